package io.redisratelimit.spring;

import org.springframework.expression.Expression;
import org.springframework.expression.spel.standard.SpelExpressionParser;
import org.springframework.expression.spel.support.StandardEvaluationContext;
import org.springframework.util.AntPathMatcher;

import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.concurrent.ConcurrentHashMap;
import java.util.function.Supplier;

/**
 * The route rules a request matches, and each one's key: written once for
 * the servlet interceptor and the WebFlux filter, which differ only in how
 * they read the request and answer. A rule matches when one of its
 * {@code methods} is the request's (or it names none) and one of its
 * {@code routes} (Ant patterns) the path; its key is its SpEL
 * {@code key} over {@code #request} (the request object), or the client's
 * address when it has none. Public only because the interceptor and the
 * filter live in their own packages ({@code web}, {@code reactive}); an
 * application has no use for it.
 */
public final class RouteMatcher {
    private final RateLimitService service;
    private final AntPathMatcher matcher = new AntPathMatcher();
    private final SpelExpressionParser parser = new SpelExpressionParser();
    private final Map<String, Expression> expressions = new ConcurrentHashMap<>();

    public RouteMatcher(RateLimitService service) {
        this.service = service;
    }

    /**
     * What a request matched: the rules' names and keys, in the rules'
     * order, and the largest of their costs; or {@code missingKey}, the rule
     * whose key came out empty when the service refuses such requests (then
     * the request is answered 400 and nothing is counted).
     */
    public record Match(List<String> names, List<String> identities, long cost, RateLimitRules.Entry missingKey) {
        /** No rule to check: the request goes on unlimited. */
        public boolean none() {
            return missingKey == null && names.isEmpty();
        }
    }

    /**
     * The rules of {@code method} and {@code path}; {@code request} is what
     * the key expressions see as {@code #request}, {@code peer} the client's
     * address (read only for a rule without a key expression).
     */
    public Match match(String method, String path, Object request, Supplier<String> peer) {
        List<String> names = new ArrayList<>();
        List<String> identities = new ArrayList<>();
        long cost = 0;
        for (RateLimitRules.Entry e : service.rules().entries().values()) {
            if (!e.appliesTo(method)) {
                continue;
            }
            for (String pattern : e.routes()) {
                if (matcher.match(pattern, path)) {
                    String identity = identity(e, request, peer);
                    if (identity == null) {
                        if (service.keyMissing(List.of(e.name()), e.keyExpression()) == RateLimitService.MissingKey.ADMIT) {
                            break;
                        }
                        return new Match(List.of(), List.of(), 0, e);
                    }
                    names.add(e.name());
                    identities.add(identity);
                    cost = Math.max(cost, e.cost());
                    break;
                }
            }
        }
        return new Match(names, identities, cost, null);
    }

    private String identity(RateLimitRules.Entry e, Object request, Supplier<String> peer) {
        if (e.keyExpression() == null || e.keyExpression().isBlank()) {
            return peer.get();
        }
        Expression x = expressions.computeIfAbsent(e.keyExpression(), parser::parseExpression);
        StandardEvaluationContext ctx = new StandardEvaluationContext(request);
        ctx.setVariable("request", request);
        Object v = x.getValue(ctx);
        return v == null || v.toString().isEmpty() ? null : v.toString();
    }
}

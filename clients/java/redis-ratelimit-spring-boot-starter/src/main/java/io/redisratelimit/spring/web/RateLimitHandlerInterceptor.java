package io.redisratelimit.spring.web;

import io.redisratelimit.client.Decision;
import io.redisratelimit.spring.RateLimitHeaders;
import io.redisratelimit.spring.RateLimitRules;
import io.redisratelimit.spring.RateLimitService;
import io.redisratelimit.spring.Permit;
import jakarta.servlet.DispatcherType;
import jakarta.servlet.http.HttpServletRequest;
import jakarta.servlet.http.HttpServletResponse;
import org.springframework.expression.Expression;
import org.springframework.expression.spel.standard.SpelExpressionParser;
import org.springframework.expression.spel.support.StandardEvaluationContext;
import org.springframework.http.MediaType;
import org.springframework.util.AntPathMatcher;
import org.springframework.web.servlet.HandlerInterceptor;

import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.concurrent.ConcurrentHashMap;

/**
 * Route-level rules: every rule whose {@code routes} match the request's path
 * is checked (together, all or nothing), keyed by its {@code key} expression
 * over {@code #request} (the client's address by default). A denial answers
 * 429 here, before the handler runs. A rule that caps concurrency holds its
 * lease from here until the request completes ({@link #afterCompletion}, also
 * after an error; for an asynchronous request, after its last dispatch).
 */
public class RateLimitHandlerInterceptor implements HandlerInterceptor {
    private final RateLimitService service;
    private final boolean headers;
    private final AntPathMatcher matcher = new AntPathMatcher();
    private final SpelExpressionParser parser = new SpelExpressionParser();
    private final Map<String, Expression> expressions = new ConcurrentHashMap<>();

    public RateLimitHandlerInterceptor(RateLimitService service, boolean headers) {
        this.service = service;
        this.headers = headers;
    }

    /** The request's {@link Permit} while its handler works (rules that cap concurrency). */
    public static final String PERMIT = RateLimitHandlerInterceptor.class.getName() + ".permit";

    @Override
    public boolean preHandle(HttpServletRequest request, HttpServletResponse response, Object handler) throws Exception {
        if (request.getDispatcherType() == DispatcherType.ASYNC || !service.enabled()) {
            // Decided when the request came in; this is its second dispatch.
            return true;
        }
        String path = request.getRequestURI().substring(request.getContextPath().length());
        List<String> names = new ArrayList<>();
        List<String> identities = new ArrayList<>();
        long cost = 0;
        for (RateLimitRules.Entry e : service.rules().entries().values()) {
            if (!e.appliesTo(request.getMethod())) {
                continue;
            }
            for (String pattern : e.routes()) {
                if (matcher.match(pattern, path)) {
                    String identity = identity(e, request);
                    if (identity == null) {
                        if (service.keyMissing(List.of(e.name()), e.keyExpression()) == RateLimitService.MissingKey.ADMIT) {
                            break;
                        }
                        response.setStatus(400);
                        response.setContentType(MediaType.APPLICATION_PROBLEM_JSON_VALUE);
                        response.getOutputStream().write(RateLimitHeaders.keyMissingJson(e.name(), e.keyExpression(),
                                request.getRequestURI()).getBytes(StandardCharsets.UTF_8));
                        return false;
                    }
                    names.add(e.name());
                    identities.add(identity);
                    cost = Math.max(cost, e.cost());
                    break;
                }
            }
        }
        if (names.isEmpty()) {
            return true;
        }
        Permit permit = service.admit(names, identities, cost);
        Decision d = permit.decision();
        if (d.allowed()) {
            if (!permit.leases().isEmpty()) {
                request.setAttribute(PERMIT, permit);
            }
            if (headers) {
                RateLimitHeaders.of(service, names, d).forEach(response::setHeader);
            }
            return true;
        }
        String rule = service.reported(names, d);
        RateLimitHeaders.of(service, names, d).forEach(response::setHeader);
        response.setStatus(429);
        response.setContentType(MediaType.APPLICATION_PROBLEM_JSON_VALUE);
        response.getOutputStream().write(RateLimitHeaders.problemJson(rule, d, request.getRequestURI()).getBytes(StandardCharsets.UTF_8));
        return false;
    }

    /** The response is done (or the handler failed): the concurrency rules' leases go back. */
    @Override
    public void afterCompletion(HttpServletRequest request, HttpServletResponse response, Object handler, Exception ex) {
        if (request.getAttribute(PERMIT) instanceof Permit permit) {
            request.removeAttribute(PERMIT);
            permit.close();
        }
    }

    private String identity(RateLimitRules.Entry e, HttpServletRequest request) {
        if (e.keyExpression() == null || e.keyExpression().isBlank()) {
            return request.getRemoteAddr();
        }
        Expression x = expressions.computeIfAbsent(e.keyExpression(), parser::parseExpression);
        StandardEvaluationContext ctx = new StandardEvaluationContext(request);
        ctx.setVariable("request", request);
        Object v = x.getValue(ctx);
        return v == null || v.toString().isEmpty() ? null : v.toString();
    }
}

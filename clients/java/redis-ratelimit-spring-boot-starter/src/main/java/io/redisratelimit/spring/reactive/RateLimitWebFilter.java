package io.redisratelimit.spring.reactive;

import io.redisratelimit.client.Decision;
import io.redisratelimit.spring.RateLimitHeaders;
import io.redisratelimit.spring.RateLimitRules;
import io.redisratelimit.spring.RateLimitService;
import org.springframework.core.io.buffer.DataBuffer;
import org.springframework.expression.Expression;
import org.springframework.expression.spel.standard.SpelExpressionParser;
import org.springframework.expression.spel.support.StandardEvaluationContext;
import org.springframework.http.HttpStatus;
import org.springframework.http.MediaType;
import org.springframework.http.server.reactive.ServerHttpRequest;
import org.springframework.http.server.reactive.ServerHttpResponse;
import org.springframework.util.AntPathMatcher;
import org.springframework.web.server.ServerWebExchange;
import org.springframework.web.server.WebFilter;
import org.springframework.web.server.WebFilterChain;
import reactor.core.publisher.Mono;

import java.net.InetSocketAddress;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.concurrent.ConcurrentHashMap;

/**
 * Route-level rules for WebFlux, as the servlet interceptor does them, without
 * blocking: the rules whose {@code routes} match are checked together with
 * one asynchronous call, keyed by {@code key} (SpEL over {@code #request}, a
 * {@link ServerHttpRequest}; the client's address by default). A rule that
 * caps concurrency holds its lease until the response completes, fails or
 * is cancelled.
 */
public class RateLimitWebFilter implements WebFilter {
    private final RateLimitService service;
    private final boolean headers;
    private final AntPathMatcher matcher = new AntPathMatcher();
    private final SpelExpressionParser parser = new SpelExpressionParser();
    private final Map<String, Expression> expressions = new ConcurrentHashMap<>();

    public RateLimitWebFilter(RateLimitService service, boolean headers) {
        this.service = service;
        this.headers = headers;
    }

    @Override
    public Mono<Void> filter(ServerWebExchange exchange, WebFilterChain chain) {
        if (!service.enabled()) {
            return chain.filter(exchange);
        }
        ServerHttpRequest request = exchange.getRequest();
        String path = request.getPath().pathWithinApplication().value();
        List<String> names = new ArrayList<>();
        List<String> identities = new ArrayList<>();
        long cost = 0;
        for (RateLimitRules.Entry e : service.rules().entries().values()) {
            if (!e.appliesTo(request.getMethod().name())) {
                continue;
            }
            for (String pattern : e.routes()) {
                if (matcher.match(pattern, path)) {
                    String identity = identity(e, request);
                    if (identity == null) {
                        if (service.keyMissing(List.of(e.name()), e.keyExpression()) == RateLimitService.MissingKey.ADMIT) {
                            break;
                        }
                        ServerHttpResponse response = exchange.getResponse();
                        response.setStatusCode(HttpStatus.BAD_REQUEST);
                        response.getHeaders().setContentType(MediaType.APPLICATION_PROBLEM_JSON);
                        byte[] body = RateLimitHeaders.keyMissingJson(e.name(), e.keyExpression(), path).getBytes(StandardCharsets.UTF_8);
                        return response.writeWith(Mono.just(response.bufferFactory().wrap(body)));
                    }
                    names.add(e.name());
                    identities.add(identity);
                    cost = Math.max(cost, e.cost());
                    break;
                }
            }
        }
        if (names.isEmpty()) {
            return chain.filter(exchange);
        }
        return Mono.fromCompletionStage(service.admitAsync(names, identities, cost)).flatMap(permit -> {
            Decision d = permit.decision();
            ServerHttpResponse response = exchange.getResponse();
            if (d.allowed()) {
                if (headers) {
                    RateLimitHeaders.of(service, names, d).forEach(response.getHeaders()::set);
                }
                if (permit.leases().isEmpty()) {
                    return chain.filter(exchange);
                }
                // Held until the response is written, or the exchange fails or is cancelled.
                return chain.filter(exchange).doFinally(signal -> permit.releaseAsync());
            }
            return deny(response, names, d, path);
        });
    }

    private Mono<Void> deny(ServerHttpResponse response, List<String> names, Decision d, String path) {
        RateLimitHeaders.of(service, names, d).forEach(response.getHeaders()::set);
        response.setStatusCode(HttpStatus.TOO_MANY_REQUESTS);
        response.getHeaders().setContentType(MediaType.APPLICATION_PROBLEM_JSON);
        byte[] body = RateLimitHeaders.problemJson(service.reported(names, d), d, path).getBytes(StandardCharsets.UTF_8);
        DataBuffer buffer = response.bufferFactory().wrap(body);
        return response.writeWith(Mono.just(buffer));
    }

    private String identity(RateLimitRules.Entry e, ServerHttpRequest request) {
        if (e.keyExpression() == null || e.keyExpression().isBlank()) {
            InetSocketAddress remote = request.getRemoteAddress();
            return remote == null ? "-" : remote.getAddress() == null ? remote.getHostString() : remote.getAddress().getHostAddress();
        }
        Expression x = expressions.computeIfAbsent(e.keyExpression(), parser::parseExpression);
        StandardEvaluationContext ctx = new StandardEvaluationContext(request);
        ctx.setVariable("request", request);
        Object v = x.getValue(ctx);
        return v == null || v.toString().isEmpty() ? null : v.toString();
    }
}

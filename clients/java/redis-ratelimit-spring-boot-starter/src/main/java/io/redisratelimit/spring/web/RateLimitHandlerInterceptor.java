package io.redisratelimit.spring.web;

import io.redisratelimit.client.Decision;
import io.redisratelimit.spring.RateLimitHeaders;
import io.redisratelimit.spring.RateLimitRules;
import io.redisratelimit.spring.RateLimitService;
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
 * 429 here, before the handler runs.
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

    @Override
    public boolean preHandle(HttpServletRequest request, HttpServletResponse response, Object handler) throws Exception {
        String path = request.getRequestURI().substring(request.getContextPath().length());
        List<String> names = new ArrayList<>();
        List<String> identities = new ArrayList<>();
        long cost = 0;
        for (RateLimitRules.Entry e : service.rules().entries().values()) {
            for (String pattern : e.routes()) {
                if (matcher.match(pattern, path)) {
                    names.add(e.name());
                    identities.add(identity(e, request));
                    cost = Math.max(cost, e.cost());
                    break;
                }
            }
        }
        if (names.isEmpty()) {
            return true;
        }
        Decision d = service.check(names, identities, cost);
        if (d.allowed()) {
            if (headers) {
                RateLimitHeaders.of(service, names, d).forEach(response::setHeader);
            }
            return true;
        }
        String rule = service.reported(names, d);
        RateLimitHeaders.of(service, names, d).forEach(response::setHeader);
        response.setStatus(429);
        response.setContentType(MediaType.APPLICATION_PROBLEM_JSON_VALUE);
        response.getOutputStream().write(RateLimitHeaders.problemJson(rule, d).getBytes(StandardCharsets.UTF_8));
        return false;
    }

    private String identity(RateLimitRules.Entry e, HttpServletRequest request) {
        if (e.keyExpression() == null || e.keyExpression().isBlank()) {
            return request.getRemoteAddr();
        }
        Expression x = expressions.computeIfAbsent(e.keyExpression(), parser::parseExpression);
        StandardEvaluationContext ctx = new StandardEvaluationContext(request);
        ctx.setVariable("request", request);
        Object v = x.getValue(ctx);
        return v == null || v.toString().isEmpty() ? "-" : v.toString();
    }
}

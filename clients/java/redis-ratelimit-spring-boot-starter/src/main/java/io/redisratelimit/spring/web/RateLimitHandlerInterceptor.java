package io.redisratelimit.spring.web;

import io.redisratelimit.client.Decision;
import io.redisratelimit.spring.RateLimitHeaders;
import io.redisratelimit.spring.RateLimitRules;
import io.redisratelimit.spring.RateLimitService;
import io.redisratelimit.spring.RouteMatcher;
import io.redisratelimit.spring.Permit;
import jakarta.servlet.DispatcherType;
import jakarta.servlet.http.HttpServletRequest;
import jakarta.servlet.http.HttpServletResponse;
import org.springframework.http.MediaType;
import org.springframework.web.servlet.HandlerInterceptor;

import java.nio.charset.StandardCharsets;
import java.util.List;

/**
 * Route-level rules: every rule whose {@code routes} match the request's path
 * is checked (together, all or nothing), keyed by its {@code key} expression
 * over {@code #request} (the client's address by default). A denial answers
 * 429 here, before the handler runs. A rule that caps concurrency holds its
 * lease from here until the request completes ({@link #afterCompletion}, also
 * after an error; for an asynchronous request, after its last dispatch).
 * When the request completes its outcome is counted for the rules' loop (an
 * error by the {@link io.redisratelimit.spring.ErrorPredicate}: a 5xx, or an
 * exception). A route of a rule with {@code core=false} answers 429 without
 * a call to Redis while the rule's stage is 1 or more.
 */
public class RateLimitHandlerInterceptor implements HandlerInterceptor {
    private final RateLimitService service;
    private final boolean headers;
    private final RouteMatcher routes;

    public RateLimitHandlerInterceptor(RateLimitService service, boolean headers) {
        this.service = service;
        this.headers = headers;
        this.routes = new RouteMatcher(service);
    }

    /** The request's {@link Permit} while its handler works (rules that cap concurrency). */
    public static final String PERMIT = RateLimitHandlerInterceptor.class.getName() + ".permit";

    /** The rules that admitted the request: its outcome is counted for their policies when it completes. */
    static final String ADMITTED = RateLimitHandlerInterceptor.class.getName() + ".admitted";

    @Override
    public boolean preHandle(HttpServletRequest request, HttpServletResponse response, Object handler) throws Exception {
        if (request.getDispatcherType() == DispatcherType.ASYNC || !service.enabled()) {
            // Decided when the request came in; this is its second dispatch.
            return true;
        }
        String path = request.getRequestURI().substring(request.getContextPath().length());
        RouteMatcher.Match match = routes.match(request.getMethod(), path, request, request::getRemoteAddr);
        if (match.missingKey() != null) {
            RateLimitRules.Entry e = match.missingKey();
            response.setStatus(400);
            response.setContentType(MediaType.APPLICATION_PROBLEM_JSON_VALUE);
            response.getOutputStream().write(RateLimitHeaders.keyMissingJson(e.name(), e.keyExpression(),
                    request.getRequestURI()).getBytes(StandardCharsets.UTF_8));
            return false;
        }
        if (match.none()) {
            return true;
        }
        List<String> names = match.names();
        String degrading = service.degrading(names, false);
        if (degrading != null) {
            // A non-core route at stage 1 or more: answered without a call to Redis.
            deny(request, response, names, degrading, service.degraded(degrading));
            return false;
        }
        Permit permit = service.admit(names, match.identities(), match.cost(),
                io.redisratelimit.client.Origin.of(request.getRemoteAddr(), request.getHeader("User-Agent")));
        Decision d = permit.decision();
        if (d.allowed()) {
            if (!permit.leases().isEmpty()) {
                request.setAttribute(PERMIT, permit);
            }
            request.setAttribute(ADMITTED, names);
            if (headers) {
                RateLimitHeaders.of(service, names, d).forEach(response::setHeader);
            }
            return true;
        }
        deny(request, response, names, service.reported(names, d), d);
        return false;
    }

    private void deny(HttpServletRequest request, HttpServletResponse response, List<String> names, String rule, Decision d)
            throws java.io.IOException {
        RateLimitHeaders.of(service, names, d).forEach(response::setHeader);
        response.setStatus(429);
        response.setContentType(MediaType.APPLICATION_PROBLEM_JSON_VALUE);
        response.getOutputStream().write(RateLimitHeaders.problemJson(rule, d, request.getRequestURI()).getBytes(StandardCharsets.UTF_8));
    }

    /** The response is done (or the handler failed): the concurrency rules' leases go back. */
    @Override
    public void afterCompletion(HttpServletRequest request, HttpServletResponse response, Object handler, Exception ex) {
        if (request.getAttribute(ADMITTED) instanceof List<?> names) {
            request.removeAttribute(ADMITTED);
            List<String> rules = names.stream().map(String::valueOf).toList();
            service.recordOutcome(rules, service.isError(response.getStatus(), ex));
        }
        if (request.getAttribute(PERMIT) instanceof Permit permit) {
            request.removeAttribute(PERMIT);
            permit.close();
        }
    }
}

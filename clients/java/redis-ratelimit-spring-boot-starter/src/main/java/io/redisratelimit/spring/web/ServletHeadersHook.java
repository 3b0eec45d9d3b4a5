package io.redisratelimit.spring.web;

import io.redisratelimit.client.Decision;
import io.redisratelimit.spring.RateLimitHeaders;
import io.redisratelimit.spring.RateLimitService;
import io.redisratelimit.spring.RateLimitedInterceptor;
import jakarta.servlet.http.HttpServletResponse;
import org.springframework.web.context.request.RequestContextHolder;
import org.springframework.web.context.request.ServletRequestAttributes;

import java.util.List;

/** Writes the IETF fields on the response of an admitted {@code @RateLimited} call in a servlet request. */
public class ServletHeadersHook implements RateLimitedInterceptor.DecisionHook {
    private final RateLimitService service;

    public ServletHeadersHook(RateLimitService service) {
        this.service = service;
    }

    @Override
    public void decided(List<String> rules, Decision decision) {
        if (!decision.allowed()) {
            return;
        }
        if (RequestContextHolder.getRequestAttributes() instanceof ServletRequestAttributes attrs) {
            HttpServletResponse response = attrs.getResponse();
            if (response != null && !response.isCommitted()) {
                RateLimitHeaders.of(service, rules, decision).forEach(response::setHeader);
            }
        }
    }
}

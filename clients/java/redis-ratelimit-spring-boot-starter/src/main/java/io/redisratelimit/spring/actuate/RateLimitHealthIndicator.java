package io.redisratelimit.spring.actuate;

import io.redisratelimit.client.Limiter;
import io.redisratelimit.client.StatsSnapshot;
import io.redisratelimit.spring.RateLimitService;
import org.springframework.boot.actuate.health.AbstractHealthIndicator;
import org.springframework.boot.actuate.health.Health;

/**
 * The limiter's state as its own health component ({@code rateLimit}): UP
 * whether Redis answers or the fallback decides, since in both cases the
 * instance limits and serves. A load balancer that pulled every instance
 * while Redis is away would defeat the fallback; the details say which path
 * decides ({@code redis}: {@code up}, or {@code fallback} with the breaker
 * open), the fallback mode, and what a refresh could not apply.
 */
public class RateLimitHealthIndicator extends AbstractHealthIndicator {
    private final RateLimitService service;

    public RateLimitHealthIndicator(RateLimitService service) {
        super("redis-ratelimit health check failed");
        this.service = service;
    }

    @Override
    protected void doHealthCheck(Health.Builder builder) {
        Limiter limiter = service.limiter();
        StatsSnapshot s = limiter.stats();
        builder.up()
                .withDetail("decides", limiter.breakerOpen() ? "fallback" : "redis")
                .withDetail("breaker", limiter.circuitBreaker().getState().name().toLowerCase(java.util.Locale.ROOT))
                .withDetail("fallback", limiter.fallbackMode().name().toLowerCase(java.util.Locale.ROOT).replace('_', '-'))
                .withDetail("enabled", service.enabled())
                .withDetail("redisTimeouts", s.redisTimeouts())
                .withDetail("redisUnavailable", s.redisUnavailable())
                .withDetail("fallbackAdmitted", s.fallbackAdmitted())
                .withDetail("fallbackDenied", s.fallbackDenied())
                .withDetail("breakerOpened", s.breakerOpened());
        if (service.outOfDate()) {
            builder.withDetail("rulesOutOfDate", true);
        }
        if (!service.settingsNotApplied().isEmpty()) {
            builder.withDetail("settingsNotApplied", service.settingsNotApplied());
        }
    }
}

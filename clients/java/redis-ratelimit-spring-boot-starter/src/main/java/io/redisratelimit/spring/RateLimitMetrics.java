package io.redisratelimit.spring;

import io.micrometer.core.instrument.MeterRegistry;
import io.redisratelimit.client.Decision;
import io.redisratelimit.client.Limiter;
import io.redisratelimit.client.Protection;
import io.redisratelimit.client.RateLimitMeters;

import java.util.List;

/**
 * The starter's Micrometer binding: the client's {@link RateLimitMeters}
 * (the contract's series: {@code ratelimit_decisions_total{rule,level,outcome}},
 * {@code ratelimit_redis_seconds}, {@code ratelimit_remaining_ratio{rule}},
 * {@code ratelimit_breaker_open{breaker}}, {@code ratelimit_deny_events_*_total},
 * and the limiter's own counters) on the application's registry, plus the
 * protection loop's gauges of every rule with a loop:
 * {@code ratelimit_scale{rule}} and {@code ratelimit_stage{rule}} (the rule
 * label is the rule's policy, {@code <app>:<rule>}, as in the decisions), and
 * {@code ratelimit_breaker_open{breaker}} of each breaker a rule names
 * (1 while one of its policies is at stage 2).
 */
public class RateLimitMetrics implements RateLimitService.Listener {
    private final RateLimitMeters meters;

    public RateLimitMetrics(MeterRegistry registry) {
        this.meters = RateLimitMeters.on(registry);
    }

    public RateLimitMeters meters() {
        return meters;
    }

    /** Counts the limiter's decisions from now on, and binds its breaker, counters and deny events. */
    public void bind(Limiter limiter) {
        meters.bind(limiter);
    }

    /** The scale and stage of every rule with a loop (the rules at start-up; a rule removed later reads 100 and 0). */
    public void bindProtection(RateLimitService service) {
        for (RateLimitRules.Entry e : service.rules().entries().values()) {
            String policy = e.rule().policy();
            if (e.loop().any()) {
                meters.protection(policy, () -> {
                    Protection p = service.protection();
                    return p == null ? 100 : p.scale(policy);
                }, () -> {
                    Protection p = service.protection();
                    return p == null ? 0 : p.stage(policy);
                });
            }
            if (e.breaker() != null) {
                String breaker = e.breaker();
                meters.breaker(breaker, () -> {
                    Protection p = service.protection();
                    if (p == null) {
                        return 0;
                    }
                    for (RateLimitRules.Entry x : service.rules().entries().values()) {
                        if (breaker.equals(x.breaker()) && p.stage(x.rule().policy()) >= Protection.BREAK) {
                            return 1;
                        }
                    }
                    return 0;
                });
            }
        }
    }

    /** Decisions are counted by the limiter itself (every level, every caller); nothing more here. */
    @Override
    public void onDecision(List<String> rules, Decision decision, long nanos) {
    }
}

package io.redisratelimit.spring;

import io.micrometer.core.instrument.Counter;
import io.micrometer.core.instrument.FunctionCounter;
import io.micrometer.core.instrument.Gauge;
import io.micrometer.core.instrument.MeterRegistry;
import io.micrometer.core.instrument.Timer;
import io.redisratelimit.client.Decision;
import io.redisratelimit.client.Limiter;
import io.redisratelimit.client.Path;
import io.redisratelimit.client.StatsSnapshot;

import java.util.List;
import java.util.Locale;
import java.util.concurrent.TimeUnit;
import java.util.function.ToDoubleFunction;

/**
 * Micrometer meters, named as its conventions expect (dotted, lower case,
 * the unit in the base name only for timers):
 * <ul>
 *   <li>{@code ratelimit.requests} counter, tags {@code rule}, {@code outcome}
 *       (admitted, denied) and {@code path} (redis, local, deny_cache, fallback);</li>
 *   <li>{@code ratelimit.redis.latency} timer: decisions Redis answered;</li>
 *   <li>{@code ratelimit.redis.calls}, {@code ratelimit.redis.failures} (tag {@code reason}),
 *       {@code ratelimit.fallback} (tag {@code outcome}), {@code ratelimit.breaker.opened},
 *       {@code ratelimit.breaker.probes} function counters from the limiter's stats;</li>
 *   <li>{@code ratelimit.breaker.open} gauge (1 open or probing, 0 closed);</li>
 *   <li>{@code ratelimit.scale} and {@code ratelimit.stage} gauges, tag {@code rule}, for the
 *       rules with a protection loop (the scale and stage this instance last read).</li>
 * </ul>
 */
public class RateLimitMetrics implements RateLimitService.Listener {
    private final MeterRegistry registry;
    private final Timer latency;

    public RateLimitMetrics(MeterRegistry registry) {
        this.registry = registry;
        this.latency = Timer.builder("ratelimit.redis.latency").description("Decisions answered by Redis").register(registry);
    }

    /** Binds the limiter's counters of every path. */
    public void bind(Limiter limiter) {
        fc("ratelimit.redis.calls", limiter, s -> s.redisCalls(), "Limiter calls sent to Redis (probes excluded)");
        fc("ratelimit.redis.failures", limiter, s -> s.redisTimeouts(), "Calls Redis failed", "reason", "timeout");
        fc("ratelimit.redis.failures", limiter, s -> s.redisUnavailable(), "Calls Redis failed", "reason", "unavailable");
        fc("ratelimit.redis.failures", limiter, s -> s.redisErrors(), "Calls Redis failed", "reason", "error");
        fc("ratelimit.fallback", limiter, s -> s.fallbackAdmitted(), "Requests the fallback decided", "outcome", "admitted");
        fc("ratelimit.fallback", limiter, s -> s.fallbackDenied(), "Requests the fallback decided", "outcome", "denied");
        fc("ratelimit.breaker.opened", limiter, s -> s.breakerOpened(), "Times the circuit breaker opened");
        fc("ratelimit.breaker.probes", limiter, s -> s.probes(), "Probes sent while the breaker was open");
        Gauge.builder("ratelimit.breaker.open", limiter, l -> l.breakerOpen() ? 1 : 0)
                .description("1 while the circuit breaker is open or probing").register(registry);
    }

    /** The scale and stage of every rule with a loop (the rules at start-up; a rule removed later reads 100 and 0). */
    public void bindProtection(RateLimitService service) {
        for (RateLimitRules.Entry e : service.rules().entries().values()) {
            if (!e.loop().any()) {
                continue;
            }
            String policy = e.rule().policy();
            Gauge.builder("ratelimit.scale", service, s -> s.protection() == null ? 100 : s.protection().scale(policy))
                    .description("The policy's scale in percent, as this instance last read it").tag("rule", e.name()).register(registry);
            Gauge.builder("ratelimit.stage", service, s -> s.protection() == null ? 0 : s.protection().stage(policy))
                    .description("The policy's stage: 0 normal, 1 degrade, 2 break").tag("rule", e.name()).register(registry);
        }
    }

    private void fc(String name, Limiter limiter, ToDoubleFunction<StatsSnapshot> f, String description, String... tags) {
        FunctionCounter.builder(name, limiter, l -> f.applyAsDouble(l.stats())).description(description).tags(tags).register(registry);
    }

    @Override
    public void onDecision(List<String> rules, Decision d, long nanos) {
        Counter.builder("ratelimit.requests").description("Requests decided")
                .tag("rule", String.join(",", rules))
                .tag("outcome", d.allowed() ? "admitted" : "denied")
                .tag("path", d.path().name().toLowerCase(Locale.ROOT))
                .register(registry).increment();
        if (d.path() == Path.REDIS) {
            latency.record(nanos, TimeUnit.NANOSECONDS);
        }
    }
}

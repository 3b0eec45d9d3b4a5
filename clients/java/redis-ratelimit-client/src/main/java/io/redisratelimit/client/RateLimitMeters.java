package io.redisratelimit.client;

import io.micrometer.core.instrument.Counter;
import io.micrometer.core.instrument.FunctionCounter;
import io.micrometer.core.instrument.Gauge;
import io.micrometer.core.instrument.MeterRegistry;
import io.micrometer.core.instrument.Timer;

import java.time.Duration;
import java.util.List;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicLong;
import java.util.function.DoubleSupplier;
import java.util.function.ToDoubleFunction;

/**
 * The kit's metrics in Micrometer, named so that a Prometheus scrape shows
 * exactly the contract's series ({@code clients/contract/contract.json},
 * {@code observability.metrics}):
 * <ul>
 *   <li>{@code ratelimit.decisions} counter, tags {@code rule}, {@code level}, {@code outcome}
 *       → {@code ratelimit_decisions_total};</li>
 *   <li>{@code ratelimit.redis} timer with the contract's buckets as service level
 *       objectives and no percentile histogram → {@code ratelimit_redis_seconds_bucket},
 *       {@code _sum}, {@code _count} (Micrometer adds its own gauge
 *       {@code ratelimit_redis_seconds_max}, a separate family outside the contract);</li>
 *   <li>{@code ratelimit.remaining.ratio{rule}}, {@code ratelimit.breaker.open{breaker}},
 *       {@code ratelimit.scale{rule}}, {@code ratelimit.stage{rule}} gauges;</li>
 *   <li>{@code ratelimit.deny_events.dropped}, {@code .shipped}, {@code .sink_errors}
 *       function counters → {@code ratelimit_deny_events_*_total};</li>
 *   <li>and the limiter's own counters, kept: {@code ratelimit.redis.calls},
 *       {@code ratelimit.redis.failures{reason}}, {@code ratelimit.fallback{outcome}},
 *       {@code ratelimit.breaker.opened}, {@code ratelimit.breaker.probes}.</li>
 * </ul>
 * Opt in with {@link Limiter.Builder#metrics} or {@link #bind(Limiter)};
 * without it the limiter pays one null check per decision.
 */
public final class RateLimitMeters implements Observer {
    /** {@code ratelimit_redis_seconds}'s buckets, in seconds: the contract's {@code redis_seconds_buckets}. */
    public static final List<Double> REDIS_SECONDS_BUCKETS = List.of(0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0);
    /** The breaker tag of the limiter's own breaker (Redis skipped while it is open). */
    public static final String REDIS_BREAKER = "redis";

    static final String DECISIONS = "ratelimit.decisions";
    static final String REDIS = "ratelimit.redis";
    static final String REMAINING_RATIO = "ratelimit.remaining.ratio";
    static final String BREAKER_OPEN = "ratelimit.breaker.open";
    static final String SCALE = "ratelimit.scale";
    static final String STAGE = "ratelimit.stage";
    static final String DROPPED = "ratelimit.deny_events.dropped";
    static final String SHIPPED = "ratelimit.deny_events.shipped";
    static final String SINK_ERRORS = "ratelimit.deny_events.sink_errors";

    private static final Path[] PATHS = Path.values();

    private final MeterRegistry registry;
    private final Timer redis;
    private final ConcurrentHashMap<String, RuleMeters> rules = new ConcurrentHashMap<>();

    /** A rule's counters, one per level and outcome, registered on first use; and its last remaining ratio. */
    private final class RuleMeters {
        final String rule;
        final Counter[] counters = new Counter[PATHS.length * 2];
        final AtomicLong ratio = new AtomicLong(Double.doubleToLongBits(Double.NaN));
        volatile boolean ratioRegistered;

        RuleMeters(String rule) {
            this.rule = rule;
        }

        Counter counter(Path level, boolean allowed) {
            int i = level.ordinal() * 2 + (allowed ? 0 : 1);
            Counter c = counters[i];
            if (c == null) {
                c = Counter.builder(DECISIONS).description("Decisions taken, by rule, by the level that took them and by outcome")
                        .tag("rule", rule).tag("level", level.level()).tag("outcome", allowed ? "admitted" : "denied")
                        .register(registry);
                counters[i] = c;
            }
            return c;
        }
    }

    private RateLimitMeters(MeterRegistry registry) {
        if (registry == null) {
            throw new InvalidArgumentException("registry", "metrics need a MeterRegistry");
        }
        this.registry = registry;
        Duration[] slos = REDIS_SECONDS_BUCKETS.stream().map(s -> Duration.ofNanos(Math.round(s * 1e9))).toArray(Duration[]::new);
        this.redis = Timer.builder(REDIS).description("Round trips of limiter commands to Redis, in seconds")
                .serviceLevelObjectives(slos).publishPercentileHistogram(false).register(registry);
    }

    /** The meters on {@code registry}: {@code ratelimit_redis_seconds} at once, the others as they are bound or used. */
    public static RateLimitMeters on(MeterRegistry registry) {
        return new RateLimitMeters(registry);
    }

    public MeterRegistry registry() {
        return registry;
    }

    /**
     * Counts the limiter's decisions and round trips from now on, and binds
     * its breaker ({@code ratelimit_breaker_open{breaker="redis"}}), its
     * counters and its deny events' counters, if it has deny events.
     */
    public RateLimitMeters bind(Limiter limiter) {
        fc("ratelimit.redis.calls", limiter, StatsSnapshot::redisCalls, "Limiter calls sent to Redis (probes excluded)");
        fc("ratelimit.redis.failures", limiter, StatsSnapshot::redisTimeouts, "Calls Redis failed", "reason", "timeout");
        fc("ratelimit.redis.failures", limiter, StatsSnapshot::redisUnavailable, "Calls Redis failed", "reason", "unavailable");
        fc("ratelimit.redis.failures", limiter, StatsSnapshot::redisErrors, "Calls Redis failed", "reason", "error");
        fc("ratelimit.fallback", limiter, StatsSnapshot::fallbackAdmitted, "Requests the fallback decided", "outcome", "admitted");
        fc("ratelimit.fallback", limiter, StatsSnapshot::fallbackDenied, "Requests the fallback decided", "outcome", "denied");
        fc("ratelimit.breaker.opened", limiter, StatsSnapshot::breakerOpened, "Times the circuit breaker opened");
        fc("ratelimit.breaker.probes", limiter, StatsSnapshot::probes, "Probes sent while the breaker was open");
        breaker(REDIS_BREAKER, () -> limiter.breakerOpen() ? 1 : 0);
        limiter.observe(this);
        DenyEvents events = limiter.denyEvents();
        if (events != null) {
            bind(events);
        }
        return this;
    }

    /** {@code ratelimit_deny_events_dropped_total}, {@code _shipped_total} and {@code _sink_errors_total} of {@code events}. */
    public RateLimitMeters bind(DenyEvents events) {
        FunctionCounter.builder(DROPPED, events, DenyEvents::dropped)
                .description("Deny events lost: the oldest dropped from a full buffer, and every event of a batch its sink refused")
                .register(registry);
        FunctionCounter.builder(SHIPPED, events, DenyEvents::shipped).description("Deny events a sink accepted").register(registry);
        FunctionCounter.builder(SINK_ERRORS, events, DenyEvents::sinkErrors)
                .description("Flushes a sink refused or failed (an error, a timeout, an HTTP status other than 2xx, a _bulk reply with errors)")
                .register(registry);
        return this;
    }

    /** The protection loop's scale and stage of each policy it watches now, labelled with the policy's name. */
    public RateLimitMeters bind(Protection protection) {
        for (String policy : protection.policies()) {
            protection(policy, () -> protection.scale(policy), () -> protection.stage(policy));
        }
        return this;
    }

    /** {@code ratelimit_scale{rule}} and {@code ratelimit_stage{rule}} read from the given functions. */
    public RateLimitMeters protection(String rule, DoubleSupplier scale, DoubleSupplier stage) {
        Gauge.builder(SCALE, scale::getAsDouble).description("The protection loop's scale of the rule's policy, in percent")
                .tag("rule", rule).strongReference(true).register(registry);
        Gauge.builder(STAGE, stage::getAsDouble)
                .description("The protection loop's stage of the rule's policy: 0 normal, 1 degrade, 2 break")
                .tag("rule", rule).strongReference(true).register(registry);
        return this;
    }

    /** {@code ratelimit_breaker_open{breaker}}: 1 while {@code open} says so, else 0. */
    public RateLimitMeters breaker(String breaker, DoubleSupplier open) {
        Gauge.builder(BREAKER_OPEN, open::getAsDouble)
                .description("1 while the breaker is open (Redis skipped, or a protected stage broken), else 0")
                .tag("breaker", breaker).strongReference(true).register(registry);
        return this;
    }

    private void fc(String name, Limiter limiter, ToDoubleFunction<StatsSnapshot> f, String description, String... tags) {
        FunctionCounter.builder(name, limiter, l -> f.applyAsDouble(l.stats())).description(description).tags(tags).register(registry);
    }

    private RuleMeters rule(String rule) {
        RuleMeters m = rules.get(rule);
        return m != null ? m : rules.computeIfAbsent(rule, RuleMeters::new);
    }

    @Override
    public void decided(String rule, Path level, boolean allowed) {
        rule(rule).counter(level, allowed).increment();
    }

    @Override
    public void remaining(String rule, long limit, long remaining) {
        if (limit <= 0) {
            return;
        }
        RuleMeters m = rule(rule);
        m.ratio.set(Double.doubleToLongBits(Math.max(0, Math.min(1.0, (double) remaining / limit))));
        if (!m.ratioRegistered) {
            Gauge.builder(REMAINING_RATIO, m.ratio, r -> Double.longBitsToDouble(r.get()))
                    .description("remaining / limit of the rule's last decision taken by Redis or the local level (0: at the limit)")
                    .tag("rule", rule).strongReference(true).register(registry);
            m.ratioRegistered = true;
        }
    }

    @Override
    public void redisRoundTrip(long nanos) {
        redis.record(nanos, TimeUnit.NANOSECONDS);
    }
}

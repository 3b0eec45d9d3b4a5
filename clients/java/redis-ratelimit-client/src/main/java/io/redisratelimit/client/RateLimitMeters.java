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
 *
 * <p>One registry has one {@code RateLimitMeters} ({@link #on} returns it
 * again): every limiter and every {@link DenyEvents} bound to it adds to the
 * same series (the limiters' counters and the deny events' counters are
 * sums, {@code ratelimit_breaker_open{breaker="redis"}} is 1 while any bound
 * limiter's breaker is open, a rule's remaining ratio is its last decision
 * in any of them). A bound limiter is kept for the registry's life, so that
 * its counts never go back.
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

    /**
     * Each registry's meters. The registry is held weakly (here and in each
     * instance), so a registry the application drops is collected with them.
     */
    private static final java.util.Map<MeterRegistry, RateLimitMeters> ON =
            java.util.Collections.synchronizedMap(new java.util.WeakHashMap<>());

    private final java.lang.ref.WeakReference<MeterRegistry> registry;
    private final Timer redis;
    private final ConcurrentHashMap<String, RuleMeters> rules = new ConcurrentHashMap<>();
    /** The limiters bound to this registry: its counters are their sums. */
    private final java.util.concurrent.CopyOnWriteArrayList<Limiter> limiters = new java.util.concurrent.CopyOnWriteArrayList<>();
    /** The deny events bound to this registry: its deny-event counters are their sums. */
    private final java.util.concurrent.CopyOnWriteArrayList<DenyEvents> events = new java.util.concurrent.CopyOnWriteArrayList<>();

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
                MeterRegistry r = registry.get();
                if (r == null) {
                    return null;
                }
                c = Counter.builder(DECISIONS).description("Decisions taken, by rule, by the level that took them and by outcome")
                        .tag("rule", rule).tag("level", level.level()).tag("outcome", allowed ? "admitted" : "denied")
                        .register(r);
                counters[i] = c;
            }
            return c;
        }
    }

    private RateLimitMeters(MeterRegistry registry) {
        if (registry == null) {
            throw new InvalidArgumentException("registry", "metrics need a MeterRegistry");
        }
        this.registry = new java.lang.ref.WeakReference<>(registry);
        Duration[] slos = REDIS_SECONDS_BUCKETS.stream().map(s -> Duration.ofNanos(Math.round(s * 1e9))).toArray(Duration[]::new);
        this.redis = Timer.builder(REDIS).description("Round trips of limiter commands to Redis, in seconds")
                .serviceLevelObjectives(slos).publishPercentileHistogram(false).register(registry);
    }

    /** The meters on {@code registry}: {@code ratelimit_redis_seconds} at once, the others as they are bound or used. */
    public static RateLimitMeters on(MeterRegistry registry) {
        if (registry == null) {
            throw new InvalidArgumentException("registry", "metrics need a MeterRegistry");
        }
        return ON.computeIfAbsent(registry, RateLimitMeters::new);
    }

    public MeterRegistry registry() {
        MeterRegistry r = registry.get();
        if (r == null) {
            throw new IllegalStateException("the MeterRegistry of these meters was garbage collected");
        }
        return r;
    }

    /**
     * Counts the limiter's decisions and round trips from now on, and binds
     * its breaker ({@code ratelimit_breaker_open{breaker="redis"}}), its
     * counters and its deny events' counters, if it has deny events.
     */
    public RateLimitMeters bind(Limiter limiter) {
        if (limiter == null) {
            throw new InvalidArgumentException("limiter", "null");
        }
        boolean first;
        synchronized (limiters) {
            first = limiters.isEmpty();
            limiters.addIfAbsent(limiter);
        }
        if (first) {
            fc("ratelimit.redis.calls", StatsSnapshot::redisCalls, "Limiter calls sent to Redis (probes excluded)");
            fc("ratelimit.redis.failures", StatsSnapshot::redisTimeouts, "Calls Redis failed", "reason", "timeout");
            fc("ratelimit.redis.failures", StatsSnapshot::redisUnavailable, "Calls Redis failed", "reason", "unavailable");
            fc("ratelimit.redis.failures", StatsSnapshot::redisErrors, "Calls Redis failed", "reason", "error");
            fc("ratelimit.fallback", StatsSnapshot::fallbackAdmitted, "Requests the fallback decided", "outcome", "admitted");
            fc("ratelimit.fallback", StatsSnapshot::fallbackDenied, "Requests the fallback decided", "outcome", "denied");
            fc("ratelimit.breaker.opened", StatsSnapshot::breakerOpened, "Times the circuit breaker opened");
            fc("ratelimit.breaker.probes", StatsSnapshot::probes, "Probes sent while the breaker was open");
            breaker(REDIS_BREAKER, () -> {
                for (Limiter l : limiters) {
                    if (l.breakerOpen()) {
                        return 1;
                    }
                }
                return 0;
            });
        }
        limiter.observe(this);
        DenyEvents events = limiter.denyEvents();
        if (events != null) {
            bind(events);
        }
        return this;
    }

    /** {@code ratelimit_deny_events_dropped_total}, {@code _shipped_total} and {@code _sink_errors_total} of {@code events}. */
    public RateLimitMeters bind(DenyEvents events) {
        if (events == null) {
            throw new InvalidArgumentException("events", "null");
        }
        boolean first;
        synchronized (this.events) {
            first = this.events.isEmpty();
            this.events.addIfAbsent(events);
        }
        if (first) {
            MeterRegistry r = registry();
            FunctionCounter.builder(DROPPED, this, m -> m.eventsSum(DenyEvents::dropped))
                    .description("Deny events lost: the oldest dropped from a full buffer, and every event of a batch its sink refused")
                    .register(r);
            FunctionCounter.builder(SHIPPED, this, m -> m.eventsSum(DenyEvents::shipped)).description("Deny events a sink accepted")
                    .register(r);
            FunctionCounter.builder(SINK_ERRORS, this, m -> m.eventsSum(DenyEvents::sinkErrors))
                    .description("Flushes a sink refused or failed (an error, a timeout, an HTTP status other than 2xx, a _bulk reply with errors)")
                    .register(r);
        }
        return this;
    }

    private double eventsSum(java.util.function.ToLongFunction<DenyEvents> f) {
        long sum = 0;
        for (DenyEvents e : events) {
            sum += f.applyAsLong(e);
        }
        return sum;
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
                .tag("rule", rule).strongReference(true).register(registry());
        Gauge.builder(STAGE, stage::getAsDouble)
                .description("The protection loop's stage of the rule's policy: 0 normal, 1 degrade, 2 break")
                .tag("rule", rule).strongReference(true).register(registry());
        return this;
    }

    /** {@code ratelimit_breaker_open{breaker}}: 1 while {@code open} says so, else 0. */
    public RateLimitMeters breaker(String breaker, DoubleSupplier open) {
        Gauge.builder(BREAKER_OPEN, open::getAsDouble)
                .description("1 while the breaker is open (Redis skipped, or a protected stage broken), else 0")
                .tag("breaker", breaker).strongReference(true).register(registry());
        return this;
    }

    /** A counter of the bound limiters' sum (the function counter holds this instance, kept as long as the registry). */
    private void fc(String name, ToDoubleFunction<StatsSnapshot> f, String description, String... tags) {
        FunctionCounter.builder(name, this, m -> {
            double sum = 0;
            for (Limiter l : m.limiters) {
                sum += f.applyAsDouble(l.stats());
            }
            return sum;
        }).description(description).tags(tags).register(registry());
    }

    private RuleMeters rule(String rule) {
        RuleMeters m = rules.get(rule);
        return m != null ? m : rules.computeIfAbsent(rule, RuleMeters::new);
    }

    @Override
    public void decided(String rule, Path level, boolean allowed) {
        Counter c = rule(rule).counter(level, allowed);
        if (c != null) {
            c.increment();
        }
    }

    @Override
    public void remaining(String rule, long limit, long remaining) {
        if (limit <= 0) {
            return;
        }
        RuleMeters m = rule(rule);
        m.ratio.set(Double.doubleToLongBits(Math.max(0, Math.min(1.0, (double) remaining / limit))));
        MeterRegistry live = registry.get();
        if (!m.ratioRegistered && live != null) {
            Gauge.builder(REMAINING_RATIO, m.ratio, r -> Double.longBitsToDouble(r.get()))
                    .description("remaining / limit of the rule's last decision taken by Redis or the local level (0: at the limit)")
                    .tag("rule", rule).strongReference(true).register(live);
            m.ratioRegistered = true;
        }
    }

    @Override
    public void redisRoundTrip(long nanos) {
        redis.record(nanos, TimeUnit.NANOSECONDS);
    }
}

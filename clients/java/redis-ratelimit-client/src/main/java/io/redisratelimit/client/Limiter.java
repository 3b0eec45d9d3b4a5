package io.redisratelimit.client;

import io.github.resilience4j.circuitbreaker.CallNotPermittedException;
import io.github.resilience4j.circuitbreaker.CircuitBreaker;
import io.github.resilience4j.circuitbreaker.CircuitBreakerConfig;

import java.lang.System.Logger.Level;
import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.OptionalInt;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.CompletionException;
import java.util.concurrent.CompletionStage;
import java.util.concurrent.TimeUnit;

/**
 * Rate limiting over a {@link Client}: the deny cache, then the local
 * level (for global rules), then one round trip to Redis within the deadline,
 * and the fallback with a Resilience4j circuit breaker when Redis cannot
 * answer. {@link #check} never fails: where Redis cannot decide, the fallback
 * does, and {@link Decision#path()} says which path did.
 *
 * <p>A concurrency rule ({@link Spec#concurrency}) is a set of its own (RL.ALL
 * refuses it): its admission carries {@link Decision#lease()}, which the
 * caller releases ({@link Lease#of}); its denials are never cached, and the
 * local-only fallback admits it without a lease (the fallback keeps no
 * count of work in flight).
 *
 * <p>A global rule may be {@link Rule#batched() batched} (units taken with
 * {@code UPTO b} and spent in process, {@link Path#GRANT}; what is held
 * {@code hold_ms} goes back with {@code REFUND}, and everything held at
 * {@link #close}) and {@link Rule#striped(int) striped} (its limit kept in
 * N keys on different masters: this instance's own stripe, then one other).
 */
public final class Limiter implements AutoCloseable {
    private static final System.Logger LOG = System.getLogger(Limiter.class.getName());

    /** Builds a {@link Limiter}; every setting has a default. */
    public static final class Builder {
        private final Client client;
        private boolean localLevel = true;
        private Share share = Share.instances(1);
        private boolean denyCache = true;
        private Duration denyCacheMax = Duration.ofSeconds(1);
        private long denyCacheCapacity = 10_000;
        private long localCapacity = 100_000;
        private FallbackMode fallback = FallbackMode.LOCAL_ONLY;
        private int breakerFailures = 5;
        private Duration breakerOpenFor = Duration.ofSeconds(1);
        private Duration deadline;
        private RateLimitMeters meters;
        private DenyEvents denyEvents;

        private Builder(Client client) {
            this.client = client;
        }

        /** The local level on or off (on by default; it acts only on rules marked global). */
        public Builder localLevel(boolean on) {
            localLevel = on;
            return this;
        }

        /** Instances sharing each global limit: each takes {@code ceil(total / instances * 1.1)}, at least 1. */
        public Builder instances(long instances) {
            share = Share.instances(instances);
            return this;
        }

        public Builder share(Share s) {
            share = s;
            return this;
        }

        public Builder denyCache(boolean on) {
            denyCache = on;
            return this;
        }

        /** The longest a denial is cached (1 s by default), so a raised limit or the kill switch reaches users within it. */
        public Builder denyCacheMax(Duration max) {
            if (max.isNegative()) {
                throw new InvalidArgumentException("deny-cache.max", "must be at least 0");
            }
            denyCacheMax = max;
            return this;
        }

        public Builder denyCacheCapacity(long capacity) {
            denyCacheCapacity = capacity;
            return this;
        }

        public Builder localCapacity(long capacity) {
            localCapacity = capacity;
            return this;
        }

        public Builder fallback(FallbackMode mode) {
            fallback = mode;
            return this;
        }

        /** Consecutive failures (timeouts, lost connections) that open the breaker, and how long it stays open. */
        public Builder breaker(int failures, Duration openFor) {
            if (failures < 1) {
                throw new InvalidArgumentException("breaker.failures", "must be at least 1");
            }
            breakerFailures = failures;
            breakerOpenFor = openFor;
            return this;
        }

        /** The deadline of one call (the client's by default). */
        public Builder deadline(Duration d) {
            deadline = d;
            return this;
        }

        /**
         * Metrics on ({@code RateLimitMeters.on(registry)}): every decision
         * counted in {@code ratelimit_decisions_total}, every round trip timed
         * in {@code ratelimit_redis_seconds}. Off by default (null).
         */
        public Builder metrics(RateLimitMeters m) {
            meters = m;
            return this;
        }

        /**
         * Deny events on: every denial, at every level, recorded into
         * {@code events} (which {@link Limiter#close} closes). Off by default (null).
         */
        public Builder denyEvents(DenyEvents events) {
            denyEvents = events;
            return this;
        }

        public Limiter build() {
            Limiter l = new Limiter(this);
            if (meters != null) {
                meters.bind(l);
            }
            return l;
        }
    }

    private final Client client;
    private final boolean localLevel;
    private final Share share;
    private final DenyCache denyCache;
    private final LocalLimiters local;
    /**
     * Each rule's account at this instance's share, per key, for the rules
     * without a local level (a global rule's account is its local level):
     * charged with every unit Redis admitted, or may have admitted, for this
     * instance, and the only thing the local-only fallback admits from.
     */
    private final LocalLimiters accounts;
    /** Units the fallback admitted without Redis, over every key: when above 0, a call that Redis answers settles its keys. */
    private final java.util.concurrent.atomic.AtomicLong owed = new java.util.concurrent.atomic.AtomicLong();
    private final FallbackMode fallback;
    private final CircuitBreaker breaker;
    private final Duration openFor;
    private final Stats stats = new Stats();
    /** A batched rule's units held per (rule, key): at most {@link #heldCapacity} keys, idle ones swept. */
    private final java.util.concurrent.ConcurrentHashMap<String, Held> heldStates = new java.util.concurrent.ConcurrentHashMap<>();
    private final long heldCapacity;
    /** The instance's own stripe of each striped rule: this modulo its stripes, chosen at random once. */
    private final int stripeSeed = java.util.concurrent.ThreadLocalRandom.current().nextInt(Integer.MAX_VALUE);
    /** The slot map the stripes are placed on; null until read (a cluster) or first needed. */
    private volatile Stripes topology;
    private final java.util.concurrent.atomic.AtomicReference<CompletableFuture<Stripes>> loading = new java.util.concurrent.atomic.AtomicReference<>();
    private final java.util.concurrent.ConcurrentHashMap<String, List<Spec>> stripeSpecs = new java.util.concurrent.ConcurrentHashMap<>();
    /** Refunds held units after hold_ms, sweeps idle keys and re-reads the slot map; started with the first grant or stripe. */
    private volatile java.util.concurrent.ScheduledExecutorService timer;
    private volatile boolean closed;
    private volatile Thread exitHook;
    private final long origin = System.nanoTime();
    private volatile Observer observer;
    private final DenyEvents events;
    private final List<java.util.function.Consumer<ServerErrorException>> serverErrorListeners = new java.util.concurrent.CopyOnWriteArrayList<>();

    private Limiter(Builder b) {
        this.client = b.deadline == null ? b.client : b.client.withDeadline(b.deadline);
        this.localLevel = b.localLevel;
        this.share = b.share;
        this.denyCache = b.denyCache ? new DenyCache(b.denyCacheMax, b.denyCacheCapacity) : null;
        this.local = new LocalLimiters(b.localCapacity);
        this.accounts = new LocalLimiters(b.localCapacity);
        this.heldCapacity = b.localCapacity;
        this.fallback = b.fallback;
        this.openFor = b.breakerOpenFor;
        this.events = b.denyEvents;
        // Opens after `failures` consecutive unavailable or late calls; one probe when half open.
        this.breaker = CircuitBreaker.of("redis-ratelimit", CircuitBreakerConfig.custom()
                .slidingWindowType(CircuitBreakerConfig.SlidingWindowType.COUNT_BASED)
                .slidingWindowSize(b.breakerFailures)
                .minimumNumberOfCalls(b.breakerFailures)
                .failureRateThreshold(100)
                .waitDurationInOpenState(b.breakerOpenFor)
                .permittedNumberOfCallsInHalfOpenState(1)
                .automaticTransitionFromOpenToHalfOpenEnabled(false)
                .recordException(e -> e instanceof RedisUnavailableException || e instanceof RateLimitTimeoutException)
                .build());
        breaker.getEventPublisher().onStateTransition(e -> {
            if (e.getStateTransition().getToState() == CircuitBreaker.State.OPEN
                    && e.getStateTransition().getFromState() == CircuitBreaker.State.CLOSED) {
                stats.breakerOpened.increment();
                LOG.log(Level.WARNING, "redis-ratelimit: circuit breaker open, the fallback " + fallback + " decides");
            } else if (e.getStateTransition().getToState() == CircuitBreaker.State.CLOSED) {
                LOG.log(Level.INFO, "redis-ratelimit: Redis answers again, circuit breaker closed");
            }
        });
    }

    public static Builder builder(Client client) {
        return new Builder(client);
    }

    public Client client() {
        return client;
    }

    public StatsSnapshot stats() {
        return stats.snapshot();
    }

    /** Where its denials go, or null (deny events off). */
    public DenyEvents denyEvents() {
        return events;
    }

    /** Metrics on from now on ({@link RateLimitMeters#bind(Limiter)} calls it). */
    void observe(Observer o) {
        observer = o;
    }

    /** The Resilience4j breaker, for its metrics (resilience4j-micrometer binds it). */
    public CircuitBreaker circuitBreaker() {
        return breaker;
    }

    /** Open or half open (probing). */
    public boolean breakerOpen() {
        return breaker.getState() != CircuitBreaker.State.CLOSED;
    }

    public FallbackMode fallbackMode() {
        return fallback;
    }

    /**
     * Told of every server error a limiter call got (the fallback decided the
     * request): the starter re-pushes its policies on {@code ERR unknown
     * policy}, after a restart without persistence.
     */
    public void onServerError(java.util.function.Consumer<ServerErrorException> listener) {
        serverErrorListeners.add(listener);
    }

    /** Checks the rules (every parameter, before anything is sent) into a set decided together. */
    public RuleSet rules(List<Rule> rules) {
        if (rules == null || rules.isEmpty()) {
            throw new InvalidArgumentException("rules", "at least one rule");
        }
        if (rules.size() > 1 && client.driver().cluster()) {
            String first = rules.get(0).hashTag();
            for (Rule r : rules) {
                if (r.hashTag() == null || !r.hashTag().equals(first)) {
                    throw new InvalidArgumentException("key", "rule '" + r.name() + "': in a cluster, the keys of several rules"
                            + " (one RL.ALL) need one hash tag, such as {api}:user: and {api}:global");
                }
            }
        }
        for (Rule r : rules) {
            if (rules.size() > 1 && r.concurrency()) {
                throw new InvalidArgumentException("rules", "rule '" + r.name() + "' caps concurrency: RL.ALL refuses it,"
                        + " so it is a set of its own (its lease is released when the work is done)");
            }
            if (rules.size() > 1 && r.policy() == null && r.spec().zoned()) {
                throw new InvalidArgumentException("zone", "rule '" + r.name() + "' is a quota in " + r.spec().zone()
                        + ": RL.ALL's inline quotas count in UTC only, so it is a set of its own"
                        + " (or a policy rule, Rule.policy, which RL.ALL ... POLICY counts in its zone)");
            }
        }
        for (Rule r : rules) {
            checkGrants(r, rules.size());
        }
        List<RuleSet.Checked> checked = new ArrayList<>();
        for (Rule r : rules) {
            // A concurrency cap has no local level: leases are counted in the server only. A batched
            // rule's held units are its level in process; a striped rule's stripes are each exact.
            boolean rate = r.spec() != null && !r.concurrency();
            Spec localSpec = rate && r.global() && localLevel && r.enforced() && !r.grants().any() ? r.spec().share(share) : null;
            Spec fallbackSpec = rate ? r.spec().share(share) : null;
            String signature = r.policy() != null ? "POLICY " + r.policy() : r.spec().toString();
            checked.add(new RuleSet.Checked(r, localSpec, fallbackSpec, signature));
        }
        return new RuleSet(checked);
    }

    /**
     * A batched or striped rule: global, of a token bucket, a window or a
     * quota, a set of its own, its spec known. A striped rule's stripes are
     * inline calls of its spec's shares (each stripe's share is a spec of its
     * own): a policy rule striped is enforced (its policy is not consulted);
     * a batched policy rule asks {@code RL.HIT ... UPTO b}.
     */
    private static void checkGrants(Rule r, int setSize) {
        Grants g = r.grants();
        if (!g.any()) {
            return;
        }
        String option = g.striped() ? "striped" : "batched";
        if (!r.global()) {
            throw new InvalidArgumentException(option, "rule '" + r.name() + "' is not global: only a limit shared by every"
                    + " instance (Rule.asGlobal) is " + option);
        }
        if (r.spec() == null) {
            throw new InvalidArgumentException(option, "rule '" + r.name() + "' has no known spec: a " + option
                    + " rule needs its limit (Rule.policy(name, policy, spec))");
        }
        Algorithm a = r.spec().algorithm();
        if (a == Algorithm.LEAKYBUCKET || a == Algorithm.CONCURRENCY) {
            throw new InvalidArgumentException(option, "rule '" + r.name() + "' is a " + a.name().toLowerCase(java.util.Locale.ROOT)
                    + ", which UPTO cannot take: only a token bucket, a window or a quota is " + option);
        }
        if (g.striped() && r.policy() != null && !r.enforced()) {
            throw new InvalidArgumentException("striped", "rule '" + r.name() + "' is policy " + r.policy() + " in "
                    + r.mode() + " at " + r.rollout() + "%: a striped rule's stripes are inline calls of its spec's"
                    + " shares, which only an enforced rule (roll-out 100) can be");
        }
        if (setSize > 1) {
            throw new InvalidArgumentException(option, "rule '" + r.name() + "' is " + option + ": it is a set of its own"
                    + " (RL.ALL cannot take its grants or its stripes)");
        }
    }

    private volatile java.util.function.ToIntFunction<String> scales;
    private volatile Protection denials;

    /**
     * Tells {@code protection} of each call of a policy rule this limiter
     * denies without asking the server (a deny cache hit, a local-level
     * denial): {@link Protection#recordDenied}, reported as {@code DENIED n}
     * with the policy's outcomes, so that the server's stages see the whole
     * flood and not only the denials that reached it. Null stops it.
     */
    public void reportLocalDenials(Protection protection) {
        denials = protection;
    }

    private void deniedLocally(RuleSet.Checked c) {
        Protection p = denials;
        if (p != null && c.rule().policy() != null) {
            p.recordDenied(c.rule().policy());
        }
    }

    /**
     * Runs the local level of each global policy rule at the scale
     * {@code policyScale} gives for its policy (the protection loop's
     * {@link Protection#scale}, which is 100 until a scale is read): the
     * share of the scaled limit, what the server itself runs at that scale.
     * What was consumed carries over.
     */
    public void scaleLocalLevel(java.util.function.ToIntFunction<String> policyScale) {
        scales = policyScale;
    }

    private Spec localSpec(RuleSet.Checked c) {
        java.util.function.ToIntFunction<String> f = scales;
        if (f == null || c.rule().policy() == null) {
            return c.local();
        }
        int scale = f.applyAsInt(c.rule().policy());
        return scale >= 100 || scale < 1 ? c.local() : c.rule().spec().scaled(scale).share(share);
    }

    public RuleSet rules(Rule... rules) {
        return rules(List.of(rules));
    }

    /** Decides one request of {@code cost} units for {@code identity}, blocking up to the deadline. */
    public Decision check(RuleSet set, String identity, long cost) {
        return checkAsync(set, identity, cost).toCompletableFuture().join();
    }

    public Decision check(RuleSet set, String identity) {
        return check(set, identity, 1);
    }

    /** The asynchronous form: the stage never fails. */
    public CompletionStage<Decision> checkAsync(RuleSet set, String identity, long cost) {
        return checkAsync(set, java.util.Collections.nCopies(set.size(), identity), cost);
    }

    /** One identity per rule, in order (rules keyed by different things: a user, an IP). */
    public CompletionStage<Decision> checkAsync(RuleSet set, List<String> identities, long cost) {
        return checkAsync(set, identities, cost, Origin.UNKNOWN);
    }

    /** The blocking form of {@link #checkAsync(RuleSet, List, long, Origin)}. */
    public Decision check(RuleSet set, List<String> identities, long cost, Origin origin) {
        return checkAsync(set, identities, cost, origin).toCompletableFuture().join();
    }

    /**
     * With where the request came from: a denial's deny event carries its
     * {@code client_ip} and {@code user_agent} (the starter's HTTP interceptor
     * and filter pass them).
     */
    public CompletionStage<Decision> checkAsync(RuleSet set, List<String> identities, long cost, Origin origin) {
        List<RuleSet.Checked> rules = set.checked();
        if (identities == null || identities.size() != rules.size()) {
            throw new InvalidArgumentException("identities", "one per rule: " + rules.size() + " rules, "
                    + (identities == null ? "none" : identities.size()) + " identities");
        }
        List<String> keys = new ArrayList<>(rules.size());
        for (int i = 0; i < rules.size(); i++) {
            keys.add(Args.key(rules.get(i).rule().keyFor(identities.get(i))));
        }
        if (cost < 0 || cost > Spec.MAX_PARAM) {
            throw new InvalidArgumentException("cost", "must be an integer from 0 to " + Spec.MAX_PARAM + ", got " + cost);
        }
        // Every path's decision says the units it took: the cost when admitted, else 0.
        CompletionStage<Decision> decided = decide(set, keys, cost).thenApply(d -> {
            long granted = d.allowed() ? cost : 0;
            return d.granted() == granted ? d : d.withGranted(granted);
        });
        Observer o = observer;
        DenyEvents ev = events;
        if (o == null && ev == null) {
            return decided;
        }
        Origin from = origin == null ? Origin.UNKNOWN : origin;
        CompletableFuture<Decision> now = decided.toCompletableFuture();
        if (now.isDone() && !now.isCompletedExceptionally()) {
            // Decided without a round trip (deny cache, local level, fallback): no stage to chain.
            observed(rules, keys, now.join(), o, ev, from);
            return now;
        }
        return decided.thenApply(d -> {
            observed(rules, keys, d, o, ev, from);
            return d;
        });
    }

    /** Counts a decision (once per rule admitted, once for the rule that denied) and records a denial's event. */
    private static void observed(List<RuleSet.Checked> rules, List<String> keys, Decision d, Observer o, DenyEvents ev, Origin origin) {
        int at = reported(rules, d);
        if (o != null) {
            if (d.allowed()) {
                for (RuleSet.Checked c : rules) {
                    o.decided(c.label(), d.path(), true);
                }
            } else {
                o.decided(rules.get(at).label(), d.path(), false);
            }
            if (at >= 0 && (d.path() == Path.REDIS || d.path() == Path.LOCAL)) {
                o.remaining(rules.get(at).label(), d.limit(), d.remaining());
            }
        }
        if (ev != null && !d.allowed()) {
            ev.record(new DenyEvent(java.time.Instant.now(), keys.get(at), rules.get(at).label(), d.path().level(), "denied",
                    d.limit(), d.remaining(), d.waitMs(), origin.clientIp(), origin.userAgent()));
        }
    }

    /**
     * The rule a decision's fields describe: the one that denied; for an
     * admission, the only rule, or the first whose limit is the reply's
     * (-1 when none is: its remaining ratio is not set).
     */
    private static int reported(List<RuleSet.Checked> rules, Decision d) {
        if (d.deniedBy().isPresent() && d.deniedBy().getAsInt() < rules.size()) {
            return d.deniedBy().getAsInt();
        }
        if (rules.size() == 1 || !d.allowed()) {
            return 0;
        }
        for (int i = 0; i < rules.size(); i++) {
            Spec s = rules.get(i).rule().spec();
            if (s != null && s.limit() == d.limit()) {
                return i;
            }
        }
        return -1;
    }

    private CompletionStage<Decision> decide(RuleSet set, List<String> keys, long cost) {
        List<RuleSet.Checked> rules = set.checked();
        if (rules.size() == 1 && cost == 1 && rules.get(0).rule().grants().batched() && heldStates.size() < heldCapacity) {
            return decideBatched(set, rules.get(0), keys.get(0));
        }
        // A concurrency denial's wait is only the time until leases expire: a release frees room
        // earlier, so it is never cached.
        boolean cacheable = denyCache != null && !rules.get(0).rule().concurrency();
        if (cacheable && cost > 0) {
            for (int i = 0; i < rules.size(); i++) {
                Decision d = denyCache.get(cacheKey(rules.get(i), keys.get(i)));
                if (d != null) {
                    stats.denyCacheHits.increment();
                    deniedLocally(rules.get(i));
                    return CompletableFuture.completedFuture(d.withDeniedBy(i));
                }
            }
            if (rules.size() > 1) {
                Decision d = denyCache.get(setKey(rules, keys));
                if (d != null) {
                    stats.denyCacheHits.increment();
                    int by = d.deniedBy().orElse(0);
                    deniedLocally(rules.get(by < rules.size() ? by : 0));
                    return CompletableFuture.completedFuture(d);
                }
            }
        }
        List<LocalLimiters.Take> takes = new ArrayList<>();
        List<Integer> positions = new ArrayList<>();
        for (int i = 0; i < rules.size(); i++) {
            if (rules.get(i).local() != null) {
                takes.add(new LocalLimiters.Take(cacheKey(rules.get(i), keys.get(i)), localSpec(rules.get(i))));
                positions.add(i);
            }
        }
        boolean tookLocally = !takes.isEmpty() && cost > 0;
        Taken taken = null;
        if (tookLocally) {
            LocalLimiters.Outcome o = local.take(takes, cost);
            if (!o.allowed()) {
                int i = positions.get(o.index());
                stats.localDenied.increment();
                deniedLocally(rules.get(i));
                Decision d = o.decision();
                return CompletableFuture.completedFuture(new Decision(false, rules.get(i).rule().spec().limit(), 0,
                        d.waitMs(), d.resetMs(), OptionalInt.of(i), Path.LOCAL));
            }
            taken = new Taken(takes, positions.get(o.index()), o.decision());
        }
        Taken localTaken = taken;
        if (!breaker.tryAcquirePermission()) {
            stats.breakerSkipped.increment();
            return CompletableFuture.completedFuture(fallback(set, keys, cost, localTaken, false));
        }
        if (breaker.getState() == CircuitBreaker.State.HALF_OPEN) {
            // The one call let through half open is a PING, not a limiter write: a
            // write that timed out may have been admitted, and would count twice.
            stats.breakerSkipped.increment();
            probe();
            return CompletableFuture.completedFuture(fallback(set, keys, cost, localTaken, false));
        }
        if (owed.get() > 0) {
            // Sent ahead of the call on the same connection, so Redis counts them before deciding it.
            settle(set, keys);
        }
        stats.redisCalls.increment();
        long start = System.nanoTime();
        CompletionStage<Decision> call;
        try {
            call = send(set, keys, cost);
        } catch (RuntimeException e) {
            call = CompletableFuture.failedFuture(e);
        }
        return call.handle((d, err) -> {
            long took = System.nanoTime() - start;
            Observer timed = observer;
            if (timed != null) {
                timed.redisRoundTrip(took);
            }
            if (err == null) {
                breaker.onSuccess(took, TimeUnit.NANOSECONDS);
                (d.allowed() ? stats.redisAdmitted : stats.redisDenied).increment();
                // Only the local-only fallback reads the accounts.
                if (d.allowed() && cost > 0 && fallback == FallbackMode.LOCAL_ONLY) {
                    List<LocalLimiters.Take> charged = accountTakes(set, keys, null);
                    if (!charged.isEmpty()) {
                        accounts.charge(charged, cost);
                    }
                }
                if (!d.allowed() && tookLocally) {
                    // Another rule (a user's own limit) denied: the share is not spent on it.
                    local.giveBack(takes, cost);
                }
                if (!d.allowed() && cacheable) {
                    int i = d.deniedBy().orElse(0);
                    if (rules.size() > 1) {
                        denyCache.put(setKey(rules, keys), d);
                    } else if (i < rules.size()) {
                        denyCache.put(cacheKey(rules.get(i), keys.get(i)), d);
                    }
                }
                if (!d.allowed() && d.deniedBy().isEmpty()) {
                    d = d.withDeniedBy(0);
                }
                return d;
            }
            boolean lost = failed(err, took);
            return fallback(set, keys, cost, localTaken, lost);
        });
    }

    /**
     * Counts a failed limiter call (the breaker, the counters, the server
     * error listeners; a {@code MOVED} re-reads the slot map) and answers
     * whether its fate is unknown: a timeout or a lost connection may have
     * been admitted; an error reply counted nothing.
     */
    private boolean failed(Throwable err, long took) {
        Throwable e = err instanceof CompletionException && err.getCause() != null ? err.getCause() : err;
        breaker.onError(took, TimeUnit.NANOSECONDS, e);
        boolean lost = e instanceof RateLimitTimeoutException
                || e instanceof RedisUnavailableException && !(e instanceof NotConnectedException);
        if (e instanceof RateLimitTimeoutException) {
            stats.redisTimeouts.increment();
        } else if (e instanceof RedisUnavailableException) {
            stats.redisUnavailable.increment();
        } else {
            stats.redisErrors.increment();
            if (e instanceof ServerErrorException se) {
                if (String.valueOf(se.getMessage()).contains("MOVED") && client.driver().cluster()) {
                    refreshTopology();
                }
                for (java.util.function.Consumer<ServerErrorException> l : serverErrorListeners) {
                    l.accept(se);
                }
            }
        }
        LOG.log(Level.DEBUG, "redis-ratelimit: Redis failed, fallback " + fallback + " decides: " + e);
        return lost;
    }

    private void probe() {
        stats.probes.increment();
        long start = System.nanoTime();
        client.pingAsync().whenComplete((v, err) -> {
            long took = System.nanoTime() - start;
            if (err == null) {
                stats.probesOk.increment();
                breaker.onSuccess(took, TimeUnit.NANOSECONDS);
            } else {
                Throwable e = err instanceof CompletionException && err.getCause() != null ? err.getCause() : err;
                // Any failure of the probe keeps Redis out of the path.
                breaker.onError(took, TimeUnit.NANOSECONDS,
                        e instanceof RateLimitException ? e : new RedisUnavailableException("probe: " + e, e));
            }
        });
    }

    private CompletionStage<Decision> send(RuleSet set, List<String> keys, long cost) {
        List<RuleSet.Checked> rules = set.checked();
        Request units = Request.cost(cost);
        if (rules.size() == 1 && rules.get(0).rule().grants().striped()) {
            // The own stripe, then (on a denial) the next one: denied only when both deny.
            RuleSet.Checked c = rules.get(0);
            return topology().thenCompose(topo -> {
                List<Target> t = targets(c, keys.get(0), topo);
                return call(t.get(0), units).thenCompose(d0 -> {
                    if (d0.allowed() || cost == 0) {
                        return CompletableFuture.completedFuture(d0);
                    }
                    stats.redisCalls.increment();
                    return call(t.get(1), units).thenApply(d1 -> d1.allowed() ? d1 : bothDenied(d0, d1));
                });
            });
        }
        if (rules.size() == 1) {
            Rule r = rules.get(0).rule();
            return r.policy() != null ? client.hitAsync(r.policy(), keys.get(0), units) : client.limitAsync(keys.get(0), r.spec(), units);
        }
        List<Limit> limits = new ArrayList<>();
        for (int i = 0; i < rules.size(); i++) {
            Rule r = rules.get(i).rule();
            limits.add(r.policy() != null ? Limit.policy(keys.get(i), r.policy()) : Limit.of(keys.get(i), r.spec()));
        }
        return client.allAsync(limits, units);
    }

    /**
     * Sends Redis, as {@code COST n FORCE}, the units the fallback admitted on
     * these keys while Redis was not asked, before the keys' next call: Redis
     * counts them, and admits no more in their window than its limit leaves.
     * Not retried: a lost settlement only loosens the bound by its units.
     */
    private void settle(RuleSet set, List<String> keys) {
        List<RuleSet.Checked> rules = set.checked();
        for (int i = 0; i < rules.size(); i++) {
            RuleSet.Checked c = rules.get(i);
            if (c.fallback() == null) {
                continue;
            }
            Stripes topo = topology;
            if (c.rule().grants().striped() && topo == null) {
                // The stripes' keys are not known yet: settled once they are.
                continue;
            }
            long units = (c.local() != null ? local : accounts).settle(cacheKey(c, keys.get(i)));
            if (units == 0) {
                continue;
            }
            owed.addAndGet(-units);
            // A striped rule's units go to this instance's own stripe.
            Target target = targets(c, keys.get(i), topo).get(0);
            CompletionStage<Decision> sent;
            try {
                sent = call(target, Request.force(units));
            } catch (RuntimeException e) {
                sent = CompletableFuture.failedFuture(e);
            }
            sent.whenComplete((v, e) -> {
                if (e != null) {
                    LOG.log(Level.DEBUG, "redis-ratelimit: could not settle " + units + " units on " + keys.get(0) + ": " + e);
                }
            });
        }
    }

    /** What the local level took for a request, and the fields of its tightest account. */
    private record Taken(List<LocalLimiters.Take> takes, int position, Decision decision) {
    }

    /**
     * The accounts of the rules that have no local level: enforced rate rules
     * (a rule in shadow or off never denies on the server; nor here). With
     * {@code positions}, each take's rule.
     */
    private List<LocalLimiters.Take> accountTakes(RuleSet set, List<String> keys, List<Integer> positions) {
        List<RuleSet.Checked> rules = set.checked();
        List<LocalLimiters.Take> out = new ArrayList<>(rules.size());
        for (int i = 0; i < rules.size(); i++) {
            RuleSet.Checked c = rules.get(i);
            if (c.fallback() != null && c.local() == null && c.rule().mode() == PolicyMode.ENFORCE) {
                out.add(new LocalLimiters.Take(cacheKey(c, keys.get(i)), c.fallback()));
                if (positions != null) {
                    positions.add(i);
                }
            }
        }
        return out;
    }

    /**
     * The fallback's decision. The local-only fallback admits only what each
     * rule's account still has, so it never adds to what Redis may already
     * have counted for this instance. When the call's answer was
     * {@code lost}, its units stay charged whatever the fallback decides;
     * otherwise a denial gives back what the local level took.
     */
    private Decision fallback(RuleSet set, List<String> keys, long cost, Taken localTaken, boolean lost) {
        List<RuleSet.Checked> rules = set.checked();
        Decision d = switch (fallback) {
            case FAIL_OPEN -> admittedByFallback(rules);
            case FAIL_CLOSED -> new Decision(false, rules.get(0).rule().spec() == null ? 0 : rules.get(0).rule().spec().limit(),
                    0, openFor.toMillis(), openFor.toMillis(), OptionalInt.of(0), Path.FALLBACK);
            case LOCAL_ONLY -> {
                List<Integer> positions = new ArrayList<>();
                List<LocalLimiters.Take> takes = cost == 0 ? List.of() : accountTakes(set, keys, positions);
                LocalLimiters.Outcome o = takes.isEmpty() ? null : accounts.take(takes, cost);
                if (o != null && !o.allowed()) {
                    if (lost) {
                        accounts.charge(takes, cost);
                    }
                    Decision l = o.decision();
                    yield new Decision(false, rules.get(positions.get(o.index())).rule().spec().limit(), l.remaining(),
                            l.waitMs(), l.resetMs(), OptionalInt.of(positions.get(o.index())), Path.FALLBACK);
                }
                // The fields of the account left with the fewest units: what this admission used.
                int at = -1;
                Decision by = null;
                if (o != null) {
                    at = positions.get(o.index());
                    by = o.decision();
                }
                if (localTaken != null && (by == null || localTaken.decision().remaining() < by.remaining())) {
                    at = localTaken.position();
                    by = localTaken.decision();
                }
                if (by == null) {
                    yield admittedByFallback(rules);
                }
                if (!lost) {
                    // Redis never saw these units: they are sent to it when it answers again.
                    if (o != null) {
                        accounts.owe(takes, cost);
                        owed.addAndGet(cost * takes.size());
                    }
                    if (localTaken != null) {
                        local.owe(localTaken.takes(), cost);
                        owed.addAndGet(cost * localTaken.takes().size());
                    }
                }
                long limit = rules.get(at).rule().spec().limit();
                yield new Decision(true, limit, Math.min(limit, by.remaining()), by.waitMs(), by.resetMs(),
                        OptionalInt.empty(), Path.FALLBACK);
            }
        };
        (d.allowed() ? stats.fallbackAdmitted : stats.fallbackDenied).increment();
        if (!d.allowed() && localTaken != null && !lost) {
            local.giveBack(localTaken.takes(), cost);
        }
        return d;
    }

    private static Decision admittedByFallback(List<RuleSet.Checked> rules) {
        long limit = rules.get(0).rule().spec() == null ? 0 : rules.get(0).rule().spec().limit();
        return new Decision(true, limit, limit, 0, 0, OptionalInt.empty(), Path.FALLBACK);
    }

    private static String cacheKey(RuleSet.Checked c, String key) {
        return c.signature() + '\0' + key;
    }

    /**
     * The deny cache's entry for an RL.ALL denial: its rules and keys together. Its wait is the
     * slowest denier's, which need not be the rule it names: cached under that rule alone, another
     * identity sharing the rule's key would be denied past the rule's own wait.
     */
    private static String setKey(List<RuleSet.Checked> rules, List<String> keys) {
        StringBuilder out = new StringBuilder();
        for (int i = 0; i < rules.size(); i++) {
            out.append(cacheKey(rules.get(i), keys.get(i))).append('\u0001');
        }
        return out.toString();
    }

    // ---- stripes ---------------------------------------------------------

    /** One key a call goes to: the rule's, or a stripe's with its share of the spec. */
    private record Target(String key, Spec spec, String policy) {
    }

    private CompletionStage<Decision> call(Target t, Request units) {
        return t.policy() != null ? client.hitAsync(t.policy(), t.key(), units) : client.limitAsync(t.key(), t.spec(), units);
    }

    /** The rule's own key; for a striped rule, its own stripe then the next one ({@code (own + 1) mod N}). */
    private List<Target> targets(RuleSet.Checked c, String key, Stripes topo) {
        Rule r = c.rule();
        if (!r.grants().striped()) {
            return List.of(new Target(key, r.spec(), r.policy()));
        }
        int n = r.grants().stripes();
        List<String> tags = topo.tags(n);
        List<Spec> specs = stripeSpecs.computeIfAbsent(n + " " + r.spec(), k -> Stripes.shares(r.spec(), n));
        int own = stripeSeed % n;
        int other = (own + 1) % n;
        return List.of(new Target(Stripes.key(tags.get(own), key), specs.get(own), null),
                new Target(Stripes.key(tags.get(other), key), specs.get(other), null));
    }

    /** The stripe this instance tries first for a rule of {@code stripes} stripes (0-based). */
    public int ownStripe(int stripes) {
        return stripes <= 1 ? 0 : stripeSeed % stripes;
    }

    /**
     * The keys of a striped rule's stripes for {@code identity}, in stripe
     * order, on the slot map known now (read when first needed).
     */
    public List<String> stripeKeys(Rule rule, String identity) {
        Stripes topo = topology().toCompletableFuture().join();
        List<String> tags = topo.tags(rule.grants().stripes());
        String key = rule.keyFor(identity);
        return tags.stream().map(t -> Stripes.key(t, key)).toList();
    }

    /** The slot map: a standalone server's at once; a cluster's from {@code CLUSTER SLOTS} when first needed. */
    private CompletionStage<Stripes> topology() {
        Stripes t = topology;
        if (t != null) {
            return CompletableFuture.completedFuture(t);
        }
        if (!client.driver().cluster()) {
            t = Stripes.standalone();
            topology = t;
            return CompletableFuture.completedFuture(t);
        }
        return refreshTopology();
    }

    /**
     * Reads {@code CLUSTER SLOTS} (one read at a time); a changed map re-picks
     * the stripes' tags: only stripes whose master no longer holds them beside
     * its due move, and what they had consumed under the old keys is not seen
     * under the new ones.
     */
    private CompletableFuture<Stripes> refreshTopology() {
        CompletableFuture<Stripes> mine = new CompletableFuture<>();
        CompletableFuture<Stripes> running = loading.compareAndExchange(null, mine);
        if (running != null) {
            return running;
        }
        CompletableFuture<List<Object>> read;
        try {
            read = client.driver().sendToMasters(new io.redisratelimit.client.driver.Command("CLUSTER", List.of("SLOTS"), -1, true))
                    .orTimeout(Math.max(1000, client.deadline().toMillis()), TimeUnit.MILLISECONDS);
        } catch (RuntimeException e) {
            read = CompletableFuture.failedFuture(e);
        }
        read.whenComplete((replies, err) -> {
            try {
                if (err != null || replies == null || replies.isEmpty()) {
                    Throwable e = err instanceof CompletionException && err.getCause() != null ? err.getCause() : err;
                    mine.completeExceptionally(e instanceof RateLimitException ? e
                            : new RedisUnavailableException("CLUSTER SLOTS: " + (e == null ? "no master answered" : e.toString()), e));
                    return;
                }
                Stripes fresh = Stripes.fromClusterSlots(replies.get(0));
                Stripes before = topology;
                Stripes now = before == null ? fresh : before.sameMap(fresh) ? before : fresh.repick(before);
                if (before != null && now != before) {
                    LOG.log(Level.INFO, "redis-ratelimit: the cluster's slot map changed, stripes re-picked");
                }
                topology = now;
                if (before == null && !closed) {
                    // From now on the slot map is re-read once a second (Lettuce follows a MOVED itself).
                    try {
                        timer();
                    } catch (java.util.concurrent.RejectedExecutionException closing) {
                        LOG.log(Level.DEBUG, "redis-ratelimit: closed while reading the slot map");
                    }
                }
                mine.complete(now);
            } catch (RuntimeException e) {
                mine.completeExceptionally(e);
            } finally {
                loading.compareAndSet(mine, null);
            }
        });
        return mine;
    }

    /** Both stripes denied: the own stripe's fields with the shorter wait of the two (-1 only when both never pass). */
    private static Decision bothDenied(Decision own, Decision other) {
        long w0 = own.waitMs();
        long w1 = other.waitMs();
        long w = w0 < 0 ? w1 : w1 < 0 ? w0 : Math.min(w0, w1);
        return new Decision(false, own.limit(), own.remaining(), w, own.resetMs(), own.deniedBy(), own.path(), 0, 0);
    }

    // ---- batched rules -----------------------------------------------------

    /** One (rule, key)'s grant: units held, when they were granted, the rate, the next ask, the ask in flight. */
    private static final class Held {
        final Target target;
        long held;
        long grantedAt;
        long stamp;
        long nextAskAt = Long.MIN_VALUE;
        long second = Long.MIN_VALUE;
        long thisSecond;
        long lastSecond;
        long lastUsed;
        boolean asking;
        boolean dead;
        Decision last;
        final java.util.ArrayDeque<CompletableFuture<Decision>> waiters = new java.util.ArrayDeque<>();

        Held(Target target) {
            this.target = target;
        }

        /** Counts a decision in the instance's own seconds. */
        void count(long sinceOrigin, long now) {
            long s = sinceOrigin / 1_000_000_000L;
            if (s == second) {
                thisSecond++;
            } else {
                lastSecond = s == second + 1 ? thisSecond : 0;
                thisSecond = 1;
                second = s;
            }
            lastUsed = now;
        }

        /** Decisions per second: the previous whole second's, or this one's so far when more. */
        long rate() {
            return Math.max(lastSecond, thisSecond);
        }

        long resetMs() {
            return last == null ? 0 : last.resetMs();
        }

        /** An admission from the held units (one just taken). */
        Decision fromHeld() {
            return new Decision(true, target.spec().limit(), held, 0, resetMs(), OptionalInt.empty(), Path.GRANT, 0, 1);
        }

        /** A denial without a round trip: wait until the next ask (-1: never). */
        Decision deniedHere(long now) {
            long wait = nextAskAt == Long.MAX_VALUE ? -1 : Math.max(0, Decision.ceilDiv(nextAskAt - now, 1_000_000L));
            return new Decision(false, target.spec().limit(), 0, wait, resetMs(), OptionalInt.of(0), Path.GRANT, 0, 0);
        }
    }

    /** A batched rule's decision of one unit: its own stripe's grant, then (striped) the next stripe's. */
    private CompletionStage<Decision> decideBatched(RuleSet set, RuleSet.Checked c, String key) {
        CompletionStage<List<Target>> targets = c.rule().grants().striped()
                ? topology().thenApply(topo -> targets(c, key, topo))
                : CompletableFuture.completedFuture(targets(c, key, null));
        return targets.handle((t, err) -> {
            if (err != null) {
                failed(err, 0);
                return CompletableFuture.completedFuture(fallback(set, List.of(key), 1, null, false));
            }
            CompletionStage<Decision> first = take(set, c, key, t.get(0));
            if (t.size() == 1) {
                return first;
            }
            return first.thenCompose(d0 -> d0.allowed() || d0.path() == Path.FALLBACK ? CompletableFuture.completedFuture(d0)
                    : take(set, c, key, t.get(1)).thenApply(d1 -> d1.allowed() || d1.path() == Path.FALLBACK ? d1 : bothDenied(d0, d1)));
        }).thenCompose(x -> x).thenApply(d -> !d.allowed() && d.deniedBy().isEmpty() ? d.withDeniedBy(0) : d);
    }

    /** One unit from a key's grant: held units, a local denial until the next ask, the ask in flight, or a new ask. */
    private CompletionStage<Decision> take(RuleSet set, RuleSet.Checked c, String ruleKey, Target t) {
        Grants g = c.rule().grants();
        long hold = g.holdMs() * 1_000_000L;
        String stateKey = c.signature() + '\0' + t.key();
        for (;;) {
            Held h = heldStates.computeIfAbsent(stateKey, k -> new Held(t));
            long now = System.nanoTime();
            long expired = 0;
            Decision ready = null;
            CompletableFuture<Decision> waiting = null;
            long batch = 0;
            synchronized (h) {
                if (h.dead) {
                    continue;
                }
                h.count(now - origin, now);
                if (h.held > 0 && now - h.grantedAt >= hold) {
                    expired = h.held;
                    h.held = 0;
                }
                if (h.held > 0) {
                    h.held--;
                    ready = h.fromHeld();
                } else if (now < h.nextAskAt) {
                    ready = h.deniedHere(now);
                } else if (h.asking) {
                    waiting = new CompletableFuture<>();
                    h.waiters.add(waiting);
                } else {
                    h.asking = true;
                    batch = g.batchSize(h.rate(), t.spec().limit());
                }
            }
            if (expired > 0) {
                giveBack(t, expired);
            }
            if (ready != null) {
                (ready.allowed() ? stats.grantAdmitted : stats.grantDenied).increment();
                if (!ready.allowed()) {
                    deniedLocally(c);
                }
                return CompletableFuture.completedFuture(ready);
            }
            if (waiting != null) {
                return waiting;
            }
            return ask(set, c, ruleKey, h, batch, now, hold);
        }
    }

    /** {@code UPTO b} for a key: the one call in flight for it; its answer serves the asker, then the waiters in arrival order. */
    private CompletionStage<Decision> ask(RuleSet set, RuleSet.Checked c, String ruleKey, Held h, long batch, long askAt, long hold) {
        if (!breaker.tryAcquirePermission()) {
            stats.breakerSkipped.increment();
            return CompletableFuture.completedFuture(askFailed(set, ruleKey, h, false));
        }
        if (breaker.getState() == CircuitBreaker.State.HALF_OPEN) {
            stats.breakerSkipped.increment();
            probe();
            return CompletableFuture.completedFuture(askFailed(set, ruleKey, h, false));
        }
        if (owed.get() > 0) {
            settle(set, List.of(ruleKey));
        }
        stats.redisCalls.increment();
        stats.grantAsks.increment();
        long start = System.nanoTime();
        CompletionStage<Decision> sent;
        try {
            sent = call(h.target, Request.upto(batch));
        } catch (RuntimeException e) {
            sent = CompletableFuture.failedFuture(e);
        }
        return sent.handle((d, err) -> {
            long took = System.nanoTime() - start;
            Observer timed = observer;
            if (timed != null) {
                timed.redisRoundTrip(took);
            }
            if (err != null) {
                return askFailed(set, ruleKey, h, failed(err, took));
            }
            breaker.onSuccess(took, TimeUnit.NANOSECONDS);
            return granted(set, c, ruleKey, h, batch, askAt, hold, d);
        });
    }

    /** Redis did not answer the ask: the asker and every waiter go through the fallback, as any rule. */
    private Decision askFailed(RuleSet set, String ruleKey, Held h, boolean lost) {
        List<CompletableFuture<Decision>> waiters;
        synchronized (h) {
            h.asking = false;
            waiters = new ArrayList<>(h.waiters);
            h.waiters.clear();
        }
        Decision mine = fallback(set, List.of(ruleKey), 1, null, lost);
        for (CompletableFuture<Decision> w : waiters) {
            w.complete(fallback(set, List.of(ruleKey), 1, null, false));
        }
        return mine;
    }

    /** The grant's answer: the asker takes one unit, the waiters take from the rest in arrival order. */
    private Decision granted(RuleSet set, RuleSet.Checked c, String ruleKey, Held h, long batch, long askAt, long hold, Decision d) {
        long g = d.granted();
        long now = System.nanoTime();
        List<CompletableFuture<Decision>> waiters;
        List<Decision> answers = new ArrayList<>();
        long stamp = 0;
        boolean expire = false;
        long gone = 0;
        synchronized (h) {
            h.asking = false;
            h.last = d;
            waiters = new ArrayList<>(h.waiters);
            h.waiters.clear();
            if (g >= 1) {
                h.held = g - 1;
                h.grantedAt = now;
                stamp = ++h.stamp;
                if (g < batch) {
                    // The limiter is drained while this instance is busy: ask again after hold_ms.
                    h.nextAskAt = askAt + hold;
                }
                for (int i = 0; i < waiters.size(); i++) {
                    if (h.held > 0) {
                        h.held--;
                        answers.add(h.fromHeld());
                    } else {
                        answers.add(h.deniedHere(now));
                    }
                }
                expire = h.held > 0;
                if (expire && h.dead) {
                    // Granted after close (or after the key was swept): back at once.
                    stamp = 0;
                    expire = false;
                    gone = h.held;
                    h.held = 0;
                }
            } else if (d.allowed()) {
                // A policy in shadow or off: admitted, nothing taken.
                for (int i = 0; i < waiters.size(); i++) {
                    answers.add(d.withPath(Path.GRANT).withGranted(0));
                }
            } else {
                long wait = d.waitMs();
                h.nextAskAt = wait < 0 ? Long.MAX_VALUE : askAt + Math.max(wait * 1_000_000L, batch > 1 ? hold : 0);
                for (int i = 0; i < waiters.size(); i++) {
                    answers.add(h.deniedHere(now));
                }
            }
        }
        (d.allowed() ? stats.redisAdmitted : stats.redisDenied).increment();
        if (g >= 1 && fallback == FallbackMode.LOCAL_ONLY) {
            List<LocalLimiters.Take> charged = accountTakes(set, List.of(ruleKey), null);
            if (!charged.isEmpty()) {
                accounts.charge(charged, g);
            }
        }
        if (gone > 0) {
            giveBack(h.target, gone);
        }
        if (expire) {
            long at = stamp;
            try {
                timer().schedule(() -> expire(h, at), hold, TimeUnit.NANOSECONDS);
            } catch (java.util.concurrent.RejectedExecutionException closing) {
                expire(h, at);
            }
        }
        for (int i = 0; i < waiters.size(); i++) {
            Decision a = answers.get(i);
            (a.allowed() ? stats.grantAdmitted : stats.grantDenied).increment();
            if (!a.allowed()) {
                deniedLocally(c);
            }
            waiters.get(i).complete(a);
        }
        return g >= 1 ? d.withGranted(1) : d.withGranted(0);
    }

    /** Units of grant {@code stamp} still held after hold_ms go back. */
    private void expire(Held h, long stamp) {
        long units = 0;
        synchronized (h) {
            if (h.stamp == stamp && h.held > 0) {
                units = h.held;
                h.held = 0;
            }
        }
        if (units > 0) {
            giveBack(h.target, units);
        }
    }

    /** {@code REFUND n}: fire and forget, never retried (a lost refund only under-admits). */
    private CompletableFuture<Decision> giveBack(Target t, long units) {
        stats.grantRefunds.increment();
        CompletableFuture<Decision> sent;
        try {
            sent = call(t, Request.refund(units)).toCompletableFuture();
        } catch (RuntimeException e) {
            sent = CompletableFuture.failedFuture(e);
        }
        sent.whenComplete((v, e) -> {
            if (e != null) {
                LOG.log(Level.DEBUG, "redis-ratelimit: could not give back " + units + " units of " + t.key() + ": " + e);
            }
        });
        return sent;
    }

    /** The timer of grants and stripes: one daemon thread, started when first needed. */
    private java.util.concurrent.ScheduledExecutorService timer() {
        java.util.concurrent.ScheduledExecutorService t = timer;
        if (t != null) {
            return t;
        }
        synchronized (heldStates) {
            if (closed) {
                throw new java.util.concurrent.RejectedExecutionException("the limiter is closed");
            }
            if (timer == null) {
                java.util.concurrent.ScheduledThreadPoolExecutor e = new java.util.concurrent.ScheduledThreadPoolExecutor(1, r -> {
                    Thread th = new Thread(r, "redis-ratelimit-grants");
                    th.setDaemon(true);
                    return th;
                });
                e.setRemoveOnCancelPolicy(true);
                e.scheduleWithFixedDelay(this::tick, 1, 1, TimeUnit.SECONDS);
                timer = e;
                // Held units go back at the JVM's exit too, when the application never closes the limiter.
                Thread hook = new Thread(this::giveBackHeld, "redis-ratelimit-grants-exit");
                try {
                    Runtime.getRuntime().addShutdownHook(hook);
                    exitHook = hook;
                } catch (IllegalStateException shuttingDown) {
                    exitHook = null;
                }
            }
            return timer;
        }
    }

    /** Once a second: forget idle keys holding nothing; in a cluster, re-read the slot map of the stripes. */
    private void tick() {
        long now = System.nanoTime();
        for (java.util.Map.Entry<String, Held> e : heldStates.entrySet()) {
            Held h = e.getValue();
            synchronized (h) {
                if (!h.asking && h.held == 0 && h.waiters.isEmpty() && now >= h.nextAskAt && now - h.lastUsed > 2_000_000_000L) {
                    h.dead = true;
                    heldStates.remove(e.getKey(), h);
                }
            }
        }
        if (topology != null && client.driver().cluster()) {
            refreshTopology();
        }
    }

    /** At close (or the JVM's exit): every held unit goes back, awaited up to the client's deadline. */
    private void giveBackHeld() {
        java.util.concurrent.ScheduledExecutorService t;
        synchronized (heldStates) {
            closed = true;
            t = timer;
        }
        if (t != null) {
            t.shutdownNow();
        }
        List<CompletableFuture<Decision>> sent = new ArrayList<>();
        for (Held h : heldStates.values()) {
            long units;
            synchronized (h) {
                units = h.held;
                h.held = 0;
                h.dead = true;
            }
            if (units > 0) {
                sent.add(giveBack(h.target, units));
            }
        }
        heldStates.clear();
        if (sent.isEmpty()) {
            return;
        }
        try {
            CompletableFuture.allOf(sent.toArray(CompletableFuture[]::new)).get(client.deadline().toMillis() + 1000, TimeUnit.MILLISECONDS);
        } catch (Exception e) {
            if (e instanceof InterruptedException) {
                Thread.currentThread().interrupt();
            }
            LOG.log(Level.DEBUG, "redis-ratelimit: held units not all given back at close: " + e);
        }
    }

    /** Unused by the kit: Resilience4j's own exception, named here so callers can catch it if they wrap calls. */
    static Class<CallNotPermittedException> notPermitted() {
        return CallNotPermittedException.class;
    }

    /**
     * Gives back every unit a batched rule holds ({@code REFUND}, awaited up
     * to the deadline; a JVM exit without close does it too, from a shutdown
     * hook), then closes the client and the deny events given to the builder
     * (what they hold is shipped, within their timeout).
     */
    @Override
    public void close() {
        try {
            giveBackHeld();
            Thread hook = exitHook;
            if (hook != null && Thread.currentThread() != hook) {
                try {
                    Runtime.getRuntime().removeShutdownHook(hook);
                } catch (IllegalStateException shuttingDown) {
                    // The JVM is exiting: the hook runs, finds nothing held, returns.
                }
            }
            if (events != null) {
                events.close();
            }
        } finally {
            client.close();
        }
    }
}

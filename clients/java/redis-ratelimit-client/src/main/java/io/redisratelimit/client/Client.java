package io.redisratelimit.client;

import io.redisratelimit.client.driver.Command;
import io.redisratelimit.client.driver.Driver;

import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.Optional;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.CompletionException;
import java.util.concurrent.CompletionStage;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.TimeoutException;

/**
 * Typed calls of every {@code RL.*} command, synchronous and asynchronous
 * ({@link CompletionStage}), over a {@link Driver} (Lettuce or Jedis,
 * standalone, Sentinel or cluster). Each call is one round trip to the node
 * that owns its key, bounded by the deadline, and never sent twice: a call
 * that timed out may have been admitted.
 *
 * <pre>{@code
 * Client rl = Client.connect(LettuceDriver.connect(RedisURI.create("redis://localhost")));
 * Decision d = rl.limit("rl:user:42", Spec.tokenBucket(5, 5, 1000));
 * if (!d.allowed()) { ... d.retryAfter() ... }
 * }</pre>
 *
 * <p>Sealed: its one subclass is {@link RateLimitClient}, its former name,
 * kept deprecated for one release (hence the warning suppressed here, for
 * the {@code permits} clause).
 */
@SuppressWarnings("removal")
public sealed class Client implements AutoCloseable permits RateLimitClient {
    /** The oldest module the kit works with: {@code MODULE LIST}'s {@code ver}, major * 10000 + minor * 100 + patch. */
    public static final long MIN_MODULE_VERSION = 100;
    /**
     * The default deadline of one call, the same in every kit: 100 ms, which a
     * healthy Redis meets on a loaded host, a cold JVM included (measured in
     * docs/clients.md). A tighter deadline sends answers Redis did give to the
     * fallback, and a call that timed out may have been counted.
     */
    public static final Duration DEFAULT_DEADLINE = Duration.ofMillis(100);

    private final Driver driver;
    private final Duration deadline;
    private final long moduleVersion;

    /** Package-private: the kit's factories, and the deprecated {@link RateLimitClient}, make clients. */
    Client(Driver driver, Duration deadline, long moduleVersion) {
        this.driver = driver;
        this.deadline = deadline;
        this.moduleVersion = moduleVersion;
    }

    /** Checks {@code MODULE LIST} (on every master) and answers a client with the default deadline. */
    public static Client connect(Driver driver) {
        return connect(driver, DEFAULT_DEADLINE);
    }

    /**
     * Opens the connection ({@code PING}) and checks {@code MODULE LIST} on every master: a server without the
     * {@code ratelimit} module, or with an older one, is a
     * {@link ModuleMissingException} here, not an open breaker later.
     */
    public static Client connect(Driver driver, Duration deadline) {
        if (deadline == null || deadline.isNegative() || deadline.isZero()) {
            throw new InvalidArgumentException("deadline", "must be above 0");
        }
        // Opened and checked now, so that the first requests pay neither the connection nor the first round trip.
        await(driver.send(new Command("PING", List.of(), -1, false)), "PING", Duration.ofSeconds(10));
        List<Object> replies = await(driver.sendToMasters(new Command("MODULE", List.of("LIST"), -1, true)),
                "MODULE LIST", Duration.ofSeconds(10));
        long version = Long.MAX_VALUE;
        for (Object reply : replies) {
            version = Math.min(version, moduleVersion(reply));
        }
        if (version < MIN_MODULE_VERSION) {
            throw new ModuleMissingException("the ratelimit module is at version " + version
                    + ", the kit needs " + MIN_MODULE_VERSION + " or later: upgrade libredis_ratelimit.so");
        }
        return new Client(driver, deadline, version);
    }

    /**
     * A client over a driver that is not connected yet ({@link
     * io.redisratelimit.client.driver.DeferredDriver}): nothing is checked
     * now, the driver checks when it connects; {@link #moduleVersion()} is 0.
     */
    public static Client connecting(Driver driver, Duration deadline) {
        if (deadline == null || deadline.isNegative() || deadline.isZero()) {
            throw new InvalidArgumentException("deadline", "must be above 0");
        }
        return new Client(driver, deadline, 0);
    }

    private static long moduleVersion(Object reply) {
        if (reply instanceof List<?> modules) {
            for (Object m : modules) {
                if (m instanceof List<?> fields) {
                    Object name = null;
                    Object ver = null;
                    for (int i = 0; i + 1 < fields.size(); i += 2) {
                        if ("name".equals(fields.get(i))) {
                            name = fields.get(i + 1);
                        } else if ("ver".equals(fields.get(i))) {
                            ver = fields.get(i + 1);
                        }
                    }
                    if ("ratelimit".equals(name) && ver instanceof Long v) {
                        return v;
                    }
                }
            }
        }
        throw new ModuleMissingException("the server has no 'ratelimit' module (MODULE LIST answered " + reply
                + "): load target/release/libredis_ratelimit.so with --loadmodule, or use a server that can load modules");
    }

    /** The module's version, as {@code MODULE LIST} gave it at start-up (the lowest of the masters). */
    public long moduleVersion() {
        return moduleVersion;
    }

    public Duration deadline() {
        return deadline;
    }

    /** A client over the same driver with another deadline. */
    public Client withDeadline(Duration newDeadline) {
        if (newDeadline == null || newDeadline.isNegative() || newDeadline.isZero()) {
            throw new InvalidArgumentException("deadline", "must be above 0");
        }
        return new Client(driver, newDeadline, moduleVersion);
    }

    public Driver driver() {
        return driver;
    }

    // ---- limiters ----------------------------------------------------------

    /**
     * {@code RL.<ALGORITHM> key <params> [COST n [FORCE] | REFUND n | UPTO n]}.
     * {@code UPTO} on a leaky bucket or a concurrency cap is refused here, in
     * the server's words, naming {@code UPTO}.
     */
    public CompletionStage<Decision> limitAsync(String key, Spec spec, Request units) {
        if (units.upto() && (spec.algorithm() == Algorithm.LEAKYBUCKET || spec.algorithm() == Algorithm.CONCURRENCY)) {
            throw new InvalidArgumentException("UPTO", uptoRefusal(spec.algorithm(), -1));
        }
        List<String> args = new ArrayList<>();
        args.add(Args.key(key));
        args.addAll(spec.words().subList(1, spec.words().size()));
        units.appendTo(args);
        return decision(new Command(spec.algorithm().command(), args, 0, true), units);
    }

    /**
     * The server's words refusing {@code UPTO} on a leaky bucket or a
     * concurrency cap: of its own command, or ({@code spec} from 1) of
     * {@code RL.ALL}'s spec at that position.
     */
    static String uptoRefusal(Algorithm a, int spec) {
        return spec < 1 ? "UPTO is not an option of " + a.command()
                : "UPTO is not an option of RL.ALL with a " + a.name() + " limiter (spec " + spec + ")";
    }

    public CompletionStage<Decision> limitAsync(String key, Spec spec) {
        return limitAsync(key, spec, Request.ONE);
    }

    public Decision limit(String key, Spec spec, Request units) {
        return sync(limitAsync(key, spec, units), spec.algorithm().command(), units);
    }

    public Decision limit(String key, Spec spec) {
        return limit(key, spec, Request.ONE);
    }

    public Decision tokenBucket(String key, long capacity, long refillCount, long refillMs) {
        return limit(key, Spec.tokenBucket(capacity, refillCount, refillMs));
    }

    public Decision leakyBucket(String key, long capacity, long leakCount, long leakMs) {
        return limit(key, Spec.leakyBucket(capacity, leakCount, leakMs));
    }

    public Decision sliding(String key, long limit, long windowMs) {
        return limit(key, Spec.sliding(limit, windowMs));
    }

    public Decision hashWindow(String key, long limit, long windowMs, long bucketMs) {
        return limit(key, Spec.hashWindow(limit, windowMs, bucketMs));
    }

    public Decision fixedWindow(String key, long limit, long windowMs) {
        return limit(key, Spec.fixedWindow(limit, windowMs));
    }

    /**
     * {@code RL.QUOTA key limit PERIOD [TZ zone] [COST n [FORCE] | REFUND n]}:
     * at most {@code limit} units per calendar period in {@code zone} (null:
     * UTC). The decision's {@code resetMs} is the time until the period ends,
     * a denial's {@code waitMs} the time until the next one starts.
     */
    public CompletionStage<Decision> quotaAsync(String key, long limit, Period period, String zone, Request units) {
        return limitAsync(key, Spec.quota(limit, period, zone), units);
    }

    public CompletionStage<Decision> quotaAsync(String key, long limit, Period period, String zone) {
        return quotaAsync(key, limit, period, zone, Request.ONE);
    }

    public CompletionStage<Decision> quotaAsync(String key, long limit, Period period) {
        return quotaAsync(key, limit, period, null, Request.ONE);
    }

    public Decision quota(String key, long limit, Period period, String zone, Request units) {
        return limit(key, Spec.quota(limit, period, zone), units);
    }

    public Decision quota(String key, long limit, Period period, String zone) {
        return quota(key, limit, period, zone, Request.ONE);
    }

    public Decision quota(String key, long limit, Period period) {
        return quota(key, limit, period, null, Request.ONE);
    }

    /** {@code RL.HIT policy key [COST n [FORCE] | REFUND n]}: routed by the key (its second argument). */
    public CompletionStage<Decision> hitAsync(String policy, String key, Request units) {
        List<String> args = new ArrayList<>(List.of(Args.policyName(policy), Args.key(key)));
        units.appendTo(args);
        return decision(new Command("RL.HIT", args, 1, true), units);
    }

    public CompletionStage<Decision> hitAsync(String policy, String key) {
        return hitAsync(policy, key, Request.ONE);
    }

    public Decision hit(String policy, String key, Request units) {
        return sync(hitAsync(policy, key, units), "RL.HIT", units);
    }

    public Decision hit(String policy, String key) {
        return hit(policy, key, Request.ONE);
    }

    /**
     * {@code RL.ALL numkeys key... spec... [COST n]}: all or nothing.
     * In a cluster the keys must share a slot ({@code {order:create}:...}).
     */
    public CompletionStage<Decision> allAsync(List<Limit> limits, Request units) {
        return decision(new Command("RL.ALL", allArgs(limits, units), 1, true), units);
    }

    private static List<String> allArgs(List<Limit> limits, Request units) {
        if (limits == null || limits.isEmpty()) {
            throw new InvalidArgumentException("numkeys", "RL.ALL takes at least one limit");
        }
        if (units.refund() || units.force()) {
            throw new InvalidArgumentException("cost", "RL.ALL takes COST n or UPTO n only");
        }
        if (units.upto()) {
            for (int i = 0; i < limits.size(); i++) {
                Spec s = limits.get(i).spec();
                if (s != null && (s.algorithm() == Algorithm.LEAKYBUCKET || s.algorithm() == Algorithm.CONCURRENCY)) {
                    throw new InvalidArgumentException("UPTO", uptoRefusal(s.algorithm(), i + 1));
                }
            }
        }
        List<String> args = new ArrayList<>();
        args.add(Integer.toString(limits.size()));
        for (Limit l : limits) {
            args.add(l.key());
        }
        for (Limit l : limits) {
            if (l.spec() != null) {
                args.addAll(l.spec().words());
            } else {
                args.add("POLICY");
                args.add(l.policy());
            }
        }
        units.appendTo(args);
        return args;
    }

    public Decision all(List<Limit> limits, Request units) {
        return sync(allAsync(limits, units), "RL.ALL", units);
    }

    public Decision all(List<Limit> limits) {
        return all(limits, Request.ONE);
    }

    // ---- concurrency: leases --------------------------------------------

    /**
     * {@code RL.CONCURRENCY key limit lease_ms [COST n]}: at most {@code limit}
     * units held at once. An admission's {@link Decision#lease()} is the id to
     * give back with {@link #release}; {@link #lease} wraps it in a handle.
     */
    public CompletionStage<Decision> concurrencyAsync(String key, long limit, long leaseMs, Request units) {
        return limitAsync(key, Spec.concurrency(limit, leaseMs), units);
    }

    public Decision concurrency(String key, long limit, long leaseMs, Request units) {
        return limit(key, Spec.concurrency(limit, leaseMs), units);
    }

    public Decision concurrency(String key, long limit, long leaseMs) {
        return concurrency(key, limit, leaseMs, Request.ONE);
    }

    /** {@code RL.RELEASE key lease}: true when the lease was held until now, false when it had already ended. */
    public CompletionStage<Boolean> releaseAsync(String key, long lease) {
        Command c = new Command("RL.RELEASE", List.of(Args.key(key), Long.toString(Args.lease(lease))), 0, false);
        return within(c, leaseDeadline()).thenApply(r -> bool(c, r));
    }

    public boolean release(String key, long lease) {
        return await(releaseAsync(key, lease).toCompletableFuture(), "RL.RELEASE", leaseDeadline().plusSeconds(1));
    }

    /** {@code RL.RENEW key lease lease_ms}: the lease is held for {@code leaseTime} from now; false when it had already ended. */
    public CompletionStage<Boolean> renewAsync(String key, long lease, Duration leaseTime) {
        long ms = Args.positive("lease_ms", leaseTime == null ? 0 : leaseTime.toMillis());
        Command c = new Command("RL.RENEW", List.of(Args.key(key), Long.toString(Args.lease(lease)), Long.toString(ms)), 0, false);
        return within(c, leaseDeadline()).thenApply(r -> bool(c, r));
    }

    public boolean renew(String key, long lease, Duration leaseTime) {
        return await(renewAsync(key, lease, leaseTime).toCompletableFuture(), "RL.RENEW", leaseDeadline().plusSeconds(1));
    }

    /**
     * A {@link Lease} of {@code cost} units of a concurrency cap, or a
     * {@link RateLimitDeniedException}. With {@code wait} null the call is
     * answered at once (the shared connection); otherwise it waits up to
     * {@code wait} for room as {@link #acquireAsync} does ({@code BLOCK}, on
     * a connection of its own; {@link Duration#ZERO} waits without a limit).
     */
    public CompletionStage<Lease> leaseAsync(String key, long limit, long leaseMs, Request units, Duration wait) {
        Spec spec = Spec.concurrency(limit, leaseMs);
        CompletionStage<Decision> d = wait == null ? limitAsync(key, spec, units) : acquireAsync(key, spec, units, wait);
        return d.thenApply(decision -> {
            if (!decision.allowed()) {
                throw new RateLimitDeniedException("RL.CONCURRENCY", decision);
            }
            return Lease.of(this, key, decision, Duration.ofMillis(leaseMs));
        });
    }

    /** One unit of a concurrency cap, answered at once: {@code try (Lease l = rl.lease(key, 3, 30_000)) { ... }}. */
    public Lease lease(String key, long limit, long leaseMs) {
        return lease(key, limit, leaseMs, Request.ONE, null);
    }

    /** One unit of a concurrency cap, waiting up to {@code wait} for room. */
    public Lease lease(String key, long limit, long leaseMs, Duration wait) {
        return lease(key, limit, leaseMs, Request.ONE, wait);
    }

    public Lease lease(String key, long limit, long leaseMs, Request units, Duration wait) {
        Duration limitOfWait = wait == null ? deadline.plusSeconds(1) : acquireDeadline(wait);
        return await(leaseAsync(key, limit, leaseMs, units, wait).toCompletableFuture(), "RL.CONCURRENCY",
                limitOfWait == null ? null : limitOfWait.plusSeconds(1));
    }

    // ---- waiting: BLOCK ----------------------------------------------------

    /**
     * {@code RL.<ALGORITHM> key <params> [COST n] BLOCK timeout_ms}: waits in
     * the server (no polling) until the request is admitted, or
     * {@code timeout} passes (then the denial). {@link Duration#ZERO} waits
     * without a limit. The call goes on a connection of its own (never the
     * shared multiplexed one, which it would stall), is bounded by
     * {@code timeout} plus a margin ({@code max(1 s, 10 %)}) rather than the
     * client's deadline, and is never sent twice. It completes when the caller
     * may act: for an admitted leaky bucket, once its {@code wait_ms} has
     * passed.
     */
    public CompletionStage<Decision> acquireAsync(String key, Spec spec, Request units, Duration timeout) {
        if (units.upto() && (spec.algorithm() == Algorithm.LEAKYBUCKET || spec.algorithm() == Algorithm.CONCURRENCY)) {
            throw new InvalidArgumentException("UPTO", uptoRefusal(spec.algorithm(), -1));
        }
        List<String> args = new ArrayList<>();
        args.add(Args.key(key));
        args.addAll(spec.words().subList(1, spec.words().size()));
        units.appendTo(args);
        return acquire(new Command(spec.algorithm().command(), args, 0, true), units, timeout, spec.algorithm() == Algorithm.LEAKYBUCKET);
    }

    public CompletionStage<Decision> acquireAsync(String key, Spec spec, Duration timeout) {
        return acquireAsync(key, spec, Request.ONE, timeout);
    }

    /** The blocking form of {@link #acquireAsync(String, Spec, Request, Duration)}: a denial is a decision with {@code allowed} false. */
    public Decision acquire(String key, Spec spec, Request units, Duration timeout) {
        return awaitAcquire(acquireAsync(key, spec, units, timeout), spec.algorithm().command(), timeout);
    }

    public Decision acquire(String key, Spec spec, Duration timeout) {
        return acquire(key, spec, Request.ONE, timeout);
    }

    /**
     * {@code RL.HIT policy key [COST n] BLOCK timeout_ms}, as
     * {@link #acquireAsync(String, Spec, Request, Duration)}. For a leaky-bucket
     * policy the reply's {@code wait_ms} is waited too.
     */
    public CompletionStage<Decision> acquireHitAsync(String policy, String key, Request units, Duration timeout) {
        List<String> args = new ArrayList<>(List.of(Args.policyName(policy), Args.key(key)));
        units.appendTo(args);
        return acquire(new Command("RL.HIT", args, 1, true), units, timeout, true);
    }

    public Decision acquireHit(String policy, String key, Request units, Duration timeout) {
        return awaitAcquire(acquireHitAsync(policy, key, units, timeout), "RL.HIT", timeout);
    }

    public Decision acquireHit(String policy, String key, Duration timeout) {
        return acquireHit(policy, key, Request.ONE, timeout);
    }

    /** {@code RL.ALL ... [COST n] BLOCK timeout_ms}: admitted when every limiter admits at once. */
    public CompletionStage<Decision> acquireAllAsync(List<Limit> limits, Request units, Duration timeout) {
        List<String> args = allArgs(limits, units);
        return acquire(new Command("RL.ALL", args, 1, true), units, timeout, true);
    }

    public Decision acquireAll(List<Limit> limits, Request units, Duration timeout) {
        return awaitAcquire(acquireAllAsync(limits, units, timeout), "RL.ALL", timeout);
    }

    public Decision acquireAll(List<Limit> limits, Duration timeout) {
        return acquireAll(limits, Request.ONE, timeout);
    }

    /** The deadline of an acquire: its BLOCK timeout plus {@code max(1 s, 10 %)}; null (none) for a wait without a limit. */
    public static Duration acquireDeadline(Duration timeout) {
        long ms = blockMs(timeout);
        return ms == 0 ? null : Duration.ofMillis(ms + Math.max(1000, ms / 10));
    }

    /** {@code BLOCK}'s milliseconds for {@code timeout}; refused naming {@code timeout_ms}. Package-private for the contract test. */
    static long blockMs(Duration timeout) {
        if (timeout == null || timeout.isNegative()) {
            throw new InvalidArgumentException("timeout_ms", "must be at least 0 (0 waits without a limit), got " + timeout);
        }
        long ms = timeout.toMillis();
        if (ms > Spec.MAX_PARAM) {
            throw new InvalidArgumentException("timeout_ms", "must be at most " + Spec.MAX_PARAM + " ms, got " + ms);
        }
        if (ms == 0 && !timeout.isZero()) {
            ms = 1;
        }
        return ms;
    }

    private CompletionStage<Decision> acquire(Command base, Request units, Duration timeout, boolean mayQueue) {
        if (units.refund() || units.force()) {
            throw new InvalidArgumentException("block", "BLOCK waits for COST n, not FORCE or REFUND");
        }
        long ms = blockMs(timeout);
        List<String> args = new ArrayList<>(base.args());
        args.add("BLOCK");
        args.add(Long.toString(ms));
        Command command = new Command(base.name(), args, base.keyIndex(), true);
        CompletableFuture<Object> sent = driver.sendBlocking(command);
        CompletableFuture<Object> bounded = bound(sent, command, acquireDeadline(timeout));
        return bounded.thenApply(reply -> Decision.fromReply(command.name(), reply, units)).thenCompose(d -> {
            if (!d.allowed() || d.waitMs() <= 0 || !mayQueue) {
                return CompletableFuture.completedFuture(d);
            }
            // An admitted leaky bucket queues the request: the caller may act once wait_ms has passed.
            CompletableFuture<Decision> later = new CompletableFuture<>();
            CompletableFuture.delayedExecutor(d.waitMs(), TimeUnit.MILLISECONDS).execute(() -> later.complete(d));
            return later;
        });
    }

    private <T> T awaitAcquire(CompletionStage<T> stage, String command, Duration timeout) {
        Duration d = acquireDeadline(timeout);
        return await(stage.toCompletableFuture(), command, d == null ? null : d.plusSeconds(1));
    }

    private Duration leaseDeadline() {
        return deadline.compareTo(Lease.MIN_DEADLINE) > 0 ? deadline : Lease.MIN_DEADLINE;
    }

    private static boolean bool(Command c, Object reply) {
        if (reply instanceof Long n && (n == 0 || n == 1)) {
            return n == 1;
        }
        throw new ProtocolException(c.name(), reply);
    }

    // ---- policies ----------------------------------------------------------

    /**
     * {@code RL.POLICY SET} on every master (policies are node state). A quota
     * in another zone than UTC is sent with its zone
     * ({@code RL.POLICY SET name QUOTA 1000 DAY TZ America/New_York MODE ... ROLLOUT ...}):
     * {@code RL.HIT} and {@code RL.ALL ... POLICY name} then count in that zone.
     */
    public CompletionStage<Void> policySetAsync(String name, Spec spec, PolicyMode mode, int rollout) {
        return policySetAsync(name, spec, mode, rollout, PolicyLoop.NONE);
    }

    /**
     * {@code RL.POLICY SET name <spec> MODE m ROLLOUT p <loop>} on every
     * master: the policy with its protection loop ({@code ADAPT},
     * {@code STAGES}, {@code WINDOW}). A set without a loop resets the
     * policy's scale and stage; {@link PolicyLoop#adaptOff()} keeps the scale.
     */
    public CompletionStage<Void> policySetAsync(String name, Spec spec, PolicyMode mode, int rollout, PolicyLoop loop) {
        if (rollout < 0 || rollout > 100) {
            throw new InvalidArgumentException("rollout", "must be a percent from 0 to 100, got " + rollout);
        }
        List<String> args = new ArrayList<>(List.of("SET", Args.policyName(name)));
        args.addAll(spec.words());
        args.add("MODE");
        args.add((mode == null ? PolicyMode.ENFORCE : mode).name());
        args.add("ROLLOUT");
        args.add(Integer.toString(rollout));
        args.addAll((loop == null ? PolicyLoop.NONE : loop).words());
        return masters(new Command("RL.POLICY", args, -1, false)).thenApply(r -> null);
    }

    public void policySet(String name, Spec spec, PolicyMode mode, int rollout) {
        sync(policySetAsync(name, spec, mode, rollout), "RL.POLICY SET", null);
    }

    public void policySet(String name, Spec spec, PolicyMode mode, int rollout, PolicyLoop loop) {
        sync(policySetAsync(name, spec, mode, rollout, loop), "RL.POLICY SET", null);
    }

    /**
     * {@code RL.OUTCOME name ok errors} on every master: counts of finished
     * requests the policy admitted, added to each master's current window.
     * Answers each master's {@link PolicyStats}. Never retried by the kit: a
     * lost report is a lost count.
     */
    public CompletionStage<List<PolicyStats>> outcomeAsync(String policy, long ok, long errors) {
        return outcomeAsync(policy, ok, errors, 0);
    }

    /**
     * {@code RL.OUTCOME name ok errors DENIED n}: also {@code denied} calls the
     * kit denied without asking the server (deny cache, local level), counted
     * as calls and denials of the current window. {@code DENIED} is sent only
     * when {@code denied} is above 0 (0 is the plain three-argument form).
     */
    public CompletionStage<List<PolicyStats>> outcomeAsync(String policy, long ok, long errors, long denied) {
        if (denied < 0 || denied > Spec.MAX_PARAM) {
            throw new InvalidArgumentException("denied", "must be an integer from 0 to " + Spec.MAX_PARAM + ", got " + denied);
        }
        if (ok < 0 || ok > Spec.MAX_PARAM) {
            throw new InvalidArgumentException("ok", "must be an integer from 0 to " + Spec.MAX_PARAM + ", got " + ok);
        }
        if (errors < 0 || errors > Spec.MAX_PARAM) {
            throw new InvalidArgumentException("errors", "must be an integer from 0 to " + Spec.MAX_PARAM + ", got " + errors);
        }
        List<String> args = denied == 0
                ? List.of(Args.policyName(policy), Long.toString(ok), Long.toString(errors))
                : List.of(Args.policyName(policy), Long.toString(ok), Long.toString(errors), "DENIED", Long.toString(denied));
        Command c = new Command("RL.OUTCOME", args, -1, true);
        return masters(c).thenApply(rs -> rs.stream().map(r -> PolicyStats.fromReply(c.name(), r)).toList());
    }

    /** {@code RL.POLICY STATS name} on every master, each master's view (one for a standalone server). */
    public CompletionStage<List<PolicyStats>> policyStatsAsync(String policy) {
        Command c = new Command("RL.POLICY", List.of("STATS", Args.policyName(policy)), -1, true);
        return masters(c).thenApply(rs -> rs.stream().map(r -> PolicyStats.fromReply("RL.POLICY STATS", r)).toList());
    }

    public List<PolicyStats> policyStats(String policy) {
        return sync(policyStatsAsync(policy), "RL.POLICY STATS", null);
    }

    /** {@code RL.POLICY SCALE name pct} on every master: the operator's hand on the scale (1 to 100). */
    public void policyScale(String policy, int pct) {
        if (pct < 1 || pct > 100) {
            throw new InvalidArgumentException("pct", "must be an integer from 1 to 100, got " + pct);
        }
        Command c = new Command("RL.POLICY", List.of("SCALE", Args.policyName(policy), Integer.toString(pct)), -1, false);
        sync(masters(c), "RL.POLICY SCALE", null);
    }

    /** {@code RL.POLICY GET}; empty when there is none. */
    public CompletionStage<Optional<PolicyInfo>> policyGetAsync(String name) {
        Command c = new Command("RL.POLICY", List.of("GET", Args.policyName(name)), -1, true);
        return timed(c, null).thenApply(reply -> parsePolicy(name, reply));
    }

    public Optional<PolicyInfo> policyGet(String name) {
        return sync(policyGetAsync(name), "RL.POLICY GET", null);
    }

    /** {@code RL.POLICY DEL} on every master: true when one of them had it. */
    public CompletionStage<Boolean> policyDelAsync(String name) {
        return masters(new Command("RL.POLICY", List.of("DEL", Args.policyName(name)), -1, false))
                .thenApply(rs -> rs.stream().anyMatch(r -> Long.valueOf(1).equals(r)));
    }

    public boolean policyDel(String name) {
        return sync(policyDelAsync(name), "RL.POLICY DEL", null);
    }

    /** {@code RL.POLICY LIST}: the names, sorted (in a cluster, those of every master). */
    public CompletionStage<List<String>> policyListAsync() {
        return masters(new Command("RL.POLICY", List.of("LIST"), -1, true)).thenApply(rs -> {
            java.util.TreeSet<String> names = new java.util.TreeSet<>();
            for (Object r : rs) {
                if (r instanceof List<?> l) {
                    for (Object o : l) {
                        if (o instanceof String s) {
                            names.add(s);
                        }
                    }
                }
            }
            return List.copyOf(names);
        });
    }

    public List<String> policyList() {
        return sync(policyListAsync(), "RL.POLICY LIST", null);
    }

    // ---- the deny log ------------------------------------------------------

    /** {@code RL.LOG GET count}: the most recent denials, newest first. */
    public List<LogEntry> logGet(int count) {
        Command c = new Command("RL.LOG", List.of("GET", Integer.toString(Math.max(0, count))), -1, true);
        Object reply = sync(timed(c, null), c.name(), null);
        List<LogEntry> out = new ArrayList<>();
        if (reply instanceof List<?> entries) {
            for (Object e : entries) {
                if (e instanceof List<?> f && f.size() >= 6) {
                    out.add(new LogEntry(asLong(f.get(0)), asLong(f.get(1)), String.valueOf(f.get(2)), String.valueOf(f.get(3)),
                            asLong(f.get(4)), asLong(f.get(5))));
                }
            }
        }
        return out;
    }

    public long logLen() {
        return integer(new Command("RL.LOG", List.of("LEN"), -1, false));
    }

    public void logReset() {
        sync(timed(new Command("RL.LOG", List.of("RESET"), -1, false), null), "RL.LOG RESET", null);
    }

    /** {@code PING} within the deadline: the breaker's probe. */
    public CompletionStage<Void> pingAsync() {
        return timed(new Command("PING", List.of(), -1, false), null).thenApply(r -> null);
    }

    // ---- plumbing ----------------------------------------------------------

    private CompletionStage<Decision> decision(Command command, Request units) {
        return timed(command, units).thenApply(reply -> Decision.fromReply(command.name(), reply, units));
    }


    private CompletableFuture<Object> timed(Command command, Request units) {
        return within(command, deadline);
    }

    private CompletableFuture<Object> within(Command command, Duration d) {
        return bound(driver.send(command), command, d);
    }

    /** {@code f} failed with a {@link RateLimitTimeoutException} after {@code d} (and cancelled); as it is when null. */
    private static CompletableFuture<Object> bound(CompletableFuture<Object> f, Command command, Duration d) {
        if (d == null) {
            return f;
        }
        CompletableFuture<Object> out = new CompletableFuture<>();
        f.whenComplete((v, e) -> {
            if (e != null) {
                out.completeExceptionally(e instanceof CompletionException && e.getCause() != null ? e.getCause() : e);
            } else {
                out.complete(v);
            }
        });
        CompletableFuture.delayedExecutor(d.toNanos(), TimeUnit.NANOSECONDS).execute(() -> {
            if (out.completeExceptionally(new RateLimitTimeoutException(command.name(), d))) {
                // Lettuce skips a cancelled command still queued; one already sent is simply dropped
                // (a blocking call's own connection is closed, so the server forgets it).
                f.cancel(false);
            }
        });
        return out;
    }

    private CompletableFuture<List<Object>> masters(Command command) {
        return driver.sendToMasters(command).orTimeout(Math.max(1000, deadline.toMillis()), TimeUnit.MILLISECONDS)
                .exceptionally(e -> {
                    Throwable c = e instanceof CompletionException && e.getCause() != null ? e.getCause() : e;
                    if (c instanceof TimeoutException) {
                        throw new RateLimitTimeoutException(command.name(), Duration.ofMillis(Math.max(1000, deadline.toMillis())));
                    }
                    throw c instanceof RuntimeException r ? r : new CompletionException(c);
                });
    }

    private long integer(Command command) {
        Object r = sync(timed(command, null), command.name(), null);
        if (r instanceof Long n) {
            return n;
        }
        throw new ProtocolException(command.name(), r);
    }

    private <T> T sync(CompletionStage<T> stage, String command, Request units) {
        Duration d = deadline;
        // The async form already bounds the call; this only guards a driver that never answers.
        return await(stage.toCompletableFuture(), command, d == null ? null : d.plusSeconds(1));
    }

    static <T> T await(CompletableFuture<T> f, String command, Duration limit) {
        try {
            return limit == null ? f.get() : f.get(limit.toNanos(), TimeUnit.NANOSECONDS);
        } catch (ExecutionException e) {
            Throwable c = e.getCause();
            if (c instanceof CompletionException && c.getCause() != null) {
                c = c.getCause();
            }
            if (c instanceof RuntimeException r) {
                throw r;
            }
            throw new RateLimitException(command + ": " + c, c);
        } catch (TimeoutException e) {
            throw new RateLimitTimeoutException(command, limit);
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
            throw new RateLimitException(command + ": interrupted", e);
        }
    }

    private static long asLong(Object o) {
        return o instanceof Long n ? n : -1;
    }

    static Optional<PolicyInfo> parsePolicy(String name, Object reply) {
        if (!(reply instanceof List<?> f) || f.isEmpty() || (f.size() == 1 && f.get(0) == null)) {
            return Optional.empty();
        }
        java.util.Map<String, Object> m = new java.util.HashMap<>();
        for (int i = 0; i + 1 < f.size(); i += 2) {
            m.put(String.valueOf(f.get(i)), f.get(i + 1));
        }
        String algorithm = String.valueOf(m.get("algorithm"));
        List<Long> params = new ArrayList<>();
        String period = null;
        if (m.get("params") instanceof List<?> ps) {
            for (Object p : ps) {
                if (p instanceof Long n) {
                    params.add(n);
                } else if (String.valueOf(p).matches("-?[0-9]+")) {
                    params.add(Long.parseLong(String.valueOf(p)));
                } else {
                    // A quota's period: [limit, "DAY"].
                    period = String.valueOf(p);
                }
            }
        }
        // A quota's zone as the server names it (UTC, +05:30, America/New_York); none for the other algorithms.
        String zone = m.get("zone") == null ? null : String.valueOf(m.get("zone"));
        Spec spec;
        try {
            Algorithm a = Algorithm.parse(algorithm);
            spec = a == Algorithm.QUOTA && params.size() == 1 ? Spec.quota(params.get(0), Period.parse(period), zone)
                    : Spec.of(a, params);
        } catch (InvalidArgumentException e) {
            spec = null;
        }
        return Optional.of(new PolicyInfo(name, algorithm, List.copyOf(params), spec,
                PolicyMode.parse(String.valueOf(m.getOrDefault("mode", "ENFORCE"))),
                (int) asLong(m.getOrDefault("rollout", 100L)), zone, asLong(m.get("calls")), asLong(m.get("admitted")),
                asLong(m.get("denied")), asLong(m.get("shadow_denied"))));
    }

    @Override
    public void close() {
        driver.close();
    }
}

package io.redisratelimit.client;

import java.lang.System.Logger.Level;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Collection;
import java.util.LinkedHashSet;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.CopyOnWriteArrayList;
import java.util.concurrent.Executors;
import java.util.concurrent.ScheduledExecutorService;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicLong;
import java.util.concurrent.atomic.LongAdder;
import java.util.function.LongSupplier;

/**
 * The kit's side of the server's protection loop, for a set of policies:
 * <ul>
 * <li>{@link #record} counts the outcome of each request a policy admitted,
 * in memory (two {@link LongAdder}s per policy: no lock, no I/O on the
 * request's path), and {@link #recordDenied} the calls of a policy rule the
 * kit's {@link Limiter} denied without asking the server (a deny cache hit, a
 * local-level denial), so that a deny cache does not hide a flood from the
 * policy's stages;</li>
 * <li>every report interval a background thread sends the counts with
 * {@code RL.OUTCOME name ok errors [DENIED n]} to every master, for each
 * policy with a count ({@code DENIED} only when some were denied locally), and
 * forgets them: a failed send loses its counts (never retried, so
 * nothing piles up while Redis is away);</li>
 * <li>every stage poll it reads {@code RL.POLICY STATS name} on every master:
 * the highest stage and the lowest scale win ({@link #stage}, {@link #scale});
 * with no successful read for the stage hold, the stage falls back to 0 (the
 * limiter's own fallback decides while Redis is away);</li>
 * <li>{@link Listener}s hear each policy's stage when it changes (the Spring
 * starter opens and closes the Resilience4j breakers a rule names).</li>
 * </ul>
 * The defaults are the contract's ({@code protection.kits}): report every
 * 1 s, poll every 1 s, hold a stage 5 s (the hold must be longer than the
 * poll). {@link #close()} stops the thread, sends the last counts once (best
 * effort) and tells the listeners stage 0 for every policy they last heard
 * above 0 (a breaker the loop forced open does not stay open).
 *
 * <pre>{@code
 * Protection p = Protection.builder(client).policies(List.of("orders")).build();
 * p.record("orders", failed);      // after each request "orders" admitted
 * if (p.stage("orders") >= 1) { ... serve the cached answer ... }
 * }</pre>
 */
public final class Protection implements AutoCloseable {
    private static final System.Logger LOG = System.getLogger(Protection.class.getName());

    /** The contract's {@code report_interval_ms}. */
    public static final Duration DEFAULT_REPORT_INTERVAL = Duration.ofMillis(1000);
    /** The contract's {@code stage_poll_ms}. */
    public static final Duration DEFAULT_STAGE_POLL = Duration.ofMillis(1000);
    /** The contract's {@code stage_hold_ms}. */
    public static final Duration DEFAULT_STAGE_HOLD = Duration.ofMillis(5000);

    /** 0: normal. */
    public static final int NORMAL = 0;
    /** 1: degrade (non-core routes answer their degrade handler). */
    public static final int DEGRADE = 1;
    /** 2: break (the breakers the rules name are open). */
    public static final int BREAK = 2;

    /** Told of a policy's stage each time it changes (read from the server, or fallen back to 0). */
    @FunctionalInterface
    public interface Listener {
        void stageChanged(String policy, int stage);
    }

    /** A policy's counts and last read. */
    private static final class Watch {
        final LongAdder ok = new LongAdder();
        final LongAdder errors = new LongAdder();
        final LongAdder denied = new LongAdder();
        volatile int stage;
        volatile int scale = 100;
        /** When the last successful read was made (the clock's nanos), or none yet. */
        volatile long readAt;
        volatile boolean read;
        /** The stage last told to the listeners. */
        int told;
    }

    private final List<Client> clients;
    private final Duration reportInterval;
    private final Duration stagePoll;
    private final Duration stageHold;
    private final LongSupplier nanos;
    private final Map<String, Watch> watches = new ConcurrentHashMap<>();
    private final List<Listener> listeners = new CopyOnWriteArrayList<>();
    private final ScheduledExecutorService timer;
    private final AtomicLong reportsSent = new AtomicLong();
    private final AtomicLong reportsFailed = new AtomicLong();
    private final AtomicLong countsLost = new AtomicLong();
    private final AtomicLong pollsFailed = new AtomicLong();
    private volatile boolean closed;

    private Protection(Builder b) {
        this.clients = List.copyOf(b.clients);
        this.reportInterval = b.reportInterval;
        this.stagePoll = b.stagePoll;
        this.stageHold = b.stageHold;
        this.nanos = b.nanos;
        for (String p : b.policies) {
            watches.put(Args.policyName(p), new Watch());
        }
        listeners.addAll(b.listeners);
        if (b.start) {
            timer = Executors.newSingleThreadScheduledExecutor(r -> {
                Thread t = new Thread(r, "redis-ratelimit-protection");
                t.setDaemon(true);
                return t;
            });
            timer.scheduleWithFixedDelay(this::reportQuietly, reportInterval.toNanos(), reportInterval.toNanos(), TimeUnit.NANOSECONDS);
            timer.scheduleWithFixedDelay(this::pollQuietly, 0, stagePoll.toNanos(), TimeUnit.NANOSECONDS);
        } else {
            timer = null;
        }
    }

    /** A loop over one client: its masters (one standalone server, or every master of a cluster). */
    public static Builder builder(Client client) {
        return new Builder(List.of(client));
    }

    /**
     * A loop over several clients, each one's masters: outcomes go to every
     * one of them and the highest stage read from any of them wins (two
     * standalone servers count as two masters).
     */
    public static Builder builder(List<Client> clients) {
        return new Builder(clients);
    }

    public static final class Builder {
        private final List<Client> clients;
        private final Set<String> policies = new LinkedHashSet<>();
        private final List<Listener> listeners = new ArrayList<>();
        private Duration reportInterval = DEFAULT_REPORT_INTERVAL;
        private Duration stagePoll = DEFAULT_STAGE_POLL;
        private Duration stageHold = DEFAULT_STAGE_HOLD;
        private LongSupplier nanos = System::nanoTime;
        private boolean start = true;

        private Builder(List<Client> clients) {
            if (clients == null || clients.isEmpty()) {
                throw new InvalidArgumentException("clients", "the loop needs at least one client");
            }
            this.clients = List.copyOf(clients);
        }

        /** The policies watched (their names on the server). */
        public Builder policies(Collection<String> names) {
            policies.addAll(names);
            return this;
        }

        public Builder reportInterval(Duration d) {
            reportInterval = positive("report_interval", d);
            return this;
        }

        public Builder stagePoll(Duration d) {
            stagePoll = positive("stage_poll", d);
            return this;
        }

        public Builder stageHold(Duration d) {
            stageHold = positive("stage_hold", d);
            return this;
        }

        public Builder listener(Listener l) {
            listeners.add(l);
            return this;
        }

        /** The clock the stage hold is measured on (nanoseconds, as {@link System#nanoTime()}): for tests. */
        public Builder clock(LongSupplier nanoClock) {
            nanos = nanoClock;
            return this;
        }

        /** Without the background thread: the caller runs {@link #report()} and {@link #poll()} itself (tests). */
        public Builder manual() {
            start = false;
            return this;
        }

        public Protection build() {
            if (stageHold.compareTo(stagePoll) <= 0) {
                // A hold no longer than the poll drops the stage to 0 between two good reads.
                throw new InvalidArgumentException("stage_hold", "must be above stage_poll (" + stagePoll.toMillis()
                        + " ms), got " + stageHold.toMillis() + " ms");
            }
            return new Protection(this);
        }

        private static Duration positive(String name, Duration d) {
            if (d == null || d.isNegative() || d.isZero()) {
                throw new InvalidArgumentException(name, "must be above 0, got " + d);
            }
            return d;
        }
    }

    public Duration reportInterval() {
        return reportInterval;
    }

    public Duration stagePoll() {
        return stagePoll;
    }

    public Duration stageHold() {
        return stageHold;
    }

    /** The policies watched. */
    public Set<String> policies() {
        return Set.copyOf(watches.keySet());
    }

    /**
     * Watches these policies from now on, and only them (a refreshed rule
     * set). A policy no longer watched whose listeners last heard a stage
     * above 0 is told 0 (nothing reads it any more, so a breaker it forced
     * open must not stay open).
     */
    public void watch(Collection<String> names) {
        for (String n : names) {
            watches.computeIfAbsent(Args.policyName(n), k -> new Watch());
        }
        Set<String> keep = Set.copyOf(names);
        synchronized (this) {
            for (java.util.Iterator<Map.Entry<String, Watch>> it = watches.entrySet().iterator(); it.hasNext(); ) {
                Map.Entry<String, Watch> e = it.next();
                if (!keep.contains(e.getKey())) {
                    it.remove();
                    if (e.getValue().told != NORMAL && !closed) {
                        e.getValue().told = NORMAL;
                        tellOne(e.getKey(), NORMAL);
                    }
                }
            }
        }
    }

    public void addListener(Listener l) {
        listeners.add(l);
    }

    /** Counts one finished request that {@code policy} admitted; a policy not watched is ignored. */
    public void record(String policy, boolean error) {
        Watch w = watches.get(policy);
        if (w != null) {
            (error ? w.errors : w.ok).increment();
        }
    }

    public void recordOk(String policy) {
        record(policy, false);
    }

    public void recordError(String policy) {
        record(policy, true);
    }

    /**
     * Counts {@code n} calls of {@code policy}'s rule that the kit denied
     * without asking the server (answered from its deny cache, or denied by
     * the local level of a global rule); sent as {@code DENIED n} with the
     * next report, where the server counts them as calls and denials of the
     * policy's current window. A policy not watched is ignored.
     */
    public void recordDenied(String policy, long n) {
        Watch w = watches.get(policy);
        if (w != null && n > 0) {
            w.denied.add(n);
        }
    }

    public void recordDenied(String policy) {
        recordDenied(policy, 1);
    }

    /** The counts not reported yet: {@code [ok, errors, denied]} (never more than one report interval's). */
    public long[] pending(String policy) {
        Watch w = watches.get(policy);
        return w == null ? new long[] {0, 0, 0} : new long[] {w.ok.sum(), w.errors.sum(), w.denied.sum()};
    }

    /**
     * The policy's stage: the highest any master gave at the last poll, or 0
     * when no read succeeded for the stage hold (or the policy is not
     * watched, or the loop is closed).
     */
    public int stage(String policy) {
        Watch w = watches.get(policy);
        return w == null ? NORMAL : effective(w, nanos.getAsLong());
    }

    /** The highest stage of these policies. */
    public int stage(Collection<String> policies) {
        int s = NORMAL;
        for (String p : policies) {
            s = Math.max(s, stage(p));
        }
        return s;
    }

    /** The policy's scale in percent: the lowest any master gave at the last poll (100 before any read, or when not watched). */
    public int scale(String policy) {
        Watch w = watches.get(policy);
        return w == null ? 100 : w.scale;
    }

    /**
     * A size or rate parameter at a scale, as the server runs it:
     * {@code max(1, floor(param * scale / 100))} (the contract's
     * {@code protection.scaled}), in integer arithmetic without overflow.
     */
    public static long scaled(long param, int scale) {
        long whole = param / 100 * scale;
        long part = param % 100 * scale / 100;
        return Math.max(1, whole + part);
    }

    private int effective(Watch w, long now) {
        if (closed || !w.read || now - w.readAt > stageHold.toNanos()) {
            return NORMAL;
        }
        return w.stage;
    }

    /** Reports sent (one per policy and client) and failed, counts lost with failed reports, polls that read nothing. */
    public long reportsSent() {
        return reportsSent.get();
    }

    public long reportsFailed() {
        return reportsFailed.get();
    }

    public long countsLost() {
        return countsLost.get();
    }

    public long pollsFailed() {
        return pollsFailed.get();
    }

    /**
     * Sends the counts of every watched policy that has some, to every master,
     * and forgets them; waits for the answers (bounded by the clients'
     * deadlines). The background thread calls it every report interval.
     */
    public void report() {
        List<CompletableFuture<?>> sent = new ArrayList<>();
        for (Map.Entry<String, Watch> e : watches.entrySet()) {
            Watch w = e.getValue();
            long ok = w.ok.sumThenReset();
            long errors = w.errors.sumThenReset();
            long denied = w.denied.sumThenReset();
            if (ok == 0 && errors == 0 && denied == 0) {
                continue;
            }
            for (Client c : clients) {
                CompletableFuture<?> f;
                try {
                    f = c.outcomeAsync(e.getKey(), ok, errors, denied).toCompletableFuture();
                } catch (RuntimeException ex) {
                    f = CompletableFuture.failedFuture(ex);
                }
                sent.add(f.whenComplete((v, ex) -> {
                    if (ex == null) {
                        reportsSent.incrementAndGet();
                    } else {
                        reportsFailed.incrementAndGet();
                        countsLost.addAndGet(ok + errors + denied);
                    }
                }));
            }
        }
        waitAll(sent);
    }

    /**
     * Reads every watched policy's stats on every master: the highest stage
     * and the lowest scale win, and listeners hear the stages that changed
     * (a stage unread for the stage hold falls back to 0). The background
     * thread calls it every stage poll.
     */
    public void poll() {
        Map<String, List<CompletableFuture<List<PolicyStats>>>> reads = new java.util.HashMap<>();
        for (String policy : watches.keySet()) {
            List<CompletableFuture<List<PolicyStats>>> fs = new ArrayList<>();
            for (Client c : clients) {
                try {
                    fs.add(c.policyStatsAsync(policy).toCompletableFuture());
                } catch (RuntimeException ex) {
                    fs.add(CompletableFuture.failedFuture(ex));
                }
            }
            reads.put(policy, fs);
        }
        waitAll(reads.values().stream().flatMap(List::stream).toList());
        long now = nanos.getAsLong();
        for (Map.Entry<String, List<CompletableFuture<List<PolicyStats>>>> e : reads.entrySet()) {
            Watch w = watches.get(e.getKey());
            if (w == null) {
                continue;
            }
            int stage = -1;
            int scale = 101;
            for (CompletableFuture<List<PolicyStats>> f : e.getValue()) {
                if (f.isCompletedExceptionally() || !f.isDone()) {
                    continue;
                }
                for (PolicyStats s : f.join()) {
                    stage = Math.max(stage, s.stage());
                    scale = Math.min(scale, s.scale());
                }
            }
            if (stage < 0) {
                pollsFailed.incrementAndGet();
            } else {
                w.stage = stage;
                w.scale = scale;
                w.readAt = now;
                w.read = true;
            }
        }
        tell(now);
    }

    private synchronized void tell(long now) {
        if (closed) {
            // A poll still running when close() gave up waiting for it: close() told the last word.
            return;
        }
        for (Map.Entry<String, Watch> e : watches.entrySet()) {
            Watch w = e.getValue();
            int s = effective(w, now);
            if (s != w.told) {
                w.told = s;
                tellOne(e.getKey(), s);
            }
        }
    }

    private void tellOne(String policy, int stage) {
        for (Listener l : listeners) {
            try {
                l.stageChanged(policy, stage);
            } catch (RuntimeException ex) {
                LOG.log(Level.WARNING, "redis-ratelimit: a protection listener failed on " + policy + ": " + ex);
            }
        }
    }

    private static void waitAll(List<? extends CompletableFuture<?>> fs) {
        try {
            CompletableFuture.allOf(fs.toArray(CompletableFuture[]::new)).get(30, TimeUnit.SECONDS);
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
        } catch (java.util.concurrent.ExecutionException | java.util.concurrent.TimeoutException e) {
            // Each future's own failure is counted where it completes.
        }
    }

    private void reportQuietly() {
        try {
            report();
        } catch (RuntimeException e) {
            LOG.log(Level.WARNING, "redis-ratelimit: outcome report failed: " + e);
        }
    }

    private void pollQuietly() {
        try {
            poll();
        } catch (RuntimeException e) {
            LOG.log(Level.WARNING, "redis-ratelimit: stage poll failed: " + e);
        }
    }

    /**
     * Stops the background thread, sends the last counts once (best effort),
     * then tells the listeners stage 0 for each policy they last heard above
     * 0: the loop no longer reads stages, so nothing it forced may stay.
     */
    @Override
    public void close() {
        if (closed) {
            return;
        }
        closed = true;
        if (timer != null) {
            timer.shutdownNow();
            try {
                timer.awaitTermination(2, TimeUnit.SECONDS);
            } catch (InterruptedException e) {
                Thread.currentThread().interrupt();
            }
        }
        try {
            report();
        } catch (RuntimeException e) {
            LOG.log(Level.DEBUG, "redis-ratelimit: the last outcome report failed: " + e);
        }
        synchronized (this) {
            for (Map.Entry<String, Watch> e : watches.entrySet()) {
                Watch w = e.getValue();
                if (w.told != NORMAL) {
                    w.told = NORMAL;
                    tellOne(e.getKey(), NORMAL);
                }
            }
        }
    }
}

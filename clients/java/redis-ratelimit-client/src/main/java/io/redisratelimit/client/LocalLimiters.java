package io.redisratelimit.client;

import com.github.benmanes.caffeine.cache.Cache;
import com.github.benmanes.caffeine.cache.Caffeine;

import java.time.Duration;
import java.time.Instant;
import java.util.ArrayList;
import java.util.Comparator;
import java.util.List;
import java.util.concurrent.locks.ReentrantLock;
import java.util.function.LongSupplier;

/**
 * In-process limiters, one per rule and key, bounded by a size cap and
 * dropped when idle. Used by the local level (at the instance's share of a
 * global rule) and as each rule's account at that share, which the
 * local-only fallback admits from. Each limiter is the server's own
 * algorithm ({@link CoreAlgorithms}, the core's state machines in integer
 * arithmetic): at a share equal to the limit it answers what the server would
 * for the same calls at the same instants, {@code reset_ms} and
 * {@code wait_ms} included. A change of parameters carries what was consumed
 * over, as the server does; a change of algorithm starts afresh.
 */
final class LocalLimiters {
    /** One limiter. Guarded by its lock; several are locked in key order. */
    static final class State {
        final ReentrantLock lock = new ReentrantLock();
        Algorithm algorithm;
        CoreAlgorithms.State core;
        long owed;          // units admitted here that Redis never saw (the call was not sent)
    }

    /** A request against one limiter. */
    record Take(String key, Spec spec) {
    }

    /** The denial of a take: which one, and its decision. */
    record Denied(int index, Decision decision) {
    }

    /**
     * What a take decided: denied by the take at {@code index}, or admitted, where
     * {@code index} is the take left with the fewest units and {@code decision}
     * its fields (what the admission reports).
     */
    record Outcome(boolean allowed, int index, Decision decision) {
    }

    private final Cache<String, State> states;
    /** Unix microseconds. */
    private final LongSupplier clockUs;

    LocalLimiters(long capacity) {
        this(capacity, LocalLimiters::wallClockUs);
    }

    /** With {@code clockUs} as the clock (Unix microseconds). */
    LocalLimiters(long capacity, LongSupplier clockUs) {
        states = Caffeine.newBuilder().maximumSize(Math.max(1, capacity)).expireAfterAccess(Duration.ofMinutes(10)).build();
        this.clockUs = clockUs;
    }

    /** The wall clock in Unix microseconds (the server's time base; a step back never gives units back). */
    static long wallClockUs() {
        Instant t = Instant.now();
        return t.getEpochSecond() * 1_000_000L + t.getNano() / 1_000;
    }

    /** All or nothing: consumes {@code cost} from every limiter, or denies naming the first that cannot. */
    Denied takeAll(List<Take> takes, long cost) {
        Outcome o = take(takes, cost, false);
        return o.allowed() ? null : new Denied(o.index(), o.decision());
    }

    /** {@link #takeAll}, answering the admission's fields too. */
    Outcome take(List<Take> takes, long cost) {
        return take(takes, cost, false);
    }

    /**
     * Consumes {@code cost} from every limiter whether it has room or not
     * ({@code COST n FORCE}: a limiter may go into debt, at most its limit
     * beyond empty, which it pays back as it refills): units that Redis
     * counted, or may have counted, for this instance.
     */
    void charge(List<Take> takes, long cost) {
        take(takes, cost, true);
    }

    /** Notes that Redis never saw these units (the fallback admitted them without a call). */
    void owe(List<Take> takes, long cost) {
        for (Take t : takes) {
            State s = states.getIfPresent(t.key());
            if (s != null) {
                s.lock.lock();
                try {
                    s.owed += cost;
                } finally {
                    s.lock.unlock();
                }
            }
        }
    }

    /** The units owed to Redis on this limiter, now cleared. */
    long settle(String key) {
        State s = states.getIfPresent(key);
        if (s == null) {
            return 0;
        }
        s.lock.lock();
        try {
            long owed = s.owed;
            s.owed = 0;
            return owed;
        } finally {
            s.lock.unlock();
        }
    }

    private Outcome take(List<Take> takes, long cost, boolean forced) {
        List<State> held = new ArrayList<>(takes.size());
        List<Integer> order = new ArrayList<>();
        for (int i = 0; i < takes.size(); i++) {
            order.add(i);
        }
        order.sort(Comparator.comparing(i -> takes.get(i).key()));
        State[] byIndex = new State[takes.size()];
        for (int i : order) {
            State s = states.get(takes.get(i).key(), k -> new State());
            s.lock.lock();
            held.add(s);
            byIndex[i] = s;
        }
        try {
            long nowUs = clockUs.getAsLong();
            if (!forced) {
                // All or nothing: every limiter decides first, nothing changes on a denial.
                for (int i = 0; i < takes.size(); i++) {
                    Spec spec = takes.get(i).spec();
                    refresh(byIndex[i], spec, nowUs);
                    CoreAlgorithms.Verdict v = byIndex[i].core.decide(params(spec, nowUs), cost, nowUs);
                    if (!v.allowed()) {
                        return new Outcome(false, i, v.toDecision());
                    }
                }
            }
            int tightest = 0;
            Decision admitted = null;
            CoreAlgorithms.Request request = forced ? CoreAlgorithms.Request.force(cost) : CoreAlgorithms.Request.cost(cost);
            for (int i = 0; i < takes.size(); i++) {
                Decision d = step(byIndex[i], takes.get(i).spec(), request, nowUs);
                if (admitted == null || d.remaining() < admitted.remaining()) {
                    tightest = i;
                    admitted = d;
                }
            }
            return new Outcome(true, tightest, admitted);
        } finally {
            for (State s : held) {
                s.lock.unlock();
            }
        }
    }

    /**
     * Gives back what {@link #takeAll} consumed, when Redis denied the request
     * after the local level admitted it: a denial consumes nothing anywhere
     * ({@code REFUND cost} on each limiter).
     */
    void giveBack(List<Take> takes, long cost) {
        for (Take t : takes) {
            State s = states.getIfPresent(t.key());
            if (s == null) {
                continue;
            }
            s.lock.lock();
            try {
                if (s.core != null && s.algorithm == t.spec().algorithm()) {
                    step(s, t.spec(), CoreAlgorithms.Request.refund(cost), clockUs.getAsLong());
                }
            } finally {
                s.lock.unlock();
            }
        }
    }

    /**
     * One request on one limiter at the clock's instant, as the server would
     * run it ({@code COST n}, {@code COST n FORCE}, {@code REFUND n}): the
     * step {@link #take}, {@link #charge} and {@link #giveBack} take on each
     * limiter.
     */
    Decision request(Take take, CoreAlgorithms.Request request) {
        State s = states.get(take.key(), k -> new State());
        s.lock.lock();
        try {
            return step(s, take.spec(), request, clockUs.getAsLong());
        } finally {
            s.lock.unlock();
        }
    }

    private static Decision step(State s, Spec spec, CoreAlgorithms.Request request, long nowUs) {
        refresh(s, spec, nowUs);
        CoreAlgorithms.Outcome o = CoreAlgorithms.run(s.core, params(spec, nowUs), request, nowUs);
        Decision d = o.decision().toDecision();
        return request.kind() == CoreAlgorithms.Kind.UPTO ? d.withGranted(o.granted()) : d;
    }

    /** A limiter of the spec's algorithm: idle at {@code now} if there was none, or one of another algorithm. */
    private static void refresh(State s, Spec spec, long nowUs) {
        if (s.core == null || s.algorithm != spec.algorithm()) {
            s.core = CoreAlgorithms.idle(spec.algorithm(), params(spec, nowUs), nowUs);
            s.algorithm = spec.algorithm();
        }
    }

    /**
     * The core's parameters of a spec: its integers; for a quota the limit,
     * the period's index and the end of the period holding {@code now} in the
     * quota's zone (0 in UTC, which the algorithm computes itself).
     */
    static long[] params(Spec spec, long nowUs) {
        if (spec.algorithm() == Algorithm.QUOTA) {
            long endUs = spec.zoned() ? spec.period().bounds(Math.floorDiv(nowUs, 1000), spec.zoneId())[1] * 1000 : 0;
            return new long[] {spec.limit(), spec.period().ordinal(), endUs};
        }
        return spec.params().stream().mapToLong(Long::longValue).toArray();
    }
}

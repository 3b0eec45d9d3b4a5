package io.redisratelimit.client;

import com.github.benmanes.caffeine.cache.Cache;
import com.github.benmanes.caffeine.cache.Caffeine;

import java.time.Duration;
import java.util.ArrayList;
import java.util.Comparator;
import java.util.List;
import java.util.concurrent.locks.ReentrantLock;

/**
 * In-process limiters, one per rule and key, bounded by a size cap and
 * dropped when idle. Used by the local level (at the instance's share of a
 * global rule) and as each rule's account at that share, which the
 * local-only fallback admits from. Each algorithm is kept in the
 * same shape as the server's: a bucket refilling continuously, a fixed window
 * aligned to the epoch, and for the sliding and hash windows a weighted
 * two-window counter (approximate, as a local share is anyway).
 */
final class LocalLimiters {
    /** One limiter. Guarded by its lock; several are locked in key order. */
    static final class State {
        final ReentrantLock lock = new ReentrantLock();
        Spec spec;
        double level;       // buckets: tokens (token bucket) or queued units (leaky bucket)
        long lastNanos;
        long window = Long.MIN_VALUE;
        long end;           // quota: the end of the period counted, epoch ms
        long count;
        long previous;
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

    LocalLimiters(long capacity) {
        states = Caffeine.newBuilder().maximumSize(Math.max(1, capacity)).expireAfterAccess(Duration.ofMinutes(10)).build();
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
     * Consumes {@code cost} from every limiter whether it has room or not (a
     * limiter may go into debt, which it pays back as it refills): units that
     * Redis counted, or may have counted, for this instance.
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
            long nowNanos = System.nanoTime();
            long nowMs = System.currentTimeMillis();
            int tightest = 0;
            Decision admitted = null;
            for (int i = 0; i < takes.size(); i++) {
                State s = byIndex[i];
                refresh(s, takes.get(i).spec(), nowNanos, nowMs);
                if (forced) {
                    continue;
                }
                Decision d = peek(s, cost, nowMs);
                if (!d.allowed()) {
                    return new Outcome(false, i, d);
                }
                if (admitted == null || d.remaining() < admitted.remaining()) {
                    tightest = i;
                    admitted = d;
                }
            }
            for (State s : byIndex) {
                consume(s, cost);
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
     * after the local level admitted it: a denial consumes nothing anywhere.
     */
    void giveBack(List<Take> takes, long cost) {
        for (Take t : takes) {
            State s = states.getIfPresent(t.key());
            if (s == null) {
                continue;
            }
            s.lock.lock();
            try {
                if (s.spec == null) {
                    continue;
                }
                switch (s.spec.algorithm()) {
                    case TOKENBUCKET -> s.level = Math.min(s.spec.params().get(0), s.level + cost);
                    case LEAKYBUCKET -> s.level = Math.max(0, s.level - cost);
                    default -> s.count = Math.max(0, s.count - cost);
                }
            } finally {
                s.lock.unlock();
            }
        }
    }

    private static void refresh(State s, Spec spec, long nowNanos, long nowMs) {
        List<Long> p = spec.params();
        if (s.spec == null || s.spec.algorithm() != spec.algorithm() || s.spec.period() != spec.period()) {
            s.spec = spec;
            s.level = spec.algorithm() == Algorithm.TOKENBUCKET ? p.get(0) : 0;
            s.lastNanos = nowNanos;
            s.window = Long.MIN_VALUE;
            s.count = 0;
            s.previous = 0;
        }
        s.spec = spec;
        double elapsedMs = Math.max(0, nowNanos - s.lastNanos) / 1e6;
        s.lastNanos = nowNanos;
        switch (spec.algorithm()) {
            case TOKENBUCKET -> s.level = Math.min(p.get(0), s.level + elapsedMs * p.get(1) / p.get(2));
            case LEAKYBUCKET -> s.level = Math.max(0, s.level - elapsedMs * p.get(1) / p.get(2));
            case QUOTA -> {
                if (s.window == Long.MIN_VALUE || nowMs >= s.end) {
                    long[] bounds = spec.period().bounds(nowMs, spec.zoneId());
                    s.window = bounds[0];
                    s.end = bounds[1];
                    s.count = 0;
                }
            }
            default -> {
                long w = p.get(1);
                long window = Math.floorDiv(nowMs, w);
                if (window != s.window) {
                    s.previous = window == s.window + 1 ? s.count : 0;
                    s.count = 0;
                    s.window = window;
                }
            }
        }
    }

    private static Decision peek(State s, long cost, long nowMs) {
        List<Long> p = s.spec.params();
        long limit = p.get(0);
        if (cost > limit) {
            return new Decision(false, limit, 0, -1, 0, null, Path.LOCAL);
        }
        switch (s.spec.algorithm()) {
            case TOKENBUCKET -> {
                if (s.level >= cost) {
                    return admitted(limit, (long) Math.floor(s.level - cost), 0);
                }
                long wait = (long) Math.ceil((cost - s.level) * p.get(2) / p.get(1));
                return new Decision(false, limit, Math.max(0, (long) Math.floor(s.level)), Math.max(1, wait),
                        (long) Math.ceil((limit - s.level) * p.get(2) / p.get(1)), null, Path.LOCAL);
            }
            case LEAKYBUCKET -> {
                if (s.level + cost <= limit) {
                    return admitted(limit, (long) Math.floor(limit - s.level - cost), 0);
                }
                long wait = (long) Math.ceil((s.level + cost - limit) * p.get(2) / p.get(1));
                return new Decision(false, limit, Math.max(0, (long) Math.floor(limit - s.level)), Math.max(1, wait),
                        (long) Math.ceil(s.level * p.get(2) / p.get(1)), null, Path.LOCAL);
            }
            case QUOTA -> {
                long reset = Math.max(1, s.end - nowMs);
                if (s.count + cost <= limit) {
                    return admitted(limit, limit - s.count - cost, reset);
                }
                return new Decision(false, limit, Math.max(0, limit - s.count), reset, reset, null, Path.LOCAL);
            }
            case FIXEDWINDOW -> {
                long w = p.get(1);
                long reset = (s.window + 1) * w - nowMs;
                if (s.count + cost <= limit) {
                    return admitted(limit, limit - s.count - cost, reset);
                }
                return new Decision(false, limit, Math.max(0, limit - s.count), Math.max(1, reset), reset, null, Path.LOCAL);
            }
            default -> {
                long w = p.get(1);
                long intoWindow = nowMs - s.window * w;
                double weight = (double) (w - intoWindow) / w;
                double used = s.previous * weight + s.count;
                long reset = (s.window + 2) * w - nowMs;
                if (used + cost <= limit) {
                    return admitted(limit, (long) Math.floor(limit - used - cost), reset);
                }
                return new Decision(false, limit, Math.max(0, (long) Math.floor(limit - used)), Math.max(1, w - intoWindow), reset, null, Path.LOCAL);
            }
        }
    }

    private static Decision admitted(long limit, long remaining, long reset) {
        return new Decision(true, limit, Math.max(0, remaining), 0, Math.max(0, reset), null, Path.LOCAL);
    }

    private static void consume(State s, long cost) {
        switch (s.spec.algorithm()) {
            case TOKENBUCKET -> s.level -= cost;
            case LEAKYBUCKET -> s.level += cost;
            default -> s.count += cost;
        }
    }
}

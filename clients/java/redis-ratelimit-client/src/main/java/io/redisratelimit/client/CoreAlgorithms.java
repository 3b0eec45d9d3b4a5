package io.redisratelimit.client;

import java.math.BigInteger;
import java.util.Arrays;
import java.util.Iterator;
import java.util.Map;
import java.util.TreeMap;
import java.util.function.LongUnaryOperator;

/**
 * The core's rate algorithms ({@code core/src/*.rs}) ported exactly, in
 * integer arithmetic, for the in-process limiters ({@link LocalLimiters}):
 * the same decisions as the server for the same calls at the same instants.
 * A state is built {@link #idle} and changed only by {@link #run}; time is
 * Unix microseconds. Parameters are the spec's integers in command order; a
 * quota's are {@code limit, period index, end_us} ({@code end_us} the end of
 * the call's period, 0 for UTC, which the algorithm then computes).
 *
 * <p>The token and leaky buckets are the core's GCRA in ticks of
 * {@code 1 / refill_count} microsecond, whose products need up to 128 bits:
 * they are {@link BigInteger}s. Everything else fits a {@code long}.
 */
final class CoreAlgorithms {
    /** The longest span a limiter may need to get back to idle, in ms (2^50). */
    static final long MAX_SPAN_MS = 1L << 50;
    /** The latest instant a call can run at (2^62 us). */
    static final long MAX_TIME_US = 1L << 62;
    /** The largest limit of a sliding log (2^24 - 1). */
    static final long MAX_SLIDING = (1L << 24) - 1;

    private CoreAlgorithms() {
    }

    /** {@code COST n}, {@code COST n FORCE}, {@code REFUND n}, {@code UPTO n}. */
    enum Kind { COST, FORCE, REFUND, UPTO }

    /** One request. */
    record Request(Kind kind, long n) {
        static Request cost(long n) {
            return new Request(Kind.COST, n);
        }

        static Request force(long n) {
            return new Request(Kind.FORCE, n);
        }

        static Request refund(long n) {
            return new Request(Kind.REFUND, n);
        }

        static Request upto(long n) {
            return new Request(Kind.UPTO, n);
        }
    }

    /** The five integers of the reply; {@code waitMs} -1 for never. */
    record Verdict(boolean allowed, long limit, long remaining, long waitMs, long resetMs) {
        Verdict withAllowed(boolean a) {
            return new Verdict(a, limit, remaining, waitMs, resetMs);
        }

        Verdict withWait(long w) {
            return new Verdict(allowed, limit, remaining, w, resetMs);
        }

        Decision toDecision() {
            return new Decision(allowed, limit, remaining, waitMs, resetMs, null, Path.LOCAL);
        }

        long[] fields() {
            return new long[] {allowed ? 1 : 0, limit, remaining, waitMs, resetMs};
        }
    }

    /** What a request did: the decision, whether the state changed, and ({@code UPTO}) the units granted. */
    record Outcome(Verdict decision, boolean changed, long granted) {
        Outcome(Verdict decision, boolean changed) {
            this(decision, changed, 0);
        }
    }

    /** One limiter's state. */
    abstract static class State {
        /** Decides {@code cost} at {@code now}, changing the state only when admitted with {@code cost > 0}. */
        abstract Verdict apply(long[] p, long cost, long nowUs);

        /** What {@link #apply} would answer, changing nothing. */
        abstract Verdict decide(long[] p, long cost, long nowUs);

        /** {@code COST n FORCE}: what {@link #apply} would have answered, and whether the state changed. */
        abstract Outcome force(long[] p, long cost, long nowUs);

        /** {@code REFUND n}: whether the state changed. */
        abstract boolean refund(long[] p, long units, long nowUs);
    }

    /** The state of a limiter that has seen no traffic, at {@code now}. */
    static State idle(Algorithm algorithm, long[] p, long nowUs) {
        return switch (algorithm) {
            case TOKENBUCKET -> new Gcra(p, nowUs, false);
            case LEAKYBUCKET -> new Gcra(p, nowUs, true);
            case FIXEDWINDOW -> new FixedWindow(nowUs);
            case SLIDING -> new SlidingLog();
            case HASHWINDOW -> new HashWindow(p, nowUs);
            case QUOTA -> new Quota();
            case CONCURRENCY -> throw new IllegalArgumentException("a concurrency cap has no in-process limiter");
        };
    }

    /** The core's {@code run}: the one entry point. */
    static Outcome run(State s, long[] p, Request r, long nowUs) {
        return switch (r.kind()) {
            case COST -> {
                Verdict d = s.apply(p, r.n(), nowUs);
                yield new Outcome(d, d.allowed() && r.n() > 0);
            }
            case FORCE -> {
                Outcome o = s.force(p, r.n(), nowUs);
                yield new Outcome(o.decision().withAllowed(true), o.changed());
            }
            case REFUND -> {
                boolean changed = s.refund(p, r.n(), nowUs);
                yield new Outcome(s.decide(p, 0, nowUs), changed);
            }
            case UPTO -> {
                // As the server: the units that fit, at most n, run as COST fits; none fit: the denial COST 1 gets.
                long fits = fits(s, p, r.n(), nowUs);
                Verdict d = s.apply(p, Math.max(1, fits), nowUs);
                yield new Outcome(d, fits > 0, fits);
            }
        };
    }

    /**
     * The most units, at most {@code most}, that {@code s} admits at once now
     * (0 when not even one does): admission is monotone in the cost, so a
     * binary search over {@link State#decide}, which changes nothing.
     */
    static long fits(State s, long[] p, long most, long nowUs) {
        if (most < 1 || !s.decide(p, 1, nowUs).allowed()) {
            return 0;
        }
        long lo = 1;
        long hi = most;
        while (lo < hi) {
            long mid = lo + (hi - lo + 1) / 2;
            if (s.decide(p, mid, nowUs).allowed()) {
                lo = mid;
            } else {
                hi = mid - 1;
            }
        }
        return lo;
    }

    static long ceilDiv(long a, long b) {
        return a / b + (a % b == 0 ? 0 : 1);
    }

    private static long satSub(long a, long b) {
        return a > b ? a - b : 0;
    }

    /**
     * A denial's wait, one rule for the counting algorithms: none for
     * {@code COST 0} (an inspection), never (-1) for more than the limit,
     * else {@code until} the {@code excess} units over the limit have left.
     */
    private static long denialWait(long cost, long limit, long excess, LongUnaryOperator until) {
        if (cost == 0) {
            return 0;
        }
        if (cost > limit) {
            return -1;
        }
        return until.applyAsLong(excess);
    }

    // ---------------------------------------------------------------- GCRA

    private static final BigInteger THOUSAND = BigInteger.valueOf(1000);
    private static final BigInteger SPAN = BigInteger.valueOf(MAX_SPAN_MS);

    private static BigInteger big(long n) {
        return BigInteger.valueOf(n);
    }

    private static BigInteger ceilDiv(BigInteger a, BigInteger b) {
        BigInteger[] qr = a.divideAndRemainder(b);
        return qr[1].signum() == 0 ? qr[0] : qr[0].add(BigInteger.ONE);
    }

    private static BigInteger max0(BigInteger a) {
        return a.signum() < 0 ? BigInteger.ZERO : a;
    }

    /**
     * The token bucket ({@code token_bucket.rs}) and, shaped, the leaky
     * bucket ({@code leaky_bucket.rs}): params {@code capacity, count, ms}.
     */
    static final class Gcra extends State {
        private final boolean leaky;
        long tatUs;
        long tatFrac;
        long refillCount;
        long refillMs;

        Gcra(long[] p, long nowUs, boolean leaky) {
            this.leaky = leaky;
            this.tatUs = nowUs;
            this.tatFrac = 0;
            this.refillCount = p[1];
            this.refillMs = p[2];
        }

        /** A GCRA step: the decision, the ticks ahead, and the TAT to store (null: nothing). */
        private record Step(Verdict decision, BigInteger ahead, BigInteger newTat) {
        }

        private static BigInteger period(long[] p) {
            return big(p[2]).multiply(THOUSAND);
        }

        private static BigInteger ticksPerMs(long[] p) {
            return big(p[1]).multiply(THOUSAND);
        }

        private BigInteger tatTicks() {
            return big(tatUs).multiply(big(refillCount)).add(big(tatFrac));
        }

        private BigInteger ownDeficit(long nowUs) {
            return max0(tatTicks().subtract(big(nowUs).multiply(big(refillCount))));
        }

        private BigInteger deficit(long[] p, long nowUs) {
            BigInteger own = ownDeficit(nowUs);
            BigInteger oldPeriod = big(refillMs).multiply(THOUSAND);
            BigInteger newPeriod = period(p);
            BigInteger deficit;
            if (oldPeriod.equals(newPeriod)) {
                deficit = own;
            } else {
                BigInteger[] qr = own.divideAndRemainder(oldPeriod);
                deficit = qr[0].multiply(newPeriod).add(ceilDiv(qr[1].multiply(newPeriod), oldPeriod));
            }
            return deficit.min(SPAN.multiply(ticksPerMs(p)));
        }

        private void setTat(long[] p, BigInteger ticks) {
            BigInteger[] qr = ticks.divideAndRemainder(big(p[1]));
            tatUs = qr[0].longValueExact();
            tatFrac = qr[1].longValueExact();
            refillCount = p[1];
            refillMs = p[2];
        }

        private Step gcra(long[] p, long cost, long nowUs) {
            BigInteger period = period(p);
            BigInteger tau = big(p[0]).multiply(period);
            BigInteger ticksPerMs = ticksPerMs(p);
            BigInteger deficit = deficit(p, nowUs);
            BigInteger need = big(cost).multiply(period);
            if (cost > 0 && deficit.add(need).compareTo(tau) <= 0) {
                BigInteger after = deficit.add(need);
                BigInteger nowTicks = big(nowUs).multiply(big(p[1]));
                Verdict d = new Verdict(true, p[0], max0(tau.subtract(after)).divide(period).longValueExact(), 0,
                        ceilDiv(after, ticksPerMs).longValueExact());
                return new Step(d, deficit, nowTicks.add(after));
            }
            BigInteger shortMs;
            BigInteger resetMs;
            if (refillCount == p[1] && refillMs == p[2]) {
                shortMs = ceilDiv(max0(deficit.add(need).subtract(tau)), ticksPerMs);
                resetMs = ceilDiv(deficit, ticksPerMs);
            } else {
                // Another rate: the state keeps draining at its own until an admission stores it.
                BigInteger own = ownDeficit(nowUs);
                BigInteger ownPerMs = big(refillCount).multiply(THOUSAND);
                BigInteger fits = big(satSub(p[0], cost)).multiply(big(refillMs).multiply(THOUSAND));
                shortMs = ceilDiv(max0(own.subtract(fits)), ownPerMs).min(SPAN);
                resetMs = ceilDiv(own, ownPerMs).min(SPAN);
            }
            long wait;
            if (cost == 0) {
                wait = 0;
            } else if (need.compareTo(tau) > 0) {
                wait = -1;
            } else {
                wait = shortMs.longValueExact();
            }
            Verdict d = new Verdict(cost == 0, p[0], max0(tau.subtract(deficit)).divide(period).longValueExact(), wait,
                    resetMs.longValueExact());
            return new Step(d, deficit, null);
        }

        /** The leaky bucket's answer: an admitted request learns when its turn comes. */
        private Verdict shaped(Step step, long[] p) {
            Verdict d = step.decision();
            if (leaky && d.allowed()) {
                return d.withWait(ceilDiv(step.ahead(), ticksPerMs(p)).longValueExact());
            }
            return d;
        }

        @Override
        Verdict apply(long[] p, long cost, long nowUs) {
            Step step = gcra(p, cost, nowUs);
            if (step.newTat() != null) {
                setTat(p, step.newTat());
            }
            return shaped(step, p);
        }

        @Override
        Verdict decide(long[] p, long cost, long nowUs) {
            return shaped(gcra(p, cost, nowUs), p);
        }

        @Override
        Outcome force(long[] p, long cost, long nowUs) {
            Step step = gcra(p, cost, nowUs);
            if (step.decision().allowed() || cost == 0) {
                if (step.newTat() != null) {
                    setTat(p, step.newTat());
                }
                return new Outcome(shaped(step, p), step.decision().allowed() && cost > 0);
            }
            BigInteger deficit = deficit(p, nowUs);
            BigInteger tau = big(p[0]).multiply(period(p));
            BigInteger debtCap = tau.shiftLeft(1).min(SPAN.multiply(ticksPerMs(p)));
            BigInteger after = deficit.add(big(cost).multiply(period(p))).min(debtCap);
            if (after.compareTo(deficit) <= 0) {
                return new Outcome(shaped(step, p), false);
            }
            setTat(p, big(nowUs).multiply(big(p[1])).add(after));
            return new Outcome(shaped(step, p), true);
        }

        @Override
        boolean refund(long[] p, long units, long nowUs) {
            BigInteger deficit = deficit(p, nowUs);
            if (deficit.signum() == 0 || units == 0) {
                return false;
            }
            BigInteger after = max0(deficit.subtract(big(units).multiply(period(p))));
            setTat(p, big(nowUs).multiply(big(p[1])).add(after));
            return true;
        }
    }

    // -------------------------------------------------------- fixed window

    /**
     * A count in a window (the fixed window) or a period (the quota): the
     * decision, {@code COST n FORCE} and {@code REFUND n} are the same for
     * both, as in the core; they differ only in where a window ends.
     */
    abstract static class Counted extends State {
        long count;

        /** The mark a call counts at (an instant or a period's end), and its count. */
        abstract long[] current(long[] p, long nowUs);

        /** Keeps the mark {@link #current} gave. */
        abstract void mark(long at);

        @Override
        final Outcome force(long[] p, long cost, long nowUs) {
            Verdict d = apply(p, cost, nowUs);
            if (d.allowed() || cost == 0) {
                return new Outcome(d, d.allowed() && cost > 0);
            }
            long[] cur = current(p, nowUs);
            long forced = Math.min(cur[1] + cost, 2 * p[0]);
            if (forced <= cur[1]) {
                return new Outcome(d, false);
            }
            mark(cur[0]);
            count = forced;
            return new Outcome(d, true);
        }

        /** The end of the window or period that a mark of {@link #current} is in, in microseconds. */
        abstract long endOf(long[] p, long mark);

        /**
         * A call of {@code cost} units: admitted while the count leaves room
         * (kept when {@code commit}), else the wait to the end (which is after
         * {@code nowUs}), or never for more than the limit; {@code COST 0}
         * inspects.
         */
        private Verdict evaluate(long[] p, long cost, long nowUs, boolean commit) {
            long[] cur = current(p, nowUs);
            long count = cur[1];
            long end = endOf(p, cur[0]);
            long toEndMs = ceilDiv(end - Math.min(nowUs, end), 1000);
            long limit = p[0];
            long remaining = satSub(limit, count);
            if (cost > 0 && cost <= remaining) {
                if (commit) {
                    mark(cur[0]);
                    this.count = count + cost;
                }
                return new Verdict(true, limit, remaining - cost, 0, toEndMs);
            }
            long wait = denialWait(cost, limit, count + cost - limit, excess -> Math.max(toEndMs, 1));
            return new Verdict(cost == 0, limit, remaining, wait, count == 0 ? 0 : toEndMs);
        }

        @Override
        final Verdict apply(long[] p, long cost, long nowUs) {
            return evaluate(p, cost, nowUs, true);
        }

        @Override
        final Verdict decide(long[] p, long cost, long nowUs) {
            return evaluate(p, cost, nowUs, false);
        }

        /** Gives back at most the current count (a count of the current window or period, which keeps its mark). */
        @Override
        final boolean refund(long[] p, long units, long nowUs) {
            long count = current(p, nowUs)[1];
            long back = Math.min(units, count);
            if (back == 0) {
                return false;
            }
            this.count = count - back;
            return true;
        }
    }

    /** {@code fixed_window.rs}: params {@code limit, window_ms}. */
    static final class FixedWindow extends Counted {
        long lastUs;

        FixedWindow(long nowUs) {
            lastUs = nowUs;
        }

        private static long windowEndUs(long[] p, long t) {
            long w = p[1] * 1000;
            return t - t % w + w;
        }

        /** The instant a call counts at, and its window's count. */
        @Override
        long[] current(long[] p, long nowUs) {
            long eff = Math.max(nowUs, lastUs);
            boolean same = windowEndUs(p, lastUs) == windowEndUs(p, eff);
            return new long[] {eff, same ? count : 0};
        }

        @Override
        long endOf(long[] p, long mark) {
            return windowEndUs(p, mark);
        }

        @Override
        void mark(long at) {
            lastUs = at;
        }
    }

    // --------------------------------------------------------- sliding log

    /**
     * {@code sliding_log.rs}: params {@code limit, window_ms}. One entry per
     * millisecond that admitted something: its millisecond and the running
     * count of units admitted through it, oldest first.
     */
    static final class SlidingLog extends State {
        private long[] ms = new long[4];
        private long[] run = new long[4];
        private int start;
        private int end;
        private long admitted;
        private long held;

        private int len() {
            return end - start;
        }

        private long msOf(int i) {
            return ms[start + i];
        }

        /** Units in entries {@code 0..=i}. */
        private long unitsThrough(int i) {
            return run[start + i] - (admitted - held);
        }

        private long newestMs() {
            return len() == 0 ? -1 : msOf(len() - 1);
        }

        private long stamp(long nowUs) {
            return Math.max(ceilDiv(nowUs, 1000), len() == 0 ? 0 : newestMs());
        }

        /** The first index of {@code from..len} where {@code reached} holds ({@code len} if nowhere). */
        private int search(int from, java.util.function.IntPredicate reached) {
            int lo = from;
            int hi = len();
            while (lo < hi) {
                int mid = lo + (hi - lo) / 2;
                if (reached.test(mid)) {
                    hi = mid;
                } else {
                    lo = mid + 1;
                }
            }
            return lo;
        }

        private int firstLive(long windowMs, long nowUs) {
            return search(0, i -> (msOf(i) + windowMs) * 1000 > nowUs);
        }

        private long liveUnits(int first) {
            return first == 0 ? held : held - unitsThrough(first - 1);
        }

        private void expire(int first) {
            if (first > 0) {
                held -= unitsThrough(first - 1);
                start += first;
            }
        }

        private void push(long stampMs, long cost) {
            admitted += cost;
            held += cost;
            if (len() > 0 && newestMs() == stampMs) {
                run[end - 1] = admitted;
                return;
            }
            if (end == ms.length) {
                int n = len();
                int capacity = Math.max(4, n * 2);
                long[] m = new long[capacity];
                long[] r = new long[capacity];
                System.arraycopy(ms, start, m, 0, n);
                System.arraycopy(run, start, r, 0, n);
                ms = m;
                run = r;
                start = 0;
                end = n;
            }
            ms[end] = stampMs;
            run[end] = admitted;
            end++;
        }

        private void popNewest(long units) {
            while (units > 0 && len() > 0) {
                int n = len();
                long below = n >= 2 ? unitsThrough(n - 2) : 0;
                long inLast = unitsThrough(n - 1) - below;
                long back = Math.min(units, inLast);
                held -= back;
                admitted -= back;
                units -= back;
                if (back == inLast) {
                    end--;
                } else {
                    run[end - 1] = admitted;
                }
            }
        }

        /** The decision, and (in {@code first[0]}) the oldest entry still in the window. */
        private Verdict evaluate(long[] p, long cost, long nowUs, int[] firstOut) {
            long limit = p[0];
            long windowMs = p[1];
            long nowCeilMs = ceilDiv(nowUs, 1000);
            int first = firstLive(windowMs, nowUs);
            firstOut[0] = first;
            long before = first > 0 ? unitsThrough(first - 1) : 0;
            long held = this.held - before;
            long remaining = satSub(limit, held);
            if (cost > 0 && cost <= remaining) {
                long st = stamp(nowUs);
                long reset = st == nowCeilMs ? windowMs : leavesAfter(st, windowMs, nowUs);
                return new Verdict(true, limit, remaining - cost, 0, reset);
            }
            long reset = 0;
            if (len() > 0 && held > 0) {
                long newest = newestMs();
                reset = newest == nowCeilMs ? windowMs : leavesAfter(newest, windowMs, nowUs);
            }
            long wait = denialWait(cost, limit, held + cost - limit, excess ->
                    leavesAfter(msOf(search(first, i -> unitsThrough(i) - before >= excess)), windowMs, nowUs));
            if (wait >= 0) {
                reset = Math.max(reset, wait);
            }
            return new Verdict(cost == 0, limit, remaining, wait, reset);
        }

        private static long leavesAfter(long ms, long windowMs, long nowUs) {
            return ceilDiv(satSub((ms + windowMs) * 1000, nowUs), 1000);
        }

        @Override
        Verdict apply(long[] p, long cost, long nowUs) {
            int[] first = new int[1];
            Verdict d = evaluate(p, cost, nowUs, first);
            if (d.allowed() && cost > 0) {
                long st = stamp(nowUs);
                expire(first[0]);
                push(st, cost);
            }
            return d;
        }

        @Override
        Verdict decide(long[] p, long cost, long nowUs) {
            return evaluate(p, cost, nowUs, new int[1]);
        }

        @Override
        Outcome force(long[] p, long cost, long nowUs) {
            int[] first = new int[1];
            Verdict d = evaluate(p, cost, nowUs, first);
            if (d.allowed() || cost == 0) {
                boolean changed = d.allowed() && cost > 0;
                if (changed) {
                    long st = stamp(nowUs);
                    expire(first[0]);
                    push(st, cost);
                }
                return new Outcome(d, changed);
            }
            long live = liveUnits(first[0]);
            long cap = Math.min(2 * p[0], MAX_SLIDING);
            long take = Math.min(cost, satSub(cap, live));
            if (take == 0) {
                return new Outcome(d, false);
            }
            long st = stamp(nowUs);
            expire(first[0]);
            push(st, take);
            return new Outcome(d, true);
        }

        @Override
        boolean refund(long[] p, long units, long nowUs) {
            int first = firstLive(p[1], nowUs);
            long back = Math.min(units, liveUnits(first));
            if (back == 0) {
                return false;
            }
            expire(first);
            popNewest(back);
            return true;
        }
    }

    // --------------------------------------------------------- hash window

    /**
     * {@code hash_window.rs}: params {@code limit, window_ms, bucket_ms}. The
     * ring of {@code window_ms / bucket_ms + 1} counters is kept sparse: the
     * non-zero counts of the buckets {@code (newest - n, newest]} by index.
     */
    static final class HashWindow extends State {
        long bucketMs;
        long newest;
        long sum;
        long n;
        TreeMap<Long, Long> counts = new TreeMap<>();

        HashWindow(long[] p, long nowUs) {
            bucketMs = p[2];
            newest = (nowUs / 1000) / p[2];
            n = p[1] / p[2] + 1;
        }

        private void become(HashWindow o) {
            bucketMs = o.bucketMs;
            newest = o.newest;
            sum = o.sum;
            n = o.n;
            counts = o.counts;
        }

        private boolean sameLayout(long[] p) {
            return bucketMs == p[2] && n == p[1] / p[2] + 1;
        }

        private long count(long bucket) {
            return counts.getOrDefault(bucket, 0L);
        }

        /** Units still in the window when bucket {@code current} (at least {@code newest}) is the newest. */
        private long heldAt(long current) {
            if (current >= newest + n) {
                return 0;
            }
            long gone = 0;
            for (long c : counts.headMap(current - n, true).values()) {
                gone += c;
            }
            return sum - gone;
        }

        private void advance(long current) {
            if (current >= newest + n) {
                counts.clear();
                sum = 0;
            } else {
                Iterator<Map.Entry<Long, Long>> it = counts.headMap(current - n, true).entrySet().iterator();
                while (it.hasNext()) {
                    sum -= it.next().getValue();
                    it.remove();
                }
            }
            newest = Math.max(newest, current);
        }

        private void add(long bucket, long units) {
            counts.merge(bucket, units, Long::sum);
            sum += units;
        }

        private long leavesAfter(long bucket, long bucketUs, long nowUs) {
            return ceilDiv(satSub((bucket + n) * bucketUs, nowUs), 1000);
        }

        private long current(long[] p, long nowUs) {
            return Math.max(nowUs / (p[2] * 1000), newest);
        }

        /** The decision on a ring of the right layout. */
        private Verdict evaluate(long[] p, long cost, long nowUs) {
            long bucketUs = p[2] * 1000;
            long current = current(p, nowUs);
            long held = heldAt(current);
            long limit = p[0];
            long remaining = satSub(limit, held);
            if (cost > 0 && cost <= remaining) {
                return new Verdict(true, limit, remaining - cost, 0, leavesAfter(current, bucketUs, nowUs));
            }
            long wait = denialWait(cost, limit, held + cost - limit, excess -> {
                long freed = 0;
                long from = Math.max(current + 1 - n, 0);
                long bucket = from;
                for (Map.Entry<Long, Long> e : counts.tailMap(from, true).entrySet()) {
                    if (e.getKey() > newest) {
                        break;
                    }
                    freed += e.getValue();
                    bucket = e.getKey();
                    if (freed >= excess) {
                        break;
                    }
                }
                return leavesAfter(bucket, bucketUs, nowUs);
            });
            return new Verdict(cost == 0, limit, remaining, wait, held == 0 ? 0 : leavesAfter(newest, bucketUs, nowUs));
        }

        /** The same units in the ring of other parameters, at {@code now}. */
        private HashWindow converted(long[] p, long nowUs) {
            HashWindow fresh = new HashWindow(p, nowUs);
            long oldestLive = Math.max(fresh.newest + 1 - fresh.n, 0);
            for (Map.Entry<Long, Long> e : counts.entrySet()) {
                long j = e.getKey();
                long units = e.getValue();
                if (units == 0) {
                    continue;
                }
                long lastMs = (j + 1) * bucketMs - 1;
                long target = lastMs / p[2];
                if (target < oldestLive) {
                    continue;
                }
                if (target > fresh.newest) {
                    fresh.advance(target);
                }
                fresh.add(target, units);
            }
            return fresh;
        }

        private void take(long current, long units) {
            advance(current);
            add(current, units);
        }

        @Override
        Verdict apply(long[] p, long cost, long nowUs) {
            if (!sameLayout(p)) {
                HashWindow c = converted(p, nowUs);
                Verdict d = c.apply(p, cost, nowUs);
                if (d.allowed() && cost > 0) {
                    become(c);
                }
                return d;
            }
            Verdict d = evaluate(p, cost, nowUs);
            if (d.allowed() && cost > 0) {
                take(current(p, nowUs), cost);
            }
            return d;
        }

        @Override
        Verdict decide(long[] p, long cost, long nowUs) {
            return sameLayout(p) ? evaluate(p, cost, nowUs) : converted(p, nowUs).evaluate(p, cost, nowUs);
        }

        @Override
        Outcome force(long[] p, long cost, long nowUs) {
            if (!sameLayout(p)) {
                HashWindow c = converted(p, nowUs);
                Outcome o = c.force(p, cost, nowUs);
                if (o.changed()) {
                    become(c);
                }
                return o;
            }
            Verdict d = evaluate(p, cost, nowUs);
            if (cost == 0) {
                return new Outcome(d, false);
            }
            long current = current(p, nowUs);
            long held = heldAt(current);
            long take = d.allowed() ? cost : Math.min(cost, satSub(2 * p[0], held));
            if (take == 0) {
                return new Outcome(d, false);
            }
            take(current, take);
            return new Outcome(d, true);
        }

        @Override
        boolean refund(long[] p, long units, long nowUs) {
            if (!sameLayout(p)) {
                HashWindow c = converted(p, nowUs);
                boolean changed = c.refund(p, units, nowUs);
                if (changed) {
                    become(c);
                }
                return changed;
            }
            long current = current(p, nowUs);
            long left = Math.min(units, heldAt(current));
            if (left == 0) {
                return false;
            }
            advance(current);
            // The current bucket first, then back in time.
            long oldest = Math.max(current + 1 - n, 0);
            Iterator<Map.Entry<Long, Long>> it = counts.subMap(oldest, true, current, true).descendingMap().entrySet().iterator();
            while (left > 0 && it.hasNext()) {
                Map.Entry<Long, Long> e = it.next();
                long back = Math.min(left, e.getValue());
                sum -= back;
                left -= back;
                if (back == e.getValue()) {
                    it.remove();
                } else {
                    e.setValue(e.getValue() - back);
                }
            }
            return true;
        }
    }

    // --------------------------------------------------------------- quota

    private static final long DAY_US = 86_400_000_000L;

    /** {@code quota.rs}: params {@code limit, period index, end_us} (0: the UTC period). */
    static final class Quota extends Counted {
        long endUs;

        private static long endAfter(long[] p, long nowUs) {
            long end = p[2] > nowUs ? p[2] : utcPeriodEnd(Period.values()[(int) p[1]], nowUs);
            return Math.max(end, nowUs + 1);
        }

        @Override
        long[] current(long[] p, long nowUs) {
            return nowUs < endUs ? new long[] {endUs, count} : new long[] {endAfter(p, nowUs), 0};
        }

        /** A quota's mark is its period's end. */
        @Override
        long endOf(long[] p, long mark) {
            return mark;
        }

        @Override
        void mark(long at) {
            endUs = at;
        }
    }

    /** The end of {@code period} that contains {@code now} in UTC, in Unix microseconds. */
    static long utcPeriodEnd(Period period, long nowUs) {
        long day = nowUs / DAY_US;
        long nextDay = switch (period) {
            case DAY -> day + 1;
            // 1970-01-01 was a Thursday: Monday is day 4 (mod 7).
            case WEEK -> day + 7 - (day + 3) % 7;
            case MONTH -> {
                long[] ymd = civilFromDays(day);
                yield ymd[1] == 12 ? daysFromCivil(ymd[0] + 1, 1, 1) : daysFromCivil(ymd[0], ymd[1] + 1, 1);
            }
            case YEAR -> daysFromCivil(civilFromDays(day)[0] + 1, 1, 1);
        };
        if (nextDay > MAX_TIME_US / DAY_US) {
            return MAX_TIME_US;
        }
        return Math.min(nextDay * DAY_US, MAX_TIME_US);
    }

    /** Days since 1970-01-01 to (year, month, day) (H. Hinnant's {@code civil_from_days}). */
    static long[] civilFromDays(long days) {
        long z = days + 719_468;
        long era = z / 146_097;
        long doe = z - era * 146_097;
        long yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
        long doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
        long mp = (5 * doy + 2) / 153;
        long d = doy - (153 * mp + 2) / 5 + 1;
        long m = mp < 10 ? mp + 3 : mp - 9;
        long y = yoe + era * 400 + (m <= 2 ? 1 : 0);
        return new long[] {y, m, d};
    }

    /** (year, month, day) to days since 1970-01-01. */
    static long daysFromCivil(long y, long m, long d) {
        long yy = m <= 2 ? y - 1 : y;
        long era = yy / 400;
        long yoe = yy - era * 400;
        long mp = m > 2 ? m - 3 : m + 9;
        long doy = (153 * mp + 2) / 5 + d - 1;
        long doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
        return Math.max(era * 146_097 + doe - 719_468, 0);
    }

    /** For tests and diagnostics: the decision's five integers. */
    static String fields(Verdict v) {
        return Arrays.toString(v.fields());
    }
}

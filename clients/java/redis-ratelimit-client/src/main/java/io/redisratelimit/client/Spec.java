package io.redisratelimit.client;

import java.util.ArrayList;
import java.util.List;

/**
 * An algorithm and its parameters, valid by construction: every parameter is
 * checked against the server's ranges when the spec is built, so a bad rule
 * fails where it is written, not at the first request.
 */
public final class Spec {
    /** The largest parameter the server accepts: 2^40. */
    public static final long MAX_PARAM = 1L << 40;
    /** The largest {@code limit} of a concurrency cap: 2^24 - 1. */
    public static final long MAX_CONCURRENCY = (1L << 24) - 1;

    private final Algorithm algorithm;
    private final long[] params;

    private Spec(Algorithm algorithm, long[] params) {
        this.algorithm = algorithm;
        this.params = params;
    }

    public static Spec tokenBucket(long capacity, long refillCount, long refillMs) {
        return of(Algorithm.TOKENBUCKET, capacity, refillCount, refillMs);
    }

    public static Spec leakyBucket(long capacity, long leakCount, long leakMs) {
        return of(Algorithm.LEAKYBUCKET, capacity, leakCount, leakMs);
    }

    public static Spec sliding(long limit, long windowMs) {
        return of(Algorithm.SLIDING, limit, windowMs);
    }

    public static Spec hashWindow(long limit, long windowMs, long bucketMs) {
        return of(Algorithm.HASHWINDOW, limit, windowMs, bucketMs);
    }

    public static Spec fixedWindow(long limit, long windowMs) {
        return of(Algorithm.FIXEDWINDOW, limit, windowMs);
    }

    /**
     * {@code CONCURRENCY limit lease_ms}: at most {@code limit} units held at
     * once, each lease ending at its release or {@code lease_ms} after it was
     * granted or last renewed ({@code RL.CONCURRENCY}, or a policy).
     */
    public static Spec concurrency(long limit, long leaseMs) {
        return of(Algorithm.CONCURRENCY, limit, leaseMs);
    }

    /** Whether this caps work in flight ({@code CONCURRENCY}) rather than a rate. */
    public boolean concurrency() {
        return algorithm == Algorithm.CONCURRENCY;
    }

    /** Checks the arity and every parameter's range (1 to 2^40; a bucket dividing its window). */
    public static Spec of(Algorithm algorithm, long... params) {
        List<String> names = algorithm.paramNames();
        if (params.length != names.size()) {
            throw new BadArgumentException("params", algorithm.name().toLowerCase(java.util.Locale.ROOT)
                    + " takes " + names.size() + " parameters " + names + ", got " + params.length);
        }
        for (int i = 0; i < params.length; i++) {
            if (params[i] < 1 || params[i] > MAX_PARAM) {
                throw new BadArgumentException(names.get(i), "must be an integer from 1 to " + MAX_PARAM + ", got " + params[i]);
            }
        }
        if (algorithm == Algorithm.CONCURRENCY && params[0] > MAX_CONCURRENCY) {
            throw new BadArgumentException("limit", "must be an integer from 1 to " + MAX_CONCURRENCY + ", got " + params[0]);
        }
        if (algorithm == Algorithm.HASHWINDOW && params[1] % params[2] != 0) {
            throw new BadArgumentException("bucket_ms", "must divide window_ms (" + params[1] + " % " + params[2] + " != 0)");
        }
        return new Spec(algorithm, params.clone());
    }

    public static Spec of(Algorithm algorithm, List<Long> params) {
        return of(algorithm, params.stream().mapToLong(Long::longValue).toArray());
    }

    public Algorithm algorithm() {
        return algorithm;
    }

    /** The parameters in the command's order. */
    public List<Long> params() {
        List<Long> out = new ArrayList<>(params.length);
        for (long p : params) {
            out.add(p);
        }
        return out;
    }

    /** The spec as command words: {@code TOKENBUCKET 5 5 1000}. */
    public List<String> words() {
        List<String> out = new ArrayList<>(params.length + 1);
        out.add(algorithm.name());
        for (long p : params) {
            out.add(Long.toString(p));
        }
        return out;
    }

    /** Requests (or units) per window: the {@code q} of {@code RateLimit-Policy}. */
    public long limit() {
        return params[0];
    }

    /**
     * The {@code w} of {@code RateLimit-Policy} in seconds, rounded up: the
     * window for the windows, {@code capacity * refill_ms / refill_count} for
     * the buckets. A concurrency cap has no window (the field leaves {@code w}
     * out); this answers its lease time.
     */
    public long windowSeconds() {
        long ms = switch (algorithm) {
            case TOKENBUCKET, LEAKYBUCKET -> java.math.BigInteger.valueOf(params[0]).multiply(java.math.BigInteger.valueOf(params[2]))
                    .add(java.math.BigInteger.valueOf(params[1] - 1)).divide(java.math.BigInteger.valueOf(params[1])).longValue();
            default -> params[1];
        };
        return Decision.ceilDiv(ms, 1000);
    }

    /** The period over which the refill or window applies, in ms. */
    long periodMs() {
        return switch (algorithm) {
            case TOKENBUCKET, LEAKYBUCKET -> params[2];
            default -> params[1];
        };
    }

    /**
     * The same algorithm at one instance's share: {@code ceil(n * ratio)}, at
     * least 1, for the capacity or limit and for the refill or leak count, so
     * the window or refill period stays.
     */
    public Spec share(Share share) {
        long[] p = params.clone();
        p[0] = share.of(p[0]);
        if (algorithm == Algorithm.TOKENBUCKET || algorithm == Algorithm.LEAKYBUCKET) {
            p[1] = share.of(p[1]);
        }
        return new Spec(algorithm, p);
    }

    @Override
    public boolean equals(Object o) {
        return o instanceof Spec s && s.algorithm == algorithm && java.util.Arrays.equals(s.params, params);
    }

    @Override
    public int hashCode() {
        return algorithm.hashCode() * 31 + java.util.Arrays.hashCode(params);
    }

    @Override
    public String toString() {
        return String.join(" ", words());
    }
}

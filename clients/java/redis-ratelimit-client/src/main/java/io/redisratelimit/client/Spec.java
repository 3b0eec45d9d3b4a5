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
    /** The largest {@code limit} of a sliding log (one entry per unit): 2^24 - 1. */
    public static final long MAX_SLIDING = (1L << 24) - 1;
    /**
     * The longest a limiter may take to get back to idle, in ms: 2^50. A
     * bucket whose {@code capacity * refill_ms / refill_count} (or
     * {@code leak_ms / leak_count}) is longer is refused, naming {@code span}.
     */
    public static final long MAX_SPAN_MS = 1L << 50;
    /** The most buckets a hash window counts in: {@code window_ms / bucket_ms} at most 10^6. */
    public static final long MAX_BUCKETS = 1_000_000;

    private final Algorithm algorithm;
    private final long[] params;
    /** A quota's period; null for the others. */
    private final Period period;
    /** A quota's zone as given ({@code +05:30}, {@code America/New_York}); null for UTC. */
    private final String zone;

    private Spec(Algorithm algorithm, long[] params) {
        this(algorithm, params, null, null);
    }

    private Spec(Algorithm algorithm, long[] params, Period period, String zone) {
        this.algorithm = algorithm;
        this.params = params;
        this.period = period;
        this.zone = zone;
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

    /**
     * {@code QUOTA limit PERIOD}: at most {@code limit} units per calendar
     * period in UTC ({@code RL.QUOTA}, a policy, or in {@code RL.ALL}).
     */
    public static Spec quota(long limit, Period period) {
        return quota(limit, period, null);
    }

    /**
     * {@code QUOTA limit PERIOD TZ zone}: at most {@code limit} units per
     * calendar period in {@code zone}: {@code UTC} (or null), a fixed offset
     * {@code +HH:MM} / {@code -HH:MM} (from -18:00 to +18:00), or an IANA name
     * ({@code America/New_York}). The zone's syntax is checked here, whether
     * the server's database knows a name when the call is made. A quota in
     * another zone than UTC goes in its own {@code RL.QUOTA} call or in a
     * policy ({@code RL.POLICY SET ... TZ zone}, which {@code RL.HIT} and
     * {@code RL.ALL ... POLICY name} count in); an inline spec of
     * {@code RL.ALL} counts in UTC only ({@link Limit#of} refuses a zoned one).
     */
    public static Spec quota(long limit, Period period, String zone) {
        if (period == null) {
            throw new InvalidArgumentException("period", "must be one of day, week, month, year, not null");
        }
        if (limit < 1 || limit > MAX_PARAM) {
            throw new InvalidArgumentException("limit", "must be an integer from 1 to " + MAX_PARAM + ", got " + limit);
        }
        return new Spec(Algorithm.QUOTA, new long[] {limit}, period, checkZone(zone));
    }

    /** The zone, or null for UTC ({@code UTC} or {@code Z} in any case); a {@link InvalidArgumentException} naming {@code zone} for a bad one. */
    static String checkZone(String zone) {
        if (zone == null || zone.equalsIgnoreCase("UTC") || zone.equalsIgnoreCase("Z")) {
            return null;
        }
        String why = "must be UTC, a fixed offset such as +05:30, or a time zone name such as America/New_York, not '" + zone + "'";
        if (zone.matches("[+-][0-9]{2}:[0-9]{2}")) {
            int hours = Integer.parseInt(zone.substring(1, 3));
            int minutes = Integer.parseInt(zone.substring(4, 6));
            if (minutes > 59 || hours > 18 || (hours == 18 && minutes > 0)) {
                throw new InvalidArgumentException("zone", why);
            }
            return zone;
        }
        if (zone.length() > 64 || zone.startsWith("/") || zone.contains("..")
                || !zone.matches("[A-Za-z][A-Za-z0-9_+\\-]*(/[A-Za-z0-9_+\\-]+)*")) {
            throw new InvalidArgumentException("zone", why);
        }
        return zone;
    }

    /** A quota's period; null for the other algorithms. */
    public Period period() {
        return period;
    }

    /** A quota's zone as given; null for UTC (and for the other algorithms). */
    public String zone() {
        return zone;
    }

    /** A quota in another zone than UTC: its own {@code RL.QUOTA} call or a policy, not an inline spec of {@code RL.ALL}. */
    public boolean zoned() {
        return zone != null;
    }

    /** The zone as {@link ZoneId}, for the in-process level (UTC when Java does not know a name). */
    java.time.ZoneId zoneId() {
        if (zone == null) {
            return java.time.ZoneOffset.UTC;
        }
        try {
            if (zone.charAt(0) == '+' || zone.charAt(0) == '-') {
                int seconds = (Integer.parseInt(zone.substring(1, 3)) * 3600 + Integer.parseInt(zone.substring(4, 6)) * 60)
                        * (zone.charAt(0) == '-' ? -1 : 1);
                return java.time.ZoneOffset.ofTotalSeconds(seconds);
            }
            return java.time.ZoneId.of(zone);
        } catch (java.time.DateTimeException e) {
            return java.time.ZoneOffset.UTC;
        }
    }

    /** Whether this caps work in flight ({@code CONCURRENCY}) rather than a rate. */
    public boolean concurrency() {
        return algorithm == Algorithm.CONCURRENCY;
    }

    /**
     * Checks the arity and every parameter's range as the server does, in the
     * command's order: 1 to 2^40 (a sliding log's or a concurrency cap's limit
     * 1 to 2^24 - 1); a bucket dividing its window into at most 10^6 buckets;
     * a bucket filling (or draining) within {@link #MAX_SPAN_MS}. A refusal
     * is a {@link InvalidArgumentException} naming the parameter, or
     * {@code window_ms / bucket_ms}, or {@code span}.
     */
    public static Spec of(Algorithm algorithm, long... params) {
        if (algorithm == Algorithm.QUOTA) {
            throw new InvalidArgumentException("period", "a quota takes a period: Spec.quota(limit, Period.DAY)");
        }
        List<String> names = algorithm.paramNames();
        if (params.length != names.size()) {
            throw new InvalidArgumentException("params", algorithm.name().toLowerCase(java.util.Locale.ROOT)
                    + " takes " + names.size() + " parameters " + names + ", got " + params.length);
        }
        for (int i = 0; i < params.length; i++) {
            long max = i > 0 ? MAX_PARAM : switch (algorithm) {
                case CONCURRENCY -> MAX_CONCURRENCY;
                case SLIDING -> MAX_SLIDING;
                default -> MAX_PARAM;
            };
            if (params[i] < 1 || params[i] > max) {
                throw new InvalidArgumentException(names.get(i), "must be an integer from 1 to " + max + ", got " + params[i]);
            }
        }
        if (algorithm == Algorithm.HASHWINDOW) {
            if (params[1] % params[2] != 0) {
                throw new InvalidArgumentException("bucket_ms", "must divide window_ms (" + params[1] + " % " + params[2] + " != 0)");
            }
            if (params[1] / params[2] > MAX_BUCKETS) {
                throw new InvalidArgumentException("window_ms / bucket_ms", "must be an integer from 1 to " + MAX_BUCKETS
                        + ", got " + params[1] / params[2]);
            }
        }
        if (algorithm == Algorithm.TOKENBUCKET || algorithm == Algorithm.LEAKYBUCKET) {
            // capacity * ms <= MAX_SPAN_MS * count, exactly (each side up to 2^90).
            java.math.BigInteger fill = java.math.BigInteger.valueOf(params[0]).multiply(java.math.BigInteger.valueOf(params[2]));
            if (fill.compareTo(java.math.BigInteger.valueOf(MAX_SPAN_MS).multiply(java.math.BigInteger.valueOf(params[1]))) > 0) {
                String what = algorithm == Algorithm.TOKENBUCKET
                        ? "capacity * refill_ms / refill_count (the time to fill the bucket)"
                        : "capacity * leak_ms / leak_count (the time to drain a full queue)";
                throw new InvalidArgumentException("span", what + " is too long: a limiter may take at most " + MAX_SPAN_MS
                        + " ms to get back to idle");
            }
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

    /** The spec as command words: {@code TOKENBUCKET 5 5 1000}, {@code QUOTA 1000 DAY TZ Europe/Paris}. */
    public List<String> words() {
        List<String> out = new ArrayList<>(params.length + 4);
        out.add(algorithm.name());
        for (long p : params) {
            out.add(Long.toString(p));
        }
        if (period != null) {
            out.add(period.word());
        }
        if (zone != null) {
            out.add("TZ");
            out.add(zone);
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
     * out); this answers its lease time. A quota answers its period's nominal
     * length ({@link Period#nominalSeconds()}: 86400, 604800, 2592000 for a
     * month, 31536000 for a year).
     */
    public long windowSeconds() {
        if (period != null) {
            return period.nominalSeconds();
        }
        long ms = switch (algorithm) {
            case TOKENBUCKET, LEAKYBUCKET -> java.math.BigInteger.valueOf(params[0]).multiply(java.math.BigInteger.valueOf(params[2]))
                    .add(java.math.BigInteger.valueOf(params[1] - 1)).divide(java.math.BigInteger.valueOf(params[1])).longValue();
            default -> params[1];
        };
        return Decision.ceilDiv(ms, 1000);
    }

    /** The period over which the refill or window applies, in ms. */
    long periodMs() {
        if (period != null) {
            return period.nominalSeconds() * 1000;
        }
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
        return new Spec(algorithm, p, period, zone);
    }

    /**
     * Stripe {@code i} of {@code n}: every size and rate parameter (the
     * capacity and the refill count of a token bucket, a window's or a
     * quota's limit) becomes {@code p / n}, plus 1 when {@code i < p % n};
     * the periods stay. Checked as any spec (a share of 0 is refused by
     * {@link Stripes#shares}, naming {@code striped}, before this is called).
     */
    Spec stripe(int i, int n) {
        long[] p = params.clone();
        p[0] = p[0] / n + (i < p[0] % n ? 1 : 0);
        if (algorithm == Algorithm.TOKENBUCKET || algorithm == Algorithm.LEAKYBUCKET) {
            p[1] = p[1] / n + (i < p[1] % n ? 1 : 0);
        }
        if (algorithm == Algorithm.QUOTA) {
            return new Spec(algorithm, p, period, zone);
        }
        return of(algorithm, p);
    }

    /**
     * The same algorithm at a policy's scale, as the server runs it: each size
     * and rate parameter (the capacity or limit, and the refill or leak
     * count) becomes {@code max(1, floor(n * scale / 100))}; the periods stay.
     */
    public Spec scaled(int scale) {
        if (scale < 1 || scale > 100) {
            throw new InvalidArgumentException("scale", "must be a percent from 1 to 100, got " + scale);
        }
        long[] p = params.clone();
        p[0] = Protection.scaled(p[0], scale);
        if (algorithm == Algorithm.TOKENBUCKET || algorithm == Algorithm.LEAKYBUCKET) {
            p[1] = Protection.scaled(p[1], scale);
        }
        return new Spec(algorithm, p, period, zone);
    }

    @Override
    public boolean equals(Object o) {
        return o instanceof Spec s && s.algorithm == algorithm && java.util.Arrays.equals(s.params, params)
                && s.period == period && java.util.Objects.equals(s.zone, zone);
    }

    @Override
    public int hashCode() {
        return java.util.Objects.hash(algorithm, java.util.Arrays.hashCode(params), period, zone);
    }

    @Override
    public String toString() {
        return String.join(" ", words());
    }
}

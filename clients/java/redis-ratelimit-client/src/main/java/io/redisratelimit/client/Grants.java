package io.redisratelimit.client;

/**
 * A global rule's grant options: {@code batched} (units taken from the server
 * with {@code UPTO b} and spent in process, the rest given back after
 * {@code holdMs}), and {@code stripes} (the limit kept in that many keys on
 * different masters). Set with {@link Rule#batched()}, {@link Rule#holdMs},
 * {@link Rule#maxSharePct} and {@link Rule#striped}; checked against the rule
 * by {@link Limiter#rules}.
 *
 * @param batched     units are taken in batches ({@code UPTO b}) and spent in process
 * @param holdMs      how long held units are kept before they go back ({@code REFUND}): 1 to 60000, default 50
 * @param maxSharePct the largest batch, in percent of the rule's limit: 1 to 100, default 10
 * @param stripes     the number of stripes: 1 (not striped) to 64
 */
public record Grants(boolean batched, long holdMs, int maxSharePct, int stripes) {
    /** Not batched, not striped. */
    public static final Grants OFF = new Grants(false, 50, 10, 1);
    /** The longest hold: one minute. */
    public static final long MAX_HOLD_MS = 60_000;
    /** The most stripes of one rule. */
    public static final int MAX_STRIPES = 64;

    public Grants {
        if (holdMs < 1 || holdMs > MAX_HOLD_MS) {
            throw new InvalidArgumentException("hold_ms", "must be an integer from 1 to " + MAX_HOLD_MS + ", got " + holdMs);
        }
        if (maxSharePct < 1 || maxSharePct > 100) {
            throw new InvalidArgumentException("max_share_pct", "must be a percent from 1 to 100, got " + maxSharePct);
        }
        if (stripes < 1 || stripes > MAX_STRIPES) {
            throw new InvalidArgumentException("striped", "must be an integer from 1 (not striped) to " + MAX_STRIPES + ", got " + stripes);
        }
    }

    /** Whether the rule is striped (more than one stripe). */
    public boolean striped() {
        return stripes > 1;
    }

    /** Whether either option is on. */
    public boolean any() {
        return batched || stripes > 1;
    }

    /**
     * The batch size {@code clamp(ceil(rate * holdMs / 1000), 1, max(1, limit * maxSharePct / 100))},
     * in integers: {@code rate} the decisions per second seen, {@code limit} the limit the batch is taken from.
     */
    public long batchSize(long rate, long limit) {
        long cap = Math.max(1, multiplyDiv(limit, maxSharePct, 100));
        long want = Math.max(1, ceilMultiplyDiv(Math.max(0, rate), holdMs, 1000));
        return Math.min(want, cap);
    }

    private static long multiplyDiv(long a, long b, long d) {
        return java.math.BigInteger.valueOf(a).multiply(java.math.BigInteger.valueOf(b)).divide(java.math.BigInteger.valueOf(d)).longValue();
    }

    private static long ceilMultiplyDiv(long a, long b, long d) {
        java.math.BigInteger p = java.math.BigInteger.valueOf(a).multiply(java.math.BigInteger.valueOf(b));
        java.math.BigInteger q = p.add(java.math.BigInteger.valueOf(d - 1)).divide(java.math.BigInteger.valueOf(d));
        return q.bitLength() < 63 ? q.longValue() : Long.MAX_VALUE;
    }
}

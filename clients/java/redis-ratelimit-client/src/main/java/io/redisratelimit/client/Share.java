package io.redisratelimit.client;

/**
 * How much of a global limit one instance takes in process: by default
 * {@code ceil(total / instances * 1.1)}, at least 1 and at most the total
 * (seed 000's rule: 15,000/s over 20 instances gives 825 each; one instance
 * takes the whole limit, not 1.1 times it).
 */
public record Share(double ratio) {
    public Share {
        if (!(ratio > 0) || Double.isInfinite(ratio)) {
            throw new InvalidArgumentException("share", "must be a ratio above 0, got " + ratio);
        }
    }

    /** {@code 1.1 / instances}. */
    public static Share instances(long instances) {
        if (instances < 1) {
            throw new InvalidArgumentException("instances", "must be at least 1, got " + instances);
        }
        return new Share(1.1 / instances);
    }

    /** {@code ceil(total * ratio)}, at least 1, at most {@code total}. */
    public long of(long total) {
        // Integer form of ceil(total * 11 / (instances * 10)) where the ratio came
        // from instances, so that 15000 / 20 gives exactly 825.
        double exact = total * ratio;
        long rounded = Math.round(exact);
        long n = Math.abs(exact - rounded) < 1e-9 ? rounded : (long) Math.ceil(exact);
        return Math.min(Math.max(1, total), Math.max(1, n));
    }
}

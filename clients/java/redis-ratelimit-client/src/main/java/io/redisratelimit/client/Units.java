package io.redisratelimit.client;

/**
 * What a limiter call takes: {@code COST n} (default 1; 0 inspects), with
 * {@code FORCE} (consume even when denied), or {@code REFUND n}.
 */
public record Units(long n, boolean force, boolean refund) {
    public Units {
        if (n < 0 || n > Spec.MAX_PARAM) {
            throw new BadArgumentException(refund ? "refund" : "cost", "must be an integer from 0 to " + Spec.MAX_PARAM + ", got " + n);
        }
        if (force && refund) {
            throw new BadArgumentException("force", "FORCE goes with COST, not REFUND");
        }
    }

    public static final Units ONE = new Units(1, false, false);

    public static Units cost(long n) {
        return new Units(n, false, false);
    }

    public static Units force(long n) {
        return new Units(n, true, false);
    }

    public static Units refund(long n) {
        return new Units(n, false, true);
    }

    void appendTo(java.util.List<String> args) {
        if (refund) {
            args.add("REFUND");
            args.add(Long.toString(n));
        } else if (n != 1 || force) {
            args.add("COST");
            args.add(Long.toString(n));
            if (force) {
                args.add("FORCE");
            }
        }
    }
}

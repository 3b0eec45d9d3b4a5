package io.redisratelimit.client;

import java.time.Duration;

/**
 * What a limiter call takes: {@code COST n} (default 1; 0 inspects), with
 * {@code FORCE} (consume even when denied), or {@code REFUND n}; and an
 * optional {@code BLOCK timeout_ms} (wait in the server for admission).
 */
public record Units(long n, boolean force, boolean refund, Duration block) {
    public Units {
        if (n < 0 || n > Spec.MAX_PARAM) {
            throw new BadArgumentException(refund ? "refund" : "cost", "must be an integer from 0 to " + Spec.MAX_PARAM + ", got " + n);
        }
        if (force && refund) {
            throw new BadArgumentException("force", "FORCE goes with COST, not REFUND");
        }
        if (block != null && block.isNegative()) {
            throw new BadArgumentException("block", "must be at least 0 ms");
        }
    }

    public static final Units ONE = new Units(1, false, false, null);

    public static Units cost(long n) {
        return new Units(n, false, false, null);
    }

    public static Units force(long n) {
        return new Units(n, true, false, null);
    }

    public static Units refund(long n) {
        return new Units(n, false, true, null);
    }

    /** The same units, waiting in the server up to {@code timeout} ({@code 0}: no limit). */
    public Units block(Duration timeout) {
        return new Units(n, force, refund, timeout);
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
        if (block != null) {
            args.add("BLOCK");
            args.add(Long.toString(block.toMillis()));
        }
    }
}

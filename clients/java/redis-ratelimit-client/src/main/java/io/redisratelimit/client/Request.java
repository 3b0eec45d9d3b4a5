package io.redisratelimit.client;

import java.util.List;
import java.util.Objects;

/**
 * What a limiter call takes, one of three kinds (the Rust kit's
 * {@code Request::Cost(n) | Request::Force(n) | Request::Refund(n)}):
 * {@link #cost(long) COST n} (default 1; 0 inspects),
 * {@link #force(long) COST n FORCE} (consume even when denied), or
 * {@link #refund(long) REFUND n}. {@link #kind()} says which.
 *
 * <p>Replaces {@link Units} (deprecated since 0.2.0), which is a subclass of
 * this type so that every call that took a {@code Units} still takes one.
 */
public class Request {
    /** The three kinds of request. */
    public enum Kind {
        /** {@code COST n}: take n units if the limiter allows them. */
        COST,
        /** {@code COST n FORCE}: take n units even when denied. */
        FORCE,
        /** {@code REFUND n}: give n units back. */
        REFUND
    }

    /** One unit: what a call without a request sends. */
    public static final Request ONE = new Request(1, false, false);

    private final long n;
    private final boolean force;
    private final boolean refund;

    /* Package-private: the kit's own subclass ({@link Units}) only. */
    Request(long n, boolean force, boolean refund) {
        if (n < 0 || n > Spec.MAX_PARAM) {
            throw new InvalidArgumentException(refund ? "refund" : "cost", "must be an integer from 0 to " + Spec.MAX_PARAM + ", got " + n);
        }
        if (force && refund) {
            throw new InvalidArgumentException("force", "FORCE goes with COST, not REFUND");
        }
        this.n = n;
        this.force = force;
        this.refund = refund;
    }

    /** {@code COST n}: n units (0 inspects without taking anything). */
    public static Request cost(long n) {
        return new Request(n, false, false);
    }

    /** {@code COST n FORCE}: n units, taken even when the limiter denies them. */
    public static Request force(long n) {
        return new Request(n, true, false);
    }

    /** {@code REFUND n}: n units given back. */
    public static Request refund(long n) {
        return new Request(n, false, true);
    }

    /** The number of units. */
    public long n() {
        return n;
    }

    /** True for {@link Kind#FORCE}. */
    public boolean force() {
        return force;
    }

    /** True for {@link Kind#REFUND}. */
    public boolean refund() {
        return refund;
    }

    /** Which of the three kinds this request is. */
    public Kind kind() {
        return refund ? Kind.REFUND : force ? Kind.FORCE : Kind.COST;
    }

    void appendTo(List<String> args) {
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

    /** Equal to any request (a deprecated {@code Units} too) of the same kind and units. */
    @Override
    public final boolean equals(Object o) {
        return o instanceof Request r && r.n == n && r.force == force && r.refund == refund;
    }

    @Override
    public final int hashCode() {
        return Objects.hash(n, force, refund);
    }

    @Override
    public String toString() {
        return "Request[n=" + n + ", force=" + force + ", refund=" + refund + "]";
    }
}

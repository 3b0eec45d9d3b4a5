package io.redisratelimit.client;

import java.util.List;
import java.util.Objects;

/**
 * What a limiter call takes, one of four kinds (the Rust kit's
 * {@code Request::Cost(n) | Request::Force(n) | Request::Refund(n) | Request::UpTo(n)}):
 * {@link #cost(long) COST n} (default 1; 0 inspects),
 * {@link #force(long) COST n FORCE} (consume even when denied),
 * {@link #refund(long) REFUND n}, or {@link #upto(long) UPTO n} (as many
 * units as the limiter admits now, at most n, at least 1: the decision's
 * {@link Decision#granted()}). {@link #kind()} says which.
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
        REFUND,
        /** {@code UPTO n}: take what fits now, from 1 to n units (not on a leaky bucket or a concurrency cap). */
        UPTO
    }

    /** One unit: what a call without a request sends. */
    public static final Request ONE = new Request(1, false, false);

    private final long n;
    private final boolean force;
    private final boolean refund;
    private final boolean upto;

    /* Package-private: the kit's own subclass ({@link Units}) only. */
    Request(long n, boolean force, boolean refund) {
        this(n, force, refund, false);
    }

    private Request(long n, boolean force, boolean refund, boolean upto) {
        if (upto && (n < 1 || n > Spec.MAX_PARAM)) {
            throw new InvalidArgumentException("UPTO", "must be an integer from 1 to " + Spec.MAX_PARAM + ", got " + n);
        }
        if (n < 0 || n > Spec.MAX_PARAM) {
            throw new InvalidArgumentException(refund ? "refund" : "cost", "must be an integer from 0 to " + Spec.MAX_PARAM + ", got " + n);
        }
        if (force && refund) {
            throw new InvalidArgumentException("force", "FORCE goes with COST, not REFUND");
        }
        this.n = n;
        this.force = force;
        this.refund = refund;
        this.upto = upto;
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

    /**
     * {@code UPTO n}: as many units as the limiter admits now, at most
     * {@code n} (1 to 2^40), at least 1; if not even one fits, the denial
     * {@code COST 1} gets. Not an option of a leaky bucket or a concurrency
     * cap (refused naming {@code UPTO}).
     */
    public static Request upto(long n) {
        return new Request(n, false, false, true);
    }

    /** True for {@link Kind#UPTO}. */
    public boolean upto() {
        return upto;
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
        return upto ? Kind.UPTO : refund ? Kind.REFUND : force ? Kind.FORCE : Kind.COST;
    }

    void appendTo(List<String> args) {
        if (upto) {
            args.add("UPTO");
            args.add(Long.toString(n));
        } else if (refund) {
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
        return o instanceof Request r && r.n == n && r.force == force && r.refund == refund && r.upto == upto;
    }

    @Override
    public final int hashCode() {
        return upto ? Objects.hash(n, force, refund, upto) : Objects.hash(n, force, refund);
    }

    @Override
    public String toString() {
        return upto ? "Request[upto=" + n + "]" : "Request[n=" + n + ", force=" + force + ", refund=" + refund + "]";
    }
}

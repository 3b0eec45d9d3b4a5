package io.redisratelimit.client;

/**
 * What a limiter call takes: {@code COST n} (default 1; 0 inspects), with
 * {@code FORCE} (consume even when denied), or {@code REFUND n}.
 *
 * @deprecated since 0.2.0, for removal: use {@link Request}, the name every
 * kit uses ({@link Request#cost(long)}, {@link Request#force(long)},
 * {@link Request#refund(long)}, {@link Request#ONE}). A {@code Units} is a
 * {@code Request}, so every call that takes a request still takes one, with
 * the same behaviour; {@code Units} was a record and is now a class (the
 * accessors {@code n()}, {@code force()}, {@code refund()}, {@code equals}
 * and {@code hashCode} are unchanged).
 */
@Deprecated(since = "0.2.0", forRemoval = true)
public final class Units extends Request {
    /** @deprecated use {@link Request#ONE}. */
    @Deprecated(since = "0.2.0", forRemoval = true)
    public static final Units ONE = new Units(1, false, false);

    /** @deprecated use {@link Request#cost(long)}, {@link Request#force(long)} or {@link Request#refund(long)}. */
    @Deprecated(since = "0.2.0", forRemoval = true)
    public Units(long n, boolean force, boolean refund) {
        super(n, force, refund);
    }

    /** @deprecated use {@link Request#cost(long)}. */
    @Deprecated(since = "0.2.0", forRemoval = true)
    public static Units cost(long n) {
        return new Units(n, false, false);
    }

    /** @deprecated use {@link Request#force(long)}. */
    @Deprecated(since = "0.2.0", forRemoval = true)
    public static Units force(long n) {
        return new Units(n, true, false);
    }

    /** @deprecated use {@link Request#refund(long)}. */
    @Deprecated(since = "0.2.0", forRemoval = true)
    public static Units refund(long n) {
        return new Units(n, false, true);
    }

    @Override
    public String toString() {
        return "Units[n=" + n() + ", force=" + force() + ", refund=" + refund() + "]";
    }
}

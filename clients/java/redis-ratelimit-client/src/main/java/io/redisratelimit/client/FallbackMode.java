package io.redisratelimit.client;

/** What decides a request when Redis errors, misses its deadline, or the breaker is open. */
public enum FallbackMode {
    /** Admit: availability over protection (the limiter guards a cost, not a safety property). */
    FAIL_OPEN,
    /** Deny, with {@code Retry-After} of the breaker's open time: protection over availability (logins, paid APIs). */
    FAIL_CLOSED,
    /** Every rule in process at this instance's share of its limit: the middle ground, and the default. */
    LOCAL_ONLY;

    public static FallbackMode parse(String s) {
        String n = s == null ? "" : s.trim().replace('-', '_').toUpperCase(java.util.Locale.ROOT);
        try {
            return valueOf(n);
        } catch (IllegalArgumentException e) {
            throw new InvalidArgumentException("fallback", "must be fail-open, fail-closed or local-only, got '" + s + "'");
        }
    }
}

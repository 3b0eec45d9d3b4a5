package io.redisratelimit.client;

/** How the server applies a policy. */
public enum PolicyMode {
    /** Denies what the limiter denies (the default). */
    ENFORCE,
    /** Evaluates and counts, takes only what it admits, always answers allowed: the dry run. */
    SHADOW,
    /** The kill switch: answers allowed at once, touching no state. */
    OFF;

    public static PolicyMode parse(String s) {
        try {
            return valueOf(s.trim().toUpperCase(java.util.Locale.ROOT));
        } catch (RuntimeException e) {
            throw new InvalidArgumentException("mode", "must be enforce, shadow or off, got '" + s + "'");
        }
    }
}

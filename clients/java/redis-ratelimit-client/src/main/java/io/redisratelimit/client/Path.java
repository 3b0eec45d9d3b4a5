package io.redisratelimit.client;

/** Which path decided a request; each has its counter in {@link StatsSnapshot}. */
public enum Path {
    /** The server's limiter. */
    REDIS,
    /** The in-process level, for a global rule, without a round trip. */
    LOCAL,
    /** The local deny cache, without a round trip. */
    DENY_CACHE,
    /** The fallback: Redis unreachable, late, or the breaker open. */
    FALLBACK,
    /**
     * A batched rule's units held from an {@code UPTO} grant, without a round
     * trip: an admission from them, or a denial until the grant's next ask.
     */
    GRANT;

    /** The level as metrics and deny events name it: {@code redis}, {@code local}, {@code deny_cache}, {@code fallback}, {@code grant}. */
    public String level() {
        return switch (this) {
            case REDIS -> "redis";
            case LOCAL -> "local";
            case DENY_CACHE -> "deny_cache";
            case FALLBACK -> "fallback";
            case GRANT -> "grant";
        };
    }
}

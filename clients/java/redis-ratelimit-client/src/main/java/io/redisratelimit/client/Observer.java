package io.redisratelimit.client;

/**
 * What a {@link Limiter} tells its metrics, with no metrics library in the
 * signature: without Micrometer on the class path the limiter never loads a
 * Micrometer class ({@link RateLimitMeters} is the one implementation).
 */
interface Observer {
    /** One rule's share of a decision: {@code level} from {@link Path#level()}, {@code outcome} admitted or denied. */
    void decided(String rule, Path level, boolean allowed);

    /** The last decision's {@code remaining / limit} for the rule (Redis or the local level decided). */
    void remaining(String rule, long limit, long remaining);

    /** One limiter command's round trip to Redis, answered or failed. */
    void redisRoundTrip(long nanos);
}

package io.redisratelimit.client;

/** The connection to Redis is down or refused. */
public class RedisUnavailableException extends RateLimitException {
    private static final long serialVersionUID = 1L;

    public RedisUnavailableException(String message, Throwable cause) {
        super(message, cause);
    }
}

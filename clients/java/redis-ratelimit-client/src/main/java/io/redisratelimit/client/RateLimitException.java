package io.redisratelimit.client;

/**
 * The one exception type of the kit. Its subclasses say what went wrong:
 * {@link InvalidArgumentException} (refused before anything was sent),
 * {@link ServerErrorException} (the server answered an error),
 * {@link RateLimitTimeoutException} (no answer within the deadline: the call
 * may have been admitted, so it is never retried),
 * {@link ProtocolException} (a reply of a shape the command never sends),
 * {@link RedisUnavailableException} (no connection),
 * {@link ModuleMissingException} (the server has no {@code ratelimit} module).
 */
public class RateLimitException extends RuntimeException {
    private static final long serialVersionUID = 1L;

    public RateLimitException(String message) {
        super(message);
    }

    public RateLimitException(String message, Throwable cause) {
        super(message, cause);
    }
}

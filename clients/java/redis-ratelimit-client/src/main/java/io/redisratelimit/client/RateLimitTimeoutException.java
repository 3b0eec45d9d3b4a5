package io.redisratelimit.client;

import java.time.Duration;

/**
 * No reply within the call's deadline. The server may still have admitted
 * the call, which is why the kit never sends it again: the fallback decides.
 */
public final class RateLimitTimeoutException extends RateLimitException {
    private static final long serialVersionUID = 1L;

    public RateLimitTimeoutException(String command, Duration deadline) {
        super(command + ": no reply within " + deadline.toMillis() + " ms");
    }
}

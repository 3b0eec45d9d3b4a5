package io.redisratelimit.client;

import java.time.Duration;

/**
 * No reply within the call's deadline. The server may still have admitted
 * the call, which is why the kit never sends it again: the fallback decides.
 *
 * <p>The shared vocabulary's {@code Timeout} error. Its Java name keeps the
 * {@code RateLimit} prefix so as not to clash with the JDK's checked
 * {@link java.util.concurrent.TimeoutException}, which code calling the
 * kit's {@code ...Async} methods (through {@code CompletableFuture.get(timeout,
 * unit)}) often catches in the same file; this one is unchecked.
 */
public final class RateLimitTimeoutException extends RateLimitException {
    private static final long serialVersionUID = 1L;

    public RateLimitTimeoutException(String command, Duration deadline) {
        super(command + ": no reply within " + deadline.toMillis() + " ms");
    }
}

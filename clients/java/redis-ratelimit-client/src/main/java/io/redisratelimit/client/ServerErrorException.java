package io.redisratelimit.client;

/** The server answered an error reply ({@code ERR ...}, {@code WRONGTYPE ...}, {@code CROSSSLOT ...}). */
public final class ServerErrorException extends RateLimitException {
    private static final long serialVersionUID = 1L;

    public ServerErrorException(String message, Throwable cause) {
        super(message, cause);
    }
}

package io.redisratelimit.client;

/** A reply of a shape the command never sends: a proxy in the way, or another module. */
public final class UnexpectedReplyException extends RateLimitException {
    private static final long serialVersionUID = 1L;

    public UnexpectedReplyException(String command, Object reply) {
        super(command + ": unexpected reply " + reply);
    }
}

package io.redisratelimit.client;

/** An argument the server would refuse, caught before anything was sent. */
public final class BadArgumentException extends RateLimitException {
    private static final long serialVersionUID = 1L;
    private final String argument;
    private final String reason;

    public BadArgumentException(String argument, String message) {
        super(argument + ": " + message);
        this.argument = argument;
        this.reason = message;
    }

    /** The message without the argument's name. */
    public String reason() {
        return reason;
    }

    /** The argument's name, as the commands' docs spell it ({@code capacity}, {@code cost}, ...). */
    public String argument() {
        return argument;
    }
}

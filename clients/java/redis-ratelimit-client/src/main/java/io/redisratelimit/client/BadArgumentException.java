package io.redisratelimit.client;

/**
 * An argument the server would refuse, caught before anything was sent.
 *
 * @deprecated since 0.2.0, for removal: catch {@link InvalidArgumentException}
 * and read {@link InvalidArgumentException#parameter()}. The kit throws only
 * {@code InvalidArgumentException}, a subclass of this class, so an existing
 * {@code catch (BadArgumentException e)} still catches every refused argument
 * until this class is removed (then {@code InvalidArgumentException} extends
 * {@link RateLimitException} directly).
 */
@Deprecated(since = "0.2.0", forRemoval = true)
public class BadArgumentException extends RateLimitException {
    private static final long serialVersionUID = 1L;
    private final String argument;
    private final String reason;

    /** @deprecated construct an {@link InvalidArgumentException}. */
    @Deprecated(since = "0.2.0", forRemoval = true)
    public BadArgumentException(String argument, String message) {
        super(argument + ": " + message);
        this.argument = argument;
        this.reason = message;
    }

    /** The message without the argument's name. */
    public String reason() {
        return reason;
    }

    /**
     * The argument's name, as the commands' docs spell it ({@code capacity}, {@code cost}, ...).
     *
     * @deprecated use {@link InvalidArgumentException#parameter()}, the same name.
     */
    @Deprecated(since = "0.2.0", forRemoval = true)
    public String argument() {
        return argument;
    }
}

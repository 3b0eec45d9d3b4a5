package io.redisratelimit.client;

/**
 * A reply of a shape the command never sends: a proxy in the way, or another module.
 *
 * @deprecated since 0.2.0, for removal: catch {@link ProtocolException}. The
 * kit throws only {@code ProtocolException}, a subclass of this class, so an
 * existing {@code catch (UnexpectedReplyException e)} still catches it until
 * this class is removed (then {@code ProtocolException} extends
 * {@link RateLimitException} directly).
 */
@Deprecated(since = "0.2.0", forRemoval = true)
public class UnexpectedReplyException extends RateLimitException {
    private static final long serialVersionUID = 1L;

    /** @deprecated construct a {@link ProtocolException}. */
    @Deprecated(since = "0.2.0", forRemoval = true)
    public UnexpectedReplyException(String command, Object reply) {
        super(command + ": unexpected reply " + reply);
    }
}

package io.redisratelimit.client;

/**
 * A reply of a shape the command never sends (the shared vocabulary's
 * {@code Protocol} error): a proxy in the way, or another module answering
 * the command. Not {@link java.net.ProtocolException}, a checked
 * {@code IOException} of the JDK's HTTP client; this one is unchecked, in
 * the kit's package, and a {@link RateLimitException}.
 *
 * <p>For one release this class extends the deprecated
 * {@link UnexpectedReplyException} (its old name), so that an existing
 * {@code catch (UnexpectedReplyException e)} still catches what the kit
 * throws; when that class goes, this one extends {@link RateLimitException}
 * directly.
 */
// The one reference to the deprecated superclass; nothing else in the kit uses it.
@SuppressWarnings("removal")
public final class ProtocolException extends UnexpectedReplyException {
    private static final long serialVersionUID = 1L;

    public ProtocolException(String command, Object reply) {
        super(command, reply);
    }
}

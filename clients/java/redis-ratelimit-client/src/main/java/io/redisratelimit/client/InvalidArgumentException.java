package io.redisratelimit.client;

/**
 * An argument the server would refuse, caught before anything was sent:
 * {@link #parameter()} names it as the commands' docs spell it
 * ({@code capacity}, {@code cost}, {@code window_ms}, {@code zone}, ...), and
 * {@link #reason()} says what is wrong with it.
 *
 * <p>For one release this class extends the deprecated
 * {@link BadArgumentException} (its old name), so that an existing
 * {@code catch (BadArgumentException e)} still catches what the kit throws;
 * when that class goes, this one extends {@link RateLimitException} directly.
 * Catch this class (or {@link RateLimitException}) in new code.
 */
// The one reference to the deprecated superclass; nothing else in the kit uses it.
@SuppressWarnings("removal")
public final class InvalidArgumentException extends BadArgumentException {
    private static final long serialVersionUID = 1L;

    public InvalidArgumentException(String parameter, String message) {
        super(parameter, message);
    }

    /** The parameter at fault, as the commands' docs spell it ({@code capacity}, {@code cost}, ...). */
    public String parameter() {
        return argument();
    }
}

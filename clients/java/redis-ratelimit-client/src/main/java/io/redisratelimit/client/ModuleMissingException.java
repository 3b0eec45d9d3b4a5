package io.redisratelimit.client;

/**
 * {@code MODULE LIST} has no {@code ratelimit} module (or an older one than the
 * kit needs): a managed server that cannot load modules, or a forgotten
 * {@code --loadmodule}. Raised at start-up, not at the first request.
 */
public final class ModuleMissingException extends RateLimitException {
    private static final long serialVersionUID = 1L;

    public ModuleMissingException(String message) {
        super(message);
    }
}

package io.redisratelimit.client;

/**
 * A lease (or an acquire that must succeed) was denied: the limiter is full,
 * or the wait passed first. {@link #decision()} is the server's denial, with
 * {@code wait_ms} for {@code Retry-After}.
 */
public final class RateLimitDeniedException extends RateLimitException {
    private static final long serialVersionUID = 1L;
    private final transient Decision decision;

    public RateLimitDeniedException(String command, Decision decision) {
        super(command + ": denied (" + (decision.never() ? "it can never pass" : "retry after " + decision.waitMs() + " ms") + ")");
        this.decision = decision;
    }

    public Decision decision() {
        return decision;
    }
}

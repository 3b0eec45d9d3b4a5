package io.redisratelimit.spring;

/** A bad {@code ratelimit.*} property, named in the message; raised at start-up (or refused on a refresh). */
public class RateLimitConfigException extends IllegalStateException {
    private static final long serialVersionUID = 1L;
    private final String property;

    public RateLimitConfigException(String property, String message, Throwable cause) {
        super(property + ": " + message, cause);
        this.property = property;
    }

    /** The property's full name, e.g. {@code ratelimit.rules.order-create.params[0]}. */
    public String property() {
        return property;
    }
}

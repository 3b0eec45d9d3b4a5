package io.redisratelimit.client;

/**
 * Redis is unavailable and the call was never sent: there is no connection
 * yet (Redis was away when the application started). Unlike a connection lost
 * after a call was sent, Redis counted nothing.
 */
public final class NotConnectedException extends RedisUnavailableException {
    private static final long serialVersionUID = 1L;

    public NotConnectedException(String message) {
        super(message, null);
    }
}

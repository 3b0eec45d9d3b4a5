package io.redisratelimit.client;

/**
 * Where a request came from, as HTTP tells it: its deny events carry
 * {@code client_ip} and {@code user_agent}. Either may be null (left out).
 */
public record Origin(String clientIp, String userAgent) {
    /** Nothing known (what the limiter's calls without an origin use). */
    public static final Origin UNKNOWN = new Origin(null, null);

    public static Origin of(String clientIp, String userAgent) {
        return clientIp == null && userAgent == null ? UNKNOWN : new Origin(clientIp, userAgent);
    }
}

package io.redisratelimit.spring;

import java.util.List;

/**
 * A request whose key expression gave nothing (null or empty), with
 * {@code ratelimit.missing-key: deny}: it is not decided, rather than counted
 * under one key shared by every such caller. Answered with 400.
 */
public class RateLimitKeyMissingException extends RuntimeException {
    private static final long serialVersionUID = 1L;
    private final transient List<String> rules;

    public RateLimitKeyMissingException(List<String> rules, String expression) {
        super("no rate-limit key: " + expression + " gave nothing for " + rules);
        this.rules = List.copyOf(rules);
    }

    public List<String> rules() {
        return rules;
    }
}

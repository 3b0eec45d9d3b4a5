package io.redisratelimit.spring;

import io.redisratelimit.client.Decision;

import java.util.List;

/** A call denied under {@link #rule()}: carries the decision for the 429's headers. */
public class RateLimitExceededException extends RuntimeException {
    private static final long serialVersionUID = 1L;
    private final transient Decision decision;
    private final String rule;
    private final List<String> rules;

    public RateLimitExceededException(List<String> rules, String rule, Decision decision) {
        super(RateLimitHeaders.detail(rule, decision));
        this.decision = decision;
        this.rule = rule;
        this.rules = List.copyOf(rules);
    }

    public Decision decision() {
        return decision;
    }

    /** The rule that denied. */
    public String rule() {
        return rule;
    }

    /** Every rule the call was checked against. */
    public List<String> rules() {
        return rules;
    }
}

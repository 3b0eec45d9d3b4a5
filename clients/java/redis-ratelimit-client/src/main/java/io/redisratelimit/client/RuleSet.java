package io.redisratelimit.client;

import java.util.List;

/**
 * Rules checked together, all or nothing (several go out as one {@code RL.ALL},
 * so in a cluster their keys must share a hash tag). Built by
 * {@link Limiter#rules(List)}, which checks every rule before anything is sent.
 */
public final class RuleSet {
    record Checked(Rule rule, Spec local, Spec fallback, String signature, String label) {
        Checked(Rule rule, Spec local, Spec fallback, String signature) {
            // Metrics' and deny events' rule: a policy rule's policy name, else the rule's name (never a key).
            this(rule, local, fallback, signature, rule.policy() != null ? rule.policy() : rule.name());
        }
    }

    private final List<Checked> rules;

    RuleSet(List<Checked> rules) {
        this.rules = List.copyOf(rules);
    }

    List<Checked> checked() {
        return rules;
    }

    public List<Rule> rules() {
        return rules.stream().map(Checked::rule).toList();
    }

    public int size() {
        return rules.size();
    }
}

package io.redisratelimit.client;

/**
 * One limiter of an {@code RL.ALL}: a key and either a spec or a policy name.
 */
public record Limit(String key, Spec spec, String policy) {
    public Limit {
        Args.key(key);
        if ((spec == null) == (policy == null)) {
            throw new InvalidArgumentException("spec", "a limit has either a spec or a policy name");
        }
        if (policy != null) {
            Args.policyName(policy);
        }
        if (spec != null && spec.concurrency()) {
            throw new InvalidArgumentException("spec", "RL.ALL refuses CONCURRENCY: take the lease with its own call");
        }
        if (spec != null && spec.zoned()) {
            throw new InvalidArgumentException("zone", "RL.ALL's inline quotas count in UTC only, not '" + spec.zone()
                    + "': make it a policy (Limit.policy counts in the policy's zone) or decide it with its own RL.QUOTA call");
        }
    }

    public static Limit of(String key, Spec spec) {
        return new Limit(key, spec, null);
    }

    public static Limit policy(String key, String policy) {
        return new Limit(key, null, policy);
    }
}

package io.redisratelimit.client;

/**
 * A rule: what the server applies (a spec inline, or a policy kept in the
 * server, {@code RL.HIT}) and the key it applies to, for an identity (a user,
 * an IP): {@code keyPrefix + identity}, or one fixed key for a total.
 *
 * <p>{@link #global()} marks a limit shared by every instance (a total): the
 * local level takes the instance's share of it in process first. A policy's
 * {@code spec} is what the server has (known from the properties that pushed
 * it, or read with {@code RL.POLICY GET}): the headers' window and the
 * local-only fallback use it.
 */
public record Rule(String name, Spec spec, String policy, String keyPrefix, String fixedKey, boolean global,
                   PolicyMode mode, int rollout, Grants grants) {

    /** A rule neither batched nor striped. */
    public Rule(String name, Spec spec, String policy, String keyPrefix, String fixedKey, boolean global,
                PolicyMode mode, int rollout) {
        this(name, spec, policy, keyPrefix, fixedKey, global, mode, rollout, Grants.OFF);
    }

    public Rule {
        if (name == null || name.isEmpty()) {
            throw new InvalidArgumentException("name", "a rule has a name");
        }
        if (spec == null && policy == null) {
            throw new InvalidArgumentException("spec", "rule '" + name + "' has neither a spec nor a policy");
        }
        if (policy != null) {
            Args.policyName(policy);
        }
        if (keyPrefix == null) {
            keyPrefix = "";
        }
        if (mode == null) {
            mode = PolicyMode.ENFORCE;
        }
        if (rollout < 0 || rollout > 100) {
            throw new InvalidArgumentException("rollout", "must be a percent from 0 to 100, got " + rollout);
        }
        if (grants == null) {
            grants = Grants.OFF;
        }
        if (grants.striped() && spec != null) {
            Stripes.shares(spec, grants.stripes());
        }
    }

    /** An inline rule, keyed {@code rl:<name>:<identity>}. */
    public static Rule of(String name, Spec spec) {
        return new Rule(name, spec, null, "rl:" + name + ":", null, false, PolicyMode.ENFORCE, 100);
    }

    /** A rule kept in the server as policy {@code policy}. */
    public static Rule policy(String name, String policy, Spec knownSpec) {
        return new Rule(name, knownSpec, policy, "rl:" + name + ":", null, false, PolicyMode.ENFORCE, 100);
    }

    public Rule keyPrefix(String prefix) {
        return new Rule(name, spec, policy, prefix, fixedKey, global, mode, rollout, grants);
    }

    /** One key for every identity: a total. */
    public Rule fixedKey(String key) {
        return new Rule(name, spec, policy, keyPrefix, Args.key(key), global, mode, rollout, grants);
    }

    /** Shared by every instance: the local level takes its share in process first. */
    public Rule asGlobal() {
        return new Rule(name, spec, policy, keyPrefix, fixedKey, true, mode, rollout, grants);
    }

    /** The policy's mode and roll-out, as pushed; the local level acts only on fully enforced rules. */
    public Rule mode(PolicyMode newMode, int newRollout) {
        return new Rule(name, spec, policy, keyPrefix, fixedKey, global, newMode, newRollout, grants);
    }

    /**
     * Batched (a global rule of a token bucket, a window or a quota): the
     * limiter takes units from the server with {@code UPTO b}, about
     * {@link #holdMs} worth of this instance's rate (at most
     * {@link #maxSharePct} of the limit), and spends them in process;
     * what it has held for {@code holdMs} goes back with {@code REFUND}.
     * Never over the limit; under-admission at most instances x batch for
     * {@code holdMs}.
     */
    public Rule batched() {
        return batched(true);
    }

    /** Batched on or off. */
    public Rule batched(boolean on) {
        return new Rule(name, spec, policy, keyPrefix, fixedKey, global, mode, rollout,
                new Grants(on, grants.holdMs(), grants.maxSharePct(), grants.stripes()));
    }

    /** How long a batched rule keeps units unspent before it gives them back: 1 to 60000 ms, default 50. */
    public Rule holdMs(long ms) {
        return new Rule(name, spec, policy, keyPrefix, fixedKey, global, mode, rollout,
                new Grants(grants.batched(), ms, grants.maxSharePct(), grants.stripes()));
    }

    /** The largest batch of a batched rule, in percent of its limit: 1 to 100, default 10. */
    public Rule maxSharePct(int pct) {
        return new Rule(name, spec, policy, keyPrefix, fixedKey, global, mode, rollout,
                new Grants(grants.batched(), grants.holdMs(), pct, grants.stripes()));
    }

    /**
     * Striped over {@code n} keys (2 to 64; 1 is not striped), each on its
     * own master where the cluster has enough, each with {@code limit / n}
     * (the remainder to the first ones) of every size and rate parameter. An
     * {@code n} larger than one of those is refused, naming {@code striped}.
     */
    public Rule striped(int n) {
        return new Rule(name, spec, policy, keyPrefix, fixedKey, global, mode, rollout,
                new Grants(grants.batched(), grants.holdMs(), grants.maxSharePct(), n));
    }

    public String keyFor(String identity) {
        return fixedKey != null ? fixedKey : keyPrefix + identity;
    }

    /**
     * The hash tag of the rule's keys ({@code api} in {@code {api}:user:}),
     * when the fixed part of the key has one: what puts every key of an
     * {@code RL.ALL} in one cluster slot. Null when there is none.
     */
    public String hashTag() {
        String fixed = fixedKey != null ? fixedKey : keyPrefix;
        int open = fixed.indexOf('{');
        if (open < 0) {
            return null;
        }
        int close = fixed.indexOf('}', open + 1);
        return close > open + 1 ? fixed.substring(open + 1, close) : null;
    }

    /** Whether it caps work in flight ({@code CONCURRENCY}): its admissions hold leases to release. */
    public boolean concurrency() {
        return spec != null && spec.concurrency();
    }

    /** Whether every key is enforced (not shadow, not off, roll-out 100). */
    public boolean enforced() {
        return mode == PolicyMode.ENFORCE && rollout == 100;
    }
}

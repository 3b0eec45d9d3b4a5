package io.redisratelimit.spring;

import io.redisratelimit.client.Algorithm;
import io.redisratelimit.client.InvalidArgumentException;
import io.redisratelimit.client.PolicyLoop;
import io.redisratelimit.client.PolicyMode;
import io.redisratelimit.client.Rule;
import io.redisratelimit.client.Spec;

import java.util.Collections;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;

/**
 * The rules of {@code ratelimit.rules.*}, checked: every algorithm and
 * parameter valid, or a {@link RateLimitConfigException} naming the property.
 * Each becomes a policy {@code <app>:<rule>} on the server.
 */
public final class RateLimitRules {
    /** A checked rule with what the starter needs beside the client's {@link Rule}. */
    public record Entry(String name, Rule rule, List<String> routes, List<String> methods, String keyExpression, long cost,
                        PolicyLoop loop, boolean core, String breaker) {
        /** Whether a route rule applies to a request of this HTTP method (every method when none is named). */
        public boolean appliesTo(String method) {
            return methods.isEmpty() || methods.contains(method);
        }
    }

    private final String app;
    private final Map<String, Entry> entries;

    private RateLimitRules(String app, Map<String, Entry> entries) {
        this.app = app;
        this.entries = Collections.unmodifiableMap(entries);
    }

    public static RateLimitRules from(String app, Map<String, RateLimitProperties.Rule> rules) {
        String prefix = "ratelimit.rules.";
        Map<String, Entry> out = new LinkedHashMap<>();
        for (Map.Entry<String, RateLimitProperties.Rule> e : rules.entrySet()) {
            String name = e.getKey();
            RateLimitProperties.Rule r = e.getValue();
            String p = prefix + name;
            if (r.getAlgorithm() == null || r.getAlgorithm().isBlank()) {
                throw new RateLimitConfigException(p + ".algorithm", "missing: one of tokenbucket, leakybucket, sliding, hashwindow, fixedwindow, concurrency, quota", null);
            }
            Algorithm algorithm;
            try {
                algorithm = Algorithm.parse(r.getAlgorithm());
            } catch (InvalidArgumentException ex) {
                throw new RateLimitConfigException(p + ".algorithm", ex.reason(), ex);
            }
            Spec spec;
            try {
                if (algorithm == Algorithm.QUOTA) {
                    spec = quota(p, r);
                } else {
                    if (r.getPeriod() != null || r.getZone() != null) {
                        throw new RateLimitConfigException(p + (r.getPeriod() != null ? ".period" : ".zone"),
                                "only a quota takes a period and a zone, not " + algorithm.name().toLowerCase(java.util.Locale.ROOT), null);
                    }
                    spec = Spec.of(algorithm, r.getParams());
                }
            } catch (InvalidArgumentException ex) {
                int i = algorithm.paramNames().indexOf(ex.parameter());
                if (i < 0) {
                    throw new RateLimitConfigException(p + ".params", ex.reason(), ex);
                }
                throw new RateLimitConfigException(p + ".params[" + i + "]", ex.parameter() + " " + ex.reason()
                        + " (" + algorithm.name().toLowerCase(java.util.Locale.ROOT) + " takes " + algorithm.paramNames() + ")", ex);
            }
            PolicyMode mode;
            try {
                // Unquoted YAML `mode: off` arrives as "false".
                mode = "false".equals(r.getMode()) ? PolicyMode.OFF : PolicyMode.parse(r.getMode());
            } catch (InvalidArgumentException ex) {
                throw new RateLimitConfigException(p + ".mode", ex.reason(), ex);
            }
            if (r.getRollout() < 0 || r.getRollout() > 100) {
                throw new RateLimitConfigException(p + ".rollout", "must be a percent from 0 to 100, got " + r.getRollout(), null);
            }
            if (spec.concurrency() && r.isGlobal()) {
                throw new RateLimitConfigException(p + ".global", "a concurrency rule has no local level: its leases are counted in the server", null);
            }
            if (r.getKey() != null && !r.getKey().isBlank()) {
                RateLimitKeys.checkRoute(p + ".key", r.getKey());
            }
            if (r.getCost() < 0) {
                throw new RateLimitConfigException(p + ".cost", "must be at least 0, got " + r.getCost(), null);
            }
            // Every rule is a policy, a quota in another zone than UTC too (RL.POLICY SET ... TZ zone).
            String policy = app + ":" + name;
            Rule rule;
            try {
                rule = Rule.policy(name, policy, spec).mode(mode, r.getRollout());
                if (r.getKeyPrefix() != null) {
                    rule = rule.keyPrefix(r.getKeyPrefix());
                } else {
                    rule = rule.keyPrefix("rl:" + app + ":" + name + ":");
                }
                if (r.getFixedKey() != null) {
                    rule = rule.fixedKey(r.getFixedKey());
                }
                if (r.isGlobal()) {
                    rule = rule.asGlobal();
                }
            } catch (InvalidArgumentException ex) {
                throw new RateLimitConfigException(p, ex.getMessage(), ex);
            }
            rule = grants(p, r, rule);
            List<String> methods = new java.util.ArrayList<>();
            for (String m : r.getMethods()) {
                String upper = m.trim().toUpperCase(java.util.Locale.ROOT);
                if (!List.of("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS", "TRACE").contains(upper)) {
                    throw new RateLimitConfigException(p + ".methods", "'" + m + "' is not an HTTP method", null);
                }
                methods.add(upper);
            }
            PolicyLoop loop = loop(p, r);
            String breaker = r.getBreaker() == null || r.getBreaker().isBlank() ? null : r.getBreaker().trim();
            if (io.redisratelimit.client.RateLimitMeters.REDIS_BREAKER.equals(breaker)) {
                throw new RateLimitConfigException(p + ".breaker", "'" + breaker + "' is the limiter's own breaker in"
                        + " ratelimit_breaker_open{breaker}: name the rule's breaker otherwise", null);
            }
            if (rule.grants().striped() && loop.any()) {
                throw new RateLimitConfigException(p + ".striped", "a striped rule's stripes are inline calls, which its"
                        + " policy's adapt and stages never see: a striped rule has neither", null);
            }
            if ((breaker != null || !r.isCore()) && !loop.staged()) {
                throw new RateLimitConfigException(p + ".stages", "missing: a rule with " + (breaker != null ? "a breaker" : "core=false")
                        + " acts on its stage, which only a policy with stages (degrade_pct,break_pct) has", null);
            }
            out.put(name, new Entry(name, rule, List.copyOf(r.getRoutes()), List.copyOf(methods), r.getKey(), r.getCost(),
                    loop, r.isCore(), breaker));
        }
        return new RateLimitRules(app, out);
    }

    /**
     * The rule's grant options ({@code batched}, {@code hold-ms},
     * {@code max-share-pct}, {@code striped}): on a global rule of a token
     * bucket, a window or a quota; a striped one enforced at roll-out 100.
     * Each error names its property.
     */
    private static Rule grants(String p, RateLimitProperties.Rule r, Rule rule) {
        boolean defaults = !r.isBatched() && r.getHoldMs() == 50 && r.getMaxSharePct() == 10 && r.getStriped() == 1;
        if (defaults) {
            return rule;
        }
        String option = r.getStriped() != 1 ? ".striped" : r.isBatched() ? ".batched" : r.getHoldMs() != 50 ? ".hold-ms" : ".max-share-pct";
        Rule out;
        try {
            out = rule.batched(r.isBatched()).holdMs(r.getHoldMs()).maxSharePct(r.getMaxSharePct()).striped(r.getStriped());
        } catch (InvalidArgumentException ex) {
            String property = switch (ex.parameter()) {
                case "hold_ms" -> ".hold-ms";
                case "max_share_pct" -> ".max-share-pct";
                default -> ".striped";
            };
            throw new RateLimitConfigException(p + property, ex.reason(), ex);
        }
        if (!out.grants().any()) {
            throw new RateLimitConfigException(p + option, "hold-ms and max-share-pct are options of a batched rule: set batched=true", null);
        }
        String what = out.grants().striped() ? ".striped" : ".batched";
        if (!r.isGlobal()) {
            throw new RateLimitConfigException(p + what, "only a global rule (global=true, a limit shared by every instance)"
                    + " is batched or striped", null);
        }
        Algorithm a = out.spec().algorithm();
        if (a == Algorithm.LEAKYBUCKET || a == Algorithm.CONCURRENCY) {
            throw new RateLimitConfigException(p + what, "a " + a.name().toLowerCase(java.util.Locale.ROOT)
                    + " takes no UPTO: only a token bucket, a window or a quota is batched or striped", null);
        }
        if (out.grants().striped() && !out.enforced()) {
            throw new RateLimitConfigException(p + ".striped", "a striped rule's stripes are inline calls, which only an"
                    + " enforced rule at roll-out 100 can be (mode " + out.mode() + ", rollout " + out.rollout() + ")", null);
        }
        return out;
    }

    /** The rule's protection loop; each argument's error names its property. */
    private static PolicyLoop loop(String p, RateLimitProperties.Rule r) {
        PolicyLoop loop = PolicyLoop.NONE;
        try {
            RateLimitProperties.Adapt a = r.getAdapt();
            if (a.getErrors() != null) {
                loop = PolicyLoop.adapt(a.getErrors()).factor(a.getFactor()).min(a.getMin()).recover(a.getRecover()).minCalls(a.getMincalls());
            }
            if (!r.getStages().isEmpty()) {
                if (r.getStages().size() != 2) {
                    throw new RateLimitConfigException(p + ".stages", "takes degrade_pct,break_pct, got " + r.getStages(), null);
                }
                loop = loop.stages(r.getStages().get(0), r.getStages().get(1));
            }
            if (r.getWindow() != null) {
                loop = loop.window(r.getWindow());
            }
        } catch (InvalidArgumentException ex) {
            String property = switch (ex.parameter()) {
                case "degrade_pct", "break_pct" -> ".stages";
                case "WINDOW" -> ".window";
                default -> ".adapt." + ex.parameter().toLowerCase(java.util.Locale.ROOT);
            };
            throw new RateLimitConfigException(p + property, ex.parameter() + " " + ex.reason(), ex);
        }
        return loop;
    }

    /** The policies with a loop (adapt or stages): the ones whose outcomes are reported and whose stage is read. */
    public List<String> loopPolicies() {
        return entries.values().stream().filter(e -> e.loop().any()).map(e -> e.rule().policy()).distinct().toList();
    }

    /** A quota's spec; the period and zone's errors name their properties. */
    private static Spec quota(String p, RateLimitProperties.Rule r) {
        if (r.getParams().size() != 1) {
            throw new RateLimitConfigException(p + ".params", "quota takes 1 parameter [limit], got " + r.getParams().size(), null);
        }
        if (r.getPeriod() == null || r.getPeriod().isBlank()) {
            throw new RateLimitConfigException(p + ".period", "missing: a quota's period is one of day, week, month, year", null);
        }
        io.redisratelimit.client.Period period;
        try {
            period = io.redisratelimit.client.Period.parse(r.getPeriod());
        } catch (InvalidArgumentException ex) {
            throw new RateLimitConfigException(p + ".period", ex.reason(), ex);
        }
        try {
            return Spec.quota(r.getParams().get(0), period, r.getZone());
        } catch (InvalidArgumentException ex) {
            if (ex.parameter().equals("zone")) {
                throw new RateLimitConfigException(p + ".zone", ex.reason(), ex);
            }
            throw ex;
        }
    }

    public String app() {
        return app;
    }

    /** The policies' prefix: {@code <app>:}. */
    public String policyPrefix() {
        return app + ":";
    }

    /**
     * What the server's policies are when this rule set has been pushed: a
     * SHA-256 over each policy's name, spec, mode and roll-out, in name order.
     * Two instances with the same rules have the same digest.
     */
    public String digest() {
        java.util.TreeMap<String, String> byPolicy = new java.util.TreeMap<>();
        for (Entry e : entries.values()) {
            Rule r = e.rule();
            byPolicy.put(r.policy(), r.spec() + " " + r.mode() + " " + r.rollout() + (e.loop().any() ? " " + e.loop() : ""));
        }
        try {
            java.security.MessageDigest sha = java.security.MessageDigest.getInstance("SHA-256");
            for (Map.Entry<String, String> e : byPolicy.entrySet()) {
                sha.update((e.getKey() + "\n" + e.getValue() + "\n").getBytes(java.nio.charset.StandardCharsets.UTF_8));
            }
            return java.util.HexFormat.of().formatHex(sha.digest());
        } catch (java.security.NoSuchAlgorithmException ex) {
            throw new IllegalStateException("SHA-256 is required of every Java platform", ex);
        }
    }

    public Map<String, Entry> entries() {
        return entries;
    }

    public Entry get(String name) {
        Entry e = entries.get(name);
        if (e == null) {
            throw new IllegalArgumentException("no rule '" + name + "' in ratelimit.rules (known: " + entries.keySet() + ")");
        }
        return e;
    }
}

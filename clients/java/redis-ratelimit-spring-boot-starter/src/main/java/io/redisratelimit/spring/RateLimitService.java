package io.redisratelimit.spring;

import io.redisratelimit.client.Decision;
import io.redisratelimit.client.Lease;
import io.redisratelimit.client.Limiter;
import io.redisratelimit.client.PolicyInfo;
import io.redisratelimit.client.RateLimitClient;
import io.redisratelimit.client.RateLimitException;
import io.redisratelimit.client.Rule;
import io.redisratelimit.client.RuleSet;
import io.redisratelimit.client.Spec;

import java.lang.System.Logger.Level;
import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.Optional;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.CompletionStage;
import java.util.concurrent.ConcurrentHashMap;
import java.util.function.Supplier;

/**
 * The starter's one entry point: decides requests under named rules, and
 * keeps the server's policies equal to the properties (pushed at start-up
 * and on every environment refresh; a rule removed from the properties is
 * deleted, and only policies with this application's prefix are touched).
 */
public class RateLimitService {
    private static final System.Logger LOG = System.getLogger(RateLimitService.class.getName());

    /** Told of every decision (Micrometer's counters listen). */
    public interface Listener {
        void onDecision(List<String> rules, Decision decision, long nanos);
    }

    private final Limiter limiter;
    private final Supplier<RateLimitRules> properties;
    private final List<Listener> listeners;
    private volatile RateLimitRules rules;
    private final Map<List<String>, RuleSet> sets = new ConcurrentHashMap<>();

    public RateLimitService(Limiter limiter, Supplier<RateLimitRules> properties, List<Listener> listeners) {
        this.limiter = limiter;
        this.properties = properties;
        this.listeners = List.copyOf(listeners);
        this.rules = properties.get();
        limiter.onServerError(e -> {
            if (e.getMessage() != null && e.getMessage().contains("unknown policy '" + rules.policyPrefix())) {
                repushSoon();
            }
        });
    }

    private final java.util.concurrent.atomic.AtomicLong lastRepush = new java.util.concurrent.atomic.AtomicLong();

    /**
     * The server lost this application's policies (a restart without
     * persistence, a new node): push the running rules again, off the
     * request's thread, at most once a second. Until then the fallback decides.
     */
    private void repushSoon() {
        long now = System.nanoTime();
        long last = lastRepush.get();
        if (last != 0 && now - last < 1_000_000_000L || !lastRepush.compareAndSet(last, now)) {
            return;
        }
        Thread t = new Thread(() -> {
            try {
                synchronized (this) {
                    push(rules);
                }
            } catch (RuntimeException ex) {
                LOG.log(Level.WARNING, "redis-ratelimit: could not push the policies again: " + ex.getMessage());
            }
        }, "redis-ratelimit-repush");
        t.setDaemon(true);
        t.start();
    }

    public Limiter limiter() {
        return limiter;
    }

    public RateLimitClient client() {
        return limiter.client();
    }

    public RateLimitRules rules() {
        return rules;
    }

    /**
     * Reads the rules again (a bad one is a {@link RateLimitConfigException}
     * and changes nothing), pushes each as {@code RL.POLICY SET} to every
     * master, deletes this application's policies no rule names any more, and
     * only then lets requests use the new rules.
     */
    public synchronized void sync() {
        RateLimitRules next = properties.get();
        push(next);
        rules = next;
        sets.clear();
    }

    private void push(RateLimitRules next) {
        RateLimitClient client = limiter.client();
        for (RateLimitRules.Entry e : next.entries().values()) {
            client.policySet(e.rule().policy(), e.rule().spec(), e.rule().mode(), e.rule().rollout());
        }
        List<String> keep = next.entries().values().stream().map(e -> e.rule().policy()).toList();
        for (String name : client.policyList()) {
            if (name.startsWith(next.policyPrefix()) && !keep.contains(name)) {
                client.policyDel(name);
                LOG.log(Level.INFO, "redis-ratelimit: deleted policy " + name + " (no rule names it any more)");
            }
        }
        LOG.log(Level.INFO, "redis-ratelimit: pushed " + keep.size() + " policies " + keep);
    }

    /** The server's view of a rule's policy. */
    public Optional<PolicyInfo> policy(String rule) {
        return limiter.client().policyGet(rules.get(rule).rule().policy());
    }

    /** The checked set of these rules (cached until the next refresh). */
    public RuleSet ruleSet(List<String> names) {
        return sets.computeIfAbsent(List.copyOf(names), n -> {
            List<Rule> list = new ArrayList<>();
            for (String name : n) {
                list.add(rules.get(name).rule());
            }
            return limiter.rules(list);
        });
    }

    /**
     * Decides one request under {@code names} (several: all or nothing, one
     * {@code RL.ALL}); never throws for Redis. Rules that cap concurrency take
     * leases that must be given back: use {@link #admit} for them.
     */
    public Decision check(List<String> names, List<String> identities, long cost) {
        refuseCaps(names);
        long start = System.nanoTime();
        Decision d;
        try {
            d = limiter.checkAsync(ruleSet(names), identities, cost).toCompletableFuture().join();
        } catch (RateLimitException e) {
            throw e;
        }
        long took = System.nanoTime() - start;
        for (Listener l : listeners) {
            l.onDecision(names, d, took);
        }
        return d;
    }

    /** The non-blocking form, for WebFlux: the stage never fails for Redis. */
    public java.util.concurrent.CompletionStage<Decision> checkAsync(List<String> names, List<String> identities, long cost) {
        refuseCaps(names);
        return decide(names, identities, cost);
    }

    private void refuseCaps(List<String> names) {
        for (String n : names) {
            if (rules.get(n).rule().concurrency()) {
                throw new IllegalArgumentException("rule '" + n + "' caps concurrency: its lease must be released, use admit(...) and close the Permit");
            }
        }
    }

    /**
     * Decides one request under {@code names}, rate rules and concurrency
     * caps alike: the rate rules first (one call, all or nothing), then each
     * cap ({@code RL.HIT} on its policy, which grants a lease). The
     * {@link Permit} holds the leases until it is closed; a cap that denies
     * gives back the leases taken before it (the rate rules' units stay
     * spent, as for any request that got that far). Never fails for Redis.
     */
    public CompletionStage<Permit> admitAsync(List<String> names, List<String> identities, long cost) {
        List<Integer> rate = new ArrayList<>();
        List<Integer> caps = new ArrayList<>();
        for (int i = 0; i < names.size(); i++) {
            (rules.get(names.get(i)).rule().concurrency() ? caps : rate).add(i);
        }
        if (caps.isEmpty()) {
            return decide(names, identities, cost).thenApply(d -> new Permit(d, List.of()));
        }
        CompletionStage<Decision> first = rate.isEmpty() ? CompletableFuture.completedFuture(null)
                : decide(pick(names, rate), pick(identities, rate), cost).thenApply(d ->
                        d.deniedBy().isPresent() ? d.withDeniedBy(rate.get(d.deniedBy().getAsInt())) : d);
        RateLimitRules current = rules;
        return first.thenCompose(d -> d != null && !d.allowed()
                ? CompletableFuture.completedFuture(new Permit(d, List.of()))
                : takeLeases(current, names, identities, cost, caps, 0, d, new ArrayList<>()));
    }

    /** The blocking form of {@link #admitAsync}. */
    public Permit admit(List<String> names, List<String> identities, long cost) {
        return admitAsync(names, identities, cost).toCompletableFuture().join();
    }

    public Permit admit(List<String> names, String identity, long cost) {
        return admit(names, java.util.Collections.nCopies(names.size(), identity), cost);
    }

    private CompletionStage<Permit> takeLeases(RateLimitRules current, List<String> names, List<String> identities, long cost,
                                               List<Integer> caps, int next, Decision reported, List<Lease> taken) {
        if (next == caps.size()) {
            return CompletableFuture.completedFuture(new Permit(reported, taken));
        }
        int i = caps.get(next);
        String name = names.get(i);
        Rule rule = current.get(name).rule();
        String key = rule.keyFor(identities.get(i));
        return decide(List.of(name), List.of(identities.get(i)), cost).thenCompose(c -> {
            if (!c.allowed()) {
                for (Lease l : taken) {
                    l.releaseAsync();
                }
                return CompletableFuture.completedFuture(new Permit(c.withDeniedBy(i), List.of()));
            }
            if (c.lease() > 0) {
                taken.add(Lease.of(limiter.client(), key, c, Duration.ofMillis(rule.spec().params().get(1))));
            }
            return takeLeases(current, names, identities, cost, caps, next + 1, reported == null ? c : reported, taken);
        });
    }

    private static <T> List<T> pick(List<T> all, List<Integer> positions) {
        List<T> out = new ArrayList<>(positions.size());
        for (int p : positions) {
            out.add(all.get(p));
        }
        return out;
    }

    private CompletionStage<Decision> decide(List<String> names, List<String> identities, long cost) {
        long start = System.nanoTime();
        return limiter.checkAsync(ruleSet(names), identities, cost).thenApply(d -> {
            long took = System.nanoTime() - start;
            for (Listener l : listeners) {
                l.onDecision(names, d, took);
            }
            return d;
        });
    }

    public Decision check(List<String> names, String identity, long cost) {
        return check(names, java.util.Collections.nCopies(names.size(), identity), cost);
    }

    /** The rule whose fields a reply describes: the one that denied, or the first whose limit is the reply's. */
    public String reported(List<String> names, Decision d) {
        if (d.deniedBy().isPresent() && d.deniedBy().getAsInt() < names.size()) {
            return names.get(d.deniedBy().getAsInt());
        }
        for (String n : names) {
            Spec s = rules.get(n).rule().spec();
            if (s != null && s.limit() == d.limit()) {
                return n;
            }
        }
        return names.get(0);
    }
}

package io.redisratelimit.spring;

import io.redisratelimit.client.Client;
import io.redisratelimit.client.Decision;
import io.redisratelimit.client.Lease;
import io.redisratelimit.client.Limiter;
import io.redisratelimit.client.Origin;
import io.redisratelimit.client.PolicyInfo;
import io.redisratelimit.client.Protection;
import io.redisratelimit.client.RateLimitException;
import io.redisratelimit.client.Rule;
import io.redisratelimit.client.RuleSet;
import io.redisratelimit.client.Spec;
import io.redisratelimit.client.driver.Command;

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
 *
 * <p>Every push first writes the rule set's {@linkplain RateLimitRules#digest
 * digest} to {@code rl:policies:<app>}: the server's record of which rule set
 * its policies come from. An instance that finds one of its policies missing
 * (a server restarted without persistence) re-creates only the missing
 * policies, and only when that record is its own rule set's: when another
 * instance has pushed a different set since (a refresh this instance has not
 * seen yet), it restores nothing, so that it never undoes a newer change;
 * it says so in the log and in {@link #outOfDate()} until its own refresh.
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
    private final java.util.concurrent.atomic.AtomicLong repairs = new java.util.concurrent.atomic.AtomicLong();
    private volatile boolean outOfDate;
    private volatile boolean enabled = true;
    private volatile MissingKey missingKey = MissingKey.DENY;
    private final java.util.concurrent.atomic.AtomicLong missingKeys = new java.util.concurrent.atomic.AtomicLong();

    /** What a request whose key expression gives nothing gets: {@code ratelimit.missing-key}. */
    public enum MissingKey {
        /** Not decided: 400 from the route rules, {@link RateLimitKeyMissingException} from {@code @RateLimited}. */
        DENY,
        /** Let through undecided, and counted ({@link #missingKeys()}). */
        ADMIT;

        public static MissingKey parse(String s) {
            if (s != null) {
                for (MissingKey m : values()) {
                    if (m.name().equalsIgnoreCase(s.trim())) {
                        return m;
                    }
                }
            }
            throw new RateLimitConfigException("ratelimit.missing-key", "must be deny or admit, got '" + s + "'", null);
        }
    }

    public MissingKey missingKey() {
        return missingKey;
    }

    public void missingKey(MissingKey m) {
        missingKey = m;
    }

    /**
     * A request whose key expression gave nothing: counted, and the
     * configured outcome returned. Never decided under a shared key.
     */
    public MissingKey keyMissing(List<String> rules, String expression) {
        missingKeys.incrementAndGet();
        LOG.log(Level.DEBUG, "redis-ratelimit: the key " + expression + " of " + rules + " gave nothing: " + missingKey);
        return missingKey;
    }

    /** Requests whose key expression gave nothing, since start-up. */
    public long missingKeys() {
        return missingKeys.get();
    }
    private volatile List<String> notApplied = List.of();

    /**
     * Whether the starter limits at all: {@code ratelimit.enabled}, which
     * follows a refresh. Off, the interceptor, the filter and
     * {@code @RateLimited} let every request through without a decision.
     */
    public boolean enabled() {
        return enabled;
    }

    public void enabled(boolean on) {
        if (on != enabled) {
            enabled = on;
            LOG.log(Level.WARNING, "redis-ratelimit: ratelimit.enabled is now " + on + (on ? "" : ": no request is limited"));
        }
    }

    /**
     * The settings read at start-up only whose refreshed value differs from the
     * running one, each as {@code name: running -> refreshed}: not applied
     * until a restart (logged as an error at each refresh, and shown by the
     * health indicator).
     */
    public List<String> settingsNotApplied() {
        return notApplied;
    }

    /** Compares the refreshed start-up-only settings with the running ones; differences are refused loudly. */
    public void settingsRefreshed(Map<String, String> running, Map<String, String> refreshed) {
        List<String> differ = new ArrayList<>();
        for (Map.Entry<String, String> e : running.entrySet()) {
            String now = refreshed.get(e.getKey());
            if (!java.util.Objects.equals(e.getValue(), now)) {
                differ.add(e.getKey() + ": " + e.getValue() + " -> " + now);
            }
        }
        notApplied = List.copyOf(differ);
        if (!differ.isEmpty()) {
            LOG.log(Level.ERROR, "redis-ratelimit: refused the refresh of " + differ + ": these settings are read at start-up"
                    + " only and keep their running values until the application restarts (the rules and ratelimit.enabled"
                    + " follow a refresh)");
        }
    }

    /**
     * A policy of this application is missing on the server: repair it off the
     * request's thread, at most once a second ({@link #repair}). Until then
     * the fallback decides.
     */
    private void repushSoon() {
        long now = System.nanoTime();
        long last = lastRepush.get();
        if (last != 0 && now - last < 1_000_000_000L || !lastRepush.compareAndSet(last, now)) {
            return;
        }
        Thread t = new Thread(() -> {
            try {
                repair();
            } catch (RuntimeException ex) {
                LOG.log(Level.WARNING, "redis-ratelimit: could not push the policies again: " + ex.getMessage());
            } finally {
                repairs.incrementAndGet();
            }
        }, "redis-ratelimit-repush");
        t.setDaemon(true);
        t.start();
    }

    /**
     * Re-creates this application's missing policies, if the server's record
     * says its policies come from this instance's rule set; pushes the whole
     * set when the record is gone too (the server lost everything); restores
     * nothing when another instance pushed a different set since.
     */
    synchronized void repair() {
        RateLimitRules mine = rules;
        String digest = mine.digest();
        String current = readRecord(mine.app());
        if (current == null) {
            writeRecord(mine.app(), digest);
            push(mine);
            LOG.log(Level.INFO, "redis-ratelimit: the server had lost this application's policies; pushed them again");
            return;
        }
        if (!current.equals(digest)) {
            outOfDate = true;
            LOG.log(Level.WARNING, "redis-ratelimit: a policy of '" + mine.app() + "' is missing and the server's policies come from"
                    + " another rule set (pushed by a refreshed instance): not restoring it, so as not to undo a newer change."
                    + " This instance's ratelimit.* rules are out of date until its next refresh; meanwhile the fallback decides"
                    + " the rules the server no longer has");
            return;
        }
        List<String> present = limiter.client().policyList();
        List<String> restored = new ArrayList<>();
        for (RateLimitRules.Entry e : mine.entries().values()) {
            Rule r = e.rule();
            if (!present.contains(r.policy())) {
                limiter.client().policySet(r.policy(), r.spec(), r.mode(), r.rollout(), e.loop());
                restored.add(r.policy());
            }
        }
        LOG.log(Level.INFO, "redis-ratelimit: re-created the missing policies " + restored);
    }

    /** The number of policy repairs finished (a policy found missing), whatever they did. */
    public long policyRepairs() {
        return repairs.get();
    }

    /**
     * Whether another instance pushed a rule set other than this instance's
     * since its last push: its rules are out of date until its next refresh.
     */
    public boolean outOfDate() {
        return outOfDate;
    }

    /** The key holding the digest of the rule set the server's policies of {@code app} come from. */
    public static String recordKey(String app) {
        return "rl:policies:" + app;
    }

    private String readRecord(String app) {
        Object v = call(new Command("GET", List.of(recordKey(app)), 0, false));
        return v == null ? null : v.toString();
    }

    private void writeRecord(String app, String digest) {
        call(new Command("SET", List.of(recordKey(app), digest), 0, false));
    }

    private Object call(Command c) {
        try {
            return limiter.client().driver().send(c).get(Math.max(1000, limiter.client().deadline().toMillis()), java.util.concurrent.TimeUnit.MILLISECONDS);
        } catch (java.util.concurrent.ExecutionException e) {
            throw e.getCause() instanceof RuntimeException r ? r : new RateLimitException(c.name() + ": " + e.getCause(), e.getCause());
        } catch (java.util.concurrent.TimeoutException e) {
            throw new io.redisratelimit.client.RateLimitTimeoutException(c.name(), Duration.ofMillis(Math.max(1000, limiter.client().deadline().toMillis())));
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
            throw new RateLimitException(c.name() + ": interrupted", e);
        }
    }

    public Limiter limiter() {
        return limiter;
    }

    public Client client() {
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
        // The record first: an instance that finds a policy missing from here on knows its rules are not the newest.
        writeRecord(next.app(), next.digest());
        push(next);
        rules = next;
        outOfDate = false;
        sets.clear();
        Protection p = protection;
        if (p != null) {
            p.watch(next.loopPolicies());
        }
    }

    // ---- the protection loop ------------------------------------------------

    private volatile Protection protection;
    private volatile ErrorPredicate errors = ErrorPredicate.DEFAULT;

    /** The loop this service reports outcomes to and reads stages from (the auto-configuration sets it). */
    public void protection(Protection p, ErrorPredicate predicate) {
        this.protection = p;
        this.errors = predicate == null ? ErrorPredicate.DEFAULT : predicate;
        if (p != null) {
            p.watch(rules.loopPolicies());
        }
    }

    /** The protection loop, or null when there is none. */
    public Protection protection() {
        return protection;
    }

    /** The highest stage of these rules' policies (0 without a loop, or while no stage was read for the stage hold). */
    public int stage(List<String> names) {
        Protection p = protection;
        if (p == null) {
            return Protection.NORMAL;
        }
        int s = Protection.NORMAL;
        for (String n : names) {
            s = Math.max(s, p.stage(rules.get(n).rule().policy()));
        }
        return s;
    }

    /**
     * The first of these rules that degrades now: non-core (its property
     * {@code core=false}, or {@code nonCore} for every rule of an annotated
     * method) with its policy at stage 1 or more; null when none does.
     */
    public String degrading(List<String> names, boolean nonCore) {
        Protection p = protection;
        if (p == null) {
            return null;
        }
        for (String n : names) {
            RateLimitRules.Entry e = rules.get(n);
            if ((nonCore || !e.core()) && p.stage(e.rule().policy()) >= Protection.DEGRADE) {
                return n;
            }
        }
        return null;
    }

    /**
     * The answer of a degraded rule, decided without Redis: a denial of its
     * limit, to retry after the stage poll (when the stage may have fallen).
     */
    public Decision degraded(String name) {
        RateLimitRules.Entry e = rules.get(name);
        long limit = e.rule().spec() == null ? 0 : e.rule().spec().limit();
        long wait = protection == null ? 1000 : protection.stagePoll().toMillis();
        return new Decision(false, limit, 0, wait, wait, java.util.OptionalInt.empty(), io.redisratelimit.client.Path.FALLBACK);
    }

    /** Whether a finished request failed, by the application's {@link ErrorPredicate} ({@code status} -1: no HTTP status). */
    public boolean isError(int status, Throwable failure) {
        return errors.isError(status, ErrorPredicate.cause(failure));
    }

    /** Counts the outcome of a request these rules admitted, for their policies with a loop (no I/O here). */
    public void recordOutcome(List<String> names, boolean error) {
        Protection p = protection;
        if (p == null) {
            return;
        }
        RateLimitRules current = rules;
        for (String n : names) {
            RateLimitRules.Entry e = current.entries().get(n);
            if (e != null) {
                p.record(e.rule().policy(), error);
            }
        }
    }

    private void push(RateLimitRules next) {
        Client client = limiter.client();
        for (RateLimitRules.Entry e : next.entries().values()) {
            client.policySet(e.rule().policy(), e.rule().spec(), e.rule().mode(), e.rule().rollout(), e.loop());
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
        return decide(names, identities, cost, Origin.UNKNOWN);
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
        return admitAsync(names, identities, cost, Origin.UNKNOWN);
    }

    /** With where the request came from: its deny events carry the client's IP and user agent. */
    public CompletionStage<Permit> admitAsync(List<String> names, List<String> identities, long cost, Origin origin) {
        List<Integer> rate = new ArrayList<>();
        List<Integer> caps = new ArrayList<>();
        for (int i = 0; i < names.size(); i++) {
            (rules.get(names.get(i)).rule().concurrency() ? caps : rate).add(i);
        }
        if (caps.isEmpty()) {
            return decide(names, identities, cost, origin).thenApply(d -> new Permit(d, List.of()));
        }
        CompletionStage<Decision> first = rate.isEmpty() ? CompletableFuture.completedFuture(null)
                : decide(pick(names, rate), pick(identities, rate), cost, origin).thenApply(d ->
                        d.deniedBy().isPresent() ? d.withDeniedBy(rate.get(d.deniedBy().getAsInt())) : d);
        RateLimitRules current = rules;
        return first.thenCompose(d -> d != null && !d.allowed()
                ? CompletableFuture.completedFuture(new Permit(d, List.of()))
                : takeLeases(current, names, identities, cost, caps, 0, d, new ArrayList<>(), origin));
    }

    /** The blocking form of {@link #admitAsync}. */
    public Permit admit(List<String> names, List<String> identities, long cost) {
        return admitAsync(names, identities, cost).toCompletableFuture().join();
    }

    /** The blocking form of {@link #admitAsync(List, List, long, Origin)}. */
    public Permit admit(List<String> names, List<String> identities, long cost, Origin origin) {
        return admitAsync(names, identities, cost, origin).toCompletableFuture().join();
    }

    public Permit admit(List<String> names, String identity, long cost) {
        return admit(names, java.util.Collections.nCopies(names.size(), identity), cost);
    }

    private CompletionStage<Permit> takeLeases(RateLimitRules current, List<String> names, List<String> identities, long cost,
                                               List<Integer> caps, int next, Decision reported, List<Lease> taken, Origin origin) {
        if (next == caps.size()) {
            return CompletableFuture.completedFuture(new Permit(reported, taken));
        }
        int i = caps.get(next);
        String name = names.get(i);
        Rule rule = current.get(name).rule();
        String key = rule.keyFor(identities.get(i));
        return decide(List.of(name), List.of(identities.get(i)), cost, origin).thenCompose(c -> {
            if (!c.allowed()) {
                for (Lease l : taken) {
                    l.releaseAsync();
                }
                return CompletableFuture.completedFuture(new Permit(c.withDeniedBy(i), List.of()));
            }
            if (c.lease() > 0) {
                taken.add(Lease.of(limiter.client(), key, c, Duration.ofMillis(rule.spec().params().get(1))));
            }
            return takeLeases(current, names, identities, cost, caps, next + 1, reported == null ? c : reported, taken, origin);
        });
    }

    private static <T> List<T> pick(List<T> all, List<Integer> positions) {
        List<T> out = new ArrayList<>(positions.size());
        for (int p : positions) {
            out.add(all.get(p));
        }
        return out;
    }

    private CompletionStage<Decision> decide(List<String> names, List<String> identities, long cost, Origin origin) {
        long start = System.nanoTime();
        return limiter.checkAsync(ruleSet(names), identities, cost, origin).thenApply(d -> {
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

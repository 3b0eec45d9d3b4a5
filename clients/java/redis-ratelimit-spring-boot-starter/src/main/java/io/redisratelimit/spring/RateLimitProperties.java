package io.redisratelimit.spring;

import org.springframework.boot.context.properties.ConfigurationProperties;

import java.time.Duration;
import java.util.ArrayList;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;

/**
 * {@code ratelimit.*}: the connection comes from {@code spring.data.redis.*};
 * the rules are declared here by name and pushed to the server as policies
 * named {@code <app>:<rule>}.
 *
 * <pre>
 * ratelimit.rules.order-create.algorithm=tokenbucket
 * ratelimit.rules.order-create.params=5,5,1000
 * ratelimit.rules.order-create.key-prefix={order}:user:
 * ratelimit.rules.order-total.algorithm=fixedwindow
 * ratelimit.rules.order-total.params=15000,1000
 * ratelimit.rules.order-total.fixed-key={order}:total
 * ratelimit.rules.order-total.global=true
 * ratelimit.rules.exports.algorithm=quota
 * ratelimit.rules.exports.params=1000
 * ratelimit.rules.exports.period=day
 * </pre>
 */
@ConfigurationProperties(prefix = "ratelimit")
public class RateLimitProperties {
    /** Whether the starter configures anything. */
    private boolean enabled = true;
    /** The policies' prefix: this application's rules are {@code <app>:<rule>} on the server. Default: spring.application.name. */
    private String app;
    /** The driver: lettuce (default) or jedis. */
    private String driver = "lettuce";
    /** Deadline of one call to Redis; past it the fallback decides (100 ms, which a healthy Redis meets on a loaded host). */
    private Duration deadline = Duration.ofMillis(100);
    /** Instances sharing each global rule: each takes ceil(total / instances * 1.1) in process. */
    private long instances = 1;
    /** The in-process level in front of Redis, for rules marked global. */
    private boolean localLevel = true;
    /** What decides when Redis cannot: local-only, fail-open or fail-closed. */
    private String fallback = "local-only";
    /**
     * When a key expression gives nothing (null or empty: a missing header, a
     * null argument): deny (400, the request is not decided) or admit (let it
     * through undecided, counted). Never a key shared by every such caller.
     */
    private String missingKey = "deny";
    /** Send the IETF RateLimit and RateLimit-Policy fields on admitted responses too. */
    private boolean headers = true;
    private final DenyCache denyCache = new DenyCache();
    private final Breaker breaker = new Breaker();
    private final Protection protection = new Protection();
    private final DenyEvents denyEvents = new DenyEvents();
    /**
     * The rules, by name: ratelimit.rules.<name>.algorithm, params, period, zone, mode, rollout, key-prefix, fixed-key,
     * global, routes, methods, key, cost, adapt.*, stages, window, core, breaker; and for a global rule (token bucket,
     * window or quota) batched (units taken in batches with UPTO and spent in process, never over the limit), hold-ms
     * (default 50: unspent units go back after it), max-share-pct (default 10: the largest batch in percent of the
     * limit) and striped (2 to 64 keys on different masters, each with limit / striped; 1: not striped).
     */
    private Map<String, Rule> rules = new LinkedHashMap<>();

    public static class DenyCache {
        /** Deny a key locally after a denial, for min(wait, max), without a round trip. */
        private boolean enabled = true;
        /** The longest a denial is cached, so a raised limit or the kill switch reaches users within it. */
        private Duration max = Duration.ofSeconds(1);
        /** The most denials cached at once. */
        private long capacity = 10_000;

        public boolean isEnabled() {
            return enabled;
        }

        public void setEnabled(boolean enabled) {
            this.enabled = enabled;
        }

        public Duration getMax() {
            return max;
        }

        public void setMax(Duration max) {
            this.max = max;
        }

        public long getCapacity() {
            return capacity;
        }

        public void setCapacity(long capacity) {
            this.capacity = capacity;
        }
    }

    /**
     * Deny events ({@code ratelimit.deny-events.*}): every denial shipped as a
     * JSON line, in batches, off the request path, to {@code sink}: {@code none}
     * (the default; or a {@code DenyEventSink} bean of the application, a
     * callback), {@code file} ({@code file}) or {@code bulk} (Elasticsearch's
     * {@code _bulk} at {@code url}, index {@code index}).
     */
    public static class DenyEvents {
        /** none, file or bulk; a DenyEventSink bean of the application takes precedence over none. */
        private String sink = "none";
        /** The file sink's path (JSON lines appended). */
        private String file;
        /** The bulk sink's base URL, as http://elasticsearch:9200 (the sink posts to <url>/_bulk). */
        private String url;
        /** The bulk sink's index. */
        private String index = io.redisratelimit.client.DenyEvents.DEFAULT_INDEX;
        /** Events the ring buffer holds; past it the oldest are dropped and counted. */
        private int capacity = io.redisratelimit.client.DenyEvents.DEFAULT_CAPACITY;
        /** The most events in one batch, and the count that flushes at once. */
        private int flushEvents = io.redisratelimit.client.DenyEvents.DEFAULT_FLUSH_EVENTS;
        /** The longest an event waits for its flush. */
        private Duration flushInterval = io.redisratelimit.client.DenyEvents.DEFAULT_FLUSH_INTERVAL;
        /** The longest one batch may take in the sink; past it the batch is dropped and counted. */
        private Duration timeout = io.redisratelimit.client.DenyEvents.DEFAULT_TIMEOUT;

        public String getSink() {
            return sink;
        }

        public void setSink(String sink) {
            this.sink = sink;
        }

        public String getFile() {
            return file;
        }

        public void setFile(String file) {
            this.file = file;
        }

        public String getUrl() {
            return url;
        }

        public void setUrl(String url) {
            this.url = url;
        }

        public String getIndex() {
            return index;
        }

        public void setIndex(String index) {
            this.index = index;
        }

        public int getCapacity() {
            return capacity;
        }

        public void setCapacity(int capacity) {
            this.capacity = capacity;
        }

        public int getFlushEvents() {
            return flushEvents;
        }

        public void setFlushEvents(int flushEvents) {
            this.flushEvents = flushEvents;
        }

        public Duration getFlushInterval() {
            return flushInterval;
        }

        public void setFlushInterval(Duration flushInterval) {
            this.flushInterval = flushInterval;
        }

        public Duration getTimeout() {
            return timeout;
        }

        public void setTimeout(Duration timeout) {
            this.timeout = timeout;
        }
    }

    public static class Breaker {
        /** Consecutive failures (timeouts, lost connections) that open the circuit breaker. */
        private int failures = 5;
        /** How long it stays open before one PING probes Redis. */
        private Duration openFor = Duration.ofSeconds(1);

        public int getFailures() {
            return failures;
        }

        public void setFailures(int failures) {
            this.failures = failures;
        }

        public Duration getOpenFor() {
            return openFor;
        }

        public void setOpenFor(Duration openFor) {
            this.openFor = openFor;
        }
    }

    /** The protection loop's timings (the defaults are every kit's: report 1 s, poll 1 s, hold 5 s). */
    public static class Protection {
        /** How often the outcome counts are sent with RL.OUTCOME (to every master). */
        private Duration reportInterval = Duration.ofMillis(1000);
        /** How often each policy's stage and scale are read with RL.POLICY STATS (on every master; the highest stage wins). */
        private Duration stagePoll = Duration.ofMillis(1000);
        /** With no successful read for this long, the stage falls back to 0 (the limiter's own fallback decides). */
        private Duration stageHold = Duration.ofMillis(5000);

        public Duration getReportInterval() {
            return reportInterval;
        }

        public void setReportInterval(Duration reportInterval) {
            this.reportInterval = reportInterval;
        }

        public Duration getStagePoll() {
            return stagePoll;
        }

        public void setStagePoll(Duration stagePoll) {
            this.stagePoll = stagePoll;
        }

        public Duration getStageHold() {
            return stageHold;
        }

        public void setStageHold(Duration stageHold) {
            this.stageHold = stageHold;
        }
    }

    /** A rule's {@code ADAPT ERRORS pct [FACTOR f] [MIN m] [RECOVER r] [MINCALLS n]}. */
    public static class Adapt {
        /** Percent of errors among a window's outcomes above which the scale falls (0 to 100); unset: no adapting. */
        private Integer errors;
        /** The scale is multiplied by factor % on such a window (1 to 100). */
        private int factor = 80;
        /** The lowest scale, in percent (1 to 100). */
        private int min = 50;
        /** Points the scale climbs back per window with at most errors / 2 % errors (0 to 100). */
        private int recover = 5;
        /** A window with fewer outcomes changes nothing. */
        private long mincalls = 100;

        public Integer getErrors() {
            return errors;
        }

        public void setErrors(Integer errors) {
            this.errors = errors;
        }

        public int getFactor() {
            return factor;
        }

        public void setFactor(int factor) {
            this.factor = factor;
        }

        public int getMin() {
            return min;
        }

        public void setMin(int min) {
            this.min = min;
        }

        public int getRecover() {
            return recover;
        }

        public void setRecover(int recover) {
            this.recover = recover;
        }

        public long getMincalls() {
            return mincalls;
        }

        public void setMincalls(long mincalls) {
            this.mincalls = mincalls;
        }
    }

    public static class Rule {
        /** The policy's error-driven scale (RL.POLICY SET ... ADAPT ERRORS pct ...). */
        private final Adapt adapt = new Adapt();
        /** degrade_pct,break_pct: the policy's stage from each window's deny ratio (RL.POLICY SET ... STAGES). */
        private List<Integer> stages = new ArrayList<>();
        /** The policy's loop window (default 10 s on the server). */
        private Duration window;
        /** false: a non-core route (or @RateLimited(core = false) method) degrades while the rule's stage is 1 or more. */
        private boolean core = true;
        /** A Resilience4j CircuitBreaker (by name, from the application's CircuitBreakerRegistry) forced open while the rule's stage is 2. */
        private String breaker;

        public Adapt getAdapt() {
            return adapt;
        }

        public List<Integer> getStages() {
            return stages;
        }

        public void setStages(List<Integer> stages) {
            this.stages = stages;
        }

        public Duration getWindow() {
            return window;
        }

        public void setWindow(Duration window) {
            this.window = window;
        }

        public boolean isCore() {
            return core;
        }

        public void setCore(boolean core) {
            this.core = core;
        }

        public String getBreaker() {
            return breaker;
        }

        public void setBreaker(String breaker) {
            this.breaker = breaker;
        }

        /** tokenbucket, leakybucket, sliding, hashwindow, fixedwindow, concurrency (at most limit requests at once), or quota (limit units per calendar period). */
        private String algorithm;
        /** The algorithm's parameters in the command's order (tokenbucket: capacity, refill_count, refill_ms; concurrency: limit, lease_ms; quota: limit). */
        private List<Long> params = new ArrayList<>();
        /** A quota's calendar period: day, week (ISO, from Monday), month or year. */
        private String period;
        /** A quota's zone: UTC (default), a fixed offset (+05:30) or an IANA name (America/New_York). The rule's policy counts in it (RL.POLICY SET ... TZ zone). */
        private String zone;
        /** enforce, shadow (never denies: the dry run) or off (the kill switch). */
        private String mode = "enforce";
        /** Percent of keys enforced (by a stable hash of the key); the rest run in shadow. */
        private int rollout = 100;
        /** The key is key-prefix + the identity (default rl:<rule>:). */
        private String keyPrefix;
        /** One key for every identity: a total. */
        private String fixedKey;
        /** A limit shared by every instance: the local level takes this instance's share first. */
        private boolean global;
        /** Path patterns the servlet interceptor limits (/api/orders/**); none: only @RateLimited uses the rule. */
        private List<String> routes = new ArrayList<>();
        /** For routes: the HTTP methods limited (POST, GET...); none: every method. GET and POST of one path are then counted apart by two rules. */
        private List<String> methods = new ArrayList<>();
        /** For routes: SpEL over #request giving the identity (default the client's address). */
        private String key;
        /** Units each request takes. */
        private long cost = 1;
        /** A global rule (token bucket, window or quota) taken from the server in batches (RL.HIT ... UPTO b) and spent in process: never over the limit, under-admission at most instances x batch for hold-ms. */
        private boolean batched;
        /** A batched rule: how long units are held unspent before they go back (REFUND), 1 to 60000 ms. */
        private long holdMs = 50;
        /** A batched rule: the largest batch, in percent of the limit (1 to 100). */
        private int maxSharePct = 10;
        /** A global rule kept in this many keys (2 to 64; 1: not striped), each on its own master where the cluster has enough, each with limit / striped. An instance uses its own stripe, then one other before it denies. Enforced rules without adapt or stages only. */
        private int striped = 1;

        public boolean isBatched() {
            return batched;
        }

        public void setBatched(boolean batched) {
            this.batched = batched;
        }

        public long getHoldMs() {
            return holdMs;
        }

        public void setHoldMs(long holdMs) {
            this.holdMs = holdMs;
        }

        public int getMaxSharePct() {
            return maxSharePct;
        }

        public void setMaxSharePct(int maxSharePct) {
            this.maxSharePct = maxSharePct;
        }

        public int getStriped() {
            return striped;
        }

        public void setStriped(int striped) {
            this.striped = striped;
        }

        public String getAlgorithm() {
            return algorithm;
        }

        public void setAlgorithm(String algorithm) {
            this.algorithm = algorithm;
        }

        public List<Long> getParams() {
            return params;
        }

        public void setParams(List<Long> params) {
            this.params = params;
        }

        public String getPeriod() {
            return period;
        }

        public void setPeriod(String period) {
            this.period = period;
        }

        public String getZone() {
            return zone;
        }

        public void setZone(String zone) {
            this.zone = zone;
        }

        public String getMode() {
            return mode;
        }

        public void setMode(String mode) {
            this.mode = mode;
        }

        public int getRollout() {
            return rollout;
        }

        public void setRollout(int rollout) {
            this.rollout = rollout;
        }

        public String getKeyPrefix() {
            return keyPrefix;
        }

        public void setKeyPrefix(String keyPrefix) {
            this.keyPrefix = keyPrefix;
        }

        public String getFixedKey() {
            return fixedKey;
        }

        public void setFixedKey(String fixedKey) {
            this.fixedKey = fixedKey;
        }

        public boolean isGlobal() {
            return global;
        }

        public void setGlobal(boolean global) {
            this.global = global;
        }

        public List<String> getRoutes() {
            return routes;
        }

        public void setRoutes(List<String> routes) {
            this.routes = routes;
        }

        public List<String> getMethods() {
            return methods;
        }

        public void setMethods(List<String> methods) {
            this.methods = methods;
        }

        public String getKey() {
            return key;
        }

        public void setKey(String key) {
            this.key = key;
        }

        public long getCost() {
            return cost;
        }

        public void setCost(long cost) {
            this.cost = cost;
        }
    }

    public boolean isEnabled() {
        return enabled;
    }

    public void setEnabled(boolean enabled) {
        this.enabled = enabled;
    }

    public String getApp() {
        return app;
    }

    public void setApp(String app) {
        this.app = app;
    }

    public String getDriver() {
        return driver;
    }

    public void setDriver(String driver) {
        this.driver = driver;
    }

    public Duration getDeadline() {
        return deadline;
    }

    public void setDeadline(Duration deadline) {
        this.deadline = deadline;
    }

    public long getInstances() {
        return instances;
    }

    public void setInstances(long instances) {
        this.instances = instances;
    }

    public boolean isLocalLevel() {
        return localLevel;
    }

    public void setLocalLevel(boolean localLevel) {
        this.localLevel = localLevel;
    }

    public String getFallback() {
        return fallback;
    }

    public void setFallback(String fallback) {
        this.fallback = fallback;
    }

    public String getMissingKey() {
        return missingKey;
    }

    public void setMissingKey(String missingKey) {
        this.missingKey = missingKey;
    }

    public boolean isHeaders() {
        return headers;
    }

    public void setHeaders(boolean headers) {
        this.headers = headers;
    }

    public DenyCache getDenyCache() {
        return denyCache;
    }

    public Breaker getBreaker() {
        return breaker;
    }

    public DenyEvents getDenyEvents() {
        return denyEvents;
    }

    public Protection getProtection() {
        return protection;
    }

    public Map<String, Rule> getRules() {
        return rules;
    }

    public void setRules(Map<String, Rule> rules) {
        this.rules = rules;
    }
}

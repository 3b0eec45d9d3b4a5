package io.redisratelimit.client;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import io.micrometer.prometheusmetrics.PrometheusConfig;
import io.micrometer.prometheusmetrics.PrometheusMeterRegistry;
import io.redisratelimit.client.testing.Contract;
import io.redisratelimit.client.testing.Prometheus;
import io.redisratelimit.client.testing.RedisServer;
import io.redisratelimit.client.testing.Windows;
import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.Assumptions;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.Test;

import java.time.Duration;
import java.time.Instant;
import java.util.ArrayList;
import java.util.Iterator;
import java.util.LinkedHashSet;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.TreeSet;
import java.util.UUID;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertNotNull;
import static org.junit.jupiter.api.Assertions.assertTrue;

/**
 * The contract's {@code observability} section, checked against what the kit
 * really produces: a Prometheus scrape of {@link RateLimitMeters} after real
 * decisions on a real redis-server (names, types, labels, buckets, levels,
 * outcomes; {@code promtool check metrics} on it), the deny events' field
 * order, and {@link DenyEvents}' defaults.
 */
class ObservabilityContractTest {
    private static RedisServer server;
    private static Client client;
    private static Limiter limiter;
    private static PrometheusMeterRegistry registry;

    private static JsonNode obs() {
        return Contract.json().get("observability");
    }

    @BeforeAll
    static void start() {
        server = RedisServer.start();
        client = Client.connect(Drivers.LETTUCE.standalone(server), Duration.ofSeconds(2));
        registry = new PrometheusMeterRegistry(PrometheusConfig.DEFAULT);
        DenyEvents events = DenyEvents.builder(batch -> { }).build();
        limiter = Limiter.builder(client).instances(1).denyEvents(events).metrics(RateLimitMeters.on(registry)).build();
        RateLimitMeters.on(registry).protection("orders:user", () -> 100, () -> 0);
    }

    @AfterAll
    static void stop() {
        limiter.close();
        server.close();
    }

    /** Drives admitted and denied decisions at the redis, local and deny-cache levels; returns the scrape. */
    private static Prometheus drive() {
        String run = UUID.randomUUID().toString();
        RuleSet user = limiter.rules(Rule.of("user", Spec.fixedWindow(2, Windows.FIXED_MS)).keyPrefix("obs:" + run + ":u:"));
        for (int i = 0; i < 4; i++) {
            limiter.check(user, "ann");
        }
        RuleSet total = limiter.rules(Rule.of("total", Spec.fixedWindow(3, Windows.FIXED_MS)).fixedKey("obs:" + run + ":t").asGlobal());
        for (int i = 0; i < 5; i++) {
            limiter.check(total, "anyone");
        }
        return new Prometheus(registry.scrape());
    }

    @Test
    void aRegistryThatRefusesTheMetersNeverFailsADecision() {
        // The application's registry already has ratelimit.decisions with other tags (its own older meter): Prometheus
        // refuses the kit's. Metrics are a side line: the decision is still answered, denial and event included.
        PrometheusMeterRegistry taken = new PrometheusMeterRegistry(PrometheusConfig.DEFAULT);
        io.micrometer.core.instrument.Counter.builder("ratelimit.decisions").tag("route", "/orders").register(taken);
        List<DenyEvent> got = new java.util.concurrent.CopyOnWriteArrayList<>();
        DenyEvents events = DenyEvents.builder(DenyEventSink.callback(got::addAll)).backgroundFlusher(false).build();
        try (Limiter own = Limiter.builder(Client.connect(Drivers.LETTUCE.standalone(server), Duration.ofSeconds(2))).instances(1)
                .denyCache(false).denyEvents(events).metrics(RateLimitMeters.on(taken)).build()) {
            RuleSet rules = own.rules(Rule.of("user", Spec.fixedWindow(1, Windows.FIXED_MS)).keyPrefix("refused:" + UUID.randomUUID() + ":"));
            assertTrue(own.check(rules, "ann").allowed());
            assertTrue(!own.check(rules, "ann").allowed());
            assertTrue(!own.checkAsync(rules, "ann", 1).toCompletableFuture().join().allowed());
            events.flush();
            assertEquals(2, got.size(), "the denials' events are recorded all the same");
        }
    }

    @Test
    void twoLimitersOnOneRegistryAreBothCounted() {
        // Two limiters (two Redis deployments, or two configurations) in one application, one registry:
        // the registry's series are the sum of both, not the first limiter's alone.
        PrometheusMeterRegistry shared = new PrometheusMeterRegistry(PrometheusConfig.DEFAULT);
        DenyEvents firstEvents = DenyEvents.builder(batch -> { }).capacity(1).backgroundFlusher(false).build();
        DenyEvents secondEvents = DenyEvents.builder(batch -> { }).capacity(1).backgroundFlusher(false).build();
        try (Limiter first = Limiter.builder(Client.connect(Drivers.LETTUCE.standalone(server), Duration.ofSeconds(2))).instances(1).denyCache(false).denyEvents(firstEvents)
                .metrics(RateLimitMeters.on(shared)).build();
             Limiter second = Limiter.builder(Client.connect(Drivers.LETTUCE.standalone(server), Duration.ofSeconds(2))).instances(1).denyCache(false).denyEvents(secondEvents)
                     .metrics(RateLimitMeters.on(shared)).build()) {
            String run = UUID.randomUUID().toString();
            RuleSet wide = first.rules(Rule.of("user", Spec.fixedWindow(4, Windows.FIXED_MS)).keyPrefix("two:" + run + ":w:"));
            RuleSet x = first.rules(Rule.of("x", Spec.fixedWindow(1, Windows.FIXED_MS)).keyPrefix("two:" + run + ":x:"));
            RuleSet narrow = second.rules(Rule.of("user", Spec.fixedWindow(1, Windows.FIXED_MS)).keyPrefix("two:" + run + ":n:"));
            first.check(wide, "ann");
            for (int i = 0; i < 3; i++) {
                first.check(x, "ann");
            }
            for (int i = 0; i < 5; i++) {
                second.check(narrow, "ann");
            }
            Prometheus scrape = new Prometheus(shared.scrape());
            assertEquals(9.0, scrape.sum("ratelimit_redis_calls_total"), scrape.text());
            assertEquals(1 + 3, firstEvents.dropped() + secondEvents.dropped(), "each buffer of 1 keeps its newest");
            assertEquals(4.0, scrape.sum("ratelimit_deny_events_dropped_total"), scrape.text());
            assertEquals(3.0, scrape.sum("ratelimit_decisions_total", "outcome", "admitted"), scrape.text());
            assertEquals(6.0, scrape.sum("ratelimit_decisions_total", "outcome", "denied"), scrape.text());
            List<Prometheus.Sample> ratio = scrape.samples("ratelimit_remaining_ratio").stream()
                    .filter(r -> "user".equals(r.labels().get("rule"))).toList();
            assertEquals(1, ratio.size(), scrape.text());
            assertEquals(0.0, ratio.get(0).value(), "the rule's last decision (the second limiter's, at its limit)\n" + scrape.text());
            assertEquals(1, scrape.samples("ratelimit_breaker_open").size(), scrape.text());
        }
    }

    @Test
    void theScrapeHasEveryMetricOfTheContractWithItsTypeAndLabels() {
        Prometheus scrape = drive();
        for (JsonNode m : obs().get("metrics")) {
            String name = m.get("name").asText();
            String type = m.get("type").asText();
            String family = type.equals("counter") && name.endsWith("_total") ? name.substring(0, name.length() - 6) : name;
            String declared = scrape.types().containsKey(name) ? scrape.types().get(name) : scrape.types().get(family);
            assertEquals(type, declared, name + ": its # TYPE in\n" + scrape.text());
            String series = type.equals("histogram") ? name + "_count" : name;
            List<Prometheus.Sample> samples = scrape.samples(series);
            assertTrue(!samples.isEmpty(), name + ": no sample " + series);
            Set<String> labels = new TreeSet<>();
            m.get("labels").forEach(l -> labels.add(l.asText()));
            for (Prometheus.Sample s : samples) {
                assertEquals(labels, s.labels().keySet(), name + "'s labels");
            }
        }
    }

    @Test
    void theHistogramHasTheContractsBucketsAndNoLabels() {
        Prometheus scrape = drive();
        List<Double> want = new ArrayList<>();
        obs().get("redis_seconds_buckets").forEach(b -> want.add(b.asDouble()));
        assertEquals(want, RateLimitMeters.REDIS_SECONDS_BUCKETS);
        List<Double> le = new ArrayList<>();
        for (Prometheus.Sample s : scrape.samples("ratelimit_redis_seconds_bucket")) {
            assertEquals(Set.of("le"), s.labels().keySet());
            le.add(Double.parseDouble(s.labels().get("le").replace("+Inf", "Infinity")));
        }
        List<Double> withInf = new ArrayList<>(want);
        withInf.add(Double.POSITIVE_INFINITY);
        assertEquals(withInf, le, "the buckets, then +Inf");
        double count = scrape.sum("ratelimit_redis_seconds_count");
        assertEquals(count, scrape.sum("ratelimit_redis_seconds_bucket", "le", "+Inf"));
        assertEquals(limiter.stats().redisCalls(), (long) count, "every limiter round trip, and only those");
        assertTrue(scrape.sum("ratelimit_redis_seconds_sum") > 0);
        // Micrometer's own extra family: a gauge, outside the contract, which changes none of its series.
        assertEquals("gauge", scrape.types().get("ratelimit_redis_seconds_max"));
    }

    @Test
    void levelsAndOutcomesAreTheContractsAndEachDecisionIsCountedWhereItWasTaken() {
        Set<String> levels = new LinkedHashSet<>();
        obs().get("levels").forEach(l -> levels.add(l.get("level").asText()));
        for (Path p : Path.values()) {
            assertTrue(levels.contains(p.level()), p + " -> " + p.level() + " is one of " + levels);
        }
        Set<String> outcomes = new LinkedHashSet<>();
        obs().get("outcomes").forEach(o -> outcomes.add(o.asText()));
        assertEquals(Set.of("admitted", "denied", "shadow_denied"), outcomes);

        double before = new Prometheus(registry.scrape()).sum("ratelimit_decisions_total", "rule", "user", "level", "redis", "outcome", "denied");
        double cacheBefore = new Prometheus(registry.scrape()).sum("ratelimit_decisions_total", "rule", "user", "level", "deny_cache");
        Prometheus s = drive();
        for (Prometheus.Sample x : s.samples("ratelimit_decisions_total")) {
            assertTrue(levels.contains(x.labels().get("level")), x.toString());
            assertTrue(outcomes.contains(x.labels().get("outcome")), x.toString());
        }
        // user: 2 admitted by Redis, the 3rd denied by Redis, the 4th by the deny cache.
        assertEquals(before + 1, s.sum("ratelimit_decisions_total", "rule", "user", "level", "redis", "outcome", "denied"));
        assertEquals(cacheBefore + 1, s.sum("ratelimit_decisions_total", "rule", "user", "level", "deny_cache", "outcome", "denied"));
        // total, a global rule with one instance: its local level takes 3 then denies 2 without a round trip.
        assertTrue(s.sum("ratelimit_decisions_total", "rule", "total", "level", "local", "outcome", "denied") >= 2);
        assertEquals(0, s.sum("ratelimit_remaining_ratio", "rule", "user"), "the last decision was at the limit");
        assertEquals(1, s.sum("ratelimit_breaker_open", "breaker", "redis") + 1, "closed");
    }

    @Test
    void theProtectionLoopsScaleAndStageAreGaugesOfItsPolicies() {
        try (Protection p = Protection.builder(client).policies(List.of("obs-loop")).manual().build()) {
            RateLimitMeters.on(registry).bind(p);
            Prometheus s = new Prometheus(registry.scrape());
            assertEquals(100, s.sum("ratelimit_scale", "rule", "obs-loop"), "100 until a scale is read");
            assertEquals(0, s.sum("ratelimit_stage", "rule", "obs-loop"));
            assertEquals(1, s.samples("ratelimit_stage").stream().filter(x -> "obs-loop".equals(x.labels().get("rule"))).count());
        }
    }

    @Test
    void promtoolChecksTheScrape() throws Exception {
        Prometheus scrape = drive();
        Assumptions.assumeTrue(Prometheus.promtool() != null, "promtool is not installed (apt-get install prometheus): skipped");
        Map.Entry<Integer, String> r = Prometheus.check(scrape.text());
        assertEquals(0, r.getKey(), "promtool check metrics:\n" + r.getValue() + "\non\n" + scrape.text());
    }

    @Test
    void denyEventsHaveTheContractsFieldsInItsOrder() throws Exception {
        JsonNode ev = obs().get("deny_events");
        List<String> fields = new ArrayList<>();
        ev.get("fields").forEach(f -> fields.add(f.asText()));
        Set<String> optional = new LinkedHashSet<>();
        ev.get("optional").forEach(f -> optional.add(f.asText()));
        ObjectMapper json = new ObjectMapper();
        DenyEvent full = new DenyEvent(Instant.parse("2026-12-02T10:00:00.123456Z"), "rl:user:ann", "orders:user", "redis", "denied",
                5, 0, 734, "10.1.2.3", "curl/8.5 \"quoted\"\n");
        assertEquals(fields, names(json.readTree(full.toJson())));
        assertEquals("2026-12-02T10:00:00.123Z", json.readTree(full.toJson()).get("timestamp").asText(), "RFC 3339 UTC millis");
        assertEquals("curl/8.5 \"quoted\"\n", json.readTree(full.toJson()).get("user_agent").asText());
        DenyEvent bare = new DenyEvent(Instant.EPOCH, "k", "r", "local", "denied", 1, 0, -1, null, null);
        List<String> without = new ArrayList<>(fields);
        without.removeAll(optional);
        assertEquals(without, names(json.readTree(bare.toJson())), "an unknown optional field is left out");
        assertEquals("1970-01-01T00:00:00.000Z", json.readTree(bare.toJson()).get("timestamp").asText());
        assertEquals(-1, json.readTree(bare.toJson()).get("retry_after_ms").asLong(), "never: -1");
    }

    private static List<String> names(JsonNode o) {
        List<String> out = new ArrayList<>();
        for (Iterator<String> it = o.fieldNames(); it.hasNext(); ) {
            out.add(it.next());
        }
        return out;
    }

    @Test
    void denyEventDefaultsAreTheContracts() {
        JsonNode ev = obs().get("deny_events");
        assertEquals(ev.get("buffer_events").asInt(), DenyEvents.DEFAULT_CAPACITY);
        assertEquals(ev.get("flush_events").asInt(), DenyEvents.DEFAULT_FLUSH_EVENTS);
        assertEquals(ev.get("flush_interval_ms").asLong(), DenyEvents.DEFAULT_FLUSH_INTERVAL.toMillis());
        assertEquals(ev.get("sink_timeout_ms").asLong(), DenyEvents.DEFAULT_TIMEOUT.toMillis());
        assertEquals(ev.get("bulk_index").asText(), DenyEvents.DEFAULT_INDEX);
        assertEquals(ev.get("max_header_bytes").asInt(), DenyEvent.MAX_HEADER_BYTES);
        try (DenyEvents d = DenyEvents.builder(b -> { }).build()) {
            assertEquals(DenyEvents.DEFAULT_CAPACITY, d.capacity());
            assertEquals(DenyEvents.DEFAULT_FLUSH_EVENTS, d.flushEvents());
            assertEquals(DenyEvents.DEFAULT_FLUSH_INTERVAL, d.flushInterval());
            assertEquals(DenyEvents.DEFAULT_TIMEOUT, d.timeout());
        }
        assertNotNull(ev.get("sinks").get("bulk"));
        assertNotNull(ev.get("sinks").get("file"));
        assertNotNull(ev.get("sinks").get("callback"));
    }
}

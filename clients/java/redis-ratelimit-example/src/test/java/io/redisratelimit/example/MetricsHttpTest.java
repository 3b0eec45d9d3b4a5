package io.redisratelimit.example;

import com.fasterxml.jackson.databind.JsonNode;
import io.redisratelimit.client.testing.BulkServer;
import io.redisratelimit.client.testing.Prometheus;
import io.redisratelimit.client.testing.RedisServer;
import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.Assumptions;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.Test;
import org.springframework.boot.builder.SpringApplicationBuilder;
import org.springframework.boot.web.context.WebServerApplicationContext;
import org.springframework.context.ConfigurableApplicationContext;

import java.net.URI;
import java.net.http.HttpClient;
import java.net.http.HttpRequest;
import java.net.http.HttpResponse;
import java.time.Duration;
import java.util.List;
import java.util.Map;
import java.util.UUID;
import java.util.function.BooleanSupplier;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

/**
 * The example service's {@code /metrics} over real HTTP: the app on a real
 * redis-server with the module, admitted and denied requests driven over
 * HTTP, the scrape checked by {@code promtool check metrics} and its decision
 * counts compared with what was driven; the denials shipped as deny events
 * to a real {@code _bulk} server, with the client's IP and user agent.
 */
class MetricsHttpTest {
    private static final HttpClient HTTP = HttpClient.newBuilder().connectTimeout(Duration.ofSeconds(5)).build();
    private static RedisServer redis;
    private static BulkServer bulk;
    private static ConfigurableApplicationContext app;
    private static int port;

    @BeforeAll
    static void start() {
        redis = RedisServer.start();
        bulk = BulkServer.start();
        app = new SpringApplicationBuilder(OrderApplication.class).run(
                "--server.port=0",
                "--server.address=127.0.0.1",
                "--spring.data.redis.url=" + redis.uri(),
                "--ratelimit.deadline=2s",
                // Every denial decided by Redis, so the counts per level are exact.
                "--ratelimit.deny-cache.enabled=false",
                // 3 per minute per user: the 4th request in the test's minute is denied.
                "--ratelimit.rules.order-create.params[0]=3",
                "--ratelimit.rules.order-create.params[1]=60000",
                "--ratelimit.deny-events.sink=bulk",
                "--ratelimit.deny-events.url=" + bulk.url(),
                "--ratelimit.deny-events.flush-interval=100ms");
        port = ((WebServerApplicationContext) app).getWebServer().getPort();
    }

    @AfterAll
    static void stop() {
        if (app != null) {
            app.close();
        }
        if (bulk != null) {
            bulk.close();
        }
        if (redis != null) {
            redis.close();
        }
    }

    private static HttpResponse<String> send(String method, String path, Map<String, String> headers) throws Exception {
        HttpRequest.Builder b = HttpRequest.newBuilder(URI.create("http://127.0.0.1:" + port + path))
                .timeout(Duration.ofSeconds(10)).method(method, HttpRequest.BodyPublishers.noBody());
        headers.forEach(b::header);
        return HTTP.send(b.build(), HttpResponse.BodyHandlers.ofString());
    }

    private static void poll(String what, Duration within, BooleanSupplier done) throws InterruptedException {
        long deadline = System.nanoTime() + within.toNanos();
        while (!done.getAsBoolean()) {
            if (System.nanoTime() > deadline) {
                throw new AssertionError("not within " + within + ": " + what);
            }
            Thread.sleep(20);
        }
    }

    private static Prometheus scrape() throws Exception {
        HttpResponse<String> r = send("GET", "/metrics", Map.of());
        assertEquals(200, r.statusCode(), r.body());
        assertTrue(r.headers().firstValue("Content-Type").orElse("").startsWith("text/plain"), r.headers().toString());
        return new Prometheus(r.body());
    }

    @Test
    void metricsCountWhatWasDrivenPromtoolAcceptsThemAndDenialsReachTheBulkServer() throws Exception {
        String user = "u-" + UUID.randomUUID();
        String agent = "metrics-test/1.0 (" + user + ")";
        int admitted = 0;
        int denied = 0;
        for (int i = 0; i < 8; i++) {
            int code = send("POST", "/api/order/create", Map.of("X-User", user, "User-Agent", agent)).statusCode();
            admitted += code == 200 ? 1 : 0;
            denied += code == 429 ? 1 : 0;
        }
        assertEquals(3, admitted);
        assertEquals(5, denied);

        Prometheus m = scrape();
        String create = "order-api:order-create";
        String total = "order-api:order-total";
        assertEquals(3, m.sum("ratelimit_decisions_total", "rule", create, "level", "redis", "outcome", "admitted"));
        assertEquals(5, m.sum("ratelimit_decisions_total", "rule", create, "level", "redis", "outcome", "denied"));
        assertEquals(8, m.sum("ratelimit_decisions_total", "rule", create), "nothing at another level");
        assertEquals(3, m.sum("ratelimit_decisions_total", "rule", total, "outcome", "admitted"),
                "the total admits with the user's rule, in the same RL.ALL");
        assertEquals(0, m.sum("ratelimit_decisions_total", "rule", total, "outcome", "denied"));
        assertEquals(8, m.sum("ratelimit_redis_seconds_count"), "one round trip per request");
        assertEquals(8, m.sum("ratelimit_redis_seconds_bucket", "le", "+Inf"));
        assertEquals(0, m.sum("ratelimit_remaining_ratio", "rule", create), "the last decision was a denial at the limit");
        assertEquals(0, m.sum("ratelimit_breaker_open", "breaker", "redis"));
        assertEquals("counter", m.types().get("ratelimit_decisions_total"));
        assertEquals("histogram", m.types().get("ratelimit_redis_seconds"));
        assertEquals(100, m.sum("ratelimit_scale", "rule", "order-api:catalog"));
        assertEquals(0, m.sum("ratelimit_stage", "rule", "order-api:reco"));
        assertEquals(0, m.sum("ratelimit_breaker_open", "breaker", "inventory"));

        poll("5 deny events at the _bulk server", Duration.ofSeconds(15), () -> bulk.events().size() >= 5);
        assertEquals(List.of(), bulk.malformed());
        assertEquals(5, bulk.events().size());
        for (JsonNode e : bulk.events()) {
            assertEquals("{order:create}:user:" + user, e.get("key").asText());
            assertEquals(create, e.get("rule").asText());
            assertEquals("redis", e.get("level").asText());
            assertEquals("denied", e.get("outcome").asText());
            assertEquals(3, e.get("limit").asLong());
            assertTrue(e.get("retry_after_ms").asLong() > 0);
            assertEquals("127.0.0.1", e.get("client_ip").asText());
            assertEquals(agent, e.get("user_agent").asText());
        }
        poll("the shipped counter", Duration.ofSeconds(10), () -> {
            try {
                return scrape().sum("ratelimit_deny_events_shipped_total") == 5;
            } catch (Exception e) {
                throw new IllegalStateException(e);
            }
        });
        Prometheus after = scrape();
        // Kept for the README and for a look: target/metrics-scrape.txt.
        java.nio.file.Files.writeString(java.nio.file.Path.of("target", "metrics-scrape.txt"), after.text());
        assertEquals(0, after.sum("ratelimit_deny_events_dropped_total"));
        assertEquals(0, after.sum("ratelimit_deny_events_sink_errors_total"));

        Assumptions.assumeTrue(Prometheus.promtool() != null, "promtool is not installed (apt-get install prometheus): skipped");
        // The whole scrape parses; promtool's lint may report the style of the JVM's and Tomcat's
        // families (Micrometer's), never of the kit's.
        Map.Entry<Integer, String> whole = Prometheus.check(after.text());
        assertTrue(whole.getKey() == 0 || whole.getKey() == 3, "promtool check metrics:\n" + whole.getValue());
        assertTrue(!whole.getValue().contains("error") && !whole.getValue().contains("ratelimit_"),
                "promtool check metrics:\n" + whole.getValue());
        Map.Entry<Integer, String> ours = Prometheus.check(after.only("ratelimit_"));
        assertEquals(0, ours.getKey(), "promtool check metrics on the ratelimit_ families:\n" + ours.getValue());
    }
}

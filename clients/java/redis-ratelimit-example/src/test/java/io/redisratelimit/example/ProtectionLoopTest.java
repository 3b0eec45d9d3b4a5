package io.redisratelimit.example;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import io.redisratelimit.client.testing.RedisServer;
import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.MethodOrderer;
import org.junit.jupiter.api.Order;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.TestMethodOrder;
import org.springframework.boot.builder.SpringApplicationBuilder;
import org.springframework.boot.web.context.WebServerApplicationContext;
import org.springframework.context.ConfigurableApplicationContext;

import java.net.URI;
import java.net.http.HttpClient;
import java.net.http.HttpRequest;
import java.net.http.HttpResponse;
import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.atomic.AtomicBoolean;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.function.BooleanSupplier;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

/**
 * The protection loop end to end: two instances of the example app on
 * random ports, sharing one redis-server with the module (and a replica of
 * it), over real HTTP. Windows of 1 s, reports and polls every 100 ms;
 * every condition is polled for with a deadline.
 */
@TestMethodOrder(MethodOrderer.OrderAnnotation.class)
class ProtectionLoopTest {
    private static final ObjectMapper JSON = new ObjectMapper();
    private static final HttpClient HTTP = HttpClient.newBuilder().connectTimeout(Duration.ofSeconds(5)).build();

    static RedisServer redis;
    static RedisServer replica;
    static final List<ConfigurableApplicationContext> apps = new ArrayList<>();
    static final List<Integer> ports = new ArrayList<>();

    @BeforeAll
    static void start() {
        redis = RedisServer.start();
        replica = RedisServer.startReplicaOf(redis);
        for (int i = 0; i < 2; i++) {
            // Command-line arguments: above application.yml (default properties would be below it).
            ConfigurableApplicationContext app = new SpringApplicationBuilder(OrderApplication.class).run(
                    "--server.port=0",
                    "--server.address=127.0.0.1",
                    "--spring.data.redis.url=" + redis.uri(),
                    "--ratelimit.deadline=1s",
                    "--ratelimit.instances=2",
                    // The deny cache stays on (application.yml): the denials it answers reach the
                    // server as RL.OUTCOME ... DENIED n, so the window's deny ratio is the flood's.
                    "--ratelimit.protection.report-interval=100ms",
                    "--ratelimit.protection.stage-poll=100ms",
                    "--ratelimit.rules.catalog.adapt.mincalls=20",
                    "--ratelimit.rules.catalog.window=1s",
                    "--ratelimit.rules.reco.window=1s",
                    "--management.endpoints.web.exposure.include=health");
            apps.add(app);
            ports.add(((WebServerApplicationContext) app).getWebServer().getPort());
        }
    }

    @AfterAll
    static void stop() {
        apps.forEach(ConfigurableApplicationContext::close);
        if (replica != null) {
            replica.close();
        }
        if (redis != null) {
            redis.close();
        }
    }

    static HttpResponse<String> send(String method, int port, String path, String user) {
        HttpRequest.Builder b = HttpRequest.newBuilder(URI.create("http://127.0.0.1:" + port + path))
                .timeout(Duration.ofSeconds(10)).method(method, HttpRequest.BodyPublishers.noBody());
        if (user != null) {
            b.header("X-User", user);
        }
        try {
            return HTTP.send(b.build(), HttpResponse.BodyHandlers.ofString());
        } catch (Exception e) {
            throw new IllegalStateException(e);
        }
    }

    static JsonNode json(HttpResponse<String> r) {
        try {
            return JSON.readTree(r.body());
        } catch (Exception e) {
            throw new IllegalStateException(r.statusCode() + " " + r.body(), e);
        }
    }

    static JsonNode protection(int port) {
        return json(send("GET", port, "/protection", null));
    }

    static void poll(String what, Duration within, BooleanSupplier done) throws InterruptedException {
        long deadline = System.nanoTime() + within.toNanos();
        while (!done.getAsBoolean()) {
            if (System.nanoTime() > deadline) {
                throw new AssertionError("not within " + within + ": " + what + "; instances: " + protection(ports.get(0)) + " "
                        + protection(ports.get(1)));
            }
            Thread.sleep(20);
        }
    }

    /** Background traffic until stopped: {@code perSecond} requests a second, alternating between the instances. */
    static final class Traffic implements AutoCloseable {
        final AtomicBoolean running = new AtomicBoolean(true);
        final AtomicInteger sent = new AtomicInteger();
        final Thread thread;

        Traffic(String path, int perSecond) {
            thread = new Thread(() -> {
                long pause = 1_000_000_000L / perSecond;
                long next = System.nanoTime();
                while (running.get()) {
                    int n = sent.getAndIncrement();
                    send("GET", ports.get(n % 2), path, "u" + (n % 50));
                    next += pause;
                    long wait = next - System.nanoTime();
                    if (wait > 0) {
                        try {
                            Thread.sleep(wait / 1_000_000, (int) (wait % 1_000_000));
                        } catch (InterruptedException e) {
                            return;
                        }
                    }
                }
            }, "traffic " + path);
            thread.start();
        }

        @Override
        public void close() {
            running.set(false);
            try {
                thread.join();
            } catch (InterruptedException e) {
                Thread.currentThread().interrupt();
            }
        }
    }

    /**
     * Bursts on one user's fixed window of 6 a second: {@code perWindow}
     * requests at the start of each second (through instance b), so that
     * each window denies {@code perWindow - 6} of them.
     */
    static final class Flood implements AutoCloseable {
        final AtomicBoolean running = new AtomicBoolean(true);
        final AtomicInteger perWindow;
        final Thread thread;

        Flood(int perWindow) {
            this.perWindow = new AtomicInteger(perWindow);
            thread = new Thread(() -> {
                while (running.get()) {
                    long now = System.currentTimeMillis();
                    try {
                        Thread.sleep(1000 - now % 1000 + 50);
                    } catch (InterruptedException e) {
                        return;
                    }
                    for (int i = 0; i < this.perWindow.get() && running.get(); i++) {
                        send("GET", ports.get(1), "/api/feed", "flood");
                    }
                }
            }, "flood");
            thread.start();
        }

        @Override
        public void close() {
            running.set(false);
            try {
                thread.join();
            } catch (InterruptedException e) {
                Thread.currentThread().interrupt();
            }
        }
    }

    static String replicaScale() {
        try {
            // "scale 80 stage 0 ...": the flat reply as the harness joins it.
            String[] words = replica.command("RL.POLICY", "STATS", "order-api:catalog").split(" ");
            return words[1];
        } catch (Exception e) {
            return "?";
        }
    }

    @Test
    @Order(1)
    void aDeniedRequestOnARouteWithADegradeHandlerGetsTheHandlersAnswer() {
        boolean cached = false;
        for (int i = 0; i < 30 && !cached; i++) {
            HttpResponse<String> r = send("GET", ports.get(0), "/api/recommendations", "greedy");
            assertEquals(200, r.statusCode(), "never a 429: " + r.body());
            cached = "cache".equals(json(r).get("source").asText());
        }
        assertTrue(cached, "past 6 a second the fallback answers");
    }

    @Test
    @Order(2)
    void tenPercentErrorsScaleThePolicyTo80OnBothInstancesAndTheReplicaThenItRecovers() throws Exception {
        for (int port : ports) {
            send("POST", port, "/admin/failures?every=10", null);
        }
        Traffic traffic = new Traffic("/api/catalog", 80);
        try {
            poll("scale 80 on both instances", Duration.ofSeconds(15), () ->
                    protection(ports.get(0)).get("catalog").get("scale").asInt() == 80
                            && protection(ports.get(1)).get("catalog").get("scale").asInt() == 80);
            poll("scale 80 on the replica", Duration.ofSeconds(5), () -> "80".equals(replicaScale()));
            io.micrometer.core.instrument.Gauge gauge = apps.get(0).getBean(io.micrometer.core.instrument.MeterRegistry.class)
                    .find("ratelimit.scale").tag("rule", "order-api:catalog").gauge();
            assertTrue(gauge != null && gauge.value() <= 80, "the ratelimit.scale gauge: " + (gauge == null ? null : gauge.value()));
            for (int port : ports) {
                send("POST", port, "/admin/failures?every=0", null);
            }
            poll("scale back to 100 on both instances", Duration.ofSeconds(15), () ->
                    protection(ports.get(0)).get("catalog").get("scale").asInt() == 100
                            && protection(ports.get(1)).get("catalog").get("scale").asInt() == 100);
            poll("scale 100 on the replica", Duration.ofSeconds(5), () -> "100".equals(replicaScale()));
        } finally {
            traffic.close();
        }
    }

    @Test
    @Order(3)
    void aFloodDegradesNonCoreRoutesThenBreaksThenBothRecoverOneStepPerWindow() throws Exception {
        int a = ports.get(0);
        JsonNode before = json(send("GET", ports.get(1), "/stats", null));
        try (Flood flood = new Flood(10)) {
            // 4 of 10 denied: 40 %, between 30 and 50: stage 1.
            poll("stage 1 on both instances", Duration.ofSeconds(15), () ->
                    protection(a).get("reco").get("stage").asInt() == 1 && protection(ports.get(1)).get("reco").get("stage").asInt() == 1);
            long redisCalls = json(send("GET", a, "/stats", null)).get("redis_calls").asLong();
            JsonNode degraded = json(send("GET", a, "/api/recommendations", "someone"));
            assertEquals("cache", degraded.get("source").asText(), "a non-core route at stage 1 answers its degrade handler");
            assertEquals(redisCalls, json(send("GET", a, "/stats", null)).get("redis_calls").asLong(), "without a call to Redis");
            assertEquals("CLOSED", protection(a).get("breaker").asText());
            // 14 of 20 denied: 70 %, above 50: stage 2, the named breaker forced open.
            flood.perWindow.set(20);
            poll("stage 2 and the breaker open on both instances", Duration.ofSeconds(15), () ->
                    protection(a).get("reco").get("stage").asInt() == 2 && protection(a).get("breaker").asText().equals("FORCED_OPEN")
                            && protection(ports.get(1)).get("breaker").asText().equals("FORCED_OPEN"));
            assertEquals("skipped", json(send("GET", a, "/api/feed", "reader")).get("inventory").asText(),
                    "the application's own calls through the breaker see it open");
        }
        // The flood was answered mostly from instance b's deny cache (the 7th of each burst reaches
        // Redis, the rest do not): the stages moved on the DENIED counts it reported.
        JsonNode after = json(send("GET", ports.get(1), "/stats", null));
        long cached = after.get("deny_cache_hits").asLong() - before.get("deny_cache_hits").asLong();
        long redisDenied = after.get("redis_denied").asLong() - before.get("redis_denied").asLong();
        assertTrue(cached > 2 * redisDenied && redisDenied > 0, "deny cache hits " + cached + ", Redis denials " + redisDenied);
        List<Integer> seen = new ArrayList<>();
        poll("back to stage 0", Duration.ofSeconds(15), () -> {
            JsonNode p = protection(a);
            int stage = p.get("reco").get("stage").asInt();
            if (seen.isEmpty() || seen.get(seen.size() - 1) != stage) {
                seen.add(stage);
            }
            if (stage < 2 && !"CLOSED".equals(p.get("breaker").asText())) {
                // The stage is published a moment before the listeners close the breaker.
                try {
                    poll("the breaker closed once the stage fell below 2", Duration.ofMillis(500),
                            () -> "CLOSED".equals(protection(a).get("breaker").asText()));
                } catch (InterruptedException e) {
                    throw new IllegalStateException(e);
                }
            }
            return stage == 0;
        });
        assertEquals(List.of(2, 1, 0), seen, "one step per window");
        assertEquals("fresh", json(send("GET", a, "/api/recommendations", "someone-else")).get("source").asText());
    }

    @Test
    @Order(4)
    void withRedisDownRequestsStillAnswerAndReportsAreLostNotQueuedThenResume() throws Exception {
        int a = ports.get(0);
        redis.kill9();
        for (int i = 0; i < 20; i++) {
            assertEquals(200, send("GET", a, "/api/catalog", "u" + i).statusCode(), "the fallback decides");
        }
        poll("a report failed", Duration.ofSeconds(10), () -> protection(a).get("reports_failed").asLong() > 0);
        poll("the stage hold falls back to 0", Duration.ofSeconds(10), () -> protection(a).get("reco").get("stage").asInt() == 0);
        long sent = protection(a).get("reports_sent").asLong();
        redis.restart();
        poll("reports resume", Duration.ofSeconds(20), () -> {
            send("GET", a, "/api/catalog", "again");
            return protection(a).get("reports_sent").asLong() > sent;
        });
    }
}

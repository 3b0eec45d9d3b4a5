package io.redisratelimit.spring.it;

import io.micrometer.core.instrument.MeterRegistry;
import io.redisratelimit.client.testing.RedisServer;
import io.redisratelimit.client.testing.Windows;
import org.junit.jupiter.api.Test;
import org.springframework.beans.factory.annotation.Autowired;
import org.springframework.boot.test.context.SpringBootTest;
import org.springframework.boot.test.web.server.LocalServerPort;
import org.springframework.test.context.DynamicPropertyRegistry;
import org.springframework.test.context.DynamicPropertySource;

import java.net.http.HttpResponse;
import java.util.ArrayList;
import java.util.List;
import java.util.UUID;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.Future;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

/** The starter in a real Spring Boot app over real HTTP. */
@SpringBootTest(classes = OrderApp.class, webEnvironment = SpringBootTest.WebEnvironment.RANDOM_PORT, properties = {
        "spring.application.name=orders-it",
        "ratelimit.deadline=2s",
        "ratelimit.rules.order-create.algorithm=tokenbucket",
        "ratelimit.rules.order-create.params=20,1,3600000",
        "ratelimit.rules.order-create.key-prefix={order}:user:",
        "ratelimit.rules.order-total.algorithm=fixedwindow",
        "ratelimit.rules.order-total.params=15000,1000",
        "ratelimit.rules.order-total.fixed-key={order}:total",
        "ratelimit.rules.order-total.global=true",
        "ratelimit.rules.search.algorithm=fixedwindow",
        "ratelimit.rules.search.params=3,60000",
        "ratelimit.rules.search.routes=/search/**,/search",
        "ratelimit.rules.search.key=#request.getHeader('X-User')",
        "ratelimit.rules.both-post.algorithm=sliding",
        "ratelimit.rules.both-post.params=1,60000",
        "ratelimit.rules.both-post.routes=/both",
        "ratelimit.rules.both-post.methods=post",
        "ratelimit.rules.both-post.key=#request.getHeader('X-User')",
        "ratelimit.rules.quote.algorithm=sliding",
        "ratelimit.rules.quote.params=2,60000",
        "ratelimit.deny-events.flush-interval=50ms",
        // Room for the 20,000-byte User-Agent of aHugeUserAgentIsCutInTheDenyEvent (Tomcat's default is 8 KB).
        "server.max-http-request-header-size=64KB",
})
class StarterHttpTest {
    @DynamicPropertySource
    static void redis(DynamicPropertyRegistry r) {
        RedisServer s = SharedRedis.get();
        r.add("spring.data.redis.host", () -> "127.0.0.1");
        r.add("spring.data.redis.port", s::port);
        // A fixed window that cannot turn over during the test (they are aligned to the epoch).
        r.add("ratelimit.rules.search.params", () -> "3," + Windows.FIXED_MS);
    }

    @LocalServerPort
    int port;

    @Autowired
    MeterRegistry meters;

    @Test
    void exactlyTheLimitIsAdmittedUnderConcurrentRequests() throws Exception {
        String user = "u-" + UUID.randomUUID();
        ExecutorService pool = Executors.newFixedThreadPool(16);
        List<Future<Integer>> codes = new ArrayList<>();
        for (int i = 0; i < 100; i++) {
            codes.add(pool.submit(() -> Http.send("POST", port, "/api/order/create", user).statusCode()));
        }
        int ok = 0;
        int limited = 0;
        for (Future<Integer> f : codes) {
            int c = f.get();
            ok += c == 200 ? 1 : 0;
            limited += c == 429 ? 1 : 0;
        }
        pool.shutdown();
        assertEquals(20, ok);
        assertEquals(80, limited);
    }

    @Test
    void aDenialIsA429ProblemWithRetryAfterAndTheIetfFields() {
        String user = "u-" + UUID.randomUUID();
        HttpResponse<String> first = Http.send("POST", port, "/api/order/create", user);
        assertEquals(200, first.statusCode());
        // w: ceil(capacity * refill_ms / refill_count / 1000) = 20 * 3600 s.
        assertEquals("\"order-create\";q=20;w=72000, \"order-total\";q=15000;w=1",
                first.headers().firstValue("RateLimit-Policy").orElseThrow());
        assertTrue(first.headers().firstValue("RateLimit").orElseThrow().startsWith("\"order-create\";r=19;t="),
                first.headers().map().toString());
        for (int i = 0; i < 19; i++) {
            Http.send("POST", port, "/api/order/create", user);
        }
        HttpResponse<String> denied = Http.send("POST", port, "/api/order/create", user);
        assertEquals(429, denied.statusCode());
        assertEquals("application/problem+json", denied.headers().firstValue("Content-Type").orElseThrow());
        long retryAfter = Long.parseLong(denied.headers().firstValue("Retry-After").orElseThrow());
        assertTrue(retryAfter > 0 && retryAfter <= 180_000, "ceil(wait_ms / 1000): " + retryAfter);
        assertTrue(denied.headers().firstValue("RateLimit").orElseThrow().startsWith("\"order-create\";r=0;t="));
        String body = denied.body();
        assertTrue(body.contains("\"type\":\"https://iana.org/assignments/http-problem-types#quota-exceeded\""), body);
        assertTrue(body.contains("\"status\":429"), body);
        assertTrue(body.contains("\"violated-policies\":[\"order-create\"]"), body);
        assertTrue(body.contains("\"title\":\"Request cannot be satisfied as assigned quota has been exceeded\""), body);
    }

    @Test
    void theKeyIsEvaluatedPerRequest() {
        String a = "a-" + UUID.randomUUID();
        String b = "b-" + UUID.randomUUID();
        for (int i = 0; i < 20; i++) {
            assertEquals(200, Http.send("POST", port, "/api/order/create", a).statusCode());
        }
        assertEquals(429, Http.send("POST", port, "/api/order/create", a).statusCode());
        assertEquals(200, Http.send("POST", port, "/api/order/create", b).statusCode(), "another user has its own limit");
    }

    @Test
    void aRouteRuleCanNameItsMethodsSoGetAndPostAreCountedApart() {
        String user = "m-" + UUID.randomUUID();
        assertEquals(200, Http.send("POST", port, "/both", user).statusCode());
        assertEquals(429, Http.send("POST", port, "/both", user).statusCode());
        for (int i = 0; i < 3; i++) {
            assertEquals(200, Http.send("GET", port, "/both", user).statusCode(), "the rule names POST only");
        }
    }

    @Test
    void aRequestWithoutItsKeyIsRefusedNotCountedUnderOneSharedKey() {
        for (int i = 0; i < 5; i++) {
            HttpResponse<String> r = Http.send("GET", port, "/search", null);
            assertEquals(400, r.statusCode(), "no X-User: the key expression gives nothing");
            assertEquals("application/problem+json", r.headers().firstValue("Content-Type").orElseThrow());
            assertTrue(r.body().contains("no rate-limit key") && r.body().contains("\"instance\":\"/search\""), r.body());
        }
        String user = "k-" + UUID.randomUUID();
        assertEquals(200, Http.send("GET", port, "/search", user).statusCode(), "a caller with a key is decided as usual");
    }

    @Test
    void aRouteRuleIsEnforcedByTheInterceptorBeforeTheHandler() {
        String user = "s-" + UUID.randomUUID();
        for (int i = 0; i < 3; i++) {
            HttpResponse<String> r = Http.send("GET", port, "/search", user);
            assertEquals(200, r.statusCode());
            assertEquals("\"search\";r=" + (2 - i) + ";t=" + r.headers().firstValue("RateLimit").orElseThrow().replaceAll(".*;t=", ""),
                    r.headers().firstValue("RateLimit").orElseThrow());
        }
        HttpResponse<String> denied = Http.send("GET", port, "/search", user);
        assertEquals(429, denied.statusCode());
        assertEquals("application/problem+json", denied.headers().firstValue("Content-Type").orElseThrow());
        assertTrue(denied.body().contains("\"violated-policies\":[\"search\"]"), denied.body());
        assertTrue(denied.body().contains("\"instance\":\"/search\""), "as the annotation's 429: " + denied.body());
        assertTrue(denied.headers().firstValue("Retry-After").isPresent());
        assertEquals(200, Http.send("GET", port, "/bare", user).statusCode(), "other routes are not limited");
        // The interceptor's denial, shipped as a deny event with the client's address and user agent.
        long deadline = System.nanoTime() + 10_000_000_000L;
        while (OrderApp.EVENTS.stream().noneMatch(e -> e.key().endsWith(user)) && System.nanoTime() < deadline) {
            try {
                Thread.sleep(10);
            } catch (InterruptedException ie) {
                throw new IllegalStateException(ie);
            }
        }
        io.redisratelimit.client.DenyEvent e = OrderApp.EVENTS.stream().filter(x -> x.key().endsWith(user)).findFirst()
                .orElseThrow(() -> new AssertionError("no deny event for " + user));
        assertEquals("orders-it:search", e.rule());
        assertEquals("127.0.0.1", e.clientIp());
        assertTrue(e.userAgent() != null && e.userAgent().startsWith("Java-http-client"), e.userAgent());
    }

    @Test
    void aHugeUserAgentIsCutInTheDenyEvent() throws Exception {
        String user = "ua-" + UUID.randomUUID();
        // 1 + 2 * 9,999 + 1 = 20,000 bytes of UTF-8 on the wire. Tomcat reads a header's bytes as ISO-8859-1 (one char
        // each, 2 bytes of UTF-8 for the non-ASCII ones): the 512-byte mark falls inside a character either way.
        byte[] wire = ("a" + "\u00e9".repeat(9_999) + "z").getBytes(java.nio.charset.StandardCharsets.UTF_8);
        assertEquals(20_000, wire.length);
        String agent = new String(wire, java.nio.charset.StandardCharsets.ISO_8859_1);
        for (int i = 0; i < 3; i++) {
            assertEquals(200, Http.getWithRawUserAgent(port, "/search", user, wire));
        }
        assertEquals(429, Http.getWithRawUserAgent(port, "/search", user, wire));
        long deadline = System.nanoTime() + 10_000_000_000L;
        while (OrderApp.EVENTS.stream().noneMatch(e -> e.key().endsWith(user)) && System.nanoTime() < deadline) {
            Thread.sleep(10);
        }
        io.redisratelimit.client.DenyEvent e = OrderApp.EVENTS.stream().filter(x -> x.key().endsWith(user)).findFirst()
                .orElseThrow(() -> new AssertionError("no deny event for " + user));
        String got = e.userAgent();
        assertTrue(got != null && agent.startsWith(got), "a prefix of the original: " + got);
        // Valid UTF-8: encodes without a lone surrogate, and decodes back to itself.
        java.nio.ByteBuffer utf8 = java.nio.charset.StandardCharsets.UTF_8.newEncoder()
                .onMalformedInput(java.nio.charset.CodingErrorAction.REPORT)
                .onUnmappableCharacter(java.nio.charset.CodingErrorAction.REPORT)
                .encode(java.nio.CharBuffer.wrap(got));
        int n = utf8.remaining();
        assertTrue(n <= io.redisratelimit.client.DenyEvent.MAX_HEADER_BYTES, n + " bytes");
        assertEquals(got, java.nio.charset.StandardCharsets.UTF_8.newDecoder()
                .onMalformedInput(java.nio.charset.CodingErrorAction.REPORT)
                .decode(utf8).toString());
        assertEquals(511, n, "cut before the character that would pass 512, no further");
        assertEquals("127.0.0.1", e.clientIp());
    }

    @Test
    void aLimitedBeanMethodDeniesThroughTheControllerToo() {
        String user = "q-" + UUID.randomUUID();
        assertEquals(200, Http.send("GET", port, "/quote", user).statusCode());
        assertEquals(200, Http.send("GET", port, "/quote", user).statusCode());
        HttpResponse<String> denied = Http.send("GET", port, "/quote", user);
        assertEquals(429, denied.statusCode());
        assertTrue(denied.body().contains("\"violated-policies\":[\"quote\"]"), denied.body());
    }

    @Test
    void theRulesArePoliciesOnTheServerAndDecisionsAreCounted() throws Exception {
        String list = SharedRedis.get().command("RL.POLICY", "LIST");
        assertTrue(list.contains("orders-it:order-create") && list.contains("orders-it:search"), list);
        Http.send("POST", port, "/api/order/create", "m-" + UUID.randomUUID());
        double admitted = meters.find("ratelimit.decisions").tag("rule", "orders-it:order-create").tag("level", "redis")
                .tag("outcome", "admitted").counters().stream().mapToDouble(c -> c.count()).sum();
        assertTrue(admitted >= 1, "ratelimit.decisions counts decisions, by the rule's policy");
        assertTrue(meters.find("ratelimit.redis").timer().count() >= 1);
        assertTrue(meters.find("ratelimit.redis.calls").functionCounter().count() >= 1);
    }
}

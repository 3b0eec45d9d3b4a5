package io.redisratelimit.spring.it;

import io.redisratelimit.client.Client;
import io.redisratelimit.client.Request;
import io.redisratelimit.spring.RateLimitService;
import io.redisratelimit.spring.RateLimited;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.Test;
import org.springframework.beans.factory.annotation.Autowired;
import org.springframework.boot.autoconfigure.SpringBootApplication;
import org.springframework.boot.test.context.SpringBootTest;
import org.springframework.context.annotation.Bean;
import org.springframework.web.bind.annotation.GetMapping;
import org.springframework.web.bind.annotation.RequestHeader;
import org.springframework.web.bind.annotation.RestController;

import java.net.http.HttpResponse;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.UUID;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.Semaphore;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.function.BooleanSupplier;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertTrue;

/**
 * Concurrency caps over real HTTP (Tomcat): a route rule through the servlet
 * interceptor and {@code @RateLimited} on a bean. Slow requests hold their
 * leases until they complete; the others get the 429; then everything is
 * given back, also after an error.
 */
@SpringBootTest(classes = ConcurrencyHttpTest.CapApp.class, webEnvironment = SpringBootTest.WebEnvironment.RANDOM_PORT, properties = {
        "spring.application.name=caps-it",
        "ratelimit.deadline=2s",
        "ratelimit.rules.inflight.algorithm=concurrency",
        "ratelimit.rules.inflight.params=3,60000",
        "ratelimit.rules.inflight.routes=/slow,/boom",
        "ratelimit.rules.inflight.key=#request.getHeader('X-User')",
        "ratelimit.rules.per-minute.algorithm=fixedwindow",
        "ratelimit.rules.per-minute.params=1000,60000",
        "ratelimit.rules.per-minute.routes=/slow",
        "ratelimit.rules.per-minute.key=#request.getHeader('X-User')",
        "ratelimit.rules.exports.algorithm=concurrency",
        "ratelimit.rules.exports.params=2,60000",
})
class ConcurrencyHttpTest extends OnSharedRedis {
    /** Requests inside a handler, and the gate that lets them finish. */
    static final AtomicInteger INSIDE = new AtomicInteger();
    static final Semaphore GATE = new Semaphore(0);

    static void hold() {
        INSIDE.incrementAndGet();
        try {
            GATE.tryAcquire(30, TimeUnit.SECONDS);
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
        } finally {
            INSIDE.decrementAndGet();
        }
    }

    @SpringBootApplication
    @RestController
    static class CapApp {
        private final Exports exports;

        CapApp(Exports exports) {
            this.exports = exports;
        }

        @Bean
        static Exports exports() {
            return new Exports();
        }

        @GetMapping("/slow")
        Map<String, Object> slow() {
            hold();
            return Map.of("ok", true);
        }

        @GetMapping("/boom")
        Map<String, Object> boom() {
            throw new IllegalStateException("the handler failed");
        }

        @GetMapping("/export")
        Map<String, Object> export(@RequestHeader("X-User") String user) {
            return Map.of("rows", exports.run(user));
        }
    }

    static class Exports {
        @RateLimited(rule = "exports", key = "#user")
        public long run(String user) {
            hold();
            return 7;
        }
    }

    @Autowired
    RateLimitService service;

    @AfterEach
    void openTheGate() {
        GATE.release(100);
        GATE.drainPermits();
    }

    private static void eventually(String what, BooleanSupplier condition) throws InterruptedException {
        long until = System.nanoTime() + TimeUnit.SECONDS.toNanos(20);
        while (!condition.getAsBoolean()) {
            assertTrue(System.nanoTime() < until, "never: " + what);
            Thread.sleep(20);
        }
    }

    private long free(String key, long limit) {
        Client rl = service.client().withDeadline(java.time.Duration.ofSeconds(2));
        return rl.concurrency(key, limit, 60_000, Request.cost(0)).remaining();
    }

    private List<CompletableFuture<HttpResponse<String>>> fire(int n, String path, String user) {
        List<CompletableFuture<HttpResponse<String>>> out = new ArrayList<>();
        for (int i = 0; i < n; i++) {
            out.add(CompletableFuture.supplyAsync(() -> Http.send("GET", port, path, user)));
        }
        return out;
    }

    @Test
    void aRouteCapAdmitsLimitSlowRequestsAnswersTheRest429AndFreesThemWhenDone() throws Exception {
        String user = "c-" + UUID.randomUUID();
        String key = "rl:caps-it:inflight:" + user;
        List<CompletableFuture<HttpResponse<String>>> calls = fire(8, "/slow", user);
        eventually("3 requests inside and 5 answered", () -> INSIDE.get() == 3 && calls.stream().filter(CompletableFuture::isDone).count() == 5);
        assertEquals(0, free(key, 3), "three leases held while the requests work");
        for (CompletableFuture<HttpResponse<String>> c : calls) {
            if (c.isDone()) {
                HttpResponse<String> denied = c.get();
                assertEquals(429, denied.statusCode(), denied.body());
                assertEquals("application/problem+json", denied.headers().firstValue("Content-Type").orElseThrow());
                assertTrue(denied.headers().firstValue("Retry-After").isPresent());
                assertEquals("\"inflight\";q=3, \"per-minute\";q=1000;w=60",
                        denied.headers().firstValue("RateLimit-Policy").orElseThrow(), "no w for a concurrency cap");
                assertTrue(denied.headers().firstValue("RateLimit").orElseThrow().startsWith("\"inflight\";r=0;t="));
                assertTrue(denied.body().contains("\"violated-policies\":[\"inflight\"]"), denied.body());
            }
        }
        GATE.release(3);
        int ok = 0;
        for (CompletableFuture<HttpResponse<String>> c : calls) {
            ok += c.get(20, TimeUnit.SECONDS).statusCode() == 200 ? 1 : 0;
        }
        assertEquals(3, ok);
        eventually("every lease given back", () -> free(key, 3) == 3);
        // A handler that fails gives its lease back too.
        assertEquals(500, Http.send("GET", port, "/boom", user).statusCode());
        eventually("the failed request's lease given back", () -> free(key, 3) == 3);
    }

    @Test
    void rateLimitedCapsConcurrentCallsOfABean() throws Exception {
        String user = "e-" + UUID.randomUUID();
        String key = "rl:caps-it:exports:" + user;
        List<CompletableFuture<HttpResponse<String>>> calls = fire(5, "/export", user);
        eventually("2 calls inside and 3 answered", () -> INSIDE.get() == 2 && calls.stream().filter(CompletableFuture::isDone).count() == 3);
        for (CompletableFuture<HttpResponse<String>> c : calls) {
            if (c.isDone()) {
                assertEquals(429, c.get().statusCode());
                assertEquals("\"exports\";q=2", c.get().headers().firstValue("RateLimit-Policy").orElseThrow());
            }
        }
        assertEquals(0, free(key, 2));
        assertFalse(calls.stream().allMatch(CompletableFuture::isDone));
        GATE.release(2);
        for (CompletableFuture<HttpResponse<String>> c : calls) {
            int code = c.get(20, TimeUnit.SECONDS).statusCode();
            assertTrue(code == 200 || code == 429, "status " + code);
        }
        eventually("every lease given back", () -> free(key, 2) == 2);
    }
}

package io.redisratelimit.spring.it;

import io.redisratelimit.client.Request;
import io.redisratelimit.spring.RateLimitService;
import org.junit.jupiter.api.Test;
import org.springframework.beans.factory.annotation.Autowired;
import org.springframework.boot.autoconfigure.SpringBootApplication;
import org.springframework.boot.test.context.SpringBootTest;
import org.springframework.web.bind.annotation.GetMapping;
import org.springframework.web.bind.annotation.RestController;
import reactor.core.publisher.Mono;

import java.net.http.HttpResponse;
import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.UUID;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.function.BooleanSupplier;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

/** A concurrency cap through the WebFlux filter over real HTTP (Netty): held until the response completes or fails. */
@SpringBootTest(classes = WebFluxConcurrencyTest.ReactiveCapApp.class, webEnvironment = SpringBootTest.WebEnvironment.RANDOM_PORT, properties = {
        "spring.main.web-application-type=reactive",
        "spring.application.name=reactive-caps",
        "ratelimit.deadline=2s",
        "ratelimit.rules.inflight.algorithm=concurrency",
        "ratelimit.rules.inflight.params=2,60000",
        "ratelimit.rules.inflight.routes=/held,/fails",
        "ratelimit.rules.inflight.key=#request.headers.getFirst('X-User')",
})
class WebFluxConcurrencyTest extends OnSharedRedis {
    static final AtomicInteger INSIDE = new AtomicInteger();
    static volatile CompletableFuture<String> gate = new CompletableFuture<>();

    @SpringBootApplication
    @RestController
    static class ReactiveCapApp {
        @GetMapping("/held")
        Mono<String> held() {
            return Mono.defer(() -> {
                INSIDE.incrementAndGet();
                return Mono.fromFuture(gate).doFinally(s -> INSIDE.decrementAndGet());
            });
        }

        @GetMapping("/fails")
        Mono<String> fails() {
            return Mono.error(new IllegalStateException("the handler failed"));
        }
    }

    @Autowired
    RateLimitService service;

    private static void eventually(String what, BooleanSupplier condition) throws InterruptedException {
        long until = System.nanoTime() + TimeUnit.SECONDS.toNanos(20);
        while (!condition.getAsBoolean()) {
            assertTrue(System.nanoTime() < until, "never: " + what);
            Thread.sleep(20);
        }
    }

    private long free(String key) {
        return service.client().withDeadline(Duration.ofSeconds(2)).concurrency(key, 2, 60_000, Request.cost(0)).remaining();
    }

    @Test
    void theFilterHoldsLeasesUntilResponsesCompleteAndAnswers429Beyond() throws Exception {
        gate = new CompletableFuture<>();
        String user = "r-" + UUID.randomUUID();
        String key = "rl:reactive-caps:inflight:" + user;
        List<CompletableFuture<HttpResponse<String>>> calls = new ArrayList<>();
        for (int i = 0; i < 6; i++) {
            calls.add(CompletableFuture.supplyAsync(() -> Http.send("GET", port, "/held", user)));
        }
        eventually("2 inside and 4 answered", () -> INSIDE.get() == 2 && calls.stream().filter(CompletableFuture::isDone).count() == 4);
        assertEquals(0, free(key));
        for (CompletableFuture<HttpResponse<String>> c : calls) {
            if (c.isDone()) {
                HttpResponse<String> denied = c.get();
                assertEquals(429, denied.statusCode());
                assertEquals("\"inflight\";q=2", denied.headers().firstValue("RateLimit-Policy").orElseThrow());
                assertTrue(denied.headers().firstValue("Retry-After").isPresent());
                assertTrue(denied.body().contains("\"violated-policies\":[\"inflight\"]"), denied.body());
            }
        }
        gate.complete("done");
        int ok = 0;
        for (CompletableFuture<HttpResponse<String>> c : calls) {
            ok += c.get(20, TimeUnit.SECONDS).statusCode() == 200 ? 1 : 0;
        }
        assertEquals(2, ok);
        eventually("every lease given back", () -> free(key) == 2);
        assertEquals(500, Http.send("GET", port, "/fails", user).statusCode());
        eventually("the failed response's lease given back", () -> free(key) == 2);
    }
}

package io.redisratelimit.spring.it;

import io.redisratelimit.client.PolicyStats;
import io.redisratelimit.spring.RateLimitService;
import org.junit.jupiter.api.Test;
import org.springframework.beans.factory.annotation.Autowired;
import org.springframework.boot.test.context.SpringBootTest;

import java.net.http.HttpResponse;
import java.time.Duration;
import java.util.function.BooleanSupplier;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

/**
 * The protection loop on route rules (the servlet interceptor): the outcomes
 * of admitted requests reach the server, and a non-core route rule
 * ({@code core=false}) at stage 1 or more answers 429 with the usual fields
 * without a call to Redis.
 */
@SpringBootTest(classes = OrderApp.class, webEnvironment = SpringBootTest.WebEnvironment.RANDOM_PORT, properties = {
        "spring.application.name=protection-route-it",
        "ratelimit.deadline=2s",
        "ratelimit.deny-cache.enabled=false",
        "ratelimit.protection.report-interval=100ms",
        "ratelimit.protection.stage-poll=100ms",
        "ratelimit.rules.bare.algorithm=fixedwindow",
        "ratelimit.rules.bare.params=1,3600000",
        "ratelimit.rules.bare.routes=/bare",
        "ratelimit.rules.bare.key=#request.getHeader('X-User')",
        "ratelimit.rules.bare.stages=30,50",
        "ratelimit.rules.bare.window=1s",
        "ratelimit.rules.bare.core=false",
})
class ProtectionRouteTest extends OnSharedRedis {
    @Autowired
    RateLimitService service;

    private static void poll(String what, Duration within, BooleanSupplier done) throws InterruptedException {
        long deadline = System.nanoTime() + within.toNanos();
        while (!done.getAsBoolean()) {
            if (System.nanoTime() > deadline) {
                throw new AssertionError("not within " + within + ": " + what);
            }
            Thread.sleep(20);
        }
    }

    @Test
    void admittedOutcomesAreReportedThenAFloodDegradesTheNonCoreRouteWithoutRedis() throws Exception {
        String policy = "protection-route-it:bare";
        String first = "u-" + System.nanoTime();
        assertEquals(200, Http.send("GET", port, "/bare", first).statusCode());
        poll("the ok outcome reported", Duration.ofSeconds(5), () -> {
            PolicyStats s = service.client().policyStats(policy).get(0);
            return s.current().ok() + s.last().ok() >= 1;
        });
        poll("stage 1 or more", Duration.ofSeconds(10), () -> {
            for (int i = 0; i < 10; i++) {
                Http.send("GET", port, "/bare", first);
            }
            return service.protection().stage(policy) >= 1;
        });
        long calls = service.limiter().stats().redisCalls();
        HttpResponse<String> r = Http.send("GET", port, "/bare", "someone-new-" + System.nanoTime());
        assertEquals(429, r.statusCode(), "a non-core route degrades: " + r.body());
        assertTrue(r.headers().firstValue("Retry-After").isPresent());
        assertTrue(r.body().contains("\"violated-policies\":[\"bare\"]"), r.body());
        assertEquals(calls, service.limiter().stats().redisCalls(), "without a call to Redis");
        poll("back to stage 0 once the flood stops", Duration.ofSeconds(10), () -> service.protection().stage(policy) == 0);
        assertEquals(200, Http.send("GET", port, "/bare", "another-" + System.nanoTime()).statusCode());
    }
}

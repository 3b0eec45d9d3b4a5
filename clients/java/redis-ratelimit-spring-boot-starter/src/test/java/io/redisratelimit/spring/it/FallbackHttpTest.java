package io.redisratelimit.spring.it;

import io.micrometer.core.instrument.MeterRegistry;
import org.junit.jupiter.api.Test;
import org.springframework.beans.factory.annotation.Autowired;
import org.springframework.boot.test.context.SpringBootTest;
import org.springframework.test.annotation.DirtiesContext;

import java.net.http.HttpResponse;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

/** Redis killed with -9 under a running app: fail-closed answers 429, only probes reach Redis, the app recovers. */
@SpringBootTest(classes = OrderApp.class, webEnvironment = SpringBootTest.WebEnvironment.RANDOM_PORT, properties = {
        "spring.application.name=fallback-it",
        "ratelimit.deadline=300ms",
        "ratelimit.fallback=fail-closed",
        "ratelimit.breaker.failures=2",
        "ratelimit.breaker.open-for=500ms",
        "ratelimit.rules.order-create.algorithm=fixedwindow",
        "ratelimit.rules.order-create.params=1000,60000",
        "ratelimit.rules.order-total.algorithm=fixedwindow",
        "ratelimit.rules.order-total.params=15000,1000",
        "ratelimit.rules.order-total.fixed-key={order}:fallback-total",
        "ratelimit.rules.quote.algorithm=sliding",
        "ratelimit.rules.quote.params=2,60000",
})
@DirtiesContext
class FallbackHttpTest extends OwnRedis {
    @Autowired
    MeterRegistry meters;

    private double meter(String name) {
        var m = meters.find(name);
        return m.functionCounter() != null ? m.functionCounter().count() : m.gauge().value();
    }

    @Test
    void failClosedDeniesWhileRedisIsDeadOnlyProbesReachItAndTheAppRecovers() throws Exception {
        assertEquals(200, Http.send("POST", port, "/api/order/create", "alice").statusCode());
        server.kill9();
        for (int i = 0; i < 3; i++) {
            HttpResponse<String> r = Http.send("POST", port, "/api/order/create", "alice");
            assertEquals(429, r.statusCode());
            assertEquals("1", r.headers().firstValue("Retry-After").orElseThrow(), "the breaker's open time, rounded up");
            assertTrue(r.body().contains("quota-exceeded"), r.body());
        }
        assertEquals(1.0, meter("ratelimit.breaker.open"));
        assertEquals("redis", meters.find("ratelimit.breaker.open").gauge().getId().getTag("breaker"));
        double calls = meter("ratelimit.redis.calls");
        long start = System.nanoTime();
        while (System.nanoTime() - start < 1_200_000_000L) {
            assertEquals(429, Http.send("POST", port, "/api/order/create", "alice").statusCode());
            Thread.sleep(5);
        }
        assertEquals(calls, meter("ratelimit.redis.calls"), "while open, no limiter call reaches Redis");
        assertTrue(meter("ratelimit.breaker.probes") >= 1, "probes do");
        server.restart();
        long deadline = System.nanoTime() + 15_000_000_000L;
        int code = 0;
        while (System.nanoTime() < deadline && code != 200) {
            code = Http.send("POST", port, "/api/order/create", "alice").statusCode();
            Thread.sleep(20);
        }
        assertEquals(200, code, "the app recovers when Redis returns");
        assertEquals(0.0, meter("ratelimit.breaker.open"));
        double denied = meters.find("ratelimit.decisions").tag("level", "fallback").tag("outcome", "denied").counters().stream()
                .mapToDouble(c -> c.count()).sum();
        assertTrue(denied >= 3, "the fallback's denials are counted: " + denied);
    }
}

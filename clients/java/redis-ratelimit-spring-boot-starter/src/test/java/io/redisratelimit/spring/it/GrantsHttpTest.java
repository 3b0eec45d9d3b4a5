package io.redisratelimit.spring.it;

import io.micrometer.core.instrument.Counter;
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
import java.util.UUID;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

/** Batched and striped rules declared in Spring properties, over real HTTP. */
@SpringBootTest(classes = OrderApp.class, webEnvironment = SpringBootTest.WebEnvironment.RANDOM_PORT, properties = {
        "spring.application.name=grants-it",
        "ratelimit.deadline=2s",
        "ratelimit.rules.order-create.algorithm=tokenbucket",
        "ratelimit.rules.order-create.params=20,1,3600000",
        "ratelimit.rules.order-total.algorithm=fixedwindow",
        "ratelimit.rules.order-total.params=15000,1000",
        "ratelimit.rules.quote.algorithm=sliding",
        "ratelimit.rules.quote.params=2,60000",
        "ratelimit.rules.search-total.algorithm=tokenbucket",
        "ratelimit.rules.search-total.params=30,1,3600000",
        "ratelimit.rules.search-total.routes=/search",
        "ratelimit.rules.search-total.global=true",
        "ratelimit.rules.search-total.batched=true",
        "ratelimit.rules.search-total.hold-ms=60000",
        "ratelimit.rules.bare-total.algorithm=fixedwindow",
        "ratelimit.rules.bare-total.routes=/bare",
        "ratelimit.rules.bare-total.global=true",
        "ratelimit.rules.bare-total.striped=3",
})
class GrantsHttpTest {
    @DynamicPropertySource
    static void redis(DynamicPropertyRegistry r) {
        RedisServer s = SharedRedis.get();
        r.add("spring.data.redis.host", () -> "127.0.0.1");
        r.add("spring.data.redis.port", s::port);
        String run = UUID.randomUUID().toString();
        r.add("ratelimit.rules.search-total.fixed-key", () -> "grants-it:search:" + run);
        r.add("ratelimit.rules.bare-total.fixed-key", () -> "grants-it:bare:" + run);
        r.add("ratelimit.rules.bare-total.params", () -> "30," + Windows.FIXED_MS);
    }

    @LocalServerPort
    int port;

    @Autowired
    MeterRegistry meters;

    private double counted(String level, String outcome) {
        return meters.find("ratelimit.decisions").tag("rule", "grants-it:search-total").tag("level", level).tag("outcome", outcome)
                .counters().stream().mapToDouble(Counter::count).sum();
    }

    @Test
    void aBatchedRuleAdmitsExactlyItsLimitMostlyFromHeldUnits() {
        int ok = 0;
        int limited = 0;
        for (int i = 0; i < 60; i++) {
            HttpResponse<String> r = Http.send("GET", port, "/search", "u");
            ok += r.statusCode() == 200 ? 1 : 0;
            if (r.statusCode() == 429) {
                limited++;
                assertTrue(r.headers().firstValue("Retry-After").isPresent(), r.headers().toString());
            }
        }
        assertEquals(30, ok, "one caller spends every unit it takes before it asks again");
        assertEquals(30, limited);
        assertTrue(counted("grant", "admitted") > 0, "admissions from held units");
        assertTrue(counted("grant", "denied") > 0, "denials until the next ask, without a round trip");
    }

    @Test
    void aStripedRuleAdmitsItsOwnStripeAndTheNextOne() {
        int ok = 0;
        for (int i = 0; i < 60; i++) {
            HttpResponse<String> r = Http.send("GET", port, "/bare", "u");
            ok += r.statusCode() == 200 ? 1 : 0;
        }
        assertEquals(20, ok, "two stripes of 10 (of 3): this instance's own and the next one");
    }
}

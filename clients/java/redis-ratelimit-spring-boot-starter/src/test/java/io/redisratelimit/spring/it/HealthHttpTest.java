package io.redisratelimit.spring.it;

import org.junit.jupiter.api.Test;
import org.springframework.boot.test.context.SpringBootTest;
import org.springframework.test.annotation.DirtiesContext;

import java.net.http.HttpResponse;
import java.time.Duration;
import java.util.UUID;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

/**
 * /actuator/health while Redis is away: the instance stays UP (its fallback
 * serves), and the limiter's own component says the fallback decides.
 */
@SpringBootTest(classes = OrderApp.class, webEnvironment = SpringBootTest.WebEnvironment.RANDOM_PORT, properties = {
        "spring.application.name=health-it",
        "ratelimit.deadline=300ms",
        "ratelimit.breaker.failures=1",
        "ratelimit.breaker.open-for=60s",
        "ratelimit.rules.order-create.algorithm=sliding",
        "ratelimit.rules.order-create.params=1000,60000",
        "ratelimit.rules.order-total.algorithm=sliding",
        "ratelimit.rules.order-total.params=1000,60000",
        "ratelimit.rules.order-total.fixed-key={order}:health-total",
        "ratelimit.rules.quote.algorithm=sliding",
        "ratelimit.rules.quote.params=2,60000",
        "management.endpoints.web.exposure.include=health",
        "management.endpoint.health.show-details=always",
})
@DirtiesContext
class HealthHttpTest extends OwnRedis {

    @Test
    void theInstanceStaysUpWhileItsFallbackServesAndSaysSo() throws Exception {
        HttpResponse<String> healthy = Http.send("GET", port, "/actuator/health", null);
        assertEquals(200, healthy.statusCode(), healthy.body());
        assertTrue(healthy.body().contains("\"rateLimit\":{\"status\":\"UP\"") && healthy.body().contains("\"decides\":\"redis\""),
                healthy.body());

        server.kill9();
        String user = "h-" + UUID.randomUUID();
        long until = System.nanoTime() + Duration.ofSeconds(20).toNanos();
        HttpResponse<String> health;
        do {
            assertTrue(System.nanoTime() < until, "the breaker opens once Redis is gone");
            assertEquals(200, Http.send("POST", port, "/api/order/create", user).statusCode(), "the fallback serves");
            health = Http.send("GET", port, "/actuator/health", null);
        } while (!health.body().contains("\"decides\":\"fallback\""));
        assertEquals(200, health.statusCode(), "UP while the fallback serves: " + health.body());
        assertTrue(health.body().startsWith("{\"status\":\"UP\""), health.body());
        assertTrue(health.body().contains("\"breaker\":\"open\"") && health.body().contains("\"fallback\":\"local-only\""), health.body());
    }
}

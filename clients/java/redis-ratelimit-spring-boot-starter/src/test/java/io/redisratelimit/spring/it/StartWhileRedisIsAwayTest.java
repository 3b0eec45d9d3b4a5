package io.redisratelimit.spring.it;

import io.redisratelimit.client.testing.RedisServer;
import io.redisratelimit.client.testing.Windows;
import io.redisratelimit.spring.RateLimitService;
import org.junit.jupiter.api.Test;
import org.springframework.boot.WebApplicationType;
import org.springframework.boot.builder.SpringApplicationBuilder;
import org.springframework.boot.web.context.WebServerApplicationContext;
import org.springframework.context.ConfigurableApplicationContext;

import java.time.Duration;
import java.util.UUID;
import java.util.function.BooleanSupplier;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

/**
 * Seed 000's promise: the local level keeps limiting when Redis is away, at
 * start-up too. The application starts with no server on its port, its
 * fallback decides; once a server with the module comes up there, the
 * policies are pushed and Redis decides again.
 */
class StartWhileRedisIsAwayTest {
    private static void poll(String what, BooleanSupplier done) throws InterruptedException {
        long until = System.nanoTime() + Duration.ofSeconds(30).toNanos();
        while (!done.getAsBoolean()) {
            assertTrue(System.nanoTime() < until, what);
            Thread.sleep(20);
        }
    }

    @Test
    void theAppStartsInTheFallbackAndPushesItsPoliciesWhenRedisComes() throws Exception {
        int redisPort = RedisServer.freePort();
        try (ConfigurableApplicationContext app = new SpringApplicationBuilder(OrderApp.class).web(WebApplicationType.SERVLET)
                .run("--server.port=0", "--spring.application.name=away-it", "--spring.data.redis.port=" + redisPort,
                        "--spring.main.banner-mode=off", "--ratelimit.deadline=500ms", "--ratelimit.deny-cache.enabled=false",
                        "--ratelimit.rules.order-create.algorithm=fixedwindow", "--ratelimit.rules.order-create.params=2," + Windows.FIXED_MS,
                        "--ratelimit.rules.order-total.algorithm=fixedwindow", "--ratelimit.rules.order-total.params=15000," + Windows.FIXED_MS,
                        "--ratelimit.rules.order-total.fixed-key={order}:away-total",
                        "--ratelimit.rules.quote.algorithm=sliding", "--ratelimit.rules.quote.params=2,60000")) {
            int port = ((WebServerApplicationContext) app).getWebServer().getPort();
            RateLimitService service = app.getBean(RateLimitService.class);
            String early = "a-" + UUID.randomUUID();
            assertEquals(200, Http.send("POST", port, "/api/order/create", early).statusCode(), "the fallback decides");
            assertTrue(service.limiter().stats().fallbackAdmitted() >= 1);

            try (RedisServer server = RedisServer.startOn(redisPort)) {
                poll("the policies are pushed once Redis answers", () -> {
                    try {
                        return server.command("RL.POLICY", "LIST").contains("away-it:order-create");
                    } catch (java.io.IOException e) {
                        return false;
                    }
                });
                String probe = "p-" + UUID.randomUUID();
                poll("Redis decides again", () -> {
                    long before = service.limiter().stats().redisAdmitted();
                    Http.send("POST", port, "/api/order/create", probe + System.nanoTime());
                    return service.limiter().stats().redisAdmitted() > before;
                });
                String user = "r-" + UUID.randomUUID();
                assertEquals(200, Http.send("POST", port, "/api/order/create", user).statusCode());
                assertEquals(200, Http.send("POST", port, "/api/order/create", user).statusCode());
                assertEquals(429, Http.send("POST", port, "/api/order/create", user).statusCode(), "Redis's limit of 2");
                // The unit the fallback admitted before Redis came is sent to it with the next call of that key.
                assertEquals(200, Http.send("POST", port, "/api/order/create", early).statusCode());
                assertEquals(429, Http.send("POST", port, "/api/order/create", early).statusCode(), "1 owed + 1 = 2");
            }
        }
    }
}

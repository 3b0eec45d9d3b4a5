package io.redisratelimit.spring.it;

import org.junit.jupiter.api.Test;
import org.springframework.boot.autoconfigure.SpringBootApplication;
import org.springframework.boot.test.context.SpringBootTest;
import org.springframework.web.bind.annotation.GetMapping;
import org.springframework.web.bind.annotation.RestController;
import reactor.core.publisher.Mono;

import java.net.http.HttpResponse;
import java.util.UUID;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

/** The WebFlux filter over real HTTP: the same 429 and fields as the servlet interceptor. */
@SpringBootTest(classes = WebFluxTest.ReactiveApp.class, webEnvironment = SpringBootTest.WebEnvironment.RANDOM_PORT, properties = {
        "spring.main.web-application-type=reactive",
        "spring.application.name=reactive-it",
        "ratelimit.deadline=2s",
        "ratelimit.rules.items.algorithm=sliding",
        "ratelimit.rules.items.params=3,60000",
        "ratelimit.rules.items.routes=/items/**",
        "ratelimit.rules.items.key=#request.headers.getFirst('X-User')",
        "ratelimit.deny-events.flush-interval=50ms",
})
class WebFluxTest extends OnSharedRedis {
    @SpringBootApplication
    @RestController
    static class ReactiveApp {
        @GetMapping("/items/list")
        Mono<String> list() {
            return Mono.just("[]");
        }
    }

    @Test
    void theFilterAdmitsTheLimitThenAnswersTheProblem() {
        String user = "w-" + UUID.randomUUID();
        for (int i = 0; i < 3; i++) {
            HttpResponse<String> r = Http.send("GET", port, "/items/list", user);
            assertEquals(200, r.statusCode());
            assertTrue(r.headers().firstValue("RateLimit").orElseThrow().startsWith("\"items\";r=" + (2 - i) + ";t="));
            assertEquals("\"items\";q=3;w=60", r.headers().firstValue("RateLimit-Policy").orElseThrow());
        }
        HttpResponse<String> denied = Http.send("GET", port, "/items/list", user);
        assertEquals(429, denied.statusCode());
        assertEquals("application/problem+json", denied.headers().firstValue("Content-Type").orElseThrow());
        assertTrue(denied.headers().firstValue("Retry-After").isPresent());
        assertTrue(denied.body().contains("\"violated-policies\":[\"items\"]"), denied.body());
        assertEquals(200, Http.send("GET", port, "/items/list", "other-" + UUID.randomUUID()).statusCode());
        // Deny events go to OrderApp's callback sink (this app's scan finds OrderApp's beans too).
        long deadline = System.nanoTime() + 10_000_000_000L;
        while (OrderApp.EVENTS.stream().noneMatch(e -> e.key().endsWith(user)) && System.nanoTime() < deadline) {
            try {
                Thread.sleep(10);
            } catch (InterruptedException ie) {
                throw new IllegalStateException(ie);
            }
        }
        io.redisratelimit.client.DenyEvent e = OrderApp.EVENTS.stream().filter(x -> x.key().endsWith(user)).findFirst()
                .orElseThrow(() -> new AssertionError("no deny event for " + user + ": " + OrderApp.EVENTS));
        assertEquals("reactive-it:items", e.rule());
        assertEquals("127.0.0.1", e.clientIp());
        assertTrue(e.userAgent() != null && e.userAgent().startsWith("Java-http-client"), e.userAgent());
    }
}

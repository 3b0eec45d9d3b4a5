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
    }
}

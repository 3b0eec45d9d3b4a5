package io.redisratelimit.example;

import io.github.resilience4j.circuitbreaker.CircuitBreaker;
import io.github.resilience4j.circuitbreaker.CircuitBreakerRegistry;
import io.redisratelimit.client.Protection;
import io.redisratelimit.client.StatsSnapshot;
import io.redisratelimit.spring.RateLimitExceededException;
import io.redisratelimit.spring.RateLimitService;
import io.redisratelimit.spring.RateLimited;
import org.springframework.boot.SpringApplication;
import org.springframework.boot.autoconfigure.SpringBootApplication;
import org.springframework.context.annotation.Bean;
import org.springframework.http.ResponseEntity;
import org.springframework.web.bind.annotation.GetMapping;
import org.springframework.web.bind.annotation.PostMapping;
import org.springframework.web.bind.annotation.RequestHeader;
import org.springframework.web.bind.annotation.RequestParam;
import org.springframework.web.bind.annotation.RestController;

import java.util.List;
import java.util.Map;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.concurrent.atomic.AtomicLong;

/**
 * Seed 000's order API on the Java kit: 5 orders per second per user (an
 * exact sliding window) and 15,000 per second in total (a token bucket whose
 * share each instance takes in process first), both in one {@code RL.ALL}.
 * The rules are in application.yml and live on the server as policies
 * {@code order-api:order-create} and {@code order-api:order-total}.
 *
 * <pre>
 * make run            # redis-server with the module on 6379
 * make example-java   # this app on 127.0.0.1:8080
 * curl -i -X POST -H 'X-User: alice' http://127.0.0.1:8080/api/order/create
 * </pre>
 *
 * <p>The protection loop: {@code /api/catalog} runs on a policy whose scale
 * falls when more than 5 % of its requests fail ({@code POST
 * /admin/failures?every=10} makes every 10th fail); {@code /api/feed} and
 * {@code /api/recommendations} share a policy with stages: at stage 1 the
 * recommendations (non-core) answer from their cache without Redis, at
 * stage 2 the "inventory" breaker is forced open. {@code GET /protection}
 * shows this instance's view.
 */
@SpringBootApplication
public class OrderApplication {
    public static void main(String[] args) {
        SpringApplication.run(OrderApplication.class, args);
    }

    /** The application's breakers: the starter forces open, at stage 2, the one a rule names ("inventory"). */
    @Bean
    CircuitBreakerRegistry circuitBreakerRegistry() {
        return CircuitBreakerRegistry.ofDefaults();
    }

    @RestController
    static class Orders {
        private final AtomicLong ids = new AtomicLong();
        private final AtomicLong served = new AtomicLong();
        private final AtomicInteger failEvery = new AtomicInteger(Integer.getInteger("example.fail-every", 0));
        private final RateLimitService rateLimit;
        private final CircuitBreakerRegistry breakers;

        Orders(RateLimitService rateLimit, CircuitBreakerRegistry breakers) {
            this.rateLimit = rateLimit;
            this.breakers = breakers;
        }

        @PostMapping("/api/order/create")
        @RateLimited(rule = {"order-create", "order-total"}, key = "#user")
        public Map<String, Object> create(@RequestHeader(name = "X-User", defaultValue = "anonymous") String user) {
            return Map.of("order", ids.incrementAndGet(), "user", user);
        }

        /** The same work without the limiter: the benchmark's baseline. */
        @PostMapping("/api/order/bare")
        public Map<String, Object> bare(@RequestHeader(name = "X-User", defaultValue = "anonymous") String user) {
            return Map.of("order", ids.incrementAndGet(), "user", user);
        }

        /**
         * The catalog: a core route on a policy that adapts to errors. Every
         * {@code failEvery}-th request fails with a 500 (the backend's fault,
         * set by {@code POST /admin/failures?every=n}; 0: never), which the
         * starter counts as an error outcome.
         */
        @GetMapping("/api/catalog")
        @RateLimited(rule = "catalog", key = "#user")
        public ResponseEntity<Map<String, Object>> catalog(@RequestHeader(name = "X-User", defaultValue = "anonymous") String user) {
            int every = failEvery.get();
            if (every > 0 && served.incrementAndGet() % every == 0) {
                return ResponseEntity.status(500).body(Map.of("error", "the backend failed"));
            }
            return ResponseEntity.ok(Map.of("items", 3, "user", user));
        }

        /**
         * The feed: a core route on the recommendations' policy (the one with
         * stages), which asks the inventory through the breaker the policy
         * names: forced open at stage 2, the feed then goes without it.
         */
        @GetMapping("/api/feed")
        @RateLimited(rule = "reco", key = "#user")
        public Map<String, Object> feed(@RequestHeader(name = "X-User", defaultValue = "anonymous") String user) {
            CircuitBreaker inventory = breakers.circuitBreaker("inventory");
            boolean inStock = inventory.tryAcquirePermission();
            if (inStock) {
                inventory.onSuccess(0, java.util.concurrent.TimeUnit.NANOSECONDS);
            }
            return Map.of("feed", List.of("a", "b"), "inventory", inStock ? "checked" : "skipped", "user", user);
        }

        /**
         * Recommendations: a non-core feature. While the policy's stage is 1
         * or more it answers from the cache without a call to Redis, and a
         * denial answers from the cache too instead of a 429.
         */
        @GetMapping("/api/recommendations")
        @RateLimited(rule = "reco", key = "#user", core = false, fallback = "cachedRecommendations")
        public Map<String, Object> recommendations(@RequestHeader(name = "X-User", defaultValue = "anonymous") String user) {
            return Map.of("recommendations", List.of("fresh-1", "fresh-2"), "source", "fresh", "user", user);
        }

        /** The degrade handler: the same parameters, then the denial; a cached (here: a default) answer. */
        Map<String, Object> cachedRecommendations(String user, RateLimitExceededException denied) {
            return Map.of("recommendations", List.of("popular-1"), "source", "cache", "rule", denied.rule());
        }

        /** The backend's fault for the demonstration and the tests: every n-th catalog request fails (0: none). */
        @PostMapping("/admin/failures")
        public Map<String, Object> failures(@RequestParam("every") int every) {
            failEvery.set(Math.max(0, every));
            return Map.of("every", failEvery.get());
        }

        /** This instance's view of the loop: each policy's stage and scale, the inventory breaker's state. */
        @GetMapping("/protection")
        public Map<String, Object> protection() {
            Protection p = rateLimit.protection();
            Map<String, Object> out = new java.util.TreeMap<>();
            for (String rule : List.of("catalog", "reco")) {
                String policy = rateLimit.rules().get(rule).rule().policy();
                out.put(rule, Map.of("stage", p.stage(policy), "scale", p.scale(policy)));
            }
            out.put("breaker", breakers.circuitBreaker("inventory").getState().name());
            out.put("reports_sent", p.reportsSent());
            out.put("reports_failed", p.reportsFailed());
            return out;
        }

        /** The kit's counters of every path. */
        @GetMapping("/stats")
        public Map<String, Long> stats() {
            StatsSnapshot s = rateLimit.limiter().stats();
            return s.pairs();
        }
    }
}

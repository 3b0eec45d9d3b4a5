package io.redisratelimit.example;

import io.redisratelimit.client.StatsSnapshot;
import io.redisratelimit.spring.RateLimitService;
import io.redisratelimit.spring.RateLimited;
import org.springframework.boot.SpringApplication;
import org.springframework.boot.autoconfigure.SpringBootApplication;
import org.springframework.web.bind.annotation.GetMapping;
import org.springframework.web.bind.annotation.PostMapping;
import org.springframework.web.bind.annotation.RequestHeader;
import org.springframework.web.bind.annotation.RestController;

import java.util.Map;
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
 */
@SpringBootApplication
public class OrderApplication {
    public static void main(String[] args) {
        SpringApplication.run(OrderApplication.class, args);
    }

    @RestController
    static class Orders {
        private final AtomicLong ids = new AtomicLong();
        private final RateLimitService rateLimit;

        Orders(RateLimitService rateLimit) {
            this.rateLimit = rateLimit;
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

        /** The kit's counters of every path. */
        @GetMapping("/stats")
        public Map<String, Long> stats() {
            StatsSnapshot s = rateLimit.limiter().stats();
            return s.pairs();
        }
    }
}

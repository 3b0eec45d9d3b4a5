package io.redisratelimit.spring.it;

import io.micrometer.core.instrument.MeterRegistry;
import io.micrometer.core.instrument.simple.SimpleMeterRegistry;
import io.redisratelimit.spring.RateLimited;
import org.springframework.boot.autoconfigure.SpringBootApplication;
import org.springframework.context.annotation.Bean;
import org.springframework.stereotype.Service;
import org.springframework.web.bind.annotation.GetMapping;
import org.springframework.web.bind.annotation.PostMapping;
import org.springframework.web.bind.annotation.RequestHeader;
import org.springframework.web.bind.annotation.RestController;

import java.util.Map;

/** The tests' application: seed 000's order API, a route-limited search, and a limited bean. */
@SpringBootApplication
public class OrderApp {
    @Bean
    MeterRegistry meterRegistry() {
        return new SimpleMeterRegistry();
    }

    /** The deny events of the tests that use this app: a callback sink keeping the last 1,000. */
    static final java.util.Deque<io.redisratelimit.client.DenyEvent> EVENTS = new java.util.concurrent.ConcurrentLinkedDeque<>();

    @Bean
    io.redisratelimit.client.DenyEventSink denyEvents() {
        return batch -> {
            EVENTS.addAll(batch);
            while (EVENTS.size() > 1_000) {
                EVENTS.pollFirst();
            }
        };
    }

    @RestController
    static class Orders {
        private final Quotes quotes;

        Orders(Quotes quotes) {
            this.quotes = quotes;
        }

        @PostMapping("/api/order/create")
        @RateLimited(rule = {"order-create", "order-total"}, key = "#user")
        public Map<String, Object> create(@RequestHeader("X-User") String user) {
            return Map.of("ok", true, "user", user);
        }

        @GetMapping("/search")
        public Map<String, Object> search() {
            return Map.of("results", 0);
        }

        /** One path, two methods: a route rule can limit one of them. */
        @org.springframework.web.bind.annotation.RequestMapping(path = "/both", method = {
                org.springframework.web.bind.annotation.RequestMethod.GET, org.springframework.web.bind.annotation.RequestMethod.POST})
        public Map<String, Object> both() {
            return Map.of("ok", true);
        }

        @GetMapping("/bare")
        public Map<String, Object> bare() {
            return Map.of("ok", true);
        }

        @GetMapping("/quote")
        public Map<String, Object> quote(@RequestHeader("X-User") String user) {
            return Map.of("price", quotes.price(user));
        }
    }

    /** A plain bean, limited by the annotation too. */
    @Service
    public static class Quotes {
        @RateLimited(rule = "quote", key = "#customer")
        public long price(String customer) {
            return 42;
        }
    }
}

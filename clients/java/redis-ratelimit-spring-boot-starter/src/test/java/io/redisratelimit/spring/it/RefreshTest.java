package io.redisratelimit.spring.it;

import io.redisratelimit.client.PolicyMode;
import io.redisratelimit.client.Spec;
import io.redisratelimit.client.testing.RedisServer;
import io.redisratelimit.client.testing.Windows;
import io.redisratelimit.spring.RateLimitService;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.Test;
import org.springframework.beans.factory.annotation.Autowired;
import org.springframework.boot.test.context.SpringBootTest;
import org.springframework.boot.test.web.server.LocalServerPort;
import org.springframework.cloud.context.environment.EnvironmentChangeEvent;
import org.springframework.context.ApplicationContextInitializer;
import org.springframework.context.ConfigurableApplicationContext;
import org.springframework.core.env.ConfigurableEnvironment;
import org.springframework.core.env.MapPropertySource;
import org.springframework.test.context.ContextConfiguration;
import org.springframework.test.context.DynamicPropertyRegistry;
import org.springframework.test.context.DynamicPropertySource;

import java.util.HashMap;
import java.util.Map;
import java.util.UUID;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertTrue;

/**
 * A property change plus a refresh event (what Spring Cloud publishes when
 * Nacos, Apollo or Consul change a value) changes the policy on the server,
 * and the next request follows it.
 */
@SpringBootTest(classes = OrderApp.class, webEnvironment = SpringBootTest.WebEnvironment.RANDOM_PORT, properties = {
        "spring.application.name=refresh-it",
        "ratelimit.deadline=2s",
        "ratelimit.deny-cache.enabled=false",
        "ratelimit.rules.order-create.algorithm=fixedwindow",
        "ratelimit.rules.order-create.params=2,60000",
        "ratelimit.rules.order-total.algorithm=fixedwindow",
        "ratelimit.rules.order-total.params=15000,1000",
        "ratelimit.rules.order-total.fixed-key={order}:refresh-total",
        "ratelimit.rules.quote.algorithm=sliding",
        "ratelimit.rules.quote.params=2,60000",
        "ratelimit.protection.report-interval=100ms",
        "ratelimit.protection.stage-poll=100ms",
})
@ContextConfiguration(initializers = RefreshTest.ConfigCentre.class)
@org.springframework.context.annotation.Import(RefreshTest.Breakers.class)
class RefreshTest {
    /** The application's breakers. */
    static class Breakers {
        @org.springframework.context.annotation.Bean
        io.github.resilience4j.circuitbreaker.CircuitBreakerRegistry circuitBreakerRegistry() {
            return io.github.resilience4j.circuitbreaker.CircuitBreakerRegistry.ofDefaults();
        }
    }

    /** Stands for the config centre: a mutable property source above the application's. */
    static class ConfigCentre implements ApplicationContextInitializer<ConfigurableApplicationContext> {
        @Override
        public void initialize(ConfigurableApplicationContext ctx) {
            Map<String, Object> m = new HashMap<>();
            m.put("ratelimit.rules.temp.algorithm", "fixedwindow");
            m.put("ratelimit.rules.temp.params", "9,1000");
            ctx.getEnvironment().getPropertySources().addFirst(new MapPropertySource("config-centre", m));
        }
    }

    @DynamicPropertySource
    static void redis(DynamicPropertyRegistry r) {
        RedisServer s = SharedRedis.get();
        r.add("spring.data.redis.port", s::port);
        // A fixed window that cannot turn over during the test (they are aligned to the epoch).
        r.add("ratelimit.rules.order-create.params", () -> "2," + Windows.FIXED_MS);
    }

    @LocalServerPort
    int port;
    @Autowired
    ConfigurableEnvironment env;
    @Autowired
    ConfigurableApplicationContext context;
    @Autowired
    RateLimitService service;
    @Autowired
    io.github.resilience4j.circuitbreaker.CircuitBreakerRegistry breakers;

    private static void poll(String what, java.time.Duration within, java.util.function.BooleanSupplier done) throws InterruptedException {
        long deadline = System.nanoTime() + within.toNanos();
        while (!done.getAsBoolean()) {
            if (System.nanoTime() > deadline) {
                throw new AssertionError("not within " + within + ": " + what);
            }
            Thread.sleep(20);
        }
    }

    @Test
    void aBreakerForcedOpenByARuleTheRefreshRemovedIsClosed() throws Exception {
        String policy = "refresh-it:staged";
        change(Map.of("ratelimit.rules.staged.algorithm", "fixedwindow", "ratelimit.rules.staged.params", "1,3600000",
                "ratelimit.rules.staged.stages", "30,50", "ratelimit.rules.staged.window", "1s",
                "ratelimit.rules.staged.breaker", "dropped"));
        poll("stage 2", java.time.Duration.ofSeconds(10), () -> {
            for (int i = 0; i < 10; i++) {
                service.client().hit(policy, "k");
            }
            return service.protection().stage(policy) == 2;
        });
        poll("the breaker forced open", java.time.Duration.ofSeconds(2), () ->
                breakers.circuitBreaker("dropped").getState() == io.github.resilience4j.circuitbreaker.CircuitBreaker.State.FORCED_OPEN);
        centre().keySet().removeIf(k -> k.startsWith("ratelimit.rules.staged"));
        context.publishEvent(new EnvironmentChangeEvent(context, java.util.Set.of("ratelimit.rules.staged.algorithm")));
        poll("the breaker closed once no rule names it", java.time.Duration.ofSeconds(2), () ->
                breakers.circuitBreaker("dropped").getState() == io.github.resilience4j.circuitbreaker.CircuitBreaker.State.CLOSED);
    }

    @SuppressWarnings("unchecked")
    private Map<String, Object> centre() {
        return (Map<String, Object>) env.getPropertySources().get("config-centre").getSource();
    }

    private void change(Map<String, Object> values) {
        centre().putAll(values);
        context.publishEvent(new EnvironmentChangeEvent(context, values.keySet()));
    }

    @AfterEach
    void reset() {
        centre().keySet().removeIf(k -> k.startsWith("ratelimit.rules.order-create"));
        context.publishEvent(new EnvironmentChangeEvent(context, java.util.Set.of("ratelimit.rules.order-create.params")));
    }

    private int post(String user) {
        return Http.send("POST", port, "/api/order/create", user).statusCode();
    }

    @Test
    void aRaisedLimitReachesTheServerAndTheNextRequestFollowsIt() {
        String user = "r-" + UUID.randomUUID();
        assertEquals(200, post(user));
        assertEquals(200, post(user));
        assertEquals(429, post(user));
        change(Map.of("ratelimit.rules.order-create.params[0]", "5", "ratelimit.rules.order-create.params[1]", String.valueOf(Windows.FIXED_MS)));
        assertEquals(Spec.fixedWindow(5, Windows.FIXED_MS), service.policy("order-create").orElseThrow().spec());
        // What was consumed carries over: 2 of 5 taken, 3 left.
        assertEquals(200, post(user));
        assertEquals(200, post(user));
        assertEquals(200, post(user));
        assertEquals(429, post(user));
    }

    @Test
    void shadowNeverDeniesAndTheKillSwitchAdmits() {
        String user = "s-" + UUID.randomUUID();
        change(Map.of("ratelimit.rules.order-create.mode", "shadow"));
        assertEquals(PolicyMode.SHADOW, service.policy("order-create").orElseThrow().mode());
        for (int i = 0; i < 6; i++) {
            assertEquals(200, post(user), "shadow mode never denies");
        }
        change(Map.of("ratelimit.rules.order-create.mode", "off"));
        assertEquals(PolicyMode.OFF, service.policy("order-create").orElseThrow().mode());
        for (int i = 0; i < 6; i++) {
            assertEquals(200, post(user), "the kill switch admits");
        }
        change(Map.of("ratelimit.rules.order-create.mode", "enforce"));
        assertEquals(429, post(user), "enforced again");
    }

    @Test
    void aRemovedRuleIsDeletedAndOnlyThisApplicationsPoliciesAreTouched() throws Exception {
        RedisServer s = SharedRedis.get();
        s.command("RL.POLICY", "SET", "someone-else:temp", "FIXEDWINDOW", "1", "1000");
        assertTrue(s.command("RL.POLICY", "LIST").contains("refresh-it:temp"));
        centre().remove("ratelimit.rules.temp.algorithm");
        centre().remove("ratelimit.rules.temp.params");
        context.publishEvent(new EnvironmentChangeEvent(context, java.util.Set.of("ratelimit.rules.temp.algorithm")));
        String list = s.command("RL.POLICY", "LIST");
        assertFalse(list.contains("refresh-it:temp"), list);
        assertTrue(list.contains("someone-else:temp"), list);
        assertTrue(list.contains("refresh-it:order-create"), list);
    }

    @Test
    void theSwitchFollowsARefresh() {
        String user = "e-" + UUID.randomUUID();
        assertEquals(200, post(user));
        assertEquals(200, post(user));
        assertEquals(429, post(user));
        try {
            change(Map.of("ratelimit.enabled", "false"));
            for (int i = 0; i < 5; i++) {
                assertEquals(200, post(user), "off: nothing is limited");
            }
        } finally {
            change(Map.of("ratelimit.enabled", "true"));
        }
        assertEquals(429, post(user), "on again");
    }

    @Test
    void aStartUpOnlySettingIsRefusedLoudlyNotIgnored() {
        try {
            change(Map.of("ratelimit.deadline", "5s", "ratelimit.breaker.failures", "9"));
            assertEquals(java.util.List.of("ratelimit.deadline: PT2S -> PT5S", "ratelimit.breaker.failures: 5 -> 9"),
                    service.settingsNotApplied());
        } finally {
            centre().remove("ratelimit.deadline");
            centre().remove("ratelimit.breaker.failures");
            context.publishEvent(new EnvironmentChangeEvent(context, java.util.Set.of("ratelimit.deadline")));
        }
        assertEquals(java.util.List.of(), service.settingsNotApplied(), "back to the running values");
    }

    @Test
    void aBadRefreshedRuleIsRefusedAndTheRunningRulesStay() {
        change(Map.of("ratelimit.rules.order-create.algorithm", "nosuch"));
        assertEquals(Spec.fixedWindow(2, Windows.FIXED_MS), service.policy("order-create").orElseThrow().spec());
        centre().remove("ratelimit.rules.order-create.algorithm");
    }
}

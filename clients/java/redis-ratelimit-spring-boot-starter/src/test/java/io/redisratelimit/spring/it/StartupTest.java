package io.redisratelimit.spring.it;

import io.redisratelimit.client.Decision;
import io.redisratelimit.client.ModuleMissingException;
import io.redisratelimit.client.testing.RedisCluster;
import io.redisratelimit.client.testing.RedisServer;
import io.redisratelimit.spring.RateLimitAutoConfiguration;
import io.redisratelimit.spring.RateLimitConfigException;
import io.redisratelimit.spring.RateLimitService;
import org.junit.jupiter.api.Test;
import org.springframework.boot.autoconfigure.AutoConfigurations;
import org.springframework.boot.test.context.runner.ApplicationContextRunner;

import java.util.UUID;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertInstanceOf;
import static org.junit.jupiter.api.Assertions.assertNotNull;
import static org.junit.jupiter.api.Assertions.assertTrue;

/** Bad configuration fails at start-up naming the property; both drivers, standalone and cluster. */
class StartupTest {
    private final ApplicationContextRunner runner = new ApplicationContextRunner()
            .withConfiguration(AutoConfigurations.of(RateLimitAutoConfiguration.class))
            .withPropertyValues("spring.data.redis.port=" + SharedRedis.get().port(), "ratelimit.app=startup-it",
                    "ratelimit.deadline=500ms");

    private static Throwable root(Throwable t) {
        while (t.getCause() != null && !(t instanceof RateLimitConfigException) && !(t instanceof ModuleMissingException)) {
            t = t.getCause();
        }
        return t;
    }

    @Test
    void anUnknownAlgorithmFailsAtStartUpNamingTheProperty() {
        runner.withPropertyValues("ratelimit.rules.order-create.algorithm=gcra", "ratelimit.rules.order-create.params=1,2")
                .run(ctx -> {
                    Throwable t = root(ctx.getStartupFailure());
                    assertInstanceOf(RateLimitConfigException.class, t);
                    assertEquals("ratelimit.rules.order-create.algorithm", ((RateLimitConfigException) t).property());
                    assertTrue(t.getMessage().contains("unknown algorithm 'gcra'"), t.getMessage());
                });
    }

    @Test
    void aZeroCapacityFailsAtStartUpNamingTheProperty() {
        runner.withPropertyValues("ratelimit.rules.order-create.algorithm=tokenbucket", "ratelimit.rules.order-create.params=0,5,1000")
                .run(ctx -> {
                    Throwable t = root(ctx.getStartupFailure());
                    assertInstanceOf(RateLimitConfigException.class, t);
                    assertEquals("ratelimit.rules.order-create.params[0]", ((RateLimitConfigException) t).property());
                    assertTrue(t.getMessage().contains("capacity"), t.getMessage());
                });
    }

    @Test
    void aWrongArityOrModeOrFallbackFailsAtStartUp() {
        runner.withPropertyValues("ratelimit.rules.x.algorithm=sliding", "ratelimit.rules.x.params=5")
                .run(ctx -> assertEquals("ratelimit.rules.x.params", ((RateLimitConfigException) root(ctx.getStartupFailure())).property()));
        runner.withPropertyValues("ratelimit.rules.x.algorithm=sliding", "ratelimit.rules.x.params=5,1000", "ratelimit.rules.x.mode=dry")
                .run(ctx -> assertEquals("ratelimit.rules.x.mode", ((RateLimitConfigException) root(ctx.getStartupFailure())).property()));
        runner.withPropertyValues("ratelimit.fallback=maybe")
                .run(ctx -> assertEquals("ratelimit.fallback", ((RateLimitConfigException) root(ctx.getStartupFailure())).property()));
    }

    @Test
    void aConcurrencyRuleIsCheckedAtStartUpAndPushedAsAPolicy() {
        runner.withPropertyValues("ratelimit.rules.cap.algorithm=concurrency", "ratelimit.rules.cap.params=0,1000")
                .run(ctx -> assertEquals("ratelimit.rules.cap.params[0]", ((RateLimitConfigException) root(ctx.getStartupFailure())).property()));
        runner.withPropertyValues("ratelimit.rules.cap.algorithm=concurrency", "ratelimit.rules.cap.params=2,1000", "ratelimit.rules.cap.global=true")
                .run(ctx -> assertEquals("ratelimit.rules.cap.global", ((RateLimitConfigException) root(ctx.getStartupFailure())).property()));
        runner.withPropertyValues("ratelimit.rules.cap.algorithm=concurrency", "ratelimit.rules.cap.params=1,60000")
                .run(ctx -> {
                    RateLimitService s = ctx.getBean(RateLimitService.class);
                    assertEquals(io.redisratelimit.client.Spec.concurrency(1, 60_000), s.policy("cap").orElseThrow().spec());
                    String who = "w-" + java.util.UUID.randomUUID();
                    try (io.redisratelimit.spring.Permit p = s.admit(java.util.List.of("cap"), who, 1)) {
                        assertTrue(p.allowed());
                        assertEquals(1, p.leases().size());
                        assertTrue(!s.admit(java.util.List.of("cap"), who, 1).allowed());
                    }
                    try (io.redisratelimit.spring.Permit again = s.admit(java.util.List.of("cap"), who, 1)) {
                        assertTrue(again.allowed(), "closing the permit gave the lease back");
                    }
                    org.junit.jupiter.api.Assertions.assertThrows(IllegalArgumentException.class,
                            () -> s.check(java.util.List.of("cap"), who, 1), "check would leak the lease");
                });
    }

    @Test
    void aServerWithoutTheModuleFailsAtStartUp() {
        try (RedisServer bare = RedisServer.startWithoutModule()) {
            runner.withPropertyValues("spring.data.redis.port=" + bare.port()).run(ctx -> {
                Throwable t = root(ctx.getStartupFailure());
                assertInstanceOf(ModuleMissingException.class, t);
            });
        }
    }

    @Test
    void jedisWorksAsTheDriver() {
        runner.withPropertyValues("ratelimit.driver=jedis", "ratelimit.rules.j.algorithm=fixedwindow", "ratelimit.rules.j.params=1,60000")
                .run(ctx -> {
                    assertNotNull(ctx.getBean(RateLimitService.class));
                    RateLimitService s = ctx.getBean(RateLimitService.class);
                    String who = UUID.randomUUID().toString();
                    assertTrue(s.check(java.util.List.of("j"), who, 1).allowed());
                    Decision d = s.check(java.util.List.of("j"), who, 1);
                    assertTrue(!d.allowed());
                    assertTrue(s.client().driver() instanceof io.redisratelimit.client.driver.JedisDriver);
                });
    }

    @Test
    void aClusterGetsThePoliciesOnEveryMasterOnBothDrivers() throws Exception {
        try (RedisCluster cluster = RedisCluster.start()) {
            String nodes = String.join(",", cluster.nodes().stream().map(n -> "127.0.0.1:" + n.port()).toList());
            for (String driver : new String[] {"lettuce", "jedis"}) {
                runner.withPropertyValues("spring.data.redis.cluster.nodes=" + nodes, "ratelimit.driver=" + driver,
                                "ratelimit.app=cluster-" + driver,
                                "ratelimit.rules.c.algorithm=fixedwindow", "ratelimit.rules.c.params=100,60000")
                        .run(ctx -> {
                            assertTrue(ctx.getStartupFailure() == null, String.valueOf(ctx.getStartupFailure()));
                            RateLimitService s = ctx.getBean(RateLimitService.class);
                            for (int i = 0; i < 30; i++) {
                                assertTrue(s.check(java.util.List.of("c"), "user" + i, 1).allowed());
                            }
                        });
                for (RedisServer n : cluster.nodes()) {
                    assertTrue(n.command("RL.POLICY", "LIST").contains("cluster-" + driver + ":c"));
                }
            }
        }
    }
}

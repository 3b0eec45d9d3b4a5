package io.redisratelimit.spring.it;

import io.redisratelimit.client.Decision;
import io.redisratelimit.client.ModuleMissingException;
import io.redisratelimit.client.testing.RedisCluster;
import io.redisratelimit.client.testing.RedisServer;
import io.redisratelimit.client.testing.Windows;
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
    void aRuleBreakerNamedAsTheLimitersOwnFailsAtStartUp() {
        // ratelimit_breaker_open{breaker="redis"} is the limiter's own breaker: a rule's breaker of that name would
        // never show on it (the first gauge registered wins), so its break would be invisible on the dashboard.
        runner.withPropertyValues("ratelimit.rules.pay.algorithm=fixedwindow", "ratelimit.rules.pay.params=10,1000",
                "ratelimit.rules.pay.stages=30,50", "ratelimit.rules.pay.breaker=redis").run(ctx -> {
                    Throwable t = root(ctx.getStartupFailure());
                    assertInstanceOf(RateLimitConfigException.class, t, String.valueOf(t));
                    assertEquals("ratelimit.rules.pay.breaker", ((RateLimitConfigException) t).property());
                });
    }

    /** A key naming a parameter the method does not have (#user on userId). */
    static class MisnamedKey {
        @io.redisratelimit.spring.RateLimited(rule = "order-create", key = "#user")
        public String create(String userId) {
            return userId;
        }
    }

    @Test
    void aKeyThatNamesNoParameterFailsAtStartUp() {
        runner.withPropertyValues("ratelimit.rules.order-create.algorithm=tokenbucket", "ratelimit.rules.order-create.params=5,5,1000")
                .withBean(MisnamedKey.class)
                .run(ctx -> {
                    Throwable t = root(ctx.getStartupFailure());
                    assertInstanceOf(RateLimitConfigException.class, t);
                    assertTrue(t.getMessage().contains("#user names no parameter") && t.getMessage().contains("MisnamedKey.create")
                            && t.getMessage().contains("[#userId]"), t.getMessage());
                });
    }

    @Test
    void aRouteKeyNamingAnythingButTheRequestFailsAtStartUp() {
        runner.withPropertyValues("ratelimit.rules.s.algorithm=sliding", "ratelimit.rules.s.params=5,1000",
                        "ratelimit.rules.s.routes=/s", "ratelimit.rules.s.key=#req.getHeader('X-User')")
                .run(ctx -> {
                    Throwable t = root(ctx.getStartupFailure());
                    assertInstanceOf(RateLimitConfigException.class, t);
                    assertEquals("ratelimit.rules.s.key", ((RateLimitConfigException) t).property());
                });
    }

    @Test
    void unquotedYamlOffIsTheKillSwitch() {
        // YAML 1.1 reads an unquoted `mode: off` as the boolean false, which reaches the binder as "false".
        runner.withPropertyValues("ratelimit.app=yaml-off-it", "ratelimit.rules.x.algorithm=sliding", "ratelimit.rules.x.params=5,1000",
                        "ratelimit.rules.x.mode=false")
                .run(ctx -> {
                    assertTrue(ctx.getStartupFailure() == null, String.valueOf(ctx.getStartupFailure()));
                    assertEquals(io.redisratelimit.client.PolicyMode.OFF,
                            ctx.getBean(RateLimitService.class).policy("x").orElseThrow().mode());
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

    private void failsAt(String property, String... rule) {
        runner.withPropertyValues(rule).run(ctx -> {
            Throwable t = root(ctx.getStartupFailure());
            assertInstanceOf(RateLimitConfigException.class, t);
            assertEquals(property, ((RateLimitConfigException) t).property(), t.getMessage());
        });
    }

    @Test
    void aQuotaRuleIsCheckedAtStartUpNamingTheProperty() {
        String a = "ratelimit.rules.q.algorithm=quota";
        failsAt("ratelimit.rules.q.period", a, "ratelimit.rules.q.params=5");
        failsAt("ratelimit.rules.q.period", a, "ratelimit.rules.q.params=5", "ratelimit.rules.q.period=fortnight");
        failsAt("ratelimit.rules.q.params[0]", a, "ratelimit.rules.q.params=0", "ratelimit.rules.q.period=day");
        failsAt("ratelimit.rules.q.params", a, "ratelimit.rules.q.params=5,1000", "ratelimit.rules.q.period=day");
        failsAt("ratelimit.rules.q.zone", a, "ratelimit.rules.q.params=5", "ratelimit.rules.q.period=day", "ratelimit.rules.q.zone=Mars Olympus");
        failsAt("ratelimit.rules.q.period", "ratelimit.rules.q.algorithm=sliding", "ratelimit.rules.q.params=5,1000",
                "ratelimit.rules.q.period=day");
    }

    @Test
    void aZonedQuotaIsAPolicyLikeTheOthersWithItsModeAndRollout() throws InterruptedException {
        Windows.awayFromMidnight();
        runner.withPropertyValues("ratelimit.app=quota-it", "ratelimit.rules.daily.algorithm=quota", "ratelimit.rules.daily.params=2",
                        "ratelimit.rules.daily.period=Day", "ratelimit.rules.paris.algorithm=quota", "ratelimit.rules.paris.params=1",
                        "ratelimit.rules.paris.period=month", "ratelimit.rules.paris.zone=Europe/Paris",
                        "ratelimit.rules.tokyo.algorithm=quota", "ratelimit.rules.tokyo.params=1", "ratelimit.rules.tokyo.period=week",
                        "ratelimit.rules.tokyo.zone=Asia/Tokyo", "ratelimit.rules.tokyo.mode=shadow", "ratelimit.rules.tokyo.rollout=30")
                .run(ctx -> {
                    assertTrue(ctx.getStartupFailure() == null, String.valueOf(ctx.getStartupFailure()));
                    RateLimitService s = ctx.getBean(RateLimitService.class);
                    assertEquals(io.redisratelimit.client.Spec.quota(2, io.redisratelimit.client.Period.DAY),
                            s.policy("daily").orElseThrow().spec());
                    io.redisratelimit.client.PolicyInfo paris = s.policy("paris").orElseThrow();
                    assertEquals(io.redisratelimit.client.Spec.quota(1, io.redisratelimit.client.Period.MONTH, "Europe/Paris"), paris.spec());
                    assertEquals("Europe/Paris", paris.zone());
                    io.redisratelimit.client.PolicyInfo tokyo = s.policy("tokyo").orElseThrow();
                    assertEquals("Asia/Tokyo", tokyo.zone());
                    assertEquals(io.redisratelimit.client.PolicyMode.SHADOW, tokyo.mode());
                    assertEquals(30, tokyo.rollout());
                    String list = SharedRedis.get().command("RL.POLICY", "LIST");
                    assertTrue(list.contains("quota-it:daily") && list.contains("quota-it:paris") && list.contains("quota-it:tokyo"), list);
                    String who = "q-" + UUID.randomUUID();
                    assertTrue(s.check(java.util.List.of("daily"), who, 1).allowed());
                    assertTrue(s.check(java.util.List.of("daily"), who, 1).allowed());
                    Decision no = s.check(java.util.List.of("daily"), who, 1);
                    assertTrue(!no.allowed());
                    assertTrue(no.waitMs() > 0 && no.waitMs() <= 86_400_000L, no.toString());
                    assertTrue(s.check(java.util.List.of("paris"), who, 1).allowed());
                    assertTrue(!s.check(java.util.List.of("paris"), who, 1).allowed());
                    assertTrue(SharedRedis.get().command("EXISTS", "rl:quota-it:paris:" + who).contains("1"), "keyed rl:<app>:<rule>:<identity>");
                    assertTrue(s.check(java.util.List.of("tokyo"), who, 1).allowed());
                    assertTrue(s.check(java.util.List.of("tokyo"), who, 1).allowed(), "shadow never denies");
                    // A zoned quota shares a check with other rules: one RL.ALL of their policies.
                    String other = "q-" + UUID.randomUUID();
                    assertTrue(s.check(java.util.List.of("paris", "daily"), other, 1).allowed());
                    Decision both = s.check(java.util.List.of("paris", "daily"), other, 1);
                    assertTrue(!both.allowed());
                    long toParisMonth = java.time.LocalDate.now(java.time.ZoneId.of("Europe/Paris")).withDayOfMonth(1).plusMonths(1)
                            .atStartOfDay(java.time.ZoneId.of("Europe/Paris")).toInstant().toEpochMilli() - System.currentTimeMillis();
                    assertTrue(Math.abs(both.waitMs() - toParisMonth) < 5_000, "until the next month in Paris: " + both);
                });
    }

    @Test
    void aServerWithoutTheModuleFailsAtStartUp() {
        try (RedisServer bare = RedisServer.startWithoutModule()) {
            runner.withPropertyValues("spring.data.redis.port=" + bare.port()).run(ctx -> {
                Throwable t = root(ctx.getStartupFailure());
                assertInstanceOf(ModuleMissingException.class, t);
                assertTrue(t.getMessage().contains(":" + bare.port() + ": "), "names the server: " + t.getMessage());
                org.springframework.boot.diagnostics.FailureAnalysis a = new io.redisratelimit.spring.RateLimitFailureAnalyzer()
                        .analyze(ctx.getStartupFailure());
                assertTrue(a != null && a.getDescription().contains(":" + bare.port()) && a.getAction().contains("loadmodule"),
                        "Spring Boot's failure report, on top: " + (a == null ? null : a.getDescription()));
            });
        }
    }

    @Test
    void jedisWorksAsTheDriver() {
        runner.withPropertyValues("ratelimit.driver=jedis", "ratelimit.rules.j.algorithm=fixedwindow", "ratelimit.rules.j.params=1," + Windows.FIXED_MS)
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

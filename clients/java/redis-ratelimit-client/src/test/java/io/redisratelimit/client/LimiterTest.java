package io.redisratelimit.client;

import io.redisratelimit.client.testing.RedisServer;
import io.redisratelimit.client.testing.Windows;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.BeforeEach;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.params.ParameterizedTest;
import org.junit.jupiter.params.provider.EnumSource;

import java.time.Duration;
import java.util.UUID;
import java.util.function.BooleanSupplier;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertTrue;

/** The two levels, the deny cache and the fallback with its breaker, against a real server killed with -9. */
class LimiterTest {
    private RedisServer server;
    private Client client;

    @BeforeEach
    void start() {
        server = RedisServer.start();
    }

    @AfterEach
    void stop() {
        if (client != null) {
            client.close();
        }
        server.close();
    }

    private Client client(Drivers d) {
        client = Client.connect(d.standalone(server), Duration.ofMillis(500));
        return client;
    }

    private static void poll(String what, Duration within, BooleanSupplier done) throws InterruptedException {
        long deadline = System.nanoTime() + within.toNanos();
        while (!done.getAsBoolean()) {
            if (System.nanoTime() > deadline) {
                throw new AssertionError("not within " + within + ": " + what);
            }
            Thread.sleep(10);
        }
    }

    @Test
    void theLocalShareIsTotalOverInstancesTimesElevenTenthsRoundedUp() {
        assertEquals(825, Share.instances(20).of(15_000));
        assertEquals(6, Share.instances(2).of(10));
        assertEquals(1, Share.instances(1000).of(5));
        assertEquals(5, Share.instances(1).of(5), "at most the limit: one instance takes it whole");
        assertEquals(Spec.tokenBucket(6, 3, 1000), Spec.tokenBucket(10, 5, 1000).share(Share.instances(2)));
    }

    @Test
    void theLocalLevelDeniesAboveTheSharesAndItsDenialsNeverReachRedis() {
        Limiter limiter = Limiter.builder(client(Drivers.LETTUCE)).instances(2).denyCache(false).build();
        String total = "rl:total:" + UUID.randomUUID();
        RuleSet rules = limiter.rules(Rule.of("total", Spec.fixedWindow(10, Windows.FIXED_MS)).fixedKey(total).asGlobal());
        int admitted = 0;
        for (int i = 0; i < 100; i++) {
            Decision d = limiter.check(rules, "anyone");
            admitted += d.allowed() ? 1 : 0;
            if (!d.allowed()) {
                assertEquals(Path.LOCAL, d.path());
                assertEquals(10, d.limit(), "the global limit, not the share");
            }
        }
        assertEquals(6, admitted, "ceil(10 / 2 * 1.1)");
        StatsSnapshot s = limiter.stats();
        assertEquals(6, s.redisCalls());
        assertEquals(94, s.localDenied());
        assertEquals(4, client.limit(total, Spec.fixedWindow(10, Windows.FIXED_MS), Request.cost(0)).remaining());
    }

    @Test
    void bothLevelsMustAdmit() {
        Limiter limiter = Limiter.builder(client(Drivers.LETTUCE)).instances(1).denyCache(false).build();
        String total = "rl:total:" + UUID.randomUUID();
        // Another instance already took 9 of the 10.
        client.limit(total, Spec.fixedWindow(10, Windows.FIXED_MS), Request.cost(9));
        RuleSet rules = limiter.rules(Rule.of("total", Spec.fixedWindow(10, Windows.FIXED_MS)).fixedKey(total).asGlobal());
        assertTrue(limiter.check(rules, "x").allowed());
        Decision d = limiter.check(rules, "x");
        assertFalse(d.allowed());
        assertEquals(Path.REDIS, d.path(), "the local share (10) admits; Redis denies");
    }

    @Test
    void aRequestRedisDeniesDoesNotSpendTheLocalShare() {
        Limiter limiter = Limiter.builder(client(Drivers.LETTUCE)).instances(1).denyCache(false).build();
        String tag = "{" + UUID.randomUUID() + "}";
        RuleSet rules = limiter.rules(
                Rule.of("per-user", Spec.fixedWindow(1, Windows.FIXED_MS)).keyPrefix(tag + ":user:"),
                Rule.of("total", Spec.fixedWindow(10, Windows.FIXED_MS)).fixedKey(tag + ":total").asGlobal());
        assertTrue(limiter.check(rules, "evil").allowed());
        for (int i = 0; i < 50; i++) {
            Decision d = limiter.check(rules, "evil");
            assertFalse(d.allowed());
            assertEquals(Path.REDIS, d.path());
            assertEquals(0, d.deniedBy().getAsInt(), "the user's own limit");
        }
        int others = 0;
        for (int i = 0; i < 9; i++) {
            others += limiter.check(rules, "user" + i).allowed() ? 1 : 0;
        }
        assertEquals(9, others, "the local share (10) was not spent on evil's denied requests");
        assertEquals(0, limiter.stats().localDenied());
    }

    @Test
    void theDenyCacheAnswersWithoutARoundTripForMinOfWaitAndMax() throws Exception {
        Limiter limiter = Limiter.builder(client(Drivers.LETTUCE)).denyCacheMax(Duration.ofMillis(300)).build();
        RuleSet rules = limiter.rules(Rule.of("per-user", Spec.tokenBucket(1, 1, 60_000)));
        assertTrue(limiter.check(rules, "u1").allowed());
        Decision denied = limiter.check(rules, "u1");
        assertFalse(denied.allowed());
        assertEquals(Path.REDIS, denied.path());
        for (int i = 0; i < 50; i++) {
            Decision d = limiter.check(rules, "u1");
            assertFalse(d.allowed());
            assertEquals(Path.DENY_CACHE, d.path());
            assertTrue(d.waitMs() > 0);
        }
        assertTrue(limiter.check(rules, "u2").allowed(), "another key is not cached");
        assertEquals(3, limiter.stats().redisCalls());
        assertEquals(50, limiter.stats().denyCacheHits());
        poll("the entry expires after max, not after the 60 s wait", Duration.ofSeconds(3),
                () -> limiter.check(rules, "u1").path() == Path.REDIS);
    }

    /**
     * An RL.ALL denial waits for the slowest limiter that denied, not for the one it names first:
     * it is cached for its rules and keys together, so another identity, which shares the fast
     * rule's key, passes once that rule admits again.
     */
    @Test
    void anRlAllDenialIsCachedForItsSetOnly() throws Exception {
        Client c = client(Drivers.LETTUCE);
        Limiter limiter = Limiter.builder(c).denyCacheMax(Duration.ofSeconds(60)).build();
        RuleSet rules = limiter.rules(
                Rule.of("fast", Spec.sliding(1, 300)).fixedKey("dc:f"),
                Rule.of("slow", Spec.sliding(1, 60_000)).keyPrefix("dc:s:"));
        assertTrue(limiter.check(rules, "a").allowed());
        Decision denied = limiter.check(rules, "a");
        assertFalse(denied.allowed());
        assertEquals(Path.REDIS, denied.path());
        assertTrue(denied.waitMs() > 50_000, "the slow rule's wait");
        assertEquals(Path.DENY_CACHE, limiter.check(rules, "a").path());
        poll("the fast rule admits again", Duration.ofSeconds(10),
                () -> c.limit("dc:f", Spec.sliding(1, 300), Request.cost(0)).remaining() == 1);
        Decision b = limiter.check(rules, "b");
        assertTrue(b.allowed(), "another identity: " + b);
        assertEquals(Path.REDIS, b.path());
    }

    @ParameterizedTest
    @EnumSource(value = Drivers.class, names = {"LETTUCE", "JEDIS"})
    void redisKilledMidRunOpensTheBreakerThenOnlyProbesReachItAndItRecovers(Drivers driver) throws Exception {
        Duration openFor = Duration.ofMillis(300);
        Limiter limiter = Limiter.builder(client(driver)).fallback(FallbackMode.FAIL_OPEN)
                .breaker(5, openFor).deadline(Duration.ofMillis(200)).build();
        RuleSet rules = limiter.rules(Rule.of("per-user", Spec.fixedWindow(1_000_000, Windows.FIXED_MS)));
        for (int i = 0; i < 20; i++) {
            assertEquals(Path.REDIS, limiter.check(rules, "u").path());
        }
        server.kill9();
        int fallback = 0;
        for (int i = 0; i < 5; i++) {
            Decision d = limiter.check(rules, "u");
            assertTrue(d.allowed(), "fail-open admits");
            fallback += d.path() == Path.FALLBACK ? 1 : 0;
        }
        assertEquals(5, fallback);
        assertTrue(limiter.breakerOpen(), "5 failures opened it");
        StatsSnapshot opened = limiter.stats();
        assertEquals(1, opened.breakerOpened());
        long start = System.nanoTime();
        int during = 0;
        while (System.nanoTime() - start < 1_000_000_000L) {
            assertEquals(Path.FALLBACK, limiter.check(rules, "u").path());
            during++;
            Thread.sleep(1);
        }
        StatsSnapshot open = limiter.stats();
        assertEquals(opened.redisCalls(), open.redisCalls(), "no limiter call reaches Redis while the breaker is open");
        long probes = open.probes() - opened.probes();
        assertTrue(probes >= 1 && probes <= 1000 / openFor.toMillis() + 1, "about one probe per open period: " + probes);
        assertEquals(during, open.breakerSkipped() - opened.breakerSkipped());
        assertEquals(0, open.probesOk());

        server.restart();
        poll("a probe finds Redis back and closes the breaker", Duration.ofSeconds(15), () -> {
            limiter.check(rules, "u");
            return !limiter.breakerOpen();
        });
        poll("limiter calls reach Redis again", Duration.ofSeconds(5), () -> limiter.check(rules, "u").path() == Path.REDIS);
        assertTrue(limiter.stats().probesOk() >= 1);
    }

    @Test
    void failClosedDeniesWhileRedisIsDown() throws Exception {
        Limiter limiter = Limiter.builder(client(Drivers.LETTUCE)).fallback(FallbackMode.FAIL_CLOSED)
                .breaker(2, Duration.ofSeconds(1)).build();
        RuleSet rules = limiter.rules(Rule.of("login", Spec.fixedWindow(100, Windows.FIXED_MS)));
        assertTrue(limiter.check(rules, "u").allowed());
        server.kill9();
        for (int i = 0; i < 10; i++) {
            Decision d = limiter.check(rules, "u");
            assertFalse(d.allowed());
            assertEquals(Path.FALLBACK, d.path());
            assertEquals(1000, d.waitMs(), "retry after the breaker's open time");
        }
        assertEquals(10, limiter.stats().fallbackDenied());
    }

    @Test
    void localOnlyLimitsEachRuleAtTheInstancesShareWhileRedisIsDown() throws Exception {
        Limiter limiter = Limiter.builder(client(Drivers.LETTUCE)).fallback(FallbackMode.LOCAL_ONLY).instances(4)
                .breaker(1, Duration.ofSeconds(5)).build();
        RuleSet rules = limiter.rules(Rule.of("per-user", Spec.fixedWindow(20, Windows.FIXED_MS)));
        server.kill9();
        int admitted = 0;
        for (int i = 0; i < 30; i++) {
            Decision d = limiter.check(rules, "u");
            assertEquals(Path.FALLBACK, d.path());
            admitted += d.allowed() ? 1 : 0;
        }
        assertEquals(Share.instances(4).of(20), admitted, "ceil(20 / 4 * 1.1) = 6");
    }

    @Test
    void theFallbacksAdmissionsCarryTheFieldsOfTheAccountThatAdmitted() throws Exception {
        Limiter limiter = Limiter.builder(client(Drivers.LETTUCE)).fallback(FallbackMode.LOCAL_ONLY).instances(2)
                .breaker(1, Duration.ofSeconds(5)).build();
        RuleSet rules = limiter.rules(Rule.of("per-user", Spec.fixedWindow(5, Windows.FIXED_MS)));
        server.kill9();
        long share = Share.instances(2).of(5);
        assertEquals(3, share, "ceil(5 / 2 * 1.1)");
        for (long left = share - 1; left >= 0; left--) {
            Decision d = limiter.check(rules, "u");
            assertEquals(Path.FALLBACK, d.path());
            assertTrue(d.allowed());
            assertEquals(5, d.limit(), "the rule's limit");
            assertEquals(left, d.remaining(), "what the account has left, not a full quota");
            assertTrue(d.resetMs() > 0, "the account's window ends: " + d);
        }
        assertFalse(limiter.check(rules, "u").allowed());
    }

    @Test
    void theDefaultDeadlineIsOneAHealthyRedisMeetsOnALoadedHost() {
        assertEquals(Duration.ofMillis(100), Client.DEFAULT_DEADLINE);
    }

    @Test
    void aLimiterCallIsNeverRetried() throws Exception {
        Limiter limiter = Limiter.builder(client(Drivers.LETTUCE)).fallback(FallbackMode.FAIL_OPEN)
                .deadline(Duration.ofMillis(50)).build();
        String user = UUID.randomUUID().toString();
        RuleSet rules = limiter.rules(Rule.of("per-user", Spec.fixedWindow(10, Windows.FIXED_MS)).keyPrefix("rl:retry:"));
        server.command("CLIENT", "PAUSE", "300", "WRITE");
        Decision d = limiter.check(rules, user);
        assertEquals(Path.FALLBACK, d.path());
        assertEquals(1, limiter.stats().redisTimeouts());
        poll("the pause ends", Duration.ofSeconds(3), () -> client.limit("rl:retry:" + user, Spec.fixedWindow(10, Windows.FIXED_MS), Request.cost(0)).remaining() < 10);
        Thread.sleep(200);
        assertEquals(9, client.limit("rl:retry:" + user, Spec.fixedWindow(10, Windows.FIXED_MS), Request.cost(0)).remaining(),
                "the late call counted once");
    }
}

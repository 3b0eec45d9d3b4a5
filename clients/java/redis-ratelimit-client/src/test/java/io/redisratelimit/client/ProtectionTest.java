package io.redisratelimit.client;

import io.redisratelimit.client.testing.RedisServer;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.Test;

import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.CopyOnWriteArrayList;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.Future;
import java.util.concurrent.atomic.AtomicLong;
import java.util.function.BooleanSupplier;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

/**
 * {@link Protection} against real servers: the counters, the reports to
 * every master, the highest stage of several masters, the stage hold and
 * lost reports (run by hand: {@link Protection.Builder#manual()}).
 */
class ProtectionTest {
    private final List<AutoCloseable> open = new ArrayList<>();

    @AfterEach
    void stop() throws Exception {
        for (int i = open.size() - 1; i >= 0; i--) {
            open.get(i).close();
        }
    }

    private RedisServer server() {
        RedisServer s = RedisServer.start();
        open.add(s);
        return s;
    }

    private Client client(RedisServer s) {
        Client c = Client.connect(Drivers.LETTUCE.standalone(s), Duration.ofMillis(500));
        open.add(c);
        return c;
    }

    private static void poll(String what, Duration within, BooleanSupplier done) throws InterruptedException {
        long deadline = System.nanoTime() + within.toNanos();
        while (!done.getAsBoolean()) {
            if (System.nanoTime() > deadline) {
                throw new AssertionError("not within " + within + ": " + what);
            }
            Thread.sleep(20);
        }
    }

    @Test
    void countsFromManyThreadsReachEveryMasterOnceAndAreThenForgotten() throws Exception {
        RedisServer a = server();
        RedisServer b = server();
        Client ca = client(a);
        Client cb = client(b);
        for (Client c : List.of(ca, cb)) {
            c.policySet("orders", Spec.tokenBucket(100, 100, 1000), PolicyMode.ENFORCE, 100,
                    PolicyLoop.adapt(5).window(Duration.ofMinutes(10)));
        }
        try (Protection p = Protection.builder(List.of(ca, cb)).policies(List.of("orders")).manual().build()) {
            ExecutorService pool = Executors.newFixedThreadPool(8);
            List<Future<?>> done = new ArrayList<>();
            for (int t = 0; t < 8; t++) {
                done.add(pool.submit(() -> {
                    for (int i = 0; i < 1000; i++) {
                        p.record("orders", i % 10 == 9);
                    }
                }));
            }
            for (Future<?> f : done) {
                f.get();
            }
            pool.shutdown();
            p.record("not-watched", true);
            assertArrayEquals(new long[] {7200, 800, 0}, p.pending("orders"));
            p.report();
            assertArrayEquals(new long[] {0, 0, 0}, p.pending("orders"));
            assertEquals(2, p.reportsSent(), "one report per master");
            for (Client c : List.of(ca, cb)) {
                PolicyStats s = c.policyStats("orders").get(0);
                assertEquals(7200, s.current().ok());
                assertEquals(800, s.current().errors());
                assertEquals(100, s.current().errorPermille());
            }
            p.report();
            assertEquals(2, p.reportsSent(), "nothing counted, nothing sent");
        }
    }

    /** Floods a policy of capacity 1 on {@code c} so that its window's deny ratio is 90 %. */
    private static void flood(Client c, String policy) {
        for (int i = 0; i < 10; i++) {
            c.hit(policy, "k");
        }
    }

    @Test
    void theHighestStageAndTheLowestScaleOfTwoMastersWin() throws Exception {
        RedisServer a = server();
        RedisServer b = server();
        Client ca = client(a);
        Client cb = client(b);
        for (Client c : List.of(ca, cb)) {
            c.policySet("p", Spec.tokenBucket(1, 1, 3_600_000), PolicyMode.ENFORCE, 100,
                    PolicyLoop.staged(30, 50).window(Duration.ofMillis(200)));
        }
        ca.policyScale("p", 60);
        List<Integer> told = new CopyOnWriteArrayList<>();
        try (Protection p = Protection.builder(List.of(ca, cb)).policies(List.of("p")).manual()
                .listener((policy, stage) -> told.add(stage)).build()) {
            p.poll();
            assertEquals(0, p.stage("p"));
            assertEquals(60, p.scale("p"), "the lowest scale");
            flood(cb, "p");
            poll("stage 2 read from b", Duration.ofSeconds(5), () -> {
                p.poll();
                return p.stage("p") == 2;
            });
            assertEquals(0, ca.policyStats("p").get(0).stage(), "a saw no flood");
            assertEquals(List.of(2), told);
        }
    }

    @Test
    void withNoReadForTheStageHoldTheStageFallsBackToZero() throws Exception {
        RedisServer s = server();
        Client c = client(s);
        c.policySet("p", Spec.tokenBucket(1, 1, 3_600_000), PolicyMode.ENFORCE, 100,
                PolicyLoop.staged(30, 50).window(Duration.ofMillis(200)));
        AtomicLong now = new AtomicLong(1_000_000_000L);
        List<Integer> told = new CopyOnWriteArrayList<>();
        try (Protection p = Protection.builder(c).policies(List.of("p")).manual().clock(now::get)
                .listener((policy, stage) -> told.add(stage)).build()) {
            flood(c, "p");
            poll("stage 2", Duration.ofSeconds(5), () -> {
                p.poll();
                return p.stage("p") == 2;
            });
            s.kill9();
            now.addAndGet(Duration.ofMillis(4900).toNanos());
            p.poll();
            assertEquals(2, p.stage("p"), "held: the last read is 4.9 s old");
            now.addAndGet(Duration.ofMillis(200).toNanos());
            p.poll();
            assertEquals(0, p.stage("p"), "5.1 s without a read: back to 0");
            // A flood that straddles the 200 ms windows of a loaded host climbs through stage 1 first.
            assertEquals(List.of(2, 0), told.subList(Math.max(0, told.size() - 2), told.size()), told.toString());
            assertTrue(told.subList(0, told.size() - 2).stream().allMatch(st -> st == 1), told.toString());
        }
    }

    @Test
    void theLocalLevelOfAGlobalPolicyRuleRunsAtTheScaleLastRead() throws Exception {
        RedisServer s = server();
        Client c = client(s);
        c.policySet("g", Spec.tokenBucket(10, 10, 3_600_000), PolicyMode.ENFORCE, 100, PolicyLoop.adapt(5));
        c.policyScale("g", 50);
        try (Protection p = Protection.builder(c).policies(List.of("g")).manual().build();
             Limiter limiter = Limiter.builder(c).instances(1).denyCache(false).build()) {
            RuleSet rules = limiter.rules(Rule.policy("g", "g", Spec.tokenBucket(10, 10, 3_600_000)).asGlobal());
            limiter.scaleLocalLevel(p::scale);
            p.poll();
            assertEquals(50, p.scale("g"));
            for (int i = 0; i < 5; i++) {
                assertEquals(true, limiter.check(rules, "k").allowed(), "admitted " + i);
            }
            Decision sixth = limiter.check(rules, "k");
            assertEquals(false, sixth.allowed());
            assertEquals(Path.LOCAL, sixth.path(), "denied in process: 5 of 10 at 50 %");
            assertEquals(Spec.tokenBucket(5, 5, 3_600_000), Spec.tokenBucket(10, 10, 3_600_000).scaled(50));
            assertEquals(Spec.fixedWindow(1, 1000), Spec.fixedWindow(1, 1000).scaled(1));
        }
    }

    @Test
    void aFailedReportLosesItsCountsAndIsNeverRetried() throws Exception {
        RedisServer s = server();
        Client c = client(s);
        try (Protection p = Protection.builder(c).policies(List.of("p")).manual().build()) {
            s.kill9();
            for (int i = 0; i < 100; i++) {
                p.recordOk("p");
            }
            p.recordDenied("p", 7);
            p.report();
            assertEquals(1, p.reportsFailed());
            assertEquals(107, p.countsLost(), "the local denials are lost with the report");
            assertArrayEquals(new long[] {0, 0, 0}, p.pending("p"), "no backlog");
            s.restart();
            s.command("RL.POLICY", "SET", "p", "TOKENBUCKET", "10", "10", "1000", "ADAPT", "ERRORS", "5", "WINDOW", "600000");
            poll("the client reconnected", Duration.ofSeconds(10), () -> {
                try {
                    c.policyStats("p");
                    return true;
                } catch (RateLimitException e) {
                    return false;
                }
            });
            for (int i = 0; i < 5; i++) {
                p.recordError("p");
            }
            p.report();
            PolicyStats stats = c.policyStats("p").get(0);
            assertEquals(0, stats.current().ok(), "the lost 100 were not sent again");
            assertEquals(5, stats.current().errors());
            assertEquals(0, stats.current().calls(), "nor the lost 7 local denials");
        }
    }

    /** The arguments of every RL.OUTCOME the server ran, from its slow log (every command logged). */
    private static List<String> outcomes(RedisServer s) throws Exception {
        String log = s.command("SLOWLOG", "GET", "1000");
        List<String> out = new ArrayList<>();
        String[] words = log.split(" ");
        for (int i = 0; i < words.length; i++) {
            if (words[i].equals("RL.OUTCOME")) {
                StringBuilder b = new StringBuilder("RL.OUTCOME");
                // name ok errors, then DENIED n when sent (the client's address follows otherwise).
                int end = i + 4 < words.length && words[i + 4].equals("DENIED") ? i + 6 : i + 4;
                for (int j = i + 1; j < end; j++) {
                    b.append(' ').append(words[j]);
                }
                out.add(b.toString());
            }
        }
        java.util.Collections.reverse(out);
        return out;
    }

    @Test
    void denialsTheLimiterAnsweredWithoutTheServerAreReportedAsDeniedAndMoveTheStage() throws Exception {
        RedisServer s = server();
        Client c = client(s);
        c.policySet("p", Spec.fixedWindow(2, 3_600_000), PolicyMode.ENFORCE, 100,
                PolicyLoop.staged(30, 50).window(Duration.ofMillis(2000)));
        try (Protection p = Protection.builder(c).policies(List.of("p")).manual().build();
             Limiter limiter = Limiter.builder(c).instances(1).denyCacheMax(Duration.ofMinutes(1)).build()) {
            limiter.reportLocalDenials(p);
            RuleSet rules = limiter.rules(Rule.policy("p", "p", Spec.fixedWindow(2, 3_600_000)));
            // A window with a second or more to go, so that all ten calls fall in it (an RL.OUTCOME
            // of nothing is a call: it rolls an ended window).
            poll("a fresh window", Duration.ofSeconds(5), () -> {
                PolicyStats st = c.outcomeAsync("p", 0, 0).toCompletableFuture().join().get(0);
                return st.windowEndMs() - System.currentTimeMillis() > 1000;
            });
            s.command("CONFIG", "SET", "slowlog-log-slower-than", "0");
            s.command("CONFIG", "SET", "slowlog-max-len", "1000");
            s.command("SLOWLOG", "RESET");
            List<Path> paths = new ArrayList<>();
            for (int i = 0; i < 10; i++) {
                paths.add(limiter.check(rules, "k").path());
            }
            assertEquals(List.of(Path.REDIS, Path.REDIS, Path.REDIS, Path.DENY_CACHE, Path.DENY_CACHE, Path.DENY_CACHE,
                    Path.DENY_CACHE, Path.DENY_CACHE, Path.DENY_CACHE, Path.DENY_CACHE), paths);
            assertArrayEquals(new long[] {0, 0, 7}, p.pending("p"), "the deny cache's 7");
            PolicyStats before = c.policyStats("p").get(0);
            assertEquals(3, before.current().calls(), "the server saw 3 of the 10");
            p.report();
            assertArrayEquals(new long[] {0, 0, 0}, p.pending("p"));
            PolicyStats after = c.policyStats("p").get(0);
            assertEquals(10, after.current().calls());
            assertEquals(8, after.current().denied(), "80 % denied, as the flood was");
            p.recordOk("p");
            p.report();
            assertEquals(List.of("RL.OUTCOME p 0 0 DENIED 7", "RL.OUTCOME p 1 0"), outcomes(s),
                    "DENIED only when some were denied locally");
            poll("stage 2 from a flood the deny cache answered", Duration.ofSeconds(5), () -> {
                limiter.check(rules, "k");
                p.report();
                p.poll();
                return p.stage("p") == 2;
            });
            p.report();
        }
    }

    @Test
    void denialsOfTheLocalLevelOfAGlobalPolicyRuleAreCountedNotThoseOfOtherRules() throws Exception {
        RedisServer s = server();
        Client c = client(s);
        c.policySet("g", Spec.tokenBucket(5, 5, 3_600_000), PolicyMode.ENFORCE, 100,
                PolicyLoop.staged(30, 50).window(Duration.ofMinutes(10)));
        try (Protection p = Protection.builder(c).policies(List.of("g")).manual().build();
             Limiter limiter = Limiter.builder(c).instances(1).denyCache(false).build()) {
            limiter.reportLocalDenials(p);
            RuleSet global = limiter.rules(Rule.policy("g", "g", Spec.tokenBucket(5, 5, 3_600_000)).asGlobal());
            RuleSet plain = limiter.rules(Rule.of("plain", Spec.tokenBucket(1, 1, 3_600_000)));
            for (int i = 0; i < 8; i++) {
                Decision d = limiter.check(global, "k");
                assertEquals(i < 5 ? Path.REDIS : Path.LOCAL, d.path(), "call " + i);
            }
            for (int i = 0; i < 3; i++) {
                limiter.check(plain, "k");
            }
            p.recordDenied("not-watched", 4);
            assertArrayEquals(new long[] {0, 0, 3}, p.pending("g"), "3 local-level denials; a rule without a policy counts none");
            p.report();
            PolicyStats st = c.policyStats("g").get(0);
            assertEquals(8, st.current().calls());
            assertEquals(3, st.current().denied());
        }
    }

    @Test
    void closingTheLoopTellsItsListenersStageZeroSoNothingStaysForced() throws Exception {
        RedisServer s = server();
        Client c = client(s);
        c.policySet("p", Spec.tokenBucket(1, 1, 3_600_000), PolicyMode.ENFORCE, 100,
                PolicyLoop.staged(30, 50).window(Duration.ofMillis(200)));
        List<Integer> told = new CopyOnWriteArrayList<>();
        // What a listener reads back when told (the starter's breakers read every rule's stage).
        List<Integer> readBack = new CopyOnWriteArrayList<>();
        java.util.concurrent.atomic.AtomicReference<Protection> self = new java.util.concurrent.atomic.AtomicReference<>();
        Protection p = Protection.builder(c).policies(List.of("p")).manual().listener((policy, stage) -> {
            told.add(stage);
            readBack.add(self.get().stage(policy));
        }).build();
        self.set(p);
        flood(c, "p");
        poll("stage 2", Duration.ofSeconds(5), () -> {
            p.poll();
            return p.stage("p") == 2;
        });
        p.close();
        assertEquals(List.of(2, 0), told, "a breaker forced open at stage 2 is released when the loop closes");
        assertEquals(List.of(2, 0), readBack, "and the closed loop's stage reads 0");
        p.close();
        assertEquals(List.of(2, 0), told, "once");
    }

    @Test
    void aPolicyNoLongerWatchedAtStageTwoIsToldZero() throws Exception {
        RedisServer s = server();
        Client c = client(s);
        c.policySet("p", Spec.tokenBucket(1, 1, 3_600_000), PolicyMode.ENFORCE, 100,
                PolicyLoop.staged(30, 50).window(Duration.ofMillis(200)));
        List<String> told = new CopyOnWriteArrayList<>();
        try (Protection p = Protection.builder(c).policies(List.of("p", "q")).manual()
                .listener((policy, stage) -> told.add(policy + "=" + stage)).build()) {
            flood(c, "p");
            poll("stage 2", Duration.ofSeconds(5), () -> {
                p.poll();
                return p.stage("p") == 2;
            });
            p.watch(List.of("q"));
            assertEquals(List.of("p=2", "p=0"), told, "the rule set dropped p: its breaker must not stay forced open");
            assertEquals(0, p.stage("p"));
        }
    }

    @Test
    void aStageHoldNoLongerThanTheStagePollIsRefused() throws Exception {
        InvalidArgumentException e = org.junit.jupiter.api.Assertions.assertThrows(InvalidArgumentException.class, () ->
                Protection.builder(client(server())).stagePoll(Duration.ofSeconds(1))
                        .stageHold(Duration.ofSeconds(1)).manual().build());
        assertEquals("stage_hold", e.parameter());
    }

    @Test
    void aReportRefusesANegativeDeniedCount() throws Exception {
        Client c = client(server());
        InvalidArgumentException e = org.junit.jupiter.api.Assertions.assertThrows(InvalidArgumentException.class, () ->
                c.outcomeAsync("p", 0, 0, -1));
        assertEquals("denied", e.parameter());
    }
}

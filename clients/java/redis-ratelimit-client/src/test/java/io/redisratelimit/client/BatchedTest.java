package io.redisratelimit.client;

import io.micrometer.core.instrument.Counter;
import io.micrometer.core.instrument.simple.SimpleMeterRegistry;
import io.redisratelimit.client.testing.RedisServer;
import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.TestInstance;

import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.UUID;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.Future;
import java.util.function.BooleanSupplier;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertTrue;

/**
 * Batched global rules against a real server: never over the bound the
 * server's own clock gives, far fewer round trips than decisions, held units
 * back at close and after hold_ms, local denials until the next ask, the
 * fallback when Redis is away.
 */
@TestInstance(TestInstance.Lifecycle.PER_CLASS)
class BatchedTest {
    /** A bucket that does not refill within a test: 1 unit per 10^9 ms. */
    private static final Spec SLOW = Spec.tokenBucket(1000, 1, 1_000_000_000L);
    private RedisServer server;
    private Client inspector;

    @BeforeAll
    void start() {
        server = RedisServer.start();
        inspector = Client.connect(Drivers.LETTUCE.standalone(server), Duration.ofSeconds(2));
    }

    @AfterAll
    void stop() {
        if (inspector != null) {
            inspector.close();
        }
        if (server != null) {
            server.close();
        }
    }

    private Limiter limiter(RedisServer on, SimpleMeterRegistry registry) {
        return limiter(on, registry, FallbackMode.LOCAL_ONLY);
    }

    private Limiter limiter(RedisServer on, SimpleMeterRegistry registry, FallbackMode fallback) {
        Limiter.Builder b = Limiter.builder(Client.connect(Drivers.LETTUCE.standalone(on), Duration.ofSeconds(2))).fallback(fallback);
        if (registry != null) {
            b.metrics(RateLimitMeters.on(registry));
        }
        return b.build();
    }

    private static Rule batched(String key, Spec spec, long holdMs) {
        return Rule.of("batched", spec).fixedKey(key).asGlobal().batched().holdMs(holdMs);
    }

    /** The server's clock in ms ({@code TIME}). */
    private long serverMs() throws Exception {
        String[] t = server.command("TIME").split(" ");
        return Long.parseLong(t[0]) * 1000 + Long.parseLong(t[1]) / 1000;
    }

    private long calls(String command) throws Exception {
        for (String line : server.command("INFO", "commandstats").split("\r?\n")) {
            if (line.startsWith("cmdstat_" + command + ":calls=")) {
                return Long.parseLong(line.substring(line.indexOf('=') + 1, line.indexOf(',')));
            }
        }
        return 0;
    }

    private long remaining(String key, Spec spec) {
        return inspector.limit(key, spec, Request.cost(0)).remaining();
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

    private static double counted(SimpleMeterRegistry registry, String level, String outcome) {
        return registry.find("ratelimit.decisions").tag("level", level).tag("outcome", outcome).counters().stream()
                .mapToDouble(Counter::count).sum();
    }

    @Test
    void manyCallersAreNeverAboveTheBoundAndAskFarLessThanTheyDecide() throws Exception {
        String key = "t:batched:" + UUID.randomUUID();
        Spec spec = Spec.tokenBucket(100, 10, 1000);
        SimpleMeterRegistry registry = new SimpleMeterRegistry();
        int callers = 8;
        int each = 500;
        long admitted = 0;
        long callsBefore = calls("rl.tokenbucket");
        long startMs;
        long endMs;
        // Fail closed: a late reply on a loaded host is never an admission of the fallback's.
        try (Limiter l = limiter(server, registry, FallbackMode.FAIL_CLOSED)) {
            RuleSet set = l.rules(batched(key, spec, 50));
            ExecutorService pool = Executors.newFixedThreadPool(callers);
            try {
                startMs = serverMs();
                List<Future<Long>> runs = new ArrayList<>();
                for (int c = 0; c < callers; c++) {
                    runs.add(pool.submit(() -> {
                        long ok = 0;
                        for (int i = 0; i < each; i++) {
                            ok += l.check(set, "any").allowed() ? 1 : 0;
                        }
                        return ok;
                    }));
                }
                for (Future<Long> r : runs) {
                    admitted += r.get();
                }
                endMs = serverMs();
            } finally {
                pool.shutdownNow();
            }
            StatsSnapshot s = l.stats();
            long decisions = (long) callers * each;
            // capacity + refill over the elapsed time, a refill begun counted whole.
            long bound = 100 + 10 * ((endMs - startMs) / 1000 + 1);
            assertTrue(admitted <= bound, admitted + " admitted, bound " + bound);
            assertTrue(admitted >= 50, admitted + " admitted");
            assertTrue(s.redisCalls() * 10 < decisions, s.toString());
            assertTrue(s.grantAdmitted() > 0, s.toString());
            assertTrue(s.grantDenied() > 0, "a drained bucket denies locally until the next ask: " + s);
            assertTrue(counted(registry, "grant", "admitted") > 0);
            assertTrue(counted(registry, "grant", "denied") > 0);
        }
        long onServer = calls("rl.tokenbucket") - callsBefore;
        assertTrue(onServer * 10 < (long) callers * each, onServer + " calls of RL.TOKENBUCKET (asks and refunds)");
    }

    @Test
    void heldUnitsGoBackAtClose() throws Exception {
        String key = "t:close:" + UUID.randomUUID();
        Limiter l = limiter(server, null);
        RuleSet set = l.rules(batched(key, SLOW, 60_000));
        for (int i = 0; i < 150; i++) {
            assertTrue(l.check(set, "any").allowed(), "decision " + i);
        }
        assertTrue(remaining(key, SLOW) < 1000 - 150, "units are held: " + remaining(key, SLOW));
        assertTrue(l.stats().redisCalls() < 10, l.stats().toString());
        l.close();
        poll("the server's remaining back to 850", Duration.ofSeconds(10), () -> remaining(key, SLOW) == 850);
    }

    @Test
    void heldUnitsGoBackWhenTheJvmExitsWithoutClose() throws Exception {
        String key = "t:exit:" + UUID.randomUUID();
        String jvm = java.nio.file.Path.of(System.getProperty("java.home"), "bin", "java").toString();
        Process p = new ProcessBuilder(jvm, "-cp", System.getProperty("java.class.path"), GrantsExitMain.class.getName(),
                Integer.toString(server.port()), key).redirectErrorStream(true).start();
        String out = new String(p.getInputStream().readAllBytes(), java.nio.charset.StandardCharsets.UTF_8);
        assertTrue(p.waitFor(60, java.util.concurrent.TimeUnit.SECONDS), out);
        assertEquals(0, p.exitValue(), out);
        assertTrue(out.contains("admitted 150"), out);
        // Held for 60 s: only the exit's hook gives them back this soon.
        poll("the server's remaining back to 850 after the exit", Duration.ofSeconds(10), () -> remaining(key, SLOW) == 850);
    }

    @Test
    void anIdleInstanceHoldsNothingAfterHoldMs() throws Exception {
        String key = "t:idle:" + UUID.randomUUID();
        try (Limiter l = limiter(server, null)) {
            RuleSet set = l.rules(batched(key, SLOW, 200));
            for (int i = 0; i < 150; i++) {
                assertTrue(l.check(set, "any").allowed());
            }
            poll("the server's remaining back to 850 while the limiter is open", Duration.ofSeconds(10),
                    () -> remaining(key, SLOW) == 850);
            assertTrue(l.stats().grantRefunds() >= 1, l.stats().toString());
        }
    }

    @Test
    void aDrainedLimiterDeniesLocallyUntilItsNextAsk() {
        String key = "t:drained:" + UUID.randomUUID();
        Spec spec = Spec.tokenBucket(5, 1, 3_600_000);
        try (Limiter l = limiter(server, null)) {
            RuleSet set = l.rules(batched(key, spec, 50));
            long admitted = 0;
            for (int i = 0; i < 5; i++) {
                Decision d = l.check(set, "any");
                admitted += d.allowed() ? 1 : 0;
                assertEquals(d.allowed() ? 1 : 0, d.granted(), d.toString());
            }
            Decision denied = l.check(set, "any");
            for (int i = 0; i < 5 && denied.allowed(); i++) {
                admitted++;
                denied = l.check(set, "any");
            }
            assertEquals(5, admitted, "the bucket's 5, no more");
            assertFalse(denied.allowed());
            long calls = l.stats().redisCalls();
            Decision local = l.check(set, "any");
            assertFalse(local.allowed());
            assertEquals(Path.GRANT, local.path());
            assertTrue(local.waitMs() > 0 && local.waitMs() <= 3_600_000, local.toString());
            assertEquals(0, local.granted());
            assertEquals(calls, l.stats().redisCalls(), "no round trip until the next ask");
        }
    }

    @Test
    void whenRedisIsAwayHeldUnitsAreSpentThenTheFallbackDecides() throws Exception {
        RedisServer own = RedisServer.start();
        try (Limiter l = limiter(own, null)) {
            RuleSet set = l.rules(batched("t:away", SLOW, 60_000));
            for (int i = 0; i < 10; i++) {
                assertTrue(l.check(set, "any").allowed());
            }
            own.kill9();
            List<Path> paths = new ArrayList<>();
            for (int i = 0; i < 300; i++) {
                Decision d = l.check(set, "any");
                paths.add(d.path());
            }
            assertTrue(paths.stream().allMatch(p -> p == Path.GRANT || p == Path.FALLBACK), paths.toString());
            assertEquals(Path.GRANT, paths.get(0), "held units first");
            assertTrue(paths.contains(Path.FALLBACK), "then the fallback");
            Decision three = l.check(set, "any", 3);
            assertEquals(Path.FALLBACK, three.path());
            assertEquals(three.allowed() ? 3 : 0, three.granted(), "every path's granted: the cost when admitted");
        } finally {
            own.close();
        }
    }
}

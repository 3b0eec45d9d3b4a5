package io.redisratelimit.client;

import io.redisratelimit.client.driver.Command;
import io.redisratelimit.client.testing.RedisServer;
import io.redisratelimit.client.testing.Windows;
import org.junit.jupiter.api.Assumptions;
import org.junit.jupiter.params.ParameterizedTest;
import org.junit.jupiter.params.provider.EnumSource;

import java.time.Duration;
import java.util.List;
import java.util.UUID;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.TimeUnit;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

/**
 * {@code acquire} on the server's {@code BLOCK}, on both drivers, standalone
 * and cluster. Skipped, saying so, on a module without {@code BLOCK} (unless
 * {@code RL_REQUIRE_BLOCK=1}, which makes that a failure).
 */
class AcquireTest extends EveryDriver {
    private static final Duration LONG = Duration.ofSeconds(20);

    @Override
    void beforeConnecting(RedisServer standalone) {
        Client probe = Client.connect(Drivers.LETTUCE.standalone(standalone), Duration.ofSeconds(2));
        try {
            probe.acquire(key("probe"), Spec.tokenBucket(1, 1, 1000), Duration.ofMillis(10));
        } catch (ServerErrorException e) {
            probe.close();
            boolean required = "1".equals(System.getenv("RL_REQUIRE_BLOCK"));
            if (required || !String.valueOf(e.getMessage()).contains("BLOCK")) {
                throw e;
            }
            Assumptions.assumeTrue(false, "the module has no BLOCK yet (" + e.getMessage() + "): acquire tests skipped");
        }
        probe.close();
    }

    private static String key(String what) {
        return "t:" + what + ":" + UUID.randomUUID();
    }

    private static long msSince(long startNanos) {
        return TimeUnit.NANOSECONDS.toMillis(System.nanoTime() - startNanos);
    }

    /** Polls until the servers hold at least {@code n} blocked clients ({@code INFO clients}). */
    private static void blocked(Client rl, long n) throws InterruptedException {
        Command info = new Command("INFO", List.of("clients"), -1, false);
        long until = System.nanoTime() + TimeUnit.SECONDS.toNanos(10);
        while (true) {
            long now = 0;
            for (Object reply : rl.driver().sendToMasters(info).join()) {
                for (String line : String.valueOf(reply).split("\r?\n")) {
                    if (line.startsWith("blocked_clients:")) {
                        now += Long.parseLong(line.substring("blocked_clients:".length()).trim());
                    }
                }
            }
            if (now >= n) {
                return;
            }
            assertTrue(System.nanoTime() < until, "the server never held the call");
            Thread.sleep(10);
        }
    }

    @ParameterizedTest
    @EnumSource(Drivers.class)
    void anAcquireWaitsForARelease(Drivers d) throws Exception {
        Client rl = client(d);
        String k = key("wait");
        // The lease ends within the wait (or the server would deny at once); the release comes first.
        Lease held = rl.lease(k, 1, 10_000);
        CompletableFuture<Decision> waiting = rl.acquireAsync(k, Spec.concurrency(1, 10_000), LONG).toCompletableFuture();
        blocked(rl, 1);
        // The normal call answers while the acquire is held: acquire has a connection of its own.
        Decision other = rl.tokenBucket(key("other"), 5, 5, 1000);
        assertTrue(other.allowed());
        assertFalse(waiting.isDone(), "the acquire waits while the lease is held: " + (waiting.isDone() ? waiting.get() : ""));
        long released = System.nanoTime();
        assertTrue(held.release());
        Decision got = waiting.get(10, TimeUnit.SECONDS);
        assertTrue(got.allowed(), got.toString());
        assertTrue(got.lease() > held.id());
        assertTrue(msSince(released) < 5_000, "a release wakes the acquirer at once, not at the lease's expiry");
        assertTrue(rl.release(k, got.lease()));
    }

    @ParameterizedTest
    @EnumSource(Drivers.class)
    void anAcquireThatTimesOutAnswersTheDenialAtItsTimeout(Drivers d) throws Exception {
        Client rl = client(d);
        String k = key("timeout");
        // The lease ends in 1 s, within the 1.5 s wait; renewing it (a write) keeps it past the wait.
        Lease held = rl.lease(k, 1, 1000);
        long start = System.nanoTime();
        CompletableFuture<Decision> waiting = rl.acquireAsync(k, Spec.concurrency(1, 1000), Duration.ofMillis(1500)).toCompletableFuture();
        blocked(rl, 1);
        assertTrue(held.renew(Duration.ofSeconds(30)));
        Decision denied = waiting.join();
        long took = msSince(start);
        assertFalse(denied.allowed(), denied.toString());
        assertEquals(0, denied.lease());
        assertTrue(took >= 1000 && took < 6000, "the denial comes at about the timeout: " + took + " ms");
        // A denial at once when the wait is above the timeout.
        Decision atOnce = rl.acquire(k, Spec.concurrency(1, 30_000), Duration.ofMillis(100));
        assertFalse(atOnce.allowed());
        held.close();
    }

    @ParameterizedTest
    @EnumSource(Drivers.class)
    void anAcquireOfAnOpenLimiterAnswersAtOnceAndTheBlockingFormWaitsForTokens(Drivers d) {
        Client rl = client(d);
        String k = key("tb");
        Spec spec = Spec.tokenBucket(1, 1, 500);
        assertTrue(rl.acquire(k, spec, LONG).allowed());
        long start = System.nanoTime();
        Decision next = rl.acquire(k, spec, LONG);
        assertTrue(next.allowed(), next.toString());
        long took = msSince(start);
        assertTrue(took >= 300 && took < 10_000, "admitted when the next token came, after " + took + " ms");
    }

    @ParameterizedTest
    @EnumSource(Drivers.class)
    void anAdmittedLeakyBucketAcquireResolvesAfterItsWait(Drivers d) {
        Client rl = client(d);
        String k = key("lb");
        Spec spec = Spec.leakyBucket(10, 1, 400);
        assertTrue(rl.limit(k, spec).allowed());
        long start = System.nanoTime();
        Decision queued = rl.acquire(k, spec, LONG);
        long took = msSince(start);
        assertTrue(queued.allowed(), queued.toString());
        assertTrue(queued.waitMs() > 0, "the second request queues: " + queued);
        assertTrue(took >= queued.waitMs(), "resolved after wait_ms (" + queued.waitMs() + " ms), not at " + took + " ms");
    }

    @ParameterizedTest
    @EnumSource(Drivers.class)
    void acquireWorksThroughAPolicyAndAcrossSeveralLimiters(Drivers d) throws Exception {
        Client rl = client(d);
        String name = "test:acq:" + d + ":" + UUID.randomUUID();
        rl.policySet(name, Spec.concurrency(1, 10_000), PolicyMode.ENFORCE, 100);
        try {
            String k = key("hit");
            Decision first = rl.hit(name, k);
            CompletableFuture<Decision> second = rl.acquireHitAsync(name, k, Request.ONE, LONG).toCompletableFuture();
            blocked(rl, 1);
            assertFalse(second.isDone());
            assertTrue(rl.release(k, first.lease()));
            Decision got = second.get(10, TimeUnit.SECONDS);
            assertTrue(got.allowed() && got.lease() > 0, got.toString());
        } finally {
            rl.policyDel(name);
        }
        String tag = "{" + UUID.randomUUID() + "}";
        List<Limit> both = List.of(Limit.of(tag + ":a", Spec.tokenBucket(1, 1, 500)), Limit.of(tag + ":b", Spec.fixedWindow(100, Windows.FIXED_MS)));
        assertTrue(rl.all(both).allowed());
        Decision all = rl.acquireAll(both, LONG);
        assertTrue(all.allowed(), all.toString());
        assertEquals(98, rl.limit(tag + ":b", Spec.fixedWindow(100, Windows.FIXED_MS), Request.cost(0)).remaining());
    }

    @ParameterizedTest
    @EnumSource(Drivers.class)
    void aLeaseCanWaitForRoom(Drivers d) throws Exception {
        Client rl = client(d);
        String k = key("leasewait");
        Lease held = rl.lease(k, 1, 10_000);
        CompletableFuture<Lease> waiting = rl.leaseAsync(k, 1, 10_000, Request.ONE, LONG).toCompletableFuture();
        blocked(rl, 1);
        assertFalse(waiting.isDone());
        held.close();
        try (Lease got = waiting.get(10, TimeUnit.SECONDS)) {
            assertTrue(got.id() > held.id());
            assertThrows(RateLimitDeniedException.class, () -> rl.lease(k, 1, 10_000, Duration.ofMillis(50)));
        }
    }
}

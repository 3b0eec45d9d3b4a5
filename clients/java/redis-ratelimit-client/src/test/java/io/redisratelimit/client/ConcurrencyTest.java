package io.redisratelimit.client;

import org.junit.jupiter.params.ParameterizedTest;
import org.junit.jupiter.params.provider.EnumSource;

import java.time.Duration;
import java.util.ArrayList;
import java.util.HashSet;
import java.util.List;
import java.util.Set;
import java.util.UUID;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.Future;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicInteger;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

/** RL.CONCURRENCY, RL.RELEASE and RL.RENEW typed, and leases as handles, on both drivers, standalone and cluster. */
class ConcurrencyTest extends EveryDriver {

    private static String key(String what) {
        return "t:" + what + ":" + UUID.randomUUID();
    }

    /** Polls {@code condition} until it holds, failing after a generous bound. */
    private static void eventually(String what, java.util.function.BooleanSupplier condition) throws InterruptedException {
        long until = System.nanoTime() + TimeUnit.SECONDS.toNanos(10);
        while (!condition.getAsBoolean()) {
            assertTrue(System.nanoTime() < until, "never: " + what);
            Thread.sleep(20);
        }
    }

    @ParameterizedTest
    @EnumSource(Drivers.class)
    void concurrencyGrantsLimitLeasesWithIdsThenDeniesWithoutOne(Drivers d) throws Exception {
        Client rl = client(d);
        String k = key("cc");
        Set<Long> ids = new HashSet<>();
        for (int i = 0; i < 3; i++) {
            Decision ok = rl.concurrency(k, 3, 60_000);
            assertTrue(ok.allowed(), ok.toString());
            assertEquals(3, ok.limit());
            assertEquals(2 - i, ok.remaining());
            assertTrue(ok.lease() > 0, ok.toString());
            assertTrue(ok.deniedBy().isEmpty());
            ids.add(ok.lease());
        }
        assertEquals(3, ids.size());
        Decision no = rl.concurrencyAsync(k, 3, 60_000, Request.ONE).toCompletableFuture().get();
        assertFalse(no.allowed());
        assertEquals(0, no.lease());
        assertTrue(no.waitMs() > 0 && no.waitMs() <= 60_000, no.toString());
        long first = ids.iterator().next();
        assertTrue(rl.release(k, first));
        assertFalse(rl.release(k, first), "a lease is released once");
        assertTrue(rl.concurrency(k, 3, 60_000).allowed(), "the release made room");
        long other = ids.stream().filter(id -> id != first).findFirst().orElseThrow();
        assertTrue(rl.renewAsync(k, other, Duration.ofSeconds(30)).toCompletableFuture().get());
        assertFalse(rl.renew(k, 999_999_999L, Duration.ofSeconds(30)), "an unknown lease renews nothing");
        assertFalse(rl.release(k, 999_999_999L), "an unknown lease releases nothing");
        Decision cost = rl.concurrency(key("cost"), 5, 60_000, Request.cost(4));
        assertEquals(1, cost.remaining());
    }

    @ParameterizedTest
    @EnumSource(Drivers.class)
    void badArgumentsAreRefusedBeforeSendingNamingTheArgument(Drivers d) {
        Client rl = client(d);
        assertEquals("limit", assertThrows(InvalidArgumentException.class, () -> rl.concurrency("k", 0, 1000)).parameter());
        assertEquals("lease_ms", assertThrows(InvalidArgumentException.class, () -> rl.concurrency("k", 1, 0)).parameter());
        assertEquals("lease", assertThrows(InvalidArgumentException.class, () -> rl.release("k", 0)).parameter());
        assertEquals("key", assertThrows(InvalidArgumentException.class, () -> rl.release("", 1)).parameter());
        assertEquals("lease_ms", assertThrows(InvalidArgumentException.class, () -> rl.renew("k", 1, Duration.ZERO)).parameter());
        assertEquals("timeout_ms", assertThrows(InvalidArgumentException.class,
                () -> rl.acquire("k", Spec.concurrency(1, 1000), Duration.ofMillis(-1))).parameter());
        assertEquals("spec", assertThrows(InvalidArgumentException.class,
                () -> Limit.of("{a}:k", Spec.concurrency(1, 1000))).parameter(), "RL.ALL refuses CONCURRENCY");
    }

    @ParameterizedTest
    @EnumSource(Drivers.class)
    void neverMoreThanLimitLeasesAreHeldUnderConcurrentUse(Drivers d) throws Exception {
        Client rl = client(d);
        String k = key("many");
        int limit = 4;
        AtomicInteger inFlight = new AtomicInteger();
        AtomicInteger most = new AtomicInteger();
        AtomicInteger admitted = new AtomicInteger();
        AtomicInteger denied = new AtomicInteger();
        ExecutorService pool = Executors.newFixedThreadPool(16);
        try {
            List<Future<?>> workers = new ArrayList<>();
            for (int w = 0; w < 16; w++) {
                workers.add(pool.submit(() -> {
                    for (int i = 0; i < 25; i++) {
                        try (Lease lease = rl.lease(k, limit, 60_000)) {
                            int now = inFlight.incrementAndGet();
                            most.accumulateAndGet(now, Math::max);
                            admitted.incrementAndGet();
                            Thread.onSpinWait();
                            inFlight.decrementAndGet();
                            assertFalse(lease.ended());
                        } catch (RateLimitDeniedException e) {
                            denied.incrementAndGet();
                            assertEquals(0, e.decision().lease());
                        }
                    }
                    return null;
                }));
            }
            for (Future<?> f : workers) {
                f.get(60, TimeUnit.SECONDS);
            }
        } finally {
            pool.shutdownNow();
        }
        assertTrue(most.get() <= limit, "at most " + limit + " held at once, saw " + most.get());
        assertTrue(admitted.get() >= limit, "admitted " + admitted.get());
        assertEquals(16 * 25, admitted.get() + denied.get());
        // Every lease was released: the cap is free again.
        assertEquals(limit, rl.concurrency(k, limit, 60_000, Request.cost(0)).remaining());
    }

    @ParameterizedTest
    @EnumSource(Drivers.class)
    void aLeaseInTryWithResourcesIsReleasedAtTheEndOfTheBlock(Drivers d) {
        Client rl = client(d);
        String k = key("twr");
        Lease kept;
        try (Lease lease = rl.lease(k, 1, 60_000)) {
            kept = lease;
            assertTrue(lease.id() > 0);
            RateLimitDeniedException full = assertThrows(RateLimitDeniedException.class, () -> rl.lease(k, 1, 60_000));
            assertFalse(full.decision().allowed());
        }
        assertTrue(kept.ended());
        assertFalse(kept.release(), "released once, by close");
        try (Lease again = rl.lease(k, 1, 60_000)) {
            assertTrue(again.id() > kept.id(), "ids are never reused for a key");
        }
    }

    @ParameterizedTest
    @EnumSource(Drivers.class)
    void anUnrenewedLeaseEndsAfterLeaseMsAndARenewedOneIsKept(Drivers d) throws Exception {
        Client rl = client(d);
        String lapsing = key("lapse");
        String renewed = key("renew");
        long leaseMs = 400;
        Lease a = rl.lease(lapsing, 1, leaseMs);
        Lease b = rl.lease(renewed, 1, leaseMs).autoRenew();
        long start = System.nanoTime();
        eventually("the unrenewed lease frees its unit", () -> rl.concurrency(lapsing, 1, 60_000, Request.cost(0)).remaining() == 1);
        // Time has to pass here, well beyond lease_ms, for the renewals to matter.
        while (System.nanoTime() - start < TimeUnit.MILLISECONDS.toNanos(leaseMs * 3)) {
            Thread.sleep(50);
        }
        assertEquals(0, rl.concurrency(renewed, 1, leaseMs, Request.cost(0)).remaining(), "renewed past lease_ms: still held");
        assertFalse(b.ended());
        assertTrue(b.release());
        assertEquals(1, rl.concurrency(renewed, 1, leaseMs, Request.cost(0)).remaining());
        assertFalse(a.release(), "it had expired");
        Lease c = rl.lease(key("manual"), 1, leaseMs);
        assertTrue(c.renew());
        assertTrue(c.renew(Duration.ofSeconds(5)));
        c.close();
        assertFalse(c.renew(), "a released lease is not renewed");
    }

    @ParameterizedTest
    @EnumSource(Drivers.class)
    void aConcurrencyPolicyGivesLeasesThroughHitAndTheLimiter(Drivers d) {
        Client rl = client(d);
        String name = "test:cc:" + d + ":" + UUID.randomUUID();
        rl.policySet(name, Spec.concurrency(2, 60_000), PolicyMode.ENFORCE, 100);
        try {
            assertEquals(Spec.concurrency(2, 60_000), rl.policyGet(name).orElseThrow().spec());
            String k = key("hitcc");
            Decision one = rl.hit(name, k);
            assertTrue(one.allowed() && one.lease() > 0, one.toString());
            try (Lease lease = Lease.of(rl, k, one, Duration.ofMinutes(1))) {
                assertEquals(one.lease(), lease.id());
                Limiter limiter = Limiter.builder(rl).build();
                RuleSet set = limiter.rules(Rule.policy("inflight", name, Spec.concurrency(2, 60_000)).fixedKey(k));
                Decision two = limiter.check(set, "-");
                assertTrue(two.allowed() && two.lease() > 0, two.toString());
                Decision three = limiter.check(set, "-");
                assertFalse(three.allowed());
                assertEquals(Path.REDIS, three.path());
                assertTrue(rl.release(k, two.lease()));
                Decision four = limiter.check(set, "-");
                assertTrue(four.allowed(), "a concurrency denial is never cached: " + four);
                assertEquals(Path.REDIS, four.path());
                assertThrows(InvalidArgumentException.class, () -> limiter.rules(
                        Rule.of("rate", Spec.fixedWindow(5, 1000)).keyPrefix("{x}:"),
                        Rule.of("cap", Spec.concurrency(1, 1000)).keyPrefix("{x}:")));
            }
        } finally {
            rl.policyDel(name);
        }
    }
}

package io.redisratelimit.client;

import io.redisratelimit.client.testing.RedisServer;
import io.redisratelimit.client.testing.Windows;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.BeforeEach;
import org.junit.jupiter.params.ParameterizedTest;
import org.junit.jupiter.params.provider.EnumSource;

import java.time.Duration;
import java.util.List;
import java.util.UUID;
import java.util.concurrent.CompletableFuture;

import static org.junit.jupiter.api.Assertions.assertTrue;

/**
 * The over-admission bound: while Redis is slow for short spells, calls
 * miss their deadline, Redis may still count them, and the local-only
 * fallback decides. One instance then admits at most max(limit, share)
 * units of one key in a window, because every unit Redis admitted or may
 * have admitted is charged to the account the fallback admits from.
 */
class SlowSpellsTest {
    private static final long LIMIT = 10;
    private static final long INSTANCES = 2;

    private RedisServer server;
    private Client client;

    @BeforeEach
    void start() {
        server = RedisServer.start(List.of("--enable-debug-command", "yes"));
    }

    @AfterEach
    void stop() {
        if (client != null) {
            client.close();
        }
        server.close();
    }

    @ParameterizedTest
    @EnumSource(value = Drivers.class, names = {"LETTUCE", "JEDIS"})
    void aBurstThroughSlowSpellsStaysWithinTheBound(Drivers d) throws Exception {
        client = Client.connect(d.standalone(server), Duration.ofMillis(30));
        Limiter limiter = Limiter.builder(client).fallback(FallbackMode.LOCAL_ONLY).instances(INSTANCES)
                .denyCache(false).breaker(1, Duration.ofMillis(100)).build();
        RuleSet rules = limiter.rules(Rule.of("per-user", Spec.fixedWindow(LIMIT, Windows.FIXED_MS)).keyPrefix("rl:spells:"));
        String user = UUID.randomUUID().toString();
        long bound = Math.max(LIMIT, Share.instances(INSTANCES).of(LIMIT));
        int admitted = 0;
        for (int i = 0; i < 3; i++) {
            admitted += limiter.check(rules, user).allowed() ? 1 : 0;
        }
        for (int spell = 0; spell < 4; spell++) {
            CompletableFuture<Void> slow;
            if (spell % 2 == 0) {
                server.command("CLIENT", "PAUSE", "300", "WRITE");
                slow = CompletableFuture.completedFuture(null);
            } else {
                slow = CompletableFuture.runAsync(() -> {
                    try {
                        server.command("DEBUG", "SLEEP", "0.3");
                    } catch (java.io.IOException e) {
                        throw new IllegalStateException(e);
                    }
                });
            }
            for (int i = 0; i < 10; i++) {
                admitted += limiter.check(rules, user).allowed() ? 1 : 0;
            }
            slow.join();
            // A peek is a write: it is answered once the pause is over.
            client.withDeadline(Duration.ofSeconds(10)).limit("rl:spells:" + user, Spec.fixedWindow(LIMIT, Windows.FIXED_MS), Request.cost(0));
            // Requests of another user close the breaker (its probe), so that Redis decides again.
            String other = UUID.randomUUID().toString();
            long until = System.nanoTime() + Duration.ofSeconds(10).toNanos();
            while (limiter.check(rules, other).path() != Path.REDIS) {
                assertTrue(System.nanoTime() < until, "the breaker closes once Redis answers: " + limiter.stats());
                Thread.sleep(10);
            }
            for (int i = 0; i < 3; i++) {
                admitted += limiter.check(rules, user).allowed() ? 1 : 0;
            }
        }
        StatsSnapshot stats = limiter.stats();
        assertTrue(stats.redisTimeouts() > 0 && stats.fallbackAdmitted() + stats.fallbackDenied() > 0,
                "the spells sent requests to the fallback: " + stats);
        long counted = client.limit("rl:spells:" + user, Spec.fixedWindow(LIMIT, Windows.FIXED_MS), Request.cost(0)).remaining();
        assertTrue(admitted <= bound, "admitted " + admitted + " of a limit of " + LIMIT + " (bound " + bound
                + ", Redis has " + (LIMIT - counted) + " counted): " + stats);
    }
}

package io.redisratelimit.client;

import io.redisratelimit.client.driver.Driver;
import io.redisratelimit.client.testing.RedisServer;
import io.redisratelimit.client.testing.Windows;
import org.junit.jupiter.params.ParameterizedTest;
import org.junit.jupiter.params.provider.EnumSource;

import java.io.IOException;
import java.time.Duration;
import java.util.List;
import java.util.UUID;
import java.util.function.Supplier;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertTrue;
import static org.junit.jupiter.api.Assertions.fail;

/**
 * Through a real Sentinel, on Lettuce and Jedis: a master with the module, a
 * replica with the module, one Sentinel with quorum 1. The client connects
 * through the Sentinel ({@code MODULE LIST} passes), a fixed window of 3
 * admits 3 and denies the 4th, the master is killed with {@code -9}, the
 * Sentinel promotes the replica, and once the client's calls succeed again
 * the 5th call is still denied: the module's state came over by replication.
 *
 * <p>The master is killed rather than handed over with {@code SENTINEL
 * FAILOVER}: after a manual failover the old master stays a writable master
 * until the Sentinel converts it, about 10 s later, and a Lettuce connection
 * (which asks the Sentinel only when it reconnects) keeps writing to it until
 * then. Killed, it takes no write, so a call that succeeds is on the new master.
 */
class SentinelFailoverTest {
    private static final String MASTER = "mymaster";
    /** A day: the windows are aligned on the epoch, so the test never straddles a boundary in practice. */
    private static final long WINDOW_MS = Windows.FIXED_MS;
    private static final Duration FAILOVER_WITHIN = Duration.ofSeconds(15);

    @ParameterizedTest
    @EnumSource(value = Drivers.class, names = {"LETTUCE", "JEDIS"})
    void theLimiterStateSurvivesAFailover(Drivers d) throws Exception {
        // No diskless-sync delay (5 s by default): the replica syncs at once.
        try (RedisServer master = RedisServer.start(List.of("--repl-diskless-sync-delay", "0"));
             RedisServer replica = RedisServer.startReplicaOf(master);
             RedisServer sentinel = RedisServer.startSentinel(MASTER, master, 500, 2000)) {
            awaitSentinelKnowsReplica(sentinel, replica);

            Driver driver = d.sentinel(sentinel, MASTER);
            try (Client rl = Client.connect(driver, Duration.ofSeconds(2))) {
                assertTrue(rl.moduleVersion() >= Client.MIN_MODULE_VERSION);
                String k = "t:sentinel:" + UUID.randomUUID();
                for (int i = 0; i < 3; i++) {
                    assertTrue(rl.fixedWindow(k, 3, WINDOW_MS).allowed(), "call " + (i + 1));
                }
                Decision fourth = rl.fixedWindow(k, 3, WINDOW_MS);
                assertFalse(fourth.allowed(), fourth.toString());

                // The replica has every write before the master goes (the module replicates its state
                // exactly). Not WAIT: it counts the writes of its own connection only, and the test's is
                // not the driver's. Right after a sync the master streams nothing until the replica's
                // first REPLCONF ACK (up to a second), so a master killed then loses the writes.
                long written = replOffset(master, "master_repl_offset");
                awaitUntil(() -> "the replica to reach offset " + written + ": " + diagnose(master, replica, sentinel),
                        () -> replOffset(replica, "slave_repl_offset") >= written);
                master.kill9();

                awaitUntil(() -> "the Sentinel to promote the replica on " + replica.port() + "\n" + sentinel.log(), () -> {
                    try {
                        return ("127.0.0.1 " + replica.port()).equals(sentinel.command("SENTINEL", "GET-MASTER-ADDR-BY-NAME", MASTER))
                                && replica.command("ROLE").startsWith("master");
                    } catch (IOException e) {
                        return false;
                    }
                });
                // The client finds the new master: the only master alive, so a write that succeeds went there.
                String probe = "t:sentinel:probe:" + UUID.randomUUID();
                awaitUntil(() -> d + " to reach the promoted master on " + replica.port(), () -> {
                    try {
                        return rl.fixedWindow(probe, 1_000_000, WINDOW_MS).allowed();
                    } catch (RateLimitException e) {
                        return false;
                    }
                });

                Decision fifth = rl.fixedWindow(k, 3, WINDOW_MS);
                assertFalse(fifth.allowed(), () -> fifth + " on the promoted master " + replica.port() + ": " + diagnose(master, replica, sentinel));
                assertEquals(0, fifth.remaining());
                assertEquals(Path.REDIS, fifth.path());
                assertTrue(fifth.resetMs() <= fourth.resetMs(), fourth + " then " + fifth);

                // MODULE LIST passes on the promoted master too, over the same driver
                // (not closed here: rl closes the driver).
                assertTrue(Client.connect(driver, Duration.ofSeconds(2)).moduleVersion() >= Client.MIN_MODULE_VERSION);
            }
        }
    }

    /** A field of {@code INFO replication}; -1 when the server does not answer. */
    private static long replOffset(RedisServer s, String field) {
        try {
            for (String line : s.command("INFO", "replication").split("\r\n")) {
                if (line.startsWith(field + ":")) {
                    return Long.parseLong(line.substring(field.length() + 1).trim());
                }
            }
            return -1;
        } catch (IOException e) {
            return -1;
        }
    }

    private static String diagnose(RedisServer master, RedisServer replica, RedisServer sentinel) {
        try {
            return replica.command("INFO", "replication") + "\n" + replica.command("INFO", "keyspace") + "\n" + "master log:\n" + master.log() + "\nreplica log:\n" + replica.log() + "\nsentinel log:\n" + sentinel.log();
        } catch (IOException e) {
            return e.toString();
        }
    }

    /** The Sentinel has seen the replica and its INFO (link up), so it can select it when the master goes. */
    private static void awaitSentinelKnowsReplica(RedisServer sentinel, RedisServer replica) {
        awaitUntil(() -> "the Sentinel to discover the replica on " + replica.port() + "\n" + sentinel.log(), () -> {
            try {
                String replicas = sentinel.command("SENTINEL", "REPLICAS", MASTER);
                return replicas != null && replicas.contains("127.0.0.1:" + replica.port())
                        && replicas.contains("master-link-status ok");
            } catch (IOException e) {
                return false;
            }
        });
    }

    private static void awaitUntil(Supplier<String> what, Supplier<Boolean> condition) {
        long deadline = System.nanoTime() + FAILOVER_WITHIN.toNanos();
        while (System.nanoTime() < deadline) {
            if (condition.get()) {
                return;
            }
            try {
                Thread.sleep(20);
            } catch (InterruptedException e) {
                Thread.currentThread().interrupt();
                fail("interrupted waiting for " + what.get());
            }
        }
        fail("timed out after " + FAILOVER_WITHIN.toSeconds() + " s waiting for " + what.get());
    }
}

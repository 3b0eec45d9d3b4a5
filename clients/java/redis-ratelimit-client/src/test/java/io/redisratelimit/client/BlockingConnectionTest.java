package io.redisratelimit.client;

import io.redisratelimit.client.driver.Command;
import io.redisratelimit.client.driver.Driver;
import io.redisratelimit.client.testing.RedisCluster;
import io.redisratelimit.client.testing.RedisServer;
import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.TestInstance;
import org.junit.jupiter.params.ParameterizedTest;
import org.junit.jupiter.params.provider.EnumSource;

import java.util.ArrayList;
import java.util.EnumMap;
import java.util.List;
import java.util.Map;
import java.util.UUID;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.TimeUnit;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertTrue;

/**
 * The drivers' connections for held calls, shown with Redis's own blocking
 * command ({@code BLPOP}), so that it holds whatever the module can do: a held
 * call stalls no other call, several are held at once, and one given up is
 * forgotten by the server (its connection closed).
 */
@TestInstance(TestInstance.Lifecycle.PER_CLASS)
class BlockingConnectionTest {
    private RedisServer server;
    private RedisCluster cluster;
    private final Map<Drivers, Driver> drivers = new EnumMap<>(Drivers.class);

    @BeforeAll
    void start() {
        server = RedisServer.start();
        cluster = RedisCluster.start();
        for (Drivers d : Drivers.values()) {
            drivers.put(d, d.cluster() ? d.cluster(cluster) : d.standalone(server));
        }
    }

    @AfterAll
    void stop() {
        drivers.values().forEach(Driver::close);
        if (cluster != null) {
            cluster.close();
        }
        if (server != null) {
            server.close();
        }
    }

    private static Command blpop(String key, String timeoutSeconds) {
        return new Command("BLPOP", List.of(key, timeoutSeconds), 0, true);
    }

    @ParameterizedTest
    @EnumSource(Drivers.class)
    void heldCallsStallNothingAndEachGetsItsReply(Drivers d) throws Exception {
        Driver driver = drivers.get(d);
        String k = "t:list:" + UUID.randomUUID();
        List<CompletableFuture<Object>> held = new ArrayList<>();
        for (int i = 0; i < 3; i++) {
            held.add(driver.sendBlocking(blpop(k, "0")));
        }
        // The shared connection answers at once while three calls are held.
        Object pong = driver.send(new Command("PING", List.of(), -1, false)).get(2, TimeUnit.SECONDS);
        assertEquals("PONG", pong);
        for (CompletableFuture<Object> h : held) {
            assertFalse(h.isDone());
        }
        driver.send(new Command("RPUSH", List.of(k, "a", "b", "c"), 0, false)).get(2, TimeUnit.SECONDS);
        List<Object> got = new ArrayList<>();
        for (CompletableFuture<Object> h : held) {
            Object reply = h.get(10, TimeUnit.SECONDS);
            assertTrue(reply instanceof List<?> l && l.size() == 2 && k.equals(l.get(0)), String.valueOf(reply));
            got.add(((List<?>) reply).get(1));
        }
        assertEquals(3, got.stream().distinct().count());
        // The connections are lent again: a second round works the same.
        CompletableFuture<Object> again = driver.sendBlocking(blpop(k, "0"));
        driver.send(new Command("RPUSH", List.of(k, "d"), 0, false)).get(2, TimeUnit.SECONDS);
        assertEquals(List.of(k, "d"), again.get(10, TimeUnit.SECONDS));
    }

    @ParameterizedTest
    @EnumSource(value = Drivers.class, names = {"LETTUCE", "LETTUCE_CLUSTER"})
    void aHeldCallGivenUpClosesItsConnectionSoTheServerForgetsIt(Drivers d) throws Exception {
        Driver driver = drivers.get(d);
        String k = "t:gone:" + UUID.randomUUID();
        CompletableFuture<Object> held = driver.sendBlocking(blpop(k, "0"));
        Command blocked = new Command("INFO", List.of("clients"), -1, false);
        long until = System.nanoTime() + TimeUnit.SECONDS.toNanos(10);
        while (blockedClients(driver, blocked) < 1) {
            assertTrue(System.nanoTime() < until, "the call never blocked");
            Thread.sleep(20);
        }
        held.cancel(false);
        while (blockedClients(driver, blocked) > 0) {
            assertTrue(System.nanoTime() < until, "the server still holds the given-up call");
            Thread.sleep(20);
        }
        // Nothing was popped for it: a value pushed now stays in the list.
        driver.send(new Command("RPUSH", List.of(k, "x"), 0, false)).get(2, TimeUnit.SECONDS);
        assertEquals(1L, driver.send(new Command("LLEN", List.of(k), 0, false)).get(2, TimeUnit.SECONDS));
    }

    private static long blockedClients(Driver driver, Command info) throws Exception {
        long n = 0;
        for (Object reply : driver.sendToMasters(info).get(2, TimeUnit.SECONDS)) {
            for (String line : String.valueOf(reply).split("\r?\n")) {
                if (line.startsWith("blocked_clients:")) {
                    n += Long.parseLong(line.substring("blocked_clients:".length()).trim());
                }
            }
        }
        return n;
    }
}

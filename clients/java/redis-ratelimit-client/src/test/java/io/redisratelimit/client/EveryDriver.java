package io.redisratelimit.client;

import io.redisratelimit.client.driver.Driver;
import io.redisratelimit.client.testing.RedisCluster;
import io.redisratelimit.client.testing.RedisServer;
import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.TestInstance;

import java.time.Duration;
import java.util.EnumMap;
import java.util.Map;

/**
 * The base of the typed-call tests: a standalone server, a three-master
 * cluster, and a {@link Client} (deadline 2 s) for each of {@link Drivers},
 * on the cluster for the cluster drivers and on the server for the others;
 * started once for the class, closed after it.
 */
@TestInstance(TestInstance.Lifecycle.PER_CLASS)
abstract class EveryDriver {
    RedisServer server;
    RedisCluster cluster;
    private final Map<Drivers, Client> clients = new EnumMap<>(Drivers.class);

    /** Runs on the standalone server before anything else starts: a class may probe the module there, and skip. */
    void beforeConnecting(RedisServer standalone) {
    }

    @BeforeAll
    final void startEveryDriver() {
        server = RedisServer.start();
        beforeConnecting(server);
        cluster = RedisCluster.start();
        for (Drivers d : Drivers.values()) {
            Driver driver = d.cluster() ? d.cluster(cluster) : d.standalone(server);
            clients.put(d, Client.connect(driver, Duration.ofSeconds(2)));
        }
    }

    /** Runs even when the start failed or skipped the class. */
    @AfterAll
    final void stopEveryDriver() {
        clients.values().forEach(Client::close);
        if (cluster != null) {
            cluster.close();
        }
        if (server != null) {
            server.close();
        }
    }

    Client client(Drivers d) {
        return clients.get(d);
    }
}

package io.redisratelimit.client.testing;

import java.io.IOException;
import java.util.ArrayList;
import java.util.List;

/**
 * A cluster of three masters on free loopback ports, each with the module:
 * slots assigned with CLUSTER ADDSLOTSRANGE, nodes joined with CLUSTER MEET,
 * ready when every node says {@code cluster_state:ok}.
 */
public final class RedisCluster implements AutoCloseable {
    private final List<RedisServer> nodes = new ArrayList<>();

    public static RedisCluster start() {
        RedisCluster c = new RedisCluster();
        try {
            for (int i = 0; i < 3; i++) {
                c.nodes.add(RedisServer.start(List.of("--cluster-enabled", "yes",
                        "--cluster-config-file", "nodes-" + i + ".conf", "--cluster-node-timeout", "2000")));
            }
            int[][] ranges = {{0, 5460}, {5461, 10922}, {10923, 16383}};
            for (int i = 0; i < 3; i++) {
                c.nodes.get(i).command("CLUSTER", "ADDSLOTSRANGE", Integer.toString(ranges[i][0]), Integer.toString(ranges[i][1]));
            }
            for (int i = 1; i < 3; i++) {
                c.nodes.get(0).command("CLUSTER", "MEET", "127.0.0.1", Integer.toString(c.nodes.get(i).port()));
            }
            long deadline = System.nanoTime() + 30_000_000_000L;
            while (System.nanoTime() < deadline) {
                boolean ok = true;
                for (RedisServer n : c.nodes) {
                    String info = n.command("CLUSTER", "INFO");
                    ok &= info.contains("cluster_state:ok") && info.contains("cluster_known_nodes:3");
                }
                if (ok) {
                    return c;
                }
                Thread.sleep(20);
            }
            throw new IllegalStateException("the cluster did not reach cluster_state:ok");
        } catch (IOException | InterruptedException e) {
            c.close();
            throw new IllegalStateException(e);
        }
    }

    public List<RedisServer> nodes() {
        return nodes;
    }

    @Override
    public void close() {
        for (RedisServer n : nodes) {
            n.close();
        }
    }
}

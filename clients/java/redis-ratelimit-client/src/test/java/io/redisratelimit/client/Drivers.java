package io.redisratelimit.client;

import io.lettuce.core.RedisURI;
import io.redisratelimit.client.driver.Driver;
import io.redisratelimit.client.driver.JedisDriver;
import io.redisratelimit.client.driver.LettuceDriver;
import io.redisratelimit.client.testing.RedisCluster;
import io.redisratelimit.client.testing.RedisServer;
import redis.clients.jedis.DefaultJedisClientConfig;
import redis.clients.jedis.HostAndPort;
import redis.clients.jedis.JedisCluster;
import redis.clients.jedis.JedisPooled;
import redis.clients.jedis.JedisSentineled;

import java.util.Set;
import java.util.stream.Collectors;

/** The four ways the tests reach a server: Lettuce or Jedis, standalone (or through a Sentinel) or cluster. */
enum Drivers {
    LETTUCE, JEDIS, LETTUCE_CLUSTER, JEDIS_CLUSTER;

    boolean cluster() {
        return this == LETTUCE_CLUSTER || this == JEDIS_CLUSTER;
    }

    Driver standalone(RedisServer s) {
        return switch (this) {
            case LETTUCE -> LettuceDriver.connect(RedisURI.create(s.uri()));
            case JEDIS -> JedisDriver.owning(new JedisPooled(new HostAndPort("127.0.0.1", s.port()),
                    DefaultJedisClientConfig.builder().timeoutMillis(2000).build()));
            default -> throw new IllegalStateException(this + " is a cluster driver");
        };
    }

    /** Through a Sentinel: Lettuce's {@code redis-sentinel://} URI, Jedis's {@link JedisSentineled}. */
    Driver sentinel(RedisServer sentinel, String masterName) {
        return switch (this) {
            case LETTUCE -> LettuceDriver.connect(RedisURI.create("redis-sentinel://127.0.0.1:" + sentinel.port() + "#" + masterName));
            case JEDIS -> JedisDriver.owning(new JedisSentineled(masterName,
                    DefaultJedisClientConfig.builder().timeoutMillis(2000).build(),
                    Set.of(new HostAndPort("127.0.0.1", sentinel.port())),
                    DefaultJedisClientConfig.builder().timeoutMillis(2000).build()));
            default -> throw new IllegalStateException(this + " is a cluster driver");
        };
    }

    Driver cluster(RedisCluster c) {
        return switch (this) {
            case LETTUCE_CLUSTER -> LettuceDriver.connectCluster(c.nodes().stream()
                    .map(n -> RedisURI.create(n.uri())).toList());
            case JEDIS_CLUSTER -> {
                Set<HostAndPort> seeds = c.nodes().stream().map(n -> new HostAndPort("127.0.0.1", n.port()))
                        .collect(Collectors.toSet());
                // maxAttempts 1: Jedis would otherwise resend a write after a connection error.
                yield JedisDriver.owning(new JedisCluster(seeds, DefaultJedisClientConfig.builder().timeoutMillis(2000).build(), 1));
            }
            default -> throw new IllegalStateException(this + " is a standalone driver");
        };
    }
}

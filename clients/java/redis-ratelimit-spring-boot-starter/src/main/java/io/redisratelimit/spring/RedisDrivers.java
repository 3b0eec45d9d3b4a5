package io.redisratelimit.spring;

import io.lettuce.core.RedisURI;
import io.redisratelimit.client.driver.Driver;
import io.redisratelimit.client.driver.JedisDriver;
import io.redisratelimit.client.driver.LettuceDriver;
import org.springframework.boot.autoconfigure.data.redis.RedisProperties;
import redis.clients.jedis.DefaultJedisClientConfig;
import redis.clients.jedis.HostAndPort;
import redis.clients.jedis.JedisClientConfig;
import redis.clients.jedis.JedisCluster;
import redis.clients.jedis.JedisPooled;
import redis.clients.jedis.JedisSentineled;

import java.time.Duration;
import java.util.List;
import java.util.Set;
import java.util.stream.Collectors;

/**
 * The kit's own connection, from {@code spring.data.redis.*}: standalone
 * (host, port or url), Sentinel or cluster, on Lettuce or Jedis. Its own, so
 * that its options (no buffering across reconnects, no resending) do not
 * change the application's {@code RedisTemplate}.
 */
final class RedisDrivers {
    private RedisDrivers() {
    }

    static Driver create(String driver, RedisProperties p) {
        return switch (driver.toLowerCase(java.util.Locale.ROOT)) {
            case "lettuce" -> lettuce(p);
            case "jedis" -> Jedis.create(p);
            default -> throw new RateLimitConfigException("ratelimit.driver", "must be lettuce or jedis, got '" + driver + "'", null);
        };
    }

    /** Whether the properties name a cluster. */
    static boolean cluster(RedisProperties p) {
        return p.getCluster() != null && p.getCluster().getNodes() != null && !p.getCluster().getNodes().isEmpty();
    }

    /** Where the properties point, for messages: host:port, the url, the Sentinel master or the cluster's nodes. */
    static String describe(RedisProperties p) {
        if (cluster(p)) {
            return "the cluster " + p.getCluster().getNodes();
        }
        if (p.getSentinel() != null && p.getSentinel().getMaster() != null) {
            return "the Sentinel master '" + p.getSentinel().getMaster() + "' at " + p.getSentinel().getNodes();
        }
        if (p.getUrl() != null) {
            return p.getUrl().replaceAll("//[^@/]*@", "//");
        }
        return p.getHost() + ":" + p.getPort();
    }

    private static Driver lettuce(RedisProperties p) {
        if (p.getCluster() != null && p.getCluster().getNodes() != null && !p.getCluster().getNodes().isEmpty()) {
            List<RedisURI> seeds = p.getCluster().getNodes().stream().map(n -> {
                String[] hp = n.split(":");
                RedisURI.Builder b = RedisURI.builder().withHost(hp[0]).withPort(Integer.parseInt(hp[1]));
                auth(b, p);
                return b.build();
            }).toList();
            return LettuceDriver.connectCluster(seeds);
        }
        if (p.getSentinel() != null && p.getSentinel().getMaster() != null) {
            List<String> nodes = p.getSentinel().getNodes();
            String[] first = nodes.get(0).split(":");
            RedisURI.Builder b = RedisURI.Builder.sentinel(first[0], Integer.parseInt(first[1]), p.getSentinel().getMaster());
            for (String n : nodes.subList(1, nodes.size())) {
                String[] hp = n.split(":");
                b.withSentinel(hp[0], Integer.parseInt(hp[1]));
            }
            auth(b, p);
            b.withDatabase(p.getDatabase());
            return LettuceDriver.connect(b.build());
        }
        if (p.getUrl() != null) {
            return LettuceDriver.connect(RedisURI.create(p.getUrl()));
        }
        RedisURI.Builder b = RedisURI.builder().withHost(p.getHost()).withPort(p.getPort()).withDatabase(p.getDatabase())
                .withSsl(p.getSsl().isEnabled()).withTimeout(p.getTimeout() == null ? Duration.ofSeconds(60) : p.getTimeout());
        auth(b, p);
        return LettuceDriver.connect(b.build());
    }

    private static void auth(RedisURI.Builder b, RedisProperties p) {
        if (p.getPassword() != null) {
            if (p.getUsername() != null) {
                b.withAuthentication(p.getUsername(), p.getPassword());
            } else {
                b.withPassword(p.getPassword().toCharArray());
            }
        }
    }

    /** Kept apart so that Jedis's classes load only when it is chosen. */
    static final class Jedis {
        private Jedis() {
        }

        static Driver create(RedisProperties p) {
            DefaultJedisClientConfig.Builder cb = DefaultJedisClientConfig.builder()
                    .timeoutMillis(p.getTimeout() == null ? 2000 : (int) p.getTimeout().toMillis())
                    .database(p.getDatabase()).ssl(p.getSsl().isEnabled());
            if (p.getPassword() != null) {
                cb.password(p.getPassword());
                if (p.getUsername() != null) {
                    cb.user(p.getUsername());
                }
            }
            JedisClientConfig config = cb.build();
            if (p.getCluster() != null && p.getCluster().getNodes() != null && !p.getCluster().getNodes().isEmpty()) {
                Set<HostAndPort> seeds = p.getCluster().getNodes().stream().map(HostAndPort::from).collect(Collectors.toSet());
                // maxAttempts 1: JedisCluster resends a write after a connection error otherwise.
                return JedisDriver.owning(new JedisCluster(seeds, config, 1));
            }
            if (p.getSentinel() != null && p.getSentinel().getMaster() != null) {
                Set<HostAndPort> sentinels = p.getSentinel().getNodes().stream().map(HostAndPort::from).collect(Collectors.toSet());
                return JedisDriver.owning(new JedisSentineled(p.getSentinel().getMaster(), config, sentinels,
                        DefaultJedisClientConfig.builder().build()));
            }
            return JedisDriver.owning(new JedisPooled(new HostAndPort(p.getHost(), p.getPort()), config));
        }
    }
}

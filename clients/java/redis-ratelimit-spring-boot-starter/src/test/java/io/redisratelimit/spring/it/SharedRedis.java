package io.redisratelimit.spring.it;

import io.redisratelimit.client.testing.RedisServer;

/** One redis-server with the module for the starter's tests, stopped when the JVM exits. */
final class SharedRedis {
    private static RedisServer server;

    private SharedRedis() {
    }

    static synchronized RedisServer get() {
        if (server == null) {
            server = RedisServer.start();
            RedisServer s = server;
            Runtime.getRuntime().addShutdownHook(new Thread(s::close));
        }
        return server;
    }
}

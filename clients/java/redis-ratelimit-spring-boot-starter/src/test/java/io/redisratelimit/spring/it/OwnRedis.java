package io.redisratelimit.spring.it;

import io.redisratelimit.client.testing.RedisServer;
import org.junit.jupiter.api.AfterAll;
import org.springframework.boot.test.web.server.LocalServerPort;
import org.springframework.test.context.DynamicPropertyRegistry;
import org.springframework.test.context.DynamicPropertySource;

/**
 * The base of the HTTP tests that kill their server: a redis-server of their
 * own (not {@link SharedRedis}), given to the application as
 * {@code spring.data.redis.port}, closed after the class; {@link #port} is
 * the application's own.
 */
abstract class OwnRedis {
    static RedisServer server;

    @LocalServerPort
    int port;

    @DynamicPropertySource
    static void redis(DynamicPropertyRegistry r) {
        server = RedisServer.start();
        r.add("spring.data.redis.port", server::port);
    }

    @AfterAll
    static void stop() {
        server.close();
    }
}

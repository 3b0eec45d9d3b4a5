package io.redisratelimit.spring.it;

import org.springframework.boot.test.web.server.LocalServerPort;
import org.springframework.test.context.DynamicPropertyRegistry;
import org.springframework.test.context.DynamicPropertySource;

/**
 * The base of the HTTP tests on the {@link SharedRedis} server: it is the
 * application's {@code spring.data.redis.port}, and {@link #port} the
 * application's own.
 */
abstract class OnSharedRedis {
    @LocalServerPort
    int port;

    @DynamicPropertySource
    static void redis(DynamicPropertyRegistry r) {
        r.add("spring.data.redis.port", SharedRedis.get()::port);
    }
}

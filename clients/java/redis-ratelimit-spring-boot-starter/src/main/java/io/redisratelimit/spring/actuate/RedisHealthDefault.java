package io.redisratelimit.spring.actuate;

import org.springframework.boot.SpringApplication;
import org.springframework.boot.env.EnvironmentPostProcessor;
import org.springframework.core.env.ConfigurableEnvironment;
import org.springframework.core.env.MapPropertySource;

import java.util.Map;

/**
 * Turns Spring Boot's Redis health indicator off by default (the lowest
 * precedence: any setting of the application's wins). With the starter, a
 * Redis that is away is not an instance that is down: the fallback serves,
 * and {@code rateLimit} reports it. An application that uses Redis for
 * other things and wants that indicator sets
 * {@code management.health.redis.enabled=true}.
 */
public class RedisHealthDefault implements EnvironmentPostProcessor {
    static final String SOURCE = "redis-ratelimit-defaults";

    @Override
    public void postProcessEnvironment(ConfigurableEnvironment env, SpringApplication application) {
        if (!env.getProperty("ratelimit.enabled", Boolean.class, true) || env.getPropertySources().contains(SOURCE)) {
            return;
        }
        env.getPropertySources().addLast(new MapPropertySource(SOURCE, Map.of("management.health.redis.enabled", "false")));
    }
}

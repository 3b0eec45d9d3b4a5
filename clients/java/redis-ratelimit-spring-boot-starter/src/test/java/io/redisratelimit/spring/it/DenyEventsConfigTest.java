package io.redisratelimit.spring.it;

import io.redisratelimit.client.DenyEvent;
import io.redisratelimit.client.DenyEventSink;
import io.redisratelimit.client.DenyEvents;
import io.redisratelimit.client.Limiter;
import io.redisratelimit.client.Origin;
import io.redisratelimit.spring.RateLimitAutoConfiguration;
import io.redisratelimit.spring.RateLimitConfigException;
import io.redisratelimit.spring.RateLimitService;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;
import org.springframework.boot.autoconfigure.AutoConfigurations;
import org.springframework.boot.test.context.runner.ApplicationContextRunner;

import java.nio.file.Files;
import java.util.List;
import java.util.UUID;
import java.util.concurrent.CopyOnWriteArrayList;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertInstanceOf;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertSame;
import static org.junit.jupiter.api.Assertions.assertTrue;

/** ratelimit.deny-events.*: each sink, a DenyEventSink bean, and bad settings refused naming the property. */
class DenyEventsConfigTest {
    private final ApplicationContextRunner runner = new ApplicationContextRunner()
            .withConfiguration(AutoConfigurations.of(RateLimitAutoConfiguration.class))
            .withPropertyValues("spring.data.redis.port=" + SharedRedis.get().port(), "ratelimit.app=deny-events-it",
                    "ratelimit.deadline=500ms", "ratelimit.deny-cache.enabled=false",
                    "ratelimit.rules.tight.algorithm=fixedwindow", "ratelimit.rules.tight.params=1,60000");

    private static Throwable root(Throwable t) {
        while (t.getCause() != null && !(t instanceof RateLimitConfigException)) {
            t = t.getCause();
        }
        return t;
    }

    @Test
    void offByDefault() {
        runner.run(ctx -> {
            assertNull(ctx.getStartupFailure());
            assertNull(ctx.getBean(Limiter.class).denyEvents());
        });
    }

    @Test
    void theFileSinkGetsTheStartersDenialsWithTheOrigin(@TempDir java.nio.file.Path dir) {
        java.nio.file.Path file = dir.resolve("deny.jsonl");
        String user = "u-" + UUID.randomUUID();
        runner.withPropertyValues("ratelimit.deny-events.sink=file", "ratelimit.deny-events.file=" + file,
                "ratelimit.deny-events.capacity=50", "ratelimit.deny-events.flush-events=10").run(ctx -> {
            DenyEvents events = ctx.getBean(Limiter.class).denyEvents();
            assertSame(ctx.getBean(DenyEvents.class), events);
            assertEquals(50, events.capacity());
            assertEquals(10, events.flushEvents());
            RateLimitService service = ctx.getBean(RateLimitService.class);
            service.admit(List.of("tight"), List.of(user), 1, Origin.of("198.51.100.9", "ua/1"));
            assertFalse(service.admit(List.of("tight"), List.of(user), 1, Origin.of("198.51.100.9", "ua/1")).decision().allowed());
            assertEquals(1, events.recorded());
        });
        // Closed with the context: what was buffered is in the file.
        try {
            List<String> lines = Files.readAllLines(file);
            assertEquals(1, lines.size());
            assertTrue(lines.get(0).contains("\"rule\":\"deny-events-it:tight\"") && lines.get(0).contains("\"client_ip\":\"198.51.100.9\"")
                    && lines.get(0).contains("\"user_agent\":\"ua/1\""), lines.get(0));
        } catch (java.io.IOException e) {
            throw new java.io.UncheckedIOException(e);
        }
    }

    @Test
    void aDenyEventSinkBeanIsTheCallback() {
        List<DenyEvent> got = new CopyOnWriteArrayList<>();
        runner.withBean(DenyEventSink.class, () -> got::addAll).run(ctx -> {
            DenyEvents events = ctx.getBean(Limiter.class).denyEvents();
            RateLimitService service = ctx.getBean(RateLimitService.class);
            String user = "u-" + UUID.randomUUID();
            service.check(List.of("tight"), user, 1);
            service.check(List.of("tight"), user, 1);
            events.flush();
            assertEquals(1, got.size());
            assertEquals("redis", got.get(0).level());
        });
    }

    @Test
    void badSettingsFailAtStartUpNamingTheProperty() {
        for (String[] bad : List.of(
                new String[] {"ratelimit.deny-events.sink", "ratelimit.deny-events.sink=kafka"},
                new String[] {"ratelimit.deny-events.file", "ratelimit.deny-events.sink=file"},
                new String[] {"ratelimit.deny-events.url", "ratelimit.deny-events.sink=bulk"},
                new String[] {"ratelimit.deny-events.url", "ratelimit.deny-events.sink=bulk", "ratelimit.deny-events.url=ftp://x"},
                new String[] {"ratelimit.deny-events.capacity", "ratelimit.deny-events.sink=file", "ratelimit.deny-events.file=/tmp/x",
                        "ratelimit.deny-events.capacity=0"},
                new String[] {"ratelimit.deny-events.timeout", "ratelimit.deny-events.sink=file", "ratelimit.deny-events.file=/tmp/x",
                        "ratelimit.deny-events.timeout=0s"},
                // A path the OS cannot name, a folder, an index Elasticsearch refuses on every batch, a URL with a query.
                new String[] {"ratelimit.deny-events.file", "ratelimit.deny-events.sink=file", "ratelimit.deny-events.file=/tmp/a\u0000b"},
                new String[] {"ratelimit.deny-events.file", "ratelimit.deny-events.sink=file",
                        "ratelimit.deny-events.file=" + System.getProperty("java.io.tmpdir")},
                new String[] {"ratelimit.deny-events.index", "ratelimit.deny-events.sink=bulk", "ratelimit.deny-events.url=http://127.0.0.1:9200",
                        "ratelimit.deny-events.index=RateLimit-Deny"},
                new String[] {"ratelimit.deny-events.url", "ratelimit.deny-events.sink=bulk", "ratelimit.deny-events.url=http://127.0.0.1:9200/?pretty"})) {
            runner.withPropertyValues(java.util.Arrays.copyOfRange(bad, 1, bad.length)).run(ctx -> {
                Throwable t = root(ctx.getStartupFailure());
                assertInstanceOf(RateLimitConfigException.class, t, String.join(" ", bad));
                assertEquals(bad[0], ((RateLimitConfigException) t).property(), t.getMessage());
            });
        }
    }
}

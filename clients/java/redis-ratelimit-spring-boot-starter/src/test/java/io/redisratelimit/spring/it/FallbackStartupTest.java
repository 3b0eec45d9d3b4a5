package io.redisratelimit.spring.it;

import io.redisratelimit.spring.RateLimitAutoConfiguration;
import io.redisratelimit.spring.RateLimitConfigException;
import io.redisratelimit.spring.RateLimitExceededException;
import io.redisratelimit.spring.RateLimited;
import org.junit.jupiter.api.Test;
import org.springframework.boot.autoconfigure.AutoConfigurations;
import org.springframework.boot.autoconfigure.aop.AopAutoConfiguration;
import org.springframework.boot.autoconfigure.data.redis.RedisAutoConfiguration;
import org.springframework.boot.test.context.runner.ApplicationContextRunner;

import java.util.List;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertInstanceOf;
import static org.junit.jupiter.api.Assertions.assertNotNull;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertTrue;

/**
 * {@code @RateLimited(fallback = "...")} is resolved when the bean is
 * created: a missing method, or one whose signature does not fit, fails the
 * context's start with a message naming it; a fitting one answers denials.
 */
class FallbackStartupTest {
    private final ApplicationContextRunner runner = new ApplicationContextRunner()
            .withConfiguration(AutoConfigurations.of(AopAutoConfiguration.class, RedisAutoConfiguration.class, RateLimitAutoConfiguration.class))
            .withPropertyValues("spring.application.name=fallback-it", "spring.data.redis.port=" + SharedRedis.get().port(),
                    "ratelimit.rules.catalog.algorithm=fixedwindow", "ratelimit.rules.catalog.params=1,3600000");

    /** The degrade handler is missing. */
    static class Missing {
        @RateLimited(rule = "catalog", fallback = "cachedItems")
        public List<String> items(String user) {
            return List.of("fresh");
        }
    }

    /** The degrade handler takes other parameters. */
    static class WrongParameters {
        @RateLimited(rule = "catalog", fallback = "cachedItems")
        public List<String> items(String user) {
            return List.of("fresh");
        }

        List<String> cachedItems(long user) {
            return List.of("cached");
        }
    }

    /** The degrade handler returns another type. */
    static class WrongReturn {
        @RateLimited(rule = "catalog", fallback = "cachedItems")
        public List<String> items(String user) {
            return List.of("fresh");
        }

        String cachedItems(String user, RateLimitExceededException e) {
            return "cached";
        }
    }

    /** A fitting handler: the parameters, then the denial. */
    public static class Fits {
        @RateLimited(rule = "catalog", key = "#user", fallback = "cachedItems")
        public List<String> items(String user) {
            return List.of("fresh");
        }

        List<String> cachedItems(String user, RateLimitExceededException e) {
            return List.of("cached", e.rule());
        }
    }

    private static String failure(Throwable startup) {
        assertNotNull(startup, "the context must not start");
        Throwable t = startup;
        while (t != null && !(t instanceof RateLimitConfigException)) {
            t = t.getCause();
        }
        assertInstanceOf(RateLimitConfigException.class, t, () -> "no RateLimitConfigException in " + startup);
        return t.getMessage();
    }

    @Test
    void aMissingFallbackFailsTheStartNamingIt() {
        runner.withBean(Missing.class).run(ctx -> assertEquals("@RateLimited(fallback = \"cachedItems\") on FallbackStartupTest.Missing.items(String): "
                + "no method cachedItems in " + Missing.class.getName() + "; declare List cachedItems(String) (optionally with a last"
                + " RateLimitExceededException parameter)", failure(ctx.getStartupFailure())));
    }

    @Test
    void aFallbackWithOtherParametersFailsTheStartNamingIt() {
        runner.withBean(WrongParameters.class).run(ctx -> {
            String m = failure(ctx.getStartupFailure());
            assertTrue(m.startsWith("@RateLimited(fallback = \"cachedItems\") on FallbackStartupTest.WrongParameters.items(String): "
                    + "the signature of List cachedItems(long) does not fit: it must take (String)"), m);
        });
    }

    @Test
    void aFallbackReturningAnotherTypeFailsTheStartNamingIt() {
        runner.withBean(WrongReturn.class).run(ctx -> {
            String m = failure(ctx.getStartupFailure());
            assertTrue(m.contains("the signature of String cachedItems(String, RateLimitExceededException) does not fit: it returns String,"
                    + " which is not a List"), m);
        });
    }

    @Test
    void aFittingFallbackAnswersTheDenialInsteadOfThrowing() {
        runner.withBean(Fits.class).run(ctx -> {
            assertNull(ctx.getStartupFailure());
            Fits bean = ctx.getBean(Fits.class);
            String user = "u-" + System.nanoTime();
            assertEquals(List.of("fresh"), bean.items(user));
            assertEquals(List.of("cached", "catalog"), bean.items(user), "denied: the fallback's answer, no exception");
        });
    }
}

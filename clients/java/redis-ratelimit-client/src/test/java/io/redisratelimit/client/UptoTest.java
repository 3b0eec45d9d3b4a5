package io.redisratelimit.client;

import io.redisratelimit.client.testing.Windows;
import org.junit.jupiter.params.ParameterizedTest;
import org.junit.jupiter.params.provider.EnumSource;

import java.util.List;
import java.util.UUID;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

/** {@code UPTO n} through the typed calls, on Lettuce and Jedis, standalone and cluster. */
class UptoTest extends EveryDriver {

    private static String key(String what) {
        return "t:upto:" + what + ":" + UUID.randomUUID();
    }

    /** The five algorithms that take UPTO, each with 5 units. */
    private static List<Spec> fives() {
        return List.of(Spec.tokenBucket(5, 1, 3_600_000), Spec.fixedWindow(5, Windows.FIXED_MS), Spec.sliding(5, Windows.FIXED_MS),
                Spec.hashWindow(5, 86_400_000, 3_600_000), Spec.quota(5, Period.YEAR));
    }

    @ParameterizedTest
    @EnumSource(Drivers.class)
    void uptoTakesAllThatFitsThenTheRestThenNothing(Drivers d) {
        Client rl = client(d);
        for (Spec spec : fives()) {
            String k = key(spec.algorithm().name());
            Decision three = rl.limit(k, spec, Request.upto(3));
            assertTrue(three.allowed(), spec + ": " + three);
            assertEquals(3, three.granted(), spec + ": " + three);
            assertEquals(2, three.remaining(), spec + ": " + three);
            assertEquals(5, three.limit());
            Decision two = rl.limit(k, spec, Request.upto(3));
            assertTrue(two.allowed(), spec + ": " + two);
            assertEquals(2, two.granted(), spec + ": takes what fits");
            assertEquals(0, two.remaining());
            Decision none = rl.limit(k, spec, Request.upto(3));
            assertFalse(none.allowed(), spec + ": " + none);
            assertEquals(0, none.granted());
            assertTrue(none.waitMs() > 0, spec + ": the denial COST 1 gets: " + none);
            // The same denial as COST 1's.
            Decision one = rl.limit(k, spec, Request.cost(1));
            assertFalse(one.allowed());
            assertEquals(0, one.granted());
            // A call without UPTO still answers five fields.
            assertEquals(0, rl.limit(k, spec, Request.cost(0)).remaining());
        }
    }

    @ParameterizedTest
    @EnumSource(Drivers.class)
    void uptoOnAPolicyAndOnRlAll(Drivers d) {
        Client rl = client(d);
        String policy = "upto-" + d + "-" + UUID.randomUUID();
        rl.policySet(policy, Spec.fixedWindow(4, Windows.FIXED_MS), PolicyMode.ENFORCE, 100);
        String k = key("hit");
        Decision hit = rl.hit(policy, k, Request.upto(10));
        assertTrue(hit.allowed());
        assertEquals(4, hit.granted());
        Decision hitNo = rl.hit(policy, k, Request.upto(10));
        assertFalse(hitNo.allowed());
        assertEquals(0, hitNo.granted());
        String tag = "{" + UUID.randomUUID() + "}";
        List<Limit> limits = List.of(Limit.of(tag + ":a", Spec.fixedWindow(5, Windows.FIXED_MS)),
                Limit.of(tag + ":b", Spec.tokenBucket(3, 1, 3_600_000)));
        Decision all = rl.all(limits, Request.upto(4));
        assertTrue(all.allowed(), all.toString());
        assertEquals(3, all.granted(), "what every limiter admits at once");
        Decision allNo = rl.all(limits, Request.upto(4));
        assertFalse(allNo.allowed());
        assertEquals(0, allNo.granted());
        assertEquals(1, allNo.deniedBy().getAsInt(), "the token bucket is spent: " + allNo);
        rl.policyDel(policy);
    }

    @ParameterizedTest
    @EnumSource(Drivers.class)
    void theErrorsNameUpto(Drivers d) {
        Client rl = client(d);
        InvalidArgumentException leaky = assertThrows(InvalidArgumentException.class,
                () -> rl.limit(key("lb"), Spec.leakyBucket(5, 1, 1000), Request.upto(2)));
        assertEquals("UPTO", leaky.parameter());
        assertEquals("UPTO is not an option of RL.LEAKYBUCKET", leaky.reason());
        InvalidArgumentException conc = assertThrows(InvalidArgumentException.class,
                () -> rl.concurrency(key("cc"), 5, 1000, Request.upto(2)));
        assertEquals("UPTO is not an option of RL.CONCURRENCY", conc.reason());
        assertEquals("UPTO", assertThrows(InvalidArgumentException.class,
                () -> rl.all(List.of(Limit.of(key("x"), Spec.leakyBucket(5, 1, 1000))), Request.upto(2))).parameter());
        String policy = "upto-leaky-" + d + "-" + UUID.randomUUID();
        rl.policySet(policy, Spec.leakyBucket(5, 1, 1000), PolicyMode.ENFORCE, 100);
        ServerErrorException e = assertThrows(ServerErrorException.class, () -> rl.hit(policy, key("h"), Request.upto(2)));
        assertTrue(e.getMessage().contains("UPTO is not an option of RL.HIT on a LEAKYBUCKET policy"), e.getMessage());
        rl.policyDel(policy);
        assertEquals("UPTO", assertThrows(InvalidArgumentException.class, () -> Request.upto(0)).parameter());
    }
}

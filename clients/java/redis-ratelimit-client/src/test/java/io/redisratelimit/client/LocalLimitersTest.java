package io.redisratelimit.client;

import io.redisratelimit.client.testing.Windows;
import org.junit.jupiter.api.Test;

import java.util.List;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertNotNull;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertTrue;

/** The in-process limiters behind the local level and the local-only fallback. */
class LocalLimitersTest {
    private static int admitted(LocalLimiters l, Spec spec, int tries) {
        int n = 0;
        for (int i = 0; i < tries; i++) {
            n += l.takeAll(List.of(new LocalLimiters.Take("k", spec)), 1) == null ? 1 : 0;
        }
        return n;
    }

    @Test
    void everyAlgorithmAdmitsItsLimitThenDeniesWithAWait() {
        for (Spec spec : List.of(Spec.tokenBucket(5, 1, 3_600_000), Spec.leakyBucket(5, 1, 3_600_000),
                Spec.fixedWindow(5, Windows.FIXED_MS), Spec.sliding(5, 3_600_000), Spec.hashWindow(5, 3_600_000, 60_000))) {
            LocalLimiters l = new LocalLimiters(100);
            assertEquals(5, admitted(l, spec, 20), spec.toString());
            LocalLimiters.Denied d = l.takeAll(List.of(new LocalLimiters.Take("k", spec)), 1);
            assertNotNull(d);
            assertTrue(d.decision().waitMs() > 0, spec + ": " + d.decision());
        }
    }

    @Test
    void aCostAboveTheLimitCanNeverPass() {
        LocalLimiters l = new LocalLimiters(100);
        LocalLimiters.Denied d = l.takeAll(List.of(new LocalLimiters.Take("k", Spec.fixedWindow(5, 1000))), 6);
        assertTrue(d.decision().never());
    }

    @Test
    void severalAreAllOrNothingAndGiveBackRestoresTheUnits() {
        LocalLimiters l = new LocalLimiters(100);
        LocalLimiters.Take roomy = new LocalLimiters.Take("a", Spec.fixedWindow(10, Windows.FIXED_MS));
        LocalLimiters.Take tight = new LocalLimiters.Take("b", Spec.fixedWindow(1, Windows.FIXED_MS));
        assertNull(l.takeAll(List.of(roomy, tight), 1));
        LocalLimiters.Denied d = l.takeAll(List.of(roomy, tight), 1);
        assertEquals(1, d.index(), "the second denied");
        l.giveBack(List.of(roomy, tight), 1);
        assertNull(l.takeAll(List.of(roomy, tight), 1), "the units came back");
        int left = 0;
        while (l.takeAll(List.of(roomy), 1) == null) {
            left++;
        }
        assertEquals(9, left, "10, minus the one the last set took: the denied set took nothing");
    }

    @Test
    void aTokenBucketRefills() throws InterruptedException {
        LocalLimiters l = new LocalLimiters(100);
        Spec spec = Spec.tokenBucket(1, 1, 20);
        assertEquals(1, admitted(l, spec, 5));
        long deadline = System.nanoTime() + 2_000_000_000L;
        while (l.takeAll(List.of(new LocalLimiters.Take("k", spec)), 1) != null) {
            assertTrue(System.nanoTime() < deadline, "refilled within 2 s");
            Thread.sleep(5);
        }
    }
}

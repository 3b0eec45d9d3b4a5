package io.redisratelimit.client;

import org.junit.jupiter.api.Test;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertTrue;

/**
 * The port of the core's algorithms on the edges the contract's golden
 * sequences do not reach: the core's own unit tests
 * ({@code core/src/token_bucket.rs}, {@code hash_window.rs},
 * {@code quota.rs}), with their numbers.
 */
class CoreAlgorithmsTest {
    private static final long T0_US = 1_700_000_000_000_000L;

    private static long at(long ms) {
        return T0_US + ms * 1000;
    }

    private static CoreAlgorithms.Verdict hit(CoreAlgorithms.State s, long[] p, long cost, long nowUs) {
        CoreAlgorithms.Verdict predicted = s.decide(p, cost, nowUs);
        CoreAlgorithms.Verdict d = CoreAlgorithms.run(s, p, CoreAlgorithms.Request.cost(cost), nowUs).decision();
        assertEquals(predicted, d, "decide and run agree");
        return d;
    }

    /** Units left under {@code next} after {@code consumed} under {@code old}, checked admitted exactly (the core's testkit). */
    private static long remainingAfterChange(Algorithm a, long[] old, long[] next, long consumed, long nowUs) {
        CoreAlgorithms.State s = CoreAlgorithms.idle(a, old, nowUs);
        assertTrue(hit(s, old, consumed, nowUs).allowed());
        long left = hit(s, next, 0, nowUs).remaining();
        if (left > 0) {
            CoreAlgorithms.Verdict d = hit(s, next, left, nowUs);
            assertTrue(d.allowed() && d.remaining() == 0, d.toString());
        }
        assertFalse(hit(s, next, 1, nowUs).allowed(), "a unit beyond the " + left + " shown");
        return left;
    }

    @Test
    void aFasterRateDoesNotRefillThePast() {
        long[] slow = {10, 1, 1000};
        long[] fast = {10, 1000, 1000};
        CoreAlgorithms.State s = CoreAlgorithms.idle(Algorithm.TOKENBUCKET, slow, at(0));
        hit(s, slow, 10, at(0));
        CoreAlgorithms.Verdict d = hit(s, fast, 0, at(500));
        assertEquals(0, d.remaining());
        assertEquals(9500, d.resetMs(), "nothing stored: still refilling at the slow rate");
        assertEquals(500, hit(s, fast, 1, at(500)).waitMs());
        d = hit(s, fast, 1, at(1000));
        assertTrue(d.allowed());
        assertEquals(10, d.resetMs());
    }

    @Test
    void afterARateChangeWaitMsIsWhenTheRequestFits() {
        long[] slow = {10, 1, 1000};
        long[] fast = {10, 1, 1};
        CoreAlgorithms.State s = CoreAlgorithms.idle(Algorithm.TOKENBUCKET, slow, at(0));
        hit(s, slow, 10, at(0));
        assertEquals(new CoreAlgorithms.Verdict(false, 10, 0, 1000, 10_000), hit(s, fast, 1, at(0)));
        assertFalse(hit(s, fast, 1, at(999)).allowed());
        assertTrue(hit(s, fast, 1, at(1000)).allowed());
        s = CoreAlgorithms.idle(Algorithm.TOKENBUCKET, fast, at(0));
        hit(s, fast, 10, at(0));
        CoreAlgorithms.Verdict d = hit(s, slow, 3, at(0));
        assertFalse(d.allowed());
        assertEquals(3, d.waitMs());
        assertFalse(hit(s, slow, 3, at(2)).allowed());
        assertTrue(hit(s, slow, 3, at(3)).allowed());
    }

    @Test
    void aNewRefillRateRefillsNothingAtOnceInEitherBucket() {
        long[] slow = {10, 1, 1000};
        for (Algorithm a : new Algorithm[] {Algorithm.TOKENBUCKET, Algorithm.LEAKYBUCKET}) {
            for (long[] next : new long[][] {{10, 1000, 1}, {10, 1, 3_600_000}, {100, 7, 3}}) {
                assertEquals(next[0] - 10, remainingAfterChange(a, slow, next, 10, at(0)), a + " " + next[2]);
            }
            assertEquals(90, remainingAfterChange(a, slow, new long[] {100, 1, 1000}, 10, at(0)));
            assertEquals(10, remainingAfterChange(a, new long[] {100, 1, 1000}, new long[] {20, 1, 1000}, 10, at(0)));
            // A part of a token refilled before the change stays a part.
            CoreAlgorithms.State s = CoreAlgorithms.idle(a, slow, at(0));
            hit(s, slow, 10, at(0));
            assertEquals(0, hit(s, new long[] {10, 1000, 1}, 0, at(999)).remaining(), a.toString());
        }
    }

    @Test
    void aQueueTellsWhenAnAdmittedRequestsTurnComes() {
        long[] p = {3, 1, 100};
        CoreAlgorithms.State s = CoreAlgorithms.idle(Algorithm.LEAKYBUCKET, p, at(0));
        assertEquals(new CoreAlgorithms.Verdict(true, 3, 2, 0, 100), hit(s, p, 1, at(0)));
        assertEquals(new CoreAlgorithms.Verdict(true, 3, 1, 100, 200), hit(s, p, 1, at(0)));
        assertEquals(new CoreAlgorithms.Verdict(true, 3, 1, 150, 150), hit(s, p, 0, at(50)), "a peek: the delay a request would get");
        assertEquals(new CoreAlgorithms.Verdict(false, 3, 1, 50, 150), hit(s, p, 2, at(50)));
        assertEquals(-1, hit(s, p, 4, at(50)).waitMs());
    }

    @Test
    void sixtyOneSecondBuckets() {
        long t0 = 1_700_000_000_000L - 1_700_000_000_000L % 3_600_000;
        long[] p = {10, 60_000, 1000};
        CoreAlgorithms.State s = CoreAlgorithms.idle(Algorithm.HASHWINDOW, p, (t0) * 1000);
        assertTrue(hit(s, p, 6, (t0 + 500) * 1000).allowed());
        assertTrue(hit(s, p, 4, (t0 + 30_500) * 1000).allowed());
        CoreAlgorithms.Verdict d = hit(s, p, 1, (t0 + 59_999) * 1000);
        assertFalse(d.allowed());
        assertEquals(1001, d.waitMs());
        assertEquals(31_001, d.resetMs());
        assertFalse(hit(s, p, 1, (t0 + 60_999) * 1000).allowed());
        d = hit(s, p, 6, (t0 + 61_000) * 1000);
        assertTrue(d.allowed());
        assertEquals(0, d.remaining());
        assertEquals(30_000, hit(s, p, 1, (t0 + 61_000) * 1000).waitMs());
    }

    @Test
    void newBucketSizesKeepTheUnits() {
        long t0 = 1_700_000_000_000L - 1_700_000_000_000L % 3_600_000;
        long[] a = {10, 60_000, 1000};
        long[] b = {10, 60_000, 10_000};
        CoreAlgorithms.State s = CoreAlgorithms.idle(Algorithm.HASHWINDOW, a, t0 * 1000);
        hit(s, a, 7, (t0 + 12_300) * 1000);
        // The 7 units now sit in the 10 s bucket [10 s, 20 s), which leaves the 60 s window at 80 s.
        CoreAlgorithms.Verdict d = hit(s, b, 4, (t0 + 12_400) * 1000);
        assertFalse(d.allowed());
        assertEquals(3, d.remaining());
        assertEquals(80_000 - 12_400, d.waitMs());
        // A 1 s window: the units may date from 12.999 s, in the 100 ms bucket [12.9 s, 13 s), leaving at 14 s.
        long[] c = {10, 1000, 100};
        assertFalse(hit(s, c, 10, (t0 + 13_999) * 1000).allowed());
        assertTrue(hit(s, c, 10, (t0 + 14_000) * 1000).allowed());
        assertEquals(90, remainingAfterChange(Algorithm.HASHWINDOW, a, new long[] {100, 60_000, 1000}, 10, (t0 + 30_500) * 1000));
        assertEquals(10, remainingAfterChange(Algorithm.HASHWINDOW, new long[] {100, 60_000, 1000}, new long[] {20, 60_000, 1000},
                10, (t0 + 30_500) * 1000));
    }

    @Test
    void aHashWindowReachingBackPastTheEpochKeepsItsUnits() {
        long[] p = {90, 1000, 10};
        CoreAlgorithms.State s = CoreAlgorithms.idle(Algorithm.HASHWINDOW, p, 10_000);
        assertTrue(hit(s, p, 2, 10_000).allowed());
        CoreAlgorithms.Verdict d = hit(s, p, 32, 250_000);
        assertTrue(d.allowed());
        assertEquals(56, d.remaining());
        d = hit(s, p, 57, 250_000);
        assertFalse(d.allowed());
        assertEquals(1020 - 250, d.waitMs());
        assertTrue(hit(s, p, 57, 1_020_000).allowed());
    }

    @Test
    void aHashWindowRefundGivesBackTheNewestUnitsFirst() {
        long[] p = {10, 1000, 100};
        CoreAlgorithms.State s = CoreAlgorithms.idle(Algorithm.HASHWINDOW, p, at(0));
        hit(s, p, 6, at(0));
        hit(s, p, 4, at(500));
        // 5 back: the 4 of 500 ms, then 1 of 0 ms. The reset still counts from the newest bucket (500 ms).
        CoreAlgorithms.Outcome o = CoreAlgorithms.run(s, p, CoreAlgorithms.Request.refund(5), at(500));
        assertTrue(o.changed());
        assertEquals(5, o.decision().remaining());
        assertEquals(1100, o.decision().resetMs());
        CoreAlgorithms.Verdict d = hit(s, p, 6, at(500));
        assertEquals(600, d.waitMs(), "the units of bucket 0 leave at 1100 ms");
    }

    @Test
    void aQuotaKeepsItsCountUntilTheStoredPeriodEnds() {
        long dayMs = 86_400_000L;
        long t0 = 1_772_928_000_000L; // 2026-03-08T00:00:00Z
        long[] day = {2, Period.DAY.ordinal(), (t0 + dayMs) * 1000};
        CoreAlgorithms.State s = CoreAlgorithms.idle(Algorithm.QUOTA, day, t0 * 1000);
        assertTrue(hit(s, day, 2, t0 * 1000).allowed());
        long[] month = {2, Period.MONTH.ordinal(), (t0 + 24 * dayMs) * 1000};
        CoreAlgorithms.Verdict d = hit(s, month, 1, (t0 + 5) * 1000);
        assertFalse(d.allowed());
        assertEquals(dayMs - 5, d.waitMs());
        d = hit(s, month, 1, (t0 + dayMs) * 1000);
        assertTrue(d.allowed());
        assertEquals(23 * dayMs, d.resetMs());
        assertEquals(9, hit(s, new long[] {10, Period.MONTH.ordinal(), (t0 + 24 * dayMs) * 1000}, 0, (t0 + dayMs) * 1000).remaining());
        // A denial a microsecond before the end waits 1 ms (rounded up).
        CoreAlgorithms.State q = CoreAlgorithms.idle(Algorithm.QUOTA, day, t0 * 1000);
        hit(q, day, 2, t0 * 1000);
        assertEquals(1, hit(q, day, 1, (t0 + dayMs) * 1000 - 1).waitMs());
    }

    @Test
    void utcPeriodsEndOnTheCalendar() {
        long dayMs = 86_400_000L;
        long t0 = 1_772_928_000_000L;
        long t = (t0 + 12 * 3_600_000) * 1000; // 2026-03-08T12:00Z, a Sunday
        assertEquals((t0 + dayMs) * 1000, CoreAlgorithms.utcPeriodEnd(Period.DAY, t));
        assertEquals((t0 + dayMs) * 1000, CoreAlgorithms.utcPeriodEnd(Period.WEEK, t), "Monday 03-09");
        assertEquals((t0 + 8 * dayMs) * 1000, CoreAlgorithms.utcPeriodEnd(Period.WEEK, (t0 + dayMs) * 1000));
        assertEquals(1_775_001_600_000L * 1000, CoreAlgorithms.utcPeriodEnd(Period.MONTH, t));
        assertEquals(1_798_761_600_000L * 1000, CoreAlgorithms.utcPeriodEnd(Period.YEAR, t));
        assertEquals(1_835_481_600_000L * 1000, CoreAlgorithms.utcPeriodEnd(Period.MONTH, 1_835_481_599_000L * 1000));
        assertEquals(1_835_395_200_000L * 1000, CoreAlgorithms.utcPeriodEnd(Period.DAY, 1_835_308_800_000L * 1000));
        for (long days : new long[] {0, 59, 365, 10_956, 20_520, 2_932_896}) {
            long[] ymd = CoreAlgorithms.civilFromDays(days);
            assertEquals(days, CoreAlgorithms.daysFromCivil(ymd[0], ymd[1], ymd[2]));
        }
        assertArrayEquals(new long[] {2028, 2, 29}, CoreAlgorithms.civilFromDays(1_835_395_200_000L / dayMs));
    }

    @Test
    void aSlidingLogCountsEachUnitUntilItsMillisecondLeaves() {
        long[] p = {10, 1000};
        CoreAlgorithms.State s = CoreAlgorithms.idle(Algorithm.SLIDING, p, at(0));
        hit(s, p, 10, at(0));
        assertTrue(CoreAlgorithms.run(s, p, CoreAlgorithms.Request.force(5), at(100)).changed());
        // The 10 of 0 ms leave at 1000 ms, the 5 forced at 100 ms at 1100 ms.
        assertEquals(900, hit(s, p, 5, at(100)).waitMs());
        assertEquals(1000, hit(s, p, 6, at(100)).waitMs());
        assertFalse(hit(s, p, 5, at(1000) - 1).allowed());
        assertTrue(hit(s, p, 5, at(1000)).allowed());
    }
}

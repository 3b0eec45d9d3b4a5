package io.redisratelimit.client.testing;

import org.junit.jupiter.api.Test;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

class WindowsTest {
    private static final long DAY = 86_400_000L;
    private static final long HOUR = 3_600_000L;

    @Test
    void midnightIsFoundInEveryZoneTheQuotaTestsUse() {
        assertEquals(0, Windows.minutesToMidnight(java.time.Instant.parse("2026-12-01T23:59:30Z")), "UTC");
        assertEquals(0, Windows.minutesToMidnight(java.time.Instant.parse("2026-12-01T18:29:30Z")), "+05:30");
        assertEquals(0, Windows.minutesToMidnight(java.time.Instant.parse("2026-12-02T04:59:30Z")), "New York in winter");
        assertTrue(Windows.minutesToMidnight(java.time.Instant.parse("2026-12-01T20:00:00Z")) >= 2);
    }

    @Test
    void aWindowWithRoomIsKeptAsItIs() {
        assertEquals(DAY, Windows.withRoom(20 * DAY + HOUR, DAY, HOUR));
    }

    @Test
    void aWindowAboutToTurnOverIsLengthenedUntilItHasRoom() {
        long now = 20 * DAY - 1_000;
        long w = Windows.withRoom(now, DAY, HOUR);
        assertTrue(w - Math.floorMod(now, w) >= HOUR, "window " + w);
    }
}

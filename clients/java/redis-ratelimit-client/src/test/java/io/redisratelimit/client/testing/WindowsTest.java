package io.redisratelimit.client.testing;

import org.junit.jupiter.api.Test;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

class WindowsTest {
    private static final long DAY = 86_400_000L;
    private static final long HOUR = 3_600_000L;

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

package io.redisratelimit.client.testing;

/**
 * Fixed windows are aligned to the epoch, so a test that reads one across
 * several calls sees it start again if a boundary falls between them (a
 * 60 s window turns over every minute). Tests that count in a fixed window
 * use {@link #FIXED_MS}: a window that cannot turn over while the tests run.
 */
public final class Windows {
    private static final long DAY_MS = 86_400_000L;
    private static final long ROOM_MS = 3_600_000L;

    /** A window of about a day whose current window has at least an hour left when the tests start. */
    public static final long FIXED_MS = withRoom(System.currentTimeMillis(), DAY_MS, ROOM_MS);

    private Windows() {
    }

    /** The first length from {@code base} up, in steps of a second, whose window at {@code now} ends at least {@code room} later. */
    static long withRoom(long now, long base, long room) {
        long w = base;
        while (w - Math.floorMod(now, w) < room) {
            w += 1_000;
        }
        return w;
    }
}

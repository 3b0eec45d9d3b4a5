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

    /** The zones the calendar-quota tests count in (a week, month or year ends at one of their midnights). */
    private static final java.util.List<java.time.ZoneId> QUOTA_ZONES = java.util.stream.Stream.of("UTC", "+05:30", "-09:00",
            "America/New_York", "Asia/Kolkata", "Asia/Tokyo", "Europe/Paris").map(java.time.ZoneId::of).toList();

    private Windows() {
    }

    /**
     * Returns once no calendar day of the quota tests' zones ends within the
     * next two minutes (polling; at most a few minutes a day): a quota counted
     * across a midnight would start again between two calls.
     */
    public static void awayFromMidnight() throws InterruptedException {
        while (minutesToMidnight(java.time.Instant.now()) < 2) {
            Thread.sleep(1_000);
        }
    }

    /** Whole minutes until the next midnight in any of the quota tests' zones. */
    static long minutesToMidnight(java.time.Instant now) {
        long least = Long.MAX_VALUE;
        for (java.time.ZoneId z : QUOTA_ZONES) {
            java.time.ZonedDateTime t = now.atZone(z);
            java.time.ZonedDateTime midnight = t.toLocalDate().plusDays(1).atStartOfDay(z);
            least = Math.min(least, java.time.Duration.between(t, midnight).toMinutes());
        }
        return least;
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

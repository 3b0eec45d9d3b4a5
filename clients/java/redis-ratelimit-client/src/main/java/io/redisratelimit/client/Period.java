package io.redisratelimit.client;

import java.time.DayOfWeek;
import java.time.Instant;
import java.time.LocalDate;
import java.time.ZoneId;
import java.time.temporal.TemporalAdjusters;

/**
 * The calendar period of a quota ({@code RL.QUOTA key limit DAY|WEEK|MONTH|YEAR}):
 * a day, an ISO week (from Monday), a month or a year, in the quota's zone.
 */
public enum Period {
    DAY(86_400),
    WEEK(604_800),
    MONTH(2_592_000),
    YEAR(31_536_000);

    private final long nominalSeconds;

    Period(long nominalSeconds) {
        this.nominalSeconds = nominalSeconds;
    }

    /**
     * The period's nominal length in seconds (a day 86400, a week 604800, a
     * month 30 days, a year 365 days): the {@code w} of
     * {@code RateLimit-Policy} for a quota. The server counts real calendar
     * periods (a month of 28 to 31 days, a day of 23 or 25 hours at a
     * daylight-saving change).
     */
    public long nominalSeconds() {
        return nominalSeconds;
    }

    /** Parses {@code day}, {@code DAY}, {@code Week}, ...; anything else is a {@link InvalidArgumentException} naming {@code period}. */
    public static Period parse(String word) {
        if (word != null) {
            for (Period p : values()) {
                if (p.name().equalsIgnoreCase(word.trim())) {
                    return p;
                }
            }
        }
        throw new InvalidArgumentException("period", "must be one of day, week, month, year, not '" + word + "'");
    }

    /** The period holding {@code now} in {@code zone}: its start and end, in epoch ms. */
    long[] bounds(long nowMs, ZoneId zone) {
        LocalDate today = Instant.ofEpochMilli(nowMs).atZone(zone).toLocalDate();
        LocalDate start = switch (this) {
            case DAY -> today;
            case WEEK -> today.with(TemporalAdjusters.previousOrSame(DayOfWeek.MONDAY));
            case MONTH -> today.withDayOfMonth(1);
            case YEAR -> today.withDayOfYear(1);
        };
        LocalDate end = switch (this) {
            case DAY -> start.plusDays(1);
            case WEEK -> start.plusWeeks(1);
            case MONTH -> start.plusMonths(1);
            case YEAR -> start.plusYears(1);
        };
        return new long[] {start.atStartOfDay(zone).toInstant().toEpochMilli(), end.atStartOfDay(zone).toInstant().toEpochMilli()};
    }

    /** The word the server takes: {@code DAY}, ... */
    public String word() {
        return name();
    }
}

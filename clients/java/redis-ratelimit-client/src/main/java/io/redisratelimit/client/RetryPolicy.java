package io.redisratelimit.client;

import java.time.Duration;
import java.time.ZonedDateTime;
import java.time.format.DateTimeFormatter;
import java.util.Optional;
import java.util.concurrent.ThreadLocalRandom;
import java.util.function.Function;
import java.util.function.Supplier;

/**
 * Backoff for callers of a rate-limited service: exponential delays (1, 2, 4 s
 * by default) plus up to 0.5 s of jitter, at most 3 retries, never earlier
 * than the answer's {@code Retry-After}, and never past a total cap.
 */
public final class RetryPolicy {
    /** Sleeps; replaced in tests. */
    @FunctionalInterface
    public interface Sleeper {
        void sleep(Duration d) throws InterruptedException;
    }

    private final Duration base;
    private final Duration maxJitter;
    private final int maxRetries;
    private final Duration totalCap;
    private final Sleeper sleeper;

    private RetryPolicy(Duration base, Duration maxJitter, int maxRetries, Duration totalCap, Sleeper sleeper) {
        if (maxRetries < 0) {
            throw new InvalidArgumentException("max-retries", "must be at least 0");
        }
        this.base = base;
        this.maxJitter = maxJitter;
        this.maxRetries = maxRetries;
        this.totalCap = totalCap;
        this.sleeper = sleeper;
    }

    /** 1 s, doubling; up to 0.5 s jitter; 3 retries; 30 s in total. */
    public static RetryPolicy defaults() {
        return new RetryPolicy(Duration.ofSeconds(1), Duration.ofMillis(500), 3, Duration.ofSeconds(30), d -> Thread.sleep(d.toMillis()));
    }

    public RetryPolicy base(Duration d) {
        return new RetryPolicy(d, maxJitter, maxRetries, totalCap, sleeper);
    }

    public RetryPolicy maxJitter(Duration d) {
        return new RetryPolicy(base, d, maxRetries, totalCap, sleeper);
    }

    public RetryPolicy maxRetries(int n) {
        return new RetryPolicy(base, maxJitter, n, totalCap, sleeper);
    }

    public RetryPolicy totalCap(Duration d) {
        return new RetryPolicy(base, maxJitter, maxRetries, d, sleeper);
    }

    public RetryPolicy sleeper(Sleeper s) {
        return new RetryPolicy(base, maxJitter, maxRetries, totalCap, s);
    }

    /**
     * The delay before retry number {@code retry} (0-based): {@code base * 2^retry}
     * plus jitter, and at least {@code retryAfter}; empty when retries are used
     * up or when waiting would pass the total cap ({@code waitedSoFar} included).
     */
    public Optional<Duration> delay(int retry, Duration retryAfter, Duration waitedSoFar) {
        if (retry >= maxRetries) {
            return Optional.empty();
        }
        long jitter = maxJitter.isZero() ? 0 : ThreadLocalRandom.current().nextLong(maxJitter.toMillis() + 1);
        Duration backoff = base.multipliedBy(1L << Math.min(retry, 30)).plusMillis(jitter);
        Duration d = retryAfter != null && retryAfter.compareTo(backoff) > 0 ? retryAfter : backoff;
        if (waitedSoFar.plus(d).compareTo(totalCap) > 0) {
            return Optional.empty();
        }
        return Optional.of(d);
    }

    /**
     * Calls until {@code retryAfterOf} says the result needs no retry (empty),
     * or the retries are used up; answers the last result.
     *
     * @param retryAfterOf empty for a result to keep; else the wait it asks for
     *                     ({@link Duration#ZERO} when it names none)
     */
    public <T> T execute(Supplier<T> call, Function<T, Optional<Duration>> retryAfterOf) throws InterruptedException {
        Duration waited = Duration.ZERO;
        for (int retry = 0; ; retry++) {
            T result = call.get();
            Optional<Duration> asked = retryAfterOf.apply(result);
            if (asked.isEmpty()) {
                return result;
            }
            Optional<Duration> d = delay(retry, asked.get(), waited);
            if (d.isEmpty()) {
                return result;
            }
            sleeper.sleep(d.get());
            waited = waited.plus(d.get());
        }
    }

    /** Parses a {@code Retry-After} value: delay seconds or an HTTP date. */
    public static Optional<Duration> parseRetryAfter(String value) {
        if (value == null || value.isBlank()) {
            return Optional.empty();
        }
        String v = value.trim();
        try {
            return Optional.of(Duration.ofSeconds(Math.max(0, Long.parseLong(v))));
        } catch (NumberFormatException e) {
            try {
                ZonedDateTime at = ZonedDateTime.parse(v, DateTimeFormatter.RFC_1123_DATE_TIME);
                Duration d = Duration.between(ZonedDateTime.now(at.getZone()), at);
                return Optional.of(d.isNegative() ? Duration.ZERO : d);
            } catch (RuntimeException e2) {
                return Optional.empty();
            }
        }
    }
}

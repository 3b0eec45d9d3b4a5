package io.redisratelimit.client;

import org.junit.jupiter.api.Test;

import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.Optional;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

class RetryPolicyTest {
    @Test
    void backsOffOneTwoFourSecondsWithHalfASecondOfJitterAtMostThreeTimes() throws Exception {
        List<Duration> slept = new ArrayList<>();
        RetryPolicy p = RetryPolicy.defaults().sleeper(slept::add);
        int[] calls = {0};
        String result = p.execute(() -> "429 #" + ++calls[0], r -> Optional.of(Duration.ZERO));
        assertEquals("429 #4", result, "the first call and 3 retries");
        assertEquals(3, slept.size());
        long[] base = {1000, 2000, 4000};
        for (int i = 0; i < 3; i++) {
            long ms = slept.get(i).toMillis();
            assertTrue(ms >= base[i] && ms <= base[i] + 500, "retry " + i + ": " + ms);
        }
    }

    @Test
    void neverRetriesEarlierThanRetryAfter() throws Exception {
        List<Duration> slept = new ArrayList<>();
        RetryPolicy p = RetryPolicy.defaults().sleeper(slept::add);
        p.execute(() -> 429, r -> Optional.of(Duration.ofSeconds(7)));
        assertEquals(Duration.ofSeconds(7), slept.get(0));
        assertEquals(Duration.ofSeconds(7), slept.get(1));
        assertTrue(slept.get(0).compareTo(Duration.ofSeconds(7)) >= 0);
    }

    @Test
    void stopsAtTheTotalCapAndWhenTheCallSucceeds() throws Exception {
        List<Duration> slept = new ArrayList<>();
        RetryPolicy p = RetryPolicy.defaults().totalCap(Duration.ofSeconds(10)).sleeper(slept::add);
        p.execute(() -> 429, r -> Optional.of(Duration.ofSeconds(6)));
        assertEquals(1, slept.size(), "a second 6 s wait would pass the 10 s cap");
        slept.clear();
        int[] calls = {0};
        p.execute(() -> ++calls[0], r -> r < 2 ? Optional.of(Duration.ZERO) : Optional.empty());
        assertEquals(2, calls[0]);
    }

    @Test
    void parsesRetryAfterSecondsAndDates() {
        assertEquals(Optional.of(Duration.ofSeconds(3)), RetryPolicy.parseRetryAfter("3"));
        assertTrue(RetryPolicy.parseRetryAfter("Wed, 21 Oct 2015 07:28:00 GMT").isPresent());
        assertTrue(RetryPolicy.parseRetryAfter("soon").isEmpty());
    }
}

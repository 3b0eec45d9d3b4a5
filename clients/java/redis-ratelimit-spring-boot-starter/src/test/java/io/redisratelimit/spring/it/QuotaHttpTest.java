package io.redisratelimit.spring.it;

import io.redisratelimit.client.testing.RedisServer;
import org.junit.jupiter.api.Test;
import org.springframework.boot.test.context.SpringBootTest;
import org.springframework.boot.test.web.server.LocalServerPort;
import org.springframework.test.context.DynamicPropertyRegistry;
import org.springframework.test.context.DynamicPropertySource;

import java.net.http.HttpResponse;
import java.time.Instant;
import java.time.LocalDate;
import java.time.ZoneId;
import java.time.ZoneOffset;
import java.util.UUID;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

/**
 * Calendar quotas as route rules, over real HTTP: a UTC day, a month in New
 * York, and a day in Kolkata sharing an {@code @RateLimited} with a total
 * (every one a policy; the zoned ones {@code RL.POLICY SET ... TZ zone}).
 */
@SpringBootTest(classes = OrderApp.class, webEnvironment = SpringBootTest.WebEnvironment.RANDOM_PORT, properties = {
        "spring.application.name=quota-http-it",
        "ratelimit.deadline=2s",
        "ratelimit.rules.exports.algorithm=quota",
        "ratelimit.rules.exports.params=2",
        "ratelimit.rules.exports.period=day",
        "ratelimit.rules.exports.routes=/search",
        "ratelimit.rules.exports.key=#request.getHeader('X-User')",
        "ratelimit.rules.monthly.algorithm=quota",
        "ratelimit.rules.monthly.params=1",
        "ratelimit.rules.monthly.period=MONTH",
        "ratelimit.rules.monthly.zone=America/New_York",
        "ratelimit.rules.monthly.routes=/bare",
        "ratelimit.rules.monthly.key=#request.getHeader('X-User')",
        "ratelimit.rules.order-create.algorithm=quota",
        "ratelimit.rules.order-create.params=2",
        "ratelimit.rules.order-create.period=day",
        "ratelimit.rules.order-create.zone=Asia/Kolkata",
        "ratelimit.rules.order-create.key-prefix={order}:quota-user:",
        "ratelimit.rules.order-total.algorithm=fixedwindow",
        "ratelimit.rules.order-total.params=15000,1000",
        "ratelimit.rules.order-total.fixed-key={order}:quota-total",
})
class QuotaHttpTest {
    @DynamicPropertySource
    static void redis(DynamicPropertyRegistry r) {
        RedisServer s = SharedRedis.get();
        r.add("spring.data.redis.host", () -> "127.0.0.1");
        r.add("spring.data.redis.port", s::port);
    }

    @LocalServerPort
    int port;

    @org.junit.jupiter.api.BeforeEach
    void awayFromMidnight() throws InterruptedException {
        io.redisratelimit.client.testing.Windows.awayFromMidnight();
    }

    private static long secondsToEnd(ZoneId zone, boolean month) {
        LocalDate today = LocalDate.now(zone);
        LocalDate end = month ? today.withDayOfMonth(1).plusMonths(1) : today.plusDays(1);
        return end.atStartOfDay(zone).toEpochSecond() - Instant.now().getEpochSecond();
    }

    @Test
    void aDailyQuotaAnswersTheNominalDayAsWAndRetryAfterTheNextDay() {
        String user = "e-" + UUID.randomUUID();
        HttpResponse<String> first = Http.send("GET", port, "/search", user);
        assertEquals(200, first.statusCode());
        assertEquals("\"exports\";q=2;w=86400", first.headers().firstValue("RateLimit-Policy").orElseThrow());
        String t = first.headers().firstValue("RateLimit").orElseThrow().replaceAll(".*;t=", "");
        assertTrue(Math.abs(Long.parseLong(t) - secondsToEnd(ZoneOffset.UTC, false)) <= 5, "t is the end of the UTC day: " + t);
        assertEquals(200, Http.send("GET", port, "/search", user).statusCode());
        HttpResponse<String> denied = Http.send("GET", port, "/search", user);
        assertEquals(429, denied.statusCode());
        long retryAfter = Long.parseLong(denied.headers().firstValue("Retry-After").orElseThrow());
        assertTrue(Math.abs(retryAfter - secondsToEnd(ZoneOffset.UTC, false)) <= 5, "Retry-After is the next UTC day: " + retryAfter);
        assertTrue(denied.body().contains("\"violated-policies\":[\"exports\"]"), denied.body());
    }

    @Test
    void aZonedMonthlyQuotaIsAPolicyAndEndsAtTheZonesMonth() {
        String user = "m-" + UUID.randomUUID();
        HttpResponse<String> first = Http.send("GET", port, "/bare", user);
        assertEquals(200, first.statusCode());
        assertEquals("\"monthly\";q=1;w=2592000", first.headers().firstValue("RateLimit-Policy").orElseThrow());
        HttpResponse<String> denied = Http.send("GET", port, "/bare", user);
        assertEquals(429, denied.statusCode());
        long retryAfter = Long.parseLong(denied.headers().firstValue("Retry-After").orElseThrow());
        assertTrue(Math.abs(retryAfter - secondsToEnd(ZoneId.of("America/New_York"), true)) <= 5,
                "Retry-After is the next month in New York: " + retryAfter);
    }

    @Test
    void aZonedQuotaSharesAnAnnotationWithAnotherRule() {
        String user = "o-" + UUID.randomUUID();
        HttpResponse<String> first = Http.send("POST", port, "/api/order/create", user);
        assertEquals(200, first.statusCode(), first.body());
        assertEquals("\"order-create\";q=2;w=86400, \"order-total\";q=15000;w=1",
                first.headers().firstValue("RateLimit-Policy").orElseThrow());
        assertEquals(200, Http.send("POST", port, "/api/order/create", user).statusCode());
        HttpResponse<String> denied = Http.send("POST", port, "/api/order/create", user);
        assertEquals(429, denied.statusCode());
        long retryAfter = Long.parseLong(denied.headers().firstValue("Retry-After").orElseThrow());
        assertTrue(Math.abs(retryAfter - secondsToEnd(ZoneId.of("Asia/Kolkata"), false)) <= 5,
                "Retry-After is midnight in Kolkata: " + retryAfter);
        assertTrue(denied.body().contains("\"violated-policies\":[\"order-create\"]"), denied.body());
    }
}

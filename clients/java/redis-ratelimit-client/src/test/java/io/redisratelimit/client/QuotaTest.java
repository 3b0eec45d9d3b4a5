package io.redisratelimit.client;

import org.junit.jupiter.api.Test;
import org.junit.jupiter.params.ParameterizedTest;
import org.junit.jupiter.params.provider.EnumSource;

import java.time.Duration;
import java.time.ZoneId;
import java.time.ZoneOffset;
import java.util.List;
import java.util.UUID;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertNotNull;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

/** RL.QUOTA: the typed calls, as a policy, in RL.ALL and in the limiter, on Lettuce and Jedis, standalone and cluster. */
class QuotaTest extends EveryDriver {

    @org.junit.jupiter.api.BeforeEach
    void awayFromMidnight() throws InterruptedException {
        io.redisratelimit.client.testing.Windows.awayFromMidnight();
    }

    private static String key(String what) {
        return "{q}:" + what + ":" + UUID.randomUUID();
    }

    /** The ms from now to the end of the period holding now in {@code zone}, as Java's calendar has it. */
    private static long untilEnd(Period period, ZoneId zone) {
        long now = System.currentTimeMillis();
        return period.bounds(now, zone)[1] - now;
    }

    private static void assertNear(long expected, long actual, String what) {
        assertTrue(Math.abs(expected - actual) < 5_000, what + ": expected about " + expected + " ms, got " + actual);
    }

    @ParameterizedTest
    @EnumSource(Drivers.class)
    void aDailyQuotaAdmitsItsLimitThenDeniesUntilTheNextDay(Drivers d) {
        Client rl = client(d);
        String k = key("day");
        for (int i = 0; i < 3; i++) {
            Decision ok = rl.quota(k, 3, Period.DAY);
            assertTrue(ok.allowed(), ok.toString());
            assertEquals(3, ok.limit());
            assertEquals(2 - i, ok.remaining());
            assertNear(untilEnd(Period.DAY, ZoneOffset.UTC), ok.resetMs(), "reset_ms is the time to the end of the UTC day");
        }
        Decision no = rl.quota(k, 3, Period.DAY);
        assertFalse(no.allowed());
        assertNear(untilEnd(Period.DAY, ZoneOffset.UTC), no.waitMs(), "a denial waits for the next day");
        assertTrue(rl.quota(k, 3, Period.DAY, null, Request.cost(4)).never(), "a cost above the limit can never pass");
        assertTrue(rl.quota(k, 3, Period.DAY, "UTC", Request.refund(1)).allowed());
        assertTrue(rl.quota(k, 3, Period.DAY).allowed(), "the refunded unit");
        assertEquals(0, rl.quota(k, 3, Period.DAY, null, Request.cost(0)).remaining());
    }

    @ParameterizedTest
    @EnumSource(Drivers.class)
    void everyPeriodAndZoneEndsWhereJavasCalendarEndsIt(Drivers d) throws Exception {
        Client rl = client(d);
        for (Period p : Period.values()) {
            for (String zone : new String[] {null, "+05:30", "-09:00", "America/New_York", "Asia/Kolkata"}) {
                ZoneId id = zone == null ? ZoneOffset.UTC : ZoneId.of(zone);
                Decision ok = rl.quotaAsync(key("p"), 10, p, zone).toCompletableFuture().get();
                assertTrue(ok.allowed());
                assertNear(untilEnd(p, id), ok.resetMs(), p + " in " + zone);
            }
        }
    }

    @Test
    void theArgumentsAreCheckedBeforeAnythingIsSent() {
        Client rl = client(Drivers.LETTUCE);
        assertEquals("limit", assertThrows(InvalidArgumentException.class, () -> rl.quota(key("bad"), 0, Period.DAY)).parameter());
        assertEquals("limit", assertThrows(InvalidArgumentException.class, () -> Spec.quota(Spec.MAX_PARAM + 1, Period.DAY)).parameter());
        assertEquals("period", assertThrows(InvalidArgumentException.class, () -> rl.quota(key("bad"), 5, null)).parameter());
        assertEquals("period", assertThrows(InvalidArgumentException.class, () -> Period.parse("fortnight")).parameter());
        assertEquals("period", assertThrows(InvalidArgumentException.class, () -> Spec.of(Algorithm.QUOTA, 5)).parameter());
        for (String zone : new String[] {"", "+8", "+26:00", "+05:60", "../etc/passwd", "/etc/localtime", "EST5EDT,M3.2.0,M11.1.0", "Mars Olympus"}) {
            assertEquals("zone", assertThrows(InvalidArgumentException.class, () -> rl.quota(key("bad"), 5, Period.DAY, zone)).parameter(), zone);
        }
        assertEquals(Period.WEEK, Period.parse("week"));
        assertEquals(Period.MONTH, Period.parse("Month"));
        assertEquals(Algorithm.QUOTA, Algorithm.parse("quota"));
        assertNull(Spec.quota(5, Period.DAY, "utc").zone(), "UTC in any case is the default");
        assertEquals(List.of("QUOTA", "5", "WEEK", "TZ", "Europe/Paris"), Spec.quota(5, Period.WEEK, "Europe/Paris").words());
        assertEquals(86_400, Spec.quota(5, Period.DAY).windowSeconds());
        assertEquals(2_592_000, Spec.quota(5, Period.MONTH).windowSeconds());
    }

    @Test
    void aZoneTheServerDoesNotKnowIsAServerError() {
        ServerErrorException e = assertThrows(ServerErrorException.class,
                () -> client(Drivers.JEDIS).quota(key("mars"), 5, Period.DAY, "Mars/Olympus"));
        assertTrue(e.getMessage().contains("TZ must be UTC"), e.getMessage());
    }

    @ParameterizedTest
    @EnumSource(Drivers.class)
    void aQuotaPolicyIsHitAndReadBackAndGoesInAll(Drivers d) {
        Client rl = client(d);
        String name = "test:quota:" + d;
        rl.policySet(name, Spec.quota(2, Period.MONTH), PolicyMode.ENFORCE, 100);
        PolicyInfo info = rl.policyGet(name).orElseThrow();
        assertEquals(Spec.quota(2, Period.MONTH), info.spec());
        assertEquals(List.of(2L), info.params());
        String k = key("hit");
        assertTrue(rl.hit(name, k).allowed());
        assertTrue(rl.hit(name, k).allowed());
        Decision no = rl.hit(name, k);
        assertFalse(no.allowed());
        assertNear(untilEnd(Period.MONTH, ZoneOffset.UTC), no.waitMs(), "until the next month");
        assertEquals("UTC", info.zone(), "the server names a UTC quota's zone");
        rl.policyDel(name);

        String a = key("all-a");
        String b = key("all-b");
        List<Limit> limits = List.of(Limit.of(a, Spec.quota(1, Period.YEAR)), Limit.of(b, Spec.sliding(10, 60_000)));
        assertTrue(rl.all(limits).allowed());
        Decision denied = rl.all(limits);
        assertFalse(denied.allowed());
        assertEquals(0, denied.deniedBy().getAsInt());
        assertEquals("zone", assertThrows(InvalidArgumentException.class,
                () -> Limit.of(a, Spec.quota(1, Period.DAY, "Europe/Paris"))).parameter());
    }

    @ParameterizedTest
    @EnumSource(Drivers.class)
    void aZonedQuotaPolicyIsReadBackAndCountsInItsZoneThroughHitAndAll(Drivers d) {
        Client rl = client(d);
        String name = "test:quota-ny:" + d;
        ZoneId ny = ZoneId.of("America/New_York");
        Spec spec = Spec.quota(2, Period.DAY, "America/New_York");
        rl.policySet(name, spec, PolicyMode.ENFORCE, 100);
        PolicyInfo info = rl.policyGet(name).orElseThrow();
        assertEquals(spec, info.spec(), "the zone is part of the spec read back");
        assertEquals("America/New_York", info.zone());
        assertEquals(List.of(2L), info.params());
        assertEquals(PolicyMode.ENFORCE, info.mode());
        String k = key("ny");
        Decision first = rl.hit(name, k);
        assertTrue(first.allowed());
        assertNear(untilEnd(Period.DAY, ny), first.resetMs(), "RL.HIT counts the New York day");
        assertTrue(rl.hit(name, k).allowed());
        Decision no = rl.hit(name, k);
        assertFalse(no.allowed());
        assertNear(untilEnd(Period.DAY, ny), no.waitMs(), "until midnight in New York");

        // RL.ALL ... POLICY name counts in the policy's zone, beside an inline UTC quota.
        String a = key("ny-all-a");
        String b = key("ny-all-b");
        List<Limit> limits = List.of(Limit.of(b, Spec.quota(10, Period.DAY)), Limit.policy(a, name));
        assertTrue(rl.all(limits).allowed());
        assertTrue(rl.all(limits).allowed());
        Decision denied = rl.all(limits);
        assertFalse(denied.allowed());
        assertEquals(1, denied.deniedBy().getAsInt());
        assertNear(untilEnd(Period.DAY, ny), denied.waitMs(), "RL.ALL waits for the New York day");
        assertEquals(8, rl.quota(b, 10, Period.DAY, null, Request.cost(0)).remaining(), "the denial changed nothing");

        // The mode, the roll-out and a fixed offset go with the zone; a UTC one has no TZ.
        rl.policySet(name, Spec.quota(5, Period.WEEK, "+05:30"), PolicyMode.SHADOW, 40);
        PolicyInfo shadow = rl.policyGet(name).orElseThrow();
        assertEquals(Spec.quota(5, Period.WEEK, "+05:30"), shadow.spec());
        assertEquals("+05:30", shadow.zone());
        assertEquals(PolicyMode.SHADOW, shadow.mode());
        assertEquals(40, shadow.rollout());
        assertNear(untilEnd(Period.WEEK, ZoneOffset.ofHoursMinutes(5, 30)), rl.hit(name, key("ist")).resetMs(), "the week in +05:30");
        rl.policySet(name, Spec.quota(5, Period.WEEK, "utc"), PolicyMode.ENFORCE, 100);
        assertEquals("UTC", rl.policyGet(name).orElseThrow().zone());
        assertNull(rl.policyGet(name).orElseThrow().spec().zone());
        rl.policyDel(name);
        assertEquals(List.of("QUOTA", "5", "WEEK"), Spec.quota(5, Period.WEEK, "UTC").words(), "UTC is sent without TZ");
    }

    @Test
    void aPolicyTheServerAnswersWithAZoneIsParsed() {
        List<Object> reply = List.of("name", "p", "algorithm", "QUOTA", "params", List.of(100L, "MONTH"), "mode", "ENFORCE",
                "rollout", 100L, "zone", "Asia/Kolkata", "calls", 3L, "admitted", 2L, "denied", 1L, "shadow_denied", 0L);
        PolicyInfo info = Client.parsePolicy("p", reply).orElseThrow();
        assertEquals(Spec.quota(100, Period.MONTH, "Asia/Kolkata"), info.spec());
        assertEquals("Asia/Kolkata", info.zone());
        assertEquals(3, info.calls());
        assertEquals(0, info.shadowDenied());
        List<Object> sliding = List.of("name", "s", "algorithm", "SLIDING", "params", List.of(10L, 1000L), "mode", "SHADOW",
                "rollout", 50L, "calls", 0L, "admitted", 0L, "denied", 0L, "shadow_denied", 0L);
        PolicyInfo other = Client.parsePolicy("s", sliding).orElseThrow();
        assertNull(other.zone(), "the other algorithms have no zone field");
        assertEquals(Spec.sliding(10, 1000), other.spec());
        assertEquals(50, other.rollout());
    }

    @Test
    void anAcquireOfAnExhaustedQuotaIsDeniedAtItsTimeout() {
        Client rl = client(Drivers.LETTUCE);
        String k = key("acq");
        Spec spec = Spec.quota(1, Period.DAY, "Europe/Paris");
        assertTrue(rl.acquire(k, spec, Duration.ofMillis(200)).allowed());
        long start = System.nanoTime();
        Decision no = rl.acquire(k, spec, Duration.ofMillis(200));
        assertFalse(no.allowed());
        assertTrue(System.nanoTime() - start < 2_000_000_000L, "answered at the timeout, not at the next day");
    }

    @ParameterizedTest
    @EnumSource(value = Drivers.class, names = {"LETTUCE", "JEDIS_CLUSTER"})
    void theLimiterTakesQuotaRulesAndTheLocalLevelCountsThem(Drivers d) {
        Limiter limiter = Limiter.builder(client(d)).build();
        Rule daily = Rule.of("daily", Spec.quota(3, Period.DAY)).keyPrefix("{q}:daily:" + UUID.randomUUID() + ":").asGlobal();
        Rule perSecond = Rule.of("burst", Spec.sliding(100, 1000)).keyPrefix("{q}:burst:" + UUID.randomUUID() + ":");
        RuleSet set = limiter.rules(daily, perSecond);
        int admitted = 0;
        for (int i = 0; i < 6; i++) {
            admitted += limiter.check(set, "u").allowed() ? 1 : 0;
        }
        assertEquals(3, admitted);
        Rule paris = Rule.of("paris", Spec.quota(3, Period.DAY, "Europe/Paris")).keyPrefix("{q}:paris:" + UUID.randomUUID() + ":");
        assertTrue(limiter.check(limiter.rules(paris), "u").allowed(), "a zoned quota on its own: RL.QUOTA ... TZ");
        assertEquals("zone", assertThrows(InvalidArgumentException.class, () -> limiter.rules(paris, perSecond)).parameter(),
                "an inline RL.ALL spec counts in UTC only");

        // As a policy, a zoned quota goes in a set with other rules: RL.ALL ... POLICY counts in its zone.
        String policy = "test:quota-tokyo:" + d;
        Spec tokyo = Spec.quota(2, Period.DAY, "Asia/Tokyo");
        client(d).policySet(policy, tokyo, PolicyMode.ENFORCE, 100);
        try {
            Rule zoned = Rule.policy("tokyo", policy, tokyo).keyPrefix("{q}:tokyo:" + UUID.randomUUID() + ":").asGlobal();
            RuleSet both = limiter.rules(zoned, perSecond);
            assertTrue(limiter.check(both, "u").allowed());
            assertTrue(limiter.check(both, "u").allowed());
            Decision no = limiter.check(both, "u");
            assertFalse(no.allowed());
            assertNear(untilEnd(Period.DAY, ZoneId.of("Asia/Tokyo")), no.waitMs(), "until midnight in Tokyo");
        } finally {
            client(d).policyDel(policy);
        }
    }

    @Test
    void theLocalLevelCountsAQuotaByCalendarPeriod() {
        LocalLimiters l = new LocalLimiters(100);
        Spec spec = Spec.quota(2, Period.WEEK, "+05:30");
        assertNull(l.takeAll(List.of(new LocalLimiters.Take("k", spec)), 1));
        assertNull(l.takeAll(List.of(new LocalLimiters.Take("k", spec)), 1));
        LocalLimiters.Denied no = l.takeAll(List.of(new LocalLimiters.Take("k", spec)), 1);
        assertNotNull(no);
        assertNear(untilEnd(Period.WEEK, ZoneOffset.ofHoursMinutes(5, 30)), no.decision().waitMs(), "until the next Monday in +05:30");
        assertEquals(2, spec.share(new Share(1.0)).limit());
    }
}

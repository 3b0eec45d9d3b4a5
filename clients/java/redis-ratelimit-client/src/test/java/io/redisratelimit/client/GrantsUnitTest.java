package io.redisratelimit.client;

import org.junit.jupiter.api.Test;

import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

/**
 * The pure parts of issue 27, no server: UPTO's request and reply, the grant
 * options' ranges and batch size, the stripes' shares, tags and re-pick.
 */
class GrantsUnitTest {

    @Test
    void uptoIsOneToTwoToTheFortyAndGoesOutAsUpto() {
        List<String> args = new ArrayList<>();
        Request.upto(7).appendTo(args);
        assertEquals(List.of("UPTO", "7"), args);
        assertEquals(Request.Kind.UPTO, Request.upto(7).kind());
        assertTrue(Request.upto(Spec.MAX_PARAM).upto());
        assertFalse(Request.cost(7).upto());
        assertFalse(Request.upto(7).equals(Request.cost(7)));
        for (long bad : new long[] {0, -1, Spec.MAX_PARAM + 1}) {
            InvalidArgumentException e = assertThrows(InvalidArgumentException.class, () -> Request.upto(bad));
            assertEquals("UPTO", e.parameter());
            assertTrue(e.getMessage().contains("1 to 1099511627776"), e.getMessage());
        }
    }

    @Test
    void anUptoReplyHasGrantedAsItsSixthFieldAndRlAllsSeventh() {
        Decision d = Decision.fromReply("RL.TOKENBUCKET", List.of(1L, 10L, 2L, 0L, 800L, 3L), Request.upto(5));
        assertTrue(d.allowed());
        assertEquals(3, d.granted());
        assertEquals(2, d.remaining());
        Decision no = Decision.fromReply("RL.FIXEDWINDOW", List.of(0L, 10L, 0L, 250L, 250L, 0L), Request.upto(5));
        assertFalse(no.allowed());
        assertEquals(0, no.granted());
        assertEquals(250, no.waitMs());
        Decision all = Decision.fromReply("RL.ALL", List.of(1L, 5L, 1L, 0L, 900L, 0L, 4L), Request.upto(9));
        assertEquals(4, all.granted());
        assertTrue(all.deniedBy().isEmpty());
        Decision allNo = Decision.fromReply("RL.ALL", List.of(0L, 5L, 0L, 100L, 900L, 2L, 0L), Request.upto(9));
        assertEquals(1, allNo.deniedBy().getAsInt());
        assertThrows(ProtocolException.class, () -> Decision.fromReply("RL.SLIDING", List.of(1L, 10L, 2L, 0L, 800L), Request.upto(5)));
        assertThrows(ProtocolException.class, () -> Decision.fromReply("RL.ALL", List.of(1L, 10L, 2L, 0L, 800L, 0L), Request.upto(5)));
        // Without UPTO: the cost when admitted, else 0.
        assertEquals(4, Decision.fromReply("RL.SLIDING", List.of(1L, 10L, 2L, 0L, 800L), Request.cost(4)).granted());
        assertEquals(0, Decision.fromReply("RL.SLIDING", List.of(0L, 10L, 2L, 5L, 800L), Request.cost(4)).granted());
        assertEquals(0, Decision.fromReply("RL.SLIDING", List.of(1L, 10L, 2L, 0L, 800L), Request.refund(4)).granted());
    }

    @Test
    void theGrantOptionsAreCheckedNamingEach() {
        Rule r = Rule.of("g", Spec.tokenBucket(100, 10, 1000)).asGlobal();
        assertEquals(Grants.OFF, r.grants());
        Rule b = r.batched().holdMs(200).maxSharePct(25).striped(4);
        assertEquals(new Grants(true, 200, 25, 4), b.grants());
        assertEquals("hold_ms", assertThrows(InvalidArgumentException.class, () -> r.holdMs(0)).parameter());
        assertEquals("hold_ms", assertThrows(InvalidArgumentException.class, () -> r.holdMs(60_001)).parameter());
        assertEquals("max_share_pct", assertThrows(InvalidArgumentException.class, () -> r.maxSharePct(0)).parameter());
        assertEquals("max_share_pct", assertThrows(InvalidArgumentException.class, () -> r.maxSharePct(101)).parameter());
        assertEquals("striped", assertThrows(InvalidArgumentException.class, () -> r.striped(0)).parameter());
        assertEquals("striped", assertThrows(InvalidArgumentException.class, () -> r.striped(65)).parameter());
        // Every share at least 1: 11 stripes of a refill of 10 leave one refilling nothing.
        assertEquals("striped", assertThrows(InvalidArgumentException.class, () -> r.striped(11)).parameter());
        assertEquals("striped", assertThrows(InvalidArgumentException.class,
                () -> Rule.of("w", Spec.fixedWindow(3, 1000)).striped(4)).parameter());
        assertEquals("striped", assertThrows(InvalidArgumentException.class,
                () -> Rule.of("l", Spec.leakyBucket(30, 3, 1000)).striped(2)).parameter());
        assertEquals(3, Rule.of("w", Spec.fixedWindow(3, 1000)).striped(3).grants().stripes());
    }

    @Test
    void theBatchIsHoldMsOfTheRateClampedToOneAndTheShare() {
        Grants g = new Grants(true, 50, 10, 1);
        assertEquals(1, g.batchSize(0, 1000));
        assertEquals(1, g.batchSize(1, 1000));
        assertEquals(1, g.batchSize(20, 1000));
        assertEquals(2, g.batchSize(21, 1000));
        assertEquals(50, g.batchSize(1000, 1000));
        assertEquals(100, g.batchSize(1_000_000, 1000));
        // A limit below 10: at most max(1, limit * 10 / 100) = 1.
        assertEquals(1, g.batchSize(1_000_000, 9));
        assertEquals(Long.MAX_VALUE / 10, new Grants(true, 60_000, 100, 1).batchSize(Long.MAX_VALUE, Long.MAX_VALUE / 10));
    }

    @Test
    void eachStripeGetsItsShareOfEverySizeAndRateTheRemainderToTheFirst() {
        List<Spec> tb = Stripes.shares(Spec.tokenBucket(10, 5, 1000), 3);
        assertEquals(List.of(Spec.tokenBucket(4, 2, 1000), Spec.tokenBucket(3, 2, 1000), Spec.tokenBucket(3, 1, 1000)), tb);
        assertEquals(List.of(Spec.fixedWindow(4, 60_000), Spec.fixedWindow(3, 60_000)), Stripes.shares(Spec.fixedWindow(7, 60_000), 2));
        assertEquals(List.of(Spec.hashWindow(2, 1000, 100), Spec.hashWindow(2, 1000, 100)), Stripes.shares(Spec.hashWindow(4, 1000, 100), 2));
        assertEquals(List.of(Spec.sliding(3, 1000), Spec.sliding(2, 1000)), Stripes.shares(Spec.sliding(5, 1000), 2));
        assertEquals(List.of(Spec.quota(501, Period.DAY, "+05:30"), Spec.quota(500, Period.DAY, "+05:30")),
                Stripes.shares(Spec.quota(1001, Period.DAY, "+05:30"), 2));
        long sum = 0;
        for (Spec s : Stripes.shares(Spec.fixedWindow(1_000_003, 1000), 64)) {
            sum += s.limit();
        }
        assertEquals(1_000_003, sum);
    }

    @Test
    void theSlotIsCrc16XmodemModTheSlots() {
        // CRC16-XMODEM("123456789") = 0x31C3, the cluster spec's check value.
        assertEquals(0x31C3, Stripes.slot("123456789"));
        assertEquals(3708, Stripes.slot("rl0"));
        assertEquals(7773, Stripes.slot("rl1"));
        assertEquals(11838, Stripes.slot("rl2"));
        assertEquals(Stripes.slot("rl0"), Stripes.slot("{rl0}rl:total"));
    }

    @Test
    void theTagsOfAStandaloneServerAreRl0ToRlNMinus1() {
        assertEquals(List.of("rl0", "rl1", "rl2"), Stripes.standalone().tags(3));
        assertEquals("{rl1}rl:g:total", Stripes.key("rl1", "rl:g:total"));
    }

    private static Object slots(int[][] ranges) {
        List<Object> out = new ArrayList<>();
        for (int[] r : ranges) {
            out.add(List.of((long) r[0], (long) r[1], List.of("127.0.0.1", (long) r[2], "id" + r[2])));
        }
        return out;
    }

    @Test
    void theTagsOfAClusterPutStripeIOnMasterIModMByLowestSlot() {
        // Listed out of order: masters are ordered by the lowest slot each owns.
        Stripes three = Stripes.fromClusterSlots(slots(new int[][] {{10923, 16383, 7002}, {0, 5460, 7000}, {5461, 10922, 7001}}));
        assertEquals(3, three.masters());
        assertEquals(List.of("rl0", "rl1", "rl2"), three.tags(3));
        // Master 0 owns rl0 (3708) and rl4 (3832); master 1 rl1, rl5; master 2 rl2 (11838), rl3 (15903).
        assertEquals(List.of("rl0", "rl1", "rl2", "rl4", "rl5", "rl3"), three.tags(6));
        for (int n = 2; n <= 64; n++) {
            List<String> tags = three.tags(n);
            assertEquals(n, tags.stream().distinct().count());
            for (int i = 0; i < n; i++) {
                assertEquals(i % 3, three.ownerOf(Stripes.slot(tags.get(i))), n + " stripes: " + tags);
            }
        }
        // A master owning two ranges counts from its lowest.
        Stripes split = Stripes.fromClusterSlots(slots(new int[][] {{0, 99, 7001}, {100, 8000, 7000}, {8001, 16383, 7001}}));
        assertEquals(0, split.ownerOf(50));
        assertEquals(0, split.ownerOf(9000));
        assertEquals(1, split.ownerOf(3708));
        assertThrows(ProtocolException.class, () -> Stripes.fromClusterSlots("nope"));
    }

    @Test
    void aRepickMovesOnlyTheStripesWhoseMasterNoLongerHoldsThemApart() {
        Stripes before = Stripes.fromClusterSlots(slots(new int[][] {{0, 5460, 7000}, {5461, 10922, 7001}, {10923, 16383, 7002}}));
        assertEquals(List.of("rl0", "rl1", "rl2"), before.tags(3));
        // rl1 (7773) now on master 0 beside rl0: it moves, to the master left without a stripe.
        Stripes after = Stripes.fromClusterSlots(slots(new int[][] {{0, 8000, 7000}, {8001, 12000, 7001}, {12001, 16383, 7002}})).repick(before);
        assertEquals(List.of("rl0", "rl3", "rl2"), after.tags(3));
        assertFalse(after.sameMap(before));
        // Two masters left: three stripes are two and one, and none moves.
        Stripes two = Stripes.fromClusterSlots(slots(new int[][] {{0, 5460, 7000}, {5461, 10922, 7001}, {10923, 16383, 7000}})).repick(before);
        assertEquals(List.of("rl0", "rl1", "rl2"), two.tags(3));
        assertTrue(before.sameMap(Stripes.fromClusterSlots(slots(new int[][] {{0, 5460, 7000}, {5461, 10922, 7001}, {10923, 16383, 7002}}))));
        assertEquals(3, Arrays.stream(new int[] {0, 1, 2}).map(i -> after.ownerOf(Stripes.slot(after.tags(3).get(i)))).distinct().count());
    }
}

package io.redisratelimit.client;

import io.redisratelimit.client.testing.RedisServer;
import io.redisratelimit.client.testing.Windows;
import org.junit.jupiter.params.ParameterizedTest;
import org.junit.jupiter.params.provider.EnumSource;
import org.junit.jupiter.api.Test;

import java.time.Duration;
import java.util.ArrayList;
import java.util.HashSet;
import java.util.List;
import java.util.Set;
import java.util.UUID;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

/**
 * Striped global rules on the three-master cluster (slots 0-5460,
 * 5461-10922, 10923-16383, node i owning range i) and a standalone server:
 * where the stripes live, their sum, the spill-over to the next stripe.
 */
class StripesTest extends EveryDriver {
    private static final long WINDOW = Windows.FIXED_MS;

    private Limiter limiter(Drivers d) {
        Client c = Client.connect(d.cluster() ? d.cluster(cluster) : d.standalone(server), Duration.ofSeconds(2));
        // Fail closed: a late reply on a loaded host is never an admission of the fallback's.
        return Limiter.builder(c).fallback(FallbackMode.FAIL_CLOSED).build();
    }

    private static Rule striped(String key, long limit) {
        return Rule.of("striped", Spec.fixedWindow(limit, WINDOW)).fixedKey(key).asGlobal().striped(3);
    }

    private static int master(int slot) {
        return slot <= 5460 ? 0 : slot <= 10922 ? 1 : 2;
    }

    /** Units consumed on a stripe's key: its share minus what an inspection (COST 0) finds left. */
    private static long consumed(Client c, String key, Spec share) {
        Decision d = c.limit(key, share, Request.cost(0));
        return share.limit() - d.remaining();
    }

    @Test
    void theKitsCrc16IsTheServersKeyslot() throws Exception {
        RedisServer node = cluster.nodes().get(0);
        for (int k = 0; k < 100; k++) {
            String tag = "rl" + k;
            assertEquals(Integer.parseInt(node.command("CLUSTER", "KEYSLOT", tag)), Stripes.slot(tag), tag);
            String key = Stripes.key(tag, "rl:x:" + k);
            assertEquals(Integer.parseInt(node.command("CLUSTER", "KEYSLOT", key)), Stripes.slot(key), key);
        }
    }

    @ParameterizedTest
    @EnumSource(value = Drivers.class, names = {"LETTUCE", "JEDIS"})
    void aStandaloneServersTagsAreRl0Rl1Rl2(Drivers d) {
        try (Limiter l = limiter(d)) {
            assertEquals(List.of("{rl0}g:total", "{rl1}g:total", "{rl2}g:total"), l.stripeKeys(striped("g:total", 30), "any"));
        }
    }

    @ParameterizedTest
    @EnumSource(value = Drivers.class, names = {"LETTUCE_CLUSTER", "JEDIS_CLUSTER"})
    void eachStripeLivesOnAnotherMaster(Drivers d) throws Exception {
        String key = "t:stripes:" + UUID.randomUUID();
        try (Limiter l = limiter(d)) {
            Rule r = striped(key, 30);
            RuleSet set = l.rules(r);
            List<String> keys = l.stripeKeys(r, "any");
            assertEquals(List.of("{rl0}" + key, "{rl1}" + key, "{rl2}" + key), keys, "the contract's vector for these slots");
            Set<Integer> masters = new HashSet<>();
            for (String k : keys) {
                int slot = Integer.parseInt(cluster.nodes().get(0).command("CLUSTER", "KEYSLOT", k));
                masters.add(master(slot));
            }
            assertEquals(Set.of(0, 1, 2), masters);
            assertTrue(l.check(set, "any").allowed());
            // The key the decision wrote is on the master that owns its slot.
            int own = l.ownStripe(3);
            int slot = Integer.parseInt(cluster.nodes().get(0).command("CLUSTER", "KEYSLOT", keys.get(own)));
            assertEquals("1", cluster.nodes().get(master(slot)).command("EXISTS", keys.get(own)));
        }
    }

    @ParameterizedTest
    @EnumSource(value = Drivers.class, names = {"LETTUCE_CLUSTER", "JEDIS_CLUSTER"})
    void aDenialOnTheOwnStripeSpillsToTheNextOneAndOnlyThatOne(Drivers d) {
        String key = "t:spill:" + UUID.randomUUID();
        try (Limiter l = limiter(d)) {
            Rule r = striped(key, 30);
            RuleSet set = l.rules(r);
            List<String> keys = l.stripeKeys(r, "any");
            List<Spec> shares = Stripes.shares(r.spec(), 3);
            int own = l.ownStripe(3);
            int next = (own + 1) % 3;
            int third = (own + 2) % 3;
            Client c = l.client();
            for (int i = 0; i < 10; i++) {
                Decision ok = l.check(set, "any");
                assertTrue(ok.allowed(), i + ": " + ok);
            }
            assertEquals(10, consumed(c, keys.get(own), shares.get(own)));
            assertEquals(0, consumed(c, keys.get(next), shares.get(next)));
            assertTrue(l.check(set, "any").allowed(), "the own stripe is spent: the next one admits");
            assertEquals(1, consumed(c, keys.get(next), shares.get(next)));
            for (int i = 0; i < 9; i++) {
                assertTrue(l.check(set, "any").allowed());
            }
            Decision no = l.check(set, "any");
            assertFalse(no.allowed());
            assertTrue(no.waitMs() > 0, no.toString());
            assertEquals(0, consumed(c, keys.get(third), shares.get(third)), "a denial tries exactly one other stripe");
        }
    }

    @ParameterizedTest
    @EnumSource(value = Drivers.class, names = {"LETTUCE_CLUSTER", "JEDIS_CLUSTER"})
    void theSumOverEveryStripeNeverExceedsTheLimitAtTwiceTheLoad(Drivers d) {
        String key = "t:sum:" + UUID.randomUUID();
        Rule r = striped(key, 30);
        List<Limiter> instances = new ArrayList<>();
        try {
            for (int i = 0; i < 4; i++) {
                instances.add(limiter(d));
            }
            long admitted = 0;
            for (int i = 0; i < 60; i++) {
                Limiter l = instances.get(i % 4);
                admitted += l.check(l.rules(r), "any").allowed() ? 1 : 0;
            }
            List<String> keys = instances.get(0).stripeKeys(r, "any");
            List<Spec> shares = Stripes.shares(r.spec(), 3);
            long onServer = 0;
            for (int i = 0; i < 3; i++) {
                onServer += consumed(instances.get(0).client(), keys.get(i), shares.get(i));
            }
            assertTrue(admitted <= 30, admitted + " admitted");
            assertTrue(admitted >= 20, "each instance reaches two stripes: " + admitted);
            assertEquals(admitted, onServer, "every admission was counted on a stripe");
        } finally {
            instances.forEach(Limiter::close);
        }
    }

    @ParameterizedTest
    @EnumSource(value = Drivers.class, names = {"LETTUCE_CLUSTER", "JEDIS_CLUSTER"})
    void batchedAndStripedBatchesPerStripeAndNeverExceedsTheLimit(Drivers d) throws Exception {
        String key = "t:bs:" + UUID.randomUUID();
        Rule r = Rule.of("bs", Spec.fixedWindow(300, WINDOW)).fixedKey(key).asGlobal().striped(3).batched().holdMs(60_000);
        List<Limiter> instances = new ArrayList<>();
        long admitted = 0;
        long calls = 0;
        List<String> keys;
        try {
            for (int i = 0; i < 4; i++) {
                instances.add(limiter(d));
            }
            keys = instances.get(0).stripeKeys(r, "any");
            for (int i = 0; i < 600; i++) {
                Limiter l = instances.get(i % 4);
                admitted += l.check(l.rules(r), "any").allowed() ? 1 : 0;
            }
            for (Limiter l : instances) {
                calls += l.stats().redisCalls();
            }
        } finally {
            instances.forEach(Limiter::close);
        }
        assertTrue(admitted <= 300, admitted + " admitted");
        assertTrue(admitted >= 200, admitted + " admitted");
        assertTrue(calls * 5 < 600, calls + " round trips for 600 decisions");
        List<Spec> shares = Stripes.shares(r.spec(), 3);
        try (Client c = Client.connect(d.cluster(cluster), Duration.ofSeconds(2))) {
            long onServer = 0;
            for (int i = 0; i < 3; i++) {
                onServer += consumed(c, keys.get(i), shares.get(i));
            }
            assertEquals(admitted, onServer, "held units went back at close: the stripes count what was admitted");
        }
    }

    @ParameterizedTest
    @EnumSource(value = Drivers.class, names = {"LETTUCE_CLUSTER", "JEDIS_CLUSTER"})
    void aChangedSlotMapMovesOnlyTheStripeWhoseMasterNoLongerHoldsItApart(Drivers d) throws Exception {
        try (io.redisratelimit.client.testing.RedisCluster own = io.redisratelimit.client.testing.RedisCluster.start();
             Limiter l = Limiter.builder(Client.connect(d.cluster(own), Duration.ofSeconds(2))).build()) {
            Rule r = striped("t:repick", 30);
            assertEquals(List.of("{rl0}t:repick", "{rl1}t:repick", "{rl2}t:repick"), l.stripeKeys(r, "any"));
            // rl1's slot (7773) goes to master 0, beside rl0: only stripe 1 moves, to master 1's next tag, rl5 (7897).
            String first = own.nodes().get(0).command("CLUSTER", "MYID");
            for (RedisServer n : own.nodes()) {
                n.command("CLUSTER", "SETSLOT", "7773", "NODE", first);
            }
            long deadline = System.nanoTime() + 15_000_000_000L;
            while (!l.stripeKeys(r, "any").get(1).equals("{rl5}t:repick") && System.nanoTime() < deadline) {
                Thread.sleep(20);
            }
            assertEquals(List.of("{rl0}t:repick", "{rl5}t:repick", "{rl2}t:repick"), l.stripeKeys(r, "any"));
            assertTrue(l.check(l.rules(r), "any").allowed(), "decides on the new stripes");
        }
    }

    @ParameterizedTest
    @EnumSource(value = Drivers.class, names = {"LETTUCE"})
    void aBatchedOrStripedRuleIsGlobalOfAnUptoAlgorithmAndASetOfItsOwn(Drivers d) {
        try (Limiter l = limiter(d)) {
            Rule notGlobal = Rule.of("n", Spec.fixedWindow(30, WINDOW)).batched();
            assertEquals("batched", assertThrows(InvalidArgumentException.class, () -> l.rules(notGlobal)).parameter());
            Rule leaky = Rule.of("l", Spec.leakyBucket(30, 3, 1000)).asGlobal().batched();
            assertEquals("batched", assertThrows(InvalidArgumentException.class, () -> l.rules(leaky)).parameter());
            Rule conc = Rule.of("c", Spec.concurrency(30, 1000)).asGlobal().batched();
            assertEquals("batched", assertThrows(InvalidArgumentException.class, () -> l.rules(conc)).parameter());
            Rule ok = Rule.of("s", Spec.fixedWindow(30, WINDOW)).fixedKey("{t}s").asGlobal().striped(2);
            Rule other = Rule.of("o", Spec.fixedWindow(30, WINDOW)).keyPrefix("{t}o:");
            assertEquals("striped", assertThrows(InvalidArgumentException.class, () -> l.rules(ok, other)).parameter());
            Rule shadow = Rule.policy("p", "p", Spec.fixedWindow(30, WINDOW)).asGlobal().striped(2).mode(PolicyMode.SHADOW, 100);
            assertEquals("striped", assertThrows(InvalidArgumentException.class, () -> l.rules(shadow)).parameter());
            Rule unknown = Rule.policy("u", "u", null).asGlobal().batched();
            assertEquals("batched", assertThrows(InvalidArgumentException.class, () -> l.rules(unknown)).parameter());
            assertEquals(1, l.rules(ok).size());
        }
    }
}

package io.redisratelimit.client;

import io.redisratelimit.client.testing.RedisServer;
import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.TestInstance;
import org.junit.jupiter.params.ParameterizedTest;
import org.junit.jupiter.params.provider.EnumSource;

import java.time.Duration;
import java.util.ArrayList;
import java.util.EnumMap;
import java.util.List;
import java.util.Map;
import java.util.UUID;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertNotEquals;
import static org.junit.jupiter.api.Assertions.assertSame;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;
import static org.junit.jupiter.api.Assertions.fail;

/**
 * The names deprecated in 0.2.0 still work for one release: {@code Units}
 * (now {@link Request}), {@code RateLimitClient} (now {@link Client}),
 * {@code BadArgumentException} (now
 * {@link InvalidArgumentException}) and {@code UnexpectedReplyException} (now
 * {@link ProtocolException}). Old calls behave as the new ones against a real
 * server, and old catch blocks catch what the kit throws. The only place in
 * the kit that uses the old names.
 */
@SuppressWarnings({"deprecation", "removal"})
@TestInstance(TestInstance.Lifecycle.PER_CLASS)
class DeprecatedNamesTest {
    private RedisServer server;
    private final Map<Drivers, Client> clients = new EnumMap<>(Drivers.class);

    @BeforeAll
    void start() {
        server = RedisServer.start();
        for (Drivers d : List.of(Drivers.LETTUCE, Drivers.JEDIS)) {
            clients.put(d, Client.connect(d.standalone(server), Duration.ofSeconds(2)));
        }
    }

    @AfterAll
    void stop() {
        clients.values().forEach(Client::close);
        if (server != null) {
            server.close();
        }
    }

    private static String key(String what) {
        return "compat:" + what + ":" + UUID.randomUUID();
    }

    @Test
    void unitsIsARequestWithTheSameFactoriesAndValues() {
        Units cost = Units.cost(3);
        Request asRequest = cost;
        assertEquals(Request.cost(3), asRequest);
        assertEquals(asRequest, Request.cost(3));
        assertEquals(Request.cost(3).hashCode(), cost.hashCode());
        assertEquals(Request.Kind.COST, cost.kind());
        assertEquals(Request.force(2), Units.force(2));
        assertEquals(Request.Kind.FORCE, Units.force(2).kind());
        assertEquals(Request.refund(4), Units.refund(4));
        assertEquals(Request.Kind.REFUND, Units.refund(4).kind());
        assertEquals(Request.ONE, Units.ONE);
        assertEquals(new Units(5, true, false), Request.force(5));
        assertNotEquals(Request.cost(5), Units.force(5));
        // The record's accessors and text.
        Units u = new Units(7, false, true);
        assertEquals(7, u.n());
        assertFalse(u.force());
        assertTrue(u.refund());
        assertEquals("Units[n=7, force=false, refund=true]", u.toString());
    }

    @Test
    void unitsRefusesWhatRequestRefusesAndOldCatchBlocksCatchIt() {
        String caught = null;
        try {
            Units.cost(-1);
            fail("a negative cost was accepted");
        } catch (BadArgumentException e) {
            caught = e.argument();
            assertSame(InvalidArgumentException.class, e.getClass(), "the kit throws the new name");
            assertEquals(e.argument(), ((InvalidArgumentException) e).parameter());
        }
        assertEquals("cost", caught);
        assertEquals("refund", assertThrows(BadArgumentException.class, () -> Units.refund(Spec.MAX_PARAM + 1)).argument());
        assertEquals("force", assertThrows(BadArgumentException.class, () -> new Units(1, true, true)).argument());
        // The same refusals through the new names, with the same messages.
        assertEquals(assertThrows(BadArgumentException.class, () -> Units.cost(-1)).getMessage(),
                assertThrows(InvalidArgumentException.class, () -> Request.cost(-1)).getMessage());
    }

    /** One sequence of calls, through Units on one key and Request on another: the same decisions. */
    @ParameterizedTest
    @EnumSource(value = Drivers.class, names = {"LETTUCE", "JEDIS"})
    void unitsAreAcceptedWhereRequestsAreAndDecideTheSame(Drivers d) {
        Client rl = clients.get(d);
        Spec spec = Spec.fixedWindow(5, 60_000);
        String oldKey = key("units");
        String newKey = key("request");
        List<Decision> old = new ArrayList<>();
        old.add(rl.limit(oldKey, spec, Units.cost(3)));
        old.add(rl.limit(oldKey, spec, Units.cost(3)));
        old.add(rl.limit(oldKey, spec, Units.force(3)));
        old.add(rl.limit(oldKey, spec, Units.refund(4)));
        old.add(rl.limit(oldKey, spec, Units.ONE));
        old.add(rl.limit(oldKey, spec, Units.cost(0)));
        List<Decision> now = new ArrayList<>();
        now.add(rl.limit(newKey, spec, Request.cost(3)));
        now.add(rl.limit(newKey, spec, Request.cost(3)));
        now.add(rl.limit(newKey, spec, Request.force(3)));
        now.add(rl.limit(newKey, spec, Request.refund(4)));
        now.add(rl.limit(newKey, spec, Request.ONE));
        now.add(rl.limit(newKey, spec, Request.cost(0)));
        for (int i = 0; i < old.size(); i++) {
            assertEquals(now.get(i).allowed(), old.get(i).allowed(), "call " + i);
            assertEquals(now.get(i).remaining(), old.get(i).remaining(), "call " + i);
            assertEquals(now.get(i).limit(), old.get(i).limit(), "call " + i);
        }
        assertTrue(old.get(0).allowed());
        assertFalse(old.get(1).allowed());

        // The other calls that took Units still do.
        String q = key("quota");
        assertTrue(rl.quota(q, 2, Period.DAY, null, Units.cost(2)).allowed());
        assertFalse(rl.quota(q, 2, Period.DAY, null, Units.ONE).allowed());
        assertTrue(rl.concurrency(key("cap"), 2, 1000, Units.cost(2)).allowed());
        assertTrue(rl.acquire(key("acq"), spec, Units.cost(5), Duration.ZERO).allowed());
        String a = "{compat}:" + UUID.randomUUID();
        assertTrue(rl.all(List.of(Limit.of(a + ":1", spec), Limit.of(a + ":2", spec)), Units.cost(5)).allowed());
        try (Lease lease = rl.lease(key("lease"), 1, 1000, Units.ONE, null)) {
            assertTrue(lease.decision().allowed());
        }
    }

    @ParameterizedTest
    @EnumSource(value = Drivers.class, names = {"LETTUCE", "JEDIS"})
    void anOldCatchBlockCatchesTheClientsRefusals(Drivers d) {
        Client rl = clients.get(d);
        try {
            rl.fixedWindow("", 1, 1000);
            fail("an empty key was sent");
        } catch (BadArgumentException e) {
            assertEquals("key", e.argument());
            assertEquals("key", ((InvalidArgumentException) e).parameter());
        }
        try {
            rl.tokenBucket(key("bad"), 0, 1, 1000);
            fail("a capacity of 0 was sent");
        } catch (BadArgumentException e) {
            assertEquals("capacity", e.argument());
        }
        // The new name catches the same.
        assertEquals("capacity", assertThrows(InvalidArgumentException.class, () -> rl.tokenBucket(key("bad"), 0, 1, 1000)).parameter());
    }

    /** Code written against the old name compiles and runs: its factories and withDeadline answer the old type. */
    @ParameterizedTest
    @EnumSource(value = Drivers.class, names = {"LETTUCE", "JEDIS"})
    void rateLimitClientIsAClientUnderTheOldName(Drivers d) {
        try (RateLimitClient old = RateLimitClient.connect(d.standalone(server), Duration.ofSeconds(2))) {
            Client asClient = old;
            assertTrue(old.moduleVersion() >= RateLimitClient.MIN_MODULE_VERSION);
            assertEquals(Client.DEFAULT_DEADLINE, RateLimitClient.DEFAULT_DEADLINE);
            assertEquals(Duration.ofSeconds(2), old.deadline());
            RateLimitClient faster = old.withDeadline(Duration.ofSeconds(1));
            assertEquals(Duration.ofSeconds(1), faster.deadline());
            assertSame(old.driver(), faster.driver());
            String k = key("old-client");
            assertTrue(asClient.fixedWindow(k, 1, 60_000).allowed());
            assertFalse(faster.fixedWindow(k, 1, 60_000).allowed(), "the same key, counted once");
            // The kit takes it wherever it takes a client.
            assertSame(old, Limiter.builder(old).build().client());
        }
    }

    @Test
    void anOldCatchBlockCatchesAReplyOfTheWrongShape() {
        List<Object> reply = List.of(1L, 2L);
        String message = null;
        try {
            Decision.fromReply("RL.LIMIT", reply);
            fail("a two-integer reply was parsed");
        } catch (UnexpectedReplyException e) {
            assertSame(ProtocolException.class, e.getClass(), "the kit throws the new name");
            message = e.getMessage();
        }
        assertEquals("RL.LIMIT: unexpected reply [1, 2]", message);
        assertTrue(assertThrows(RateLimitException.class, () -> Decision.fromReply("RL.LIMIT", "OK")) instanceof ProtocolException);
    }
}

package io.redisratelimit.client;

import io.redisratelimit.client.driver.Driver;
import io.redisratelimit.client.testing.RedisServer;
import io.redisratelimit.client.testing.Windows;
import org.junit.jupiter.params.ParameterizedTest;
import org.junit.jupiter.params.provider.EnumSource;

import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.Optional;
import java.util.UUID;
import java.util.concurrent.CompletionStage;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

/** Every typed call, on Lettuce and Jedis, against a standalone server and a three-master cluster. */
class ClientCommandsTest extends EveryDriver {

    private static String key(String what) {
        return "t:" + what + ":" + UUID.randomUUID();
    }

    @ParameterizedTest
    @EnumSource(Drivers.class)
    void aTokenBucketAdmitsItsCapacityThenDeniesWithTheWait(Drivers d) {
        Client rl = client(d);
        String k = key("tb");
        for (int i = 0; i < 5; i++) {
            Decision ok = rl.tokenBucket(k, 5, 1, 1000);
            assertTrue(ok.allowed());
            assertEquals(5, ok.limit());
            assertEquals(4 - i, ok.remaining());
            assertEquals(Path.REDIS, ok.path());
        }
        Decision no = rl.tokenBucket(k, 5, 1, 1000);
        assertFalse(no.allowed());
        assertTrue(no.retryAfter().toMillis() > 0 && no.retryAfter().toMillis() <= 1000, no.toString());
        assertEquals(1, no.retryAfterSeconds().getAsLong());
        assertTrue(no.resetAfter().toMillis() > 4000, no.toString());
        Decision never = rl.limit(k, Spec.tokenBucket(5, 1, 1000), Request.cost(6));
        assertTrue(never.never());
        assertTrue(never.retryAfterSeconds().isEmpty());
    }

    @ParameterizedTest
    @EnumSource(Drivers.class)
    void everyAlgorithmAnswersItsLimit(Drivers d) {
        Client rl = client(d);
        assertEquals(7, rl.leakyBucket(key("lb"), 7, 1, 100).limit());
        assertEquals(8, rl.sliding(key("sl"), 8, 1000).limit());
        assertEquals(9, rl.hashWindow(key("hw"), 9, 1000, 100).limit());
        assertEquals(10, rl.fixedWindow(key("fw"), 10, 1000).limit());
        String k = key("peek");
        Decision peek = rl.limit(k, Spec.fixedWindow(3, Windows.FIXED_MS), Request.cost(0));
        assertEquals(3, peek.remaining());
        rl.limit(k, Spec.fixedWindow(3, Windows.FIXED_MS), Request.force(5));
        assertEquals(0, rl.limit(k, Spec.fixedWindow(3, Windows.FIXED_MS), Request.cost(0)).remaining());
        Decision refunded = rl.limit(k, Spec.fixedWindow(3, Windows.FIXED_MS), Request.refund(2));
        assertTrue(refunded.allowed());
    }

    @ParameterizedTest
    @EnumSource(Drivers.class)
    void theAsyncFormAnswersTheSame(Drivers d) throws Exception {
        Client rl = client(d);
        String k = key("async");
        List<CompletionStage<Decision>> calls = new ArrayList<>();
        for (int i = 0; i < 20; i++) {
            calls.add(rl.limitAsync(k, Spec.fixedWindow(10, Windows.FIXED_MS)));
        }
        long admitted = 0;
        for (CompletionStage<Decision> c : calls) {
            admitted += c.toCompletableFuture().get().allowed() ? 1 : 0;
        }
        assertEquals(10, admitted);
    }

    @ParameterizedTest
    @EnumSource(Drivers.class)
    void allIsAllOrNothingAndNamesTheLimiterThatDenied(Drivers d) {
        Client rl = client(d);
        String tag = "{" + UUID.randomUUID() + "}";
        Limit user = Limit.of(tag + ":user:1", Spec.fixedWindow(5, Windows.FIXED_MS));
        Limit total = Limit.of(tag + ":total", Spec.fixedWindow(2, Windows.FIXED_MS));
        assertTrue(rl.all(List.of(user, total)).allowed());
        assertTrue(rl.all(List.of(user, total)).allowed());
        Decision denied = rl.all(List.of(user, total));
        assertFalse(denied.allowed());
        assertEquals(1, denied.deniedBy().getAsInt());
        // Nothing was taken from the user's limiter by the denial.
        assertEquals(3, rl.limit(user.key(), user.spec(), Request.cost(0)).remaining());
    }

    @ParameterizedTest
    @EnumSource(Drivers.class)
    void policiesAreSetReadListedHitAndDeleted(Drivers d) {
        Client rl = client(d);
        String name = "test:" + d + ":" + UUID.randomUUID();
        rl.policySet(name, Spec.tokenBucket(2, 1, 60_000), PolicyMode.ENFORCE, 100);
        Optional<PolicyInfo> info = rl.policyGet(name);
        assertTrue(info.isPresent());
        assertEquals(Spec.tokenBucket(2, 1, 60_000), info.get().spec());
        assertEquals(PolicyMode.ENFORCE, info.get().mode());
        assertTrue(rl.policyList().contains(name));
        String k = key("hit");
        assertTrue(rl.hit(name, k).allowed());
        assertTrue(rl.hit(name, k).allowed());
        assertFalse(rl.hit(name, k).allowed());
        rl.policySet(name, Spec.tokenBucket(2, 1, 60_000), PolicyMode.SHADOW, 100);
        assertTrue(rl.hit(name, k).allowed(), "shadow never denies");
        rl.policySet(name, Spec.tokenBucket(2, 1, 60_000), PolicyMode.OFF, 100);
        assertTrue(rl.hit(name, k).allowed(), "the kill switch admits");
        String tag = "{" + UUID.randomUUID() + "}";
        Decision viaAll = rl.all(List.of(Limit.policy(tag + "a", name), Limit.of(tag + "b", Spec.fixedWindow(1, 1000))));
        assertTrue(viaAll.allowed());
        assertTrue(rl.policyDel(name));
        assertFalse(rl.policyDel(name));
        assertTrue(rl.policyGet(name).isEmpty());
    }

    @ParameterizedTest
    @EnumSource(value = Drivers.class, names = {"LETTUCE_CLUSTER", "JEDIS_CLUSTER"})
    void inAClusterEveryCallGoesToTheKeysOwnerAndPoliciesToEveryMaster(Drivers d) throws Exception {
        Client rl = client(d);
        String name = "test:route:" + d;
        rl.policySet(name, Spec.fixedWindow(100, Windows.FIXED_MS), PolicyMode.ENFORCE, 100);
        for (RedisServer n : cluster.nodes()) {
            assertTrue(n.command("RL.POLICY", "LIST").contains(name), "policy on every master");
        }
        for (int i = 0; i < 60; i++) {
            assertTrue(rl.hit(name, "route:" + d + ":" + i).allowed());
            assertTrue(rl.fixedWindow("route:fw:" + d + ":" + i, 10, 1000).allowed());
        }
        long moved = 0;
        long hits = 0;
        for (RedisServer n : cluster.nodes()) {
            String errors = n.command("INFO", "errorstats");
            for (String line : errors.split("\r?\n")) {
                if (line.startsWith("errorstat_MOVED") || line.startsWith("errorstat_ASK")) {
                    moved += Long.parseLong(line.replaceAll(".*count=(\\d+).*", "$1"));
                }
            }
            String stats = n.command("INFO", "commandstats");
            for (String line : stats.split("\r?\n")) {
                if (line.toLowerCase(java.util.Locale.ROOT).startsWith("cmdstat_rl.hit:")) {
                    hits += Long.parseLong(line.replaceAll("^[^:]*:calls=(\\d+),.*", "$1"));
                }
            }
        }
        assertEquals(0, moved, "no call was redirected");
        assertTrue(hits >= 60, "the hits spread over the masters: " + hits);
        assertTrue(rl.policyDel(name));
    }

    @ParameterizedTest
    @EnumSource(value = Drivers.class, names = {"LETTUCE_CLUSTER", "JEDIS_CLUSTER"})
    void inAClusterRulesWithoutOneSharedHashTagAreRefusedWhenTheSetIsBuilt(Drivers d) {
        Limiter limiter = Limiter.builder(client(d)).build();
        Rule user = Rule.of("per-user", Spec.sliding(5, 1000)).keyPrefix("{api}:user:");
        InvalidArgumentException e = assertThrows(InvalidArgumentException.class,
                () -> limiter.rules(user, Rule.of("global", Spec.tokenBucket(10, 10, 1000)).fixedKey("global")));
        assertEquals("key", e.parameter());
        assertThrows(InvalidArgumentException.class,
                () -> limiter.rules(user, Rule.of("global", Spec.tokenBucket(10, 10, 1000)).fixedKey("{other}:global")));
        RuleSet ok = limiter.rules(user, Rule.of("global", Spec.tokenBucket(10, 10, 1000)).fixedKey("{api}:global").asGlobal());
        assertTrue(limiter.check(ok, "u-" + UUID.randomUUID()).allowed());
        assertEquals(Path.REDIS, limiter.check(ok, "u-" + UUID.randomUUID()).path());
    }

    @ParameterizedTest
    @EnumSource(Drivers.class)
    void aBadArgumentIsRefusedBeforeAnythingIsSent(Drivers d) {
        InvalidArgumentException e = assertThrows(InvalidArgumentException.class, () -> client(d).tokenBucket(key("bad"), 0, 1, 1000));
        assertEquals("capacity", e.parameter());
        assertEquals("cost", assertThrows(InvalidArgumentException.class, () -> Request.cost(-1)).parameter());
        assertEquals("bucket_ms", assertThrows(InvalidArgumentException.class, () -> Spec.hashWindow(10, 1000, 300)).parameter());
        assertEquals("name", assertThrows(InvalidArgumentException.class, () -> client(d).hit("has space", "k")).parameter());
        assertEquals("key", assertThrows(InvalidArgumentException.class, () -> client(d).fixedWindow("", 1, 1)).parameter());
        assertEquals("rollout", assertThrows(InvalidArgumentException.class,
                () -> client(d).policySet("p", Spec.fixedWindow(1, 1), PolicyMode.ENFORCE, 101)).parameter());
    }

    @ParameterizedTest
    @EnumSource(Drivers.class)
    void aServerErrorIsAServerErrorException(Drivers d) throws Exception {
        String k = "{wrongtype}" + UUID.randomUUID();
        RedisServer owner = d.cluster() ? ownerOf(k) : server;
        owner.command("SET", k, "x");
        ServerErrorException e = assertThrows(ServerErrorException.class, () -> client(d).tokenBucket(k, 5, 1, 1000));
        assertTrue(e.getMessage().contains("WRONGTYPE"), e.getMessage());
        ServerErrorException missing = assertThrows(ServerErrorException.class, () -> client(d).hit("no-such-policy-" + d, k));
        assertTrue(missing.getMessage().contains("ERR"), missing.getMessage());
    }

    private RedisServer ownerOf(String k) throws Exception {
        for (RedisServer n : cluster.nodes()) {
            String slot = n.command("CLUSTER", "KEYSLOT", k);
            String slots = n.command("CLUSTER", "MYID");
            String shards = n.command("CLUSTER", "NODES");
            for (String line : shards.split("\n")) {
                if (line.startsWith(slots) && line.contains("myself")) {
                    String[] f = line.trim().split(" ");
                    for (int i = 8; i < f.length; i++) {
                        String[] r = f[i].split("-");
                        int s = Integer.parseInt(slot);
                        if (s >= Integer.parseInt(r[0]) && s <= Integer.parseInt(r[r.length - 1])) {
                            return n;
                        }
                    }
                }
            }
        }
        throw new IllegalStateException("no owner for " + k);
    }

    @ParameterizedTest
    @EnumSource(value = Drivers.class, names = {"LETTUCE", "JEDIS"})
    void aLateReplyIsATimeoutAndIsNotSentAgain(Drivers d) throws Exception {
        Client fast = client(d).withDeadline(Duration.ofMillis(100));
        String k = key("late");
        // The pause is long beside the deadline, so that a loaded machine
        // (a starved timer thread) still ends the call by its deadline.
        server.command("CLIENT", "PAUSE", "1500", "WRITE");
        long start = System.nanoTime();
        assertThrows(RateLimitTimeoutException.class, () -> fast.fixedWindow(k, 10, Windows.FIXED_MS));
        assertTrue(System.nanoTime() - start < 1_200_000_000L, "the deadline, not the pause, ended the call");
        // A peek is a write command, so the pause holds it too; it is answered
        // after the paused call, which the server runs first if it received it.
        // Whether it did depends on the driver (Lettuce drops a call that timed
        // out before it was written; Jedis has written it): the call counts
        // once or not at all, never twice.
        long first = client(d).limit(k, Spec.fixedWindow(10, Windows.FIXED_MS), Request.cost(0)).remaining();
        assertTrue(first == 9 || first == 10, "consumed at most once: " + first);
        for (int i = 0; i < 20; i++) {
            long again = client(d).limit(k, Spec.fixedWindow(10, Windows.FIXED_MS), Request.cost(0)).remaining();
            assertEquals(first, again, "the late call is not sent again");
            Thread.sleep(10);
        }
    }

    @ParameterizedTest
    @EnumSource(value = Drivers.class, names = {"LETTUCE", "JEDIS"})
    void aServerWithoutTheModuleIsRefusedAtStartUp(Drivers d) {
        try (RedisServer bare = RedisServer.startWithoutModule()) {
            Driver driver = d.standalone(bare);
            ModuleMissingException e = assertThrows(ModuleMissingException.class, () -> Client.connect(driver));
            assertTrue(e.getMessage().contains("no 'ratelimit' module"), e.getMessage());
            driver.close();
        }
    }

    @ParameterizedTest
    @EnumSource(Drivers.class)
    void theModuleVersionIsKnown(Drivers d) {
        assertTrue(client(d).moduleVersion() >= Client.MIN_MODULE_VERSION);
    }
}

package io.redisratelimit.client;

import com.fasterxml.jackson.databind.JsonNode;
import io.redisratelimit.client.testing.Contract;
import org.junit.jupiter.api.Test;

import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.function.LongFunction;

import static org.junit.jupiter.api.Assertions.assertDoesNotThrow;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;

/**
 * The protection loop against the contract's {@code protection} section:
 * {@link Protection}'s defaults are {@code kits}' timings, {@link PolicyLoop}'s
 * are {@code defaults} and it refuses each argument out of the contract's
 * range naming it as the server does, {@link PolicyStats} takes exactly
 * {@code stats_fields} and {@code window_fields}, and
 * {@link Protection#scaled} gives every {@code scaled} case.
 */
class ProtectionContractTest {
    private static JsonNode protection() {
        return Contract.json().get("protection");
    }

    @Test
    void theLoopsDefaultsAreTheContracts() {
        JsonNode kits = protection().get("kits");
        assertEquals(kits.get("report_interval_ms").longValue(), Protection.DEFAULT_REPORT_INTERVAL.toMillis());
        assertEquals(kits.get("stage_poll_ms").longValue(), Protection.DEFAULT_STAGE_POLL.toMillis());
        assertEquals(kits.get("stage_hold_ms").longValue(), Protection.DEFAULT_STAGE_HOLD.toMillis());
        assertEquals("the highest", kits.get("stage_of_many_masters").asText());
        JsonNode d = protection().get("defaults");
        assertEquals(d.get("factor").intValue(), PolicyLoop.DEFAULT_FACTOR);
        assertEquals(d.get("min").intValue(), PolicyLoop.DEFAULT_MIN);
        assertEquals(d.get("recover").intValue(), PolicyLoop.DEFAULT_RECOVER);
        assertEquals(d.get("mincalls").longValue(), PolicyLoop.DEFAULT_MIN_CALLS);
        assertEquals(d.get("window_ms").longValue(), PolicyLoop.DEFAULT_WINDOW_MS);
        List<Integer> stages = new ArrayList<>();
        protection().get("stages").forEach(s -> stages.add(s.get("stage").intValue()));
        assertEquals(List.of(Protection.NORMAL, Protection.DEGRADE, Protection.BREAK), stages);
    }

    @Test
    void eachArgumentIsRefusedOutOfTheContractsRangeNamingIt() {
        Map<String, LongFunction<Object>> build = Map.of(
                "ERRORS", n -> PolicyLoop.adapt((int) n),
                "FACTOR", n -> PolicyLoop.adapt(5).factor((int) n),
                "MIN", n -> PolicyLoop.adapt(5).min((int) n),
                "RECOVER", n -> PolicyLoop.adapt(5).recover((int) n),
                "MINCALLS", n -> PolicyLoop.adapt(5).minCalls(n),
                "WINDOW", n -> PolicyLoop.adapt(5).window(Duration.ofMillis(n)),
                "degrade_pct", n -> PolicyLoop.staged((int) n, 100),
                "pct", n -> {
                    if (n < 1 || n > 100) {
                        throw new InvalidArgumentException("pct", "out of range");
                    }
                    return n;
                });
        int checked = 0;
        for (JsonNode a : protection().get("arguments")) {
            String name = a.get("name").asText();
            if (name.equals("break_pct")) {
                // From degrade_pct to 100.
                assertDoesNotThrow(() -> PolicyLoop.staged(30, 30));
                assertDoesNotThrow(() -> PolicyLoop.staged(30, 100));
                assertEquals("break_pct", assertThrows(InvalidArgumentException.class, () -> PolicyLoop.staged(30, 29)).parameter());
                assertEquals("break_pct", assertThrows(InvalidArgumentException.class, () -> PolicyLoop.staged(30, 101)).parameter());
                checked++;
                continue;
            }
            long min = a.get("min").longValue();
            long max = a.get("max").longValue();
            if (name.equals("ok") || name.equals("errors") || name.equals("DENIED")) {
                assertEquals(0, min, name);
                assertEquals(Spec.MAX_PARAM, max, name);
                checked++;
                continue;
            }
            LongFunction<Object> f = build.get(name);
            assertDoesNotThrow(() -> f.apply(min), name + " " + min);
            assertDoesNotThrow(() -> f.apply(max), name + " " + max);
            if (min > 0) {
                assertEquals(name, assertThrows(InvalidArgumentException.class, () -> f.apply(min - 1)).parameter());
            }
            assertEquals(name, assertThrows(InvalidArgumentException.class, () -> f.apply(max + 1)).parameter());
            checked++;
        }
        assertEquals(12, checked);
    }

    @Test
    void theStatsParserTakesExactlyTheContractsFields() {
        List<String> stats = texts(protection().get("stats_fields"));
        List<String> window = texts(protection().get("window_fields"));
        assertEquals(stats, PolicyStats.FIELDS);
        assertEquals(window, PolicyStats.Window.FIELDS);
        List<Object> w = flat(window, 1);
        List<Object> reply = new ArrayList<>();
        long[] values = {80, 2, 1000, 1_796_000_000_000L};
        for (int i = 0; i < stats.size(); i++) {
            reply.add(stats.get(i));
            reply.add(i < 4 ? (Object) values[i] : stats.get(i).equals("adapting") ? (Object) 1L : w);
        }
        PolicyStats s = PolicyStats.fromReply("RL.POLICY STATS", reply);
        assertEquals(new PolicyStats(80, 2, 1000, 1_796_000_000_000L, new PolicyStats.Window(1, 2, 3, 4, 5, 6, 7),
                new PolicyStats.Window(1, 2, 3, 4, 5, 6, 7), true), s);
        List<Object> shorter = new ArrayList<>(reply.subList(0, reply.size() - 2));
        assertThrows(ProtocolException.class, () -> PolicyStats.fromReply("RL.POLICY STATS", shorter));
        List<Object> longer = new ArrayList<>(reply);
        longer.addAll(List.of("extra", 1L));
        assertThrows(ProtocolException.class, () -> PolicyStats.fromReply("RL.POLICY STATS", longer));
        List<Object> renamed = new ArrayList<>(reply);
        renamed.set(0, "scal");
        assertThrows(ProtocolException.class, () -> PolicyStats.fromReply("RL.POLICY STATS", renamed));
    }

    @Test
    void policyGetIsReadByNameWhateverLoopFieldsItCarries() {
        JsonNode get = protection().get("get_fields");
        List<String> names = new ArrayList<>(texts(get.get("always")));
        names.addAll(texts(get.get("when_set")));
        names.addAll(texts(get.get("then")));
        Map<String, Object> values = Map.ofEntries(Map.entry("name", "p"), Map.entry("algorithm", "TOKENBUCKET"),
                Map.entry("params", List.of(100L, 100L, 1000L)), Map.entry("mode", "ENFORCE"), Map.entry("rollout", 100L),
                Map.entry("calls", 7L), Map.entry("admitted", 5L), Map.entry("denied", 2L), Map.entry("shadow_denied", 0L),
                Map.entry("adapt", List.of(5L, 80L, 50L, 5L, 20L)), Map.entry("stages", List.of(30L, 50L)),
                Map.entry("window_ms", 1000L), Map.entry("scale", 80L), Map.entry("stage", 1L));
        List<Object> reply = new ArrayList<>();
        for (String n : names) {
            reply.add(n);
            reply.add(values.get(n));
        }
        PolicyInfo info = Client.parsePolicy("p", reply).orElseThrow();
        assertEquals(Spec.tokenBucket(100, 100, 1000), info.spec());
        assertEquals(PolicyMode.ENFORCE, info.mode());
        assertEquals(100, info.rollout());
        assertEquals(7, info.calls());
        assertEquals(2, info.denied());
        // Without the loop's fields (a policy that has none): the same.
        List<Object> plain = new ArrayList<>();
        for (String n : names) {
            if (!texts(get.get("when_set")).contains(n)) {
                plain.add(n);
                plain.add(values.get(n));
            }
        }
        assertEquals(info, Client.parsePolicy("p", plain).orElseThrow());
    }

    @Test
    void everyScaledCaseIsTheContracts() {
        int n = 0;
        for (JsonNode c : protection().get("scaled")) {
            assertEquals(c.get("scaled").longValue(), Protection.scaled(c.get("param").longValue(), c.get("scale").intValue()), c.toString());
            n++;
        }
        assertEquals(protection().get("scaled").size(), n);
    }

    private static List<Object> flat(List<String> names, long first) {
        List<Object> out = new ArrayList<>();
        long v = first;
        for (String name : names) {
            out.add(name);
            out.add(v++);
        }
        return out;
    }

    private static List<String> texts(JsonNode array) {
        List<String> out = new ArrayList<>();
        array.forEach(x -> out.add(x.asText()));
        return out;
    }
}

package io.redisratelimit.client;

import com.fasterxml.jackson.databind.JsonNode;
import io.redisratelimit.client.testing.Contract;
import org.junit.jupiter.api.DynamicTest;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.TestFactory;

import java.time.Duration;
import java.time.ZoneId;
import java.time.ZoneOffset;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;
import java.util.Locale;
import java.util.Map;
import java.util.Set;
import java.util.TreeSet;
import java.util.stream.Stream;

import static org.junit.jupiter.api.Assertions.assertDoesNotThrow;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;
import static org.junit.jupiter.api.DynamicTest.dynamicTest;

/**
 * The kit against {@code clients/contract/contract.json}: its spec
 * validation accepts exactly the server's cases and refuses the others naming
 * the same parameter, its zone syntax is the server's, its algorithms, periods
 * and {@code RateLimit-Policy} windows are the contract's; its requests and
 * blocking timeouts are accepted and refused as the server's options are, and
 * its reply parser takes each command's fields in the contract's order. (The
 * HTTP vectors are the starter's: {@code ContractHeadersTest} there.)
 */
class ContractTest {
    @Test
    void theFileIsVersionOneWithTheKitsBounds() {
        JsonNode c = Contract.json();
        assertEquals(1, c.get("version").asInt());
        assertEquals(Spec.MAX_PARAM, c.get("max_param").longValue());
        assertEquals(Spec.MAX_SPAN_MS, c.get("max_span_ms").longValue());
        assertEquals(List.of("allowed", "limit", "remaining", "wait_ms", "reset_ms"), texts(c.get("decision_fields")));
    }

    @Test
    void everyAlgorithmHasTheContractsCommandAndParameters() {
        List<String> words = new ArrayList<>();
        for (JsonNode a : Contract.json().get("algorithms")) {
            String word = a.get("word").asText();
            words.add(word);
            Algorithm algorithm = Algorithm.valueOf(word);
            assertEquals(a.get("command").asText(), algorithm.command(), word);
            List<String> names = new ArrayList<>();
            a.get("params").forEach(p -> names.add(p.get("name").asText()));
            // A quota's period is a parameter of the command; the kit keeps it beside the limit.
            List<String> kit = new ArrayList<>(algorithm.paramNames());
            if (algorithm == Algorithm.QUOTA) {
                kit.add("period");
            }
            assertEquals(names, kit, word);
        }
        assertEquals(Arrays.stream(Algorithm.values()).map(Enum::name).sorted().toList(), words.stream().sorted().toList());
    }

    @Test
    void periodsHaveTheContractsWordsIndicesAndNominalLengths() {
        JsonNode periods = Contract.json().get("periods");
        assertEquals(Period.values().length, periods.size());
        List<String> keywords = texts(Contract.algorithm("QUOTA").get("params").get(1).get("keywords"));
        for (JsonNode p : periods) {
            Period period = Period.values()[p.get("index").asInt()];
            assertEquals(p.get("word").asText(), period.word());
            assertEquals(p.get("word").asText(), keywords.get(p.get("index").asInt()));
            assertEquals(p.get("nominal_s").longValue(), period.nominalSeconds(), period.word());
            assertEquals(period, Period.parse(p.get("word").asText().toLowerCase(java.util.Locale.ROOT)));
        }
    }

    @TestFactory
    Stream<DynamicTest> validation() {
        List<DynamicTest> tests = new ArrayList<>();
        for (JsonNode a : Contract.json().get("algorithms")) {
            String word = a.get("word").asText();
            int i = 0;
            for (JsonNode v : a.get("validation")) {
                long[] params = Contract.longs(v.get("params"));
                boolean ok = v.get("ok").asBoolean();
                String name = word + " #" + i++ + " " + Arrays.toString(params) + (ok ? " ok" : " refused naming " + v.get("names").asText());
                tests.add(dynamicTest(name, () -> {
                    if (ok) {
                        Spec spec = assertDoesNotThrow(() -> Contract.spec(word, params), name);
                        assertEquals(word, spec.algorithm().name());
                        assertEquals(params[0], spec.limit());
                        if (spec.algorithm() == Algorithm.QUOTA) {
                            assertEquals(Period.values()[(int) params[1]], spec.period());
                        } else {
                            assertEquals(Arrays.stream(params).boxed().toList(), spec.params());
                        }
                    } else {
                        InvalidArgumentException e = assertThrows(InvalidArgumentException.class, () -> Contract.spec(word, params), name);
                        assertEquals(v.get("names").asText(), e.parameter(), name + ": " + e.getMessage());
                    }
                }));
            }
        }
        return tests.stream();
    }

    @TestFactory
    Stream<DynamicTest> zonesAccepted() {
        return texts(Contract.json().get("zones").get("accepted")).stream().map(zone -> dynamicTest("accepts '" + zone + "'", () -> {
            Spec spec = assertDoesNotThrow(() -> Spec.quota(10, Period.DAY, zone));
            boolean utc = zone.equalsIgnoreCase("UTC") || zone.equalsIgnoreCase("Z");
            ZoneId expected = utc ? ZoneOffset.UTC
                    : zone.startsWith("+") || zone.startsWith("-") ? ZoneOffset.of(zone) : ZoneId.of(zone);
            if (utc) {
                assertNull(spec.zone());
                assertFalse(spec.zoned());
            } else {
                assertEquals(zone, spec.zone());
                assertEquals(List.of("QUOTA", "10", "DAY", "TZ", zone), spec.words());
            }
            // The in-process level counts the quota's periods in this zone.
            assertEquals(expected, spec.zoneId(), zone);
        }));
    }

    @TestFactory
    Stream<DynamicTest> zonesRefused() {
        return texts(Contract.json().get("zones").get("refused")).stream().map(zone -> dynamicTest("refuses '" + zone + "'", () -> {
            InvalidArgumentException e = assertThrows(InvalidArgumentException.class, () -> Spec.quota(10, Period.DAY, zone), zone);
            assertEquals("zone", e.parameter());
        }));
    }

    @TestFactory
    Stream<DynamicTest> zonesTheServerAloneRefuses() {
        // Syntax the kit takes: only the server's time-zone database can refuse the name.
        return texts(Contract.json().get("zones").get("refused_by_server_only")).stream().map(zone -> dynamicTest("leaves '" + zone + "' to the server", () ->
                assertEquals(zone, Spec.quota(10, Period.DAY, zone).zone())));
    }

    @TestFactory
    Stream<DynamicTest> policyWindows() {
        List<DynamicTest> tests = new ArrayList<>();
        for (JsonNode p : Contract.json().get("policy_window")) {
            String word = p.get("algorithm").asText();
            long[] params = Contract.longs(p.get("params"));
            tests.add(dynamicTest(word + " " + Arrays.toString(params) + " w=" + p.get("w"), () -> {
                Spec spec = Contract.spec(word, params);
                if (p.get("w").isNull()) {
                    // No window: the RateLimit-Policy item leaves w out.
                    assertTrue(spec.concurrency(), word);
                } else {
                    assertFalse(spec.concurrency(), word);
                    assertEquals(p.get("w").longValue(), spec.windowSeconds());
                }
            }));
        }
        return tests.stream();
    }

    /** The algorithms whose golden sequences the in-process limiters must reproduce. */
    static final List<String> GOLDEN = List.of("TOKENBUCKET", "LEAKYBUCKET", "FIXEDWINDOW", "SLIDING", "HASHWINDOW", "QUOTA");

    /**
     * Every golden sequence through the in-process limiters, as the local
     * level and the local-only fallback run them ({@link LocalLimiters} at a
     * share equal to the limit, its clock at each step's instant): a cost
     * through {@code take} (every limiter decides, then runs), a forced cost
     * or a refund through the per-limiter step {@code charge} and
     * {@code giveBack} take. Every decision must equal the vector, all five
     * integers.
     */
    @TestFactory
    Stream<DynamicTest> goldenSequences() {
        List<DynamicTest> tests = new ArrayList<>();
        for (String word : GOLDEN) {
            JsonNode golden = Contract.algorithm(word).get("golden");
            assertTrue(golden != null && golden.size() > 0, word + " has golden sequences");
            int i = 0;
            for (JsonNode sequence : golden) {
                String name = word + " golden #" + i++;
                tests.add(dynamicTest(name, () -> {
                    List<String> wrong = goldenMismatches(word, sequence);
                    assertEquals(List.of(), wrong, name + ": " + wrong.size() + " of " + sequence.get("steps").size() + " decisions differ");
                }));
            }
        }
        return tests.stream();
    }

    @Test
    void goldenSequencesCoverEveryRequestKind() {
        int steps = 0;
        java.util.Set<String> kinds = new java.util.TreeSet<>();
        for (String word : GOLDEN) {
            for (JsonNode sequence : Contract.algorithm(word).get("golden")) {
                for (JsonNode step : sequence.get("steps")) {
                    kinds.add(step.get("request").fieldNames().next());
                    steps++;
                }
            }
        }
        assertEquals(java.util.Set.of("cost", "force", "refund"), kinds);
        assertTrue(steps >= 6 * 100, steps + " golden decisions");
    }

    /** The steps of one golden sequence whose decision differs from the vector (empty when all match). */
    static List<String> goldenMismatches(String word, JsonNode sequence) {
        long[] clock = {0};
        LocalLimiters limiters = new LocalLimiters(16, () -> clock[0]);
        List<String> wrong = new ArrayList<>();
        int n = 0;
        for (JsonNode step : sequence.get("steps")) {
            clock[0] = step.get("at_us").longValue();
            LocalLimiters.Take take = new LocalLimiters.Take("k", Contract.spec(word, Contract.longs(step.get("params"))));
            JsonNode request = step.get("request");
            Decision d;
            if (request.has("cost")) {
                d = limiters.take(List.of(take), request.get("cost").longValue()).decision();
            } else if (request.has("force")) {
                d = limiters.request(take, CoreAlgorithms.Request.force(request.get("force").longValue()));
            } else {
                d = limiters.request(take, CoreAlgorithms.Request.refund(request.get("refund").longValue()));
            }
            long[] got = {d.allowed() ? 1 : 0, d.limit(), d.remaining(), d.waitMs(), d.resetMs()};
            long[] expected = Contract.longs(step.get("decision"));
            if (!Arrays.equals(got, expected)) {
                wrong.add("step " + n + " " + step.get("params") + " at " + clock[0] + " " + request + ": expected "
                        + Arrays.toString(expected) + ", got " + Arrays.toString(got));
            }
            n++;
        }
        return wrong;
    }

    // ---- options and replies --------------------------------------------

    /**
     * The kit's argument names where they are not the option the server
     * names: the blocking calls take a {@code Duration} checked as
     * {@code timeout_ms}, which the server receives as {@code BLOCK}. Other
     * names ({@code cost}, {@code refund}) are the option's, compared
     * without case.
     */
    private static final Map<String, String> OPTION_OF = Map.of("timeout_ms", "BLOCK");

    private static String option(String parameter) {
        return OPTION_OF.getOrDefault(parameter, parameter).toUpperCase(Locale.ROOT);
    }

    /** The tagged request a case describes ({@code {"cost": n}}, {@code {"force": n}} or {@code {"refund": n}}). */
    private static Request request(JsonNode tagged) {
        String kind = tagged.fieldNames().next();
        long n = tagged.get(kind).longValue();
        return switch (kind) {
            case "cost" -> Request.cost(n);
            case "force" -> Request.force(n);
            case "refund" -> Request.refund(n);
            default -> throw new AssertionError("a request of an unknown kind: " + tagged);
        };
    }

    /** The words the kit sends for {@code r}: {@code COST 1}, the default, is not sent. */
    private static List<String> words(Request r) {
        List<String> args = new ArrayList<>();
        r.appendTo(args);
        return args;
    }

    @TestFactory
    Stream<DynamicTest> requestsAreAcceptedAndRefusedAsTheServerDoes() {
        List<DynamicTest> tests = new ArrayList<>();
        for (JsonNode c : Contract.json().get("options").get("requests")) {
            boolean ok = c.get("ok").asBoolean();
            List<String> args = texts(c.get("args"));
            tests.add(dynamicTest(c.get("request") + (ok ? " ok" : " refused naming " + c.get("names").asText()), () -> {
                if (ok) {
                    Request r = assertDoesNotThrow(() -> request(c.get("request")));
                    assertEquals(c.get("request").elements().next().longValue(), r.n());
                    assertEquals(args.equals(List.of("COST", "1")) ? List.of() : args, words(r));
                } else {
                    InvalidArgumentException e = assertThrows(InvalidArgumentException.class, () -> request(c.get("request")));
                    assertEquals(c.get("names").asText(), option(e.parameter()), e.getMessage());
                }
            }));
        }
        return tests.stream();
    }

    @TestFactory
    Stream<DynamicTest> blockingTimeoutsAreAcceptedAndRefusedAsTheServerDoes() {
        List<DynamicTest> tests = new ArrayList<>();
        for (JsonNode c : Contract.json().get("options").get("blocks")) {
            long ms = c.get("block_ms").longValue();
            boolean ok = c.get("ok").asBoolean();
            tests.add(dynamicTest("BLOCK " + ms + (ok ? " ok" : " refused"), () -> {
                if (ok) {
                    assertEquals(texts(c.get("args")), List.of("BLOCK", Long.toString(Client.blockMs(Duration.ofMillis(ms)))));
                } else {
                    InvalidArgumentException e = assertThrows(InvalidArgumentException.class, () -> Client.blockMs(Duration.ofMillis(ms)));
                    assertEquals(c.get("names").asText(), option(e.parameter()), e.getMessage());
                }
            }));
        }
        return tests.stream();
    }

    /** No request of any kind, with any of the values the cases use, sends words the server refuses. */
    @Test
    void theRefusedWordsCannotBeBuilt() {
        List<List<String>> refused = new ArrayList<>();
        Set<Long> values = new TreeSet<>(List.of(0L, 1L, 2L, Spec.MAX_PARAM));
        for (JsonNode c : Contract.json().get("options").get("refused_words")) {
            List<String> args = texts(c.get("args"));
            refused.add(args);
            args.stream().filter(a -> a.matches("[0-9]+")).forEach(a -> values.add(Long.parseLong(a)));
        }
        assertFalse(refused.isEmpty());
        for (long n : values) {
            for (Request r : List.of(Request.cost(n), Request.force(n), Request.refund(n))) {
                assertFalse(refused.contains(words(r)), r + " sends " + words(r));
            }
        }
        // The one constructor that could hold both is the kit's own, and it refuses them.
        assertEquals("force", assertThrows(InvalidArgumentException.class, () -> new Request(1, true, true)).parameter());
    }

    /**
     * Each reply of the contract's width parses into a decision with every
     * field where the contract puts it (the wire's {@code denied_by} is
     * 1-based, the kit's 0-based); a field fewer or more is refused. {@code RL.HIT}
     * answers as its policy's algorithm: five fields, or six with a lease.
     */
    @TestFactory
    Stream<DynamicTest> repliesParseWithTheContractsFieldsInOrder() {
        List<DynamicTest> tests = new ArrayList<>();
        for (JsonNode r : Contract.json().get("replies")) {
            String command = r.get("command").asText();
            JsonNode fields = r.get("fields");
            tests.add(dynamicTest(command + " " + fields, () -> {
                List<List<String>> shapes = fields.isArray() ? List.of(texts(fields))
                        : List.of(texts(Contract.json().get("decision_fields")),
                                texts(contractReply("RL.CONCURRENCY").get("fields")));
                for (List<String> names : shapes) {
                    List<Object> wire = new ArrayList<>();
                    for (int i = 0; i < names.size(); i++) {
                        wire.add(i == 0 ? 1L : 10L + i);
                    }
                    Decision d = Decision.fromReply(command, wire);
                    for (int i = 0; i < names.size(); i++) {
                        assertEquals(wire.get(i), field(d, names.get(i)), command + " field " + i + " " + names.get(i));
                    }
                }
                // A field fewer or more than the contract's widths is refused.
                int fewest = shapes.stream().mapToInt(List::size).min().orElseThrow();
                int most = shapes.stream().mapToInt(List::size).max().orElseThrow();
                for (int width : List.of(fewest - 1, most + 1)) {
                    List<Object> wire = new ArrayList<>(java.util.Collections.nCopies(width, 1L));
                    assertThrows(ProtocolException.class, () -> Decision.fromReply(command, wire), command + " of " + width);
                }
            }));
        }
        return tests.stream();
    }

    private static JsonNode contractReply(String command) {
        for (JsonNode r : Contract.json().get("replies")) {
            if (r.get("command").asText().equals(command)) {
                return r;
            }
        }
        throw new AssertionError("no reply for " + command);
    }

    /** A decision's field by the contract's name, as the wire has it. */
    private static long field(Decision d, String name) {
        return switch (name) {
            case "allowed" -> d.allowed() ? 1 : 0;
            case "limit" -> d.limit();
            case "remaining" -> d.remaining();
            case "wait_ms" -> d.waitMs();
            case "reset_ms" -> d.resetMs();
            case "lease" -> d.lease();
            case "denied_by" -> d.deniedBy().orElseThrow() + 1;
            default -> throw new AssertionError("the kit's Decision has no field '" + name + "'");
        };
    }

    private static List<String> texts(JsonNode array) {
        List<String> out = new ArrayList<>();
        array.forEach(n -> out.add(n.asText()));
        return out;
    }
}

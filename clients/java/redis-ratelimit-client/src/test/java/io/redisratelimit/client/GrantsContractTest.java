package io.redisratelimit.client;

import com.fasterxml.jackson.databind.JsonNode;
import io.redisratelimit.client.testing.Contract;
import org.junit.jupiter.api.Assumptions;
import org.junit.jupiter.api.BeforeEach;
import org.junit.jupiter.api.Test;

import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

/**
 * The contract's {@code grants} section (clients/contract/contract.json):
 * UPTO's requests, refusals and replies, the golden UPTO sequences through
 * the in-process limiters, the batched options' defaults and the batch
 * sizes, the stripes' range, shares and tags, reproduced by this kit.
 */
class GrantsContractTest {
    private JsonNode grants;

    @BeforeEach
    void section() {
        grants = Contract.json().path("grants");
        Assumptions.assumeTrue(grants.isObject(), "contract.json has no grants section yet");
    }

    @Test
    void theBatchedDefaultsAndBatchSizes() {
        JsonNode batched = grants.path("batched");
        assertEquals(Grants.OFF.holdMs(), batched.path("hold_ms").path("default").asLong());
        assertEquals(Grants.OFF.maxSharePct(), batched.path("max_share_pct").path("default").asInt());
        JsonNode vectors = batched.path("vectors");
        assertFalse(vectors.isEmpty(), "batch vectors");
        for (JsonNode v : vectors) {
            Grants g = new Grants(true, v.path("hold_ms").asLong(), v.path("max_share_pct").asInt(), 1);
            assertEquals(v.path("batch").asLong(), g.batchSize(v.path("rate_per_s").asLong(), v.path("limit").asLong()), v.toString());
        }
    }

    @Test
    void theStripesSharesAndTags() {
        JsonNode stripes = grants.path("stripes");
        assertEquals(Grants.MAX_STRIPES, stripes.path("n").path("max").asInt());
        for (JsonNode v : stripes.path("share_vectors")) {
            long total = v.path("total").asLong();
            int n = v.path("n").asInt();
            List<Long> want = new ArrayList<>();
            v.path("shares").forEach(s -> want.add(s.asLong()));
            if (want.contains(0L)) {
                assertEquals("striped", assertThrows(InvalidArgumentException.class,
                        () -> Stripes.shares(Spec.fixedWindow(total, 1000), n)).parameter(), v.toString());
            } else {
                assertEquals(want, Stripes.shares(Spec.fixedWindow(total, 1000), n).stream().map(Spec::limit).toList(), v.toString());
            }
        }
        JsonNode tagVectors = stripes.path("tag_vectors");
        assertFalse(tagVectors.isEmpty(), "tag vectors");
        for (JsonNode v : tagVectors) {
            List<Object> slots = new ArrayList<>();
            int m = 0;
            for (JsonNode master : v.path("masters")) {
                for (JsonNode range : master) {
                    slots.add(List.of(range.get(0).asLong(), range.get(1).asLong(), List.of("master", (long) m)));
                }
                m++;
            }
            List<String> want = new ArrayList<>();
            v.path("tags").forEach(t -> want.add(t.asText()));
            assertEquals(want, Stripes.fromClusterSlots(slots).tags(v.path("n").asInt()), v.toString());
        }
    }

    /** Every golden UPTO sequence through the in-process limiters: the five integers and granted, step by step. */
    @Test
    void theGoldenUptoSequences() {
        int steps = 0;
        for (JsonNode sequence : grants.path("golden")) {
            String word = sequence.path("word").asText();
            Spec spec = Contract.spec(word, Contract.longs(sequence.path("params")));
            long[] clock = {0};
            LocalLimiters limiters = new LocalLimiters(16, () -> clock[0]);
            LocalLimiters.Take take = new LocalLimiters.Take("k", spec);
            int n = 0;
            for (JsonNode step : sequence.path("steps")) {
                clock[0] = step.path("at_us").longValue();
                JsonNode request = step.path("request");
                Decision d;
                long granted;
                if (request.has("upto")) {
                    d = limiters.request(take, CoreAlgorithms.Request.upto(request.path("upto").longValue()));
                    granted = d.granted();
                } else {
                    long cost = request.path("cost").longValue();
                    d = limiters.request(take, CoreAlgorithms.Request.cost(cost));
                    granted = d.allowed() ? cost : 0;
                }
                long[] got = {d.allowed() ? 1 : 0, d.limit(), d.remaining(), d.waitMs(), d.resetMs(), granted};
                long[] want = Arrays.copyOf(Contract.longs(step.path("decision")), 6);
                want[5] = step.path("granted").longValue();
                assertEquals(Arrays.toString(want), Arrays.toString(got), word + " step " + n + " " + request);
                n++;
                steps++;
            }
        }
        assertTrue(steps >= 5 * 8, steps + " golden UPTO steps");
    }

    @Test
    void uptoRequestsAreAcceptedAndRefusedAsTheServerDoes() {
        for (JsonNode c : grants.path("requests")) {
            long n = c.path("request").path("upto").longValue();
            if (c.path("ok").asBoolean()) {
                List<String> words = new ArrayList<>();
                Request.upto(n).appendTo(words);
                List<String> want = new ArrayList<>();
                c.path("args").forEach(a -> want.add(a.asText()));
                assertEquals(want, words);
            } else {
                InvalidArgumentException e = assertThrows(InvalidArgumentException.class, () -> Request.upto(n));
                assertEquals(c.path("names").asText(), e.parameter());
                assertEquals(c.path("message").asText(), "ERR UPTO " + e.reason().replaceAll(", got .*", ""), e.getMessage());
            }
        }
        // Every request is one kind: COST, FORCE or REFUND never goes out with UPTO.
        for (JsonNode c : grants.path("refused_words")) {
            List<String> words = new ArrayList<>();
            Request.upto(2).appendTo(words);
            List<String> refused = new ArrayList<>();
            c.path("args").forEach(a -> refused.add(a.asText()));
            assertFalse(refused.equals(words), refused.toString());
        }
    }

    @Test
    void uptoIsRefusedWhereTheServerRefusesItInItsWords() {
        for (JsonNode c : grants.path("refused_commands")) {
            String command = c.path("command").asText();
            String message = c.path("message").asText();
            switch (command) {
                case "RL.LEAKYBUCKET", "RL.CONCURRENCY" -> {
                    Algorithm a = Algorithm.parse(command.substring(3));
                    assertEquals(message, "ERR " + Client.uptoRefusal(a, -1));
                }
                case "RL.ALL" -> assertEquals(message, "ERR " + Client.uptoRefusal(Algorithm.parse(c.path("policy").asText(
                        "LEAKYBUCKET")), c.path("spec").asInt()));
                default -> assertTrue(message.contains("UPTO"), "the server's own refusal: " + message);
            }
        }
    }

    @Test
    void anUptoReplyHasTheContractsFields() {
        for (JsonNode c : grants.path("replies")) {
            String command = c.path("command").asText();
            if (!c.path("fields").isArray()) {
                continue;
            }
            int width = c.path("fields").size();
            List<Object> reply = new ArrayList<>();
            for (int i = 0; i < width; i++) {
                reply.add(i == 0 ? 1L : (long) i + 1);
            }
            Decision d = Decision.fromReply(command, reply, Request.upto(9));
            assertEquals("granted", c.path("fields").get(width - 1).asText());
            assertEquals(width, d.granted(), command);
            reply.remove(width - 1);
            assertThrows(ProtocolException.class, () -> Decision.fromReply(command, reply, Request.upto(9)), command);
        }
    }
}

package io.redisratelimit.client;

import com.fasterxml.jackson.databind.JsonNode;
import io.redisratelimit.client.testing.Contract;
import org.junit.jupiter.api.Assumptions;
import org.junit.jupiter.api.BeforeEach;
import org.junit.jupiter.api.Test;

import java.util.ArrayList;
import java.util.List;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertThrows;

/**
 * The contract's {@code grants} section (clients/contract/contract.json):
 * the batched options' defaults and the batch sizes, the stripes' range,
 * shares and tags, reproduced by this kit.
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
}

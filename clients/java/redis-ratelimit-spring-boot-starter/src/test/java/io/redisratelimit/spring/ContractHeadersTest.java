package io.redisratelimit.spring;

import com.fasterxml.jackson.databind.JsonNode;
import io.redisratelimit.client.Decision;
import io.redisratelimit.client.Path;
import io.redisratelimit.client.Spec;
import io.redisratelimit.client.testing.Contract;
import org.junit.jupiter.api.DynamicTest;
import org.junit.jupiter.api.TestFactory;

import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;
import java.util.OptionalInt;
import java.util.OptionalLong;
import java.util.stream.Stream;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;
import static org.junit.jupiter.api.DynamicTest.dynamicTest;

/**
 * The starter's HTTP answer against the {@code headers} vectors of
 * {@code clients/contract/contract.json}: the {@code RateLimit-Policy} item,
 * the {@code RateLimit} item, {@code Retry-After} and the problem+json body
 * of a denial, byte for byte.
 */
class ContractHeadersTest {
    @TestFactory
    Stream<DynamicTest> headers() {
        List<DynamicTest> tests = new ArrayList<>();
        JsonNode vectors = Contract.json().get("headers");
        assertTrue(vectors.size() > 0, "no headers vectors");
        int i = 0;
        for (JsonNode v : vectors) {
            String rule = v.get("rule").asText();
            String word = v.get("algorithm").asText();
            long[] params = Contract.longs(v.get("params"));
            long[] f = Contract.longs(v.get("decision"));
            Decision d = new Decision(f[0] == 1, f[1], f[2], f[3], f[4], OptionalInt.empty(), Path.REDIS);
            String name = "#" + i++ + " " + word + " " + Arrays.toString(params) + " '" + rule + "' " + Arrays.toString(f);
            tests.add(dynamicTest(name + " RateLimit-Policy", () -> {
                Spec spec = Contract.spec(word, params);
                assertEquals(v.get("ratelimit_policy").asText(), RateLimitHeaders.policyItem(rule, spec));
            }));
            tests.add(dynamicTest(name + " RateLimit", () ->
                    assertEquals(v.get("ratelimit").asText(), RateLimitHeaders.rateLimitItem(rule, d))));
            tests.add(dynamicTest(name + " Retry-After", () -> {
                JsonNode want = v.get("retry_after");
                assertEquals(want.isNull() ? OptionalLong.empty() : OptionalLong.of(want.longValue()), RateLimitHeaders.retryAfter(d));
            }));
            tests.add(dynamicTest(name + " body", () -> {
                JsonNode want = v.get("body");
                // No body when admitted: the request goes on to the handler.
                assertEquals(want.isNull(), d.allowed());
                if (!d.allowed()) {
                    assertEquals(want.asText(), RateLimitHeaders.problemJson(rule, d));
                }
            }));
        }
        return tests.stream();
    }
}

package io.redisratelimit.spring;

import io.redisratelimit.client.Grants;
import org.junit.jupiter.api.Test;

import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;

/** ratelimit.rules.<name>.batched, hold-ms, max-share-pct and striped: read into the rule, each error naming its property. */
class RateLimitRulesGrantsTest {

    private static RateLimitProperties.Rule rule(String algorithm, Long... params) {
        RateLimitProperties.Rule r = new RateLimitProperties.Rule();
        r.setAlgorithm(algorithm);
        r.setParams(List.of(params));
        r.setFixedKey("{total}");
        r.setGlobal(true);
        return r;
    }

    private static RateLimitRules of(RateLimitProperties.Rule r) {
        Map<String, RateLimitProperties.Rule> m = new LinkedHashMap<>();
        m.put("total", r);
        return RateLimitRules.from("app", m);
    }

    private static String refused(RateLimitProperties.Rule r) {
        return assertThrows(RateLimitConfigException.class, () -> of(r)).property();
    }

    @Test
    void theOptionsReachTheRule() {
        RateLimitProperties.Rule r = rule("tokenbucket", 1000L, 100L, 1000L);
        r.setBatched(true);
        r.setHoldMs(200);
        r.setMaxSharePct(20);
        r.setStriped(3);
        assertEquals(new Grants(true, 200, 20, 3), of(r).get("total").rule().grants());
        assertEquals(Grants.OFF, of(rule("fixedwindow", 10L, 1000L)).get("total").rule().grants());
    }

    @Test
    void eachErrorNamesItsProperty() {
        RateLimitProperties.Rule hold = rule("tokenbucket", 1000L, 100L, 1000L);
        hold.setBatched(true);
        hold.setHoldMs(0);
        assertEquals("ratelimit.rules.total.hold-ms", refused(hold));
        RateLimitProperties.Rule share = rule("tokenbucket", 1000L, 100L, 1000L);
        share.setBatched(true);
        share.setMaxSharePct(101);
        assertEquals("ratelimit.rules.total.max-share-pct", refused(share));
        RateLimitProperties.Rule tooMany = rule("fixedwindow", 2L, 1000L);
        tooMany.setStriped(3);
        assertEquals("ratelimit.rules.total.striped", refused(tooMany));
        RateLimitProperties.Rule notGlobal = rule("fixedwindow", 20L, 1000L);
        notGlobal.setGlobal(false);
        notGlobal.setBatched(true);
        assertEquals("ratelimit.rules.total.batched", refused(notGlobal));
        RateLimitProperties.Rule leaky = rule("leakybucket", 20L, 1L, 1000L);
        leaky.setBatched(true);
        assertEquals("ratelimit.rules.total.batched", refused(leaky));
        RateLimitProperties.Rule shadow = rule("fixedwindow", 20L, 1000L);
        shadow.setStriped(2);
        shadow.setMode("shadow");
        assertEquals("ratelimit.rules.total.striped", refused(shadow));
        RateLimitProperties.Rule staged = rule("fixedwindow", 20L, 1000L);
        staged.setStriped(2);
        staged.setStages(List.of(30, 50));
        assertEquals("ratelimit.rules.total.striped", refused(staged));
        RateLimitProperties.Rule holdAlone = rule("fixedwindow", 20L, 1000L);
        holdAlone.setHoldMs(100);
        assertEquals("ratelimit.rules.total.hold-ms", refused(holdAlone));
    }
}

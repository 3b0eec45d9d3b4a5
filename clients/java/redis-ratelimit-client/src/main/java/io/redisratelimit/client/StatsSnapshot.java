package io.redisratelimit.client;

import java.util.LinkedHashMap;
import java.util.Map;

/**
 * A reading of the counters of every path a decision can take.
 *
 * @param redisCalls       limiter calls sent to Redis (probes excluded)
 * @param redisAdmitted    of those, answered admitted
 * @param redisDenied      of those, answered denied
 * @param redisErrors      of those, answered with a server error (e.g. {@code WRONGTYPE})
 * @param redisTimeouts    of those, not answered within the deadline
 * @param redisUnavailable of those, failed on the connection
 * @param localDenied      denied by the local level, without a round trip
 * @param denyCacheHits    denied by the deny cache, without a round trip
 * @param fallbackAdmitted admitted by the fallback
 * @param fallbackDenied   denied by the fallback
 * @param breakerSkipped   decided by the fallback because the breaker was open (no call)
 * @param breakerOpened    times the breaker opened
 * @param probes           probes sent while it was open
 * @param probesOk         probes answered (the breaker closed)
 * @param grantAsks        batched rules' {@code UPTO} calls (counted in {@code redisCalls} too)
 * @param grantAdmitted    admitted from units held, without a round trip
 * @param grantDenied      denied by a batched rule until its next ask, without a round trip
 * @param grantRefunds     {@code REFUND} calls giving held units back
 */
public record StatsSnapshot(long redisCalls, long redisAdmitted, long redisDenied, long redisErrors, long redisTimeouts,
                            long redisUnavailable, long localDenied, long denyCacheHits, long fallbackAdmitted,
                            long fallbackDenied, long breakerSkipped, long breakerOpened, long probes, long probesOk,
                            long grantAsks, long grantAdmitted, long grantDenied, long grantRefunds) {

    /** {@code name value} pairs in snake_case, as the Rust kit names them (for an exporter). */
    public Map<String, Long> pairs() {
        Map<String, Long> m = new LinkedHashMap<>();
        m.put("redis_calls", redisCalls);
        m.put("redis_admitted", redisAdmitted);
        m.put("redis_denied", redisDenied);
        m.put("redis_errors", redisErrors);
        m.put("redis_timeouts", redisTimeouts);
        m.put("redis_unavailable", redisUnavailable);
        m.put("local_denied", localDenied);
        m.put("deny_cache_hits", denyCacheHits);
        m.put("fallback_admitted", fallbackAdmitted);
        m.put("fallback_denied", fallbackDenied);
        m.put("breaker_skipped", breakerSkipped);
        m.put("breaker_opened", breakerOpened);
        m.put("probes", probes);
        m.put("probes_ok", probesOk);
        m.put("grant_asks", grantAsks);
        m.put("grant_admitted", grantAdmitted);
        m.put("grant_denied", grantDenied);
        m.put("grant_refunds", grantRefunds);
        return m;
    }
}

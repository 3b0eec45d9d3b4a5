package io.redisratelimit.client;

import java.util.concurrent.atomic.LongAdder;

/** The live counters behind {@link StatsSnapshot}. */
final class Stats {
    final LongAdder redisCalls = new LongAdder();
    final LongAdder redisAdmitted = new LongAdder();
    final LongAdder redisDenied = new LongAdder();
    final LongAdder redisErrors = new LongAdder();
    final LongAdder redisTimeouts = new LongAdder();
    final LongAdder redisUnavailable = new LongAdder();
    final LongAdder localDenied = new LongAdder();
    final LongAdder denyCacheHits = new LongAdder();
    final LongAdder fallbackAdmitted = new LongAdder();
    final LongAdder fallbackDenied = new LongAdder();
    final LongAdder breakerSkipped = new LongAdder();
    final LongAdder breakerOpened = new LongAdder();
    final LongAdder probes = new LongAdder();
    final LongAdder probesOk = new LongAdder();
    final LongAdder grantAsks = new LongAdder();
    final LongAdder grantAdmitted = new LongAdder();
    final LongAdder grantDenied = new LongAdder();
    final LongAdder grantRefunds = new LongAdder();

    StatsSnapshot snapshot() {
        return new StatsSnapshot(redisCalls.sum(), redisAdmitted.sum(), redisDenied.sum(), redisErrors.sum(),
                redisTimeouts.sum(), redisUnavailable.sum(), localDenied.sum(), denyCacheHits.sum(),
                fallbackAdmitted.sum(), fallbackDenied.sum(), breakerSkipped.sum(), breakerOpened.sum(),
                probes.sum(), probesOk.sum(), grantAsks.sum(), grantAdmitted.sum(), grantDenied.sum(), grantRefunds.sum());
    }
}

package io.redisratelimit.example;

import io.redisratelimit.client.Client;
import io.redisratelimit.client.Limiter;
import io.redisratelimit.client.Rule;
import io.redisratelimit.client.RuleSet;
import io.redisratelimit.client.Spec;
import io.redisratelimit.client.driver.LettuceDriver;

import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.Locale;
import java.util.UUID;
import java.util.concurrent.atomic.AtomicLong;
import java.util.concurrent.locks.LockSupport;

/**
 * Issue 27's figures for this kit (table 4 of KitBench, or alone with
 * {@code KIT_BENCH_ONLY=grants}): 4 limiter instances in process, 4 callers
 * each, offering twice a global token bucket's limit (paced), one rule
 * plain, then batched: admitted per second against the limit's bound (the
 * capacity plus the refill over the run), and Redis round trips per 1,000
 * decisions. A benchmark reports; it asserts nothing.
 *
 * <p>Env: KIT_BENCH_GRANTS_LIMIT (2000 per second), KIT_BENCH_GRANTS_SECONDS (5).
 */
final class GrantsBench {
    private GrantsBench() {
    }

    public static void main(String[] args) throws Exception {
        run(Integer.parseInt(args[0]));
    }

    static void run(int redisPort) throws Exception {
        long limit = Long.parseLong(System.getenv().getOrDefault("KIT_BENCH_GRANTS_LIMIT", "2000"));
        int seconds = Integer.parseInt(System.getenv().getOrDefault("KIT_BENCH_GRANTS_SECONDS", "5"));
        System.out.printf(Locale.ROOT, "%n4. one global limit of %d/s (token bucket %d %d 1000), 4 instances x 4 callers offering 2x, %d s%n",
                limit, limit, limit, seconds);
        System.out.printf(Locale.ROOT, "%-10s %10s %11s %9s %9s %17s%n", "rule", "offered/s", "admitted/s", "bound/s", "of limit", "Redis calls/1000");
        for (boolean batched : new boolean[] {false, true}) {
            Rule rule = Rule.of("bench-total", Spec.tokenBucket(limit, limit, 1000)).fixedKey("bench:grants:" + UUID.randomUUID()).asGlobal();
            if (batched) {
                rule = rule.batched();
            }
            List<Limiter> instances = new ArrayList<>();
            for (int i = 0; i < 4; i++) {
                Client c = Client.connect(LettuceDriver.connect(io.lettuce.core.RedisURI.create("redis://127.0.0.1:" + redisPort)),
                        Duration.ofMillis(100));
                // The local level off: the figures are the server's and the grants'.
                instances.add(Limiter.builder(c).localLevel(false).denyCache(false).build());
            }
            AtomicLong admitted = new AtomicLong();
            AtomicLong decided = new AtomicLong();
            long periodNs = 1_000_000_000L * 16 / (2 * limit);
            long start = System.nanoTime();
            long end = start + seconds * 1_000_000_000L;
            List<Thread> callers = new ArrayList<>();
            for (Limiter l : instances) {
                RuleSet set = l.rules(rule);
                for (int t = 0; t < 4; t++) {
                    long offset = periodNs * (callers.size()) / 16;
                    Thread th = new Thread(() -> {
                        long next = start + offset;
                        while (next < end) {
                            long wait = next - System.nanoTime();
                            if (wait > 0) {
                                LockSupport.parkNanos(wait);
                            }
                            if (l.check(set, "any").allowed()) {
                                admitted.incrementAndGet();
                            }
                            decided.incrementAndGet();
                            next += periodNs;
                        }
                    });
                    callers.add(th);
                    th.start();
                }
            }
            for (Thread th : callers) {
                th.join();
            }
            double took = (System.nanoTime() - start) / 1e9;
            long calls = 0;
            for (Limiter l : instances) {
                calls += l.stats().redisCalls();
                l.close();
            }
            // The token bucket's own bound: its capacity plus the refill over the run.
            double bound = (limit + limit * took) / took;
            System.out.printf(Locale.ROOT, "%-10s %10.0f %11.0f %9.0f %8.1f%% %17.1f%n", batched ? "batched" : "plain",
                    decided.get() / took, admitted.get() / took, bound, 100.0 * (admitted.get() / took - limit / took) / limit,
                    1000.0 * calls / Math.max(1, decided.get()));
        }
        System.out.println("  bound/s: (capacity + refill x elapsed) / elapsed; of limit: the admitted rate past the initial capacity, over the refill rate");
    }
}

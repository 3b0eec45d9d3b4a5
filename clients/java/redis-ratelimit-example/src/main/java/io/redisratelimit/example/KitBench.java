package io.redisratelimit.example;

import io.micrometer.prometheusmetrics.PrometheusConfig;
import io.micrometer.prometheusmetrics.PrometheusMeterRegistry;
import io.redisratelimit.client.Client;
import io.redisratelimit.client.DenyEventSink;
import io.redisratelimit.client.DenyEvents;
import io.redisratelimit.client.Limiter;
import io.redisratelimit.client.RateLimitMeters;
import io.redisratelimit.client.Rule;
import io.redisratelimit.client.RuleSet;
import io.redisratelimit.client.Spec;
import io.redisratelimit.client.StatsSnapshot;
import io.redisratelimit.client.driver.LettuceDriver;
import io.redisratelimit.spring.RateLimitService;
import org.springframework.boot.WebApplicationType;
import org.springframework.boot.builder.SpringApplicationBuilder;
import org.springframework.boot.web.context.WebServerApplicationContext;
import org.springframework.context.ConfigurableApplicationContext;

import java.net.URI;
import java.net.http.HttpClient;
import java.net.http.HttpRequest;
import java.net.http.HttpResponse;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;
import java.util.Locale;
import java.util.concurrent.ThreadLocalRandom;
import java.util.concurrent.atomic.AtomicLong;

/**
 * The Java kit's benchmark (clients/java/bench.sh, in {@code make bench}):
 * the example app in process over real HTTP.
 * <ol>
 *   <li>the annotation's cost per request: {@code /api/order/create}
 *       (two rules in one RL.ALL, limits that never bind) against
 *       {@code /api/order/bare}, the same handler without it, interleaved;</li>
 *   <li>Redis calls per 1,000 requests with and without the local level and
 *       the deny cache, under a skewed load (90% from one user; a global
 *       limit of 500/s that the load exceeds); with 4 instances, this one's
 *       local share is ceil(500 / 4 * 1.1) = 138/s;</li>
 *   <li>the cost of metrics and deny events: decisions per second of the
 *       {@link Limiter} in process on the same skewed load, with Micrometer
 *       metrics (a Prometheus registry) and deny events (a ring buffer
 *       flushed to a callback) on against off, interleaved, as a ratio.</li>
 * </ol>
 * Args: redis port. Env: KIT_BENCH_N (20000), KIT_BENCH_C (16), KIT_BENCH_ROUNDS (3),
 * KIT_BENCH_ONLY=observability (table 3 alone), KIT_BENCH_ONLY=grants (table 4 alone: {@link GrantsBench}).
 */
public final class KitBench {
    private static final HttpClient HTTP = HttpClient.newBuilder().version(HttpClient.Version.HTTP_1_1)
            .connectTimeout(Duration.ofSeconds(5)).build();

    record Run(long requests, double seconds, long ok, long limited, long p50us, long p99us) {
        double rps() {
            return requests / seconds;
        }
    }

    private KitBench() {
    }

    public static void main(String[] args) throws Exception {
        int redisPort = Integer.parseInt(args[0]);
        int n = Integer.parseInt(System.getenv().getOrDefault("KIT_BENCH_N", "20000"));
        int c = Integer.parseInt(System.getenv().getOrDefault("KIT_BENCH_C", "16"));
        int rounds = Integer.parseInt(System.getenv().getOrDefault("KIT_BENCH_ROUNDS", "3"));

        if ("observability".equals(System.getenv("KIT_BENCH_ONLY"))) {
            observability(redisPort, n, c, rounds);
            System.exit(0);
        }
        if ("grants".equals(System.getenv("KIT_BENCH_ONLY"))) {
            GrantsBench.run(redisPort);
            System.exit(0);
        }
        log("the annotation's cost per request (" + n + " requests, " + c + " connections, " + rounds + " rounds, 1000 users)");
        List<Run> bare = new ArrayList<>();
        List<Run> limited = new ArrayList<>();
        long fallback;
        try (ConfigurableApplicationContext app = start(redisPort, "RL_USER_LIMIT=100000", "RL_GLOBAL_LIMIT=1000000000", "RL_DEADLINE=100ms")) {
            int port = port(app);
            run(port, "/api/order/bare", n / 2, c, 0);
            run(port, "/api/order/create", n / 2, c, 0);
            for (int r = 1; r <= rounds; r++) {
                bare.add(run(port, "/api/order/bare", n, c, 0));
                limited.add(run(port, "/api/order/create", n, c, 0));
                log("round " + r + ": bare " + fmt(bare.get(bare.size() - 1)) + "; limited " + fmt(limited.get(limited.size() - 1)));
            }
            StatsSnapshot s = app.getBean(RateLimitService.class).limiter().stats();
            fallback = s.fallbackAdmitted() + s.fallbackDenied();
        }
        double bRps = median(bare.stream().mapToDouble(Run::rps).toArray());
        double lRps = median(limited.stream().mapToDouble(Run::rps).toArray());
        double b50 = median(bare.stream().mapToDouble(Run::p50us).toArray());
        double l50 = median(limited.stream().mapToDouble(Run::p50us).toArray());
        double b99 = median(bare.stream().mapToDouble(Run::p99us).toArray());
        double l99 = median(limited.stream().mapToDouble(Run::p99us).toArray());
        System.out.println();
        System.out.println("| Spring MVC endpoint | requests/s | p50 µs | p99 µs | µs per request (1 / rate) |");
        System.out.println("|---|---|---|---|---|");
        System.out.printf(Locale.ROOT, "| bare handler | %.0f | %.0f | %.0f | %.1f |%n", bRps, b50, b99, 1e6 / bRps);
        System.out.printf(Locale.ROOT, "| @RateLimited (RL.ALL of 2 rules) | %.0f | %.0f | %.0f | %.1f |%n", lRps, l50, l99, 1e6 / lRps);
        System.out.printf(Locale.ROOT, "| ratio limited / bare | %.2fx | %.2fx | | +%.1f µs |%n", lRps / bRps, l50 / b50, 1e6 / lRps - 1e6 / bRps);
        System.out.println("(requests the fallback decided during the limited runs: " + fallback + ")");

        log("Redis calls per 1,000 requests, skewed load (" + n + " requests, 90% from one user)");
        System.out.println();
        System.out.println("| local level | deny cache | instances | RL.ALL calls per 1,000 requests | admitted | denied | seconds |");
        System.out.println("|---|---|---|---|---|---|---|");
        for (String cfg : new String[] {"false false 1", "true false 1", "false true 1", "true true 1", "true false 4", "true true 4"}) {
            String[] f = cfg.split(" ");
            try (ConfigurableApplicationContext app = start(redisPort, "RL_LOCAL=" + f[0], "RL_DENY_CACHE=" + f[1],
                    "RL_INSTANCES=" + f[2], "RL_GLOBAL_LIMIT=500", "RL_DEADLINE=100ms")) {
                RateLimitService rl = app.getBean(RateLimitService.class);
                Run r = run(port(app), "/api/order/create", n, c, 0.9);
                long calls = rl.limiter().stats().redisCalls();
                log("local=" + f[0] + " deny_cache=" + f[1] + ": " + fmt(r) + ", Redis calls " + calls);
                System.out.printf(Locale.ROOT, "| %s | %s | %s | %.0f | %d | %d | %.1f |%n", on(f[0]), on(f[1]), f[2],
                        calls * 1000.0 / r.requests(), r.ok(), r.limited(), r.seconds());
            }
        }
        observability(redisPort, n, c, rounds);
        GrantsBench.run(redisPort);
        System.exit(0);
    }

    /** Table 3: the Limiter's decisions per second with metrics + deny events on vs off, side by side. */
    private static void observability(int redisPort, int n, int c, int rounds) throws InterruptedException {
        log("metrics + deny events on vs off: the Limiter in process (" + n + " decisions, " + c + " threads, 90% from one user)");
        Client client = Client.connect(LettuceDriver.connect(io.lettuce.core.RedisURI.create("redis://127.0.0.1:" + redisPort)),
                Duration.ofMillis(100));
        List<Double> off = new ArrayList<>();
        List<Double> on = new ArrayList<>();
        long[] deniedOn = new long[1];
        long[] shipped = new long[1];
        long[] dropped = new long[1];
        decisions(client, n / 2, c, false, null);
        decisions(client, n / 2, c, true, null);
        for (int r = 1; r <= rounds; r++) {
            off.add(decisions(client, n, c, false, null));
            long[] events = new long[3];
            on.add(decisions(client, n, c, true, events));
            deniedOn[0] += events[0];
            shipped[0] += events[1];
            dropped[0] += events[2];
            log(String.format(Locale.ROOT, "round %d: off %.0f decisions/s, on %.0f decisions/s", r, off.get(off.size() - 1),
                    on.get(on.size() - 1)));
        }
        client.close();
        double offRate = median(off.stream().mapToDouble(Double::doubleValue).toArray());
        double onRate = median(on.stream().mapToDouble(Double::doubleValue).toArray());
        System.out.println();
        System.out.println("| Limiter in process | decisions/s | µs per decision | ratio on / off |");
        System.out.println("|---|---|---|---|");
        System.out.printf(Locale.ROOT, "| metrics + deny events off | %.0f | %.2f | |%n", offRate, 1e6 / offRate);
        System.out.printf(Locale.ROOT, "| metrics + deny events on | %.0f | %.2f | %.2fx (%+.2f µs per decision) |%n", onRate, 1e6 / onRate,
                onRate / offRate, 1e6 / onRate - 1e6 / offRate);
        System.out.println("(deny events recorded in the runs with them on: " + deniedOn[0] + ", shipped " + shipped[0]
                + ", dropped " + dropped[0] + ")");
    }

    /** One run on a fresh Limiter (its own keys): decisions per second; {@code events} gets recorded, shipped, dropped. */
    private static double decisions(Client client, int n, int c, boolean observed, long[] events) throws InterruptedException {
        DenyEvents deny = observed ? DenyEvents.builder(DenyEventSink.callback(batch -> { })).build() : null;
        Limiter.Builder b = Limiter.builder(client).denyEvents(deny);
        if (observed) {
            b.metrics(RateLimitMeters.on(new PrometheusMeterRegistry(PrometheusConfig.DEFAULT)));
        }
        Limiter limiter = b.build();
        RuleSet rules = limiter.rules(Rule.of("user", Spec.fixedWindow(100, 1000)).keyPrefix("kit-bench:" + System.nanoTime() + ":"));
        AtomicLong next = new AtomicLong();
        Thread[] threads = new Thread[c];
        long start = System.nanoTime();
        for (int t = 0; t < c; t++) {
            threads[t] = new Thread(() -> {
                while (next.getAndIncrement() < n) {
                    ThreadLocalRandom rnd = ThreadLocalRandom.current();
                    limiter.check(rules, rnd.nextDouble() < 0.9 ? "evil" : "user" + rnd.nextInt(1000));
                }
            });
            threads[t].start();
        }
        for (Thread t : threads) {
            t.join();
        }
        double rate = n / ((System.nanoTime() - start) / 1e9);
        if (deny != null) {
            deny.close();
            if (events != null) {
                events[0] = deny.recorded();
                events[1] = deny.shipped();
                events[2] = deny.dropped();
            }
        }
        return rate;
    }

    private static String on(String b) {
        return Boolean.parseBoolean(b) ? "on" : "off";
    }

    private static ConfigurableApplicationContext start(int redisPort, String... env) {
        List<String> props = new ArrayList<>(List.of("--server.port=0", "--spring.data.redis.url=redis://127.0.0.1:" + redisPort,
                "--logging.level.root=WARN", "--spring.main.banner-mode=off", "--ratelimit.app=kit-bench-" + System.nanoTime()));
        for (String e : env) {
            String[] kv = e.split("=", 2);
            props.add("--" + kv[0] + "=" + kv[1]);
        }
        return new SpringApplicationBuilder(OrderApplication.class).web(WebApplicationType.SERVLET)
                .run(props.toArray(String[]::new));
    }

    private static int port(ConfigurableApplicationContext app) {
        return ((WebServerApplicationContext) app).getWebServer().getPort();
    }

    private static Run run(int port, String path, int n, int c, double skew) throws InterruptedException {
        AtomicLong next = new AtomicLong();
        AtomicLong ok = new AtomicLong();
        AtomicLong limited = new AtomicLong();
        long[] latencies = new long[n];
        URI uri = URI.create("http://127.0.0.1:" + port + path);
        Thread[] threads = new Thread[c];
        long start = System.nanoTime();
        for (int t = 0; t < c; t++) {
            threads[t] = new Thread(() -> {
                long i;
                while ((i = next.getAndIncrement()) < n) {
                    ThreadLocalRandom rnd = ThreadLocalRandom.current();
                    String user = rnd.nextDouble() < skew ? "evil" : "user" + rnd.nextInt(1000);
                    HttpRequest req = HttpRequest.newBuilder(uri).header("X-User", user)
                            .POST(HttpRequest.BodyPublishers.noBody()).timeout(Duration.ofSeconds(10)).build();
                    long t0 = System.nanoTime();
                    try {
                        int code = HTTP.send(req, HttpResponse.BodyHandlers.discarding()).statusCode();
                        (code == 429 ? limited : ok).incrementAndGet();
                    } catch (Exception e) {
                        // counted as neither
                    }
                    latencies[(int) i] = (System.nanoTime() - t0) / 1000;
                }
            });
            threads[t].start();
        }
        for (Thread t : threads) {
            t.join();
        }
        double seconds = (System.nanoTime() - start) / 1e9;
        Arrays.sort(latencies);
        return new Run(n, seconds, ok.get(), limited.get(), latencies[n / 2], latencies[Math.min(n - 1, (int) (n * 0.99))]);
    }

    private static String fmt(Run r) {
        return String.format(Locale.ROOT, "%.0f req/s p50 %d µs p99 %d µs ok %d limited %d", r.rps(), r.p50us(), r.p99us(), r.ok(), r.limited());
    }

    private static double median(double[] v) {
        double[] s = v.clone();
        Arrays.sort(s);
        return s[(s.length - 1) / 2];
    }

    private static void log(String s) {
        System.err.println("bench-kit-java: " + s);
    }
}

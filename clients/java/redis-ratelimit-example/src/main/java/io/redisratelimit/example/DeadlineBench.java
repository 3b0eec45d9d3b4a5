package io.redisratelimit.example;

import io.redisratelimit.client.Decision;
import io.redisratelimit.client.Path;
import io.redisratelimit.client.StatsSnapshot;
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
import java.util.Arrays;
import java.util.List;
import java.util.Locale;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.concurrent.atomic.AtomicLong;

/**
 * How long one limiter call takes on a cold JVM against a healthy Redis, and
 * how many decisions a deadline sends to the fallback: the measurement behind
 * the default deadline (docs/clients.md). Starts the example app in this
 * (fresh) JVM and sends N requests over HTTP from C connections at once; each
 * decision's time is taken by a {@link RateLimitService.Listener}.
 * Args: redis port, deadline (10ms, 100ms). Env: DEADLINE_BENCH_N (40000),
 * DEADLINE_BENCH_C (16). Run it once per JVM: the point is the cold start.
 */
public final class DeadlineBench {
    private static final HttpClient HTTP = HttpClient.newBuilder().version(HttpClient.Version.HTTP_1_1)
            .connectTimeout(Duration.ofSeconds(5)).build();

    private DeadlineBench() {
    }

    public static void main(String[] args) throws Exception {
        int redisPort = Integer.parseInt(args[0]);
        String deadline = args[1];
        int n = Integer.parseInt(System.getenv().getOrDefault("DEADLINE_BENCH_N", "40000"));
        int c = Integer.parseInt(System.getenv().getOrDefault("DEADLINE_BENCH_C", "16"));
        long[] nanos = new long[n];
        AtomicInteger seen = new AtomicInteger();
        AtomicLong fallback = new AtomicLong();
        RateLimitService.Listener timing = (List<String> rules, Decision d, long took) -> {
            int i = seen.getAndIncrement();
            if (i < n) {
                nanos[i] = took;
            }
            if (d.path() == Path.FALLBACK) {
                fallback.incrementAndGet();
            }
        };
        long t0 = System.nanoTime();
        ConfigurableApplicationContext app = new SpringApplicationBuilder(OrderApplication.class).web(WebApplicationType.SERVLET)
                .initializers(ctx -> ctx.getBeanFactory().registerSingleton("deadlineBenchTiming", timing))
                .run("--server.port=0", "--spring.data.redis.url=redis://127.0.0.1:" + redisPort, "--logging.level.root=WARN",
                        "--spring.main.banner-mode=off", "--ratelimit.app=deadline-bench-" + System.nanoTime(),
                        "--ratelimit.deadline=" + deadline, "--RL_USER_LIMIT=100000", "--RL_GLOBAL_LIMIT=1000000000");
        double startSeconds = (System.nanoTime() - t0) / 1e9;
        int port = ((WebServerApplicationContext) app).getWebServer().getPort();
        AtomicLong next = new AtomicLong();
        URI uri = URI.create("http://127.0.0.1:" + port + "/api/order/create");
        Thread[] threads = new Thread[c];
        for (int t = 0; t < c; t++) {
            threads[t] = new Thread(() -> {
                long i;
                while ((i = next.getAndIncrement()) < n) {
                    HttpRequest req = HttpRequest.newBuilder(uri).header("X-User", "user" + (i % 1000))
                            .POST(HttpRequest.BodyPublishers.noBody()).timeout(Duration.ofSeconds(10)).build();
                    try {
                        HTTP.send(req, HttpResponse.BodyHandlers.discarding());
                    } catch (Exception e) {
                        // the decision's time is what counts, not the HTTP answer
                    }
                }
            });
            threads[t].start();
        }
        for (Thread t : threads) {
            t.join();
        }
        StatsSnapshot s = app.getBean(RateLimitService.class).limiter().stats();
        int m = Math.min(n, seen.get());
        long[] sorted = Arrays.copyOf(nanos, m);
        Arrays.sort(sorted);
        long over = Arrays.stream(sorted).filter(x -> x > 100_000_000L).count();
        System.out.printf(Locale.ROOT, "| %s | %.1f s | %d | %.2f | %.2f | %.2f | %.1f | %d (%.4f%%) | %d | %d | %d |%n",
                deadline, startSeconds, m, ms(sorted, 0.5), ms(sorted, 0.99), ms(sorted, 0.999), sorted[m - 1] / 1e6,
                over, 100.0 * over / m, s.redisTimeouts(), fallback.get(), s.breakerOpened());
        app.close();
        System.exit(0);
    }

    private static double ms(long[] sorted, double q) {
        return sorted[Math.min(sorted.length - 1, (int) (sorted.length * q))] / 1e6;
    }
}

package io.redisratelimit.client;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import io.redisratelimit.client.testing.BulkServer;
import io.redisratelimit.client.testing.RedisServer;
import io.redisratelimit.client.testing.Windows;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

import java.net.URI;
import java.nio.file.Files;
import java.time.Duration;
import java.time.Instant;
import java.util.ArrayList;
import java.util.Collections;
import java.util.List;
import java.util.UUID;
import java.util.concurrent.CopyOnWriteArrayList;
import java.util.function.BooleanSupplier;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

/** Deny events through real sinks: a real _bulk HTTP server, a real file, a callback; dead sinks; a full buffer. */
class DenyEventsTest {
    private static final ObjectMapper JSON = new ObjectMapper();

    private static void poll(String what, Duration within, BooleanSupplier done) throws InterruptedException {
        long deadline = System.nanoTime() + within.toNanos();
        while (!done.getAsBoolean()) {
            if (System.nanoTime() > deadline) {
                throw new AssertionError("not within " + within + ": " + what);
            }
            Thread.sleep(10);
        }
    }

    private static DenyEvent event(int i) {
        return new DenyEvent(Instant.now(), "rl:user:" + i, "orders:user", "redis", "denied", 5, 0, 100 + i, "127.0.0.1", "test/1");
    }

    @Test
    void aFloodReachesTheBulkEndpointWholeInBatchesOfAtMostOneThousand() throws Exception {
        int n = 7_500;
        try (BulkServer bulk = BulkServer.start();
             DenyEvents events = DenyEvents.builder(DenyEventSink.bulk(bulk.url())).build()) {
            Thread[] writers = new Thread[3];
            for (int w = 0; w < writers.length; w++) {
                int from = w * (n / writers.length);
                writers[w] = new Thread(() -> {
                    for (int i = from; i < from + n / writers.length; i++) {
                        events.record(event(i));
                    }
                });
                writers[w].start();
            }
            for (Thread t : writers) {
                t.join();
            }
            poll("all " + n + " events at the _bulk server", Duration.ofSeconds(30), () -> bulk.events().size() >= n);
            assertEquals(List.of(), bulk.malformed());
            assertEquals(n, bulk.events().size());
            assertTrue(bulk.batches().stream().allMatch(b -> b >= 1 && b <= 1_000), "batch sizes " + bulk.batches());
            assertTrue(bulk.batches().size() >= n / 1_000, "batches " + bulk.batches());
            assertTrue(bulk.indexes().stream().allMatch("ratelimit-deny"::equals));
            assertTrue(bulk.contentTypes().stream().allMatch(c -> c.startsWith("application/x-ndjson")), bulk.contentTypes().toString());
            List<String> keys = new ArrayList<>();
            for (JsonNode e : bulk.events()) {
                keys.add(e.get("key").asText());
            }
            List<String> want = new ArrayList<>();
            for (int i = 0; i < n; i++) {
                want.add("rl:user:" + i);
            }
            Collections.sort(keys);
            Collections.sort(want);
            assertEquals(want, keys, "every event, once");
            assertEquals(n, events.shipped());
            assertEquals(0, events.dropped());
            assertEquals(0, events.sinkErrors());
        }
    }

    @Test
    void theFlushIntervalShipsASmallBatchToACallback() throws Exception {
        List<List<DenyEvent>> got = new CopyOnWriteArrayList<>();
        List<String> threads = new CopyOnWriteArrayList<>();
        try (DenyEvents events = DenyEvents.builder(DenyEventSink.callback(b -> {
            got.add(List.copyOf(b));
            threads.add(Thread.currentThread().getName());
        })).flushInterval(Duration.ofMillis(100)).build()) {
            for (int i = 0; i < 5; i++) {
                events.record(event(i));
            }
            poll("the callback's batch", Duration.ofSeconds(10), () -> got.stream().mapToInt(List::size).sum() == 5);
            assertEquals("rl:user:0", got.get(0).get(0).key(), "oldest first");
            assertTrue(threads.stream().noneMatch(t -> t.equals(Thread.currentThread().getName())), "never on the recording thread");
            assertEquals(5, events.shipped());
        }
    }

    @Test
    void aBufferSmallerThanFlushEventsIsFlushedWhenFull() throws Exception {
        List<DenyEvent> got = new CopyOnWriteArrayList<>();
        try (DenyEvents events = DenyEvents.builder(DenyEventSink.callback(got::addAll)).capacity(5)
                .flushInterval(Duration.ofMinutes(10)).build()) {
            for (int i = 0; i < 5; i++) {
                events.record(event(i));
            }
            poll("the full buffer flushed, long before the interval", Duration.ofSeconds(30), () -> got.size() == 5);
            assertEquals(0, events.dropped());
        }
    }

    @Test
    void closeAppendsWhatIsLeftToAFileAsJsonLines(@TempDir java.nio.file.Path dir) throws Exception {
        java.nio.file.Path file = dir.resolve("logs/deny.jsonl");
        DenyEvents events = DenyEvents.builder(DenyEventSink.file(file)).build();
        events.record(event(1));
        events.record(new DenyEvent(Instant.now(), "rl:x", "x", "local", "denied", 3, 0, -1, null, null));
        events.close();
        List<String> lines = Files.readAllLines(file);
        assertEquals(2, lines.size());
        assertEquals("rl:user:1", JSON.readTree(lines.get(0)).get("key").asText());
        assertFalse(JSON.readTree(lines.get(1)).has("client_ip"), "unknown: left out");
        assertEquals(-1, JSON.readTree(lines.get(1)).get("retry_after_ms").asLong());
        try (DenyEvents again = DenyEvents.builder(DenyEventSink.file(file)).build()) {
            again.record(event(2));
        }
        assertEquals(3, Files.readAllLines(file).size(), "appended, not overwritten");
        assertEquals(2, events.shipped());
    }

    @Test
    void aFullBufferWithAStoppedFlusherDropsExactlyTheOldest() {
        List<DenyEvent> got = new ArrayList<>();
        try (DenyEvents events = DenyEvents.builder(DenyEventSink.callback(got::addAll)).capacity(100).backgroundFlusher(false).build()) {
            for (int i = 0; i < 250; i++) {
                events.record(event(i));
            }
            assertEquals(150, events.dropped(), "sent - capacity");
            assertEquals(100, events.pending());
            assertEquals(100, events.flush());
            List<String> keys = got.stream().map(DenyEvent::key).toList();
            List<String> newest = new ArrayList<>();
            for (int i = 150; i < 250; i++) {
                newest.add("rl:user:" + i);
            }
            assertEquals(newest, keys, "the survivors are the newest, in order");
            assertEquals(150, events.dropped());
        }
    }

    @Test
    void aRefusedConnectionCostsASinkErrorAndTheBatchNothingElse() throws Exception {
        int port = RedisServer.freePort();
        try (DenyEvents events = DenyEvents.builder(DenyEventSink.bulk(URI.create("http://127.0.0.1:" + port)))
                .flushInterval(Duration.ofMillis(50)).build()) {
            for (int i = 0; i < 10; i++) {
                events.record(event(i));
            }
            poll("the refused batch counted", Duration.ofSeconds(10), () -> events.dropped() == 10);
            assertTrue(events.sinkErrors() >= 1);
            assertEquals(0, events.shipped());
            assertEquals(0, events.pending(), "never held, never retried");
        }
    }

    @Test
    void aBulkReplyWithErrorsOrABadStatusIsRefused() throws Exception {
        com.sun.net.httpserver.HttpServer http = com.sun.net.httpserver.HttpServer.create(
                new java.net.InetSocketAddress(java.net.InetAddress.getLoopbackAddress(), 0), 0);
        http.createContext("/errors/_bulk", ex -> {
            ex.getRequestBody().readAllBytes();
            byte[] b = "{\"errors\":true,\"items\":[]}".getBytes();
            ex.sendResponseHeaders(200, b.length);
            ex.getResponseBody().write(b);
            ex.close();
        });
        http.createContext("/status/_bulk", ex -> {
            ex.getRequestBody().readAllBytes();
            byte[] b = "{\"errors\":false}".getBytes();
            ex.sendResponseHeaders(503, b.length);
            ex.getResponseBody().write(b);
            ex.close();
        });
        http.start();
        try {
            for (String path : List.of("/errors", "/status/")) {
                URI url = URI.create("http://127.0.0.1:" + http.getAddress().getPort() + path);
                try (DenyEvents events = DenyEvents.builder(DenyEventSink.bulk(url)).backgroundFlusher(false).build()) {
                    events.record(event(1));
                    events.record(event(2));
                    assertEquals(0, events.flush(), path);
                    assertEquals(2, events.dropped(), path);
                    assertEquals(1, events.sinkErrors(), path);
                }
            }
        } finally {
            http.stop(0);
        }
    }

    @Test
    void aSinkThatNeverAnswersCostsCountsNotRequestLatency() throws Exception {
        try (RedisServer server = RedisServer.start(); BulkServer bulk = BulkServer.start().hang()) {
            DenyEvents events = DenyEvents.builder(DenyEventSink.bulk(bulk.url(), DenyEvents.DEFAULT_INDEX, Duration.ofMillis(300)))
                    .timeout(Duration.ofMillis(300)).flushEvents(10).flushInterval(Duration.ofMillis(50)).build();
            try (Limiter limiter = Limiter.builder(Client.connect(Drivers.LETTUCE.standalone(server), Duration.ofSeconds(2)))
                    .denyCache(false).denyEvents(events).build()) {
                RuleSet rules = limiter.rules(Rule.of("user", Spec.fixedWindow(1, Windows.FIXED_MS)).keyPrefix("dead:" + UUID.randomUUID() + ":"));
                int denied = 0;
                for (int i = 0; i < 200; i++) {
                    denied += limiter.check(rules, "ann").allowed() ? 0 : 1;
                }
                // Every request above was decided while the sink hung: none waited for it.
                assertEquals(199, denied);
                poll("batches given up after the timeout", Duration.ofSeconds(30), () -> events.sinkErrors() >= 2);
                assertEquals(0, events.shipped());
                long errors = events.sinkErrors();
                assertTrue(events.dropped() >= errors, "each timed-out batch is dropped: " + events.dropped() + " for " + errors);
                assertEquals(199, events.recorded());
            }
            assertEquals(199, events.dropped() + events.shipped(), "closed: every event shipped or counted lost");
        }
    }

    @Test
    void badSettingsAreRefusedNamingTheSetting() {
        DenyEventSink none = b -> { };
        assertEquals("sink", assertThrows(InvalidArgumentException.class, () -> DenyEvents.builder(null)).parameter());
        assertEquals("capacity", assertThrows(InvalidArgumentException.class, () -> DenyEvents.builder(none).capacity(0)).parameter());
        assertEquals("flush-events", assertThrows(InvalidArgumentException.class, () -> DenyEvents.builder(none).flushEvents(0)).parameter());
        assertEquals("flush-interval", assertThrows(InvalidArgumentException.class,
                () -> DenyEvents.builder(none).flushInterval(Duration.ZERO)).parameter());
        assertEquals("timeout", assertThrows(InvalidArgumentException.class,
                () -> DenyEvents.builder(none).timeout(Duration.ofMillis(-1))).parameter());
        assertEquals("url", assertThrows(InvalidArgumentException.class, () -> DenyEventSink.bulk(URI.create("ftp://x"))).parameter());
        assertEquals("index", assertThrows(InvalidArgumentException.class,
                () -> DenyEventSink.bulk(URI.create("http://x"), "", Duration.ofSeconds(1))).parameter());
        assertEquals("file", assertThrows(InvalidArgumentException.class, () -> DenyEventSink.file(null)).parameter());
        assertEquals("key", assertThrows(InvalidArgumentException.class,
                () -> new DenyEvent(Instant.now(), null, "r", "redis", "denied", 1, 0, 0, null, null)).parameter());
    }

    @Test
    void aBulkReplyIsJudgedByItsHeadNotReadToItsEnd() throws Exception {
        // Elasticsearch puts "errors" first; the items after it can be megabytes. A reply whose head says
        // errors false is accepted without reading (or holding in memory) the rest, even one that never ends.
        com.sun.net.httpserver.HttpServer http = com.sun.net.httpserver.HttpServer.create(
                new java.net.InetSocketAddress(java.net.InetAddress.getLoopbackAddress(), 0), 0);
        java.util.concurrent.CountDownLatch done = new java.util.concurrent.CountDownLatch(1);
        http.setExecutor(java.util.concurrent.Executors.newCachedThreadPool(r -> {
            Thread t = new Thread(r, "endless-bulk");
            t.setDaemon(true);
            return t;
        }));
        http.createContext("/_bulk", ex -> {
            ex.getRequestBody().readAllBytes();
            ex.sendResponseHeaders(200, 0);
            byte[] item = ",{\"index\":{\"status\":201}}".repeat(100).getBytes(java.nio.charset.StandardCharsets.UTF_8);
            try (java.io.OutputStream out = ex.getResponseBody()) {
                out.write("{\"took\":1,\"errors\":false,\"items\":[{}".getBytes(java.nio.charset.StandardCharsets.UTF_8));
                while (done.getCount() > 0) {
                    out.write(item);
                    out.flush();
                }
            } catch (java.io.IOException gone) {
                // the client stopped reading: what the sink should do
            }
        });
        http.start();
        try (DenyEvents events = DenyEvents.builder(DenyEventSink.bulk(URI.create("http://127.0.0.1:" + http.getAddress().getPort())))
                .backgroundFlusher(false).timeout(Duration.ofSeconds(5)).build()) {
            events.record(event(1));
            events.record(event(2));
            assertEquals(2, events.flush(), "errors false in the head: accepted");
            assertEquals(0, events.sinkErrors());
            assertEquals(0, events.dropped());
        } finally {
            done.countDown();
            http.stop(0);
            ((java.util.concurrent.ExecutorService) http.getExecutor()).shutdownNow();
        }
    }

    @Test
    void aSinkFailureThatCannotEvenBePrintedLeavesTheFlusherRunning() throws Exception {
        List<Integer> shipped = new CopyOnWriteArrayList<>();
        java.util.concurrent.atomic.AtomicInteger calls = new java.util.concurrent.atomic.AtomicInteger();
        DenyEventSink odd = batch -> {
            if (calls.incrementAndGet() == 1) {
                throw new IllegalStateException() {
                    @Override
                    public String toString() {
                        throw new UnsupportedOperationException("a toString that throws");
                    }

                    @Override
                    public String getMessage() {
                        throw new UnsupportedOperationException("a getMessage that throws");
                    }
                };
            }
            shipped.add(batch.size());
        };
        try (DenyEvents events = DenyEvents.builder(odd).flushInterval(Duration.ofMillis(20)).build()) {
            events.record(event(1));
            poll("the first batch refused", Duration.ofSeconds(10), () -> events.sinkErrors() == 1);
            events.record(event(2));
            poll("the flusher still ships after it", Duration.ofSeconds(10), () -> events.shipped() == 1);
            assertEquals(List.of(1), shipped);
            assertEquals(1, events.dropped());
        }
    }

    @Test
    void sinkSettingsThatCannotWorkAreRefusedNamingTheSetting(@TempDir java.nio.file.Path dir) {
        Duration t = Duration.ofSeconds(1);
        URI es = URI.create("http://127.0.0.1:9200");
        // Elasticsearch refuses these index names on every batch: refused here, before any event is lost.
        for (String index : List.of("RateLimit", "rate limit", "a/b", "a,b", "a*", "_deny", "-deny", "+deny", ".", "..", "a#b", "a\\b",
                "a:b", "x".repeat(256))) {
            InvalidArgumentException e = assertThrows(InvalidArgumentException.class, () -> DenyEventSink.bulk(es, index, t), index);
            assertEquals("index", e.parameter(), index);
        }
        DenyEventSink.bulk(es, "ratelimit-deny-2026.12", t);
        DenyEventSink.bulk(es, "<ratelimit-deny-{now/d}>", t);
        // <url>/_bulk after a query or a fragment is another URL.
        for (String url : List.of("http://127.0.0.1:9200/?pretty", "http://127.0.0.1:9200#x")) {
            assertEquals("url", assertThrows(InvalidArgumentException.class, () -> DenyEventSink.bulk(URI.create(url), "i", t)).parameter(), url);
        }
        assertEquals("file", assertThrows(InvalidArgumentException.class, () -> DenyEventSink.file(dir)).parameter(),
                "a folder is no file to append to");
    }

    @Test
    void eventsStillBufferedWhenTheJvmExitsAreShipped(@TempDir java.nio.file.Path dir) throws Exception {
        // A plain-Java service stopped (main returns, or SIGTERM) without closing its DenyEvents: the flusher is a
        // daemon, so without a shutdown hook up to flushInterval of denials vanished, not even counted.
        java.nio.file.Path file = dir.resolve("exit.jsonl");
        String jvm = java.nio.file.Path.of(System.getProperty("java.home"), "bin", "java").toString();
        Process p = new ProcessBuilder(jvm, "-cp", System.getProperty("java.class.path"), DenyEventsExitMain.class.getName(), file.toString())
                .redirectErrorStream(true).start();
        String out = new String(p.getInputStream().readAllBytes(), java.nio.charset.StandardCharsets.UTF_8);
        assertTrue(p.waitFor(60, java.util.concurrent.TimeUnit.SECONDS), out);
        assertEquals(0, p.exitValue(), out);
        assertTrue(out.contains("recorded 3"), out);
        assertTrue(Files.exists(file), "nothing shipped at exit\n" + out);
        List<String> lines = Files.readAllLines(file);
        assertEquals(3, lines.size(), out);
        assertTrue(lines.get(0).contains("\"key\":\"rl:exit:0\""), lines.get(0));
    }

    @Test
    void aBatchTheDiskCannotHoldLeavesNoBrokenLine(@TempDir java.nio.file.Path dir) throws Exception {
        // A full disk (here: the file size limit, ulimit -f 2, 2048 bytes) takes part of a batch and fails the rest:
        // the part written must go, or the next batch's first line is glued onto a broken one.
        java.nio.file.Path file = dir.resolve("disk.jsonl");
        String jvm = java.nio.file.Path.of(System.getProperty("java.home"), "bin", "java").toString();
        Process p = new ProcessBuilder("bash", "-c", "ulimit -f 2; exec \"$0\" \"$@\"", jvm, "-XX:-UsePerfData", "-cp",
                System.getProperty("java.class.path"), DenyEventsFullDiskMain.class.getName(), file.toString())
                .redirectErrorStream(true).start();
        String out = new String(p.getInputStream().readAllBytes(), java.nio.charset.StandardCharsets.UTF_8);
        assertTrue(p.waitFor(60, java.util.concurrent.TimeUnit.SECONDS), out);
        assertEquals(0, p.exitValue(), out);
        assertTrue(out.contains("shipped 5 of 5") && out.contains("shipped 0 of 10") && out.contains("shipped 1 of 1"), out);
        assertTrue(out.contains("dropped 10 errors 1"), out);
        String text = Files.readString(file);
        assertTrue(text.endsWith("\n"), "the file ends with a whole line\n" + text);
        List<String> keys = new ArrayList<>();
        for (String line : text.split("\n")) {
            keys.add(JSON.readTree(line).get("key").asText());
        }
        assertEquals(List.of("rl:disk:0", "rl:disk:1", "rl:disk:2", "rl:disk:3", "rl:disk:4", "rl:disk:15"), keys, text);
    }

    @Test
    void settingsTooLargeToWorkAreRefusedNamingTheSetting() {
        // A buffer the heap cannot allocate, durations whose nanoseconds overflow a long (the flusher and close count in them).
        DenyEventSink none = b -> { };
        assertEquals("capacity", assertThrows(InvalidArgumentException.class,
                () -> DenyEvents.builder(none).capacity(Integer.MAX_VALUE).build()).parameter());
        assertEquals("flush-events", assertThrows(InvalidArgumentException.class,
                () -> DenyEvents.builder(none).flushEvents(Integer.MAX_VALUE).build()).parameter());
        assertEquals("flush-interval", assertThrows(InvalidArgumentException.class,
                () -> DenyEvents.builder(none).flushInterval(Duration.ofDays(400 * 365)).build()).parameter());
        assertEquals("timeout", assertThrows(InvalidArgumentException.class,
                () -> DenyEvents.builder(none).timeout(Duration.ofDays(400 * 365)).build()).parameter());
        assertEquals("timeout", assertThrows(InvalidArgumentException.class,
                () -> DenyEventSink.bulk(URI.create("http://127.0.0.1:9200"), "i", Duration.ofDays(400 * 365))).parameter());
        DenyEvents.builder(none).capacity(DenyEvents.MAX_EVENTS).flushEvents(DenyEvents.MAX_EVENTS).flushInterval(DenyEvents.MAX_DURATION)
                .timeout(DenyEvents.MAX_DURATION).backgroundFlusher(false).build().close();
    }

    @Test
    void theLimiterRecordsEveryDenialAtEveryLevelWithItsFields() throws Exception {
        List<DenyEvent> got = new CopyOnWriteArrayList<>();
        try (RedisServer server = RedisServer.start()) {
            DenyEvents events = DenyEvents.builder(DenyEventSink.callback(got::addAll)).backgroundFlusher(false).build();
            String run = UUID.randomUUID().toString();
            try (Limiter limiter = Limiter.builder(Client.connect(Drivers.LETTUCE.standalone(server), Duration.ofSeconds(2)))
                    .denyEvents(events).fallback(FallbackMode.FAIL_CLOSED).breaker(1, Duration.ofMinutes(5)).build()) {
                RuleSet user = limiter.rules(Rule.of("user", Spec.fixedWindow(1, Windows.FIXED_MS)).keyPrefix("ev:" + run + ":"));
                assertTrue(limiter.check(user, "ann").allowed());
                limiter.checkAsync(user, List.of("ann"), 1, Origin.of("192.0.2.7", "agent/2")).toCompletableFuture().join();
                limiter.check(user, "ann");
                RuleSet total = limiter.rules(Rule.of("total", Spec.fixedWindow(1, Windows.FIXED_MS)).fixedKey("ev:" + run + ":t").asGlobal());
                limiter.check(total, "x");
                limiter.check(total, "x");
                server.kill9();
                RuleSet other = limiter.rules(Rule.of("other", Spec.fixedWindow(9, Windows.FIXED_MS)).keyPrefix("ev:" + run + ":o:"));
                limiter.check(other, "bob");
                events.flush();
                List<String> levels = got.stream().map(DenyEvent::level).toList();
                assertEquals(List.of("redis", "deny_cache", "local", "fallback"), levels);
                DenyEvent first = got.get(0);
                assertEquals("ev:" + run + ":ann", first.key());
                assertEquals("user", first.rule());
                assertEquals("denied", first.outcome());
                assertEquals(1, first.limit());
                assertTrue(first.retryAfterMs() > 0);
                assertEquals("192.0.2.7", first.clientIp());
                assertEquals("agent/2", first.userAgent());
                assertEquals(null, got.get(1).clientIp(), "a call without an origin");
                assertEquals("total", got.get(2).rule());
                assertEquals("other", got.get(3).rule());
            }
        }
    }

    @Test
    void aUsersHugeOriginIsCutAtACharacterBoundary() throws Exception {
        List<DenyEvent> got = new CopyOnWriteArrayList<>();
        // 1 + 4 * 5,000 bytes: the 512-byte mark falls inside a 4-byte character (one surrogate pair).
        String agent = "a" + "\uD83D\uDE00".repeat(5_000);
        String ip = "9".repeat(20_000);
        try (RedisServer server = RedisServer.start()) {
            DenyEvents events = DenyEvents.builder(DenyEventSink.callback(got::addAll)).backgroundFlusher(false).build();
            try (Limiter limiter = Limiter.builder(Client.connect(Drivers.LETTUCE.standalone(server), Duration.ofSeconds(2)))
                    .denyEvents(events).build()) {
                RuleSet user = limiter.rules(Rule.of("user", Spec.fixedWindow(1, Windows.FIXED_MS))
                        .keyPrefix("cut:" + UUID.randomUUID() + ":"));
                assertTrue(limiter.check(user, "ann").allowed());
                limiter.checkAsync(user, List.of("ann"), 1, Origin.of(ip, agent)).toCompletableFuture().join();
                events.flush();
            }
        }
        assertEquals(1, got.size(), got.toString());
        DenyEvent e = got.get(0);
        assertEquals("9".repeat(DenyEvent.MAX_HEADER_BYTES), e.clientIp());
        // 1 + 127 * 4 = 509 bytes: a 128th character would pass 512.
        assertEquals(agent.substring(0, 1 + 127 * 2), e.userAgent());
        assertEquals(509, e.userAgent().getBytes(java.nio.charset.StandardCharsets.UTF_8).length);
        assertTrue(e.toJson().length() < 2 * DenyEvent.MAX_HEADER_BYTES + 300, e.toJson());
    }
}

package io.redisratelimit.client.testing;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import com.sun.net.httpserver.HttpServer;

import java.io.IOException;
import java.io.InputStream;
import java.io.OutputStream;
import java.net.InetAddress;
import java.net.InetSocketAddress;
import java.net.URI;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.Iterator;
import java.util.List;
import java.util.concurrent.CopyOnWriteArrayList;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.Executors;
import java.util.concurrent.TimeUnit;

/**
 * A real Elasticsearch-style {@code _bulk} endpoint on 127.0.0.1, written for
 * the tests: it parses each NDJSON body as action/event pairs (an action line
 * {@code {"index":{"_index":...}}} then the event), keeps every event and
 * every batch's size, and answers {@code {"errors":false,"items":[...]}}.
 * A body that breaks the format is answered 400 and kept in
 * {@link #malformed()}. {@link #hang()} makes it never answer until
 * {@link #close()}.
 */
public final class BulkServer implements AutoCloseable {
    private static final ObjectMapper JSON = new ObjectMapper();

    private final HttpServer http;
    private final List<JsonNode> events = new CopyOnWriteArrayList<>();
    private final List<String> lines = new CopyOnWriteArrayList<>();
    private final List<Integer> batches = new CopyOnWriteArrayList<>();
    private final List<String> indexes = new CopyOnWriteArrayList<>();
    private final List<String> contentTypes = new CopyOnWriteArrayList<>();
    private final List<String> malformed = new CopyOnWriteArrayList<>();
    private final CountDownLatch released = new CountDownLatch(1);
    private volatile boolean hang;

    private BulkServer() throws IOException {
        http = HttpServer.create(new InetSocketAddress(InetAddress.getLoopbackAddress(), 0), 0);
        http.setExecutor(Executors.newCachedThreadPool(r -> {
            Thread t = new Thread(r, "bulk-server");
            t.setDaemon(true);
            return t;
        }));
        http.createContext("/_bulk", exchange -> {
            try (exchange) {
                byte[] body;
                try (InputStream in = exchange.getRequestBody()) {
                    body = in.readAllBytes();
                }
                if (hang) {
                    released.await(60, TimeUnit.SECONDS);
                    return;
                }
                contentTypes.add(String.valueOf(exchange.getRequestHeaders().getFirst("Content-Type")));
                String reply;
                int status = 200;
                try {
                    reply = accept(new String(body, StandardCharsets.UTF_8), exchange.getRequestMethod());
                } catch (IllegalArgumentException e) {
                    malformed.add(e.getMessage());
                    status = 400;
                    reply = "{\"error\":\"" + e.getMessage().replace('"', '\'') + "\"}";
                }
                byte[] out = reply.getBytes(StandardCharsets.UTF_8);
                exchange.getResponseHeaders().set("Content-Type", "application/json");
                exchange.sendResponseHeaders(status, out.length);
                try (OutputStream os = exchange.getResponseBody()) {
                    os.write(out);
                }
            } catch (InterruptedException e) {
                Thread.currentThread().interrupt();
            }
        });
        http.start();
    }

    public static BulkServer start() {
        try {
            return new BulkServer();
        } catch (IOException e) {
            throw new java.io.UncheckedIOException(e);
        }
    }

    private String accept(String body, String method) {
        if (!"POST".equals(method)) {
            throw new IllegalArgumentException("_bulk takes POST, got " + method);
        }
        if (!body.endsWith("\n")) {
            throw new IllegalArgumentException("an NDJSON body ends with a newline");
        }
        List<String> got = List.of(body.substring(0, body.length() - 1).split("\n", -1));
        if (got.size() % 2 != 0) {
            throw new IllegalArgumentException("an odd number of lines: " + got.size());
        }
        List<JsonNode> parsed = new ArrayList<>();
        List<String> raw = new ArrayList<>();
        StringBuilder items = new StringBuilder();
        for (Iterator<String> it = got.iterator(); it.hasNext(); ) {
            JsonNode action = read(it.next());
            JsonNode index = action.path("index");
            if (action.size() != 1 || !index.isObject() || !index.path("_index").isTextual()) {
                throw new IllegalArgumentException("not an index action: " + action);
            }
            indexes.add(index.get("_index").asText());
            String line = it.next();
            JsonNode event = read(line);
            if (!event.isObject()) {
                throw new IllegalArgumentException("an event is an object: " + line);
            }
            parsed.add(event);
            raw.add(line);
            items.append(items.length() == 0 ? "" : ",").append("{\"index\":{\"status\":201}}");
        }
        events.addAll(parsed);
        lines.addAll(raw);
        batches.add(parsed.size());
        return "{\"took\":1,\"errors\":false,\"items\":[" + items + "]}";
    }

    private static JsonNode read(String line) {
        try {
            return JSON.readTree(line);
        } catch (IOException e) {
            throw new IllegalArgumentException("not JSON: " + line);
        }
    }

    /** Never answers from now on (the connection stays open) until {@link #close()}. */
    public BulkServer hang() {
        hang = true;
        return this;
    }

    public URI url() {
        return URI.create("http://127.0.0.1:" + http.getAddress().getPort());
    }

    public List<JsonNode> events() {
        return events;
    }

    /** Each event's line as it came. */
    public List<String> lines() {
        return lines;
    }

    public List<Integer> batches() {
        return batches;
    }

    public List<String> indexes() {
        return indexes;
    }

    public List<String> contentTypes() {
        return contentTypes;
    }

    public List<String> malformed() {
        return malformed;
    }

    @Override
    public void close() {
        released.countDown();
        http.stop(0);
        ((java.util.concurrent.ExecutorService) http.getExecutor()).shutdownNow();
    }
}

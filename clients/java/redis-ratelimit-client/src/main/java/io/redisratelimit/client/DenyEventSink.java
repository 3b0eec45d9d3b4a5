package io.redisratelimit.client;

import java.io.IOException;
import java.io.OutputStream;
import java.net.URI;
import java.net.http.HttpClient;
import java.net.http.HttpRequest;
import java.net.http.HttpResponse;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.StandardOpenOption;
import java.time.Duration;
import java.util.List;
import java.util.function.Consumer;
import java.util.regex.Pattern;

/**
 * Where {@link DenyEvents} ships its batches, always on its flusher (never
 * on a request). A batch the sink accepts returns normally; one it refuses
 * throws, and is dropped and counted (never retried).
 */
@FunctionalInterface
public interface DenyEventSink {

    /** Ships one batch (at most {@code flushEvents} events, oldest first); throws when it is refused. */
    void ship(List<DenyEvent> batch) throws Exception;

    /** A callback given the batch, on the flusher. */
    static DenyEventSink callback(Consumer<List<DenyEvent>> callback) {
        if (callback == null) {
            throw new InvalidArgumentException("callback", "a callback sink needs a function");
        }
        return callback::accept;
    }

    /** Appends each batch to {@code file} as JSON lines (the file and its folder are created when missing). */
    static DenyEventSink file(java.nio.file.Path file) {
        if (file == null) {
            throw new InvalidArgumentException("file", "a file sink needs a path");
        }
        return batch -> {
            StringBuilder b = new StringBuilder(batch.size() * 192);
            for (DenyEvent e : batch) {
                b.append(e.toJson()).append('\n');
            }
            java.nio.file.Path parent = file.toAbsolutePath().getParent();
            if (parent != null) {
                Files.createDirectories(parent);
            }
            try (OutputStream out = Files.newOutputStream(file, StandardOpenOption.CREATE, StandardOpenOption.APPEND,
                    StandardOpenOption.WRITE)) {
                out.write(b.toString().getBytes(StandardCharsets.UTF_8));
            }
        };
    }

    /** Elasticsearch's {@code _bulk} at {@code url} (as {@code http://host:9200}), index {@code ratelimit-deny}, 2 s per request. */
    static DenyEventSink bulk(URI url) {
        return bulk(url, DenyEvents.DEFAULT_INDEX, DenyEvents.DEFAULT_TIMEOUT);
    }

    /**
     * {@code POST <url>/_bulk}, {@code Content-Type: application/x-ndjson}:
     * per event the action line {@code {"index":{"_index":"<index>"}}} then
     * the event's line. Accepted on a 2xx whose JSON body has
     * {@code "errors": false}; anything else (a connection refused, a
     * timeout, another status, {@code "errors": true}) throws.
     */
    static DenyEventSink bulk(URI url, String index, Duration timeout) {
        return new Bulk(url, index, timeout);
    }

    /** The {@code _bulk} sink: {@link java.net.http.HttpClient}, so no dependency. */
    final class Bulk implements DenyEventSink {
        private static final Pattern NO_ERRORS = Pattern.compile("\"errors\"\\s*:\\s*false");
        private final URI endpoint;
        private final String action;
        private final Duration timeout;
        private final HttpClient http;

        Bulk(URI url, String index, Duration timeout) {
            if (url == null || url.getScheme() == null || !(url.getScheme().equals("http") || url.getScheme().equals("https"))
                    || url.getHost() == null) {
                throw new InvalidArgumentException("url", "the _bulk sink needs an http(s) URL with a host, got " + url);
            }
            if (index == null || index.isEmpty()) {
                throw new InvalidArgumentException("index", "the _bulk sink needs an index name");
            }
            if (timeout == null || timeout.isZero() || timeout.isNegative()) {
                throw new InvalidArgumentException("timeout", "must be above 0, got " + timeout);
            }
            String base = url.toString();
            this.endpoint = URI.create((base.endsWith("/") ? base.substring(0, base.length() - 1) : base) + "/_bulk");
            StringBuilder a = new StringBuilder("{\"index\":{\"_index\":");
            DenyEvent.string(a, index);
            this.action = a.append("}}\n").toString();
            this.timeout = timeout;
            this.http = HttpClient.newBuilder().connectTimeout(timeout).version(HttpClient.Version.HTTP_1_1).build();
        }

        public URI endpoint() {
            return endpoint;
        }

        @Override
        public void ship(List<DenyEvent> batch) throws IOException, InterruptedException {
            StringBuilder body = new StringBuilder(batch.size() * 240);
            for (DenyEvent e : batch) {
                body.append(action).append(e.toJson()).append('\n');
            }
            HttpRequest request = HttpRequest.newBuilder(endpoint).timeout(timeout)
                    .header("Content-Type", "application/x-ndjson")
                    .POST(HttpRequest.BodyPublishers.ofString(body.toString(), StandardCharsets.UTF_8)).build();
            HttpResponse<String> response = http.send(request, HttpResponse.BodyHandlers.ofString(StandardCharsets.UTF_8));
            if (response.statusCode() / 100 != 2) {
                throw new IOException(endpoint + " answered HTTP " + response.statusCode());
            }
            if (!NO_ERRORS.matcher(response.body()).find()) {
                throw new IOException(endpoint + " answered without \"errors\": false");
            }
        }
    }
}

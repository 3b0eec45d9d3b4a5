package io.redisratelimit.client;

import java.io.IOException;
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
        if (Files.isDirectory(file)) {
            throw new InvalidArgumentException("file", "the file sink appends to a file, and " + file + " is a folder");
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
            appendWhole(file, b.toString().getBytes(StandardCharsets.UTF_8));
        };
    }

    /**
     * Appends {@code bytes} to {@code file}, all or nothing: a write that
     * fails part way (a full disk, a file size limit, the flusher's timeout
     * interrupting it) is cut off again, so that the file holds whole lines
     * only and the next batch starts on a line of its own. (One writer per
     * file: another process appending to it meanwhile would be cut too.)
     */
    private static void appendWhole(java.nio.file.Path file, byte[] bytes) throws IOException {
        long before = -1;
        try (java.nio.channels.FileChannel ch = java.nio.channels.FileChannel.open(file, StandardOpenOption.CREATE,
                StandardOpenOption.APPEND, StandardOpenOption.WRITE)) {
            before = ch.size();
            java.nio.ByteBuffer buf = java.nio.ByteBuffer.wrap(bytes);
            while (buf.hasRemaining()) {
                ch.write(buf);
            }
        } catch (IOException e) {
            if (before >= 0) {
                // The channel may be closed (an interrupt closes it): cut the part written on a new one, not interrupted.
                boolean interrupted = Thread.interrupted();
                try (java.nio.channels.FileChannel cut = java.nio.channels.FileChannel.open(file, StandardOpenOption.WRITE)) {
                    if (cut.size() > before) {
                        cut.truncate(before);
                    }
                } catch (IOException again) {
                    e.addSuppressed(again);
                } finally {
                    if (interrupted) {
                        Thread.currentThread().interrupt();
                    }
                }
            }
            throw e;
        }
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
        /** The first "errors" field: Elasticsearch and OpenSearch put it at the top, before the items. */
        private static final Pattern ERRORS = Pattern.compile("\"errors\"\\s*:\\s*(true|false)");
        /** How much of a reply is read to find it. */
        private static final int HEAD_BYTES = 64 * 1024;
        private final URI endpoint;
        private final String action;
        private final Duration timeout;
        private final HttpClient http;

        Bulk(URI url, String index, Duration timeout) {
            if (url == null || url.getScheme() == null || !(url.getScheme().equals("http") || url.getScheme().equals("https"))
                    || url.getHost() == null) {
                throw new InvalidArgumentException("url", "the _bulk sink needs an http(s) URL with a host, got " + url);
            }
            if (url.getRawQuery() != null || url.getRawFragment() != null) {
                throw new InvalidArgumentException("url", "the _bulk sink posts to <url>/_bulk: give the base URL without a query or a"
                        + " fragment, got " + url);
            }
            String bad = badIndex(index);
            if (bad != null) {
                throw new InvalidArgumentException("index", bad);
            }
            if (timeout == null || timeout.isZero() || timeout.isNegative() || timeout.compareTo(DenyEvents.MAX_DURATION) > 0) {
                throw new InvalidArgumentException("timeout", "must be above 0 and at most " + DenyEvents.MAX_DURATION + ", got " + timeout);
            }
            String base = url.toString();
            this.endpoint = URI.create((base.endsWith("/") ? base.substring(0, base.length() - 1) : base) + "/_bulk");
            StringBuilder a = new StringBuilder("{\"index\":{\"_index\":");
            DenyEvent.string(a, index);
            this.action = a.append("}}\n").toString();
            this.timeout = timeout;
            this.http = HttpClient.newBuilder().connectTimeout(timeout).version(HttpClient.Version.HTTP_1_1).build();
        }

        /**
         * Why Elasticsearch would refuse {@code index} on every batch, or null:
         * lowercase only, none of {@code \\ / * ? " < > | , # :} nor a space,
         * not starting with {@code - _ +}, not {@code .} or {@code ..}, at most
         * 255 bytes. A date-math name ({@code <ratelimit-deny-{now/d}>}) is
         * left to the server.
         */
        static String badIndex(String index) {
            if (index == null || index.isEmpty()) {
                return "the _bulk sink needs an index name";
            }
            if (index.length() > 2 && index.startsWith("<") && index.endsWith(">")) {
                return null;
            }
            if (index.getBytes(StandardCharsets.UTF_8).length > 255) {
                return "an index name is at most 255 bytes, got " + index.getBytes(StandardCharsets.UTF_8).length;
            }
            if (index.equals(".") || index.equals("..")) {
                return "an index cannot be named '" + index + "'";
            }
            if ("-_+".indexOf(index.charAt(0)) >= 0) {
                return "an index name cannot start with '" + index.charAt(0) + "', got '" + index + "'";
            }
            for (int i = 0; i < index.length(); i++) {
                char c = index.charAt(i);
                if (Character.isUpperCase(c)) {
                    return "an index name is lowercase, got '" + index + "'";
                }
                if ("\\/*?\"<>|,#: ".indexOf(c) >= 0 || Character.isWhitespace(c) || c < 0x20) {
                    return "an index name cannot hold '" + c + "', got '" + index + "'";
                }
            }
            return null;
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
            // The reply as a stream: only its head is read. Elasticsearch puts "errors" before the items,
            // which can be megabytes; the rest is never held (closing the stream drops the connection).
            HttpResponse<java.io.InputStream> response = http.send(request, HttpResponse.BodyHandlers.ofInputStream());
            try (java.io.InputStream in = response.body()) {
                if (response.statusCode() / 100 != 2) {
                    throw new IOException(endpoint + " answered HTTP " + response.statusCode());
                }
                String head = head(in);
                java.util.regex.Matcher m = ERRORS.matcher(head);
                if (!m.find()) {
                    throw new IOException(endpoint + " answered without \"errors\" in the first " + HEAD_BYTES + " bytes");
                }
                if (!m.group(1).equals("false")) {
                    throw new IOException(endpoint + " answered \"errors\": true");
                }
            }
        }

        /** The reply's first bytes, up to where its top-level "errors" field is known (at most HEAD_BYTES). */
        private static String head(java.io.InputStream in) throws IOException {
            byte[] buf = new byte[HEAD_BYTES];
            int n = 0;
            while (n < buf.length) {
                int r = in.read(buf, n, buf.length - n);
                if (r < 0) {
                    break;
                }
                n += r;
                if (ERRORS.matcher(new String(buf, 0, n, StandardCharsets.UTF_8)).find()) {
                    break;
                }
            }
            return new String(buf, 0, n, StandardCharsets.UTF_8);
        }
    }
}

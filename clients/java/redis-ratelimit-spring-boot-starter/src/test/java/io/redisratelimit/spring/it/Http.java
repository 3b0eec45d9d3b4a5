package io.redisratelimit.spring.it;

import java.net.URI;
import java.net.http.HttpClient;
import java.net.http.HttpRequest;
import java.net.http.HttpResponse;
import java.time.Duration;

/** Real HTTP to the running app. */
final class Http {
    static final HttpClient CLIENT = HttpClient.newBuilder().connectTimeout(Duration.ofSeconds(5)).build();

    private Http() {
    }

    static HttpResponse<String> send(String method, int port, String path, String user) {
        HttpRequest.Builder b = HttpRequest.newBuilder(URI.create("http://127.0.0.1:" + port + path))
                .timeout(Duration.ofSeconds(10)).method(method, HttpRequest.BodyPublishers.noBody());
        if (user != null) {
            b.header("X-User", user);
        }
        try {
            return CLIENT.send(b.build(), HttpResponse.BodyHandlers.ofString());
        } catch (Exception e) {
            throw new IllegalStateException(e);
        }
    }

    /**
     * A GET over a plain socket with these raw User-Agent bytes (Java's HTTP
     * client would send each non-ASCII char as '?'); returns the status code.
     */
    static int getWithRawUserAgent(int port, String path, String user, byte[] userAgent) {
        try (java.net.Socket s = new java.net.Socket("127.0.0.1", port)) {
            s.setSoTimeout(10_000);
            java.io.ByteArrayOutputStream req = new java.io.ByteArrayOutputStream();
            req.writeBytes(("GET " + path + " HTTP/1.1\r\nHost: 127.0.0.1:" + port + "\r\nX-User: " + user
                    + "\r\nConnection: close\r\nUser-Agent: ").getBytes(java.nio.charset.StandardCharsets.US_ASCII));
            req.writeBytes(userAgent);
            req.writeBytes("\r\n\r\n".getBytes(java.nio.charset.StandardCharsets.US_ASCII));
            s.getOutputStream().write(req.toByteArray());
            s.getOutputStream().flush();
            String head = new String(s.getInputStream().readAllBytes(), java.nio.charset.StandardCharsets.ISO_8859_1);
            String[] status = head.split("\r\n", 2)[0].split(" ");
            if (status.length < 2 || !status[0].startsWith("HTTP/1.")) {
                throw new IllegalStateException("not an HTTP response: " + head);
            }
            return Integer.parseInt(status[1]);
        } catch (java.io.IOException e) {
            throw new java.io.UncheckedIOException(e);
        }
    }
}

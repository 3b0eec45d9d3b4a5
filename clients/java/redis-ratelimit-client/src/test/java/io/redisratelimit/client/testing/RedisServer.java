package io.redisratelimit.client.testing;

import java.io.File;
import java.io.IOException;
import java.io.InputStream;
import java.io.OutputStream;
import java.net.InetSocketAddress;
import java.net.ServerSocket;
import java.net.Socket;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.time.Duration;
import java.util.ArrayList;
import java.util.List;

/**
 * A real redis-server with the module loaded, on a free loopback port, for
 * the tests. The module comes from {@code RL_MODULE} (the Makefile passes
 * the project's {@code target/release/libredis_ratelimit.so}); the server
 * binary from {@code REDIS_SERVER} or {@code redis-server} on the PATH.
 * Start-up is polled with PING, never slept through.
 */
public final class RedisServer implements AutoCloseable {
    private final int port;
    private final Path dir;
    private final List<String> extra;
    private final Path sentinelConf;
    private Process process;

    private RedisServer(int port, Path dir, List<String> extra) {
        this(port, dir, extra, null);
    }

    private RedisServer(int port, Path dir, List<String> extra, Path sentinelConf) {
        this.port = port;
        this.dir = dir;
        this.extra = extra;
        this.sentinelConf = sentinelConf;
    }

    public static String module() {
        String m = System.getenv("RL_MODULE");
        if (m == null || m.isBlank() || m.equals("null")) {
            throw new IllegalStateException("set RL_MODULE to the module's .so (make test-kit-java does: target/release/libredis_ratelimit.so)");
        }
        if (!new File(m).isFile()) {
            throw new IllegalStateException("RL_MODULE=" + m + " is not a file: run make build first");
        }
        return m;
    }

    /** A standalone server with the module. */
    public static RedisServer start() {
        return start(List.of());
    }

    public static RedisServer start(List<String> extraArgs) {
        try {
            RedisServer s = new RedisServer(freePort(), Files.createTempDirectory("rl-java-redis"), List.copyOf(extraArgs));
            s.launch();
            return s;
        } catch (IOException e) {
            throw new IllegalStateException(e);
        }
    }

    /** A server with the module on a port chosen before (an application was started against it while no server was there). */
    public static RedisServer startOn(int port) {
        try {
            RedisServer s = new RedisServer(port, Files.createTempDirectory("rl-java-redis"), List.of());
            s.launch();
            return s;
        } catch (IOException e) {
            throw new IllegalStateException(e);
        }
    }

    /** A server without the module: the start-up check must refuse it. */
    public static RedisServer startWithoutModule() {
        try {
            RedisServer s = new RedisServer(freePort(), Files.createTempDirectory("rl-java-redis"), List.of("--no-module"));
            s.launch();
            return s;
        } catch (IOException e) {
            throw new IllegalStateException(e);
        }
    }

    /** A replica of {@code master}, with the module too (it replays the module's commands); ready once its link is up. */
    public static RedisServer startReplicaOf(RedisServer master) {
        RedisServer r = start(List.of("--replicaof", "127.0.0.1", Integer.toString(master.port())));
        try {
            long deadline = System.nanoTime() + Duration.ofSeconds(20).toNanos();
            while (System.nanoTime() < deadline) {
                if (r.command("INFO", "replication").contains("master_link_status:up")) {
                    return r;
                }
                Thread.sleep(10);
            }
            String log = r.log();
            r.close();
            throw new IllegalStateException("the replica on " + r.port + " did not sync with " + master.port + ": " + log);
        } catch (IOException | InterruptedException e) {
            r.close();
            throw new IllegalStateException(e);
        }
    }

    /**
     * A Sentinel (the same binary with {@code --sentinel}, no module) on a
     * free port, monitoring {@code master} as {@code name} with quorum 1.
     */
    public static RedisServer startSentinel(String name, RedisServer master, long downAfterMs, long failoverTimeoutMs) {
        try {
            Path dir = Files.createTempDirectory("rl-java-sentinel");
            Path conf = dir.resolve("sentinel.conf");
            Files.writeString(conf, "sentinel monitor " + name + " 127.0.0.1 " + master.port() + " 1\n"
                    + "sentinel down-after-milliseconds " + name + " " + downAfterMs + "\n"
                    + "sentinel failover-timeout " + name + " " + failoverTimeoutMs + "\n");
            RedisServer s = new RedisServer(freePort(), dir, List.of("--no-module"), conf);
            s.launch();
            return s;
        } catch (IOException e) {
            throw new IllegalStateException(e);
        }
    }

    private void launch() {
        List<String> cmd = new ArrayList<>(List.of(System.getenv().getOrDefault("REDIS_SERVER", "redis-server")));
        if (sentinelConf != null) {
            // The config file must come first; Sentinel rewrites it as it learns the replicas and the failovers.
            cmd.add(sentinelConf.toString());
            cmd.add("--sentinel");
        }
        cmd.addAll(List.of("--port", Integer.toString(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
                "--dir", dir.toString(), "--protected-mode", "no"));
        boolean module = true;
        for (String a : extra) {
            if (a.equals("--no-module")) {
                module = false;
            } else {
                cmd.add(a);
            }
        }
        if (module) {
            cmd.add("--loadmodule");
            cmd.add(module());
        }
        try {
            process = new ProcessBuilder(cmd).redirectErrorStream(true)
                    .redirectOutput(dir.resolve("redis.log").toFile()).start();
        } catch (IOException e) {
            throw new IllegalStateException("cannot start redis-server: " + e.getMessage(), e);
        }
        long deadline = System.nanoTime() + Duration.ofSeconds(20).toNanos();
        while (System.nanoTime() < deadline) {
            if (!process.isAlive()) {
                throw new IllegalStateException("redis-server exited: " + log());
            }
            if (ping()) {
                return;
            }
            Thread.onSpinWait();
            try {
                Thread.sleep(5);
            } catch (InterruptedException e) {
                Thread.currentThread().interrupt();
                throw new IllegalStateException(e);
            }
        }
        throw new IllegalStateException("redis-server on " + port + " did not answer PING: " + log());
    }

    public String log() {
        try {
            return Files.readString(dir.resolve("redis.log"));
        } catch (IOException e) {
            return "(no log)";
        }
    }

    public int port() {
        return port;
    }

    public String uri() {
        return "redis://127.0.0.1:" + port;
    }

    /** kill -9: no shutdown, no goodbye to the clients. */
    public void kill9() {
        process.destroyForcibly();
        try {
            process.waitFor();
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
        }
    }

    /** Starts it again on the same port (state lost: no persistence). */
    public void restart() {
        if (process != null && process.isAlive()) {
            kill9();
        }
        launch();
    }

    public boolean ping() {
        try {
            return "PONG".equals(command("PING"));
        } catch (IOException e) {
            return false;
        }
    }

    /** One command over a raw socket: the tests' own view of the server, without either driver. */
    public String command(String... args) throws IOException {
        try (Socket s = new Socket()) {
            s.connect(new InetSocketAddress("127.0.0.1", port), 500);
            s.setSoTimeout(2000);
            OutputStream out = s.getOutputStream();
            StringBuilder b = new StringBuilder("*").append(args.length).append("\r\n");
            for (String a : args) {
                byte[] bytes = a.getBytes(StandardCharsets.UTF_8);
                b.append('$').append(bytes.length).append("\r\n").append(a).append("\r\n");
            }
            out.write(b.toString().getBytes(StandardCharsets.UTF_8));
            out.flush();
            return readReply(s.getInputStream());
        }
    }

    private static String readReply(InputStream in) throws IOException {
        String line = readLine(in);
        char t = line.charAt(0);
        String rest = line.substring(1);
        switch (t) {
            case '+', '-', ':' -> {
                return rest;
            }
            case '$' -> {
                int n = Integer.parseInt(rest);
                if (n < 0) {
                    return null;
                }
                byte[] buf = in.readNBytes(n + 2);
                return new String(buf, 0, n, StandardCharsets.UTF_8);
            }
            case '*' -> {
                int n = Integer.parseInt(rest);
                List<String> items = new ArrayList<>();
                for (int i = 0; i < n; i++) {
                    items.add(readReply(in));
                }
                return String.join(" ", items);
            }
            default -> throw new IOException("bad reply " + line);
        }
    }

    private static String readLine(InputStream in) throws IOException {
        StringBuilder b = new StringBuilder();
        int c;
        while ((c = in.read()) != -1) {
            if (c == '\r') {
                in.read();
                return b.toString();
            }
            b.append((char) c);
        }
        throw new IOException("connection closed");
    }

    public static int freePort() {
        try (ServerSocket s = new ServerSocket(0, 1, java.net.InetAddress.getLoopbackAddress())) {
            s.setReuseAddress(true);
            return s.getLocalPort();
        } catch (IOException e) {
            throw new IllegalStateException(e);
        }
    }

    @Override
    public void close() {
        if (process != null) {
            kill9();
        }
        try (var files = Files.walk(dir)) {
            files.sorted(java.util.Comparator.reverseOrder()).forEach(p -> p.toFile().delete());
        } catch (IOException e) {
            // a temp dir left behind is harmless
        }
    }
}

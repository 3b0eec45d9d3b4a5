package io.redisratelimit.client.driver;

import io.redisratelimit.client.RedisUnavailableException;
import io.redisratelimit.client.ServerErrorException;
import redis.clients.jedis.CommandArguments;
import redis.clients.jedis.Connection;
import redis.clients.jedis.ConnectionPool;
import redis.clients.jedis.JedisCluster;
import redis.clients.jedis.UnifiedJedis;
import redis.clients.jedis.commands.ProtocolCommand;
import redis.clients.jedis.exceptions.JedisConnectionException;
import redis.clients.jedis.exceptions.JedisDataException;
import redis.clients.jedis.exceptions.JedisException;

import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.atomic.AtomicInteger;

/**
 * The driver on Jedis: {@code JedisPooled} (standalone), {@code JedisSentineled}
 * (Sentinel) or {@link JedisCluster}, any {@link UnifiedJedis}. Jedis is
 * blocking, so the asynchronous form runs each call on this driver's own
 * daemon threads; a cluster routes each call by its key with
 * {@code sendCommand(sampleKey, ...)}.
 *
 * <p>Give the {@code JedisCluster} {@code maxAttempts = 1}: its default
 * resends a command after a connection error, which for a limiter write is a
 * second consumption.
 *
 * <p>A call the server may hold ({@code BLOCK}) takes a connection of the
 * pool for itself, for the whole wait, with no socket timeout (as Jedis does
 * for {@code BLPOP}): size the pool ({@code maxTotal}) for the acquires
 * waiting at once beside the other calls, or give the blocking calls a
 * client of their own ({@link #owning(UnifiedJedis, UnifiedJedis)}).
 */
public final class JedisDriver implements Driver {
    private final UnifiedJedis jedis;
    private final UnifiedJedis blocking;
    private final boolean owned;
    private final ExecutorService executor;

    private JedisDriver(UnifiedJedis jedis, UnifiedJedis blocking, boolean owned) {
        this.jedis = jedis;
        this.blocking = blocking;
        this.owned = owned;
        AtomicInteger n = new AtomicInteger();
        this.executor = Executors.newCachedThreadPool(r -> {
            Thread t = new Thread(r, "redis-ratelimit-jedis-" + n.incrementAndGet());
            t.setDaemon(true);
            return t;
        });
    }

    /** Over a client the application opened and closes. */
    public static JedisDriver of(UnifiedJedis jedis) {
        return new JedisDriver(jedis, jedis, false);
    }

    /** Over a client this driver closes with itself. */
    public static JedisDriver owning(UnifiedJedis jedis) {
        return new JedisDriver(jedis, jedis, true);
    }

    /**
     * Over two clients this driver closes with itself: {@code jedis} for the
     * calls answered at once, {@code blocking} (same servers, its own pool)
     * for the calls the server may hold, so that waiting acquires never take
     * the other calls' connections.
     */
    public static JedisDriver owning(UnifiedJedis jedis, UnifiedJedis blocking) {
        return new JedisDriver(jedis, blocking, true);
    }

    @Override
    public boolean cluster() {
        return jedis instanceof JedisCluster;
    }

    @Override
    public CompletableFuture<Object> send(Command command) {
        return CompletableFuture.supplyAsync(() -> sendNow(command), executor);
    }

    /** The blocking form, on the caller's thread. */
    public Object sendNow(Command command) {
        try {
            byte[][] args = bytes(command.args());
            String key = command.routingKey();
            Object reply = key == null
                    ? jedis.sendCommand(protocol(command.name()), args)
                    : jedis.sendCommand(key.getBytes(StandardCharsets.UTF_8), protocol(command.name()), args);
            return Replies.normalize(reply);
        } catch (RuntimeException e) {
            throw translate(e, command);
        }
    }

    /**
     * On a connection of the pool held for this call, without a socket
     * timeout. A caller that gives up (its deadline) leaves this thread
     * waiting for the server's reply, which comes by the BLOCK timeout.
     */
    @Override
    public CompletableFuture<Object> sendBlocking(Command command) {
        return CompletableFuture.supplyAsync(() -> {
            try {
                byte[][] args = bytes(command.args());
                String key = command.routingKey();
                Object reply = key == null
                        ? blocking.sendBlockingCommand(protocol(command.name()), args)
                        : blocking.sendBlockingCommand(key.getBytes(StandardCharsets.UTF_8), protocol(command.name()), args);
                return Replies.normalize(reply);
            } catch (RuntimeException e) {
                throw translate(e, command);
            }
        }, executor);
    }

    @Override
    public CompletableFuture<List<Object>> sendToMasters(Command command) {
        if (!(jedis instanceof JedisCluster c)) {
            return send(command).thenApply(List::of);
        }
        return CompletableFuture.supplyAsync(() -> {
            List<Object> out = new ArrayList<>();
            for (Map.Entry<String, ConnectionPool> node : c.getClusterNodes().entrySet()) {
                try (Connection conn = node.getValue().getResource()) {
                    Object role = Replies.normalize(conn.executeCommand(new CommandArguments(protocol("ROLE"))));
                    if (role instanceof List<?> r && !r.isEmpty() && "master".equals(r.get(0))) {
                        CommandArguments a = new CommandArguments(protocol(command.name()));
                        for (String s : command.args()) {
                            a.add(s);
                        }
                        out.add(Replies.normalize(conn.executeCommand(a)));
                    }
                } catch (RuntimeException e) {
                    throw translate(e, command);
                }
            }
            return out;
        }, executor);
    }

    static RuntimeException translate(RuntimeException e, Command command) {
        if (e instanceof JedisConnectionException) {
            return new RedisUnavailableException(command.name() + ": " + e.getMessage(), e);
        }
        if (e instanceof JedisDataException) {
            return new ServerErrorException(command.name() + ": " + e.getMessage(), e);
        }
        if (e instanceof JedisException) {
            return new RedisUnavailableException(command.name() + ": " + e.getMessage(), e);
        }
        return e;
    }

    private static byte[][] bytes(List<String> args) {
        byte[][] out = new byte[args.size()][];
        for (int i = 0; i < out.length; i++) {
            out[i] = args.get(i).getBytes(StandardCharsets.UTF_8);
        }
        return out;
    }

    private static ProtocolCommand protocol(String name) {
        byte[] raw = name.getBytes(StandardCharsets.US_ASCII);
        return () -> raw;
    }

    private final java.util.concurrent.atomic.AtomicBoolean closed = new java.util.concurrent.atomic.AtomicBoolean();

    @Override
    public void close() {
        if (!closed.compareAndSet(false, true)) {
            return;
        }
        executor.shutdownNow();
        if (owned) {
            jedis.close();
            if (blocking != jedis) {
                blocking.close();
            }
        }
    }
}

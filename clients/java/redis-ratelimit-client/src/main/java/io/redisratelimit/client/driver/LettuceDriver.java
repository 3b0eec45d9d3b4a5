package io.redisratelimit.client.driver;

import io.lettuce.core.AbstractRedisClient;
import io.lettuce.core.ClientOptions;
import io.lettuce.core.RedisClient;
import io.lettuce.core.RedisCommandExecutionException;
import io.lettuce.core.RedisConnectionException;
import io.lettuce.core.RedisException;
import io.lettuce.core.RedisURI;
import io.lettuce.core.api.StatefulConnection;
import io.lettuce.core.api.StatefulRedisConnection;
import io.lettuce.core.cluster.ClusterClientOptions;
import io.lettuce.core.cluster.RedisClusterClient;
import io.lettuce.core.cluster.api.StatefulRedisClusterConnection;
import io.lettuce.core.cluster.models.partitions.RedisClusterNode;
import io.lettuce.core.codec.StringCodec;
import io.lettuce.core.output.NestedMultiOutput;
import io.lettuce.core.protocol.CommandArgs;
import io.lettuce.core.protocol.ProtocolKeyword;
import io.lettuce.core.protocol.ProtocolVersion;
import io.lettuce.core.resource.ClientResources;
import io.lettuce.core.resource.Delay;
import io.redisratelimit.client.RedisUnavailableException;
import io.redisratelimit.client.ServerErrorException;

import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.CompletionException;
import java.util.concurrent.CompletionStage;
import java.util.concurrent.ConcurrentLinkedDeque;
import java.util.concurrent.TimeUnit;
import java.util.function.Supplier;

/**
 * The driver on Lettuce, standalone (or Sentinel, through a sentinel
 * {@link RedisURI}) or cluster. Commands go out on one multiplexed connection;
 * in a cluster, Lettuce routes each by its first key to the slot's master.
 *
 * <p>The connections this class opens itself reject commands while
 * disconnected ({@link ClientOptions.DisconnectedBehavior#REJECT_COMMANDS})
 * and speak RESP2, so a limiter write is never buffered and replayed after a
 * reconnect: a call that fails is decided by the fallback, once.
 *
 * <p>Calls the server may hold ({@code BLOCK}) go on connections of their
 * own, never the multiplexed one: a small pool, opened lazily from the same
 * settings, each connection lent to one call at a time. Those connections
 * do not reconnect by themselves, so a held call that loses its connection
 * fails and is never replayed.
 */
public final class LettuceDriver implements Driver {
    private final StatefulRedisConnection<String, String> standalone;
    private final StatefulRedisClusterConnection<String, String> cluster;
    private final AbstractRedisClient owned;
    private final ClientResources ownedResources;
    /** Opens a connection for blocking calls; null when the application gave none. */
    private final Supplier<StatefulConnection<String, String>> blockingConnections;
    private final AbstractRedisClient blockingClient;
    private final ConcurrentLinkedDeque<StatefulConnection<String, String>> idle = new ConcurrentLinkedDeque<>();

    /** Idle connections kept for blocking calls; more are opened while more calls wait, and closed after. */
    static final int BLOCKING_IDLE = 4;

    private LettuceDriver(StatefulRedisConnection<String, String> standalone,
                          StatefulRedisClusterConnection<String, String> cluster,
                          AbstractRedisClient owned, ClientResources ownedResources,
                          Supplier<StatefulConnection<String, String>> blockingConnections, AbstractRedisClient blockingClient) {
        this.standalone = standalone;
        this.cluster = cluster;
        this.owned = owned;
        this.ownedResources = ownedResources;
        this.blockingConnections = blockingConnections;
        this.blockingClient = blockingClient;
    }

    /** Options that never buffer a command across a reconnect. */
    public static ClientOptions clientOptions() {
        return ClientOptions.builder()
                .protocolVersion(ProtocolVersion.RESP2)
                .disconnectedBehavior(ClientOptions.DisconnectedBehavior.REJECT_COMMANDS)
                .autoReconnect(true)
                .build();
    }

    /** The blocking calls' connections: as {@link #clientOptions()}, and no reconnecting (a held call is never replayed). */
    static ClientOptions blockingOptions() {
        return ClientOptions.builder()
                .protocolVersion(ProtocolVersion.RESP2)
                .disconnectedBehavior(ClientOptions.DisconnectedBehavior.REJECT_COMMANDS)
                .autoReconnect(false)
                .build();
    }

    static ClientResources resources() {
        // Reconnect soon after Redis returns: the breaker's probe finds it within a second.
        return ClientResources.builder()
                .reconnectDelay(Delay.exponential(Duration.ofMillis(10), Duration.ofMillis(500), 2, TimeUnit.MILLISECONDS))
                .build();
    }

    /** A standalone or Sentinel server ({@code redis://host:port}, {@code redis-sentinel://...}). */
    public static LettuceDriver connect(RedisURI uri) {
        ClientResources res = resources();
        RedisClient client = RedisClient.create(res, uri);
        client.setOptions(clientOptions());
        RedisClient blocking = RedisClient.create(res, uri);
        blocking.setOptions(blockingOptions());
        try {
            return new LettuceDriver(client.connect(StringCodec.UTF8), null, client, res,
                    () -> blocking.connect(StringCodec.UTF8), blocking);
        } catch (RedisException e) {
            client.shutdown();
            blocking.shutdown();
            res.shutdown();
            throw new RedisUnavailableException("cannot connect to " + uri + ": " + e.getMessage(), e);
        }
    }

    /** A cluster, from one or more of its nodes. */
    public static LettuceDriver connectCluster(List<RedisURI> seeds) {
        ClientResources res = resources();
        RedisClusterClient client = RedisClusterClient.create(res, seeds);
        client.setOptions(ClusterClientOptions.builder(clientOptions()).validateClusterNodeMembership(false).build());
        RedisClusterClient blocking = RedisClusterClient.create(res, seeds);
        blocking.setOptions(ClusterClientOptions.builder(blockingOptions()).validateClusterNodeMembership(false).build());
        try {
            return new LettuceDriver(null, client.connect(StringCodec.UTF8), client, res,
                    () -> blocking.connect(StringCodec.UTF8), blocking);
        } catch (RedisException e) {
            client.shutdown();
            blocking.shutdown();
            res.shutdown();
            throw new RedisUnavailableException("cannot connect to the cluster " + seeds + ": " + e.getMessage(), e);
        }
    }

    /**
     * Over a connection the application opened (and closes): give its client
     * {@link #clientOptions()}. Without a source of connections for blocking
     * calls, {@code acquire} fails: see {@link #of(StatefulRedisConnection, Supplier)}.
     */
    public static LettuceDriver of(StatefulRedisConnection<String, String> connection) {
        return new LettuceDriver(connection, null, null, null, null, null);
    }

    /**
     * Over a connection the application opened, and a source of connections
     * for blocking calls ({@code () -> client.connect(StringCodec.UTF8)}, from
     * a client with {@link #blockingOptions()}), which this driver closes.
     */
    public static LettuceDriver of(StatefulRedisConnection<String, String> connection,
                                   Supplier<StatefulRedisConnection<String, String>> blockingConnections) {
        return new LettuceDriver(connection, null, null, null, blockingConnections::get, null);
    }

    /** Over a cluster connection the application opened (and closes). */
    public static LettuceDriver of(StatefulRedisClusterConnection<String, String> connection) {
        return new LettuceDriver(null, connection, null, null, null, null);
    }

    /** Over a cluster connection the application opened, and a source of cluster connections for blocking calls. */
    public static LettuceDriver of(StatefulRedisClusterConnection<String, String> connection,
                                   Supplier<StatefulRedisClusterConnection<String, String>> blockingConnections) {
        return new LettuceDriver(null, connection, null, null, blockingConnections::get, null);
    }

    @Override
    public boolean cluster() {
        return cluster != null;
    }

    @Override
    public CompletableFuture<Object> send(Command command) {
        try {
            CompletionStage<List<Object>> f = cluster != null
                    ? cluster.async().dispatch(keyword(command.name()), new NestedMultiOutput<>(StringCodec.UTF8), args(command))
                    : standalone.async().dispatch(keyword(command.name()), new NestedMultiOutput<>(StringCodec.UTF8), args(command));
            return unwrap(f, command);
        } catch (RedisException e) {
            return CompletableFuture.failedFuture(translate(e, command));
        }
    }

    /**
     * On a connection lent to this call alone (from the idle ones, or a new
     * one). Back to the idle ones after a reply; closed when the call failed
     * or was cancelled, since its reply may still be on the way.
     */
    @Override
    public CompletableFuture<Object> sendBlocking(Command command) {
        if (blockingConnections == null) {
            return CompletableFuture.failedFuture(new UnsupportedOperationException("this LettuceDriver has no connections"
                    + " for blocking calls (" + command.name() + " ... BLOCK): build it with LettuceDriver.connect, or with of(connection, blockingConnections)"));
        }
        if (closed.get()) {
            return CompletableFuture.failedFuture(new RedisUnavailableException(command.name() + ": the driver is closed", null));
        }
        StatefulConnection<String, String> c = idle.pollFirst();
        CompletionStage<List<Object>> f;
        try {
            while (c != null && !c.isOpen()) {
                c = idle.pollFirst();
            }
            if (c == null) {
                c = blockingConnections.get();
            }
            f = dispatch(c, command);
        } catch (RedisException e) {
            if (c != null) {
                c.closeAsync();
            }
            return CompletableFuture.failedFuture(translate(e, command));
        }
        StatefulConnection<String, String> lent = c;
        CompletableFuture<Object> out = unwrap(f, command);
        out.whenComplete((v, err) -> {
            boolean clean = err == null || err instanceof ServerErrorException;
            if (clean && !closed.get() && lent.isOpen() && idle.size() < BLOCKING_IDLE) {
                idle.offerFirst(lent);
            } else {
                lent.closeAsync();
            }
        });
        return out;
    }

    @SuppressWarnings("unchecked")
    private static CompletionStage<List<Object>> dispatch(StatefulConnection<String, String> c, Command command) {
        if (c instanceof StatefulRedisClusterConnection<?, ?> cc) {
            return ((StatefulRedisClusterConnection<String, String>) cc).async()
                    .dispatch(keyword(command.name()), new NestedMultiOutput<>(StringCodec.UTF8), args(command));
        }
        return ((StatefulRedisConnection<String, String>) c).async()
                .dispatch(keyword(command.name()), new NestedMultiOutput<>(StringCodec.UTF8), args(command));
    }

    @Override
    public CompletableFuture<List<Object>> sendToMasters(Command command) {
        if (cluster == null) {
            CompletableFuture<Object> sent = send(command);
            CompletableFuture<List<Object>> one = sent.thenApply(List::of);
            cancelWhenFailed(one, List.of(sent));
            return one;
        }
        List<CompletableFuture<Object>> all = new ArrayList<>();
        for (RedisClusterNode node : cluster.getPartitions()) {
            if (!node.is(RedisClusterNode.NodeFlag.UPSTREAM)) {
                continue;
            }
            try {
                StatefulRedisConnection<String, String> c = cluster.getConnection(node.getNodeId());
                all.add(unwrap(c.async().dispatch(keyword(command.name()), new NestedMultiOutput<>(StringCodec.UTF8), args(command)), command));
            } catch (RedisException e) {
                all.add(CompletableFuture.failedFuture(translate(e, command)));
            }
        }
        CompletableFuture<List<Object>> every = CompletableFuture.allOf(all.toArray(CompletableFuture[]::new))
                .thenApply(v -> all.stream().map(CompletableFuture::join).toList());
        cancelWhenFailed(every, all);
        return every;
    }

    /**
     * When the caller gives up on the answer (its deadline completes it
     * exceptionally, or it cancels it), the commands still queued are
     * cancelled: Lettuce would otherwise write them again after a reconnect
     * (a command sent just before the connection dropped is kept for the
     * next one), and a replayed {@code RL.OUTCOME} counts twice.
     */
    private static void cancelWhenFailed(CompletableFuture<?> answer, List<CompletableFuture<Object>> commands) {
        answer.whenComplete((v, err) -> {
            if (err != null) {
                for (CompletableFuture<Object> c : commands) {
                    c.cancel(false);
                }
            }
        });
    }

    private static CompletableFuture<Object> unwrap(CompletionStage<List<Object>> f, Command command) {
        CompletableFuture<Object> out = new CompletableFuture<>();
        // Cancelling the answer cancels Lettuce's command: one still queued is never written.
        out.whenComplete((v, err) -> {
            if (out.isCancelled()) {
                f.toCompletableFuture().cancel(false);
            }
        });
        f.whenComplete((list, err) -> {
            if (err != null) {
                out.completeExceptionally(translate(err, command));
                return;
            }
            Object reply;
            if (command.arrayReply()) {
                reply = list;
            } else {
                reply = list == null || list.isEmpty() ? null : list.get(0);
            }
            out.complete(Replies.normalize(reply));
        });
        return out;
    }

    static RuntimeException translate(Throwable err, Command command) {
        Throwable e = err instanceof CompletionException && err.getCause() != null ? err.getCause() : err;
        if (e instanceof RedisCommandExecutionException) {
            return new ServerErrorException(command.name() + ": " + e.getMessage(), e);
        }
        if (e instanceof RedisConnectionException || e instanceof RedisException || e instanceof java.io.IOException) {
            return new RedisUnavailableException(command.name() + ": " + e.getMessage(), e);
        }
        return e instanceof RuntimeException r ? r : new RedisUnavailableException(command.name() + ": " + e, e);
    }

    private static CommandArgs<String, String> args(Command command) {
        CommandArgs<String, String> a = new CommandArgs<>(StringCodec.UTF8);
        List<String> args = command.args();
        for (int i = 0; i < args.size(); i++) {
            if (i == command.keyIndex()) {
                a.addKey(args.get(i));
            } else {
                a.add(args.get(i));
            }
        }
        return a;
    }

    private static ProtocolKeyword keyword(String name) {
        byte[] bytes = name.getBytes(StandardCharsets.US_ASCII);
        return new ProtocolKeyword() {
            @Override
            public byte[] getBytes() {
                return bytes;
            }

            @Override
            public String toString() {
                return name;
            }
        };
    }

    private final java.util.concurrent.atomic.AtomicBoolean closed = new java.util.concurrent.atomic.AtomicBoolean();

    @Override
    public void close() {
        if (!closed.compareAndSet(false, true)) {
            return;
        }
        for (StatefulConnection<String, String> c; (c = idle.pollFirst()) != null; ) {
            c.close();
        }
        if (blockingClient != null) {
            blockingClient.shutdown(Duration.ZERO, Duration.ofSeconds(2));
        }
        if (owned == null) {
            return;
        }
        if (standalone != null) {
            standalone.close();
        }
        if (cluster != null) {
            cluster.close();
        }
        owned.shutdown(Duration.ZERO, Duration.ofSeconds(2));
        ownedResources.shutdown(0, 2, TimeUnit.SECONDS);
    }
}

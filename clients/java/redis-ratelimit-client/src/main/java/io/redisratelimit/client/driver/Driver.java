package io.redisratelimit.client.driver;

import java.util.List;
import java.util.concurrent.CompletableFuture;

/**
 * What the client needs from a Redis driver: one command to the node that owns
 * its key, in one round trip, and a command to every master. Replies come as
 * {@link Long}, {@link String}, {@link List} or null. A future fails with
 * {@link io.redisratelimit.client.ServerErrorException} for an error reply and
 * {@link io.redisratelimit.client.RedisUnavailableException} for a lost or
 * refused connection. Drivers never resend a command on their own.
 */
public interface Driver extends AutoCloseable {
    CompletableFuture<Object> send(Command command);

    /**
     * A command the server may hold (an option {@code BLOCK}), on a connection
     * of its own for this one call, never the shared one: on a multiplexed
     * connection a held reply would stall every command behind it. No
     * deadline of the driver's applies; the caller bounds the call and
     * cancels the future when it gives up, which closes that connection (the
     * server forgets a blocked client that disconnects, consuming nothing).
     */
    default CompletableFuture<Object> sendBlocking(Command command) {
        return CompletableFuture.failedFuture(new UnsupportedOperationException(
                getClass().getSimpleName() + " has no connection for blocking calls (" + command.name() + " ... BLOCK)"));
    }

    /** The command on every master (one for a standalone server), in no particular order. */
    CompletableFuture<List<Object>> sendToMasters(Command command);

    /** Whether this driver talks to a cluster. */
    boolean cluster();

    @Override
    void close();
}

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

    /** The command on every master (one for a standalone server), in no particular order. */
    CompletableFuture<List<Object>> sendToMasters(Command command);

    /** Whether this driver talks to a cluster. */
    boolean cluster();

    @Override
    void close();
}

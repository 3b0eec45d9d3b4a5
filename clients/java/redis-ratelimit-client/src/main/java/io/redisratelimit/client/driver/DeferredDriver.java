package io.redisratelimit.client.driver;

import io.redisratelimit.client.Client;
import io.redisratelimit.client.ModuleMissingException;
import io.redisratelimit.client.NotConnectedException;

import java.lang.System.Logger.Level;
import java.time.Duration;
import java.util.List;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.CopyOnWriteArrayList;
import java.util.function.Supplier;

/**
 * A driver for an application that starts while Redis is away: until a
 * connection is made and checked ({@code PING}, {@code MODULE LIST}), every
 * command fails at once with {@link NotConnectedException} (nothing is sent,
 * so the fallback decides and nothing is charged as possibly counted); a
 * background thread retries, and once Redis answers with the module, commands
 * go to the new driver and the {@link #onConnected} actions run (the starter
 * pushes its policies).
 */
public final class DeferredDriver implements Driver {
    private static final System.Logger LOG = System.getLogger(DeferredDriver.class.getName());

    private final Supplier<Driver> factory;
    private final boolean cluster;
    private final Duration retryEvery;
    private final List<Runnable> onConnected = new CopyOnWriteArrayList<>();
    private volatile Driver delegate;
    private volatile boolean closed;
    private final Thread connector;

    /**
     * Starts connecting in the background with {@code factory} (which opens
     * a new driver, or throws), every {@code retryEvery} until it succeeds.
     * {@code cluster}: whether the driver it opens is a cluster's.
     */
    public DeferredDriver(Supplier<Driver> factory, boolean cluster, Duration retryEvery) {
        this.factory = factory;
        this.cluster = cluster;
        this.retryEvery = retryEvery;
        this.connector = new Thread(this::connect, "redis-ratelimit-connect");
        connector.setDaemon(true);
        connector.start();
    }

    private void connect() {
        boolean warned = false;
        while (!closed) {
            Driver d = null;
            try {
                d = factory.get();
                Client.connect(d, Duration.ofSeconds(1));
                if (closed) {
                    d.close();
                    return;
                }
                delegate = d;
                LOG.log(Level.INFO, "redis-ratelimit: connected to Redis; it decides again");
                for (Runnable r : onConnected) {
                    try {
                        r.run();
                    } catch (RuntimeException e) {
                        LOG.log(Level.WARNING, "redis-ratelimit: after connecting: " + e.getMessage());
                    }
                }
                return;
            } catch (RuntimeException e) {
                if (d != null) {
                    d.close();
                }
                if (e instanceof ModuleMissingException) {
                    LOG.log(Level.ERROR, "redis-ratelimit: " + e.getMessage() + " (retrying)");
                } else if (!warned) {
                    LOG.log(Level.WARNING, "redis-ratelimit: Redis is away (" + e.getMessage() + "); the fallback decides, retrying every "
                            + retryEvery.toMillis() + " ms");
                    warned = true;
                }
            }
            try {
                Thread.sleep(retryEvery.toMillis());
            } catch (InterruptedException e) {
                return;
            }
        }
    }

    /** Whether the connection is made and checked. */
    public boolean connected() {
        return delegate != null;
    }

    /** Runs {@code action} once connected (at once if already), on the connecting thread. */
    public void onConnected(Runnable action) {
        onConnected.add(action);
        if (delegate != null && onConnected.remove(action)) {
            action.run();
        }
    }

    private <T> CompletableFuture<T> notYet(Command command) {
        return CompletableFuture.failedFuture(new NotConnectedException(command.name()
                + ": not connected to Redis yet (it was away at start-up; retrying in the background)"));
    }

    @Override
    public CompletableFuture<Object> send(Command command) {
        Driver d = delegate;
        return d == null ? notYet(command) : d.send(command);
    }

    @Override
    public CompletableFuture<Object> sendBlocking(Command command) {
        Driver d = delegate;
        return d == null ? notYet(command) : d.sendBlocking(command);
    }

    @Override
    public CompletableFuture<List<Object>> sendToMasters(Command command) {
        Driver d = delegate;
        return d == null ? notYet(command) : d.sendToMasters(command);
    }

    @Override
    public boolean cluster() {
        return cluster;
    }

    @Override
    public void close() {
        closed = true;
        connector.interrupt();
        Driver d = delegate;
        if (d != null) {
            d.close();
        }
    }
}

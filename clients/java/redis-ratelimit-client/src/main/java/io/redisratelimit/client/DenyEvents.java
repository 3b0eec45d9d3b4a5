package io.redisratelimit.client;

import java.lang.System.Logger.Level;
import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.Future;
import java.util.concurrent.LinkedBlockingQueue;
import java.util.concurrent.ThreadPoolExecutor;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.TimeoutException;
import java.util.concurrent.atomic.LongAdder;

/**
 * Ships denials to a {@link DenyEventSink} in batches, off the request path:
 * a bounded ring buffer (10,000 events by default) that a background flusher
 * empties every 5 s, or as soon as 1,000 events wait, whichever comes first.
 *
 * <p>What it guarantees (the contract's {@code observability.deny_events}):
 * <ul>
 *   <li>{@link #record} takes a short lock on the buffer and returns: a
 *       request never waits for a sink;</li>
 *   <li>a full buffer drops its oldest event for the new one, counted in
 *       {@link #dropped()};</li>
 *   <li>a batch is at most {@code flushEvents} events; a batch the sink
 *       refuses, or does not take within the timeout (2 s), is dropped
 *       ({@link #dropped()} += its size, {@link #sinkErrors()} += 1), never
 *       retried and never held;</li>
 *   <li>{@link #close} ships what is left, within the timeout; so does the
 *       JVM's exit (a shutdown hook, removed by {@link #close}), when the
 *       application never closes them.</li>
 * </ul>
 * Wire it into a {@link Limiter} ({@link Limiter.Builder#denyEvents}): every
 * denial at every level is recorded; the starter's HTTP interceptor and
 * filter add the client's IP and user agent.
 */
public final class DenyEvents implements AutoCloseable {
    private static final System.Logger LOG = System.getLogger(DenyEvents.class.getName());

    public static final int DEFAULT_CAPACITY = 10_000;
    public static final int DEFAULT_FLUSH_EVENTS = 1_000;
    public static final Duration DEFAULT_FLUSH_INTERVAL = Duration.ofMillis(5_000);
    public static final Duration DEFAULT_TIMEOUT = Duration.ofMillis(2_000);
    public static final String DEFAULT_INDEX = "ratelimit-deny";
    /** The most events a buffer or a batch may hold (100 times the default buffer): past it, a setting is refused. */
    public static final int MAX_EVENTS = 1_000_000;
    /** The longest flush interval or timeout (a day): past it, a setting is refused (nanoseconds would overflow past 292 years). */
    public static final Duration MAX_DURATION = Duration.ofDays(1);

    /** Builds {@link DenyEvents}: the sink is required, every other setting has the contract's default. */
    public static final class Builder {
        private final DenyEventSink sink;
        private int capacity = DEFAULT_CAPACITY;
        private int flushEvents = DEFAULT_FLUSH_EVENTS;
        private Duration flushInterval = DEFAULT_FLUSH_INTERVAL;
        private Duration timeout = DEFAULT_TIMEOUT;
        private boolean flusher = true;

        private Builder(DenyEventSink sink) {
            if (sink == null) {
                throw new InvalidArgumentException("sink", "deny events need a sink: DenyEventSink.file, .bulk or .callback");
            }
            this.sink = sink;
        }

        /** Events the buffer holds (10,000); past it the oldest are dropped. */
        public Builder capacity(int events) {
            if (events < 1 || events > MAX_EVENTS) {
                throw new InvalidArgumentException("capacity", "must be from 1 to " + MAX_EVENTS + ", got " + events);
            }
            capacity = events;
            return this;
        }

        /**
         * The most events in one batch, and the count that wakes the flusher at
         * once (1,000; a buffer smaller than it is flushed when full).
         */
        public Builder flushEvents(int events) {
            if (events < 1 || events > MAX_EVENTS) {
                throw new InvalidArgumentException("flush-events", "must be from 1 to " + MAX_EVENTS + ", got " + events);
            }
            flushEvents = events;
            return this;
        }

        /** The longest an event waits for its flush (5 s). */
        public Builder flushInterval(Duration d) {
            if (d == null || d.isZero() || d.isNegative() || d.compareTo(MAX_DURATION) > 0) {
                throw new InvalidArgumentException("flush-interval", "must be above 0 and at most " + MAX_DURATION + ", got " + d);
            }
            flushInterval = d;
            return this;
        }

        /** The longest one batch may take in the sink (2 s); past it the batch is dropped. */
        public Builder timeout(Duration d) {
            if (d == null || d.isZero() || d.isNegative() || d.compareTo(MAX_DURATION) > 0) {
                throw new InvalidArgumentException("timeout", "must be above 0 and at most " + MAX_DURATION + ", got " + d);
            }
            timeout = d;
            return this;
        }

        /**
         * Without the background flusher (on by default): events ship only on
         * {@link DenyEvents#flush()} and {@link DenyEvents#close()}.
         */
        public Builder backgroundFlusher(boolean on) {
            flusher = on;
            return this;
        }

        public DenyEvents build() {
            return new DenyEvents(this);
        }
    }

    public static Builder builder(DenyEventSink sink) {
        return new Builder(sink);
    }

    private final DenyEventSink sink;
    private final int flushEvents;
    /** The count that wakes the flusher: flushEvents, or the capacity when the buffer is smaller (it flushes when full). */
    private final int trigger;
    private final long intervalNanos;
    private final Duration timeout;
    private final Object lock = new Object();
    private final DenyEvent[] ring;
    private int head;
    private int size;
    private boolean closed;
    private final LongAdder dropped = new LongAdder();
    private final LongAdder shipped = new LongAdder();
    private final LongAdder sinkErrors = new LongAdder();
    private final LongAdder recorded = new LongAdder();
    private final Thread flusher;
    /** The sink runs here, so that the flusher can give up on it after the timeout. */
    private final ThreadPoolExecutor sinkThread;
    /**
     * Closes them when the JVM exits without {@link #close}: the flusher is a
     * daemon (it never keeps a JVM alive), so the buffered events would
     * vanish uncounted.
     */
    private final Thread exitHook;

    private DenyEvents(Builder b) {
        this.sink = b.sink;
        this.flushEvents = b.flushEvents;
        this.trigger = Math.min(b.flushEvents, b.capacity);
        this.intervalNanos = b.flushInterval.toNanos();
        this.timeout = b.timeout;
        this.ring = new DenyEvent[b.capacity];
        this.sinkThread = new ThreadPoolExecutor(1, 1, 0, TimeUnit.MILLISECONDS, new LinkedBlockingQueue<>(), r -> {
            Thread t = new Thread(r, "redis-ratelimit-deny-sink");
            t.setDaemon(true);
            return t;
        });
        if (b.flusher) {
            flusher = new Thread(this::run, "redis-ratelimit-deny-flusher");
            flusher.setDaemon(true);
            flusher.start();
        } else {
            flusher = null;
        }
        Thread hook = new Thread(this::close, "redis-ratelimit-deny-exit");
        try {
            Runtime.getRuntime().addShutdownHook(hook);
        } catch (IllegalStateException shuttingDown) {
            hook = null;
        }
        exitHook = hook;
    }

    /**
     * Appends a denial (under a short lock; never blocks on the sink). A full
     * buffer drops its oldest event. After {@link #close}, the event is
     * dropped and counted.
     */
    public void record(DenyEvent e) {
        if (e == null) {
            throw new InvalidArgumentException("event", "null");
        }
        recorded.increment();
        synchronized (lock) {
            if (closed) {
                dropped.increment();
                return;
            }
            if (size == ring.length) {
                ring[head] = e;
                head = head + 1 == ring.length ? 0 : head + 1;
                dropped.increment();
            } else {
                int tail = head + size;
                ring[tail >= ring.length ? tail - ring.length : tail] = e;
                size++;
            }
            if (size == trigger) {
                lock.notifyAll();
            }
        }
    }

    /** Takes up to {@code max} of the oldest events; call with the lock held. */
    private List<DenyEvent> take(int max) {
        int n = Math.min(max, size);
        List<DenyEvent> out = new ArrayList<>(n);
        for (int i = 0; i < n; i++) {
            out.add(ring[head]);
            ring[head] = null;
            head = head + 1 == ring.length ? 0 : head + 1;
        }
        size -= n;
        return out;
    }

    private void run() {
        while (true) {
            List<DenyEvent> batch;
            synchronized (lock) {
                long due = System.nanoTime() + intervalNanos;
                try {
                    while (!closed && size < trigger) {
                        long left = due - System.nanoTime();
                        if (left <= 0) {
                            break;
                        }
                        TimeUnit.NANOSECONDS.timedWait(lock, left);
                    }
                } catch (InterruptedException e) {
                    return;
                }
                if (closed) {
                    return;
                }
                batch = take(flushEvents);
            }
            if (!batch.isEmpty()) {
                try {
                    ship(batch);
                } catch (RuntimeException | Error e) {
                    // ship counts every failure it knows; nothing may stop the flusher, or nothing ships again.
                    LOG.log(Level.ERROR, "redis-ratelimit: the deny-event flusher goes on after " + describe(e));
                }
            }
        }
    }

    /** A failure as text, even one whose toString throws (a sink's exception is anyone's code). */
    private static String describe(Throwable why) {
        try {
            return String.valueOf(why);
        } catch (RuntimeException | Error e) {
            return why.getClass().getName();
        }
    }

    /** Ships one batch on the sink's thread, waiting at most the timeout; counts the outcome. */
    private boolean ship(List<DenyEvent> batch) {
        return ship(batch, timeout.toNanos());
    }

    /** Ships one batch, waiting at most {@code waitNanos} (the timeout, or what is left of close's). */
    private boolean ship(List<DenyEvent> batch, long waitNanos) {
        Future<?> f;
        try {
            f = sinkThread.submit(() -> {
                sink.ship(batch);
                return null;
            });
        } catch (java.util.concurrent.RejectedExecutionException e) {
            failed(batch, e);
            return false;
        }
        try {
            f.get(Math.max(0, waitNanos), TimeUnit.NANOSECONDS);
            shipped.add(batch.size());
            return true;
        } catch (TimeoutException e) {
            f.cancel(true);
            // A sink that ignores the interrupt keeps its thread: the batches queued behind it time out
            // (counted) instead of piling up.
            sinkThread.purge();
            failed(batch, e);
        } catch (ExecutionException e) {
            failed(batch, e.getCause());
        } catch (RuntimeException | Error e) {
            // Future.get itself failed: a CancellationException, or an ExecutionException that could not be
            // made (its constructor calls the sink's exception's toString, which may throw).
            f.cancel(true);
            failed(batch, e);
        } catch (InterruptedException e) {
            f.cancel(true);
            failed(batch, e);
            Thread.currentThread().interrupt();
        }
        return false;
    }

    private void failed(List<DenyEvent> batch, Throwable why) {
        dropped.add(batch.size());
        sinkErrors.increment();
        LOG.log(Level.WARNING, "redis-ratelimit: the deny-event sink refused a batch of " + batch.size()
                + " events (dropped, not retried): " + (why instanceof TimeoutException ? "no answer within " + timeout : describe(why)));
    }

    /**
     * Ships every buffered event now, in batches of at most
     * {@code flushEvents}, on the calling thread (each batch within the
     * timeout). Returns the events the sink accepted.
     */
    public long flush() {
        long ok = 0;
        while (true) {
            List<DenyEvent> batch;
            synchronized (lock) {
                batch = take(flushEvents);
            }
            if (batch.isEmpty()) {
                return ok;
            }
            if (ship(batch)) {
                ok += batch.size();
            }
        }
    }

    /** Events lost: the oldest dropped from a full buffer, and every event of a batch the sink refused. */
    public long dropped() {
        return dropped.sum();
    }

    /** Events a sink accepted. */
    public long shipped() {
        return shipped.sum();
    }

    /** Batches a sink refused or did not take in time. */
    public long sinkErrors() {
        return sinkErrors.sum();
    }

    /** Events given to {@link #record} since the start. */
    public long recorded() {
        return recorded.sum();
    }

    /** Events waiting in the buffer. */
    public int pending() {
        synchronized (lock) {
            return size;
        }
    }

    public int capacity() {
        return ring.length;
    }

    public int flushEvents() {
        return flushEvents;
    }

    public Duration flushInterval() {
        return Duration.ofNanos(intervalNanos);
    }

    public Duration timeout() {
        return timeout;
    }

    /**
     * Stops the flusher and ships what is left, in batches, giving the whole
     * at most the timeout (a batch the flusher is shipping keeps its own
     * timeout): what is not shipped by then is dropped and counted.
     */
    @Override
    public void close() {
        long end = System.nanoTime() + timeout.toNanos();
        List<DenyEvent> left;
        synchronized (lock) {
            if (closed) {
                return;
            }
            closed = true;
            lock.notifyAll();
            left = take(size);
        }
        if (exitHook != null && Thread.currentThread() != exitHook) {
            try {
                Runtime.getRuntime().removeShutdownHook(exitHook);
            } catch (IllegalStateException shuttingDown) {
                // The JVM is exiting: the hook runs, finds them closed, returns.
            }
        }
        if (flusher != null) {
            try {
                // The flusher may be in the middle of a batch: it gives up on it within the timeout.
                flusher.join(timeout.toMillis() + 100);
            } catch (InterruptedException e) {
                Thread.currentThread().interrupt();
            }
        }
        for (int i = 0; i < left.size(); i += flushEvents) {
            List<DenyEvent> batch = left.subList(i, Math.min(left.size(), i + flushEvents));
            long remaining = end - System.nanoTime();
            if (remaining <= 0) {
                failed(left.subList(i, left.size()), new TimeoutException("closing"));
                break;
            }
            ship(batch, remaining);
        }
        sinkThread.shutdownNow();
    }
}

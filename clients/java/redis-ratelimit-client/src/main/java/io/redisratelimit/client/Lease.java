package io.redisratelimit.client;

import java.lang.System.Logger.Level;
import java.time.Duration;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.CompletionStage;
import java.util.concurrent.Executors;
import java.util.concurrent.ScheduledExecutorService;
import java.util.concurrent.ScheduledFuture;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicBoolean;

/**
 * Units of a concurrency cap held until {@link #close()}: made for
 * try-with-resources.
 *
 * <pre>{@code
 * try (Lease lease = rl.lease("rl:export:" + tenant, 3, 30_000)) {   // RL.CONCURRENCY, denied: RateLimitDeniedException
 *     export();                                                      // at most 3 exports of the tenant at once
 * }                                                                  // RL.RELEASE
 * }</pre>
 *
 * <p>A lease ends at its release or {@code lease_ms} after it was granted or
 * last renewed, whichever comes first: a holder that dies frees its units by
 * itself. For work that may outlast {@code lease_ms}, {@link #renew()} it, or
 * let {@link #autoRenew()} renew it in the background. Release and renewal
 * go over the client's ordinary connection; one that fails is not retried
 * (the lease then ends by its expiry) and {@link #close()} never throws for
 * it.
 */
public final class Lease implements AutoCloseable {
    private static final System.Logger LOG = System.getLogger(Lease.class.getName());
    /** Releases and renewals are not decisions: they get at least this long, whatever the client's deadline. */
    static final Duration MIN_DEADLINE = Duration.ofSeconds(1);

    private static final ScheduledExecutorService RENEWALS = Executors.newSingleThreadScheduledExecutor(r -> {
        Thread t = new Thread(r, "redis-ratelimit-lease-renewal");
        t.setDaemon(true);
        return t;
    });

    private final Client client;
    private final String key;
    private final Decision decision;
    private final Duration leaseTime;
    private final AtomicBoolean ended = new AtomicBoolean();
    private volatile boolean lost;
    private volatile ScheduledFuture<?> renewal;

    private Lease(Client client, String key, Decision decision, Duration leaseTime) {
        this.client = client;
        this.key = key;
        this.decision = decision;
        this.leaseTime = leaseTime;
    }

    /**
     * The lease an admitted decision holds ({@code RL.CONCURRENCY}, or
     * {@code RL.HIT} on a concurrency policy), on {@code key}, granted for
     * {@code leaseTime} (what {@link #renew()} asks again; null when unknown).
     */
    public static Lease of(Client client, String key, Decision admitted, Duration leaseTime) {
        Args.key(key);
        if (!admitted.allowed() || admitted.lease() < 1) {
            throw new InvalidArgumentException("lease", "the decision holds no lease: " + admitted);
        }
        return new Lease(client, key, admitted, leaseTime);
    }

    public String key() {
        return key;
    }

    /** The lease's id, as {@code RL.RELEASE} and {@code RL.RENEW} take it. */
    public long id() {
        return decision.lease();
    }

    /** The admission that granted it. */
    public Decision decision() {
        return decision;
    }

    /** Released by this handle, or found ended (expired) by a renewal. */
    public boolean ended() {
        return ended.get() || lost;
    }

    /** {@code RL.RELEASE key lease}: true when it was held until now, false when it had already ended. Once only. */
    public boolean release() {
        return Client.await(releaseAsync().toCompletableFuture(), "RL.RELEASE", MIN_DEADLINE.plus(client.deadline()).plusSeconds(1));
    }

    /** The asynchronous form of {@link #release()}; a second call answers false without a round trip. */
    public CompletionStage<Boolean> releaseAsync() {
        if (!ended.compareAndSet(false, true)) {
            return CompletableFuture.completedFuture(false);
        }
        stopRenewal();
        return client.releaseAsync(key, id());
    }

    /** {@code RL.RENEW key lease lease_ms} for the lease time it was granted with: true when it is still held. */
    public boolean renew() {
        if (leaseTime == null) {
            throw new InvalidArgumentException("lease_ms", "this lease's time is unknown: renew(Duration)");
        }
        return renew(leaseTime);
    }

    /** {@code RL.RENEW key lease lease_ms}: held for {@code leaseTime} from now; false when it had already ended. */
    public boolean renew(Duration leaseTime) {
        if (ended.get()) {
            return false;
        }
        boolean held = client.renew(key, id(), leaseTime);
        if (!held) {
            lost = true;
        }
        return held;
    }

    /** Renews in the background every third of its lease time, until it is released (or found ended). */
    public Lease autoRenew() {
        if (leaseTime == null) {
            throw new InvalidArgumentException("lease_ms", "this lease's time is unknown: autoRenew(every, leaseTime)");
        }
        return autoRenew(Duration.ofMillis(Math.max(1, leaseTime.toMillis() / 3)), leaseTime);
    }

    /** Renews for {@code leaseTime} every {@code every} in the background, until it is released (or found ended). */
    public synchronized Lease autoRenew(Duration every, Duration leaseTime) {
        if (every == null || every.isNegative() || every.isZero()) {
            throw new InvalidArgumentException("every", "must be above 0");
        }
        Args.positive("lease_ms", leaseTime == null ? 0 : leaseTime.toMillis());
        if (renewal != null || ended()) {
            return this;
        }
        renewal = RENEWALS.scheduleWithFixedDelay(() -> {
            if (ended.get()) {
                stopRenewal();
                return;
            }
            client.renewAsync(key, id(), leaseTime).whenComplete((held, err) -> {
                if (err != null) {
                    LOG.log(Level.DEBUG, "redis-ratelimit: renewing lease " + id() + " on " + key + " failed: " + err);
                } else if (!held) {
                    lost = true;
                    stopRenewal();
                    LOG.log(Level.WARNING, "redis-ratelimit: lease " + id() + " on " + key + " had ended before its renewal");
                }
            });
        }, every.toNanos(), every.toNanos(), TimeUnit.NANOSECONDS);
        return this;
    }

    private void stopRenewal() {
        ScheduledFuture<?> r = renewal;
        if (r != null) {
            r.cancel(false);
        }
    }

    /** Releases it (once); a failure is logged, not thrown: the lease then ends by its expiry. */
    @Override
    public void close() {
        try {
            release();
        } catch (RateLimitException e) {
            LOG.log(Level.WARNING, "redis-ratelimit: releasing lease " + id() + " on " + key
                    + " failed, it ends by its expiry: " + e.getMessage());
        }
    }

    @Override
    public String toString() {
        return "Lease[" + key + " #" + id() + (ended() ? ", ended" : "") + "]";
    }
}

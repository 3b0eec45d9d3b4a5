package io.redisratelimit.client;

import io.redisratelimit.client.driver.Driver;

import java.time.Duration;

/**
 * The former name of {@link Client}.
 *
 * @deprecated since 0.2.0, for removal: use {@link Client}, the name every
 * kit uses for its typed calls ({@link Client#connect(Driver)},
 * {@link Client#connect(Driver, Duration)}, {@link Client#connecting(Driver, Duration)}).
 * A {@code RateLimitClient} is a {@code Client} (its only subclass), so it
 * goes wherever a client goes, with the same calls and the same behaviour;
 * its factories and {@link #withDeadline(Duration)} still answer a
 * {@code RateLimitClient}, so code written against the old name compiles,
 * with a deprecation warning. What the kit answers itself (for example the
 * starter's bean) is a {@code Client}.
 */
@Deprecated(since = "0.2.0", forRemoval = true)
public final class RateLimitClient extends Client {
    private RateLimitClient(Client client) {
        super(client.driver(), client.deadline(), client.moduleVersion());
    }

    /** @deprecated use {@link Client#connect(Driver)}. */
    @Deprecated(since = "0.2.0", forRemoval = true)
    public static RateLimitClient connect(Driver driver) {
        return new RateLimitClient(Client.connect(driver));
    }

    /** @deprecated use {@link Client#connect(Driver, Duration)}. */
    @Deprecated(since = "0.2.0", forRemoval = true)
    public static RateLimitClient connect(Driver driver, Duration deadline) {
        return new RateLimitClient(Client.connect(driver, deadline));
    }

    /** @deprecated use {@link Client#connecting(Driver, Duration)}. */
    @Deprecated(since = "0.2.0", forRemoval = true)
    public static RateLimitClient connecting(Driver driver, Duration deadline) {
        return new RateLimitClient(Client.connecting(driver, deadline));
    }

    /** A client over the same driver with another deadline, under the old name. */
    @Override
    public RateLimitClient withDeadline(Duration newDeadline) {
        return new RateLimitClient(super.withDeadline(newDeadline));
    }
}

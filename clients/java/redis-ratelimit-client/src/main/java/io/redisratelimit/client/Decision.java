package io.redisratelimit.client;

import java.time.Duration;
import java.util.List;
import java.util.OptionalInt;
import java.util.OptionalLong;

/**
 * A limiter's answer: the five fields of the reply ({@code [allowed, limit,
 * remaining, wait_ms, reset_ms]}), the sixth of {@code RL.ALL}
 * ({@code denied_by}) or of {@code RL.CONCURRENCY} ({@code lease}), and the
 * path that decided.
 *
 * @param allowed   admitted (its units consumed) or denied (nothing changed)
 * @param limit     the limiter's capacity or requests per window
 * @param remaining units left right after this call
 * @param waitMs    as the server sent it: for a denial the time until the same
 *                  request passes, -1 when it never can; for an admission 0,
 *                  except the leaky bucket's queueing delay
 * @param resetMs   time until the limiter is idle again
 * @param deniedBy  {@code RL.ALL} (and rule sets): the 0-based position of the
 *                  first rule that denied
 * @param path      which path decided
 * @param lease     {@code RL.CONCURRENCY} (or {@code RL.HIT} on a concurrency
 *                  policy): the id of the lease granted, 0 when none was (a
 *                  denial, another limiter, or the fallback admitting)
 * @param granted   the units taken: an {@code UPTO n} call's {@code granted}
 *                  field (0 on a denial); for the other calls the cost when
 *                  admitted (a {@code FORCE} call's cost always), else 0 (a
 *                  {@code REFUND} takes nothing); a batched rule's admission 1
 */
public record Decision(boolean allowed, long limit, long remaining, long waitMs, long resetMs,
                       OptionalInt deniedBy, Path path, long lease, long granted) {

    /** A decision that holds no lease, of one unit (granted 1 when admitted, else 0). */
    public Decision(boolean allowed, long limit, long remaining, long waitMs, long resetMs, OptionalInt deniedBy, Path path) {
        this(allowed, limit, remaining, waitMs, resetMs, deniedBy, path, 0);
    }

    /** A decision of one unit (granted 1 when admitted, else 0). */
    public Decision(boolean allowed, long limit, long remaining, long waitMs, long resetMs, OptionalInt deniedBy, Path path, long lease) {
        this(allowed, limit, remaining, waitMs, resetMs, deniedBy, path, lease, allowed ? 1 : 0);
    }

    public Decision {
        if (deniedBy == null) {
            deniedBy = OptionalInt.empty();
        }
        if (path == null) {
            path = Path.REDIS;
        }
    }

    /** Denied: time until the same request would pass (zero when it never can). */
    public Duration retryAfter() {
        return Duration.ofMillis(Math.max(0, waitMs));
    }

    /** Time until the limiter is idle again. */
    public Duration resetAfter() {
        return Duration.ofMillis(Math.max(0, resetMs));
    }

    /** A denial that can never pass: its cost exceeds the limit ({@code wait_ms} -1). */
    public boolean never() {
        return waitMs < 0;
    }

    /** {@code Retry-After} in whole seconds, {@code ceil(wait_ms / 1000)}; empty when it never can pass. */
    public OptionalLong retryAfterSeconds() {
        return waitMs < 0 ? OptionalLong.empty() : OptionalLong.of(ceilDiv(waitMs, 1000));
    }

    /** {@code t} of the {@code RateLimit} field: {@code ceil(reset_ms / 1000)}. */
    public long resetSeconds() {
        return ceilDiv(Math.max(0, resetMs), 1000);
    }

    public Decision withPath(Path newPath) {
        return new Decision(allowed, limit, remaining, waitMs, resetMs, deniedBy, newPath, lease, granted);
    }

    public Decision withDeniedBy(int index) {
        return new Decision(allowed, limit, remaining, waitMs, resetMs, OptionalInt.of(index), path, lease, granted);
    }

    /** The same decision with {@code units} granted. */
    public Decision withGranted(long units) {
        return new Decision(allowed, limit, remaining, waitMs, resetMs, deniedBy, path, lease, units);
    }

    static long ceilDiv(long a, long b) {
        return -Math.floorDiv(-a, b);
    }

    /**
     * Parses a reply of the width the contract gives {@code command}: six
     * integers for {@code RL.ALL} (the sixth {@code denied_by}) and
     * {@code RL.CONCURRENCY} (the sixth the lease), five or six for
     * {@code RL.HIT} (as its policy's algorithm), five for the others.
     */
    static Decision fromReply(String command, Object reply) {
        return fromReply(command, reply, null);
    }

    /**
     * With the request sent: after {@code UPTO} the reply has one field more
     * ({@code granted}: the sixth, the seventh of {@code RL.ALL}), read into
     * {@link #granted()}; otherwise {@code granted} is the request's cost
     * when admitted.
     */
    static Decision fromReply(String command, Object reply, Request units) {
        boolean upto = units != null && units.upto();
        if (upto) {
            return fromUptoReply(command, reply);
        }
        if (!(reply instanceof List<?> items) || !replyWidth(command, items.size())) {
            throw new ProtocolException(command, reply);
        }
        long[] f = new long[items.size()];
        for (int i = 0; i < f.length; i++) {
            if (!(items.get(i) instanceof Long n)) {
                throw new ProtocolException(command, reply);
            }
            f[i] = n;
        }
        boolean all = "RL.ALL".equals(command);
        OptionalInt deniedBy = all && f.length == 6 && f[5] > 0 ? OptionalInt.of((int) f[5] - 1) : OptionalInt.empty();
        long lease = !all && f.length == 6 ? Math.max(0, f[5]) : 0;
        boolean allowed = f[0] == 1;
        long granted = units == null ? (allowed ? 1 : 0)
                : units.refund() ? 0 : units.force() || allowed ? units.n() : 0;
        return new Decision(allowed, Math.max(0, f[1]), Math.max(0, f[2]), f[3], Math.max(0, f[4]), deniedBy, Path.REDIS, lease, granted);
    }

    private static Decision fromUptoReply(String command, Object reply) {
        boolean all = "RL.ALL".equals(command);
        int width = all ? 7 : 6;
        if (!(reply instanceof List<?> items) || items.size() != width) {
            throw new ProtocolException(command, reply);
        }
        long[] f = new long[width];
        for (int i = 0; i < width; i++) {
            if (!(items.get(i) instanceof Long n)) {
                throw new ProtocolException(command, reply);
            }
            f[i] = n;
        }
        OptionalInt deniedBy = all && f[5] > 0 ? OptionalInt.of((int) f[5] - 1) : OptionalInt.empty();
        return new Decision(f[0] == 1, Math.max(0, f[1]), Math.max(0, f[2]), f[3], Math.max(0, f[4]), deniedBy, Path.REDIS, 0,
                Math.max(0, f[width - 1]));
    }

    private static boolean replyWidth(String command, int size) {
        return switch (command) {
            case "RL.ALL", "RL.CONCURRENCY" -> size == 6;
            case "RL.HIT" -> size == 5 || size == 6;
            default -> size == 5;
        };
    }
}

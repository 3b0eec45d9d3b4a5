package io.redisratelimit.client;

import java.util.List;

/** The limiter algorithms (and the concurrency cap), with their command names and parameter names. */
public enum Algorithm {
    TOKENBUCKET("capacity", "refill_count", "refill_ms"),
    LEAKYBUCKET("capacity", "leak_count", "leak_ms"),
    SLIDING("limit", "window_ms"),
    HASHWINDOW("limit", "window_ms", "bucket_ms"),
    FIXEDWINDOW("limit", "window_ms"),
    /** At most {@code limit} units held at once, by leases that end at a release or after {@code lease_ms}. */
    CONCURRENCY("limit", "lease_ms"),
    /**
     * At most {@code limit} units per calendar period (a day, an ISO week, a
     * month, a year) in a zone: {@code RL.QUOTA key limit PERIOD [TZ zone]}.
     * Its one parameter is the limit; the period and the zone are the
     * {@link Spec}'s ({@link Spec#quota}).
     */
    QUOTA("limit");

    private final List<String> params;

    Algorithm(String... params) {
        this.params = List.of(params);
    }

    /** The parameters' names, in the command's order. */
    public List<String> paramNames() {
        return params;
    }

    /** The command: {@code RL.TOKENBUCKET}, ... */
    public String command() {
        return "RL." + name();
    }

    /** Parses a name in any case ({@code token-bucket} and {@code token_bucket} too). */
    public static Algorithm parse(String name) {
        String n = name == null ? "" : name.replace("-", "").replace("_", "").toUpperCase(java.util.Locale.ROOT);
        if (n.equals("SLIDINGLOG") || n.equals("SLIDINGWINDOW")) {
            return SLIDING;
        }
        for (Algorithm a : values()) {
            if (a.name().equals(n)) {
                return a;
            }
        }
        throw new InvalidArgumentException("algorithm", "unknown algorithm '" + name
                + "' (one of tokenbucket, leakybucket, sliding, hashwindow, fixedwindow, concurrency, quota)");
    }
}

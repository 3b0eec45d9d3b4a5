package io.redisratelimit.client;

/** One denial of {@code RL.LOG GET}. */
public record LogEntry(long id, long unixMs, String key, String command, long cost, long waitMs) {
}

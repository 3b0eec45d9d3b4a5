package io.redisratelimit.client;

import com.github.benmanes.caffeine.cache.Cache;
import com.github.benmanes.caffeine.cache.Caffeine;
import com.github.benmanes.caffeine.cache.Expiry;

import java.time.Duration;

/**
 * After a denial with {@code wait_ms} w, the same rule and key deny in
 * process for {@code min(w, max)}, the reply's times counting down, without a
 * round trip. Bounded by Caffeine's size cap (W-TinyLFU keeps the hot keys).
 */
final class DenyCache {
    private record Entry(Decision decision, long atNanos, long ttlNanos) {
    }

    private final Cache<String, Entry> cache;
    private final Duration max;

    DenyCache(Duration max, long capacity) {
        this.max = max;
        this.cache = Caffeine.newBuilder()
                .maximumSize(Math.max(1, capacity))
                .expireAfter(new Expiry<String, Entry>() {
                    @Override
                    public long expireAfterCreate(String key, Entry e, long now) {
                        return e.ttlNanos();
                    }

                    @Override
                    public long expireAfterUpdate(String key, Entry e, long now, long current) {
                        return e.ttlNanos();
                    }

                    @Override
                    public long expireAfterRead(String key, Entry e, long now, long current) {
                        return current;
                    }
                })
                .build();
    }

    Decision get(String key) {
        Entry e = cache.getIfPresent(key);
        if (e == null) {
            return null;
        }
        long elapsed = System.nanoTime() - e.atNanos();
        if (elapsed >= e.ttlNanos()) {
            cache.invalidate(key);
            return null;
        }
        long elapsedMs = elapsed / 1_000_000;
        Decision d = e.decision();
        // The rule that denied stays named (an RL.ALL denial cached for its rules together).
        // Never below 1 ms while the entry denies: a denial always says to wait.
        return new Decision(false, d.limit(), d.remaining(), Math.max(1, d.waitMs() - elapsedMs),
                Math.max(0, d.resetMs() - elapsedMs), d.deniedBy(), Path.DENY_CACHE);
    }

    /** Remembers a denial; one that can never pass, or has no wait, is not cached. */
    void put(String key, Decision d) {
        if (d.allowed() || d.waitMs() <= 0) {
            return;
        }
        long ttl = Math.min(Duration.ofMillis(d.waitMs()).toNanos(), max.toNanos());
        if (ttl > 0) {
            cache.put(key, new Entry(d, System.nanoTime(), ttl));
        }
    }

    long size() {
        cache.cleanUp();
        return cache.estimatedSize();
    }
}

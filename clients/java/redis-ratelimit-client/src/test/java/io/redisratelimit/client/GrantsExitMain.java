package io.redisratelimit.client;

import java.time.Duration;

/**
 * A program that takes units of a batched rule and exits without closing its
 * limiter (what a plain-Java service does when it is stopped): run by
 * {@link BatchedTest} in a JVM of its own. Args: the server's port, the key.
 */
public final class GrantsExitMain {
    private GrantsExitMain() {
    }

    public static void main(String[] args) {
        Limiter l = Limiter.builder(Client.connect(io.redisratelimit.client.driver.LettuceDriver.connect(
                io.lettuce.core.RedisURI.create("redis://127.0.0.1:" + Integer.parseInt(args[0]))), Duration.ofSeconds(2))).build();
        RuleSet set = l.rules(Rule.of("exit", Spec.tokenBucket(1000, 1, 1_000_000_000L)).fixedKey(args[1]).asGlobal().batched().holdMs(60_000));
        long admitted = 0;
        for (int i = 0; i < 150; i++) {
            admitted += l.check(set, "any").allowed() ? 1 : 0;
        }
        System.out.println("admitted " + admitted);
        System.exit(0);
    }
}

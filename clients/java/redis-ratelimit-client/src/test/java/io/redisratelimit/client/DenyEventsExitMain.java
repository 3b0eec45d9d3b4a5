package io.redisratelimit.client;

import java.nio.file.Path;
import java.time.Duration;
import java.time.Instant;

/**
 * A program that records deny events and returns from main without closing
 * them (what a plain-Java service does when it is stopped): run by
 * {@link DenyEventsTest} in a JVM of its own.
 */
public final class DenyEventsExitMain {
    private DenyEventsExitMain() {
    }

    public static void main(String[] args) {
        DenyEvents events = DenyEvents.builder(DenyEventSink.file(Path.of(args[0]))).flushInterval(Duration.ofHours(1)).build();
        for (int i = 0; i < 3; i++) {
            events.record(new DenyEvent(Instant.now(), "rl:exit:" + i, "exit", "redis", "denied", 1, 0, 10, null, null));
        }
        System.out.println("recorded " + events.pending());
    }
}

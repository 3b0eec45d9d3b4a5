package io.redisratelimit.client;

import java.nio.file.Path;
import java.time.Instant;

/**
 * Three batches to a file sink in a JVM whose file size limit
 * ({@code ulimit -f}) the second batch crosses: run by {@link DenyEventsTest}.
 */
public final class DenyEventsFullDiskMain {
    private DenyEventsFullDiskMain() {
    }

    public static void main(String[] args) {
        try (DenyEvents events = DenyEvents.builder(DenyEventSink.file(Path.of(args[0]))).backgroundFlusher(false).build()) {
            int[] batches = {5, 10, 1};
            int n = 0;
            for (int size : batches) {
                for (int i = 0; i < size; i++) {
                    events.record(new DenyEvent(Instant.now(), "rl:disk:" + n++, "disk", "redis", "denied", 1, 0, 10, "192.0.2.1", "disk/1"));
                }
                System.out.println("shipped " + events.flush() + " of " + size);
            }
            System.out.println("dropped " + events.dropped() + " errors " + events.sinkErrors());
        }
    }
}

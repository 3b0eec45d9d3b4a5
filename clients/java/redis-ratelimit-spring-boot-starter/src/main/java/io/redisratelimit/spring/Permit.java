package io.redisratelimit.spring;

import io.redisratelimit.client.Decision;
import io.redisratelimit.client.Lease;

import java.util.List;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.CompletionStage;

/**
 * A request decided under its rules, with the leases its concurrency rules
 * took: {@link #close()} (or {@link #releaseAsync()}) gives them back when the
 * work is done. A denial, and rules that only limit a rate, hold none.
 */
public final class Permit implements AutoCloseable {
    private final Decision decision;
    private final List<Lease> leases;

    Permit(Decision decision, List<Lease> leases) {
        this.decision = decision;
        this.leases = List.copyOf(leases);
    }

    /** The decision the response reports (the one that denied, or the rate rules' admission). */
    public Decision decision() {
        return decision;
    }

    public boolean allowed() {
        return decision.allowed();
    }

    /** The leases held, one per concurrency rule that granted one. */
    public List<Lease> leases() {
        return leases;
    }

    /** Releases every lease, waiting for the server's answers (a failure is logged; the lease then expires). */
    @Override
    public void close() {
        for (Lease l : leases) {
            l.close();
        }
    }

    /** Releases every lease without waiting, for threads that must not block (WebFlux). */
    public CompletionStage<Void> releaseAsync() {
        CompletableFuture<?>[] all = leases.stream()
                .map(l -> l.releaseAsync().toCompletableFuture().exceptionally(e -> false))
                .toArray(CompletableFuture[]::new);
        return CompletableFuture.allOf(all);
    }
}

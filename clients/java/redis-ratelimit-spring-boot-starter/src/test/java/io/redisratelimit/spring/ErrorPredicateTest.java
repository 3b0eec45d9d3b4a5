package io.redisratelimit.spring;

import org.junit.jupiter.api.Test;
import org.springframework.http.HttpStatus;
import org.springframework.web.server.ResponseStatusException;

import java.util.concurrent.CompletableFuture;
import java.util.concurrent.CompletionException;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.TimeoutException;

import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertTrue;

/** The default error rule on what asynchronous handlers fail with: the cause, not its wrapper. */
class ErrorPredicateTest {
    @Test
    void aCompletionStagesWrappedFailureIsJudgedByItsCause() {
        ResponseStatusException notFound = new ResponseStatusException(HttpStatus.NOT_FOUND);
        assertFalse(ErrorPredicate.DEFAULT.isError(-1, notFound));
        // What whenComplete hands a derived stage (supplyAsync, thenApply) when the handler threw a 404.
        Throwable[] seen = new Throwable[1];
        CompletableFuture.supplyAsync(() -> {
            throw notFound;
        }).whenComplete((v, e) -> seen[0] = e).exceptionally(e -> null).join();
        assertTrue(seen[0] instanceof CompletionException, String.valueOf(seen[0]));
        assertFalse(ErrorPredicate.DEFAULT.isError(-1, seen[0]), "a 404 is no error, wrapped or not");
        assertFalse(ErrorPredicate.DEFAULT.isError(-1, new ExecutionException(notFound)));
        assertTrue(ErrorPredicate.DEFAULT.isError(-1, new CompletionException(new TimeoutException("slow"))), "a timeout is");
        assertTrue(ErrorPredicate.DEFAULT.isError(-1, new CompletionException(new ResponseStatusException(HttpStatus.BAD_GATEWAY))));
        assertTrue(ErrorPredicate.DEFAULT.isError(-1, new CompletionException(null)), "a wrapper without a cause is an error");
    }
}

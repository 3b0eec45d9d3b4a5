package io.redisratelimit.spring;

/**
 * Which finished requests count as errors in the protection loop's outcomes
 * (the policy's {@code ADAPT ERRORS pct} compares them with the rest). A bean
 * of this type replaces {@link #DEFAULT}.
 */
@FunctionalInterface
public interface ErrorPredicate {
    /**
     * @param status  the HTTP status of the answer, or -1 when there is none
     *                (a bean's method, or a handler that threw before answering)
     * @param failure what the handler threw (the cause of the
     *                {@code CompletionException} an asynchronous handler's
     *                stage failed with), or null
     */
    boolean isError(int status, Throwable failure);

    /**
     * A 5xx answer, or an exception or a timeout of the handler; not an
     * exception that answers below 500 (Spring's {@code ErrorResponse}, such as
     * {@code ResponseStatusException(NOT_FOUND)}), nor a rate-limit denial.
     */
    ErrorPredicate DEFAULT = (status, failure) -> {
        if (status >= 500) {
            return true;
        }
        failure = cause(failure);
        if (failure == null || failure instanceof RateLimitExceededException) {
            return false;
        }
        int answered = ErrorResponses.status(failure);
        return answered < 0 || answered >= 500;
    };

    /**
     * What a handler threw, without the wrappers of asynchronous completion
     * ({@code CompletionException}, {@code ExecutionException}) that a
     * {@code CompletionStage} adds around it; the wrapper itself when it has
     * no cause.
     */
    static Throwable cause(Throwable failure) {
        Throwable t = failure;
        while ((t instanceof java.util.concurrent.CompletionException || t instanceof java.util.concurrent.ExecutionException)
                && t.getCause() != null) {
            t = t.getCause();
        }
        return t;
    }
}

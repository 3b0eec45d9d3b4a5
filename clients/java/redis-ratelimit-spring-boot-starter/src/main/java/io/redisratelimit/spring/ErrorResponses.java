package io.redisratelimit.spring;

import org.springframework.util.ClassUtils;

/** The status of an exception that carries one (Spring's {@code ErrorResponse}), read only when spring-web is there. */
final class ErrorResponses {
    private static final boolean WEB = ClassUtils.isPresent("org.springframework.web.ErrorResponse", ErrorResponses.class.getClassLoader());

    private ErrorResponses() {
    }

    /** The status the exception answers with, or -1. */
    static int status(Throwable t) {
        if (WEB && t instanceof org.springframework.web.ErrorResponse r) {
            return r.getStatusCode().value();
        }
        return -1;
    }
}

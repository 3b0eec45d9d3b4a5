package io.redisratelimit.spring;

import io.redisratelimit.client.ModuleMissingException;
import org.springframework.boot.diagnostics.AbstractFailureAnalyzer;
import org.springframework.boot.diagnostics.FailureAnalysis;

/**
 * Puts a server without the module at the top of a failed start-up, as
 * Spring Boot's "APPLICATION FAILED TO START" report, instead of the last of
 * a long stack trace.
 */
public class RateLimitFailureAnalyzer extends AbstractFailureAnalyzer<ModuleMissingException> {
    @Override
    protected FailureAnalysis analyze(Throwable rootFailure, ModuleMissingException cause) {
        return new FailureAnalysis("redis-ratelimit: " + cause.getMessage(),
                "Load the module into that server (--loadmodule /path/to/libredis_ratelimit.so, or loadmodule in redis.conf),"
                        + " or point spring.data.redis.* at a server that has it.", cause);
    }
}

package io.redisratelimit.spring;

import io.github.resilience4j.circuitbreaker.CircuitBreaker;
import io.github.resilience4j.circuitbreaker.CircuitBreakerRegistry;
import io.redisratelimit.client.Protection;

import java.lang.System.Logger.Level;
import java.util.Map;
import java.util.Set;
import java.util.concurrent.ConcurrentHashMap;

/**
 * Opens the Resilience4j breakers the rules name ({@code ratelimit.rules.<rule>.breaker})
 * while one of their policies is at stage 2: {@code transitionToForcedOpenState()},
 * and {@code transitionToClosedState()} once every policy naming it falls below 2
 * (only a breaker this class forced open is closed by it; also when a refresh
 * removed the rules naming it, or the loop closed). The breakers come by
 * name from the application's {@link CircuitBreakerRegistry}, so the
 * application's own calls through them see the same state.
 */
public final class RateLimitBreakers implements Protection.Listener {
    private static final System.Logger LOG = System.getLogger(RateLimitBreakers.class.getName());

    private final RateLimitService service;
    private final CircuitBreakerRegistry registry;
    private final Set<String> forced = ConcurrentHashMap.newKeySet();

    public RateLimitBreakers(RateLimitService service, CircuitBreakerRegistry registry) {
        this.service = service;
        this.registry = registry;
    }

    public CircuitBreakerRegistry registry() {
        return registry;
    }

    @Override
    public synchronized void stageChanged(String policy, int stage) {
        Protection p = service.protection();
        Map<String, RateLimitRules.Entry> entries = service.rules().entries();
        Map<String, Integer> byBreaker = new java.util.HashMap<>();
        for (RateLimitRules.Entry e : entries.values()) {
            if (e.breaker() != null) {
                byBreaker.merge(e.breaker(), p == null ? 0 : p.stage(e.rule().policy()), Math::max);
            }
        }
        for (String name : forced) {
            // A breaker it forced open that no rule names any more (a refresh removed the rule): closed.
            byBreaker.putIfAbsent(name, Protection.NORMAL);
        }
        for (Map.Entry<String, Integer> b : byBreaker.entrySet()) {
            CircuitBreaker cb = registry.circuitBreaker(b.getKey());
            if (b.getValue() >= Protection.BREAK) {
                if (cb.getState() != CircuitBreaker.State.FORCED_OPEN) {
                    cb.transitionToForcedOpenState();
                    forced.add(b.getKey());
                    LOG.log(Level.WARNING, "redis-ratelimit: stage 2 (break): circuit breaker '" + b.getKey() + "' forced open");
                }
            } else if (forced.remove(b.getKey()) && cb.getState() == CircuitBreaker.State.FORCED_OPEN) {
                cb.transitionToClosedState();
                LOG.log(Level.INFO, "redis-ratelimit: the stage fell below 2: circuit breaker '" + b.getKey() + "' closed");
            }
        }
    }
}

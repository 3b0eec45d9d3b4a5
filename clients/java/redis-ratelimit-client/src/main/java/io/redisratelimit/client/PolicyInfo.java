package io.redisratelimit.client;

/**
 * A policy as {@code RL.POLICY GET} answers it.
 *
 * @param spec the algorithm and parameters; null for one the kit does not know
 *             (such as {@code CONCURRENCY})
 */
public record PolicyInfo(String name, String algorithm, java.util.List<Long> params, Spec spec, PolicyMode mode, int rollout,
                         long calls, long admitted, long denied, long shadowDenied) {
}

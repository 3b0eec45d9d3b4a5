package io.redisratelimit.client;

/**
 * A policy as {@code RL.POLICY GET} answers it.
 *
 * @param spec the algorithm and parameters (a quota's period and zone too);
 *             null for one the kit does not know
 * @param zone a quota's zone as the server names it ({@code UTC},
 *             {@code +05:30}, {@code America/New_York}); null for the other
 *             algorithms (and from a server whose policies have no zone)
 */
public record PolicyInfo(String name, String algorithm, java.util.List<Long> params, Spec spec, PolicyMode mode, int rollout,
                         String zone, long calls, long admitted, long denied, long shadowDenied) {
}

package io.redisratelimit.client;

import java.util.ArrayList;
import java.util.Arrays;
import java.util.HashMap;
import java.util.HashSet;
import java.util.List;
import java.util.Map;
import java.util.Set;

/**
 * Where a striped rule's stripes live: stripe {@code i}'s key is
 * {@code "{" + tag_i + "}" + key}, and {@code tag_i} the first of
 * {@code rl0, rl1, rl2, ...} whose cluster slot (CRC16-XMODEM mod 16384, the
 * driver library's own: Lettuce's {@code SlotHash} or Jedis's
 * {@code JedisClusterCRC16}) is owned by master {@code i mod M} (masters
 * ordered by the lowest slot each owns) and is no earlier stripe's tag. A
 * standalone or Sentinel server is one master owning every slot: tags
 * {@code rl0 ... rl(N-1)}.
 *
 * <p>An immutable slot map ({@link #owners}) with the tags picked on it;
 * {@link #repick} moves only the stripes whose master no longer holds them
 * beside another stripe.
 */
final class Stripes {
    /** The cluster's slots. */
    static final int SLOTS = 16384;
    private static final boolean LETTUCE = present("io.lettuce.core.cluster.SlotHash");

    /** Master index (ordered by lowest slot) of each slot, -1 when no master owns it. */
    private final int[] owner;
    private final int masters;
    /** The tags per number of stripes. */
    private final Map<Integer, List<String>> tags = new HashMap<>();

    Stripes(int[] owner, int masters) {
        this.owner = owner;
        this.masters = masters;
    }

    /** One master owning every slot: a standalone or Sentinel server. */
    static Stripes standalone() {
        return new Stripes(new int[SLOTS], 1);
    }

    /**
     * The slot map of a {@code CLUSTER SLOTS} reply (entries
     * {@code [start, end, [host, port, ...], replicas...]}): masters named by
     * host and port, numbered by the lowest slot each owns.
     */
    static Stripes fromClusterSlots(Object reply) {
        if (!(reply instanceof List<?> entries)) {
            throw new ProtocolException("CLUSTER SLOTS", reply);
        }
        Map<String, Integer> lowest = new HashMap<>();
        List<Object[]> ranges = new ArrayList<>();
        for (Object e : entries) {
            if (!(e instanceof List<?> f) || f.size() < 3 || !(f.get(0) instanceof Long start) || !(f.get(1) instanceof Long end)
                    || !(f.get(2) instanceof List<?> node) || node.size() < 2) {
                throw new ProtocolException("CLUSTER SLOTS", reply);
            }
            String master = node.get(0) + ":" + node.get(1);
            ranges.add(new Object[] {master, start.intValue(), end.intValue()});
            lowest.merge(master, start.intValue(), Math::min);
        }
        List<String> order = new ArrayList<>(lowest.keySet());
        order.sort((a, b) -> Integer.compare(lowest.get(a), lowest.get(b)));
        int[] owner = new int[SLOTS];
        Arrays.fill(owner, -1);
        for (Object[] r : ranges) {
            int m = order.indexOf((String) r[0]);
            for (int s = Math.max(0, (Integer) r[1]); s <= Math.min(SLOTS - 1, (Integer) r[2]); s++) {
                owner[s] = m;
            }
        }
        return new Stripes(owner, Math.max(1, order.size()));
    }

    /** The number of masters. */
    int masters() {
        return masters;
    }

    /** The master owning {@code slot} (-1: none). */
    int ownerOf(int slot) {
        return owner[slot];
    }

    /** Whether two maps give every slot the same master. */
    boolean sameMap(Stripes other) {
        return other != null && other.masters == masters && Arrays.equals(other.owner, owner);
    }

    /** The tags of {@code n} stripes on this map, picked once. */
    synchronized List<String> tags(int n) {
        return tags.computeIfAbsent(n, k -> pick(null, k));
    }

    /** This map with the tags of {@code before} re-picked: a stripe keeps its tag while its master holds no more than its due. */
    Stripes repick(Stripes before) {
        Stripes next = this;
        Map<Integer, List<String>> old;
        synchronized (before) {
            old = new HashMap<>(before.tags);
        }
        synchronized (next) {
            for (Map.Entry<Integer, List<String>> e : old.entrySet()) {
                next.tags.put(e.getKey(), next.pick(e.getValue(), e.getKey()));
            }
        }
        return next;
    }

    /**
     * The tags of {@code n} stripes: stripe {@code i} on master {@code i mod M}
     * with the first free {@code rlK} of that master. With {@code old} tags,
     * each keeps its tag while the master now owning it holds fewer stripes
     * than its due (the number of {@code i} with {@code i mod M} its index);
     * the others move, in order, each to its placement's master or the next
     * one short of its due (as the other kits).
     */
    private List<String> pick(List<String> old, int n) {
        int[] due = new int[masters];
        for (int i = 0; i < n; i++) {
            due[i % masters]++;
        }
        int[] held = new int[masters];
        String[] out = new String[n];
        Set<String> used = new HashSet<>();
        if (old != null && old.size() == n) {
            for (int i = 0; i < n; i++) {
                int m = owner[slot(old.get(i))];
                if (m >= 0 && held[m] < due[m]) {
                    out[i] = old.get(i);
                    held[m]++;
                    used.add(old.get(i));
                }
            }
        }
        long next = 0;
        for (int i = 0; i < n; i++) {
            if (out[i] != null) {
                continue;
            }
            // The placement's own master when it has room, else the next one with room.
            int m = i % masters;
            for (int j = 0; j < masters && held[m] >= due[m]; j++) {
                m = (i + j + 1) % masters;
            }
            out[i] = firstTag(m, used);
            used.add(out[i]);
            held[m]++;
        }
        return List.of(out);
    }

    /** The first {@code rlK} owned by master {@code m} and not used; any free one when {@code m} owns no slot. */
    private String firstTag(int m, Set<String> used) {
        for (long k = 0; k < 1_000_000; k++) {
            String t = "rl" + k;
            if (owner[slot(t)] == m && !used.contains(t)) {
                return t;
            }
        }
        for (long k = 0; ; k++) {
            String t = "rl" + k;
            if (!used.contains(t)) {
                return t;
            }
        }
    }

    /** Stripe {@code i}'s key. */
    static String key(String tag, String key) {
        return "{" + tag + "}" + key;
    }

    /** The cluster slot of {@code key}: CRC16-XMODEM of its hash tag (or the whole key) mod 16384, as the driver library computes it. */
    static int slot(String key) {
        return LETTUCE ? io.lettuce.core.cluster.SlotHash.getSlot(key) : redis.clients.jedis.util.JedisClusterCRC16.getSlot(key);
    }

    /**
     * The specs of {@code n} stripes of {@code spec}; refused naming
     * {@code striped} when a share would be 0 ({@code n} above the limit, or
     * above a token bucket's refill count), or for an algorithm that cannot be
     * striped (a leaky bucket, a concurrency cap).
     */
    static List<Spec> shares(Spec spec, int n) {
        Algorithm a = spec.algorithm();
        if (a == Algorithm.LEAKYBUCKET || a == Algorithm.CONCURRENCY) {
            throw new InvalidArgumentException("striped", "a " + a.name().toLowerCase(java.util.Locale.ROOT)
                    + " cannot be striped (no UPTO): only a token bucket, a window or a quota");
        }
        List<Long> p = spec.params();
        if (n > p.get(0)) {
            throw new InvalidArgumentException("striped", n + " stripes of a limit of " + p.get(0) + " leave a stripe with 0: at most " + p.get(0));
        }
        if (a == Algorithm.TOKENBUCKET && n > p.get(1)) {
            throw new InvalidArgumentException("striped", n + " stripes of a refill_count of " + p.get(1)
                    + " leave a stripe refilling 0: at most " + p.get(1));
        }
        List<Spec> out = new ArrayList<>(n);
        for (int i = 0; i < n; i++) {
            out.add(spec.stripe(i, n));
        }
        return out;
    }

    private static boolean present(String cls) {
        try {
            Class.forName(cls, false, Stripes.class.getClassLoader());
            return true;
        } catch (ClassNotFoundException | LinkageError e) {
            return false;
        }
    }
}

package io.redisratelimit.client;

import java.util.ArrayList;
import java.util.List;

/**
 * A policy's protection loop as one master sees it: the reply of
 * {@code RL.POLICY STATS name} and of {@code RL.OUTCOME}, a flat list of
 * names and values in the order of {@link #FIELDS} ({@code current} and
 * {@code last} are each a flat list in the order of {@link Window#FIELDS}).
 *
 * @param scale       percent (1 to 100) the policy's size and rate parameters run at
 * @param stage       0 normal, 1 degrade, 2 break
 * @param windowMs    the policy's window
 * @param windowEndMs when the current window ends (Unix ms, the master's clock)
 * @param current     the window being counted
 * @param last        the last window that ended
 * @param adapting    whether {@code ADAPT ERRORS} is on
 */
public record PolicyStats(int scale, int stage, long windowMs, long windowEndMs, Window current, Window last, boolean adapting) {
    /** The reply's field names, in order (the contract's {@code protection.stats_fields}). */
    public static final List<String> FIELDS = List.of("scale", "stage", "window_ms", "window_end_ms", "current", "last", "adapting");

    /** One window's counts; the ratios are in per mille, rounded down, 0 when nothing was counted. */
    public record Window(long calls, long admitted, long denied, long ok, long errors, long denyPermille, long errorPermille) {
        /** The contract's {@code protection.window_fields}. */
        public static final List<String> FIELDS = List.of("calls", "admitted", "denied", "ok", "errors", "deny_permille", "error_permille");

        static Window fromReply(String command, Object reply) {
            List<Object> v = values(command, reply, FIELDS);
            return new Window(number(command, v.get(0)), number(command, v.get(1)), number(command, v.get(2)),
                    number(command, v.get(3)), number(command, v.get(4)), number(command, v.get(5)), number(command, v.get(6)));
        }
    }

    /** Parses one master's reply; a field missing, misplaced or extra is a {@link ProtocolException}. */
    public static PolicyStats fromReply(String command, Object reply) {
        List<Object> v = values(command, reply, FIELDS);
        return new PolicyStats((int) number(command, v.get(0)), (int) number(command, v.get(1)), number(command, v.get(2)),
                number(command, v.get(3)), Window.fromReply(command, v.get(4)), Window.fromReply(command, v.get(5)),
                number(command, v.get(6)) == 1);
    }

    private static List<Object> values(String command, Object reply, List<String> names) {
        if (!(reply instanceof List<?> flat) || flat.size() != names.size() * 2) {
            throw new ProtocolException(command, reply);
        }
        List<Object> out = new ArrayList<>(names.size());
        for (int i = 0; i < names.size(); i++) {
            if (!names.get(i).equals(flat.get(2 * i))) {
                throw new ProtocolException(command, reply);
            }
            out.add(flat.get(2 * i + 1));
        }
        return out;
    }

    private static long number(String command, Object o) {
        if (o instanceof Long n) {
            return n;
        }
        throw new ProtocolException(command, o);
    }
}

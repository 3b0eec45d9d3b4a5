package io.redisratelimit.client.driver;

import java.util.List;

/**
 * One command as a driver sends it.
 *
 * @param name       the command ({@code RL.HIT}, {@code MODULE}, ...)
 * @param args       its arguments, after the name
 * @param keyIndex   the position in {@code args} of the key that decides the
 *                   node (RL.HIT's key is its second argument, RL.ALL's first
 *                   key follows numkeys), or -1 for any node
 * @param arrayReply whether the reply is an array (else a single value)
 */
public record Command(String name, List<String> args, int keyIndex, boolean arrayReply) {
    public Command {
        args = List.copyOf(args);
        if (keyIndex >= args.size()) {
            throw new IllegalArgumentException("key index " + keyIndex + " out of " + args);
        }
    }

    /** The routing key, or null. */
    public String routingKey() {
        return keyIndex < 0 ? null : args.get(keyIndex);
    }

    @Override
    public String toString() {
        return name + (args.isEmpty() ? "" : " " + String.join(" ", args));
    }
}

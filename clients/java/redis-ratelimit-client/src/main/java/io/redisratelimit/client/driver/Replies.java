package io.redisratelimit.client.driver;

import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.List;

/** Drivers' replies turned into Long, String, List or null. */
final class Replies {
    private Replies() {
    }

    static Object normalize(Object reply) {
        if (reply instanceof byte[] b) {
            return new String(b, StandardCharsets.UTF_8);
        }
        if (reply instanceof List<?> list) {
            List<Object> out = new ArrayList<>(list.size());
            for (Object o : list) {
                out.add(normalize(o));
            }
            return out;
        }
        return reply;
    }
}

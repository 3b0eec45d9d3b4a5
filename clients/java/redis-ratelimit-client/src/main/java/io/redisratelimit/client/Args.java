package io.redisratelimit.client;

/** The checks made before a command is sent. */
final class Args {
    private Args() {
    }

    static String key(String key) {
        if (key == null || key.isEmpty()) {
            throw new InvalidArgumentException("key", "must not be empty");
        }
        return key;
    }

    /** 1 to 256 bytes of printable ASCII without spaces ({@code !} to {@code ~}). */
    static String policyName(String name) {
        if (name == null || name.isEmpty() || name.length() > 256) {
            throw new InvalidArgumentException("name", "a policy name is 1 to 256 printable ASCII characters without spaces");
        }
        for (int i = 0; i < name.length(); i++) {
            char c = name.charAt(i);
            if (c < '!' || c > '~') {
                throw new InvalidArgumentException("name", "a policy name is printable ASCII without spaces: '" + name + "'");
            }
        }
        return name;
    }

    /** A lease id: a positive integer below 2^63, as the server hands them out. */
    static long lease(long lease) {
        if (lease < 1) {
            throw new InvalidArgumentException("lease", "must be a lease id, an integer from 1 to " + Long.MAX_VALUE + ", got " + lease);
        }
        return lease;
    }

    static long positive(String arg, long n) {
        if (n < 1 || n > Spec.MAX_PARAM) {
            throw new InvalidArgumentException(arg, "must be an integer from 1 to " + Spec.MAX_PARAM + ", got " + n);
        }
        return n;
    }
}

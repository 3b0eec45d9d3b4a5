package io.redisratelimit.spring;

import io.redisratelimit.client.Decision;
import io.redisratelimit.client.Spec;

import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.OptionalLong;

/**
 * The HTTP answer of a decision, as the Rust kit writes it:
 * {@code RateLimit-Policy: "name";q=<limit>;w=<window s>} (one item per rule),
 * {@code RateLimit: "name";r=<remaining>;t=<ceil(reset_ms / 1000)>} for the
 * rule the reply describes, {@code Retry-After: ceil(wait_ms / 1000)} on a
 * denial that can pass later, and the problem body
 * ({@code application/problem+json}).
 */
public final class RateLimitHeaders {
    public static final String QUOTA_EXCEEDED = "https://iana.org/assignments/http-problem-types#quota-exceeded";
    public static final String TITLE = "Request cannot be satisfied as assigned quota has been exceeded";

    private RateLimitHeaders() {
    }

    public static Map<String, String> of(RateLimitService service, List<String> names, Decision d) {
        Map<String, String> h = new LinkedHashMap<>();
        StringBuilder policy = new StringBuilder();
        for (String n : names) {
            if (policy.length() > 0) {
                policy.append(", ");
            }
            policy.append(policyItem(n, service.rules().get(n).rule().spec()));
        }
        h.put("RateLimit-Policy", policy.toString());
        h.put("RateLimit", rateLimitItem(service.reported(names, d), d));
        OptionalLong retryAfter = retryAfter(d);
        if (retryAfter.isPresent()) {
            h.put("Retry-After", Long.toString(retryAfter.getAsLong()));
        }
        return h;
    }

    /**
     * One rule's item of {@code RateLimit-Policy}: {@code "name";q=<limit>;w=<window s>},
     * without {@code w} for a concurrency cap (it has no window), just the
     * name for a rule without a spec.
     */
    public static String policyItem(String rule, Spec s) {
        StringBuilder b = new StringBuilder().append('"').append(rule).append('"');
        if (s != null) {
            b.append(";q=").append(s.limit());
            if (!s.concurrency()) {
                // A concurrency cap has no window: the draft's "w" is left out.
                b.append(";w=").append(s.windowSeconds());
            }
        }
        return b.toString();
    }

    /** The {@code RateLimit} item of the rule a decision describes: {@code "name";r=<remaining>;t=<ceil(reset_ms / 1000)>}. */
    public static String rateLimitItem(String rule, Decision d) {
        return "\"" + rule + "\";r=" + d.remaining() + ";t=" + d.resetSeconds();
    }

    /** {@code Retry-After} in seconds, {@code ceil(wait_ms / 1000)}: empty when admitted or when the request can never pass. */
    public static OptionalLong retryAfter(Decision d) {
        return d.allowed() ? OptionalLong.empty() : d.retryAfterSeconds();
    }

    /**
     * The problem's {@code detail}: {@code rate limit "name" exceeded; retry
     * after <s> s} (or {@code ; this request can never pass}), the name
     * quoted as the Rust kit quotes it ({@code "q\"uote"}).
     */
    public static String detail(String rule, Decision d) {
        return d.never() ? "rate limit " + quoted(rule) + " exceeded; this request can never pass"
                : "rate limit " + quoted(rule) + " exceeded; retry after " + d.retryAfterSeconds().getAsLong() + " s";
    }

    /**
     * A name between double quotes, a quote, a backslash and a control
     * character escaped as Rust's {@code {:?}} writes a string (a backslash
     * before a quote or a backslash, {@code \n}, {@code \t}, {@code \r},
     * {@code \0}, any other control character as {@code u{hex}} after a
     * backslash).
     */
    static String quoted(String s) {
        StringBuilder b = new StringBuilder(s.length() + 2).append('"');
        s.codePoints().forEach(c -> {
            switch (c) {
                case '"' -> b.append("\\\"");
                case '\\' -> b.append("\\\\");
                case '\n' -> b.append("\\n");
                case '\r' -> b.append("\\r");
                case '\t' -> b.append("\\t");
                case 0 -> b.append("\\0");
                default -> {
                    if (Character.isISOControl(c)) {
                        b.append("\\u{").append(Integer.toHexString(c)).append('}');
                    } else {
                        b.appendCodePoint(c);
                    }
                }
            }
        });
        return b.append('"').toString();
    }

    /** The 400 problem of a request whose key expression gave nothing ({@code ratelimit.missing-key: deny}). */
    public static String keyMissingJson(String rule, String expression, String instance) {
        return "{\"type\":\"about:blank\",\"title\":\"Bad Request\",\"status\":400,\"detail\":\""
                + escape("no rate-limit key: " + expression + " of rule \"" + rule + "\" gave nothing") + "\",\"instance\":\""
                + escape(instance) + "\"}";
    }

    /**
     * The problem body of a denial ({@code application/problem+json}), for
     * writers without Spring's message converters: byte for byte the Rust
     * kit's, its members in name order.
     */
    public static String problemJson(String rule, Decision d) {
        return "{\"detail\":\"" + escape(detail(rule, d)) + "\",\"status\":429,\"title\":\"" + TITLE + "\",\"type\":\""
                + QUOTA_EXCEEDED + "\",\"violated-policies\":[\"" + escape(rule) + "\"]}";
    }

    /** The problem body with {@code instance}, the request's path, as the annotation's 429 has it (members in name order). */
    public static String problemJson(String rule, Decision d, String instance) {
        return "{\"detail\":\"" + escape(detail(rule, d)) + "\",\"instance\":\"" + escape(instance)
                + "\",\"status\":429,\"title\":\"" + TITLE + "\",\"type\":\"" + QUOTA_EXCEEDED
                + "\",\"violated-policies\":[\"" + escape(rule) + "\"]}";
    }

    private static String escape(String s) {
        StringBuilder b = new StringBuilder();
        for (char c : s.toCharArray()) {
            switch (c) {
                case '"' -> b.append("\\\"");
                case '\\' -> b.append("\\\\");
                case '\b' -> b.append("\\b");
                case '\f' -> b.append("\\f");
                case '\n' -> b.append("\\n");
                case '\r' -> b.append("\\r");
                case '\t' -> b.append("\\t");
                default -> {
                    if (c < 0x20) {
                        b.append(String.format("\\u%04x", (int) c));
                    } else {
                        b.append(c);
                    }
                }
            }
        }
        return b.toString();
    }
}

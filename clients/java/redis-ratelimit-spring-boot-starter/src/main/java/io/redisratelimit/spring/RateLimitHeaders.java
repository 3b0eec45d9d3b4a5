package io.redisratelimit.spring;

import io.redisratelimit.client.Decision;
import io.redisratelimit.client.Spec;

import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;

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
            Spec s = service.rules().get(n).rule().spec();
            if (policy.length() > 0) {
                policy.append(", ");
            }
            policy.append('"').append(n).append('"');
            if (s != null) {
                policy.append(";q=").append(s.limit());
                if (!s.concurrency()) {
                    // A concurrency cap has no window: the draft's "w" is left out.
                    policy.append(";w=").append(s.windowSeconds());
                }
            }
        }
        h.put("RateLimit-Policy", policy.toString());
        String reported = service.reported(names, d);
        h.put("RateLimit", "\"" + reported + "\";r=" + d.remaining() + ";t=" + d.resetSeconds());
        if (!d.allowed() && d.retryAfterSeconds().isPresent()) {
            h.put("Retry-After", Long.toString(d.retryAfterSeconds().getAsLong()));
        }
        return h;
    }

    public static String detail(String rule, Decision d) {
        return d.never() ? "rate limit \"" + rule + "\" exceeded; this request can never pass"
                : "rate limit \"" + rule + "\" exceeded; retry after " + d.retryAfterSeconds().getAsLong() + " s";
    }

    /** The problem body, for writers without Spring's message converters. */
    /** The 400 problem of a request whose key expression gave nothing ({@code ratelimit.missing-key: deny}). */
    public static String keyMissingJson(String rule, String expression, String instance) {
        return "{\"type\":\"about:blank\",\"title\":\"Bad Request\",\"status\":400,\"detail\":\""
                + escape("no rate-limit key: " + expression + " of rule \"" + rule + "\" gave nothing") + "\",\"instance\":\""
                + escape(instance) + "\"}";
    }

    public static String problemJson(String rule, Decision d) {
        return "{\"type\":\"" + QUOTA_EXCEEDED + "\",\"title\":\"" + TITLE + "\",\"status\":429,\"detail\":\""
                + escape(detail(rule, d)) + "\",\"violated-policies\":[\"" + escape(rule) + "\"]}";
    }

    /** The problem body with {@code instance}, the request's path, as the annotation's 429 has it. */
    public static String problemJson(String rule, Decision d, String instance) {
        return "{\"type\":\"" + QUOTA_EXCEEDED + "\",\"title\":\"" + TITLE + "\",\"status\":429,\"detail\":\""
                + escape(detail(rule, d)) + "\",\"instance\":\"" + escape(instance) + "\",\"violated-policies\":[\""
                + escape(rule) + "\"]}";
    }

    private static String escape(String s) {
        StringBuilder b = new StringBuilder();
        for (char c : s.toCharArray()) {
            switch (c) {
                case '"' -> b.append("\\\"");
                case '\\' -> b.append("\\\\");
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

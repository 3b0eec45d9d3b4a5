package io.redisratelimit.client;

import java.time.Instant;
import java.time.ZoneOffset;
import java.time.format.DateTimeFormatter;

/**
 * One denial, as shipped by {@link DenyEvents}: the contract's fields in its
 * order ({@code clients/contract/contract.json}, {@code observability.deny_events}).
 *
 * @param timestamp    when it was decided
 * @param key          the limiter key that denied (never the identity alone: the key the server counts)
 * @param rule         the rule's label, as in {@code ratelimit_decisions_total} (a policy rule: the policy's name)
 * @param level        the level that denied: {@code local}, {@code redis}, {@code deny_cache} or {@code fallback}
 * @param outcome      {@code denied} ({@code shadow_denied} is never seen by this kit: the server answers a shadow denial as allowed)
 * @param limit        the limiter's capacity or requests per window
 * @param remaining    units left
 * @param retryAfterMs the decision's {@code wait_ms}: -1 when the request can never pass
 * @param clientIp     from HTTP, null when unknown (left out of the line); cut to {@link #MAX_HEADER_BYTES}
 * @param userAgent    from HTTP, null when unknown (left out of the line); cut to {@link #MAX_HEADER_BYTES}
 */
public record DenyEvent(Instant timestamp, String key, String rule, String level, String outcome, long limit, long remaining,
                        long retryAfterMs, String clientIp, String userAgent) {

    private static final DateTimeFormatter RFC3339_MILLIS =
            DateTimeFormatter.ofPattern("uuuu-MM-dd'T'HH:mm:ss.SSS'Z'").withZone(ZoneOffset.UTC);

    /**
     * The most UTF-8 bytes of {@code clientIp} or {@code userAgent} an event
     * keeps (the contract's {@code max_header_bytes}): a full buffer of
     * events with huge headers would otherwise hold gigabytes.
     */
    public static final int MAX_HEADER_BYTES = 512;

    public DenyEvent {
        if (timestamp == null) {
            throw new InvalidArgumentException("timestamp", "a deny event has a time");
        }
        if (key == null) {
            throw new InvalidArgumentException("key", "a deny event has a key");
        }
        if (rule == null) {
            throw new InvalidArgumentException("rule", "a deny event has a rule");
        }
        if (level == null) {
            throw new InvalidArgumentException("level", "a deny event has a level");
        }
        if (outcome == null) {
            throw new InvalidArgumentException("outcome", "a deny event has an outcome");
        }
        clientIp = cut(clientIp);
        userAgent = cut(userAgent);
    }

    /**
     * {@code s} cut to at most {@link #MAX_HEADER_BYTES} bytes of UTF-8, at a
     * character boundary (a surrogate pair is never split); null stays null.
     */
    static String cut(String s) {
        if (s == null || s.length() <= MAX_HEADER_BYTES / 3) {
            return s; // at most 3 bytes per char: short enough without counting
        }
        int bytes = 0;
        int i = 0;
        while (i < s.length()) {
            int cp = s.codePointAt(i);
            // A lone surrogate is counted as 3 bytes, more than the '?' it is encoded as.
            int n = cp < 0x80 ? 1 : cp < 0x800 ? 2 : cp < 0x10000 ? 3 : 4;
            if (bytes + n > MAX_HEADER_BYTES) {
                return s.substring(0, i);
            }
            bytes += n;
            i += Character.charCount(cp);
        }
        return s;
    }

    /** The contract's timestamp: RFC 3339 in UTC with milliseconds, as {@code 2026-12-02T10:00:00.123Z}. */
    public String timestampText() {
        return RFC3339_MILLIS.format(timestamp);
    }

    /** One JSON object, the fields in the contract's order, an unknown optional field left out; no line end. */
    public String toJson() {
        StringBuilder b = new StringBuilder(192);
        b.append("{\"timestamp\":\"").append(timestampText()).append('"');
        b.append(",\"key\":");
        string(b, key);
        b.append(",\"rule\":");
        string(b, rule);
        b.append(",\"level\":");
        string(b, level);
        b.append(",\"outcome\":");
        string(b, outcome);
        b.append(",\"limit\":").append(limit);
        b.append(",\"remaining\":").append(remaining);
        b.append(",\"retry_after_ms\":").append(retryAfterMs);
        if (clientIp != null) {
            b.append(",\"client_ip\":");
            string(b, clientIp);
        }
        if (userAgent != null) {
            b.append(",\"user_agent\":");
            string(b, userAgent);
        }
        return b.append('}').toString();
    }

    /** A JSON string: quotes, backslashes and control characters escaped (keys and user agents are anyone's bytes). */
    static void string(StringBuilder b, String s) {
        b.append('"');
        for (int i = 0; i < s.length(); i++) {
            char c = s.charAt(i);
            switch (c) {
                case '"' -> b.append("\\\"");
                case '\\' -> b.append("\\\\");
                case '\n' -> b.append("\\n");
                case '\r' -> b.append("\\r");
                case '\t' -> b.append("\\t");
                default -> {
                    if (c < 0x20 || c == 0x2028 || c == 0x2029) {
                        b.append(String.format("\\u%04x", (int) c));
                    } else {
                        b.append(c);
                    }
                }
            }
        }
        b.append('"');
    }
}

package io.redisratelimit.spring.web;

import io.redisratelimit.client.Origin;
import jakarta.servlet.http.HttpServletRequest;
import org.springframework.web.context.request.RequestAttributes;
import org.springframework.web.context.request.RequestContextHolder;
import org.springframework.web.context.request.ServletRequestAttributes;

/**
 * The servlet request being served on this thread, as a deny event's origin ({@code @RateLimited} methods).
 *
 * <p>{@code client_ip} is {@link HttpServletRequest#getRemoteAddr()}, the connection's peer, never a raw
 * {@code X-Forwarded-For}, which any client can write. Behind a proxy, set
 * {@code server.forward-headers-strategy} ({@code native} or {@code framework}): the container or Spring's
 * {@code ForwardedHeaderFilter} then gives the forwarded client of trusted proxies as the remote address.
 */
public final class ServletOrigin {
    private ServletOrigin() {
    }

    /** Its client address and user agent, or {@link Origin#UNKNOWN} outside a servlet request. */
    public static Origin current() {
        RequestAttributes a = RequestContextHolder.getRequestAttributes();
        if (a instanceof ServletRequestAttributes s) {
            HttpServletRequest r = s.getRequest();
            return Origin.of(r.getRemoteAddr(), r.getHeader("User-Agent"));
        }
        return Origin.UNKNOWN;
    }
}

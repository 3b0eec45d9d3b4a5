package io.redisratelimit.spring.reactive;

import io.redisratelimit.client.Decision;
import io.redisratelimit.spring.RateLimitHeaders;
import io.redisratelimit.spring.RateLimitRules;
import io.redisratelimit.spring.RateLimitService;
import io.redisratelimit.spring.RouteMatcher;
import org.springframework.core.io.buffer.DataBuffer;
import org.springframework.http.HttpStatus;
import org.springframework.http.MediaType;
import org.springframework.http.server.reactive.ServerHttpRequest;
import org.springframework.http.server.reactive.ServerHttpResponse;
import org.springframework.web.server.ServerWebExchange;
import org.springframework.web.server.WebFilter;
import org.springframework.web.server.WebFilterChain;
import reactor.core.publisher.Mono;

import java.net.InetSocketAddress;
import java.nio.charset.StandardCharsets;
import java.util.List;

/**
 * Route-level rules for WebFlux, as the servlet interceptor does them, without
 * blocking: the rules whose {@code routes} match are checked together with
 * one asynchronous call, keyed by {@code key} (SpEL over {@code #request}, a
 * {@link ServerHttpRequest}; the client's address by default). A rule that
 * caps concurrency holds its lease until the response completes, fails or
 * is cancelled.
 */
public class RateLimitWebFilter implements WebFilter {
    private final RateLimitService service;
    private final boolean headers;
    private final RouteMatcher routes;

    public RateLimitWebFilter(RateLimitService service, boolean headers) {
        this.service = service;
        this.headers = headers;
        this.routes = new RouteMatcher(service);
    }

    @Override
    public Mono<Void> filter(ServerWebExchange exchange, WebFilterChain chain) {
        if (!service.enabled()) {
            return chain.filter(exchange);
        }
        ServerHttpRequest request = exchange.getRequest();
        String path = request.getPath().pathWithinApplication().value();
        RouteMatcher.Match match = routes.match(request.getMethod().name(), path, request, () -> peer(request));
        if (match.missingKey() != null) {
            RateLimitRules.Entry e = match.missingKey();
            ServerHttpResponse response = exchange.getResponse();
            response.setStatusCode(HttpStatus.BAD_REQUEST);
            response.getHeaders().setContentType(MediaType.APPLICATION_PROBLEM_JSON);
            byte[] body = RateLimitHeaders.keyMissingJson(e.name(), e.keyExpression(), path).getBytes(StandardCharsets.UTF_8);
            return response.writeWith(Mono.just(response.bufferFactory().wrap(body)));
        }
        if (match.none()) {
            return chain.filter(exchange);
        }
        List<String> names = match.names();
        String degrading = service.degrading(names, false);
        if (degrading != null) {
            return deny(exchange.getResponse(), names, service.degraded(degrading), path);
        }
        return Mono.fromCompletionStage(service.admitAsync(names, match.identities(), match.cost(), origin(exchange))).flatMap(permit -> {
            Decision d = permit.decision();
            ServerHttpResponse response = exchange.getResponse();
            if (d.allowed()) {
                if (headers) {
                    RateLimitHeaders.of(service, names, d).forEach(response.getHeaders()::set);
                }
                Mono<Void> counted = chain.filter(exchange)
                        .doOnSuccess(v -> service.recordOutcome(names, service.isError(status(response), null)))
                        .doOnError(e -> service.recordOutcome(names, service.isError(status(response), e)));
                if (permit.leases().isEmpty()) {
                    return counted;
                }
                // Held until the response is written, or the exchange fails or is cancelled.
                return counted.doFinally(signal -> permit.releaseAsync());
            }
            return deny(response, names, d, path);
        });
    }

    private Mono<Void> deny(ServerHttpResponse response, List<String> names, Decision d, String path) {
        RateLimitHeaders.of(service, names, d).forEach(response.getHeaders()::set);
        response.setStatusCode(HttpStatus.TOO_MANY_REQUESTS);
        response.getHeaders().setContentType(MediaType.APPLICATION_PROBLEM_JSON);
        byte[] body = RateLimitHeaders.problemJson(service.reported(names, d), d, path).getBytes(StandardCharsets.UTF_8);
        DataBuffer buffer = response.bufferFactory().wrap(body);
        return response.writeWith(Mono.just(buffer));
    }

    private static int status(ServerHttpResponse response) {
        return response.getStatusCode() == null ? 200 : response.getStatusCode().value();
    }

    /**
     * The client's address and user agent, for the request's deny events: the peer address, never a raw
     * {@code X-Forwarded-For} (anyone can write it); behind a proxy, {@code server.forward-headers-strategy}
     * makes it the forwarded client of trusted proxies ({@code ForwardedHeaderTransformer}).
     */
    private static io.redisratelimit.client.Origin origin(ServerWebExchange exchange) {
        ServerHttpRequest request = exchange.getRequest();
        InetSocketAddress remote = request.getRemoteAddress();
        String ip = remote == null ? null : remote.getAddress() == null ? remote.getHostString() : remote.getAddress().getHostAddress();
        return io.redisratelimit.client.Origin.of(ip, request.getHeaders().getFirst("User-Agent"));
    }

    /** The client's address: the key of a rule without a key expression. */
    private static String peer(ServerHttpRequest request) {
        InetSocketAddress remote = request.getRemoteAddress();
        return remote == null ? "-" : remote.getAddress() == null ? remote.getHostString() : remote.getAddress().getHostAddress();
    }
}

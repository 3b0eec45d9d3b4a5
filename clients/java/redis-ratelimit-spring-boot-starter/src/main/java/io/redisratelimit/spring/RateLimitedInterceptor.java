package io.redisratelimit.spring;

import io.redisratelimit.client.Decision;
import org.aopalliance.intercept.MethodInterceptor;
import org.aopalliance.intercept.MethodInvocation;
import org.springframework.aop.support.AopUtils;
import org.springframework.context.expression.MethodBasedEvaluationContext;
import org.springframework.core.DefaultParameterNameDiscoverer;
import org.springframework.core.ParameterNameDiscoverer;
import org.springframework.core.annotation.AnnotatedElementUtils;
import org.springframework.expression.Expression;
import org.springframework.expression.spel.standard.SpelExpressionParser;
import org.springframework.util.ClassUtils;

import java.lang.reflect.Method;
import java.util.List;
import java.util.Map;
import java.util.concurrent.CompletionStage;
import java.util.concurrent.ConcurrentHashMap;

/**
 * The advice behind {@link RateLimited}: evaluates the key per call, decides,
 * throws on a denial, and holds the leases of concurrency rules while the call
 * works.
 */
public class RateLimitedInterceptor implements MethodInterceptor {
    /** Told of every decision of an annotated call, e.g. to write the response's headers. */
    public interface DecisionHook {
        void decided(List<String> rules, Decision decision);
    }

    private final RateLimitService service;
    private final List<DecisionHook> hooks;
    private final SpelExpressionParser parser = new SpelExpressionParser();
    private final ParameterNameDiscoverer names = new DefaultParameterNameDiscoverer();
    private final Map<String, Expression> expressions = new ConcurrentHashMap<>();

    public RateLimitedInterceptor(RateLimitService service, List<DecisionHook> hooks) {
        this.service = service;
        this.hooks = List.copyOf(hooks);
    }

    @Override
    public Object invoke(MethodInvocation invocation) throws Throwable {
        Method method = invocation.getMethod();
        Class<?> target = invocation.getThis() == null ? method.getDeclaringClass() : AopUtils.getTargetClass(invocation.getThis());
        Method specific = AopUtils.getMostSpecificMethod(method, target);
        RateLimited a = AnnotatedElementUtils.findMergedAnnotation(specific, RateLimited.class);
        if (a == null) {
            a = AnnotatedElementUtils.findMergedAnnotation(target, RateLimited.class);
        }
        if (a == null || !service.enabled()) {
            return invocation.proceed();
        }
        List<String> rules = List.of(a.rule());
        String degrading = service.degrading(rules, !a.core());
        if (degrading != null) {
            // Not decided: a non-core feature at stage 1 or more calls no Redis.
            Decision d = service.degraded(degrading);
            return denied(invocation, target, specific, a, new RateLimitExceededException(rules, degrading, d));
        }
        String identity = "-";
        if (!a.key().isEmpty()) {
            Expression e = expressions.computeIfAbsent(a.key(), parser::parseExpression);
            MethodBasedEvaluationContext ctx = new MethodBasedEvaluationContext(invocation.getThis(), specific,
                    invocation.getArguments(), names);
            Object v = e.getValue(ctx);
            if (v == null || v.toString().isEmpty()) {
                if (service.keyMissing(rules, a.key()) == RateLimitService.MissingKey.ADMIT) {
                    return invocation.proceed();
                }
                throw new RateLimitKeyMissingException(rules, a.key());
            }
            identity = v.toString();
        }
        Permit permit = service.admit(rules, java.util.Collections.nCopies(rules.size(), identity), a.cost(), origin());
        Decision d = permit.decision();
        for (DecisionHook h : hooks) {
            h.decided(rules, d);
        }
        if (!d.allowed()) {
            return denied(invocation, target, specific, a, new RateLimitExceededException(rules, service.reported(rules, d), d));
        }
        Object result;
        try {
            result = invocation.proceed();
        } catch (Throwable t) {
            service.recordOutcome(rules, service.isError(-1, t));
            permit.close();
            throw t;
        }
        return releasedWhenDone(counted(result, rules), permit);
    }

    /** A denied or degraded call: its fallback's answer, or the denial thrown. */
    private static Object denied(MethodInvocation invocation, Class<?> target, Method specific, RateLimited a,
                                 RateLimitExceededException denial) throws Throwable {
        if (a.fallback().isEmpty()) {
            throw denial;
        }
        Method fallback = RateLimitFallbacks.resolve(target, specific, a.fallback());
        return RateLimitFallbacks.invoke(fallback, invocation.getThis(), invocation.getArguments(), denial);
    }

    /**
     * Counts the call's outcome for the loop when it finishes: now, or when
     * its {@link CompletionStage} or Reactor publisher completes. A
     * {@code ResponseEntity} gives its status.
     */
    private Object counted(Object result, List<String> rules) {
        if (result instanceof CompletionStage<?> stage) {
            return stage.whenComplete((v, e) -> service.recordOutcome(rules, service.isError(status(v), e)));
        }
        if (REACTOR && result != null) {
            Object watched = Reactive.counted(result, service, rules);
            if (watched != null) {
                return watched;
            }
        }
        service.recordOutcome(rules, service.isError(status(result), null));
        return result;
    }

    private static int status(Object result) {
        if (WEB && result instanceof org.springframework.http.ResponseEntity<?> r) {
            return r.getStatusCode().value();
        }
        return -1;
    }

    private static final boolean WEB = ClassUtils.isPresent("org.springframework.http.ResponseEntity", RateLimitedInterceptor.class.getClassLoader());

    /**
     * The leases of a concurrency rule are held while the call works: until it
     * returns, or, for a {@link CompletionStage} or a Reactor {@code Mono} or
     * {@code Flux}, until that completes, fails or is cancelled.
     */
    static Object releasedWhenDone(Object result, Permit permit) {
        if (result instanceof CompletionStage<?> stage) {
            return stage.whenComplete((v, e) -> permit.releaseAsync());
        }
        if (REACTOR && result != null) {
            Object held = Reactive.releasedWhenDone(result, permit);
            if (held != null) {
                return held;
            }
        }
        permit.close();
        return result;
    }

    private static final boolean REACTOR = ClassUtils.isPresent("reactor.core.publisher.Mono", RateLimitedInterceptor.class.getClassLoader());

    /** Kept apart so that Reactor's classes load only when they are there. */
    static final class Reactive {
        private Reactive() {
        }

        static Object releasedWhenDone(Object result, Permit permit) {
            if (result instanceof reactor.core.publisher.Mono<?> mono) {
                return mono.doFinally(signal -> permit.releaseAsync());
            }
            if (result instanceof reactor.core.publisher.Flux<?> flux) {
                return flux.doFinally(signal -> permit.releaseAsync());
            }
            return null;
        }

        static Object counted(Object result, RateLimitService service, List<String> rules) {
            if (result instanceof reactor.core.publisher.Mono<?> mono) {
                return mono.doOnSuccess(v -> service.recordOutcome(rules, service.isError(status(v), null)))
                        .doOnError(e -> service.recordOutcome(rules, service.isError(-1, e)));
            }
            if (result instanceof reactor.core.publisher.Flux<?> flux) {
                return flux.doOnComplete(() -> service.recordOutcome(rules, false))
                        .doOnError(e -> service.recordOutcome(rules, service.isError(-1, e)));
            }
            return null;
        }
    }

    /** Servlet classes on the class path: an {@code @RateLimited} call on a request's thread takes its origin. */
    private static final boolean SERVLET = org.springframework.util.ClassUtils.isPresent(
            "org.springframework.web.context.request.ServletRequestAttributes", RateLimitedInterceptor.class.getClassLoader())
            && org.springframework.util.ClassUtils.isPresent("jakarta.servlet.http.HttpServletRequest",
            RateLimitedInterceptor.class.getClassLoader());

    /** The client's IP and user agent of the servlet request on this thread, for its deny events; unknown elsewhere. */
    private static io.redisratelimit.client.Origin origin() {
        return SERVLET ? io.redisratelimit.spring.web.ServletOrigin.current() : io.redisratelimit.client.Origin.UNKNOWN;
    }
}

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

import java.lang.reflect.Method;
import java.util.List;
import java.util.Map;
import java.util.concurrent.ConcurrentHashMap;

/** The advice behind {@link RateLimited}: evaluates the key per call, decides, throws on a denial. */
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
        if (a == null) {
            return invocation.proceed();
        }
        List<String> rules = List.of(a.rule());
        String identity = "-";
        if (!a.key().isEmpty()) {
            Expression e = expressions.computeIfAbsent(a.key(), parser::parseExpression);
            MethodBasedEvaluationContext ctx = new MethodBasedEvaluationContext(invocation.getThis(), specific,
                    invocation.getArguments(), names);
            Object v = e.getValue(ctx);
            identity = v == null ? "-" : v.toString();
            if (identity.isEmpty()) {
                identity = "-";
            }
        }
        Decision d = service.check(rules, identity, a.cost());
        for (DecisionHook h : hooks) {
            h.decided(rules, d);
        }
        if (!d.allowed()) {
            throw new RateLimitExceededException(rules, service.reported(rules, d), d);
        }
        return invocation.proceed();
    }
}

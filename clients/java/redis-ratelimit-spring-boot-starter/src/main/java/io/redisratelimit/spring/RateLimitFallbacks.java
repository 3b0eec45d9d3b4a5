package io.redisratelimit.spring;

import org.springframework.util.ClassUtils;
import org.springframework.util.ReflectionUtils;

import java.lang.reflect.InvocationTargetException;
import java.lang.reflect.Method;
import java.lang.reflect.Modifier;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;
import java.util.Map;
import java.util.concurrent.ConcurrentHashMap;
import java.util.stream.Collectors;

/**
 * Resolves {@code @RateLimited(fallback = "name")}: a method of the bean's
 * class (or a superclass), any visibility, static or not, taking the limited
 * method's parameter types, optionally followed by one parameter that a
 * {@link RateLimitExceededException} is assignable to, and returning a type
 * assignable to the limited method's. The form with the exception wins when
 * both exist.
 */
public final class RateLimitFallbacks {
    private static final Map<Method, Method> RESOLVED = new ConcurrentHashMap<>();

    private RateLimitFallbacks() {
    }

    /** The fallback of {@code method} in {@code type}, or a {@link RateLimitConfigException} naming it and saying why. */
    public static Method resolve(Class<?> type, Method method, String name) {
        Method cached = RESOLVED.get(method);
        if (cached != null && cached.getName().equals(name)) {
            return cached;
        }
        Method found = find(type, method, name);
        RESOLVED.put(method, found);
        return found;
    }

    private static Method find(Class<?> type, Method method, String name) {
        String where = "@RateLimited(fallback = \"" + name + "\") on " + describe(type, method);
        Class<?>[] params = method.getParameterTypes();
        List<Method> named = new ArrayList<>();
        ReflectionUtils.doWithMethods(type, named::add, m -> m.getName().equals(name) && !m.isBridge());
        if (named.isEmpty()) {
            throw new RateLimitConfigException(where, "no method " + name + " in " + type.getName() + "; declare "
                    + signature(method.getReturnType(), name, params) + " (optionally with a last RateLimitExceededException parameter)", null);
        }
        Method exact = null;
        Method withException = null;
        for (Method m : named) {
            Class<?>[] p = m.getParameterTypes();
            if (Arrays.equals(p, params)) {
                exact = m;
            } else if (p.length == params.length + 1 && Arrays.equals(Arrays.copyOf(p, params.length), params)
                    && p[params.length].isAssignableFrom(RateLimitExceededException.class)) {
                withException = m;
            }
        }
        Method chosen = withException != null ? withException : exact;
        if (chosen == null) {
            throw new RateLimitConfigException(where, "the signature of " + named.stream().map(m -> signature(m.getReturnType(), name,
                    m.getParameterTypes())).collect(Collectors.joining(", ")) + " does not fit: it must take " + types(params)
                    + " (optionally followed by a RateLimitExceededException)", null);
        }
        if (!ClassUtils.isAssignable(method.getReturnType(), chosen.getReturnType())) {
            throw new RateLimitConfigException(where, "the signature of " + signature(chosen.getReturnType(), name, chosen.getParameterTypes())
                    + " does not fit: it returns " + chosen.getReturnType().getSimpleName() + ", which is not a "
                    + method.getReturnType().getSimpleName() + " (what " + method.getName() + " returns)", null);
        }
        ReflectionUtils.makeAccessible(chosen);
        return chosen;
    }

    /** Calls the fallback for a denied (or degraded) call; what it throws is thrown as is. */
    public static Object invoke(Method fallback, Object target, Object[] args, RateLimitExceededException denial) throws Throwable {
        Object[] with = args;
        if (fallback.getParameterCount() == args.length + 1) {
            with = Arrays.copyOf(args, args.length + 1);
            with[args.length] = denial;
        }
        try {
            return fallback.invoke(Modifier.isStatic(fallback.getModifiers()) ? null : target, with);
        } catch (InvocationTargetException e) {
            throw e.getCause();
        }
    }

    private static String describe(Class<?> type, Method m) {
        return ClassUtils.getShortName(type) + "." + m.getName() + types(m.getParameterTypes());
    }

    private static String signature(Class<?> returns, String name, Class<?>[] params) {
        return returns.getSimpleName() + " " + name + types(params);
    }

    private static String types(Class<?>[] params) {
        return Arrays.stream(params).map(Class::getSimpleName).collect(Collectors.joining(", ", "(", ")"));
    }
}

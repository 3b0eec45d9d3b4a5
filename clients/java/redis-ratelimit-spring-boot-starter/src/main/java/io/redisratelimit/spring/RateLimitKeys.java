package io.redisratelimit.spring;

import org.springframework.expression.spel.SpelNode;
import org.springframework.expression.spel.ast.VariableReference;
import org.springframework.expression.spel.standard.SpelExpression;
import org.springframework.expression.spel.standard.SpelExpressionParser;

import java.lang.reflect.Method;
import java.util.ArrayList;
import java.util.List;
import java.util.Set;

/**
 * The checks of key expressions made at start-up: every {@code #variable} an
 * expression names must exist where it is evaluated, since one that does not
 * evaluates to null on every call and would put every caller on one key.
 */
final class RateLimitKeys {
    private static final SpelExpressionParser PARSER = new SpelExpressionParser();

    private RateLimitKeys() {
    }

    /** The variables an expression names ({@code #user} gives {@code user}), {@code #root} and {@code #this} left out. */
    static List<String> variables(String expression) {
        List<String> out = new ArrayList<>();
        collect(((SpelExpression) PARSER.parseExpression(expression)).getAST(), out);
        out.removeAll(Set.of("root", "this"));
        return out;
    }

    private static void collect(SpelNode node, List<String> out) {
        if (node instanceof VariableReference) {
            out.add(node.toStringAST().substring(1));
        }
        for (int i = 0; i < node.getChildCount(); i++) {
            collect(node.getChild(i), out);
        }
    }

    /**
     * Checks {@code @RateLimited(key = ...)} on {@code method}: each variable is
     * one of its parameters by name ({@code -parameters}), or {@code #p0} /
     * {@code #a0}. A failure names the method, the expression and what it can use.
     */
    static void checkAnnotated(Method method, String expression, String[] parameterNames) {
        if (expression.isEmpty()) {
            return;
        }
        int n = method.getParameterCount();
        List<String> known = new ArrayList<>();
        for (int i = 0; i < n; i++) {
            known.add("p" + i);
            known.add("a" + i);
            if (parameterNames != null) {
                known.add(parameterNames[i]);
            }
        }
        String where = method.getDeclaringClass().getName() + "." + method.getName();
        List<String> used;
        try {
            used = variables(expression);
        } catch (org.springframework.expression.ParseException e) {
            throw new RateLimitConfigException("@RateLimited(key = \"" + expression + "\") on " + where, e.getMessage(), e);
        }
        for (String v : used) {
            if (!known.contains(v)) {
                String names = parameterNames == null
                        ? "the parameters' names are not in the class file (compile with -parameters), so only #p0.. or #a0.. can be used"
                        : "its parameters are " + List.of(parameterNames).stream().map(s -> "#" + s).toList() + " (or #p0..)";
                throw new RateLimitConfigException("@RateLimited(key = \"" + expression + "\") on " + where,
                        "#" + v + " names no parameter of the method, so the key would be null on every call; " + names, null);
            }
        }
    }

    /** Checks a route rule's {@code key}: its only variable is {@code #request}. */
    static void checkRoute(String property, String expression) {
        List<String> used;
        try {
            used = variables(expression);
        } catch (org.springframework.expression.ParseException e) {
            throw new RateLimitConfigException(property, e.getMessage(), e);
        }
        for (String v : used) {
            if (!v.equals("request")) {
                throw new RateLimitConfigException(property, "#" + v + " is not known here: a route rule's key is SpEL over #request"
                        + " (the HttpServletRequest, or WebFlux's ServerHttpRequest)", null);
            }
        }
    }
}

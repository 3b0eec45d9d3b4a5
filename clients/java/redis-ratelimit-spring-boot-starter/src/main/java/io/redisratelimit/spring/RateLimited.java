package io.redisratelimit.spring;

import java.lang.annotation.Documented;
import java.lang.annotation.ElementType;
import java.lang.annotation.Retention;
import java.lang.annotation.RetentionPolicy;
import java.lang.annotation.Target;

/**
 * Limits calls of a method (a controller's or any bean's) under rules of
 * {@code ratelimit.rules}: {@code @RateLimited(rule = "order-create", key = "#userId")}.
 * Several rules are decided together, all or nothing, in one {@code RL.ALL}.
 * A denial throws {@link RateLimitExceededException}; in a web application the
 * starter answers it with 429, {@code Retry-After} and the IETF fields.
 */
@Target({ElementType.METHOD, ElementType.TYPE})
@Retention(RetentionPolicy.RUNTIME)
@Documented
public @interface RateLimited {
    /** The rules' names in {@code ratelimit.rules}. */
    String[] rule();

    /**
     * SpEL giving the identity (a user, a tenant): the method's parameters by
     * name ({@code #userId}, {@code #order.customerId}) or position ({@code #p0}).
     * Empty: one identity for every call. A rule with a {@code fixed-key} ignores it.
     */
    String key() default "";

    /** Units one call takes. */
    long cost() default 1;

    /**
     * The degrade handler: a method of the same bean, by name, that answers
     * instead of the denial (a cached or default answer), as Sentinel's
     * {@code blockHandler} and Resilience4j's {@code fallbackMethod}. It takes
     * the method's parameters, optionally followed by the
     * {@link RateLimitExceededException} (or a supertype), and returns what
     * the method returns. Checked at start-up: a missing method, or one whose
     * signature does not fit, fails the application's start with its name.
     */
    String fallback() default "";

    /**
     * false: a non-core feature. While a rule's stage (the protection loop's,
     * {@code ratelimit.rules.<rule>.stages}) is 1 or more, the call is not
     * decided (no call to Redis): it answers with {@link #fallback()}, or is
     * denied when there is none.
     */
    boolean core() default true;
}

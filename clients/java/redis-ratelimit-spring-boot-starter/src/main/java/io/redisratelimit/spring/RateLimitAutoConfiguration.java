package io.redisratelimit.spring;

import io.micrometer.core.instrument.MeterRegistry;
import io.redisratelimit.client.Client;
import io.redisratelimit.client.DenyEventSink;
import io.redisratelimit.client.DenyEvents;
import io.redisratelimit.client.FallbackMode;
import io.redisratelimit.client.InvalidArgumentException;
import io.redisratelimit.client.Limiter;
import io.redisratelimit.client.driver.Driver;
import io.redisratelimit.spring.web.RateLimitExceptionHandler;
import io.redisratelimit.spring.web.RateLimitHandlerInterceptor;
import io.redisratelimit.spring.web.ServletHeadersHook;
import org.springframework.aop.support.DefaultPointcutAdvisor;
import org.springframework.aop.support.ComposablePointcut;
import org.springframework.aop.support.annotation.AnnotationMatchingPointcut;
import org.springframework.beans.factory.ObjectProvider;
import org.springframework.beans.factory.config.BeanDefinition;
import org.springframework.boot.autoconfigure.AutoConfiguration;
import org.springframework.boot.autoconfigure.condition.ConditionalOnClass;
import org.springframework.boot.autoconfigure.condition.ConditionalOnMissingBean;
import org.springframework.boot.autoconfigure.condition.ConditionalOnProperty;
import org.springframework.boot.autoconfigure.condition.ConditionalOnWebApplication;
import org.springframework.boot.autoconfigure.data.redis.RedisAutoConfiguration;
import org.springframework.boot.autoconfigure.data.redis.RedisProperties;
import org.springframework.boot.context.properties.EnableConfigurationProperties;
import org.springframework.boot.context.properties.bind.Binder;
import org.springframework.context.ApplicationListener;
import org.springframework.context.annotation.Bean;
import org.springframework.context.annotation.Configuration;
import org.springframework.context.annotation.Role;
import org.springframework.core.env.Environment;
import org.springframework.web.servlet.config.annotation.InterceptorRegistry;
import org.springframework.web.servlet.config.annotation.WebMvcConfigurer;

import java.util.function.Supplier;

/**
 * Configures the kit from {@code ratelimit.*} and {@code spring.data.redis.*}:
 * the client (with its {@code MODULE LIST} check), the limiter, the rules
 * pushed as policies, {@code @RateLimited}, the servlet interceptor, the 429
 * handler and the Micrometer meters. Every bean can be replaced.
 */
@AutoConfiguration(after = RedisAutoConfiguration.class)
@ConditionalOnProperty(prefix = "ratelimit", name = "enabled", havingValue = "true", matchIfMissing = true)
@EnableConfigurationProperties({RateLimitProperties.class, RedisProperties.class})
public class RateLimitAutoConfiguration {

    static String app(Environment env, RateLimitProperties p) {
        if (p.getApp() != null && !p.getApp().isBlank()) {
            return p.getApp();
        }
        return env.getProperty("spring.application.name", "app");
    }

    /** The rules as the environment has them now (read again on every refresh). */
    static Supplier<RateLimitRules> rulesFromEnvironment(Environment env) {
        return () -> {
            RateLimitProperties p = Binder.get(env).bind("ratelimit", RateLimitProperties.class).orElseGet(RateLimitProperties::new);
            return RateLimitRules.from(app(env, p), p.getRules());
        };
    }

    @Bean(destroyMethod = "close")
    @ConditionalOnMissingBean
    public Driver rateLimitDriver(RateLimitProperties p, RedisProperties redis) {
        java.util.function.Supplier<Driver> open = () -> RedisDrivers.create(p.getDriver(), redis);
        Driver d = null;
        try {
            d = open.get();
            // Opened and checked now; a server without the module fails the start-up here.
            Client.connect(d, java.time.Duration.ofSeconds(10));
            return d;
        } catch (io.redisratelimit.client.RedisUnavailableException | io.redisratelimit.client.RateLimitTimeoutException e) {
            if (d != null) {
                d.close();
            }
            // Redis is away: start in the fallback, and connect (and push the policies) when it answers.
            System.getLogger(RateLimitAutoConfiguration.class.getName()).log(System.Logger.Level.WARNING,
                    "redis-ratelimit: cannot reach " + RedisDrivers.describe(redis) + " at start-up (" + e.getMessage()
                            + "): starting in the fallback (" + p.getFallback() + "); the policies are pushed when Redis answers");
            return new io.redisratelimit.client.driver.DeferredDriver(open, RedisDrivers.cluster(redis), java.time.Duration.ofSeconds(1));
        } catch (io.redisratelimit.client.ModuleMissingException e) {
            d.close();
            throw new io.redisratelimit.client.ModuleMissingException(RedisDrivers.describe(redis) + ": " + e.getMessage());
        } catch (RuntimeException e) {
            if (d != null) {
                d.close();
            }
            throw e;
        }
    }

    /** The driver bean closes the connection; the client and limiter over it close nothing of their own. */
    @Bean(destroyMethod = "")
    @ConditionalOnMissingBean
    public Client rateLimitClient(Driver driver, RateLimitProperties p) {
        if (p.getDeadline() == null || p.getDeadline().isZero() || p.getDeadline().isNegative()) {
            throw new RateLimitConfigException("ratelimit.deadline", "must be above 0", null);
        }
        if (driver instanceof io.redisratelimit.client.driver.DeferredDriver deferred && !deferred.connected()) {
            return Client.connecting(driver, p.getDeadline());
        }
        return Client.connect(driver, p.getDeadline());
    }

    /**
     * Deny events, when {@code ratelimit.deny-events.sink} is {@code file} or
     * {@code bulk}, or the application has a {@link DenyEventSink} bean (a
     * callback); none otherwise (a null bean). Closed with the context: what
     * is buffered is shipped, within the timeout.
     */
    @Bean(destroyMethod = "close")
    @ConditionalOnMissingBean
    public DenyEvents rateLimitDenyEvents(RateLimitProperties p, ObjectProvider<DenyEventSink> sinks) {
        RateLimitProperties.DenyEvents d = p.getDenyEvents();
        String kind = d.getSink() == null ? "none" : d.getSink().trim().toLowerCase(java.util.Locale.ROOT);
        DenyEventSink sink;
        try {
            sink = switch (kind) {
                case "none" -> sinks.getIfAvailable();
                case "file" -> {
                    if (d.getFile() == null || d.getFile().isBlank()) {
                        throw new RateLimitConfigException("ratelimit.deny-events.file", "the file sink needs a path", null);
                    }
                    java.nio.file.Path file;
                    try {
                        file = java.nio.file.Path.of(d.getFile());
                    } catch (java.nio.file.InvalidPathException e) {
                        throw new RateLimitConfigException("ratelimit.deny-events.file", "not a path: " + e.getMessage(), e);
                    }
                    yield DenyEventSink.file(file);
                }
                case "bulk" -> {
                    if (d.getUrl() == null || d.getUrl().isBlank()) {
                        throw new RateLimitConfigException("ratelimit.deny-events.url", "the bulk sink needs a URL, as http://host:9200", null);
                    }
                    java.net.URI url;
                    try {
                        url = java.net.URI.create(d.getUrl().trim());
                    } catch (IllegalArgumentException e) {
                        throw new RateLimitConfigException("ratelimit.deny-events.url", "not a URL: " + e.getMessage(), e);
                    }
                    yield DenyEventSink.bulk(url, d.getIndex(), d.getTimeout());
                }
                default -> throw new RateLimitConfigException("ratelimit.deny-events.sink", "must be none, file or bulk, got '"
                        + d.getSink() + "'", null);
            };
            if (sink == null) {
                return null;
            }
            return DenyEvents.builder(sink).capacity(d.getCapacity()).flushEvents(d.getFlushEvents())
                    .flushInterval(d.getFlushInterval()).timeout(d.getTimeout()).build();
        } catch (InvalidArgumentException e) {
            throw new RateLimitConfigException("ratelimit.deny-events." + e.parameter(), e.reason(), e);
        }
    }

    @Bean(destroyMethod = "")
    @ConditionalOnMissingBean
    public Limiter rateLimitLimiter(Client client, RateLimitProperties p, ObjectProvider<DenyEvents> denyEvents) {
        FallbackMode fallback;
        try {
            fallback = FallbackMode.parse(p.getFallback());
        } catch (InvalidArgumentException e) {
            throw new RateLimitConfigException("ratelimit.fallback", e.reason(), e);
        }
        if (p.getInstances() < 1) {
            throw new RateLimitConfigException("ratelimit.instances", "must be at least 1, got " + p.getInstances(), null);
        }
        if (p.getBreaker().getFailures() < 1) {
            throw new RateLimitConfigException("ratelimit.breaker.failures", "must be at least 1", null);
        }
        return Limiter.builder(client).instances(p.getInstances()).localLevel(p.isLocalLevel())
                .denyCache(p.getDenyCache().isEnabled()).denyCacheMax(p.getDenyCache().getMax())
                .denyCacheCapacity(p.getDenyCache().getCapacity()).fallback(fallback)
                .breaker(p.getBreaker().getFailures(), p.getBreaker().getOpenFor())
                .denyEvents(denyEvents.getIfAvailable()).build();
    }

    @Bean
    @ConditionalOnMissingBean
    public RateLimitService rateLimitService(Limiter limiter, Environment env, ObjectProvider<RateLimitService.Listener> listeners,
                                             RateLimitProperties p) {
        RateLimitService service = new RateLimitService(limiter, rulesFromEnvironment(env), listeners.orderedStream().toList());
        service.missingKey(RateLimitService.MissingKey.parse(p.getMissingKey()));
        if (limiter.client().driver() instanceof io.redisratelimit.client.driver.DeferredDriver deferred && !deferred.connected()) {
            // The rules were checked when the service read them; they reach the server once it answers.
            deferred.onConnected(service::sync);
        } else {
            service.sync();
        }
        return service;
    }

    /**
     * The protection loop: the outcomes of requests the rules with a loop
     * ({@code adapt}, {@code stages}) admitted are sent with RL.OUTCOME and
     * their stages read in the background; at stage 2 the Resilience4j
     * breakers those rules name are forced open (from the application's
     * {@code CircuitBreakerRegistry}, or a registry of the starter's own when
     * it has none).
     */
    @Bean(destroyMethod = "close")
    @ConditionalOnMissingBean
    public io.redisratelimit.client.Protection rateLimitProtection(RateLimitService service, RateLimitProperties p,
                                                                   ObjectProvider<ErrorPredicate> predicate,
                                                                   ObjectProvider<io.github.resilience4j.circuitbreaker.CircuitBreakerRegistry> registry) {
        RateLimitProperties.Protection t = p.getProtection();
        io.redisratelimit.client.Protection protection;
        try {
            protection = io.redisratelimit.client.Protection.builder(service.client()).reportInterval(t.getReportInterval())
                    .stagePoll(t.getStagePoll()).stageHold(t.getStageHold()).policies(service.rules().loopPolicies()).build();
        } catch (InvalidArgumentException e) {
            throw new RateLimitConfigException("ratelimit.protection." + e.parameter().replace('_', '-'), e.reason(), e);
        }
        RateLimitBreakers breakers = new RateLimitBreakers(service, registry.getIfAvailable(
                io.github.resilience4j.circuitbreaker.CircuitBreakerRegistry::ofDefaults));
        protection.addListener(breakers);
        // The local level of a global rule runs at its policy's scale, as the server does.
        service.limiter().scaleLocalLevel(protection::scale);
        // Its denials without a server call (deny cache, local level) reach the stages as DENIED n.
        service.limiter().reportLocalDenials(protection);
        service.protection(protection, predicate.getIfAvailable(() -> ErrorPredicate.DEFAULT));
        return protection;
    }

    /**
     * Checks every {@code @RateLimited} key expression and degrade handler
     * ({@code fallback}) when its bean is created: a key naming no parameter
     * of its method, or a fallback that is missing or does not fit, fails the
     * start-up.
     */
    @Bean
    @Role(BeanDefinition.ROLE_INFRASTRUCTURE)
    public static org.springframework.beans.factory.config.BeanPostProcessor rateLimitedKeyCheck() {
        org.springframework.core.ParameterNameDiscoverer names = new org.springframework.core.DefaultParameterNameDiscoverer();
        return new org.springframework.beans.factory.config.BeanPostProcessor() {
            @Override
            public Object postProcessBeforeInitialization(Object bean, String beanName) {
                Class<?> type = org.springframework.util.ClassUtils.getUserClass(bean);
                if (!org.springframework.core.annotation.AnnotationUtils.isCandidateClass(type, RateLimited.class)) {
                    return bean;
                }
                RateLimited onClass = org.springframework.core.annotation.AnnotatedElementUtils.findMergedAnnotation(type, RateLimited.class);
                java.lang.reflect.Method[] methods;
                try {
                    methods = org.springframework.util.ReflectionUtils.getUniqueDeclaredMethods(type,
                            org.springframework.util.ReflectionUtils.USER_DECLARED_METHODS);
                } catch (LinkageError e) {
                    // A method whose signature names a class that is not there: the bean cannot be advised either.
                    return bean;
                }
                for (java.lang.reflect.Method m : methods) {
                    RateLimited a = org.springframework.core.annotation.AnnotatedElementUtils.findMergedAnnotation(m, RateLimited.class);
                    if (a == null && onClass != null && java.lang.reflect.Modifier.isPublic(m.getModifiers())
                            && m.getDeclaringClass() != Object.class) {
                        a = onClass;
                    }
                    if (a != null) {
                        RateLimitKeys.checkAnnotated(m, a.key(), names.getParameterNames(m));
                        if (!a.fallback().isEmpty()) {
                            // A missing or ill-fitting degrade handler fails the start, naming it.
                            RateLimitFallbacks.resolve(type, m, a.fallback());
                        }
                    }
                }
                return bean;
            }
        };
    }

    @Bean
    @Role(BeanDefinition.ROLE_INFRASTRUCTURE)
    public static DefaultPointcutAdvisor rateLimitedAdvisor(ObjectProvider<RateLimitService> service,
                                                            ObjectProvider<RateLimitedInterceptor.DecisionHook> hooks) {
        ComposablePointcut pointcut = new ComposablePointcut(AnnotationMatchingPointcut.forMethodAnnotation(RateLimited.class))
                .union(new AnnotationMatchingPointcut(RateLimited.class, true));
        // Resolved at the first call, so the advisor can be created before the service.
        org.aopalliance.intercept.MethodInterceptor lazy = new org.aopalliance.intercept.MethodInterceptor() {
            private volatile RateLimitedInterceptor delegate;

            @Override
            public Object invoke(org.aopalliance.intercept.MethodInvocation invocation) throws Throwable {
                RateLimitedInterceptor d = delegate;
                if (d == null) {
                    d = new RateLimitedInterceptor(service.getObject(), hooks.orderedStream().toList());
                    delegate = d;
                }
                return d.invoke(invocation);
            }
        };
        DefaultPointcutAdvisor advisor = new DefaultPointcutAdvisor(pointcut, lazy);
        advisor.setOrder(0);
        return advisor;
    }

    @Configuration(proxyBeanMethods = false)
    @ConditionalOnClass(MeterRegistry.class)
    static class Metrics {
        @Bean
        @ConditionalOnMissingBean
        RateLimitMetricsBinder rateLimitMetrics(ObjectProvider<MeterRegistry> registry, ObjectProvider<Limiter> limiter,
                                                ObjectProvider<RateLimitService> service) {
            return new RateLimitMetricsBinder(registry, limiter, service);
        }
    }

    /**
     * Creates the meters once both the registry and the limiter exist (when
     * every singleton is, or at the first decision if that comes first); none
     * without a registry.
     */
    static final class RateLimitMetricsBinder implements RateLimitService.Listener,
            org.springframework.beans.factory.SmartInitializingSingleton {
        private final ObjectProvider<MeterRegistry> registry;
        private final ObjectProvider<Limiter> limiter;
        private final ObjectProvider<RateLimitService> service;
        private volatile RateLimitMetrics metrics;
        private volatile boolean resolved;

        RateLimitMetricsBinder(ObjectProvider<MeterRegistry> registry, ObjectProvider<Limiter> limiter, ObjectProvider<RateLimitService> service) {
            this.registry = registry;
            this.limiter = limiter;
            this.service = service;
        }

        private RateLimitMetrics metrics() {
            if (!resolved) {
                synchronized (this) {
                    if (!resolved) {
                        MeterRegistry r = registry.getIfAvailable();
                        if (r != null) {
                            RateLimitMetrics m = new RateLimitMetrics(r);
                            m.bind(limiter.getObject());
                            RateLimitService s = service.getIfAvailable();
                            if (s != null) {
                                m.bindProtection(s);
                            }
                            metrics = m;
                        }
                        resolved = true;
                    }
                }
            }
            return metrics;
        }

        @Override
        public void afterSingletonsInstantiated() {
            metrics();
        }

        @Override
        public void onDecision(java.util.List<String> rules, io.redisratelimit.client.Decision decision, long nanos) {
            if (!resolved) {
                metrics();
            }
        }
    }

    /**
     * The settings read at start-up only, by property name: a refresh that
     * changes one is refused with an error naming it (never ignored silently).
     */
    static java.util.Map<String, String> startupSettings(RateLimitProperties p) {
        java.util.Map<String, String> m = new java.util.LinkedHashMap<>();
        m.put("ratelimit.driver", p.getDriver());
        m.put("ratelimit.deadline", String.valueOf(p.getDeadline()));
        m.put("ratelimit.instances", String.valueOf(p.getInstances()));
        m.put("ratelimit.local-level", String.valueOf(p.isLocalLevel()));
        m.put("ratelimit.fallback", p.getFallback());
        m.put("ratelimit.headers", String.valueOf(p.isHeaders()));
        m.put("ratelimit.deny-cache.enabled", String.valueOf(p.getDenyCache().isEnabled()));
        m.put("ratelimit.deny-cache.max", String.valueOf(p.getDenyCache().getMax()));
        m.put("ratelimit.deny-cache.capacity", String.valueOf(p.getDenyCache().getCapacity()));
        m.put("ratelimit.breaker.failures", String.valueOf(p.getBreaker().getFailures()));
        m.put("ratelimit.breaker.open-for", String.valueOf(p.getBreaker().getOpenFor()));
        m.put("ratelimit.protection.report-interval", String.valueOf(p.getProtection().getReportInterval()));
        m.put("ratelimit.protection.stage-poll", String.valueOf(p.getProtection().getStagePoll()));
        m.put("ratelimit.protection.stage-hold", String.valueOf(p.getProtection().getStageHold()));
        return m;
    }

    @Configuration(proxyBeanMethods = false)
    @ConditionalOnClass(name = "org.springframework.cloud.context.environment.EnvironmentChangeEvent")
    static class Refresh {
        @Bean
        ApplicationListener<org.springframework.cloud.context.environment.EnvironmentChangeEvent> rateLimitRefresh(RateLimitService service,
                                                                                                                  Environment env) {
            // A copy: Spring Cloud rebinds the properties bean itself on a refresh.
            java.util.Map<String, String> running = startupSettings(
                    Binder.get(env).bind("ratelimit", RateLimitProperties.class).orElseGet(RateLimitProperties::new));
            return event -> {
                boolean ours = event.getKeys().isEmpty() || event.getKeys().stream().anyMatch(k -> k.startsWith("ratelimit."));
                if (!ours) {
                    return;
                }
                RateLimitProperties now = Binder.get(env).bind("ratelimit", RateLimitProperties.class).orElseGet(RateLimitProperties::new);
                service.enabled(now.isEnabled());
                try {
                    service.missingKey(RateLimitService.MissingKey.parse(now.getMissingKey()));
                } catch (RateLimitConfigException e) {
                    System.getLogger(RateLimitAutoConfiguration.class.getName()).log(System.Logger.Level.ERROR,
                            "redis-ratelimit: refused the refreshed " + e.getMessage() + "; keeping " + service.missingKey());
                }
                service.settingsRefreshed(running, startupSettings(now));
                try {
                    service.sync();
                } catch (RateLimitConfigException e) {
                    // A bad rule from the config centre keeps the running rules: refusing it is safer than failing every request.
                    System.getLogger(RateLimitAutoConfiguration.class.getName()).log(System.Logger.Level.ERROR,
                            "redis-ratelimit: refused the refreshed rules, keeping the running ones: " + e.getMessage());
                }
            };
        }
    }

    @Configuration(proxyBeanMethods = false)
    @ConditionalOnClass(name = "org.springframework.boot.actuate.health.HealthIndicator")
    static class Health {
        @Bean
        @ConditionalOnMissingBean(name = "rateLimitHealthIndicator")
        io.redisratelimit.spring.actuate.RateLimitHealthIndicator rateLimitHealthIndicator(RateLimitService service) {
            return new io.redisratelimit.spring.actuate.RateLimitHealthIndicator(service);
        }
    }

    @Configuration(proxyBeanMethods = false)
    @ConditionalOnWebApplication
    @ConditionalOnClass(name = "org.springframework.http.ProblemDetail")
    static class Web {
        @Bean
        RateLimitExceptionHandler rateLimitExceptionHandler(RateLimitService service) {
            return new RateLimitExceptionHandler(service);
        }
    }

    @Configuration(proxyBeanMethods = false)
    @ConditionalOnWebApplication(type = ConditionalOnWebApplication.Type.REACTIVE)
    @ConditionalOnClass(name = "org.springframework.web.server.WebFilter")
    static class Reactive {
        @Bean
        io.redisratelimit.spring.reactive.RateLimitWebFilter rateLimitWebFilter(RateLimitService service, RateLimitProperties p) {
            return new io.redisratelimit.spring.reactive.RateLimitWebFilter(service, p.isHeaders());
        }
    }

    @Configuration(proxyBeanMethods = false)
    @ConditionalOnWebApplication(type = ConditionalOnWebApplication.Type.SERVLET)
    @ConditionalOnClass({WebMvcConfigurer.class, jakarta.servlet.http.HttpServletRequest.class})
    static class Servlet {

        @Bean
        ServletHeadersHook rateLimitServletHeaders(RateLimitService service, RateLimitProperties p) {
            return p.isHeaders() ? new ServletHeadersHook(service) : new ServletHeadersHook(service) {
                @Override
                public void decided(java.util.List<String> rules, io.redisratelimit.client.Decision decision) {
                }
            };
        }

        @Bean
        RateLimitHandlerInterceptor rateLimitHandlerInterceptor(RateLimitService service, RateLimitProperties p) {
            return new RateLimitHandlerInterceptor(service, p.isHeaders());
        }

        @Bean
        WebMvcConfigurer rateLimitWebMvcConfigurer(RateLimitHandlerInterceptor interceptor) {
            return new WebMvcConfigurer() {
                @Override
                public void addInterceptors(InterceptorRegistry registry) {
                    registry.addInterceptor(interceptor);
                }
            };
        }
    }
}

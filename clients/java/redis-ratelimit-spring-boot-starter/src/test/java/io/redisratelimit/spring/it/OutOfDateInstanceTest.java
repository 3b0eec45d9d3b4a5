package io.redisratelimit.spring.it;

import io.redisratelimit.client.Spec;
import io.redisratelimit.client.testing.RedisServer;
import io.redisratelimit.client.testing.Windows;
import io.redisratelimit.spring.RateLimitService;
import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.Test;
import org.springframework.boot.WebApplicationType;
import org.springframework.boot.builder.SpringApplicationBuilder;
import org.springframework.boot.web.context.WebServerApplicationContext;
import org.springframework.cloud.context.environment.EnvironmentChangeEvent;
import org.springframework.context.ConfigurableApplicationContext;
import org.springframework.core.env.MapPropertySource;

import java.net.http.HttpResponse;
import java.time.Duration;
import java.util.HashMap;
import java.util.Map;
import java.util.Set;
import java.util.UUID;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertTrue;

/**
 * Two instances of one application on one Redis, refreshed out of order: A
 * is refreshed (a rule deleted, a limit lowered), B is not yet and meets the
 * deleted policy. B must not undo A's change: the deleted rule stays deleted,
 * the lowered limit stays lowered, and A admits what its headers say.
 */
class OutOfDateInstanceTest {
    private static RedisServer server;
    private static ConfigurableApplicationContext a;
    private static ConfigurableApplicationContext b;

    @BeforeAll
    static void start() {
        server = RedisServer.start();
        a = instance();
        b = instance();
    }

    @AfterAll
    static void stop() {
        b.close();
        a.close();
        server.close();
    }

    /** One instance, with a config centre of its own: a mutable property source above the application's. */
    private static ConfigurableApplicationContext instance() {
        Map<String, Object> centre = new HashMap<>();
        centre.put("ratelimit.rules.order-create.algorithm", "fixedwindow");
        centre.put("ratelimit.rules.order-create.params", "5," + Windows.FIXED_MS);
        centre.put("ratelimit.rules.order-total.algorithm", "fixedwindow");
        centre.put("ratelimit.rules.order-total.params", "15000," + Windows.FIXED_MS);
        centre.put("ratelimit.rules.order-total.fixed-key", "{order}:ooo-total");
        centre.put("ratelimit.rules.exp-route.algorithm", "fixedwindow");
        centre.put("ratelimit.rules.exp-route.params", "100," + Windows.FIXED_MS);
        centre.put("ratelimit.rules.exp-route.routes", "/search");
        centre.put("ratelimit.rules.exp-route.key", "#request.getHeader('X-User')");
        centre.put("ratelimit.rules.quote.algorithm", "sliding");
        centre.put("ratelimit.rules.quote.params", "2,60000");
        return new SpringApplicationBuilder(OrderApp.class).web(WebApplicationType.SERVLET)
                .initializers(ctx -> ctx.getEnvironment().getPropertySources().addFirst(new MapPropertySource("config-centre", centre)))
                .run("--server.port=0", "--spring.application.name=ooo-it", "--spring.data.redis.port=" + server.port(),
                        "--ratelimit.deadline=2s", "--ratelimit.deny-cache.enabled=false", "--spring.main.banner-mode=off");
    }

    @SuppressWarnings("unchecked")
    private static Map<String, Object> centre(ConfigurableApplicationContext ctx) {
        return (Map<String, Object>) ctx.getEnvironment().getPropertySources().get("config-centre").getSource();
    }

    private static int port(ConfigurableApplicationContext ctx) {
        return ((WebServerApplicationContext) ctx).getWebServer().getPort();
    }

    @Test
    void anInstanceNotYetRefreshedNeverUndoesANewerChange() throws Exception {
        Map<String, Object> ca = centre(a);
        ca.keySet().removeIf(k -> k.startsWith("ratelimit.rules.exp-route."));
        ca.put("ratelimit.rules.order-create.params", "3," + Windows.FIXED_MS);
        a.publishEvent(new EnvironmentChangeEvent(a, Set.of("ratelimit.rules.exp-route.algorithm", "ratelimit.rules.order-create.params")));
        assertFalse(server.command("RL.POLICY", "LIST").contains("ooo-it:exp-route"));

        RateLimitService serviceB = b.getBean(RateLimitService.class);
        long before = serviceB.policyRepairs();
        HttpResponse<String> search = Http.send("GET", port(b), "/search", "u-" + UUID.randomUUID());
        assertEquals(200, search.statusCode(), "the fallback decides the rule the server no longer has");
        long until = System.nanoTime() + Duration.ofSeconds(10).toNanos();
        while (serviceB.policyRepairs() == before) {
            assertTrue(System.nanoTime() < until, "B looked at the missing policy");
            Thread.sleep(10);
        }
        String list = server.command("RL.POLICY", "LIST");
        assertFalse(list.contains("ooo-it:exp-route"), "B restored a rule A deleted: " + list);
        assertEquals(Spec.fixedWindow(3, Windows.FIXED_MS), a.getBean(RateLimitService.class).policy("order-create").orElseThrow().spec(),
                "B put back the limit A lowered");
        assertTrue(serviceB.outOfDate(), "B knows its rules are out of date");

        String user = "o-" + UUID.randomUUID();
        int admitted = 0;
        for (int i = 0; i < 5; i++) {
            HttpResponse<String> r = Http.send("POST", port(a), "/api/order/create", user);
            admitted += r.statusCode() == 200 ? 1 : 0;
            assertTrue(r.headers().firstValue("RateLimit-Policy").orElseThrow().contains("\"order-create\";q=3"));
        }
        assertEquals(3, admitted, "A admits what its headers say");

        // B's own refresh brings it up to date.
        Map<String, Object> cb = centre(b);
        cb.keySet().removeIf(k -> k.startsWith("ratelimit.rules.exp-route."));
        cb.put("ratelimit.rules.order-create.params", "3," + Windows.FIXED_MS);
        b.publishEvent(new EnvironmentChangeEvent(b, Set.of("ratelimit.rules.exp-route.algorithm", "ratelimit.rules.order-create.params")));
        assertFalse(serviceB.outOfDate());
    }

    @Test
    void aServerThatLostItsPoliciesGetsThemBackFromAnInstanceThatIsCurrent() throws Exception {
        server.command("FLUSHALL");
        for (String p : server.command("RL.POLICY", "LIST").split(" ")) {
            if (p.startsWith("ooo-it:")) {
                server.command("RL.POLICY", "DEL", p);
            }
        }
        RateLimitService serviceA = a.getBean(RateLimitService.class);
        long before = serviceA.policyRepairs();
        Http.send("POST", port(a), "/api/order/create", "l-" + UUID.randomUUID());
        long until = System.nanoTime() + Duration.ofSeconds(10).toNanos();
        while (serviceA.policyRepairs() == before) {
            assertTrue(System.nanoTime() < until, "A repaired the policies");
            Thread.sleep(10);
        }
        assertTrue(server.command("RL.POLICY", "LIST").contains("ooo-it:order-create"));
    }
}

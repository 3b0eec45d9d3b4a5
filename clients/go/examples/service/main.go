// Command service is an example HTTP service limited by the kit: a chi
// router whose /hello route is limited per user (the X-User header, else
// the client's address) and globally, with the kit's answer (429,
// Retry-After, RateLimit-Policy, RateLimit, a problem+json body), the
// limiter's metrics on /metrics and its counters on /stats.
//
//	go run ./examples/service -redis 127.0.0.1:6379 -limit 10 -window 1m
//	curl -i -H 'X-User: alice' http://127.0.0.1:8080/hello
//
// Every flag can be given in the environment instead (the flag wins):
// RL_LISTEN, RL_REDIS, RL_LIMIT, RL_WINDOW, RL_GLOBAL_LIMIT, RL_INSTANCES,
// RL_DEADLINE, RL_FALLBACK. When it is ready it prints one line,
// "listening on http://<address>", on stdout.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strconv"
	"syscall"
	"time"

	"github.com/go-chi/chi/v5"
	"github.com/redis-ratelimit/redis-ratelimit/clients/go/ratelimit"
	"github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/maintnotifications"
)

// LevelHeader is the response header naming the level that decided
// (redis, local, deny_cache, fallback, grant): the end-to-end tests count
// the fallback's answers with it.
const LevelHeader = "X-RateLimit-Level"

type config struct {
	listen      string
	redis       string
	limit       int64
	window      time.Duration
	globalLimit int64
	instances   int
	deadline    time.Duration
	fallback    string
}

func env(name, def string) string {
	if v, ok := os.LookupEnv(name); ok {
		return v
	}
	return def
}

func envInt(name string, def int64) int64 {
	if v, ok := os.LookupEnv(name); ok {
		if n, err := strconv.ParseInt(v, 10, 64); err == nil {
			return n
		}
		log.Fatalf("%s=%q: not an integer", name, v)
	}
	return def
}

func envDuration(name string, def time.Duration) time.Duration {
	if v, ok := os.LookupEnv(name); ok {
		if d, err := time.ParseDuration(v); err == nil {
			return d
		}
		log.Fatalf("%s=%q: not a duration (such as 1m, 500ms)", name, v)
	}
	return def
}

func parseFlags(args []string) (config, error) {
	var c config
	fs := flag.NewFlagSet("service", flag.ContinueOnError)
	fs.StringVar(&c.listen, "listen", env("RL_LISTEN", "127.0.0.1:8080"), "address to listen on (port 0: any free port)")
	fs.StringVar(&c.redis, "redis", env("RL_REDIS", "127.0.0.1:6379"), "Redis address, with the redis-ratelimit module loaded")
	fs.Int64Var(&c.limit, "limit", envInt("RL_LIMIT", 10), "requests per user per window (rule per-user: a sliding log, at most the server's ratelimit.sliding-max-limit, 100000 by default)")
	fs.DurationVar(&c.window, "window", envDuration("RL_WINDOW", time.Minute), "the window of both rules")
	fs.Int64Var(&c.globalLimit, "global-limit", envInt("RL_GLOBAL_LIMIT", 1000), "requests of everybody per window (rule global: a sliding log too, at most 100000 by default)")
	fs.IntVar(&c.instances, "instances", int(envInt("RL_INSTANCES", 1)), "instances of this service sharing the Redis (the local level's share)")
	fs.DurationVar(&c.deadline, "deadline", envDuration("RL_DEADLINE", ratelimit.DefaultDeadline), "deadline of one call to Redis")
	fs.StringVar(&c.fallback, "fallback", env("RL_FALLBACK", "local"), "when Redis cannot answer: local, open or closed")
	if err := fs.Parse(args); err != nil {
		return c, err
	}
	switch {
	case c.limit < 1:
		return c, fmt.Errorf("-limit %d: must be at least 1", c.limit)
	case c.globalLimit < 1:
		return c, fmt.Errorf("-global-limit %d: must be at least 1", c.globalLimit)
	case c.window < time.Millisecond:
		return c, fmt.Errorf("-window %v: must be at least 1ms", c.window)
	case c.instances < 1:
		return c, fmt.Errorf("-instances %d: must be at least 1", c.instances)
	case c.deadline <= 0:
		return c, fmt.Errorf("-deadline %v: must be positive", c.deadline)
	}
	return c, nil
}

func fallbackMode(s string) (ratelimit.FallbackMode, error) {
	switch s {
	case "local":
		return ratelimit.LocalOnly, nil
	case "open":
		return ratelimit.FailOpen, nil
	case "closed":
		return ratelimit.FailClosed, nil
	}
	return 0, fmt.Errorf("-fallback %q: local, open or closed", s)
}

func main() {
	c, err := parseFlags(os.Args[1:])
	if err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return
		}
		log.Fatal(err)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, c); err != nil {
		log.Fatal(err)
	}
}

func run(ctx context.Context, c config) error {
	mode, err := fallbackMode(c.fallback)
	if err != nil {
		return err
	}
	rdb := redis.NewClient(&redis.Options{
		Addr: c.redis,
		// No maintenance notifications (a Redis Cloud feature): nothing to
		// ask a self-hosted server for.
		MaintNotificationsConfig: &maintnotifications.Config{Mode: maintnotifications.ModeDisabled},
	})
	defer rdb.Close()
	start, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	client, err := ratelimit.NewClient(start, rdb, ratelimit.WithDeadline(c.deadline))
	if err != nil {
		return fmt.Errorf("connecting to %s: %w", c.redis, err)
	}
	metrics, err := ratelimit.NewMetrics(nil)
	if err != nil {
		return err
	}
	limiter := ratelimit.NewLimiter(client,
		ratelimit.WithInstances(c.instances),
		ratelimit.WithFallback(mode),
		ratelimit.WithMetrics(metrics),
	)
	windowMs := c.window.Milliseconds()
	// Two exact sliding logs, one per user and one for everybody, with one
	// hash tag for both keys: the two rules are one RL.ALL per request, also
	// on a cluster.
	set, err := limiter.RuleSet(start,
		ratelimit.NewRule("per-user", ratelimit.SlidingWindow(c.limit, windowMs)).Prefix("{api}:user:"),
		ratelimit.NewRule("global", ratelimit.SlidingWindow(c.globalLimit, windowMs)).Global("{api}:global"),
	)
	if err != nil {
		return err
	}
	// The user's header, else the client's address.
	byUser, byIP := ratelimit.KeyByHeader("X-User"), ratelimit.KeyByIP()
	key := func(r *http.Request) (string, error) {
		if id, err := byUser(r); err == nil {
			return "user:" + id, nil
		}
		id, err := byIP(r)
		return "ip:" + id, err
	}

	r := chi.NewRouter()
	r.Get("/metrics", metrics.Handler().ServeHTTP)
	r.Get("/stats", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(limiter.Stats())
	})
	r.Get("/healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok\n")) })
	r.Group(func(r chi.Router) {
		r.Use(ratelimit.Middleware(limiter, set, key, ratelimit.WithLevelHeader(LevelHeader)))
		r.Get("/hello", func(w http.ResponseWriter, r *http.Request) {
			d, _ := ratelimit.DecisionFromContext(r.Context())
			fmt.Fprintf(w, "hello; %d left\n", d.Remaining)
		})
	})

	ln, err := net.Listen("tcp", c.listen)
	if err != nil {
		return err
	}
	srv := &http.Server{Handler: r, ReadHeaderTimeout: 10 * time.Second}
	fmt.Printf("listening on http://%s\n", ln.Addr())
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	shutdown, cancelShutdown := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancelShutdown()
	err = srv.Shutdown(shutdown)
	_ = limiter.Close(shutdown)
	return err
}

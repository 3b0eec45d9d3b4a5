// Command grants is one instance of an application sharing ONE global
// limit with others (the Go port of the Rust kit's grants_load example,
// with its options and its output): it offers decisions at a fixed rate
// for a while on a token bucket rule, one key, batched, striped or both,
// and prints what happened as one JSON line. bench/grants/run.sh runs
// several of these as processes on a 3-master cluster.
//
//	go run ./bench/grants --nodes redis://127.0.0.1:7000/[,redis://...] --mode batched \
//	    --capacity 400 --refill-count 40 --refill-ms 10 --rate 2000 --duration-ms 5000
//
// Options (all --name value):
//   - nodes: one URL (standalone) or several, comma-separated (a cluster;
//     --cluster 1 makes one URL a cluster's);
//   - mode: one (one key, a call per decision), batched, striped,
//     batched-striped; stripes (3), hold-ms (50), max-share-pct (10);
//   - key (grants:global), capacity, refill-count, refill-ms;
//   - rate: decisions offered per second; tasks: concurrent deciders (8);
//     duration-ms; start-at-ms: a Unix time to start at (to start several
//     processes together).
//
// The line: decisions, admitted, denied, redis_calls (limiter calls and
// REFUNDs), grant_asks, grant_units, grant_refunds, grant_refunded_units,
// stripe_spills, fallback, held_at_exit (before Close), elapsed_ms, and
// admitted_per_s / decisions_per_s (one per second of the run).
package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis-ratelimit/redis-ratelimit/clients/go/ratelimit"
	"github.com/redis/go-redis/v9"
)

func fail(code int, format string, a ...any) {
	fmt.Fprintf(os.Stderr, "grants: "+format+"\n", a...)
	os.Exit(code)
}

func main() {
	args := os.Args[1:]
	opts := map[string]string{}
	if len(args)%2 != 0 {
		fail(2, "options go as --name value pairs, not %q", args)
	}
	for i := 0; i < len(args); i += 2 {
		if !strings.HasPrefix(args[i], "--") {
			fail(2, "options go as --name value pairs, not %q", args[i:i+2])
		}
		opts[strings.TrimPrefix(args[i], "--")] = args[i+1]
	}
	get := func(k, d string) string {
		if v, ok := opts[k]; ok {
			return v
		}
		return d
	}
	num := func(k string, d int64) int64 {
		v := get(k, strconv.FormatInt(d, 10))
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil || n < 0 {
			fail(2, "--%s must be a non-negative integer, not %q", k, v)
		}
		return n
	}
	urls := strings.Split(get("nodes", "redis://127.0.0.1:6379/"), ",")
	mode := get("mode", "batched")
	key := get("key", "grants:global")
	capacity, refillCount, refillMs := num("capacity", 400), num("refill-count", 40), num("refill-ms", 10)
	rate := max(num("rate", 1000), 1)
	tasks := max(num("tasks", 8), 1)
	duration := time.Duration(num("duration-ms", 5000)) * time.Millisecond
	batch := ratelimit.Batch{HoldMs: num("hold-ms", 50), MaxSharePct: num("max-share-pct", 10)}

	var rdb redis.UniversalClient
	if len(urls) > 1 || num("cluster", 0) == 1 {
		var addrs []string
		for _, u := range urls {
			o, err := redis.ParseURL(u)
			if err != nil {
				fail(2, "--nodes: %v", err)
			}
			addrs = append(addrs, o.Addr)
		}
		rdb = redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs})
	} else {
		o, err := redis.ParseURL(urls[0])
		if err != nil {
			fail(2, "--nodes: %v", err)
		}
		rdb = redis.NewClient(o)
	}
	ctx := context.Background()
	client, err := ratelimit.NewClient(ctx, rdb, ratelimit.WithDeadline(2*time.Second))
	if err != nil {
		fail(1, "%v", err)
	}
	rule := ratelimit.NewRule("global", ratelimit.TokenBucket(capacity, refillCount, refillMs)).Global(key)
	switch mode {
	case "one":
	case "batched":
		rule = rule.Batched(batch)
	case "striped":
		rule = rule.Striped(int(num("stripes", 3)))
	case "batched-striped":
		rule = rule.Batched(batch).Striped(int(num("stripes", 3)))
	default:
		fail(2, "--mode is one, batched, striped or batched-striped, not %q", mode)
	}
	// Fail closed: nothing is admitted that the server did not grant, so the
	// bound holds even when a busy machine misses a deadline.
	limiter := ratelimit.NewLimiter(client, ratelimit.WithLocalLevel(false), ratelimit.WithDenyCache(false),
		ratelimit.WithFallback(ratelimit.FailClosed))
	set, err := limiter.RuleSet(ctx, rule)
	if err != nil {
		fail(2, "%v", err)
	}
	if v, ok := opts["start-at-ms"]; ok {
		if at, err := strconv.ParseInt(v, 10, 64); err == nil {
			time.Sleep(time.Until(time.UnixMilli(at)))
		}
	}
	seconds := max(int((duration+time.Second-1)/time.Second), 1)
	perS := make([][2]atomic.Int64, seconds)
	start := time.Now()
	stopAt := start.Add(duration)
	period := time.Duration(int64(time.Second) * tasks / rate)
	var wg sync.WaitGroup
	for t := int64(0); t < tasks; t++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			// Task t decides at start + (t + k * tasks) / rate.
			next := start.Add(time.Duration(int64(time.Second) * t / rate))
			for next.Before(stopAt) {
				time.Sleep(time.Until(next))
				d := limiter.Check(ctx, set, "", 1)
				s := min(int(time.Since(start)/time.Second), seconds-1)
				perS[s][0].Add(1)
				if d.Allowed {
					perS[s][1].Add(1)
				}
				next = next.Add(period)
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	var decisions, admitted int64
	list := func(i int) []int64 {
		out := make([]int64, seconds)
		for s := range perS {
			out[s] = perS[s][i].Load()
		}
		return out
	}
	for s := range perS {
		decisions += perS[s][0].Load()
		admitted += perS[s][1].Load()
	}
	held := limiter.HeldUnits()
	_ = limiter.Close(ctx)
	st := limiter.Stats()
	line, _ := json.Marshal(map[string]any{
		"mode": mode, "decisions": decisions, "admitted": admitted, "denied": decisions - admitted,
		"redis_calls": st.RedisCalls + st.GrantRefunds, "grant_asks": st.GrantAsks, "grant_units": st.GrantUnits,
		"grant_refunds": st.GrantRefunds, "grant_refunded_units": st.GrantRefundedUnits,
		"stripe_spills": st.StripeSpills, "fallback": st.FallbackAdmitted + st.FallbackDenied,
		"held_at_exit": held, "elapsed_ms": elapsed.Milliseconds(),
		"admitted_per_s": list(1), "decisions_per_s": list(0),
	})
	fmt.Println(string(line))
	_ = client.Close()
}

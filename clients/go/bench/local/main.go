// Command local measures the Limiter's decisions made in process, without a
// round trip: the deny cache (a denied key answered until its retry_after)
// and the local level (a global rule's share, denied in process), in
// decisions per second per core (SPEC: at least 1,000,000 per core). It
// prints a table, one row per path:
//
//	go run ./bench/local --url redis://127.0.0.1:6379/ [--seconds 2] [--keys 10000]
//	RL_MODULE=/abs/libredis_ratelimit.so bench/local/run.sh   (starts its own server)
//
// The server (with the module) keeps the run's keys for an hour; it only answers the calls that fill the cache
// and the share; the measured decisions never reach it (the table's
// redis_calls column says so). Each path runs on one goroutine with
// GOMAXPROCS 1 (one core), then on GOMAXPROCS goroutines (all cores).
package main

import (
	"context"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"
	"time"

	"github.com/redis-ratelimit/redis-ratelimit/clients/go/ratelimit"
	"github.com/redis/go-redis/v9"
)

func fail(format string, a ...any) {
	fmt.Fprintf(os.Stderr, "local: "+format+"\n", a...)
	os.Exit(2)
}

type path struct {
	name     string
	want     ratelimit.Path
	limiter  *ratelimit.Limiter
	set      *ratelimit.RuleSet
	identity func(i int) string
}

func main() {
	opts := map[string]string{"url": os.Getenv("REDIS_URL"), "seconds": "2", "keys": "10000"}
	args := os.Args[1:]
	for i := 0; i+1 < len(args); i += 2 {
		opts[strings.TrimPrefix(args[i], "--")] = args[i+1]
	}
	if opts["url"] == "" {
		fail("give --url redis://host:port/ (a server with the module) or REDIS_URL")
	}
	seconds, err := strconv.ParseFloat(opts["seconds"], 64)
	if err != nil || seconds <= 0 {
		fail("--seconds %q", opts["seconds"])
	}
	keys, err := strconv.Atoi(opts["keys"])
	if err != nil || keys < 1 {
		fail("--keys %q", opts["keys"])
	}
	ro, err := redis.ParseURL(opts["url"])
	if err != nil {
		fail("--url: %v", err)
	}
	ctx := context.Background()
	client, err := ratelimit.NewClient(ctx, redis.NewClient(ro))
	if err != nil {
		fail("%v", err)
	}
	// Keys of this run only: nothing of the server's is touched.
	run := strconv.FormatInt(time.Now().UnixNano(), 36)

	// The deny cache: every identity denied once by Redis, then from the
	// cache for an hour.
	deny := ratelimit.NewLimiter(client, ratelimit.WithDenyCacheMax(time.Hour), ratelimit.WithDenyCacheCapacity(keys*2))
	denySet, err := deny.RuleSet(ctx, ratelimit.NewRule("bench-deny-"+run, ratelimit.FixedWindow(1, 3600000)))
	if err != nil {
		fail("%v", err)
	}
	// The local level: a global rule of 1,000 per hour over 1,000 instances,
	// a share of 2: denied in process once those are taken.
	local := ratelimit.NewLimiter(client, ratelimit.WithInstances(1000))
	localSet, err := local.RuleSet(ctx, ratelimit.NewRule("bench-global", ratelimit.FixedWindow(1000, 3600000)).Global("bench:{global}:"+run))
	if err != nil {
		fail("%v", err)
	}
	ids := make([]string, keys)
	for i := range ids {
		ids[i] = "user" + strconv.Itoa(i)
	}
	for _, id := range ids {
		for n := 0; n < 2; n++ {
			deny.Check(ctx, denySet, id, 1)
		}
	}
	for n := 0; n < 3; n++ {
		local.Check(ctx, localSet, "anyone", 1)
	}
	paths := []path{
		{"deny_cache, 1 key", ratelimit.PathDenyCache, deny, denySet, func(int) string { return ids[0] }},
		{fmt.Sprintf("deny_cache, %d keys", keys), ratelimit.PathDenyCache, deny, denySet, func(i int) string { return ids[i%keys] }},
		{"local level, global rule", ratelimit.PathLocal, local, localSet, func(i int) string { return ids[i%keys] }},
	}
	cores := runtime.NumCPU()
	fmt.Printf("Go %s, %s/%s, %d cores, %.1f s per row\n\n", runtime.Version(), runtime.GOOS, runtime.GOARCH, cores, seconds)
	fmt.Printf("| path | goroutines (GOMAXPROCS) | decisions | decisions/s | per core | ns/decision | allocs/decision | redis calls |\n")
	fmt.Printf("|---|---|---|---|---|---|---|---|\n")
	for _, p := range paths {
		for _, g := range []int{1, cores} {
			measure(p, g, time.Duration(seconds*float64(time.Second)))
		}
	}
}

func measure(p path, goroutines int, d time.Duration) {
	prev := runtime.GOMAXPROCS(goroutines)
	defer runtime.GOMAXPROCS(prev)
	ctx := context.Background()
	before := p.limiter.Stats().RedisCalls
	var ms0, ms1 runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&ms0)
	counts := make(chan int, goroutines)
	wrong := make(chan ratelimit.Decision, goroutines)
	start := time.Now()
	deadline := start.Add(d)
	for g := 0; g < goroutines; g++ {
		go func(g int) {
			n := 0
			for i := g * 7919; ; i++ {
				if i%1024 == 0 && time.Now().After(deadline) {
					break
				}
				dec := p.limiter.Check(ctx, p.set, p.identity(i), 1)
				if dec.Path != p.want || dec.Allowed {
					wrong <- dec
					break
				}
				n++
			}
			counts <- n
		}(g)
	}
	total := 0
	for g := 0; g < goroutines; g++ {
		total += <-counts
	}
	elapsed := time.Since(start)
	runtime.ReadMemStats(&ms1)
	select {
	case dec := <-wrong:
		fail("%s: a decision off the path: %+v", p.name, dec)
	default:
	}
	perS := float64(total) / elapsed.Seconds()
	fmt.Printf("| %s | %d | %d | %.0f | %.0f | %.0f | %.1f | %d |\n", p.name, goroutines, total, perS,
		perS/float64(goroutines), float64(elapsed.Nanoseconds())*float64(goroutines)/float64(total),
		float64(ms1.Mallocs-ms0.Mallocs)/float64(total), p.limiter.Stats().RedisCalls-before)
}

// Command redisrate measures, side by side in one run on one server,
// redisrate.Allow (the module's RL.TOKENBUCKET) against go-redis/redis_rate
// v10's Allow (its Lua GCRA through EVALSHA): calls per second with N
// goroutines, and the server's time per call, from INFO commandstats
// (usec_per_call of rl.tokenbucket against evalsha + eval, the script's
// inner GET/SET/TIME included) and from INFO cpu (the process's user + sys
// CPU, network I/O included, divided by the calls).
//
// Environment:
//   - REDISRATE_BENCH_ADDR: the server (host:port), with the module loaded
//     (required; run.sh starts one).
//   - BENCH_GOROUTINES: the goroutine counts, comma-separated (default 1,8,32).
//   - BENCH_SECONDS: seconds per row (default 4), run as BENCH_ROUNDS slices
//     (default 4) alternating with the other library's, so that what else
//     runs on the machine weighs on both alike.
//   - BENCH_KEYS: distinct keys, spread over the goroutines (default 1000).
package main

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	upstream "github.com/go-redis/redis_rate/v10"
	"github.com/redis/go-redis/v9"

	redisrate "github.com/redis-ratelimit/redis-ratelimit/clients/go/redisrate"
)

type allowFunc func(ctx context.Context, key string) (allowed bool, err error)

// row is one library's measurement at one goroutine count, summed over
// slices.
type row struct {
	lib        string
	goroutines int
	calls      int64
	allowed    int64
	seconds    float64
	usec       float64 // commandstats: the server's time in the call's commands
	cpuUsec    float64 // INFO cpu: the server process's user + sys time
}

func (r *row) add(m row) {
	r.lib, r.goroutines = m.lib, m.goroutines
	r.calls += m.calls
	r.allowed += m.allowed
	r.seconds += m.seconds
	r.usec += m.usec
	r.cpuUsec += m.cpuUsec
}

func main() {
	addr := os.Getenv("REDISRATE_BENCH_ADDR")
	if addr == "" {
		fmt.Fprintln(os.Stderr, "REDISRATE_BENCH_ADDR is not set: the address of a server with the module (bench/redisrate/run.sh starts one)")
		os.Exit(2)
	}
	counts := intList(os.Getenv("BENCH_GOROUTINES"), []int{1, 8, 32})
	seconds := intList(os.Getenv("BENCH_SECONDS"), []int{4})[0]
	rounds := intList(os.Getenv("BENCH_ROUNDS"), []int{4})[0]
	keys := intList(os.Getenv("BENCH_KEYS"), []int{1000})[0]
	ctx := context.Background()

	maxN := 0
	for _, n := range counts {
		maxN = max(maxN, n)
	}
	rdb := redis.NewClient(&redis.Options{Addr: addr, PoolSize: max(maxN, 10), MaxRetries: -1})
	defer rdb.Close()
	if err := rdb.Ping(ctx).Err(); err != nil {
		fail(err)
	}
	version := info(ctx, rdb, "server")["redis_version"]

	ours := redisrate.NewLimiter(rdb)
	theirs := upstream.NewLimiter(rdb)
	usLimit := redisrate.PerSecond(1_000_000)
	upLimit := upstream.PerSecond(1_000_000)
	libs := []struct {
		name    string
		command string // commandstats entries whose time is the call's
		allow   allowFunc
	}{
		{"redisrate (RL.TOKENBUCKET)", "rl.tokenbucket", func(ctx context.Context, key string) (bool, error) {
			r, err := ours.Allow(ctx, key, usLimit)
			return err == nil && r.Allowed > 0, err
		}},
		{"redis_rate v10 (Lua, EVALSHA)", "evalsha,eval", func(ctx context.Context, key string) (bool, error) {
			r, err := theirs.Allow(ctx, key, upLimit)
			return err == nil && r.Allowed > 0, err
		}},
	}
	// Warm up: the script loaded, the connections open.
	for _, l := range libs {
		for i := 0; i < 200; i++ {
			if _, err := l.allow(ctx, "warm:"+strconv.Itoa(i)); err != nil {
				fail(err)
			}
		}
	}

	var rows []row
	slice := time.Duration(seconds) * time.Second / time.Duration(rounds)
	for _, n := range counts {
		acc := make([]row, len(libs))
		for r := 0; r < rounds; r++ {
			for i, l := range libs {
				m := measure(ctx, rdb, l.name, l.command, l.allow, n, slice, keys)
				acc[i].add(m)
			}
		}
		rows = append(rows, acc...)
	}

	fmt.Printf("redisrate vs go-redis/redis_rate v10, one server (%s %s), %d s per row in %d alternating slices, %d keys, PerSecond(1e6)\n\n", addr, version, seconds, rounds, keys)
	fmt.Println("| library | goroutines | calls/s | server usec/call (commandstats) | server CPU usec/call (INFO cpu) | allowed |")
	fmt.Println("|---|---:|---:|---:|---:|---:|")
	for _, r := range rows {
		fmt.Printf("| %s | %d | %.0f | %.2f | %.2f | %.0f%% |\n", r.lib, r.goroutines, float64(r.calls)/r.seconds, r.usec/float64(r.calls), r.cpuUsec/float64(r.calls), 100*float64(r.allowed)/float64(r.calls))
	}
	fmt.Println()
	for _, n := range counts {
		var a, b row
		for _, r := range rows {
			if r.goroutines == n && strings.HasPrefix(r.lib, "redisrate") {
				a = r
			} else if r.goroutines == n {
				b = r
			}
		}
		fmt.Printf("%d goroutines: redisrate %.2fx the calls/s of redis_rate; server time per call %.2fx (commandstats), CPU %.2fx\n",
			n, (float64(a.calls)/a.seconds)/(float64(b.calls)/b.seconds), (a.usec/float64(a.calls))/(b.usec/float64(b.calls)), (a.cpuUsec/float64(a.calls))/(b.cpuUsec/float64(b.calls)))
	}
}

func measure(ctx context.Context, rdb *redis.Client, lib, command string, allow allowFunc, n int, d time.Duration, keys int) row {
	if err := rdb.ConfigResetStat(ctx).Err(); err != nil {
		fail(err)
	}
	cpu0 := cpuSeconds(ctx, rdb)
	var calls, allowed atomic.Int64
	var failed atomic.Value
	stop := make(chan struct{})
	var wg sync.WaitGroup
	start := time.Now()
	for g := 0; g < n; g++ {
		wg.Add(1)
		go func(g int) {
			defer wg.Done()
			for i := g; ; i += n {
				select {
				case <-stop:
					return
				default:
				}
				ok, err := allow(ctx, "bench:"+strconv.Itoa(i%keys))
				if err != nil {
					failed.Store(err)
					return
				}
				calls.Add(1)
				if ok {
					allowed.Add(1)
				}
			}
		}(g)
	}
	time.Sleep(d)
	close(stop)
	wg.Wait()
	elapsed := time.Since(start).Seconds()
	if err, _ := failed.Load().(error); err != nil {
		fail(fmt.Errorf("%s: %w", lib, err))
	}
	cpu1 := cpuSeconds(ctx, rdb)
	stats := info(ctx, rdb, "commandstats")
	var usec float64
	for _, c := range strings.Split(command, ",") {
		for k, v := range stats {
			if strings.EqualFold(k, "cmdstat_"+c) { // RL.TOKENBUCKET is listed in capitals
				usec += field(v, "usec")
			}
		}
	}
	return row{
		lib: lib, goroutines: n, calls: calls.Load(), allowed: allowed.Load(), seconds: elapsed,
		usec: usec, cpuUsec: (cpu1 - cpu0) * 1e6,
	}
}

func cpuSeconds(ctx context.Context, rdb *redis.Client) float64 {
	m := info(ctx, rdb, "cpu")
	return parseFloat(m["used_cpu_user"]) + parseFloat(m["used_cpu_sys"])
}

func info(ctx context.Context, rdb *redis.Client, section string) map[string]string {
	text, err := rdb.Info(ctx, section).Result()
	if err != nil {
		fail(err)
	}
	m := map[string]string{}
	for _, line := range strings.Split(text, "\n") {
		if k, v, ok := strings.Cut(strings.TrimSpace(line), ":"); ok && !strings.HasPrefix(k, "#") {
			m[k] = v
		}
	}
	return m
}

// field is name=value's value in a commandstats line.
func field(line, name string) float64 {
	for _, f := range strings.Split(line, ",") {
		if v, ok := strings.CutPrefix(f, name+"="); ok {
			return parseFloat(v)
		}
	}
	return 0
}

func parseFloat(s string) float64 {
	f, _ := strconv.ParseFloat(strings.TrimSpace(s), 64)
	return f
}

func intList(s string, def []int) []int {
	if s == "" {
		return def
	}
	var out []int
	for _, p := range strings.Split(s, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(p))
		if err != nil || n < 1 {
			fail(fmt.Errorf("not a positive integer: %q", p))
		}
		out = append(out, n)
	}
	return out
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "bench/redisrate:", err)
	os.Exit(1)
}

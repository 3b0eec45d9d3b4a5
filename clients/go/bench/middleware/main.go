// Command middleware measures what the kit's net/http middleware costs per
// request, against the same handler without it, under a real HTTP load
// generator over keep-alive connections on loopback, side by side in one
// run, and prints a table.
//
// Scenarios (each its own server, one after the other, the same load):
//   - bare: the handler alone;
//   - admitted: the middleware, every request decided by Redis (one
//     RL.TOKENBUCKET round trip) and admitted;
//   - deny-cache: the middleware, every request denied by the deny cache
//     in process (after one denial from Redis), answered 429 with the
//     problem body;
//   - missing-key: the middleware refusing a request without a key (400),
//     no limiter work: the cost of the wrapping alone.
//
// The load generator is bombardier (github.com/codesenberg/bombardier, a
// fasthttp client) when it is on PATH or in $(go env GOPATH)/bin (go
// install github.com/codesenberg/bombardier@v1.2.6), else a Go one of its
// own (net/http keep-alive clients); -tool picks one.
//
//	RL_MODULE=/path/libredis_ratelimit.so go run ./bench/middleware -c 32 -d 5s
//
// Without -redis it starts redis-server (PATH or $REDIS_SERVER) with
// $RL_MODULE (default ../../target/release/libredis_ratelimit.so) on a free
// port.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis-ratelimit/redis-ratelimit/clients/go/ratelimit"
	"github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/maintnotifications"
)

type result struct {
	name     string
	requests int64
	statuses map[int]int64
	errors   int64
	seconds  float64
	meanUs   float64
	p50Us    float64
	p99Us    float64
}

func (r result) rps() float64 { return float64(r.requests) / r.seconds }

func main() {
	redisAddr := flag.String("redis", "", "Redis with the module (default: start redis-server with $RL_MODULE)")
	conns := flag.Int("c", 32, "concurrent connections")
	dur := flag.Duration("d", 5*time.Second, "duration of each scenario")
	tool := flag.String("tool", "auto", "load generator: auto, bombardier or go")
	flag.Parse()

	if *redisAddr == "" {
		addr, stop, err := startRedis()
		if err != nil {
			log.Fatal(err)
		}
		defer stop()
		*redisAddr = addr
	}
	gen, err := pickTool(*tool)
	if err != nil {
		log.Fatal(err)
	}
	ctx := context.Background()
	rdb := redis.NewClient(&redis.Options{Addr: *redisAddr, PoolSize: 4 * *conns,
		MaintNotificationsConfig: &maintnotifications.Config{Mode: maintnotifications.ModeDisabled}})
	defer rdb.Close()
	client, err := ratelimit.NewClient(ctx, rdb, ratelimit.WithDeadline(time.Second))
	if err != nil {
		log.Fatal(err)
	}
	limiter := ratelimit.NewLimiter(client)
	defer limiter.Close(ctx)
	admitSet, err := limiter.RuleSet(ctx, ratelimit.NewRule("per-user", ratelimit.TokenBucket(1_000_000_000, 1_000_000_000, 1000)).Prefix("bench:mw:admit:"))
	if err != nil {
		log.Fatal(err)
	}
	denySet, err := limiter.RuleSet(ctx, ratelimit.NewRule("per-user", ratelimit.FixedWindow(1, 3_600_000)).Prefix("bench:mw:deny:"))
	if err != nil {
		log.Fatal(err)
	}
	_ = rdb.Del(ctx, "bench:mw:admit:u1", "bench:mw:deny:u1").Err()
	key := ratelimit.KeyByHeader("X-User")
	handler := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "ok\n") })

	scenarios := []struct {
		name   string
		h      http.Handler
		header string
	}{
		{"bare", handler, "X-User: u1"},
		{"admitted (Redis)", ratelimit.Middleware(limiter, admitSet, key)(handler), "X-User: u1"},
		{"denied (deny cache)", ratelimit.Middleware(limiter, denySet, key)(handler), "X-User: u1"},
		{"no key (400)", ratelimit.Middleware(limiter, admitSet, key)(handler), "X-Other: u1"},
	}
	fmt.Printf("middleware bench: %s, %d connections, %v per scenario, GOMAXPROCS %d, %d CPUs\n",
		gen.name, *conns, *dur, runtime.GOMAXPROCS(0), runtime.NumCPU())
	var results []result
	before := limiter.Stats()
	for _, s := range scenarios {
		url, stop, err := serve(s.h)
		if err != nil {
			log.Fatal(err)
		}
		// A short warm-up (connections, the deny cache's first denial).
		if _, err := gen.run(url, s.header, *conns, max(*dur/5, time.Second)); err != nil {
			log.Fatal(err)
		}
		r, err := gen.run(url, s.header, *conns, *dur)
		stop()
		if err != nil {
			log.Fatal(err)
		}
		r.name = s.name
		results = append(results, r)
	}
	after := limiter.Stats()
	printTable(results)
	fmt.Printf("\nlimiter: %d Redis calls (%d admitted, %d denied, %d timeouts), %d deny-cache hits\n",
		after.RedisCalls-before.RedisCalls, after.RedisAdmitted-before.RedisAdmitted, after.RedisDenied-before.RedisDenied,
		after.RedisTimeouts-before.RedisTimeouts, after.DenyCacheHits-before.DenyCacheHits)
}

func printTable(rs []result) {
	bare := rs[0]
	fmt.Printf("\n| %-20s | %10s | %9s | %9s | %9s | %18s | %-24s |\n", "scenario", "requests/s", "mean µs", "p50 µs", "p99 µs", "added µs/request", "statuses")
	fmt.Printf("|%s|%s|%s|%s|%s|%s|%s|\n", strings.Repeat("-", 22), strings.Repeat("-", 12), strings.Repeat("-", 11),
		strings.Repeat("-", 11), strings.Repeat("-", 11), strings.Repeat("-", 20), strings.Repeat("-", 26))
	for _, r := range rs {
		// What the middleware adds to a request, in machine time: the
		// difference of the time per request at full load (1/throughput).
		added := "-"
		if r.name != bare.name {
			added = fmt.Sprintf("%+.1f", 1e6/r.rps()-1e6/bare.rps())
		}
		var st []string
		codes := make([]int, 0, len(r.statuses))
		for c := range r.statuses {
			codes = append(codes, c)
		}
		slices.Sort(codes)
		for _, c := range codes {
			st = append(st, fmt.Sprintf("%dxx×%d", c/100, r.statuses[c]))
		}
		if r.errors > 0 {
			st = append(st, fmt.Sprintf("errors×%d", r.errors))
		}
		fmt.Printf("| %-20s | %10.0f | %9.0f | %9.0f | %9.0f | %18s | %-24s |\n", r.name, r.rps(), r.meanUs, r.p50Us, r.p99Us, added, strings.Join(st, " "))
	}
}

// serve runs h on a loopback port.
func serve(h http.Handler) (string, func(), error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", nil, err
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	return "http://" + ln.Addr().String() + "/", func() { _ = srv.Close() }, nil
}

type generator struct {
	name string
	run  func(url, header string, conns int, d time.Duration) (result, error)
}

func pickTool(tool string) (generator, error) {
	bomb := findBombardier()
	switch tool {
	case "go":
		return generator{"Go load generator (net/http keep-alive)", goLoad}, nil
	case "bombardier":
		if bomb == "" {
			return generator{}, errors.New("-tool bombardier: not found (go install github.com/codesenberg/bombardier@v1.2.6)")
		}
	case "auto":
		if bomb == "" {
			return generator{"Go load generator (net/http keep-alive)", goLoad}, nil
		}
	default:
		return generator{}, fmt.Errorf("-tool %q: auto, bombardier or go", tool)
	}
	return generator{"bombardier " + bomb, func(url, header string, conns int, d time.Duration) (result, error) {
		return bombardier(bomb, url, header, conns, d)
	}}, nil
}

func findBombardier() string {
	if p, err := exec.LookPath("bombardier"); err == nil {
		return p
	}
	gopath := os.Getenv("GOPATH")
	if gopath == "" {
		if out, err := exec.Command("go", "env", "GOPATH").Output(); err == nil {
			gopath = strings.TrimSpace(string(out))
		}
	}
	for _, dir := range filepath.SplitList(gopath) {
		p := filepath.Join(dir, "bin", "bombardier")
		if _, err := os.Stat(p); err == nil {
			return p
		}
	}
	return ""
}

func bombardier(bin, url, header string, conns int, d time.Duration) (result, error) {
	cmd := exec.Command(bin, "-c", strconv.Itoa(conns), "-d", d.String(), "-l", "-p", "r", "-o", "json",
		"-H", header, url)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return result{}, fmt.Errorf("bombardier: %w: %s%s", err, stderr.String(), out)
	}
	var b struct {
		Result struct {
			TimeTakenSeconds float64 `json:"timeTakenSeconds"`
			Req1xx           int64   `json:"req1xx"`
			Req2xx           int64   `json:"req2xx"`
			Req3xx           int64   `json:"req3xx"`
			Req4xx           int64   `json:"req4xx"`
			Req5xx           int64   `json:"req5xx"`
			Others           int64   `json:"others"`
			Latency          struct {
				Mean        float64            `json:"mean"`
				Percentiles map[string]float64 `json:"percentiles"`
			} `json:"latency"`
		} `json:"result"`
	}
	if err := json.Unmarshal(out, &b); err != nil {
		return result{}, fmt.Errorf("bombardier's output: %w: %s", err, out)
	}
	r := b.Result
	res := result{
		requests: r.Req1xx + r.Req2xx + r.Req3xx + r.Req4xx + r.Req5xx,
		statuses: map[int]int64{},
		errors:   r.Others,
		seconds:  r.TimeTakenSeconds,
		meanUs:   r.Latency.Mean,
		p50Us:    r.Latency.Percentiles["50"],
		p99Us:    r.Latency.Percentiles["99"],
	}
	for c, n := range map[int]int64{100: r.Req1xx, 200: r.Req2xx, 300: r.Req3xx, 400: r.Req4xx, 500: r.Req5xx} {
		if n > 0 {
			res.statuses[c] = n
		}
	}
	return res, nil
}

// goLoad is the load generator of its own: conns goroutines, each with a
// keep-alive connection of its own, requesting back to back for d.
func goLoad(url, header string, conns int, d time.Duration) (result, error) {
	name, value, _ := strings.Cut(header, ":")
	value = strings.TrimSpace(value)
	var (
		mu        sync.Mutex
		latencies []time.Duration
		statuses  = map[int]int64{}
		errs      atomic.Int64
		wg        sync.WaitGroup
	)
	start := time.Now()
	end := start.Add(d)
	for range conns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 1}}
			defer c.CloseIdleConnections()
			req, _ := http.NewRequest(http.MethodGet, url, nil)
			req.Header.Set(name, value)
			var mine []time.Duration
			st := map[int]int64{}
			for time.Now().Before(end) {
				t0 := time.Now()
				resp, err := c.Do(req)
				if err != nil {
					errs.Add(1)
					continue
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				mine = append(mine, time.Since(t0))
				st[resp.StatusCode/100*100]++
			}
			mu.Lock()
			latencies = append(latencies, mine...)
			for k, v := range st {
				statuses[k] += v
			}
			mu.Unlock()
		}()
	}
	wg.Wait()
	elapsed := time.Since(start).Seconds()
	if len(latencies) == 0 {
		return result{}, fmt.Errorf("no request answered (%d errors)", errs.Load())
	}
	slices.Sort(latencies)
	var sum time.Duration
	for _, l := range latencies {
		sum += l
	}
	us := func(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) }
	return result{
		requests: int64(len(latencies)), statuses: statuses, errors: errs.Load(), seconds: elapsed,
		meanUs: us(sum / time.Duration(len(latencies))),
		p50Us:  us(latencies[len(latencies)/2]),
		p99Us:  us(latencies[len(latencies)*99/100]),
	}, nil
}

// startRedis starts redis-server with the module on a free loopback port.
func startRedis() (string, func(), error) {
	module := os.Getenv("RL_MODULE")
	if module == "" {
		module = filepath.Join("..", "..", "target", "release", "libredis_ratelimit.so")
	}
	if abs, err := filepath.Abs(module); err == nil {
		module = abs
	}
	if _, err := os.Stat(module); err != nil {
		return "", nil, fmt.Errorf("the module: %w (set RL_MODULE, or give -redis)", err)
	}
	bin := os.Getenv("REDIS_SERVER")
	if bin == "" {
		bin = "redis-server"
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", nil, err
	}
	port := ln.Addr().(*net.TCPAddr).Port
	_ = ln.Close()
	dir, err := os.MkdirTemp("", "bench-mw-")
	if err != nil {
		return "", nil, err
	}
	cmd := exec.Command(bin, "--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
		"--dir", dir, "--loadmodule", module)
	if err := cmd.Start(); err != nil {
		return "", nil, fmt.Errorf("%s: %w", bin, err)
	}
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	stop := func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		_ = os.RemoveAll(dir)
	}
	rdb := redis.NewClient(&redis.Options{Addr: addr, MaintNotificationsConfig: &maintnotifications.Config{Mode: maintnotifications.ModeDisabled}})
	defer rdb.Close()
	for deadline := time.Now().Add(30 * time.Second); ; {
		if rdb.Ping(context.Background()).Err() == nil {
			return addr, stop, nil
		}
		if time.Now().After(deadline) {
			stop()
			return "", nil, fmt.Errorf("redis-server on %s did not answer", addr)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

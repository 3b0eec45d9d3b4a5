// Package e2e runs the example service (examples/service) as real
// processes against a real Redis with the module, and real HTTP clients
// against them.
package e2e

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis-ratelimit/redis-ratelimit/clients/go/internal/testserver"
	"github.com/redis-ratelimit/redis-ratelimit/clients/go/ratelimit"
)

// The example's binary, built once per test process.
var (
	buildOnce sync.Once
	binary    string
	buildErr  error
	buildDir  string
)

func TestMain(m *testing.M) {
	code := m.Run()
	if buildDir != "" {
		_ = os.RemoveAll(buildDir)
	}
	os.Exit(code)
}

// serviceBinary builds examples/service (go build -o) once.
func serviceBinary(t *testing.T) string {
	t.Helper()
	buildOnce.Do(func() {
		buildDir, buildErr = os.MkdirTemp("", "rl-e2e-")
		if buildErr != nil {
			return
		}
		binary = filepath.Join(buildDir, "service")
		cmd := exec.Command("go", "build", "-o", binary, "./examples/service")
		cmd.Dir = ".."
		out, err := cmd.CombinedOutput()
		if err != nil {
			buildErr = fmt.Errorf("go build ./examples/service: %v\n%s", err, out)
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return binary
}

// instance is one running process of the example service.
type instance struct {
	url string
	cmd *exec.Cmd
}

// startInstance runs the service with args and waits for its "listening on"
// line; the test's cleanup kills it.
func startInstance(t *testing.T, args ...string) *instance {
	t.Helper()
	cmd := exec.Command(serviceBinary(t), append([]string{"-listen", "127.0.0.1:0"}, args...)...)
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr strings.Builder
	cmd.Stderr = &lockedWriter{w: &stderr}
	testserver.DieWithUs(cmd) // no service outlives a -timeout panic
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		if t.Failed() && stderr.Len() > 0 {
			t.Logf("service %d stderr:\n%s", cmd.Process.Pid, stderr.String())
		}
	})
	lines := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			if u, ok := strings.CutPrefix(sc.Text(), "listening on "); ok {
				lines <- u
			}
		}
		close(lines)
	}()
	select {
	case u, ok := <-lines:
		if !ok {
			t.Fatalf("the service exited before listening: %s", stderr.String())
		}
		return &instance{url: u, cmd: cmd}
	case <-time.After(testserver.Patience):
		t.Fatalf("the service did not print its address within %v: %s", testserver.Patience, stderr.String())
	}
	return nil
}

type lockedWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

// stats reads the instance's limiter counters (/stats).
func (in *instance) stats(t *testing.T) ratelimit.Stats {
	t.Helper()
	resp, err := http.Get(in.url + "/stats")
	if err != nil {
		t.Fatalf("GET /stats: %v", err)
	}
	defer resp.Body.Close()
	var s ratelimit.Stats
	if err := json.NewDecoder(resp.Body).Decode(&s); err != nil {
		t.Fatalf("GET /stats: %v", err)
	}
	return s
}

// answer is what a client saw of one response.
type answer struct {
	status int
	header http.Header
	body   string
	err    error
}

func get(c *http.Client, url, user string) answer {
	req, err := http.NewRequest(http.MethodGet, url, nil)
	if err != nil {
		return answer{err: err}
	}
	if user != "" {
		req.Header.Set("X-User", user)
	}
	resp, err := c.Do(req)
	if err != nil {
		return answer{err: err}
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return answer{status: resp.StatusCode, header: resp.Header, body: string(b), err: err}
}

// TestE2EExactness: three instances of the example, as processes sharing
// one Redis (and one Valkey); 200 concurrent clients, each with its own
// http.Client, send 3 requests each, round robin over the instances.
// Exactly the limit is admitted, and every denial carries Retry-After,
// RateLimit, RateLimit-Policy and the problem body, consistent with each
// other:
//   - per-user: every client is one user, limited to 50 a minute;
//   - global: every client is its own user, everybody limited to 60 a
//     minute (the local level takes each instance's share first).
func TestE2EExactness(t *testing.T) {
	for _, kind := range []testserver.Kind{testserver.Redis, testserver.Valkey} {
		t.Run(kind.String()+"/per-user", func(t *testing.T) { exactness(t, kind, "per-user") })
		t.Run(kind.String()+"/global", func(t *testing.T) { exactness(t, kind, "global") })
	}
}

func exactness(t *testing.T, kind testserver.Kind, rule string) {
	const (
		clients   = 200
		perClient = 3
		windowS   = 60
	)
	limit, userLimit, globalLimit := 50, 50, 100_000
	if rule == "global" {
		limit, userLimit, globalLimit = 60, 100_000, 60
	}
	srv := testserver.Start(t, kind)
	var instances []*instance
	for range 3 {
		instances = append(instances, startInstance(t,
			"-redis", srv.Addr(), "-limit", strconv.Itoa(userLimit), "-window", fmt.Sprintf("%ds", windowS),
			"-global-limit", strconv.Itoa(globalLimit), "-instances", "3", "-deadline", "2s"))
	}
	policy := fmt.Sprintf(`"per-user";q=%d;w=%d, "global";q=%d;w=%d`, userLimit, windowS, globalLimit, windowS)
	admittedItem := regexp.MustCompile(`^"` + rule + `";r=(\d+);t=(\d+)$`)

	answers := make(chan answer, clients*perClient)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c := &http.Client{Transport: &http.Transport{}, Timeout: testserver.Patience}
			defer c.CloseIdleConnections()
			user := "alice"
			if rule == "global" {
				user = fmt.Sprintf("user%d", i)
			}
			<-start
			for j := range perClient {
				in := instances[(i+j)%len(instances)]
				answers <- get(c, in.url+"/hello", user)
			}
		}()
	}
	close(start)
	wg.Wait()
	close(answers)

	admitted, denied := 0, 0
	remaining := map[int]int{}
	levels := map[string]int{}
	for a := range answers {
		if a.err != nil {
			t.Fatalf("request failed: %v", a.err)
		}
		if got := a.header.Get("RateLimit-Policy"); got != policy {
			t.Errorf("status %d: RateLimit-Policy %q, want %q", a.status, got, policy)
		}
		levels[a.header.Get("X-RateLimit-Level")]++
		switch a.status {
		case http.StatusOK:
			admitted++
			if rule == "global" {
				continue // the tightest limit of an admission may be either rule's
			}
			m := admittedItem.FindStringSubmatch(a.header.Get("RateLimit"))
			if m == nil {
				t.Errorf("admitted: RateLimit %q is not the %s item", a.header.Get("RateLimit"), rule)
				continue
			}
			r, _ := strconv.Atoi(m[1])
			remaining[r]++
			if a.header.Get("Retry-After") != "" {
				t.Errorf("admitted with Retry-After %q", a.header.Get("Retry-After"))
			}
		case http.StatusTooManyRequests:
			denied++
			checkDenial(t, a, rule, windowS)
		default:
			t.Errorf("status %d: %s", a.status, a.body)
		}
	}
	t.Logf("%s: %d admitted, %d denied; levels %v", rule, admitted, denied, levels)
	if admitted != limit || denied != clients*perClient-limit {
		t.Fatalf("admitted %d and denied %d of %d requests; want exactly %d admitted", admitted, denied, clients*perClient, limit)
	}
	if rule == "per-user" {
		// Each admission took the next unit: remaining 49, 48, ..., 0, once each.
		for r := range limit {
			if remaining[r] != 1 {
				t.Errorf("remaining %d seen %d times among the admissions, want once (all: %v)", r, remaining[r], remaining)
			}
		}
	}
	// The limit was counted in Redis, under the rule's key.
	key := "{api}:global"
	if rule == "per-user" {
		key = "{api}:user:user:alice"
	}
	n, err := srv.Client().Exists(context.Background(), key).Result()
	if err != nil || n != 1 {
		t.Errorf("EXISTS %s = %d (%v), want 1", key, n, err)
	}
}

// checkDenial checks a 429's fields against each other and the contract's
// form: Retry-After in 1..window, RateLimit the rule's item with r=0 and t
// at least Retry-After, the problem body byte for byte as the kit writes it
// for that Retry-After.
func checkDenial(t *testing.T, a answer, rule string, windowS int) {
	t.Helper()
	ra, err := strconv.Atoi(a.header.Get("Retry-After"))
	if err != nil || ra < 1 || ra > windowS {
		t.Errorf("denied: Retry-After %q, want 1..%d", a.header.Get("Retry-After"), windowS)
		return
	}
	m := regexp.MustCompile(`^"` + rule + `";r=0;t=(\d+)$`).FindStringSubmatch(a.header.Get("RateLimit"))
	if m == nil {
		t.Errorf("denied: RateLimit %q, want the %s item with r=0", a.header.Get("RateLimit"), rule)
		return
	}
	// The server's limiters run on its wall clock (CLOCK_REALTIME, as
	// Redis's expiry): a clock stepped back a few milliseconds between two
	// calls leaves the newest entry "in the future", and its reset is then
	// window + those milliseconds, one more second once rounded up (seen once
	// on Valkey under load: t=61 for a 60 s window).
	if reset, _ := strconv.Atoi(m[1]); reset < ra || reset > windowS+1 {
		t.Errorf("denied: RateLimit t=%d with Retry-After %d (window %d s)", reset, ra, windowS)
	}
	if ct := a.header.Get("Content-Type"); ct != "application/problem+json" {
		t.Errorf("denied: Content-Type %q", ct)
	}
	want := fmt.Sprintf(`{"detail":"rate limit \"%s\" exceeded; retry after %d s","status":429,`+
		`"title":"Request cannot be satisfied as assigned quota has been exceeded",`+
		`"type":"https://iana.org/assignments/http-problem-types#quota-exceeded","violated-policies":["%s"]}`, rule, ra, rule)
	if a.body != want {
		t.Errorf("denied: body\n%s\nwant\n%s", a.body, want)
	}
}

// TestE2ERedisKilled: kill -9 of Redis under load against instances of the
// example, in each fallback mode (local: three instances; open and closed:
// two). They keep answering, never an error or a 5xx; the fallback decides
// (its answers counted by the level header): local and open admit, closed
// denies with Retry-After (the breaker's 1 s) and the problem body; every
// breaker opens, requests are then decided without a call, and no call
// waited for its deadline (the limiters counted no timeout: with a 2 s
// deadline, a wait for it would be one). When Redis restarts, each
// instance's probe closes its breaker and decisions come from Redis again.
func TestE2ERedisKilled(t *testing.T) {
	for _, c := range []struct {
		mode      string
		instances int
	}{{"local", 3}, {"open", 2}, {"closed", 2}} {
		t.Run(c.mode, func(t *testing.T) { redisKilled(t, c.mode, c.instances) })
	}
}

func redisKilled(t *testing.T, mode string, n int) {
	srv := testserver.Start(t, testserver.Redis)
	var instances []*instance
	for range n {
		instances = append(instances, startInstance(t,
			"-redis", srv.Addr(), "-limit", "100000", "-window", "60s",
			"-global-limit", "100000", "-instances", strconv.Itoa(n), "-deadline", "2s", "-fallback", mode))
	}

	var (
		redisAnswers, fallbackAnswers atomic.Int64
		fallbackDenials               atomic.Int64
		failures                      atomic.Int64
		lastErr                       atomic.Value
		mu                            sync.Mutex
		wrong                         []string // answers that break the mode's rule
		stop                          = make(chan struct{})
		wg                            sync.WaitGroup
	)
	bad := func(format string, a ...any) {
		mu.Lock()
		if len(wrong) < 10 {
			wrong = append(wrong, fmt.Sprintf(format, a...))
		}
		mu.Unlock()
	}
	// Per instance: the answers decided by Redis, for the return to Redis.
	perInstance := make([]atomic.Int64, n)
	for i := range 12 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c := &http.Client{Transport: &http.Transport{}, Timeout: testserver.Patience}
			defer c.CloseIdleConnections()
			for j := 0; ; j++ {
				select {
				case <-stop:
					return
				default:
				}
				k := (i + j) % n
				a := get(c, instances[k].url+"/hello", fmt.Sprintf("u%d", i))
				if a.err != nil {
					failures.Add(1)
					lastErr.Store(a.err)
					continue
				}
				switch level := a.header.Get("X-RateLimit-Level"); level {
				case "redis", "local":
					redisAnswers.Add(1)
					perInstance[k].Add(1)
					if a.status != http.StatusOK {
						bad("decided by %s: status %d (the limits are not reached)", level, a.status)
					}
				case "fallback":
					fallbackAnswers.Add(1)
					if a.status == http.StatusTooManyRequests {
						fallbackDenials.Add(1)
					}
					if mode == "closed" {
						if a.status != http.StatusTooManyRequests || a.header.Get("Retry-After") != "1" ||
							a.header.Get("Content-Type") != ratelimit.ProblemContentType || !strings.Contains(a.body, `"status":429`) {
							bad("closed fallback: status %d, Retry-After %q, %s", a.status, a.header.Get("Retry-After"), a.body)
						}
					} else if a.status != http.StatusOK {
						bad("%s fallback: status %d %s", mode, a.status, a.body)
					}
				default:
					bad("level %q, status %d", level, a.status)
				}
			}
		}()
	}
	defer func() {
		select {
		case <-stop:
		default:
			close(stop)
		}
		wg.Wait()
	}()

	testserver.WaitUntil(t, "200 answers decided by Redis", func() bool { return redisAnswers.Load() >= 200 })
	t0 := time.Now()
	srv.Kill9()
	before := fallbackAnswers.Load()
	testserver.WaitUntil(t, "300 answers of the fallback, and every breaker open", func() bool {
		if fallbackAnswers.Load()-before < 300 {
			return false
		}
		for _, in := range instances {
			if in.stats(t).BreakerOpened == 0 {
				return false
			}
		}
		return true
	})
	for i, in := range instances {
		s := in.stats(t)
		if s.BreakerSkipped == 0 || s.FallbackAdmitted+s.FallbackDenied == 0 {
			t.Errorf("instance %d while Redis is down: %+v; want requests decided by the fallback without a call", i, s)
		}
	}
	t.Logf("%s: the fallback and the breakers took %v", mode, time.Since(t0))
	t1 := time.Now()
	srv.Restart()
	mark := make([]int64, n)
	for k := range instances {
		mark[k] = perInstance[k].Load()
	}
	testserver.WaitUntil(t, "every instance deciding with Redis again", func() bool {
		for k := range instances {
			if perInstance[k].Load()-mark[k] < 50 {
				return false
			}
		}
		return true
	})
	t.Logf("%s: back to Redis in %v", mode, time.Since(t1))
	close(stop)
	wg.Wait()

	if n := failures.Load(); n != 0 {
		t.Errorf("%d requests failed (last: %v): the service must keep answering", n, lastErr.Load())
	}
	for _, w := range wrong {
		t.Error(w)
	}
	for i, in := range instances {
		s := in.stats(t)
		if s.RedisTimeouts != 0 {
			t.Errorf("instance %d: %d calls waited for their deadline (2 s): %+v", i, s.RedisTimeouts, s)
		}
		if s.ProbesOK == 0 {
			t.Errorf("instance %d: no probe closed the breaker: %+v", i, s)
		}
	}
	// The metrics counted the fallback's decisions too, exactly: an
	// admission once for each of the two rules, a denial once.
	var counted float64
	for _, in := range instances {
		counted += in.metric(t, "ratelimit_decisions_total", `level="fallback"`)
	}
	if want := 2*(fallbackAnswers.Load()-fallbackDenials.Load()) + fallbackDenials.Load(); counted != float64(want) {
		t.Errorf("/metrics counted %v decisions of the fallback; its %d answers (%d denials) make %d", counted, fallbackAnswers.Load(), fallbackDenials.Load(), want)
	}
	t.Logf("%s: %d answers decided by Redis, %d by the fallback (%v in the metrics)", mode, redisAnswers.Load(), fallbackAnswers.Load(), counted)
}

// metric sums the samples of a family on the instance's /metrics whose
// labels contain match.
func (in *instance) metric(t *testing.T, family, match string) float64 {
	t.Helper()
	resp, err := http.Get(in.url + "/metrics")
	if err != nil {
		t.Fatalf("GET /metrics: %v", err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("GET /metrics: %v", err)
	}
	var sum float64
	for _, line := range strings.Split(string(b), "\n") {
		if !strings.HasPrefix(line, family+"{") || !strings.Contains(line, match) {
			continue
		}
		f := strings.Fields(line)
		if v, err := strconv.ParseFloat(f[len(f)-1], 64); err == nil {
			sum += v
		}
	}
	return sum
}

package ratelimit

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis-ratelimit/redis-ratelimit/clients/go/internal/testserver"
	"github.com/redis/go-redis/v9"
)

// policyStatsOf is RL.POLICY STATS name of one server, read by hand: the
// top-level integers (scale, stage, ...) and the current and last
// windows' fields as "current.ok", "last.denied", ...
func policyStatsOf(t *testing.T, s *testserver.Server, name string) map[string]int64 {
	t.Helper()
	v, err := s.Do(context.Background(), "RL.POLICY", "STATS", name)
	if err != nil {
		t.Fatalf("RL.POLICY STATS %s: %v", name, err)
	}
	out := map[string]int64{}
	flatten("", v, out)
	return out
}

func flatten(prefix string, v any, out map[string]int64) {
	items, ok := v.([]any)
	if !ok {
		if m, isMap := v.(map[any]any); isMap {
			for k, x := range m {
				items = append(items, k, x)
			}
		} else {
			return
		}
	}
	for i := 0; i+1 < len(items); i += 2 {
		k := fmt.Sprint(items[i])
		switch x := items[i+1].(type) {
		case int64:
			out[prefix+k] = x
		default:
			flatten(prefix+k+".", x, out)
		}
	}
}

func mustDo(t *testing.T, s *testserver.Server, args ...any) any {
	t.Helper()
	v, err := s.Do(context.Background(), args...)
	if err != nil {
		t.Fatalf("%v: %v", args, err)
	}
	return v
}

func newTestClient(t *testing.T, rdb redis.UniversalClient) *Client {
	t.Helper()
	c, err := NewClient(context.Background(), rdb, WithDeadline(2*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

func startProtection(t *testing.T, c *Client, opts ...ProtectionOption) *Protection {
	t.Helper()
	p, err := NewProtection(c, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close(context.Background()) })
	return p
}

func TestProtectionRefusesBadOptions(t *testing.T) {
	if _, err := NewProtection(nil); err == nil {
		t.Fatal("a nil client was accepted")
	}
	srv := testserver.Start(t, testserver.Redis)
	c := newTestClient(t, srv.Client())
	_, err := NewProtection(c, WithStagePoll(time.Second), WithStageHold(time.Second))
	var ia *InvalidArgumentError
	if !errors.As(err, &ia) || ia.Arg != "stage_hold" {
		t.Fatalf("a stage hold equal to the poll: %v, want an *InvalidArgumentError naming stage_hold", err)
	}
	if _, err := NewProtection(c, WithPolicies("")); !errors.As(err, &ia) || ia.Arg != "policy name" {
		t.Fatalf("an empty policy name: %v", err)
	}
}

// TestProtectionCircuitBreaker: consecutive failures open it, a success
// resets the count, an open breaker lets calls try after its time, a
// forced one refuses until released.
func TestProtectionCircuitBreaker(t *testing.T) {
	b := NewCircuitBreaker("down", CircuitBreakerConfig{Failures: 3, OpenFor: time.Hour})
	b.Record(false)
	b.Record(false)
	b.Record(true)
	b.Record(false)
	b.Record(false)
	if b.State() != BreakerClosed {
		t.Fatalf("two failures after a success: %v", b.State())
	}
	b.Record(false)
	if b.State() != BreakerOpen || b.Allow() {
		t.Fatalf("three consecutive failures: %v", b.State())
	}
	called := false
	err := b.Call(func() error { called = true; return nil })
	if !errors.Is(err, ErrBreakerOpen) || called {
		t.Fatalf("Call on an open breaker: %v, called %v", err, called)
	}

	quick := NewCircuitBreaker("quick", CircuitBreakerConfig{Failures: 2, OpenFor: time.Nanosecond})
	quick.Record(false)
	quick.Record(false)
	testserver.WaitUntil(t, "the open time to pass", quick.Allow)
	if err := quick.Call(func() error { return io.EOF }); !errors.Is(err, io.EOF) {
		t.Fatalf("the call's own error: %v", err)
	}
	quick.mu.Lock()
	reopened := quick.state == BreakerOpen
	quick.mu.Unlock()
	if !reopened {
		t.Fatal("one failure after the open time did not open it again")
	}

	f := NewCircuitBreaker("forced", CircuitBreakerConfig{})
	f.ForceOpen()
	f.Record(true)
	if f.State() != BreakerForcedOpen || f.Allow() {
		t.Fatalf("forced open: %v", f.State())
	}
	f.Release()
	if f.State() != BreakerClosed || !f.Allow() {
		t.Fatalf("released: %v", f.State())
	}
	if s := BreakerForcedOpen.String(); s != "forced_open" {
		t.Fatalf("String: %q", s)
	}
}

// TestProtectionErrorsLowerTheScaleAndItRecovers: outcomes with 10 %
// errors against ADAPT ERRORS 5 MIN 80: the server lowers the policy's
// scale to 80 at the end of its window and the loop reads it; once the
// errors stop the scale climbs back by RECOVER per window to 100.
func TestProtectionErrorsLowerTheScaleAndItRecovers(t *testing.T) {
	srv := testserver.Start(t, testserver.Redis)
	mustDo(t, srv, "RL.POLICY", "SET", "adapt", "TOKENBUCKET", 100000, 100000, 1000,
		"ADAPT", "ERRORS", 5, "MIN", 80, "RECOVER", 10, "WINDOW", 1000, "MINCALLS", 20)
	c := newTestClient(t, srv.Client())
	p := startProtection(t, c, WithPolicies("adapt"),
		WithReportInterval(50*time.Millisecond), WithStagePoll(50*time.Millisecond))
	var failing atomic.Bool
	failing.Store(true)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			select {
			case <-stop:
				return
			case <-time.After(5 * time.Millisecond):
			}
			// Ten outcomes a tick, one an error while failing: 10 %, and
			// MINCALLS reached in every window even on a slow machine.
			for j := 0; j < 10; j++ {
				p.Record("adapt", failing.Load() && j == 0)
			}
		}
	}()
	defer func() { close(stop); wg.Wait() }()

	testserver.WaitUntil(t, "the loop to read scale 80", func() bool { return p.Scale("adapt") == 80 })
	if got := policyStatsOf(t, srv, "adapt")["scale"]; got != 80 {
		t.Fatalf("the server's scale: %d, want 80", got)
	}
	failing.Store(false)
	seen := []int{80}
	testserver.WaitUntil(t, "the scale back at 100", func() bool {
		s := p.Scale("adapt")
		if s != seen[len(seen)-1] {
			seen = append(seen, s)
		}
		return s == 100
	})
	for i := 1; i < len(seen); i++ {
		if seen[i] < seen[i-1] {
			t.Fatalf("the scale went %v: it should only climb", seen)
		}
	}
	if len(seen) < 2 {
		t.Fatalf("scales seen %v", seen)
	}
	testserver.WaitUntil(t, "the loop to count a report", func() bool { return p.Stats().ReportsSent > 0 })
	st := p.Stats()
	if st.ReportsSent == 0 || st.OutcomesSent == 0 || st.ReadsOK == 0 {
		t.Fatalf("the loop's counters: %+v", st)
	}
}

// TestProtectionStagesDegradeBreakAndRecover: denials above STAGES 20 50
// move the policy to stage 2 (break): a non-core route answers with its
// degrade handler (the route does not run), one without a handler
// answers 429, a core route runs, the bound breaker is forced open; when
// the denials stop, the stage falls one per window and everything comes
// back.
func TestProtectionStagesDegradeBreakAndRecover(t *testing.T) {
	srv := testserver.Start(t, testserver.Redis)
	mustDo(t, srv, "RL.POLICY", "SET", "staged", "TOKENBUCKET", 2, 2, 60000, "STAGES", 20, 50, "WINDOW", 1000)
	c := newTestClient(t, srv.Client())
	p := startProtection(t, c, WithReportInterval(50*time.Millisecond), WithStagePoll(50*time.Millisecond))
	l := newTestLimiter(t, c, WithProtection(p))
	set := mustRuleSet(t, l, PolicyRule("staged", "staged").WithBreaker("downstream"))
	breakers := p.WatchRules(set)
	breaker := breakers["downstream"]
	if b, ok := p.FindBreaker("downstream"); !ok || b != breaker || len(breakers) != 1 {
		t.Fatal("FindBreaker does not find the breaker the rule names")
	}
	if got := p.Policies(); len(got) != 1 || got[0] != "staged" {
		t.Fatalf("policies watched: %v", got)
	}

	var routeRuns atomic.Int64
	route := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		routeRuns.Add(1)
		_, _ = io.WriteString(w, "fresh")
	})
	degrade := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		info, _ := DegradeInfoFrom(r.Context())
		if info.Reason != DegradeStage {
			t.Errorf("degrade reason %v at a stage", info.Reason)
		}
		_, _ = io.WriteString(w, "cached at stage "+info.Stage.String())
	})
	mux := http.NewServeMux()
	mux.Handle("/search", ProtectMiddleware(p, "staged", ProtectDegrade(degrade))(route))
	mux.Handle("/extras", ProtectMiddleware(p, "staged", ProtectNonCore())(route))
	mux.Handle("/core", ProtectMiddleware(p, "staged")(route))
	web := httptest.NewServer(mux)
	defer web.Close()
	get := func(path string) (int, string, http.Header) {
		t.Helper()
		resp, err := http.Get(web.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(body), resp.Header
	}
	if code, body, _ := get("/search"); code != 200 || body != "fresh" {
		t.Fatalf("stage 0: %d %q", code, body)
	}

	// Denials: every RL.HIT past the bucket's 2 units, until stage 2.
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			select {
			case <-stop:
				return
			case <-time.After(5 * time.Millisecond):
			}
			_, _ = srv.Do(context.Background(), "RL.HIT", "staged", "someone")
		}
	}()
	testserver.WaitUntil(t, "stage 2 read by the loop", func() bool { return p.Stage("staged") == StageBreak })
	testserver.WaitUntil(t, "the breaker forced open", func() bool { return breaker.State() == BreakerForcedOpen })
	if got := policyStatsOf(t, srv, "staged")["stage"]; got < 1 {
		t.Fatalf("the server's stage: %d", got)
	}

	runs := routeRuns.Load()
	code, body, _ := get("/search")
	if code != 200 || !strings.HasPrefix(body, "cached at stage ") {
		t.Fatalf("a non-core route with a degrade handler at a stage: %d %q", code, body)
	}
	code, body, h := get("/extras")
	if code != http.StatusTooManyRequests || h.Get("Retry-After") != "1" || !strings.Contains(body, `"violated-policies":["staged"]`) {
		t.Fatalf("a non-core route without a handler at a stage: %d %q %v", code, body, h)
	}
	if routeRuns.Load() != runs {
		t.Fatal("a degraded route ran")
	}
	if code, body, _ := get("/core"); code != 200 || body != "fresh" {
		t.Fatalf("a core route at a stage: %d %q", code, body)
	}

	// No more denials: the stage falls one per window, to 0.
	close(stop)
	wg.Wait()
	testserver.WaitUntil(t, "the stage back at 0", func() bool { return p.Stage("staged") == StageNormal })
	testserver.WaitUntil(t, "the breaker released", func() bool { return breaker.State() == BreakerClosed })
	if code, body, _ := get("/search"); code != 200 || body != "fresh" {
		t.Fatalf("after recovery: %d %q", code, body)
	}
}

// TestProtectionMiddlewareReportsOutcomes: 2xx are ok; a 5xx, a panic and
// a predicate's errors are errors; local denials leave as DENIED n; the
// server's window counts them all. On every server kind.
func TestProtectionMiddlewareReportsOutcomes(t *testing.T) {
	for _, kind := range testserver.Kinds {
		t.Run(kind.String(), func(t *testing.T) { middlewareReportsOutcomes(t, kind) })
	}
}

func middlewareReportsOutcomes(t *testing.T, kind testserver.Kind) {
	srv := testserver.Start(t, kind)
	mustDo(t, srv, "RL.POLICY", "SET", "counted", "TOKENBUCKET", 100, 100, 1000, "STAGES", 100, 100, "WINDOW", 600000)
	c := newTestClient(t, srv.Client())
	p := startProtection(t, c, WithReportInterval(50*time.Millisecond), WithStagePoll(50*time.Millisecond))

	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/fail":
			w.WriteHeader(http.StatusBadGateway)
		case "/panic":
			panic(http.ErrAbortHandler)
		case "/teapot":
			w.WriteHeader(http.StatusTeapot)
		default:
			_, _ = io.WriteString(w, "ok")
		}
	})
	teapotIsError := ProtectErrorWhen(func(_ *http.Request, status int) bool { return status >= 500 || status == http.StatusTeapot })
	web := httptest.NewServer(ProtectMiddleware(p, "counted", teapotIsError)(handler))
	defer web.Close()
	for _, path := range []string{"/a", "/b", "/c", "/fail", "/panic", "/teapot"} {
		// POST: the transport does not send it again when the panic
		// closes the connection.
		resp, err := http.Post(web.URL+path, "text/plain", strings.NewReader("x"))
		if err == nil {
			resp.Body.Close()
		}
	}
	p.RecordDenied("counted")
	p.RecordDenied("counted")
	var last map[string]int64
	defer func() {
		if t.Failed() {
			t.Logf("the server's last stats: %v; the loop's: %+v", last, p.Stats())
		}
	}()
	testserver.WaitUntil(t, "3 ok and 3 errors in the server's window", func() bool {
		st := policyStatsOf(t, srv, "counted")
		last = st
		return st["current.ok"] == 3 && st["current.errors"] == 3 && st["current.denied"] == 2
	})
	// The server applies a report before its reply reaches the loop, which
	// counts it then (CI saw the server's counts and the loop's zeros).
	testserver.WaitUntil(t, "the loop to count its report", func() bool {
		st := p.Stats()
		return st.OutcomesSent+st.OutcomesLost >= 6 && st.DeniedSent+st.DeniedLost >= 2
	})
	st := p.Stats()
	if st.OutcomesSent != 6 || st.DeniedSent != 2 || st.OutcomesPending != 0 {
		t.Fatalf("the loop's counters: %+v", st)
	}
	if got := p.Policies(); len(got) != 1 || got[0] != "counted" {
		t.Fatalf("policies watched: %v", got)
	}
}

// TestProtectionCloseSendsWhatIsPending: Close sends the counts not sent
// yet once, and nothing after.
func TestProtectionCloseSendsWhatIsPending(t *testing.T) {
	srv := testserver.Start(t, testserver.Redis)
	mustDo(t, srv, "RL.POLICY", "SET", "plain", "TOKENBUCKET", 10, 10, 1000, "STAGES", 100, 100, "WINDOW", 600000)
	c := newTestClient(t, srv.Client())
	p, err := NewProtection(c, WithReportInterval(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 4; i++ {
		p.Record("plain", i%2 == 0)
	}
	if st := p.Stats(); st.OutcomesPending != 4 {
		t.Fatalf("pending before Close: %+v", st)
	}
	if err := p.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	st := policyStatsOf(t, srv, "plain")
	if st["current.ok"] != 2 || st["current.errors"] != 2 {
		t.Fatalf("after Close: %v", st)
	}
	p.Record("plain", false)
	if err := p.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	if got := policyStatsOf(t, srv, "plain")["current.ok"]; got != 2 {
		t.Fatalf("a closed loop sent more: ok %d", got)
	}
}

// TestProtectionHighestStageAndLowestScaleOfEveryMasterWin: on a
// 3-master cluster the loop reads every master: the lowest scale (one
// master's) and the highest stage (another's) win.
func TestProtectionHighestStageAndLowestScaleOfEveryMasterWin(t *testing.T) {
	cl := testserver.StartCluster(t, 3)
	for _, m := range cl.Nodes {
		mustDo(t, m, "RL.POLICY", "SET", "spread", "TOKENBUCKET", 1, 1, 60000, "STAGES", 0, 0, "WINDOW", 3000)
	}
	mustDo(t, cl.Nodes[1], "RL.POLICY", "SCALE", "spread", 60)
	c := newTestClient(t, cl.ClusterClient())
	p := startProtection(t, c, WithPolicies("spread"), WithStagePoll(50*time.Millisecond))
	testserver.WaitUntil(t, "the lowest scale", func() bool { return p.Scale("spread") == 60 })
	if s := p.Stage("spread"); s != StageNormal {
		t.Fatalf("stage %v before any denial", s)
	}
	// Two hits on master 2 alone (a key of its slots): one denial.
	var key string
	for i := 0; ; i++ {
		key = fmt.Sprintf("k%d", i)
		if cl.NodeForSlot(KeySlot(key)) == cl.Nodes[2] {
			break
		}
	}
	mustDo(t, cl.Nodes[2], "RL.HIT", "spread", key)
	mustDo(t, cl.Nodes[2], "RL.HIT", "spread", key)
	breaker := p.Breaker("down", "spread")
	testserver.WaitUntil(t, "stage 2 from master 2", func() bool { return p.Stage("spread") == StageBreak })
	zero := 0
	for _, m := range cl.Nodes[:2] {
		if policyStatsOf(t, m, "spread")["stage"] == 0 {
			zero++
		}
	}
	if zero != 2 {
		t.Fatalf("masters 0 and 1 should be at stage 0 (%d are)", zero)
	}
	testserver.WaitUntil(t, "the breaker forced open", func() bool { return breaker.State() == BreakerForcedOpen })
	if s := p.Scale("spread"); s != 60 {
		t.Fatalf("scale %d, want 60", s)
	}
	if err := p.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	if breaker.State() != BreakerClosed {
		t.Fatal("Close did not release the breaker it forced open")
	}
}

// TestProtectionAroundTheRateLimit: ProtectMiddleware outside a Limiter's
// Middleware: admitted requests are outcomes, a denial (429) is none, and
// a route with a degrade handler answers a denial with it.
func TestProtectionAroundTheRateLimit(t *testing.T) {
	srv := testserver.Start(t, testserver.Redis)
	mustDo(t, srv, "RL.POLICY", "SET", "api", "FIXEDWINDOW", 2, 600000, "STAGES", 100, 100, "WINDOW", 600000)
	c := newTestClient(t, srv.Client())
	p := startProtection(t, c, WithReportInterval(50*time.Millisecond), WithStagePoll(50*time.Millisecond))
	l := newTestLimiter(t, c, WithDenyCache(false))
	set := mustRuleSet(t, l, PolicyRule("api", "api"))
	route := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { _, _ = io.WriteString(w, "fresh") })
	degrade := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		info, ok := DegradeInfoFrom(r.Context())
		if !ok || info.Reason != DegradeDenied {
			t.Errorf("degrade info %+v %v", info, ok)
		}
		_, _ = io.WriteString(w, "cached")
	})
	limited := Middleware(l, set, KeyByHeader("X-User"))(route)
	mux := http.NewServeMux()
	mux.Handle("/plain", ProtectMiddleware(p, "api")(limited))
	mux.Handle("/soft", ProtectMiddleware(p, "api", ProtectDegrade(degrade))(limited))
	web := httptest.NewServer(mux)
	defer web.Close()
	get := func(path, user string) (int, string, http.Header) {
		t.Helper()
		req, _ := http.NewRequest(http.MethodGet, web.URL+path, nil)
		req.Header.Set("X-User", user)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(body), resp.Header
	}
	for i := 0; i < 2; i++ {
		if code, body, _ := get("/plain", "ann"); code != 200 || body != "fresh" {
			t.Fatalf("admitted: %d %q", code, body)
		}
	}
	if code, _, h := get("/plain", "ann"); code != http.StatusTooManyRequests || h.Get("Retry-After") == "" {
		t.Fatalf("the third of a limit of 2: %d %v", code, h)
	}
	code, body, h := get("/soft", "ann")
	if code != 200 || body != "cached" || h.Get("Retry-After") != "" || h.Get("Content-Type") == ProblemContentType {
		t.Fatalf("a denial on a route with a degrade handler: %d %q %v", code, body, h)
	}
	testserver.WaitUntil(t, "2 outcomes in the server's window", func() bool {
		return p.Stats().OutcomesSent == 2 && policyStatsOf(t, srv, "api")["current.ok"] == 2
	})
	if st := policyStatsOf(t, srv, "api"); st["current.errors"] != 0 || st["current.denied"] != 2 {
		t.Fatalf("the server's window: %v", st)
	}
}

// TestProtectionLimiterCountsLocalDenials: a Limiter given the loop
// (WithProtection) counts the denials its deny cache answers; they leave
// with the report as DENIED n and the server's window counts them.
func TestProtectionLimiterCountsLocalDenials(t *testing.T) {
	srv := testserver.Start(t, testserver.Redis)
	mustDo(t, srv, "RL.POLICY", "SET", "cached", "TOKENBUCKET", 1, 1, 60000, "STAGES", 100, 100, "WINDOW", 600000)
	c := newTestClient(t, srv.Client())
	p := startProtection(t, c, WithReportInterval(50*time.Millisecond), WithStagePoll(50*time.Millisecond))
	l := newTestLimiter(t, c, WithProtection(p), WithDenyCacheMax(time.Minute))
	set := mustRuleSet(t, l, PolicyRule("cached", "cached"))
	paths := map[Path]int{}
	for i := 0; i < 10; i++ {
		d := l.Check(context.Background(), set, "someone", 1)
		paths[d.Path]++
	}
	if paths[PathDenyCache] != 8 || paths[PathRedis] != 2 {
		t.Fatalf("paths %v: want 2 from Redis, 8 from the deny cache", paths)
	}
	testserver.WaitUntil(t, "the 8 local denials in the server's window", func() bool {
		st := policyStatsOf(t, srv, "cached")
		return st["current.calls"] == 10 && st["current.denied"] == 9
	})
	// The server applies a report before its reply reaches the loop.
	testserver.WaitUntil(t, "the loop to count its report", func() bool {
		st := p.Stats()
		return st.DeniedSent+st.DeniedLost >= 8
	})
	if st := p.Stats(); st.DeniedSent != 8 {
		t.Fatalf("the loop's counters: %+v", st)
	}
}

// TestProtectionLocalOnlyFallbackRunsAPolicyAtItsLastScale: with Redis
// gone, a policy of 10 at scale 50 admits 5 per key through a limiter
// given the loop, 10 through one without.
func TestProtectionLocalOnlyFallbackRunsAPolicyAtItsLastScale(t *testing.T) {
	srv := testserver.Start(t, testserver.Redis)
	mustDo(t, srv, "RL.POLICY", "SET", "halved", "TOKENBUCKET", 10, 10, 60000)
	mustDo(t, srv, "RL.POLICY", "SCALE", "halved", 50)
	c := newTestClient(t, srv.Client())
	p := startProtection(t, c, WithPolicies("halved"), WithStagePoll(50*time.Millisecond))
	testserver.WaitUntil(t, "the scale read", func() bool { return p.Scale("halved") == 50 })
	scaled := newTestLimiter(t, c, WithProtection(p), WithCallDeadline(200*time.Millisecond))
	plain := newTestLimiter(t, c, WithCallDeadline(200*time.Millisecond))
	setScaled := mustRuleSet(t, scaled, PolicyRule("halved", "halved"))
	setPlain := mustRuleSet(t, plain, PolicyRule("halved", "halved"))
	srv.Kill9()
	var counts []int
	for _, lc := range []struct {
		l   *Limiter
		set *RuleSet
	}{{scaled, setScaled}, {plain, setPlain}} {
		n := 0
		for i := 0; i < 20; i++ {
			d := lc.l.Check(context.Background(), lc.set, "someone", 1)
			if d.Path != PathFallback {
				t.Fatalf("with Redis gone: %+v", d)
			}
			if d.Allowed {
				n++
			}
		}
		counts = append(counts, n)
	}
	if counts[0] != 5 || counts[1] != 10 {
		t.Fatalf("admitted %v, want [5 10] (scaled, then as read)", counts)
	}
	if s := p.Scale("halved"); s != 50 {
		t.Fatalf("the scale was not kept while Redis is away: %d", s)
	}
}

// TestProtectionMetrics: the loop exports each policy's scale and stage
// and its breakers' state through *Metrics.
func TestProtectionMetrics(t *testing.T) {
	srv := testserver.Start(t, testserver.Redis)
	mustDo(t, srv, "RL.POLICY", "SET", "watched", "TOKENBUCKET", 10, 10, 60000)
	mustDo(t, srv, "RL.POLICY", "SCALE", "watched", 70)
	reg := prometheus.NewRegistry()
	m, err := NewMetrics(reg)
	if err != nil {
		t.Fatal(err)
	}
	c := newTestClient(t, srv.Client())
	p := startProtection(t, c, WithPolicies("watched"), WithStagePoll(50*time.Millisecond), WithProtectionMetrics(m))
	p.Breaker("downstream", "watched")
	value := func(name, label, want string) (float64, bool) {
		families, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range families {
			if f.GetName() != name {
				continue
			}
			for _, metric := range f.GetMetric() {
				for _, l := range metric.GetLabel() {
					if l.GetName() == label && l.GetValue() == want {
						return metric.GetGauge().GetValue(), true
					}
				}
			}
		}
		return 0, false
	}
	testserver.WaitUntil(t, "ratelimit_scale{rule=\"watched\"} 70", func() bool {
		v, ok := value("ratelimit_scale", "rule", "watched")
		return ok && v == 70
	})
	if v, ok := value("ratelimit_stage", "rule", "watched"); !ok || v != 0 {
		t.Fatalf("ratelimit_stage: %v %v", v, ok)
	}
	testserver.WaitUntil(t, "ratelimit_breaker_open{breaker=\"downstream\"}", func() bool {
		v, ok := value("ratelimit_breaker_open", "breaker", "downstream")
		return ok && v == 0
	})
}

// TestProtectionALostReportIsNotRetried: reports sent while the server is
// away are lost and counted as lost, never sent again; the stage read
// before falls to normal after the stage hold; reports resume when the
// server is back.
func TestProtectionALostReportIsNotRetried(t *testing.T) {
	srv := testserver.Start(t, testserver.Redis)
	policy := []any{"RL.POLICY", "SET", "lost", "TOKENBUCKET", 10, 10, 1000, "STAGES", 0, 0, "WINDOW", 600000}
	mustDo(t, srv, policy...)
	c := newTestClient(t, srv.Client())
	p := startProtection(t, c, WithPolicies("lost"), WithReportInterval(20*time.Millisecond),
		WithStagePoll(20*time.Millisecond), WithStageHold(300*time.Millisecond))
	testserver.WaitUntil(t, "a first read", func() bool { return p.Stats().ReadsOK > 0 })
	srv.Kill9()
	for i := 0; i < 5; i++ {
		p.Record("lost", false)
	}
	testserver.WaitUntil(t, "the report lost", func() bool { return p.Stats().OutcomesLost == 5 })
	testserver.WaitUntil(t, "reads failing", func() bool { return p.Stats().ReadsFailed > 0 })
	if st := p.Stats(); st.ReportsFailed == 0 || st.OutcomesPending != 0 {
		t.Fatalf("after a lost report: %+v", st)
	}
	// A stage read just now holds for the stage hold, then falls to normal
	// while no read succeeds.
	s := p.state("lost")
	s.stage.Store(int64(StageBreak))
	s.readAt.Store(p.nowNs())
	if got := p.Stage("lost"); got != StageBreak {
		t.Fatalf("a fresh read: stage %v", got)
	}
	testserver.WaitUntil(t, "the stage to fall after the hold", func() bool { return p.Stage("lost") == StageNormal })
	srv.Restart()
	mustDo(t, srv, policy...)
	// The client is back once one of its reads succeeds: after PoolSize
	// failed dials go-redis fails every dial at once until its background
	// probe (once a second) reaches the server again, and a report sent
	// before that would be lost too (a slow machine restarts the server
	// after that breaker opened).
	readsBefore := p.Stats().ReadsOK
	testserver.WaitUntil(t, "a read answered after the restart", func() bool { return p.Stats().ReadsOK > readsBefore })
	p.Record("lost", true)
	testserver.WaitUntil(t, "the next report answered", func() bool { return p.Stats().OutcomesSent == 1 })
	if st := policyStatsOf(t, srv, "lost"); st["current.ok"] != 0 || st["current.errors"] != 1 {
		t.Fatalf("the lost outcomes were sent again: %v", st)
	}
}

// The protection loop around a route: outcomes reported, the route
// degraded at a stage, a breaker forced open at stage 2.
func ExampleProtectMiddleware() {
	ctx := context.Background()
	client, err := NewClient(ctx, redis.NewClient(&redis.Options{Addr: "127.0.0.1:6379"}))
	if err != nil {
		return
	}
	p, err := NewProtection(client, WithPolicies("api"))
	if err != nil {
		return
	}
	defer p.Close(ctx)
	limiter := NewLimiter(client, WithProtection(p)) // local denials reported, fallback at the policy's scale
	set, err := limiter.RuleSet(ctx, PolicyRule("api", "api").WithBreaker("db"))
	if err != nil {
		return
	}
	db := p.WatchRules(set)["db"] // forced open while "api" is at stage 2 (break)
	search := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if err := db.Call(func() error { return nil /* the query */ }); errors.Is(err, ErrBreakerOpen) {
			http.Error(w, "try later", http.StatusServiceUnavailable)
			return
		}
		_, _ = io.WriteString(w, "results")
	})
	cached := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { _, _ = io.WriteString(w, "cached results") })
	mux := http.NewServeMux()
	mux.Handle("/search", ProtectMiddleware(p, "api", ProtectDegrade(cached))(Middleware(limiter, set, KeyByIP())(search)))
	_ = http.ListenAndServe("127.0.0.1:8080", mux)
}

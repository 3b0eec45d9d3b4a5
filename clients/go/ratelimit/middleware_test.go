package ratelimit_test

// The net/http middleware over real HTTP (httptest.NewServer: a real
// server on loopback) and a real Redis with the module: the standard
// ServeMux, chi and gorilla/mux; the contract's header vectors reproduced
// by real decisions; keys, costs, skip, the in-flight cap, deny events.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-chi/chi/v5"
	"github.com/gorilla/mux"
	"github.com/redis-ratelimit/redis-ratelimit/clients/go/internal/testserver"
	"github.com/redis-ratelimit/redis-ratelimit/clients/go/ratelimit"
	"github.com/redis/go-redis/v9"
)

// mwLimiter is a limiter on a server started for the test.
func mwLimiter(t *testing.T, opts ...ratelimit.LimiterOption) (*ratelimit.Limiter, *testserver.Server) {
	t.Helper()
	srv := testserver.Start(t, testserver.Redis)
	ctx, cancel := context.WithTimeout(context.Background(), testserver.Patience)
	defer cancel()
	c, err := ratelimit.NewClient(ctx, srv.Client(), ratelimit.WithDeadline(2*time.Second))
	if err != nil {
		t.Fatalf("NewClient: %v", err)
	}
	l := ratelimit.NewLimiter(c, opts...)
	t.Cleanup(func() { _ = l.Close(context.Background()) })
	return l, srv
}

func mwSet(t *testing.T, l *ratelimit.Limiter, rules ...ratelimit.Rule) *ratelimit.RuleSet {
	t.Helper()
	set, err := l.RuleSet(context.Background(), rules...)
	if err != nil {
		t.Fatalf("RuleSet: %v", err)
	}
	return set
}

// mwAnswer is one response as a client saw it.
type mwAnswer struct {
	status int
	header http.Header
	body   string
}

func mwGet(t *testing.T, url string, header ...string) mwAnswer {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("GET %s: reading the body: %v", url, err)
	}
	return mwAnswer{status: resp.StatusCode, header: resp.Header, body: string(b)}
}

func mwDenialBody(rule string, retryS int) string {
	return fmt.Sprintf(`{"detail":"rate limit \"%s\" exceeded; retry after %d s","status":429,`+
		`"title":"Request cannot be satisfied as assigned quota has been exceeded",`+
		`"type":"https://iana.org/assignments/http-problem-types#quota-exceeded","violated-policies":["%s"]}`, rule, retryS, rule)
}

// mwVector is one of the contract's "headers" vectors.
type mwVector struct {
	Rule            string  `json:"rule"`
	Algorithm       string  `json:"algorithm"`
	Params          []int64 `json:"params"`
	Decision        []int64 `json:"decision"`
	RateLimit       string  `json:"ratelimit"`
	RateLimitPolicy string  `json:"ratelimit_policy"`
	RetryAfter      *int64  `json:"retry_after"`
	Body            *string `json:"body"`
}

func mwVectors(t *testing.T) []mwVector {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join("..", "..", "contract", "contract.json"))
	if err != nil {
		t.Fatal(err)
	}
	var c struct {
		Headers []mwVector `json:"headers"`
	}
	if err := json.Unmarshal(raw, &c); err != nil {
		t.Fatal(err)
	}
	if len(c.Headers) == 0 {
		t.Fatal("contract.json has no headers vectors")
	}
	return c.Headers
}

// TestMiddlewareContractVectors: the contract's header vectors that real
// time can reproduce, each from real decisions of a real server through
// the middleware over HTTP, compared byte for byte (RateLimit-Policy,
// RateLimit, Retry-After, the problem body):
//   - an admission by a fresh TOKENBUCKET or SLIDING (remaining limit-1,
//     reset one unit's time);
//   - a TOKENBUCKET's denial once drained (Retry-After 1, t the refill);
//   - a request that can never pass (its cost above the limit).
//
// The others depend on the instant (FIXEDWINDOW's and QUOTA's aligned
// windows), on a rule name the kit refuses (a quote), or on leases; the
// pure vectors test checks them all.
func TestMiddlewareContractVectors(t *testing.T) {
	l, _ := mwLimiter(t)
	ran := 0
	for i, v := range mwVectors(t) {
		allowed, limit, remaining, wait := v.Decision[0] == 1, v.Decision[1], v.Decision[2], v.Decision[3]
		var spec ratelimit.Spec
		switch v.Algorithm {
		case "TOKENBUCKET":
			spec = ratelimit.TokenBucket(v.Params[0], v.Params[1], v.Params[2])
		case "SLIDING":
			spec = ratelimit.SlidingWindow(v.Params[0], v.Params[1])
		default:
			continue
		}
		var cost uint64 = 1
		switch {
		case allowed && remaining == limit-1:
		case !allowed && wait < 0:
			cost = uint64(limit) + 1
		case !allowed && v.Algorithm == "TOKENBUCKET":
		default:
			continue
		}
		ran++
		t.Run(fmt.Sprintf("%d_%s_%s", i, v.Algorithm, v.Rule), func(t *testing.T) {
			set := mwSet(t, l, ratelimit.NewRule(v.Rule, spec).Prefix(fmt.Sprintf("mw:vec:%d:", i)))
			var calls atomic.Int64
			h := ratelimit.Middleware(l, set, ratelimit.KeyByHeader("X-User"), ratelimit.WithCost(cost))(
				http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { calls.Add(1) }))
			ts := httptest.NewServer(h)
			defer ts.Close()
			var a mwAnswer
			for n := 0; ; n++ {
				a = mwGet(t, ts.URL, "X-User", "u")
				if allowed || a.status == http.StatusTooManyRequests {
					break
				}
				if n > 1000 {
					t.Fatalf("no denial after %d requests", n)
				}
			}
			if got := a.header.Get("RateLimit-Policy"); got != v.RateLimitPolicy {
				t.Errorf("RateLimit-Policy %q, want %q", got, v.RateLimitPolicy)
			}
			if got := a.header.Get("RateLimit"); got != v.RateLimit {
				t.Errorf("RateLimit %q, want %q", got, v.RateLimit)
			}
			wantRetry := ""
			if v.RetryAfter != nil {
				wantRetry = strconv.FormatInt(*v.RetryAfter, 10)
			}
			if got := a.header.Get("Retry-After"); got != wantRetry || len(a.header.Values("Retry-After")) > 1 {
				t.Errorf("Retry-After %q, want %q", got, wantRetry)
			}
			if allowed {
				if a.status != http.StatusOK || calls.Load() != 1 {
					t.Errorf("admitted: status %d, handler called %d times", a.status, calls.Load())
				}
				return
			}
			if a.status != http.StatusTooManyRequests {
				t.Fatalf("status %d, want 429", a.status)
			}
			if a.body != *v.Body {
				t.Errorf("body\n%s\nwant\n%s", a.body, *v.Body)
			}
			if ct := a.header.Get("Content-Type"); ct != ratelimit.ProblemContentType {
				t.Errorf("Content-Type %q", ct)
			}
		})
	}
	if ran < 4 {
		t.Fatalf("only %d vectors reproduced; the contract's vectors changed?", ran)
	}
}

// mwRouterCase mounts a limited route (/items/{id}, cost 1) and a costly
// one (/export, cost 2) on a router.
type mwRouterCase struct {
	name  string
	mount func(items, export func(http.Handler) http.Handler, h http.Handler) http.Handler
}

func mwRouters() []mwRouterCase {
	return []mwRouterCase{
		{"ServeMux", func(items, export func(http.Handler) http.Handler, h http.Handler) http.Handler {
			m := http.NewServeMux()
			m.Handle("GET /items/{id}", items(h))
			m.Handle("GET /export", export(h))
			m.Handle("GET /healthz", h)
			return m
		}},
		{"chi", func(items, export func(http.Handler) http.Handler, h http.Handler) http.Handler {
			r := chi.NewRouter()
			r.With(items).Get("/items/{id}", h.ServeHTTP)
			r.With(export).Get("/export", h.ServeHTTP)
			r.Get("/healthz", h.ServeHTTP)
			return r
		}},
		{"gorilla", func(items, export func(http.Handler) http.Handler, h http.Handler) http.Handler {
			r := mux.NewRouter()
			r.Handle("/healthz", h).Methods(http.MethodGet)
			sub := r.PathPrefix("/items").Subrouter()
			sub.Use(mux.MiddlewareFunc(items))
			sub.Handle("/{id}", h).Methods(http.MethodGet)
			r.Handle("/export", export(h)).Methods(http.MethodGet)
			return r
		}},
	}
}

// TestMiddlewareRouters: with the standard ServeMux, chi and gorilla/mux,
// a route limited to 3 per minute per user admits 3 with the fields
// (RateLimit r=2, 1, 0), then answers 429 without calling the handler;
// another user is not limited by the first; a route of cost 2 on the same
// rule spends two units per request; an unlimited route carries no field.
func TestMiddlewareRouters(t *testing.T) {
	l, _ := mwLimiter(t)
	for _, rc := range mwRouters() {
		t.Run(rc.name, func(t *testing.T) {
			rule := ratelimit.NewRule("per-user", ratelimit.SlidingWindow(3, 60_000)).Prefix("mw:routers:" + rc.name + ":")
			set := mwSet(t, l, rule)
			key := ratelimit.KeyByHeader("X-User")
			var calls atomic.Int64
			h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				calls.Add(1)
				d, ok := ratelimit.DecisionFromContext(r.Context())
				fmt.Fprintf(w, "ok %v %d", ok, d.Remaining)
			})
			items := ratelimit.Middleware(l, set, key)
			export := ratelimit.Middleware(l, set, key, ratelimit.WithCost(2))
			ts := httptest.NewServer(rc.mount(items, export, h))
			defer ts.Close()
			const policy = `"per-user";q=3;w=60`

			for i, wantR := range []int{2, 1, 0} {
				a := mwGet(t, ts.URL+"/items/7", "X-User", "alice")
				if a.status != http.StatusOK {
					t.Fatalf("request %d: status %d %s", i, a.status, a.body)
				}
				if a.body != fmt.Sprintf("ok true %d", wantR) {
					t.Errorf("request %d: the handler saw %q", i, a.body)
				}
				if got := a.header.Get("RateLimit-Policy"); got != policy {
					t.Errorf("request %d: RateLimit-Policy %q", i, got)
				}
				item := a.header.Get("RateLimit")
				if !strings.HasPrefix(item, fmt.Sprintf(`"per-user";r=%d;t=`, wantR)) {
					t.Errorf("request %d: RateLimit %q, want r=%d", i, item, wantR)
				}
				if a.header.Get("Retry-After") != "" {
					t.Errorf("request %d: admitted with Retry-After", i)
				}
			}
			a := mwGet(t, ts.URL+"/items/7", "X-User", "alice")
			if a.status != http.StatusTooManyRequests {
				t.Fatalf("4th request: status %d, want 429", a.status)
			}
			if calls.Load() != 3 {
				t.Errorf("the handler ran %d times, want 3 (never for a denial)", calls.Load())
			}
			ra, err := strconv.Atoi(a.header.Get("Retry-After"))
			if err != nil || ra < 1 || ra > 60 {
				t.Fatalf("denied: Retry-After %q", a.header.Get("Retry-After"))
			}
			if a.header.Get("RateLimit-Policy") != policy || !strings.HasPrefix(a.header.Get("RateLimit"), `"per-user";r=0;t=`) {
				t.Errorf("denied: RateLimit-Policy %q RateLimit %q", a.header.Get("RateLimit-Policy"), a.header.Get("RateLimit"))
			}
			if a.body != mwDenialBody("per-user", ra) || a.header.Get("Content-Type") != ratelimit.ProblemContentType {
				t.Errorf("denied: %s %s", a.header.Get("Content-Type"), a.body)
			}
			// Another user has the whole limit; the costly route spends 2.
			b := mwGet(t, ts.URL+"/export", "X-User", "bob")
			if b.status != http.StatusOK || !strings.HasPrefix(b.header.Get("RateLimit"), `"per-user";r=1;t=`) {
				t.Errorf("bob's export (cost 2): status %d RateLimit %q, want r=1", b.status, b.header.Get("RateLimit"))
			}
			b = mwGet(t, ts.URL+"/export", "X-User", "bob")
			if b.status != http.StatusTooManyRequests || !strings.HasPrefix(b.header.Get("RateLimit"), `"per-user";r=1;t=`) {
				t.Errorf("bob's second export: status %d RateLimit %q, want 429 with r=1", b.status, b.header.Get("RateLimit"))
			}
			// The route without the middleware.
			c := mwGet(t, ts.URL+"/healthz")
			if c.status != http.StatusOK || c.header.Get("RateLimit") != "" || c.body != "ok false 0" {
				t.Errorf("unlimited route: %d %q %q", c.status, c.header.Get("RateLimit"), c.body)
			}
		})
	}
}

// TestMiddlewareMissingKey: a request without a key answers 400 with the
// problem body (as the Rust layer's MissingKey::Reject), or passes
// unlimited with MissingKeyAllow; a KeyFunc's error is a missing key; its
// panic answers 500; a nil limiter, set or key answers 500 naming it, and
// NewMiddleware returns it as an *InvalidArgumentError. Nothing panics.
func TestMiddlewareMissingKey(t *testing.T) {
	l, _ := mwLimiter(t)
	set := mwSet(t, l, ratelimit.NewRule("per-user", ratelimit.SlidingWindow(5, 60_000)).Prefix("mw:missing:"))
	var calls atomic.Int64
	h := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { calls.Add(1) })
	serve := func(mw func(http.Handler) http.Handler, header ...string) mwAnswer {
		ts := httptest.NewServer(mw(h))
		defer ts.Close()
		return mwGet(t, ts.URL, header...)
	}
	const missing = `{"detail":"this request carries no rate-limit key","status":400,"title":"Rate-limit key missing","type":"about:blank"}`

	a := serve(ratelimit.Middleware(l, set, ratelimit.KeyByHeader("X-User")))
	if a.status != http.StatusBadRequest || a.body != missing || a.header.Get("Content-Type") != ratelimit.ProblemContentType {
		t.Errorf("no header: %d %q %q", a.status, a.header.Get("Content-Type"), a.body)
	}
	if string(ratelimit.MissingKeyBody()) != missing {
		t.Errorf("MissingKeyBody %s", ratelimit.MissingKeyBody())
	}
	a = serve(ratelimit.Middleware(l, set, func(*http.Request) (string, error) { return "", errors.New("no session") }))
	if a.status != http.StatusBadRequest || a.body != missing {
		t.Errorf("KeyFunc error: %d %q", a.status, a.body)
	}
	before := calls.Load()
	a = serve(ratelimit.Middleware(l, set, ratelimit.KeyByHeader("X-User"), ratelimit.WithMissingKey(ratelimit.MissingKeyAllow)))
	if a.status != http.StatusOK || calls.Load() != before+1 || a.header.Get("RateLimit") != "" || a.header.Get("RateLimit-Policy") != "" {
		t.Errorf("MissingKeyAllow: %d, handler calls %d, RateLimit %q", a.status, calls.Load()-before, a.header.Get("RateLimit"))
	}
	a = serve(ratelimit.Middleware(l, set, func(*http.Request) (string, error) { panic("boom") }))
	if a.status != http.StatusInternalServerError || !strings.Contains(a.body, `"title":"Rate-limit key unavailable"`) || strings.Contains(a.body, "boom") {
		t.Errorf("KeyFunc panic: %d %q", a.status, a.body)
	}
	for _, c := range []struct {
		arg string
		l   *ratelimit.Limiter
		set *ratelimit.RuleSet
		key ratelimit.KeyFunc
	}{
		{"limiter", nil, set, ratelimit.KeyByIP()},
		{"rules", l, nil, ratelimit.KeyByIP()},
		{"key", l, set, nil},
	} {
		_, err := ratelimit.NewMiddleware(c.l, c.set, c.key)
		var ia *ratelimit.InvalidArgumentError
		if !errors.As(err, &ia) || ia.Arg != c.arg {
			t.Errorf("NewMiddleware with a nil %s: %v", c.arg, err)
		}
		a := serve(ratelimit.Middleware(c.l, c.set, c.key))
		if a.status != http.StatusInternalServerError || !strings.Contains(a.body, "bad argument "+c.arg) {
			t.Errorf("Middleware with a nil %s: %d %q", c.arg, a.status, a.body)
		}
	}
	// A bad in-flight rule is refused, naming it.
	_, err := ratelimit.NewMiddleware(l, set, ratelimit.KeyByIP(),
		ratelimit.WithInFlight(ratelimit.NewRule("inflight", ratelimit.FixedWindow(1, 1000))))
	var ia *ratelimit.InvalidArgumentError
	if !errors.As(err, &ia) || ia.Arg != "algorithm" {
		t.Errorf("WithInFlight of a FIXEDWINDOW rule: %v", err)
	}
}

// TestMiddlewareKeyByIP: the key is the peer's address; X-Forwarded-For is
// ignored unless the peer is a trusted proxy, and then its rightmost
// address that is not a trusted proxy is the client. Over real HTTP: a
// spoofed X-Forwarded-For does not escape the limit.
func TestMiddlewareKeyByIP(t *testing.T) {
	l, _ := mwLimiter(t)
	set := mwSet(t, l, ratelimit.NewRule("per-ip", ratelimit.SlidingWindow(2, 60_000)).Prefix("mw:ip:"))
	keys := make(chan string, 16)
	echo := func(key ratelimit.KeyFunc) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			k, err := key(r)
			if err != nil {
				k = "error: " + err.Error()
			}
			keys <- k
		})
	}
	plain := httptest.NewServer(echo(ratelimit.KeyByIP()))
	defer plain.Close()
	mwGet(t, plain.URL, "X-Forwarded-For", "203.0.113.9")
	if k := <-keys; k != "127.0.0.1" {
		t.Errorf("KeyByIP without a trusted proxy: %q, want 127.0.0.1 (X-Forwarded-For ignored)", k)
	}
	trusted := ratelimit.KeyByIP(ratelimit.TrustProxies(netip.MustParsePrefix("127.0.0.0/8"), netip.MustParsePrefix("10.0.0.0/8")))
	behind := httptest.NewServer(echo(trusted))
	defer behind.Close()
	for _, c := range []struct{ xff, want string }{
		{"203.0.113.9", "203.0.113.9"},
		{"198.51.100.1, 203.0.113.9, 10.1.2.3", "203.0.113.9"},
		{"garbage, 203.0.113.9", "203.0.113.9"},
		{"10.0.0.1, 10.0.0.2", "10.0.0.1"},
		{"203.0.113.9, not-an-ip", "127.0.0.1"},
		{"", "127.0.0.1"},
		{"[2001:db8::1]:443", "2001:db8::1"},
	} {
		mwGet(t, behind.URL, "X-Forwarded-For", c.xff)
		if k := <-keys; k != c.want {
			t.Errorf("behind a trusted proxy, X-Forwarded-For %q: key %q, want %q", c.xff, k, c.want)
		}
	}
	// Limited by IP: a new X-Forwarded-For per request does not help.
	ts := httptest.NewServer(ratelimit.Middleware(l, set, ratelimit.KeyByIP())(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {})))
	defer ts.Close()
	var statuses []int
	for i := range 3 {
		statuses = append(statuses, mwGet(t, ts.URL, "X-Forwarded-For", fmt.Sprintf("203.0.113.%d", i)).status)
	}
	if fmt.Sprint(statuses) != "[200 200 429]" {
		t.Errorf("spoofed X-Forwarded-For: statuses %v, want [200 200 429]", statuses)
	}
	// ClientIP and KeyByContext.
	type userKey struct{}
	byUser := ratelimit.KeyByContext(userKey{})
	r := httptest.NewRequest(http.MethodGet, "/", nil)
	if _, err := byUser(r); !errors.Is(err, ratelimit.ErrNoKey) {
		t.Errorf("KeyByContext without the value: %v", err)
	}
	if k, err := byUser(r.WithContext(context.WithValue(r.Context(), userKey{}, "u-42"))); k != "u-42" || err != nil {
		t.Errorf("KeyByContext: %q %v", k, err)
	}
	if _, err := ratelimit.KeyByContext(nil)(r); !errors.Is(err, ratelimit.ErrNoKey) {
		t.Errorf("KeyByContext(nil): %v", err)
	}
	r.RemoteAddr = "@unix"
	if _, err := ratelimit.KeyByIP()(r); !errors.Is(err, ratelimit.ErrNoKey) {
		t.Errorf("KeyByIP of a unix peer: %v", err)
	}
}

// TestMiddlewareSkipAndOptions: a skipped request passes unlimited; the
// level header and the X-RateLimit-* fields; WithDenied answers instead of
// the 429, with the fields already set.
func TestMiddlewareSkipAndOptions(t *testing.T) {
	l, srv := mwLimiter(t)
	set := mwSet(t, l, ratelimit.NewRule("per-user", ratelimit.SlidingWindow(1, 60_000)).Prefix("mw:opts:"))
	var calls atomic.Int64
	h := http.HandlerFunc(func(http.ResponseWriter, *http.Request) { calls.Add(1) })
	mw := ratelimit.Middleware(l, set, ratelimit.KeyByHeader("X-User"),
		ratelimit.WithSkip(func(r *http.Request) bool { return r.URL.Path == "/healthz" }),
		ratelimit.WithLevelHeader("X-RateLimit-Level"),
		ratelimit.WithXRateLimitHeaders(true),
		ratelimit.WithDenied(func(w http.ResponseWriter, _ *http.Request, d ratelimit.Decision) {
			w.WriteHeader(http.StatusServiceUnavailable)
			fmt.Fprintf(w, "degraded; rule %s", d.Rule)
		}),
	)
	ts := httptest.NewServer(mw(h))
	defer ts.Close()
	callsBefore := srv.Calls("rl.sliding")
	for range 3 {
		if a := mwGet(t, ts.URL+"/healthz"); a.status != http.StatusOK || a.header.Get("RateLimit") != "" {
			t.Fatalf("skipped: %d %q", a.status, a.header.Get("RateLimit"))
		}
	}
	if n := srv.Calls("rl.sliding") - callsBefore; n != 0 {
		t.Errorf("skipped requests made %d calls", n)
	}
	a := mwGet(t, ts.URL, "X-User", "u")
	if n := srv.Calls("rl.sliding") - callsBefore; n != 1 {
		t.Errorf("a limited request made %d RL.SLIDING calls, want 1", n)
	}
	if a.status != http.StatusOK || a.header.Get("X-RateLimit-Level") != "redis" ||
		a.header.Get("X-RateLimit-Limit") != "1" || a.header.Get("X-RateLimit-Remaining") != "0" || a.header.Get("X-RateLimit-Reset") == "" {
		t.Errorf("admitted: %d %v", a.status, a.header)
	}
	a = mwGet(t, ts.URL, "X-User", "u")
	if a.status != http.StatusServiceUnavailable || a.body != "degraded; rule per-user" ||
		a.header.Get("Retry-After") == "" || !strings.HasPrefix(a.header.Get("RateLimit"), `"per-user";r=0;t=`) {
		t.Errorf("WithDenied: %d %q %v", a.status, a.body, a.header)
	}
	// The second denial comes from the deny cache, without a call.
	a = mwGet(t, ts.URL, "X-User", "u")
	if a.header.Get("X-RateLimit-Level") != "deny_cache" {
		t.Errorf("second denial decided at %q, want deny_cache", a.header.Get("X-RateLimit-Level"))
	}
	if calls.Load() != 4 {
		t.Errorf("the handler ran %d times, want 4 (3 skipped, 1 admitted)", calls.Load())
	}
}

// TestMiddlewareInFlight: a cap of 2 requests in flight per user (a
// CONCURRENCY rule): two requests held in the handler, a third answers 429
// naming the cap, with its RateLimit-Policy item without w; once one ends
// (its lease released), the next is admitted, its RateLimit carrying the
// rate rule's item and then the cap's.
func TestMiddlewareInFlight(t *testing.T) {
	l, _ := mwLimiter(t)
	set := mwSet(t, l, ratelimit.NewRule("per-user", ratelimit.SlidingWindow(100, 60_000)).Prefix("mw:inflight:rate:"))
	release := make(chan struct{})
	entered := make(chan struct{}, 8)
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Query().Get("hold") != "" {
			entered <- struct{}{}
			<-release
		}
	})
	mw := ratelimit.Middleware(l, set, ratelimit.KeyByHeader("X-User"),
		ratelimit.WithInFlight(ratelimit.NewRule("inflight", ratelimit.ConcurrencySpec(2, 30_000)).Prefix("mw:inflight:cap:")))
	ts := httptest.NewServer(mw(h))
	defer ts.Close()
	const policy = `"per-user";q=100;w=60, "inflight";q=2`

	held := make(chan mwAnswer, 2)
	for range 2 {
		go func() { held <- mwGet(t, ts.URL+"/?hold=1", "X-User", "u") }()
	}
	<-entered
	<-entered
	a := mwGet(t, ts.URL, "X-User", "u")
	if a.status != http.StatusTooManyRequests {
		t.Fatalf("third request in flight: status %d, want 429", a.status)
	}
	ra, err := strconv.Atoi(a.header.Get("Retry-After"))
	if err != nil || ra < 1 || ra > 30 || a.body != mwDenialBody("inflight", ra) {
		t.Errorf("cap's denial: Retry-After %q body %s", a.header.Get("Retry-After"), a.body)
	}
	if a.header.Get("RateLimit-Policy") != policy || !strings.HasPrefix(a.header.Get("RateLimit"), `"inflight";r=0;t=`) {
		t.Errorf("cap's denial: RateLimit-Policy %q RateLimit %q", a.header.Get("RateLimit-Policy"), a.header.Get("RateLimit"))
	}
	// Another user has their own cap.
	if b := mwGet(t, ts.URL, "X-User", "v"); b.status != http.StatusOK {
		t.Errorf("another user: %d", b.status)
	}
	close(release)
	for range 2 {
		if b := <-held; b.status != http.StatusOK {
			t.Errorf("held request: %d", b.status)
		}
	}
	// Released before the answers were sent: a unit is free at once.
	b := mwGet(t, ts.URL, "X-User", "u")
	if b.status != http.StatusOK {
		t.Fatalf("after the held requests ended: status %d, want 200", b.status)
	}
	items := strings.Split(b.header.Get("RateLimit"), ", ")
	if len(items) != 2 || !strings.HasPrefix(items[0], `"per-user";r=`) || !strings.HasPrefix(items[1], `"inflight";r=`) {
		t.Errorf("admitted under the cap: RateLimit %q, want the rate rule's item then the cap's", b.header.Get("RateLimit"))
	}
	if b.header.Get("RateLimit-Policy") != policy {
		t.Errorf("admitted: RateLimit-Policy %q", b.header.Get("RateLimit-Policy"))
	}
}

// TestMiddlewareDenyEvents: a denial's deny event carries the client's
// address and User-Agent (and the rule, key and level).
func TestMiddlewareDenyEvents(t *testing.T) {
	var mu sync.Mutex
	var got []ratelimit.DenyEvent
	events := ratelimit.NewDenyEvents(ratelimit.CallbackSink(func(_ context.Context, batch []ratelimit.DenyEvent) error {
		mu.Lock()
		got = append(got, batch...)
		mu.Unlock()
		return nil
	}), ratelimit.WithFlushEvents(1))
	defer func() { _ = events.Close(context.Background()) }()
	l, _ := mwLimiter(t, ratelimit.WithDenyEvents(events))
	set := mwSet(t, l, ratelimit.NewRule("per-user", ratelimit.SlidingWindow(1, 60_000)).Prefix("mw:events:"))
	ts := httptest.NewServer(ratelimit.Middleware(l, set, ratelimit.KeyByHeader("X-User"))(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {})))
	defer ts.Close()
	mwGet(t, ts.URL, "X-User", "eve", "User-Agent", "mw-test/1.0")
	if a := mwGet(t, ts.URL, "X-User", "eve", "User-Agent", "mw-test/1.0"); a.status != http.StatusTooManyRequests {
		t.Fatalf("second request: %d", a.status)
	}
	testserver.WaitUntil(t, "the deny event", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(got) > 0
	})
	mu.Lock()
	ev := got[0]
	mu.Unlock()
	if ev.ClientIP != "127.0.0.1" || ev.UserAgent != "mw-test/1.0" || ev.Rule != "per-user" || ev.Key != "mw:events:eve" || ev.Level != "redis" || ev.Limit != 1 {
		t.Errorf("deny event %+v", ev)
	}
}

// ExampleMiddleware limits a chi router's API per user (a header set by the
// authenticating proxy) and globally, in one RL.ALL per request.
func ExampleMiddleware() {
	ctx := context.Background()
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:6379"})
	client, err := ratelimit.NewClient(ctx, rdb)
	if err != nil {
		log.Fatal(err) // no server, or no module: ErrModuleMissing
	}
	limiter := ratelimit.NewLimiter(client, ratelimit.WithInstances(3))
	set, err := limiter.RuleSet(ctx,
		ratelimit.NewRule("per-user", ratelimit.SlidingWindow(100, 60_000)).Prefix("{api}:user:"),
		ratelimit.NewRule("global", ratelimit.TokenBucket(5000, 500, 100)).Global("{api}:global"),
	)
	if err != nil {
		log.Fatal(err) // a bad parameter, named
	}
	r := chi.NewRouter()
	r.Use(ratelimit.Middleware(limiter, set, ratelimit.KeyByHeader("X-User")))
	r.Get("/search", func(w http.ResponseWriter, r *http.Request) { _, _ = io.WriteString(w, "results\n") })
	// A costly route: 10 units a request.
	r.With(ratelimit.Middleware(limiter, set, ratelimit.KeyByHeader("X-User"), ratelimit.WithCost(10))).
		Get("/export", func(w http.ResponseWriter, r *http.Request) {})
	log.Fatal(http.ListenAndServe("127.0.0.1:8080", r))
}

// TestMiddlewareCluster: on a 3-master cluster, a per-user and a global
// rule sharing a hash tag are one RL.ALL per request, sent to the master
// that owns the tag (no MOVED reply), and the middleware's answers are the
// same as on one server: exactly the per-user limit admitted.
func TestMiddlewareCluster(t *testing.T) {
	cluster := testserver.StartCluster(t, 3)
	ctx, cancel := context.WithTimeout(context.Background(), testserver.Patience)
	defer cancel()
	c, err := ratelimit.NewClient(ctx, cluster.ClusterClient(), ratelimit.WithDeadline(2*time.Second))
	if err != nil {
		t.Fatalf("NewClient: %v", err)
	}
	l := ratelimit.NewLimiter(c)
	defer func() { _ = l.Close(context.Background()) }()
	// Without one hash tag the set is refused, naming the key.
	_, err = l.RuleSet(ctx,
		ratelimit.NewRule("per-user", ratelimit.SlidingWindow(5, 60_000)).Prefix("user:"),
		ratelimit.NewRule("global", ratelimit.SlidingWindow(1000, 60_000)).Global("global"))
	var ia *ratelimit.InvalidArgumentError
	if !errors.As(err, &ia) || ia.Arg != "key" {
		t.Errorf("rules without a shared hash tag on a cluster: %v", err)
	}
	set := mwSet(t, l,
		ratelimit.NewRule("per-user", ratelimit.SlidingWindow(5, 60_000)).Prefix("{mw}:user:"),
		ratelimit.NewRule("global", ratelimit.SlidingWindow(1000, 60_000)).Global("{mw}:global"))
	ts := httptest.NewServer(ratelimit.Middleware(l, set, ratelimit.KeyByHeader("X-User"), ratelimit.WithLevelHeader("X-Level"))(
		http.HandlerFunc(func(http.ResponseWriter, *http.Request) {})))
	defer ts.Close()
	movedBefore := cluster.Moved()
	admitted := 0
	for range 8 {
		a := mwGet(t, ts.URL, "X-User", "ann")
		switch a.status {
		case http.StatusOK:
			admitted++
			if a.header.Get("X-Level") != "redis" {
				t.Errorf("admitted at level %q", a.header.Get("X-Level"))
			}
		case http.StatusTooManyRequests:
			ra, _ := strconv.Atoi(a.header.Get("Retry-After"))
			if a.body != mwDenialBody("per-user", ra) {
				t.Errorf("denied: %s", a.body)
			}
		default:
			t.Fatalf("status %d %s", a.status, a.body)
		}
	}
	if admitted != 5 {
		t.Errorf("admitted %d of 8, want 5", admitted)
	}
	if n := cluster.Moved() - movedBefore; n != 0 {
		t.Errorf("%d MOVED replies", n)
	}
	owner := cluster.NodeForSlot(ratelimit.KeySlot("{mw}:global"))
	if owner.Calls("rl.all") == 0 {
		t.Errorf("the master owning {mw} saw no RL.ALL")
	}
}

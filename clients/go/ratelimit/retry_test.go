package ratelimit_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis-ratelimit/redis-ratelimit/clients/go/ratelimit"
)

func TestRetryDelayIsBackoffPlusJitterNeverBeforeRetryAfter(t *testing.T) {
	p := ratelimit.DefaultRetryPolicy()
	cases := []struct {
		retry      int
		unit       float64
		retryAfter time.Duration
		want       time.Duration
	}{
		{0, 0, 0, time.Second},
		{1, 0, 0, 2 * time.Second},
		{2, 1, 0, 4500 * time.Millisecond},
		{7, 0, 0, 4 * time.Second}, // the last backoff repeats
		{0, 0.5, 7 * time.Second, 7 * time.Second},
		{2, 0, time.Second, 4 * time.Second},
		{0, 3, 0, 1500 * time.Millisecond}, // the unit is clamped
		{0, -1, 0, time.Second},
	}
	for _, c := range cases {
		if got := p.Delay(c.retry, c.unit, c.retryAfter); got != c.want {
			t.Errorf("Delay(%d, %v, %v) = %v, want %v", c.retry, c.unit, c.retryAfter, got, c.want)
		}
	}
	if got := (ratelimit.RetryPolicy{}).Delay(0, 1, 0); got != 0 {
		t.Errorf("the zero policy's delay: %v", got)
	}
}

func TestRetryAfterHeader(t *testing.T) {
	now := time.Date(2026, 12, 2, 12, 0, 0, 0, time.UTC)
	cases := []struct {
		name   string
		header http.Header
		want   time.Duration
		ok     bool
	}{
		{"seconds", http.Header{"Retry-After": {" 7 "}}, 7 * time.Second, true},
		{"an HTTP-date from the Date field", http.Header{
			"Retry-After": {"Wed, 02 Dec 2026 12:00:30 GMT"}, "Date": {"Wed, 02 Dec 2026 12:00:10 GMT"}}, 20 * time.Second, true},
		{"an HTTP-date from now", http.Header{"Retry-After": {"Wed, 02 Dec 2026 12:00:05 GMT"}}, 5 * time.Second, true},
		{"a date past", http.Header{"Retry-After": {"Wed, 02 Dec 2026 11:00:00 GMT"}}, 0, true},
		{"the RateLimit field, r=0", http.Header{"Ratelimit": {`"per-user";r=0;t=3, "global";r=0;t=9, "x";r=5;t=60`}}, 9 * time.Second, true},
		{"the RateLimit field, quotes with separators", http.Header{"Ratelimit": {`"a,b;c";r=0;t=4`}}, 4 * time.Second, true},
		{"the RateLimit field, nothing exhausted", http.Header{"Ratelimit": {`"per-user";r=2;t=3`}}, 0, false},
		{"the older dictionary", http.Header{"Ratelimit": {`limit=10, remaining=0, reset=6`}}, 6 * time.Second, true},
		{"Retry-After wins", http.Header{"Retry-After": {"2"}, "Ratelimit": {`"a";r=0;t=9`}}, 2 * time.Second, true},
		{"garbage", http.Header{"Retry-After": {"soon"}}, 0, false},
		{"nothing", http.Header{}, 0, false},
	}
	for _, c := range cases {
		got, ok := ratelimit.RetryAfterHeader(c.header, now)
		if got != c.want || ok != c.ok {
			t.Errorf("%s: %v %v, want %v %v", c.name, got, ok, c.want, c.ok)
		}
	}
	if _, ok := ratelimit.RetryAfterOf(nil); ok {
		t.Error("a nil response names a delay")
	}
}

// noWait is a policy whose waits are nothing (unless the server asks).
func noWait(retries int) ratelimit.RetryPolicy {
	return ratelimit.RetryPolicy{Backoff: []time.Duration{0}, MaxRetries: retries}
}

func TestRetryAtMostMaxRetriesThenTheLastAnswer(t *testing.T) {
	calls := 0
	last, err := ratelimit.Retry(context.Background(), noWait(3), func(_ context.Context, n int) ratelimit.Attempt[int] {
		calls++
		return ratelimit.Limited(n, 0)
	})
	if calls != 4 || last != 3 || err != nil {
		t.Fatalf("calls %d, last %d, err %v; want 4, 3, nil", calls, last, err)
	}
	calls = 0
	v, err := ratelimit.Retry(context.Background(), noWait(3), func(_ context.Context, n int) ratelimit.Attempt[string] {
		calls++
		if n == 1 {
			return ratelimit.Done("through", nil)
		}
		return ratelimit.Limited("limited", 0)
	})
	if calls != 2 || v != "through" || err != nil {
		t.Fatalf("done at the second attempt: calls %d, %q, %v", calls, v, err)
	}
	boom := errors.New("boom")
	if _, err := ratelimit.Retry(context.Background(), noWait(3), func(context.Context, int) ratelimit.Attempt[int] {
		return ratelimit.Done(0, boom)
	}); !errors.Is(err, boom) {
		t.Fatalf("an error: %v", err)
	}
	var bad *ratelimit.InvalidArgumentError
	if _, err := ratelimit.Retry[int](context.Background(), noWait(1), nil); !errors.As(err, &bad) || bad.Arg != "attempt" {
		t.Fatalf("a nil attempt: %v", err)
	}
}

// TestRetryStopsBeforeAWaitItCannotFinish: a retry that would start after
// MaxTotal, or after the context's deadline, is not waited for.
func TestRetryStopsBeforeAWaitItCannotFinish(t *testing.T) {
	p := ratelimit.RetryPolicy{Backoff: []time.Duration{time.Hour}, MaxRetries: 3, MaxTotal: time.Minute}
	calls := 0
	_, err := ratelimit.Retry(context.Background(), p, func(context.Context, int) ratelimit.Attempt[int] {
		calls++
		return ratelimit.Limited(0, 0)
	})
	if calls != 1 || err != nil {
		t.Fatalf("MaxTotal: calls %d, %v", calls, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	calls = 0
	_, err = ratelimit.Retry(ctx, noWait(3), func(context.Context, int) ratelimit.Attempt[int] {
		calls++
		return ratelimit.Limited(0, time.Hour)
	})
	if calls != 1 || err != nil {
		t.Fatalf("the deadline: calls %d, %v", calls, err)
	}
	// Cancelled during a wait: the context's error.
	ctx, cancel = context.WithCancel(context.Background())
	_, err = ratelimit.Retry(ctx, noWait(3), func(context.Context, int) ratelimit.Attempt[int] {
		cancel()
		return ratelimit.Limited(0, time.Hour)
	})
	if err != nil {
		t.Fatalf("cancelled before the wait: %v (the attempt's answer expected)", err)
	}
}

// retryServer is the Go middleware on a real server in front of a
// handler, with every answer's status recorded as the client got it.
type retryServer struct {
	url      string
	mu       sync.Mutex
	statuses []int
}

func (s *retryServer) seen() []int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]int(nil), s.statuses...)
}

type statusRecorder struct {
	http.ResponseWriter
	status int
}

func (r *statusRecorder) WriteHeader(code int) {
	if r.status == 0 {
		r.status = code
	}
	r.ResponseWriter.WriteHeader(code)
}

func newRetryServer(t *testing.T, spec ratelimit.Spec) *retryServer {
	t.Helper()
	l, _ := mwLimiter(t)
	set := mwSet(t, l, ratelimit.NewRule("per-user", spec).Prefix("retry:"))
	limited := ratelimit.Middleware(l, set, ratelimit.KeyByHeader("X-User"))(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		_, _ = w.Write([]byte("ok"))
	}))
	s := &retryServer{}
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rec := &statusRecorder{ResponseWriter: w}
		limited.ServeHTTP(rec, r)
		if rec.status == 0 {
			rec.status = http.StatusOK
		}
		s.mu.Lock()
		s.statuses = append(s.statuses, rec.status)
		s.mu.Unlock()
	}))
	t.Cleanup(ts.Close)
	s.url = ts.URL
	return s
}

func newUserRequest(t *testing.T, method, url, user string, body string) *http.Request {
	t.Helper()
	var req *http.Request
	var err error
	if body != "" {
		req, err = http.NewRequest(method, url, strings.NewReader(body))
	} else {
		req, err = http.NewRequest(method, url, nil)
	}
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("X-User", user)
	return req
}

// TestRetryGetsThroughAfterTheWaitThe429Said: over real HTTP, the Go
// middleware on a real Redis answers 429 with Retry-After: 1 (a bucket of
// one unit refilled each second); the policy waits that long (its own
// backoff being shorter) and the retry is admitted.
func TestRetryGetsThroughAfterTheWaitThe429Said(t *testing.T) {
	s := newRetryServer(t, ratelimit.TokenBucket(1, 1, 1000))
	p := ratelimit.RetryPolicy{Backoff: []time.Duration{10 * time.Millisecond}, Jitter: 10 * time.Millisecond, MaxRetries: 3, MaxTotal: time.Minute}
	for _, via := range []string{"Do", "Transport"} {
		user := "ann-" + via
		first := mwGet(t, s.url, "X-User", user)
		if first.status != http.StatusOK {
			t.Fatalf("%s: the first request: %d", via, first.status)
		}
		before := len(s.seen())
		start := time.Now()
		var resp *http.Response
		var err error
		if via == "Do" {
			resp, err = p.Do(context.Background(), nil, newUserRequest(t, http.MethodGet, s.url, user, ""))
		} else {
			resp, err = (&http.Client{Transport: p.Transport(nil)}).Do(newUserRequest(t, http.MethodGet, s.url, user, ""))
		}
		if err != nil {
			t.Fatalf("%s: %v", via, err)
		}
		_ = resp.Body.Close()
		waited := time.Since(start)
		got := s.seen()[before:]
		if resp.StatusCode != http.StatusOK || len(got) < 2 || got[0] != http.StatusTooManyRequests || got[len(got)-1] != http.StatusOK {
			t.Fatalf("%s: status %d, the server answered %v; want a 429 then 200", via, resp.StatusCode, got)
		}
		// The 429 said Retry-After: 1: no retry came sooner.
		if waited < time.Second {
			t.Errorf("%s: through after %v, before the Retry-After of 1 s", via, waited)
		}
	}
}

// TestRetryGivesUpAtItsDeadline: Retry-After 60 s and a deadline sooner:
// the client answers the 429 at once, one request sent.
func TestRetryGivesUpAtItsDeadline(t *testing.T) {
	s := newRetryServer(t, ratelimit.TokenBucket(1, 1, 60_000))
	if a := mwGet(t, s.url, "X-User", "bob"); a.status != http.StatusOK {
		t.Fatalf("the first request: %d", a.status)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := ratelimit.DefaultRetryPolicy().Do(ctx, nil, newUserRequest(t, http.MethodGet, s.url, "bob", ""))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	wait, ok := ratelimit.RetryAfterOf(resp)
	if resp.StatusCode != http.StatusTooManyRequests || !ok || wait != 60*time.Second {
		t.Fatalf("status %d, Retry-After %v %v; want the 429 saying 60 s", resp.StatusCode, wait, ok)
	}
	if ctx.Err() != nil {
		t.Fatal("the client waited for its deadline instead of giving up before it")
	}
	if got := s.seen(); len(got) != 2 {
		t.Fatalf("the server answered %v: want the first request and one 429", got)
	}
}

// TestRetryNeverRetriesANonIdempotentCallUnlessTold: a POST is not retried
// (its 429 is answered); with an Idempotency-Key, or RetryNonIdempotent,
// it is, its body sent again.
func TestRetryNeverRetriesANonIdempotentCallUnlessTold(t *testing.T) {
	s := newRetryServer(t, ratelimit.TokenBucket(1, 1, 1000))
	p := ratelimit.RetryPolicy{Backoff: []time.Duration{0}, MaxRetries: 3, MaxTotal: time.Minute}
	mwGet(t, s.url, "X-User", "cy")
	before := len(s.seen())
	resp, err := p.Do(context.Background(), nil, newUserRequest(t, http.MethodPost, s.url, "cy", "payload"))
	if err != nil {
		t.Fatal(err)
	}
	_ = resp.Body.Close()
	if resp.StatusCode != http.StatusTooManyRequests || len(s.seen())-before != 1 {
		t.Fatalf("a POST: %d after %d requests; want its 429, not retried", resp.StatusCode, len(s.seen())-before)
	}
	for _, told := range []string{"Idempotency-Key", "RetryNonIdempotent"} {
		req := newUserRequest(t, http.MethodPost, s.url, "cy", "payload")
		q := p
		if told == "Idempotency-Key" {
			req.Header.Set("Idempotency-Key", "k-1")
		} else {
			q.RetryNonIdempotent = true
		}
		resp, err := q.Do(context.Background(), nil, req)
		if err != nil {
			t.Fatalf("%s: %v", told, err)
		}
		_ = resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("a POST with %s: %d, want retried through", told, resp.StatusCode)
		}
	}
}

// ExampleRetryPolicy_Do calls a rate-limited API: a 429 is retried after
// its Retry-After (or RateLimit field) and the backoff, within 5 s.
func ExampleRetryPolicy_Do() {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	req, _ := http.NewRequest(http.MethodGet, "http://127.0.0.1:8080/search?q=go", nil)
	resp, err := ratelimit.DefaultRetryPolicy().Do(ctx, http.DefaultClient, req)
	if err != nil {
		return // the network, or ctx ended during a wait
	}
	defer resp.Body.Close()
	if resp.StatusCode == http.StatusTooManyRequests {
		wait, _ := ratelimit.RetryAfterOf(resp)
		_ = wait // still limited: the server asks for wait more
	}
}

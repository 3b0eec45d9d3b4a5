package ratelimit

import (
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// RetryPolicy is the schedule of retries for a caller of a rate-limited
// service (the Rust kit's RetryPolicy): exponential backoff (1, 2, 4 s),
// up to 0.5 s of jitter added to each wait, at most 3 retries, never
// earlier than the server's Retry-After, no retry starting later than
// MaxTotal after the first attempt nor after the context's deadline. A
// call that is not idempotent is never retried unless RetryNonIdempotent.
// DefaultRetryPolicy is that schedule; the zero value never retries.
type RetryPolicy struct {
	// Backoff is the wait before retry n (0-based; the last one repeats).
	Backoff []time.Duration
	// Jitter is the most jitter added to each wait (uniform in [0, Jitter]).
	Jitter time.Duration
	// MaxRetries is the most retries after the first attempt.
	MaxRetries int
	// MaxTotal: no retry starts later than this after the first attempt
	// (0: no cap but the context's deadline).
	MaxTotal time.Duration
	// RetryNonIdempotent retries calls that are not known to be idempotent
	// too (a POST without an Idempotency-Key; a gRPC method the caller did
	// not declare idempotent). A rate limiter's denial did not run the
	// call, but a 429 or RESOURCE_EXHAUSTED from elsewhere may have.
	RetryNonIdempotent bool
}

// DefaultRetryPolicy is 1, 2, 4 s of backoff, 0.5 s of jitter, 3 retries,
// 30 s in all, idempotent calls only.
func DefaultRetryPolicy() RetryPolicy {
	return RetryPolicy{
		Backoff:    []time.Duration{time.Second, 2 * time.Second, 4 * time.Second},
		Jitter:     500 * time.Millisecond,
		MaxRetries: 3,
		MaxTotal:   30 * time.Second,
	}
}

// Delay is the wait before retry (0-based), given the jitter drawn in
// [0, 1] as jitterUnit (clamped) and the server's Retry-After (0: none):
// the backoff plus its share of Jitter, and never less than retryAfter.
func (p RetryPolicy) Delay(retry int, jitterUnit float64, retryAfter time.Duration) time.Duration {
	var base time.Duration
	switch {
	case len(p.Backoff) == 0:
	case retry < 0:
		base = p.Backoff[0]
	case retry < len(p.Backoff):
		base = p.Backoff[retry]
	default:
		base = p.Backoff[len(p.Backoff)-1]
	}
	base = max(base, 0)
	if jitterUnit != jitterUnit { // NaN
		jitterUnit = 0
	}
	jitterUnit = min(max(jitterUnit, 0), 1)
	wait := base + time.Duration(float64(max(p.Jitter, 0))*jitterUnit)
	return max(wait, retryAfter)
}

// Attempt is what one attempt gave: its result and error, and whether it
// was rate limited (a 429, RESOURCE_EXHAUSTED), with the server's delay
// (RetryAfter 0: it sent none).
type Attempt[T any] struct {
	Value      T
	Err        error
	Limited    bool
	RetryAfter time.Duration
}

// Done is an attempt that ends the loop: a success, or an error not worth
// retrying.
func Done[T any](v T, err error) Attempt[T] { return Attempt[T]{Value: v, Err: err} }

// Limited is a rate-limited attempt, with the server's delay (0: none).
func Limited[T any](v T, retryAfter time.Duration) Attempt[T] {
	return Attempt[T]{Value: v, Limited: true, RetryAfter: max(retryAfter, 0)}
}

// Retry runs attempt (given the attempt's number, from 0) until it is
// done, the retries are used up, or the next retry would start after
// MaxTotal or after ctx's deadline (the loop does not wait for a retry it
// could not make): it answers the last attempt's Value and Err. If ctx
// ends during a wait, it answers the last Value and ctx's error; the
// caller then owns the Value (an HTTP response's body to close). A nil
// attempt is an *InvalidArgumentError.
func Retry[T any](ctx context.Context, p RetryPolicy, attempt func(ctx context.Context, n int) Attempt[T]) (T, error) {
	var zero T
	if attempt == nil {
		return zero, &InvalidArgumentError{Rule: "retry", Arg: "attempt", Reason: "nil attempt function"}
	}
	if ctx == nil {
		ctx = context.Background()
	}
	start := time.Now()
	for n := 0; ; n++ {
		a := attempt(ctx, n)
		if !a.Limited || n >= p.MaxRetries || ctx.Err() != nil {
			return a.Value, a.Err
		}
		wait := p.Delay(n, rand.Float64(), a.RetryAfter)
		if p.MaxTotal > 0 && time.Since(start)+wait > p.MaxTotal {
			return a.Value, a.Err
		}
		if dl, ok := ctx.Deadline(); ok && time.Now().Add(wait).After(dl) {
			// The retry would start after the deadline: give up now.
			return a.Value, a.Err
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return a.Value, ctx.Err()
		case <-t.C:
		}
	}
}

// Do sends req with c (http.DefaultClient when nil) under the policy: a
// 429, or a 503 with Retry-After, is retried after RetryAfterOf's delay
// and the backoff, when the request is idempotent (GET, HEAD, OPTIONS,
// TRACE, PUT, DELETE, or an Idempotency-Key header) or RetryNonIdempotent;
// a request with a body is retried only when it can be sent again
// (req.GetBody, which http.NewRequest sets for in-memory bodies). It
// answers the last response (a 429 when it gave up) or error; the limited
// responses it retried past are drained and closed. ctx bounds the whole
// loop (req's own context is replaced by it).
func (p RetryPolicy) Do(ctx context.Context, c *http.Client, req *http.Request) (*http.Response, error) {
	if req == nil {
		return nil, &InvalidArgumentError{Rule: "retry", Arg: "req", Reason: "nil *http.Request"}
	}
	if c == nil {
		c = http.DefaultClient
	}
	if ctx == nil {
		ctx = req.Context()
	}
	return p.do(ctx, c.Do, req)
}

// do is Do sending each attempt with send.
func (p RetryPolicy) do(ctx context.Context, send func(*http.Request) (*http.Response, error), req *http.Request) (*http.Response, error) {
	retryable := p.canRetry(req)
	var prev *http.Response
	resp, err := Retry(ctx, p, func(ctx context.Context, n int) Attempt[*http.Response] {
		if prev != nil {
			// The limited response retried past.
			drainClose(prev)
			prev = nil
		}
		r := req.Clone(ctx)
		if n > 0 && req.Body != nil && req.Body != http.NoBody {
			body, err := req.GetBody()
			if err != nil {
				return Done[*http.Response](nil, fmt.Errorf("ratelimit: retry: the request's body again: %w", err))
			}
			r.Body = body
		}
		resp, err := send(r)
		if err != nil || !retryable {
			return Done(resp, err)
		}
		limited := resp.StatusCode == http.StatusTooManyRequests ||
			resp.StatusCode == http.StatusServiceUnavailable && resp.Header.Get(HeaderRetryAfter) != ""
		if !limited {
			return Done(resp, nil)
		}
		wait, _ := RetryAfterOf(resp)
		prev = resp
		return Limited(resp, wait)
	})
	if err != nil && resp != nil {
		// The context ended during a wait: no response, its error.
		drainClose(resp)
		return nil, err
	}
	return resp, err
}

// drainClose reads a little of a response's body (so its connection can be
// reused) and closes it.
func drainClose(resp *http.Response) {
	if resp != nil && resp.Body != nil {
		_, _ = io.CopyN(io.Discard, resp.Body, 64<<10)
		_ = resp.Body.Close()
	}
}

// canRetry: whether a request may be sent again under the policy.
func (p RetryPolicy) canRetry(req *http.Request) bool {
	if req.Body != nil && req.Body != http.NoBody && req.GetBody == nil {
		return false
	}
	if p.RetryNonIdempotent {
		return true
	}
	switch req.Method {
	case "", http.MethodGet, http.MethodHead, http.MethodOptions, http.MethodTrace, http.MethodPut, http.MethodDelete:
		return true
	}
	return req.Header.Get("Idempotency-Key") != "" || req.Header.Get("X-Idempotency-Key") != ""
}

// Transport is an http.RoundTripper sending each request through next
// (http.DefaultTransport when nil) under the policy, as Do, bounded by
// the request's context: an *http.Client whose Transport it is retries
// 429s by itself.
func (p RetryPolicy) Transport(next http.RoundTripper) http.RoundTripper {
	if next == nil {
		next = http.DefaultTransport
	}
	return &retryTransport{p: p, next: next}
}

type retryTransport struct {
	p    RetryPolicy
	next http.RoundTripper
}

func (t *retryTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	return t.p.do(req.Context(), t.next.RoundTrip, req)
}

// RetryAfterOf is the delay a response asks for before the next try:
// its Retry-After field, as delay-seconds or an HTTP-date (counted from
// the response's Date field when it has one, so the two clocks' skew does
// not matter, else from now; a date in the past is 0), else the RateLimit
// field (the IETF draft's `"rule";r=0;t=5`: the longest t of the items
// with r=0; or the older `remaining=0, reset=5`). ok is false when the
// response names no delay (or resp is nil).
func RetryAfterOf(resp *http.Response) (time.Duration, bool) {
	if resp == nil {
		return 0, false
	}
	return RetryAfterHeader(resp.Header, time.Now())
}

// RetryAfterHeader is RetryAfterOf on a response's header fields, an
// HTTP-date counted from the Date field or else from now.
func RetryAfterHeader(h http.Header, now time.Time) (time.Duration, bool) {
	if v := strings.TrimSpace(h.Get(HeaderRetryAfter)); v != "" {
		if s, err := strconv.ParseInt(v, 10, 64); err == nil && s >= 0 {
			return secondsDuration(s), true
		}
		if at, err := http.ParseTime(v); err == nil {
			from := now
			if d, err := http.ParseTime(h.Get("Date")); err == nil {
				from = d
			}
			return max(at.Sub(from), 0), true
		}
	}
	return rateLimitFieldDelay(h.Values(HeaderRateLimit))
}

// secondsDuration is s seconds, capped rather than overflowing.
func secondsDuration(s int64) time.Duration {
	const most = int64(1<<63-1) / int64(time.Second)
	return time.Duration(min(s, most)) * time.Second
}

// rateLimitFieldDelay reads the RateLimit field: the longest t of the
// items whose r is 0 (draft-ietf-httpapi-ratelimit-headers 07 and later),
// or reset when remaining is 0 (the older drafts' dictionary).
func rateLimitFieldDelay(values []string) (time.Duration, bool) {
	var best int64 = -1
	remaining, reset := int64(-1), int64(-1)
	for _, v := range values {
		for _, item := range splitOutsideQuotes(v, ',') {
			params := splitOutsideQuotes(item, ';')
			r, t := int64(-1), int64(-1)
			for i, p := range params {
				k, val, ok := strings.Cut(strings.TrimSpace(p), "=")
				if !ok {
					continue
				}
				n, err := strconv.ParseInt(strings.Trim(strings.TrimSpace(val), `"`), 10, 64)
				if err != nil || n < 0 {
					continue
				}
				k = strings.ToLower(strings.TrimSpace(k))
				switch {
				case i > 0 && k == "r":
					r = n
				case i > 0 && k == "t":
					t = n
				case i == 0 && k == "remaining":
					remaining = n
				case i == 0 && k == "reset":
					reset = n
				}
			}
			if r == 0 && t >= 0 {
				best = max(best, t)
			}
		}
	}
	if best < 0 && remaining == 0 && reset >= 0 {
		best = reset
	}
	if best < 0 {
		return 0, false
	}
	return secondsDuration(best), true
}

// splitOutsideQuotes splits s at sep outside double-quoted strings.
func splitOutsideQuotes(s string, sep byte) []string {
	var out []string
	quoted, escaped, from := false, false, 0
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case escaped:
			escaped = false
		case quoted && c == '\\':
			escaped = true
		case c == '"':
			quoted = !quoted
		case !quoted && c == sep:
			out = append(out, s[from:i])
			from = i + 1
		}
	}
	return append(out, s[from:])
}

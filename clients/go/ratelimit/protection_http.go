package ratelimit

import (
	"bufio"
	"context"
	"errors"
	"net"
	"net/http"
	"strconv"
	"time"
)

// ProtectOption configures ProtectMiddleware.
type ProtectOption func(*protectConfig)

type protectConfig struct {
	degrade http.Handler
	nonCore bool
	isError func(r *http.Request, status int) bool
}

// ProtectDegrade gives the route a degrade handler (a cached or default
// answer) and makes it a non-core route: while the policy is at
// StageDegrade or above, the handler answers instead of the route, without
// a call to Redis; and when the rate limit inside (the Middleware of a
// Limiter, wrapped by this one) answers 429, the handler answers instead
// (Sentinel's blockHandler, Resilience4j's fallbackMethod).
// DegradeInfoFrom(r.Context()) tells it why.
func ProtectDegrade(h http.Handler) ProtectOption {
	return func(c *protectConfig) { c.degrade, c.nonCore = h, h != nil || c.nonCore }
}

// ProtectNonCore makes the route non-core without a degrade handler: while
// the policy is at StageDegrade or above it answers 429 (the kit's denial
// answer, Retry-After the stage poll) instead of running.
func ProtectNonCore() ProtectOption { return func(c *protectConfig) { c.nonCore = true } }

// ProtectErrorWhen replaces the default error predicate (a 5xx status): f
// tells, from the request and the status the handler answered, whether
// the outcome is an error. A panic of the handler and a request whose
// context ended with context.DeadlineExceeded are errors whatever f says.
func ProtectErrorWhen(f func(r *http.Request, status int) bool) ProtectOption {
	return func(c *protectConfig) {
		if f != nil {
			c.isError = f
		}
	}
}

// DegradeReason is why a degrade handler answers.
type DegradeReason int

const (
	// DegradeStage: the policy is at StageDegrade or above.
	DegradeStage DegradeReason = iota
	// DegradeDenied: the rate limit inside denied the request (429).
	DegradeDenied
)

// DegradeInfo is what a degrade handler is told (DegradeInfoFrom).
type DegradeInfo struct {
	// Reason is why it answers.
	Reason DegradeReason
	// Stage is the policy's stage then.
	Stage Stage
}

type degradeKey struct{}

// DegradeInfoFrom is why a degrade handler was called, from its request's
// context; false outside a degrade handler.
func DegradeInfoFrom(ctx context.Context) (DegradeInfo, bool) {
	info, ok := ctx.Value(degradeKey{}).(DegradeInfo)
	return info, ok
}

// ProtectMiddleware wraps a route in the protection loop of policy: each
// response of the route counts as an outcome of the policy (an error: a
// 5xx, or ProtectErrorWhen's predicate, a panic, a deadline exceeded),
// sent with the loop's next report (RL.OUTCOME). A 429 is no outcome: it
// is the rate limit's denial, not a request the policy admitted. A core
// route (the default) only reports. A non-core route (ProtectDegrade,
// ProtectNonCore) at StageDegrade or above answers with its degrade
// handler, or 429 without one, and the route does not run (nor counts):
// the contract's answer, as the other kits' layers; at StageBreak the loop
// also forces open the breakers bound to the policy (Protection.Breaker),
// which the route's own downstream calls go through.
//
// Put it outside the rate limit (ProtectMiddleware(p, policy)(Middleware(l,
// set, key)(route))): a degraded route then costs no Redis call, and a
// route with a degrade handler answers a denial with it.
//
// A nil p, or an empty policy, is a middleware that only calls the route
// (nothing to report to).
func ProtectMiddleware(p *Protection, policy string, opts ...ProtectOption) func(http.Handler) http.Handler {
	cfg := protectConfig{isError: func(_ *http.Request, status int) bool { return status >= 500 }}
	for _, o := range opts {
		if o != nil {
			o(&cfg)
		}
	}
	if p != nil && policy != "" {
		p.Watch(policy)
	}
	return func(next http.Handler) http.Handler {
		if p == nil || policy == "" {
			return next
		}
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if cfg.nonCore {
				if stage := p.Stage(policy); stage >= StageDegrade {
					if cfg.degrade != nil {
						info := DegradeInfo{Reason: DegradeStage, Stage: stage}
						cfg.degrade.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), degradeKey{}, info)))
						return
					}
					writeStageDenial(w, policy, p.StagePoll())
					return
				}
			}
			sw := &statusWriter{ResponseWriter: w}
			var saved http.Header
			if cfg.degrade != nil {
				// A 429 inside is answered by the degrade handler: the
				// headers the denial set are taken back.
				sw.swallow429 = true
				saved = w.Header().Clone()
			}
			finished := false
			defer func() {
				if !finished {
					// A panic: an error outcome, and the panic goes on.
					p.Record(policy, true)
				}
			}()
			next.ServeHTTP(sw, r)
			finished = true
			if sw.swallowed {
				h := w.Header()
				for k := range h {
					if _, ok := saved[k]; !ok {
						delete(h, k)
					}
				}
				for k, v := range saved {
					h[k] = v
				}
				info := DegradeInfo{Reason: DegradeDenied, Stage: p.Stage(policy)}
				cfg.degrade.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), degradeKey{}, info)))
				return
			}
			status := sw.status
			if status == 0 {
				status = http.StatusOK
			}
			if status == http.StatusTooManyRequests {
				return
			}
			failed := cfg.isError(r, status) || errors.Is(r.Context().Err(), context.DeadlineExceeded)
			p.Record(policy, failed)
		})
	}
}

// writeStageDenial is a non-core route's 429 at a stage, without a degrade
// handler: the usual fields, as a denial of the policy for the stage poll.
func writeStageDenial(w http.ResponseWriter, policy string, poll time.Duration) {
	wait := max(poll.Milliseconds(), 1)
	d := Decision{Allowed: false, WaitMs: wait, RetryAfter: time.Duration(wait) * time.Millisecond,
		ResetAfter: time.Duration(wait) * time.Millisecond, DeniedBy: -1, Granted: -1, Rule: policy, Path: PathLocal}
	h := w.Header()
	h.Set(HeaderRateLimit, RateLimitItem(policy, d))
	if s, ok := RetryAfterSeconds(d); ok {
		h.Set(HeaderRetryAfter, strconv.FormatInt(s, 10))
	}
	h.Set("Content-Type", ProblemContentType)
	w.WriteHeader(http.StatusTooManyRequests)
	_, _ = w.Write(ProblemBody(policy, d))
}

// statusWriter remembers the status a handler answered; with swallow429,
// a 429 and what follows it are not written (the degrade handler answers).
type statusWriter struct {
	http.ResponseWriter
	status     int
	swallow429 bool
	swallowed  bool
}

func (s *statusWriter) WriteHeader(code int) {
	if s.status == 0 {
		s.status = code
		if code == http.StatusTooManyRequests && s.swallow429 {
			s.swallowed = true
		}
	}
	if s.swallowed {
		return
	}
	s.ResponseWriter.WriteHeader(code)
}

func (s *statusWriter) Write(b []byte) (int, error) {
	if s.status == 0 {
		s.status = http.StatusOK
	}
	if s.swallowed {
		return len(b), nil
	}
	return s.ResponseWriter.Write(b)
}

// Unwrap lets http.ResponseController reach the writer underneath.
func (s *statusWriter) Unwrap() http.ResponseWriter { return s.ResponseWriter }

// Flush passes a flush on when the writer underneath can.
func (s *statusWriter) Flush() {
	if f, ok := s.ResponseWriter.(http.Flusher); ok && !s.swallowed {
		if s.status == 0 {
			s.status = http.StatusOK
		}
		f.Flush()
	}
}

// Hijack passes a hijack on when the writer underneath can (a hijacked
// connection counts as answered: status 200 unless one was written).
func (s *statusWriter) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	if hj, ok := s.ResponseWriter.(http.Hijacker); ok {
		return hj.Hijack()
	}
	return nil, nil, http.ErrNotSupported
}

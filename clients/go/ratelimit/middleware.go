package ratelimit

// net/http middleware: each request's identity (a KeyFunc), the Limiter's
// decision under a RuleSet, and the HTTP answer every kit gives (the
// contract's "headers" vectors, written by headers.go).

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"strings"
	"time"
)

// KeyFunc is a request's identity: each rule's key is built from it
// (Rule.Key). An empty identity, or an error, is a request without a key:
// answered 400 by default, or passed through unlimited with
// WithMissingKey(MissingKeyAllow). A panic in a KeyFunc answers 500.
type KeyFunc func(*http.Request) (string, error)

// ErrNoKey is what the kit's KeyFuncs return when a request carries no
// identity (no such header, no such context value, an unreadable address).
var ErrNoKey = errors.New("ratelimit: the request carries no rate-limit key")

// IPOption configures KeyByIP and ClientIP.
type IPOption func(*ipConfig)

type ipConfig struct {
	trusted []netip.Prefix
}

// TrustProxies names the proxies whose X-Forwarded-For is believed. Only
// when the connection's peer is one of them is the header read, right to
// left: the first address that is not a trusted proxy is the client's. By
// default (no trusted proxy) X-Forwarded-For is ignored: any client can
// write it.
func TrustProxies(proxies ...netip.Prefix) IPOption {
	return func(c *ipConfig) {
		for _, p := range proxies {
			if p.IsValid() {
				c.trusted = append(c.trusted, p.Masked())
			}
		}
	}
}

func (c *ipConfig) isTrusted(a netip.Addr) bool {
	for _, p := range c.trusted {
		if p.Contains(a) {
			return true
		}
	}
	return false
}

// parseIP reads an address ("10.0.0.1", "::1", "[::1]:80", "10.0.0.1:80"),
// IPv4-mapped IPv6 unmapped, without its zone.
func parseIP(s string) (netip.Addr, bool) {
	s = strings.TrimSpace(s)
	if a, err := netip.ParseAddr(s); err == nil {
		return a.Unmap().WithZone(""), true
	}
	if host, _, err := net.SplitHostPort(s); err == nil {
		if a, err := netip.ParseAddr(host); err == nil {
			return a.Unmap().WithZone(""), true
		}
	}
	return netip.Addr{}, false
}

// ClientIP is the address of the request's client: the peer of the
// connection (RemoteAddr), or, when that peer is a trusted proxy
// (TrustProxies), the rightmost X-Forwarded-For address that is not one.
// ok is false when RemoteAddr is not an address (a unix socket).
func ClientIP(r *http.Request, opts ...IPOption) (ip netip.Addr, ok bool) {
	var c ipConfig
	for _, o := range opts {
		if o != nil {
			o(&c)
		}
	}
	return c.clientIP(r)
}

func (c *ipConfig) clientIP(r *http.Request) (netip.Addr, bool) {
	if r == nil {
		return netip.Addr{}, false
	}
	peer, ok := parseIP(r.RemoteAddr)
	if !ok || len(c.trusted) == 0 || !c.isTrusted(peer) {
		return peer, ok
	}
	// The peer is a trusted proxy: each hop appended the address it saw.
	hop := peer
	values := r.Header.Values("X-Forwarded-For")
	for i := len(values) - 1; i >= 0; i-- {
		parts := strings.Split(values[i], ",")
		for j := len(parts) - 1; j >= 0; j-- {
			a, ok := parseIP(parts[j])
			if !ok {
				// A trusted hop wrote something that is not an address:
				// what lies left of it cannot be believed.
				return hop, true
			}
			if !c.isTrusted(a) {
				return a, true
			}
			hop = a
		}
	}
	return hop, true
}

// KeyByIP keys requests by the client's address (ClientIP): RemoteAddr's
// IP, or X-Forwarded-For's client behind proxies named by TrustProxies.
func KeyByIP(opts ...IPOption) KeyFunc {
	var c ipConfig
	for _, o := range opts {
		if o != nil {
			o(&c)
		}
	}
	return func(r *http.Request) (string, error) {
		a, ok := c.clientIP(r)
		if !ok {
			return "", fmt.Errorf("remote address %q is not an IP address: %w", remoteAddr(r), ErrNoKey)
		}
		return a.String(), nil
	}
}

func remoteAddr(r *http.Request) string {
	if r == nil {
		return ""
	}
	return r.RemoteAddr
}

// KeyByHeader keys requests by a header's value (an API key, a tenant, a
// user set by an authenticating proxy). A request without it has no key.
func KeyByHeader(name string) KeyFunc {
	canonical := http.CanonicalHeaderKey(strings.TrimSpace(name))
	return func(r *http.Request) (string, error) {
		if canonical == "" {
			return "", fmt.Errorf("KeyByHeader: empty header name: %w", ErrNoKey)
		}
		if r == nil {
			return "", ErrNoKey
		}
		v := strings.TrimSpace(r.Header.Get(canonical))
		if v == "" {
			return "", fmt.Errorf("no %s header: %w", canonical, ErrNoKey)
		}
		return v, nil
	}
}

// KeyByContext keys requests by a value an earlier middleware put in the
// request's context under key (an authenticated user): a string, a
// fmt.Stringer, or an integer. A request without it has no key.
func KeyByContext(key any) KeyFunc {
	return func(r *http.Request) (string, error) {
		if key == nil {
			return "", fmt.Errorf("KeyByContext: nil context key: %w", ErrNoKey)
		}
		if r == nil {
			return "", ErrNoKey
		}
		switch v := r.Context().Value(key).(type) {
		case string:
			if v != "" {
				return v, nil
			}
		case fmt.Stringer:
			if s := v.String(); s != "" {
				return s, nil
			}
		case int:
			return strconv.Itoa(v), nil
		case int64:
			return strconv.FormatInt(v, 10), nil
		case uint64:
			return strconv.FormatUint(v, 10), nil
		}
		return "", fmt.Errorf("no value for context key %v: %w", key, ErrNoKey)
	}
}

// MissingKey is what the middleware does with a request whose KeyFunc
// answers "" or an error.
type MissingKey int

const (
	// MissingKeyReject answers 400 with a problem+json body (the default,
	// as in the other kits): a request that cannot be attributed is refused
	// rather than let through unlimited.
	MissingKeyReject MissingKey = iota
	// MissingKeyAllow passes the request to the handler unlimited and
	// without rate-limit fields.
	MissingKeyAllow
)

// MiddlewareOption configures Middleware.
type MiddlewareOption func(*middlewareConfig)

type middlewareConfig struct {
	cost     func(*http.Request) uint64
	skip     func(*http.Request) bool
	missing  MissingKey
	clientIP func(*http.Request) string
	ipOpts   []IPOption
	xHeaders bool
	levelHdr string
	denied   func(http.ResponseWriter, *http.Request, Decision)
	inFlight *Rule
}

// WithCost makes every request of this middleware cost n units (1 by
// default): one middleware per route gives routes their own costs. 0 is a
// check that takes nothing.
func WithCost(n uint64) MiddlewareOption {
	return func(c *middlewareConfig) { c.cost = func(*http.Request) uint64 { return n } }
}

// WithCostFunc computes each request's cost (its body size, a query's
// weight). A nil f is the default cost, 1.
func WithCostFunc(f func(*http.Request) uint64) MiddlewareOption {
	return func(c *middlewareConfig) { c.cost = f }
}

// WithSkip passes the requests for which skip answers true straight to the
// handler, unlimited and without fields (health checks, an allow list).
func WithSkip(skip func(*http.Request) bool) MiddlewareOption {
	return func(c *middlewareConfig) { c.skip = skip }
}

// WithMissingKey says what a request without a key gets (MissingKeyReject
// by default).
func WithMissingKey(m MissingKey) MiddlewareOption {
	return func(c *middlewareConfig) { c.missing = m }
}

// WithClientIP is the client address of the deny events of this
// middleware's denials (with the request's User-Agent), when the limiter
// has DenyEvents. By default, RemoteAddr's IP.
func WithClientIP(f func(*http.Request) string) MiddlewareOption {
	return func(c *middlewareConfig) { c.clientIP = f }
}

// WithTrustedProxies makes the deny events' client address X-Forwarded-For's
// client behind these proxies (as KeyByIP(TrustProxies(proxies...))).
func WithTrustedProxies(proxies ...netip.Prefix) MiddlewareOption {
	return func(c *middlewareConfig) { c.ipOpts = append(c.ipOpts, TrustProxies(proxies...)) }
}

// WithXRateLimitHeaders adds X-RateLimit-Limit, X-RateLimit-Remaining and
// X-RateLimit-Reset (seconds) to every limited answer.
func WithXRateLimitHeaders(on bool) MiddlewareOption {
	return func(c *middlewareConfig) { c.xHeaders = on }
}

// WithLevelHeader sets a response header named name to the level that
// decided each request (Path.String(): redis, local, deny_cache, fallback,
// grant): for diagnostics and tests. Off by default.
func WithLevelHeader(name string) MiddlewareOption {
	return func(c *middlewareConfig) { c.levelHdr = http.CanonicalHeaderKey(strings.TrimSpace(name)) }
}

// WithDenied answers denials instead of the 429 (a cached or default
// answer: Sentinel's blockHandler). The rate-limit fields are already on
// w's header when it is called; Retry-After too.
func WithDenied(h func(w http.ResponseWriter, r *http.Request, d Decision)) MiddlewareOption {
	return func(c *middlewareConfig) { c.denied = h }
}

// WithInFlight caps the requests in flight per identity, as the other kits'
// layers do: rule is a CONCURRENCY rule (NewRule(name, ConcurrencySpec(n,
// leaseMs)), or a PolicyRule whose policy is CONCURRENCY). Each request the
// rate rules admit takes a lease of one unit (Limiter.Lease) before its
// handler runs and releases it when the handler returns (also when it
// panics), before the response is flushed; the lease is renewed while the
// handler runs. A full cap answers 429 like a rate denial, its
// RateLimit-Policy item without w; an admission's RateLimit has the rate
// rule's item, then the cap's. When Redis cannot answer, a FailClosed
// fallback denies and the others admit without a lease.
func WithInFlight(rule Rule) MiddlewareOption {
	return func(c *middlewareConfig) { c.inFlight = &rule }
}

// inFlightCap is the middleware's requests-in-flight cap.
type inFlightCap struct {
	l    *Limiter
	rule Rule
	name string
}

// heldLease is a request's unit of the cap (nothing for a lease that holds
// nothing).
type heldLease struct{ lease *Lease }

// release gives the unit back (RL.RELEASE within UpkeepDeadline), before
// the response is flushed, so the client's next request finds it free; a
// release that fails is covered by the lease's expiry.
func (h heldLease) release(ctx context.Context) {
	if h.lease == nil {
		return
	}
	_, _ = h.lease.Release(context.WithoutCancel(ctx))
}

// initInFlight checks the in-flight rule and adds its RateLimit-Policy item.
func (m *middleware) initInFlight() error {
	if m.cfg.inFlight == nil {
		return nil
	}
	rule := *m.cfg.inFlight
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	spec, err := m.l.InFlightSpec(ctx, rule)
	if err != nil {
		return err
	}
	m.policy += ", " + PolicyItem(rule.Name(), spec)
	m.inFlight = &inFlightCap{l: m.l, rule: rule, name: rule.Name()}
	return nil
}

// InFlightSpec checks a rule for a requests-in-flight cap (the HTTP
// middleware's and the gRPC interceptors' WithInFlight): a per-identity
// CONCURRENCY rule, inline or a policy the server has (read now). Its spec
// gives the cap's RateLimit-Policy item; a bad rule is an
// *InvalidArgumentError naming the argument.
func (l *Limiter) InFlightSpec(ctx context.Context, rule Rule) (Spec, error) {
	if err := rule.Validate(); err != nil {
		return Spec{}, err
	}
	spec, ok := rule.Spec()
	if !ok {
		if l == nil || l.client == nil {
			return Spec{}, &InvalidArgumentError{Rule: rule.Name(), Arg: "client", Reason: "the limiter has no client (NewLimiter(nil))"}
		}
		var err error
		spec, ok, err = l.policySpec(ctx, rule.Policy())
		if err != nil {
			return Spec{}, fmt.Errorf("ratelimit: reading the in-flight policy %q: %w", rule.Policy(), err)
		}
		if !ok {
			return Spec{}, rule.bad("policy", "no policy %q on the server (RL.POLICY SET it first)", rule.Policy())
		}
	}
	if spec.Algorithm() != AlgorithmConcurrency {
		return Spec{}, rule.bad("algorithm", "the in-flight cap needs a CONCURRENCY rule (ConcurrencySpec, or a policy set as CONCURRENCY limit lease_ms), not %s", spec.Algorithm())
	}
	if rule.IsGlobal() {
		return Spec{}, rule.bad("global", "the in-flight cap is per identity")
	}
	return spec, nil
}

// hold takes the request's unit: its lease (ID 0 when the fallback admitted
// without one) and the cap's answer. Allowed false is a denial to answer;
// an error other than a denial (a server error) admits without a lease.
func (c *inFlightCap) hold(ctx context.Context, identity string, origin Origin) (heldLease, capAnswer) {
	lease, err := c.l.LeaseFrom(ctx, c.rule, identity, origin)
	if err != nil {
		if ctx.Err() != nil {
			return heldLease{}, capAnswer{rule: c.name, gone: true}
		}
		var de *DeniedError
		if errors.As(err, &de) {
			return heldLease{}, capAnswer{rule: c.name, d: de.Decision}
		}
		return heldLease{}, capAnswer{rule: c.name, d: Decision{Allowed: true, DeniedBy: -1, Granted: -1, Path: PathFallback, Rule: c.name}}
	}
	return heldLease{lease: lease}, capAnswer{rule: c.name, d: lease.Decision()}
}

// decisionCtxKey is the context key of the decision an admitted request
// carries to its handler.
type decisionCtxKey struct{}

// DecisionFromContext is the decision that admitted the request, inside a
// handler behind Middleware.
func DecisionFromContext(ctx context.Context) (Decision, bool) {
	if ctx == nil {
		return Decision{}, false
	}
	d, ok := ctx.Value(decisionCtxKey{}).(Decision)
	return d, ok
}

// NewDecisionContext is ctx carrying d, for DecisionFromContext (what the
// middleware and the gRPC interceptors give an admitted request's handler).
func NewDecisionContext(ctx context.Context, d Decision) context.Context {
	if ctx == nil {
		ctx = context.Background()
	}
	return context.WithValue(ctx, decisionCtxKey{}, d)
}

// PolicyField is the RateLimit-Policy field of the set: an item per rule,
// in order, joined by ", " ("name";q=<limit>;w=<window s>, PolicyItem; a
// policy rule whose spec is unknown: "name" alone).
func (s *RuleSet) PolicyField() string {
	if s == nil {
		return ""
	}
	items := make([]string, 0, len(s.rules))
	for _, r := range s.rules {
		items = append(items, ruleItem(r))
	}
	return strings.Join(items, ", ")
}

func ruleItem(r checkedRule) string {
	if r.hasSpec {
		return PolicyItem(r.rule.name, r.spec)
	}
	return `"` + r.rule.name + `"`
}

// DecidingRule is the name of the rule a decision of the set describes:
// Decision.Rule, else the set's first rule.
func (s *RuleSet) DecidingRule(d Decision) string {
	if d.Rule != "" || s == nil || len(s.rules) == 0 {
		return d.Rule
	}
	return s.rules[ruleIndex(s, d)].rule.name
}

// Fields are the header values of the answer to a decision of the set:
// RateLimit-Policy for every rule (PolicyField), the RateLimit item of the
// rule that decided, and Retry-After for a denial that can pass later.
func (s *RuleSet) Fields(d Decision) RateLimitFields {
	f := RateLimitFields{RateLimitPolicy: s.PolicyField(), RateLimit: RateLimitItem(s.DecidingRule(d), d)}
	if sec, ok := RetryAfterSeconds(d); ok {
		f.RetryAfter = strconv.FormatInt(sec, 10)
	}
	return f
}

// The problem bodies of the answers that are not a denial.
const (
	problemKeyMissingTitle  = "Rate-limit key missing"
	problemKeyMissingDetail = "this request carries no rate-limit key"
	problemKeyFailedTitle   = "Rate-limit key unavailable"
	problemKeyFailedDetail  = "the rate-limit key of this request could not be computed"
	problemMisconfigTitle   = "Rate limiter misconfigured"
)

// MissingKeyBody is the 400 problem+json body of a request without a key.
func MissingKeyBody() []byte {
	return Problem(http.StatusBadRequest, "about:blank", problemKeyMissingTitle, problemKeyMissingDetail, "")
}

// Middleware limits every request of the handler it wraps: the identity
// from key, one decision of l under set (its cost 1, or WithCost), and the
// answer every kit gives:
//
//   - admitted: the handler's answer, with RateLimit-Policy (every rule of
//     the set) and RateLimit (the rule that decided) on its header; the
//     decision is in the request's context (DecisionFromContext);
//   - denied: 429 with Retry-After (none when the request can never pass),
//     RateLimit-Policy, RateLimit, and an application/problem+json body
//     naming the rule in violated-policies (or WithDenied's answer);
//   - no key (KeyFunc answered "" or an error): 400 with a problem body, or
//     the handler unlimited with WithMissingKey(MissingKeyAllow);
//   - a panic in key: 500 with a problem body, no stack trace.
//
// Redis trouble never answers 500: the limiter's fallback decides. A nil l,
// set or key answers every request 500 with a problem body naming it (see
// NewMiddleware to get that as an error instead).
func Middleware(l *Limiter, set *RuleSet, key KeyFunc, opts ...MiddlewareOption) func(http.Handler) http.Handler {
	mw, err := NewMiddleware(l, set, key, opts...)
	if err != nil {
		body := Problem(http.StatusInternalServerError, "about:blank", problemMisconfigTitle, err.Error(), "")
		return func(http.Handler) http.Handler {
			return http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
				writeProblem(w, http.StatusInternalServerError, body)
			})
		}
	}
	return mw
}

// NewMiddleware is Middleware, with a nil limiter, rule set or key (or a
// bad in-flight rule) returned as an *InvalidArgumentError naming it.
func NewMiddleware(l *Limiter, set *RuleSet, key KeyFunc, opts ...MiddlewareOption) (func(http.Handler) http.Handler, error) {
	switch {
	case l == nil:
		return nil, &InvalidArgumentError{Rule: "middleware", Arg: "limiter", Reason: "nil *Limiter"}
	case set == nil || len(set.rules) == 0:
		return nil, &InvalidArgumentError{Rule: "middleware", Arg: "rules", Reason: "nil or empty *RuleSet (Limiter.RuleSet makes one)"}
	case key == nil:
		return nil, &InvalidArgumentError{Rule: "middleware", Arg: "key", Reason: "nil KeyFunc (KeyByIP, KeyByHeader, KeyByContext)"}
	}
	c := middlewareConfig{}
	for _, o := range opts {
		if o != nil {
			o(&c)
		}
	}
	m := &middleware{l: l, set: set, key: key, cfg: c, policy: set.PolicyField()}
	if err := m.initInFlight(); err != nil {
		return nil, err
	}
	if c.clientIP == nil {
		ipc := ipConfig{}
		for _, o := range c.ipOpts {
			if o != nil {
				o(&ipc)
			}
		}
		m.cfg.clientIP = func(r *http.Request) string {
			if a, ok := ipc.clientIP(r); ok {
				return a.String()
			}
			return ""
		}
	}
	return func(next http.Handler) http.Handler {
		if next == nil {
			next = http.NotFoundHandler()
		}
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { m.serve(w, r, next) })
	}, nil
}

type middleware struct {
	l      *Limiter
	set    *RuleSet
	key    KeyFunc
	cfg    middlewareConfig
	policy string
	// inFlight is the requests-in-flight cap (WithInFlight), nil without.
	inFlight *inFlightCap
}

// identity runs the KeyFunc; panicked is true when it panicked.
func (m *middleware) identity(r *http.Request) (id string, err error, panicked bool) {
	defer func() {
		if p := recover(); p != nil {
			id, err, panicked = "", fmt.Errorf("ratelimit: the KeyFunc panicked: %v", p), true
		}
	}()
	id, err = m.key(r)
	return id, err, false
}

func (m *middleware) costOf(r *http.Request) (n uint64, ok bool) {
	if m.cfg.cost == nil {
		return 1, true
	}
	defer func() {
		if p := recover(); p != nil {
			n, ok = 0, false
		}
	}()
	return m.cfg.cost(r), true
}

func (m *middleware) serve(w http.ResponseWriter, r *http.Request, next http.Handler) {
	if m.cfg.skip != nil && m.cfg.skip(r) {
		next.ServeHTTP(w, r)
		return
	}
	id, err, panicked := m.identity(r)
	if panicked {
		writeProblem(w, http.StatusInternalServerError,
			Problem(http.StatusInternalServerError, "about:blank", problemKeyFailedTitle, problemKeyFailedDetail, ""))
		return
	}
	if err != nil || id == "" {
		if m.cfg.missing == MissingKeyAllow {
			next.ServeHTTP(w, r)
			return
		}
		writeProblem(w, http.StatusBadRequest, MissingKeyBody())
		return
	}
	cost, ok := m.costOf(r)
	if !ok {
		writeProblem(w, http.StatusInternalServerError,
			Problem(http.StatusInternalServerError, "about:blank", "Rate-limit cost unavailable", "the rate-limit cost of this request could not be computed", ""))
		return
	}
	var origin Origin
	if m.l.cfg.events != nil {
		origin = Origin{ClientIP: m.cfg.clientIP(r), UserAgent: r.UserAgent()}
	}
	ctx := r.Context()
	d := m.l.CheckFrom(ctx, m.set, id, cost, origin)
	rule := m.set.DecidingRule(d)
	h := w.Header()
	if !d.Allowed {
		m.setFields(h, rule, d, nil)
		m.deny(w, r, rule, d)
		return
	}
	var capItem *capAnswer
	if m.inFlight != nil {
		held, answer := m.inFlight.hold(ctx, id, origin)
		if answer.gone {
			return
		}
		if !answer.d.Allowed {
			m.setFields(h, answer.rule, answer.d, nil)
			m.deny(w, r, answer.rule, answer.d)
			return
		}
		capItem = &answer
		defer held.release(ctx)
	}
	m.setFields(h, rule, d, capItem)
	next.ServeHTTP(w, r.WithContext(NewDecisionContext(ctx, d)))
}

// capAnswer is the in-flight cap's decision and its rule's name.
type capAnswer struct {
	rule string
	d    Decision
	// gone: the request's context ended while the lease was asked (the
	// client went away): nothing to answer.
	gone bool
}

// setFields writes the fields of a decision: RateLimit-Policy, RateLimit
// (the rule's item, then the in-flight cap's), Retry-After for a denial,
// and the optional ones.
func (m *middleware) setFields(h http.Header, rule string, d Decision, capItem *capAnswer) {
	h.Set(HeaderRateLimitPolicy, m.policy)
	item := RateLimitItem(rule, d)
	if capItem != nil {
		item += ", " + RateLimitItem(capItem.rule, capItem.d)
	}
	h.Set(HeaderRateLimit, item)
	if s, ok := RetryAfterSeconds(d); ok {
		h.Set(HeaderRetryAfter, strconv.FormatInt(s, 10))
	}
	if m.cfg.xHeaders {
		h.Set("X-RateLimit-Limit", strconv.FormatInt(d.Limit, 10))
		h.Set("X-RateLimit-Remaining", strconv.FormatInt(d.Remaining, 10))
		h.Set("X-RateLimit-Reset", strconv.FormatInt(ceilSeconds(d.ResetAfter.Milliseconds()), 10))
	}
	if m.cfg.levelHdr != "" {
		h.Set(m.cfg.levelHdr, d.Path.String())
	}
}

// deny answers a denial: WithDenied's handler, or 429 with the problem body.
func (m *middleware) deny(w http.ResponseWriter, r *http.Request, rule string, d Decision) {
	if m.cfg.denied != nil {
		m.cfg.denied(w, r, d)
		return
	}
	writeProblem(w, http.StatusTooManyRequests, ProblemBody(rule, d))
}

func writeProblem(w http.ResponseWriter, status int, body []byte) {
	h := w.Header()
	h.Set("Content-Type", ProblemContentType)
	h.Set("Content-Length", strconv.Itoa(len(body)))
	w.WriteHeader(status)
	_, _ = w.Write(body)
}

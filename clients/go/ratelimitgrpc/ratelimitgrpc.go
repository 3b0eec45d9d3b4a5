// Package ratelimitgrpc limits gRPC servers with a ratelimit.Limiter: unary
// and stream server interceptors that decide every call under a RuleSet.
//
// A denied call ends with codes.ResourceExhausted, the same information as
// the HTTP middleware's 429 in its trailers (ratelimit-policy, ratelimit,
// retry-after, violated-policies), in its status message (the problem
// body's detail: `rate limit "per-user" exceeded; retry after 2 s`) and in
// its status details (errdetails.QuotaFailure naming the rule,
// errdetails.RetryInfo with the delay). An admitted call gets
// ratelimit-policy and ratelimit in its response headers, and its handler
// finds the decision with ratelimit.DecisionFromContext.
//
//	set, _ := limiter.RuleSet(ctx, ratelimit.NewRule("per-tenant", ratelimit.TokenBucket(100, 10, 1000)))
//	key := ratelimitgrpc.KeyByMetadata("x-tenant")
//	srv := grpc.NewServer(
//		grpc.ChainUnaryInterceptor(ratelimitgrpc.UnaryServerInterceptor(limiter, set, key)),
//		grpc.ChainStreamInterceptor(ratelimitgrpc.StreamServerInterceptor(limiter, set, key)),
//	)
//
// ProtectUnaryServerInterceptor and ProtectStreamServerInterceptor put
// the calls in a ratelimit.Protection's loop (outcomes reported, non-core
// methods degraded at a stage), as ratelimit.ProtectMiddleware does for
// HTTP: chain them before the rate limit. RetryUnaryClientInterceptor is
// the client's side: RESOURCE_EXHAUSTED retried under a
// ratelimit.RetryPolicy after the delay the denial carries.
package ratelimitgrpc

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"time"

	"github.com/redis-ratelimit/redis-ratelimit/clients/go/ratelimit"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/protoadapt"
	"google.golang.org/protobuf/types/known/durationpb"
)

// The metadata keys of the answer (gRPC metadata keys are lower case).
const (
	MetadataRateLimitPolicy  = "ratelimit-policy"
	MetadataRateLimit        = "ratelimit"
	MetadataRetryAfter       = "retry-after"
	MetadataViolatedPolicies = "violated-policies"
)

// KeyFunc is a call's identity: each rule's key is built from it. fullMethod
// is the call's method ("/pkg.Service/Method"). "" or an error is a call
// without a key: codes.InvalidArgument by default (WithMissingKey).
type KeyFunc func(ctx context.Context, fullMethod string) (string, error)

// KeyByMetadata keys calls by the first value of an incoming metadata key
// (an API key, a tenant). A call without it has no key.
func KeyByMetadata(name string) KeyFunc {
	name = strings.ToLower(strings.TrimSpace(name))
	return func(ctx context.Context, _ string) (string, error) {
		if name == "" {
			return "", fmt.Errorf("KeyByMetadata: empty metadata key: %w", ratelimit.ErrNoKey)
		}
		md, _ := metadata.FromIncomingContext(ctx)
		for _, v := range md.Get(name) {
			if v = strings.TrimSpace(v); v != "" {
				return v, nil
			}
		}
		return "", fmt.Errorf("no %s metadata: %w", name, ratelimit.ErrNoKey)
	}
}

// KeyByPeer keys calls by the IP address of the connection's peer.
func KeyByPeer() KeyFunc {
	return func(ctx context.Context, _ string) (string, error) {
		if a, ok := PeerIP(ctx); ok {
			return a.String(), nil
		}
		return "", fmt.Errorf("the peer has no IP address: %w", ratelimit.ErrNoKey)
	}
}

// KeyByContext keys calls by a value an earlier interceptor put in the
// context under key (an authenticated user): a string or a fmt.Stringer.
func KeyByContext(key any) KeyFunc {
	return func(ctx context.Context, _ string) (string, error) {
		if key == nil {
			return "", fmt.Errorf("KeyByContext: nil context key: %w", ratelimit.ErrNoKey)
		}
		switch v := ctx.Value(key).(type) {
		case string:
			if v != "" {
				return v, nil
			}
		case fmt.Stringer:
			if s := v.String(); s != "" {
				return s, nil
			}
		}
		return "", fmt.Errorf("no value for context key %v: %w", key, ratelimit.ErrNoKey)
	}
}

// PeerIP is the IP address of the call's peer (false for a unix socket or
// a context without a peer).
func PeerIP(ctx context.Context) (netip.Addr, bool) {
	p, ok := peer.FromContext(ctx)
	if !ok || p.Addr == nil {
		return netip.Addr{}, false
	}
	if tcp, ok := p.Addr.(*net.TCPAddr); ok {
		a, ok := netip.AddrFromSlice(tcp.IP)
		return a.Unmap(), ok
	}
	ap, err := netip.ParseAddrPort(p.Addr.String())
	if err != nil {
		return netip.Addr{}, false
	}
	return ap.Addr().Unmap(), true
}

// Option configures the interceptors.
type Option func(*config)

type config struct {
	cost     func(ctx context.Context, fullMethod string) uint64
	skip     func(ctx context.Context, fullMethod string) bool
	missing  ratelimit.MissingKey
	inFlight *ratelimit.Rule
}

// WithInFlight caps the calls in flight per identity (a stream counts
// until it ends): rule is a CONCURRENCY rule (inline, or a policy the
// server has), as the HTTP middleware's WithInFlight. Each call the rate
// rules admit takes a lease of one unit before its handler runs and
// releases it when the handler returns; a full cap ends the call with
// ResourceExhausted naming the cap. The rule is checked when the
// interceptors are made (NewInterceptors returns a bad one as an error).
func WithInFlight(rule ratelimit.Rule) Option {
	return func(c *config) { c.inFlight = &rule }
}

// WithCost makes every call cost n units (1 by default).
func WithCost(n uint64) Option {
	return func(c *config) { c.cost = func(context.Context, string) uint64 { return n } }
}

// WithCostFunc computes each call's cost from its method (a per-method
// cost). A nil f is the default cost, 1.
func WithCostFunc(f func(ctx context.Context, fullMethod string) uint64) Option {
	return func(c *config) { c.cost = f }
}

// WithSkip lets the calls for which skip answers true through unlimited
// and without fields (health checks, reflection).
func WithSkip(skip func(ctx context.Context, fullMethod string) bool) Option {
	return func(c *config) { c.skip = skip }
}

// WithMissingKey says what a call without a key gets: MissingKeyReject (the
// default: codes.InvalidArgument, "this request carries no rate-limit key")
// or MissingKeyAllow (the handler, unlimited, without fields).
func WithMissingKey(m ratelimit.MissingKey) Option {
	return func(c *config) { c.missing = m }
}

// limiter is what both interceptors share.
type limiter struct {
	l      *ratelimit.Limiter
	set    *ratelimit.RuleSet
	key    KeyFunc
	cfg    config
	policy string
	err    error
}

func newLimiter(l *ratelimit.Limiter, set *ratelimit.RuleSet, key KeyFunc, opts []Option) *limiter {
	g := &limiter{l: l, set: set, key: key}
	for _, o := range opts {
		if o != nil {
			o(&g.cfg)
		}
	}
	switch {
	case l == nil:
		g.err = &ratelimit.InvalidArgumentError{Rule: "interceptor", Arg: "limiter", Reason: "nil *Limiter"}
	case set == nil || len(set.Rules()) == 0:
		g.err = &ratelimit.InvalidArgumentError{Rule: "interceptor", Arg: "rules", Reason: "nil or empty *RuleSet (Limiter.RuleSet makes one)"}
	case key == nil:
		g.err = &ratelimit.InvalidArgumentError{Rule: "interceptor", Arg: "key", Reason: "nil KeyFunc (KeyByMetadata, KeyByPeer, KeyByContext)"}
	default:
		g.policy = set.PolicyField()
		if g.cfg.inFlight != nil {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			spec, err := l.InFlightSpec(ctx, *g.cfg.inFlight)
			if err != nil {
				g.err = err
				break
			}
			g.policy += ", " + ratelimit.PolicyItem(g.cfg.inFlight.Name(), spec)
		}
	}
	return g
}

// NewInterceptors is UnaryServerInterceptor and StreamServerInterceptor
// over the same limiter, with a nil limiter, rule set or key returned as an
// *ratelimit.InvalidArgumentError naming it.
func NewInterceptors(l *ratelimit.Limiter, set *ratelimit.RuleSet, key KeyFunc, opts ...Option) (grpc.UnaryServerInterceptor, grpc.StreamServerInterceptor, error) {
	g := newLimiter(l, set, key, opts)
	if g.err != nil {
		return nil, nil, g.err
	}
	return g.unary, g.stream, nil
}

// UnaryServerInterceptor decides every unary call: denied, it ends with
// codes.ResourceExhausted and the fields in its trailers; admitted, the
// fields go in its headers. A nil limiter, set or key ends every call with
// codes.Internal naming it (NewInterceptors returns that as an error).
func UnaryServerInterceptor(l *ratelimit.Limiter, set *ratelimit.RuleSet, key KeyFunc, opts ...Option) grpc.UnaryServerInterceptor {
	return newLimiter(l, set, key, opts).unary
}

// StreamServerInterceptor decides every stream when it opens (one decision
// per stream, not per message), as UnaryServerInterceptor.
func StreamServerInterceptor(l *ratelimit.Limiter, set *ratelimit.RuleSet, key KeyFunc, opts ...Option) grpc.StreamServerInterceptor {
	return newLimiter(l, set, key, opts).stream
}

func (g *limiter) unary(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	method := ""
	if info != nil {
		method = info.FullMethod
	}
	c := g.decide(ctx, method, func(md metadata.MD) error { return grpc.SetHeader(ctx, md) },
		func(md metadata.MD) { _ = grpc.SetTrailer(ctx, md) })
	if c.err != nil {
		return nil, c.err
	}
	defer c.release()
	return handler(c.ctx, req)
}

func (g *limiter) stream(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
	method := ""
	if info != nil {
		method = info.FullMethod
	}
	c := g.decide(ss.Context(), method, ss.SetHeader, ss.SetTrailer)
	if c.err != nil {
		return c.err
	}
	defer c.release()
	if !c.limited {
		return handler(srv, ss)
	}
	return handler(srv, &decidedStream{ServerStream: ss, ctx: c.ctx})
}

// decidedStream is a stream whose context carries its decision.
type decidedStream struct {
	grpc.ServerStream
	ctx context.Context
}

func (s *decidedStream) Context() context.Context { return s.ctx }

// call is what decide answers: the error to end the call with, or its
// context carrying the decision (limited false when it passes unlimited),
// and the in-flight lease to release when the handler returns.
type call struct {
	ctx     context.Context
	err     error
	limited bool
	lease   *ratelimit.Lease
}

// release gives the call's in-flight unit back (none without a cap).
func (c call) release() {
	if c.lease != nil {
		_, _ = c.lease.Release(context.WithoutCancel(c.ctx))
	}
}

// decide decides one call.
func (g *limiter) decide(ctx context.Context, method string, setHeader func(metadata.MD) error, setTrailer func(metadata.MD)) call {
	if g.err != nil {
		return call{ctx: ctx, err: status.Error(codes.Internal, "rate limiter misconfigured: "+g.err.Error())}
	}
	if g.cfg.skip != nil && g.cfg.skip(ctx, method) {
		return call{ctx: ctx}
	}
	id, err, panicked := g.identity(ctx, method)
	if panicked {
		return call{ctx: ctx, err: status.Error(codes.Internal, "the rate-limit key of this request could not be computed")}
	}
	if err != nil || id == "" {
		if g.cfg.missing == ratelimit.MissingKeyAllow {
			return call{ctx: ctx}
		}
		return call{ctx: ctx, err: status.Error(codes.InvalidArgument, "this request carries no rate-limit key")}
	}
	cost := uint64(1)
	if g.cfg.cost != nil {
		cost = g.cfg.cost(ctx, method)
	}
	origin := ratelimit.Origin{}
	if a, ok := PeerIP(ctx); ok {
		origin.ClientIP = a.String()
	}
	if md, ok := metadata.FromIncomingContext(ctx); ok {
		if ua := md.Get("user-agent"); len(ua) > 0 {
			origin.UserAgent = ua[0]
		}
	}
	d := g.l.CheckFrom(ctx, g.set, id, cost, origin)
	rule := g.set.DecidingRule(d)
	if !d.Allowed {
		return call{ctx: ctx, err: g.deny(rule, d, setTrailer), limited: true}
	}
	item := ratelimit.RateLimitItem(rule, d)
	var lease *ratelimit.Lease
	if g.cfg.inFlight != nil {
		l, err := g.l.LeaseFrom(ctx, *g.cfg.inFlight, id, origin)
		var de *ratelimit.DeniedError
		switch {
		case err == nil:
			lease = l
			item += ", " + ratelimit.RateLimitItem(g.cfg.inFlight.Name(), l.Decision())
		case ctx.Err() != nil:
			return call{ctx: ctx, err: status.FromContextError(ctx.Err()).Err(), limited: true}
		case errors.As(err, &de):
			return call{ctx: ctx, err: g.deny(g.cfg.inFlight.Name(), de.Decision, setTrailer), limited: true}
		}
		// Another error (the server's): admitted without a lease.
	}
	_ = setHeader(metadata.Pairs(MetadataRateLimitPolicy, g.policy, MetadataRateLimit, item))
	return call{ctx: ratelimit.NewDecisionContext(ctx, d), limited: true, lease: lease}
}

// deny sets a denial's trailers and returns its status.
func (g *limiter) deny(rule string, d ratelimit.Decision, setTrailer func(metadata.MD)) error {
	md := metadata.Pairs(
		MetadataRateLimitPolicy, g.policy,
		MetadataRateLimit, ratelimit.RateLimitItem(rule, d),
		MetadataViolatedPolicies, rule,
	)
	if s, ok := ratelimit.RetryAfterSeconds(d); ok {
		md.Set(MetadataRetryAfter, fmt.Sprint(s))
	}
	setTrailer(md)
	return Denial(rule, d)
}

// identity runs the KeyFunc; panicked is true when it panicked.
func (g *limiter) identity(ctx context.Context, method string) (id string, err error, panicked bool) {
	defer func() {
		if p := recover(); p != nil {
			id, err, panicked = "", fmt.Errorf("ratelimitgrpc: the KeyFunc panicked: %v", p), true
		}
	}()
	id, err = g.key(ctx, method)
	return id, err, false
}

// Denial is the status of a call denied by the rule named rule:
// codes.ResourceExhausted, its message the problem body's detail (`rate
// limit "rule" exceeded; retry after N s`, or `...; this request can never
// pass`), with an errdetails.QuotaFailure naming the rule and, when the
// call can pass later, an errdetails.RetryInfo with Retry-After's delay.
func Denial(rule string, d ratelimit.Decision) error {
	detail := fmt.Sprintf("rate limit %q exceeded; this request can never pass", rule)
	s, retry := ratelimit.RetryAfterSeconds(d)
	if retry {
		detail = fmt.Sprintf("rate limit %q exceeded; retry after %d s", rule, s)
	}
	st := status.New(codes.ResourceExhausted, detail)
	details := []protoadapt.MessageV1{&errdetails.QuotaFailure{Violations: []*errdetails.QuotaFailure_Violation{{Subject: rule, Description: detail}}}}
	if retry {
		details = append(details, &errdetails.RetryInfo{RetryDelay: durationpb.New(time.Duration(s) * time.Second)})
	}
	if with, err := st.WithDetails(details...); err == nil {
		st = with
	}
	return st.Err()
}

// RetryAfter reads a denial's delay from a call's error (its RetryInfo)
// or trailer (retry-after): what a client waits before trying again. ok is
// false when the error is no rate-limit denial or carries no delay.
func RetryAfter(err error, trailer metadata.MD) (time.Duration, bool) {
	st, ok := status.FromError(err)
	if !ok || st.Code() != codes.ResourceExhausted {
		return 0, false
	}
	for _, d := range st.Details() {
		if ri, ok := d.(*errdetails.RetryInfo); ok && ri.GetRetryDelay() != nil {
			return ri.GetRetryDelay().AsDuration(), true
		}
	}
	for _, v := range trailer.Get(MetadataRetryAfter) {
		var s int64
		if _, err := fmt.Sscan(v, &s); err == nil && s >= 0 {
			return time.Duration(s) * time.Second, true
		}
	}
	return 0, false
}

package ratelimitgrpc

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/redis-ratelimit/redis-ratelimit/clients/go/ratelimit"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

// DegradeUnaryFunc answers a non-core unary call instead of its handler
// (a cached or default reply): info says why (a stage, or the rate limit
// inside denied the call).
type DegradeUnaryFunc func(ctx context.Context, fullMethod string, req any, info ratelimit.DegradeInfo) (any, error)

// DegradeStreamFunc answers a non-core stream instead of its handler.
type DegradeStreamFunc func(srv any, ss grpc.ServerStream, fullMethod string, info ratelimit.DegradeInfo) error

// ProtectOption configures the protection interceptors.
type ProtectOption func(*protectConfig)

type protectConfig struct {
	methods       func(string) bool
	nonCore       func(string) bool
	nonCoreSet    bool
	degradeUnary  DegradeUnaryFunc
	degradeStream DegradeStreamFunc
	isError       func(fullMethod string, err error) bool
}

// ProtectMethods limits the interceptors to the methods for which f
// answers true (the policy's methods); the others pass untouched and
// report nothing. By default every method is the policy's.
func ProtectMethods(f func(fullMethod string) bool) ProtectOption {
	return func(c *protectConfig) { c.methods = f }
}

// ProtectNonCore makes the methods for which f answers true non-core (a
// nil f: every method): while the policy is at StageDegrade or above, they
// answer with the degrade handler, or RESOURCE_EXHAUSTED without one,
// instead of running. Without this option the methods are core, unless a
// degrade handler is given: then every method is non-core (as the HTTP
// ProtectDegrade makes a route non-core).
func ProtectNonCore(f func(fullMethod string) bool) ProtectOption {
	return func(c *protectConfig) { c.nonCore, c.nonCoreSet = f, true }
}

// ProtectDegradeUnary is the unary calls' degrade handler: it answers a
// non-core call at StageDegrade or above (Reason DegradeStage), and a
// non-core call the rate limit inside denied (Reason DegradeDenied; the
// denial's trailers are already set).
func ProtectDegradeUnary(h DegradeUnaryFunc) ProtectOption {
	return func(c *protectConfig) { c.degradeUnary = h }
}

// ProtectDegradeStream is the streams' degrade handler, as
// ProtectDegradeUnary.
func ProtectDegradeStream(h DegradeStreamFunc) ProtectOption {
	return func(c *protectConfig) { c.degradeStream = h }
}

// ProtectErrorWhen replaces the default error predicate (IsServerError):
// f tells, from the method and the error its handler returned (nil for a
// success), whether the outcome is an error. A panic of the handler is an
// error whatever f says; RESOURCE_EXHAUSTED is never an outcome.
func ProtectErrorWhen(f func(fullMethod string, err error) bool) ProtectOption {
	return func(c *protectConfig) {
		if f != nil {
			c.isError = f
		}
	}
}

// IsServerError is the default error predicate of the protection
// interceptors: a status the server is to blame for (Unknown, Internal,
// Unavailable, DeadlineExceeded, DataLoss), a context.DeadlineExceeded,
// or an error that is no gRPC status (Unknown on the wire). nil, a client's
// cancellation and the client's own faults (InvalidArgument, NotFound,
// PermissionDenied, ...) are successes.
func IsServerError(err error) bool {
	if err == nil {
		return false
	}
	if errors.Is(err, context.DeadlineExceeded) {
		return true
	}
	if errors.Is(err, context.Canceled) {
		return false
	}
	switch status.Code(err) {
	case codes.Unknown, codes.Internal, codes.Unavailable, codes.DeadlineExceeded, codes.DataLoss:
		return true
	}
	return false
}

// protector is what both protection interceptors share.
type protector struct {
	p      *ratelimit.Protection
	policy string
	cfg    protectConfig
}

func newProtector(p *ratelimit.Protection, policy string, opts []ProtectOption) *protector {
	g := &protector{p: p, policy: policy, cfg: protectConfig{isError: func(_ string, err error) bool { return IsServerError(err) }}}
	for _, o := range opts {
		if o != nil {
			o(&g.cfg)
		}
	}
	if p != nil && policy != "" {
		p.Watch(policy)
	}
	return g
}

// covers: whether the interceptors act on method (nothing to report to
// without a protection or a policy).
func (g *protector) covers(method string) bool {
	if g.p == nil || g.policy == "" {
		return false
	}
	return g.cfg.methods == nil || g.cfg.methods(method)
}

// isNonCore: whether method degrades at a stage.
func (g *protector) isNonCore(method string, degrade bool) bool {
	if g.cfg.nonCoreSet {
		return g.cfg.nonCore == nil || g.cfg.nonCore(method)
	}
	return degrade
}

// stageDenial is a non-core call's status at a stage without a degrade
// handler: the policy's denial for the stage poll, its fields in the
// trailers.
func (g *protector) stageDenial(setTrailer func(metadata.MD)) error {
	wait := max(g.p.StagePoll().Milliseconds(), 1)
	d := ratelimit.Decision{WaitMs: wait, RetryAfter: time.Duration(wait) * time.Millisecond,
		ResetAfter: time.Duration(wait) * time.Millisecond, DeniedBy: -1, Granted: -1, Rule: g.policy, Path: ratelimit.PathLocal}
	md := metadata.Pairs(MetadataRateLimit, ratelimit.RateLimitItem(g.policy, d), MetadataViolatedPolicies, g.policy)
	if s, ok := ratelimit.RetryAfterSeconds(d); ok {
		md.Set(MetadataRetryAfter, fmt.Sprint(s))
	}
	setTrailer(md)
	return Denial(g.policy, d)
}

// record reports a finished call's outcome: none for RESOURCE_EXHAUSTED
// (the rate limit's denial, not a call the policy admitted).
func (g *protector) record(method string, err error) {
	if status.Code(err) == codes.ResourceExhausted {
		return
	}
	g.p.Record(g.policy, g.cfg.isError(method, err))
}

// ProtectUnaryServerInterceptor wraps unary calls in the protection loop
// of policy, as ratelimit.ProtectMiddleware does for HTTP: each call's
// end counts as an outcome of the policy (an error: IsServerError, or
// ProtectErrorWhen's predicate, or a panic), sent with the loop's next
// report (RL.OUTCOME); RESOURCE_EXHAUSTED is no outcome. A core method only
// reports. A non-core one (ProtectNonCore, or any method once a degrade
// handler is given) at StageDegrade or above answers with the degrade
// handler, or RESOURCE_EXHAUSTED naming the policy (retry-after the stage
// poll), and its handler does not run (nor counts).
//
// Chain it before the rate limit (grpc.ChainUnaryInterceptor(protect,
// limit)): a degraded call then costs no Redis call, and a denial of a
// method with a degrade handler is answered by it. A nil p or an empty
// policy is an interceptor that only calls the handler.
func ProtectUnaryServerInterceptor(p *ratelimit.Protection, policy string, opts ...ProtectOption) grpc.UnaryServerInterceptor {
	g := newProtector(p, policy, opts)
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (resp any, err error) {
		method := ""
		if info != nil {
			method = info.FullMethod
		}
		if !g.covers(method) {
			return handler(ctx, req)
		}
		degrade := g.cfg.degradeUnary
		nonCore := g.isNonCore(method, degrade != nil)
		if nonCore {
			if stage := g.p.Stage(g.policy); stage >= ratelimit.StageDegrade {
				if degrade != nil {
					return degrade(ctx, method, req, ratelimit.DegradeInfo{Reason: ratelimit.DegradeStage, Stage: stage})
				}
				return nil, g.stageDenial(func(md metadata.MD) { _ = grpc.SetTrailer(ctx, md) })
			}
		}
		finished := false
		defer func() {
			if !finished {
				// A panic: an error outcome, and the panic goes on.
				g.p.Record(g.policy, true)
			}
		}()
		resp, err = handler(ctx, req)
		finished = true
		if nonCore && degrade != nil && status.Code(err) == codes.ResourceExhausted {
			return degrade(ctx, method, req, ratelimit.DegradeInfo{Reason: ratelimit.DegradeDenied, Stage: g.p.Stage(g.policy)})
		}
		g.record(method, err)
		return resp, err
	}
}

// ProtectStreamServerInterceptor is ProtectUnaryServerInterceptor for
// streams: a stream's outcome is its handler's return, when it ends.
func ProtectStreamServerInterceptor(p *ratelimit.Protection, policy string, opts ...ProtectOption) grpc.StreamServerInterceptor {
	g := newProtector(p, policy, opts)
	return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) (err error) {
		method := ""
		if info != nil {
			method = info.FullMethod
		}
		if !g.covers(method) {
			return handler(srv, ss)
		}
		degrade := g.cfg.degradeStream
		nonCore := g.isNonCore(method, degrade != nil)
		if nonCore {
			if stage := g.p.Stage(g.policy); stage >= ratelimit.StageDegrade {
				if degrade != nil {
					return degrade(srv, ss, method, ratelimit.DegradeInfo{Reason: ratelimit.DegradeStage, Stage: stage})
				}
				return g.stageDenial(ss.SetTrailer)
			}
		}
		finished := false
		defer func() {
			if !finished {
				g.p.Record(g.policy, true)
			}
		}()
		err = handler(srv, ss)
		finished = true
		if nonCore && degrade != nil && status.Code(err) == codes.ResourceExhausted {
			return degrade(srv, ss, method, ratelimit.DegradeInfo{Reason: ratelimit.DegradeDenied, Stage: g.p.Stage(g.policy)})
		}
		g.record(method, err)
		return err
	}
}

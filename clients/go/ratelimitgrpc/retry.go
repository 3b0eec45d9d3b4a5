package ratelimitgrpc

import (
	"context"

	"github.com/redis-ratelimit/redis-ratelimit/clients/go/ratelimit"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

// RetryUnaryClientInterceptor retries a client's unary calls that end
// with RESOURCE_EXHAUSTED under p (ratelimit.RetryPolicy): never sooner
// than the delay the denial carries (RetryAfter: its RetryInfo, or its
// retry-after trailer), with p's jittered backoff, within p's retries and
// MaxTotal and the call's deadline (a retry that would start after it is
// not waited for: the denial is answered). Only the methods idempotent
// answers true for are retried, unless p.RetryNonIdempotent (a nil
// idempotent: none is). A call whose context ends during a wait ends with
// its context's status (Canceled, DeadlineExceeded).
func RetryUnaryClientInterceptor(p ratelimit.RetryPolicy, idempotent func(fullMethod string) bool) grpc.UnaryClientInterceptor {
	return func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		if !p.RetryNonIdempotent && (idempotent == nil || !idempotent(method)) {
			return invoker(ctx, method, req, reply, cc, opts...)
		}
		last, err := ratelimit.Retry(ctx, p, func(ctx context.Context, _ int) ratelimit.Attempt[error] {
			var trailer metadata.MD
			err := invoker(ctx, method, req, reply, cc, append(opts[:len(opts):len(opts)], grpc.Trailer(&trailer))...)
			if status.Code(err) != codes.ResourceExhausted {
				return ratelimit.Done(err, nil)
			}
			wait, _ := RetryAfter(err, trailer)
			return ratelimit.Limited(err, wait)
		})
		if err != nil {
			return status.FromContextError(err).Err()
		}
		return last
	}
}

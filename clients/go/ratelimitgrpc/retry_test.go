package ratelimitgrpc_test

import (
	"context"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis-ratelimit/redis-ratelimit/clients/go/ratelimit"
	"github.com/redis-ratelimit/redis-ratelimit/clients/go/ratelimitgrpc"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
)

const healthCheck = "/grpc.health.v1.Health/Check"

// rServe runs the Health service behind the rate-limit interceptors of
// spec (per x-tenant) on a real Redis, and answers a client calling it
// through retry, and the count of calls the client sent.
func rServe(t *testing.T, spec ratelimit.Spec, retry grpc.UnaryClientInterceptor) (healthpb.HealthClient, *atomic.Int64) {
	t.Helper()
	l := gLimiter(t)
	set, err := l.RuleSet(context.Background(), ratelimit.NewRule("per-tenant", spec).Prefix("grpc:retry:"))
	if err != nil {
		t.Fatal(err)
	}
	unary, stream, err := ratelimitgrpc.NewInterceptors(l, set, ratelimitgrpc.KeyByMetadata("x-tenant"))
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer(grpc.UnaryInterceptor(unary), grpc.StreamInterceptor(stream))
	healthpb.RegisterHealthServer(srv, health.NewServer())
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(srv.Stop)
	sent := &atomic.Int64{}
	count := func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		sent.Add(1)
		return invoker(ctx, method, req, reply, cc, opts...)
	}
	conn, err := grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithChainUnaryInterceptor(retry, count))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return healthpb.NewHealthClient(conn), sent
}

// TestGRPCRetryGetsThroughAfterTheDelayTheDenialSaid: the second call
// within a second is denied (RetryInfo 1 s); the interceptor waits that
// long, its own backoff being shorter, and the retry passes.
func TestGRPCRetryGetsThroughAfterTheDelayTheDenialSaid(t *testing.T) {
	p := ratelimit.RetryPolicy{Backoff: []time.Duration{10 * time.Millisecond}, Jitter: 10 * time.Millisecond, MaxRetries: 3, MaxTotal: time.Minute}
	client, sent := rServe(t, ratelimit.TokenBucket(1, 1, 1000),
		ratelimitgrpc.RetryUnaryClientInterceptor(p, func(m string) bool { return m == healthCheck }))
	if _, err := client.Check(gCtx(t, "x-tenant", "acme"), &healthpb.HealthCheckRequest{}); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	r, err := client.Check(gCtx(t, "x-tenant", "acme"), &healthpb.HealthCheckRequest{})
	waited := time.Since(start)
	if err != nil || r.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("the retried call: %v %v", r, err)
	}
	if n := sent.Load(); n < 3 {
		t.Fatalf("%d calls sent, want the first, a denied one and its retry", n)
	}
	if waited < time.Second {
		t.Errorf("through after %v, before the denial's 1 s", waited)
	}
}

// TestGRPCRetryGivesUpAtItsDeadline: a 60 s delay and a deadline sooner:
// the denial at once, one call sent; a method not declared idempotent is
// never retried.
func TestGRPCRetryGivesUpAtItsDeadline(t *testing.T) {
	p := ratelimit.DefaultRetryPolicy()
	client, sent := rServe(t, ratelimit.TokenBucket(1, 1, 60_000),
		ratelimitgrpc.RetryUnaryClientInterceptor(p, func(m string) bool { return m == healthCheck }))
	if _, err := client.Check(gCtx(t, "x-tenant", "acme"), &healthpb.HealthCheckRequest{}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(gCtx(t, "x-tenant", "acme"), 10*time.Second)
	defer cancel()
	_, err := client.Check(ctx, &healthpb.HealthCheckRequest{})
	if d, ok := ratelimitgrpc.RetryAfter(err, nil); status.Code(err) != codes.ResourceExhausted || !ok || d != 60*time.Second {
		t.Fatalf("want the denial saying 60 s: %v", err)
	}
	if ctx.Err() != nil {
		t.Fatal("the client waited for its deadline instead of giving up before it")
	}
	if n := sent.Load(); n != 2 {
		t.Fatalf("%d calls sent, want 2", n)
	}

	// Not idempotent: never retried, even with a delay it could wait.
	q := ratelimit.RetryPolicy{Backoff: []time.Duration{0}, MaxRetries: 3}
	client, sent = rServe(t, ratelimit.TokenBucket(1, 1, 1000), ratelimitgrpc.RetryUnaryClientInterceptor(q, nil))
	_, _ = client.Check(gCtx(t, "x-tenant", "acme"), &healthpb.HealthCheckRequest{})
	if _, err := client.Check(gCtx(t, "x-tenant", "acme"), &healthpb.HealthCheckRequest{}); status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("a call not declared idempotent: %v, want its denial", err)
	}
	if n := sent.Load(); n != 2 {
		t.Fatalf("%d calls sent, want 2 (no retry)", n)
	}
}

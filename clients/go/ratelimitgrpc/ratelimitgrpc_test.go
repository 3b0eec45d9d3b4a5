package ratelimitgrpc_test

// The interceptors in a real gRPC server, called by a real gRPC client over
// TCP loopback, with a real Redis: the Health service (Check: unary, Watch:
// a server stream), which needs no protoc.

import (
	"context"
	"errors"
	"fmt"
	"log"
	"net"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis-ratelimit/redis-ratelimit/clients/go/internal/testserver"
	"github.com/redis-ratelimit/redis-ratelimit/clients/go/ratelimit"
	"github.com/redis-ratelimit/redis-ratelimit/clients/go/ratelimitgrpc"
	"github.com/redis/go-redis/v9"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

func gLimiter(t *testing.T) *ratelimit.Limiter {
	t.Helper()
	srv := testserver.Start(t, testserver.Redis)
	ctx, cancel := context.WithTimeout(context.Background(), testserver.Patience)
	defer cancel()
	c, err := ratelimit.NewClient(ctx, srv.Client(), ratelimit.WithDeadline(2*time.Second))
	if err != nil {
		t.Fatalf("NewClient: %v", err)
	}
	l := ratelimit.NewLimiter(c)
	t.Cleanup(func() { _ = l.Close(context.Background()) })
	return l
}

// gSeen records the decisions the handlers' contexts carried (an
// interceptor after the rate limiter's).
type gSeen struct {
	mu        sync.Mutex
	decisions []ratelimit.Decision
}

func (s *gSeen) add(ctx context.Context) {
	if d, ok := ratelimit.DecisionFromContext(ctx); ok {
		s.mu.Lock()
		s.decisions = append(s.decisions, d)
		s.mu.Unlock()
	}
}

func (s *gSeen) count() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.decisions)
}

// gServe runs a gRPC server with the interceptors and the Health service on
// a loopback port, and returns a client connection to it.
func gServe(t *testing.T, unary grpc.UnaryServerInterceptor, stream grpc.StreamServerInterceptor, seen *gSeen) healthpb.HealthClient {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer(
		grpc.ChainUnaryInterceptor(unary, func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
			seen.add(ctx)
			return h(ctx, req)
		}),
		grpc.ChainStreamInterceptor(stream, func(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, h grpc.StreamHandler) error {
			seen.add(ss.Context())
			return h(srv, ss)
		}),
	)
	healthpb.RegisterHealthServer(srv, health.NewServer())
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(srv.Stop)
	conn, err := grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return healthpb.NewHealthClient(conn)
}

func gCtx(t *testing.T, kv ...string) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), testserver.Patience)
	t.Cleanup(cancel)
	return metadata.AppendToOutgoingContext(ctx, kv...)
}

// gCheckDenial checks a denied call: ResourceExhausted, its message the
// problem's detail, the fields in its trailers, QuotaFailure and RetryInfo
// in its details, consistent with each other.
func gCheckDenial(t *testing.T, err error, trailer metadata.MD, rule, policy string, window int) {
	t.Helper()
	st, ok := status.FromError(err)
	if !ok || st.Code() != codes.ResourceExhausted {
		t.Fatalf("denied call: %v, want ResourceExhausted", err)
	}
	ra, convErr := strconv.Atoi(first(trailer, "retry-after"))
	if convErr != nil || ra < 1 || ra > window {
		t.Fatalf("trailer retry-after %q, want 1..%d (trailer %v)", first(trailer, "retry-after"), window, trailer)
	}
	if want := fmt.Sprintf("rate limit %q exceeded; retry after %d s", rule, ra); st.Message() != want {
		t.Errorf("status message %q, want %q", st.Message(), want)
	}
	if got := first(trailer, "ratelimit-policy"); got != policy {
		t.Errorf("trailer ratelimit-policy %q, want %q", got, policy)
	}
	if got := first(trailer, "ratelimit"); !strings.HasPrefix(got, fmt.Sprintf(`"%s";r=0;t=`, rule)) {
		t.Errorf("trailer ratelimit %q", got)
	}
	if got := first(trailer, "violated-policies"); got != rule {
		t.Errorf("trailer violated-policies %q", got)
	}
	var quota, retry bool
	for _, d := range st.Details() {
		switch d := d.(type) {
		case *errdetails.QuotaFailure:
			quota = len(d.GetViolations()) == 1 && d.GetViolations()[0].GetSubject() == rule
		case *errdetails.RetryInfo:
			retry = d.GetRetryDelay().AsDuration() == time.Duration(ra)*time.Second
		}
	}
	if !quota || !retry {
		t.Errorf("status details %v: QuotaFailure naming %q %v, RetryInfo of %d s %v", st.Details(), rule, quota, ra, retry)
	}
	if d, ok := ratelimitgrpc.RetryAfter(err, nil); !ok || d != time.Duration(ra)*time.Second {
		t.Errorf("RetryAfter(err) = %v %v", d, ok)
	}
	if d, ok := ratelimitgrpc.RetryAfter(status.Error(codes.ResourceExhausted, "x"), trailer); !ok || d != time.Duration(ra)*time.Second {
		t.Errorf("RetryAfter(trailer) = %v %v", d, ok)
	}
}

func first(md metadata.MD, k string) string {
	if v := md.Get(k); len(v) > 0 {
		return v[0]
	}
	return ""
}

// TestGRPCUnary: Health.Check limited to 2 per minute per tenant: two
// calls pass with ratelimit-policy and ratelimit in their headers and the
// decision in the handler's context; the third ends with ResourceExhausted
// and the fields in its trailers, its message and its details; another
// tenant is not limited by the first.
func TestGRPCUnary(t *testing.T) {
	l := gLimiter(t)
	set, err := l.RuleSet(context.Background(), ratelimit.NewRule("per-tenant", ratelimit.SlidingWindow(2, 60_000)).Prefix("grpc:unary:"))
	if err != nil {
		t.Fatal(err)
	}
	unary, stream, err := ratelimitgrpc.NewInterceptors(l, set, ratelimitgrpc.KeyByMetadata("X-Tenant"))
	if err != nil {
		t.Fatal(err)
	}
	seen := &gSeen{}
	client := gServe(t, unary, stream, seen)
	const policy = `"per-tenant";q=2;w=60`

	for i, wantR := range []int{1, 0} {
		var header metadata.MD
		resp, err := client.Check(gCtx(t, "x-tenant", "acme"), &healthpb.HealthCheckRequest{}, grpc.Header(&header))
		if err != nil || resp.GetStatus() != healthpb.HealthCheckResponse_SERVING {
			t.Fatalf("call %d: %v %v", i, resp, err)
		}
		if got := first(header, "ratelimit-policy"); got != policy {
			t.Errorf("call %d: header ratelimit-policy %q", i, got)
		}
		if got := first(header, "ratelimit"); !strings.HasPrefix(got, fmt.Sprintf(`"per-tenant";r=%d;t=`, wantR)) {
			t.Errorf("call %d: header ratelimit %q, want r=%d", i, got, wantR)
		}
	}
	if seen.count() != 2 {
		t.Errorf("the handler's context carried %d decisions, want 2", seen.count())
	}
	var trailer metadata.MD
	_, err = client.Check(gCtx(t, "x-tenant", "acme"), &healthpb.HealthCheckRequest{}, grpc.Trailer(&trailer))
	gCheckDenial(t, err, trailer, "per-tenant", policy, 60)
	if seen.count() != 2 {
		t.Errorf("a denied call reached the handler")
	}
	if _, err := client.Check(gCtx(t, "x-tenant", "other"), &healthpb.HealthCheckRequest{}); err != nil {
		t.Errorf("another tenant: %v", err)
	}
}

// TestGRPCStream: Health.Watch (a server stream) limited to 1 stream per
// minute per peer address: the first stream opens with the fields in its
// headers and receives SERVING; the second ends with ResourceExhausted and
// the fields in its trailers.
func TestGRPCStream(t *testing.T) {
	l := gLimiter(t)
	set, err := l.RuleSet(context.Background(), ratelimit.NewRule("per-peer", ratelimit.SlidingWindow(1, 60_000)).Prefix("grpc:stream:"))
	if err != nil {
		t.Fatal(err)
	}
	seen := &gSeen{}
	key := ratelimitgrpc.KeyByPeer()
	client := gServe(t, ratelimitgrpc.UnaryServerInterceptor(l, set, key), ratelimitgrpc.StreamServerInterceptor(l, set, key), seen)
	const policy = `"per-peer";q=1;w=60`

	ctx, cancel := context.WithCancel(gCtx(t))
	defer cancel()
	w, err := client.Watch(ctx, &healthpb.HealthCheckRequest{})
	if err != nil {
		t.Fatal(err)
	}
	msg, err := w.Recv()
	if err != nil || msg.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("first stream: %v %v", msg, err)
	}
	header, err := w.Header()
	if err != nil || first(header, "ratelimit-policy") != policy || !strings.HasPrefix(first(header, "ratelimit"), `"per-peer";r=0;t=`) {
		t.Errorf("first stream's header %v (%v)", header, err)
	}
	if seen.count() != 1 {
		t.Errorf("the stream handler's context carried %d decisions, want 1", seen.count())
	}
	w2, err := client.Watch(gCtx(t), &healthpb.HealthCheckRequest{})
	if err != nil {
		t.Fatal(err)
	}
	_, err = w2.Recv()
	gCheckDenial(t, err, w2.Trailer(), "per-peer", policy, 60)
	if seen.count() != 1 {
		t.Errorf("a denied stream reached the handler")
	}
}

// TestGRPCBadInput: a call without a key ends with InvalidArgument (or
// passes with MissingKeyAllow); a panicking KeyFunc with Internal; a nil
// limiter, set or key is NewInterceptors' *InvalidArgumentError and the
// interceptors' Internal, naming it; skipped methods pass unlimited.
func TestGRPCBadInput(t *testing.T) {
	l := gLimiter(t)
	set, err := l.RuleSet(context.Background(), ratelimit.NewRule("per-tenant", ratelimit.SlidingWindow(1, 60_000)).Prefix("grpc:bad:"))
	if err != nil {
		t.Fatal(err)
	}
	seen := &gSeen{}
	call := func(unary grpc.UnaryServerInterceptor, stream grpc.StreamServerInterceptor, kv ...string) error {
		client := gServe(t, unary, stream, seen)
		_, err := client.Check(gCtx(t, kv...), &healthpb.HealthCheckRequest{})
		return err
	}
	key := ratelimitgrpc.KeyByMetadata("x-tenant")
	err = call(ratelimitgrpc.UnaryServerInterceptor(l, set, key), ratelimitgrpc.StreamServerInterceptor(l, set, key))
	if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "no rate-limit key") {
		t.Errorf("no key: %v", err)
	}
	allow := ratelimitgrpc.WithMissingKey(ratelimit.MissingKeyAllow)
	for range 2 {
		if err := call(ratelimitgrpc.UnaryServerInterceptor(l, set, key, allow), ratelimitgrpc.StreamServerInterceptor(l, set, key, allow)); err != nil {
			t.Errorf("no key, MissingKeyAllow: %v", err)
		}
	}
	boom := func(context.Context, string) (string, error) { panic("boom") }
	err = call(ratelimitgrpc.UnaryServerInterceptor(l, set, boom), ratelimitgrpc.StreamServerInterceptor(l, set, boom))
	if status.Code(err) != codes.Internal || strings.Contains(err.Error(), "boom") {
		t.Errorf("panicking KeyFunc: %v", err)
	}
	skip := ratelimitgrpc.WithSkip(func(_ context.Context, m string) bool { return m == healthpb.Health_Check_FullMethodName })
	for range 3 {
		if err := call(ratelimitgrpc.UnaryServerInterceptor(l, set, key, skip), ratelimitgrpc.StreamServerInterceptor(l, set, key, skip), "x-tenant", "t"); err != nil {
			t.Errorf("skipped method: %v", err)
		}
	}
	for _, c := range []struct {
		arg string
		l   *ratelimit.Limiter
		set *ratelimit.RuleSet
		key ratelimitgrpc.KeyFunc
	}{
		{"limiter", nil, set, key},
		{"rules", l, nil, key},
		{"key", l, set, nil},
	} {
		_, _, err := ratelimitgrpc.NewInterceptors(c.l, c.set, c.key)
		var ia *ratelimit.InvalidArgumentError
		if !errors.As(err, &ia) || ia.Arg != c.arg {
			t.Errorf("NewInterceptors with a nil %s: %v", c.arg, err)
		}
		err = call(ratelimitgrpc.UnaryServerInterceptor(c.l, c.set, c.key), ratelimitgrpc.StreamServerInterceptor(c.l, c.set, c.key), "x-tenant", "t")
		if status.Code(err) != codes.Internal || !strings.Contains(err.Error(), "bad argument "+c.arg) {
			t.Errorf("interceptor with a nil %s: %v", c.arg, err)
		}
	}
	if _, ok := ratelimitgrpc.RetryAfter(errors.New("plain"), nil); ok {
		t.Errorf("RetryAfter of a plain error")
	}
}

// TestGRPCInFlight: at most one Health.Watch stream open per tenant (a
// CONCURRENCY rule): the first opens with the rate rule's item and the
// cap's in its ratelimit header; the second ends with ResourceExhausted
// naming the cap, its ratelimit-policy item without w; once the first
// stream ends (its handler returns, its lease released) a new one opens.
// A rule that is no CONCURRENCY rule is refused, naming the algorithm.
func TestGRPCInFlight(t *testing.T) {
	l := gLimiter(t)
	set, err := l.RuleSet(context.Background(), ratelimit.NewRule("per-tenant", ratelimit.SlidingWindow(100, 60_000)).Prefix("grpc:cap:rate:"))
	if err != nil {
		t.Fatal(err)
	}
	key := ratelimitgrpc.KeyByMetadata("x-tenant")
	_, _, err = ratelimitgrpc.NewInterceptors(l, set, key, ratelimitgrpc.WithInFlight(ratelimit.NewRule("inflight", ratelimit.FixedWindow(1, 1000))))
	var ia *ratelimit.InvalidArgumentError
	if !errors.As(err, &ia) || ia.Arg != "algorithm" {
		t.Errorf("WithInFlight of a FIXEDWINDOW rule: %v", err)
	}
	capRule := ratelimitgrpc.WithInFlight(ratelimit.NewRule("inflight", ratelimit.ConcurrencySpec(1, 30_000)).Prefix("grpc:cap:"))
	unary, stream, err := ratelimitgrpc.NewInterceptors(l, set, key, capRule)
	if err != nil {
		t.Fatal(err)
	}
	client := gServe(t, unary, stream, &gSeen{})
	const policy = `"per-tenant";q=100;w=60, "inflight";q=1`

	ctx, cancel := context.WithCancel(gCtx(t, "x-tenant", "acme"))
	w, err := client.Watch(ctx, &healthpb.HealthCheckRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if msg, err := w.Recv(); err != nil || msg.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("first stream: %v %v", msg, err)
	}
	header, _ := w.Header()
	items := strings.Split(first(header, "ratelimit"), ", ")
	if first(header, "ratelimit-policy") != policy || len(items) != 2 ||
		!strings.HasPrefix(items[0], `"per-tenant";r=99;t=`) || !strings.HasPrefix(items[1], `"inflight";r=0;t=`) {
		t.Errorf("first stream's header %v", header)
	}
	w2, err := client.Watch(gCtx(t, "x-tenant", "acme"), &healthpb.HealthCheckRequest{})
	if err != nil {
		t.Fatal(err)
	}
	_, err = w2.Recv()
	gCheckDenial(t, err, w2.Trailer(), "inflight", policy, 30)
	// Another tenant has a cap of its own.
	if _, err := client.Check(gCtx(t, "x-tenant", "other"), &healthpb.HealthCheckRequest{}); err != nil {
		t.Errorf("another tenant: %v", err)
	}
	cancel()
	testserver.WaitUntil(t, "a new stream once the first ended", func() bool {
		_, err := client.Check(gCtx(t, "x-tenant", "acme"), &healthpb.HealthCheckRequest{})
		return err == nil
	})
}

// ExampleUnaryServerInterceptor limits a gRPC server per tenant (the
// x-tenant metadata); a denied client reads its delay with RetryAfter.
func ExampleUnaryServerInterceptor() {
	ctx := context.Background()
	client, err := ratelimit.NewClient(ctx, redis.NewClient(&redis.Options{Addr: "127.0.0.1:6379"}))
	if err != nil {
		log.Fatal(err)
	}
	limiter := ratelimit.NewLimiter(client)
	set, err := limiter.RuleSet(ctx, ratelimit.NewRule("per-tenant", ratelimit.TokenBucket(100, 10, 1000)))
	if err != nil {
		log.Fatal(err)
	}
	key := ratelimitgrpc.KeyByMetadata("x-tenant")
	srv := grpc.NewServer(
		grpc.ChainUnaryInterceptor(ratelimitgrpc.UnaryServerInterceptor(limiter, set, key)),
		grpc.ChainStreamInterceptor(ratelimitgrpc.StreamServerInterceptor(limiter, set, key)),
	)
	healthpb.RegisterHealthServer(srv, health.NewServer())
	ln, err := net.Listen("tcp", "127.0.0.1:50051")
	if err != nil {
		log.Fatal(err)
	}
	log.Fatal(srv.Serve(ln))

	// On the client:
	//	var trailer metadata.MD
	//	_, err := hc.Check(ctx, req, grpc.Trailer(&trailer))
	//	if wait, ok := ratelimitgrpc.RetryAfter(err, trailer); ok { time.Sleep(wait) }
}

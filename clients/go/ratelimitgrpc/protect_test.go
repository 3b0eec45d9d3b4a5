package ratelimitgrpc_test

// The protection interceptors in a real gRPC server (the Health service),
// called by a real gRPC client, reporting to a real Redis.

import (
	"context"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis-ratelimit/redis-ratelimit/clients/go/internal/testserver"
	"github.com/redis-ratelimit/redis-ratelimit/clients/go/ratelimit"
	"github.com/redis-ratelimit/redis-ratelimit/clients/go/ratelimitgrpc"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

// pServer is a Redis with a policy and a protection loop polling fast.
func pServer(t *testing.T, policy ...any) (*testserver.Server, *ratelimit.Protection) {
	t.Helper()
	srv := testserver.Start(t, testserver.Redis)
	ctx, cancel := context.WithTimeout(context.Background(), testserver.Patience)
	defer cancel()
	if _, err := srv.Do(ctx, append([]any{"RL.POLICY", "SET"}, policy...)...); err != nil {
		t.Fatalf("RL.POLICY SET: %v", err)
	}
	c, err := ratelimit.NewClient(ctx, srv.Client(), ratelimit.WithDeadline(2*time.Second))
	if err != nil {
		t.Fatalf("NewClient: %v", err)
	}
	p, err := ratelimit.NewProtection(c, ratelimit.WithReportInterval(50*time.Millisecond), ratelimit.WithStagePoll(50*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close(context.Background()) })
	return srv, p
}

// pStats is RL.POLICY STATS name's current window: ok, errors, denied.
func pStats(t *testing.T, srv *testserver.Server, name string) map[string]int64 {
	t.Helper()
	v, err := srv.Do(context.Background(), "RL.POLICY", "STATS", name)
	if err != nil {
		t.Fatalf("RL.POLICY STATS: %v", err)
	}
	out := map[string]int64{}
	pFlatten("", v, out)
	return out
}

func pFlatten(prefix string, v any, out map[string]int64) {
	items, ok := v.([]any)
	if !ok {
		m, isMap := v.(map[any]any)
		if !isMap {
			return
		}
		for k, x := range m {
			items = append(items, k, x)
		}
	}
	for i := 0; i+1 < len(items); i += 2 {
		k := fmt.Sprint(items[i])
		if x, ok := items[i+1].(int64); ok {
			out[prefix+k] = x
		} else {
			pFlatten(prefix+k+".", items[i+1], out)
		}
	}
}

// pFailer fails calls as their x-fail metadata says (internal, panic,
// exhausted, unavailable), after counting them as run.
type pFailer struct{ runs atomic.Int64 }

func (f *pFailer) fail(ctx context.Context) error {
	f.runs.Add(1)
	md, _ := metadata.FromIncomingContext(ctx)
	what := ""
	if v := md.Get("x-fail"); len(v) > 0 {
		what = v[0]
	}
	switch what {
	case "internal":
		return status.Error(codes.Internal, "broken")
	case "unavailable":
		return status.Error(codes.Unavailable, "down")
	case "exhausted":
		return status.Error(codes.ResourceExhausted, "limited inside")
	case "panic":
		panic("handler panic")
	}
	return nil
}

// pServe runs the Health service behind: a recovery (a panic is Internal),
// the given interceptors, then the failer; and returns a client.
func pServe(t *testing.T, unary grpc.UnaryServerInterceptor, stream grpc.StreamServerInterceptor, f *pFailer) healthpb.HealthClient {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	recoverUnary := func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (resp any, err error) {
		defer func() {
			if p := recover(); p != nil {
				resp, err = nil, status.Errorf(codes.Internal, "panic: %v", p)
			}
		}()
		return h(ctx, req)
	}
	srv := grpc.NewServer(
		grpc.ChainUnaryInterceptor(recoverUnary, unary, func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
			if err := f.fail(ctx); err != nil {
				return nil, err
			}
			return h(ctx, req)
		}),
		grpc.ChainStreamInterceptor(stream, func(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, h grpc.StreamHandler) error {
			if err := f.fail(ss.Context()); err != nil {
				return err
			}
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

// watchEnd opens a Watch stream and answers how it ended (its first
// message or its error).
func watchEnd(t *testing.T, client healthpb.HealthClient, ctx context.Context) (*healthpb.HealthCheckResponse, error) {
	t.Helper()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	s, err := client.Watch(ctx, &healthpb.HealthCheckRequest{})
	if err != nil {
		return nil, err
	}
	return s.Recv()
}

// TestGRPCProtectReportsOutcomes: successes and the client's faults
// (NotFound) are ok; Internal, a panic and a stream ending Unavailable are
// errors; RESOURCE_EXHAUSTED is no outcome; a predicate can make
// NotFound an error; the server's window counts them.
func TestGRPCProtectReportsOutcomes(t *testing.T) {
	srv, p := pServer(t, "counted", "TOKENBUCKET", 100, 100, 1000, "STAGES", 100, 100, "WINDOW", 600000)
	f := &pFailer{}
	client := pServe(t, ratelimitgrpc.ProtectUnaryServerInterceptor(p, "counted"), ratelimitgrpc.ProtectStreamServerInterceptor(p, "counted"), f)
	check := func(service, fail string) error {
		_, err := client.Check(gCtx(t, "x-fail", fail), &healthpb.HealthCheckRequest{Service: service})
		return err
	}
	if err := check("", ""); err != nil {
		t.Fatal(err)
	}
	if err := check("nope", ""); status.Code(err) != codes.NotFound {
		t.Fatalf("an unknown service: %v", err)
	}
	if err := check("", "internal"); status.Code(err) != codes.Internal {
		t.Fatalf("internal: %v", err)
	}
	if err := check("", "panic"); status.Code(err) != codes.Internal {
		t.Fatalf("a panic: %v", err)
	}
	if err := check("", "exhausted"); status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("exhausted: %v", err)
	}
	if _, err := watchEnd(t, client, gCtx(t, "x-fail", "unavailable")); status.Code(err) != codes.Unavailable {
		t.Fatalf("a stream ending Unavailable: %v", err)
	}
	if m, err := watchEnd(t, client, gCtx(t)); err != nil || m.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("a stream: %v %v", m, err)
	}
	var last map[string]int64
	testserver.WaitUntil(t, "3 ok and 3 errors in the server's window", func() bool {
		last = pStats(t, srv, "counted")
		return last["current.ok"] == 3 && last["current.errors"] == 3
	})
	// The server applies a report before its reply reaches the loop.
	testserver.WaitUntil(t, "the loop to count its reports", func() bool {
		st := p.Stats()
		return st.OutcomesSent+st.OutcomesLost >= 6
	})
	if st := p.Stats(); st.OutcomesSent != 6 {
		t.Fatalf("outcomes sent %d, want 6 (no outcome for RESOURCE_EXHAUSTED); server %v", st.OutcomesSent, last)
	}

	// A predicate: NotFound is an error too.
	srv2, p2 := pServer(t, "strict", "TOKENBUCKET", 100, 100, 1000, "STAGES", 100, 100, "WINDOW", 600000)
	notFoundIsError := ratelimitgrpc.ProtectErrorWhen(func(_ string, err error) bool {
		return ratelimitgrpc.IsServerError(err) || status.Code(err) == codes.NotFound
	})
	client = pServe(t, ratelimitgrpc.ProtectUnaryServerInterceptor(p2, "strict", notFoundIsError), ratelimitgrpc.ProtectStreamServerInterceptor(p2, "strict"), &pFailer{})
	_ = check("nope", "")
	_ = check("", "")
	testserver.WaitUntil(t, "1 ok and 1 error in the server's window", func() bool {
		last = pStats(t, srv2, "strict")
		return last["current.ok"] == 1 && last["current.errors"] == 1
	})
}

// TestGRPCProtectStagesDegrade: denials above STAGES 20 50 move the
// policy to a stage: the non-core unary method answers with its degrade
// handler, the non-core stream with RESOURCE_EXHAUSTED naming the policy
// (retry-after the poll), the core method runs; neither degraded call runs
// its handler; when the denials stop, everything comes back. At stage 0,
// a denial inside is answered by the degrade handler.
func TestGRPCProtectStagesDegrade(t *testing.T) {
	srv, p := pServer(t, "staged", "TOKENBUCKET", 2, 2, 60000, "STAGES", 20, 50, "WINDOW", 1000)
	const list = "/grpc.health.v1.Health/List"
	var mu sync.Mutex
	var reasons []ratelimit.DegradeReason
	opts := []ratelimitgrpc.ProtectOption{
		ratelimitgrpc.ProtectNonCore(func(m string) bool { return m != list }),
		ratelimitgrpc.ProtectDegradeUnary(func(_ context.Context, m string, _ any, info ratelimit.DegradeInfo) (any, error) {
			mu.Lock()
			reasons = append(reasons, info.Reason)
			mu.Unlock()
			return &healthpb.HealthCheckResponse{Status: healthpb.HealthCheckResponse_SERVICE_UNKNOWN}, nil
		}),
	}
	f := &pFailer{}
	client := pServe(t, ratelimitgrpc.ProtectUnaryServerInterceptor(p, "staged", opts...), ratelimitgrpc.ProtectStreamServerInterceptor(p, "staged", opts...), f)
	const degraded = healthpb.HealthCheckResponse_SERVICE_UNKNOWN

	if r, err := client.Check(gCtx(t), &healthpb.HealthCheckRequest{}); err != nil || r.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("stage 0: %v %v", r, err)
	}
	if r, err := client.Check(gCtx(t, "x-fail", "exhausted"), &healthpb.HealthCheckRequest{}); err != nil || r.GetStatus() != degraded {
		t.Fatalf("a denial inside, with a degrade handler: %v %v", r, err)
	}

	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			select {
			case <-stop:
				return
			case <-time.After(5 * time.Millisecond):
			}
			_, _ = srv.Do(context.Background(), "RL.HIT", "staged", "someone")
		}
	}()
	testserver.WaitUntil(t, "a stage read by the loop", func() bool { return p.Stage("staged") >= ratelimit.StageDegrade })
	runs := f.runs.Load()
	if r, err := client.Check(gCtx(t), &healthpb.HealthCheckRequest{}); err != nil || r.GetStatus() != degraded {
		t.Fatalf("a non-core unary call at a stage: %v %v", r, err)
	}
	var trailer metadata.MD
	ctx, cancel := context.WithCancel(gCtx(t))
	s, err := client.Watch(ctx, &healthpb.HealthCheckRequest{}, grpc.Trailer(&trailer))
	if err == nil {
		_, err = s.Recv()
	}
	cancel()
	st, _ := status.FromError(err)
	if st.Code() != codes.ResourceExhausted || first(trailer, "violated-policies") != "staged" || first(trailer, "retry-after") != "1" {
		t.Fatalf("a non-core stream at a stage: %v, trailer %v", err, trailer)
	}
	if d, ok := ratelimitgrpc.RetryAfter(err, trailer); !ok || d != time.Second {
		t.Errorf("the stage denial's delay: %v %v", d, ok)
	}
	if f.runs.Load() != runs {
		t.Fatal("a degraded call ran its handler")
	}
	if _, err := client.List(gCtx(t), &healthpb.HealthListRequest{}); err != nil {
		t.Fatalf("the core method at a stage: %v", err)
	}
	if f.runs.Load() != runs+1 {
		t.Fatal("the core method did not run")
	}

	close(stop)
	wg.Wait()
	testserver.WaitUntil(t, "the stage back at 0", func() bool { return p.Stage("staged") == ratelimit.StageNormal })
	if r, err := client.Check(gCtx(t), &healthpb.HealthCheckRequest{}); err != nil || r.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("after recovery: %v %v", r, err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(reasons) != 2 || reasons[0] != ratelimit.DegradeDenied || reasons[1] != ratelimit.DegradeStage {
		t.Errorf("the degrade handler's reasons: %v, want [denied stage]", reasons)
	}
}

// TestGRPCProtectNilIsPassThrough: without a protection or a policy the
// interceptors only call the handler.
func TestGRPCProtectNilIsPassThrough(t *testing.T) {
	f := &pFailer{}
	client := pServe(t, ratelimitgrpc.ProtectUnaryServerInterceptor(nil, "x"), ratelimitgrpc.ProtectStreamServerInterceptor(nil, ""), f)
	if _, err := client.Check(gCtx(t), &healthpb.HealthCheckRequest{}); err != nil {
		t.Fatal(err)
	}
	if _, err := watchEnd(t, client, gCtx(t)); err != nil {
		t.Fatal(err)
	}
	if f.runs.Load() != 2 {
		t.Fatalf("handlers run: %d", f.runs.Load())
	}
}

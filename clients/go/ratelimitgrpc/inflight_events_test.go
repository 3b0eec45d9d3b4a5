package ratelimitgrpc_test

import (
	"context"
	"net"
	"strings"
	"sync"
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
	"google.golang.org/grpc/status"
)

// TestGRPCInFlightDenyEventsCarryThePeer: the in-flight cap's denial
// (Limiter.LeaseFrom) ships a deny event with the peer's address and the
// client's user-agent, as the rate rules' denials do.
func TestGRPCInFlightDenyEventsCarryThePeer(t *testing.T) {
	var mu sync.Mutex
	var got []ratelimit.DenyEvent
	events := ratelimit.NewDenyEvents(ratelimit.CallbackSink(func(_ context.Context, batch []ratelimit.DenyEvent) error {
		mu.Lock()
		got = append(got, batch...)
		mu.Unlock()
		return nil
	}), ratelimit.WithFlushEvents(1))
	t.Cleanup(func() { _ = events.Close(context.Background()) })
	srv := testserver.Start(t, testserver.Redis)
	ctx, cancel := context.WithTimeout(context.Background(), testserver.Patience)
	defer cancel()
	c, err := ratelimit.NewClient(ctx, srv.Client(), ratelimit.WithDeadline(2*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	l := ratelimit.NewLimiter(c, ratelimit.WithDenyEvents(events))
	t.Cleanup(func() { _ = l.Close(context.Background()) })
	set, err := l.RuleSet(ctx, ratelimit.NewRule("per-tenant", ratelimit.SlidingWindow(100, 60_000)).Prefix("grpc:ev:rate:"))
	if err != nil {
		t.Fatal(err)
	}
	unary, stream, err := ratelimitgrpc.NewInterceptors(l, set, ratelimitgrpc.KeyByMetadata("x-tenant"),
		ratelimitgrpc.WithInFlight(ratelimit.NewRule("inflight", ratelimit.ConcurrencySpec(1, 30_000)).Prefix("grpc:ev:cap:")))
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	server := grpc.NewServer(grpc.UnaryInterceptor(unary), grpc.StreamInterceptor(stream))
	healthpb.RegisterHealthServer(server, health.NewServer())
	go func() { _ = server.Serve(ln) }()
	t.Cleanup(server.Stop)
	dial := func(opts ...grpc.DialOption) healthpb.HealthClient {
		conn, err := grpc.NewClient(ln.Addr().String(), append(opts, grpc.WithTransportCredentials(insecure.NewCredentials()))...)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = conn.Close() })
		return healthpb.NewHealthClient(conn)
	}
	// The first client, holding a stream open; the second, another agent.
	client := dial()
	wctx, wcancel := context.WithCancel(gCtx(t, "x-tenant", "acme"))
	defer wcancel()
	w, err := client.Watch(wctx, &healthpb.HealthCheckRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.Recv(); err != nil {
		t.Fatal(err)
	}
	_, err = dial(grpc.WithUserAgent("events-test/2")).Check(gCtx(t, "x-tenant", "acme"), &healthpb.HealthCheckRequest{})
	if status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("a call past the cap: %v", err)
	}
	var ev ratelimit.DenyEvent
	testserver.WaitUntil(t, "the cap's deny event", func() bool {
		mu.Lock()
		defer mu.Unlock()
		for _, e := range got {
			if e.Rule == "inflight" {
				ev = e
				return true
			}
		}
		return false
	})
	if ev.ClientIP != "127.0.0.1" || !strings.HasPrefix(ev.UserAgent, "events-test/2") || ev.Key != "grpc:ev:cap:acme" {
		t.Errorf("the cap's deny event %+v", ev)
	}
}

package ratelimit

import (
	"context"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/redis-ratelimit/redis-ratelimit/clients/go/internal/testserver"
)

// NewLimiter(WithMetrics(m), WithDenyEvents(e)) counts e's shipped events
// in m when e was made without metrics.
func TestReviewLimiterWiresDenyEventsMetrics(t *testing.T) {
	srv := testserver.Start(t, testserver.Redis)
	m, err := NewMetrics(prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	events := NewDenyEvents(CallbackSink(func(context.Context, []DenyEvent) error { return nil }), WithFlushEvents(1))
	t.Cleanup(func() { _ = events.Close(ctx) })
	l := limiterOn(t, srv.Client(), WithMetrics(m), WithDenyEvents(events))
	set := mustSet(t, l, NewRule("api", FixedWindow(1, 60000)))
	if d := l.Check(ctx, set, "alice", 1); !d.Allowed {
		t.Fatalf("first: %+v", d)
	}
	if d := l.Check(ctx, set, "alice", 1); d.Allowed {
		t.Fatalf("second: %+v", d)
	}
	testserver.WaitUntil(t, "the event shipped, counted in the limiter's metrics", func() bool {
		return events.Stats().Shipped == 1 && counterValue(m.shipped) == 1
	})

	// Deny events given metrics of their own keep them.
	own, err := NewMetrics(prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	events2 := NewDenyEvents(CallbackSink(func(context.Context, []DenyEvent) error { return nil }), WithFlushEvents(1), WithEventsMetrics(own))
	t.Cleanup(func() { _ = events2.Close(ctx) })
	l2 := limiterOn(t, srv.Client(), WithMetrics(m), WithDenyEvents(events2))
	set2 := mustSet(t, l2, NewRule("api2", FixedWindow(1, 60000)))
	l2.Check(ctx, set2, "bob", 1)
	l2.Check(ctx, set2, "bob", 1)
	testserver.WaitUntil(t, "the second event shipped, counted in its own metrics", func() bool {
		return events2.Stats().Shipped == 1 && counterValue(own.shipped) == 1
	})
	if got, got2 := counterValue(own.shipped), counterValue(m.shipped); got != 1 || got2 != 1 {
		t.Fatalf("own metrics %v (want 1), the limiter's %v (want 1)", got, got2)
	}
}

// Limiter.RuleSet with WithProtection(p) binds the breakers its policy
// rules name, and watches their policies, without p.WatchRules.
func TestReviewRuleSetWatchesRules(t *testing.T) {
	srv := testserver.Start(t, testserver.Redis)
	ctx := context.Background()
	c := newTestClient(t, srv.Client())
	if err := c.PolicySet(ctx, "checkout", FixedWindow(100, 1000), PolicyOptions{}); err != nil {
		t.Fatalf("PolicySet: %v", err)
	}
	p := startProtection(t, c)
	l := NewLimiter(c, WithProtection(p))
	t.Cleanup(func() { _ = l.Close(ctx) })
	if _, err := l.RuleSet(ctx, PolicyRule("checkout", "checkout").WithBreaker("payments")); err != nil {
		t.Fatalf("RuleSet: %v", err)
	}
	if got := p.Policies(); len(got) != 1 || got[0] != "checkout" {
		t.Fatalf("watched policies %v, want [checkout]", got)
	}
	if _, ok := p.FindBreaker("payments"); !ok {
		t.Fatal("the breaker payments is not bound")
	}
}

// counterValue reads a counter.
func counterValue(c prometheus.Counter) float64 {
	var d dto.Metric
	if err := c.Write(&d); err != nil {
		return -1
	}
	return d.GetCounter().GetValue()
}

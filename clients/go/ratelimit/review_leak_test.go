package ratelimit

import (
	"context"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/redis-ratelimit/redis-ratelimit/clients/go/internal/testserver"
	"github.com/redis/go-redis/v9"
)

// Closing a client, a limiter, a protection loop and deny events leaves no
// goroutine of theirs running.
func TestReviewCloseLeavesNoGoroutine(t *testing.T) {
	srv := testserver.Start(t, testserver.Redis)
	ctx := context.Background()
	given := redis.NewClient(&redis.Options{Addr: srv.Addr()})
	if err := given.Ping(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	before := runtime.NumGoroutine()

	c, err := NewClient(ctx, given)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.PolicySet(ctx, "leak", FixedWindow(2, 60000), PolicyOptions{}); err != nil {
		t.Fatal(err)
	}
	p, err := NewProtection(c, WithStagePoll(10*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	events := NewDenyEvents(CallbackSink(func(context.Context, []DenyEvent) error { return nil }))
	l := NewLimiter(c, WithProtection(p), WithDenyEvents(events))
	set, err := l.RuleSet(ctx, PolicyRule("leak", "leak"), NewRule("g", FixedWindow(100, 60000)).Global("leak:g"))
	if err != nil {
		t.Fatal(err)
	}
	batched, err := l.RuleSet(ctx, NewRule("b", TokenBucket(1000, 1000, 1000)).Global("leak:b").Batched(DefaultBatch))
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 5; i++ {
		l.Check(ctx, set, "alice", 1)
		l.Check(ctx, batched, "alice", 1)
	}
	lease, err := l.Lease(ctx, NewRule("conc", ConcurrencySpec(2, 1000)), "alice")
	if err == nil {
		_, _ = lease.Release(ctx)
	}
	if err := l.Close(ctx); err != nil {
		t.Fatalf("limiter Close: %v", err)
	}
	if err := p.Close(ctx); err != nil {
		t.Fatalf("protection Close: %v", err)
	}
	if err := events.Close(ctx); err != nil {
		t.Fatalf("events Close: %v", err)
	}
	if err := c.Close(); err != nil {
		t.Fatalf("client Close: %v", err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for runtime.NumGoroutine() > before && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if n := runtime.NumGoroutine(); n > before {
		buf := make([]byte, 1<<20)
		stacks := string(buf[:runtime.Stack(buf, true)])
		var ours []string
		for _, g := range strings.Split(stacks, "\n\n") {
			if strings.Contains(g, "clients/go/ratelimit.") && !strings.Contains(g, "TestReviewCloseLeavesNoGoroutine") && !strings.Contains(g, "testing.tRunner") {
				ours = append(ours, g)
			}
		}
		t.Fatalf("%d goroutines after Close, %d before; the kit's:\n%s", n, before, strings.Join(ours, "\n\n"))
	}
}

package ratelimit

import (
	"context"
	"errors"
	"strconv"
	"testing"
	"time"

	"github.com/redis-ratelimit/redis-ratelimit/clients/go/internal/testserver"
)

func TestLeaseRenewedPastLeaseMsAndReleased(t *testing.T) {
	srv := testserver.Start(t, testserver.Redis)
	l := limiterOn(t, srv.Client())
	ctx := context.Background()
	rule := NewRule("jobs", ConcurrencySpec(1, 300))
	g, err := l.Lease(ctx, rule, "tenant")
	if err != nil {
		t.Fatal(err)
	}
	if g.ID() == 0 || g.Key() != "jobs:tenant" || g.Decision().Path != PathRedis || !g.Decision().Allowed || g.Decision().Rule != "jobs" {
		t.Fatalf("lease: id %d key %q %+v", g.ID(), g.Key(), g.Decision())
	}
	// Renewed well past its 300 ms: three renewals or more (one every 100 ms).
	testserver.WaitUntil(t, "three renewals", func() bool { return srv.Calls("rl.renew") >= 3 })
	// Still held: a second lease is denied.
	_, err = l.Lease(ctx, rule, "tenant")
	var denied *DeniedError
	if !errors.As(err, &denied) || denied.Decision.Allowed || denied.Decision.Path != PathRedis {
		t.Fatalf("a second lease while the first is renewed: %v", err)
	}
	if g.Err() != nil {
		t.Fatalf("renewals failed: %v", g.Err())
	}
	select {
	case <-g.Lost():
		t.Fatal("the lease was lost")
	default:
	}
	held, err := g.Release(ctx)
	if err != nil || !held {
		t.Fatalf("release: %v %v", held, err)
	}
	// A second release holds nothing.
	if held, err := g.Release(ctx); held || err != nil {
		t.Fatalf("second release: %v %v", held, err)
	}
	renewals := srv.Calls("rl.renew")
	g2, err := l.Lease(ctx, rule, "tenant")
	if err != nil || g2.ID() == 0 {
		t.Fatalf("a lease after the release: %v", err)
	}
	if _, err := g2.Release(ctx); err != nil {
		t.Fatal(err)
	}
	// The released lease is no longer renewed.
	if got := srv.Calls("rl.renew"); got > renewals+1 {
		t.Fatalf("renewals after the release: %d more", got-renewals)
	}
	if s := l.Stats(); s.Leases != 2 {
		t.Fatalf("stats: %+v", s)
	}
}

func TestLeaseLostIsReported(t *testing.T) {
	srv := testserver.Start(t, testserver.Redis)
	l := limiterOn(t, srv.Client())
	ctx := context.Background()
	g, err := l.Lease(ctx, NewRule("jobs", ConcurrencySpec(2, 150)), "t")
	if err != nil {
		t.Fatal(err)
	}
	// The key vanishes (as when the lease expired while the process was
	// paused): the next renewal finds the lease gone.
	if err := srv.Client().Del(ctx, "jobs:t").Err(); err != nil {
		t.Fatal(err)
	}
	select {
	case <-g.Lost():
	case <-time.After(testserver.Patience):
		t.Fatal("the loss was never reported")
	}
	if !errors.Is(g.Err(), ErrLeaseLost) {
		t.Fatalf("Err: %v", g.Err())
	}
	if l.Stats().LeasesLost != 1 {
		t.Fatalf("stats: %+v", l.Stats())
	}
	if held, err := g.Release(ctx); held || err != nil {
		t.Fatalf("release of a lost lease: %v %v", held, err)
	}
}

func TestLeaseAcquireWaitsForARelease(t *testing.T) {
	srv := testserver.Start(t, testserver.Redis)
	l := limiterOn(t, srv.Client())
	ctx := context.Background()
	rule := NewRule("slots", ConcurrencySpec(1, 10000))
	first, err := l.Acquire(ctx, rule, "t", 0)
	if err != nil || first.ID() == 0 {
		t.Fatalf("first: %v", err)
	}
	// Without a wait, denied at once.
	var denied *DeniedError
	if _, err := l.Acquire(ctx, rule, "t", 0); !errors.As(err, &denied) {
		t.Fatalf("no wait: %v", err)
	}
	type result struct {
		g   *Lease
		err error
	}
	got := make(chan result, 1)
	go func() {
		g, err := l.Acquire(ctx, rule, "t", 30*time.Second)
		got <- result{g, err}
	}()
	testserver.WaitUntil(t, "the acquire to block in the server", func() bool {
		n, _ := strconv.Atoi(srv.Info("clients")["blocked_clients"])
		return n >= 1
	})
	select {
	case r := <-got:
		t.Fatalf("admitted before the release: %+v %v", r.g, r.err)
	default:
	}
	if held, err := first.Release(ctx); !held || err != nil {
		t.Fatalf("release: %v %v", held, err)
	}
	var r result
	select {
	case r = <-got:
	case <-time.After(testserver.Patience):
		t.Fatal("the waiting acquire was never admitted")
	}
	if r.err != nil || r.g.ID() == 0 || !r.g.Decision().Allowed {
		t.Fatalf("after the release: %+v %v", r.g, r.err)
	}
	if _, err := r.g.Release(ctx); err != nil {
		t.Fatal(err)
	}
	// A rate rule waits for its admission and holds nothing.
	rate := NewRule("rate", FixedWindow(1, 60000))
	if g, err := l.Acquire(ctx, rate, "t", 0); err != nil || g.ID() != 0 || !g.Decision().Allowed {
		t.Fatalf("rate acquire: %+v %v", g, err)
	}
	if _, err := l.Acquire(ctx, rate, "t", 0); !errors.As(err, &denied) {
		t.Fatalf("rate acquire past the limit: %v", err)
	}
	// Lease refuses a rate rule.
	if _, err := l.Lease(ctx, rate, "t"); argOf(err) != "algorithm" {
		t.Fatalf("Lease on a rate rule: %v", err)
	}
}

func TestLeaseFallback(t *testing.T) {
	srv := testserver.Start(t, testserver.Redis)
	ctx := context.Background()
	open := limiterOn(t, srv.Client(), WithFallback(LocalOnly))
	closed := limiterOn(t, srv.Client(), WithFallback(FailClosed), WithBreaker(BreakerConfig{Failures: 1, OpenFor: 2 * time.Second}))
	rule := NewRule("jobs", ConcurrencySpec(1, 1000))
	srv.Kill9()
	g, err := open.Lease(ctx, rule, "t")
	if err != nil || g.ID() != 0 || g.Decision().Path != PathFallback || !g.Decision().Allowed {
		t.Fatalf("local only without Redis: %+v %v", g, err)
	}
	if held, err := g.Release(ctx); held || err != nil {
		t.Fatalf("release of a lease that holds nothing: %v %v", held, err)
	}
	_, err = closed.Lease(ctx, rule, "t")
	var denied *DeniedError
	if !errors.As(err, &denied) || denied.Decision.Path != PathFallback || denied.Decision.RetryAfter != 2*time.Second {
		t.Fatalf("fail closed without Redis: %v", err)
	}
	// A nil lease is safe.
	var none *Lease
	if none.ID() != 0 || none.Key() != "" || none.Err() == nil {
		t.Fatal("nil lease")
	}
	if held, err := none.Release(ctx); held || err != nil {
		t.Fatal("nil lease release")
	}
	<-none.Lost()
}

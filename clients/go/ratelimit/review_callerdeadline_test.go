package ratelimit

import (
	"context"
	"testing"
	"time"

	"github.com/redis-ratelimit/redis-ratelimit/clients/go/internal/testserver"
)

// A caller whose own deadline ends a call before the call's deadline is not
// Redis's failure: requests with little time left never open the breaker
// that every request shares. A call that had its whole deadline and got no
// reply does.
func TestReviewCallerDeadlineDoesNotOpenTheBreaker(t *testing.T) {
	srv := testserver.Start(t, testserver.Redis)
	ctx := context.Background()
	l := limiterOn(t, srv.Client(), WithFallback(FailOpen), WithDenyCache(false),
		WithBreaker(BreakerConfig{Failures: 1, OpenFor: time.Hour}), WithCallDeadline(300*time.Millisecond))
	set := mustSet(t, l, NewRule("short", FixedWindow(1000000, 60000)))
	if d := l.Check(ctx, set, "alice", 1); d.Path != PathRedis {
		t.Fatalf("before: %+v", d)
	}
	srv.Stop()
	defer srv.Cont()
	for i := 0; i < 5; i++ {
		cctx, cancel := context.WithTimeout(ctx, 10*time.Millisecond)
		d := l.Check(cctx, set, "alice", 1)
		cancel()
		if d.Path != PathFallback || !d.Allowed {
			t.Fatalf("a call cut by its caller is decided by the fallback: %+v", d)
		}
	}
	if s := l.Stats(); s.BreakerOpened != 0 || s.RedisTimeouts != 0 || l.BreakerOpen() {
		t.Fatalf("calls cut by their callers' deadlines counted against Redis: %+v", s)
	}
	// The same stopped server, a caller with time to spare: Redis is late.
	if d := l.Check(ctx, set, "alice", 1); d.Path != PathFallback {
		t.Fatalf("a late Redis: %+v", d)
	}
	if s := l.Stats(); s.BreakerOpened != 1 || s.RedisTimeouts != 1 || !l.BreakerOpen() {
		t.Fatalf("a call with its whole deadline and no reply opens the breaker: %+v", s)
	}
}

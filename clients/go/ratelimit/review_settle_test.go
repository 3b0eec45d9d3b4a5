package ratelimit

import (
	"context"
	"testing"
	"time"

	"github.com/redis-ratelimit/redis-ratelimit/clients/go/internal/testserver"
)

// Units the local-only fallback admitted while Redis was away stay owed
// when their send fails too (the server refuses connections), instead of
// being forgotten; a request whose owed send fails makes no second call
// (one deadline at most); and all of them reach Redis when it is back.
func TestReviewOwedUnitsSurviveAFailedSend(t *testing.T) {
	srv := testserver.Start(t, testserver.Redis)
	ctx := context.Background()
	l := limiterOn(t, srv.Client(), WithFallback(LocalOnly), WithDenyCache(false),
		WithBreaker(BreakerConfig{Failures: 1000, OpenFor: time.Millisecond}))
	set := mustSet(t, l, NewRule("owed", FixedWindow(100, 3_600_000)))
	if d := l.Check(ctx, set, "alice", 1); d.Path != PathRedis {
		t.Fatalf("before: %+v", d)
	}
	srv.Kill9()
	for i := 0; i < 5; i++ {
		if d := l.Check(ctx, set, "alice", 1); d.Path != PathFallback || !d.Allowed {
			t.Fatalf("while Redis is away: %+v", d)
		}
	}
	s := l.Stats()
	// The first request's own call failed; each later one tried its owed
	// units, failed, and made no call of its own.
	if s.RedisCalls != 2 || s.OwedSent != 4 {
		t.Fatalf("one failed round trip per request: %+v", s)
	}
	srv.Restart()
	testserver.WaitUntil(t, "Redis answers the limiter again", func() bool {
		return l.Check(ctx, set, "alice", 1).Path == PathRedis
	})
	// 5 owed, sent with FORCE before the call that reached Redis, plus that
	// call; failed attempts before it (go-redis refusing dials for a moment)
	// owe their own units too: the window counts every admission since the
	// restart.
	st := l.Stats()
	admittedSince := st.FallbackAdmitted + 1
	got, err := srv.Client().Do(ctx, "RL.FIXEDWINDOW", "owed:alice", 100, 3_600_000, "COST", 0).Int64Slice()
	if err != nil {
		t.Fatal(err)
	}
	if used := 100 - got[2]; uint64(used) != admittedSince {
		t.Fatalf("the server counts %d of the %d admitted while it was away and since: %+v", used, admittedSince, st)
	}
}

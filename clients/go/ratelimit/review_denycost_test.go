package ratelimit

import (
	"context"
	"testing"

	"github.com/redis-ratelimit/redis-ratelimit/clients/go/internal/testserver"
)

// The deny cache answers only what the cached denial denies: after a
// cost-3 denial with 2 units left, a cost-1 request goes to Redis and is
// admitted; a cost-3 request is answered from the cache.
func TestReviewDenyCacheHonoursTheCost(t *testing.T) {
	srv := testserver.Start(t, testserver.Redis)
	ctx := context.Background()
	l := limiterOn(t, srv.Client())
	for _, tc := range []struct {
		name  string
		rules []Rule
	}{
		{"one rule", []Rule{NewRule("w", FixedWindow(5, 60000))}},
		{"a set", []Rule{NewRule("w2", FixedWindow(5, 60000)).Prefix("{u}:w2:"), NewRule("big", FixedWindow(1000, 60000)).Prefix("{u}:big:")}},
	} {
		set := mustSet(t, l, tc.rules...)
		if d := l.Check(ctx, set, "alice", 3); !d.Allowed || d.Remaining != 2 {
			t.Fatalf("%s: first: %+v", tc.name, d)
		}
		if d := l.Check(ctx, set, "alice", 3); d.Allowed || d.Path != PathRedis || d.Remaining != 2 {
			t.Fatalf("%s: the denial: %+v", tc.name, d)
		}
		if d := l.Check(ctx, set, "alice", 3); d.Allowed || d.Path != PathDenyCache {
			t.Fatalf("%s: the same cost again is the cache's: %+v", tc.name, d)
		}
		if d := l.Check(ctx, set, "alice", 1); !d.Allowed || d.Path != PathRedis || d.Remaining != 1 {
			t.Fatalf("%s: a cost within what was left goes to Redis: %+v", tc.name, d)
		}
	}
}

package ratelimit

import (
	"context"
	"math"
	"testing"

	"github.com/redis-ratelimit/redis-ratelimit/clients/go/internal/testserver"
)

// Odd rule options are an *InvalidArgumentError from RuleSet (or a rule
// that works), never a panic.
func TestReviewOddRules(t *testing.T) {
	srv := testserver.Start(t, testserver.Redis)
	ctx := context.Background()
	l := limiterOn(t, srv.Client())
	base := NewRule("odd", TokenBucket(100, 100, 1000)).Global("odd:g")
	rules := map[string]Rule{
		"striped 0":        base.Striped(0),
		"striped -1":       base.Striped(-1),
		"striped max":      base.Striped(math.MaxInt),
		"batched negative": base.Batched(Batch{HoldMs: -1, MaxSharePct: -1}),
		"batched zero":     base.Batched(Batch{}),
		"batched huge":     base.Batched(Batch{HoldMs: math.MaxInt64, MaxSharePct: math.MaxInt64}),
		"zero rule":        {},
		"policy empty":     PolicyRule("p", ""),
		"prefix odd":       NewRule("x", FixedWindow(1, 1000)).Prefix("\x00{"),
		"zero spec":        NewRule("z", Spec{}),
	}
	for name, r := range rules {
		func() {
			defer func() {
				if p := recover(); p != nil {
					t.Errorf("%s: panic %v", name, p)
				}
			}()
			set, err := l.RuleSet(ctx, r)
			if err != nil {
				if argOf(err) == "" {
					t.Errorf("%s: %v is not an *InvalidArgumentError", name, err)
				}
				return
			}
			l.Check(ctx, set, "alice", 1)
		}()
	}
}

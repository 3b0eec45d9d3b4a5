package ratelimit

import (
	"context"
	"math"
	"testing"

	"github.com/redis-ratelimit/redis-ratelimit/clients/go/internal/testserver"
)

// A cost above any limit is a denial that never passes in every fallback
// mode: a cost above MaxParam (which the server refuses) never reaches the
// fallback, where failing open would admit it.
func TestReviewOddCosts(t *testing.T) {
	srv := testserver.Start(t, testserver.Redis)
	ctx := context.Background()
	for _, mode := range []FallbackMode{FailOpen, FailClosed, LocalOnly} {
		l := limiterOn(t, srv.Client(), WithFallback(mode), WithInstances(2))
		sets := map[string]*RuleSet{
			"one":    mustSet(t, l, NewRule("odd1", TokenBucket(10, 10, 1000))),
			"global": mustSet(t, l, NewRule("odd2", SlidingWindow(10, 1000)).Global("odd:g")),
			"two":    mustSet(t, l, NewRule("{o}a", FixedWindow(10, 1000)), NewRule("{o}b", LeakyBucket(10, 10, 1000))),
			"quota":  mustSet(t, l, NewRule("odd3", QuotaSpec(10, PeriodDay, "+05:30"))),
		}
		for name, set := range sets {
			for _, cost := range []uint64{math.MaxUint64, math.MaxInt64, 1 << 53, uint64(MaxParam) + 1, 11} {
				d := l.Check(ctx, set, "x", cost)
				if d.Allowed {
					t.Fatalf("mode %v set %s cost %d: admitted %+v", mode, name, cost, d)
				}
				if cost > uint64(MaxParam) && (d.WaitMs != -1 || d.DeniedBy != 0 || d.Limit != 10 || d.Rule == "") {
					t.Fatalf("mode %v set %s cost %d: not a denial that never passes: %+v", mode, name, cost, d)
				}
			}
		}
	}
}

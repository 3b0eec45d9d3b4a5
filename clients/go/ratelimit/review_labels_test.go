package ratelimit

import (
	"context"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis-ratelimit/redis-ratelimit/clients/go/internal/testserver"
)

// A rule name that is not valid UTF-8 is refused when the rule set is
// built (an *InvalidArgumentError naming name): as a metrics label it
// made client_golang panic at the first decision. The metrics never panic
// on such a label either.
func TestReviewRuleNameNotUTF8(t *testing.T) {
	srv := testserver.Start(t, testserver.Redis)
	ctx := context.Background()
	m, err := NewMetrics(prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	l := limiterOn(t, srv.Client(), WithMetrics(m))
	if _, err := l.RuleSet(ctx, NewRule("bad\xff", FixedWindow(5, 60000))); argOf(err) != "name" {
		t.Fatalf("RuleSet with a name not UTF-8: %v", err)
	}
	func() {
		defer func() {
			if p := recover(); p != nil {
				t.Fatalf("metrics panicked on a label not UTF-8: %v", p)
			}
		}()
		m.Decision("bad\xff", PathRedis, OutcomeDenied)
		m.RemainingRatio("bad\xff", 0.5)
		m.BreakerOpen("bad\xff", true)
		m.Scale("bad\xff", 50)
		m.Stage("bad\xff", 1)
	}()
}

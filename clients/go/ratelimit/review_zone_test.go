package ratelimit

import (
	"context"
	"testing"
	"time"

	"github.com/redis-ratelimit/redis-ratelimit/clients/go/internal/testserver"
)

// The server takes an IANA name in any case: a rule on "europe/paris" is
// valid, and the server counts it in Paris's calendar.
func TestReviewQuotaZoneAnyCase(t *testing.T) {
	srv := testserver.Start(t, testserver.Redis)
	ctx := context.Background()
	// The server accepts the name.
	if _, err := srv.Do(ctx, "RL.QUOTA", "review:zone", "5", "DAY", "TZ", "europe/paris"); err != nil {
		t.Fatalf("the server refused europe/paris: %v", err)
	}
	l := limiterOn(t, srv.Client())
	set, err := l.RuleSet(ctx, NewRule("q", QuotaSpec(5, PeriodDay, "europe/paris")))
	if err != nil {
		t.Fatalf("RuleSet with europe/paris: %v", err)
	}
	if d := l.Check(ctx, set, "alice", 1); !d.Allowed || d.Path != PathRedis || d.Limit != 5 {
		t.Fatalf("check: %+v", d)
	}
	end, err := QuotaPeriodEnd(PeriodDay, "europe/paris", time.Now())
	if err != nil {
		t.Fatalf("QuotaPeriodEnd: %v", err)
	}
	want, _ := QuotaPeriodEnd(PeriodDay, "Europe/Paris", time.Now())
	if !end.Equal(want) {
		t.Fatalf("period end %v, want %v", end, want)
	}
	// A name nobody knows is still refused.
	if _, err := l.RuleSet(ctx, NewRule("q2", QuotaSpec(5, PeriodDay, "Europe/Nowhere"))); argOf(err) != "zone" {
		t.Fatalf("Europe/Nowhere: %v", err)
	}
}

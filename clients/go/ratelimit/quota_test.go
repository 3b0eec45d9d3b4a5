package ratelimit

import (
	"context"
	"testing"
	"time"

	"github.com/redis-ratelimit/redis-ratelimit/clients/go/internal/testserver"
)

func TestQuotaPeriodEndInZones(t *testing.T) {
	// 2026-03-07 (a Saturday) 23:30 UTC is 18:30 in New York (EST).
	now := time.Date(2026, 3, 7, 23, 30, 0, 0, time.UTC)
	ny, err := time.LoadLocation("America/New_York")
	if err != nil {
		t.Skipf("no time zone database: %v", err)
	}
	cases := []struct {
		p    Period
		zone string
		want time.Time
	}{
		{PeriodDay, "", time.Date(2026, 3, 8, 0, 0, 0, 0, time.UTC)},
		{PeriodDay, "UTC", time.Date(2026, 3, 8, 0, 0, 0, 0, time.UTC)},
		{PeriodDay, "America/New_York", time.Date(2026, 3, 8, 0, 0, 0, 0, ny)},
		{PeriodDay, "+05:30", time.Date(2026, 3, 8, 18, 30, 0, 0, time.UTC)},
		// The week ends at Monday's midnight; New York's DST starts on 8 March.
		{PeriodWeek, "America/New_York", time.Date(2026, 3, 9, 0, 0, 0, 0, ny)},
		{PeriodWeek, "", time.Date(2026, 3, 9, 0, 0, 0, 0, time.UTC)},
		{PeriodMonth, "Asia/Tokyo", time.Date(2026, 3, 31, 15, 0, 0, 0, time.UTC)},
		{PeriodYear, "-03:00", time.Date(2027, 1, 1, 3, 0, 0, 0, time.UTC)},
	}
	for _, c := range cases {
		got, err := QuotaPeriodEnd(c.p, c.zone, now)
		if err != nil || !got.Equal(c.want) {
			t.Errorf("%v in %q: %v %v, want %v", c.p, c.zone, got, err, c.want)
		}
	}
	for _, bad := range []string{"Mars/Olympus_Mons", "+19:00", "../x", "Europe/../etc", "1abc"} {
		if _, err := QuotaPeriodEnd(PeriodDay, bad, now); argOf(err) != "zone" {
			t.Errorf("zone %q: %v", bad, err)
		}
	}
	if _, err := QuotaPeriodEnd(Period(7), "UTC", now); argOf(err) != "period" {
		t.Errorf("period 7: %v", err)
	}
}

func TestQuotaInAZone(t *testing.T) {
	srv := testserver.Start(t, testserver.Redis)
	l := limiterOn(t, srv.Client(), WithFallback(LocalOnly), WithBreaker(BreakerConfig{Failures: 1, OpenFor: time.Hour}))
	ctx := context.Background()
	const zone = "Asia/Kolkata"
	set := mustSet(t, l, NewRule("daily", QuotaSpec(3, PeriodDay, zone)))
	for i := 0; i < 3; i++ {
		if d := l.Check(ctx, set, "acme", 1); !d.Allowed || d.Path != PathRedis {
			t.Fatalf("check %d: %+v", i, d)
		}
	}
	d := l.Check(ctx, set, "acme", 1)
	end, err := QuotaPeriodEnd(PeriodDay, zone, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	untilEnd := time.Until(end)
	// Denied until the zone's midnight (the server's clock: within a second
	// or two of ours).
	if d.Allowed || d.Rule != "daily" || d.RetryAfter > untilEnd+2*time.Second || d.RetryAfter < untilEnd-2*time.Second {
		t.Fatalf("the fourth: %+v; the day ends in %v there", d, untilEnd)
	}
	if got := srv.Client().PTTL(ctx, "daily:acme").Val(); got <= 0 {
		t.Fatalf("the quota key has no expiry: %v", got)
	}

	// The fallback counts in the zone too: Redis gone, a new tenant gets the
	// instance's share (the whole quota: one instance), denied with the same
	// period end.
	srv.Kill9()
	for i := 0; i < 3; i++ {
		if d := l.Check(ctx, set, "globex", 1); !d.Allowed || d.Path != PathFallback {
			t.Fatalf("fallback %d: %+v", i, d)
		}
	}
	d = l.Check(ctx, set, "globex", 1)
	untilEnd = time.Until(end)
	if d.Allowed || d.Path != PathFallback || d.RetryAfter > untilEnd+time.Second || d.RetryAfter < untilEnd-2*time.Second {
		t.Fatalf("the fallback's fourth: %+v; the day ends in %v there", d, untilEnd)
	}
	// And acme's account holds what Redis admitted: still denied.
	if d := l.Check(ctx, set, "acme", 1); d.Allowed {
		t.Fatalf("acme in the fallback: %+v", d)
	}
}

// TestQuotaGlobalInANamedZone: a global quota in an IANA zone has a local
// level (Go reads the zone database): the share is counted in process until
// the zone's midnight.
func TestQuotaGlobalInANamedZone(t *testing.T) {
	srv := testserver.Start(t, testserver.Redis)
	l := limiterOn(t, srv.Client(), WithInstances(2))
	ctx := context.Background()
	const zone = "America/New_York"
	// 4 a week over 2 instances: a share of ceil(4 * 1.1 / 2) = 3.
	set := mustSet(t, l, NewRule("weekly", QuotaSpec(4, PeriodWeek, zone)).Global("{q}:weekly"))
	for i := 0; i < 3; i++ {
		if d := l.Check(ctx, set, "anyone", 1); !d.Allowed || d.Path != PathRedis {
			t.Fatalf("check %d: %+v", i, d)
		}
	}
	d := l.Check(ctx, set, "anyone", 1)
	end, err := QuotaPeriodEnd(PeriodWeek, zone, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	untilEnd := time.Until(end)
	if d.Allowed || d.Path != PathLocal || d.Limit != 4 || d.RetryAfter > untilEnd+time.Second || d.RetryAfter < untilEnd-2*time.Second {
		t.Fatalf("the local level's denial: %+v; the week ends in %v there", d, untilEnd)
	}
	if got := srv.Calls("rl.quota"); got != 3 {
		t.Fatalf("RL.QUOTA calls: %d, want 3", got)
	}
}

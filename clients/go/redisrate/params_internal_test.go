package redisrate

import (
	"errors"
	"testing"
	"time"

	"github.com/redis-ratelimit/redis-ratelimit/clients/go/ratelimit"
)

// TestBucketParams: a Limit's RL.TOKENBUCKET parameters; a Period that is
// not whole milliseconds is scaled to its smallest whole-ms multiple, never
// rounded.
func TestBucketParams(t *testing.T) {
	ok := []struct {
		limit               Limit
		capacity, count, ms int64
	}{
		{PerSecond(10), 10, 10, 1000},
		{PerMinute(100), 100, 100, 60_000},
		{PerHour(7), 7, 7, 3_600_000},
		{Limit{Rate: 3, Burst: 1, Period: 1500 * time.Microsecond}, 1, 6, 3},
		{Limit{Rate: 1, Burst: 2, Period: time.Hour + 500*time.Microsecond}, 2, 2, 7_200_001},
		{Limit{Rate: 1, Burst: 1, Period: time.Nanosecond}, 1, 1_000_000, 1},
		{Limit{Rate: 5, Burst: 5, Period: 250 * time.Microsecond}, 5, 20, 1},
		{Limit{Rate: 1 << 40, Burst: 1 << 40, Period: time.Millisecond}, 1 << 40, 1 << 40, 1},
	}
	for _, c := range ok {
		capacity, count, ms, err := bucketParams(c.limit)
		if err != nil || capacity != c.capacity || count != c.count || ms != c.ms {
			t.Errorf("%v: %d %d %d %v, want %d %d %d", c.limit, capacity, count, ms, err, c.capacity, c.count, c.ms)
		}
		// The rate is the Limit's exactly: count/ms == Rate/Period.
		if err == nil && count*int64(c.limit.Period) != int64(c.limit.Rate)*ms*int64(time.Millisecond) {
			t.Errorf("%v: %d per %d ms is not the Limit's rate", c.limit, count, ms)
		}
	}
	bad := []struct {
		limit Limit
		arg   string
	}{
		{Limit{}, "Limit.Rate"},
		{Limit{Rate: 0, Burst: 1, Period: time.Second}, "Limit.Rate"},
		{Limit{Rate: -1, Burst: 1, Period: time.Second}, "Limit.Rate"},
		{Limit{Rate: 1, Burst: 1}, "Limit.Period"},
		{Limit{Rate: 1, Burst: 1, Period: -time.Second}, "Limit.Period"},
		{Limit{Rate: 1, Burst: -1, Period: time.Second}, "Limit.Burst"},
		{Limit{Rate: 1, Burst: 0, Period: time.Second}, "Limit.Burst"},
		{Limit{Rate: 1, Burst: 1<<40 + 1, Period: time.Second}, "Limit.Burst"},
		{Limit{Rate: 1<<40 + 1, Burst: 1, Period: time.Second}, "Limit.Rate"},
		// 1 h + 1 ns: 3,600,000,000,001 ms after scaling, above 2^40.
		{Limit{Rate: 1, Burst: 1, Period: time.Hour + time.Nanosecond}, "Limit.Period"},
		// 2^30 per 1 ns: 2^30 * 10^6 per ms, above 2^40.
		{Limit{Rate: 1 << 30, Burst: 1, Period: time.Nanosecond}, "Limit.Period"},
		// 40 years: above 2^40 ms.
		{Limit{Rate: 1, Burst: 1, Period: 40 * 365 * 24 * time.Hour}, "Limit.Period"},
	}
	for _, c := range bad {
		_, _, _, err := bucketParams(c.limit)
		var ia *ratelimit.InvalidArgumentError
		if !errors.As(err, &ia) || ia.Arg != c.arg {
			t.Errorf("%+v: %v, want an InvalidArgumentError on %s", c.limit, err, c.arg)
		}
	}
}

// TestIntervals: the never-passing AllowN's RetryAfter arithmetic saturates
// instead of overflowing.
func TestIntervals(t *testing.T) {
	if got := intervals(PerSecond(10), 990); got != 99*time.Second {
		t.Fatalf("990 intervals of 100ms = %v", got)
	}
	if got := addDur(intervals(Limit{Rate: 1, Burst: 1, Period: time.Hour}, 1<<40), time.Hour); got != time.Duration(1<<63-1) {
		t.Fatalf("2^40 hours = %v, want the largest Duration", got)
	}
}

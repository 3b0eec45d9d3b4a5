package redisrate_test

// The same calls through go-redis/redis_rate v10 (its Lua GCRA) and through
// this package, on one server and the same user keys (which live under
// different names: "rate:k" and "rl:redisrate:k"). Allowed and Remaining
// are equal step by step; the documented differences are asserted as such.

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	upstream "github.com/go-redis/redis_rate/v10"

	"github.com/redis-ratelimit/redis-ratelimit/clients/go/internal/testserver"
	"github.com/redis-ratelimit/redis-ratelimit/clients/go/ratelimit"
	redis_rate "github.com/redis-ratelimit/redis-ratelimit/clients/go/redisrate"
)

func TestSideBySide(t *testing.T) {
	for _, kind := range []testserver.Kind{testserver.Redis, testserver.Valkey} {
		t.Run(kind.String(), func(t *testing.T) { sideBySide(t, kind) })
	}
}

func sideBySide(t *testing.T, kind testserver.Kind) {
	srv := testserver.Start(t, kind)
	rdb := srv.Client()
	ctx := context.Background()
	theirs := upstream.NewLimiter(rdb)
	ours := redis_rate.NewLimiter(rdb)
	e := env{raw: rdb}

	type step struct {
		op string // "N": AllowN, "M": AllowAtMost, "R": Reset
		n  int
	}
	limit := struct {
		up upstream.Limit
		us redis_rate.Limit
	}{upstream.PerHour(10), redis_rate.PerHour(10)}
	seq := []step{
		{"N", 0}, {"N", 1}, {"N", 2}, {"N", 0}, {"M", 2}, {"N", 7}, {"M", 10},
		{"N", 0}, {"N", 1}, {"M", 3}, {"M", 0}, {"N", 1000}, {"R", 0}, {"N", 1},
		{"M", 100}, {"N", 0}, {"N", 1}, {"R", 0}, {"N", 10}, {"N", 11},
	}
	c := startClock(t, e)
	for i, s := range seq {
		name := fmt.Sprintf("step %d %s %d", i, s.op, s.n)
		if s.op == "R" {
			if err := theirs.Reset(ctx, "seq"); err != nil {
				t.Fatal(err)
			}
			if err := ours.Reset(ctx, "seq"); err != nil {
				t.Fatal(err)
			}
			continue
		}
		var a *upstream.Result
		var b *redis_rate.Result
		var errA, errB error
		if s.op == "N" {
			a, errA = theirs.AllowN(ctx, "seq", limit.up, s.n)
			b, errB = ours.AllowN(ctx, "seq", limit.us, s.n)
		} else {
			a, errA = theirs.AllowAtMost(ctx, "seq", limit.up, s.n)
			b, errB = ours.AllowAtMost(ctx, "seq", limit.us, s.n)
		}
		if errA != nil || errB != nil {
			t.Fatalf("%s: %v / %v", name, errA, errB)
		}
		if a.Allowed != b.Allowed || a.Remaining != b.Remaining {
			t.Fatalf("%s: redis_rate allowed %d remaining %d, redisrate %d and %d", name, a.Allowed, a.Remaining, b.Allowed, b.Remaining)
		}
		if (a.RetryAfter == -1) != (b.RetryAfter == -1) {
			t.Fatalf("%s: RetryAfter %v vs %v", name, a.RetryAfter, b.RetryAfter)
		}
		// Times: each read the clock at its own call; ours are whole ms
		// rounded up.
		slack := c.Elapsed() + time.Millisecond
		within(t, name+": ResetAfter", b.ResetAfter, a.ResetAfter-slack, a.ResetAfter+slack)
		if a.RetryAfter != -1 {
			within(t, name+": RetryAfter", b.RetryAfter, a.RetryAfter-slack, a.RetryAfter+slack)
		}
	}

	// Both keep their own key: the migration runs side by side.
	if typ := rdb.Type(ctx, "rate:seq").Val(); typ != "string" {
		t.Fatalf("redis_rate's key is a %q", typ)
	}
	if typ := rdb.Type(ctx, redis_rate.KeyPrefix+"seq").Val(); typ != "rl-tokbkt" {
		t.Fatalf("redisrate's key is a %q", typ)
	}

	// Migrating mid-flight: a key redis_rate drained is a full bucket here
	// (no WRONGTYPE, no state carried over), and redis_rate's string stays
	// until it expires.
	if a, err := theirs.AllowN(ctx, "mig", upstream.PerHour(3), 3); err != nil || a.Allowed != 3 {
		t.Fatalf("redis_rate drain: %+v %v", a, err)
	}
	if b, err := ours.Allow(ctx, "mig", redis_rate.PerHour(3)); err != nil || b.Allowed != 1 || b.Remaining != 2 {
		t.Fatalf("redisrate after redis_rate drained the key: %+v %v, want a full bucket", b, err)
	}
	if ttl := rdb.TTL(ctx, "rate:mig").Val(); ttl <= 0 {
		t.Fatalf("redis_rate's string has TTL %v, want its reset time", ttl)
	}

	// Difference: Burst 0. redis_rate denies every call; here it is an error.
	a, err := theirs.Allow(ctx, "burst0", upstream.Limit{Rate: 10, Period: time.Second})
	if err != nil || a.Allowed != 0 {
		t.Fatalf("redis_rate with Burst 0: %+v %v", a, err)
	}
	_, err = ours.Allow(ctx, "burst0", redis_rate.Limit{Rate: 10, Period: time.Second})
	wantArg(t, "Burst 0", err, "Limit.Burst")

	// Difference: n < 0. redis_rate gives tokens back (Allowed -1); here it
	// is an error.
	if _, err := theirs.AllowN(ctx, "neg", upstream.PerHour(5), 3); err != nil {
		t.Fatal(err)
	}
	a, err = theirs.AllowN(ctx, "neg", upstream.PerHour(5), -1)
	if err != nil || a.Allowed != -1 || a.Remaining != 3 {
		t.Fatalf("redis_rate AllowN(-1): %+v %v, want a token back", a, err)
	}
	_, err = ours.AllowN(ctx, "neg", redis_rate.PerHour(5), -1)
	wantArg(t, "AllowN(-1)", err, "n")

	// Difference: a partial grant takes whole tokens here, the fraction too
	// in redis_rate. One token a second, burst 10: drain both, let 1.5 s or
	// more pass on the server's clock, grant up to 10.
	upLimit := upstream.Limit{Rate: 1, Burst: 10, Period: time.Second}
	usLimit := redis_rate.Limit{Rate: 1, Burst: 10, Period: time.Second}
	if a, err := theirs.AllowN(ctx, "frac", upLimit, 10); err != nil || a.Allowed != 10 {
		t.Fatalf("drain redis_rate: %+v %v", a, err)
	}
	if b, err := ours.AllowN(ctx, "frac", usLimit, 10); err != nil || b.Allowed != 10 {
		t.Fatalf("drain redisrate: %+v %v", b, err)
	}
	drained := serverNow(t, e) // ours drained before this
	testserver.WaitUntil(t, "1.5 s on the server's clock", func() bool {
		return serverNow(t, e).Sub(drained) >= 1500*time.Millisecond
	})
	a, err = theirs.AllowAtMost(ctx, "frac", upLimit, 10)
	if err != nil || a.Allowed < 1 {
		t.Fatalf("redis_rate partial grant: %+v %v", a, err)
	}
	start := serverNow(t, e) // ours is called after this
	b, err := ours.AllowAtMost(ctx, "frac", usLimit, 10)
	if err != nil || b.Allowed < 1 || b.Remaining != 0 {
		t.Fatalf("redisrate partial grant: %+v %v", b, err)
	}
	// redis_rate took all it had, fraction included: full in exactly 10 s.
	within(t, "redis_rate's ResetAfter after a partial grant", a.ResetAfter, 10*time.Second-time.Millisecond, 10*time.Second+time.Millisecond)
	// Ours left the fraction: elapsed - granted seconds (at least that much
	// passed between the drain and the grant).
	frac := start.Sub(drained) - time.Duration(b.Allowed)*time.Second
	if b.ResetAfter > 10*time.Second-frac+time.Millisecond || b.ResetAfter <= 9*time.Second {
		t.Fatalf("redisrate's ResetAfter after a partial grant of %d: %v, want at most 10s - %v (the fraction kept)", b.Allowed, b.ResetAfter, frac)
	}

	// Same: a denial answers Remaining 0 even with tokens left.
	if _, err := theirs.AllowN(ctx, "deny", upstream.PerHour(5), 2); err != nil {
		t.Fatal(err)
	}
	if _, err := ours.AllowN(ctx, "deny", redis_rate.PerHour(5), 2); err != nil {
		t.Fatal(err)
	}
	a, _ = theirs.AllowN(ctx, "deny", upstream.PerHour(5), 4)
	b, _ = ours.AllowN(ctx, "deny", redis_rate.PerHour(5), 4)
	if a.Allowed != 0 || a.Remaining != 0 || b.Allowed != 0 || b.Remaining != 0 {
		t.Fatalf("denial with 3 left: redis_rate %+v, redisrate %+v", a, b)
	}

	// Difference: bad limits. redis_rate sends Rate 0 to its script (a
	// division by zero in Lua, whatever it answers); here an error before
	// anything is sent.
	_, err = ours.Allow(ctx, "rate0", redis_rate.Limit{Burst: 1, Period: time.Second})
	var ia *ratelimit.InvalidArgumentError
	if !errors.As(err, &ia) {
		t.Fatalf("Rate 0: %v", err)
	}
}

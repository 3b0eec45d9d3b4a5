package redisrate_test

// redis_rate v10's own test cases (its README example, TestAllow,
// TestAllowN_IncrementZero, TestRetryAfter, TestAllowAtMost,
// TestAllowAtMost_IncrementZero), written again for this package, plus the
// burst, retry and reset timings, each on Redis 7.0, Valkey, a 3-master
// cluster, a Ring, a client without Do (the script path) and Redis 8.2 when
// its binary is found. redis_rate's tests assert times within a delta of the
// wall clock; these assert exact values where the state is fresh and
// otherwise bounds taken from the server's TIME read around the calls
// (nothing depends on how fast the machine is). Counts use periods of an
// hour so that no token comes back during a test.

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/redis-ratelimit/redis-ratelimit/clients/go/internal/testserver"
	"github.com/redis-ratelimit/redis-ratelimit/clients/go/ratelimit"
	redis_rate "github.com/redis-ratelimit/redis-ratelimit/clients/go/redisrate"
)

// env is one server setup: the limiter under test and a client for looking
// at the keys and the server's clock.
type env struct {
	name    string
	lim     *redis_rate.Limiter
	raw     redis.UniversalClient
	cluster *testserver.Cluster
	server  *testserver.Server
	script  bool // the limiter's client has no Do: RL.TOKENBUCKET goes through EVALSHA
}

// scriptOnly has redis_rate's methods and nothing else (no Do).
type scriptOnly struct{ c *redis.Client }

func (s scriptOnly) Eval(ctx context.Context, script string, keys []string, args ...interface{}) *redis.Cmd {
	return s.c.Eval(ctx, script, keys, args...)
}
func (s scriptOnly) EvalSha(ctx context.Context, sha1 string, keys []string, args ...interface{}) *redis.Cmd {
	return s.c.EvalSha(ctx, sha1, keys, args...)
}
func (s scriptOnly) EvalRO(ctx context.Context, script string, keys []string, args ...interface{}) *redis.Cmd {
	return s.c.EvalRO(ctx, script, keys, args...)
}
func (s scriptOnly) EvalShaRO(ctx context.Context, sha1 string, keys []string, args ...interface{}) *redis.Cmd {
	return s.c.EvalShaRO(ctx, sha1, keys, args...)
}
func (s scriptOnly) ScriptExists(ctx context.Context, hashes ...string) *redis.BoolSliceCmd {
	return s.c.ScriptExists(ctx, hashes...)
}
func (s scriptOnly) ScriptLoad(ctx context.Context, script string) *redis.StringCmd {
	return s.c.ScriptLoad(ctx, script)
}
func (s scriptOnly) Del(ctx context.Context, keys ...string) *redis.IntCmd {
	return s.c.Del(ctx, keys...)
}

// envs starts Redis 7.0, Valkey, a 3-master cluster (and Redis 8.2 when
// found) and returns the setups on them.
func envs(t *testing.T) []env {
	t.Helper()
	rs := testserver.Start(t, testserver.Redis)
	vs := testserver.Start(t, testserver.Valkey)
	cl := testserver.StartCluster(t, 3)
	ring := redis.NewRing(&redis.RingOptions{Addrs: map[string]string{"server0": rs.Addr()}})
	t.Cleanup(func() { _ = ring.Close() })
	rc, vc, cc := rs.Client(), vs.Client(), cl.ClusterClient()
	out := []env{
		{name: "redis", lim: redis_rate.NewLimiter(rc), raw: rc, server: rs},
		{name: "valkey", lim: redis_rate.NewLimiter(vc), raw: vc, server: vs},
		{name: "cluster", lim: redis_rate.NewLimiter(cc), raw: cc, cluster: cl},
		{name: "ring", lim: redis_rate.NewLimiter(ring), raw: rc, server: rs},
		{name: "redis-script", lim: redis_rate.NewLimiter(scriptOnly{rc}), raw: rc, server: rs, script: true},
		{name: "valkey-script", lim: redis_rate.NewLimiter(scriptOnly{vc}), raw: vc, server: vs, script: true},
	}
	if testserver.Available(testserver.Redis82) {
		r8 := testserver.Start(t, testserver.Redis82)
		c8 := r8.Client()
		out = append(out, env{name: "redis82", lim: redis_rate.NewLimiter(c8), raw: c8, server: r8})
	} else {
		t.Log("no Redis 8.2 binary (REDIS82_SERVER, scripts/redis8-path.sh): tested on Redis 7.0, Valkey and the cluster only")
	}
	return out
}

// serverNow is the server's TIME.
func serverNow(t *testing.T, e env) time.Time {
	t.Helper()
	now, err := e.raw.Time(context.Background()).Result()
	if err != nil {
		t.Fatalf("TIME: %v", err)
	}
	return now
}

// clock brackets a test's calls with the server's TIME: every call made
// after start happened within Elapsed() of it.
type clock struct {
	t     *testing.T
	e     env
	start time.Time
}

func startClock(t *testing.T, e env) *clock {
	return &clock{t: t, e: e, start: serverNow(t, e)}
}

// Elapsed is an upper bound of the time between start and any call made
// before this, on the server's clock.
func (c *clock) Elapsed() time.Duration { return serverNow(c.t, c.e).Sub(c.start) }

type want struct {
	allowed, remaining int
	retry              time.Duration // -1, or exact when lo == 0 and hi == 0
}

func check(t *testing.T, step string, res *redis_rate.Result, err error, w want) {
	t.Helper()
	if err != nil {
		t.Fatalf("%s: %v", step, err)
	}
	if res.Allowed != w.allowed || res.Remaining != w.remaining {
		t.Fatalf("%s: allowed %d remaining %d, want %d and %d (%+v)", step, res.Allowed, res.Remaining, w.allowed, w.remaining, res)
	}
	if w.retry == -1 && res.RetryAfter != -1 {
		t.Fatalf("%s: RetryAfter %v, want -1 (allowed)", step, res.RetryAfter)
	}
	if w.retry != -1 && res.RetryAfter < 0 {
		t.Fatalf("%s: RetryAfter %v, want a wait (denied)", step, res.RetryAfter)
	}
}

// within asserts lo <= got <= hi.
func within(t *testing.T, what string, got, lo, hi time.Duration) {
	t.Helper()
	if got < lo || got > hi {
		t.Fatalf("%s = %v, want within [%v, %v]", what, got, lo, hi)
	}
}

func TestRedisRate(t *testing.T) {
	cases := []struct {
		name string
		run  func(*testing.T, env)
	}{
		{"ReadmeExample", testReadmeExample},
		{"Allow", testAllow},
		{"AllowNIncrementZero", testAllowNIncrementZero},
		{"RetryAfter", testRetryAfter},
		{"AllowAtMost", testAllowAtMost},
		{"AllowAtMostIncrementZero", testAllowAtMostIncrementZero},
		{"Burst", testBurst},
		{"RetryAfterOnServerClock", testRetryAfterOnServerClock},
		{"Reset", testReset},
		{"KeyLayout", testKeyLayout},
		{"WrongType", testWrongType},
		{"PeriodNotWholeMs", testPeriodNotWholeMs},
		{"ServerRefusesTheBucket", testServerRefuses},
	}
	for _, e := range envs(t) {
		t.Run(e.name, func(t *testing.T) {
			for _, c := range cases {
				t.Run(c.name, func(t *testing.T) { c.run(t, e) })
			}
			t.Run("Path", func(t *testing.T) { testPath(t, e) })
		})
	}
}

// key is a key of its own for each test and setup.
func key(t *testing.T, name string) string { return t.Name() + ":" + name }

// testReadmeExample is redis_rate's README example: allowed 1 remaining 9.
func testReadmeExample(t *testing.T, e env) {
	ctx := context.Background()
	res, err := e.lim.Allow(ctx, key(t, "project:123"), redis_rate.PerSecond(10))
	if err != nil {
		t.Fatal(err)
	}
	if got := fmt.Sprint("allowed ", res.Allowed, " remaining ", res.Remaining); got != "allowed 1 remaining 9" {
		t.Fatalf("got %q, want %q", got, "allowed 1 remaining 9")
	}
	// A fresh bucket: one token out is exactly one interval to refill.
	if res.ResetAfter != 100*time.Millisecond || res.RetryAfter != -1 {
		t.Fatalf("ResetAfter %v RetryAfter %v, want 100ms and -1", res.ResetAfter, res.RetryAfter)
	}
}

const hourT = 6 * time.Minute // PerHour(10)'s interval

func testAllow(t *testing.T, e env) {
	ctx := context.Background()
	limit := redis_rate.PerHour(10)
	if limit.String() != "10 req/h (burst 10)" || redis_rate.PerSecond(10).String() != "10 req/s (burst 10)" ||
		redis_rate.PerMinute(3).String() != "3 req/m (burst 3)" {
		t.Fatalf("String: %q %q %q", limit, redis_rate.PerSecond(10), redis_rate.PerMinute(3))
	}
	if (redis_rate.Limit{Rate: 1, Burst: 2, Period: 1500 * time.Millisecond}).String() != "1 req/1.5s (burst 2)" {
		t.Fatalf("String: %q", redis_rate.Limit{Rate: 1, Burst: 2, Period: 1500 * time.Millisecond})
	}
	if limit.IsZero() || !(redis_rate.Limit{}).IsZero() {
		t.Fatal("IsZero")
	}
	k := key(t, "test_id")

	res, err := e.lim.Allow(ctx, k, limit)
	check(t, "Allow", res, err, want{1, 9, -1})
	if res.ResetAfter != hourT || res.Limit != limit {
		t.Fatalf("ResetAfter %v Limit %v, want %v and %v", res.ResetAfter, res.Limit, hourT, limit)
	}

	if err := e.lim.Reset(ctx, k); err != nil {
		t.Fatal(err)
	}
	c := startClock(t, e)
	res, err = e.lim.Allow(ctx, k, limit)
	check(t, "Allow after Reset", res, err, want{1, 9, -1})
	if res.ResetAfter != hourT {
		t.Fatalf("ResetAfter after Reset %v, want %v", res.ResetAfter, hourT)
	}

	res, err = e.lim.AllowN(ctx, k, limit, 2)
	check(t, "AllowN 2", res, err, want{2, 7, -1})
	within(t, "ResetAfter", res.ResetAfter, 3*hourT-c.Elapsed(), 3*hourT)

	res, err = e.lim.AllowN(ctx, k, limit, 7)
	check(t, "AllowN 7", res, err, want{7, 0, -1})
	within(t, "ResetAfter", res.ResetAfter, 10*hourT-c.Elapsed(), 10*hourT)

	res, err = e.lim.AllowN(ctx, k, limit, 1000)
	check(t, "AllowN 1000", res, err, want{0, 0, 0})
	within(t, "ResetAfter", res.ResetAfter, 10*hourT-c.Elapsed(), 10*hourT)
	// Never passes; the answer is redis_rate's: until full, then 990 more
	// intervals.
	if res.RetryAfter != res.ResetAfter+990*hourT {
		t.Fatalf("RetryAfter %v, want ResetAfter %v + 990 intervals", res.RetryAfter, res.ResetAfter)
	}
}

func testAllowNIncrementZero(t *testing.T, e env) {
	ctx := context.Background()
	limit := redis_rate.PerHour(10)
	k := key(t, "test_id")

	res, err := e.lim.AllowN(ctx, k, limit, 0)
	check(t, "check a missing key", res, err, want{0, 10, -1})
	if res.ResetAfter != 0 {
		t.Fatalf("ResetAfter %v, want 0", res.ResetAfter)
	}
	if n := e.raw.Exists(ctx, redis_rate.KeyPrefix+k).Val(); n != 0 {
		t.Fatal("a check created the key")
	}

	c := startClock(t, e)
	res, err = e.lim.Allow(ctx, k, limit)
	check(t, "Allow", res, err, want{1, 9, -1})
	if res.ResetAfter != hourT {
		t.Fatalf("ResetAfter %v, want %v", res.ResetAfter, hourT)
	}

	res, err = e.lim.AllowN(ctx, k, limit, 0)
	check(t, "check again", res, err, want{0, 9, -1})
	within(t, "ResetAfter", res.ResetAfter, hourT-c.Elapsed(), hourT)
}

// testRetryAfter: one event a millisecond; a denial never waits more than a
// millisecond, and no more than 1 + elapsed ms events pass.
func testRetryAfter(t *testing.T, e env) {
	ctx := context.Background()
	limit := redis_rate.Limit{Rate: 1, Period: time.Millisecond, Burst: 1}
	k := key(t, "test_id")
	c := startClock(t, e)
	allowed, denied := 0, 0
	for i := 0; i < 1000; i++ {
		res, err := e.lim.Allow(ctx, k, limit)
		if err != nil {
			t.Fatal(err)
		}
		if res.Allowed > 0 {
			allowed++
			continue
		}
		denied++
		within(t, "RetryAfter", res.RetryAfter, time.Millisecond/1000, time.Millisecond)
	}
	el := c.Elapsed()
	if allowed < 1 || int64(allowed) > 1+el.Milliseconds() || allowed+denied != 1000 {
		t.Fatalf("%d allowed in %v: want at least 1 and at most 1 + 1 a ms", allowed, el)
	}
}

func testAllowAtMost(t *testing.T, e env) {
	ctx := context.Background()
	limit := redis_rate.PerHour(10)
	k := key(t, "test_id")
	c := startClock(t, e)

	res, err := e.lim.Allow(ctx, k, limit)
	check(t, "Allow", res, err, want{1, 9, -1})
	if res.ResetAfter != hourT {
		t.Fatalf("ResetAfter %v, want %v", res.ResetAfter, hourT)
	}

	res, err = e.lim.AllowAtMost(ctx, k, limit, 2)
	check(t, "AllowAtMost 2", res, err, want{2, 7, -1})
	within(t, "ResetAfter", res.ResetAfter, 3*hourT-c.Elapsed(), 3*hourT)

	res, err = e.lim.AllowN(ctx, k, limit, 0)
	check(t, "AllowN 0", res, err, want{0, 7, -1})

	res, err = e.lim.AllowAtMost(ctx, k, limit, 10)
	check(t, "AllowAtMost 10 (a partial grant)", res, err, want{7, 0, -1})
	within(t, "ResetAfter", res.ResetAfter, 10*hourT-c.Elapsed(), 10*hourT)

	res, err = e.lim.AllowN(ctx, k, limit, 0)
	check(t, "AllowN 0 on empty", res, err, want{0, 0, -1})

	res, err = e.lim.AllowAtMost(ctx, k, limit, 1000)
	check(t, "AllowAtMost 1000 on empty", res, err, want{0, 0, 0})
	// The wait for one token.
	within(t, "RetryAfter", res.RetryAfter, hourT-c.Elapsed(), hourT)
	within(t, "ResetAfter", res.ResetAfter, 10*hourT-c.Elapsed(), 10*hourT)

	res, err = e.lim.AllowN(ctx, k, limit, 1000)
	check(t, "AllowN 1000", res, err, want{0, 0, 0})
	if res.RetryAfter != res.ResetAfter+990*hourT {
		t.Fatalf("RetryAfter %v, want ResetAfter %v + 990 intervals", res.RetryAfter, res.ResetAfter)
	}
}

func testAllowAtMostIncrementZero(t *testing.T, e env) {
	ctx := context.Background()
	limit := redis_rate.PerHour(10)
	k := key(t, "test_id")

	res, err := e.lim.AllowAtMost(ctx, k, limit, 0)
	check(t, "check a missing key", res, err, want{0, 10, -1})
	if res.ResetAfter != 0 {
		t.Fatalf("ResetAfter %v, want 0", res.ResetAfter)
	}

	c := startClock(t, e)
	res, err = e.lim.Allow(ctx, k, limit)
	check(t, "Allow", res, err, want{1, 9, -1})

	res, err = e.lim.AllowAtMost(ctx, k, limit, 0)
	check(t, "check", res, err, want{0, 9, -1})
	within(t, "ResetAfter", res.ResetAfter, hourT-c.Elapsed(), hourT)

	res, err = e.lim.AllowN(ctx, k, limit, 9)
	check(t, "drain", res, err, want{9, 0, -1})
	// Empty: redis_rate's check answers the wait for one token.
	res, err = e.lim.AllowAtMost(ctx, k, limit, 0)
	check(t, "check on empty", res, err, want{0, 0, 0})
	within(t, "RetryAfter", res.RetryAfter, hourT-c.Elapsed()-time.Millisecond, hourT+time.Millisecond)
}

// testBurst: Burst events at once from idle, then one per interval.
func testBurst(t *testing.T, e env) {
	ctx := context.Background()
	limit := redis_rate.Limit{Rate: 1, Burst: 5, Period: time.Hour}
	k := key(t, "burst")
	c := startClock(t, e)
	for i := 0; i < 5; i++ {
		res, err := e.lim.Allow(ctx, k, limit)
		check(t, fmt.Sprintf("Allow %d", i+1), res, err, want{1, 4 - i, -1})
	}
	res, err := e.lim.Allow(ctx, k, limit)
	check(t, "Allow 6", res, err, want{0, 0, 0})
	within(t, "RetryAfter", res.RetryAfter, time.Hour-c.Elapsed(), time.Hour)
	within(t, "ResetAfter", res.ResetAfter, 5*time.Hour-c.Elapsed(), 5*time.Hour)

	res, err = e.lim.AllowN(ctx, k, limit, 6)
	check(t, "AllowN 6 > Burst", res, err, want{0, 0, 0})
	if res.RetryAfter != res.ResetAfter+time.Hour {
		t.Fatalf("RetryAfter %v, want ResetAfter %v + 1h", res.RetryAfter, res.ResetAfter)
	}
}

// testRetryAfterOnServerClock: a denied call passes once RetryAfter has
// gone by on the server's clock.
func testRetryAfterOnServerClock(t *testing.T, e env) {
	ctx := context.Background()
	limit := redis_rate.Limit{Rate: 10, Burst: 1, Period: time.Second}
	k := key(t, "retry")
	for attempt := 0; ; attempt++ {
		res, err := e.lim.Allow(ctx, k, limit)
		check(t, "Allow", res, err, want{1, 0, -1})
		res, err = e.lim.Allow(ctx, k, limit)
		if err != nil {
			t.Fatal(err)
		}
		if res.Allowed == 1 {
			// The machine took a whole interval between two calls; again.
			if attempt > 20 {
				t.Fatal("never saw a denial of the second call in 20 tries")
			}
			_ = e.lim.Reset(ctx, k)
			continue
		}
		after := serverNow(t, e)
		within(t, "RetryAfter", res.RetryAfter, time.Microsecond, 100*time.Millisecond)
		testserver.WaitUntil(t, "RetryAfter on the server's clock", func() bool {
			return !serverNow(t, e).Before(after.Add(res.RetryAfter))
		})
		res, err = e.lim.Allow(ctx, k, limit)
		check(t, "Allow after RetryAfter", res, err, want{1, 0, -1})
		return
	}
}

func testReset(t *testing.T, e env) {
	ctx := context.Background()
	limit := redis_rate.PerHour(3)
	k := key(t, "reset")
	res, err := e.lim.AllowN(ctx, k, limit, 3)
	check(t, "drain", res, err, want{3, 0, -1})
	res, err = e.lim.Allow(ctx, k, limit)
	check(t, "denied", res, err, want{0, 0, 0})
	if err := e.lim.Reset(ctx, k); err != nil {
		t.Fatal(err)
	}
	if n := e.raw.Exists(ctx, redis_rate.KeyPrefix+k).Val(); n != 0 {
		t.Fatal("Reset left the key")
	}
	res, err = e.lim.Allow(ctx, k, limit)
	check(t, "after Reset", res, err, want{1, 2, -1})
	if err := e.lim.Reset(ctx, key(t, "never-used")); err != nil {
		t.Fatalf("Reset of a missing key: %v", err)
	}
}

// testKeyLayout: the bucket lives under KeyPrefix as the module's type, and
// nothing is written where redis_rate keeps its strings.
func testKeyLayout(t *testing.T, e env) {
	ctx := context.Background()
	k := key(t, "layout")
	if _, err := e.lim.Allow(ctx, k, redis_rate.PerMinute(5)); err != nil {
		t.Fatal(err)
	}
	if typ := e.raw.Type(ctx, redis_rate.KeyPrefix+k).Val(); typ != "rl-tokbkt" {
		t.Fatalf("TYPE %s%s = %q, want rl-tokbkt", redis_rate.KeyPrefix, k, typ)
	}
	if n := e.raw.Exists(ctx, "rate:"+k).Val(); n != 0 {
		t.Fatal("something was written under redis_rate's prefix")
	}
	// The key expires once the bucket is full again (at most a second late).
	ttl := e.raw.PTTL(ctx, redis_rate.KeyPrefix+k).Val()
	within(t, "PTTL", ttl, time.Millisecond, 12*time.Second+time.Second)
}

// testWrongType: a key of another type under the prefix is a server error,
// and the key is left alone.
func testWrongType(t *testing.T, e env) {
	ctx := context.Background()
	k := key(t, "string")
	if err := e.raw.Set(ctx, redis_rate.KeyPrefix+k, "mine", 0).Err(); err != nil {
		t.Fatal(err)
	}
	_, err := e.lim.Allow(ctx, k, redis_rate.PerSecond(1))
	var se *ratelimit.ServerError
	if !errors.As(err, &se) || !strings.HasPrefix(se.Message, "WRONGTYPE") {
		t.Fatalf("Allow on a string: %v, want a *ratelimit.ServerError WRONGTYPE", err)
	}
	if !e.script && !redis.HasErrorPrefix(err, "WRONGTYPE") {
		t.Fatalf("go-redis's error is not in the chain: %v", err)
	}
	if v := e.raw.Get(ctx, redis_rate.KeyPrefix+k).Val(); v != "mine" {
		t.Fatalf("the key was changed: %q", v)
	}
	_, err = e.lim.AllowAtMost(ctx, k, redis_rate.PerSecond(1), 3)
	if !errors.As(err, &se) {
		t.Fatalf("AllowAtMost on a string: %v", err)
	}
}

// testPeriodNotWholeMs: a Period of 1 h 0.5 ms is scaled exactly (2 per
// 7,200,001 ms), not rounded: one token out of a fresh bucket is 3,600,000.5
// ms to refill, 3,600,001 rounded up.
func testPeriodNotWholeMs(t *testing.T, e env) {
	ctx := context.Background()
	limit := redis_rate.Limit{Rate: 1, Burst: 2, Period: time.Hour + 500*time.Microsecond}
	res, err := e.lim.Allow(ctx, key(t, "odd"), limit)
	check(t, "Allow", res, err, want{1, 1, -1})
	if res.ResetAfter != time.Hour+time.Millisecond {
		t.Fatalf("ResetAfter %v, want 1h0m0.001s", res.ResetAfter)
	}
	res, err = e.lim.AllowN(ctx, key(t, "odd2"), limit, 2)
	check(t, "AllowN 2", res, err, want{2, 0, -1})
	if res.ResetAfter != 2*time.Hour+time.Millisecond {
		t.Fatalf("ResetAfter %v, want 2h0m0.001s (7,200,001 ms exactly)", res.ResetAfter)
	}
}

// testServerRefuses: a bucket the module cannot hold (2^40 tokens at one an
// hour fills in more than 100 years) is the server's error, not a panic.
func testServerRefuses(t *testing.T, e env) {
	ctx := context.Background()
	_, err := e.lim.Allow(ctx, key(t, "huge"), redis_rate.Limit{Rate: 1, Burst: 1 << 40, Period: time.Hour})
	var se *ratelimit.ServerError
	if !errors.As(err, &se) || !strings.Contains(se.Message, "fill") {
		t.Fatalf("got %v, want the server's error about the time to fill", err)
	}
}

// testPath: a client with Do sends RL.TOKENBUCKET itself (one command per
// call), one without goes through EVALSHA; in a cluster the keys spread
// over every master with no MOVED reply.
func testPath(t *testing.T, e env) {
	ctx := context.Background()
	if e.cluster != nil {
		for i := 0; i < 30; i++ {
			if _, err := e.lim.Allow(ctx, fmt.Sprintf("spread:%d", i), redis_rate.PerMinute(5)); err != nil {
				t.Fatal(err)
			}
		}
		for i, n := range e.cluster.Nodes {
			if n.Calls("rl.tokenbucket") == 0 {
				t.Fatalf("master %d served no RL.TOKENBUCKET", i)
			}
		}
		if m := e.cluster.Moved(); m != 0 {
			t.Fatalf("%d MOVED replies", m)
		}
		return
	}
	tb, evalsha := e.server.Calls("rl.tokenbucket"), e.server.Calls("evalsha")
	for i := 0; i < 10; i++ {
		if _, err := e.lim.Allow(ctx, key(t, "path"), redis_rate.PerMinute(50)); err != nil {
			t.Fatal(err)
		}
	}
	dtb, devalsha := e.server.Calls("rl.tokenbucket")-tb, e.server.Calls("evalsha")-evalsha
	if e.script {
		if devalsha != 10 || dtb != 10 {
			t.Fatalf("script path: %d EVALSHA and %d RL.TOKENBUCKET for 10 calls, want 10 and 10", devalsha, dtb)
		}
	} else if dtb != 10 || devalsha != 0 {
		t.Fatalf("%d RL.TOKENBUCKET and %d EVALSHA for 10 calls, want 10 and 0", dtb, devalsha)
	}
}

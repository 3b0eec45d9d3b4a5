package ratelimit

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis-ratelimit/redis-ratelimit/clients/go/internal/testserver"
	"github.com/redis/go-redis/v9"
)

// limiterOn is a limiter over a client of rdb (the module checked).
func limiterOn(t *testing.T, rdb redis.UniversalClient, opts ...LimiterOption) *Limiter {
	t.Helper()
	c, err := NewClient(context.Background(), rdb)
	if err != nil {
		t.Fatalf("NewClient: %v", err)
	}
	l := NewLimiter(c, opts...)
	t.Cleanup(func() { _ = l.Close(context.Background()) })
	return l
}

func mustSet(t *testing.T, l *Limiter, rules ...Rule) *RuleSet {
	t.Helper()
	set, err := l.RuleSet(context.Background(), rules...)
	if err != nil {
		t.Fatalf("RuleSet: %v", err)
	}
	return set
}

func argOf(err error) string {
	var ia *InvalidArgumentError
	if errors.As(err, &ia) {
		return ia.Arg
	}
	return ""
}

func TestLimiterDenyCacheSavesRoundTrips(t *testing.T) {
	srv := testserver.Start(t, testserver.Redis)
	l := limiterOn(t, srv.Client(), WithDenyCacheMax(time.Minute))
	set := mustSet(t, l, NewRule("api", FixedWindow(3, 60000)))
	ctx := context.Background()
	for i := 0; i < 3; i++ {
		if d := l.Check(ctx, set, "alice", 1); !d.Allowed || d.Path != PathRedis || d.Rule != "api" {
			t.Fatalf("check %d: %+v", i, d)
		}
	}
	d := l.Check(ctx, set, "alice", 1)
	if d.Allowed || d.Path != PathRedis || d.DeniedBy != 0 || d.Rule != "api" || d.RetryAfter <= 0 {
		t.Fatalf("the denial from Redis: %+v", d)
	}
	for i := 0; i < 50; i++ {
		d := l.Check(ctx, set, "alice", 1)
		if d.Allowed || d.Path != PathDenyCache || d.Rule != "api" || d.WaitMs < 1 || d.Limit != 3 {
			t.Fatalf("cached denial %d: %+v", i, d)
		}
	}
	if got := srv.Calls("rl.fixedwindow"); got != 4 {
		t.Fatalf("the server saw %d calls, want 4 (3 admitted, 1 denied; 50 from the cache)", got)
	}
	if s := l.Stats(); s.DenyCacheHits != 50 || s.RedisCalls != 4 || s.RedisDenied != 1 {
		t.Fatalf("stats: %+v", s)
	}
	// Another identity is not denied by alice's entry.
	if d := l.Check(ctx, set, "bob", 1); !d.Allowed {
		t.Fatalf("bob: %+v", d)
	}

	// Off: every check is a round trip.
	off := limiterOn(t, srv.Client(), WithDenyCache(false))
	before := srv.Calls("rl.fixedwindow")
	for i := 0; i < 10; i++ {
		if d := off.Check(ctx, set, "alice", 1); d.Allowed || d.Path != PathRedis {
			t.Fatalf("no cache, check %d: %+v", i, d)
		}
	}
	if got := srv.Calls("rl.fixedwindow") - before; got != 10 {
		t.Fatalf("without the cache the server saw %d calls, want 10", got)
	}
}

func TestLimiterLocalLevelShare(t *testing.T) {
	srv := testserver.Start(t, testserver.Redis)
	// 100 per minute over 4 instances: a share of ceil(100 * 1.1 / 4) = 28.
	l := limiterOn(t, srv.Client(), WithInstances(4))
	set := mustSet(t, l, NewRule("global", FixedWindow(100, 60000)).Global("rl:{g}:all"))
	ctx := context.Background()
	admitted, local := 0, 0
	for i := 0; i < 40; i++ {
		d := l.Check(ctx, set, fmt.Sprint("user", i), 1)
		switch {
		case d.Allowed && d.Path == PathRedis:
			admitted++
		case !d.Allowed && d.Path == PathLocal:
			local++
			if d.Limit != 100 || d.Remaining != 0 || d.Rule != "global" || d.RetryAfter <= 0 {
				t.Fatalf("a local denial: %+v", d)
			}
		default:
			t.Fatalf("check %d: %+v", i, d)
		}
	}
	if admitted != 28 || local != 12 {
		t.Fatalf("admitted %d, denied locally %d; want 28 and 12", admitted, local)
	}
	if got := srv.Calls("rl.fixedwindow"); got != 28 {
		t.Fatalf("the server saw %d calls, want 28 (the local denials never reach it)", got)
	}
	if s := l.Stats(); s.LocalDenied != 12 || s.LocalAdmitted != 28 {
		t.Fatalf("stats: %+v", s)
	}
	// The share by ratio, and the local level off.
	if got := shareOf(15000, 20, 0); got != 825 {
		t.Fatalf("15,000 over 20 instances: %d, want 825", got)
	}
	if got := shareOf(10, 0, 0.25); got != 3 {
		t.Fatalf("10 at 25%%: %d, want 3", got)
	}
	off := limiterOn(t, srv.Client(), WithInstances(4), WithLocalLevel(false))
	set2 := mustSet(t, off, NewRule("g2", FixedWindow(100, 60000)).Global("rl:{g}:two"))
	for i := 0; i < 40; i++ {
		if d := off.Check(ctx, set2, "x", 1); !d.Allowed || d.Path != PathRedis {
			t.Fatalf("local level off, check %d: %+v", i, d)
		}
	}
}

func TestLimiterRuleSetIsOneCall(t *testing.T) {
	srv := testserver.Start(t, testserver.Redis)
	l := limiterOn(t, srv.Client(), WithDenyCache(false))
	set := mustSet(t, l,
		NewRule("per-user", FixedWindow(5, 60000)).Prefix("{api}:user:"),
		NewRule("tight", TokenBucket(2, 1, 60000)).Prefix("{api}:tight:"),
	)
	ctx := context.Background()
	for i := 0; i < 2; i++ {
		d := l.Check(ctx, set, "u", 1)
		if !d.Allowed || d.Path != PathRedis || d.DeniedBy != -1 {
			t.Fatalf("check %d: %+v", i, d)
		}
	}
	d := l.Check(ctx, set, "u", 1)
	if d.Allowed || d.DeniedBy != 1 || d.Rule != "tight" || d.Limit != 2 {
		t.Fatalf("the denial names the tight rule: %+v", d)
	}
	if got := srv.Calls("rl.all"); got != 3 {
		t.Fatalf("RL.ALL calls: %d, want 3", got)
	}
	// The per-user rule kept its units: all or nothing.
	v, err := NewClientOrFail(t, srv.Client()).Apply(ctx, "{api}:user:u", FixedWindow(5, 60000), Cost(0))
	if err != nil || v.Remaining != 3 {
		t.Fatalf("per-user after a denial by another rule: %+v %v", v, err)
	}
}

// NewClientOrFail is a client of rdb for a test.
func NewClientOrFail(t *testing.T, rdb redis.UniversalClient) *Client {
	t.Helper()
	c, err := NewClient(context.Background(), rdb)
	if err != nil {
		t.Fatalf("NewClient: %v", err)
	}
	return c
}

func TestLimiterClusterOneCallNoMoved(t *testing.T) {
	cl := testserver.StartCluster(t, 3)
	l := limiterOn(t, cl.ClusterClient(), WithDenyCache(false))
	ctx := context.Background()
	// Without a shared hash tag: refused when built, naming key.
	_, err := l.RuleSet(ctx, NewRule("a", FixedWindow(5, 60000)), NewRule("b", FixedWindow(5, 60000)).Global("global"))
	if argOf(err) != "key" {
		t.Fatalf("rules without one hash tag: %v", err)
	}
	set := mustSet(t, l,
		NewRule("user", FixedWindow(3, 60000)).Prefix("{tenant}:user:"),
		NewRule("all", FixedWindow(1000, 60000)).Global("{tenant}:all"),
	)
	// Warm the slot map, then count.
	_ = cl.ClusterClient().ForEachMaster(ctx, func(ctx context.Context, c *redis.Client) error { return c.Ping(ctx).Err() })
	movedBefore := cl.Moved()
	for i := 0; i < 20; i++ {
		d := l.Check(ctx, set, fmt.Sprint("u", i%5), 1)
		if d.Path != PathRedis {
			t.Fatalf("check %d: %+v", i, d)
		}
	}
	if got := cl.Calls("rl.all"); got != 20 {
		t.Fatalf("RL.ALL calls over the cluster: %d, want 20", got)
	}
	if got := cl.Moved() - movedBefore; got != 0 {
		t.Fatalf("MOVED replies: %d, want 0", got)
	}
	// Each user was admitted 3 times at most: u0..u4 had 4 checks each.
	d := l.Check(ctx, set, "u0", 1)
	if d.Allowed || d.Rule != "user" {
		t.Fatalf("u0's fifth check: %+v", d)
	}
}

func TestLimiterBadInputNeverPanics(t *testing.T) {
	ctx := context.Background()
	var nilLimiter *Limiter
	if d := nilLimiter.Check(ctx, nil, "x", 1); d.Allowed || !d.Never() {
		t.Fatalf("nil limiter: %+v", d)
	}
	if _, err := nilLimiter.RuleSet(ctx, NewRule("a", FixedWindow(1, 1000))); argOf(err) != "limiter" {
		t.Fatalf("nil limiter RuleSet: %v", err)
	}
	if s := nilLimiter.Stats(); s != (Stats{}) {
		t.Fatalf("nil limiter stats: %+v", s)
	}
	if err := nilLimiter.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := nilLimiter.Lease(ctx, NewRule("c", ConcurrencySpec(1, 1000)), "x"); argOf(err) != "limiter" {
		t.Fatalf("nil limiter lease: %v", err)
	}
	var zero Limiter
	if d := zero.Check(ctx, &RuleSet{rules: []checkedRule{{}}}, "x", 1); d.Allowed || zero.BreakerOpen() {
		t.Fatalf("zero limiter: %+v", d)
	}
	if _, err := zero.RuleSet(ctx, NewRule("a", FixedWindow(1, 1000))); argOf(err) != "client" {
		t.Fatalf("zero limiter RuleSet: %v", err)
	}
	if _, err := zero.Lease(ctx, NewRule("c", ConcurrencySpec(1, 1000)), "x"); argOf(err) != "client" {
		t.Fatalf("zero limiter lease: %v", err)
	}
	if err := zero.Close(ctx); err != nil {
		t.Fatal(err)
	}
	var zeroLease Lease
	if held, err := zeroLease.Release(ctx); held || err != nil || zeroLease.ID() != 0 {
		t.Fatal("zero lease")
	}
	<-zeroLease.Lost()
	noClient := NewLimiter(nil, nil, WithFallback(FailOpen))
	if _, err := noClient.RuleSet(ctx, NewRule("a", FixedWindow(1, 1000))); argOf(err) != "client" {
		t.Fatalf("no client RuleSet: %v", err)
	}
	if _, err := noClient.Acquire(ctx, NewRule("c", ConcurrencySpec(1, 1000)), "x", time.Second); argOf(err) != "client" {
		t.Fatalf("no client acquire: %v", err)
	}

	srv := testserver.Start(t, testserver.Redis)
	l := limiterOn(t, srv.Client())
	if d := l.Check(ctx, nil, "x", 1); d.Allowed || !d.Never() {
		t.Fatalf("nil set: %+v", d)
	}
	if d := l.Check(ctx, &RuleSet{}, "x", 1); d.Allowed {
		t.Fatalf("empty set: %+v", d)
	}
	//lint:ignore SA1012 a nil context is bad input the limiter survives
	if d := l.Check(nil, mustSet(t, l, NewRule("n", FixedWindow(2, 60000))), "x", 1); !d.Allowed { //nolint:staticcheck
		t.Fatalf("nil context: %+v", d)
	}
	set := mustSet(t, l, NewRule("api", FixedWindow(2, 60000)))
	// A limiter without a client decides by its fallback.
	if d := noClient.Check(ctx, set, "x", 1); !d.Allowed || d.Path != PathFallback || d.Rule != "api" {
		t.Fatalf("no client: %+v", d)
	}
	// Empty identity: an identity like any other (the key is the prefix).
	if d := l.Check(ctx, set, "", 1); !d.Allowed || d.Path != PathRedis {
		t.Fatalf("empty identity: %+v", d)
	}
	// Cost 0 takes nothing.
	for i := 0; i < 5; i++ {
		if d := l.Check(ctx, set, "zero", 0); !d.Allowed || d.Remaining != 2 {
			t.Fatalf("cost 0: %+v", d)
		}
	}
	// Cost above the limit: never.
	if d := l.Check(ctx, set, "big", 3); d.Allowed || !d.Never() {
		t.Fatalf("cost above the limit: %+v", d)
	}

	cases := []struct {
		rules []Rule
		arg   string
	}{
		{nil, "rules"},
		{[]Rule{NewRule("", FixedWindow(1, 1000))}, "name"},
		{[]Rule{NewRule("a", FixedWindow(0, 1000))}, "limit"},
		{[]Rule{NewRule("a", TokenBucket(10, 0, 1000))}, "refill_count"},
		{[]Rule{NewRule("a", HashWindow(10, 1000, 300))}, "bucket_ms"},
		{[]Rule{{}}, "name"},
		{[]Rule{PolicyRule("p", "has space")}, "policy name"},
		{[]Rule{PolicyRule("p", "")}, "policy name"},
		{[]Rule{PolicyRule("p", "nosuchpolicy")}, "policy"},
		{[]Rule{PolicyRule("p", "x").Global("k")}, "global"},
		{[]Rule{NewRule("a", FixedWindow(5, 1000)).WithBreaker("b")}, "breaker"},
		{[]Rule{NewRule("a", FixedWindow(5, 1000)).Batched(DefaultBatch)}, "batched"},
		{[]Rule{NewRule("a", LeakyBucket(5, 1, 1000)).Global("k").Batched(DefaultBatch)}, "batched"},
		{[]Rule{NewRule("a", FixedWindow(5, 1000)).Global("k").Batched(Batch{HoldMs: 0, MaxSharePct: 10})}, "hold_ms"},
		{[]Rule{NewRule("a", FixedWindow(5, 1000)).Global("k").Batched(Batch{HoldMs: 10, MaxSharePct: 101})}, "max_share_pct"},
		{[]Rule{NewRule("a", FixedWindow(5, 1000)).Global("k").Striped(1000)}, "striped"},
		{[]Rule{NewRule("a", FixedWindow(5, 1000)).Global("k").Striped(6)}, "striped"},
		{[]Rule{NewRule("a", FixedWindow(5, 1000)).Global("")}, "key"},
		{[]Rule{NewRule("c", ConcurrencySpec(2, 1000))}, "algorithm"},
		{[]Rule{NewRule("q", QuotaSpec(5, PeriodDay, "Mars/Olympus_Mons"))}, "zone"},
		{[]Rule{NewRule("q", QuotaSpec(5, PeriodDay, "../etc/passwd"))}, "zone"},
		{[]Rule{NewRule("q", QuotaSpec(5, Period(9), ""))}, "period"},
		{[]Rule{NewRule("a", FixedWindow(5, 1000)), NewRule("q", QuotaSpec(5, PeriodDay, "Europe/Paris"))}, "zone"},
	}
	for i, c := range cases {
		_, err := l.RuleSet(ctx, c.rules...)
		if argOf(err) != c.arg {
			t.Errorf("case %d: %v, want an *InvalidArgumentError naming %q", i, err, c.arg)
		}
	}
	// Bad options are ignored, not fatal.
	odd := NewLimiter(l.Client(), nil, WithInstances(-3), WithShare(7), WithDenyCacheCapacity(-1),
		WithLocalCapacity(0), WithCallDeadline(-time.Second), WithBreaker(BreakerConfig{}), WithMetrics(nil), WithDenyEvents(nil))
	if d := odd.Check(ctx, mustSet(t, odd, NewRule("odd", FixedWindow(1, 60000))), "x", 1); !d.Allowed {
		t.Fatalf("a limiter with odd options: %+v", d)
	}
}

// load runs checks on n goroutines until stop closes; it answers the count
// of decisions per path.
func load(l *Limiter, set *RuleSet, n int, stop <-chan struct{}) func() map[Path]int64 {
	var mu sync.Mutex
	paths := map[Path]int64{}
	var wg sync.WaitGroup
	for g := 0; g < n; g++ {
		wg.Add(1)
		go func(g int) {
			defer wg.Done()
			local := map[Path]int64{}
			for i := 0; ; i++ {
				select {
				case <-stop:
					mu.Lock()
					for p, c := range local {
						paths[p] += c
					}
					mu.Unlock()
					return
				default:
				}
				d := l.Check(context.Background(), set, fmt.Sprintf("user%d", (g*7+i)%50), 1)
				local[d.Path]++
			}
		}(g)
	}
	return func() map[Path]int64 { wg.Wait(); return paths }
}

func TestFallbackRedisDies(t *testing.T) {
	for _, mode := range []FallbackMode{LocalOnly, FailOpen, FailClosed} {
		t.Run(mode.String(), func(t *testing.T) { redisDies(t, mode) })
	}
}

func redisDies(t *testing.T, mode FallbackMode) {
	srv := testserver.Start(t, testserver.Redis)
	const workers = 32
	l := limiterOn(t, srv.Client(), WithFallback(mode), WithDenyCache(false), WithInstances(2),
		WithBreaker(BreakerConfig{Failures: 3, OpenFor: 300 * time.Millisecond}), WithCallDeadline(200*time.Millisecond))
	set := mustSet(t, l, NewRule("api", FixedWindow(1000000, 60000)))
	ctx := context.Background()
	stop := make(chan struct{})
	wait := load(l, set, workers, stop)
	testserver.WaitUntil(t, "decisions from Redis under load", func() bool { return l.Stats().RedisAdmitted > 200 })

	srv.Kill9()
	testserver.WaitUntil(t, "the breaker to open", func() bool { return l.Stats().BreakerOpened >= 1 })
	open := l.Stats()
	// While it is open, checks are decided without a call: at most the
	// calls already past the gate when it opened go out.
	testserver.WaitUntil(t, "2,000 decisions with the breaker open", func() bool {
		return l.Stats().BreakerSkipped >= open.BreakerSkipped+2000
	})
	during := l.Stats()
	if sent := during.RedisCalls - open.RedisCalls; sent > workers {
		t.Fatalf("%d calls went out while the breaker was open (at most %d were in flight)", sent, workers)
	}
	if during.Probes == 0 {
		testserver.WaitUntil(t, "a probe", func() bool { return l.Stats().Probes > 0 })
	}
	// The fallback decides in its mode.
	d := l.Check(ctx, set, "probe-me", 1)
	if d.Path != PathFallback {
		t.Fatalf("with Redis dead: %+v", d)
	}
	switch mode {
	case FailOpen, LocalOnly:
		if !d.Allowed {
			t.Fatalf("%v denied: %+v", mode, d)
		}
	case FailClosed:
		if d.Allowed || d.RetryAfter != 300*time.Millisecond || d.Rule != "api" {
			t.Fatalf("fail closed: %+v", d)
		}
	}

	// Counted before the restart: a probe may close the breaker as soon as
	// the server answers.
	restarted := l.Stats()
	srv.Restart()
	testserver.WaitUntil(t, "the probe to close the breaker", func() bool { return l.Stats().ProbesOK >= 1 })
	testserver.WaitUntil(t, "decisions from Redis again", func() bool {
		return l.Check(ctx, set, "back", 1).Path == PathRedis
	})
	close(stop)
	paths := wait()
	after := l.Stats()
	if paths[PathFallback] == 0 || paths[PathRedis] == 0 {
		t.Fatalf("paths under load: %v", paths)
	}
	// What reached the restarted server: the probes (PING) and the calls
	// the limiter counted after it closed the breaker, nothing else.
	sent := int64(after.RedisCalls-restarted.RedisCalls) + int64(after.OwedSent-restarted.OwedSent)
	got := srv.Calls("rl.fixedwindow")
	if got > sent || got == 0 {
		t.Fatalf("the restarted server saw %d limiter calls; the limiter sent at most %d", got, sent)
	}
	if srv.Calls("ping") < 1 {
		t.Fatalf("no probe reached the restarted server")
	}
	t.Logf("%v: calls sent while open %d, decided without a call %d, probes %d (%d answered), restarted server saw %d limiter calls of %d sent; paths %v",
		mode, during.RedisCalls-open.RedisCalls, during.BreakerSkipped-open.BreakerSkipped, after.Probes, after.ProbesOK, got, sent, paths)
	if mode == LocalOnly && after.OwedSent == 0 {
		t.Fatalf("the local-only fallback admitted without calls but sent no owed units: %+v", after)
	}
}

func TestFallbackModes(t *testing.T) {
	ctx := context.Background()
	srv := testserver.Start(t, testserver.Redis)
	mk := func(mode FallbackMode) (*Limiter, *RuleSet) {
		l := limiterOn(t, srv.Client(), WithFallback(mode), WithInstances(2),
			WithBreaker(BreakerConfig{Failures: 1, OpenFor: time.Hour}))
		return l, mustSet(t, l, NewRule("api", FixedWindow(10, 60000)), NewRule("global", FixedWindow(100, 60000)).Global("rl:all"))
	}
	lo, loSet := mk(LocalOnly)
	op, opSet := mk(FailOpen)
	cl, clSet := mk(FailClosed)
	// Redis admits 4 for alice through the local-only limiter first: its
	// account (share ceil(10 * 1.1 / 2) = 6) holds them.
	for i := 0; i < 4; i++ {
		if d := lo.Check(ctx, loSet, "alice", 1); !d.Allowed || d.Path != PathRedis {
			t.Fatalf("before: %+v", d)
		}
	}
	srv.Kill9()
	// Fail open: everything admitted.
	for i := 0; i < 30; i++ {
		if d := op.Check(ctx, opSet, "alice", 1); !d.Allowed || d.Path != PathFallback {
			t.Fatalf("fail open %d: %+v", i, d)
		}
	}
	// Fail closed: everything denied, retry after the breaker's open time.
	for i := 0; i < 3; i++ {
		d := cl.Check(ctx, clSet, "alice", 1)
		if d.Allowed || d.Path != PathFallback || d.RetryAfter != time.Hour || d.Never() {
			t.Fatalf("fail closed %d: %+v", i, d)
		}
	}
	// Local only: the account at its share, less what Redis admitted.
	admitted := 0
	for i := 0; i < 10; i++ {
		d := lo.Check(ctx, loSet, "alice", 1)
		if d.Path != PathFallback {
			t.Fatalf("local only %d: %+v", i, d)
		}
		if d.Allowed {
			admitted++
		} else if d.Rule != "api" || d.Limit != 10 || d.RetryAfter <= 0 {
			t.Fatalf("local only denial: %+v", d)
		}
	}
	if admitted != 2 {
		t.Fatalf("the local-only fallback admitted %d for alice, want 2 (share 6 less 4 Redis admitted)", admitted)
	}
	// Another user has the whole share.
	admitted = 0
	for i := 0; i < 10; i++ {
		if lo.Check(ctx, loSet, "bob", 1).Allowed {
			admitted++
		}
	}
	if admitted != 6 {
		t.Fatalf("bob: %d admitted by the fallback, want 6", admitted)
	}
	s := lo.Stats()
	if s.FallbackAdmitted != 8 || s.FallbackDenied != 12 || s.BreakerOpened != 1 {
		t.Fatalf("stats: %+v", s)
	}
	for _, m := range []FallbackMode{LocalOnly, FailOpen, FailClosed, FallbackMode(9)} {
		if m.String() == "" || (m == FallbackMode(9)) != strings.HasPrefix(m.String(), "FallbackMode(") {
			t.Fatalf("String: %q", m.String())
		}
	}
}

// TestFallbackOwedUnitsReachRedis: what the local-only fallback admitted
// without a call is counted in Redis (COST n FORCE) before the key's next
// call, so one instance stays within the limit when Redis comes back in the
// same window.
func TestFallbackOwedUnitsReachRedis(t *testing.T) {
	ctx := context.Background()
	srv := testserver.Start(t, testserver.Redis)
	l := limiterOn(t, srv.Client(), WithFallback(LocalOnly), WithDenyCache(false),
		WithBreaker(BreakerConfig{Failures: 1, OpenFor: 50 * time.Millisecond}))
	set := mustSet(t, l, NewRule("api", FixedWindow(10, 3600000)))
	if d := l.Check(ctx, set, "k", 0); !d.Allowed || d.Path != PathRedis {
		t.Fatalf("first: %+v", d)
	}
	srv.Kill9()
	// A check of nothing meets the dead server and opens the breaker.
	if d := l.Check(ctx, set, "k", 0); d.Path != PathFallback || !l.BreakerOpen() {
		t.Fatalf("the failure: %+v", d)
	}
	// Admitted by the fallback without a call: owed to Redis.
	admitted := 0
	for i := 0; i < 5; i++ {
		if d := l.Check(ctx, set, "k", 1); d.Allowed && d.Path == PathFallback {
			admitted++
		}
	}
	if admitted != 5 {
		t.Fatalf("the fallback admitted %d of 5", admitted)
	}
	srv.Restart()
	testserver.WaitUntil(t, "decisions from Redis again", func() bool {
		return l.Check(ctx, set, "k", 0).Path == PathRedis
	})
	// Redis (empty after the restart) now holds the 5 units: it admits the
	// other 5 of the window, no more.
	for i := 0; i < 20; i++ {
		if d := l.Check(ctx, set, "k", 1); d.Allowed {
			admitted++
		}
	}
	if admitted != 10 {
		t.Fatalf("one instance admitted %d in a window of 10", admitted)
	}
	if s := l.Stats(); s.OwedSent != 1 {
		t.Fatalf("owed units sent in %d calls, want 1: %+v", s.OwedSent, s)
	}
}

func TestLimiterSentinelFailover(t *testing.T) {
	master := testserver.Start(t, testserver.Redis)
	replica := testserver.StartReplica(t, master)
	sentinel := testserver.StartSentinel(t, master)
	l := limiterOn(t, sentinel.FailoverClient(), WithDenyCache(false),
		WithBreaker(BreakerConfig{Failures: 2, OpenFor: 100 * time.Millisecond}))
	set := mustSet(t, l, NewRule("api", FixedWindow(1000000, 60000)))
	ctx := context.Background()
	if d := l.Check(ctx, set, "u", 1); d.Path != PathRedis {
		t.Fatalf("before: %+v", d)
	}
	before := replica.Calls("rl.fixedwindow")
	sentinel.Failover(t)
	testserver.WaitUntil(t, "the Sentinel to name the replica", func() bool { return sentinel.MasterAddr() == replica.Addr() })
	testserver.WaitUntil(t, "decisions from the new master", func() bool {
		d := l.Check(ctx, set, "u", 1)
		return d.Path == PathRedis && replica.Calls("rl.fixedwindow") > before
	})
}

// metricValue is the value of one sample of family name with labels (a
// counter or gauge), or a histogram's count; -1 when absent.
func metricValue(t *testing.T, reg *prometheus.Registry, name string, labels map[string]string) float64 {
	t.Helper()
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
	next:
		for _, m := range f.GetMetric() {
			have := map[string]string{}
			for _, lp := range m.GetLabel() {
				have[lp.GetName()] = lp.GetValue()
			}
			for k, v := range labels {
				if have[k] != v {
					continue next
				}
			}
			switch {
			case m.Counter != nil:
				return m.GetCounter().GetValue()
			case m.Gauge != nil:
				return m.GetGauge().GetValue()
			case m.Histogram != nil:
				return float64(m.GetHistogram().GetSampleCount())
			}
		}
	}
	return -1
}

func TestLimiterMetricsAndDenyEvents(t *testing.T) {
	srv := testserver.Start(t, testserver.Redis)
	reg := prometheus.NewRegistry()
	m, err := NewMetrics(reg)
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var shipped []DenyEvent
	events := NewDenyEvents(CallbackSink(func(_ context.Context, batch []DenyEvent) error {
		mu.Lock()
		shipped = append(shipped, batch...)
		mu.Unlock()
		return nil
	}))
	l := limiterOn(t, srv.Client(), WithMetrics(m), WithDenyEvents(events), WithDenyCacheMax(time.Minute),
		WithBreaker(BreakerConfig{Failures: 1, OpenFor: time.Hour}), WithFallback(FailClosed))
	ctx := context.Background()
	set := mustSet(t, l, NewRule("api", FixedWindow(2, 60000)))
	for i := 0; i < 4; i++ {
		l.CheckFrom(ctx, set, "alice", 1, Origin{ClientIP: "192.0.2.7", UserAgent: "curl/8"})
	}
	decisions := func(level, outcome string) float64 {
		return metricValue(t, reg, "ratelimit_decisions_total", map[string]string{"rule": "api", "level": level, "outcome": outcome})
	}
	if a, d, c := decisions("redis", "admitted"), decisions("redis", "denied"), decisions("deny_cache", "denied"); a != 2 || d != 1 || c != 1 {
		t.Fatalf("decisions: redis admitted %v, redis denied %v, deny_cache denied %v", a, d, c)
	}
	if n := metricValue(t, reg, "ratelimit_redis_seconds", nil); n != 3 {
		t.Fatalf("round trips timed: %v, want 3", n)
	}
	if r := metricValue(t, reg, "ratelimit_remaining_ratio", map[string]string{"rule": "api"}); r != 0 {
		t.Fatalf("remaining ratio after the denial: %v", r)
	}
	if b := metricValue(t, reg, "ratelimit_breaker_open", map[string]string{"breaker": "redis"}); b != 0 {
		t.Fatalf("breaker gauge: %v", b)
	}
	srv.Kill9()
	if d := l.Check(ctx, set, "bob", 1); d.Allowed || d.Path != PathFallback {
		t.Fatalf("fail closed: %+v", d)
	}
	if b := metricValue(t, reg, "ratelimit_breaker_open", map[string]string{"breaker": "redis"}); b != 1 {
		t.Fatalf("breaker gauge once open: %v", b)
	}
	if f := decisions("fallback", "denied"); f != 1 {
		t.Fatalf("fallback denials: %v", f)
	}
	if err := events.Close(ctx); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(shipped) != 3 {
		t.Fatalf("deny events: %+v", shipped)
	}
	for i, level := range []string{"redis", "deny_cache", "fallback"} {
		ev := shipped[i]
		if ev.Level != level || ev.Rule != "api" || ev.Limit != 2 || ev.Timestamp.IsZero() {
			t.Fatalf("event %d: %+v", i, ev)
		}
	}
	if ev := shipped[0]; ev.Key != "api:alice" || ev.ClientIP != "192.0.2.7" || ev.UserAgent != "curl/8" || ev.RetryAfterMs <= 0 {
		t.Fatalf("the first event: %+v", ev)
	}
	if shipped[2].Key != "api:bob" {
		t.Fatalf("the fallback's event: %+v", shipped[2])
	}
}

// TestLimiterOnEveryServer: the limiter's paths on each server kind found
// (Redis 7.0, Valkey, Redis 8.2).
func TestLimiterOnEveryServer(t *testing.T) {
	for _, kind := range testserver.Kinds {
		t.Run(kind.String(), func(t *testing.T) {
			if !testserver.Available(kind) {
				t.Skipf("no %v server on this machine", kind)
			}
			srv := testserver.Start(t, kind)
			l := limiterOn(t, srv.Client(), WithInstances(2), WithDenyCacheMax(time.Minute))
			ctx := context.Background()
			set := mustSet(t, l,
				NewRule("user", SlidingWindow(2, 60000)).Prefix("{s}:user:"),
				NewRule("all", TokenBucket(10, 1, 60000)).Global("{s}:all"),
			)
			var paths []Path
			for i := 0; i < 4; i++ {
				d := l.Check(ctx, set, "u", 1)
				paths = append(paths, d.Path)
				if d.Allowed != (i < 2) {
					t.Fatalf("check %d: %+v", i, d)
				}
			}
			if fmt.Sprint(paths) != "[redis redis redis deny_cache]" {
				t.Fatalf("paths %v", paths)
			}
			// The global share is ceil(10 * 1.1 / 2) = 6: 2 taken, 4 left.
			for i := 0; i < 5; i++ {
				d := l.Check(ctx, set, fmt.Sprint("v", i), 1)
				if (i < 4) != d.Allowed || (i == 4 && d.Path != PathLocal) {
					t.Fatalf("global %d: %+v", i, d)
				}
			}
			if got := srv.Calls("rl.all"); got != 7 {
				t.Fatalf("RL.ALL calls: %d, want 7", got)
			}
			g, err := l.Lease(ctx, NewRule("jobs", ConcurrencySpec(1, 5000)), "t")
			if err != nil || g.ID() == 0 {
				t.Fatalf("lease: %v", err)
			}
			if held, err := g.Release(ctx); !held || err != nil {
				t.Fatalf("release: %v %v", held, err)
			}
		})
	}
}

func TestLimiterPolicyRules(t *testing.T) {
	srv := testserver.Start(t, testserver.Redis)
	ctx := context.Background()
	c := NewClientOrFail(t, srv.Client())
	if err := c.PolicySet(ctx, "free", FixedWindow(3, 60000), PolicyOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := c.PolicySet(ctx, "workers", ConcurrencySpec(1, 300), PolicyOptions{}); err != nil {
		t.Fatal(err)
	}
	l := limiterOn(t, srv.Client(), WithDenyCache(false), WithBreaker(BreakerConfig{Failures: 1, OpenFor: time.Hour}))
	set := mustSet(t, l, PolicyRule("tier", "free"))
	both := mustSet(t, l, PolicyRule("tier", "free").Prefix("{p}:tier:"), NewRule("api", FixedWindow(100, 60000)).Prefix("{p}:api:"))
	for i := 0; i < 3; i++ {
		if d := l.Check(ctx, set, "acme", 1); !d.Allowed || d.Path != PathRedis || d.Rule != "tier" {
			t.Fatalf("check %d: %+v", i, d)
		}
	}
	if d := l.Check(ctx, set, "acme", 1); d.Allowed || d.Rule != "tier" || d.Limit != 3 {
		t.Fatalf("the fourth: %+v", d)
	}
	if got := srv.Calls("rl.hit"); got != 4 {
		t.Fatalf("RL.HIT calls: %d", got)
	}
	if d := l.Check(ctx, both, "acme", 1); !d.Allowed || srv.Calls("rl.all") != 1 {
		t.Fatalf("a policy in RL.ALL: %+v", d)
	}
	// A lease of a CONCURRENCY policy, renewed with the policy's lease_ms.
	g, err := l.Lease(ctx, PolicyRule("w", "workers"), "t")
	if err != nil || g.ID() == 0 {
		t.Fatalf("policy lease: %v", err)
	}
	testserver.WaitUntil(t, "renewals of the policy's lease", func() bool { return srv.Calls("rl.renew") >= 3 })
	if held, err := g.Release(ctx); !held || err != nil {
		t.Fatalf("release: %v %v", held, err)
	}
	// The local-only fallback decides a policy rule on its account, from
	// the spec read when the set was built: acme's 3 are spent.
	srv.Kill9()
	if d := l.Check(ctx, set, "acme", 1); d.Allowed || d.Path != PathFallback || d.Rule != "tier" {
		t.Fatalf("acme in the fallback: %+v", d)
	}
	admitted := 0
	for i := 0; i < 5; i++ {
		if l.Check(ctx, set, "initech", 1).Allowed {
			admitted++
		}
	}
	if admitted != 3 {
		t.Fatalf("the fallback admitted %d of initech's 5, want 3", admitted)
	}
}

// TestFallbackBoundThroughSlowSpells: two instances, a limit of 10 on a
// ten-minute sliding window (a share s of 6 each), the defaults (100 ms,
// 5 failures, local only), the deny cache off. Redis pauses longer than
// the deadline during bursts: the calls that time out may be applied, so
// they stay charged to each instance's account, and the fallback admits
// only what the account has left. One instance admits at most 10, both at
// most 16 (limit + (N - 1) x s).
func TestFallbackBoundThroughSlowSpells(t *testing.T) {
	srv := testserver.Start(t, testserver.Redis)
	ctx := context.Background()
	rule := NewRule("spell", SlidingWindow(10, 600000))
	var ls [2]*Limiter
	var sets [2]*RuleSet
	for i := range ls {
		ls[i] = limiterOn(t, srv.Client(), WithInstances(2), WithDenyCache(false))
		sets[i] = mustSet(t, ls[i], rule)
	}
	var admitted [2]int
	var fallbackSeen [2]bool
	burst := func(i, n int) {
		for k := 0; k < n; k++ {
			d := ls[i].Check(ctx, sets[i], "user", 1)
			if d.Allowed {
				admitted[i]++
			}
			if d.Path == PathFallback {
				fallbackSeen[i] = true
				if d.Allowed && (d.Limit != 10 || d.Remaining > 6) {
					t.Errorf("a fallback admission carries the account's fields: %+v", d)
				}
			}
		}
	}
	for i := range ls {
		burst(i, 3)
	}
	for round := 0; round < 20 && !(fallbackSeen[0] && fallbackSeen[1]); round++ {
		if err := srv.Client().Do(ctx, "CLIENT", "PAUSE", "400", "ALL").Err(); err != nil {
			t.Fatal(err)
		}
		var wg sync.WaitGroup
		for i := range ls {
			wg.Add(1)
			go func(i int) { defer wg.Done(); burst(i, 10) }(i)
		}
		wg.Wait()
	}
	if !fallbackSeen[0] || !fallbackSeen[1] {
		t.Fatalf("no call missed its deadline during the pauses")
	}
	for i := range ls {
		testserver.WaitUntil(t, "Redis deciding again", func() bool {
			return ls[i].Check(ctx, sets[i], "user", 0).Path == PathRedis
		})
		burst(i, 10)
	}
	t.Logf("admitted %v (stats %+v / %+v)", admitted, ls[0].Stats(), ls[1].Stats())
	if admitted[0] > 10 || admitted[1] > 10 || admitted[0]+admitted[1] > 16 {
		t.Fatalf("admitted %v: at most 10 per instance and 16 in all", admitted)
	}
}

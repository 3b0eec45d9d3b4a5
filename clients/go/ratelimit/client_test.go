package ratelimit

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis-ratelimit/redis-ratelimit/clients/go/internal/testserver"
	"github.com/redis/go-redis/v9"
)

// ctClient is a kit Client on srv, closed by the test's cleanup.
func ctClient(t *testing.T, rdb redis.UniversalClient, opts ...Option) *Client {
	t.Helper()
	c, err := NewClient(context.Background(), rdb, opts...)
	if err != nil {
		t.Fatalf("NewClient: %v", err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

func ctDecide(t *testing.T, what string) func(Decision, error) Decision {
	return func(d Decision, err error) Decision {
		t.Helper()
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		return d
	}
}

func ctWantBad(t *testing.T, what string, err error, arg string) {
	t.Helper()
	var ia *InvalidArgumentError
	if !errors.As(err, &ia) {
		t.Fatalf("%s: want an *InvalidArgumentError naming %s, got %v", what, arg, err)
	}
	if ia.Arg != arg {
		t.Fatalf("%s: the error names %q, want %q (%v)", what, ia.Arg, arg, err)
	}
}

// TestClientCommands runs every typed call against Redis 7.0, Valkey and
// (when its binary is found) Redis 8.2.
func TestClientCommands(t *testing.T) {
	for _, kind := range testserver.Kinds {
		t.Run(kind.String(), func(t *testing.T) {
			if kind == testserver.Redis82 && !testserver.Available(kind) {
				t.Skip("no Redis 8.2 binary (REDIS82_SERVER, scripts/redis8-path.sh)")
			}
			srv := testserver.Start(t, kind)
			c := ctClient(t, srv.Client())
			ctCommands(t, c, srv)
		})
	}
	// RESP2: the replies read the same (arrays where RESP3 has maps).
	t.Run("redis-resp2", func(t *testing.T) {
		srv := testserver.Start(t, testserver.Redis)
		rdb := redis.NewClient(&redis.Options{Addr: srv.Addr(), Protocol: 2})
		defer rdb.Close()
		ctCommands(t, ctClient(t, rdb), srv)
	})
}

func ctCommands(t *testing.T, c *Client, srv *testserver.Server) {
	ctx := context.Background()
	if c.ModuleVersion() < MinModuleVersion {
		t.Fatalf("ModuleVersion %d", c.ModuleVersion())
	}
	if c.IsCluster() || c.Deadline() != DefaultDeadline {
		t.Fatalf("IsCluster %v, Deadline %v", c.IsCluster(), c.Deadline())
	}

	// Token bucket: two tokens, then a denial with the time to the next.
	d := ctDecide(t, "TokenBucket")(c.TokenBucket(ctx, "tb", 2, 1, 1000, Request{}))
	if !d.Allowed || d.Limit != 2 || d.Remaining != 1 || d.DeniedBy != -1 || d.Granted != -1 || d.Lease != 0 || d.Path != PathRedis {
		t.Fatalf("first token: %+v", d)
	}
	ctDecide(t, "TokenBucket")(c.TokenBucket(ctx, "tb", 2, 1, 1000, Cost(1)))
	d = ctDecide(t, "TokenBucket")(c.TokenBucket(ctx, "tb", 2, 1, 1000, Request{}))
	if d.Allowed || d.Remaining != 0 || d.WaitMs <= 0 || d.RetryAfter != time.Duration(d.WaitMs)*time.Millisecond || d.Never() {
		t.Fatalf("denial: %+v", d)
	}
	d = ctDecide(t, "TokenBucket")(c.TokenBucket(ctx, "tb", 2, 1, 1000, Cost(3)))
	if d.Allowed || !d.Never() || d.WaitMs != -1 || d.RetryAfter != 0 {
		t.Fatalf("a cost above the capacity: %+v", d)
	}
	d = ctDecide(t, "refund")(c.TokenBucket(ctx, "tb", 2, 1, 1000, Refund(1)))
	if !d.Allowed || d.Remaining != 1 {
		t.Fatalf("refund: %+v", d)
	}
	d = ctDecide(t, "force")(c.TokenBucket(ctx, "tb", 2, 1, 1000, Force(2)))
	if !d.Allowed {
		t.Fatalf("force: %+v", d)
	}
	d = ctDecide(t, "peek")(c.TokenBucket(ctx, "tb", 2, 1, 1000, Cost(0)))
	if !d.Allowed || d.Remaining != 0 {
		t.Fatalf("a peek after the forced call: %+v", d)
	}

	// UPTO: what fits, at most n.
	d = ctDecide(t, "UpTo")(c.TokenBucket(ctx, "up", 5, 1, 1000, UpTo(7)))
	if !d.Allowed || d.Granted != 5 || d.Remaining != 0 {
		t.Fatalf("UPTO 7 of 5: %+v", d)
	}
	d = ctDecide(t, "UpTo")(c.TokenBucket(ctx, "up", 5, 1, 1000, UpTo(7)))
	if d.Allowed || d.Granted != 0 {
		t.Fatalf("UPTO on an empty bucket: %+v", d)
	}

	d = ctDecide(t, "FixedWindow")(c.FixedWindow(ctx, "fw", 10, 60000, Cost(4)))
	if !d.Allowed || d.Limit != 10 || d.Remaining != 6 || d.ResetAfter <= 0 {
		t.Fatalf("FixedWindow: %+v", d)
	}
	ctDecide(t, "LeakyBucket")(c.LeakyBucket(ctx, "lb", 5, 1, 1000, Request{}))
	d = ctDecide(t, "LeakyBucket")(c.LeakyBucket(ctx, "lb", 5, 1, 1000, Request{}))
	if !d.Allowed || d.WaitMs <= 0 || d.RetryAfter <= 0 {
		t.Fatalf("LeakyBucket's ctErr unit waits in the queue: %+v", d)
	}
	d = ctDecide(t, "Sliding")(c.Sliding(ctx, "sl", 3, 60000, Cost(3)))
	if !d.Allowed || d.Remaining != 0 {
		t.Fatalf("Sliding: %+v", d)
	}
	d = ctDecide(t, "HashWindow")(c.HashWindow(ctx, "hw", 10, 60000, 1000, Cost(2)))
	if !d.Allowed || d.Remaining != 8 {
		t.Fatalf("HashWindow: %+v", d)
	}
	for _, zone := range []string{"", "UTC", "+05:30", "Europe/Paris"} {
		key := "q:" + zone
		d = ctDecide(t, "Quota "+zone)(c.Quota(ctx, key, 100, PeriodDay, zone, Cost(10)))
		if !d.Allowed || d.Remaining != 90 || d.ResetAfter <= 0 || d.ResetAfter > 25*time.Hour {
			t.Fatalf("Quota in %q: %+v", zone, d)
		}
	}
	if _, err := c.Quota(ctx, "q:mars", 100, PeriodDay, "Mars/Olympus_Mons", Request{}); !ctServerError(err, "TZ") {
		t.Fatalf("a zone the server does not know: %v", err)
	}

	// Concurrency: a lease, renewed, released once.
	d = ctDecide(t, "Concurrency")(c.Concurrency(ctx, "cc", 1, 30000))
	if !d.Allowed || d.Lease == 0 {
		t.Fatalf("Concurrency: %+v", d)
	}
	lease := d.Lease
	d = ctDecide(t, "Concurrency")(c.Concurrency(ctx, "cc", 1, 30000))
	if d.Allowed || d.Lease != 0 {
		t.Fatalf("a ctErr lease of 1: %+v", d)
	}
	if ok, err := c.Renew(ctx, "cc", lease, 60000); err != nil || !ok {
		t.Fatalf("Renew: %v %v", ok, err)
	}
	if ok, err := c.Release(ctx, "cc", lease); err != nil || !ok {
		t.Fatalf("Release: %v %v", ok, err)
	}
	if ok, err := c.Release(ctx, "cc", lease); err != nil || ok {
		t.Fatalf("Release again: %v %v", ok, err)
	}

	// CL.THROTTLE, redis-cell's reply.
	tr, err := c.Throttle(ctx, "cell", 15, 30, 60, 1)
	if err != nil || tr.Limited || tr.Limit != 16 || tr.Remaining != 15 || tr.RetryAfterS != -1 {
		t.Fatalf("Throttle: %+v %v", tr, err)
	}

	// Policies, RL.HIT, RL.ALL.
	if err := c.PolicySet(ctx, "api:tb", TokenBucket(3, 1, 1000), PolicyOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := c.PolicySet(ctx, "api:cc", ConcurrencySpec(2, 5000), PolicyOptions{Mode: ModeEnforce, Rollout: Int64(100)}); err != nil {
		t.Fatal(err)
	}
	if err := c.PolicySet(ctx, "api:loop", FixedWindow(100, 1000), PolicyOptions{
		Adapt:  &Adapt{Errors: 20, Factor: Int64(70), Min: Int64(40), Recover: Int64(0), MinCalls: Int64(10)},
		Stages: &Stages{DegradePct: 30, BreakPct: 60}, WindowMs: Int64(2000),
	}); err != nil {
		t.Fatal(err)
	}
	if err := c.PolicySet(ctx, "tenant-daily", QuotaSpec(1000, PeriodDay, "Europe/Paris"), PolicyOptions{Mode: ModeShadow}); err != nil {
		t.Fatal(err)
	}
	names, err := c.PolicyList(ctx)
	if err != nil || strings.Join(names, ",") != "api:cc,api:loop,api:tb,tenant-daily" {
		t.Fatalf("PolicyList: %v %v", names, err)
	}
	info, err := c.PolicyGet(ctx, "api:loop")
	if err != nil || info == nil {
		t.Fatalf("PolicyGet: %v %v", info, err)
	}
	if info.Spec != FixedWindow(100, 1000) || info.Mode != ModeEnforce || info.Rollout != 100 || info.Scale != 100 ||
		info.Adapt == nil || info.Adapt.Errors != 20 || *info.Adapt.Factor != 70 || *info.Adapt.Min != 40 || *info.Adapt.Recover != 0 ||
		info.Stages == nil || *info.Stages != (Stages{30, 60}) || info.WindowMs == nil || *info.WindowMs != 2000 {
		t.Fatalf("PolicyGet api:loop: %+v", info)
	}
	info, err = c.PolicyGet(ctx, "tenant-daily")
	if err != nil || info.Spec != QuotaSpec(1000, PeriodDay, "Europe/Paris") || info.Mode != ModeShadow {
		t.Fatalf("PolicyGet tenant-daily: %+v %v", info, err)
	}
	if info, err := c.PolicyGet(ctx, "nobody"); info != nil || err != nil {
		t.Fatalf("PolicyGet of no policy: %v %v", info, err)
	}
	d = ctDecide(t, "Hit")(c.Hit(ctx, "api:tb", "user:1", Cost(3)))
	if !d.Allowed || d.Remaining != 0 || d.Lease != 0 {
		t.Fatalf("Hit: %+v", d)
	}
	d = ctDecide(t, "Hit")(c.Hit(ctx, "api:cc", "jobs", Request{}))
	if !d.Allowed || d.Lease == 0 {
		t.Fatalf("Hit on a CONCURRENCY policy: %+v", d)
	}
	d = ctDecide(t, "Hit UpTo")(c.Hit(ctx, "api:loop", "user:2", UpTo(30)))
	if !d.Allowed || d.Granted != 30 {
		t.Fatalf("Hit UpTo: %+v", d)
	}
	d = ctDecide(t, "All")(c.All(ctx, []Limit{
		{Key: "all:user", Spec: TokenBucket(5, 1, 1000)},
		{Key: "all:global", Policy: "api:tb"},
	}, Cost(1)))
	if !d.Allowed || d.DeniedBy != -1 || d.Remaining != 2 {
		t.Fatalf("All: %+v", d)
	}
	d = ctDecide(t, "All")(c.All(ctx, []Limit{
		{Key: "all:user", Spec: TokenBucket(5, 1, 1000)},
		{Key: "all:global", Policy: "api:tb"},
	}, Cost(3)))
	if d.Allowed || d.DeniedBy != 1 {
		t.Fatalf("All denied by the policy (position 1): %+v", d)
	}
	d = ctDecide(t, "All UpTo")(c.All(ctx, []Limit{
		{Key: "all:user", Spec: TokenBucket(5, 1, 1000)},
		{Key: "all:q", Spec: QuotaSpec(3, PeriodDay, "")},
	}, UpTo(10)))
	if !d.Allowed || d.Granted != 3 || d.DeniedBy != -1 {
		t.Fatalf("All UpTo: %+v", d)
	}
	d = ctDecide(t, "All zoned quota")(c.All(ctx, []Limit{{Key: "all:qz", Spec: QuotaSpec(3, PeriodWeek, "Asia/Kolkata")}}, Request{}))
	if !d.Allowed || d.Remaining != 2 {
		t.Fatalf("All with a zoned quota: %+v", d)
	}

	// The protection loop's commands.
	stats, err := c.OutcomeDenied(ctx, "api:loop", 8, 2, 3)
	if err != nil || len(stats) != 1 || stats[0].Current.OK != 8 || stats[0].Current.Errors != 2 || stats[0].Current.Denied < 3 ||
		!stats[0].Adapting || stats[0].WindowMs != 2000 || stats[0].Current.ErrorPermille != 200 {
		t.Fatalf("OutcomeDenied: %+v %v", stats, err)
	}
	if err := c.PolicyScale(ctx, "api:loop", 50); err != nil {
		t.Fatal(err)
	}
	stats, err = c.PolicyStats(ctx, "api:loop")
	if err != nil || len(stats) != 1 || stats[0].Scale != 50 {
		t.Fatalf("PolicyStats after SCALE 50: %+v %v", stats, err)
	}
	if _, err := c.PolicyStats(ctx, "nobody"); !ctServerError(err, "unknown policy") {
		t.Fatalf("PolicyStats of no policy: %v", err)
	}
	if _, err := c.Outcome(ctx, "api:tb", 1, 0); err != nil {
		t.Fatalf("Outcome on a policy without a loop: %v", err)
	}

	// The deny log.
	if err := c.LogReset(ctx); err != nil {
		t.Fatal(err)
	}
	ctDecide(t, "deny")(c.FixedWindow(ctx, "logged", 1, 60000, Cost(2)))
	n, err := c.LogLen(ctx)
	if err != nil || n != 1 {
		t.Fatalf("LogLen: %d %v", n, err)
	}
	entries, err := c.LogGet(ctx, 10)
	if err != nil || len(entries) != 1 || entries[0].Key != "logged" || entries[0].Source != "RL.FIXEDWINDOW" || entries[0].Cost != 2 || entries[0].WaitMs != -1 {
		t.Fatalf("LogGet: %+v %v", entries, err)
	}

	if ok, err := c.PolicyDel(ctx, "api:tb"); err != nil || !ok {
		t.Fatalf("PolicyDel: %v %v", ok, err)
	}
	if ok, err := c.PolicyDel(ctx, "api:tb"); err != nil || ok {
		t.Fatalf("PolicyDel again: %v %v", ok, err)
	}

	// An error reply is a *ServerError; nothing retried, nothing lost.
	if err := srv.Client().Set(ctx, "str", "x", 0).Err(); err != nil {
		t.Fatal(err)
	}
	_, err = c.TokenBucket(ctx, "str", 1, 1, 1000, Request{})
	var se *ServerError
	if !errors.As(err, &se) || !strings.HasPrefix(se.Message, "WRONGTYPE") || IsUnavailable(err) {
		t.Fatalf("a limiter on a string: %v", err)
	}
	if _, err := c.Hit(ctx, "nobody", "k", Request{}); !ctServerError(err, "") {
		t.Fatalf("Hit on no policy: %v", err)
	}
}

func ctServerError(err error, contains string) bool {
	var se *ServerError
	return errors.As(err, &se) && strings.Contains(se.Message, contains)
}

// TestClientBadInput: every call with bad values is an
// *InvalidArgumentError naming the parameter, before anything is sent.
func TestClientBadInput(t *testing.T) {
	ctx := context.Background()
	if _, err := NewClient(ctx, nil); err == nil {
		t.Fatal("a nil client")
	} else {
		ctWantBad(t, "nil", err, "client")
	}
	var nilClient *redis.Client
	_, err := NewClient(ctx, nilClient)
	ctWantBad(t, "a typed nil", err, "client")
	ring := redis.NewRing(&redis.RingOptions{Addrs: map[string]string{"a": "127.0.0.1:1"}})
	defer ring.Close()
	_, err = NewClient(ctx, ring)
	ctWantBad(t, "a ring", err, "client")
	srv := testserver.Start(t, testserver.Redis)
	_, err = NewClient(ctx, srv.Client(), WithDeadline(0))
	ctWantBad(t, "a zero deadline", err, "deadline")
	c := ctClient(t, srv.Client())

	big := MaxParam + 1
	cases := []struct {
		arg string
		err error
	}{
		{"key", ctErr(c.TokenBucket(ctx, "", 1, 1, 1, Request{}))},
		{"capacity", ctErr(c.TokenBucket(ctx, "k", 0, 1, 1, Request{}))},
		{"refill_count", ctErr(c.TokenBucket(ctx, "k", 1, -1, 1, Request{}))},
		{"refill_ms", ctErr(c.TokenBucket(ctx, "k", 1, 1, big, Request{}))},
		{"span", ctErr(c.TokenBucket(ctx, "k", MaxParam, 1, MaxParam, Request{}))},
		{"limit", ctErr(c.FixedWindow(ctx, "k", 0, 1000, Request{}))},
		{"window_ms", ctErr(c.FixedWindow(ctx, "k", 1, 0, Request{}))},
		{"leak_count", ctErr(c.LeakyBucket(ctx, "k", 1, 0, 1, Request{}))},
		{"UPTO", ctErr(c.LeakyBucket(ctx, "k", 1, 1, 1, UpTo(1)))},
		{"limit", ctErr(c.Sliding(ctx, "k", 1<<24, 1000, Request{}))},
		{"bucket_ms", ctErr(c.HashWindow(ctx, "k", 10, 1000, 300, Request{}))},
		{"window_ms / bucket_ms", ctErr(c.HashWindow(ctx, "k", 10, 2000000, 1, Request{}))},
		{"period", ctErr(c.Quota(ctx, "k", 10, Period(4), "", Request{}))},
		{"zone", ctErr(c.Quota(ctx, "k", 10, PeriodDay, "+25:00", Request{}))},
		{"zone", ctErr(c.Quota(ctx, "k", 10, PeriodDay, "../UTC", Request{}))},
		{"lease_ms", ctErr(c.Concurrency(ctx, "k", 1, 0))},
		{"UPTO", ctErr(c.Apply(ctx, "k", ConcurrencySpec(1, 1), UpTo(2)))},
		{"algorithm", ctErr(c.Apply(ctx, "k", Spec{}, Request{}))},
		{"COST", ctErr(c.TokenBucket(ctx, "k", 1, 1, 1, Cost(uint64(big))))},
		{"COST", ctErr(c.TokenBucket(ctx, "k", 1, 1, 1, Force(uint64(big))))},
		{"REFUND", ctErr(c.TokenBucket(ctx, "k", 1, 1, 1, Refund(uint64(big))))},
		{"UPTO", ctErr(c.TokenBucket(ctx, "k", 1, 1, 1, UpTo(0)))},
		{"UPTO", ctErr(c.TokenBucket(ctx, "k", 1, 1, 1, UpTo(uint64(big))))},
		{"lease", ctErr(c.Release(ctx, "k", 1<<63))},
		{"key", ctErr(c.Release(ctx, "", 1))},
		{"lease_ms", ctErr(c.Renew(ctx, "k", 1, 0))},
		{"policy name", ctErr(c.Hit(ctx, "", "k", Request{}))},
		{"policy name", ctErr(c.Hit(ctx, "has space", "k", Request{}))},
		{"policy name", ctErr(c.Hit(ctx, strings.Repeat("p", 257), "k", Request{}))},
		{"key", ctErr(c.Hit(ctx, "p", "", Request{}))},
		{"numkeys", ctErr(c.All(ctx, nil, Request{}))},
		{"numkeys", ctErr(c.All(ctx, make([]Limit, 17), Request{}))},
		{"key", ctErr(c.All(ctx, []Limit{{Key: "", Policy: "p"}}, Request{}))},
		{"key", ctErr(c.All(ctx, []Limit{{Key: "a", Policy: "p"}, {Key: "a", Policy: "q"}}, Request{}))},
		{"spec", ctErr(c.All(ctx, []Limit{{Key: "a", Policy: "p", Spec: FixedWindow(1, 1)}}, Request{}))},
		{"spec", ctErr(c.All(ctx, []Limit{{Key: "a", Spec: ConcurrencySpec(1, 1)}}, Request{}))},
		{"algorithm", ctErr(c.All(ctx, []Limit{{Key: "a"}}, Request{}))},
		{"REFUND", ctErr(c.All(ctx, []Limit{{Key: "a", Policy: "p"}}, Refund(1)))},
		{"UPTO", ctErr(c.All(ctx, []Limit{{Key: "a", Policy: "p"}, {Key: "b", Spec: LeakyBucket(1, 1, 1)}}, UpTo(2)))},
		{"BLOCK", ctErr(c.Acquire(ctx, "k", TokenBucket(1, 1, 1), Request{}, -time.Millisecond))},
		{"BLOCK", ctErr(c.AcquireHit(ctx, "p", "k", Request{}, time.Duration(MaxParam+1)*time.Millisecond))},
		{"capacity", ctErr(c.Acquire(ctx, "k", TokenBucket(0, 1, 1), Request{}, time.Second))},
		{"key", ctErr(c.AcquireAll(ctx, []Limit{{Policy: "p"}}, Request{}, time.Second))},
		{"max_burst", ctErr(c.Throttle(ctx, "k", -1, 1, 1, 1))},
		{"count", ctErr(c.Throttle(ctx, "k", 1, 0, 1, 1))},
		{"period", ctErr(c.Throttle(ctx, "k", 1, 1, big, 1))},
		{"quantity", ctErr(c.Throttle(ctx, "k", 1, 1, 1, -1))},
		{"span", ctErr(c.Throttle(ctx, "k", 1, 2_000_000_000, 1, 1))},
		{"span", ctErr(c.Throttle(ctx, "k", MaxParam, 1, MaxParam, 1))},
		{"policy name", c.PolicySet(ctx, "", TokenBucket(1, 1, 1), PolicyOptions{})},
		{"capacity", c.PolicySet(ctx, "p", TokenBucket(0, 1, 1), PolicyOptions{})},
		{"MODE", c.PolicySet(ctx, "p", TokenBucket(1, 1, 1), PolicyOptions{Mode: "LOUD"})},
		{"ROLLOUT", c.PolicySet(ctx, "p", TokenBucket(1, 1, 1), PolicyOptions{Rollout: Int64(101)})},
		{"ADAPT", c.PolicySet(ctx, "p", TokenBucket(1, 1, 1), PolicyOptions{Adapt: &Adapt{}, AdaptOff: true})},
		{"break_pct", c.PolicySet(ctx, "p", TokenBucket(1, 1, 1), PolicyOptions{Stages: &Stages{50, 30}})},
		{"WINDOW", c.PolicySet(ctx, "p", TokenBucket(1, 1, 1), PolicyOptions{WindowMs: Int64(0)})},
		{"pct", c.PolicyScale(ctx, "p", 0)},
		{"DENIED", ctErr(c.OutcomeDenied(ctx, "p", 0, 0, uint64(big)))},
		{"policy name", ctErr(c.PolicyGet(ctx, ""))},
		{"policy name", ctErr(c.PolicyDel(ctx, " "))},
		{"policy name", ctErr(c.PolicyStats(ctx, ""))},
		{"count", ctErr(c.LogGet(ctx, 0))},
	}
	for i, tc := range cases {
		ctWantBad(t, fmt.Sprintf("case %d", i), tc.err, tc.arg)
	}
	for k := range srv.Info("commandstats") {
		if strings.HasPrefix(k, "cmdstat_rl.") || strings.HasPrefix(k, "cmdstat_cl.") {
			t.Fatalf("bad input reached the server: %s", k)
		}
	}
}

func ctErr[T any](_ T, err error) error { return err }

// TestClientModuleMissing: a server without the module is ErrModuleMissing
// with a message that says what to do.
func TestClientModuleMissing(t *testing.T) {
	srv := testserver.StartBare(t, testserver.Redis)
	_, err := NewClient(context.Background(), srv.Client())
	if !errors.Is(err, ErrModuleMissing) || !strings.Contains(err.Error(), "ratelimit") || !strings.Contains(err.Error(), "loadmodule") {
		t.Fatalf("NewClient on a server without the module: %v", err)
	}
}

// TestClientUnavailable: a frozen server is ErrTimeout within the client's
// deadline (not go-redis's 30 s read timeout); a dead one ErrConnection.
func TestClientUnavailable(t *testing.T) {
	ctx := context.Background()
	srv := testserver.Start(t, testserver.Redis)
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr(), ReadTimeout: 30 * time.Second, WriteTimeout: 30 * time.Second})
	defer rdb.Close()
	c := ctClient(t, rdb, WithDeadline(200*time.Millisecond))
	ctDecide(t, "warm")(c.TokenBucket(ctx, "k", 10, 1, 1000, Request{}))

	srv.Stop()
	start := time.Now()
	_, err := c.TokenBucket(ctx, "k", 10, 1, 1000, Request{})
	took := time.Since(start)
	srv.Cont()
	if !errors.Is(err, ErrTimeout) || !IsUnavailable(err) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("a frozen server: %v", err)
	}
	// The deadline bounds the call, not the 30 s read timeout (a bound far
	// above the deadline: this is not a speed check).
	if took > 15*time.Second {
		t.Fatalf("the call waited %v: the deadline did not bound it", took)
	}
	// Back: the next calls answer (the late connection was dropped).
	testserver.WaitUntil(t, "a call after SIGCONT", func() bool {
		_, err := c.TokenBucket(ctx, "k", 10, 1, 1000, Request{})
		return err == nil
	})
	// The call's own context: cancelled is not a timeout.
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := c.TokenBucket(cctx, "k", 10, 1, 1000, Request{}); !errors.Is(err, context.Canceled) || IsUnavailable(err) {
		t.Fatalf("a cancelled call: %v", err)
	}

	srv.Kill9()
	_, err = c.TokenBucket(ctx, "k", 10, 1, 1000, Request{})
	if !errors.Is(err, ErrConnection) || !IsUnavailable(err) {
		t.Fatalf("a dead server: %v", err)
	}
	if _, err := NewClient(ctx, redis.NewClient(&redis.Options{Addr: srv.Addr()})); !errors.Is(err, ErrConnection) {
		t.Fatalf("NewClient on a dead server: %v", err)
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := c.TokenBucket(ctx, "k", 10, 1, 1000, Request{}); !errors.Is(err, ErrConnection) {
		t.Fatalf("a call after Close: %v", err)
	}
}

// ctDropProxy forwards TCP to a server; when armed, it swallows the next
// reply and closes the connection: the server applied the command, the
// client never hears of it.
type ctDropProxy struct {
	l      net.Listener
	target string
	armed  atomic.Bool
	drops  atomic.Int64
	wg     sync.WaitGroup
}

func ctStartDropProxy(t *testing.T, target string) *ctDropProxy {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &ctDropProxy{l: l, target: target}
	t.Cleanup(func() { _ = l.Close(); p.wg.Wait() })
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		for {
			in, err := l.Accept()
			if err != nil {
				return
			}
			out, err := net.Dial("tcp", target)
			if err != nil {
				_ = in.Close()
				continue
			}
			p.wg.Add(2)
			go func() { defer p.wg.Done(); _, _ = io.Copy(out, in); _ = out.Close() }()
			go func() {
				defer p.wg.Done()
				defer in.Close()
				buf := make([]byte, 64<<10)
				for {
					n, err := out.Read(buf)
					if n > 0 && p.armed.CompareAndSwap(true, false) {
						p.drops.Add(1)
						_ = out.Close()
						return
					}
					if n > 0 {
						if _, werr := in.Write(buf[:n]); werr != nil {
							return
						}
					}
					if err != nil {
						return
					}
				}
			}()
		}
	}()
	return p
}

// TestClientNeverRetries: a limiter write whose reply is lost after the
// server applied it is an error, applied once. The same call through a
// go-redis client with its default retries is applied twice (what the kit
// prevents).
func TestClientNeverRetries(t *testing.T) {
	ctx := context.Background()
	srv := testserver.Start(t, testserver.Redis)
	proxy := ctStartDropProxy(t, srv.Addr())
	given := redis.NewClient(&redis.Options{Addr: proxy.l.Addr().String()})
	defer given.Close()
	c := ctClient(t, given, WithDeadline(2*time.Second))
	ctDecide(t, "warm")(c.TokenBucket(ctx, "other", 10, 1, 60000, Request{}))

	proxy.armed.Store(true)
	_, err := c.TokenBucket(ctx, "once", 10, 1, 60000, Request{})
	if !errors.Is(err, ErrConnection) || proxy.drops.Load() != 1 {
		t.Fatalf("a lost reply: %v (drops %d)", err, proxy.drops.Load())
	}
	d, err := c.TokenBucket(ctx, "once", 10, 1, 60000, Cost(0))
	if err != nil || d.Remaining != 9 {
		t.Fatalf("the lost call is applied once: remaining %d (want 9), %v", d.Remaining, err)
	}

	// go-redis's own retries, for contrast: the same loss, applied twice.
	if err := given.Ping(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	proxy.armed.Store(true)
	if err := given.Do(ctx, "RL.TOKENBUCKET", "twice", 10, 1, 60000).Err(); err != nil {
		t.Fatalf("go-redis retried and answered: %v", err)
	}
	d, err = c.TokenBucket(ctx, "twice", 10, 1, 60000, Cost(0))
	if err != nil || d.Remaining != 8 {
		t.Fatalf("go-redis's retry applies the call twice: remaining %d (want 8), %v", d.Remaining, err)
	}
}

// TestClientAcquire: BLOCK waits in the server on a connection of its own.
func TestClientAcquire(t *testing.T) {
	ctx := context.Background()
	srv := testserver.Start(t, testserver.Redis)
	given := redis.NewClient(&redis.Options{Addr: srv.Addr(), PoolSize: 1})
	defer given.Close()
	c := ctClient(t, given)

	// Two waits at once, beside a pool of one connection for the decisions.
	keys := []string{"jobs:a", "jobs:b"}
	leases := make([]uint64, len(keys))
	for i, k := range keys {
		d := ctDecide(t, "lease")(c.Concurrency(ctx, k, 1, 60000))
		if !d.Allowed || d.Lease == 0 {
			t.Fatalf("the lease: %+v", d)
		}
		leases[i] = d.Lease
	}
	type result struct {
		d   Decision
		err error
	}
	done := make(chan result, len(keys))
	for _, k := range keys {
		go func() {
			d, err := c.Acquire(ctx, k, ConcurrencySpec(1, 60000), Request{}, 0)
			done <- result{d, err}
		}()
	}
	testserver.WaitUntil(t, "both acquires to block in the server", func() bool {
		select {
		case r := <-done:
			t.Fatalf("an acquire answered without waiting: %+v %v", r.d, r.err)
		default:
		}
		return srv.Info("ratelimit")["ratelimit_blocked_now"] == "2"
	})
	// The decisions' single pooled connection is free: calls go on.
	for i := 0; i < 3; i++ {
		ctDecide(t, "a call beside the wait")(c.TokenBucket(ctx, "free", 10, 1, 1000, Request{}))
	}
	for i, k := range keys {
		if ok, err := c.Release(ctx, k, leases[i]); err != nil || !ok {
			t.Fatalf("Release: %v %v", ok, err)
		}
		r := <-done
		if r.err != nil || !r.d.Allowed || r.d.Lease == 0 {
			t.Fatalf("the acquire after the release: %+v %v", r.d, r.err)
		}
	}
	if srv.Info("ratelimit")["ratelimit_blocked_admitted"] != "2" {
		t.Fatalf("blocked_admitted: %v", srv.Info("ratelimit")["ratelimit_blocked_admitted"])
	}

	// A wait that cannot end in time answers the denial at once.
	d, err := c.Acquire(ctx, "tb", TokenBucket(1, 1, 60000), Cost(2), time.Second)
	if err != nil || d.Allowed || !d.Never() {
		t.Fatalf("an acquire that never passes: %+v %v", d, err)
	}
	// A policy and RL.ALL wait as well.
	if err := c.PolicySet(ctx, "p", TokenBucket(1, 1, 100), PolicyOptions{}); err != nil {
		t.Fatal(err)
	}
	ctDecide(t, "hit")(c.Hit(ctx, "p", "u", Request{}))
	d, err = c.AcquireHit(ctx, "p", "u", Request{}, 5*time.Second)
	if err != nil || !d.Allowed {
		t.Fatalf("AcquireHit: %+v %v", d, err)
	}
	d, err = c.AcquireAll(ctx, []Limit{{Key: "a1", Policy: "p"}, {Key: "a2", Spec: FixedWindow(5, 1000)}}, Request{}, 5*time.Second)
	if err != nil || !d.Allowed || d.DeniedBy != -1 {
		t.Fatalf("AcquireAll: %+v %v", d, err)
	}
	if got := srv.Info("ratelimit")["ratelimit_blocked_total"]; got == "0" || got == "" {
		t.Fatalf("blocked_total %q", got)
	}
}

// TestClientCluster: a 3-master cluster: RL.HIT and RL.ALL (hash tags) go
// to the key's master, no MOVED anywhere; policies are set on every master.
func TestClientCluster(t *testing.T) {
	for _, kind := range []testserver.Kind{testserver.Redis, testserver.Valkey} {
		t.Run(kind.String(), func(t *testing.T) { ctCluster(t, kind) })
	}
}

func ctCluster(t *testing.T, kind testserver.Kind) {
	ctx := context.Background()
	cl := testserver.StartClusterKind(t, kind, 3)
	c := ctClient(t, cl.ClusterClient())
	if !c.IsCluster() {
		t.Fatal("IsCluster")
	}
	// KeySlot agrees with CLUSTER KEYSLOT.
	for i, key := range []string{"", "a", "user:42", "{orders}:user:42", "{orders}:all", "{}x", "x{}y", "{a}{b}", "a{b", "}{c}", "\xff\x00z"} {
		v, err := cl.Nodes[0].Do(ctx, "CLUSTER", "KEYSLOT", key)
		if err != nil || v.(int64) != int64(KeySlot(key)) {
			t.Fatalf("key %d %q: CLUSTER KEYSLOT %v %v, KeySlot %d", i, key, v, err, KeySlot(key))
		}
	}
	for i := 0; i < 200; i++ {
		key := fmt.Sprintf("k%d:{t%d}", i*7919, i%13)
		v, err := cl.Nodes[i%3].Do(ctx, "CLUSTER", "KEYSLOT", key)
		if err != nil || v.(int64) != int64(KeySlot(key)) {
			t.Fatalf("key %q: CLUSTER KEYSLOT %v %v, KeySlot %d", key, v, err, KeySlot(key))
		}
	}

	if err := c.PolicySet(ctx, "api", FixedWindow(100, 60000), PolicyOptions{Stages: &Stages{10, 50}}); err != nil {
		t.Fatal(err)
	}
	for _, n := range cl.Nodes {
		if v, err := n.Do(ctx, "RL.POLICY", "LIST"); err != nil || fmt.Sprint(v) != "[api]" {
			t.Fatalf("RL.POLICY LIST on %s: %v %v", n.Addr(), v, err)
		}
	}
	moved := cl.Moved()
	before := make([]int64, 3)
	for i, n := range cl.Nodes {
		before[i] = n.Calls("rl.hit")
	}
	// Keys whose slots are on each master; the policy's name hashes
	// elsewhere than most of them.
	perNode := make([]int64, 3)
	for i := 0; i < 60; i++ {
		key := fmt.Sprintf("user:%d", i)
		d := ctDecide(t, "Hit")(c.Hit(ctx, "api", key, Request{}))
		if !d.Allowed || d.Remaining != 99 {
			t.Fatalf("Hit %s: %+v", key, d)
		}
		for j, n := range cl.Nodes {
			if n == cl.NodeForSlot(KeySlot(key)) {
				perNode[j]++
			}
		}
	}
	for i, n := range cl.Nodes {
		if got := n.Calls("rl.hit") - before[i]; got != perNode[i] {
			t.Fatalf("node %d ran %d RL.HIT, owns the slots of %d keys", i, got, perNode[i])
		}
	}
	for i := 0; i < 30; i++ {
		tag := fmt.Sprintf("{order:%d}", i)
		d := ctDecide(t, "All")(c.All(ctx, []Limit{
			{Key: tag + ":user", Spec: TokenBucket(5, 1, 1000)},
			{Key: tag + ":global", Policy: "api"},
			{Key: tag + ":q", Spec: QuotaSpec(10, PeriodDay, "")},
		}, Cost(1)))
		if !d.Allowed || d.DeniedBy != -1 {
			t.Fatalf("All %s: %+v", tag, d)
		}
	}
	if got := cl.Calls("rl.all"); got != 30 {
		t.Fatalf("RL.ALL ran %d times, want 30", got)
	}
	_, err := c.All(ctx, []Limit{{Key: "a", Policy: "api"}, {Key: "b", Policy: "api"}}, Request{})
	ctWantBad(t, "RL.ALL across slots", err, "key")
	stats, err := c.OutcomeDenied(ctx, "api", 5, 0, 1)
	if err != nil || len(stats) != 3 {
		t.Fatalf("OutcomeDenied on every master: %+v %v", stats, err)
	}
	stats, err = c.PolicyStats(ctx, "api")
	if err != nil || len(stats) != 3 {
		t.Fatalf("PolicyStats on every master: %+v %v", stats, err)
	}
	ctDecide(t, "deny")(c.FixedWindow(ctx, "{x}deny", 1, 60000, Cost(2)))
	ctDecide(t, "deny")(c.FixedWindow(ctx, "{y}deny", 1, 60000, Cost(2)))
	if n, err := c.LogLen(ctx); err != nil || n != 2 {
		t.Fatalf("LogLen over the masters: %d %v", n, err)
	}
	if es, err := c.LogGet(ctx, 1); err != nil || len(es) != 1 {
		t.Fatalf("LogGet 1 over the masters: %+v %v", es, err)
	}
	d, err := c.Acquire(ctx, "{z}tb", TokenBucket(1, 1, 100), Request{}, time.Second)
	if err != nil || !d.Allowed {
		t.Fatalf("Acquire on a cluster: %+v %v", d, err)
	}
	if ok, err := c.PolicyDel(ctx, "api"); err != nil || !ok {
		t.Fatalf("PolicyDel: %v %v", ok, err)
	}
	if got := cl.Moved(); got != moved {
		t.Fatalf("MOVED replies: %d before, %d after", moved, got)
	}
}

// TestClientSentinel: through redis.NewFailoverClient; after SENTINEL
// FAILOVER, calls reach the new master.
func TestClientSentinel(t *testing.T) {
	ctx := context.Background()
	master := testserver.Start(t, testserver.Redis)
	replica := testserver.StartReplica(t, master)
	sentinel := testserver.StartSentinel(t, master)
	c := ctClient(t, sentinel.FailoverClient())
	d := ctDecide(t, "call")(c.FixedWindow(ctx, "fw", 100, 600000, Request{}))
	if !d.Allowed || d.Remaining != 99 {
		t.Fatalf("through Sentinel: %+v", d)
	}
	if master.Calls("rl.fixedwindow") != 1 {
		t.Fatal("the call did not reach the master")
	}
	testserver.WaitUntil(t, "the replica to hold the limiter", func() bool {
		v, err := replica.Do(ctx, "EXISTS", "fw")
		return err == nil && v.(int64) == 1
	})
	// A replica answers READONLY: the server's reply, and unavailability
	// (the breaker's business, not a bad request).
	onReplica := ctClient(t, replica.Client())
	_, err := onReplica.FixedWindow(ctx, "fw", 100, 600000, Request{})
	var se *ServerError
	if !errors.As(err, &se) || !strings.HasPrefix(se.Message, "READONLY") || !errors.Is(err, ErrConnection) || !IsUnavailable(err) {
		t.Fatalf("a limiter call on a replica: %v", err)
	}
	sentinel.Failover(t)
	testserver.WaitUntil(t, "the Sentinel to name the replica", func() bool { return sentinel.MasterAddr() == replica.Addr() })
	testserver.WaitUntil(t, "a call on the new master", func() bool {
		d, err := c.FixedWindow(ctx, "fw", 100, 600000, Request{})
		return err == nil && d.Allowed && replica.Calls("rl.fixedwindow") > 0
	})
	d = ctDecide(t, "after failover")(c.FixedWindow(ctx, "fw", 100, 600000, Cost(0)))
	if d.Remaining >= 99 {
		t.Fatalf("the new master's limiter carries the old one's count: %+v", d)
	}
}

// TestClientNeverRetriesCluster: on a cluster, a limiter call whose
// connection is lost while the server holds it (a blocked acquire whose
// client the server kills) is an error at once, never sent again: the
// cluster client would otherwise retry it on the same node, then another.
func TestClientNeverRetriesCluster(t *testing.T) {
	ctx := context.Background()
	cl := testserver.StartCluster(t, 3)
	c := ctClient(t, cl.ClusterClient())
	const key = "{jobs}:lease"
	node := cl.NodeForSlot(KeySlot(key))
	if d := ctDecide(t, "lease")(c.Concurrency(ctx, key, 1, 60000)); !d.Allowed {
		t.Fatalf("the lease: %+v", d)
	}
	done := make(chan error, 1)
	go func() {
		_, err := c.Acquire(ctx, key, ConcurrencySpec(1, 60000), Request{}, 30*time.Second)
		done <- err
	}()
	var id string
	testserver.WaitUntil(t, "the acquire to block on the key's master", func() bool {
		v, err := node.Do(ctx, "CLIENT", "LIST")
		if err != nil {
			return false
		}
		for _, line := range strings.Split(fmt.Sprint(v), "\n") {
			if strings.Contains(line, "flags=b") && strings.Contains(strings.ToLower(line), "cmd=rl.concurrency") {
				for _, f := range strings.Fields(line) {
					if v, ok := strings.CutPrefix(f, "id="); ok {
						id = v
					}
				}
			}
		}
		return id != ""
	})
	if _, err := node.Do(ctx, "CLIENT", "KILL", "ID", id); err != nil {
		t.Fatal(err)
	}
	if err := <-done; !errors.Is(err, ErrConnection) {
		t.Fatalf("the acquire whose connection was killed: %v", err)
	}
	if got := node.Info("ratelimit")["ratelimit_blocked_total"]; got != "1" {
		t.Fatalf("blocked_total %s: the acquire was sent again", got)
	}
}

// BenchmarkClientTokenBucket: one decision's round trip to a local Redis
// 7.0 (what each Limiter call to Redis costs).
func BenchmarkClientTokenBucket(b *testing.B) {
	srv := testserver.Start(b, testserver.Redis)
	c, err := NewClient(context.Background(), srv.Client())
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	ctx := context.Background()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if _, err := c.TokenBucket(ctx, "bench", 1_000_000_000, 1_000_000_000, 1000, Request{}); err != nil {
				b.Error(err)
				return
			}
		}
	})
}

package ratelimit

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis-ratelimit/redis-ratelimit/clients/go/internal/testserver"
	"github.com/redis/go-redis/v9"
)

// serverTimeMs is the server's clock (TIME) in ms.
func serverTimeMs(t *testing.T, s *testserver.Server) int64 {
	t.Helper()
	v := mustDo(t, s, "TIME")
	parts, ok := v.([]any)
	if !ok || len(parts) != 2 {
		t.Fatalf("TIME answered %v", v)
	}
	sec, _ := strconv.ParseInt(fmt.Sprint(parts[0]), 10, 64)
	usec, _ := strconv.ParseInt(fmt.Sprint(parts[1]), 10, 64)
	return sec*1000 + usec/1000
}

// remainingOf is a limiter's remaining units, read with COST 0 (nothing
// taken).
func remainingOf(t *testing.T, s *testserver.Server, key string, spec Spec) int64 {
	t.Helper()
	args := []any{spec.Algorithm().Command(), key}
	for _, p := range spec.Params() {
		args = append(args, p)
	}
	args = append(args, "COST", 0)
	v := mustDo(t, s, args...)
	fields, ok := v.([]any)
	if !ok || len(fields) < 3 {
		t.Fatalf("%v answered %v", args, v)
	}
	return fields[2].(int64)
}

func newTestLimiter(t *testing.T, c *Client, opts ...LimiterOption) *Limiter {
	t.Helper()
	l := NewLimiter(c, opts...)
	t.Cleanup(func() { _ = l.Close(context.Background()) })
	return l
}

func mustRuleSet(t *testing.T, l *Limiter, rules ...Rule) *RuleSet {
	t.Helper()
	set, err := l.RuleSet(context.Background(), rules...)
	if err != nil {
		t.Fatal(err)
	}
	return set
}

// TestGrantsContractVectors: the batch sizes, stripe shares and tags of
// contract.json's grants section, through the grants level's own helpers.
func TestGrantsContractVectors(t *testing.T) {
	raw, err := os.ReadFile(filepath.Join("..", "..", "contract", "contract.json"))
	if err != nil {
		t.Fatal(err)
	}
	var contract struct {
		Grants struct {
			Stripes struct {
				ShareVectors []struct {
					N      int     `json:"n"`
					Total  int64   `json:"total"`
					Shares []int64 `json:"shares"`
				} `json:"share_vectors"`
				TagVectors []struct {
					Masters [][][2]int `json:"masters"`
					N       int        `json:"n"`
					Tags    []string   `json:"tags"`
				} `json:"tag_vectors"`
			} `json:"stripes"`
		} `json:"grants"`
	}
	if err := json.Unmarshal(raw, &contract); err != nil {
		t.Fatal(err)
	}
	if len(contract.Grants.Stripes.ShareVectors) == 0 || len(contract.Grants.Stripes.TagVectors) == 0 {
		t.Fatal("contract.json has no stripe vectors")
	}
	for _, v := range contract.Grants.Stripes.ShareVectors {
		spec := FixedWindow(v.Total, 1000)
		for i, want := range v.Shares {
			if got := stripeSpec(spec, v.N, i).params[0]; got != want {
				t.Errorf("stripe %d of %d of %d: %d, want %d", i, v.N, v.Total, got, want)
			}
		}
	}
	for _, v := range contract.Grants.Stripes.TagVectors {
		m := slotMasters{}
		for _, ranges := range v.Masters {
			var rs []slotRange
			for _, r := range ranges {
				rs = append(rs, slotRange{r[0], r[1]})
			}
			m = append(m, rs)
		}
		got := pickStripeTags(orderedMasters(m), v.N)
		if strings.Join(got, ",") != strings.Join(v.Tags, ",") {
			t.Errorf("tags of %d stripes on %v: %v, want %v", v.N, v.Masters, got, v.Tags)
		}
		// The same map picks the same tags again.
		if re := repickStripeTags(orderedMasters(m), got); strings.Join(re, ",") != strings.Join(got, ",") {
			t.Errorf("repick on an unchanged map moved tags: %v -> %v", got, re)
		}
	}
}

// TestGrantsNeverAboveCapacityPlusRefill: three limiters (three
// instances), 16 goroutines each for a second, on one batched global
// token bucket:
// what they admit is never above capacity + refill x elapsed, elapsed
// from the server's clock; the server saw every admitted unit first.
func TestGrantsNeverAboveCapacityPlusRefill(t *testing.T) {
	srv := testserver.Start(t, testserver.Redis)
	c := newTestClient(t, srv.Client())
	spec := TokenBucket(200, 20, 100) // 200, then 200/s
	rule := NewRule("batched", spec).Global("{grants}global").Batched(DefaultBatch)
	var admitted, decisions atomic.Int64
	var paths sync.Map
	start := serverTimeMs(t, srv)
	until := time.Now().Add(time.Second)
	var wg sync.WaitGroup
	limiters := make([]*Limiter, 3)
	for i := range limiters {
		limiters[i] = newTestLimiter(t, c)
		set := mustRuleSet(t, limiters[i], rule)
		for g := 0; g < 16; g++ {
			wg.Add(1)
			go func(l *Limiter) {
				defer wg.Done()
				for time.Now().Before(until) {
					d := l.Check(context.Background(), set, "anyone", 1)
					decisions.Add(1)
					if d.Allowed {
						admitted.Add(1)
					}
					paths.Store(d.Path, true)
					if d.Path == PathFallback {
						t.Errorf("a fallback decision with Redis up: %+v", d)
						return
					}
				}
			}(limiters[i])
		}
	}
	wg.Wait()
	elapsed := serverTimeMs(t, srv) - start
	bound := 200 + 20*(elapsed/100+1)
	if got := admitted.Load(); got > bound || got == 0 {
		t.Fatalf("admitted %d of %d in %d ms: the bound is %d", got, decisions.Load(), elapsed, bound)
	}
	if _, ok := paths.Load(PathGrant); !ok {
		t.Fatal("no decision was made from a grant in process")
	}
	var held int64
	for _, l := range limiters {
		held += l.HeldUnits()
		if err := l.Close(context.Background()); err != nil {
			t.Fatal(err)
		}
		if h := l.HeldUnits(); h != 0 {
			t.Fatalf("%d units still held after Close", h)
		}
	}
	t.Logf("admitted %d of %d in %d ms (bound %d), %d held at the end", admitted.Load(), decisions.Load(), elapsed, bound, held)
}

// TestGrantsFewRedisCallsPerThousandDecisions: under steady load on a
// batched rule, the UPTO asks and the REFUNDs are at most ~10 per 1,000
// decisions (counted by the server).
func TestGrantsFewRedisCallsPerThousandDecisions(t *testing.T) {
	srv := testserver.Start(t, testserver.Redis)
	c := newTestClient(t, srv.Client())
	l := newTestLimiter(t, c)
	set := mustRuleSet(t, l, NewRule("busy", TokenBucket(1_000_000, 1_000_000, 1000)).Global("busy").Batched(DefaultBatch))
	before := srv.Calls("rl.tokenbucket")
	var decisions, denied atomic.Int64
	var wg sync.WaitGroup
	until := time.Now().Add(1500 * time.Millisecond)
	for g := 0; g < 4; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for time.Now().Before(until) {
				decisions.Add(1)
				// Far under the limit, only a waiter whose shared grant ran
				// out before its turn is denied (in process, briefly).
				if d := l.Check(context.Background(), set, "x", 1); !d.Allowed {
					denied.Add(1)
					if d.Path != PathGrant || d.RetryAfter <= 0 {
						t.Errorf("a denial under the limit: %+v", d)
						return
					}
				}
			}
		}()
	}
	wg.Wait()
	if err := l.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	calls := srv.Calls("rl.tokenbucket") - before
	n := decisions.Load()
	perThousand := float64(calls) * 1000 / float64(n)
	st := l.Stats()
	t.Logf("%d decisions, %d Redis calls (%.2f per 1,000): asks %d, refunds %d, in process %d", n, calls, perThousand, st.GrantAsks, st.GrantRefunds, st.GrantAdmitted)
	if n < 1000 {
		t.Fatalf("only %d decisions", n)
	}
	if denied.Load()*100 > n {
		t.Fatalf("%d of %d denied far under the limit", denied.Load(), n)
	}
	if perThousand > 10 {
		t.Fatalf("%.2f Redis calls per 1,000 decisions (%d calls, %d decisions)", perThousand, calls, n)
	}
	if st.GrantAsks == 0 || st.GrantAdmitted == 0 {
		t.Fatalf("stats: %+v", st)
	}
}

// TestGrantsHeldUnitsGoBack: units held past HoldMs go back by themselves
// (REFUND), and every held unit goes back at Close: the server's remaining
// is then the limit minus what was admitted.
// On every server kind.
func TestGrantsHeldUnitsGoBack(t *testing.T) {
	for _, kind := range testserver.Kinds {
		t.Run(kind.String(), func(t *testing.T) { heldUnitsGoBack(t, kind) })
	}
}

func heldUnitsGoBack(t *testing.T, kind testserver.Kind) {
	srv := testserver.Start(t, kind)
	c := newTestClient(t, srv.Client())
	spec := TokenBucket(1000, 1, 3_600_000) // no refill to speak of
	check := func(hold int64, key string, close bool) {
		t.Helper()
		l := NewLimiter(c)
		defer func() { _ = l.Close(context.Background()) }()
		set := mustRuleSet(t, l, NewRule("held", spec).Global(key).Batched(Batch{HoldMs: hold, MaxSharePct: 10}))
		admitted := int64(0)
		for i := 0; i < 300; i++ {
			if d := l.Check(context.Background(), set, "x", 1); d.Allowed {
				admitted++
			}
		}
		if admitted != 300 {
			t.Fatalf("admitted %d of 300 under a limit of 1000", admitted)
		}
		if l.HeldUnits() == 0 {
			t.Fatal("nothing held after a burst: the batch did not grow")
		}
		if got := remainingOf(t, srv, key, spec); got >= 1000-admitted {
			t.Fatalf("the server's remaining %d: the held units were not taken from it", got)
		}
		if close {
			if err := l.Close(context.Background()); err != nil {
				t.Fatal(err)
			}
			if h := l.HeldUnits(); h != 0 {
				t.Fatalf("%d held after Close", h)
			}
		} else {
			testserver.WaitUntil(t, "held units back after HoldMs", func() bool {
				return l.HeldUnits() == 0 && remainingOf(t, srv, key, spec) == 1000-admitted
			})
		}
		if got := remainingOf(t, srv, key, spec); got != 1000-admitted {
			t.Fatalf("the server's remaining %d, want %d", got, 1000-admitted)
		}
		st := l.Stats()
		if st.GrantRefunds == 0 || st.GrantRefundedUnits == 0 {
			t.Fatalf("no refund counted: %+v", st)
		}
	}
	check(200, "held-after-hold", false)
	check(60000, "held-at-close", true)
}

// TestGrantsFallbackWhenRedisIsAway: with the server gone, a batched rule
// spends what it holds, then its limiter's fallback decides.
func TestGrantsFallbackWhenRedisIsAway(t *testing.T) {
	srv := testserver.Start(t, testserver.Redis)
	c := newTestClient(t, srv.Client())
	l := newTestLimiter(t, c, WithFallback(FailClosed), WithCallDeadline(200*time.Millisecond))
	set := mustRuleSet(t, l, NewRule("away", TokenBucket(1000, 1000, 1000)).Global("away").Batched(Batch{HoldMs: 60000, MaxSharePct: 10}))
	for i := 0; i < 50; i++ {
		if d := l.Check(context.Background(), set, "x", 1); !d.Allowed {
			t.Fatalf("denied with Redis up: %+v", d)
		}
	}
	held := l.HeldUnits()
	if held == 0 {
		t.Fatal("nothing held")
	}
	srv.Kill9()
	var grant, fallback int64
	for i := int64(0); i < held+5; i++ {
		d := l.Check(context.Background(), set, "x", 1)
		switch {
		case d.Path == PathGrant && d.Allowed:
			grant++
		case d.Path == PathFallback && !d.Allowed:
			fallback++
		default:
			t.Fatalf("decision %d with Redis away: %+v", i, d)
		}
	}
	if grant != held || fallback != 5 {
		t.Fatalf("held %d: %d from the grant, %d by the fail-closed fallback", held, grant, fallback)
	}
}

// TestGrantsRefusesBadRules: a batched rule must be global, of an
// algorithm that takes UPTO, with hold_ms and max_share_pct in range.
func TestGrantsRefusesBadRules(t *testing.T) {
	srv := testserver.Start(t, testserver.Redis)
	l := newTestLimiter(t, newTestClient(t, srv.Client()))
	for _, r := range []Rule{
		NewRule("perkey", TokenBucket(10, 1, 1000)).Batched(DefaultBatch),
		NewRule("leaky", LeakyBucket(10, 1, 1000)).Global("k").Batched(DefaultBatch),
		NewRule("hold", TokenBucket(10, 1, 1000)).Global("k").Batched(Batch{HoldMs: 0, MaxSharePct: 5}),
		NewRule("stripes", FixedWindow(10, 1000)).Global("k").Striped(65),
		NewRule("thin", FixedWindow(2, 1000)).Global("k").Striped(3),
	} {
		if _, err := l.RuleSet(context.Background(), r); err == nil {
			t.Errorf("rule %q accepted", r.Name())
		}
	}
}

// TestStripesOnePerMaster: a 3-striped rule on a 3-master cluster has one
// stripe on each master (KeySlot checked against CLUSTER KEYSLOT).
func TestStripesOnePerMaster(t *testing.T) {
	cl := testserver.StartCluster(t, 3)
	c := newTestClient(t, cl.ClusterClient())
	l := newTestLimiter(t, c)
	set := mustRuleSet(t, l, NewRule("striped", FixedWindow(300, 60000)).Global("sg").Striped(3))
	tags, own := set.StripeTags("striped")
	if len(tags) != 3 || own < 0 || own > 2 {
		t.Fatalf("tags %v, own %d", tags, own)
	}
	seen := map[*testserver.Server]bool{}
	for _, tag := range tags {
		key := "{" + tag + "}sg"
		slot := KeySlot(key)
		if v := mustDo(t, cl.Nodes[0], "CLUSTER", "KEYSLOT", key); v.(int64) != int64(slot) {
			t.Fatalf("KeySlot(%q) = %d, CLUSTER KEYSLOT %v", key, slot, v)
		}
		seen[cl.NodeForSlot(slot)] = true
	}
	if len(seen) != 3 {
		t.Fatalf("the stripes %v fall on %d masters", tags, len(seen))
	}
	d := l.Check(context.Background(), set, "x", 1)
	if !d.Allowed || d.Limit != 300 || d.Path != PathRedis {
		t.Fatalf("first decision: %+v", d)
	}
	if got := remainingOf(t, cl.NodeForSlot(KeySlot("{"+tags[own]+"}sg")), "{"+tags[own]+"}sg", FixedWindow(100, 60000)); got != 99 {
		t.Fatalf("the own stripe's remaining %d, want 99 (its share is 100)", got)
	}
	if cl.Moved() != 0 {
		t.Fatalf("%d MOVED replies", cl.Moved())
	}
}

// TestStripesSpillOverToTheNextStripe: one instance uses its own stripe,
// then the next one, then denies: it admits two shares of three.
func TestStripesSpillOverToTheNextStripe(t *testing.T) {
	cl := testserver.StartCluster(t, 3)
	c := newTestClient(t, cl.ClusterClient())
	l := newTestLimiter(t, c)
	set := mustRuleSet(t, l, NewRule("spill", FixedWindow(10, 600000)).Global("spill").Striped(3))
	_, own := set.StripeTags("spill")
	shares := []int64{4, 3, 3}
	want := shares[own] + shares[(own+1)%3]
	var admitted int64
	for i := 0; i < 20; i++ {
		d := l.Check(context.Background(), set, "x", 1)
		if d.Allowed {
			admitted++
		} else if d.Limit != 10 || d.RetryAfter <= 0 {
			t.Fatalf("a denial's fields: %+v", d)
		}
	}
	if admitted != want {
		t.Fatalf("own stripe %d: admitted %d, want %d (own share plus the next one's)", own, admitted, want)
	}
	if st := l.Stats(); st.StripeSpills == 0 {
		t.Fatalf("no spill counted: %+v", st)
	}
}

// TestStripesSumNeverAboveTheLimitAtTwiceTheLoad: three instances offer
// twice the limit of a batched, 3-striped window: they admit at most the
// limit, and every stripe stays within its share.
func TestStripesSumNeverAboveTheLimitAtTwiceTheLoad(t *testing.T) {
	cl := testserver.StartCluster(t, 3)
	c := newTestClient(t, cl.ClusterClient())
	const limit = 600
	rule := NewRule("sum", FixedWindow(limit, 600000)).Global("sum").Striped(3).Batched(DefaultBatch)
	var admitted atomic.Int64
	var wg sync.WaitGroup
	var tags []string
	for i := 0; i < 3; i++ {
		l := newTestLimiter(t, c)
		set := mustRuleSet(t, l, rule)
		tags, _ = set.StripeTags("sum")
		for g := 0; g < 8; g++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for n := 0; n < 2*limit/24; n++ {
					if d := l.Check(context.Background(), set, "x", 1); d.Allowed {
						admitted.Add(1)
					}
				}
			}()
		}
	}
	wg.Wait()
	if got := admitted.Load(); got > limit || got == 0 {
		t.Fatalf("admitted %d at twice the load of a limit of %d", got, limit)
	}
	for _, tag := range tags {
		key := "{" + tag + "}sum"
		if r := remainingOf(t, cl.NodeForSlot(KeySlot(key)), key, FixedWindow(limit/3, 600000)); r < 0 {
			t.Fatalf("stripe %s remaining %d", key, r)
		}
	}
	t.Logf("admitted %d of %d offered (limit %d)", admitted.Load(), 2*limit, limit)
}

// TestStripesRepickOnASlotMove: a real slot move (CLUSTER SETSLOT,
// MIGRATE) puts a stripe on a master that has one already: the limiter
// sees the new slot map and picks a tag again for that stripe only.
func TestStripesRepickOnASlotMove(t *testing.T) {
	cl := testserver.StartCluster(t, 3)
	c := newTestClient(t, cl.ClusterClient())
	l := newTestLimiter(t, c)
	set := mustRuleSet(t, l, NewRule("moving", FixedWindow(3000, 600000)).Global("mv").Striped(3))
	before, _ := set.StripeTags("moving")
	for i := 0; i < 10; i++ {
		l.Check(context.Background(), set, "x", 1)
	}
	// Stripe 2's slot moves from master 2 to master 0 (which has stripe 0).
	slot := KeySlot(before[2])
	src, dst := cl.NodeForSlot(slot), cl.Nodes[0]
	if src != cl.Nodes[2] {
		t.Fatalf("stripe 2 (%s, slot %d) is not on master 2", before[2], slot)
	}
	srcID, dstID := mustDo(t, src, "CLUSTER", "MYID").(string), mustDo(t, dst, "CLUSTER", "MYID").(string)
	mustDo(t, dst, "CLUSTER", "SETSLOT", slot, "IMPORTING", srcID)
	mustDo(t, src, "CLUSTER", "SETSLOT", slot, "MIGRATING", dstID)
	for {
		keys, _ := mustDo(t, src, "CLUSTER", "GETKEYSINSLOT", slot, 100).([]any)
		if len(keys) == 0 {
			break
		}
		args := []any{"MIGRATE", "127.0.0.1", dst.Port, "", 0, 5000, "KEYS"}
		args = append(args, keys...)
		mustDo(t, src, args...)
	}
	for _, n := range []*testserver.Server{dst, src, cl.Nodes[1]} {
		mustDo(t, n, "CLUSTER", "SETSLOT", slot, "NODE", dstID)
	}
	testserver.WaitUntil(t, "the limiter to pick stripe 2's tag again", func() bool {
		l.Check(context.Background(), set, "x", 1)
		now, _ := set.StripeTags("moving")
		return now[2] != before[2]
	})
	after, _ := set.StripeTags("moving")
	if after[0] != before[0] || after[1] != before[1] {
		t.Fatalf("tags %v -> %v: only stripe 2 should move", before, after)
	}
	if got := cl.NodeForSlot(KeySlot(after[2])); got != src {
		t.Fatalf("stripe 2's new tag %s (slot %d) is not on the master that lost one", after[2], KeySlot(after[2]))
	}
	if d := l.Check(context.Background(), set, "x", 1); !d.Allowed || d.Path != PathRedis {
		t.Fatalf("a decision after the move: %+v", d)
	}
}

// TestGrantsCloseWaitsForAnAskInFlight: Close during an UPTO call (the
// server stopped) waits for its reply, so the units it brings go back too.
func TestGrantsCloseWaitsForAnAskInFlight(t *testing.T) {
	srv := testserver.Start(t, testserver.Redis)
	c := newTestClient(t, srv.Client())
	spec := TokenBucket(1000, 1, 3_600_000)
	l := newTestLimiter(t, c, WithCallDeadline(30*time.Second))
	set := mustRuleSet(t, l, NewRule("inflight", spec).Global("inflight").Batched(Batch{HoldMs: 60000, MaxSharePct: 10}))
	admitted := int64(0)
	for i := 0; i < 300; i++ {
		if l.Check(context.Background(), set, "x", 1).Allowed {
			admitted++
		}
	}
	if err := l.Close(context.Background()); err != nil || l.HeldUnits() != 0 {
		t.Fatalf("Close: %v, %d held", err, l.HeldUnits())
	}
	asks := l.Stats().GrantAsks
	srv.Stop()
	checked := make(chan Decision, 1)
	go func() { checked <- l.Check(context.Background(), set, "x", 1) }()
	testserver.WaitUntil(t, "an ask in flight", func() bool { return l.Stats().GrantAsks > asks })
	closed := make(chan error, 1)
	go func() { closed <- l.Close(context.Background()) }()
	select {
	case err := <-closed:
		srv.Cont()
		t.Fatalf("Close returned (%v) while an ask was in flight", err)
	case <-time.After(300 * time.Millisecond):
	}
	srv.Cont()
	if d := <-checked; !d.Allowed || d.Path != PathRedis {
		t.Fatalf("the decision that asked: %+v", d)
	}
	admitted++
	if err := <-closed; err != nil {
		t.Fatal(err)
	}
	if h := l.HeldUnits(); h != 0 {
		t.Fatalf("%d units held after Close: the ask's grant was not given back", h)
	}
	if got := remainingOf(t, srv, "inflight", spec); got != 1000-admitted {
		t.Fatalf("the server's remaining %d, want %d", got, 1000-admitted)
	}
}

// TestGrantsNextAskWaits: the grant state's arithmetic, as the other kits
// (contract grants.batched.next_ask_at): a grant below the ask waits
// hold_ms before the next ask once it is spent; a denial of a batch waits
// max(wait_ms, hold_ms), of one unit wait_ms; wait_ms -1 never asks again;
// a grant too small for the cost goes back at once.
func TestGrantsNextAskWaits(t *testing.T) {
	t0 := time.Now()
	newKey := func() *grantKey {
		return &grantKey{key: "k", spec: TokenBucket(1000, 1, 1000), batch: DefaultBatch, flight: make(chan struct{}, 1), limit: 1000, second: -2}
	}
	reply := func(granted, waitMs int64) Decision {
		return Decision{Allowed: granted > 0, Limit: 1000, Remaining: 10, WaitMs: waitMs, Granted: granted, DeniedBy: -1}
	}
	ms := func(n int) time.Time { return t0.Add(time.Duration(n) * time.Millisecond) }
	k := newKey()
	if d, back := k.granted(t0, t0, 10, 1, reply(3, 0)); !d.Allowed || back != 0 || k.held != 2 {
		t.Fatalf("a grant of 3 for 1: %+v, back %d, held %d", d, back, k.held)
	}
	for i := 0; i < 2; i++ {
		if st := k.step(t0, 1, 0, false); !st.done || !st.d.Allowed || st.d.Path != PathGrant {
			t.Fatalf("held unit %d: %+v", i, st)
		}
	}
	if st := k.step(ms(10), 1, 0, false); !st.done || st.d.Allowed || st.d.WaitMs != 40 {
		t.Fatalf("spent, 10 ms after a short grant: %+v", st)
	}
	if st := k.step(ms(50), 1, 0, false); st.done {
		t.Fatalf("hold_ms after a short grant: %+v, want an ask", st)
	}
	k.granted(ms(60), ms(60), 10, 1, reply(0, 20))
	if st := k.step(ms(109), 1, 0, false); !st.done || st.d.Allowed {
		t.Fatalf("49 ms after a denied batch: %+v", st)
	}
	k.granted(ms(110), ms(110), 1, 1, reply(0, 20))
	if st := k.step(ms(130), 1, 0, false); st.done {
		t.Fatalf("wait_ms after a denied unit: %+v, want an ask", st)
	}
	k.granted(ms(130), ms(130), 1, 1, reply(0, -1))
	if st := k.step(ms(9000), 1, 0, false); !st.done || !st.d.Never() {
		t.Fatalf("after wait_ms -1: %+v", st)
	}
	k = newKey()
	if d, back := k.granted(t0, t0, 5, 5, reply(2, 0)); d.Allowed || back != 2 || k.held != 0 {
		t.Fatalf("a grant of 2 for 5: %+v, back %d, held %d", d, back, k.held)
	}
	// A waiter that shared a grant that ran out is denied in process.
	k = newKey()
	k.granted(t0, t0, 1, 1, reply(1, 0))
	if st := k.step(t0, 1, 0, true); !st.done || st.d.Allowed || st.d.RetryAfter <= 0 {
		t.Fatalf("a waiter after the grant ran out: %+v", st)
	}
}

// A global limit larger than one node: units taken in batches with UPTO
// and spent in process, over three stripes on three masters.
func ExampleRule_Batched() {
	ctx := context.Background()
	cluster := redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{"127.0.0.1:7000"}})
	client, err := NewClient(ctx, cluster)
	if err != nil {
		return
	}
	limiter := NewLimiter(client)
	defer limiter.Close(ctx) // held units go back
	rule := NewRule("search", TokenBucket(4000, 40, 10)).
		Global("search:global").
		Batched(DefaultBatch). // HoldMs 50, MaxSharePct 10
		Striped(3)             // one stripe per master
	set, err := limiter.RuleSet(ctx, rule)
	if err != nil {
		return
	}
	d := limiter.Check(ctx, set, "", 1)
	fmt.Println(d.Allowed, d.Path) // PathGrant when decided from held units
}

// TestStripesOnOneServer: without a cluster (standalone, Sentinel) the
// stripes' tags are rl0, rl1, rl2 on the one master, and they still split
// the limit: one instance admits its own share and the next one's.
func TestStripesOnOneServer(t *testing.T) {
	srv := testserver.Start(t, testserver.Redis)
	c := newTestClient(t, srv.Client())
	l := newTestLimiter(t, c)
	set := mustRuleSet(t, l, NewRule("solo", FixedWindow(9, 600000)).Global("solo").Striped(3).Batched(DefaultBatch))
	tags, own := set.StripeTags("solo")
	if strings.Join(tags, ",") != "rl0,rl1,rl2" {
		t.Fatalf("tags %v", tags)
	}
	var admitted int64
	for i := 0; i < 20; i++ {
		if l.Check(context.Background(), set, "x", 1).Allowed {
			admitted++
		}
	}
	if admitted != 6 {
		t.Fatalf("own stripe %d: admitted %d, want 6 (two shares of 3)", own, admitted)
	}
	if moved, err := l.RepickStripes(context.Background(), set); err != nil || moved {
		t.Fatalf("RepickStripes on one server: %v %v", moved, err)
	}
}

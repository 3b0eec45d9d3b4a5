package ratelimit

import (
	"fmt"
	"testing"
	"time"
)

func denial(waitMs int64) Decision {
	return Decision{Limit: 5, WaitMs: waitMs, RetryAfter: time.Duration(max(waitMs, 0)) * time.Millisecond,
		ResetAfter: time.Minute, DeniedBy: 0, Granted: -1, Path: PathRedis}
}

func TestLimiterDenyCacheCountsDownAndExpires(t *testing.T) {
	c := newDenyCache(time.Second, 10)
	at := time.Unix(1000, 0)
	c.put(mk("k"), denial(60000), at)
	d, ok := c.get(mk("k"), at.Add(300*time.Millisecond))
	if !ok || d.Path != PathDenyCache || d.WaitMs != 59700 || d.RetryAfter != 59700*time.Millisecond || d.ResetAfter != time.Minute-300*time.Millisecond {
		t.Fatalf("hit: %v %+v", ok, d)
	}
	// Cached for min(wait, max): a second.
	if _, ok := c.get(mk("k"), at.Add(time.Second)); ok {
		t.Fatal("still cached after max")
	}
	c.put(mk("short"), denial(3), at)
	if d, ok := c.get(mk("short"), at.Add(2*time.Millisecond)); !ok || d.WaitMs != 1 {
		t.Fatalf("short: %v %+v", ok, d)
	}
	if _, ok := c.get(mk("short"), at.Add(3*time.Millisecond)); ok {
		t.Fatal("short still cached after its wait")
	}
	// Admissions and denials that never pass are not cached.
	ok1 := denial(10)
	ok1.Allowed = true
	c.put(mk("ok"), ok1, at)
	c.put(mk("never"), denial(-1), at)
	if _, ok := c.get(mk("ok"), at); ok {
		t.Fatal("an admission was cached")
	}
	if _, ok := c.get(mk("never"), at); ok {
		t.Fatal("a denial that never passes was cached")
	}
}

func TestLimiterDenyCacheIsBounded(t *testing.T) {
	c := newDenyCache(time.Second, 160)
	at := time.Unix(1000, 0)
	for i := 0; i < 10000; i++ {
		c.put(mk(fmt.Sprint("k", i)), denial(1000), at.Add(time.Duration(i)*time.Microsecond))
	}
	if n := c.len(); n > 160 {
		t.Fatalf("%d entries for a cap of 160", n)
	}
	if _, ok := c.get(mk("k9999"), at.Add(10*time.Millisecond)); !ok {
		t.Fatal("the newest was evicted")
	}
}

func TestLimiterLocalAllOrNothing(t *testing.T) {
	l := newLocalLimiters(10)
	a := localLimit{mk("a"), SlidingWindow(2, 60000)}
	b := localLimit{mk("b"), SlidingWindow(1, 60000)}
	if _, pos, _ := take(l, []localLimit{a, b}, 1); pos != -1 {
		t.Fatal("the first should pass")
	}
	_, pos, d := take(l, []localLimit{a, b}, 1)
	if pos != 1 || d.Allowed {
		t.Fatalf("b denies: %d %+v", pos, d)
	}
	// Nothing was taken from a by the denied call: one unit is left.
	if _, pos, _ := take(l, []localLimit{a}, 1); pos != -1 {
		t.Fatal("a kept a unit")
	}
	if _, pos, _ := take(l, []localLimit{a}, 1); pos != 0 {
		t.Fatal("a is full")
	}
	l.refundAll([]localLimit{a}, 1)
	if _, pos, _ := take(l, []localLimit{a}, 1); pos != -1 {
		t.Fatal("the refund gave the unit back")
	}
}

func TestLimiterLocalChargeOweAndBound(t *testing.T) {
	l := newLocalLimiters(10)
	acc := []localLimit{{mk("a"), SlidingWindow(3, 60000)}}
	ds, _, _ := take(l, acc, 1)
	if ds[0].Remaining != 2 {
		t.Fatalf("%+v", ds[0])
	}
	// Units Redis admitted, and a lost call's: forced into debt.
	l.chargeAll(acc, 2)
	l.chargeAll(acc, 2)
	if _, pos, d := take(l, acc, 1); pos != 0 || d.Allowed {
		t.Fatalf("in debt: %+v", d)
	}
	two := []localLimit{{mk("x"), SlidingWindow(5, 60000)}, {mk("y"), SlidingWindow(5, 60000)}}
	if got := l.takeOwed(two); got[0] != 0 || got[1] != 0 {
		t.Fatalf("nothing owed yet: %v", got)
	}
	take(l, two, 2)
	l.oweAll(two[:1], 2)
	take(l, two, 1)
	l.oweAll(two, 1)
	if got := l.takeOwed(two); got[0] != 3 || got[1] != 1 {
		t.Fatalf("owed: %v", got)
	}
	if got := l.takeOwed(two); got[0] != 0 || got[1] != 0 || l.owing != 0 {
		t.Fatalf("owed twice: %v (owing %d)", got, l.owing)
	}
	small := newLocalLimiters(50)
	for i := 0; i < 1000; i++ {
		take(small, []localLimit{{mk(fmt.Sprint("k", i)), SlidingWindow(5, 60000)}}, 1)
	}
	if n := small.size(); n > 50 {
		t.Fatalf("%d limiters for a cap of 50", n)
	}
}

func TestLimiterRuleKeysAndBuilders(t *testing.T) {
	r := NewRule("api", FixedWindow(5, 1000))
	if r.Key("u1") != "api:u1" || r.Name() != "api" || r.IsGlobal() || r.Stripes() != 1 {
		t.Fatalf("%+v", r)
	}
	if got := r.Prefix("{t}:user:").Key("u1"); got != "{t}:user:u1" {
		t.Fatal(got)
	}
	g := r.Global("{t}:all")
	if g.Key("anyone") != "{t}:all" || !g.IsGlobal() {
		t.Fatal("global")
	}
	if tag, ok := g.hashTag(); !ok || tag != "t" {
		t.Fatal("tag", tag)
	}
	if _, ok := r.hashTag(); ok {
		t.Fatal("no tag in api:")
	}
	b := g.Batched(Batch{})
	if got, ok := b.BatchSettings(); !ok || got != DefaultBatch {
		t.Fatal("default batch", got)
	}
	if _, ok := r.BatchSettings(); ok {
		t.Fatal("not batched")
	}
	p := PolicyRule("free", "free-tier").WithBreaker("db")
	if p.Policy() != "free-tier" || p.label() != "free-tier" || p.BreakerName() != "db" || p.Key("u") != "free:u" {
		t.Fatalf("%+v", p)
	}
	if _, ok := p.Spec(); ok {
		t.Fatal("a policy rule has no inline spec")
	}
	if err := p.Validate(); err != nil {
		t.Fatal(err)
	}
	s := localShare(TokenBucket(100, 10, 1000), 4, 0)
	if got := s.Params(); got[0] != 28 || got[1] != 3 || got[2] != 1000 {
		t.Fatalf("a bucket's share: %v", got)
	}
	if got := scaledSpec(FixedWindow(10, 1000), 50).Params(); got[0] != 5 {
		t.Fatalf("scaled: %v", got)
	}
}

func mk(id string) mapKey { return mapKey{rule: "r", id: id} }

func take(l *localLimiters, limits []localLimit, cost uint64) ([]Decision, int, Decision) {
	return l.takeAll(limits, cost, nowMicros(), nil)
}

package ratelimit

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sort"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// The grants level of a Limiter (SPEC "One limit larger than one node";
// contract.json's grants): batched rules (Rule.Batched) take units from the
// server with UPTO b and spend them in process (Path PathGrant); striped
// rules (Rule.Striped) keep their limit in N keys whose hash tags fall on N
// masters. The Limiter calls it through its grantLevel hook (limiter.go):
// prepare once per rule of a RuleSet, check per decision, close at
// Limiter.Close. Calls to Redis go through Limiter.gated (the breaker, the
// counters, the round-trip metric); a failed one is decided by
// Limiter.fallbackOne.

func init() {
	grantLevelFactory = func(l *Limiter) grantLevel { return newGrants(l) }
}

// maxUpTo is the largest UPTO n the server takes (max_param).
const maxUpTo = 1 << 40

// slotRange is a range of cluster slots, both ends included.
type slotRange struct{ lo, hi int }

// slotMasters is a slot map: the masters, each as the slot ranges it owns.
// Standalone or Sentinel: one master owning every slot.
type slotMasters [][]slotRange

// grants is one Limiter's grants level.
type grants struct {
	l     *Limiter
	epoch time.Time
	// seed picks the limiter's own stripe of every striped rule (seed mod
	// n), at random once per limiter.
	seed uint64

	mu   sync.Mutex
	keys map[string]*grantKey

	// The refunder gives back units held longer than hold_ms; it runs only
	// while some key holds units. tickNs: a quarter of the smallest hold_ms.
	refunding atomic.Bool
	tickNs    atomic.Int64
	// bg counts the refunds and slot-map reads in flight.
	bg bgGroup
	// slotReads counts CLUSTER SLOTS reads (tests).
	slotReads atomic.Uint64
}

func newGrants(l *Limiter) *grants {
	g := &grants{l: l, epoch: time.Now(), seed: rand.Uint64(), keys: map[string]*grantKey{}}
	g.tickNs.Store(int64(time.Hour))
	return g
}

// grantRule is what prepare answers for one batched or striped rule.
type grantRule struct {
	name      string
	spec      Spec
	batch     *Batch
	signature string
	// fb is a set of this one rule, for Limiter.fallbackOne.
	fb      *RuleSet
	stripes *stripes
}

// stripes is a striped rule's stripes: their specs, this limiter's own
// stripe, and the tags (picked again when the slot map changes).
type stripes struct {
	specs []Spec
	own   int

	mu      sync.RWMutex
	tags    []string
	masters slotMasters
	// readAt is when the slot map was last read (ns since the epoch);
	// reading: a read is under way.
	readAt  atomic.Int64
	reading atomic.Bool
	repicks atomic.Uint64
}

// key is stripe i's key for the rule's key: "{tag_i}key".
func (s *stripes) key(i int, key string) string {
	s.mu.RLock()
	tag := s.tags[i%len(s.tags)]
	s.mu.RUnlock()
	return "{" + tag + "}" + key
}

func (s *stripes) tagList() []string {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return append([]string(nil), s.tags...)
}

// repick picks the tags again for masters when it differs from the map
// they were picked from; whether a tag moved.
func (s *stripes) repick(masters slotMasters) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if sameMasters(s.masters, masters) {
		return false
	}
	tags := repickStripeTags(masters, s.tags)
	changed := false
	for i := range tags {
		changed = changed || tags[i] != s.tags[i]
	}
	s.tags, s.masters = tags, masters
	if changed {
		s.repicks.Add(1)
	}
	return changed
}

// prepare checks a batched or striped rule against the server's slot map:
// the stripes' specs and tags, the limiter's own stripe.
func (g *grants) prepare(ctx context.Context, r Rule, spec Spec) (any, error) {
	gr := &grantRule{name: r.name, spec: spec, batch: r.batch, signature: inlineSignature(spec)}
	gr.fb = &RuleSet{rules: []checkedRule{{
		rule: r, spec: spec, hasSpec: true, signature: gr.signature, label: r.label(),
		account: localShare(spec, g.l.cfg.instances, g.l.cfg.ratio), hasAccount: true,
	}}}
	if n := r.Stripes(); n > 1 {
		specs := make([]Spec, n)
		for i := range specs {
			specs[i] = stripeSpec(spec, n, i)
		}
		masters, err := g.masters(ctx)
		if err != nil {
			return nil, fmt.Errorf("ratelimit: rule %q: reading the slot map for its stripes: %w", r.name, err)
		}
		st := &stripes{specs: specs, own: int(g.seed % uint64(n)), tags: pickStripeTags(masters, n), masters: masters}
		st.readAt.Store(int64(time.Since(g.epoch)))
		gr.stripes = st
	}
	if r.batch != nil {
		for {
			cur, want := g.tickNs.Load(), int64(max(time.Duration(r.batch.HoldMs)*time.Millisecond/4, time.Millisecond))
			if want >= cur || g.tickNs.CompareAndSwap(cur, want) {
				break
			}
		}
	}
	return gr, nil
}

// stripeSpec is stripe i of n of spec: every size and rate parameter (a
// token bucket's capacity and refill count; a window's or a quota's limit)
// total / n, plus 1 if i < total % n; spans unchanged.
func stripeSpec(spec Spec, n, i int) Spec {
	out := spec
	out.params[0] = StripeShares(spec.params[0], n)[i]
	if spec.Algorithm() == AlgorithmTokenBucket {
		out.params[1] = StripeShares(spec.params[1], n)[i]
	}
	return out
}

// masters reads the slot map (CLUSTER SLOTS), each master as the ranges it
// owns; one master owning every slot when the client is not a cluster's.
func (g *grants) masters(ctx context.Context) (slotMasters, error) {
	cc, ok := g.l.client.Redis().(*redis.ClusterClient)
	if !ok {
		return slotMasters{{{0, 16383}}}, nil
	}
	g.slotReads.Add(1)
	ctx, cancel := context.WithTimeout(ctx, max(g.l.client.Deadline(), time.Second))
	defer cancel()
	// CLUSTER SLOTS by hand (go-redis deprecates its helper for CLUSTER
	// SHARDS, which older servers lack): [start, end, [ip, port, id, ...],
	// replicas...] per range.
	reply, err := cc.Do(ctx, "CLUSTER", "SLOTS").Result()
	if err != nil {
		return nil, fmt.Errorf("%w: CLUSTER SLOTS: %w", ErrConnection, err)
	}
	ranges, _ := reply.([]any)
	byMaster := map[string]int{}
	var out slotMasters
	for _, r := range ranges {
		f, _ := r.([]any)
		if len(f) < 3 {
			return nil, fmt.Errorf("%w: CLUSTER SLOTS: a range of %d fields", ErrProtocol, len(f))
		}
		lo, ok1 := f[0].(int64)
		hi, ok2 := f[1].(int64)
		node, _ := f[2].([]any)
		if !ok1 || !ok2 || len(node) < 2 {
			return nil, fmt.Errorf("%w: CLUSTER SLOTS: a range %v", ErrProtocol, f)
		}
		id := fmt.Sprint(node[0], ":", node[1])
		if len(node) > 2 {
			if s, ok := node[2].(string); ok && s != "" {
				id = s
			}
		}
		i, seen := byMaster[id]
		if !seen {
			i = len(out)
			byMaster[id] = i
			out = append(out, nil)
		}
		out[i] = append(out[i], slotRange{int(lo), int(hi)})
	}
	return orderedMasters(out), nil
}

// orderedMasters sorts each master's ranges and the masters by the lowest
// slot each owns (a master owning none last).
func orderedMasters(m slotMasters) slotMasters {
	out := make(slotMasters, len(m))
	for i, ranges := range m {
		r := append([]slotRange(nil), ranges...)
		sort.Slice(r, func(a, b int) bool { return r[a].lo < r[b].lo })
		out[i] = r
	}
	first := func(r []slotRange) int {
		if len(r) == 0 {
			return 1 << 30
		}
		return r[0].lo
	}
	sort.SliceStable(out, func(a, b int) bool { return first(out[a]) < first(out[b]) })
	return out
}

func sameMasters(a, b slotMasters) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if len(a[i]) != len(b[i]) {
			return false
		}
		for j := range a[i] {
			if a[i][j] != b[i][j] {
				return false
			}
		}
	}
	return true
}

// ownerOf is the index of the master owning slot (-1: none).
func ownerOf(m slotMasters, slot int) int {
	for i, ranges := range m {
		for _, r := range ranges {
			if slot >= r.lo && slot <= r.hi {
				return i
			}
		}
	}
	return -1
}

// pickStripeTags is the tags of n stripes: stripe i on master i mod M, its
// tag the first rl0, rl1, ... whose slot that master owns and that no
// earlier stripe took (contract.json grants.stripes.tags).
func pickStripeTags(m slotMasters, n int) []string {
	ranges := make([][][2]int, len(m))
	for i, rs := range m {
		for _, r := range rs {
			ranges[i] = append(ranges[i], [2]int{r.lo, r.hi})
		}
	}
	return PickStripeTags(ranges, n)
}

// nextFreeTag is the first rl<k> whose slot master owns and that is not
// taken.
func nextFreeTag(m slotMasters, master int, taken map[string]bool) string {
	for k := 0; k < 10_000_000; k++ {
		tag := "rl" + strconv.Itoa(k)
		if !taken[tag] && ownerOf(m, KeySlot(tag)) == master {
			return tag
		}
	}
	return "rl0"
}

// repickStripeTags is the tags after the slot map changed (as the Rust
// kit): a stripe keeps its tag while the master now owning it holds no
// more than its fair share (ceil(n / M)) of the stripes kept before it;
// the others move, in order, to the master with the fewest stripes (the
// first in slot order on a tie), with that master's first free tag. Units
// consumed under a moved stripe's old key are not seen under its new one.
func repickStripeTags(m slotMasters, old []string) []string {
	n := len(old)
	if len(m) == 0 {
		return append([]string(nil), old...)
	}
	fair := (n + len(m) - 1) / len(m)
	load := make([]int, len(m))
	kept := make([]string, n)
	taken := map[string]bool{}
	for i, tag := range old {
		if o := ownerOf(m, KeySlot(tag)); o >= 0 && load[o] < fair {
			load[o]++
			kept[i] = tag
			taken[tag] = true
		}
	}
	out := make([]string, n)
	for i := range kept {
		if kept[i] != "" {
			out[i] = kept[i]
			continue
		}
		target := 0
		for j := range load {
			if load[j] < load[target] {
				target = j
			}
		}
		load[target]++
		tag := nextFreeTag(m, target, taken)
		taken[tag] = true
		out[i] = tag
	}
	return out
}

// grantKey is what one limiter keeps of a batched rule on one key (a
// striped rule: one per stripe key).
type grantKey struct {
	key   string
	spec  Spec
	batch Batch
	// flight is held by the one UPTO call in flight on this key; the other
	// deciders wait for it and share its grant.
	flight chan struct{}

	mu        sync.Mutex
	held      int64
	grantedAt time.Time
	// nextAskAt: no ask before it (zero: ask when nothing is held).
	nextAskAt time.Time
	// never: the server answered wait_ms -1; denied until the rule changes.
	never bool
	// The rate counter: decisions in the current second of the limiter's
	// clock (second) and in the one before it.
	second, current, previous int64
	// asks is the replies received: a waiter that sees it move shared that
	// grant.
	asks uint64
	// The last reply's fields.
	limit, waitMs int64
	reset         time.Duration
}

// grantStep is what a decision on a batched key does next: decided in
// process (done), or an ask of UPTO n (seen: the reply count then).
type grantStep struct {
	done bool
	d    Decision
	n    int64
	seen uint64
}

func (g *grants) key(signature, key string, spec Spec, b Batch) *grantKey {
	id := signature + "\x00" + key
	g.mu.Lock()
	defer g.mu.Unlock()
	k := g.keys[id]
	if k == nil {
		k = &grantKey{key: key, spec: spec, batch: b, flight: make(chan struct{}, 1), limit: limitOf(spec), second: -2}
		g.keys[id] = k
	}
	return k
}

func (g *grants) allKeys() []*grantKey {
	g.mu.Lock()
	defer g.mu.Unlock()
	out := make([]*grantKey, 0, len(g.keys))
	for _, k := range g.keys {
		out = append(out, k)
	}
	return out
}

func (k *grantKey) hold() time.Duration { return time.Duration(k.batch.HoldMs) * time.Millisecond }

// count counts one decision in second s of the limiter's clock.
func (k *grantKey) count(s int64) {
	if s != k.second {
		if s == k.second+1 {
			k.previous = k.current
		} else {
			k.previous = 0
		}
		k.current, k.second = 0, s
	}
	k.current++
}

// takeStale takes the units held longer than hold_ms (all: every unit).
func (k *grantKey) takeStale(now time.Time, all bool) int64 {
	if k.held > 0 && (all || now.Sub(k.grantedAt) >= k.hold()) {
		n := k.held
		k.held = 0
		return n
	}
	return 0
}

// decision is a decision made in process, with the last reply's fields.
func (k *grantKey) decision(allowed bool, remaining, waitMs int64) Decision {
	d := Decision{Allowed: allowed, Limit: k.limit, Remaining: remaining, WaitMs: waitMs,
		ResetAfter: k.reset, DeniedBy: -1, Granted: -1, Path: PathGrant}
	if !allowed && waitMs > 0 {
		d.RetryAfter = time.Duration(waitMs) * time.Millisecond
	}
	return d
}

// step takes cost from what is held, denies before the next ask, or asks.
// seenSet: a decision that waited for the call in flight.
func (k *grantKey) step(now time.Time, cost int64, seen uint64, seenSet bool) grantStep {
	if cost > 0 && k.held >= cost {
		k.held -= cost
		return grantStep{done: true, d: k.decision(true, k.held, 0)}
	}
	if k.never {
		return grantStep{done: true, d: k.decision(false, 0, -1)}
	}
	if !k.nextAskAt.IsZero() && now.Before(k.nextAskAt) {
		wait := max(int64((k.nextAskAt.Sub(now)+time.Millisecond-1)/time.Millisecond), 1)
		return grantStep{done: true, d: k.decision(false, 0, wait)}
	}
	if seenSet && seen != k.asks {
		// The grant this decision waited for ran out before its turn (as
		// every kit: waiters share one grant in arrival order).
		return grantStep{done: true, d: k.decision(false, 0, max(k.waitMs, 1))}
	}
	rate := max(k.previous, k.current)
	n := min(max(BatchSize(rate, k.batch.HoldMs, limitOf(k.spec), k.batch.MaxSharePct), cost), maxUpTo)
	return grantStep{n: n, seen: k.asks}
}

// granted takes the server's reply d to UPTO asked, sent at askedAt, for a
// decision of cost: that decision's answer, and the units to refund at once
// (a grant too small for cost).
func (k *grantKey) granted(askedAt, now time.Time, asked, cost int64, d Decision) (Decision, int64) {
	k.mu.Lock()
	defer k.mu.Unlock()
	got := max(d.Granted, 0)
	k.asks++
	k.limit, k.waitMs, k.reset = d.Limit, d.WaitMs, d.ResetAfter
	out := d
	out.Granted, out.DeniedBy = -1, -1
	// When the next ask may go: the contract's next_ask_at (grantmath.go).
	delay, never := NextAskAfter(asked, got, d.WaitMs, k.batch.HoldMs)
	k.nextAskAt = time.Time{}
	if delay > 0 {
		k.nextAskAt = askedAt.Add(delay)
	}
	if got >= 1 {
		k.held += got
		k.grantedAt, k.never = now, false
		if k.held >= cost {
			k.held -= cost
			return out, 0
		}
		back := k.held
		k.held = 0
		short := k.decision(false, 0, 1)
		short.Path = PathRedis
		return short, back
	}
	k.never = never
	return out, 0
}

// check decides cost units of a batched or striped rule for key.
func (g *grants) check(ctx context.Context, prepared any, key string, cost uint64) (Decision, func()) {
	gr := prepared.(*grantRule)
	c := int64(min(cost, maxUpTo))
	st := gr.stripes
	if st == nil {
		return g.decideKey(ctx, gr, key, key, gr.spec, c)
	}
	own, next := st.own, (st.own+1)%len(st.specs)
	total := limitOf(gr.spec)
	first, undo := g.decideKey(ctx, gr, key, st.key(own, key), st.specs[own], c)
	first.Limit = total
	if first.Allowed || first.Path == PathFallback {
		return first, undo
	}
	g.l.stats.stripeSpills.Add(1)
	second, undo := g.decideKey(ctx, gr, key, st.key(next, key), st.specs[next], c)
	second.Limit = total
	if second.Allowed || second.Path == PathFallback {
		return second, undo
	}
	// Both denied: the own stripe's fields, with the shorter wait.
	wait := first.WaitMs
	switch {
	case first.WaitMs < 0:
		wait = second.WaitMs
	case second.WaitMs >= 0:
		wait = min(first.WaitMs, second.WaitMs)
	}
	d := first
	d.WaitMs = wait
	d.RetryAfter = 0
	if wait > 0 {
		d.RetryAfter = time.Duration(wait) * time.Millisecond
	}
	return d, nil
}

// decideKey decides one key of a grant rule (the rule's, or a stripe's):
// from its batch, or by one COST call; the fallback when Redis cannot
// answer. ruleKey is the rule's own key (the fallback's account).
func (g *grants) decideKey(ctx context.Context, gr *grantRule, ruleKey, key string, spec Spec, cost int64) (Decision, func()) {
	l := g.l
	if gr.batch == nil {
		d, ok, lost := l.gated(ctx, func() (Decision, error) { return l.client.Apply(ctx, key, spec, Cost(uint64(cost))) })
		g.afterCall(gr)
		if !ok {
			return l.fallbackOne(gr.fb, 0, ruleKey, uint64(cost), lost), nil
		}
		d.DeniedBy, d.Granted = -1, -1
		if !d.Allowed {
			l.stats.redisDenied.Add(1)
			return d, nil
		}
		l.stats.redisAdmitted.Add(1)
		return d, func() { g.refundLater(key, spec, cost) }
	}
	k := g.key(gr.signature, key, spec, *gr.batch)
	now := time.Now()
	k.mu.Lock()
	k.count(int64(now.Sub(g.epoch) / time.Second))
	stale := k.takeStale(now, false)
	step := k.step(now, cost, 0, false)
	k.mu.Unlock()
	if stale > 0 {
		g.refundLater(k.key, k.spec, stale)
	}
	if step.done {
		return g.inProcess(step.d, k, cost)
	}
	select {
	case k.flight <- struct{}{}:
	case <-ctx.Done():
		return l.fallbackOne(gr.fb, 0, ruleKey, uint64(cost), false), nil
	}
	defer func() { <-k.flight }()
	k.mu.Lock()
	step = k.step(time.Now(), cost, step.seen, true)
	k.mu.Unlock()
	if step.done {
		return g.inProcess(step.d, k, cost)
	}
	askedAt := time.Now()
	l.stats.grantAsks.Add(1)
	reply, ok, lost := l.gated(ctx, func() (Decision, error) { return l.client.Apply(ctx, key, spec, UpTo(uint64(step.n))) })
	g.afterCall(gr)
	if !ok {
		return l.fallbackOne(gr.fb, 0, ruleKey, uint64(cost), lost), nil
	}
	l.stats.grantUnits.Add(uint64(max(reply.Granted, 0)))
	d, back := k.granted(askedAt, time.Now(), step.n, cost, reply)
	if back > 0 {
		g.refundLater(k.key, k.spec, back)
	}
	g.startRefunder()
	if !d.Allowed {
		l.stats.redisDenied.Add(1)
		return d, nil
	}
	l.stats.redisAdmitted.Add(1)
	return d, func() { k.putBack(cost) }
}

// putBack gives back units a decision took but its set denied.
func (k *grantKey) putBack(units int64) {
	k.mu.Lock()
	k.held += units
	k.mu.Unlock()
}

func (g *grants) inProcess(d Decision, k *grantKey, cost int64) (Decision, func()) {
	if d.Allowed {
		g.l.stats.grantAdmitted.Add(1)
		return d, func() { k.putBack(cost) }
	}
	g.l.stats.grantDenied.Add(1)
	return d, nil
}

// refundLater gives n units of key back: one REFUND in the background,
// never retried.
func (g *grants) refundLater(key string, spec Spec, n int64) {
	g.l.stats.grantRefunds.Add(1)
	g.l.stats.grantRefundedUnits.Add(uint64(n))
	g.bg.add()
	go func() {
		defer g.bg.done()
		_, _ = g.l.client.Apply(context.Background(), key, spec, Refund(uint64(n)))
	}()
}

// startRefunder starts the goroutine that gives back units held longer
// than their hold_ms, looking every quarter of the smallest hold_ms; it
// ends when no key holds a unit (the next grant starts it again).
func (g *grants) startRefunder() {
	if !g.refunding.CompareAndSwap(false, true) {
		return
	}
	go func() {
		for {
			time.Sleep(time.Duration(g.tickNs.Load()))
			now := time.Now()
			holding := false
			for _, k := range g.allKeys() {
				k.mu.Lock()
				n := k.takeStale(now, false)
				holding = holding || k.held > 0
				k.mu.Unlock()
				if n > 0 {
					g.refundLater(k.key, k.spec, n)
				}
			}
			if holding {
				continue
			}
			g.refunding.Store(false)
			// A grant that came in meanwhile restarts it (or this one goes on).
			if !g.holding() || !g.refunding.CompareAndSwap(false, true) {
				return
			}
		}
	}()
}

func (g *grants) holding() bool {
	for _, k := range g.allKeys() {
		k.mu.Lock()
		h := k.held > 0
		k.mu.Unlock()
		if h {
			return true
		}
	}
	return false
}

// repickEvery is how often, at most, a striped rule that calls Redis reads
// the slot map again: go-redis follows MOVED and ASK itself, so the kit
// does not see them, and looks at the map instead.
const repickEvery = time.Second

// afterCall reads the slot map in the background, at most once per
// repickEvery, after a striped rule's call, and picks its tags again when
// it changed.
func (g *grants) afterCall(gr *grantRule) {
	st := gr.stripes
	if st == nil || !g.l.client.IsCluster() {
		return
	}
	now := int64(time.Since(g.epoch))
	if time.Duration(now-st.readAt.Load()) < repickEvery || !st.reading.CompareAndSwap(false, true) {
		return
	}
	st.readAt.Store(now)
	g.bg.add()
	go func() {
		defer g.bg.done()
		defer st.reading.Store(false)
		if m, err := g.masters(context.Background()); err == nil {
			st.repick(m)
		}
	}()
}

// close gives every held unit back and waits for the REFUNDs (each within
// the client's deadline, all within ctx); an ask in flight is waited for
// first, so the units it brings go back too.
func (g *grants) close(ctx context.Context) error {
	var first error
	for _, k := range g.allKeys() {
		select {
		case k.flight <- struct{}{}:
		case <-ctx.Done():
			return ctx.Err()
		}
		k.mu.Lock()
		n := k.takeStale(time.Now(), true)
		k.mu.Unlock()
		if n > 0 {
			g.l.stats.grantRefunds.Add(1)
			g.l.stats.grantRefundedUnits.Add(uint64(n))
			if _, err := g.l.client.Apply(ctx, k.key, k.spec, Refund(uint64(n))); err != nil && first == nil {
				first = fmt.Errorf("ratelimit: %d held units of %q not refunded: %w", n, k.key, err)
			}
		}
		<-k.flight
	}
	if err := g.bg.wait(ctx); err != nil && first == nil {
		first = err
	}
	return first
}

// heldUnits is the units the batched rules hold now, in every key.
func (g *grants) heldUnits() int64 {
	var n int64
	for _, k := range g.allKeys() {
		k.mu.Lock()
		n += k.held
		k.mu.Unlock()
	}
	return n
}

// HeldUnits is the units the limiter's batched rules hold now (taken from
// the server with UPTO, not spent yet), in every key.
func (l *Limiter) HeldUnits() int64 {
	if g, ok := l.grants.(*grants); ok {
		return g.heldUnits()
	}
	return 0
}

// StripeTags is the hash tags of the stripes of the set's striped rule
// named rule, in stripe order, and the limiter's own stripe; nil and -1
// when the set has no striped rule of that name. A stripe's key is
// "{tag}" + the rule's key.
func (s *RuleSet) StripeTags(rule string) (tags []string, own int) {
	if s == nil {
		return nil, -1
	}
	for _, r := range s.rules {
		if gr, ok := r.grant.(*grantRule); ok && r.rule.name == rule && gr.stripes != nil {
			return gr.stripes.tagList(), gr.stripes.own
		}
	}
	return nil, -1
}

// RepickStripes reads the slot map now and picks the tags of set's striped
// rules again where it changed (the limiter also does it on its own, at
// most once a second while a striped rule calls Redis); whether any tag
// moved.
func (l *Limiter) RepickStripes(ctx context.Context, set *RuleSet) (bool, error) {
	g, ok := l.grants.(*grants)
	if !ok || set == nil {
		return false, nil
	}
	m, err := g.masters(ctx)
	if err != nil {
		return false, err
	}
	moved := false
	for _, r := range set.rules {
		if gr, ok := r.grant.(*grantRule); ok && gr.stripes != nil {
			moved = gr.stripes.repick(m) || moved
		}
	}
	return moved, nil
}

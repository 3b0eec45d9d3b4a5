package ratelimit

// The core's rate-limiting algorithms (core/src/*.rs) in process, in exact
// integer arithmetic (no floating point anywhere): what the local level of a
// global rule and the local-only fallback run. They answer as the server
// does: the contract's golden sequences (contract.json algorithms[].golden
// and grants.golden) are reproduced decision for decision.
//
// Instants are Unix microseconds. The token and leaky buckets are the
// GCRA counted in ticks of 1/refill_count microsecond, in 128-bit integers
// (u128, pure_u128.go) as the core computes them. A change of parameters
// between calls on one state carries what was consumed over, as in the
// core. CONCURRENCY is not here: a lease is held in Redis alone.

import "time"

// The contract's bounds (contract.json max_param, max_span_ms), the latest
// instant a call runs at, and the sliding log's largest limit.
const (
	maxParam        = 1 << 40
	maxSpanMs       = 1 << 50
	maxTimeUs       = 1 << 62
	maxSlidingLimit = 1<<24 - 1
	maxHashBuckets  = 1_000_000
)

// answer is a decision's five integers (wait -1: never).
type answer struct {
	allowed   bool
	limit     uint64
	remaining uint64
	wait      int64
	resetMs   uint64
}

// LocalState is one key's in-process limiter state. The zero value is an
// idle limiter (one that has seen no traffic); LocalApply keeps it. A state
// is for one key and one algorithm: applying another algorithm starts from
// idle. It is not safe for concurrent use (the caller locks it).
//
// Memory: the buckets, the fixed window and the quota hold a few integers.
// The sliding log holds one 16-byte entry per millisecond that admitted
// something within the window, so at most min(2 x limit, window_ms + 1)
// entries (2 x limit with FORCE; limit at most 16,777,215); entries leave at
// the next admission after they expire. The hash window holds one 16-byte
// entry per bucket that admitted something within the window, at most
// window_ms / bucket_ms + 1 (at most 1,000,001).
type LocalState struct {
	algo Algorithm // the algorithm the state is kept for
	live bool      // false: idle (the zero value)
	g    gcraState
	c    countState
	log  slidingLog
	ring hashRing
	// A quota's period end in its zone, kept for the calls within
	// [zoneFrom, zoneEnd) (the calendar is read once per period).
	zone              string
	zonePeriod        int64
	zoneFrom, zoneEnd uint64
}

// Idle reports whether the state is still the zero value's idle limiter
// (nothing was ever stored in it).
func (st *LocalState) Idle() bool { return st == nil || !st.live }

// LocalApply runs one request on an in-process limiter at the instant
// nowUs (Unix microseconds), as the server would on a key holding st:
//   - Cost(n) takes n units when all fit (Cost(0) peeks);
//   - Force(n) takes them anyway (at most a limit of debt beyond empty),
//     answering what Cost(n) would have, allowed;
//   - Refund(n) gives back up to n units held, answering as Cost(0) after;
//   - UpTo(n) takes the most units, at most n, that fit now (LocalFits),
//     Granted saying how many; when not even one fits, Cost(1)'s denial.
//
// st changes only when the request changed the limiter (an admission with
// units, a Force or Refund that moved it), apart from a zoned quota's
// cached period end. A quota's period is computed in
// its zone (PeriodEnd; an unknown zone counts in UTC). A spec the server
// would refuse (a parameter out of range, see Spec.Validate), or
// CONCURRENCY, is a denial that can never pass (WaitMs -1). The Decision's
// Path is PathLocal, DeniedBy -1, and Granted -1 unless the request is UpTo.
func LocalApply(spec Spec, st *LocalState, nowUs int64, req Request) Decision {
	if st == nil {
		st = &LocalState{}
	}
	p, ok := localParams(spec, nowUs, st, true)
	if !ok {
		return neverDecision(spec, req)
	}
	now := clampTime(nowUs)
	var a answer
	var granted uint64
	if !st.live || st.algo != spec.algorithm {
		var fresh LocalState
		fresh.setIdle(spec.algorithm, p, now)
		var changed bool
		a, changed, granted = fresh.run(p, req, now)
		if changed {
			fresh.zone, fresh.zonePeriod, fresh.zoneFrom, fresh.zoneEnd = st.zone, st.zonePeriod, st.zoneFrom, st.zoneEnd
			*st = fresh
		}
	} else {
		a, _, granted = st.run(p, req, now)
	}
	return toDecision(a, req, granted)
}

// LocalFits is how many units, at most most, a Cost would admit now on st
// (0 when not even one fits): what UpTo(most) takes. It never writes st
// (nil is an idle limiter).
func LocalFits(spec Spec, st *LocalState, nowUs int64, most uint64) uint64 {
	p, ok := localParams(spec, nowUs, st, false)
	if !ok {
		return 0
	}
	now := clampTime(nowUs)
	if st == nil || !st.live || st.algo != spec.algorithm {
		var fresh LocalState
		fresh.setIdle(spec.algorithm, p, now)
		return fresh.fits(p, most, now)
	}
	return st.fits(p, most, now)
}

// LocalPeek is what Cost(cost) would answer now on st (nil: idle). It
// never writes st, and copies nothing (an all-or-nothing caller peeks at
// every limit before it applies).
func LocalPeek(spec Spec, st *LocalState, nowUs int64, cost uint64) Decision {
	p, ok := localParams(spec, nowUs, st, false)
	if !ok {
		return neverDecision(spec, Cost(cost))
	}
	now := clampTime(nowUs)
	if st == nil || !st.live || st.algo != spec.algorithm {
		var fresh LocalState
		fresh.setIdle(spec.algorithm, p, now)
		return toDecision(fresh.evaluate(p, cost, now), Cost(cost), 0)
	}
	return toDecision(st.evaluate(p, cost, now), Cost(cost), 0)
}

func clampTime(nowUs int64) uint64 {
	if nowUs < 0 {
		return 0
	}
	return min(uint64(nowUs), maxTimeUs)
}

func neverDecision(spec Spec, req Request) Decision {
	d := Decision{Allowed: false, Limit: max(spec.params[0], 0), WaitMs: -1, DeniedBy: -1, Granted: -1, Path: PathLocal}
	if req.IsUpTo() {
		d.Granted = 0
	}
	return d
}

func toDecision(a answer, req Request, granted uint64) Decision {
	d := Decision{
		Allowed:    a.allowed,
		Limit:      satI64(a.limit),
		Remaining:  satI64(a.remaining),
		WaitMs:     a.wait,
		ResetAfter: time.Duration(min(a.resetMs, maxSpanMs)) * time.Millisecond,
		DeniedBy:   -1,
		Granted:    -1,
		Path:       PathLocal,
	}
	if a.wait > 0 {
		d.RetryAfter = time.Duration(a.wait) * time.Millisecond
	}
	if req.IsUpTo() {
		d.Granted = satI64(granted)
	}
	return d
}

func satI64(x uint64) int64 {
	if x > 1<<63-1 {
		return 1<<63 - 1
	}
	return int64(x)
}

// localParams are the spec's parameters as unsigned integers, checked as
// the server checks them (ok false otherwise); a quota's third is the end
// of the period of a call at nowUs in its zone (kept in st, when not nil,
// for the calls of the same period when keep).
func localParams(spec Spec, nowUs int64, st *LocalState, keep bool) (p [3]uint64, ok bool) {
	inRange := func(i int, hi uint64) bool {
		return spec.params[i] >= 1 && uint64(spec.params[i]) <= hi
	}
	for i := 0; i < spec.n && i < 3; i++ {
		if spec.params[i] >= 0 {
			p[i] = uint64(spec.params[i])
		}
	}
	switch spec.algorithm {
	case AlgorithmTokenBucket, AlgorithmLeakyBucket:
		if !inRange(0, maxParam) || !inRange(1, maxParam) || !inRange(2, maxParam) {
			return p, false
		}
		// An empty bucket fills within maxSpanMs.
		return p, mul64(p[0], p[2]).cmp(mul64(maxSpanMs, p[1])) <= 0
	case AlgorithmFixedWindow:
		return p, inRange(0, maxParam) && inRange(1, maxParam)
	case AlgorithmSliding:
		return p, inRange(0, maxSlidingLimit) && inRange(1, maxParam)
	case AlgorithmHashWindow:
		if !inRange(0, maxParam) || !inRange(1, maxParam) || !inRange(2, maxParam) {
			return p, false
		}
		return p, p[1]%p[2] == 0 && p[1]/p[2] <= maxHashBuckets
	case AlgorithmQuota:
		if !inRange(0, maxParam) || spec.params[1] < 0 || spec.params[1] > 3 {
			return p, false
		}
		now := clampTime(nowUs)
		if st != nil && st.zone == spec.zone && st.zonePeriod == spec.params[1] && st.zoneEnd != 0 &&
			now >= st.zoneFrom && now < st.zoneEnd {
			p[2] = st.zoneEnd
			return p, true
		}
		end, _ := PeriodEnd(Period(spec.params[1]), spec.zone, nowUs)
		p[2] = uint64(end)
		if st != nil && keep {
			st.zone, st.zonePeriod, st.zoneFrom, st.zoneEnd = spec.zone, spec.params[1], now, uint64(end)
		}
		return p, true
	}
	return p, false
}

func (st *LocalState) setIdle(a Algorithm, p [3]uint64, now uint64) {
	*st = LocalState{algo: a, zone: st.zone, zonePeriod: st.zonePeriod, zoneFrom: st.zoneFrom, zoneEnd: st.zoneEnd}
	switch a {
	case AlgorithmTokenBucket, AlgorithmLeakyBucket:
		st.g = gcraState{tatUs: now, rc: p[1], rms: p[2]}
	case AlgorithmFixedWindow:
		st.c = countState{atUs: now}
	case AlgorithmHashWindow:
		st.ring = idleRing(p, now)
	}
}

// run is the core's run: the answer, whether the state changed (it is then
// live), and the units taken.
func (st *LocalState) run(p [3]uint64, req Request, now uint64) (a answer, changed bool, granted uint64) {
	n := req.Units()
	switch {
	case req.IsForce():
		a, changed = st.force(p, n, now)
		a.allowed = true
		granted = n
	case req.IsRefund():
		changed = st.refund(p, n, now)
		a = st.apply(p, 0, now) // COST 0 never changes a state
	case req.IsUpTo():
		k := max(st.fits(p, n, now), 1)
		a = st.apply(p, k, now)
		changed = a.allowed
		if changed {
			granted = k
		}
	default:
		a = st.apply(p, n, now)
		changed = a.allowed && n > 0
		if changed {
			granted = n
		}
	}
	if changed {
		st.live = true
	}
	return a, changed, granted
}

func (st *LocalState) apply(p [3]uint64, cost, now uint64) answer {
	switch st.algo {
	case AlgorithmTokenBucket:
		a, _ := st.g.gcra(p, cost, now, true)
		return a
	case AlgorithmLeakyBucket:
		a, ahead := st.g.gcra(p, cost, now, true)
		return shaped(a, ahead, p)
	case AlgorithmFixedWindow:
		return st.c.fixedApply(p, cost, now, true)
	case AlgorithmQuota:
		return st.c.quotaApply(p, cost, now, true)
	case AlgorithmSliding:
		a, first := st.log.evaluate(p, cost, now)
		if a.allowed && cost > 0 {
			st.log.expire(first)
			st.log.push(st.log.stamp(now), cost)
		}
		return a
	case AlgorithmHashWindow:
		if !st.ring.sameLayout(p) {
			other := st.ring.converted(p, now)
			a := other.apply(p, cost, now)
			if a.allowed && cost > 0 {
				st.ring = other
			}
			return a
		}
		return st.ring.apply(p, cost, now)
	}
	return answer{wait: -1}
}

// evaluate is what apply answers, changing nothing.
func (st *LocalState) evaluate(p [3]uint64, cost, now uint64) answer {
	switch st.algo {
	case AlgorithmTokenBucket:
		g := st.g
		a, _ := g.gcra(p, cost, now, false)
		return a
	case AlgorithmLeakyBucket:
		g := st.g
		a, ahead := g.gcra(p, cost, now, false)
		return shaped(a, ahead, p)
	case AlgorithmFixedWindow:
		return st.c.fixedApply(p, cost, now, false)
	case AlgorithmQuota:
		return st.c.quotaApply(p, cost, now, false)
	case AlgorithmSliding:
		a, _ := st.log.evaluate(p, cost, now)
		return a
	case AlgorithmHashWindow:
		if !st.ring.sameLayout(p) {
			other := st.ring.converted(p, now)
			a, _ := other.evaluate(p, cost, now)
			return a
		}
		a, _ := st.ring.evaluate(p, cost, now)
		return a
	}
	return answer{wait: -1}
}

func (st *LocalState) force(p [3]uint64, cost, now uint64) (answer, bool) {
	switch st.algo {
	case AlgorithmTokenBucket:
		a, _, changed := st.g.gcraForce(p, cost, now)
		return a, changed
	case AlgorithmLeakyBucket:
		a, ahead, changed := st.g.gcraForce(p, cost, now)
		return shaped(a, ahead, p), changed
	case AlgorithmFixedWindow, AlgorithmQuota:
		return st.c.force(st.algo == AlgorithmQuota, p, cost, now)
	case AlgorithmSliding:
		return st.log.force(p, cost, now)
	case AlgorithmHashWindow:
		if !st.ring.sameLayout(p) {
			other := st.ring.converted(p, now)
			a, changed := other.force(p, cost, now)
			if changed {
				st.ring = other
			}
			return a, changed
		}
		return st.ring.force(p, cost, now)
	}
	return answer{wait: -1}, false
}

func (st *LocalState) refund(p [3]uint64, units, now uint64) bool {
	switch st.algo {
	case AlgorithmTokenBucket, AlgorithmLeakyBucket:
		return st.g.refund(p, units, now)
	case AlgorithmFixedWindow:
		_, count := st.c.fixedCurrent(p, now)
		back := min(units, count)
		if back == 0 {
			return false
		}
		st.c.count = count - back
		return true
	case AlgorithmQuota:
		end, count := st.c.quotaCurrent(p, now)
		back := min(units, count)
		if back == 0 {
			return false
		}
		st.c.atUs = end
		st.c.count = count - back
		return true
	case AlgorithmSliding:
		return st.log.refund(p, units, now)
	case AlgorithmHashWindow:
		if !st.ring.sameLayout(p) {
			other := st.ring.converted(p, now)
			changed := other.refund(p, units, now)
			if changed {
				st.ring = other
			}
			return changed
		}
		return st.ring.refund(p, units, now)
	}
	return false
}

// fits is UPTO's count: the most units, at most most, that a Cost admits
// now (0 when not even one does). Admission is monotone in the cost, so a
// binary search over evaluations that change nothing finds it; no cost
// above the limit is ever admitted.
func (st *LocalState) fits(p [3]uint64, most, now uint64) uint64 {
	if st.algo == AlgorithmConcurrency || most < 1 {
		return 0
	}
	view := st
	if st.algo == AlgorithmHashWindow && !st.ring.sameLayout(p) {
		// Convert once, not at every probe.
		view = &LocalState{algo: st.algo, ring: st.ring.converted(p, now)}
	}
	admits := func(k uint64) bool { return view.evaluate(p, k, now).allowed }
	if !admits(1) {
		return 0
	}
	lo, hi := uint64(1), min(most, p[0])
	for lo < hi {
		mid := lo + (hi-lo+1)/2
		if admits(mid) {
			lo = mid
		} else {
			hi = mid - 1
		}
	}
	return lo
}

// -- token bucket and leaky bucket: GCRA in ticks -----------------------------

// gcraState is the TAT (whole microseconds and ticks of 1/rc us) and the
// rate it is kept at.
type gcraState struct{ tatUs, tatFrac, rc, rms uint64 }

func (g *gcraState) tatTicks() u128 { return mul64(g.tatUs, g.rc).add(u128of(g.tatFrac)) }

func (g *gcraState) ownDeficit(now uint64) u128 { return g.tatTicks().sub(mul64(now, g.rc)) }

// deficit is the time still to refill, in ticks of the parameters' rate (a
// state kept at another rate converted, its fractional token rounded up).
func (g *gcraState) deficit(rc, rms, now uint64) u128 {
	old := g.ownDeficit(now)
	oldPeriod := g.rms * 1000
	newPeriod := rms * 1000
	d := old
	if oldPeriod != newPeriod {
		whole, frac := old.divmod(oldPeriod)
		d = whole.mul(newPeriod).add(mul64(frac, newPeriod).ceilDiv(oldPeriod))
	}
	return minU128(d, mul64(maxSpanMs, rc*1000))
}

func (g *gcraState) setTat(rc, rms uint64, tatTicks u128) {
	q, r := tatTicks.divmod(rc)
	g.tatUs = q.u64()
	g.tatFrac = r
	g.rc = rc
	g.rms = rms
}

// gcra is one GCRA step: the decision and the ticks ahead of the request
// (the deficit before it); it stores the new TAT on an admission when
// commit.
func (g *gcraState) gcra(p [3]uint64, cost, now uint64, commit bool) (answer, u128) {
	capacity, rc, rms := p[0], p[1], p[2]
	period := rms * 1000
	tau := mul64(capacity, period)
	ticksPerMs := rc * 1000
	deficit := g.deficit(rc, rms, now)
	need := mul64(cost, period)
	remainingFor := func(x u128) uint64 { return tau.sub(x).div(period).u64() }

	if cost > 0 {
		if after := deficit.add(need); after.cmp(tau) <= 0 {
			if commit {
				g.setTat(rc, rms, mul64(now, rc).add(after))
			}
			return answer{allowed: true, limit: capacity, remaining: remainingFor(after),
				resetMs: after.ceilDiv(ticksPerMs).u64()}, deficit
		}
	}
	var shortMs, resetMs uint64
	if g.rc == rc && g.rms == rms {
		shortMs = deficit.add(need).sub(tau).ceilDiv(ticksPerMs).u64()
		resetMs = deficit.ceilDiv(ticksPerMs).u64()
	} else {
		// A state kept at another rate keeps draining at it until an
		// admission stores it at the new one.
		own := g.ownDeficit(now)
		ownPerMs := g.rc * 1000
		var room uint64
		if capacity > cost {
			room = capacity - cost
		}
		fits := mul64(room, g.rms*1000)
		shortMs = min(own.sub(fits).ceilDiv(ownPerMs).u64(), maxSpanMs)
		resetMs = min(own.ceilDiv(ownPerMs).u64(), maxSpanMs)
	}
	var wait int64
	switch {
	case cost == 0:
	case need.cmp(tau) > 0:
		wait = -1
	default:
		wait = int64(shortMs)
	}
	return answer{allowed: cost == 0, limit: capacity, remaining: remainingFor(deficit), wait: wait, resetMs: resetMs}, deficit
}

// gcraForce is COST n FORCE: a denied request's units are taken anyway,
// the deficit growing up to twice tau and no further.
func (g *gcraState) gcraForce(p [3]uint64, cost, now uint64) (answer, u128, bool) {
	a, ahead := g.gcra(p, cost, now, true)
	if a.allowed || cost == 0 {
		return a, ahead, a.allowed && cost > 0
	}
	capacity, rc, rms := p[0], p[1], p[2]
	deficit := g.deficit(rc, rms, now)
	debtCap := minU128(mul64(capacity, rms*1000).mul(2), mul64(maxSpanMs, rc*1000))
	after := minU128(deficit.add(mul64(cost, rms*1000)), debtCap)
	if after.cmp(deficit) <= 0 {
		return a, ahead, false
	}
	g.setTat(rc, rms, mul64(now, rc).add(after))
	return a, ahead, true
}

// refund: the deficit shrinks by units tokens' time, to zero at most.
func (g *gcraState) refund(p [3]uint64, units, now uint64) bool {
	rc, rms := p[1], p[2]
	deficit := g.deficit(rc, rms, now)
	if deficit.isZero() || units == 0 {
		return false
	}
	after := deficit.sub(mul64(units, rms*1000))
	g.setTat(rc, rms, mul64(now, rc).add(after))
	return true
}

// shaped: an admitted request of the leaky bucket's queue learns when its
// turn comes.
func shaped(a answer, ahead u128, p [3]uint64) answer {
	if a.allowed {
		a.wait = int64(min(ahead.ceilDiv(p[1]*1000).u64(), maxSpanMs))
	}
	return a
}

// -- fixed window and quota: a count in a window ------------------------------

// countState is a count and its window: the last admitted instant (fixed
// window) or the end of the period it counts in (quota), in microseconds.
type countState struct{ atUs, count uint64 }

func windowEndUs(windowMs, tUs uint64) uint64 {
	w := windowMs * 1000
	return tUs - tUs%w + w
}

func ceilDivU(a, b uint64) uint64 { return a/b + boolU64(a%b != 0) }

func subSat(a, b uint64) uint64 {
	if a < b {
		return 0
	}
	return a - b
}

func (c *countState) fixedCurrent(p [3]uint64, now uint64) (mark, count uint64) {
	nowEff := max(now, c.atUs)
	if windowEndUs(p[1], c.atUs) == windowEndUs(p[1], nowEff) {
		return nowEff, c.count
	}
	return nowEff, 0
}

func (c *countState) quotaCurrent(p [3]uint64, now uint64) (end, count uint64) {
	if now < c.atUs {
		return c.atUs, c.count
	}
	e := min(p[2], maxTimeUs)
	if e <= now {
		e = utcPeriodEnd(Period(p[1]), now)
	}
	return max(e, now+1), 0
}

func (c *countState) fixedApply(p [3]uint64, cost, now uint64, commit bool) answer {
	nowEff, count := c.fixedCurrent(p, now)
	return c.countApply(p[0], count, nowEff, windowEndUs(p[1], nowEff), 0, cost, now, commit)
}

func (c *countState) quotaApply(p [3]uint64, cost, now uint64, commit bool) answer {
	endUs, count := c.quotaCurrent(p, now)
	// A quota's denial always says to wait at least 1 ms.
	return c.countApply(p[0], count, endUs, endUs, 1, cost, now, commit)
}

// countApply decides cost on a count of limit that ends at endUs, the same
// for the fixed window and the quota: admitted, the count is stored with
// mark (the window's start or the period's end); denied, the wait is the
// time to endUs (at least minWaitMs), -1 when cost is above the limit.
func (c *countState) countApply(limit, count, mark, endUs, minWaitMs, cost, now uint64, commit bool) answer {
	toEndMs := ceilDivU(endUs-min(now, endUs), 1000)
	remaining := subSat(limit, count)
	if cost > 0 && cost <= remaining {
		if commit {
			c.atUs = mark
			c.count = count + cost
		}
		return answer{allowed: true, limit: limit, remaining: remaining - cost, resetMs: toEndMs}
	}
	a := answer{allowed: cost == 0, limit: limit, remaining: remaining}
	switch {
	case cost == 0:
	case cost > limit:
		a.wait = -1
	default:
		a.wait = int64(max(toEndMs, minWaitMs))
	}
	if count != 0 {
		a.resetMs = toEndMs
	}
	return a
}

// force is COST n FORCE on a count, the same for the fixed window and the
// quota: answered as unforced, at most a limit of debt.
func (c *countState) force(quota bool, p [3]uint64, cost, now uint64) (answer, bool) {
	var a answer
	var mark, count uint64
	if quota {
		a = c.quotaApply(p, cost, now, true)
	} else {
		a = c.fixedApply(p, cost, now, true)
	}
	if a.allowed || cost == 0 {
		return a, a.allowed && cost > 0
	}
	if quota {
		mark, count = c.quotaCurrent(p, now)
	} else {
		mark, count = c.fixedCurrent(p, now)
	}
	sum := count + cost
	if sum < count {
		sum = maxU64
	}
	forced := min(sum, 2*p[0])
	if forced <= count {
		return a, false
	}
	c.atUs = mark
	c.count = forced
	return a, true
}

// -- sliding log ---------------------------------------------------------------

// slidingLog is the exact sliding log: one entry per millisecond that
// admitted something, oldest first, as its millisecond and the running
// count of units admitted through it (base: the running count before the
// oldest). Entries are ms[head:] and running[head:]; the running counts
// wrap around harmlessly (only their differences are read).
type slidingLog struct {
	ms, running []uint64
	head        int
	base        uint64
}

func (l *slidingLog) size() int { return len(l.ms) - l.head }

func (l *slidingLog) held() uint64 {
	if l.size() == 0 {
		return 0
	}
	return l.running[len(l.running)-1] - l.base
}

func (l *slidingLog) unitsThrough(i int) uint64 { return l.running[l.head+i] - l.base }

// firstLive is the oldest entry still in the window: (ms + windowMs) x
// 1000 > now.
func (l *slidingLog) firstLive(windowMs, now uint64) int {
	lo, hi := 0, l.size()
	for lo < hi {
		mid := int(uint(lo+hi) >> 1)
		if (l.ms[l.head+mid]+windowMs)*1000 > now {
			hi = mid
		} else {
			lo = mid + 1
		}
	}
	return lo
}

func (l *slidingLog) liveUnits(first int) uint64 {
	if first > 0 {
		return l.held() - l.unitsThrough(first-1)
	}
	return l.held()
}

func (l *slidingLog) stamp(now uint64) uint64 {
	s := ceilDivU(now, 1000)
	if l.size() > 0 {
		s = max(s, l.ms[len(l.ms)-1])
	}
	return s
}

func (l *slidingLog) expire(first int) {
	if first <= 0 {
		return
	}
	l.base = l.running[l.head+first-1]
	l.head += first
	if l.head == len(l.ms) {
		l.ms, l.running, l.head = l.ms[:0], l.running[:0], 0
	} else if l.head >= 64 && l.head*2 >= len(l.ms) {
		n := copy(l.ms, l.ms[l.head:])
		copy(l.running, l.running[l.head:])
		l.ms, l.running, l.head = l.ms[:n], l.running[:n], 0
	}
}

func (l *slidingLog) push(ms, cost uint64) {
	if n := len(l.ms); l.size() > 0 && l.ms[n-1] == ms {
		l.running[n-1] += cost
		return
	}
	prev := l.base
	if l.size() > 0 {
		prev = l.running[len(l.running)-1]
	}
	l.ms = append(l.ms, ms)
	l.running = append(l.running, prev+cost)
}

func (l *slidingLog) popNewest(units uint64) {
	for units > 0 && l.size() > 0 {
		last := len(l.running) - 1
		below := l.base
		if last > l.head {
			below = l.running[last-1]
		}
		inLast := l.running[last] - below
		back := min(units, inLast)
		units -= back
		if back == inLast {
			l.ms, l.running = l.ms[:last], l.running[:last]
		} else {
			l.running[last] -= back
		}
	}
	if l.size() == 0 {
		l.ms, l.running, l.head = l.ms[:0], l.running[:0], 0
	}
}

func (l *slidingLog) evaluate(p [3]uint64, cost, now uint64) (answer, int) {
	limit, windowMs := p[0], p[1]
	nowMsCeil := ceilDivU(now, 1000)
	leavesAfter := func(ms uint64) uint64 { return ceilDivU(subSat((ms+windowMs)*1000, now), 1000) }
	resetAfter := func(ms uint64) uint64 {
		if ms == nowMsCeil {
			return windowMs
		}
		return leavesAfter(ms)
	}
	first := l.firstLive(windowMs, now)
	var before uint64
	if first > 0 {
		before = l.unitsThrough(first - 1)
	}
	held := l.held() - before
	remaining := subSat(limit, held)
	if cost > 0 && cost <= remaining {
		return answer{allowed: true, limit: limit, remaining: remaining - cost, resetMs: resetAfter(l.stamp(now))}, first
	}
	var resetMs uint64
	if l.size() > 0 && held > 0 {
		resetMs = resetAfter(l.ms[len(l.ms)-1])
	}
	var wait int64
	switch {
	case cost == 0:
	case cost > limit:
		wait = -1
	default:
		excess := held + cost - limit
		lo, hi := first, l.size()
		for lo < hi {
			mid := int(uint(lo+hi) >> 1)
			if l.unitsThrough(mid)-before >= excess {
				hi = mid
			} else {
				lo = mid + 1
			}
		}
		w := uint64(0)
		if lo < l.size() {
			w = leavesAfter(l.ms[l.head+lo])
		}
		wait = int64(w)
		resetMs = max(resetMs, w)
	}
	return answer{allowed: cost == 0, limit: limit, remaining: remaining, wait: wait, resetMs: resetMs}, first
}

func (l *slidingLog) force(p [3]uint64, cost, now uint64) (answer, bool) {
	a, first := l.evaluate(p, cost, now)
	if a.allowed || cost == 0 {
		changed := a.allowed && cost > 0
		if changed {
			l.expire(first)
			l.push(l.stamp(now), cost)
		}
		return a, changed
	}
	held := l.liveUnits(first)
	limitCap := min(2*p[0], maxSlidingLimit)
	take := min(cost, subSat(limitCap, held))
	if take == 0 {
		return a, false
	}
	l.expire(first)
	l.push(l.stamp(now), take)
	return a, true
}

func (l *slidingLog) refund(p [3]uint64, units, now uint64) bool {
	first := l.firstLive(p[1], now)
	back := min(units, l.liveUnits(first))
	if back == 0 {
		return false
	}
	l.expire(first)
	l.popNewest(back)
	return true
}

// -- hash window ---------------------------------------------------------------

// hashRing is the hash window's ring of n counters (one more than a
// window's buckets), kept sparse: the buckets that hold units, ascending
// (bucket[head:], count[head:]), all in (newest - n, newest]; newest is the
// newest bucket's index (Unix ms / bucketMs) and total the units held.
type hashRing struct {
	bucketMs, n, newest, total uint64
	bucket, count              []uint64
	head                       int
}

func idleRing(p [3]uint64, now uint64) hashRing {
	return hashRing{bucketMs: p[2], n: p[1]/p[2] + 1, newest: now / 1000 / p[2]}
}

func (r *hashRing) sameLayout(p [3]uint64) bool {
	return r.bucketMs == p[2] && r.n == p[1]/p[2]+1
}

// heldAt is the units of the buckets still in the window when current is
// the newest.
func (r *hashRing) heldAt(current uint64) uint64 {
	if current >= r.newest+r.n {
		return 0
	}
	held := r.total
	for i := r.head; i < len(r.bucket) && r.bucket[i]+r.n <= current; i++ {
		held -= r.count[i]
	}
	return held
}

func (r *hashRing) advance(current uint64) {
	if current >= r.newest+r.n {
		r.bucket, r.count, r.head, r.total = r.bucket[:0], r.count[:0], 0, 0
	} else {
		for r.head < len(r.bucket) && r.bucket[r.head]+r.n <= current {
			r.total -= r.count[r.head]
			r.head++
		}
		if r.head == len(r.bucket) {
			r.bucket, r.count, r.head = r.bucket[:0], r.count[:0], 0
		} else if r.head >= 64 && r.head*2 >= len(r.bucket) {
			n := copy(r.bucket, r.bucket[r.head:])
			copy(r.count, r.count[r.head:])
			r.bucket, r.count, r.head = r.bucket[:n], r.count[:n], 0
		}
	}
	r.newest = max(r.newest, current)
}

// add puts units in bucket, which is at least every bucket held.
func (r *hashRing) add(bucket, units uint64) {
	if units == 0 {
		return
	}
	if n := len(r.bucket); n > r.head && r.bucket[n-1] == bucket {
		r.count[n-1] += units
	} else {
		r.bucket = append(r.bucket, bucket)
		r.count = append(r.count, units)
	}
	r.total += units
}

// converted is the same units in the ring of other parameters: each old
// bucket's units in the new bucket holding its last millisecond, if still
// live.
func (r *hashRing) converted(p [3]uint64, now uint64) hashRing {
	fresh := idleRing(p, now)
	bucketMs := p[2]
	oldestLive := subSat(fresh.newest+1, fresh.n)
	for i := r.head; i < len(r.bucket); i++ {
		units := r.count[i]
		if units == 0 {
			continue
		}
		target := ((r.bucket[i]+1)*r.bucketMs - 1) / bucketMs
		if target < oldestLive {
			continue
		}
		if target > fresh.newest {
			fresh.advance(target)
		}
		fresh.add(target, units)
	}
	return fresh
}

func (r *hashRing) evaluate(p [3]uint64, cost, now uint64) (answer, uint64) {
	limit, bucketMs := p[0], p[2]
	n := r.n
	bucketUs := bucketMs * 1000
	current := max(now/bucketUs, r.newest)
	held := r.heldAt(current)
	leavesAfter := func(bucket uint64) uint64 { return ceilDivU(subSat((bucket+n)*bucketUs, now), 1000) }
	remaining := subSat(limit, held)
	if cost > 0 && cost <= remaining {
		return answer{allowed: true, limit: limit, remaining: remaining - cost, resetMs: leavesAfter(current)}, current
	}
	var wait int64
	switch {
	case cost == 0:
	case cost > limit:
		wait = -1
	default:
		excess := held + cost - limit
		var freed uint64
		bucket := r.newest + 1
		for i := r.head; i < len(r.bucket); i++ {
			if r.bucket[i]+n <= current {
				continue
			}
			freed += r.count[i]
			if freed >= excess {
				bucket = r.bucket[i]
				break
			}
		}
		wait = int64(leavesAfter(bucket))
	}
	var resetMs uint64
	if held != 0 {
		resetMs = leavesAfter(r.newest)
	}
	return answer{allowed: cost == 0, limit: limit, remaining: remaining, wait: wait, resetMs: resetMs}, current
}

func (r *hashRing) take(current, units uint64) {
	r.advance(current)
	r.add(current, units)
}

func (r *hashRing) apply(p [3]uint64, cost, now uint64) answer {
	a, current := r.evaluate(p, cost, now)
	if a.allowed && cost > 0 {
		r.take(current, cost)
	}
	return a
}

func (r *hashRing) force(p [3]uint64, cost, now uint64) (answer, bool) {
	a, current := r.evaluate(p, cost, now)
	if cost == 0 {
		return a, false
	}
	take := cost
	if !a.allowed {
		take = min(cost, subSat(2*p[0], r.heldAt(current)))
	}
	if take == 0 {
		return a, false
	}
	r.take(current, take)
	return a, true
}

func (r *hashRing) refund(p [3]uint64, units, now uint64) bool {
	current := max(now/(p[2]*1000), r.newest)
	left := min(units, r.heldAt(current))
	if left == 0 {
		return false
	}
	r.advance(current)
	for i := len(r.bucket) - 1; i >= r.head && left > 0; i-- {
		back := min(left, r.count[i])
		r.count[i] -= back
		r.total -= back
		left -= back
	}
	// Drop the emptied buckets at the newest end.
	for len(r.bucket) > r.head && r.count[len(r.count)-1] == 0 {
		r.bucket, r.count = r.bucket[:len(r.bucket)-1], r.count[:len(r.count)-1]
	}
	return true
}

package ratelimit

import (
	"sort"
	"sync"
	"time"
)

// localLimit is one in-process limiter of a decision: its map key and its
// spec (at the instance's share).
type localLimit struct {
	key  mapKey
	spec Spec
}

type localEntry struct {
	state LocalState
	// idleAtUs is when the limiter is idle again (dropped first when the
	// map is full).
	idleAtUs int64
	// owed is the units the fallback admitted from this account without a
	// call to Redis (the breaker open, an error reply): Redis never counted
	// them.
	owed uint64
}

// localLimiters is a bounded map of in-process limiters, on the core's
// integer algorithms (LocalApply): the local level in front of Redis, and
// the instance's accounts that the local-only fallback decides against.
// Idle limiters are dropped first, then the ones idle soonest, a tenth of
// the cap at a time.
type localLimiters struct {
	mu     sync.Mutex
	m      map[mapKey]*localEntry
	cap    int
	owing  int // entries with owed > 0
	nowFor func() int64
}

func newLocalLimiters(capacity int) *localLimiters {
	return &localLimiters{m: make(map[mapKey]*localEntry), cap: max1(capacity), nowFor: nowMicros}
}

// nowMicros is the wall clock in microseconds, as the core counts it.
func nowMicros() int64 { return time.Now().UnixMicro() }

func (l *localLimiters) entry(lim localLimit) *localEntry {
	e := l.m[lim.key]
	if e == nil {
		e = &localEntry{}
		l.m[lim.key] = e
	}
	return e
}

func (l *localLimiters) step(lim localLimit, req Request, now int64) Decision {
	e := l.entry(lim)
	d := LocalApply(lim.spec, &e.state, now, req)
	e.idleAtUs = now + d.ResetAfter.Microseconds()
	return d
}

// takeAll is all or nothing over limits at nowUs: if every one admits cost,
// takes it from each and answers their decisions appended to out, in order,
// with -1; otherwise takes
// nothing and answers the position and decision of the first that denied.
func (l *localLimiters) takeAll(limits []localLimit, cost uint64, now int64, out []Decision) ([]Decision, int, Decision) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.makeRoom(len(limits), now)
	if len(limits) == 1 {
		// LocalApply changes nothing on a denial.
		d := l.step(limits[0], Cost(cost), now)
		if !d.Allowed {
			return nil, 0, d
		}
		return append(out, d), -1, Decision{}
	}
	for i, lim := range limits {
		var st *LocalState
		if e := l.m[lim.key]; e != nil {
			st = &e.state
		}
		if d := LocalPeek(lim.spec, st, now, cost); !d.Allowed {
			return nil, i, d
		}
	}
	for _, lim := range limits {
		out = append(out, l.step(lim, Cost(cost), now))
	}
	return out, -1, Decision{}
}

// chargeAll charges cost to every one of limits, admitted or not (COST n
// FORCE: an account may go into debt): units Redis admitted for this
// instance, or may have (a call whose answer was lost).
func (l *localLimiters) chargeAll(limits []localLimit, cost uint64) {
	if len(limits) == 0 || cost == 0 {
		return
	}
	now := l.nowFor()
	l.mu.Lock()
	defer l.mu.Unlock()
	l.makeRoom(len(limits), now)
	for _, lim := range limits {
		l.step(lim, Force(cost), now)
	}
}

// refundAll gives back what takeAll took (Redis denied the request).
func (l *localLimiters) refundAll(limits []localLimit, cost uint64) {
	if len(limits) == 0 || cost == 0 {
		return
	}
	now := l.nowFor()
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, lim := range limits {
		if _, ok := l.m[lim.key]; ok {
			l.step(lim, Refund(cost), now)
		}
	}
}

// oweAll records that the fallback admitted cost from each of limits (just
// taken) without a call to Redis.
func (l *localLimiters) oweAll(limits []localLimit, cost uint64) {
	if len(limits) == 0 || cost == 0 {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, lim := range limits {
		if e := l.m[lim.key]; e != nil {
			if e.owed == 0 {
				l.owing++
			}
			e.owed += cost
		}
	}
}

// takeOwed is the units each of limits owes Redis, which the caller now
// sends; the debts are cleared.
func (l *localLimiters) takeOwed(limits []localLimit) []uint64 {
	out := make([]uint64, len(limits))
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.owing == 0 {
		return out
	}
	for i, lim := range limits {
		if e := l.m[lim.key]; e != nil && e.owed > 0 {
			out[i], e.owed = e.owed, 0
			l.owing--
		}
	}
	return out
}

// makeRoom drops idle limiters, then the ones idle soonest, when adding n
// would pass the cap (their debts are forgotten: the bound on memory comes
// first).
func (l *localLimiters) makeRoom(n int, now int64) {
	if len(l.m)+n <= l.cap {
		return
	}
	keep := max(l.cap-l.cap/10-n, 0)
	for k, e := range l.m {
		if e.idleAtUs <= now {
			l.drop(k, e)
		}
	}
	if len(l.m) <= keep {
		return
	}
	type idle struct {
		at  int64
		key mapKey
	}
	byIdle := make([]idle, 0, len(l.m))
	for k, e := range l.m {
		byIdle = append(byIdle, idle{e.idleAtUs, k})
	}
	sort.Slice(byIdle, func(i, j int) bool { return byIdle[i].at < byIdle[j].at })
	for _, x := range byIdle[:len(l.m)-keep] {
		l.drop(x.key, l.m[x.key])
	}
}

func (l *localLimiters) drop(key mapKey, e *localEntry) {
	if e.owed > 0 {
		l.owing--
	}
	delete(l.m, key)
}

// size is the number of limiters held (for tests of the bound).
func (l *localLimiters) size() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.m)
}

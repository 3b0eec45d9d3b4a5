package ratelimit

import (
	"fmt"
	"sync"
	"sync/atomic"
	"time"
)

// FallbackMode is what decides a request when Redis errors, misses its
// deadline, or the breaker is open.
type FallbackMode int

const (
	// LocalOnly decides every rule in process against this instance's
	// account at its share of the limit, s = ceil(limit / instances * 1.1):
	// the middle ground, and the default. The account is charged with every
	// unit Redis admitted for this instance and every unit of a call whose
	// answer was lost, so the fallback admits only what Redis cannot already
	// have counted for this instance: one instance admits at most limit per
	// window of a key, N instances at most limit + (N - 1) * s. What it
	// admitted without a call is sent to Redis (COST n FORCE) before the
	// key's next call.
	LocalOnly FallbackMode = iota
	// FailOpen admits: availability over protection. No bound on what is
	// admitted while it decides.
	FailOpen
	// FailClosed denies, with a retry after the breaker's OpenFor:
	// protection over availability (logins, paid APIs).
	FailClosed
)

// String is the mode's name.
func (m FallbackMode) String() string {
	switch m {
	case LocalOnly:
		return "LocalOnly"
	case FailOpen:
		return "FailOpen"
	case FailClosed:
		return "FailClosed"
	}
	return fmt.Sprintf("FallbackMode(%d)", int(m))
}

// BreakerConfig says when the breaker opens and how long it stays open
// before one PING probes Redis.
type BreakerConfig struct {
	// Failures is the number of consecutive failures (timeouts, lost
	// connections) that open it (5 when 0).
	Failures int
	// OpenFor is how long it stays open before a probe (1 s when 0).
	OpenFor time.Duration
}

// DefaultBreaker is the breaker of the other kits: 5 failures, open 1 s.
var DefaultBreaker = BreakerConfig{Failures: 5, OpenFor: time.Second}

func (c BreakerConfig) normalized() BreakerConfig {
	if c.Failures <= 0 {
		c.Failures = DefaultBreaker.Failures
	}
	if c.OpenFor <= 0 {
		c.OpenFor = DefaultBreaker.OpenFor
	}
	return c
}

// rbGate is what the breaker lets a request do.
type rbGate int

const (
	rbCall  rbGate = iota // call Redis
	rbSkip                // open: the fallback decides, no call
	rbProbe               // open long enough: this request starts the probe
)

type rbState int

const (
	rbClosed rbState = iota
	rbOpen
	rbHalfOpen
)

// breaker spares a dead Redis a deadline per request: after Failures
// consecutive failures it opens, every request is decided by the fallback
// without a call, and after OpenFor one PING probes; its answer closes it.
type redisBreaker struct {
	config   BreakerConfig
	mu       sync.Mutex
	state    rbState
	failures int
	until    time.Time
	// open mirrors state != rbClosed, read without the lock on the hot
	// path.
	open atomic.Bool
}

func newRedisBreaker(c BreakerConfig) *redisBreaker { return &redisBreaker{config: c.normalized()} }

func (b *redisBreaker) gate() rbGate {
	if !b.open.Load() {
		return rbCall
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	switch b.state {
	case rbClosed:
		return rbCall
	case rbOpen:
		if !time.Now().Before(b.until) {
			b.state = rbHalfOpen
			return rbProbe
		}
	}
	return rbSkip
}

// success: a call answered; the count of consecutive failures starts
// again. A call sent before the breaker opened that answers late does not
// close it: only the probe does.
func (b *redisBreaker) success() {
	if b.open.Load() {
		return
	}
	b.mu.Lock()
	if b.state == rbClosed {
		b.failures = 0
	}
	b.mu.Unlock()
}

// probeSucceeded closes the breaker.
func (b *redisBreaker) probeSucceeded() {
	b.mu.Lock()
	b.state, b.failures = rbClosed, 0
	b.open.Store(false)
	b.mu.Unlock()
}

// failure records a failure of Redis; true when it opened the breaker.
func (b *redisBreaker) failure() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	switch b.state {
	case rbClosed:
		b.failures++
		if b.failures >= b.config.Failures {
			b.state, b.until = rbOpen, time.Now().Add(b.config.OpenFor)
			b.open.Store(true)
			return true
		}
	case rbHalfOpen:
		b.state, b.until = rbOpen, time.Now().Add(b.config.OpenFor)
	}
	return false
}

func (b *redisBreaker) isOpen() bool { return b.open.Load() }

// Stats is a reading of the counters of every path a decision can take
// (Limiter.Stats), for the application to read and export.
type Stats struct {
	// RedisCalls is the limiter calls sent to Redis (probes and owed units
	// excluded).
	RedisCalls uint64
	// RedisAdmitted and RedisDenied are those answered admitted and denied.
	RedisAdmitted, RedisDenied uint64
	// RedisErrors is those answered with a server error (e.g. WRONGTYPE).
	RedisErrors uint64
	// RedisTimeouts is those not answered within the deadline.
	RedisTimeouts uint64
	// RedisUnavailable is those that failed on the connection.
	RedisUnavailable uint64
	// LocalAdmitted and LocalDenied are the local level's decisions of global
	// rules: taken from the share before the call, or denied without one.
	LocalAdmitted, LocalDenied uint64
	// DenyCacheHits is the requests denied by the deny cache, without a
	// round trip.
	DenyCacheHits uint64
	// FallbackAdmitted and FallbackDenied are the fallback's decisions.
	FallbackAdmitted, FallbackDenied uint64
	// OwedSent is the COST n FORCE calls sent for units the fallback
	// admitted without a call (LocalOnly), before the key's next call.
	OwedSent uint64
	// BreakerSkipped is the requests decided by the fallback because the
	// breaker was open (no call).
	BreakerSkipped uint64
	// BreakerOpened is the times the breaker opened.
	BreakerOpened uint64
	// Probes and ProbesOK are the probes sent while it was open, and those
	// answered (the breaker closed).
	Probes, ProbesOK uint64
	// GrantAdmitted and GrantDenied are batched rules' requests decided in
	// process from held units.
	GrantAdmitted, GrantDenied uint64
	// GrantAsks is batched rules' UPTO calls (also in RedisCalls); GrantUnits
	// the units granted.
	GrantAsks, GrantUnits uint64
	// GrantRefunds and GrantRefundedUnits are the REFUND calls of held units
	// and their units.
	GrantRefunds, GrantRefundedUnits uint64
	// StripeSpills is the striped rules' requests that the own stripe denied
	// and the next one was asked.
	StripeSpills uint64
	// Leases is the leases granted by Redis (Limiter.Lease, Limiter.Acquire).
	Leases uint64
	// LeasesLost is the leases whose renewal found them already ended.
	LeasesLost uint64
}

// counters are the live counters behind Stats.
type counters struct {
	redisCalls, redisAdmitted, redisDenied, redisErrors, redisTimeouts, redisUnavailable  atomic.Uint64
	localAdmitted, localDenied, denyCacheHits, fallbackAdmitted, fallbackDenied, owedSent atomic.Uint64
	breakerSkipped, breakerOpened, probes, probesOK                                       atomic.Uint64
	grantAdmitted, grantDenied, grantAsks, grantUnits, grantRefunds, grantRefundedUnits   atomic.Uint64
	stripeSpills, leases, leasesLost                                                      atomic.Uint64
}

func (c *counters) snapshot() Stats {
	return Stats{
		RedisCalls: c.redisCalls.Load(), RedisAdmitted: c.redisAdmitted.Load(), RedisDenied: c.redisDenied.Load(),
		RedisErrors: c.redisErrors.Load(), RedisTimeouts: c.redisTimeouts.Load(), RedisUnavailable: c.redisUnavailable.Load(),
		LocalAdmitted: c.localAdmitted.Load(), LocalDenied: c.localDenied.Load(), DenyCacheHits: c.denyCacheHits.Load(),
		FallbackAdmitted: c.fallbackAdmitted.Load(), FallbackDenied: c.fallbackDenied.Load(), OwedSent: c.owedSent.Load(),
		BreakerSkipped: c.breakerSkipped.Load(), BreakerOpened: c.breakerOpened.Load(),
		Probes: c.probes.Load(), ProbesOK: c.probesOK.Load(),
		GrantAdmitted: c.grantAdmitted.Load(), GrantDenied: c.grantDenied.Load(), GrantAsks: c.grantAsks.Load(),
		GrantUnits: c.grantUnits.Load(), GrantRefunds: c.grantRefunds.Load(), GrantRefundedUnits: c.grantRefundedUnits.Load(),
		StripeSpills: c.stripeSpills.Load(), Leases: c.leases.Load(), LeasesLost: c.leasesLost.Load(),
	}
}

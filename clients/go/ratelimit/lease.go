package ratelimit

import (
	"context"
	"errors"
	"sync"
	"time"
)

// UpkeepDeadline is the deadline of a lease's renewal or release: neither is
// on a request's path, and a lost one is covered by the lease's expiry.
const UpkeepDeadline = time.Second

// Lease is a unit of a CONCURRENCY rule held for the length of some work:
// renewed in the background (RL.RENEW every lease_ms / 3) so that work
// longer than lease_ms keeps its unit, and released by Release. A process
// that dies holding one frees it after lease_ms. A lease whose renewal
// finds it already ended (the process was paused past lease_ms) is lost:
// Lost's channel closes and Err answers ErrLeaseLost. A Lease with ID 0
// holds nothing: the fallback admitted without Redis, or a policy that is
// OFF admitted without a lease.
type Lease struct {
	client   *Client
	key      string
	id       uint64
	leaseMs  int64
	decision Decision
	stats    *counters

	once    sync.Once
	stop    chan struct{}
	done    chan struct{}
	lost    chan struct{}
	mu      sync.Mutex
	err     error
	release sync.Once
}

// ErrLeaseLost is what Lease.Err answers once a renewal found the lease
// already ended: its unit may now be someone else's.
var ErrLeaseLost = errors.New("ratelimit: the lease had ended before its renewal")

func startLease(c *Client, key string, d Decision, leaseMs int64, st *counters) *Lease {
	g := &Lease{client: c, key: key, id: d.Lease, leaseMs: leaseMs, decision: d, stats: st,
		stop: make(chan struct{}), done: make(chan struct{}), lost: make(chan struct{})}
	if g.id == 0 || c == nil || leaseMs <= 0 {
		close(g.done)
		return g
	}
	go g.renew()
	return g
}

// ID is the lease's id (0: the lease holds nothing).
func (g *Lease) ID() uint64 {
	if g == nil {
		return 0
	}
	return g.id
}

// Key is the limiter key the lease is on.
func (g *Lease) Key() string {
	if g == nil {
		return ""
	}
	return g.key
}

// Decision is the admission that granted the lease (Remaining units free
// then; Path PathFallback when the fallback admitted without a lease).
func (g *Lease) Decision() Decision {
	if g == nil {
		return Decision{}
	}
	return g.decision
}

// Lost is closed when a renewal finds the lease already ended.
func (g *Lease) Lost() <-chan struct{} {
	if g == nil || g.lost == nil {
		ch := make(chan struct{})
		close(ch)
		return ch
	}
	return g.lost
}

// Err is ErrLeaseLost once the lease was lost, else the last renewal's
// error (nil when it succeeded).
func (g *Lease) Err() error {
	if g == nil {
		return ErrLeaseLost
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.err
}

func (g *Lease) setErr(err error) {
	g.mu.Lock()
	g.err = err
	g.mu.Unlock()
}

// renew renews the lease every lease_ms / 3 until it is released or lost. A
// failed renewal (Redis unreachable) is tried again at the next tick.
func (g *Lease) renew() {
	defer close(g.done)
	every := time.Duration(max(g.leaseMs/3, 1)) * time.Millisecond
	deadline := min(max(every, g.client.Deadline()), UpkeepDeadline)
	c := g.client.WithDeadline(deadline)
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-g.stop:
			return
		case <-t.C:
		}
		ok, err := c.Renew(context.Background(), g.key, g.id, g.leaseMs)
		switch {
		case err != nil:
			g.setErr(err)
		case !ok:
			// Not while a release is in flight: the release took it.
			select {
			case <-g.stop:
				return
			default:
			}
			g.setErr(ErrLeaseLost)
			if g.stats != nil {
				g.stats.leasesLost.Add(1)
			}
			close(g.lost)
			return
		default:
			g.setErr(nil)
		}
	}
}

// Release stops the renewals and releases the lease now (RL.RELEASE,
// within UpkeepDeadline): whether it was still held. Not retried: a
// release that fails is covered by the expiry. Safe to call more than once
// (the later calls answer false) and on a lease that holds nothing.
func (g *Lease) Release(ctx context.Context) (bool, error) {
	if g == nil || g.stop == nil {
		// Nil, or a zero Lease (not made by the limiter): nothing held.
		return false, nil
	}
	g.once.Do(func() { close(g.stop) })
	<-g.done
	held, err := false, error(nil)
	released := false
	g.release.Do(func() {
		released = true
		if g.id == 0 || g.client == nil {
			return
		}
		if ctx == nil {
			ctx = context.Background()
		}
		held, err = g.client.WithDeadline(UpkeepDeadline).Release(ctx, g.key, g.id)
	})
	if !released {
		return false, nil
	}
	return held, err
}

// Lease takes one unit of a CONCURRENCY rule (inline ConcurrencySpec, or a
// policy the server has as CONCURRENCY) for identity, within the call's
// deadline, through the breaker, and renews it until Release. Denied by
// Redis, or by a FailClosed fallback, it is a *DeniedError carrying the
// decision. When Redis cannot answer, FailOpen and LocalOnly admit without a
// lease (a lease cannot be shared between instances): a *Lease with ID 0
// and Path PathFallback. A bad rule is an *InvalidArgumentError.
func (l *Limiter) Lease(ctx context.Context, rule Rule, identity string) (*Lease, error) {
	return l.lease(ctx, rule, identity, -1, Origin{})
}

// LeaseFrom is Lease for a request from origin: a denial's deny event
// carries the client's address and User-Agent (as CheckFrom's). The HTTP
// middleware's and the gRPC interceptors' in-flight caps take their units
// with it.
func (l *Limiter) LeaseFrom(ctx context.Context, rule Rule, identity string, origin Origin) (*Lease, error) {
	return l.lease(ctx, rule, identity, -1, origin)
}

// Acquire is Lease waiting up to wait for a unit to come free (RL.* BLOCK
// on a connection of the client's own, never a pooled one: the client's
// Acquire); wait 0 does not wait. For a rate rule (any other algorithm) it
// waits for cost 1 to be admitted and answers a *Lease with ID 0 carrying
// the decision. Denied when the wait ends, it is a *DeniedError. The call's
// deadline is the client's plus wait; ctx may end it sooner.
func (l *Limiter) Acquire(ctx context.Context, rule Rule, identity string, wait time.Duration) (*Lease, error) {
	if wait < 0 {
		wait = 0
	}
	return l.lease(ctx, rule, identity, wait, Origin{})
}

func (l *Limiter) lease(ctx context.Context, rule Rule, identity string, wait time.Duration, origin Origin) (*Lease, error) {
	if l == nil {
		return nil, &InvalidArgumentError{Arg: "limiter", Reason: "nil *Limiter"}
	}
	if l.client == nil || l.breaker == nil {
		return nil, &InvalidArgumentError{Arg: "client", Reason: "the limiter has no client (NewLimiter(nil), or a zero Limiter)"}
	}
	if err := rule.Validate(); err != nil {
		return nil, err
	}
	if rule.batch != nil || rule.Stripes() > 1 {
		return nil, rule.bad("batched", "a lease is held in Redis alone: no batch or stripes")
	}
	if ctx == nil {
		ctx = context.Background()
	}
	spec, ok := rule.spec, rule.inline
	if !ok {
		var err error
		spec, ok, err = l.leasePolicySpec(ctx, rule.policy)
		if err != nil {
			return nil, err
		}
		if !ok {
			return nil, rule.bad("policy", "no policy %q on the server (RL.POLICY SET it first)", rule.policy)
		}
	}
	concurrency := spec.Algorithm() == AlgorithmConcurrency
	if !concurrency && wait < 0 {
		return nil, rule.bad("algorithm", "a lease needs a CONCURRENCY rule (ConcurrencySpec, or a policy set as CONCURRENCY limit lease_ms)")
	}
	key := rule.Key(identity)
	var d Decision
	var answered bool
	switch l.breaker.gate() {
	case rbCall:
		l.stats.redisCalls.Add(1)
		var err error
		start := time.Now()
		d, err = l.timed(func() (Decision, error) {
			// The client's block 0 waits without a limit: no wait is the
			// plain call.
			switch {
			case wait > 0 && rule.inline:
				return l.client.Acquire(ctx, key, spec, Cost(1), wait)
			case wait > 0:
				return l.client.AcquireHit(ctx, rule.policy, key, Cost(1), wait)
			case rule.inline && concurrency:
				return l.client.Concurrency(ctx, key, spec.params[0], spec.params[1])
			case rule.inline:
				return l.client.Apply(ctx, key, spec, Cost(1))
			default:
				return l.client.Hit(ctx, rule.policy, key, Cost(1))
			}
		})
		if err == nil {
			l.breaker.success()
			answered = true
		} else {
			if ctx.Err() != nil {
				// The caller gave up: not Redis's failure.
				return nil, ctx.Err()
			}
			var se *ServerError
			if errors.As(err, &se) {
				l.stats.redisErrors.Add(1)
				return nil, err
			}
			l.failed(ctx, start, err)
		}
	case rbSkip:
		l.stats.breakerSkipped.Add(1)
	case rbProbe:
		l.stats.breakerSkipped.Add(1)
		l.probe()
	}
	name := rule.name
	if answered {
		d.Path, d.Rule = PathRedis, name
		if !d.Allowed {
			l.stats.redisDenied.Add(1)
			l.observeOne(rule, key, d, origin)
			return nil, &DeniedError{Decision: d}
		}
		l.stats.redisAdmitted.Add(1)
		l.observeOne(rule, key, d, origin)
		leaseMs := int64(0)
		if concurrency {
			leaseMs = spec.params[1]
			if d.Lease != 0 {
				l.stats.leases.Add(1)
			}
		} else {
			d.Lease = 0
		}
		return startLease(l.client, key, d, leaseMs, &l.stats), nil
	}
	limit := spec.params[0]
	d = Decision{Limit: limit, DeniedBy: -1, Granted: -1, Path: PathFallback, Rule: name}
	if l.cfg.fallback == FailClosed {
		l.stats.fallbackDenied.Add(1)
		wait := max(l.breaker.config.OpenFor.Milliseconds(), 1)
		d.WaitMs, d.RetryAfter, d.ResetAfter = wait, time.Duration(wait)*time.Millisecond, time.Duration(wait)*time.Millisecond
		l.observeOne(rule, key, d, origin)
		return nil, &DeniedError{Decision: d}
	}
	l.stats.fallbackAdmitted.Add(1)
	d.Allowed, d.Remaining = true, limit
	l.observeOne(rule, key, d, origin)
	return startLease(nil, key, d, 0, nil), nil
}

// observeOne counts one rule's decision and its deny event.
func (l *Limiter) observeOne(rule Rule, key string, d Decision, origin Origin) {
	m, ev := l.cfg.metrics, l.cfg.events
	if m == nil && ev == nil {
		return
	}
	label := rule.label()
	if d.Allowed {
		m.Decision(label, d.Path, "admitted")
	} else {
		m.Decision(label, d.Path, "denied")
		ev.Record(DenyEvent{Timestamp: time.Now(), Key: key, Rule: label, Level: d.Path.String(),
			Limit: d.Limit, Remaining: d.Remaining, RetryAfterMs: d.WaitMs,
			ClientIP: origin.ClientIP, UserAgent: origin.UserAgent})
	}
	if d.Path == PathRedis && d.Limit > 0 {
		m.RemainingRatio(label, float64(d.Remaining)/float64(d.Limit))
	}
}

// policyTTL is how long a lease keeps a policy's spec read from the server
// before it reads it again.
const policyTTL = time.Second

type policyRead struct {
	spec Spec
	at   time.Time
}

// leasePolicySpec is a policy's spec for a lease: read from the server
// (RL.POLICY GET) at most once per policyTTL, so a lease of a policy rule is
// one round trip.
func (l *Limiter) leasePolicySpec(ctx context.Context, name string) (Spec, bool, error) {
	if v, ok := l.policies.Load(name); ok {
		if r := v.(policyRead); time.Since(r.at) < policyTTL {
			return r.spec, true, nil
		}
	}
	spec, ok, err := l.policySpec(ctx, name)
	if err == nil && ok {
		l.policies.Store(name, policyRead{spec: spec, at: time.Now()})
	}
	return spec, ok, err
}

package ratelimit

import (
	"context"
	"errors"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// A Limiter decides requests against rule sets, on two levels: the deny
// cache, then the local level (a share of each global rule, in process),
// then one round trip to Redis within the call's deadline, and the fallback
// with its breaker when Redis cannot answer. Safe for concurrent use; make
// one per process and share it.
//
// Batched and striped rules (Rule.Batched, Rule.Striped) are decided first,
// mostly in process (Path PathGrant), then the set's other rules in one
// call; WithProtection ties the limiter to a protection loop.
type Limiter struct {
	client   *Client
	cfg      limiterConfig
	deny     *denyCache
	local    *localLimiters
	accounts *localLimiters
	breaker  *redisBreaker
	stats    counters
	grants   grantLevel

	probing atomic.Bool
	bg      bgGroup
	// policies caches the policies' specs that leases read (lease.go).
	policies sync.Map
}

// grantLevel is what grants.go implements for batched (Rule.Batched) and
// striped (Rule.Striped) rules.
//
// The hook: when a set has batched or striped rules, RuleSet asks the
// grantLevel that grantLevelFactory (set by grants.go in an init function)
// made for this limiter to prepare each of them, and Check decides those
// rules first through grantLevel.check, then the others in one call; a
// later denial calls the undo function each check returned. Without a
// factory, batched and striped rules are refused by RuleSet. The grants
// code reaches Redis through Limiter.gated (the breaker, the stats, the
// round-trip metric) and decides a failed call with Limiter.fallbackOne.
// The protection loop (protection.go) plugs in with an option that sets
// limiterConfig.protection (a protectionHook).
type grantLevel interface {
	// prepare is called once per batched or striped rule of a RuleSet, with
	// its checked spec; what it answers is handed back to check.
	prepare(ctx context.Context, r Rule, spec Spec) (any, error)
	// check decides cost units of the rule for key (Path PathGrant, or
	// PathRedis / PathFallback when it asked); undo, called when another
	// rule of the set denies, gives back what an admission took (nil:
	// nothing to give back).
	check(ctx context.Context, prepared any, key string, cost uint64) (d Decision, undo func())
	// close gives held units back (Limiter.Close).
	close(ctx context.Context) error
}

// grantLevelFactory makes a limiter's grants level; set by grants.go.
var grantLevelFactory func(l *Limiter) grantLevel

// protectionHook is what the protection loop gives the limiter.
type protectionHook interface {
	// recordDenied counts a denial of a policy rule answered without a call
	// (deny cache, local level), so its stages see it.
	recordDenied(policy string)
	// scale is the policy's scale in percent as last read (100: unscaled).
	scale(policy string) int
	// watchRules watches a new rule set's policies and binds the breakers
	// its rules name.
	watchRules(set *RuleSet)
}

type limiterConfig struct {
	denyCache    bool
	denyMax      time.Duration
	denyCap      int
	localLevel   bool
	instances    int64
	ratio        float64
	localCap     int
	fallback     FallbackMode
	breaker      BreakerConfig
	metrics      *Metrics
	events       *DenyEvents
	deadline     time.Duration
	protection   protectionHook
	breakerLabel string
}

// LimiterOption sets one of a Limiter's settings (NewLimiter).
type LimiterOption func(*limiterConfig)

// WithDenyCache turns the deny cache on or off (on by default).
func WithDenyCache(on bool) LimiterOption { return func(c *limiterConfig) { c.denyCache = on } }

// WithDenyCacheMax is the longest a denial is cached (1 s by default), so
// that a raised limit reaches users within it.
func WithDenyCacheMax(d time.Duration) LimiterOption {
	return func(c *limiterConfig) {
		if d > 0 {
			c.denyMax = d
		}
	}
}

// WithDenyCacheCapacity is the most denials cached at once (10,000 by
// default).
func WithDenyCacheCapacity(n int) LimiterOption {
	return func(c *limiterConfig) { c.denyCap = max1(n) }
}

// WithLocalLevel turns the local level on or off (on by default; it acts
// only on global rules).
func WithLocalLevel(on bool) LimiterOption { return func(c *limiterConfig) { c.localLevel = on } }

// WithInstances is the number of instances sharing each global limit: each
// takes ceil(total / instances * 1.1), at least 1, locally, and the
// local-only fallback's accounts are at the same share (default 1).
func WithInstances(n int) LimiterOption {
	return func(c *limiterConfig) { c.instances, c.ratio = int64(max1(n)), 0 }
}

// WithShare is another share of each global limit: ceil(total * ratio), at
// least 1 (ratio in (0, 1]; other values are ignored).
func WithShare(ratio float64) LimiterOption {
	return func(c *limiterConfig) {
		if ratio > 0 && ratio <= 1 {
			c.ratio = ratio
		}
	}
}

// WithLocalCapacity is the most in-process limiters held (100,000 by
// default), for the local level and for the accounts each.
func WithLocalCapacity(n int) LimiterOption { return func(c *limiterConfig) { c.localCap = max1(n) } }

// WithFallback is what decides when Redis cannot (LocalOnly by default).
func WithFallback(m FallbackMode) LimiterOption { return func(c *limiterConfig) { c.fallback = m } }

// WithBreaker is when the breaker opens and for how long (DefaultBreaker).
func WithBreaker(b BreakerConfig) LimiterOption {
	return func(c *limiterConfig) { c.breaker = b.normalized() }
}

// WithMetrics reports every decision (rule, level, outcome), every round
// trip, the remaining ratio and the breaker to m (nil: none).
func WithMetrics(m *Metrics) LimiterOption { return func(c *limiterConfig) { c.metrics = m } }

// WithDenyEvents records every denial, at every level, in e (nil: none).
// Deny events made without metrics (WithEventsMetrics) count their
// shipped, dropped and refused events in the limiter's (WithMetrics).
func WithDenyEvents(e *DenyEvents) LimiterOption { return func(c *limiterConfig) { c.events = e } }

// WithCallDeadline is the deadline of one call to Redis (the client's by
// default, DefaultDeadline). A call that misses it may still have been
// applied: its units are charged to the instance's account, and the
// fallback decides the request.
func WithCallDeadline(d time.Duration) LimiterOption {
	return func(c *limiterConfig) {
		if d > 0 {
			c.deadline = d
		}
	}
}

// NewLimiter is a limiter over c with the options' settings. A nil client
// gives a limiter whose every Check is decided by the fallback (and whose
// RuleSet is an error).
func NewLimiter(c *Client, opts ...LimiterOption) *Limiter {
	cfg := limiterConfig{
		denyCache: true, denyMax: time.Second, denyCap: 10000,
		localLevel: true, instances: 1, localCap: 100000,
		fallback: LocalOnly, breaker: DefaultBreaker, breakerLabel: "redis",
	}
	for _, o := range opts {
		if o != nil {
			o(&cfg)
		}
	}
	if c != nil && cfg.deadline > 0 {
		c = c.WithDeadline(cfg.deadline)
	}
	l := &Limiter{
		client:   c,
		cfg:      cfg,
		local:    newLocalLimiters(cfg.localCap),
		accounts: newLocalLimiters(cfg.localCap),
		breaker:  newRedisBreaker(cfg.breaker),
	}
	if cfg.denyCache {
		l.deny = newDenyCache(cfg.denyMax, cfg.denyCap)
	}
	if grantLevelFactory != nil {
		l.grants = grantLevelFactory(l)
	}
	cfg.metrics.BreakerOpen(cfg.breakerLabel, false)
	if cfg.metrics != nil && cfg.events != nil {
		// Deny events made without metrics count in the limiter's.
		cfg.events.metrics.CompareAndSwap(nil, cfg.metrics)
	}
	return l
}

// Client is the client underneath (nil if none was given).
func (l *Limiter) Client() *Client {
	if l == nil {
		return nil
	}
	return l.client
}

// Stats is a reading of the counters of every path.
func (l *Limiter) Stats() Stats {
	if l == nil {
		return Stats{}
	}
	return l.stats.snapshot()
}

// BreakerOpen reports whether the breaker is open (or half open, probing).
func (l *Limiter) BreakerOpen() bool { return l != nil && l.breaker != nil && l.breaker.isOpen() }

// Close gives back the units batched rules hold (REFUND) and waits for the
// probes in flight, within ctx. The limiter stays usable.
func (l *Limiter) Close(ctx context.Context) error {
	if l == nil {
		return nil
	}
	var err error
	if l.grants != nil {
		err = l.grants.close(ctx)
	}
	if werr := l.bg.wait(ctx); werr != nil && err == nil {
		err = werr
	}
	return err
}

// bgGroup counts background work (probes, refunds) that Close waits for.
// Unlike a sync.WaitGroup, work may start while a Close waits (the
// limiter stays usable): a wait covers the work in flight when it began,
// and gives up with ctx. The zero value is ready.
type bgGroup struct {
	mu   sync.Mutex
	n    int
	idle chan struct{} // closed when n falls to 0
}

func (g *bgGroup) add() {
	g.mu.Lock()
	if g.n == 0 {
		g.idle = make(chan struct{})
	}
	g.n++
	g.mu.Unlock()
}

func (g *bgGroup) done() {
	g.mu.Lock()
	g.n--
	if g.n == 0 {
		close(g.idle)
	}
	g.mu.Unlock()
}

// wait waits until no work is in flight (or ctx ends: its error).
func (g *bgGroup) wait(ctx context.Context) error {
	g.mu.Lock()
	if g.n == 0 {
		g.mu.Unlock()
		return nil
	}
	idle := g.idle
	g.mu.Unlock()
	select {
	case <-idle:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// checkedRule is one rule of a RuleSet, checked.
type checkedRule struct {
	rule Rule
	// spec is the algorithm and parameters: inline, or a policy's as the
	// server had it when the set was built (hasSpec false if unknown).
	spec    Spec
	hasSpec bool
	// local is the local level's share, for a global rule when the level is
	// on.
	local    Spec
	hasLocal bool
	// account is the local-only fallback's share.
	account    Spec
	hasAccount bool
	// signature identifies the rule's algorithm and parameters (or policy).
	signature string
	// cacheRule identifies the rule and the fixed part of its key in the deny
	// cache and the local maps, whose keys are {cacheRule, cacheID(identity)}:
	// no key is built for a decision made in process.
	cacheRule string
	label     string
	// grant is what the grants level prepared for a batched or striped rule.
	grant   any
	isGrant bool
}

// RuleSet is rules checked together, all or nothing: several are one RL.ALL
// (on a cluster, their keys must share one hash tag), batched and striped
// rules are decided first, in process mostly. Made by Limiter.RuleSet.
type RuleSet struct {
	rules []checkedRule
	// With batched or striped rules: the other rules, decided together after
	// them, and their positions in rules.
	rest    *RuleSet
	restIdx []int
}

// Rules are the set's rules, in order.
func (s *RuleSet) Rules() []Rule {
	if s == nil {
		return nil
	}
	out := make([]Rule, len(s.rules))
	for i, r := range s.rules {
		out[i] = r.rule
	}
	return out
}

// RuleSet checks rules (every parameter, before anything is sent) and reads
// the policies' specs from the server (for the local-only fallback and the
// headers). A bad rule is an *InvalidArgumentError naming its argument; so
// is a policy the server does not have, and, on a cluster, several plain
// rules whose keys do not share one hash tag (RL.ALL would answer CROSSSLOT
// at every request).
func (l *Limiter) RuleSet(ctx context.Context, rules ...Rule) (*RuleSet, error) {
	if l == nil {
		return nil, &InvalidArgumentError{Arg: "limiter", Reason: "nil *Limiter"}
	}
	if l.client == nil || l.breaker == nil {
		return nil, &InvalidArgumentError{Arg: "client", Reason: "the limiter has no client (NewLimiter(nil), or a zero Limiter)"}
	}
	if len(rules) == 0 {
		return nil, &InvalidArgumentError{Arg: "rules", Reason: "at least one rule"}
	}
	var plain []Rule
	for _, r := range rules {
		if err := r.Validate(); err != nil {
			return nil, err
		}
		if r.batch == nil && r.Stripes() == 1 {
			plain = append(plain, r)
		}
	}
	if len(plain) > 1 && l.client.IsCluster() {
		first, ok := plain[0].hashTag()
		for _, r := range plain {
			tag, has := r.hashTag()
			if !ok || !has || tag != first {
				return nil, r.bad("key", "in a cluster, the keys of several rules (one RL.ALL) need one hash tag, such as {api}:user: and {api}:global")
			}
		}
	}
	several := len(rules) > 1
	set := &RuleSet{}
	for _, r := range rules {
		cr := checkedRule{rule: r, label: r.label()}
		if r.inline {
			cr.spec, cr.hasSpec = r.spec, true
			cr.signature = inlineSignature(r.spec)
			if several && r.batch == nil && r.Stripes() == 1 && r.spec.Algorithm() == AlgorithmQuota && !zoneIsUTC(r.spec.Zone()) {
				return nil, r.bad("zone", "RL.ALL (several rules in one set) counts inline quotas in UTC: a quota in a zone is a set of its own, or a policy with its zone")
			}
		} else {
			spec, ok, err := l.policySpec(ctx, r.policy)
			if err != nil {
				return nil, err
			}
			if !ok {
				return nil, r.bad("policy", "no policy %q on the server (RL.POLICY SET it first)", r.policy)
			}
			cr.spec, cr.hasSpec = spec, !spec.IsZero()
			cr.signature = "POLICY " + r.policy
		}
		if cr.hasSpec && cr.spec.Algorithm() == AlgorithmConcurrency {
			return nil, r.bad("algorithm", "a CONCURRENCY rule holds a lease for the length of the work: use Limiter.Lease or Limiter.Acquire")
		}
		if r.batch != nil || r.Stripes() > 1 {
			if l.grants == nil {
				return nil, r.bad("batched", "this build has no grants level for batched or striped rules")
			}
			g, err := l.grants.prepare(ctx, r, cr.spec)
			if err != nil {
				return nil, err
			}
			cr.grant, cr.isGrant = g, true
		} else if r.global && l.cfg.localLevel && cr.hasSpec {
			cr.local, cr.hasLocal = localShare(cr.spec, l.cfg.instances, l.cfg.ratio), true
		}
		if cr.hasSpec {
			cr.account, cr.hasAccount = localShare(cr.spec, l.cfg.instances, l.cfg.ratio), true
		}
		cr.cacheRule = cr.signature + "\x00" + r.Key("")
		if r.global {
			cr.cacheRule += "\x00="
		}
		set.rules = append(set.rules, cr)
	}
	for i, r := range set.rules {
		if r.isGrant {
			continue
		}
		if set.rest == nil {
			set.rest = &RuleSet{}
		}
		set.rest.rules = append(set.rest.rules, r)
		set.restIdx = append(set.restIdx, i)
	}
	if len(set.restIdx) == len(set.rules) {
		set.rest, set.restIdx = nil, nil
	}
	if p := l.cfg.protection; p != nil {
		// The protection loop watches the set's policies and binds the
		// breakers its rules name (Protection.WatchRules).
		p.watchRules(set)
	}
	return set, nil
}

func inlineSignature(s Spec) string {
	var b strings.Builder
	b.WriteString(string(s.Algorithm()))
	for _, p := range s.Params() {
		b.WriteByte(' ')
		b.WriteString(itoa(p))
	}
	if z := s.Zone(); z != "" {
		b.WriteString(" TZ ")
		b.WriteString(z)
	}
	return b.String()
}

func itoa(n int64) string {
	var buf [20]byte
	i := len(buf)
	neg := n < 0
	u := uint64(n)
	if neg {
		u = uint64(-n)
	}
	for {
		i--
		buf[i] = byte('0' + u%10)
		u /= 10
		if u == 0 {
			break
		}
	}
	if neg {
		i--
		buf[i] = '-'
	}
	return string(buf[i:])
}

// denied is a decision for a request that cannot be decided (a nil limiter
// or rule set): a denial that no wait turns into an admission.
func undecidable() Decision {
	return Decision{Allowed: false, WaitMs: -1, DeniedBy: -1, Granted: -1, Path: PathFallback}
}

// Check decides one request of cost units for identity under every rule of
// set, all or nothing. It never fails: where Redis cannot answer, the
// fallback decides, and Decision.Path says which level did; Decision.Rule
// names the rule that denied (or, admitted, the one whose fields the
// decision carries). A nil limiter or set is a denial that never passes
// (WaitMs -1). Cost 0 is a check that takes nothing. An empty identity is an
// identity like any other (a per-identity rule's key is then its prefix).
func (l *Limiter) Check(ctx context.Context, set *RuleSet, identity string, cost uint64) Decision {
	return l.CheckFrom(ctx, set, identity, cost, Origin{})
}

// Origin is where a request came from, for its deny events.
type Origin struct {
	ClientIP, UserAgent string
}

// CheckFrom is Check for a request from origin (its deny events carry the
// client's address and User-Agent).
func (l *Limiter) CheckFrom(ctx context.Context, set *RuleSet, identity string, cost uint64, origin Origin) Decision {
	if l == nil || l.breaker == nil || set == nil || len(set.rules) == 0 {
		// A nil or zero Limiter (not made by NewLimiter), a nil or empty set.
		return undecidable()
	}
	if ctx == nil {
		ctx = context.Background()
	}
	d := l.decide(ctx, set, identity, cost)
	l.observe(set, identity, d, origin)
	return d
}

// cacheID is the identity's part of a rule's map keys ("" for a global
// rule: its key is fixed).
func (r *checkedRule) cacheID(identity string) string {
	if r.rule.global {
		return ""
	}
	return identity
}

// keysOf are the set's limiter keys for identity.
func keysOf(set *RuleSet, identity string) []string {
	keys := make([]string, len(set.rules))
	for i := range set.rules {
		keys[i] = set.rules[i].rule.Key(identity)
	}
	return keys
}

// observe counts a set's decision: admitted for every rule of the set, or
// denied for the rule that denied (and its deny event).
func (l *Limiter) observe(set *RuleSet, identity string, d Decision, origin Origin) {
	m, ev := l.cfg.metrics, l.cfg.events
	if m == nil && ev == nil {
		return
	}
	i := ruleIndex(set, d)
	r := &set.rules[i]
	if d.Allowed {
		for _, r := range set.rules {
			m.Decision(r.label, d.Path, "admitted")
		}
	} else {
		m.Decision(r.label, d.Path, "denied")
		ev.Record(DenyEvent{
			Timestamp: time.Now(), Key: r.rule.Key(identity), Rule: r.label, Level: d.Path.String(),
			Limit: d.Limit, Remaining: d.Remaining, RetryAfterMs: d.WaitMs,
			ClientIP: origin.ClientIP, UserAgent: origin.UserAgent,
		})
	}
	if (d.Path == PathRedis || d.Path == PathLocal) && d.Limit > 0 {
		m.RemainingRatio(r.label, float64(d.Remaining)/float64(d.Limit))
	}
}

// ruleIndex is the rule a decision describes: the one that denied, or the
// first whose limit is the decision's.
func ruleIndex(set *RuleSet, d Decision) int {
	if d.DeniedBy >= 0 && d.DeniedBy < len(set.rules) {
		return d.DeniedBy
	}
	for i, r := range set.rules {
		if r.hasSpec && limitOf(r.spec) == d.Limit {
			return i
		}
	}
	return 0
}

func (l *Limiter) named(set *RuleSet, d Decision) Decision {
	d.Rule = set.rules[ruleIndex(set, d)].rule.name
	return d
}

func (l *Limiter) decide(ctx context.Context, set *RuleSet, identity string, cost uint64) Decision {
	if cost > uint64(MaxParam) {
		// More than any limit holds (limits are at most MaxParam): a denial
		// that never passes, decided here. Sent, the server (or the
		// client's checks) would refuse the argument, and the fallback,
		// failing open, would admit it.
		l.stats.localDenied.Add(1)
		var limit int64
		if set.rules[0].hasSpec {
			limit = limitOf(set.rules[0].spec)
		}
		return l.named(set, Decision{Allowed: false, Limit: limit, WaitMs: -1, DeniedBy: 0, Granted: -1, Path: PathLocal})
	}
	if set.rest == nil && !set.rules[0].isGrant {
		return l.named(set, l.decidePlain(ctx, set, identity, cost))
	}
	keys := keysOf(set, identity)
	// The grant rules first (mostly in process), then the others in one
	// call; a later denial gives back what the earlier ones took.
	var undo []func()
	giveBack := func() {
		for _, u := range undo {
			if u != nil {
				u()
			}
		}
	}
	var last Decision
	have := false
	for i, r := range set.rules {
		if !r.isGrant {
			continue
		}
		d, u := l.grants.check(ctx, r.grant, keys[i], cost)
		if !d.Allowed {
			giveBack()
			d.DeniedBy = i
			return l.named(set, d)
		}
		undo = append(undo, u)
		last, have = d, true
	}
	if set.rest != nil {
		d := l.decidePlain(ctx, set.rest, identity, cost)
		if !d.Allowed {
			giveBack()
			if d.DeniedBy >= 0 && d.DeniedBy < len(set.restIdx) {
				d.DeniedBy = set.restIdx[d.DeniedBy]
			}
		} else {
			d.DeniedBy = -1
		}
		return l.named(set, d)
	}
	if !have {
		last = Decision{Allowed: true, DeniedBy: -1, Granted: -1, Path: PathGrant}
	}
	return l.named(set, last)
}

// callAnswer is what became of a call to Redis.
type callAnswer int

const (
	ansRedis      callAnswer = iota // Redis answered
	ansLost                         // sent, and may have been applied (a timeout, a lost connection)
	ansNotApplied                   // nothing applied: the breaker is open, an error reply, a refused connection
)

func (l *Limiter) decidePlain(ctx context.Context, set *RuleSet, identity string, cost uint64) Decision {
	n := len(set.rules)
	cacheKey := func(i int) mapKey {
		r := &set.rules[i]
		return mapKey{rule: r.cacheRule, id: r.cacheID(identity)}
	}
	// An RL.ALL denial waits for the slowest limiter that denied, which need
	// not be the one it names: it is cached for this very set of rules and
	// keys, never for one rule alone.
	setKey := func() mapKey {
		var rb, ib strings.Builder
		for i := 0; i < n; i++ {
			k := cacheKey(i)
			rb.WriteByte(1)
			rb.WriteString(k.rule)
			ib.WriteByte(1)
			ib.WriteString(k.id)
		}
		return mapKey{rule: rb.String(), id: ib.String()}
	}
	now := time.Now()
	if l.deny != nil {
		for i := 0; i < n; i++ {
			// A denial answers only the requests it denies: one for fewer
			// units than were left (a cost-1 request after a cost-10
			// denial) goes on to Redis.
			if d, ok := l.deny.get(cacheKey(i), now); ok && deniesCost(d, cost) {
				d.DeniedBy = i
				l.stats.denyCacheHits.Add(1)
				l.deniedLocally(set, i)
				return d
			}
		}
		if n > 1 {
			if d, ok := l.deny.get(setKey(), now); ok && deniesCost(d, cost) {
				l.stats.denyCacheHits.Add(1)
				l.deniedLocally(set, d.DeniedBy)
				return d
			}
		}
	}

	// The local level of the global rules, taken before the call (in
	// buffers on the stack for the usual small sets).
	var localBuf [4]localLimit
	var localIdxBuf [4]int
	var takenBuf [4]Decision
	locals, localIdx := localBuf[:0], localIdxBuf[:0]
	for i := range set.rules {
		if r := &set.rules[i]; r.hasLocal {
			locals = append(locals, localLimit{key: cacheKey(i), spec: r.local})
			localIdx = append(localIdx, i)
		}
	}
	var taken []Decision
	if len(locals) > 0 {
		ds, pos, denied := l.local.takeAll(locals, cost, now.UnixMicro(), takenBuf[:0])
		if pos >= 0 {
			i := localIdx[pos]
			l.stats.localDenied.Add(1)
			denied.Limit = limitOf(set.rules[i].spec)
			denied.Remaining = 0
			denied.DeniedBy = i
			denied.Path = PathLocal
			denied.Granted = -1
			l.deniedLocally(set, i)
			return denied
		}
		taken = ds
	}

	// The other rules' accounts: only the local-only fallback keeps them.
	var accountBuf [4]localLimit
	var accountIdxBuf [4]int
	accounts, accountIdx := accountBuf[:0], accountIdxBuf[:0]
	if l.cfg.fallback == LocalOnly {
		for i := range set.rules {
			r := &set.rules[i]
			if r.hasLocal {
				continue
			}
			if spec, ok := l.accountSpec(r); ok {
				accounts = append(accounts, localLimit{key: cacheKey(i), spec: spec})
				accountIdx = append(accountIdx, i)
			}
		}
	}

	var d Decision
	ans := ansNotApplied
	switch l.breaker.gate() {
	case rbCall:
		if l.client == nil {
			break
		}
		keys := keysOf(set, identity)
		// An owed send that fails (Redis unreachable) leaves the request
		// to the fallback: one deadline at most per request.
		if !l.settle(ctx, set, keys, locals, localIdx, accounts, accountIdx) {
			break
		}
		l.stats.redisCalls.Add(1)
		var err error
		start := time.Now()
		d, err = l.timed(func() (Decision, error) { return l.callRedis(ctx, set, keys, cost) })
		if err == nil {
			l.breaker.success()
			ans = ansRedis
		} else {
			ans = l.failed(ctx, start, err)
		}
	case rbSkip:
		l.stats.breakerSkipped.Add(1)
	case rbProbe:
		l.stats.breakerSkipped.Add(1)
		l.probe()
	}

	if ans == ansRedis {
		if d.Allowed {
			l.stats.redisAdmitted.Add(1)
			if len(locals) > 0 {
				l.stats.localAdmitted.Add(1)
			}
			l.accounts.chargeAll(accounts, cost)
			d.DeniedBy = -1
		} else {
			l.stats.redisDenied.Add(1)
			l.local.refundAll(locals, cost)
			if n == 1 {
				d.DeniedBy = 0
			}
			if l.deny != nil {
				if n == 1 {
					l.deny.put(cacheKey(0), d, time.Now())
				} else {
					l.deny.put(setKey(), d, time.Now())
				}
			}
		}
		d.Path = PathRedis
		return d
	}
	lost := ans == ansLost
	d = l.fallback(set, cost, locals, localIdx, taken, accounts, accountIdx, lost)
	if d.Allowed {
		l.stats.fallbackAdmitted.Add(1)
	} else {
		l.stats.fallbackDenied.Add(1)
		// A call that may have been applied keeps its units on the local
		// level: Redis may have counted them.
		if !lost {
			l.local.refundAll(locals, cost)
		}
	}
	return d
}

// accountSpec is a rule's local-only account: a policy's at the scale the
// protection loop last read.
func (l *Limiter) accountSpec(r *checkedRule) (Spec, bool) {
	if !r.hasAccount {
		return Spec{}, false
	}
	if p := l.cfg.protection; p != nil && !r.rule.inline {
		if sc := p.scale(r.rule.policy); sc < 100 && sc > 0 {
			return localShare(scaledSpec(r.spec, sc), l.cfg.instances, l.cfg.ratio), true
		}
	}
	return r.account, true
}

// scaledSpec is spec at scale percent, as the server runs a scaled policy:
// the size and rate parameters max(1, floor(p * scale / 100)).
func scaledSpec(s Spec, scale int) Spec {
	f := func(p int64) int64 { return max(p/100*int64(scale)+p%100*int64(scale)/100, 1) }
	out := s
	out.params[0] = f(s.params[0])
	switch s.Algorithm() {
	case AlgorithmTokenBucket, AlgorithmLeakyBucket:
		out.params[1] = f(s.params[1])
	}
	return out
}

// failed counts a failed call, feeds the breaker, and says whether the call
// may have been applied.
func (l *Limiter) failed(ctx context.Context, start time.Time, err error) callAnswer {
	if errors.Is(err, context.Canceled) || l.callerCut(ctx, start, err) {
		// The caller gave up, or its own deadline ended the call before
		// the call's deadline: not Redis's failure, and the call may have
		// been applied.
		return ansLost
	}
	switch {
	case errors.Is(err, ErrTimeout):
		l.stats.redisTimeouts.Add(1)
	case errors.Is(err, ErrConnection):
		l.stats.redisUnavailable.Add(1)
	default:
		l.stats.redisErrors.Add(1)
	}
	if IsUnavailable(err) && l.breaker.failure() {
		l.stats.breakerOpened.Add(1)
		l.cfg.metrics.BreakerOpen(l.cfg.breakerLabel, true)
	}
	if mayHaveApplied(err) {
		return ansLost
	}
	return ansNotApplied
}

// callerCut reports a call that the caller's own context ended before the
// call's deadline (a request with 5 ms left). It is not counted against
// Redis: a few callers with short deadlines must not open the breaker that
// every request shares. Whether Redis is late is judged by the calls that
// had their whole deadline.
// (The socket's read deadline, set from the context's, may fire a moment
// before the context itself reports it: the timeout and the deadline's place
// decide, not ctx.Err.)
func (l *Limiter) callerCut(ctx context.Context, start time.Time, err error) bool {
	if ctx == nil || l.client == nil || !errors.Is(err, ErrTimeout) {
		return false
	}
	dl, ok := ctx.Deadline()
	return ok && dl.Before(start.Add(l.client.Deadline()))
}

// mayHaveApplied reports an error after which the call may still have been
// applied: a timeout, a reply of the wrong shape, a connection lost after
// the call was written (not one that was never made).
func mayHaveApplied(err error) bool {
	if errors.Is(err, ErrTimeout) || errors.Is(err, ErrProtocol) {
		return true
	}
	if !errors.Is(err, ErrConnection) {
		return false
	}
	// An error reply that says the server cannot serve (LOADING, READONLY,
	// MASTERDOWN...) is an answer: nothing was applied.
	var se *ServerError
	if errors.As(err, &se) {
		return false
	}
	var op *net.OpError
	if errors.As(err, &op) && op.Op == "dial" {
		return false
	}
	return !strings.Contains(err.Error(), "connection refused")
}

// gated is one limiter call through the breaker, timed and counted, for the
// grants level: the reply, or whether the call may have been applied
// (lost), as the fallback needs it.
func (l *Limiter) gated(ctx context.Context, call func() (Decision, error)) (d Decision, ok bool, lost bool) {
	switch l.breaker.gate() {
	case rbCall:
		if l.client == nil {
			return Decision{}, false, false
		}
		l.stats.redisCalls.Add(1)
		start := time.Now()
		d, err := l.timed(call)
		if err == nil {
			l.breaker.success()
			return d, true, false
		}
		return Decision{}, false, l.failed(ctx, start, err) == ansLost
	case rbProbe:
		l.stats.breakerSkipped.Add(1)
		l.probe()
	default:
		l.stats.breakerSkipped.Add(1)
	}
	return Decision{}, false, false
}

// timed is a round trip, timed for the metrics (a connection never made is
// no round trip).
func (l *Limiter) timed(call func() (Decision, error)) (Decision, error) {
	if l.cfg.metrics == nil {
		return call()
	}
	start := time.Now()
	d, err := call()
	if err == nil || !errors.Is(err, ErrConnection) {
		l.cfg.metrics.RedisRoundTrip(time.Since(start))
	}
	return d, err
}

// probe sends one PING in the background; the breaker closes when it
// answers.
func (l *Limiter) probe() {
	if l.client == nil || !l.probing.CompareAndSwap(false, true) {
		l.breaker.failure() // back to open: the next gate probes again
		return
	}
	l.stats.probes.Add(1)
	l.bg.add()
	go func() {
		defer l.bg.done()
		defer l.probing.Store(false)
		ctx, cancel := context.WithTimeout(context.Background(), l.client.Deadline())
		defer cancel()
		if err := l.client.Redis().Ping(ctx).Err(); err != nil {
			l.breaker.failure()
			return
		}
		l.stats.probesOK.Add(1)
		l.breaker.probeSucceeded()
		l.cfg.metrics.BreakerOpen(l.cfg.breakerLabel, false)
	}()
}

// settle sends Redis the units the fallback admitted for these keys while
// no call was sent (the breaker open, an error reply), as COST n FORCE,
// before the request's own call: so Redis counts them, and one instance
// stays within max(limit, s) when Redis answers again in the same window.
// Never retried: a send that fails before reaching Redis (refused) keeps
// its units owed for the next call; one that may have been applied (a
// timeout, a lost connection) is not sent again. The first failure ends the
// settling, counts for the breaker like any failed call, and answers false:
// the request is the fallback's, so it waits one deadline at most.
func (l *Limiter) settle(ctx context.Context, set *RuleSet, keys []string, locals []localLimit, localIdx []int, accounts []localLimit, accountIdx []int) bool {
	if l.cfg.fallback != LocalOnly {
		return true
	}
	ok := true
	send := func(table *localLimiters, lims []localLimit, idx []int, owed []uint64) {
		for j, units := range owed {
			if units == 0 {
				continue
			}
			if !ok {
				// Not sent: still owed, for the next call.
				table.oweAll(lims[j:j+1], units)
				continue
			}
			i := idx[j]
			r := &set.rules[i]
			l.stats.owedSent.Add(1)
			start := time.Now()
			var err error
			if r.rule.inline {
				_, err = l.client.Apply(ctx, keys[i], r.spec, Force(units))
			} else {
				_, err = l.client.Hit(ctx, r.rule.policy, keys[i], Force(units))
			}
			if err == nil || !IsUnavailable(err) {
				continue // sent, or answered with an error: nothing more to send
			}
			if !mayHaveApplied(err) {
				table.oweAll(lims[j:j+1], units)
			}
			l.failed(ctx, start, err)
			ok = false
		}
	}
	send(l.local, locals, localIdx, l.local.takeOwed(locals))
	send(l.accounts, accounts, accountIdx, l.accounts.takeOwed(accounts))
	return ok
}

func (l *Limiter) callRedis(ctx context.Context, set *RuleSet, keys []string, cost uint64) (Decision, error) {
	if len(set.rules) == 1 {
		r := &set.rules[0]
		if r.rule.inline {
			return l.client.Apply(ctx, keys[0], r.spec, Cost(cost))
		}
		return l.client.Hit(ctx, r.rule.policy, keys[0], Cost(cost))
	}
	limits := make([]Limit, len(set.rules))
	for i, r := range set.rules {
		if r.rule.inline {
			limits[i] = Limit{Key: keys[i], Spec: r.spec}
		} else {
			limits[i] = Limit{Key: keys[i], Policy: r.rule.policy}
		}
	}
	return l.client.All(ctx, limits, Cost(cost))
}

// deniesCost reports whether a cached denial also denies a request of cost
// units: it does unless the cost is within what the denial left.
func deniesCost(d Decision, cost uint64) bool {
	return d.Remaining < 0 || cost > uint64(d.Remaining)
}

// deniedLocally counts a denial answered without a call (deny cache, local
// level) for the protection loop, when the rule that denied is a policy's.
func (l *Limiter) deniedLocally(set *RuleSet, i int) {
	p := l.cfg.protection
	if p == nil || i < 0 || i >= len(set.rules) || set.rules[i].rule.inline {
		return
	}
	p.recordDenied(set.rules[i].rule.policy)
}

// fallback decides a request that Redis did not answer. lost: the call was
// sent and may have been applied, so whatever the fallback decides, its
// units stay charged to the instance's accounts.
func (l *Limiter) fallback(set *RuleSet, cost uint64, locals []localLimit, localIdx []int, taken []Decision, accounts []localLimit, accountIdx []int, lost bool) Decision {
	var limit int64
	if set.rules[0].hasSpec {
		limit = limitOf(set.rules[0].spec)
	}
	base := Decision{Allowed: true, Limit: limit, Remaining: limit, DeniedBy: -1, Granted: -1, Path: PathFallback}
	switch l.cfg.fallback {
	case FailOpen:
		return base
	case FailClosed:
		wait := max(l.breaker.config.OpenFor.Milliseconds(), 1)
		base.Allowed, base.Remaining, base.WaitMs = false, 0, wait
		base.RetryAfter = time.Duration(wait) * time.Millisecond
		base.ResetAfter = base.RetryAfter
		base.DeniedBy = 0
		return base
	}
	// LocalOnly: global rules were taken by the local level already; the
	// others are taken from their accounts here.
	var buf [4]Decision
	ds, pos, denied := l.accounts.takeAll(accounts, cost, nowMicros(), buf[:0])
	if pos >= 0 {
		if lost {
			l.accounts.chargeAll(accounts, cost)
		}
		i := accountIdx[pos]
		denied.Limit = limitOf(set.rules[i].spec)
		denied.Remaining = 0
		denied.DeniedBy = i
		denied.Granted = -1
		denied.Path = PathFallback
		return denied
	}
	if !lost {
		// Redis never saw this request: owed to it.
		l.local.oweAll(locals, cost)
		l.accounts.oweAll(accounts, cost)
	}
	// The fields of the account that admitted with the least left, as RL.ALL
	// answers the most restrictive.
	best, bestIdx := Decision{}, -1
	consider := func(idx []int, ds []Decision) {
		for j, d := range ds {
			if bestIdx < 0 || d.Remaining < best.Remaining {
				best, bestIdx = d, idx[j]
			}
		}
	}
	consider(localIdx, taken)
	consider(accountIdx, ds)
	if bestIdx < 0 {
		return base
	}
	best.Limit = limitOf(set.rules[bestIdx].spec)
	best.DeniedBy, best.Granted, best.Path = -1, -1, PathFallback
	return best
}

// fallbackOne is the fallback's decision for one grant rule (its instance's
// share, for the local-only fallback), for the grants level; key is the
// rule's key.
func (l *Limiter) fallbackOne(set *RuleSet, i int, key string, cost uint64, lost bool) Decision {
	r := &set.rules[i]
	var d Decision
	limit := limitOf(r.spec)
	switch {
	case l.cfg.fallback == FailClosed:
		wait := max(l.breaker.config.OpenFor.Milliseconds(), 1)
		d = Decision{Limit: limit, WaitMs: wait, RetryAfter: time.Duration(wait) * time.Millisecond, ResetAfter: time.Duration(wait) * time.Millisecond}
	case l.cfg.fallback == LocalOnly && r.hasAccount:
		acc := []localLimit{{key: mapKey{rule: r.signature + "\x00", id: key}, spec: r.account}}
		ds, pos, denied := l.accounts.takeAll(acc, cost, nowMicros(), nil)
		if pos >= 0 {
			if lost {
				l.accounts.chargeAll(acc, cost)
			}
			d = denied
			d.Remaining = 0
		} else {
			d = ds[0]
		}
		d.Limit = limit
	default:
		d = Decision{Allowed: true, Limit: limit, Remaining: limit}
	}
	d.DeniedBy, d.Granted, d.Path = -1, -1, PathFallback
	if d.Allowed {
		l.stats.fallbackAdmitted.Add(1)
	} else {
		l.stats.fallbackDenied.Add(1)
	}
	return d
}

// policySpec reads a policy's spec from the server (RL.POLICY GET): false
// when the server has no such policy. A spec the kit does not know is an
// unknown spec (true, the zero Spec): the rule still applies in Redis, but
// the local-only fallback has no account for it.
func (l *Limiter) policySpec(ctx context.Context, name string) (Spec, bool, error) {
	info, err := l.client.WithDeadline(max(l.client.Deadline(), UpkeepDeadline)).PolicyGet(ctx, name)
	if err != nil {
		return Spec{}, false, err
	}
	if info == nil {
		return Spec{}, false, nil
	}
	return info.Spec, true, nil
}

// mapKey is a key of the deny cache and the local maps: a rule (with the
// fixed part of its key) and the identity, kept apart so that a decision
// made in process builds no string.
type mapKey struct{ rule, id string }

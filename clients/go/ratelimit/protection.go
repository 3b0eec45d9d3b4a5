package ratelimit

import (
	"context"
	"fmt"
	"sort"
	"sync"
	"sync/atomic"
	"time"
)

// The protection loop's defaults: the contract's protection.kits.
const (
	// DefaultReportInterval is how often the counted outcomes are sent
	// (RL.OUTCOME, one per policy per interval).
	DefaultReportInterval = time.Second
	// DefaultStagePoll is how often each policy's stage and scale are read
	// (RL.POLICY STATS on every master).
	DefaultStagePoll = time.Second
	// DefaultStageHold is how long a stage read stays good without another
	// successful read; then the stage is StageNormal and the limiter's own
	// fallback decides.
	DefaultStageHold = 5 * time.Second
)

// Stage is a policy's protection stage, as the server decides it at the
// end of each of its windows (STAGES degrade_pct break_pct).
type Stage int

// The stages: the contract's protection.stages.
const (
	StageNormal  Stage = 0 // requests as usual
	StageDegrade Stage = 1 // non-core routes answer with their degrade handler
	StageBreak   Stage = 2 // also: the breakers bound to the policy are forced open
)

// String is "normal", "degrade" or "break".
func (s Stage) String() string {
	switch s {
	case StageNormal:
		return "normal"
	case StageDegrade:
		return "degrade"
	case StageBreak:
		return "break"
	}
	return fmt.Sprintf("Stage(%d)", int(s))
}

// ProtectionOption configures NewProtection.
type ProtectionOption func(*protectionConfig)

type protectionConfig struct {
	policies       []string
	reportInterval time.Duration
	stagePoll      time.Duration
	stageHold      time.Duration
	metrics        *Metrics
}

// WithPolicies watches these policies from the start (Record and Watch add
// more later).
func WithPolicies(names ...string) ProtectionOption {
	return func(c *protectionConfig) { c.policies = append(c.policies, names...) }
}

// WithReportInterval sets how often the outcomes are sent
// (DefaultReportInterval; at least 1 ms). The server sees one RL.OUTCOME
// per policy per interval per instance, whatever the request rate.
func WithReportInterval(every time.Duration) ProtectionOption {
	return func(c *protectionConfig) { c.reportInterval = max(every, time.Millisecond) }
}

// WithStagePoll sets how often the stages are read (DefaultStagePoll; at
// least 1 ms).
func WithStagePoll(every time.Duration) ProtectionOption {
	return func(c *protectionConfig) { c.stagePoll = max(every, time.Millisecond) }
}

// WithStageHold sets how long a stage read stays good without another
// successful read (DefaultStageHold); it must be longer than the stage
// poll.
func WithStageHold(hold time.Duration) ProtectionOption {
	return func(c *protectionConfig) { c.stageHold = hold }
}

// WithProtectionMetrics exports each watched policy's scale and stage
// (ratelimit_scale, ratelimit_stage) and the bound breakers' state
// (ratelimit_breaker_open) through m after each read.
func WithProtectionMetrics(m *Metrics) ProtectionOption {
	return func(c *protectionConfig) { c.metrics = m }
}

// policyState is what one policy's loop holds in process.
type policyState struct {
	ok, errors, denied atomic.Uint64
	// stage is the highest of every master at the last successful read;
	// scale the lowest (100 before any).
	stage, scale atomic.Int64
	// readAt is when that read was, in ns since the loop started, plus one
	// (0: never).
	readAt atomic.Int64
}

// bound is a breaker that follows the stage of some policies.
type bound struct {
	breaker  *CircuitBreaker
	policies []string
	// forced: the loop forced it open (it releases only what it forced).
	forced bool
}

// ProtectionStats is a reading of the loop's own counters.
type ProtectionStats struct {
	// ReportsSent is the RL.OUTCOME reports answered (one per policy per
	// interval with something to send); ReportsFailed those that failed
	// (their counts are lost, never retried).
	ReportsSent, ReportsFailed uint64
	// OutcomesSent is the outcomes the answered reports carried;
	// OutcomesLost those lost with failed reports; OutcomesPending those
	// counted and not sent yet (at most one interval's worth).
	OutcomesSent, OutcomesLost, OutcomesPending uint64
	// DeniedSent, DeniedLost and DeniedPending are the same for the local
	// denials (RecordDenied), sent as DENIED n.
	DeniedSent, DeniedLost, DeniedPending uint64
	// ReadsOK and ReadsFailed are the reads of a policy's stage.
	ReadsOK, ReadsFailed uint64
}

// Protection is the protection loop of the policies an application
// watches (SPEC "The protection loop"): it counts the outcome of the
// requests they admitted (Record, or ProtectMiddleware), sends the counts to
// every master every report interval (RL.OUTCOME), reads each policy's
// stage and scale from every master every stage poll (RL.POLICY STATS: the
// highest stage and the lowest scale win), and forces open the
// CircuitBreakers bound to a policy while it is at StageBreak. The server
// decides the stages and scales; the loop only reads them.
//
// Nothing here is on a request's path: Record adds to an atomic counter,
// Stage reads atomics. Safe for concurrent use; Close stops its two
// goroutines.
type Protection struct {
	client  *Client
	config  protectionConfig
	started time.Time

	mu       sync.RWMutex
	policies map[string]*policyState

	bmu      sync.Mutex
	breakers map[string]*bound

	reportsSent, reportsFailed, outcomesSent, outcomesLost atomic.Uint64
	deniedSent, deniedLost, readsOK, readsFailed           atomic.Uint64

	stop      chan struct{}
	stopOnce  sync.Once
	done      sync.WaitGroup
	closeOnce sync.Once
}

// NewProtection starts the loop over c (standalone: its server; cluster:
// every master; Sentinel: the master it names): two goroutines, one
// sending the outcomes, one reading the stages. A stage hold no longer
// than the stage poll is refused (an *InvalidArgumentError naming
// stage_hold): each read would be dropped before the next came.
func NewProtection(c *Client, opts ...ProtectionOption) (*Protection, error) {
	if c == nil {
		return nil, &InvalidArgumentError{Rule: "Protection", Arg: "client", Reason: "must not be nil"}
	}
	cfg := protectionConfig{
		reportInterval: DefaultReportInterval,
		stagePoll:      DefaultStagePoll,
		stageHold:      DefaultStageHold,
	}
	for _, o := range opts {
		if o != nil {
			o(&cfg)
		}
	}
	if cfg.stageHold <= cfg.stagePoll {
		return nil, &InvalidArgumentError{Rule: "Protection", Arg: "stage_hold",
			Reason: fmt.Sprintf("%v must be longer than stage_poll (%v)", cfg.stageHold, cfg.stagePoll)}
	}
	for _, name := range cfg.policies {
		if name == "" {
			return nil, &InvalidArgumentError{Rule: "Protection", Arg: "policy name", Reason: "must not be empty"}
		}
	}
	p := &Protection{
		client:   c,
		config:   cfg,
		started:  time.Now(),
		policies: map[string]*policyState{},
		breakers: map[string]*bound{},
		stop:     make(chan struct{}),
	}
	for _, name := range cfg.policies {
		p.state(name)
	}
	p.done.Add(2)
	go p.reportLoop()
	go p.pollLoop()
	return p, nil
}

// state is the policy's state, added on first use.
func (p *Protection) state(policy string) *policyState {
	p.mu.RLock()
	s := p.policies[policy]
	p.mu.RUnlock()
	if s != nil {
		return s
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if s = p.policies[policy]; s == nil {
		s = &policyState{}
		s.scale.Store(100)
		p.policies[policy] = s
	}
	return s
}

// Record counts one finished request that policy admitted, an error or
// not (a 5xx answer, a panic, a timeout of the handler: the caller
// decides). The count leaves with the next report.
func (p *Protection) Record(policy string, isError bool) {
	s := p.state(policy)
	if isError {
		s.errors.Add(1)
	} else {
		s.ok.Add(1)
	}
}

// RecordDenied counts one call of policy that the kit denied without
// asking the server (its deny cache, its local level): it leaves with the
// next report as DENIED n, so that the server's stages see the flood the
// deny cache hides. A non-core route degraded at a stage is no denial.
func (p *Protection) RecordDenied(policy string) {
	p.state(policy).denied.Add(1)
}

// Watch watches policy: its stage is read from the next poll on.
func (p *Protection) Watch(policy string) { p.state(policy) }

// Policies is the names of the policies watched, sorted.
func (p *Protection) Policies() []string {
	p.mu.RLock()
	names := make([]string, 0, len(p.policies))
	for n := range p.policies {
		names = append(names, n)
	}
	p.mu.RUnlock()
	sort.Strings(names)
	return names
}

// Stage is policy's stage: the highest of every master at the last
// successful read, or StageNormal when there was none within the stage
// hold (or the policy is not watched).
func (p *Protection) Stage(policy string) Stage {
	p.mu.RLock()
	s := p.policies[policy]
	p.mu.RUnlock()
	if s == nil {
		return StageNormal
	}
	return p.held(s)
}

// MaxStage is the highest stage of the policies watched.
func (p *Protection) MaxStage() Stage {
	p.mu.RLock()
	defer p.mu.RUnlock()
	top := StageNormal
	for _, s := range p.policies {
		top = max(top, p.held(s))
	}
	return top
}

// Scale is policy's scale in percent (1 to 100): the lowest of every
// master at the last successful read (kept while Redis does not answer:
// the server keeps it too), 100 before any.
func (p *Protection) Scale(policy string) int {
	p.mu.RLock()
	s := p.policies[policy]
	p.mu.RUnlock()
	if s == nil {
		return 100
	}
	return int(s.scale.Load())
}

// Breaker is the breaker named name bound to policy: forced open while
// the policy is at StageBreak, released when it falls below. It is made
// (closed, DefaultCircuitBreaker) if no breaker of that name is bound;
// several policies may share one, and then any of them at StageBreak
// opens it.
func (p *Protection) Breaker(name, policy string) *CircuitBreaker {
	return p.Bind(NewCircuitBreaker(name, CircuitBreakerConfig{}), policy)
}

// Bind binds the application's breaker to policy's stage and returns it;
// if a breaker of that name is bound already, that one is bound to policy
// too and returned.
func (p *Protection) Bind(b *CircuitBreaker, policy string) *CircuitBreaker {
	p.Watch(policy)
	p.bmu.Lock()
	defer p.bmu.Unlock()
	bd := p.breakers[b.Name()]
	if bd == nil {
		bd = &bound{breaker: b}
		p.breakers[b.Name()] = bd
	}
	for _, q := range bd.policies {
		if q == policy {
			return bd.breaker
		}
	}
	bd.policies = append(bd.policies, policy)
	return bd.breaker
}

// WatchRules watches the policies of set's policy rules and binds the
// breakers they name (Rule.WithBreaker) to their policy's stage, made with
// DefaultCircuitBreaker unless one of that name is bound already (Bind
// yours first to give it your config). It answers the breakers by name:
// wrap the downstream calls of the rules' routes in them.
func (p *Protection) WatchRules(set *RuleSet) map[string]*CircuitBreaker {
	out := map[string]*CircuitBreaker{}
	for _, r := range set.Rules() {
		policy := r.Policy()
		if policy == "" {
			continue
		}
		p.Watch(policy)
		if name := r.BreakerName(); name != "" {
			b, ok := p.FindBreaker(name)
			if ok {
				b = p.Bind(b, policy)
			} else {
				b = p.Breaker(name, policy)
			}
			out[name] = b
		}
	}
	return out
}

// FindBreaker is the breaker bound under name, if one is.
func (p *Protection) FindBreaker(name string) (*CircuitBreaker, bool) {
	p.bmu.Lock()
	defer p.bmu.Unlock()
	if bd := p.breakers[name]; bd != nil {
		return bd.breaker, true
	}
	return nil, false
}

// StagePoll is the loop's stage poll interval.
func (p *Protection) StagePoll() time.Duration { return p.config.stagePoll }

// Stats is a reading of the loop's counters.
func (p *Protection) Stats() ProtectionStats {
	st := ProtectionStats{
		ReportsSent: p.reportsSent.Load(), ReportsFailed: p.reportsFailed.Load(),
		OutcomesSent: p.outcomesSent.Load(), OutcomesLost: p.outcomesLost.Load(),
		DeniedSent: p.deniedSent.Load(), DeniedLost: p.deniedLost.Load(),
		ReadsOK: p.readsOK.Load(), ReadsFailed: p.readsFailed.Load(),
	}
	p.mu.RLock()
	for _, s := range p.policies {
		st.OutcomesPending += s.ok.Load() + s.errors.Load()
		st.DeniedPending += s.denied.Load()
	}
	p.mu.RUnlock()
	return st
}

// Close stops the loop after sending the counts not sent yet once (best
// effort, within ctx), and releases the breakers it forced open. It waits
// for the goroutines; later calls do nothing.
func (p *Protection) Close(ctx context.Context) error {
	var err error
	p.closeOnce.Do(func() {
		p.stopOnce.Do(func() { close(p.stop) })
		p.done.Wait()
		err = p.report(ctx)
		p.releaseForced()
	})
	return err
}

func (p *Protection) nowNs() int64 { return int64(time.Since(p.started)) + 1 }

// held is the stage a read gives now: itself within the stage hold of the
// read, else StageNormal.
func (p *Protection) held(s *policyState) Stage {
	at := s.readAt.Load()
	if at == 0 || time.Duration(p.nowNs()-at) > p.config.stageHold {
		return StageNormal
	}
	return Stage(s.stage.Load())
}

// keep keeps what every master answered: the highest stage, the lowest
// scale.
func (p *Protection) keep(policy string, s *policyState, masters []PolicyStats) {
	if len(masters) == 0 {
		return
	}
	stage, scale := int64(0), int64(100)
	for _, m := range masters {
		stage = max(stage, int64(m.Stage))
		scale = min(scale, int64(m.Scale))
	}
	s.stage.Store(stage)
	s.scale.Store(scale)
	s.readAt.Store(p.nowNs())
	p.config.metrics.Scale(policy, int(scale))
	p.config.metrics.Stage(policy, int(stage))
}

type namedState struct {
	name  string
	state *policyState
}

func (p *Protection) snapshot() []namedState {
	p.mu.RLock()
	out := make([]namedState, 0, len(p.policies))
	for n, s := range p.policies {
		out = append(out, namedState{n, s})
	}
	p.mu.RUnlock()
	sort.Slice(out, func(i, j int) bool { return out[i].name < out[j].name })
	return out
}

// report sends each policy's counts once and forgets them, answered or
// not; the first error.
func (p *Protection) report(ctx context.Context) error {
	var first error
	for _, ps := range p.snapshot() {
		ok, errs, denied := ps.state.ok.Swap(0), ps.state.errors.Swap(0), ps.state.denied.Swap(0)
		if ok == 0 && errs == 0 && denied == 0 {
			continue
		}
		masters, err := p.client.OutcomeDenied(ctx, ps.name, ok, errs, denied)
		if err != nil {
			p.reportsFailed.Add(1)
			p.outcomesLost.Add(ok + errs)
			p.deniedLost.Add(denied)
			if first == nil {
				first = fmt.Errorf("ratelimit: outcome report of policy %q lost: %w", ps.name, err)
			}
			continue
		}
		p.reportsSent.Add(1)
		p.outcomesSent.Add(ok + errs)
		p.deniedSent.Add(denied)
		p.keep(ps.name, ps.state, masters)
	}
	return first
}

// poll reads each policy's stage and scale, then moves the bound breakers.
func (p *Protection) poll(ctx context.Context) {
	for _, ps := range p.snapshot() {
		masters, err := p.client.PolicyStats(ctx, ps.name)
		if err != nil {
			p.readsFailed.Add(1)
			continue
		}
		p.readsOK.Add(1)
		p.keep(ps.name, ps.state, masters)
	}
	// The exported stage is the held one: 0 once reads fail for longer
	// than the stage hold.
	for _, ps := range p.snapshot() {
		p.config.metrics.Stage(ps.name, int(p.held(ps.state)))
	}
	p.moveBreakers()
}

func (p *Protection) moveBreakers() {
	p.bmu.Lock()
	defer p.bmu.Unlock()
	for name, bd := range p.breakers {
		stage := StageNormal
		for _, policy := range bd.policies {
			stage = max(stage, p.Stage(policy))
		}
		if stage >= StageBreak {
			if !bd.forced {
				bd.forced = true
				bd.breaker.ForceOpen()
			}
		} else if bd.forced {
			bd.forced = false
			bd.breaker.Release()
		}
		p.config.metrics.BreakerOpen(name, bd.breaker.State() != BreakerClosed)
	}
}

// releaseForced releases every breaker this loop forced open.
func (p *Protection) releaseForced() {
	p.bmu.Lock()
	defer p.bmu.Unlock()
	for name, bd := range p.breakers {
		if bd.forced {
			bd.forced = false
			bd.breaker.Release()
			p.config.metrics.BreakerOpen(name, bd.breaker.State() != BreakerClosed)
		}
	}
}

// loopContext is a context cancelled when the loop stops, for the calls of
// its goroutines (each call has the client's own deadline too).
func (p *Protection) loopContext() (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		select {
		case <-p.stop:
			cancel()
		case <-ctx.Done():
		}
	}()
	return ctx, cancel
}

func (p *Protection) reportLoop() {
	defer p.done.Done()
	ctx, cancel := p.loopContext()
	defer cancel()
	tick := time.NewTicker(p.config.reportInterval)
	defer tick.Stop()
	for {
		select {
		case <-p.stop:
			return
		case <-tick.C:
			_ = p.report(ctx)
		}
	}
}

func (p *Protection) pollLoop() {
	defer p.done.Done()
	ctx, cancel := p.loopContext()
	defer cancel()
	p.poll(ctx)
	tick := time.NewTicker(p.config.stagePoll)
	defer tick.Stop()
	for {
		select {
		case <-p.stop:
			return
		case <-tick.C:
			p.poll(ctx)
		}
	}
}

// WithProtection gives the limiter the protection loop p: the denials of a
// policy rule that the limiter answers without a call (its deny cache, its
// local level) are counted for p's reports (DENIED n), and the local-only
// fallback runs a policy at the scale p last read. Limiter.RuleSet watches
// the set's policies and binds the breakers its rules name, as
// p.WatchRules (call WatchRules to get the breakers by name).
func WithProtection(p *Protection) LimiterOption {
	return func(c *limiterConfig) {
		if p != nil {
			c.protection = p
		}
	}
}

// recordDenied and scale are the Limiter's protectionHook.
func (p *Protection) recordDenied(policy string) { p.RecordDenied(policy) }
func (p *Protection) scale(policy string) int    { return p.Scale(policy) }
func (p *Protection) watchRules(set *RuleSet)    { p.WatchRules(set) }

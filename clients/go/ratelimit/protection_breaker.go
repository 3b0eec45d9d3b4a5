package ratelimit

import (
	"errors"
	"fmt"
	"sync"
	"time"
)

// BreakerState is what a CircuitBreaker is doing.
type BreakerState int

const (
	// BreakerClosed: calls go through.
	BreakerClosed BreakerState = iota
	// BreakerOpen: too many consecutive failures; calls are refused until
	// its OpenFor has passed, then they go through to try again.
	BreakerOpen
	// BreakerForcedOpen: opened by hand or by the protection loop (a policy
	// at stage 2, break); calls are refused until Release.
	BreakerForcedOpen
)

// String is "closed", "open" or "forced_open".
func (s BreakerState) String() string {
	switch s {
	case BreakerClosed:
		return "closed"
	case BreakerOpen:
		return "open"
	case BreakerForcedOpen:
		return "forced_open"
	}
	return fmt.Sprintf("BreakerState(%d)", int(s))
}

// CircuitBreakerConfig says when a CircuitBreaker opens on its own and for
// how long.
type CircuitBreakerConfig struct {
	// Failures is the number of consecutive failures (Call's errors, or
	// Record(false)) that open it; 0 is the default, 5; negative: it never
	// opens on its own (only the protection loop or ForceOpen open it).
	Failures int
	// OpenFor is how long it stays open before calls go through again to
	// try (0: the default, 5 s).
	OpenFor time.Duration
}

// DefaultCircuitBreaker is the other kits' breaker: open after 5
// consecutive failures, for 5 s.
var DefaultCircuitBreaker = CircuitBreakerConfig{Failures: 5, OpenFor: 5 * time.Second}

// ErrBreakerOpen is what CircuitBreaker.Call answers when it does not call:
// the breaker is open or forced open. Test with errors.Is.
var ErrBreakerOpen = errors.New("ratelimit: circuit breaker open")

// CircuitBreaker is a small circuit breaker around an application's
// downstream calls: closed, open (after consecutive failures, for a
// while) or forced open (by hand, or by a Protection while a policy bound
// to it is at stage 2, break). Safe for concurrent use; share the pointer.
type CircuitBreaker struct {
	name     string
	config   CircuitBreakerConfig
	mu       sync.Mutex
	state    BreakerState
	failures int
	until    time.Time
}

// NewCircuitBreaker is a closed breaker named name; a zero config is
// DefaultCircuitBreaker (a zero field takes its default).
func NewCircuitBreaker(name string, config CircuitBreakerConfig) *CircuitBreaker {
	if config.Failures == 0 {
		config.Failures = DefaultCircuitBreaker.Failures
	}
	if config.OpenFor <= 0 {
		config.OpenFor = DefaultCircuitBreaker.OpenFor
	}
	return &CircuitBreaker{name: name, config: config}
}

// Name is the breaker's name (the metrics' breaker label).
func (b *CircuitBreaker) Name() string { return b.name }

// State is what it is doing now (an open breaker whose time has passed is
// closed).
func (b *CircuitBreaker) State() BreakerState {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.state == BreakerOpen && !time.Now().Before(b.until) {
		return BreakerClosed
	}
	return b.state
}

// Allow reports whether a call may go through now. Once an open breaker's
// time has passed calls go through again, and one more failure opens it
// again.
func (b *CircuitBreaker) Allow() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	switch b.state {
	case BreakerClosed:
		return true
	case BreakerOpen:
		if !time.Now().Before(b.until) {
			b.state = BreakerClosed
			b.failures = max(b.config.Failures-1, 0)
			return true
		}
	}
	return false
}

// Record counts a call's result: a success starts the count of
// consecutive failures again; a failure may open the breaker. A forced-open
// breaker ignores it.
func (b *CircuitBreaker) Record(success bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.state != BreakerClosed {
		return
	}
	if success {
		b.failures = 0
		return
	}
	b.failures++
	if b.config.Failures > 0 && b.failures >= b.config.Failures {
		b.state, b.until = BreakerOpen, time.Now().Add(b.config.OpenFor)
	}
}

// Call runs call if the breaker allows it and counts its result (an error
// is a failure). When it does not call, the error wraps ErrBreakerOpen.
func (b *CircuitBreaker) Call(call func() error) error {
	if !b.Allow() {
		return fmt.Errorf("%w: %s is %s", ErrBreakerOpen, b.name, b.State())
	}
	err := call()
	b.Record(err == nil)
	return err
}

// ForceOpen opens it until Release, whatever the calls do.
func (b *CircuitBreaker) ForceOpen() {
	b.mu.Lock()
	b.state = BreakerForcedOpen
	b.mu.Unlock()
}

// Release closes a forced-open breaker (an open one stays open for its
// time).
func (b *CircuitBreaker) Release() {
	b.mu.Lock()
	if b.state == BreakerForcedOpen {
		b.state, b.failures = BreakerClosed, 0
	}
	b.mu.Unlock()
}

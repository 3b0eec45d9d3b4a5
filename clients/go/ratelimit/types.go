package ratelimit

import (
	"errors"
	"fmt"
	"time"
)

// Algorithm names one of the module's limiters, as its command word.
type Algorithm string

// The module's algorithms: RL.<word>.
const (
	AlgorithmTokenBucket Algorithm = "TOKENBUCKET"
	AlgorithmFixedWindow Algorithm = "FIXEDWINDOW"
	AlgorithmLeakyBucket Algorithm = "LEAKYBUCKET"
	AlgorithmSliding     Algorithm = "SLIDING"
	AlgorithmHashWindow  Algorithm = "HASHWINDOW"
	AlgorithmConcurrency Algorithm = "CONCURRENCY"
	AlgorithmQuota       Algorithm = "QUOTA"
)

// Command is the algorithm's command, such as "RL.TOKENBUCKET".
func (a Algorithm) Command() string { return "RL." + string(a) }

// Period is a calendar quota's period.
type Period int

// The periods of RL.QUOTA, in the contract's order (its keyword index).
const (
	PeriodDay Period = iota
	PeriodWeek
	PeriodMonth
	PeriodYear
)

// String is the period's word: DAY, WEEK, MONTH or YEAR.
func (p Period) String() string {
	switch p {
	case PeriodDay:
		return "DAY"
	case PeriodWeek:
		return "WEEK"
	case PeriodMonth:
		return "MONTH"
	case PeriodYear:
		return "YEAR"
	}
	return fmt.Sprintf("Period(%d)", int(p))
}

// Spec is an algorithm and its parameters, in command order. Build one with
// TokenBucket, FixedWindow, LeakyBucket, SlidingWindow, HashWindow,
// ConcurrencySpec or QuotaSpec; Validate checks it as the server would.
type Spec struct {
	algorithm Algorithm
	params    [3]int64
	n         int
	zone      string // quota only; "" is UTC
}

// TokenBucket: capacity tokens, refillCount tokens added every refillMs.
func TokenBucket(capacity, refillCount, refillMs int64) Spec {
	return Spec{algorithm: AlgorithmTokenBucket, params: [3]int64{capacity, refillCount, refillMs}, n: 3}
}

// FixedWindow: limit requests per window of windowMs, aligned to the epoch.
func FixedWindow(limit, windowMs int64) Spec {
	return Spec{algorithm: AlgorithmFixedWindow, params: [3]int64{limit, windowMs}, n: 2}
}

// LeakyBucket: a queue of capacity, leakCount leaving every leakMs.
func LeakyBucket(capacity, leakCount, leakMs int64) Spec {
	return Spec{algorithm: AlgorithmLeakyBucket, params: [3]int64{capacity, leakCount, leakMs}, n: 3}
}

// SlidingWindow: an exact sliding log of limit requests per windowMs.
func SlidingWindow(limit, windowMs int64) Spec {
	return Spec{algorithm: AlgorithmSliding, params: [3]int64{limit, windowMs}, n: 2}
}

// HashWindow: limit per windowMs counted in buckets of bucketMs.
func HashWindow(limit, windowMs, bucketMs int64) Spec {
	return Spec{algorithm: AlgorithmHashWindow, params: [3]int64{limit, windowMs, bucketMs}, n: 3}
}

// ConcurrencySpec: at most limit leases held at once, each expiring after
// leaseMs unless renewed.
func ConcurrencySpec(limit, leaseMs int64) Spec {
	return Spec{algorithm: AlgorithmConcurrency, params: [3]int64{limit, leaseMs}, n: 2}
}

// QuotaSpec: limit units per calendar period in a time zone ("" or "UTC",
// "+HH:MM", or an IANA name such as "Europe/Paris").
func QuotaSpec(limit int64, period Period, zone string) Spec {
	return Spec{algorithm: AlgorithmQuota, params: [3]int64{limit, int64(period)}, n: 2, zone: zone}
}

// Algorithm is the spec's algorithm.
func (s Spec) Algorithm() Algorithm { return s.algorithm }

// Params are the spec's parameters in command order (a quota's period as
// its index).
func (s Spec) Params() []int64 { return append([]int64(nil), s.params[:s.n]...) }

// Zone is a quota's time zone ("" for UTC and for the other algorithms).
func (s Spec) Zone() string { return s.zone }

// requestKind tells the four ways a call spends units.
type requestKind uint8

const (
	kindCost requestKind = iota
	kindForce
	kindRefund
	kindUpTo
)

// Request is what one call asks of a limiter: Cost(n), Force(n), Refund(n)
// or UpTo(n). The zero Request is Cost(1).
type Request struct {
	kind requestKind
	n    uint64
	set  bool // false in the zero value: Cost(1)
}

// Cost takes n units if all fit, or none (COST n; COST 0 is a check that
// takes nothing).
func Cost(n uint64) Request { return Request{kind: kindCost, n: n, set: true} }

// Force takes n units even past the limit (COST n FORCE).
func Force(n uint64) Request { return Request{kind: kindForce, n: n, set: true} }

// Refund gives n units back (REFUND n).
func Refund(n uint64) Request { return Request{kind: kindRefund, n: n, set: true} }

// UpTo takes what fits now, at most n and at least 1 (UPTO n).
func UpTo(n uint64) Request { return Request{kind: kindUpTo, n: n, set: true} }

// Units is the request's number: COST, REFUND or UPTO's n (1 for the zero
// Request).
func (r Request) Units() uint64 {
	if !r.set {
		return 1
	}
	return r.n
}

// IsForce, IsRefund and IsUpTo tell the request's kind (a Cost otherwise).
func (r Request) IsForce() bool  { return r.set && r.kind == kindForce }
func (r Request) IsRefund() bool { return r.set && r.kind == kindRefund }
func (r Request) IsUpTo() bool   { return r.set && r.kind == kindUpTo }

// Path says which level decided.
type Path int

// The levels, with the metrics' names (String).
const (
	PathRedis     Path = iota // the server's limiter
	PathLocal                 // the in-process level of a global rule
	PathDenyCache             // the local deny cache
	PathFallback              // the fallback: Redis unreachable or late
	PathGrant                 // a unit held from a batched rule's UPTO grant
)

// String is the level's name in the metrics: redis, local, deny_cache,
// fallback or grant.
func (p Path) String() string {
	switch p {
	case PathRedis:
		return "redis"
	case PathLocal:
		return "local"
	case PathDenyCache:
		return "deny_cache"
	case PathFallback:
		return "fallback"
	case PathGrant:
		return "grant"
	}
	return fmt.Sprintf("Path(%d)", int(p))
}

// Decision is a limiter's answer: the reply's five integers, with the
// durations as time.Duration, and the sixth field where the call has one.
type Decision struct {
	// Allowed: admitted (its units consumed) or denied (nothing changed).
	Allowed bool
	// Limit is the limiter's capacity or requests per window.
	Limit int64
	// Remaining is the units left right after this call.
	Remaining int64
	// WaitMs is wait_ms as the server sent it: -1 when the request can
	// never pass.
	WaitMs int64
	// RetryAfter: denied, the time until the same request would pass (0
	// when it never can, see Never); admitted, 0 except for the leaky
	// bucket, where it is the delay before acting.
	RetryAfter time.Duration
	// ResetAfter is the time until the limiter is idle again.
	ResetAfter time.Duration
	// DeniedBy is, for RL.ALL, the 0-based position of the first limit that
	// denied; -1 otherwise.
	DeniedBy int
	// Lease is, for RL.CONCURRENCY, the id of the lease granted; 0 when
	// denied and for the other limiters.
	Lease uint64
	// Granted is, for UpTo, the units taken (0 on a denial); -1 for a call
	// without UpTo.
	Granted int64
	// Rule is the name of the rule that decided, for a Limiter's decision
	// (the one that denied, or the tightest that admitted); "" for a typed
	// call.
	Rule string
	// Path says which level decided.
	Path Path
}

// Never reports a denial that no wait will turn into an admission (wait_ms
// -1: the cost is above the limit).
func (d Decision) Never() bool { return !d.Allowed && d.WaitMs < 0 }

// The errors every call may return, tested with errors.Is; the error
// returned wraps one of them and says more.
var (
	// ErrModuleMissing: the server answers but has not loaded the module
	// (or an older one than MinModuleVersion).
	ErrModuleMissing = errors.New("ratelimit: the redis-ratelimit module is not loaded")
	// ErrProtocol: a reply did not have the shape the contract gives it.
	ErrProtocol = errors.New("ratelimit: unexpected reply")
	// ErrTimeout: no reply within the call's deadline. The call may still
	// have been applied: the kit never retries it.
	ErrTimeout = errors.New("ratelimit: no reply within the deadline")
	// ErrConnection: no connection to the server (refused, reset, closed).
	ErrConnection = errors.New("ratelimit: connection error")
)

// InvalidArgumentError is a rule or an argument refused before anything was
// sent. Arg names the parameter as the commands name it (capacity,
// window_ms, COST, policy name, ...).
type InvalidArgumentError struct {
	Rule   string // the rule's name or the command's
	Arg    string // the argument at fault
	Reason string // what is wrong with it
}

func (e *InvalidArgumentError) Error() string {
	if e.Rule == "" {
		return fmt.Sprintf("ratelimit: bad argument %s: %s", e.Arg, e.Reason)
	}
	return fmt.Sprintf("ratelimit: rule %q: bad argument %s: %s", e.Rule, e.Arg, e.Reason)
}

// ServerError is an error reply of the server (ERR ..., WRONGTYPE ...).
type ServerError struct{ Message string }

func (e *ServerError) Error() string { return "ratelimit: server error: " + e.Message }

// DeniedError is a denial returned as an error by calls that answer a guard
// rather than a Decision (Client.Lease, Limiter.Acquire).
type DeniedError struct{ Decision Decision }

func (e *DeniedError) Error() string {
	if e.Decision.Never() {
		return "ratelimit: denied; this request can never pass"
	}
	return fmt.Sprintf("ratelimit: denied; retry after %v", e.Decision.RetryAfter)
}

// IsUnavailable reports a failure of the path to Redis (a timeout or a
// connection error), not of the request: what the fallback and the breaker
// count.
func IsUnavailable(err error) bool {
	return errors.Is(err, ErrTimeout) || errors.Is(err, ErrConnection)
}

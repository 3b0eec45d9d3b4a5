package ratelimit

import (
	"errors"
	"fmt"
	"math/bits"
	"strconv"
	"strings"
)

// The bounds of the commands' arguments, as the contract gives them
// (max_param, max_span_ms) and the module applies them.
const (
	// MaxParam is the largest parameter, COST, REFUND, UPTO and BLOCK: 2^40.
	MaxParam int64 = 1 << 40
	// MaxSpanMs is the longest a limiter may take to get back to idle:
	// 2^50 ms.
	MaxSpanMs int64 = 1 << 50
	// MaxUpTo is the largest UPTO n: 2^40 (UPTO is at least 1).
	MaxUpTo = uint64(MaxParam)
	// maxLogLimit is the largest limit of SLIDING and CONCURRENCY: 2^24 - 1.
	maxLogLimit int64 = 1<<24 - 1
	// maxBuckets is the most buckets a HASHWINDOW's window holds.
	maxBuckets int64 = 1_000_000
	// maxAllKeys is the most limiters one RL.ALL takes.
	maxAllKeys = 16
)

// param is one parameter's name and range.
type param struct {
	name     string
	min, max int64
}

// paramsOf are each algorithm's parameters in command order, as the
// contract's algorithms[].params.
func paramsOf(a Algorithm) []param {
	switch a {
	case AlgorithmTokenBucket:
		return []param{{"capacity", 1, MaxParam}, {"refill_count", 1, MaxParam}, {"refill_ms", 1, MaxParam}}
	case AlgorithmLeakyBucket:
		return []param{{"capacity", 1, MaxParam}, {"leak_count", 1, MaxParam}, {"leak_ms", 1, MaxParam}}
	case AlgorithmFixedWindow:
		return []param{{"limit", 1, MaxParam}, {"window_ms", 1, MaxParam}}
	case AlgorithmSliding:
		return []param{{"limit", 1, maxLogLimit}, {"window_ms", 1, MaxParam}}
	case AlgorithmHashWindow:
		return []param{{"limit", 1, MaxParam}, {"window_ms", 1, MaxParam}, {"bucket_ms", 1, MaxParam}}
	case AlgorithmQuota:
		return []param{{"limit", 1, MaxParam}, {"period", 0, 3}}
	case AlgorithmConcurrency:
		return []param{{"limit", 1, maxLogLimit}, {"lease_ms", 1, MaxParam}}
	}
	return nil
}

// rangeReason is the module's words for an argument out of its range.
func rangeReason(name string, min, max int64) string {
	return fmt.Sprintf("%s must be an integer from %d to %d", name, min, max)
}

// Validate checks the spec as the server would, without sending anything:
// each parameter in its range, in command order (a SLIDING or CONCURRENCY
// limit up to 16,777,215, a quota's period 0 to 3), then a bucket's span (a
// limiter may take at most MaxSpanMs to get back to idle: Arg "span"), a
// hash window's bucket_ms dividing window_ms (Arg "bucket_ms") and its
// buckets (Arg "window_ms / bucket_ms", at most 1,000,000), and a quota's
// zone (Arg "zone"). The error is an *InvalidArgumentError whose Arg names
// the parameter as the contract's validation cases do, its Reason the
// server's message; Rule is the command (RL.TOKENBUCKET, ...). Bounds an
// operator sets lower in the server (ratelimit.sliding-max-limit,
// ratelimit.hashwindow-max-buckets) are the server's to refuse.
func (s Spec) Validate() error {
	cmd := s.algorithm.Command()
	ps := paramsOf(s.algorithm)
	if ps == nil || s.n != len(ps) {
		return &InvalidArgumentError{Rule: cmd, Arg: "algorithm",
			Reason: fmt.Sprintf("unknown algorithm %q: build a Spec with TokenBucket, FixedWindow, LeakyBucket, SlidingWindow, HashWindow, ConcurrencySpec or QuotaSpec", string(s.algorithm))}
	}
	for i, p := range ps {
		if v := s.params[i]; v < p.min || v > p.max {
			return &InvalidArgumentError{Rule: cmd, Arg: p.name, Reason: rangeReason(p.name, p.min, p.max)}
		}
	}
	p := s.params
	switch s.algorithm {
	case AlgorithmTokenBucket:
		if !fillsWithin(p[0], p[1], p[2]) {
			return &InvalidArgumentError{Rule: cmd, Arg: "span", Reason: spanReason("capacity * refill_ms / refill_count (the time to fill the bucket)")}
		}
	case AlgorithmLeakyBucket:
		if !fillsWithin(p[0], p[1], p[2]) {
			return &InvalidArgumentError{Rule: cmd, Arg: "span", Reason: spanReason("capacity * leak_ms / leak_count (the time to drain a full queue)")}
		}
	case AlgorithmHashWindow:
		if p[1]%p[2] != 0 {
			return &InvalidArgumentError{Rule: cmd, Arg: "bucket_ms", Reason: "bucket_ms must divide window_ms"}
		}
		if p[1]/p[2] > maxBuckets {
			return &InvalidArgumentError{Rule: cmd, Arg: "window_ms / bucket_ms", Reason: rangeReason("window_ms / bucket_ms", 1, maxBuckets)}
		}
	case AlgorithmQuota:
		if s.zone != "" {
			if err := ValidZone(s.zone); err != nil {
				var ia *InvalidArgumentError
				if errors.As(err, &ia) && ia.Rule == "" {
					return &InvalidArgumentError{Rule: cmd, Arg: ia.Arg, Reason: ia.Reason}
				}
				return err
			}
		}
	}
	return nil
}

func spanReason(what string) string {
	return fmt.Sprintf("%s is too long: a limiter may take at most %d ms to get back to idle", what, MaxSpanMs)
}

// fillsWithin: size * ms <= MaxSpanMs * count, in 128 bits (the core's
// fills_within, without a division).
func fillsWithin(size, count, ms int64) bool {
	return cmp128(uint64(size), uint64(ms), uint64(MaxSpanMs), uint64(count)) <= 0
}

// cmp128 compares a * b with c * d, in 128 bits: -1, 0 or 1.
func cmp128(a, b, c, d uint64) int {
	lh, ll := bits.Mul64(a, b)
	rh, rl := bits.Mul64(c, d)
	switch {
	case lh < rh || (lh == rh && ll < rl):
		return -1
	case lh == rh && ll == rl:
		return 0
	}
	return 1
}

// zoneIsUTC: the zone sends no TZ ("", UTC or Z in any case).
func zoneIsUTC(zone string) bool {
	return zone == "" || strings.EqualFold(zone, "UTC") || strings.EqualFold(zone, "Z")
}

// paramArgs are the spec's parameters as the commands take them: a
// quota's period as its word; no TZ (see args).
func (s Spec) paramArgs() []any {
	out := make([]any, 0, s.n+2)
	for i := 0; i < s.n; i++ {
		if s.algorithm == AlgorithmQuota && i == 1 {
			out = append(out, Period(s.params[1]).String())
			continue
		}
		out = append(out, strconv.FormatInt(s.params[i], 10))
	}
	return out
}

// args are the words after the key of the spec's own command, or after the
// algorithm's name in RL.ALL: the parameters, and a quota's TZ zone when
// it is not UTC.
func (s Spec) args() []any {
	out := s.paramArgs()
	if s.algorithm == AlgorithmQuota && !zoneIsUTC(s.zone) {
		out = append(out, "TZ", s.zone)
	}
	return out
}

// IsZero reports the zero Spec (no algorithm): what a Limit that names a
// Policy holds.
func (s Spec) IsZero() bool { return s.algorithm == "" }

// specFromWire builds a spec from an algorithm's word and its parameters as
// RL.POLICY GET answers them (a quota's period as its word or its index),
// then validates it.
func specFromWire(algorithm string, params []int64, zone string) (Spec, error) {
	a := Algorithm(strings.ToUpper(algorithm))
	ps := paramsOf(a)
	if ps == nil {
		return Spec{}, &InvalidArgumentError{Rule: "RL.POLICY GET", Arg: "algorithm", Reason: fmt.Sprintf("unknown algorithm %q", algorithm)}
	}
	if len(params) != len(ps) {
		return Spec{}, &InvalidArgumentError{Rule: "RL.POLICY GET", Arg: "params", Reason: fmt.Sprintf("%s takes %d parameters, not %d", a, len(ps), len(params))}
	}
	s := Spec{algorithm: a, n: len(ps)}
	copy(s.params[:], params)
	if a == AlgorithmQuota && !zoneIsUTC(zone) {
		s.zone = zone
	}
	return s, s.Validate()
}

// parsePeriod is a period's word (DAY, WEEK, MONTH, YEAR, any case).
func parsePeriod(word string) (Period, bool) {
	for p := PeriodDay; p <= PeriodYear; p++ {
		if strings.EqualFold(word, p.String()) {
			return p, true
		}
	}
	return 0, false
}

// checkRequest checks a request's number against the option's range:
// COST and REFUND 0 to 2^40 (FORCE is COST's), UPTO 1 to 2^40. The error
// names the option as the server does.
func checkRequest(rule string, req Request) error {
	n := req.Units()
	switch {
	case req.IsUpTo():
		if n == 0 || n > MaxUpTo {
			return &InvalidArgumentError{Rule: rule, Arg: "UPTO", Reason: rangeReason("UPTO", 1, MaxParam)}
		}
	case req.IsRefund():
		if n > uint64(MaxParam) {
			return &InvalidArgumentError{Rule: rule, Arg: "REFUND", Reason: rangeReason("REFUND", 0, MaxParam)}
		}
	default:
		if n > uint64(MaxParam) {
			return &InvalidArgumentError{Rule: rule, Arg: "COST", Reason: rangeReason("COST", 0, MaxParam)}
		}
	}
	return nil
}

// requestArgs are the request's words: none for the zero Request (COST 1,
// the server's default), else COST n, COST n FORCE, REFUND n or UPTO n.
func requestArgs(req Request) []any {
	if !req.set {
		return nil
	}
	n := strconv.FormatUint(req.n, 10)
	switch req.kind {
	case kindForce:
		return []any{"COST", n, "FORCE"}
	case kindRefund:
		return []any{"REFUND", n}
	case kindUpTo:
		return []any{"UPTO", n}
	}
	return []any{"COST", n}
}

// checkUpToOn refuses UPTO on the limiters that do not take it, with the
// server's words.
func checkUpToOn(s Spec, req Request) error {
	if req.IsUpTo() && (s.algorithm == AlgorithmLeakyBucket || s.algorithm == AlgorithmConcurrency) {
		return &InvalidArgumentError{Rule: s.algorithm.Command(), Arg: "UPTO",
			Reason: "UPTO is not an option of " + s.algorithm.Command()}
	}
	return nil
}

// blockArgs are BLOCK's words for a wait of at most block, rounded up to a
// whole millisecond (0 waits without a limit); a negative wait or one above
// 2^40 ms is refused naming BLOCK.
func blockArgs(block int64) ([]any, error) {
	if block < 0 || block > MaxParam {
		return nil, &InvalidArgumentError{Arg: "BLOCK", Reason: rangeReason("BLOCK", 0, MaxParam)}
	}
	return []any{"BLOCK", strconv.FormatInt(block, 10)}, nil
}

// checkPolicyName: 1 to 256 bytes of printable ASCII without spaces.
func checkPolicyName(rule, name string) error {
	ok := len(name) >= 1 && len(name) <= 256
	for i := 0; ok && i < len(name); i++ {
		ok = name[i] >= '!' && name[i] <= '~'
	}
	if !ok {
		return &InvalidArgumentError{Rule: rule, Arg: "policy name", Reason: "must be 1 to 256 bytes of printable ASCII without spaces"}
	}
	return nil
}

// checkKey refuses an empty key.
func checkKey(rule, key string) error {
	if key == "" {
		return &InvalidArgumentError{Rule: rule, Arg: "key", Reason: "the key is empty"}
	}
	return nil
}

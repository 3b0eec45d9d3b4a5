package ratelimit

import (
	"context"
	"fmt"
	"math"
	"strconv"
	"time"
)

// sixth says what a reply has after its five integers.
type sixth int

const (
	sixthNone            sixth = iota // five integers (the rate limiters)
	sixthLease                        // six: lease (RL.CONCURRENCY)
	sixthMaybeLease                   // five, or six with a lease (RL.HIT: as the policy's algorithm)
	sixthDeniedBy                     // six: denied_by, 1-based (RL.ALL)
	sixthGranted                      // six: granted (UPTO)
	sixthDeniedByGranted              // seven: denied_by, then granted (RL.ALL ... UPTO)
)

// widths are the numbers of integers a reply may have.
func (s sixth) widths() (int, int) {
	switch s {
	case sixthLease, sixthDeniedBy, sixthGranted:
		return 6, 6
	case sixthMaybeLease:
		return 5, 6
	case sixthDeniedByGranted:
		return 7, 7
	}
	return 5, 5
}

// parseDecision reads a limiter's reply as the contract's replies give it:
// [allowed, limit, remaining, wait_ms, reset_ms] and, as s says, lease,
// denied_by (1-based on the wire, 0-based in Decision.DeniedBy) or granted.
// A reply of another shape is an error wrapping ErrProtocol.
func parseDecision(what string, v any, s sixth) (Decision, error) {
	items, ok := v.([]any)
	lo, hi := s.widths()
	if !ok || len(items) < lo || len(items) > hi {
		return Decision{}, fmt.Errorf("%w: %s answered %s, not %d to %d integers", ErrProtocol, what, describe(v), lo, hi)
	}
	ints := make([]int64, len(items))
	for i, it := range items {
		n, ok := it.(int64)
		if !ok {
			return Decision{}, fmt.Errorf("%w: %s answered %s, not integers", ErrProtocol, what, describe(v))
		}
		ints[i] = n
	}
	if ints[0] != 0 && ints[0] != 1 {
		return Decision{}, fmt.Errorf("%w: %s: allowed is %d", ErrProtocol, what, ints[0])
	}
	d := Decision{
		Allowed:    ints[0] == 1,
		Limit:      ints[1],
		Remaining:  ints[2],
		WaitMs:     ints[3],
		RetryAfter: msDuration(max(ints[3], 0)),
		ResetAfter: msDuration(max(ints[4], 0)),
		DeniedBy:   -1,
		Granted:    -1,
		Path:       PathRedis,
	}
	switch s {
	case sixthLease, sixthMaybeLease:
		if len(ints) == 6 && ints[5] > 0 {
			d.Lease = uint64(ints[5])
		}
	case sixthDeniedBy, sixthDeniedByGranted:
		if ints[5] > 0 {
			d.DeniedBy = int(ints[5] - 1)
		}
	}
	switch s {
	case sixthGranted:
		d.Granted = max(ints[5], 0)
	case sixthDeniedByGranted:
		d.Granted = max(ints[6], 0)
	}
	return d, nil
}

// msDuration is ms milliseconds, saturating.
func msDuration(ms int64) time.Duration {
	if ms > math.MaxInt64/int64(time.Millisecond) {
		return time.Duration(math.MaxInt64)
	}
	return time.Duration(ms) * time.Millisecond
}

func describe(v any) string {
	s := fmt.Sprintf("%T %v", v, v)
	if len(s) > 120 {
		s = s[:120] + "..."
	}
	return s
}

// sixthOf is what follows the five integers for a call with req on spec.
func sixthOf(s Spec, req Request) sixth {
	switch {
	case req.IsUpTo():
		return sixthGranted
	case s.algorithm == AlgorithmConcurrency:
		return sixthLease
	}
	return sixthNone
}

// limiterArgs checks and builds a limiter command: the spec, the key, the
// request.
func limiterArgs(key string, spec Spec, req Request) ([]any, error) {
	if err := spec.Validate(); err != nil {
		return nil, err
	}
	cmd := spec.algorithm.Command()
	if err := checkKey(cmd, key); err != nil {
		return nil, err
	}
	if err := checkRequest(cmd, req); err != nil {
		return nil, err
	}
	if err := checkUpToOn(spec, req); err != nil {
		return nil, err
	}
	args := append([]any{cmd, key}, spec.args()...)
	return append(args, requestArgs(req)...), nil
}

// decide sends a decision's command to the owner of the key at keyPos,
// within the client's deadline.
func (c *Client) decide(ctx context.Context, args []any, keyPos int, s sixth) (Decision, error) {
	v, err := c.exec(ctx, c.s.rdb, c.deadline, keyPos, args...)
	if err != nil {
		return Decision{}, err
	}
	return parseDecision(cmdName(args), v, s)
}

// Apply runs spec's command on key: RL.<ALGORITHM> key params... [COST n
// [FORCE] | REFUND n | UPTO n]. The spec, the key (not empty) and the
// request are checked first (an *InvalidArgumentError naming the
// argument; UPTO is refused on LEAKYBUCKET and CONCURRENCY). With UpTo,
// Decision.Granted is the units taken; on CONCURRENCY, Decision.Lease the
// lease granted.
func (c *Client) Apply(ctx context.Context, key string, spec Spec, req Request) (Decision, error) {
	args, err := limiterArgs(key, spec, req)
	if err != nil {
		return Decision{}, err
	}
	return c.decide(ctx, args, 1, sixthOf(spec, req))
}

// TokenBucket is RL.TOKENBUCKET key capacity refill_count refill_ms: a
// bucket of capacity tokens, refillCount of them back every refillMs.
func (c *Client) TokenBucket(ctx context.Context, key string, capacity, refillCount, refillMs int64, req Request) (Decision, error) {
	return c.Apply(ctx, key, TokenBucket(capacity, refillCount, refillMs), req)
}

// FixedWindow is RL.FIXEDWINDOW key limit window_ms.
func (c *Client) FixedWindow(ctx context.Context, key string, limit, windowMs int64, req Request) (Decision, error) {
	return c.Apply(ctx, key, FixedWindow(limit, windowMs), req)
}

// LeakyBucket is RL.LEAKYBUCKET key capacity leak_count leak_ms. An
// admission's RetryAfter is the delay before acting (its place in the
// queue). UPTO is refused.
func (c *Client) LeakyBucket(ctx context.Context, key string, capacity, leakCount, leakMs int64, req Request) (Decision, error) {
	return c.Apply(ctx, key, LeakyBucket(capacity, leakCount, leakMs), req)
}

// Sliding is RL.SLIDING key limit window_ms: an exact sliding log.
func (c *Client) Sliding(ctx context.Context, key string, limit, windowMs int64, req Request) (Decision, error) {
	return c.Apply(ctx, key, SlidingWindow(limit, windowMs), req)
}

// HashWindow is RL.HASHWINDOW key limit window_ms bucket_ms.
func (c *Client) HashWindow(ctx context.Context, key string, limit, windowMs, bucketMs int64, req Request) (Decision, error) {
	return c.Apply(ctx, key, HashWindow(limit, windowMs, bucketMs), req)
}

// Quota is RL.QUOTA key limit DAY|WEEK|MONTH|YEAR [TZ zone]: at most limit
// units per calendar period in zone ("" or "UTC": UTC; "+05:30"; an IANA
// name such as "America/New_York", which the server's database must know).
// ResetAfter runs to the end of the period, a denial's RetryAfter to the
// start of the next one.
func (c *Client) Quota(ctx context.Context, key string, limit int64, p Period, zone string, req Request) (Decision, error) {
	return c.Apply(ctx, key, QuotaSpec(limit, p, zone), req)
}

// Concurrency is RL.CONCURRENCY key limit lease_ms: at most limit units
// held at once by leases. An admission holds the lease Decision.Lease
// until Release, or leaseMs after it was granted or renewed. Apply with a
// ConcurrencySpec takes other requests (COST n, FORCE, REFUND).
func (c *Client) Concurrency(ctx context.Context, key string, limit, leaseMs int64) (Decision, error) {
	return c.Apply(ctx, key, ConcurrencySpec(limit, leaseMs), Request{})
}

// Release is RL.RELEASE key lease: whether the lease was still held (false
// when it had ended, was never granted, or the key is gone).
func (c *Client) Release(ctx context.Context, key string, lease uint64) (bool, error) {
	if err := checkKey("RL.RELEASE", key); err != nil {
		return false, err
	}
	if err := checkLease("RL.RELEASE", lease); err != nil {
		return false, err
	}
	return c.flag(ctx, "RL.RELEASE", key, strconv.FormatUint(lease, 10))
}

// Renew is RL.RENEW key lease lease_ms: the lease now ends leaseMs from
// now; whether it was still held.
func (c *Client) Renew(ctx context.Context, key string, lease uint64, leaseMs int64) (bool, error) {
	if err := checkKey("RL.RENEW", key); err != nil {
		return false, err
	}
	if err := checkLease("RL.RENEW", lease); err != nil {
		return false, err
	}
	if leaseMs < 1 || leaseMs > MaxParam {
		return false, &InvalidArgumentError{Rule: "RL.RENEW", Arg: "lease_ms", Reason: rangeReason("lease_ms", 1, MaxParam)}
	}
	return c.flag(ctx, "RL.RENEW", key, strconv.FormatUint(lease, 10), strconv.FormatInt(leaseMs, 10))
}

func checkLease(rule string, lease uint64) error {
	if lease > math.MaxInt64 {
		return &InvalidArgumentError{Rule: rule, Arg: "lease", Reason: rangeReason("lease", 0, math.MaxInt64)}
	}
	return nil
}

// flag sends a command on key that answers 1 or 0.
func (c *Client) flag(ctx context.Context, cmd, key string, rest ...any) (bool, error) {
	v, err := c.exec(ctx, c.s.rdb, c.deadline, 1, append([]any{cmd, key}, rest...)...)
	if err != nil {
		return false, err
	}
	n, ok := v.(int64)
	if !ok || (n != 0 && n != 1) {
		return false, fmt.Errorf("%w: %s answered %s", ErrProtocol, cmd, describe(v))
	}
	return n == 1, nil
}

// hitArgs checks and builds RL.HIT policy key [request].
func hitArgs(policy, key string, req Request) ([]any, error) {
	if err := checkPolicyName("RL.HIT", policy); err != nil {
		return nil, err
	}
	if err := checkKey("RL.HIT", key); err != nil {
		return nil, err
	}
	if err := checkRequest("RL.HIT", req); err != nil {
		return nil, err
	}
	return append([]any{"RL.HIT", policy, key}, requestArgs(req)...), nil
}

func hitSixth(req Request) sixth {
	if req.IsUpTo() {
		return sixthGranted
	}
	return sixthMaybeLease
}

// Hit is RL.HIT policy key [request]: the policy's rule applied to key,
// sent to the owner of key (the command's second argument), not of the
// policy's name. The reply is the policy's algorithm's: on a CONCURRENCY
// policy an admission carries Decision.Lease; with UpTo, Decision.Granted
// (the server refuses UPTO on a LEAKYBUCKET or CONCURRENCY policy).
func (c *Client) Hit(ctx context.Context, policy, key string, req Request) (Decision, error) {
	args, err := hitArgs(policy, key, req)
	if err != nil {
		return Decision{}, err
	}
	return c.decide(ctx, args, 2, hitSixth(req))
}

// Limit is one limiter of RL.ALL: its Key, and either an inline Spec or the
// name of a Policy (POLICY name), not both.
type Limit struct {
	Key    string
	Spec   Spec
	Policy string
}

// allArgs checks and builds RL.ALL numkeys key... spec... [request].
func (c *Client) allArgs(limits []Limit, req Request) ([]any, sixth, error) {
	const cmd = "RL.ALL"
	if len(limits) < 1 || len(limits) > maxAllKeys {
		return nil, 0, &InvalidArgumentError{Rule: cmd, Arg: "numkeys", Reason: fmt.Sprintf("RL.ALL takes 1 to %d limiters, not %d", maxAllKeys, len(limits))}
	}
	if req.IsRefund() {
		return nil, 0, &InvalidArgumentError{Rule: cmd, Arg: "REFUND", Reason: "RL.ALL takes COST n [FORCE] or UPTO n, not REFUND: refund each limiter with its own command"}
	}
	if err := checkRequest(cmd, req); err != nil {
		return nil, 0, err
	}
	seen := make(map[string]bool, len(limits))
	args := make([]any, 0, 2+len(limits)*5+2)
	args = append(args, cmd, strconv.Itoa(len(limits)))
	for i, l := range limits {
		if err := checkKey(cmd, l.Key); err != nil {
			return nil, 0, err
		}
		if seen[l.Key] {
			return nil, 0, &InvalidArgumentError{Rule: cmd, Arg: "key", Reason: fmt.Sprintf("key %q is given twice", l.Key)}
		}
		seen[l.Key] = true
		if c != nil && c.IsCluster() && KeySlot(l.Key) != KeySlot(limits[0].Key) {
			return nil, 0, &InvalidArgumentError{Rule: cmd, Arg: "key", Reason: fmt.Sprintf(
				"on a cluster RL.ALL's keys must share a slot (use a hash tag such as {orders}): %q is in slot %d, %q in %d",
				limits[0].Key, KeySlot(limits[0].Key), l.Key, KeySlot(l.Key))}
		}
		args = append(args, l.Key)
		_ = i
	}
	for i, l := range limits {
		switch {
		case l.Policy != "" && !l.Spec.IsZero():
			return nil, 0, &InvalidArgumentError{Rule: cmd, Arg: "spec", Reason: fmt.Sprintf("limit %d has both a Spec and a Policy", i)}
		case l.Policy != "":
			if err := checkPolicyName(cmd, l.Policy); err != nil {
				return nil, 0, err
			}
			args = append(args, "POLICY", l.Policy)
		default:
			if err := l.Spec.Validate(); err != nil {
				return nil, 0, err
			}
			if l.Spec.algorithm == AlgorithmConcurrency {
				return nil, 0, &InvalidArgumentError{Rule: cmd, Arg: "spec", Reason: fmt.Sprintf(
					"spec %d: CONCURRENCY cannot be used in RL.ALL: a lease is taken and released on its own key", i+1)}
			}
			if req.IsUpTo() && l.Spec.algorithm == AlgorithmLeakyBucket {
				return nil, 0, &InvalidArgumentError{Rule: cmd, Arg: "UPTO", Reason: fmt.Sprintf(
					"UPTO is not an option of RL.ALL with a LEAKYBUCKET limiter (spec %d)", i+1)}
			}
			args = append(args, string(l.Spec.algorithm))
			args = append(args, l.Spec.args()...)
		}
	}
	args = append(args, requestArgs(req)...)
	if req.IsUpTo() {
		return args, sixthDeniedByGranted, nil
	}
	return args, sixthDeniedBy, nil
}

// All is RL.ALL: several limiters in one atomic call, all or nothing, sent
// to the owner of the first key (on a cluster every key must share a
// slot: use a hash tag; a key elsewhere is refused before sending).
// Decision.DeniedBy is the 0-based position of the first limiter that
// denied (-1 when admitted). req is Cost(n), Force(n) or UpTo(n) (then
// Decision.Granted is the most units every limiter admitted at once);
// Refund is refused.
func (c *Client) All(ctx context.Context, limits []Limit, req Request) (Decision, error) {
	args, s, err := c.allArgs(limits, req)
	if err != nil {
		return Decision{}, err
	}
	return c.decide(ctx, args, 2, s)
}

// Acquire is a blocking call: spec's command with BLOCK, which the server
// answers when the request is admitted, or with the denial when block
// passes first (or at once when it could not pass within it). block is
// rounded up to whole milliseconds; 0 waits without a limit; negative or
// above 2^40 ms is refused naming BLOCK. The call waits in the server on a
// connection of its own (a pool that serves only blocking calls, so a wait
// holds none of the connections the decisions use; a connection whose call
// failed or was cancelled is closed, and the server then takes nothing for
// it), and its deadline is the client's extended by block (no deadline but
// ctx's for BLOCK 0). Never retried. Acquire returns when the caller may
// act: for an admitted leaky bucket, after its RetryAfter (or with ctx's
// error if ctx ends first).
func (c *Client) Acquire(ctx context.Context, key string, spec Spec, req Request, block time.Duration) (Decision, error) {
	args, err := limiterArgs(key, spec, req)
	if err != nil {
		return Decision{}, err
	}
	return c.blocking(ctx, args, 1, sixthOf(spec, req), block)
}

// AcquireHit is Acquire on a policy: RL.HIT policy key ... BLOCK. A policy
// in SHADOW or OFF never denies, so it never waits.
func (c *Client) AcquireHit(ctx context.Context, policy, key string, req Request, block time.Duration) (Decision, error) {
	args, err := hitArgs(policy, key, req)
	if err != nil {
		return Decision{}, err
	}
	return c.blocking(ctx, args, 2, hitSixth(req), block)
}

// AcquireAll is Acquire on several limiters at once: RL.ALL ... BLOCK,
// admitted when all of them admit together.
func (c *Client) AcquireAll(ctx context.Context, limits []Limit, req Request, block time.Duration) (Decision, error) {
	args, s, err := c.allArgs(limits, req)
	if err != nil {
		return Decision{}, err
	}
	return c.blocking(ctx, args, 2, s, block)
}

// blockMs is a wait in whole milliseconds, rounded up.
func blockMs(block time.Duration) int64 {
	if block <= 0 {
		return int64(block / time.Millisecond)
	}
	return int64((block + time.Millisecond - 1) / time.Millisecond)
}

// blocking sends a command with BLOCK on the blocking calls' pool.
func (c *Client) blocking(ctx context.Context, args []any, keyPos int, s sixth, block time.Duration) (Decision, error) {
	ms := blockMs(block)
	words, err := blockArgs(ms)
	if err != nil {
		return Decision{}, err
	}
	args = append(args, words...)
	var deadline time.Duration
	if ms > 0 {
		deadline = c.deadline + msDuration(ms) + msDuration(ms/10)
	}
	v, err := c.exec(ctx, c.s.acquire, deadline, keyPos, args...)
	if err != nil {
		return Decision{}, err
	}
	d, err := parseDecision(cmdName(args), v, s)
	if err != nil {
		return Decision{}, err
	}
	if d.Allowed && d.WaitMs > 0 {
		t := time.NewTimer(d.RetryAfter)
		defer t.Stop()
		select {
		case <-t.C:
		case <-ctx.Done():
			return d, ctx.Err()
		}
	}
	return d, nil
}

// ThrottleResult is CL.THROTTLE's reply, redis-cell's five integers.
type ThrottleResult struct {
	// Limited: the call was refused (nothing taken); false: its units
	// were taken.
	Limited bool
	// Limit is the bucket's size, max_burst + 1.
	Limit int64
	// Remaining is the units left right after this call.
	Remaining int64
	// RetryAfterS: limited, the seconds until the same call is allowed
	// (rounded up), -1 when it never can be; -1 when allowed.
	RetryAfterS int64
	// ResetAfterS is the seconds until the bucket is full again, rounded
	// up.
	ResetAfterS int64
}

// maxThrottleSpanS is CL.THROTTLE's longest fill: 100 years.
const maxThrottleSpanS = 3_155_760_000

// Throttle is CL.THROTTLE key max_burst count period quantity, redis-cell's
// command as the module answers it (on redis-cell's keys): a bucket of
// maxBurst + 1 units gaining count units every periodS seconds; quantity
// units taken if it holds them (0 peeks). Ranges (an *InvalidArgumentError
// naming the argument): maxBurst and quantity 0 to 2^40, count and periodS
// 1 to 2^40, a unit no shorter than 1 ns (count <= periodS x 10^9) and a
// fill within 100 years (Arg "span" for either).
func (c *Client) Throttle(ctx context.Context, key string, maxBurst, count, periodS, quantity int64) (ThrottleResult, error) {
	const cmd = "CL.THROTTLE"
	if err := checkKey(cmd, key); err != nil {
		return ThrottleResult{}, err
	}
	for _, p := range []struct {
		name     string
		v, lo    int64
		isPeriod bool
	}{{"max_burst", maxBurst, 0, false}, {"count", count, 1, false}, {"period", periodS, 1, true}, {"quantity", quantity, 0, false}} {
		if p.v < p.lo || p.v > MaxParam {
			return ThrottleResult{}, &InvalidArgumentError{Rule: cmd, Arg: p.name, Reason: rangeReason(p.name, p.lo, MaxParam)}
		}
	}
	if !fitsMul(periodS, 1_000_000_000, count) {
		return ThrottleResult{}, &InvalidArgumentError{Rule: cmd, Arg: "span", Reason: "period / count (the time one unit takes to come back) must be at least 1 ns (the state counts nanoseconds)"}
	}
	if !fitsMul2(maxBurst+1, periodS, maxThrottleSpanS, count) {
		return ThrottleResult{}, &InvalidArgumentError{Rule: cmd, Arg: "span", Reason: "(max_burst + 1) * period / count (the time to fill the bucket) must be at most 100 years (3155760000 s)"}
	}
	v, err := c.exec(ctx, c.s.rdb, c.deadline, 1, cmd, key, strconv.FormatInt(maxBurst, 10), strconv.FormatInt(count, 10),
		strconv.FormatInt(periodS, 10), strconv.FormatInt(quantity, 10))
	if err != nil {
		return ThrottleResult{}, err
	}
	items, ok := v.([]any)
	if !ok || len(items) != 5 {
		return ThrottleResult{}, fmt.Errorf("%w: %s answered %s, not 5 integers", ErrProtocol, cmd, describe(v))
	}
	var n [5]int64
	for i, it := range items {
		if n[i], ok = it.(int64); !ok {
			return ThrottleResult{}, fmt.Errorf("%w: %s answered %s, not 5 integers", ErrProtocol, cmd, describe(v))
		}
	}
	return ThrottleResult{Limited: n[0] == 1, Limit: n[1], Remaining: n[2], RetryAfterS: n[3], ResetAfterS: n[4]}, nil
}

// fitsMul: count <= a * b (a, b, count non-negative, in 128 bits).
func fitsMul(a, b, count int64) bool {
	return fitsMul2(count, 1, a, b)
}

// fitsMul2: a * b <= c * d (all non-negative, in 128 bits).
func fitsMul2(a, b, c, d int64) bool {
	return cmp128(uint64(a), uint64(b), uint64(c), uint64(d)) <= 0
}

package redisrate

import (
	"context"
	"errors"
	"fmt"
	"math"
	"reflect"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/redis-ratelimit/redis-ratelimit/clients/go/ratelimit"
)

// KeyPrefix is put before every key: the limiter of key k lives in
// "rl:redisrate:" + k. It is not redis_rate's "rate:" on purpose: redis_rate
// keeps a string there, and the module's bucket is a native type
// (rl-tokbkt), so sharing the name would answer WRONGTYPE to whichever
// library came second during a migration. With distinct names both run side
// by side; a key moved to this package starts with a full bucket, and
// redis_rate's old string expires by itself (its TTL is its reset time).
const KeyPrefix = "rl:redisrate:"

// maxParam is the module's largest parameter, COST or UPTO: 2^40.
const maxParam = 1 << 40

// rediser is what NewLimiter takes: the very methods go-redis/redis_rate v10
// asks of its client, so every value it accepts is accepted here
// (*redis.Client, *redis.ClusterClient, *redis.Ring, a failover client,
// redis.UniversalClient, a wrapper of one's own).
type rediser interface {
	Eval(ctx context.Context, script string, keys []string, args ...interface{}) *redis.Cmd
	EvalSha(ctx context.Context, sha1 string, keys []string, args ...interface{}) *redis.Cmd
	ScriptExists(ctx context.Context, hashes ...string) *redis.BoolSliceCmd
	ScriptLoad(ctx context.Context, script string) *redis.StringCmd
	Del(ctx context.Context, keys ...string) *redis.IntCmd

	EvalRO(ctx context.Context, script string, keys []string, args ...interface{}) *redis.Cmd
	EvalShaRO(ctx context.Context, sha1 string, keys []string, args ...interface{}) *redis.Cmd
}

// doer is the generic command every go-redis client has. A client without
// it (a wrapper exposing only rediser's methods) gets RL.TOKENBUCKET through
// a one-line script instead.
type doer interface {
	Do(ctx context.Context, args ...interface{}) *redis.Cmd
}

// viaScript calls the module from Lua, for clients without Do.
var viaScript = redis.NewScript(`return redis.call('RL.TOKENBUCKET', KEYS[1], unpack(ARGV))`)

// Limit is a rate: Rate events per Period, with bursts of up to Burst.
// It maps onto RL.TOKENBUCKET with capacity Burst and Rate tokens back per
// Period.
type Limit struct {
	Rate   int
	Burst  int
	Period time.Duration
}

// String is "<rate> req/<period> (burst <burst>)", as redis_rate writes it:
// "10 req/s (burst 10)".
func (l Limit) String() string {
	return fmt.Sprintf("%d req/%s (burst %d)", l.Rate, periodName(l.Period), l.Burst)
}

// IsZero reports the zero Limit (no rate, no burst, no period). Calls with
// it are an error, not "no limit".
func (l Limit) IsZero() bool {
	return l == Limit{}
}

func periodName(d time.Duration) string {
	switch d {
	case time.Second:
		return "s"
	case time.Minute:
		return "m"
	case time.Hour:
		return "h"
	}
	return d.String()
}

// PerSecond is rate events a second, bursts of rate.
func PerSecond(rate int) Limit {
	return Limit{Rate: rate, Burst: rate, Period: time.Second}
}

// PerMinute is rate events a minute, bursts of rate.
func PerMinute(rate int) Limit {
	return Limit{Rate: rate, Burst: rate, Period: time.Minute}
}

// PerHour is rate events an hour, bursts of rate.
func PerHour(rate int) Limit {
	return Limit{Rate: rate, Burst: rate, Period: time.Hour}
}

// Limiter decides how often events may happen, per key, with the module's
// RL.TOKENBUCKET: one round trip per call to the node that owns the key.
// Its zero value has no client: every call is an error.
type Limiter struct {
	rdb rediser
	do  doer
}

// NewLimiter is a Limiter on rdb, which takes what redis_rate's NewLimiter
// takes. A nil rdb (or a nil pointer of a client type) does not panic: every
// call on the Limiter returns an *ratelimit.InvalidArgumentError naming
// "rdb".
func NewLimiter(rdb rediser) *Limiter {
	if isNil(rdb) {
		return &Limiter{}
	}
	l := &Limiter{rdb: rdb}
	if d, ok := rdb.(doer); ok {
		l.do = d
	}
	return l
}

func isNil(v interface{}) bool {
	if v == nil {
		return true
	}
	rv := reflect.ValueOf(v)
	switch rv.Kind() {
	case reflect.Pointer, reflect.Interface, reflect.Map, reflect.Slice, reflect.Func, reflect.Chan:
		return rv.IsNil()
	}
	return false
}

// Result is a Limiter's answer, with redis_rate's meanings.
type Result struct {
	// Limit is the limit that was used to obtain this result.
	Limit Limit

	// Allowed is the number of events granted now: n for an admitted
	// AllowN, 0 for a denied one (and for n = 0, a check); between 1 and n
	// for an admitted AllowAtMost.
	Allowed int

	// Remaining is the number of events that could be permitted at once
	// right after this call: whole tokens left in the bucket. It is 0 when
	// the call was denied (as redis_rate answers), even if fewer tokens
	// than asked were left.
	Remaining int

	// RetryAfter is the time until the same call would be permitted; -1
	// when this one was.
	RetryAfter time.Duration

	// ResetAfter is the time until the bucket is full again (the Limiter
	// back in its initial state), to the millisecond, rounded up.
	ResetAfter time.Duration
}

// Allow is AllowN(ctx, key, limit, 1).
func (l Limiter) Allow(ctx context.Context, key string, limit Limit) (*Result, error) {
	return l.AllowN(ctx, key, limit, 1)
}

// AllowN takes n events if all of them fit now, or none (RL.TOKENBUCKET
// COST n). n = 0 is a check: it takes nothing, creates no key, and answers
// Allowed 0 with the tokens left in Remaining. n < 0 is an error.
func (l Limiter) AllowN(ctx context.Context, key string, limit Limit, n int) (*Result, error) {
	args, err := l.args(key, limit)
	if err != nil {
		return nil, err
	}
	if n < 0 {
		return nil, badArg("n", "must not be negative (redis_rate would give tokens back; use the ratelimit package's Refund)")
	}
	if n > maxParam {
		return nil, badArg("n", "must be at most 1099511627776 (2^40), the module's largest COST")
	}
	r, err := l.call(ctx, append(args, "COST", n), false)
	if err != nil {
		return nil, err
	}
	res := &Result{Limit: limit, ResetAfter: ms(r.resetMs), RetryAfter: -1}
	switch {
	case n == 0:
		res.Remaining = int(r.remaining)
	case r.allowed:
		res.Allowed = n
		res.Remaining = int(r.remaining)
	case r.waitMs >= 0:
		res.RetryAfter = ms(r.waitMs)
	default:
		// n > Burst: it never passes. redis_rate answers the time its GCRA
		// would take to let it through, had the bucket room for it: the
		// time until full, plus (n - Burst) emission intervals.
		res.RetryAfter = addDur(res.ResetAfter, intervals(limit, int64(n)-int64(limit.Burst)))
	}
	return res, nil
}

// AllowAtMost takes as many events as fit now, at most n and at least one
// (RL.TOKENBUCKET UPTO n): Allowed is the number taken, and Remaining is
// then 0 when fewer than n were. When not even one fits, it is a denial:
// Allowed 0, RetryAfter the time until one event fits. n = 0 is a check as
// in AllowN (empty, it answers RetryAfter the time until one event fits, as
// redis_rate); n < 0 is an error.
func (l Limiter) AllowAtMost(ctx context.Context, key string, limit Limit, n int) (*Result, error) {
	args, err := l.args(key, limit)
	if err != nil {
		return nil, err
	}
	if n < 0 {
		return nil, badArg("n", "must not be negative")
	}
	if n == 0 {
		r, err := l.call(ctx, append(args, "COST", 0), false)
		if err != nil {
			return nil, err
		}
		res := &Result{Limit: limit, Remaining: int(r.remaining), ResetAfter: ms(r.resetMs), RetryAfter: -1}
		if r.remaining == 0 {
			// Not one token: the time until one is back, from the time
			// until full (the module's check answers no wait).
			wait := res.ResetAfter - intervals(limit, int64(limit.Burst)-1)
			res.RetryAfter = max(wait, 0)
		}
		return res, nil
	}
	// More than the burst never fits: ask for what can.
	upTo := min(int64(n), maxParam)
	r, err := l.call(ctx, append(args, "UPTO", upTo), true)
	if err != nil {
		return nil, err
	}
	res := &Result{Limit: limit, ResetAfter: ms(r.resetMs), RetryAfter: -1}
	if r.granted > 0 {
		res.Allowed = int(r.granted)
		res.Remaining = int(r.remaining)
	} else {
		res.RetryAfter = ms(max(r.waitMs, 0))
	}
	return res, nil
}

// Reset deletes the key's limiter: the next call finds a full bucket.
func (l *Limiter) Reset(ctx context.Context, key string) error {
	if l == nil || l.rdb == nil {
		return badArg("rdb", "the Limiter has no client (NewLimiter was given nil)")
	}
	if err := l.rdb.Del(ctx, KeyPrefix+key).Err(); err != nil {
		return wrapErr("DEL", err)
	}
	return nil
}

// args are RL.TOKENBUCKET's key and parameters for the limit, or the error
// naming the field at fault.
func (l Limiter) args(key string, limit Limit) ([]interface{}, error) {
	if l.rdb == nil {
		return nil, badArg("rdb", "the Limiter has no client (NewLimiter was given nil)")
	}
	capacity, count, periodMs, err := bucketParams(limit)
	if err != nil {
		return nil, err
	}
	return []interface{}{"RL.TOKENBUCKET", KeyPrefix + key, capacity, count, periodMs}, nil
}

// bucketParams maps a Limit onto RL.TOKENBUCKET's capacity, refill_count and
// refill_ms. A Period that is not whole milliseconds is scaled exactly:
// Rate per 1.5 ms is 2*Rate per 3 ms (the smallest whole ms multiple), so
// no rounding changes the rate.
func bucketParams(limit Limit) (capacity, count, periodMs int64, err error) {
	switch {
	case limit.Rate <= 0:
		return 0, 0, 0, badArg("Limit.Rate", "must be at least 1 (events per Period)")
	case limit.Period <= 0:
		return 0, 0, 0, badArg("Limit.Period", "must be positive")
	case limit.Burst < 0:
		return 0, 0, 0, badArg("Limit.Burst", "must not be negative")
	case limit.Burst == 0:
		return 0, 0, 0, badArg("Limit.Burst", "must be at least 1 (the bucket's capacity; redis_rate denies every call with Burst 0)")
	case int64(limit.Burst) > maxParam:
		return 0, 0, 0, badArg("Limit.Burst", "must be at most 1099511627776 (2^40)")
	case int64(limit.Rate) > maxParam:
		return 0, 0, 0, badArg("Limit.Rate", "must be at most 1099511627776 (2^40)")
	}
	const nsPerMs = int64(time.Millisecond)
	p := int64(limit.Period)
	g := gcd(p, nsPerMs)
	periodMs = p / g
	scale := nsPerMs / g
	if periodMs > maxParam {
		return 0, 0, 0, badArg("Limit.Period", "is too long for the module (at most 2^40 ms, after scaling to whole milliseconds)")
	}
	if int64(limit.Rate) > maxParam/scale {
		return 0, 0, 0, badArg("Limit.Period", fmt.Sprintf("%v is not whole milliseconds and Rate %d scaled to its ms multiple exceeds 2^40", limit.Period, limit.Rate))
	}
	return int64(limit.Burst), int64(limit.Rate) * scale, periodMs, nil
}

func gcd(a, b int64) int64 {
	for b != 0 {
		a, b = b, a%b
	}
	return a
}

// intervals is k emission intervals (Period / Rate each) as a Duration,
// saturating.
func intervals(limit Limit, k int64) time.Duration {
	f := float64(k) * float64(limit.Period) / float64(limit.Rate)
	if f >= math.MaxInt64 {
		return math.MaxInt64
	}
	if f <= math.MinInt64 {
		return math.MinInt64
	}
	return time.Duration(f)
}

func addDur(a, b time.Duration) time.Duration {
	if b > 0 && a > math.MaxInt64-b {
		return math.MaxInt64
	}
	return a + b
}

func ms(v int64) time.Duration {
	if v > math.MaxInt64/int64(time.Millisecond) {
		return math.MaxInt64
	}
	return time.Duration(v) * time.Millisecond
}

// reply is RL.TOKENBUCKET's reply.
type reply struct {
	allowed                  bool
	limit, remaining         int64
	waitMs, resetMs, granted int64
}

func (l Limiter) call(ctx context.Context, args []interface{}, upTo bool) (reply, error) {
	var v interface{}
	var err error
	if l.do != nil {
		v, err = l.do.Do(ctx, args...).Result()
	} else {
		v, err = viaScript.Run(ctx, l.rdb, []string{args[1].(string)}, args[2:]...).Result()
	}
	if err != nil {
		return reply{}, wrapErr("RL.TOKENBUCKET", err)
	}
	a, ok := v.([]interface{})
	want := 5
	if upTo {
		want = 6
	}
	if !ok || len(a) != want {
		return reply{}, fmt.Errorf("redisrate: RL.TOKENBUCKET answered %v: %w", v, ratelimit.ErrProtocol)
	}
	ints := make([]int64, want)
	for i, x := range a {
		n, ok := x.(int64)
		if !ok {
			return reply{}, fmt.Errorf("redisrate: RL.TOKENBUCKET answered %v (field %d is not an integer): %w", v, i, ratelimit.ErrProtocol)
		}
		ints[i] = n
	}
	r := reply{allowed: ints[0] == 1, limit: ints[1], remaining: ints[2], waitMs: ints[3], resetMs: ints[4], granted: -1}
	if upTo {
		r.granted = ints[5]
	}
	return r, nil
}

func badArg(arg, reason string) error {
	return &ratelimit.InvalidArgumentError{Rule: "redisrate", Arg: arg, Reason: reason}
}

// Error wraps both the kit's error (a sentinel or *ratelimit.ServerError)
// and go-redis's, so errors.Is and errors.As find either.
type wrapped struct {
	msg  string
	errs []error
}

func (w *wrapped) Error() string   { return w.msg }
func (w *wrapped) Unwrap() []error { return w.errs }

// wrapErr classifies a go-redis error: an unknown command is
// ratelimit.ErrModuleMissing, another server error a *ratelimit.ServerError,
// a deadline ratelimit.ErrTimeout, a broken connection
// ratelimit.ErrConnection; context cancellation stays as it is.
func wrapErr(cmd string, err error) error {
	var rerr redis.Error
	if errors.As(err, &rerr) {
		msg := rerr.Error()
		if redis.HasErrorPrefix(err, "unknown command") {
			return &wrapped{msg: "redisrate: " + cmd + ": " + msg + ": " + ratelimit.ErrModuleMissing.Error(),
				errs: []error{ratelimit.ErrModuleMissing, err}}
		}
		se := &ratelimit.ServerError{Message: msg}
		return &wrapped{msg: "redisrate: " + cmd + ": " + se.Error(), errs: []error{se, err}}
	}
	if errors.Is(err, context.Canceled) {
		return fmt.Errorf("redisrate: %s: %w", cmd, err)
	}
	kind := ratelimit.ErrConnection
	if isTimeout(err) {
		kind = ratelimit.ErrTimeout
	}
	return &wrapped{msg: "redisrate: " + cmd + ": " + err.Error() + " (" + kind.Error() + ")", errs: []error{kind, err}}
}

func isTimeout(err error) bool {
	if errors.Is(err, context.DeadlineExceeded) {
		return true
	}
	var te interface{ Timeout() bool }
	return errors.As(err, &te) && te.Timeout()
}

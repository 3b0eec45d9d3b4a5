// Package redisrate is go-redis/redis_rate v10's API on the redis-ratelimit
// module: the same names, types and meanings, with RL.TOKENBUCKET in place
// of redis_rate's Lua script. A redis_rate user switches by the import path:
//
//	import redis_rate "github.com/redis-ratelimit/redis-ratelimit/clients/go/redisrate"
//
//	limiter := redis_rate.NewLimiter(rdb) // the same *redis.Client, ClusterClient, Ring...
//	res, err := limiter.Allow(ctx, "project:123", redis_rate.PerSecond(10))
//
// A Limit{Rate, Burst, Period} is RL.TOKENBUCKET with capacity Burst and
// Rate tokens back every Period: the same GCRA as redis_rate's (Burst events
// at once from idle, then one every Period/Rate), computed by the module in
// integers on the server's clock, one round trip per call, to the node that
// owns the key (a cluster client routes it; redis_rate's script does too).
// Allow, AllowN, AllowAtMost (UPTO: a partial grant), Reset and Result
// (Allowed the units granted, RetryAfter -1 when allowed) keep redis_rate's
// meanings. Where the answers differ:
//
//   - Keys: the limiter of key k is KeyPrefix + k ("rl:redisrate:k"), not
//     redis_rate's "rate:k": redis_rate stores a string there, the module a
//     native type, and a shared name would answer WRONGTYPE during a
//     migration. Both libraries run side by side on one server; a key that
//     moves here starts with a full bucket (the old string expires by
//     itself). A key of another type under KeyPrefix is an error wrapping
//     *ratelimit.ServerError (WRONGTYPE), the key left alone.
//   - Exact integers: redis_rate computes on float seconds, so tokens can
//     come out one short (2.9999 floored to 2); the module counts exact
//     ticks. Remaining is whole tokens in both.
//   - The clock: both read the server's TIME once per call (microseconds).
//     RetryAfter and ResetAfter are whole milliseconds rounded up here
//     (redis_rate: float seconds, nanoseconds in the Duration).
//   - AllowAtMost's partial grant takes whole tokens: with 2.7 tokens in the
//     bucket it grants 2 and leaves the 0.7; redis_rate grants 2 but takes
//     2.7, so its ResetAfter after a partial grant is the full Burst*Period/Rate
//     and this one up to one interval less.
//   - Changing a key's Limit carries over what was consumed as tokens (the
//     module's rule: a raised Burst or Rate gives room at once, nothing
//     refills); redis_rate keeps one instant, so a new Rate reinterprets it.
//   - Period need not be whole milliseconds: Rate per 1.5 ms is sent as 2*Rate
//     per 3 ms, exactly. A Period or Rate the module cannot hold (above 2^40
//     after that scaling, or a bucket that takes over 100 years to fill) is
//     an error.
//   - AllowN with n > Burst can never pass: the module knows it (wait -1); the
//     Result is redis_rate's (Allowed 0, RetryAfter the time until full plus
//     (n - Burst) intervals, a time after which it still fails).
//   - Denials answer Remaining 0, as redis_rate, even when some tokens are
//     left (AllowN(5) with 3 left).
//   - AllowAtMost(n = 0) on an empty bucket: RetryAfter, the time until one
//     token, is computed from ResetAfter (to the millisecond).
//   - Bad input is an error (*ratelimit.InvalidArgumentError naming the field:
//     Limit.Rate, Limit.Period, Limit.Burst, n, rdb), never a panic nor a
//     silent answer: Rate <= 0 or Period <= 0 (redis_rate divides by zero in
//     Lua), Burst 0 (redis_rate denies everything, forever) or negative,
//     n < 0 (redis_rate gives tokens back), n above 2^40 in AllowN, a nil
//     client (NewLimiter(nil) and the zero Limiter: every call is an error).
//   - Errors wrap the kit's: an unknown command (the module not loaded) is
//     ratelimit.ErrModuleMissing, a server error *ratelimit.ServerError, a
//     deadline ratelimit.ErrTimeout, a broken connection
//     ratelimit.ErrConnection; go-redis's own error stays in the chain.
//   - Retries: none here, but go-redis retries a command on some network
//     errors per its MaxRetries (as for redis_rate's script); set MaxRetries -1
//     on the client to never send a limiter write twice.
//
// A client that has only redis_rate's methods (no Do: a wrapper of one's
// own) gets RL.TOKENBUCKET through a one-line script (EVALSHA).
package redisrate

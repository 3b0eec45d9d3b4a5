package redisrate_test

import (
	"context"
	"fmt"

	"github.com/redis/go-redis/v9"

	// was: "github.com/go-redis/redis_rate/v10"
	redis_rate "github.com/redis-ratelimit/redis-ratelimit/clients/go/redisrate"
)

// redis_rate's README example with the import changed: nothing else. (It
// needs a server with the module on localhost:6379, so it is compiled, not
// run; TestRedisRate/*/ReadmeExample runs it on real servers.)
func ExampleNewLimiter() {
	ctx := context.Background()
	rdb := redis.NewClient(&redis.Options{
		Addr: "localhost:6379",
	})
	_ = rdb.FlushDB(ctx).Err()

	limiter := redis_rate.NewLimiter(rdb)
	res, err := limiter.Allow(ctx, "project:123", redis_rate.PerSecond(10))
	if err != nil {
		panic(err)
	}
	fmt.Println("allowed", res.Allowed, "remaining", res.Remaining)
}

// A partial grant: take what fits of 50 now (RL.TOKENBUCKET ... UPTO 50).
func ExampleLimiter_AllowAtMost() {
	ctx := context.Background()
	limiter := redis_rate.NewLimiter(redis.NewClient(&redis.Options{Addr: "localhost:6379"}))
	res, err := limiter.AllowAtMost(ctx, "export:42", redis_rate.PerMinute(100), 50)
	if err != nil {
		fmt.Println("limiter unavailable:", err)
		return
	}
	if res.Allowed == 0 {
		fmt.Println("nothing now; retry after", res.RetryAfter)
		return
	}
	fmt.Println("send", res.Allowed, "rows;", res.Remaining, "left")
}

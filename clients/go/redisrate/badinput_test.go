package redisrate_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/redis-ratelimit/redis-ratelimit/clients/go/internal/testserver"
	"github.com/redis-ratelimit/redis-ratelimit/clients/go/ratelimit"
	redis_rate "github.com/redis-ratelimit/redis-ratelimit/clients/go/redisrate"
)

// calls runs the Limiter's calls with limit and n (only the one named
// only, unless ""), naming each.
func calls(l *redis_rate.Limiter, limit redis_rate.Limit, n int, only string) map[string]error {
	ctx := context.Background()
	out := map[string]error{}
	if only == "" || only == "Allow" {
		_, out["Allow"] = l.Allow(ctx, "k", limit)
	}
	if only == "" || only == "AllowN" {
		_, out["AllowN"] = l.AllowN(ctx, "k", limit, n)
	}
	if only == "" || only == "AllowAtMost" {
		_, out["AllowAtMost"] = l.AllowAtMost(ctx, "k", limit, n)
	}
	return out
}

func wantArg(t *testing.T, what string, err error, arg string) {
	t.Helper()
	var ia *ratelimit.InvalidArgumentError
	if !errors.As(err, &ia) || ia.Arg != arg {
		t.Fatalf("%s: %v, want an *ratelimit.InvalidArgumentError naming %s", what, err, arg)
	}
}

// TestBadLimit: each bad Limit or n is an error naming the field, before
// anything is sent (no command reaches the server, no key is created).
func TestBadLimit(t *testing.T) {
	srv := testserver.Start(t, testserver.Redis)
	rdb := srv.Client()
	l := redis_rate.NewLimiter(rdb)
	ctx := context.Background()
	cases := []struct {
		name  string
		limit redis_rate.Limit
		n     int
		arg   string
		only  string // "" for every call
	}{
		{"zero Limit", redis_rate.Limit{}, 1, "Limit.Rate", ""},
		{"zero rate", redis_rate.Limit{Rate: 0, Burst: 5, Period: time.Second}, 1, "Limit.Rate", ""},
		{"negative rate", redis_rate.Limit{Rate: -3, Burst: 5, Period: time.Second}, 1, "Limit.Rate", ""},
		{"zero period", redis_rate.Limit{Rate: 5, Burst: 5}, 1, "Limit.Period", ""},
		{"negative period", redis_rate.Limit{Rate: 5, Burst: 5, Period: -time.Second}, 1, "Limit.Period", ""},
		{"negative burst", redis_rate.Limit{Rate: 5, Burst: -1, Period: time.Second}, 1, "Limit.Burst", ""},
		{"zero burst", redis_rate.Limit{Rate: 5, Burst: 0, Period: time.Second}, 1, "Limit.Burst", ""},
		{"negative n", redis_rate.PerSecond(5), -1, "n", "AllowN"},
		{"negative n at most", redis_rate.PerSecond(5), -1, "n", "AllowAtMost"},
		{"n above 2^40", redis_rate.PerSecond(5), 1<<40 + 1, "n", "AllowN"},
	}
	before := srv.Calls("rl.tokenbucket")
	for _, c := range cases {
		for name, err := range calls(l, c.limit, c.n, c.only) {
			wantArg(t, c.name+": "+name, err, c.arg)
		}
	}
	if after := srv.Calls("rl.tokenbucket"); after != before {
		t.Fatalf("%d RL.TOKENBUCKET sent for bad input", after-before)
	}
	if n := rdb.DBSize(ctx).Val(); n != 0 {
		t.Fatalf("%d keys created by bad input", n)
	}
	// UPTO above 2^40 is asked as 2^40: what fits, never more than Burst.
	res, err := l.AllowAtMost(ctx, "big", redis_rate.PerSecond(5), 1<<40+1)
	if err != nil || res.Allowed != 5 || res.Remaining != 0 {
		t.Fatalf("AllowAtMost(2^40+1): %+v %v, want 5 granted", res, err)
	}
}

// TestNilClient: a nil client, a nil *redis.Client and the zero Limiter
// answer errors naming rdb on every call, never a panic.
func TestNilClient(t *testing.T) {
	var nilClient *redis.Client
	var nilCluster *redis.ClusterClient
	var nilUniversal redis.UniversalClient
	limiters := map[string]*redis_rate.Limiter{
		"nil":                      redis_rate.NewLimiter(nil),
		"nil *redis.Client":        redis_rate.NewLimiter(nilClient),
		"nil *redis.ClusterClient": redis_rate.NewLimiter(nilCluster),
		"nil UniversalClient":      redis_rate.NewLimiter(nilUniversal),
		"zero Limiter":             {},
	}
	for name, l := range limiters {
		if l == nil {
			t.Fatalf("%s: NewLimiter returned nil", name)
		}
		for call, err := range calls(l, redis_rate.PerSecond(1), 1, "") {
			wantArg(t, name+": "+call, err, "rdb")
		}
		wantArg(t, name+": Reset", l.Reset(context.Background(), "k"), "rdb")
	}
	var zero redis_rate.Limiter
	_, err := zero.Allow(context.Background(), "k", redis_rate.PerSecond(1))
	wantArg(t, "a Limiter value", err, "rdb")
}

// TestModuleMissing: a server without the module answers an error wrapping
// ratelimit.ErrModuleMissing.
func TestModuleMissing(t *testing.T) {
	srv := testserver.StartBare(t, testserver.Redis)
	l := redis_rate.NewLimiter(srv.Client())
	for call, err := range calls(l, redis_rate.PerSecond(1), 1, "") {
		if !errors.Is(err, ratelimit.ErrModuleMissing) {
			t.Fatalf("%s without the module: %v, want ErrModuleMissing", call, err)
		}
	}
}

// TestUnavailable: nobody listening is ratelimit.ErrConnection; a server
// that does not answer within the context's deadline is
// ratelimit.ErrTimeout (with context.DeadlineExceeded in the chain).
func TestUnavailable(t *testing.T) {
	port := testserver.FreePort()
	c := redis.NewClient(&redis.Options{Addr: fmt.Sprintf("127.0.0.1:%d", port), MaxRetries: -1})
	defer c.Close()
	_, err := redis_rate.NewLimiter(c).Allow(context.Background(), "k", redis_rate.PerSecond(1))
	if !errors.Is(err, ratelimit.ErrConnection) || !ratelimit.IsUnavailable(err) {
		t.Fatalf("refused: %v, want ErrConnection", err)
	}

	srv := testserver.Start(t, testserver.Redis)
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr(), MaxRetries: -1, ContextTimeoutEnabled: true})
	defer rdb.Close()
	l := redis_rate.NewLimiter(rdb)
	if _, err := l.Allow(context.Background(), "k", redis_rate.PerSecond(1)); err != nil {
		t.Fatal(err)
	}
	srv.Stop()
	defer srv.Cont()
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	_, err = l.Allow(ctx, "k", redis_rate.PerSecond(1))
	if !errors.Is(err, ratelimit.ErrTimeout) {
		t.Fatalf("frozen server: %v, want ErrTimeout", err)
	}
}

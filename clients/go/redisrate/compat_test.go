package redisrate_test

// The API is go-redis/redis_rate v10's, checked by reflection against the
// real package: the same exported functions, methods (with the same
// receivers), struct fields and NewLimiter's parameter, signature for
// signature, so that code written for redis_rate compiles with this import.

import (
	"reflect"
	"strings"
	"testing"

	upstream "github.com/go-redis/redis_rate/v10"
	"github.com/redis/go-redis/v9"

	redis_rate "github.com/redis-ratelimit/redis-ratelimit/clients/go/redisrate"
)

// sig is a type's text with the package names made the same.
func sig(t reflect.Type) string {
	return strings.ReplaceAll(t.String(), "redisrate.", "redis_rate.")
}

func methods(t reflect.Type) map[string]string {
	m := map[string]string{}
	for i := 0; i < t.NumMethod(); i++ {
		m[t.Method(i).Name] = sig(t.Method(i).Type)
	}
	return m
}

func sameMethods(t *testing.T, what string, theirs, ours reflect.Type) {
	t.Helper()
	a, b := methods(theirs), methods(ours)
	for name, s := range a {
		if b[name] != s {
			t.Errorf("%s.%s: redis_rate %s, here %q", what, name, s, b[name])
		}
	}
	if len(a) == 0 {
		t.Errorf("%s: redis_rate has no methods?", what)
	}
}

func TestSameAPIAsRedisRate(t *testing.T) {
	funcs := []struct {
		name         string
		theirs, ours interface{}
	}{
		{"NewLimiter", upstream.NewLimiter, redis_rate.NewLimiter},
		{"PerSecond", upstream.PerSecond, redis_rate.PerSecond},
		{"PerMinute", upstream.PerMinute, redis_rate.PerMinute},
		{"PerHour", upstream.PerHour, redis_rate.PerHour},
	}
	for _, f := range funcs {
		a, b := reflect.TypeOf(f.theirs), reflect.TypeOf(f.ours)
		if a.NumIn() != b.NumIn() || a.NumOut() != b.NumOut() {
			t.Fatalf("%s: %v vs %v", f.name, a, b)
		}
		for i := 0; i < a.NumOut(); i++ {
			if sig(a.Out(i)) != sig(b.Out(i)) {
				t.Errorf("%s result %d: %v vs %v", f.name, i, a.Out(i), b.Out(i))
			}
		}
		for i := 0; i < a.NumIn(); i++ {
			if a.In(i).Kind() == reflect.Interface {
				// rediser: unexported in both; the same methods.
				sameMethods(t, f.name+"'s parameter", a.In(i), b.In(i))
				if a.In(i).NumMethod() != b.In(i).NumMethod() {
					t.Errorf("%s's parameter asks %d methods, redis_rate's %d", f.name, b.In(i).NumMethod(), a.In(i).NumMethod())
				}
			} else if sig(a.In(i)) != sig(b.In(i)) {
				t.Errorf("%s parameter %d: %v vs %v", f.name, i, a.In(i), b.In(i))
			}
		}
	}
	// The methods on the value and on the pointer (Allow, AllowN and
	// AllowAtMost on Limiter, Reset on *Limiter, as redis_rate).
	sameMethods(t, "Limiter", reflect.TypeOf(upstream.Limiter{}), reflect.TypeOf(redis_rate.Limiter{}))
	sameMethods(t, "*Limiter", reflect.TypeOf(&upstream.Limiter{}), reflect.TypeOf(&redis_rate.Limiter{}))
	sameMethods(t, "Limit", reflect.TypeOf(upstream.Limit{}), reflect.TypeOf(redis_rate.Limit{}))
	// The structs' fields, in order (unkeyed literals compile too).
	for _, s := range []struct{ theirs, ours interface{} }{
		{upstream.Limit{}, redis_rate.Limit{}},
		{upstream.Result{}, redis_rate.Result{}},
	} {
		a, b := reflect.TypeOf(s.theirs), reflect.TypeOf(s.ours)
		if a.NumField() != b.NumField() {
			t.Fatalf("%v has %d fields, redis_rate's %d", b, b.NumField(), a.NumField())
		}
		for i := 0; i < a.NumField(); i++ {
			if a.Field(i).Name != b.Field(i).Name || sig(a.Field(i).Type) != sig(b.Field(i).Type) {
				t.Errorf("%v field %d: %s %v, redis_rate's %s %v", b, i, b.Field(i).Name, b.Field(i).Type, a.Field(i).Name, a.Field(i).Type)
			}
		}
	}
	// Every client type redis_rate takes is taken (compile-time).
	var (
		_ = redis_rate.NewLimiter(&redis.Client{})
		_ = redis_rate.NewLimiter(&redis.ClusterClient{})
		_ = redis_rate.NewLimiter(&redis.Ring{})
		_ = redis_rate.NewLimiter(redis.UniversalClient(nil))
		_ = redis_rate.NewLimiter(redis.Cmdable(nil))
	)
	// redis_rate's examples and tests compare results like this.
	if (redis_rate.Limit{Rate: 10, Burst: 10, Period: 1e9}) != redis_rate.PerSecond(10) {
		t.Fatal("PerSecond(10)")
	}
}

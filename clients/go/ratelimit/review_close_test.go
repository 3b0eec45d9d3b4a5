package ratelimit

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/redis-ratelimit/redis-ratelimit/clients/go/internal/testserver"
)

// Close while requests start probes (the limiter stays usable after
// Close): no WaitGroup misuse (run with -race), and every Close returns.
func TestReviewCloseDuringProbes(t *testing.T) {
	srv := testserver.Start(t, testserver.Redis)
	ctx := context.Background()
	l := limiterOn(t, srv.Client(), WithFallback(FailOpen), WithDenyCache(false),
		WithBreaker(BreakerConfig{Failures: 1, OpenFor: time.Microsecond}), WithCallDeadline(20*time.Millisecond))
	set := mustSet(t, l, NewRule("probe", FixedWindow(1000000, 60000)))
	srv.Kill9()
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for g := 0; g < 4; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				l.Check(ctx, set, "alice", 1)
			}
		}()
	}
	testserver.WaitUntil(t, "probes", func() bool { return l.Stats().Probes >= 3 })
	for i := 0; i < 200; i++ {
		cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		if err := l.Close(cctx); err != nil {
			cancel()
			t.Fatalf("Close %d: %v", i, err)
		}
		cancel()
	}
	close(stop)
	wg.Wait()
	if l.Stats().Probes < 3 {
		t.Fatalf("stats: %+v", l.Stats())
	}
}

package ratelimit

import (
	"testing"
	"time"

	"github.com/redis-ratelimit/redis-ratelimit/clients/go/internal/testserver"
)

func TestFallbackBreakerStates(t *testing.T) {
	b := newRedisBreaker(BreakerConfig{Failures: 3, OpenFor: time.Millisecond})
	for i := 0; i < 2; i++ {
		if b.failure() || b.gate() != rbCall {
			t.Fatalf("opened after %d failures", i+1)
		}
	}
	// A success starts the count again.
	b.success()
	b.failure()
	b.failure()
	if b.isOpen() {
		t.Fatal("open after a success and two failures")
	}
	if !b.failure() || !b.isOpen() {
		t.Fatal("the third consecutive failure opens it")
	}
	// A late success does not close it; only the probe does.
	b.success()
	if !b.isOpen() {
		t.Fatal("closed by a late success")
	}
	testserver.WaitUntil(t, "the probe's turn", func() bool { return b.gate() == rbProbe })
	// Half open: one probe at a time, the others skip.
	if g := b.gate(); g != rbSkip {
		t.Fatalf("a second probe: %v", g)
	}
	// The probe failed: open again, and a probe later.
	if b.failure() {
		t.Fatal("a failed probe is not a new opening")
	}
	testserver.WaitUntil(t, "the next probe", func() bool { return b.gate() == rbProbe })
	b.probeSucceeded()
	if b.isOpen() || b.gate() != rbCall {
		t.Fatal("the probe's answer closes it")
	}
	if c := (BreakerConfig{}).normalized(); c != DefaultBreaker {
		t.Fatalf("the zero config: %+v", c)
	}
}

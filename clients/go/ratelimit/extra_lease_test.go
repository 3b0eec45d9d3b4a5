package ratelimit_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/redis-ratelimit/redis-ratelimit/clients/go/internal/testserver"
	"github.com/redis-ratelimit/redis-ratelimit/clients/go/ratelimit"
)

// extraEvents is a deny-event pipeline shipping each event at once to a
// slice the test reads.
type extraEvents struct {
	mu  sync.Mutex
	got []ratelimit.DenyEvent
	ev  *ratelimit.DenyEvents
}

func newExtraEvents(t *testing.T) *extraEvents {
	t.Helper()
	e := &extraEvents{}
	e.ev = ratelimit.NewDenyEvents(ratelimit.CallbackSink(func(_ context.Context, batch []ratelimit.DenyEvent) error {
		e.mu.Lock()
		e.got = append(e.got, batch...)
		e.mu.Unlock()
		return nil
	}), ratelimit.WithFlushEvents(1))
	t.Cleanup(func() { _ = e.ev.Close(context.Background()) })
	return e
}

// waitFor waits for an event of rule and answers it.
func (e *extraEvents) waitFor(t *testing.T, rule string) ratelimit.DenyEvent {
	t.Helper()
	var found ratelimit.DenyEvent
	testserver.WaitUntil(t, "a deny event of "+rule, func() bool {
		e.mu.Lock()
		defer e.mu.Unlock()
		for _, ev := range e.got {
			if ev.Rule == rule {
				found = ev
				return true
			}
		}
		return false
	})
	return found
}

// TestExtraLeaseFromCarriesTheOrigin: a lease denied because the cap is
// full is a *DeniedError, and its deny event carries the origin LeaseFrom
// was given (Lease's carries none).
func TestExtraLeaseFromCarriesTheOrigin(t *testing.T) {
	events := newExtraEvents(t)
	l, _ := mwLimiter(t, ratelimit.WithDenyEvents(events.ev))
	ctx := context.Background()
	rule := ratelimit.NewRule("jobs", ratelimit.ConcurrencySpec(1, 30_000)).Prefix("extra:lease:")
	held, err := l.LeaseFrom(ctx, rule, "ann", ratelimit.Origin{ClientIP: "192.0.2.9", UserAgent: "worker/2"})
	if err != nil || held.ID() == 0 {
		t.Fatalf("the first lease: %v (id %d)", err, held.ID())
	}
	defer func() { _, _ = held.Release(ctx) }()
	_, err = l.LeaseFrom(ctx, rule, "ann", ratelimit.Origin{ClientIP: "192.0.2.10", UserAgent: "worker/3"})
	var de *ratelimit.DeniedError
	if !errors.As(err, &de) || de.Decision.Allowed || de.Decision.Rule != "jobs" {
		t.Fatalf("a second lease of a cap of 1: %v, want a *DeniedError of jobs", err)
	}
	ev := events.waitFor(t, "jobs")
	if ev.ClientIP != "192.0.2.10" || ev.UserAgent != "worker/3" || ev.Key != "extra:lease:ann" || ev.Level != "redis" || ev.Limit != 1 {
		t.Errorf("deny event %+v", ev)
	}
}

// TestExtraInFlightDenyEventsCarryTheClient: the middleware's in-flight
// cap, full, answers 429 naming the cap, and its deny event carries the
// client's address and User-Agent.
func TestExtraInFlightDenyEventsCarryTheClient(t *testing.T) {
	events := newExtraEvents(t)
	l, _ := mwLimiter(t, ratelimit.WithDenyEvents(events.ev))
	set := mwSet(t, l, ratelimit.NewRule("per-user", ratelimit.SlidingWindow(100, 60_000)).Prefix("extra:mw:"))
	entered := make(chan struct{}, 1)
	leave := make(chan struct{})
	h := ratelimit.Middleware(l, set, ratelimit.KeyByHeader("X-User"),
		ratelimit.WithInFlight(ratelimit.NewRule("inflight", ratelimit.ConcurrencySpec(1, 30_000)).Prefix("extra:mw:cap:")))(
		http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.Header.Get("X-Hold") != "" {
				entered <- struct{}{}
				<-leave
			}
		}))
	ts := httptest.NewServer(h)
	defer ts.Close()
	done := make(chan mwAnswer, 1)
	go func() { done <- mwGet(t, ts.URL, "X-User", "ida", "X-Hold", "1") }()
	<-entered
	a := mwGet(t, ts.URL, "X-User", "ida", "User-Agent", "extra-test/1.0")
	close(leave)
	if first := <-done; first.status != http.StatusOK {
		t.Errorf("the held request: %d", first.status)
	}
	if a.status != http.StatusTooManyRequests || a.header.Get("Violated-Policies") != "inflight" && !strings.Contains(a.body, `"violated-policies":["inflight"]`) {
		t.Fatalf("a second request in flight: %d %v %s", a.status, a.header, a.body)
	}
	ev := events.waitFor(t, "inflight")
	if ev.ClientIP != "127.0.0.1" || ev.UserAgent != "extra-test/1.0" || ev.Key != "extra:mw:cap:ida" {
		t.Errorf("the cap's deny event %+v", ev)
	}
}

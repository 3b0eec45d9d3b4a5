package ratelimit

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"

	"github.com/redis-ratelimit/redis-ratelimit/clients/go/internal/testserver"
)

// A nil option is ignored, as by NewClient, NewLimiter and NewProtection;
// BulkHTTPClient(nil) is http.DefaultClient, not a sink whose every batch
// fails.
func TestReviewNilOptions(t *testing.T) {
	ctx := context.Background()
	var bodies atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.ReadAll(r.Body)
		bodies.Add(1)
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"errors":false,"items":[{"create":{"status":201}}]}`)
	}))
	defer srv.Close()
	sink, err := BulkSink(srv.URL, nil, BulkHTTPClient(nil))
	if err != nil {
		t.Fatalf("BulkSink: %v", err)
	}
	var failures atomic.Int64
	events := NewDenyEvents(sink, nil, WithFlushEvents(1), WithEventsErrorHandler(func(error) { failures.Add(1) }))
	defer events.Close(ctx)
	events.Record(DenyEvent{Key: "k", Rule: "r", Level: "redis", Limit: 1, RetryAfterMs: 5})
	testserver.WaitUntil(t, "the event shipped or refused", func() bool {
		s := events.Stats()
		return s.Shipped+s.Dropped > 0
	})
	if s := events.Stats(); s.Shipped != 1 || failures.Load() != 0 || bodies.Load() != 1 {
		t.Fatalf("stats %+v, %d sink failures, %d bodies", s, failures.Load(), bodies.Load())
	}
}

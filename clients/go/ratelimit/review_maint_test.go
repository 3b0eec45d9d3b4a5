package ratelimit

import (
	"context"
	"fmt"
	"log"
	"os"
	"strings"
	"sync"
	"testing"

	"github.com/redis-ratelimit/redis-ratelimit/clients/go/internal/testserver"
	"github.com/redis/go-redis/v9"
)

// logCapture is a go-redis logger that keeps every line.
type logCapture struct {
	mu    sync.Mutex
	lines []string
}

func (l *logCapture) Printf(_ context.Context, format string, v ...any) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.lines = append(l.lines, fmt.Sprintf(format, v...))
}

func (l *logCapture) text() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return strings.Join(l.lines, "\n")
}

// NewClient on a client with go-redis's default options (RESP3, maintenance
// notifications "auto") logs nothing: the derived clients do not fight over
// the caller's push handlers.
func TestReviewDerivedClientsLogNothing(t *testing.T) {
	srv := testserver.Start(t, testserver.Redis)
	cl := testserver.StartCluster(t, 3)
	capture := &logCapture{}
	redis.SetLogger(capture)
	t.Cleanup(func() { redis.SetLogger(stderrLogger{log.New(os.Stderr, "redis: ", log.LstdFlags|log.Lshortfile)}) })
	ctx := context.Background()

	given := redis.NewClient(&redis.Options{Addr: srv.Addr()})
	defer given.Close()
	_ = given.Ping(ctx).Err()
	c, err := NewClient(ctx, given)
	if err != nil {
		t.Fatalf("NewClient: %v", err)
	}
	if _, err := c.FixedWindow(ctx, "review:maint", 5, 60000, Request{}); err != nil {
		t.Fatalf("FixedWindow: %v", err)
	}
	if _, err := c.Acquire(ctx, "review:maint2", FixedWindow(5, 60000), Request{}, 0); err != nil {
		t.Fatalf("Acquire: %v", err)
	}
	_ = c.Close()

	gc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: cl.Addrs()})
	defer gc.Close()
	cc, err := NewClient(ctx, gc)
	if err != nil {
		t.Fatalf("NewClient (cluster): %v", err)
	}
	if _, err := cc.FixedWindow(ctx, "review:maint", 5, 60000, Request{}); err != nil {
		t.Fatalf("FixedWindow (cluster): %v", err)
	}
	_ = cc.Close()

	sen := testserver.StartSentinel(t, srv)
	fo := sen.FailoverClient()
	_ = fo.Ping(ctx).Err()
	fc, err := NewClient(ctx, fo)
	if err != nil {
		t.Fatalf("NewClient (Sentinel): %v", err)
	}
	if _, err := fc.FixedWindow(ctx, "review:maint", 5, 60000, Request{}); err != nil {
		t.Fatalf("FixedWindow (Sentinel): %v", err)
	}
	_ = fc.Close()

	if got := capture.text(); strings.Contains(got, "maintnotifications") || strings.Contains(got, "existing handler") {
		t.Fatalf("go-redis logged:\n%s", got)
	}
}

// stderrLogger is go-redis's default logger (restored after a capture).
type stderrLogger struct{ l *log.Logger }

func (s stderrLogger) Printf(_ context.Context, format string, v ...any) {
	_ = s.l.Output(2, fmt.Sprintf(format, v...))
}

package ratelimit

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
	"unicode/utf8"
)

// eventually polls cond every 5 ms until it holds; it fails the test after
// 30 s (a bound for a busy machine, not a speed assertion).
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// collector is a callback sink that keeps every batch.
type collector struct {
	mu      sync.Mutex
	batches [][]DenyEvent
}

func (c *collector) sink() Sink {
	return CallbackSink(func(_ context.Context, batch []DenyEvent) error {
		c.mu.Lock()
		defer c.mu.Unlock()
		c.batches = append(c.batches, batch)
		return nil
	})
}

func (c *collector) events() []DenyEvent {
	c.mu.Lock()
	defer c.mu.Unlock()
	var all []DenyEvent
	for _, b := range c.batches {
		all = append(all, b...)
	}
	return all
}

func (c *collector) sizes() []int {
	c.mu.Lock()
	defer c.mu.Unlock()
	var n []int
	for _, b := range c.batches {
		n = append(n, len(b))
	}
	return n
}

func ev(i int) DenyEvent {
	return DenyEvent{
		Timestamp: time.Date(2026, 12, 2, 10, 0, 0, 123_000_000, time.UTC),
		Key:       fmt.Sprintf("rl:user:%d", i), Rule: "per-user", Level: "redis",
		Limit: 5, Remaining: 0, RetryAfterMs: 250,
	}
}

func closeEvents(t *testing.T, e *DenyEvents) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := e.Close(ctx); err != nil {
		t.Errorf("Close: %v", err)
	}
}

// jsonKeys is the object's keys in the order written.
func jsonKeys(t *testing.T, line []byte) []string {
	t.Helper()
	dec := json.NewDecoder(bytes.NewReader(line))
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		t.Fatalf("%s: not a JSON object (%v)", line, err)
	}
	var keys []string
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			t.Fatalf("%s: %v", line, err)
		}
		keys = append(keys, tok.(string))
		var skip json.RawMessage
		if err := dec.Decode(&skip); err != nil {
			t.Fatalf("%s: %v", line, err)
		}
	}
	return keys
}

func TestDenyEventsContractDefaults(t *testing.T) {
	c := readObsContract(t).DenyEvents
	if DefaultEventsCapacity != c.BufferEvents || DefaultFlushEvents != c.FlushEvents ||
		DefaultFlushInterval != time.Duration(c.FlushIntervalMs)*time.Millisecond ||
		DefaultSinkTimeout != time.Duration(c.SinkTimeoutMs)*time.Millisecond ||
		DefaultBulkIndex != c.BulkIndex || MaxHeaderBytes != c.MaxHeaderBytes {
		t.Errorf("defaults %d %d %v %v %q %d differ from the contract's %+v", DefaultEventsCapacity,
			DefaultFlushEvents, DefaultFlushInterval, DefaultSinkTimeout, DefaultBulkIndex, MaxHeaderBytes, c)
	}
	if !slices.Equal(DenyEventFields, c.Fields) || !slices.Equal(DenyEventOptional, c.Optional) {
		t.Errorf("fields %v optional %v, the contract %v %v", DenyEventFields, DenyEventOptional, c.Fields, c.Optional)
	}
	e := NewDenyEvents(CallbackSink(func(context.Context, []DenyEvent) error { return nil }))
	defer closeEvents(t, e)
	if e.cfg.capacity != c.BufferEvents || e.cfg.flushEvents != c.FlushEvents ||
		e.cfg.interval != DefaultFlushInterval || e.cfg.timeout != DefaultSinkTimeout {
		t.Errorf("NewDenyEvents' settings %+v are not the contract's defaults", e.cfg)
	}
}

func TestDenyEventsJSON(t *testing.T) {
	c := readObsContract(t).DenyEvents
	e := ev(1)
	e.RetryAfterMs = -1
	line, err := json.Marshal(e)
	if err != nil {
		t.Fatal(err)
	}
	want := `{"timestamp":"2026-12-02T10:00:00.123Z","key":"rl:user:1","rule":"per-user","level":"redis",` +
		`"outcome":"denied","limit":5,"remaining":0,"retry_after_ms":-1}`
	if string(line) != want {
		t.Errorf("JSON\n%s\nwant\n%s", line, want)
	}
	if !strings.Contains(c.Timestamp, "2026-12-02T10:00:00.123Z") {
		t.Errorf("the contract's timestamp example changed: %q", c.Timestamp)
	}
	// Every field, in the contract's order; a zone converted to UTC.
	e.ClientIP, e.UserAgent, e.Outcome = "10.0.0.1", "curl/8", OutcomeShadowDenied
	e.Timestamp = time.Date(2026, 12, 2, 11, 0, 0, 123_456_789, time.FixedZone("CET", 3600))
	line, _ = json.Marshal(e)
	if got := jsonKeys(t, line); !slices.Equal(got, c.Fields) {
		t.Errorf("keys %v, the contract's %v", got, c.Fields)
	}
	var back map[string]any
	if err := json.Unmarshal(line, &back); err != nil {
		t.Fatal(err)
	}
	if back["timestamp"] != "2026-12-02T10:00:00.123Z" || back["outcome"] != "shadow_denied" {
		t.Errorf("timestamp %v outcome %v", back["timestamp"], back["outcome"])
	}
	// Strings that need escaping come back as they were.
	for _, key := range []string{"", "plain", "tab\there", "nl\n\x01\x7f", `é \ "q"`, "\U0001F600", "<&>", "\u2028"} {
		e.Key = key
		line, _ := json.Marshal(e)
		var v struct{ Key string }
		if err := json.Unmarshal(line, &v); err != nil || v.Key != key {
			t.Errorf("key %q: %s -> %q (%v)", key, line, v.Key, err)
		}
	}
	e.Key = "bad\xffutf8"
	line, _ = json.Marshal(e)
	if !json.Valid(line) || !strings.Contains(string(line), `bad\ufffdutf8`) {
		t.Errorf("invalid UTF-8 written as %s", line)
	}
}

func TestDenyEventsCutHeaders(t *testing.T) {
	col := &collector{}
	e := NewDenyEvents(col.sink(), WithFlushInterval(time.Hour))
	long := strings.Repeat("a", MaxHeaderBytes-1) + "é" + strings.Repeat("b", 1000)
	x := ev(1)
	x.UserAgent, x.ClientIP = long, strings.Repeat("1", 5000)
	e.Record(x)
	closeEvents(t, e)
	got := col.events()
	if len(got) != 1 {
		t.Fatalf("shipped %d events, want 1", len(got))
	}
	if ua := got[0].UserAgent; ua != strings.Repeat("a", MaxHeaderBytes-1) || !utf8.ValidString(ua) {
		t.Errorf("user agent cut to %d bytes (%q...), want %d at the character boundary", len(ua), ua[:10], MaxHeaderBytes-1)
	}
	if len(got[0].ClientIP) != MaxHeaderBytes {
		t.Errorf("client_ip cut to %d bytes, want %d", len(got[0].ClientIP), MaxHeaderBytes)
	}
}

func TestDenyEventsFileSink(t *testing.T) {
	path := filepath.Join(t.TempDir(), "deny.jsonl")
	e := NewDenyEvents(FileSink(path), WithFlushEvents(3), WithFlushInterval(time.Hour))
	defer closeEvents(t, e)
	for i := range 3 {
		e.Record(ev(i))
	}
	eventually(t, "3 events shipped", func() bool { return e.Stats().Shipped == 3 })
	e.Record(ev(3))
	if err := e.Flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	sc := bufio.NewScanner(bytes.NewReader(raw))
	n := 0
	for sc.Scan() {
		var v map[string]any
		if err := json.Unmarshal(sc.Bytes(), &v); err != nil {
			t.Fatalf("line %d: %v", n, err)
		}
		if v["key"] != fmt.Sprintf("rl:user:%d", n) {
			t.Errorf("line %d: key %v", n, v["key"])
		}
		n++
	}
	if n != 4 || !bytes.HasSuffix(raw, []byte("}\n")) {
		t.Errorf("the file has %d lines, want 4 (appended):\n%s", n, raw)
	}
	if s := e.Stats(); s.Batches != 2 || s.Recorded != 4 || s.Dropped != 0 {
		t.Errorf("stats %+v, want 2 batches, 4 recorded, 0 dropped", s)
	}

	// A file that cannot be opened: the batch is dropped and counted.
	bad := NewDenyEvents(FileSink(filepath.Join(t.TempDir(), "no", "such", "dir.jsonl")),
		WithEventsErrorHandler(func(error) {}))
	bad.Record(ev(1))
	if err := bad.Flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	if s := bad.Stats(); s.SinkErrors != 1 || s.Dropped != 1 || s.Shipped != 0 {
		t.Errorf("an unopenable file: stats %+v, want 1 sink error, 1 dropped", s)
	}
	closeEvents(t, bad)
}

// bulkServer is a real HTTP server on loopback answering _bulk.
type bulkServer struct {
	mu     sync.Mutex
	bodies []string
	types  []string
	paths  []string
	reply  string
	status int
}

func (b *bulkServer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	b.mu.Lock()
	b.bodies = append(b.bodies, string(body))
	b.types = append(b.types, r.Header.Get("Content-Type"))
	b.paths = append(b.paths, r.Method+" "+r.URL.Path)
	reply, status := b.reply, b.status
	b.mu.Unlock()
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = io.WriteString(w, reply)
}

func (b *bulkServer) set(status int, reply string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.status, b.reply = status, reply
}

func TestDenyEventsBulkSink(t *testing.T) {
	bs := &bulkServer{status: 200, reply: `{"took":3,"errors":false,"items":[]}`}
	srv := httptest.NewServer(bs)
	defer srv.Close()
	sink, err := BulkSink(srv.URL + "/es/")
	if err != nil {
		t.Fatal(err)
	}
	var errs []error
	var errMu sync.Mutex
	e := NewDenyEvents(sink, WithFlushEvents(2), WithFlushInterval(time.Hour),
		WithEventsErrorHandler(func(err error) { errMu.Lock(); errs = append(errs, err); errMu.Unlock() }))
	defer closeEvents(t, e)
	e.Record(ev(0))
	e.Record(ev(1))
	eventually(t, "the batch posted", func() bool { return e.Stats().Shipped == 2 })
	bs.mu.Lock()
	body, ctype, path := bs.bodies[0], bs.types[0], bs.paths[0]
	bs.mu.Unlock()
	if path != "POST /es/_bulk" || ctype != "application/x-ndjson" {
		t.Errorf("request %s, Content-Type %q", path, ctype)
	}
	lines := strings.Split(strings.TrimSuffix(body, "\n"), "\n")
	if len(lines) != 4 || !strings.HasSuffix(body, "\n") {
		t.Fatalf("body has %d lines, want 4 (action, event, action, event):\n%s", len(lines), body)
	}
	for i, line := range lines {
		if i%2 == 0 {
			if line != `{"index":{"_index":"ratelimit-deny"}}` {
				t.Errorf("line %d: action %s", i, line)
			}
			continue
		}
		var v map[string]any
		if err := json.Unmarshal([]byte(line), &v); err != nil || v["key"] != fmt.Sprintf("rl:user:%d", i/2) {
			t.Errorf("line %d: event %s (%v)", i, line, err)
		}
	}

	// A reply with errors, and a 5xx: each batch dropped and counted.
	bs.set(200, `{"errors":true,"items":[]}`)
	e.Record(ev(2))
	e.Record(ev(3))
	eventually(t, "a refused batch counted", func() bool { return e.Stats().SinkErrors == 1 })
	bs.set(503, `{"error":"busy"}`)
	e.Record(ev(4))
	e.Record(ev(5))
	eventually(t, "a 503 counted", func() bool { return e.Stats().SinkErrors == 2 })
	if s := e.Stats(); s.Shipped != 2 || s.Dropped != 4 || s.Batches != 1 {
		t.Errorf("stats %+v, want 2 shipped, 4 dropped, 1 batch", s)
	}
	errMu.Lock()
	if len(errs) != 2 || !strings.Contains(errs[0].Error(), "errors") || !strings.Contains(errs[1].Error(), "503") {
		t.Errorf("errors told: %v", errs)
	}
	errMu.Unlock()

	// Another index.
	sink2, err := BulkSink(srv.URL, BulkIndex("audit"))
	if err != nil {
		t.Fatal(err)
	}
	if got := string(sink2.(*bulkSink).bulkBody([]DenyEvent{ev(0)})); !strings.HasPrefix(got, `{"index":{"_index":"audit"}}`+"\n") {
		t.Errorf("the body in index audit: %s", got)
	}
}

func TestDenyEventsBulkSinkArguments(t *testing.T) {
	for _, c := range []struct {
		url, index, arg string
	}{
		{"localhost:9200", "", "url"},
		{"ftp://h/", "", "url"},
		{"http://", "", "url"},
		{"http://h:9200/?q=1", "", "url"},
		{"http://h:9200", `a"b`, "index"},
	} {
		var opts []BulkOption
		if c.index != "" {
			opts = append(opts, BulkIndex(c.index))
		}
		_, err := BulkSink(c.url, opts...)
		var ia *InvalidArgumentError
		if !errors.As(err, &ia) || ia.Arg != c.arg {
			t.Errorf("BulkSink(%q, index %q): %v, want an InvalidArgumentError naming %s", c.url, c.index, err, c.arg)
		}
	}
}

func TestDenyEventsCallbackAndCountTrigger(t *testing.T) {
	col := &collector{}
	e := NewDenyEvents(col.sink(), WithFlushEvents(10), WithFlushInterval(time.Hour))
	defer closeEvents(t, e)
	for i := range 9 {
		e.Record(ev(i))
	}
	// Nine wait: no trigger yet (the interval is an hour).
	if s := e.Stats(); s.Pending != 9 || s.Shipped != 0 {
		t.Fatalf("after 9 events: %+v, want 9 pending", s)
	}
	e.Record(ev(9))
	eventually(t, "the 10th event to flush the batch", func() bool { return e.Stats().Shipped == 10 })
	if got := col.sizes(); !slices.Equal(got, []int{10}) {
		t.Errorf("batches %v, want one of 10", got)
	}
	for i, x := range col.events() {
		if x.Key != fmt.Sprintf("rl:user:%d", i) {
			t.Errorf("event %d: key %s (order)", i, x.Key)
		}
	}
	// 25 more: two batches of 10 at once; 5 wait for the interval.
	for i := 10; i < 35; i++ {
		e.Record(ev(i))
	}
	eventually(t, "two more batches", func() bool { return e.Stats().Shipped == 30 })
	if s := e.Stats(); s.Pending != 5 {
		t.Errorf("pending %d, want 5", s.Pending)
	}
}

func TestDenyEventsTimerTrigger(t *testing.T) {
	col := &collector{}
	e := NewDenyEvents(col.sink(), WithFlushInterval(20*time.Millisecond))
	defer closeEvents(t, e)
	e.Record(ev(0))
	e.Record(ev(1))
	eventually(t, "the interval to flush 2 events", func() bool { return e.Stats().Shipped == 2 })
	if got := col.events(); len(got) != 2 || got[1].Key != "rl:user:1" {
		t.Errorf("shipped %v", got)
	}
}

// gate is a sink that blocks each batch until released.
type gate struct {
	entered chan []DenyEvent
	release chan struct{}
}

func newGate() *gate {
	return &gate{entered: make(chan []DenyEvent, 100), release: make(chan struct{})}
}

func (g *gate) sink() Sink {
	return CallbackSink(func(ctx context.Context, batch []DenyEvent) error {
		g.entered <- batch
		<-g.release
		return nil
	})
}

func TestDenyEventsFullBufferDropsTheOldest(t *testing.T) {
	m, err := NewMetrics(nil)
	if err != nil {
		t.Fatal(err)
	}
	g := newGate()
	e := NewDenyEvents(g.sink(), WithEventsCapacity(5), WithFlushInterval(time.Hour),
		WithSinkTimeout(time.Minute), WithEventsMetrics(m))
	defer closeEvents(t, e)
	for i := range 5 {
		e.Record(ev(i))
	}
	first := <-g.entered // the flusher holds 0..4 in the sink
	if len(first) != 5 || first[0].Key != "rl:user:0" {
		t.Fatalf("first batch %d events from %s", len(first), first[0].Key)
	}
	for i := 5; i < 12; i++ {
		e.Record(ev(i))
	}
	s := e.Stats()
	if s.Dropped != 2 || s.Pending != 5 || s.Recorded != 12 {
		t.Fatalf("stats %+v: want 2 dropped (5 and 6), 5 pending, 12 recorded", s)
	}
	if v, _ := gathered(t, m.Gatherer(), "ratelimit_deny_events_dropped_total", nil); v != 2 {
		t.Errorf("ratelimit_deny_events_dropped_total = %v, want 2", v)
	}
	close(g.release)
	second := <-g.entered
	var keys []string
	for _, x := range second {
		keys = append(keys, x.Key)
	}
	want := []string{"rl:user:7", "rl:user:8", "rl:user:9", "rl:user:10", "rl:user:11"}
	if !slices.Equal(keys, want) {
		t.Errorf("the second batch %v, want the newest %v", keys, want)
	}
	eventually(t, "10 shipped", func() bool { return e.Stats().Shipped == 10 })
	if v, _ := gathered(t, m.Gatherer(), "ratelimit_deny_events_shipped_total", nil); v != 10 {
		t.Errorf("ratelimit_deny_events_shipped_total = %v, want 10", v)
	}
}

func TestDenyEventsSlowSinkNeverBlocksRecord(t *testing.T) {
	m, err := NewMetrics(nil)
	if err != nil {
		t.Fatal(err)
	}
	g := newGate()
	defer close(g.release)
	var told []error
	var mu sync.Mutex
	e := NewDenyEvents(g.sink(), WithEventsCapacity(100), WithFlushEvents(10), WithFlushInterval(time.Hour),
		WithSinkTimeout(30*time.Millisecond), WithEventsMetrics(m),
		WithEventsErrorHandler(func(err error) { mu.Lock(); told = append(told, err); mu.Unlock() }))
	defer closeEvents(t, e)
	for i := range 10 {
		e.Record(ev(i))
	}
	<-g.entered // the sink is stuck with the first batch
	// 20,000 records while the sink never answers: they all return.
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := range 20000 {
			e.Record(ev(10 + i))
		}
	}()
	eventually(t, "20,000 Records to return while the sink is stuck", func() bool {
		select {
		case <-done:
			return true
		default:
			return false
		}
	})
	// The stuck batch timed out; the batches after it were refused at once
	// (the stuck send still runs); every event is accounted for.
	eventually(t, "the stuck batch to time out", func() bool { return e.Stats().SinkErrors >= 1 })
	eventually(t, "every event accounted for", func() bool {
		s := e.Stats()
		return s.Dropped+uint64(s.Pending)+s.Shipped == s.Recorded && s.Pending < 10
	})
	s := e.Stats()
	if s.Shipped != 0 || s.Recorded != 20010 || s.Dropped < 20000 {
		t.Errorf("stats %+v", s)
	}
	if v, _ := gathered(t, m.Gatherer(), "ratelimit_deny_events_sink_errors_total", nil); uint64(v) != s.SinkErrors {
		t.Errorf("sink_errors metric %v, stats %d", v, s.SinkErrors)
	}
	mu.Lock()
	if len(told) == 0 || !strings.Contains(told[0].Error(), "no answer within") {
		t.Errorf("first error told: %v", told)
	}
	mu.Unlock()
	if len(g.entered) != 0 {
		t.Errorf("%d batches reached the stuck sink", len(g.entered))
	}
}

func TestDenyEventsCloseFlushes(t *testing.T) {
	col := &collector{}
	e := NewDenyEvents(col.sink(), WithFlushInterval(time.Hour))
	for i := range 3 {
		e.Record(ev(i))
	}
	if got := col.events(); len(got) != 0 {
		t.Fatalf("shipped %d before Close", len(got))
	}
	closeEvents(t, e)
	if got := col.events(); len(got) != 3 {
		t.Errorf("Close shipped %d events, want 3", len(got))
	}
	e.Record(ev(3))
	if s := e.Stats(); s.Dropped != 1 || s.Shipped != 3 || s.Pending != 0 {
		t.Errorf("a Record after Close: stats %+v, want it dropped", s)
	}
	closeEvents(t, e) // idempotent
}

func TestDenyEventsCloseGivesUpAtTheDeadline(t *testing.T) {
	g := newGate()
	defer close(g.release)
	e := NewDenyEvents(g.sink(), WithFlushEvents(2), WithFlushInterval(time.Hour), WithSinkTimeout(time.Hour),
		WithEventsErrorHandler(func(error) {}))
	e.Record(ev(0))
	e.Record(ev(1))
	<-g.entered
	e.Record(ev(2))
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := e.Close(ctx); !errors.Is(err, context.Canceled) {
		t.Errorf("Close with an ended context: %v", err)
	}
	eventually(t, "the stuck batch and the waiting event counted dropped", func() bool {
		return e.Stats().Dropped == 3
	})
}

func TestDenyEventsNilAndNilSink(t *testing.T) {
	var e *DenyEvents
	e.Record(ev(0))
	if err := e.Close(context.Background()); err != nil || e.Stats() != (DenyEventsStats{}) {
		t.Errorf("a nil *DenyEvents: %v %+v", err, e.Stats())
	}
	var told error
	n := NewDenyEvents(nil, WithEventsErrorHandler(func(err error) { told = err }))
	n.Record(ev(0))
	_ = n.Flush(context.Background())
	var ia *InvalidArgumentError
	if !errors.As(told, &ia) || ia.Arg != "sink" || n.Stats().Dropped != 1 {
		t.Errorf("a nil sink: %v, %+v", told, n.Stats())
	}
	closeEvents(t, n)
}

func TestDenyEventsSinkPanic(t *testing.T) {
	e := NewDenyEvents(CallbackSink(func(context.Context, []DenyEvent) error { panic("boom") }),
		WithEventsErrorHandler(func(error) {}))
	e.Record(ev(0))
	_ = e.Flush(context.Background())
	if s := e.Stats(); s.SinkErrors != 1 || s.Dropped != 1 {
		t.Errorf("a panicking sink: %+v", s)
	}
	closeEvents(t, e)
}

func TestDenyEventsSetMetrics(t *testing.T) {
	m, err := NewMetrics(nil)
	if err != nil {
		t.Fatal(err)
	}
	e := NewDenyEvents(CallbackSink(func(context.Context, []DenyEvent) error { return nil }),
		WithFlushInterval(time.Hour))
	e.Record(ev(0))
	_ = e.Flush(context.Background())
	e.SetMetrics(m)
	e.Record(ev(1))
	e.Record(ev(2))
	_ = e.Flush(context.Background())
	if v, _ := gathered(t, m.Gatherer(), "ratelimit_deny_events_shipped_total", nil); v != 2 {
		t.Errorf("shipped after SetMetrics = %v, want 2 (the events from then on)", v)
	}
	closeEvents(t, e)
}

func BenchmarkDenyEventsRecord(b *testing.B) {
	e := NewDenyEvents(CallbackSink(func(context.Context, []DenyEvent) error { return nil }))
	defer func() { _ = e.Close(context.Background()) }()
	x := ev(1)
	x.UserAgent = "Mozilla/5.0"
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			e.Record(x)
		}
	})
}

func TestDenyEventsBufferGrowsInOrder(t *testing.T) {
	g := newGate()
	e := NewDenyEvents(g.sink(), WithEventsCapacity(1000), WithFlushEvents(10), WithFlushInterval(time.Hour),
		WithSinkTimeout(time.Minute))
	defer closeEvents(t, e)
	for i := range 10 {
		e.Record(ev(i))
	}
	<-g.entered // 0..9 in the sink: the ring's head moved
	for i := 10; i < 110; i++ {
		e.Record(ev(i)) // the ring grows past 64, wrapped
	}
	if s := e.Stats(); s.Pending != 100 || s.Dropped != 0 {
		t.Fatalf("stats %+v, want 100 pending, none dropped", s)
	}
	close(g.release)
	var keys []string
	for len(keys) < 100 {
		for _, x := range <-g.entered {
			keys = append(keys, x.Key)
		}
	}
	for i, k := range keys {
		if k != fmt.Sprintf("rl:user:%d", i+10) {
			t.Fatalf("event %d shipped is %s: order lost", i, k)
		}
	}
}

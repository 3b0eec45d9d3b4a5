package ratelimit

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"
)

// The deny events' defaults: the contract's (observability.deny_events).
const (
	// DefaultEventsCapacity is the buffer's size (buffer_events).
	DefaultEventsCapacity = 10000
	// DefaultFlushEvents is how many waiting events start a flush, and the
	// largest batch a sink is given (flush_events).
	DefaultFlushEvents = 1000
	// DefaultFlushInterval is how often the buffer is flushed
	// (flush_interval_ms).
	DefaultFlushInterval = 5 * time.Second
	// DefaultSinkTimeout is how long a sink may take with one batch
	// (sink_timeout_ms).
	DefaultSinkTimeout = 2 * time.Second
	// DefaultBulkIndex is the _bulk sink's index (bulk_index).
	DefaultBulkIndex = "ratelimit-deny"
	// MaxHeaderBytes is the most bytes of an event's ClientIP or UserAgent
	// kept (max_header_bytes): longer ones are cut at a character boundary.
	MaxHeaderBytes = 512
	// maxBulkReply is the largest _bulk reply read.
	maxBulkReply = 16 << 20
)

// DenyEventFields are an event's JSON fields, in the order written; the
// optional ones (DenyEventOptional) are left out when unknown (empty).
var DenyEventFields = []string{"timestamp", "key", "rule", "level", "outcome", "limit",
	"remaining", "retry_after_ms", "client_ip", "user_agent"}

// DenyEventOptional are the fields left out of an event's JSON when empty.
var DenyEventOptional = []string{"client_ip", "user_agent"}

// DenyEvent is one denial, with the contract's fields.
type DenyEvent struct {
	// Timestamp is when it was denied (zero: the time Record is called).
	Timestamp time.Time
	// Key is the limiter key.
	Key string
	// Rule is the rule's name (a policy rule: the policy's name).
	Rule string
	// Level is the level that denied: "local", "redis", "deny_cache",
	// "grant" or "fallback" (Path.String).
	Level string
	// Outcome is OutcomeDenied (the default, when empty) or
	// OutcomeShadowDenied (a shadow policy would have denied; the request
	// went on).
	Outcome string
	// Limit and Remaining are the decision's.
	Limit, Remaining int64
	// RetryAfterMs is the decision's wait in milliseconds: -1 when the
	// request can never pass.
	RetryAfterMs int64
	// ClientIP and UserAgent come from an HTTP request ("" when unknown:
	// left out of the JSON); cut to MaxHeaderBytes by Record.
	ClientIP, UserAgent string
}

// MarshalJSON writes the event as one JSON object, its fields in the
// contract's order, the unknown optional ones left out; the timestamp in
// RFC 3339, UTC, with milliseconds ("2026-12-02T10:00:00.123Z").
func (e DenyEvent) MarshalJSON() ([]byte, error) {
	return e.appendJSON(make([]byte, 0, 256)), nil
}

func (e *DenyEvent) appendJSON(b []byte) []byte {
	b = append(b, `{"timestamp":"`...)
	b = e.Timestamp.UTC().AppendFormat(b, "2006-01-02T15:04:05.000Z")
	b = append(b, `","key":`...)
	b = appendJSONString(b, e.Key)
	b = append(b, `,"rule":`...)
	b = appendJSONString(b, e.Rule)
	b = append(b, `,"level":`...)
	b = appendJSONString(b, e.Level)
	b = append(b, `,"outcome":`...)
	outcome := e.Outcome
	if outcome == "" {
		outcome = OutcomeDenied
	}
	b = appendJSONString(b, outcome)
	b = append(b, `,"limit":`...)
	b = strconv.AppendInt(b, e.Limit, 10)
	b = append(b, `,"remaining":`...)
	b = strconv.AppendInt(b, e.Remaining, 10)
	b = append(b, `,"retry_after_ms":`...)
	b = strconv.AppendInt(b, e.RetryAfterMs, 10)
	if e.ClientIP != "" {
		b = append(b, `,"client_ip":`...)
		b = appendJSONString(b, e.ClientIP)
	}
	if e.UserAgent != "" {
		b = append(b, `,"user_agent":`...)
		b = appendJSONString(b, e.UserAgent)
	}
	return append(b, '}')
}

// cutHeader cuts s to at most MaxHeaderBytes bytes at a character boundary.
func cutHeader(s string) string {
	if len(s) <= MaxHeaderBytes {
		return s
	}
	end := MaxHeaderBytes
	for end > 0 && !utf8.RuneStart(s[end]) {
		end--
	}
	return strings.Clone(s[:end])
}

// Sink takes the deny events' batches, on the flusher's goroutine (never a
// request's). Send gets a context that ends at the sink timeout; an error
// counts the batch dropped (never retried).
type Sink interface {
	Send(ctx context.Context, batch []DenyEvent) error
}

// SinkFunc is a function as a Sink: the callback sink.
type SinkFunc func(ctx context.Context, batch []DenyEvent) error

// Send calls f.
func (f SinkFunc) Send(ctx context.Context, batch []DenyEvent) error { return f(ctx, batch) }

// CallbackSink gives each batch to f, on the flusher (never on a request);
// an error counts as a failed flush. The batch is f's to keep.
func CallbackSink(f func(ctx context.Context, batch []DenyEvent) error) Sink { return SinkFunc(f) }

// FileSink appends each batch to the file at path as JSON lines (the file
// created if missing, mode 0644), in one write per batch.
func FileSink(path string) Sink { return &fileSink{path: path} }

type fileSink struct{ path string }

func (s *fileSink) Send(_ context.Context, batch []DenyEvent) error {
	var buf []byte
	for i := range batch {
		buf = batch[i].appendJSON(buf)
		buf = append(buf, '\n')
	}
	f, err := os.OpenFile(s.path, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		return fmt.Errorf("ratelimit: file sink: %w", err)
	}
	_, err = f.Write(buf)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("ratelimit: file sink %s: %w", s.path, err)
	}
	return nil
}

// BulkOption configures BulkSink.
type BulkOption func(*bulkSink)

// BulkIndex sets the _bulk sink's index (DefaultBulkIndex by default).
func BulkIndex(index string) BulkOption { return func(s *bulkSink) { s.index = index } }

// BulkHTTPClient sets the HTTP client the _bulk sink posts with
// (http.DefaultClient by default, and for nil).
func BulkHTTPClient(c *http.Client) BulkOption { return func(s *bulkSink) { s.client = c } }

type bulkSink struct {
	url    string
	index  string
	action []byte
	client *http.Client
}

// BulkSink posts each batch to <baseURL>/_bulk in Elasticsearch's format
// (per event an action line {"index":{"_index":"ratelimit-deny"}} then the
// event's line), Content-Type application/x-ndjson; a batch is accepted on
// a 2xx whose JSON body has "errors": false. baseURL is http(s)://host[:port]
// with an optional path. A bad URL or index is an *InvalidArgumentError
// naming it.
func BulkSink(baseURL string, opts ...BulkOption) (Sink, error) {
	s := &bulkSink{index: DefaultBulkIndex, client: http.DefaultClient}
	for _, o := range opts {
		if o != nil {
			o(s)
		}
	}
	if s.client == nil {
		s.client = http.DefaultClient
	}
	bad := func(arg, reason string) error {
		return &InvalidArgumentError{Rule: "BulkSink", Arg: arg, Reason: reason}
	}
	u, err := url.Parse(baseURL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" ||
		u.RawQuery != "" || u.Fragment != "" {
		return nil, bad("url", fmt.Sprintf("%q must be http(s)://host[:port][/path], no query or fragment", baseURL))
	}
	if s.index == "" || strings.ContainsAny(s.index, "\"\\") || strings.IndexFunc(s.index, func(r rune) bool { return r < 0x20 }) >= 0 {
		return nil, bad("index", fmt.Sprintf("%q must be a non-empty index name", s.index))
	}
	if s.client == nil {
		s.client = http.DefaultClient
	}
	s.url = strings.TrimRight(u.String(), "/") + "/_bulk"
	s.action = []byte(`{"index":{"_index":"` + s.index + `"}}` + "\n")
	return s, nil
}

// bulkBody is the _bulk request body of a batch.
func (s *bulkSink) bulkBody(batch []DenyEvent) []byte {
	buf := make([]byte, 0, len(batch)*(len(s.action)+256))
	for i := range batch {
		buf = append(buf, s.action...)
		buf = batch[i].appendJSON(buf)
		buf = append(buf, '\n')
	}
	return buf
}

func (s *bulkSink) Send(ctx context.Context, batch []DenyEvent) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, s.url, bytes.NewReader(s.bulkBody(batch)))
	if err != nil {
		return fmt.Errorf("ratelimit: bulk sink: %w", err)
	}
	req.Header.Set("Content-Type", "application/x-ndjson")
	resp, err := s.client.Do(req)
	if err != nil {
		return fmt.Errorf("ratelimit: bulk sink: POST %s: %w", s.url, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxBulkReply))
	if err != nil {
		return fmt.Errorf("ratelimit: bulk sink: POST %s: status %d, reading the reply: %w", s.url, resp.StatusCode, err)
	}
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		return fmt.Errorf("ratelimit: bulk sink: POST %s: status %d", s.url, resp.StatusCode)
	}
	var reply struct {
		Errors *bool `json:"errors"`
	}
	if err := json.Unmarshal(body, &reply); err != nil {
		return fmt.Errorf("ratelimit: bulk sink: POST %s: the reply is not JSON: %w", s.url, err)
	}
	if reply.Errors == nil || *reply.Errors {
		return fmt.Errorf("ratelimit: bulk sink: POST %s: the reply has errors", s.url)
	}
	return nil
}

// DenyEventsOption configures NewDenyEvents.
type DenyEventsOption func(*denyEventsConfig)

type denyEventsConfig struct {
	capacity    int
	flushEvents int
	interval    time.Duration
	timeout     time.Duration
	metrics     *Metrics
	onError     func(error)
}

// WithEventsCapacity sets the most events the buffer holds
// (DefaultEventsCapacity); when full, the oldest is dropped and counted.
// Values below 1 keep the default.
func WithEventsCapacity(n int) DenyEventsOption {
	return func(c *denyEventsConfig) {
		if n > 0 {
			c.capacity = n
		}
	}
}

// WithFlushEvents sets how many waiting events start a flush, and the
// largest batch a sink is given (DefaultFlushEvents; at most the capacity).
// Values below 1 keep the default.
func WithFlushEvents(n int) DenyEventsOption {
	return func(c *denyEventsConfig) {
		if n > 0 {
			c.flushEvents = n
		}
	}
}

// WithFlushInterval sets how often the buffer is flushed
// (DefaultFlushInterval). Values not above 0 keep the default.
func WithFlushInterval(d time.Duration) DenyEventsOption {
	return func(c *denyEventsConfig) {
		if d > 0 {
			c.interval = d
		}
	}
}

// WithSinkTimeout sets how long the sink may take with one batch
// (DefaultSinkTimeout); a batch not taken by then is dropped and counted,
// never retried. Values not above 0 keep the default.
func WithSinkTimeout(d time.Duration) DenyEventsOption {
	return func(c *denyEventsConfig) {
		if d > 0 {
			c.timeout = d
		}
	}
}

// WithEventsMetrics counts the events in m: ratelimit_deny_events_dropped,
// _shipped and _sink_errors totals.
func WithEventsMetrics(m *Metrics) DenyEventsOption {
	return func(c *denyEventsConfig) { c.metrics = m }
}

// WithEventsErrorHandler sets what is told of a failed flush (by default a
// warning through log/slog). It runs on the flusher.
func WithEventsErrorHandler(f func(error)) DenyEventsOption {
	return func(c *denyEventsConfig) { c.onError = f }
}

// DenyEventsStats is a reading of the deny events' counters.
type DenyEventsStats struct {
	// Recorded is the events given to Record.
	Recorded uint64
	// Shipped is the events a sink accepted.
	Shipped uint64
	// Dropped is the events lost: the oldest dropped from a full buffer,
	// every event of a batch its sink refused or did not take in time, and
	// those recorded after Close.
	Dropped uint64
	// SinkErrors is the flushes a sink refused or failed.
	SinkErrors uint64
	// Batches is the batches a sink accepted.
	Batches uint64
	// Pending is the events waiting in the buffer now.
	Pending int
}

// DenyEvents ships denials as JSON lines to a Sink, in batches, through a
// bounded ring buffer that a goroutine flushes every flush interval or as
// soon as a batch's worth waits, whichever comes first. Record never waits
// for the sink. Call Close at shutdown to ship what is left. A nil
// *DenyEvents records nothing.
type DenyEvents struct {
	cfg  denyEventsConfig
	sink Sink

	mu     sync.Mutex
	ring   []DenyEvent
	head   int // index of the oldest
	n      int // events waiting
	closed bool

	wake chan struct{} // a batch is ready (buffered 1)
	stop chan struct{}
	done chan struct{}
	// ctx is the flusher's sends' context: cancelled by a Close whose own
	// context ends before the flusher stops.
	ctx    context.Context
	cancel context.CancelFunc

	shipMu sync.Mutex  // one batch at a time goes to the sink
	stuck  atomic.Bool // a send that timed out still runs

	metrics atomic.Pointer[Metrics]

	closeOnce sync.Once
	closeErr  error

	recorded, shipped, dropped, sinkErrors, batches atomic.Uint64
}

// NewDenyEvents starts the deny events' flusher, shipping to sink, with the
// contract's defaults: a buffer of 10,000 events, flushed every 5 s or as
// soon as 1,000 wait, each batch within 2 s. With a nil sink every batch
// fails (an *InvalidArgumentError naming "sink", given to the error
// handler) and is counted dropped.
func NewDenyEvents(sink Sink, opts ...DenyEventsOption) *DenyEvents {
	if sink == nil {
		sink = SinkFunc(func(context.Context, []DenyEvent) error {
			return &InvalidArgumentError{Rule: "NewDenyEvents", Arg: "sink", Reason: "a nil Sink"}
		})
	}
	cfg := denyEventsConfig{
		capacity:    DefaultEventsCapacity,
		flushEvents: DefaultFlushEvents,
		interval:    DefaultFlushInterval,
		timeout:     DefaultSinkTimeout,
	}
	for _, o := range opts {
		if o != nil {
			o(&cfg)
		}
	}
	cfg.flushEvents = min(cfg.flushEvents, cfg.capacity)
	if cfg.onError == nil {
		cfg.onError = func(err error) {
			slog.Warn("redis-ratelimit: deny events dropped, the sink failed", "error", err)
		}
	}
	e := &DenyEvents{
		cfg:  cfg,
		sink: sink,
		ring: make([]DenyEvent, min(cfg.capacity, 64)),
		wake: make(chan struct{}, 1),
		stop: make(chan struct{}),
		done: make(chan struct{}),
	}
	e.ctx, e.cancel = context.WithCancel(context.Background())
	e.metrics.Store(cfg.metrics)
	go e.flusher()
	return e
}

// Record appends ev to the buffer (dropping the oldest when it is full) and
// wakes the flusher when a batch is ready. It never waits for the sink.
// ClientIP and UserAgent are cut to MaxHeaderBytes; a zero Timestamp is now.
// After Close the event is dropped and counted.
func (e *DenyEvents) Record(ev DenyEvent) {
	if e == nil {
		return
	}
	e.recorded.Add(1)
	if ev.Timestamp.IsZero() {
		ev.Timestamp = time.Now()
	}
	ev.ClientIP = cutHeader(ev.ClientIP)
	ev.UserAgent = cutHeader(ev.UserAgent)
	dropped := 0
	e.mu.Lock()
	if e.closed {
		e.mu.Unlock()
		e.drop(1)
		return
	}
	if e.n == len(e.ring) && len(e.ring) < e.cfg.capacity {
		e.grow()
	}
	capacity := len(e.ring)
	if e.n == capacity {
		e.ring[e.head] = DenyEvent{}
		e.head = (e.head + 1) % capacity
		e.n--
		dropped = 1
	}
	e.ring[(e.head+e.n)%capacity] = ev
	e.n++
	ready := e.n >= e.cfg.flushEvents
	e.mu.Unlock()
	if dropped > 0 {
		e.drop(dropped)
	}
	if ready {
		select {
		case e.wake <- struct{}{}:
		default:
		}
	}
}

// grow doubles the ring's storage, up to the capacity (under e.mu): a
// buffer holds what waits, not its capacity, in memory.
func (e *DenyEvents) grow() {
	bigger := make([]DenyEvent, min(2*len(e.ring), e.cfg.capacity))
	for i := range e.n {
		bigger[i] = e.ring[(e.head+i)%len(e.ring)]
	}
	e.ring, e.head = bigger, 0
}

func (e *DenyEvents) drop(n int) {
	e.dropped.Add(uint64(n))
	e.metrics.Load().DenyEventsDropped(n)
}

// take removes and returns at most flushEvents of the oldest events.
func (e *DenyEvents) take() []DenyEvent {
	e.mu.Lock()
	defer e.mu.Unlock()
	k := min(e.n, e.cfg.flushEvents)
	if k == 0 {
		return nil
	}
	batch := make([]DenyEvent, k)
	capacity := len(e.ring)
	for i := range k {
		j := (e.head + i) % capacity
		batch[i] = e.ring[j]
		e.ring[j] = DenyEvent{}
	}
	e.head = (e.head + k) % capacity
	e.n -= k
	return batch
}

func (e *DenyEvents) pending() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.n
}

// ship sends one batch within the sink timeout (and ctx), and counts what
// became of it. A send that does not return in time is left running; the
// batches that come meanwhile are refused at once.
func (e *DenyEvents) ship(ctx context.Context, batch []DenyEvent) {
	e.shipMu.Lock()
	defer e.shipMu.Unlock()
	n := len(batch)
	fail := func(err error) {
		e.drop(n)
		e.sinkErrors.Add(1)
		e.metrics.Load().DenyEventsSinkError()
		e.cfg.onError(fmt.Errorf("ratelimit: %d deny events dropped: %w", n, err))
	}
	if e.stuck.Load() {
		fail(errors.New("the previous batch's send is still running (it timed out)"))
		return
	}
	sctx, cancel := context.WithTimeout(ctx, e.cfg.timeout)
	defer cancel()
	result := make(chan error, 1)
	e.stuck.Store(true)
	go func() {
		err := e.send(sctx, batch)
		e.stuck.Store(false)
		result <- err
	}()
	var err error
	select {
	case err = <-result:
	case <-sctx.Done():
		select {
		case err = <-result: // it answered at the deadline
		default:
			err = fmt.Errorf("no answer within %v: %w", e.cfg.timeout, sctx.Err())
		}
	}
	if err != nil {
		fail(err)
		return
	}
	e.shipped.Add(uint64(n))
	e.batches.Add(1)
	e.metrics.Load().DenyEventsShipped(n)
}

// send calls the sink, a panic turned into an error.
func (e *DenyEvents) send(ctx context.Context, batch []DenyEvent) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("the sink panicked: %v", r)
		}
	}()
	return e.sink.Send(ctx, batch)
}

func (e *DenyEvents) flusher() {
	defer close(e.done)
	tick := time.NewTicker(e.cfg.interval)
	defer tick.Stop()
	for {
		select {
		case <-e.stop:
			return
		case <-tick.C:
			e.flushAll(e.ctx)
		case <-e.wake:
			// Full batches while they wait; the rest waits for the tick.
			for e.pending() >= e.cfg.flushEvents {
				select {
				case <-e.stop:
					return
				default:
				}
				e.ship(e.ctx, e.take())
			}
		}
	}
}

// flushAll ships everything waiting now, batch after batch, until ctx ends.
func (e *DenyEvents) flushAll(ctx context.Context) {
	for ctx.Err() == nil {
		batch := e.take()
		if len(batch) == 0 {
			return
		}
		e.ship(ctx, batch)
	}
}

// Flush ships everything waiting now, in batches, each within the sink
// timeout; it returns ctx's error if ctx ended first.
func (e *DenyEvents) Flush(ctx context.Context) error {
	if e == nil {
		return nil
	}
	e.flushAll(ctx)
	return ctx.Err()
}

// Close stops the flusher and ships what is left, within ctx; what it
// could not ship by then is dropped and counted, and ctx's error returned.
// Later Records are dropped and counted. Close is idempotent.
func (e *DenyEvents) Close(ctx context.Context) error {
	if e == nil {
		return nil
	}
	e.closeOnce.Do(func() {
		close(e.stop)
		select {
		case <-e.done:
		case <-ctx.Done():
			// The batch the flusher is shipping is given up (counted).
			e.cancel()
			<-e.done
		}
		e.cancel()
		e.flushAll(ctx)
		e.mu.Lock()
		e.closed = true
		left := e.n
		e.ring = make([]DenyEvent, 1)
		e.n, e.head = 0, 0
		e.mu.Unlock()
		e.drop(left)
		e.closeErr = ctx.Err()
	})
	return e.closeErr
}

// SetMetrics counts the events in m from now on (as WithEventsMetrics;
// nil: in none), replacing the metrics set before: a limiter given both
// its metrics and these deny events calls it.
func (e *DenyEvents) SetMetrics(m *Metrics) {
	if e == nil {
		return
	}
	e.metrics.Store(m)
}

// Stats is a reading of the counters.
func (e *DenyEvents) Stats() DenyEventsStats {
	if e == nil {
		return DenyEventsStats{}
	}
	return DenyEventsStats{
		Recorded:   e.recorded.Load(),
		Shipped:    e.shipped.Load(),
		Dropped:    e.dropped.Load(),
		SinkErrors: e.sinkErrors.Load(),
		Batches:    e.batches.Load(),
		Pending:    e.pending(),
	}
}

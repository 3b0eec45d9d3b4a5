package ratelimit

import (
	"context"
	"encoding/json"
	"io"
	"math"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/redis-ratelimit/redis-ratelimit/clients/go/internal/testserver"
)

// obsContract is the observability section of clients/contract/contract.json.
type obsContract struct {
	DenyEvents struct {
		BufferEvents    int      `json:"buffer_events"`
		BulkIndex       string   `json:"bulk_index"`
		Fields          []string `json:"fields"`
		FlushEvents     int      `json:"flush_events"`
		FlushIntervalMs int64    `json:"flush_interval_ms"`
		MaxHeaderBytes  int      `json:"max_header_bytes"`
		Optional        []string `json:"optional"`
		SinkTimeoutMs   int64    `json:"sink_timeout_ms"`
		Timestamp       string   `json:"timestamp"`
	} `json:"deny_events"`
	Levels []struct {
		Level string `json:"level"`
	} `json:"levels"`
	Metrics []struct {
		Name   string   `json:"name"`
		Type   string   `json:"type"`
		Labels []string `json:"labels"`
		Help   string   `json:"help"`
	} `json:"metrics"`
	Outcomes            []string  `json:"outcomes"`
	RedisSecondsBuckets []float64 `json:"redis_seconds_buckets"`
}

func readObsContract(t *testing.T) obsContract {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join("..", "..", "contract", "contract.json"))
	if err != nil {
		t.Fatalf("the contract: %v", err)
	}
	var c struct {
		Observability obsContract `json:"observability"`
	}
	if err := json.Unmarshal(raw, &c); err != nil {
		t.Fatalf("the contract's observability section: %v", err)
	}
	if len(c.Observability.Metrics) == 0 {
		t.Fatal("the contract's observability section has no metrics")
	}
	return c.Observability
}

func TestMetricsTableIsTheContracts(t *testing.T) {
	c := readObsContract(t)
	if len(MetricsTable) != len(c.Metrics) {
		t.Fatalf("MetricsTable has %d families, the contract %d", len(MetricsTable), len(c.Metrics))
	}
	for i, want := range c.Metrics {
		got := MetricsTable[i]
		if got.Name != want.Name || got.Type != want.Type || got.Help != want.Help ||
			!slices.Equal(got.Labels, want.Labels) {
			t.Errorf("MetricsTable[%d] = %+v, the contract %+v", i, got, want)
		}
	}
	var levels []string
	for _, l := range c.Levels {
		levels = append(levels, l.Level)
	}
	if !slices.Equal(MetricLevels, levels) {
		t.Errorf("MetricLevels = %v, the contract %v", MetricLevels, levels)
	}
	for _, p := range []Path{PathRedis, PathLocal, PathDenyCache, PathFallback, PathGrant} {
		if !slices.Contains(levels, p.String()) {
			t.Errorf("Path %d's level %q is not one of the contract's %v", int(p), p.String(), levels)
		}
	}
	if !slices.Equal(MetricOutcomes, c.Outcomes) {
		t.Errorf("MetricOutcomes = %v, the contract %v", MetricOutcomes, c.Outcomes)
	}
	if !slices.Equal(RedisSecondsBuckets, c.RedisSecondsBuckets) {
		t.Errorf("RedisSecondsBuckets = %v, the contract %v", RedisSecondsBuckets, c.RedisSecondsBuckets)
	}
}

// feedAll reports something into every family: a decision per level and
// outcome, a round trip, a ratio, a breaker, a scale, a stage and the deny
// events' counters.
func feedAll(m *Metrics) {
	for _, p := range []Path{PathLocal, PathRedis, PathDenyCache, PathGrant, PathFallback} {
		for _, o := range MetricOutcomes {
			m.Decision("per-user", p, o)
		}
	}
	m.RedisRoundTrip(3 * time.Millisecond)
	m.RemainingRatio("per-user", 0.25)
	m.BreakerOpen("redis", true)
	m.Scale("per-user", 80)
	m.Stage("per-user", 1)
	m.DenyEventsDropped(2)
	m.DenyEventsShipped(5)
	m.DenyEventsSinkError()
}

var dtoTypes = map[string]dto.MetricType{
	"counter":   dto.MetricType_COUNTER,
	"gauge":     dto.MetricType_GAUGE,
	"histogram": dto.MetricType_HISTOGRAM,
}

func TestMetricsConformToTheContract(t *testing.T) {
	c := readObsContract(t)
	m, err := NewMetrics(nil)
	if err != nil {
		t.Fatal(err)
	}
	feedAll(m)
	families, err := m.Gatherer().Gather()
	if err != nil {
		t.Fatal(err)
	}
	byName := map[string]*dto.MetricFamily{}
	for _, f := range families {
		byName[f.GetName()] = f
	}
	if len(byName) != len(c.Metrics) {
		var names []string
		for n := range byName {
			names = append(names, n)
		}
		t.Errorf("the registry has %d families %v, the contract %d", len(byName), names, len(c.Metrics))
	}
	for _, want := range c.Metrics {
		f, ok := byName[want.Name]
		if !ok {
			t.Errorf("%s: not gathered", want.Name)
			continue
		}
		if f.GetType() != dtoTypes[want.Type] {
			t.Errorf("%s: type %v, the contract %s", want.Name, f.GetType(), want.Type)
		}
		if f.GetHelp() != want.Help {
			t.Errorf("%s: help %q, the contract %q", want.Name, f.GetHelp(), want.Help)
		}
		if len(f.GetMetric()) == 0 {
			t.Errorf("%s: no series", want.Name)
		}
		for _, s := range f.GetMetric() {
			var labels []string
			for _, l := range s.GetLabel() {
				labels = append(labels, l.GetName())
			}
			slices.Sort(labels)
			wantLabels := slices.Sorted(slices.Values(want.Labels))
			if !slices.Equal(labels, wantLabels) {
				t.Errorf("%s: a series with labels %v, the contract %v", want.Name, labels, want.Labels)
			}
		}
	}
	// Every level x outcome of the decisions.
	seen := map[[2]string]float64{}
	for _, s := range byName["ratelimit_decisions_total"].GetMetric() {
		lv := map[string]string{}
		for _, l := range s.GetLabel() {
			lv[l.GetName()] = l.GetValue()
		}
		if lv["rule"] != "per-user" {
			t.Errorf("decisions: rule %q, want per-user", lv["rule"])
		}
		seen[[2]string{lv["level"], lv["outcome"]}] = s.GetCounter().GetValue()
	}
	for _, l := range c.Levels {
		for _, o := range c.Outcomes {
			if seen[[2]string{l.Level, o}] != 1 {
				t.Errorf("decisions{level=%q,outcome=%q} = %v, want 1", l.Level, o, seen[[2]string{l.Level, o}])
			}
		}
	}
	// The histogram's buckets, in order, and the 3 ms round trip in them.
	h := byName["ratelimit_redis_seconds"].GetMetric()[0].GetHistogram()
	var bounds []float64
	for _, b := range h.GetBucket() {
		bounds = append(bounds, b.GetUpperBound())
		wantCount := uint64(0)
		if b.GetUpperBound() >= 0.003 {
			wantCount = 1
		}
		if b.GetCumulativeCount() != wantCount {
			t.Errorf("ratelimit_redis_seconds le=%v: %d, want %d", b.GetUpperBound(), b.GetCumulativeCount(), wantCount)
		}
	}
	if !slices.Equal(bounds, c.RedisSecondsBuckets) {
		t.Errorf("ratelimit_redis_seconds buckets %v, the contract %v", bounds, c.RedisSecondsBuckets)
	}
	if h.GetSampleCount() != 1 || math.Abs(h.GetSampleSum()-0.003) > 1e-12 {
		t.Errorf("ratelimit_redis_seconds count %d sum %v, want 1 and 0.003", h.GetSampleCount(), h.GetSampleSum())
	}
	for name, want := range map[string]float64{
		"ratelimit_remaining_ratio":               0.25,
		"ratelimit_breaker_open":                  1,
		"ratelimit_scale":                         80,
		"ratelimit_stage":                         1,
		"ratelimit_deny_events_dropped_total":     2,
		"ratelimit_deny_events_shipped_total":     5,
		"ratelimit_deny_events_sink_errors_total": 1,
	} {
		if got := value(t, byName[name].GetMetric()[0]); got != want {
			t.Errorf("%s = %v, want %v", name, got, want)
		}
	}
}

func value(t *testing.T, s *dto.Metric) float64 {
	t.Helper()
	switch {
	case s.Gauge != nil:
		return s.GetGauge().GetValue()
	case s.Counter != nil:
		return s.GetCounter().GetValue()
	}
	t.Fatalf("not a gauge or counter: %v", s)
	return 0
}

// gathered is the value of the series of name whose labels include want.
func gathered(t *testing.T, g prometheus.Gatherer, name string, want map[string]string) (float64, bool) {
	t.Helper()
	families, err := g.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
	series:
		for _, s := range f.GetMetric() {
			for _, l := range s.GetLabel() {
				if v, ok := want[l.GetName()]; ok && v != l.GetValue() {
					continue series
				}
			}
			return value(t, s), true
		}
	}
	return 0, false
}

func TestMetricsScrape(t *testing.T) {
	c := readObsContract(t)
	m, err := NewMetrics(nil)
	if err != nil {
		t.Fatal(err)
	}
	feedAll(m)
	srv := httptest.NewServer(m.Handler())
	defer srv.Close()
	get := func(accept string) (string, string) {
		req, _ := http.NewRequest(http.MethodGet, srv.URL, nil)
		if accept != "" {
			req.Header.Set("Accept", accept)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != 200 {
			t.Fatalf("scrape: status %d", resp.StatusCode)
		}
		return resp.Header.Get("Content-Type"), string(body)
	}
	_, text := get("")
	for _, want := range c.Metrics {
		family := want.Name
		if !strings.Contains(text, "# TYPE "+family+" "+want.Type+"\n") {
			t.Errorf("the text scrape has no '# TYPE %s %s'", family, want.Type)
		}
		if !strings.Contains(text, "# HELP "+family+" ") {
			t.Errorf("the text scrape has no HELP for %s", family)
		}
	}
	if !strings.Contains(text, `ratelimit_redis_seconds_bucket{le="0.01"} 1`) {
		t.Errorf("the text scrape lacks the 10 ms bucket:\n%s", text)
	}
	// promtool (make setup installs it) reads the scrape without a lint
	// problem.
	promtool, err := exec.LookPath("promtool")
	if err != nil {
		t.Fatalf("promtool is needed (make setup installs it): %v", err)
	}
	check := exec.Command(promtool, "check", "metrics")
	check.Stdin = strings.NewReader(text)
	if out, err := check.CombinedOutput(); err != nil {
		t.Errorf("promtool check metrics: %v\n%s", err, out)
	}
	ct, om := get("application/openmetrics-text; version=1.0.0")
	if !strings.HasPrefix(ct, "application/openmetrics-text") {
		t.Errorf("OpenMetrics scrape Content-Type %q", ct)
	}
	if !strings.HasSuffix(om, "# EOF\n") {
		t.Errorf("the OpenMetrics scrape does not end in # EOF")
	}
}

func TestMetricsValues(t *testing.T) {
	m, err := NewMetrics(nil)
	if err != nil {
		t.Fatal(err)
	}
	g := m.Gatherer()
	m.Decision("a", PathRedis, OutcomeDenied)
	m.Decision("a", PathRedis, OutcomeDenied)
	m.Decision("b", PathRedis, OutcomeDenied)
	if v, _ := gathered(t, g, "ratelimit_decisions_total", map[string]string{"rule": "a", "level": "redis", "outcome": "denied"}); v != 2 {
		t.Errorf("decisions{a,redis,denied} = %v, want 2", v)
	}
	for _, c := range []struct{ in, want float64 }{{1.5, 1}, {-0.2, 0}, {0.5, 0.5}} {
		m.RemainingRatio("a", c.in)
		if v, _ := gathered(t, g, "ratelimit_remaining_ratio", map[string]string{"rule": "a"}); v != c.want {
			t.Errorf("RemainingRatio(%v) shows %v, want %v", c.in, v, c.want)
		}
	}
	m.RemainingRatio("a", math.NaN())
	if v, _ := gathered(t, g, "ratelimit_remaining_ratio", map[string]string{"rule": "a"}); v != 0.5 {
		t.Errorf("RemainingRatio(NaN) changed the gauge to %v", v)
	}
	m.BreakerOpen("redis", true)
	m.BreakerOpen("redis", false)
	if v, ok := gathered(t, g, "ratelimit_breaker_open", map[string]string{"breaker": "redis"}); !ok || v != 0 {
		t.Errorf("breaker_open after closing = %v (%v), want 0", v, ok)
	}
	m.Stage("p", 2)
	if v, _ := gathered(t, g, "ratelimit_stage", map[string]string{"rule": "p"}); v != 2 {
		t.Errorf("stage = %v, want 2", v)
	}
}

func TestMetricsNilIsSafe(t *testing.T) {
	var m *Metrics
	feedAll(m)
	m.RemainingRatio("x", 1)
	if m.Gatherer() != nil {
		t.Error("a nil *Metrics has a Gatherer")
	}
	rec := httptest.NewRecorder()
	m.Handler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/", nil))
	if rec.Code != http.StatusNotFound {
		t.Errorf("a nil *Metrics' handler answered %d, want 404", rec.Code)
	}
}

func TestMetricsShareARegistry(t *testing.T) {
	reg := prometheus.NewRegistry()
	a, err := NewMetrics(reg)
	if err != nil {
		t.Fatal(err)
	}
	b, err := NewMetrics(reg)
	if err != nil {
		t.Fatalf("a second NewMetrics on the same registry: %v", err)
	}
	a.Decision("r", PathLocal, OutcomeAdmitted)
	b.Decision("r", PathLocal, OutcomeAdmitted)
	if v, _ := gathered(t, reg, "ratelimit_decisions_total", map[string]string{"rule": "r"}); v != 2 {
		t.Errorf("decisions over two Metrics on one registry = %v, want 2", v)
	}
	if !reflect.DeepEqual(a.Gatherer(), prometheus.Gatherer(reg)) {
		t.Error("Gatherer is not the registry given")
	}

	// A family of the same name and another kind is refused.
	other := prometheus.NewRegistry()
	other.MustRegister(prometheus.NewGauge(prometheus.GaugeOpts{Name: "ratelimit_scale", Help: "x"}))
	if _, err := NewMetrics(other); err == nil {
		t.Error("NewMetrics over a clashing ratelimit_scale: no error")
	}
}

func BenchmarkMetricsDecision(b *testing.B) {
	m, err := NewMetrics(nil)
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			m.Decision("per-user", PathRedis, OutcomeAdmitted)
		}
	})
}

func BenchmarkMetricsRedisRoundTrip(b *testing.B) {
	m, err := NewMetrics(nil)
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		m.RedisRoundTrip(700 * time.Microsecond)
	}
}

// A real limiter on a real server, then without it: the scrape shows the
// decisions at each level it took, the round trips, the ratio, and the deny
// events carry the contract's fields.
func TestMetricsFromARealLimiter(t *testing.T) {
	c := readObsContract(t)
	srv := testserver.Start(t, testserver.Redis)
	ctx := context.Background()
	client, err := NewClient(ctx, srv.Client())
	if err != nil {
		t.Fatal(err)
	}
	m, err := NewMetrics(nil)
	if err != nil {
		t.Fatal(err)
	}
	col := &collector{}
	events := NewDenyEvents(col.sink(), WithFlushInterval(time.Hour), WithEventsMetrics(m))
	l := NewLimiter(client, WithMetrics(m), WithDenyEvents(events), WithFallback(FailOpen),
		WithBreaker(BreakerConfig{Failures: 1, OpenFor: time.Hour}))
	t.Cleanup(func() { _ = l.Close(context.Background()) })
	set, err := l.RuleSet(ctx, NewRule("per-user", FixedWindow(2, 60000)))
	if err != nil {
		t.Fatal(err)
	}
	var paths []Path
	for range 4 {
		paths = append(paths, l.Check(ctx, set, "bob", 1).Path)
	}
	srv.Kill9()
	testserver.WaitUntil(t, "a fallback decision", func() bool {
		d := l.Check(ctx, set, "carol", 1)
		paths = append(paths, d.Path)
		return d.Path == PathFallback
	})
	var levels []string
	for _, l := range c.Levels {
		levels = append(levels, l.Level)
	}
	for _, p := range paths {
		if !slices.Contains(levels, p.String()) {
			t.Errorf("a decision's level %q is not in the contract's %v", p.String(), levels)
		}
	}
	g := m.Gatherer()
	for _, want := range []struct {
		level, outcome string
		min            float64
	}{{"redis", "admitted", 2}, {"redis", "denied", 1}, {"fallback", "admitted", 1}} {
		v, ok := gathered(t, g, "ratelimit_decisions_total",
			map[string]string{"rule": "per-user", "level": want.level, "outcome": want.outcome})
		if !ok || v < want.min {
			t.Errorf("decisions{per-user,%s,%s} = %v (%v), want at least %v", want.level, want.outcome, v, ok, want.min)
		}
	}
	families, err := g.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() == "ratelimit_redis_seconds" && f.GetMetric()[0].GetHistogram().GetSampleCount() < 3 {
			t.Errorf("ratelimit_redis_seconds counted %d round trips, want at least 3",
				f.GetMetric()[0].GetHistogram().GetSampleCount())
		}
	}
	if v, ok := gathered(t, g, "ratelimit_remaining_ratio", map[string]string{"rule": "per-user"}); !ok || v < 0 || v > 1 {
		t.Errorf("ratelimit_remaining_ratio{per-user} = %v (%v)", v, ok)
	}
	if err := events.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	got := col.events()
	if len(got) == 0 {
		t.Fatal("no deny event shipped")
	}
	first := got[0]
	if first.Key == "" || !strings.Contains(first.Key, "bob") || first.Rule != "per-user" || first.Limit != 2 ||
		first.Remaining != 0 || first.RetryAfterMs <= 0 || !slices.Contains(levels, first.Level) {
		t.Errorf("the first deny event %+v", first)
	}
	line, _ := json.Marshal(first)
	keys := jsonKeys(t, line)
	if !slices.Equal(keys, c.DenyEvents.Fields[:len(keys)]) {
		t.Errorf("the event's keys %v, the contract's order %v", keys, c.DenyEvents.Fields)
	}
	if v, _ := gathered(t, g, "ratelimit_deny_events_shipped_total", nil); v != float64(len(got)) {
		t.Errorf("ratelimit_deny_events_shipped_total = %v, %d shipped", v, len(got))
	}
	if err := events.Close(ctx); err != nil {
		t.Fatal(err)
	}
}

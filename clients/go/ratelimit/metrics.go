package ratelimit

import (
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// MetricInfo is one of the contract's metric families (clients/contract/
// contract.json, observability.metrics): its name as a scrape shows it, its
// type ("counter", "gauge", "histogram"), its labels and its help.
type MetricInfo struct {
	Name   string
	Type   string
	Labels []string
	Help   string
}

// MetricsTable lists the families every kit serves, as the contract names
// them (SPEC "Observability in every kit").
var MetricsTable = []MetricInfo{
	{"ratelimit_decisions_total", "counter", []string{"rule", "level", "outcome"},
		"Decisions taken, by rule, by the level that took them and by outcome"},
	{"ratelimit_redis_seconds", "histogram", nil,
		"Round trips of limiter commands to Redis, in seconds"},
	{"ratelimit_remaining_ratio", "gauge", []string{"rule"},
		"remaining / limit of the rule's last decision taken by Redis or the local level (0: at the limit)"},
	{"ratelimit_breaker_open", "gauge", []string{"breaker"},
		"1 while the breaker is open (Redis skipped, or a protected stage broken), else 0"},
	{"ratelimit_scale", "gauge", []string{"rule"},
		"The protection loop's scale of the rule's policy, in percent"},
	{"ratelimit_stage", "gauge", []string{"rule"},
		"The protection loop's stage of the rule's policy: 0 normal, 1 degrade, 2 break"},
	{"ratelimit_deny_events_dropped_total", "counter", nil,
		"Deny events lost: the oldest dropped from a full buffer, and every event of a batch its sink refused"},
	{"ratelimit_deny_events_shipped_total", "counter", nil,
		"Deny events a sink accepted"},
	{"ratelimit_deny_events_sink_errors_total", "counter", nil,
		"Flushes a sink refused or failed (an error, a timeout, an HTTP status other than 2xx, a _bulk reply with errors)"},
}

// RedisSecondsBuckets are the upper bounds of ratelimit_redis_seconds'
// buckets, in seconds (10 ms among them: the P2 alert's threshold).
var RedisSecondsBuckets = []float64{0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0}

// MetricLevels are the values of the level label, in the contract's order
// (Path.String of each Path).
var MetricLevels = []string{"local", "redis", "deny_cache", "grant", "fallback"}

// The values of the outcome label of ratelimit_decisions_total (and of a
// deny event's outcome).
const (
	OutcomeAdmitted     = "admitted"
	OutcomeDenied       = "denied"
	OutcomeShadowDenied = "shadow_denied"
)

// MetricOutcomes are the values of the outcome label, in the contract's
// order.
var MetricOutcomes = []string{OutcomeAdmitted, OutcomeDenied, OutcomeShadowDenied}

func metricHelp(name string) string {
	for _, m := range MetricsTable {
		if m.Name == name {
			return m.Help
		}
	}
	return ""
}

// Metrics are the kit's Prometheus metrics (client_golang), by the
// contract's names. Give them to the limiter (WithMetrics), the protection
// loop and the deny events (WithEventsMetrics). Every method is safe on a
// nil *Metrics (it does nothing) and for concurrent use.
//
// A labelled family shows in a scrape from its first series on (client_golang
// serves no family without samples); the unlabelled ones from the start.
type Metrics struct {
	decisions    *prometheus.CounterVec
	redisSeconds prometheus.Histogram
	remaining    *prometheus.GaugeVec
	breaker      *prometheus.GaugeVec
	scale        *prometheus.GaugeVec
	stage        *prometheus.GaugeVec
	dropped      prometheus.Counter
	shipped      prometheus.Counter
	sinkErrors   prometheus.Counter

	gatherer prometheus.Gatherer

	// decided caches the counter of each (rule, level, outcome): one map
	// read on a request instead of the vector's hashing of its labels.
	decided sync.Map // decisionKey -> prometheus.Counter
	ratios  sync.Map // rule -> prometheus.Gauge
}

type decisionKey struct {
	rule    string
	level   Path
	outcome string
}

// NewMetrics registers the contract's families in reg and returns them.
// A nil reg gives the metrics a registry of their own (serve it with
// Handler). Families already registered in reg by another NewMetrics are
// shared, so two limiters may report into one registry; a family of the
// same name but another kind is an error.
func NewMetrics(reg prometheus.Registerer) (*Metrics, error) {
	var gatherer prometheus.Gatherer
	if reg == nil {
		r := prometheus.NewRegistry()
		reg, gatherer = r, r
	} else if g, ok := reg.(prometheus.Gatherer); ok {
		gatherer = g
	}
	m := &Metrics{gatherer: gatherer}
	var err error
	if m.decisions, err = register(reg, prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "ratelimit_decisions_total", Help: metricHelp("ratelimit_decisions_total"),
	}, []string{"rule", "level", "outcome"})); err != nil {
		return nil, err
	}
	if m.redisSeconds, err = register(reg, prometheus.NewHistogram(prometheus.HistogramOpts{
		Name: "ratelimit_redis_seconds", Help: metricHelp("ratelimit_redis_seconds"),
		Buckets: RedisSecondsBuckets,
	})); err != nil {
		return nil, err
	}
	gauges := []struct {
		into  **prometheus.GaugeVec
		name  string
		label string
	}{
		{&m.remaining, "ratelimit_remaining_ratio", "rule"},
		{&m.breaker, "ratelimit_breaker_open", "breaker"},
		{&m.scale, "ratelimit_scale", "rule"},
		{&m.stage, "ratelimit_stage", "rule"},
	}
	for _, g := range gauges {
		if *g.into, err = register(reg, prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: g.name, Help: metricHelp(g.name),
		}, []string{g.label})); err != nil {
			return nil, err
		}
	}
	counters := []struct {
		into *prometheus.Counter
		name string
	}{
		{&m.dropped, "ratelimit_deny_events_dropped_total"},
		{&m.shipped, "ratelimit_deny_events_shipped_total"},
		{&m.sinkErrors, "ratelimit_deny_events_sink_errors_total"},
	}
	for _, c := range counters {
		if *c.into, err = register(reg, prometheus.NewCounter(prometheus.CounterOpts{
			Name: c.name, Help: metricHelp(c.name),
		})); err != nil {
			return nil, err
		}
	}
	return m, nil
}

// register registers c in reg, or returns the collector of the same
// description already there.
func register[C prometheus.Collector](reg prometheus.Registerer, c C) (C, error) {
	if err := reg.Register(c); err != nil {
		var are prometheus.AlreadyRegisteredError
		if errors.As(err, &are) {
			if existing, ok := are.ExistingCollector.(C); ok {
				return existing, nil
			}
		}
		var zero C
		return zero, fmt.Errorf("ratelimit: registering the metrics: %w", err)
	}
	return c, nil
}

// Gatherer is the registry the metrics are in, when it can be gathered
// (their own, or the Registerer given if it is also a Gatherer); else nil.
func (m *Metrics) Gatherer() prometheus.Gatherer {
	if m == nil {
		return nil
	}
	return m.gatherer
}

// Handler serves the metrics' registry (Gatherer) in the Prometheus text
// or OpenMetrics format, as the scraper asks; 404 without one.
func (m *Metrics) Handler() http.Handler {
	g := m.Gatherer()
	if g == nil {
		return http.NotFoundHandler()
	}
	return promhttp.HandlerFor(g, promhttp.HandlerOpts{EnableOpenMetrics: true})
}

// Decision counts one decision of rule, taken at level, with outcome
// (OutcomeAdmitted, OutcomeDenied or OutcomeShadowDenied).
func (m *Metrics) Decision(rule string, level Path, outcome string) {
	if m == nil {
		return
	}
	k := decisionKey{rule, level, outcome}
	if c, ok := m.decided.Load(k); ok {
		c.(prometheus.Counter).Inc()
		return
	}
	c := m.decisions.WithLabelValues(label(rule), level.String(), label(outcome))
	m.decided.Store(k, c)
	c.Inc()
}

// RedisRoundTrip observes one round trip of a limiter command.
func (m *Metrics) RedisRoundTrip(d time.Duration) {
	if m == nil {
		return
	}
	m.redisSeconds.Observe(d.Seconds())
}

// RemainingRatio sets remaining / limit of the rule's last decision taken
// by Redis or the local level, clamped to [0, 1] (NaN is ignored).
func (m *Metrics) RemainingRatio(rule string, ratio float64) {
	if m == nil || ratio != ratio {
		return
	}
	ratio = min(max(ratio, 0), 1)
	if g, ok := m.ratios.Load(rule); ok {
		g.(prometheus.Gauge).Set(ratio)
		return
	}
	g := m.remaining.WithLabelValues(label(rule))
	m.ratios.Store(rule, g)
	g.Set(ratio)
}

// BreakerOpen sets ratelimit_breaker_open{breaker}: 1 while open, else 0.
func (m *Metrics) BreakerOpen(breaker string, open bool) {
	if m == nil {
		return
	}
	v := 0.0
	if open {
		v = 1
	}
	m.breaker.WithLabelValues(label(breaker)).Set(v)
}

// Scale sets the protection loop's scale of the rule's policy, in percent.
func (m *Metrics) Scale(rule string, pct int) {
	if m == nil {
		return
	}
	m.scale.WithLabelValues(label(rule)).Set(float64(pct))
}

// Stage sets the protection loop's stage of the rule's policy: 0 normal,
// 1 degrade, 2 break.
func (m *Metrics) Stage(rule string, stage int) {
	if m == nil {
		return
	}
	m.stage.WithLabelValues(label(rule)).Set(float64(stage))
}

// DenyEventsDropped adds n deny events lost (a full buffer's oldest, a
// refused batch).
func (m *Metrics) DenyEventsDropped(n int) {
	if m == nil || n <= 0 {
		return
	}
	m.dropped.Add(float64(n))
}

// DenyEventsShipped adds n deny events a sink accepted.
func (m *Metrics) DenyEventsShipped(n int) {
	if m == nil || n <= 0 {
		return
	}
	m.shipped.Add(float64(n))
}

// DenyEventsSinkError counts one flush a sink refused or failed.
func (m *Metrics) DenyEventsSinkError() {
	if m == nil {
		return
	}
	m.sinkErrors.Inc()
}

// label is s as a label value: client_golang panics on one that is not
// valid UTF-8, so invalid bytes become U+FFFD.
func label(s string) string {
	if utf8.ValidString(s) {
		return s
	}
	return strings.ToValidUTF8(s, "\uFFFD")
}

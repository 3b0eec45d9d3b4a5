//! Observability (SPEC "Observability in every kit"): the metrics every
//! kit serves, by the contract's names, and the deny events shipped in
//! batches.
//!
//! - this file: [`Metrics`], the families, the scrape-time collector, and
//!   the exposition ([`Metrics::render`], [`render`]);
//! - `events.rs`: [`DenyEvents`], the ring buffer and its flusher;
//! - `sink.rs`: [`Sink`]: a file, an Elasticsearch `_bulk` endpoint, a
//!   callback.
//!
//! On a request's path with metrics on: one or two atomic additions (a
//! counter handle per rule, level and outcome is resolved once and kept),
//! and a histogram observation per round trip. Everything the kit already
//! holds in atomics (the breakers, the protection loop's scale and stage,
//! the deny events' counters) is read at scrape time by a collector, never
//! on a request.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::{ConstCounter, Counter};
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::{ConstGauge, Gauge};
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Registry;

use crate::decision::Path;

mod events;
mod sink;

pub(crate) use events::Origin;
use events::Totals;
pub use events::{DenyEvent, DenyEvents, DenyEventsBuilder, DenyEventsStats, Outcome};
pub use sink::Sink;

/// The deny events' defaults: the contract's.
pub mod events_defaults {
    pub use super::events::{
        DEFAULT_CAPACITY as CAPACITY, DEFAULT_FLUSH_EVENTS as FLUSH_EVENTS,
        DEFAULT_FLUSH_INTERVAL as FLUSH_INTERVAL, DEFAULT_SINK_TIMEOUT as SINK_TIMEOUT,
    };
    pub use super::sink::DEFAULT_BULK_INDEX as BULK_INDEX;
}

/// The contract's metrics: name as a scrape shows it, type, labels, help
/// (`observability.metrics` of clients/contract/contract.json).
pub const METRICS: [(&str, &str, &[&str], &str); 9] = [
    (
        "ratelimit_decisions_total",
        "counter",
        &["rule", "level", "outcome"],
        "Decisions taken, by rule, by the level that took them and by outcome",
    ),
    (
        "ratelimit_redis_seconds",
        "histogram",
        &[],
        "Round trips of limiter commands to Redis, in seconds",
    ),
    (
        "ratelimit_remaining_ratio",
        "gauge",
        &["rule"],
        "remaining / limit of the rule's last decision taken by Redis or the local level (0: at the limit)",
    ),
    (
        "ratelimit_breaker_open",
        "gauge",
        &["breaker"],
        "1 while the breaker is open (Redis skipped, or a protected stage broken), else 0",
    ),
    (
        "ratelimit_scale",
        "gauge",
        &["rule"],
        "The protection loop's scale of the rule's policy, in percent",
    ),
    (
        "ratelimit_stage",
        "gauge",
        &["rule"],
        "The protection loop's stage of the rule's policy: 0 normal, 1 degrade, 2 break",
    ),
    (
        "ratelimit_deny_events_dropped_total",
        "counter",
        &[],
        "Deny events lost: the oldest dropped from a full buffer, and every event of a batch its sink refused",
    ),
    (
        "ratelimit_deny_events_shipped_total",
        "counter",
        &[],
        "Deny events a sink accepted",
    ),
    (
        "ratelimit_deny_events_sink_errors_total",
        "counter",
        &[],
        "Flushes a sink refused or failed (an error, a timeout, an HTTP status other than 2xx, a _bulk reply with errors)",
    ),
];

/// The upper bounds of `ratelimit_redis_seconds`' buckets, in seconds
/// (10 ms among them: the P2 alert's threshold).
pub const REDIS_SECONDS_BUCKETS: [f64; 11] = [
    0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0,
];

/// The values of the `level` label, in the contract's order. `grant` (units
/// held from an `UPTO` grant) is for a later release: no path of this kit
/// takes it yet.
pub const LEVELS: [&str; 5] = ["local", "redis", "deny_cache", "grant", "fallback"];

/// The values of the `outcome` label.
pub const OUTCOMES: [&str; 3] = ["admitted", "denied", "shadow_denied"];

/// The `Content-Type` of the OpenMetrics text format.
pub const OPENMETRICS_CONTENT_TYPE: &str =
    "application/openmetrics-text; version=1.0.0; charset=utf-8";
/// The `Content-Type` of the Prometheus text format (0.0.4).
pub const TEXT_CONTENT_TYPE: &str = prometheus_client::encoding::prometheus_text::CONTENT_TYPE;

/// The name a family is registered under: a counter's without `_total`,
/// which the encoders add.
fn registered(name: &'static str) -> &'static str {
    name.strip_suffix("_total").unwrap_or(name)
}

fn help(name: &str) -> &'static str {
    METRICS
        .iter()
        .find(|m| m.0 == name)
        .map(|m| m.3)
        .expect("a contract metric")
}

pub(crate) fn level_of(path: Path) -> usize {
    match path {
        Path::Local => 0,
        Path::Redis => 1,
        Path::DenyCache => 2,
        Path::Grant => 3,
        Path::Fallback => 4,
    }
}

type DecisionLabels = [(&'static str, String); 3];
type RuleLabels = [(&'static str, String); 1];
type Ratio = Gauge<f64, AtomicU64>;

/// The kit's metrics, by the contract's names (`ratelimit_*`), in a
/// `prometheus-client` registry: the kit's own ([`Metrics::new`]) or the
/// application's ([`Metrics::register`]). Give it to
/// [`crate::LimiterBuilder::metrics`]: the limiter, its protection loop and
/// its deny events then report here. Cheap to clone: clones are the same
/// metrics.
#[derive(Clone)]
pub struct Metrics {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metrics").finish_non_exhaustive()
    }
}

struct Inner {
    decisions: Family<DecisionLabels, Counter>,
    redis_seconds: Histogram,
    remaining_ratio: Family<RuleLabels, Ratio>,
    live: Arc<Live>,
    /// The kit's own registry ([`Metrics::new`]); `None` when the families
    /// live in the application's.
    registry: Option<Registry>,
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new()
    }
}

impl Metrics {
    /// The metrics in a registry of their own: serve it with
    /// [`Metrics::render`].
    pub fn new() -> Metrics {
        let mut registry = Registry::default();
        let mut metrics = Metrics::register(&mut registry);
        Arc::get_mut(&mut metrics.inner)
            .expect("not shared yet")
            .registry = Some(registry);
        metrics
    }

    /// The metrics registered in the application's `registry` (served with
    /// the rest of it, e.g. through [`render`]).
    pub fn register(registry: &mut Registry) -> Metrics {
        let decisions = Family::<DecisionLabels, Counter>::default();
        let redis_seconds = Histogram::new(REDIS_SECONDS_BUCKETS);
        let remaining_ratio = Family::<RuleLabels, Ratio>::default();
        let live = Arc::new(Live::default());
        let name = registered("ratelimit_decisions_total");
        registry.register(name, help("ratelimit_decisions_total"), decisions.clone());
        registry.register(
            "ratelimit_redis_seconds",
            help("ratelimit_redis_seconds"),
            redis_seconds.clone(),
        );
        registry.register(
            "ratelimit_remaining_ratio",
            help("ratelimit_remaining_ratio"),
            remaining_ratio.clone(),
        );
        registry.register_collector(Box::new(live.clone()));
        Metrics {
            inner: Arc::new(Inner {
                decisions,
                redis_seconds,
                remaining_ratio,
                live,
                registry: None,
            }),
        }
    }

    /// The kit's own registry, if the metrics have one.
    pub fn registry(&self) -> Option<&Registry> {
        self.inner.registry.as_ref()
    }

    /// The scrape of the kit's own registry for a request whose `Accept`
    /// header is `accept`: its `Content-Type` and body ([`render`]); `None`
    /// when the metrics live in the application's registry.
    pub fn render(&self, accept: Option<&str>) -> Option<(&'static str, String)> {
        self.inner.registry.as_ref().map(|r| {
            // Only the kit's own families are in it: each encodes in both formats.
            render(r, accept).expect("the kit's metrics encode")
        })
    }

    /// Watches a protection loop: `ratelimit_scale` and `ratelimit_stage`
    /// of its policies, and `ratelimit_breaker_open` of its breakers, read
    /// at each scrape. (A limiter or a layer given both does it.)
    pub fn watch_protection(&self, protection: &crate::Protection) {
        self.inner
            .live
            .add(Source::Protection(protection.downgrade()));
    }

    /// Adds a deny-event shipper's counters (`ratelimit_deny_events_*`),
    /// read at each scrape. (A limiter given both does it.)
    pub fn watch_deny_events(&self, events: &DenyEvents) {
        self.inner.live.add(Source::Shipper(events.totals()));
    }

    pub(crate) fn watch_limiter(&self, breaker: Weak<dyn Fn() -> bool + Send + Sync>) {
        self.inner.live.add(Source::Limiter(breaker));
    }

    /// One round trip of a limiter command.
    pub(crate) fn observe_redis(&self, seconds: f64) {
        self.inner.redis_seconds.observe(seconds);
    }

    /// The handles of one rule's series (resolved on first use).
    pub(crate) fn rule(&self, rule: &str) -> RuleMetrics {
        RuleMetrics {
            metrics: self.clone(),
            rule: Arc::from(rule),
            decisions: Default::default(),
            ratio: OnceLock::new(),
        }
    }
}

/// The series of one rule: a counter per level and outcome, and the
/// remaining ratio, each looked up in its family once.
pub(crate) struct RuleMetrics {
    metrics: Metrics,
    rule: Arc<str>,
    decisions: [[OnceLock<Counter>; 3]; 5],
    ratio: OnceLock<Ratio>,
}

impl std::fmt::Debug for RuleMetrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RuleMetrics")
            .field("rule", &self.rule)
            .finish_non_exhaustive()
    }
}

impl RuleMetrics {
    /// Counts one decision of `level` (an index of [`LEVELS`]) with
    /// `outcome` (an index of [`OUTCOMES`]).
    pub(crate) fn decided(&self, level: usize, outcome: usize) {
        self.decisions[level][outcome]
            .get_or_init(|| {
                let labels = [
                    ("rule", self.rule.to_string()),
                    ("level", LEVELS[level].to_string()),
                    ("outcome", OUTCOMES[outcome].to_string()),
                ];
                self.metrics.inner.decisions.get_or_create_owned(&labels)
            })
            .inc();
    }

    /// The rule's last remaining / limit.
    pub(crate) fn remaining(&self, remaining: u64, limit: u64) {
        if limit == 0 {
            return;
        }
        let ratio = (remaining as f64 / limit as f64).clamp(0.0, 1.0);
        self.ratio
            .get_or_init(|| {
                self.metrics
                    .inner
                    .remaining_ratio
                    .get_or_create_owned(&[("rule", self.rule.to_string())])
            })
            .set(ratio);
    }
}

/// The scrape of `registry` for a request whose `Accept` header is
/// `accept`: OpenMetrics when the scraper asks for it (Prometheus does),
/// else the Prometheus text format 0.0.4, which every other reader takes
/// (`promtool check metrics`, curl); its `Content-Type` and body. An
/// error when a metric of `registry` cannot be written in that format (a
/// native-only histogram in the text format).
pub fn render(
    registry: &Registry,
    accept: Option<&str>,
) -> Result<(&'static str, String), std::fmt::Error> {
    let mut body = String::new();
    let openmetrics = accept.is_some_and(|a| a.contains("application/openmetrics-text"));
    if openmetrics {
        prometheus_client::encoding::text::encode(&mut body, registry)?;
        Ok((OPENMETRICS_CONTENT_TYPE, body))
    } else {
        prometheus_client::encoding::prometheus_text::encode(&mut body, registry)?;
        Ok((TEXT_CONTENT_TYPE, body))
    }
}

/// What the collector reads at each scrape.
enum Source {
    /// A limiter's breaker in front of Redis (`breaker="redis"`).
    Limiter(Weak<dyn Fn() -> bool + Send + Sync>),
    Protection(crate::protection::WeakProtection),
    /// Held, not watched: a dropped shipper's counts stay in the sums, so
    /// the counters never go back.
    Shipper(Arc<Totals>),
}

impl Source {
    fn same(&self, other: &Source) -> bool {
        match (self, other) {
            (Source::Limiter(a), Source::Limiter(b)) => Weak::ptr_eq(a, b),
            (Source::Protection(a), Source::Protection(b)) => a.same(b),
            (Source::Shipper(a), Source::Shipper(b)) => Arc::ptr_eq(a, b),
            _ => false,
        }
    }
}

/// The scrape-time collector of what the kit holds in atomics.
#[derive(Default)]
struct Live {
    sources: Mutex<Vec<Source>>,
}

impl std::fmt::Debug for Live {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Live").finish_non_exhaustive()
    }
}

impl Live {
    fn add(&self, source: Source) {
        let mut sources = self.sources.lock().unwrap_or_else(|e| e.into_inner());
        if !sources.iter().any(|s| s.same(&source)) {
            sources.push(source);
        }
    }
}

/// Appends `value` for `label` to `rows`, merged with a row of the same
/// label by `merge` (several limiters or loops may report one name).
fn merge_row<T: Copy>(rows: &mut Vec<(String, T)>, label: &str, value: T, merge: fn(T, T) -> T) {
    match rows.iter_mut().find(|(l, _)| l == label) {
        Some(row) => row.1 = merge(row.1, value),
        None => rows.push((label.to_string(), value)),
    }
}

impl Collector for Live {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let mut breakers: Vec<(String, i64)> = Vec::new();
        let mut scales: Vec<(String, i64)> = Vec::new();
        let mut stages: Vec<(String, i64)> = Vec::new();
        let (mut dropped, mut shipped, mut sink_errors) = (0u64, 0u64, 0u64);
        {
            let mut sources = self.sources.lock().unwrap_or_else(|e| e.into_inner());
            sources.retain(|s| match s {
                Source::Limiter(w) => w.strong_count() > 0,
                Source::Protection(w) => w.alive(),
                Source::Shipper(_) => true,
            });
            for source in sources.iter() {
                match source {
                    Source::Limiter(w) => {
                        if let Some(open) = w.upgrade() {
                            merge_row(&mut breakers, "redis", i64::from(open()), i64::max);
                        }
                    }
                    Source::Protection(w) => {
                        if let Some(p) = w.upgrade() {
                            for (policy, scale, stage) in p.readings() {
                                merge_row(&mut scales, &policy, i64::from(scale), i64::min);
                                merge_row(&mut stages, &policy, i64::from(stage), i64::max);
                            }
                            for (name, open) in p.breaker_states() {
                                merge_row(&mut breakers, &name, i64::from(open), i64::max);
                            }
                        }
                    }
                    Source::Shipper(t) => {
                        dropped += t.dropped.load(Ordering::Relaxed);
                        shipped += t.shipped.load(Ordering::Relaxed);
                        sink_errors += t.sink_errors.load(Ordering::Relaxed);
                    }
                }
            }
        }
        for (name, label, rows) in [
            ("ratelimit_breaker_open", "breaker", &breakers),
            ("ratelimit_scale", "rule", &scales),
            ("ratelimit_stage", "rule", &stages),
        ] {
            // Described even without a series yet: every name is served
            // from the moment metrics are on.
            let help = format!("{}.", help(name));
            let mut family = encoder.encode_descriptor(name, &help, None, MetricType::Gauge)?;
            for (value, v) in rows {
                let labels = [(label, value.as_str())];
                let metric = family.encode_family(&labels)?;
                ConstGauge::new(*v).encode(metric)?;
            }
        }
        for (name, v) in [
            ("ratelimit_deny_events_dropped_total", dropped),
            ("ratelimit_deny_events_shipped_total", shipped),
            ("ratelimit_deny_events_sink_errors_total", sink_errors),
        ] {
            let help = format!("{}.", help(name));
            let metric =
                encoder.encode_descriptor(registered(name), &help, None, MetricType::Counter)?;
            ConstCounter::new(v).encode(metric)?;
        }
        Ok(())
    }
}

//! The service's Prometheus metrics.
//!
//! Two kinds of family live in one `prometheus-client` registry:
//!
//! - The reference's. envoyproxy/ratelimit counts through statsd names that
//!   its Prometheus sink maps with `src/stats/prom/default_mapper.yaml`;
//!   the families below carry the names and labels that mapping gives, so
//!   dashboards and alerts written for the reference keep working:
//!   `ratelimit_service_rate_limit_{total_hits,over_limit,near_limit,
//!   within_limit,shadow_mode,over_limit_with_local_cache}{domain,key1[,key2]}`,
//!   `ratelimit_service_config_load_{success,error}`,
//!   `ratelimit_service_should_rate_limit_error{err_type}`,
//!   `ratelimit_service_global_shadow_mode`,
//!   `ratelimit_service_total_requests{grpc_method}` and the histogram
//!   `ratelimit_service_response_time_seconds{grpc_method}`.
//!   The reference exposes its counters without the `_total` suffix that
//!   `prometheus-client` appends to every counter, so these are written as
//!   untyped families: the sample names stay exactly the reference's and
//!   `rate()`/`increase()` work on them as before.
//! - Ours, named `ratelimit_rls_*`: Redis calls and their latency, Redis
//!   errors, the breaker's state, configuration loads and ShouldRateLimit
//!   calls by result.

use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};

use prometheus_client::collector::Collector;
use prometheus_client::encoding::DescriptorEncoder;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Registry;

/// The `Content-Type` of the Prometheus text format 0.0.4.
pub const TEXT_CONTENT_TYPE: &str = prometheus_client::encoding::prometheus_text::CONTENT_TYPE;
/// The `Content-Type` of OpenMetrics 1.0.0.
pub const OPENMETRICS_CONTENT_TYPE: &str =
    "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Upper bounds (seconds) of the latency histograms. A decision takes a
/// fraction of a millisecond on a local Redis and Envoy gives up after
/// 20 ms by default, so the buckets are dense below 25 ms; the tail goes to
/// one second, past any sane `REDIS_TIMEOUT`.
const LATENCY_BUCKETS: [f64; 14] = [
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.02, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
];

/// The per-descriptor counters, in the order [`DESCRIPTOR_FAMILIES`] names them.
const TOTAL_HITS: usize = 0;
const OVER_LIMIT: usize = 1;
const NEAR_LIMIT: usize = 2;
const WITHIN_LIMIT: usize = 3;
const SHADOW_MODE: usize = 4;
const OVER_LIMIT_WITH_LOCAL_CACHE: usize = 5;

/// Name and help of each per-descriptor family.
const DESCRIPTOR_FAMILIES: [(&str, &str); 6] = [
    (
        "ratelimit_service_rate_limit_total_hits",
        "Hits asked of a descriptor's limit (hits_addend summed).",
    ),
    (
        "ratelimit_service_rate_limit_over_limit",
        "Hits over a descriptor's limit.",
    ),
    (
        "ratelimit_service_rate_limit_near_limit",
        "Hits past NEAR_LIMIT_RATIO of a descriptor's limit and within it.",
    ),
    (
        "ratelimit_service_rate_limit_within_limit",
        "Hits within a descriptor's limit.",
    ),
    (
        "ratelimit_service_rate_limit_shadow_mode",
        "Hits over a shadow-mode descriptor's limit, admitted.",
    ),
    (
        "ratelimit_service_rate_limit_over_limit_with_local_cache",
        "Hits denied by the local deny cache, without a Redis call.",
    ),
];

/// The service's metrics; cheap to clone (an `Arc` inside).
#[derive(Clone)]
pub struct Metrics {
    inner: Arc<Inner>,
}

struct Inner {
    registry: Registry,
    descriptors: Arc<DescriptorSet>,
    service: Arc<ServiceCounters>,
    response_time: Family<[(&'static str, &'static str); 1], Histogram>,
    redis_calls: Family<[(&'static str, &'static str); 1], Histogram>,
    redis_errors: Counter,
    breaker_open: Gauge,
    config_loads: Family<[(&'static str, &'static str); 1], Counter>,
    calls: Family<[(&'static str, &'static str); 1], Counter>,
}

impl fmt::Debug for Metrics {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Metrics").finish_non_exhaustive()
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new()
    }
}

fn latency_histogram() -> Histogram {
    Histogram::new(LATENCY_BUCKETS)
}

impl Metrics {
    /// A registry holding every family, all at zero.
    pub fn new() -> Metrics {
        let mut registry = Registry::default();
        let descriptors = Arc::new(DescriptorSet::default());
        registry.register_collector(Box::new(descriptors.clone()));
        let service = Arc::new(ServiceCounters::default());
        registry.register_collector(Box::new(service.clone()));

        let response_time =
            Family::<_, Histogram>::new_with_constructor(latency_histogram as fn() -> Histogram);
        registry.register(
            "ratelimit_service_response_time_seconds",
            "Time to answer a gRPC call, in seconds",
            response_time.clone(),
        );
        let redis_calls =
            Family::<_, Histogram>::new_with_constructor(latency_histogram as fn() -> Histogram);
        registry.register(
            "ratelimit_rls_redis_call_duration_seconds",
            "Redis calls (one RL.ALL, refund or probe each) and their latency in seconds, by result (ok, error)",
            redis_calls.clone(),
        );
        let redis_errors = Counter::default();
        registry.register(
            "ratelimit_rls_redis_errors",
            "Redis errors (connection, timeout or error reply), each answered UNAVAILABLE",
            redis_errors.clone(),
        );
        let breaker_open = Gauge::default();
        registry.register(
            "ratelimit_rls_breaker_open",
            "1 while the Redis breaker is open (calls answered UNAVAILABLE without reaching Redis), else 0",
            breaker_open.clone(),
        );
        let config_loads = Family::default();
        registry.register(
            "ratelimit_rls_config_loads",
            "Configuration loads by result (success, error)",
            config_loads.clone(),
        );
        let calls = Family::default();
        registry.register(
            "ratelimit_rls_should_rate_limit_calls",
            "ShouldRateLimit calls (gRPC and /json) by result (ok, over_limit, error)",
            calls.clone(),
        );
        Metrics {
            inner: Arc::new(Inner {
                registry,
                descriptors,
                service,
                response_time,
                redis_calls,
                redis_errors,
                breaker_open,
                config_loads,
                calls,
            }),
        }
    }

    /// The counters of one descriptor, by its stats key (the reference's
    /// `FullKey`, `domain.key_value.key2...`). The labels are the ones the
    /// reference's statsd mapping takes from that key: its dot-separated
    /// parts `domain`, `key1` and, for a key of three parts or more, `key2`
    /// (later parts are dropped, as the mapping drops them). A key that does
    /// not start with `domain.` is taken as relative to `domain`.
    ///
    /// Cached: the first call for a key allocates, later ones take a read
    /// lock and clone an `Arc`.
    pub fn descriptor(&self, domain: &str, stats_key: &str) -> DescriptorStats {
        let set = &self.inner.descriptors;
        if let Some(found) = set.read().get(stats_key) {
            return DescriptorStats {
                counts: found.clone(),
            };
        }
        let counts = Arc::new(DescriptorCounts::new(descriptor_labels(domain, stats_key)));
        let mut map = set.write();
        let counts = map.entry(stats_key.to_owned()).or_insert(counts).clone();
        DescriptorStats { counts }
    }

    /// One Redis call of `seconds`, successful or not.
    pub fn redis_call(&self, seconds: f64, ok: bool) {
        let result = if ok { "ok" } else { "error" };
        self.inner
            .redis_calls
            .get_or_create(&[("result", result)])
            .observe(seconds);
    }

    /// A ShouldRateLimit call failed on Redis. Counted in ours and in the
    /// reference's `should_rate_limit_error{err_type="redis_error"}`, so
    /// call it once per failed request.
    pub fn redis_error(&self) {
        self.inner.redis_errors.inc();
        self.inner
            .service
            .redis_error
            .fetch_add(1, Ordering::Relaxed);
    }

    /// A ShouldRateLimit call refused as invalid (empty domain or
    /// descriptors): the reference's `err_type="service_error"`.
    pub fn service_error(&self) {
        self.inner
            .service
            .service_error
            .fetch_add(1, Ordering::Relaxed);
    }

    /// A request admitted only because `SHADOW_MODE` is on
    /// (`ratelimit_service_global_shadow_mode`).
    pub fn global_shadow_mode(&self) {
        self.inner
            .service
            .global_shadow_mode
            .fetch_add(1, Ordering::Relaxed);
    }

    /// The Redis breaker opened (`true`) or closed.
    pub fn breaker_open(&self, open: bool) {
        self.inner.breaker_open.set(i64::from(open));
    }

    /// A configuration load (the first or a reload) succeeded or failed.
    pub fn config_load(&self, ok: bool) {
        let (result, count) = if ok {
            ("success", &self.inner.service.config_load_success)
        } else {
            ("error", &self.inner.service.config_load_error)
        };
        count.fetch_add(1, Ordering::Relaxed);
        self.inner
            .config_loads
            .get_or_create(&[("result", result)])
            .inc();
    }

    /// One ShouldRateLimit call answered: `"ok"`, `"over_limit"` or `"error"`.
    pub fn call(&self, result: &'static str) {
        self.inner.calls.get_or_create(&[("result", result)]).inc();
    }

    /// One gRPC call of `method` (e.g. `"ShouldRateLimit"`) answered in
    /// `seconds`: the reference's `total_requests` and `response_time`.
    pub fn grpc_request(&self, method: &'static str, seconds: f64) {
        self.inner
            .service
            .total_requests
            .fetch_add(1, Ordering::Relaxed);
        self.inner
            .response_time
            .get_or_create(&[("grpc_method", method)])
            .observe(seconds);
    }

    /// The scrape for a request whose `Accept` header is `accept`:
    /// OpenMetrics when the scraper asks for it (Prometheus does), else the
    /// Prometheus text format 0.0.4, which every other reader takes
    /// (`promtool check metrics`, curl). Its `Content-Type` and body.
    pub fn render(&self, accept: Option<&str>) -> (&'static str, String) {
        let openmetrics = accept.is_some_and(|a| a.contains("application/openmetrics-text"));
        let mut body = String::new();
        // Writing to a String cannot fail, and the registry holds no
        // native-only histogram, the one thing an encoder refuses.
        let encoded = if openmetrics {
            prometheus_client::encoding::text::encode(&mut body, &self.inner.registry)
        } else {
            prometheus_client::encoding::prometheus_text::encode(&mut body, &self.inner.registry)
        };
        if encoded.is_err() {
            body.clear();
        }
        if openmetrics {
            (OPENMETRICS_CONTENT_TYPE, body)
        } else {
            (TEXT_CONTENT_TYPE, body)
        }
    }
}

/// The reference's statsd name sanitising (`utils.SanitizeStatName`): `:`
/// and `|` become `_`, and so do the dots inside an IPv4 address, so that
/// an address in a descriptor value stays one part of the name.
fn sanitize_stat_name(name: &str) -> String {
    let replaced: Vec<u8> = name
        .bytes()
        .map(|b| if b == b':' || b == b'|' { b'_' } else { b })
        .collect();
    let mut out = replaced.clone();
    // Every run of the form d{1,3}.d{1,3}.d{1,3}.d{1,3}, leftmost first and
    // not overlapping, as Go's regexp ReplaceAllStringFunc finds them.
    let mut i = 0;
    while i < replaced.len() {
        match ipv4_at(&replaced, i) {
            Some((end, dots)) => {
                for d in dots {
                    out[d] = b'_';
                }
                i = end;
            }
            None => i += 1,
        }
    }
    // Only ASCII bytes were replaced, so the result is still UTF-8.
    String::from_utf8(out).unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned())
}

/// The end of an IPv4-like run starting at `start`, and its dots' indices.
fn ipv4_at(s: &[u8], start: usize) -> Option<(usize, [usize; 3])> {
    // One to three digits from `i`, greedy (what the regex engine takes
    // first; fewer would leave a digit where a dot must follow).
    let digits = |i: usize| {
        let n = s[i..]
            .iter()
            .take(3)
            .take_while(|b| b.is_ascii_digit())
            .count();
        (n > 0).then_some(i + n)
    };
    let mut i = digits(start)?;
    let mut dots = [0; 3];
    for dot in &mut dots {
        if s.get(i) != Some(&b'.') {
            return None;
        }
        *dot = i;
        i = digits(i + 1)?;
    }
    Some((i, dots))
}

/// The labels the reference's mapping gives a descriptor's stats.
fn descriptor_labels(domain: &str, stats_key: &str) -> Vec<(&'static str, String)> {
    let full = if stats_key == domain || stats_key.starts_with(&format!("{domain}.")) {
        sanitize_stat_name(stats_key)
    } else {
        sanitize_stat_name(&format!("{domain}.{stats_key}"))
    };
    let mut parts = full.split('.');
    let mut labels = vec![
        ("domain", parts.next().unwrap_or_default().to_owned()),
        ("key1", parts.next().unwrap_or_default().to_owned()),
    ];
    if let Some(key2) = parts.next() {
        labels.push(("key2", key2.to_owned()));
    }
    labels
}

/// One descriptor's counters, shared by the engine's handles and the scrape.
#[derive(Debug)]
struct DescriptorCounts {
    labels: Vec<(&'static str, String)>,
    counts: [AtomicU64; 6],
}

impl DescriptorCounts {
    fn new(labels: Vec<(&'static str, String)>) -> Self {
        DescriptorCounts {
            labels,
            counts: Default::default(),
        }
    }
}

/// A descriptor's counters (from [`Metrics::descriptor`]); cheap to clone.
#[derive(Clone, Debug)]
pub struct DescriptorStats {
    counts: Arc<DescriptorCounts>,
}

impl DescriptorStats {
    fn add(&self, which: usize, n: u64) {
        self.counts.counts[which].fetch_add(n, Ordering::Relaxed);
    }
    /// Hits asked of the descriptor.
    pub fn total_hits(&self, n: u64) {
        self.add(TOTAL_HITS, n);
    }
    /// Hits over its limit.
    pub fn over_limit(&self, n: u64) {
        self.add(OVER_LIMIT, n);
    }
    /// Hits past the near-limit ratio, still within the limit.
    pub fn near_limit(&self, n: u64) {
        self.add(NEAR_LIMIT, n);
    }
    /// Hits within the limit.
    pub fn within_limit(&self, n: u64) {
        self.add(WITHIN_LIMIT, n);
    }
    /// Hits over the limit of a shadow-mode descriptor (admitted).
    pub fn shadow_mode(&self, n: u64) {
        self.add(SHADOW_MODE, n);
    }
    /// Hits denied by the local deny cache.
    pub fn over_limit_with_local_cache(&self, n: u64) {
        self.add(OVER_LIMIT_WITH_LOCAL_CACHE, n);
    }
}

/// Every descriptor's counters by stats key; encoded at each scrape.
#[derive(Debug, Default)]
struct DescriptorSet {
    by_key: RwLock<HashMap<String, Arc<DescriptorCounts>>>,
}

impl DescriptorSet {
    // A poisoned lock only means a panic elsewhere while it was held; the
    // map itself is always whole (one insert at a time), so keep using it.
    fn read(&self) -> std::sync::RwLockReadGuard<'_, HashMap<String, Arc<DescriptorCounts>>> {
        self.by_key.read().unwrap_or_else(|e| e.into_inner())
    }
    fn write(&self) -> std::sync::RwLockWriteGuard<'_, HashMap<String, Arc<DescriptorCounts>>> {
        self.by_key.write().unwrap_or_else(|e| e.into_inner())
    }
}

impl Collector for DescriptorSet {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), fmt::Error> {
        let mut all: Vec<Arc<DescriptorCounts>> = self.read().values().cloned().collect();
        if all.is_empty() {
            return Ok(());
        }
        all.sort_by(|a, b| a.labels.cmp(&b.labels));
        for (which, (name, help)) in DESCRIPTOR_FAMILIES.iter().enumerate() {
            let mut family = encoder.encode_descriptor(name, help, None, MetricType::Unknown)?;
            for d in &all {
                let value = d.counts[which].load(Ordering::Relaxed);
                family.encode_family(&d.labels)?.encode_gauge(&value)?;
            }
        }
        Ok(())
    }
}

/// The reference's service-wide counters that are not per descriptor.
#[derive(Debug, Default)]
struct ServiceCounters {
    config_load_success: AtomicU64,
    config_load_error: AtomicU64,
    redis_error: AtomicU64,
    service_error: AtomicU64,
    global_shadow_mode: AtomicU64,
    total_requests: AtomicU64,
}

/// One untyped family of a single sample without labels.
fn encode_untyped(
    encoder: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    value: &AtomicU64,
) -> Result<(), fmt::Error> {
    let mut family = encoder.encode_descriptor(name, help, None, MetricType::Unknown)?;
    family.encode_gauge(&value.load(Ordering::Relaxed))
}

impl Collector for ServiceCounters {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), fmt::Error> {
        encode_untyped(
            &mut encoder,
            "ratelimit_service_config_load_success",
            "Configuration loads that succeeded.",
            &self.config_load_success,
        )?;
        encode_untyped(
            &mut encoder,
            "ratelimit_service_config_load_error",
            "Configuration loads that failed (the previous configuration stays).",
            &self.config_load_error,
        )?;
        {
            let mut family = encoder.encode_descriptor(
                "ratelimit_service_should_rate_limit_error",
                "ShouldRateLimit calls that failed, by cause: redis_error, service_error (an invalid request).",
                None,
                MetricType::Unknown,
            )?;
            for (err_type, value) in [
                ("redis_error", &self.redis_error),
                ("service_error", &self.service_error),
            ] {
                family
                    .encode_family(&[("err_type", err_type)])?
                    .encode_gauge(&value.load(Ordering::Relaxed))?;
            }
        }
        encode_untyped(
            &mut encoder,
            "ratelimit_service_global_shadow_mode",
            "Requests over a limit admitted because SHADOW_MODE is on.",
            &self.global_shadow_mode,
        )?;
        let mut family = encoder.encode_descriptor(
            "ratelimit_service_total_requests",
            "gRPC calls received, by method.",
            None,
            MetricType::Unknown,
        )?;
        family
            .encode_family(&[("grpc_method", "ShouldRateLimit")])?
            .encode_gauge(&self.total_requests.load(Ordering::Relaxed))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample<'a>(body: &'a str, prefix: &str) -> Option<&'a str> {
        body.lines()
            .find(|l| l.starts_with(prefix) && l[prefix.len()..].starts_with(' '))
            .map(|l| &l[prefix.len() + 1..])
    }

    #[test]
    fn descriptor_stats_carry_the_reference_mapper_labels() {
        let m = Metrics::new();
        m.descriptor("dom", "dom.k1").total_hits(3);
        let two = m.descriptor("dom", "dom.a_x.b");
        two.over_limit(2);
        two.total_hits(1);
        m.descriptor("dom", "dom.a.b_c.d_e").within_limit(5);
        let (ct, body) = m.render(None);
        assert_eq!(ct, "text/plain; version=0.0.4; charset=utf-8");
        assert!(body.contains("# TYPE ratelimit_service_rate_limit_total_hits untyped\n"));
        assert_eq!(
            sample(
                &body,
                r#"ratelimit_service_rate_limit_total_hits{domain="dom",key1="k1"}"#
            ),
            Some("3"),
            "{body}"
        );
        assert_eq!(
            sample(
                &body,
                r#"ratelimit_service_rate_limit_over_limit{domain="dom",key1="a_x",key2="b"}"#
            ),
            Some("2"),
            "{body}"
        );
        assert_eq!(
            sample(
                &body,
                r#"ratelimit_service_rate_limit_within_limit{domain="dom",key1="a",key2="b_c"}"#
            ),
            Some("5"),
            "{body}"
        );
        for family in ["near_limit", "shadow_mode", "over_limit_with_local_cache"] {
            let name =
                format!(r#"ratelimit_service_rate_limit_{family}{{domain="dom",key1="k1"}}"#);
            assert_eq!(sample(&body, &name), Some("0"), "{body}");
        }
    }

    #[test]
    fn a_descriptor_is_counted_in_one_place() {
        let m = Metrics::new();
        m.descriptor("d", "d.k_v").total_hits(1);
        m.descriptor("d", "d.k_v").total_hits(2);
        // Relative to its domain.
        m.descriptor("d", "k_v").total_hits(4);
        let (_, body) = m.render(None);
        let lines: Vec<_> = body
            .lines()
            .filter(|l| l.starts_with("ratelimit_service_rate_limit_total_hits{"))
            .collect();
        assert_eq!(lines.len(), 2, "{body}");
        assert!(lines
            .iter()
            .all(|l| l
                .starts_with(r#"ratelimit_service_rate_limit_total_hits{domain="d",key1="k_v"}"#)));
        let sum: u64 = lines
            .iter()
            .map(|l| l.rsplit(' ').next().unwrap().parse::<u64>().unwrap())
            .sum();
        assert_eq!(sum, 7);
    }

    #[test]
    fn stat_names_are_sanitised_as_the_reference() {
        assert_eq!(sanitize_stat_name("d.k_a:b|c"), "d.k_a_b_c");
        assert_eq!(
            sanitize_stat_name("d.remote_address_10.0.12.255.x"),
            "d.remote_address_10_0_12_255.x"
        );
        // Four digits: the regex finds 234.5.6.7 inside 1234.5.6.7.
        assert_eq!(sanitize_stat_name("d.1234.5.6.7"), "d.1234_5_6_7");
        assert_eq!(sanitize_stat_name("d.1.2.3"), "d.1.2.3");
        assert_eq!(sanitize_stat_name("é.ü:1"), "é.ü_1");
        assert_eq!(
            descriptor_labels("d", "d.ip_192.168.0.1.path_x"),
            vec![
                ("domain", "d".to_owned()),
                ("key1", "ip_192_168_0_1".to_owned()),
                ("key2", "path_x".to_owned()),
            ]
        );
    }

    #[test]
    fn label_values_are_escaped() {
        let m = Metrics::new();
        m.descriptor("d", "d.k_a\"b\\c\nd").total_hits(1);
        let (_, body) = m.render(None);
        assert!(
            body.contains(
                r#"ratelimit_service_rate_limit_total_hits{domain="d",key1="k_a\"b\\c\nd"} 1"#
            ),
            "{body}"
        );
    }

    #[test]
    fn service_families() {
        let m = Metrics::new();
        m.config_load(true);
        m.config_load(true);
        m.config_load(false);
        m.redis_error();
        m.service_error();
        m.service_error();
        m.global_shadow_mode();
        m.breaker_open(true);
        m.call("ok");
        m.call("over_limit");
        m.call("ok");
        m.redis_call(0.0003, true);
        m.redis_call(0.2, false);
        m.grpc_request("ShouldRateLimit", 0.001);
        let (_, body) = m.render(None);
        let expect = [
            ("ratelimit_service_config_load_success", "2"),
            ("ratelimit_service_config_load_error", "1"),
            (
                r#"ratelimit_service_should_rate_limit_error{err_type="redis_error"}"#,
                "1",
            ),
            (
                r#"ratelimit_service_should_rate_limit_error{err_type="service_error"}"#,
                "2",
            ),
            ("ratelimit_service_global_shadow_mode", "1"),
            (
                r#"ratelimit_service_total_requests{grpc_method="ShouldRateLimit"}"#,
                "1",
            ),
            (
                r#"ratelimit_service_response_time_seconds_count{grpc_method="ShouldRateLimit"}"#,
                "1",
            ),
            ("ratelimit_rls_redis_errors_total", "1"),
            ("ratelimit_rls_breaker_open", "1"),
            (r#"ratelimit_rls_config_loads_total{result="success"}"#, "2"),
            (r#"ratelimit_rls_config_loads_total{result="error"}"#, "1"),
            (
                r#"ratelimit_rls_should_rate_limit_calls_total{result="ok"}"#,
                "2",
            ),
            (
                r#"ratelimit_rls_should_rate_limit_calls_total{result="over_limit"}"#,
                "1",
            ),
            (
                r#"ratelimit_rls_redis_call_duration_seconds_count{result="ok"}"#,
                "1",
            ),
            (
                r#"ratelimit_rls_redis_call_duration_seconds_bucket{result="ok",le="0.0005"}"#,
                "1",
            ),
            (
                r#"ratelimit_rls_redis_call_duration_seconds_bucket{result="ok",le="0.00025"}"#,
                "0",
            ),
            (
                r#"ratelimit_rls_redis_call_duration_seconds_count{result="error"}"#,
                "1",
            ),
        ];
        for (name, value) in expect {
            assert_eq!(sample(&body, name), Some(value), "{name} in\n{body}");
        }
        m.breaker_open(false);
        let (_, body) = m.render(None);
        assert_eq!(sample(&body, "ratelimit_rls_breaker_open"), Some("0"));
        // No descriptor yet: no per-descriptor family.
        assert!(!body.contains("ratelimit_service_rate_limit_"), "{body}");
    }

    #[test]
    fn openmetrics_when_asked() {
        let m = Metrics::new();
        m.descriptor("d", "d.k").total_hits(1);
        let (ct, body) = m.render(Some(
            "application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5",
        ));
        assert_eq!(ct, OPENMETRICS_CONTENT_TYPE);
        assert!(body.ends_with("# EOF\n"), "{body}");
        assert!(body.contains("# TYPE ratelimit_service_rate_limit_total_hits unknown\n"));
        // Same sample name as in the text format: no suffix added.
        assert!(
            body.contains(r#"ratelimit_service_rate_limit_total_hits{domain="d",key1="k"} 1"#),
            "{body}"
        );
        let (ct, _) = m.render(Some("text/plain"));
        assert_eq!(ct, TEXT_CONTENT_TYPE);
    }

    /// `promtool check metrics` (Prometheus' own parser and linter) takes
    /// the scrape without a complaint. Skipped where promtool is absent.
    #[test]
    fn promtool_accepts_the_scrape() {
        use std::io::Write;
        use std::process::{Command, Stdio};
        let m = Metrics::new();
        m.descriptor("dom", "dom.k1").total_hits(3);
        m.descriptor("dom", "dom.a_x.b").over_limit(1);
        m.config_load(true);
        m.call("ok");
        m.redis_call(0.001, true);
        m.grpc_request("ShouldRateLimit", 0.001);
        let (_, body) = m.render(None);
        let child = Command::new("promtool")
            .args(["check", "metrics"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn();
        let Ok(mut child) = child else {
            eprintln!("promtool not found: skipped");
            return;
        };
        child
            .stdin
            .take()
            .unwrap()
            .write_all(body.as_bytes())
            .unwrap();
        let out = child.wait_with_output().unwrap();
        assert!(
            out.status.success(),
            "promtool: {}{}\n{body}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

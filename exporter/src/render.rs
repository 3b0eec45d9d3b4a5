//! The series: what one scrape read, written by prometheus-client as the
//! Prometheus text format 0.0.4. The families and their help are in
//! [`FAMILIES`] (and in exporter/metrics.txt, which the tests hold to it).

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Registry;

use crate::info::{Info, Outcomes, PolicyLine};
use crate::scrape::NodeScrape;

/// The `Content-Type` of what [`encode`] writes.
pub const CONTENT_TYPE: &str = prometheus_client::encoding::prometheus_text::CONTENT_TYPE;

/// One family: its name as scraped (counters with `_total`), type, labels
/// after `node`, and help.
pub struct Family {
    pub name: &'static str,
    pub counter: bool,
    pub labels: &'static [&'static str],
    pub help: &'static str,
}

const fn f(
    name: &'static str,
    counter: bool,
    labels: &'static [&'static str],
    help: &'static str,
) -> Family {
    Family {
        name,
        counter,
        labels,
        help,
    }
}

const C: bool = true;
const G: bool = false;
const P: &[&str] = &["policy"];
const A: &[&str] = &["algorithm"];

/// Every family, in the order they are written.
pub const FAMILIES: &[Family] = &[
    f("redis_ratelimit_up", G, &[], "1 when the node answered INFO ratelimit in this scrape, 0 when it did not"),
    f("redis_ratelimit_scrape_errors_total", C, &[], "Scrapes of the node that failed (connection, timeout, error reply, RL.POLICY read failed), since the exporter started"),
    f("redis_ratelimit_scrape_duration_seconds", G, &[], "Seconds the last scrape of the node took"),
    f("redis_ratelimit_info_garbled_lines_total", C, &[], "Lines of INFO ratelimit the exporter could not parse and skipped, since the exporter started"),
    f("redis_ratelimit_policies", G, &[], "Policies defined on the node (ratelimit_policies)"),
    f("redis_ratelimit_policy_calls_total", C, P, "Calls of the policy (RL.HIT, RL.ALL ... POLICY), including peeks (COST 0, REFUND) and those answered while OFF"),
    f("redis_ratelimit_policy_admitted_total", C, P, "Calls of the policy admitted"),
    f("redis_ratelimit_policy_denied_total", C, P, "Calls of the policy denied, shadow denials included"),
    f("redis_ratelimit_policy_shadow_denied_total", C, P, "Denials answered as allowed (MODE SHADOW, or keys outside the ROLLOUT)"),
    f("redis_ratelimit_policy_peeks_total", C, P, "COST 0 and REFUND calls of the policy (they admit or deny nothing)"),
    f("redis_ratelimit_policy_scale", G, P, "Scale of the policy's protection loop, percent (100 = full limits)"),
    f("redis_ratelimit_policy_stage", G, P, "Stage of the policy's protection loop: 0 normal, 1 degrade, 2 break"),
    f("redis_ratelimit_policy_info", G, &["policy", "fingerprint"], "Always 1; fingerprint is a hash of the policy's definition (algorithm, params, mode, rollout, zone, adapt, stages, window): several per policy = nodes differ"),
    f("redis_ratelimit_algorithm_calls_total", C, A, "Calls of the algorithm (tokenbucket, fixedwindow, leakybucket, sliding, hashwindow, concurrency, quota, throttle; all = RL.ALL as a whole)"),
    f("redis_ratelimit_algorithm_admitted_total", C, A, "Calls of the algorithm admitted"),
    f("redis_ratelimit_algorithm_denied_total", C, A, "Calls of the algorithm denied"),
    f("redis_ratelimit_algorithm_peeks_total", C, A, "COST 0 calls of the algorithm (and RL.ALL limiters that would have admitted a denied call)"),
    f("redis_ratelimit_upto_calls_total", C, &[], "Calls with UPTO (grants: units taken as many as fit)"),
    f("redis_ratelimit_upto_granted_units_total", C, &[], "Units granted to calls with UPTO"),
    f("redis_ratelimit_upto_partial_total", C, &[], "Calls with UPTO granted fewer units than asked (the limiter nearly drained)"),
    f("redis_ratelimit_blocked", G, &[], "Requests waiting in the server now (BLOCK; ratelimit_blocked_now)"),
    f("redis_ratelimit_blocked_total", C, &[], "Requests that waited (BLOCK)"),
    f("redis_ratelimit_blocked_admitted_total", C, &[], "Requests that waited and were admitted"),
    f("redis_ratelimit_blocked_timed_out_total", C, &[], "Requests that waited and timed out"),
    f("redis_ratelimit_deny_log_length", G, &[], "Entries in the deny log (RL.LOG)"),
    f("redis_ratelimit_deny_log_max_length", G, &[], "Bound of the deny log (ratelimit.log-max-len)"),
    f("redis_ratelimit_bucket_rates", G, &[], "Distinct token- and leaky-bucket rates numbered for compact keys (at most 65536)"),
    f("redis_ratelimit_propagation_pinned", G, &[], "1 when admitted calls are propagated with the master's time pinned"),
];

/// A sample's value.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Value {
    Int(u64),
    Float(f64),
}

/// The samples of one family for one node: (label values after `node`, value).
fn samples(name: &str, s: &NodeScrape) -> Vec<(Vec<String>, Value)> {
    use Value::{Float, Int};
    let one = |v: Option<u64>| v.map(|v| (Vec::new(), Int(v))).into_iter().collect();
    let info: Option<&Info> = s.info.as_ref();
    let field = |get: fn(&Info) -> Option<u64>| one(info.and_then(get));
    let policy = |get: fn(&PolicyLine) -> Option<u64>| {
        info.map(|i| {
            i.policy
                .iter()
                .filter_map(|(name, p)| get(p).map(|v| (vec![name.clone()], Int(v))))
                .collect()
        })
        .unwrap_or_default()
    };
    let algorithm = |get: fn(&Outcomes) -> Option<u64>| {
        info.map(|i| {
            i.algorithms
                .iter()
                .filter_map(|(name, o)| get(o).map(|v| (vec![name.clone()], Int(v))))
                .collect()
        })
        .unwrap_or_default()
    };
    match name {
        "redis_ratelimit_up" => one(Some(u64::from(info.is_some()))),
        "redis_ratelimit_scrape_errors_total" => one(Some(s.scrape_errors)),
        "redis_ratelimit_scrape_duration_seconds" => {
            vec![(Vec::new(), Float(s.duration.as_secs_f64()))]
        }
        "redis_ratelimit_info_garbled_lines_total" => one(Some(s.garbled_lines)),
        "redis_ratelimit_policies" => field(|i| i.policies),
        "redis_ratelimit_policy_calls_total" => policy(|p| p.calls),
        "redis_ratelimit_policy_admitted_total" => policy(|p| p.admitted),
        "redis_ratelimit_policy_denied_total" => policy(|p| p.denied),
        "redis_ratelimit_policy_shadow_denied_total" => policy(|p| p.shadow_denied),
        "redis_ratelimit_policy_peeks_total" => policy(|p| p.peeks),
        "redis_ratelimit_policy_scale" => policy(|p| p.scale),
        "redis_ratelimit_policy_stage" => policy(|p| p.stage),
        "redis_ratelimit_policy_info" => s
            .fingerprints
            .iter()
            .map(|(policy, fp)| (vec![policy.clone(), fp.clone()], Int(1)))
            .collect(),
        "redis_ratelimit_algorithm_calls_total" => algorithm(|o| o.calls),
        "redis_ratelimit_algorithm_admitted_total" => algorithm(|o| o.admitted),
        "redis_ratelimit_algorithm_denied_total" => algorithm(|o| o.denied),
        "redis_ratelimit_algorithm_peeks_total" => algorithm(|o| o.peeks),
        "redis_ratelimit_upto_calls_total" => field(|i| i.upto_calls),
        "redis_ratelimit_upto_granted_units_total" => field(|i| i.upto_granted_units),
        "redis_ratelimit_upto_partial_total" => field(|i| i.upto_partial),
        "redis_ratelimit_blocked" => field(|i| i.blocked_now),
        "redis_ratelimit_blocked_total" => field(|i| i.blocked_total),
        "redis_ratelimit_blocked_admitted_total" => field(|i| i.blocked_admitted),
        "redis_ratelimit_blocked_timed_out_total" => field(|i| i.blocked_timed_out),
        "redis_ratelimit_deny_log_length" => field(|i| i.deny_log_len),
        "redis_ratelimit_deny_log_max_length" => field(|i| i.deny_log_max_len),
        "redis_ratelimit_bucket_rates" => field(|i| i.bucket_rates),
        "redis_ratelimit_propagation_pinned" => field(|i| i.propagation_pinned),
        _ => Vec::new(),
    }
}

/// One scrape's results as a prometheus-client collector.
#[derive(Debug)]
struct Snapshot(Vec<NodeScrape>);

impl Collector for Snapshot {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        for family in FAMILIES {
            // prometheus-client adds `_total` to a counter's name itself.
            let (name, kind) = match family.name.strip_suffix("_total") {
                Some(base) if family.counter => (base, MetricType::Counter),
                _ => (family.name, MetricType::Gauge),
            };
            let mut metric = encoder.encode_descriptor(name, family.help, None, kind)?;
            for node in &self.0 {
                for (values, value) in samples(family.name, node) {
                    let mut labels: Vec<(&str, &str)> = vec![("node", node.label.as_str())];
                    labels.extend(
                        family
                            .labels
                            .iter()
                            .copied()
                            .zip(values.iter().map(String::as_str)),
                    );
                    let sample = metric.encode_family(&labels)?;
                    match (family.counter, value) {
                        (true, Value::Int(v)) => ConstCounter::new(v).encode(sample)?,
                        (true, Value::Float(v)) => ConstCounter::new(v).encode(sample)?,
                        (false, Value::Int(v)) => ConstGauge::new(v).encode(sample)?,
                        (false, Value::Float(v)) => ConstGauge::new(v).encode(sample)?,
                    }
                }
            }
        }
        Ok(())
    }
}

/// The scrape as the Prometheus text format 0.0.4.
pub fn encode(scrapes: Vec<NodeScrape>) -> String {
    let mut registry = Registry::default();
    registry.register_collector(Box::new(Snapshot(scrapes)));
    let mut out = String::new();
    if let Err(e) = prometheus_client::encoding::prometheus_text::encode(&mut out, &registry) {
        // Writing to a String does not fail; say so if it ever does.
        out = format!("# encoding failed: {e}\n");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn scrape(label: &str, text: Option<&str>) -> NodeScrape {
        NodeScrape {
            label: label.into(),
            info: text.map(crate::info::parse),
            fingerprints: vec![("a\"b".into(), "00ff".into())],
            duration: Duration::from_millis(1500),
            scrape_errors: 2,
            garbled_lines: 0,
        }
    }

    /// exporter/metrics.txt, which the dashboard and rules are written
    /// against, lists exactly these families, types, labels and help.
    #[test]
    fn families_are_those_of_metrics_txt() {
        let listed: Vec<String> = include_str!("../metrics.txt")
            .lines()
            .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
            .map(String::from)
            .collect();
        let ours: Vec<String> = FAMILIES
            .iter()
            .map(|f| {
                let kind = if f.counter { "counter" } else { "gauge" };
                let labels: Vec<&str> = std::iter::once("node")
                    .chain(f.labels.iter().copied())
                    .collect();
                format!("{} {kind} {} # {}", f.name, labels.join(" "), f.help)
            })
            .collect();
        assert_eq!(ours, listed);
        for f in FAMILIES {
            assert_eq!(f.counter, f.name.ends_with("_total"), "{}", f.name);
        }
    }

    #[test]
    fn samples_and_escaping() {
        let body = encode(vec![
            scrape(
                "h:1",
                Some("ratelimit_policy_a%22b%5C%0Ac:calls=5,admitted=4,denied=1,shadow_denied=0,peeks=0,scale=60,stage=1\nratelimit_all_calls:9\nratelimit_blocked_now:3\n"),
            ),
            scrape("h:2", None),
        ]);
        for line in [
            "# HELP redis_ratelimit_policy_calls_total Calls of the policy (RL.HIT, RL.ALL ... POLICY), including peeks (COST 0, REFUND) and those answered while OFF",
            "# TYPE redis_ratelimit_policy_calls_total counter",
            "redis_ratelimit_policy_calls_total{node=\"h:1\",policy=\"a\\\"b\\\\\\nc\"} 5",
            "redis_ratelimit_policy_scale{node=\"h:1\",policy=\"a\\\"b\\\\\\nc\"} 60",
            "redis_ratelimit_policy_info{node=\"h:1\",policy=\"a\\\"b\",fingerprint=\"00ff\"} 1",
            "redis_ratelimit_algorithm_calls_total{node=\"h:1\",algorithm=\"all\"} 9",
            "redis_ratelimit_blocked{node=\"h:1\"} 3",
            "redis_ratelimit_up{node=\"h:1\"} 1",
            "redis_ratelimit_up{node=\"h:2\"} 0",
            "redis_ratelimit_scrape_errors_total{node=\"h:2\"} 2",
            "redis_ratelimit_scrape_duration_seconds{node=\"h:2\"} 1.5",
            "# TYPE redis_ratelimit_policy_info gauge",
        ] {
            assert!(body.lines().any(|l| l == line), "missing {line:?} in\n{body}");
        }
        // A node that did not answer has no INFO series.
        assert!(!body.contains("redis_ratelimit_blocked{node=\"h:2\"}"));
        assert!(!body.contains("_total_total"));
        // Every family is described once, even with no samples.
        for family in FAMILIES {
            let help = format!("# HELP {} ", family.name);
            assert_eq!(body.matches(&help).count(), 1, "{}", family.name);
        }
    }
}

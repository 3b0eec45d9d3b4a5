//! The observability conformance test: the kit's metrics (names as a scrape
//! shows them, types, labels, help, the histogram's buckets), the `level`
//! and `outcome` values, and the deny events' fields, order and defaults
//! against `observability` in clients/contract/contract.json.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::{Duration, UNIX_EPOCH};

use serde_json::Value;

use crate::observability::{
    render, DenyEvent, DenyEvents, Metrics, Outcome, Sink, LEVELS, METRICS, OUTCOMES,
    REDIS_SECONDS_BUCKETS,
};

fn contract() -> Value {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../contract/contract.json");
    let text = std::fs::read_to_string(&path).expect("clients/contract/contract.json");
    let all: Value = serde_json::from_str(&text).expect("the contract is JSON");
    all["observability"].clone()
}

fn strings(v: &Value) -> Vec<String> {
    v.as_array()
        .expect("an array")
        .iter()
        .map(|s| s.as_str().expect("a string").to_string())
        .collect()
}

/// One family of a Prometheus text scrape: its type, help, and the label
/// names of each sample (by sample name).
#[derive(Debug, Default)]
struct Family {
    kind: String,
    help: String,
    samples: BTreeMap<String, Vec<BTreeMap<String, String>>>,
}

/// Parses the Prometheus text format (0.0.4) the kit serves by default.
fn parse(text: &str) -> BTreeMap<String, Family> {
    let mut families: BTreeMap<String, Family> = BTreeMap::new();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# HELP ") {
            let (name, help) = rest.split_once(' ').expect("HELP name text");
            families.entry(name.into()).or_default().help = help.into();
        } else if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').expect("TYPE name type");
            families.entry(name.into()).or_default().kind = kind.into();
        } else if !line.is_empty() && !line.starts_with('#') {
            let (series, _value) = line.rsplit_once(' ').expect("a sample and its value");
            let (name, labels) = match series.split_once('{') {
                Some((n, l)) => (n, l.trim_end_matches('}')),
                None => (series, ""),
            };
            let labels: BTreeMap<String, String> = labels
                .split("\",")
                .filter(|kv| !kv.is_empty())
                .map(|kv| {
                    let (k, v) = kv.split_once('=').expect("label=value");
                    (k.to_string(), v.trim_matches('"').to_string())
                })
                .collect();
            let family = ["_bucket", "_sum", "_count"]
                .iter()
                .find_map(|s| name.strip_suffix(s).filter(|f| families.contains_key(*f)))
                .unwrap_or(name);
            families
                .entry(family.into())
                .or_default()
                .samples
                .entry(name.into())
                .or_default()
                .push(labels);
        }
    }
    families
}

#[test]
fn the_kits_metric_table_is_the_contracts() {
    let c = contract();
    let metrics = c["metrics"].as_array().expect("metrics");
    assert_eq!(
        metrics.len(),
        METRICS.len(),
        "one entry per contract metric"
    );
    for (m, (name, kind, labels, help)) in metrics.iter().zip(METRICS) {
        assert_eq!(m["name"], name);
        assert_eq!(m["type"], kind, "{name}");
        assert_eq!(strings(&m["labels"]), labels, "{name}");
        assert_eq!(m["help"], help, "{name}");
    }
    assert_eq!(strings(&c["outcomes"]), OUTCOMES);
    let levels: Vec<String> = c["levels"]
        .as_array()
        .expect("levels")
        .iter()
        .map(|l| l["level"].as_str().expect("level").to_string())
        .collect();
    assert_eq!(levels, LEVELS);
    let buckets: Vec<f64> = c["redis_seconds_buckets"]
        .as_array()
        .expect("buckets")
        .iter()
        .map(|b| b.as_f64().expect("a number"))
        .collect();
    assert_eq!(buckets, REDIS_SECONDS_BUCKETS);
}

#[tokio::test]
async fn a_scrape_shows_every_contract_metric_with_its_type_labels_help_and_buckets() {
    let c = contract();
    let metrics = Metrics::new();
    // A series of each labelled family, every level and outcome.
    let rule = metrics.rule("per-user");
    for level in 0..LEVELS.len() {
        for outcome in 0..OUTCOMES.len() {
            rule.decided(level, outcome);
        }
    }
    rule.remaining(3, 5);
    metrics.observe_redis(0.003);
    let open: Arc<dyn Fn() -> bool + Send + Sync> = Arc::new(|| true);
    metrics.watch_limiter(Arc::downgrade(&open));
    let events = DenyEvents::builder(Sink::callback(|_| Ok(())))
        .background(false)
        .start()
        .expect("defaults");
    metrics.watch_deny_events(&events);

    let (content_type, text) = metrics.render(None).expect("its own registry");
    assert_eq!(content_type, "text/plain; version=0.0.4; charset=utf-8");
    let families = parse(&text);
    for m in c["metrics"].as_array().expect("metrics") {
        let name = m["name"].as_str().expect("name");
        let f = families
            .get(name)
            .unwrap_or_else(|| panic!("{name} missing from the scrape:\n{text}"));
        assert_eq!(f.kind, m["type"].as_str().expect("type"), "{name}");
        let help = m["help"].as_str().expect("help");
        assert!(f.help.starts_with(help), "{name}: HELP {:?}", f.help);
        let labels: BTreeSet<String> = strings(&m["labels"]).into_iter().collect();
        let sample = match f.kind.as_str() {
            "histogram" => format!("{name}_count"),
            _ => name.to_string(),
        };
        match name {
            // Read from the protection loop: no loop here, no series.
            "ratelimit_scale" | "ratelimit_stage" => continue,
            _ => {}
        }
        let series = f
            .samples
            .get(&sample)
            .unwrap_or_else(|| panic!("no {sample} sample:\n{text}"));
        for s in series {
            let names: BTreeSet<String> = s.keys().cloned().collect();
            assert_eq!(names, labels, "{name}'s labels");
        }
    }
    // Every level and outcome is a value the contract knows.
    let decisions = &families["ratelimit_decisions_total"].samples["ratelimit_decisions_total"];
    assert_eq!(decisions.len(), LEVELS.len() * OUTCOMES.len());
    for s in decisions {
        assert!(LEVELS.contains(&s["level"].as_str()));
        assert!(OUTCOMES.contains(&s["outcome"].as_str()));
        assert_eq!(s["rule"], "per-user");
    }
    // The histogram's buckets, in order, then +Inf.
    let les: Vec<String> = families["ratelimit_redis_seconds"].samples
        ["ratelimit_redis_seconds_bucket"]
        .iter()
        .map(|s| s["le"].clone())
        .collect();
    let mut want: Vec<String> = c["redis_seconds_buckets"]
        .as_array()
        .expect("buckets")
        .iter()
        .map(|b| format!("{:?}", b.as_f64().expect("a number")))
        .collect();
    want.push("+Inf".into());
    let les: Vec<f64> = les
        .iter()
        .map(|l| {
            if l == "+Inf" {
                f64::INFINITY
            } else {
                l.parse().expect("le")
            }
        })
        .collect();
    let want: Vec<f64> = want
        .iter()
        .map(|l| {
            if l == "+Inf" {
                f64::INFINITY
            } else {
                l.parse().expect("le")
            }
        })
        .collect();
    assert_eq!(les, want);
    // The OpenMetrics scrape, for a scraper that asks for it.
    let (content_type, om) = metrics
        .render(Some(
            "application/openmetrics-text;version=1.0.0,text/plain;q=0.5",
        ))
        .expect("its own registry");
    assert_eq!(
        content_type,
        "application/openmetrics-text; version=1.0.0; charset=utf-8"
    );
    assert!(om.ends_with("# EOF\n"), "{om}");
    assert!(om.contains("ratelimit_decisions_total{"), "{om}");
    // The application's registry carries the same.
    let mut registry = crate::Registry::default();
    let theirs = Metrics::register(&mut registry);
    theirs.rule("r").decided(1, 0);
    assert!(
        theirs.render(None).is_none(),
        "served with the application's registry"
    );
    let (_, text) = render(&registry, None).expect("encodes");
    assert!(
        text.contains(r#"ratelimit_decisions_total{rule="r",level="redis",outcome="admitted"} 1"#),
        "{text}"
    );
}

#[test]
fn deny_events_have_the_contracts_fields_in_order_and_its_defaults() {
    let c = &contract()["deny_events"];
    let event = DenyEvent {
        timestamp: UNIX_EPOCH + Duration::from_millis(1_796_205_600_123),
        key: "rl:user:bob".into(),
        rule: Arc::from("per-user"),
        level: "redis",
        outcome: Outcome::Denied,
        limit: 5,
        remaining: 0,
        retry_after_ms: 800,
        client_ip: Some("127.0.0.1".into()),
        user_agent: Some("test".into()),
    };
    let line = event.to_json();
    let v: serde_json::Map<String, Value> = serde_json::from_str(&line).expect("JSON");
    // serde_json's map keeps the keys sorted: read the order from the text.
    let mut order: Vec<(usize, String)> = v
        .keys()
        .map(|k| (line.find(&format!("\"{k}\":")).expect("the key"), k.clone()))
        .collect();
    order.sort();
    let order: Vec<String> = order.into_iter().map(|(_, k)| k).collect();
    assert_eq!(order, strings(&c["fields"]));
    assert_eq!(
        v["timestamp"], "2026-12-02T10:00:00.123Z",
        "{}",
        c["timestamp"]
    );
    // The optional fields are left out when unknown, the others stay.
    let bare = DenyEvent {
        client_ip: None,
        user_agent: None,
        ..event
    };
    let v: serde_json::Map<String, Value> = serde_json::from_str(&bare.to_json()).expect("JSON");
    let optional = strings(&c["optional"]);
    let want: BTreeSet<String> = strings(&c["fields"])
        .into_iter()
        .filter(|f| !optional.contains(f))
        .collect();
    assert_eq!(v.keys().cloned().collect::<BTreeSet<_>>(), want);
    // The defaults.
    use crate::observability::events_defaults as d;
    assert_eq!(c["buffer_events"], d::CAPACITY as u64);
    assert_eq!(c["flush_events"], d::FLUSH_EVENTS as u64);
    assert_eq!(c["flush_interval_ms"], d::FLUSH_INTERVAL.as_millis() as u64);
    assert_eq!(c["sink_timeout_ms"], d::SINK_TIMEOUT.as_millis() as u64);
    assert_eq!(c["bulk_index"], d::BULK_INDEX);
    let shipper = DenyEvents::builder(Sink::callback(|_| Ok(()))).background(false);
    assert_eq!(
        shipper.settings(),
        (
            d::CAPACITY,
            d::FLUSH_INTERVAL,
            d::FLUSH_EVENTS,
            d::SINK_TIMEOUT
        )
    );
}

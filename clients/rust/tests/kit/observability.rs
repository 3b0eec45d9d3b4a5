//! Metrics and deny events against real servers over real HTTP: the example
//! service's `/metrics` scraped and checked by `promtool`, with the decision
//! counts the test drove; deny events to a real `_bulk` server written
//! here, to a file and to a callback; a dead sink costing counters, not
//! requests; a full buffer dropping exactly the oldest.

use std::collections::BTreeMap;
use std::io::Write;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use axum::routing::post;
use axum::Router;
use redis_ratelimit_client::{
    Client, DenyEvent, DenyEvents, FallbackMode, Limiter, Metrics, Outcome, RateLimitLayer, Rule,
    Sink,
};

use crate::harness::{free_port, wait_for, Http, Kind, Server, Service};

const PROMTOOL: &str = "/usr/bin/promtool";

/// The value of the sample `name` whose labels are exactly `labels`.
fn sample(text: &str, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    let want: BTreeMap<&str, &str> = labels.iter().copied().collect();
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .find_map(|line| {
            let (series, value) = line.rsplit_once(' ')?;
            let (n, l) = match series.split_once('{') {
                Some((n, l)) => (n, l.trim_end_matches('}')),
                None => (series, ""),
            };
            let got: BTreeMap<&str, &str> = l
                .split("\",")
                .filter(|kv| !kv.is_empty())
                .filter_map(|kv| kv.split_once('='))
                .map(|(k, v)| (k, v.trim_matches('"')))
                .collect();
            (n == name && got == want).then(|| value.parse().ok())?
        })
}

/// `promtool check metrics` on `text`: its verdict, or `None` (with a
/// message) when promtool is not installed.
fn promtool(text: &str) -> Option<(bool, String)> {
    if !std::path::Path::new(PROMTOOL).exists() {
        eprintln!("SKIPPED promtool check: {PROMTOOL} is absent (make setup installs it)");
        return None;
    }
    let mut child = Command::new(PROMTOOL)
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("promtool runs");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    Some((out.status.success(), said))
}

fn temp_file(tag: &str) -> std::path::PathBuf {
    let path = std::env::temp_dir().join(format!(
        "rl-kit-{}-{tag}-{}.jsonl",
        std::process::id(),
        SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .unwrap()
            .as_nanos()
    ));
    let _ = std::fs::remove_file(&path);
    path
}

fn lines(path: &std::path::Path) -> Vec<serde_json::Value> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(|l| serde_json::from_str(l).expect("a JSON line"))
        .collect()
}

/// The keys of a JSON line in the order they are written.
fn key_order(line: &str) -> Vec<String> {
    let v: serde_json::Map<String, serde_json::Value> = serde_json::from_str(line).unwrap();
    let mut keys: Vec<(usize, String)> = v
        .keys()
        .map(|k| (line.find(&format!("\"{k}\":")).unwrap(), k.clone()))
        .collect();
    keys.sort();
    keys.into_iter().map(|(_, k)| k).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_example_service_serves_metrics_promtool_accepts_counting_what_was_driven() {
    let server = Server::start(Kind::Redis);
    let mut conn = server.conn();
    redis::cmd("RL.POLICY")
        .arg(&["SET", "obs-loop", "TOKENBUCKET", "1000", "1000", "1000"])
        .exec(&mut conn)
        .unwrap();
    let events_file = temp_file("service-events");
    let service = Service::start(&[
        ("RL_URL", server.url()),
        ("RL_PREFIX", "obs:".into()),
        ("RL_USER_LIMIT", "3".into()),
        ("RL_USER_WINDOW_MS", "60000".into()),
        // Every decision by Redis, so the test knows each one's level.
        ("RL_DENY_CACHE", "0".into()),
        ("RL_POLICY", "obs-loop".into()),
        ("RL_DENY_EVENTS_FILE", events_file.display().to_string()),
        ("RL_DENY_EVENTS_FLUSH_MS", "100".into()),
    ]);
    let http = Http::default();
    let headers = [("x-user", "alice"), ("user-agent", "obs-test/1.0")];
    let mut statuses = Vec::new();
    for _ in 0..7 {
        statuses.push(http.get(&service.url("/"), &headers).await.status);
    }
    assert_eq!(statuses, [200, 200, 200, 429, 429, 429, 429]);

    let scrape = http.get(&service.url("/metrics"), &[]).await;
    assert_eq!(scrape.status, 200);
    assert_eq!(
        scrape.header("content-type"),
        Some("text/plain; version=0.0.4; charset=utf-8")
    );
    let text = scrape.body;
    if let Some((ok, said)) = promtool(&text) {
        assert!(
            ok,
            "promtool check metrics refused the scrape: {said}\n{text}"
        );
    }
    let decisions = |rule: &str, level: &str, outcome: &str| {
        sample(
            &text,
            "ratelimit_decisions_total",
            &[("rule", rule), ("level", level), ("outcome", outcome)],
        )
    };
    // An admitted request counts for both rules of its RL.ALL; a denial for
    // the rule that denied.
    assert_eq!(
        decisions("per-user", "redis", "admitted"),
        Some(3.0),
        "{text}"
    );
    assert_eq!(
        decisions("global", "redis", "admitted"),
        Some(3.0),
        "{text}"
    );
    assert_eq!(
        decisions("per-user", "redis", "denied"),
        Some(4.0),
        "{text}"
    );
    assert_eq!(decisions("global", "redis", "denied"), None, "{text}");
    for level in ["local", "deny_cache", "grant", "fallback"] {
        assert_eq!(
            decisions("per-user", level, "denied"),
            None,
            "{level}: {text}"
        );
    }
    // One RL.ALL per request.
    assert_eq!(
        sample(&text, "ratelimit_redis_seconds_count", &[]),
        Some(7.0),
        "{text}"
    );
    assert_eq!(
        sample(&text, "ratelimit_remaining_ratio", &[("rule", "per-user")]),
        Some(0.0),
        "the last decision left nothing: {text}"
    );
    assert_eq!(
        sample(&text, "ratelimit_breaker_open", &[("breaker", "redis")]),
        Some(0.0)
    );
    assert_eq!(
        sample(
            &text,
            "ratelimit_breaker_open",
            &[("breaker", "downstream")]
        ),
        Some(0.0)
    );
    assert_eq!(
        sample(&text, "ratelimit_scale", &[("rule", "obs-loop")]),
        Some(100.0)
    );
    assert_eq!(
        sample(&text, "ratelimit_stage", &[("rule", "obs-loop")]),
        Some(0.0)
    );
    assert_eq!(
        sample(&text, "ratelimit_deny_events_dropped_total", &[]),
        Some(0.0)
    );

    // The OpenMetrics exposition, for a scraper that asks for it.
    let om = http
        .get(
            &service.url("/metrics"),
            &[(
                "accept",
                "application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5",
            )],
        )
        .await;
    assert_eq!(
        om.header("content-type"),
        Some("application/openmetrics-text; version=1.0.0; charset=utf-8")
    );
    assert!(om.body.ends_with("# EOF\n"), "{}", om.body);
    assert!(
        om.body.contains("# TYPE ratelimit_decisions counter"),
        "{}",
        om.body
    );

    // The four denials as deny events, with the HTTP request's fields.
    wait_for("the deny events in the file", async || {
        lines(&events_file).len() >= 4
    })
    .await;
    let raw = std::fs::read_to_string(&events_file).unwrap();
    assert_eq!(raw.lines().count(), 4, "{raw}");
    for line in raw.lines() {
        assert_eq!(
            key_order(line),
            [
                "timestamp",
                "key",
                "rule",
                "level",
                "outcome",
                "limit",
                "remaining",
                "retry_after_ms",
                "client_ip",
                "user_agent"
            ]
        );
        let v: serde_json::Value = serde_json::from_str(line).unwrap();
        assert_eq!(v["key"], "{obs:api}:user:alice");
        assert_eq!(v["rule"], "per-user");
        assert_eq!(v["level"], "redis");
        assert_eq!(v["outcome"], "denied");
        assert_eq!(v["limit"], 3);
        assert_eq!(v["remaining"], 0);
        assert!(v["retry_after_ms"].as_i64().unwrap() > 0, "{line}");
        assert_eq!(v["client_ip"], "127.0.0.1");
        assert_eq!(v["user_agent"], "obs-test/1.0");
        let ts = v["timestamp"].as_str().unwrap();
        assert!(
            ts.len() == 24 && ts.ends_with('Z') && ts.as_bytes()[19] == b'.',
            "{ts}"
        );
    }
    let after = http.get(&service.url("/metrics"), &[]).await.body;
    assert_eq!(
        sample(&after, "ratelimit_deny_events_shipped_total", &[]),
        Some(4.0),
        "{after}"
    );
    let _ = std::fs::remove_file(&events_file);
}

/// The levels a limiter in process decides at: the local level of a global
/// rule, the deny cache, and the fallback once Redis is gone; each counted
/// with its level and outcome, and each denial an event of that level.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_level_counts_its_decisions_and_ships_its_denials() {
    let mut server = Server::start(Kind::Redis);
    let client = Client::standalone(&server.url()).await.unwrap();
    let metrics = Metrics::new();
    let batches: Arc<Mutex<Vec<Vec<DenyEvent>>>> = Arc::default();
    let seen = batches.clone();
    let events = DenyEvents::builder(Sink::callback(move |batch| {
        seen.lock().unwrap().push(batch.to_vec());
        Ok(())
    }))
    .background(false)
    .start()
    .unwrap();
    let limiter = Limiter::builder(client)
        .deadline(Duration::from_millis(500))
        .fallback(FallbackMode::FailClosed)
        .metrics(metrics.clone())
        .deny_events(events.clone())
        .build();
    let global = limiter
        .rule_set(vec![Rule::fixed_window(2, 60_000)
            .name("shared")
            .fixed_key("obs:lv:global")
            .global()])
        .await
        .unwrap();
    // Two admitted by Redis, then the local share (2 on one instance) denies.
    let mut got = Vec::new();
    for _ in 0..3 {
        let d = limiter.check(&global, "x", 1).await;
        got.push((d.allowed, d.path));
    }
    use redis_ratelimit_client::Path;
    assert_eq!(
        got,
        [
            (true, Path::Redis),
            (true, Path::Redis),
            (false, Path::Local)
        ]
    );
    let user = limiter
        .rule_set(vec![Rule::fixed_window(1, 60_000)
            .name("per-key")
            .key_prefix("obs:lv:user:")])
        .await
        .unwrap();
    let d1 = limiter.check(&user, "bob", 1).await;
    let d2 = limiter.check(&user, "bob", 1).await;
    let d3 = limiter.check(&user, "bob", 1).await;
    assert_eq!(
        [
            (d1.allowed, d1.path),
            (d2.allowed, d2.path),
            (d3.allowed, d3.path)
        ],
        [
            (true, Path::Redis),
            (false, Path::Redis),
            (false, Path::DenyCache)
        ]
    );
    // Redis gone: the fail-closed fallback denies.
    server.kill9();
    let d4 = limiter.check(&user, "carol", 1).await;
    assert_eq!((d4.allowed, d4.path), (false, Path::Fallback));

    let (_, text) = metrics.render(None).unwrap();
    let count = |rule: &str, level: &str, outcome: &str| {
        sample(
            &text,
            "ratelimit_decisions_total",
            &[("rule", rule), ("level", level), ("outcome", outcome)],
        )
    };
    assert_eq!(count("shared", "redis", "admitted"), Some(2.0), "{text}");
    assert_eq!(count("shared", "local", "denied"), Some(1.0), "{text}");
    assert_eq!(count("per-key", "redis", "admitted"), Some(1.0), "{text}");
    assert_eq!(count("per-key", "redis", "denied"), Some(1.0), "{text}");
    assert_eq!(
        count("per-key", "deny_cache", "denied"),
        Some(1.0),
        "{text}"
    );
    assert_eq!(count("per-key", "fallback", "denied"), Some(1.0), "{text}");
    assert_eq!(
        sample(&text, "ratelimit_remaining_ratio", &[("rule", "shared")]),
        Some(0.0),
        "the local level's denial: {text}"
    );
    if let Some((ok, said)) = promtool(&text) {
        assert!(ok, "promtool: {said}\n{text}");
    }

    events.flush().await;
    let shipped: Vec<DenyEvent> = batches.lock().unwrap().concat();
    let summary: Vec<(&str, &str, &str, Option<&str>)> = shipped
        .iter()
        .map(|e| (&*e.rule, e.key.as_str(), e.level, e.client_ip.as_deref()))
        .collect();
    assert_eq!(
        summary,
        [
            ("shared", "obs:lv:global", "local", None),
            ("per-key", "obs:lv:user:bob", "redis", None),
            ("per-key", "obs:lv:user:bob", "deny_cache", None),
            ("per-key", "obs:lv:user:carol", "fallback", None),
        ]
    );
    assert!(shipped.iter().all(|e| e.outcome == Outcome::Denied));
    assert_eq!(shipped[0].limit, 2, "the rule's whole limit");
    assert_eq!(events.stats().shipped, 4);
}

/// What the `_bulk` server written for the test received.
#[derive(Default)]
struct Bulk {
    batches: Mutex<Vec<Vec<serde_json::Value>>>,
    bad: Mutex<Vec<String>>,
}

/// A real HTTP server that takes Elasticsearch's `_bulk`: checks the
/// content type and each action/event pair, answers `errors: false`.
async fn bulk_server(bulk: Arc<Bulk>) -> String {
    let app = Router::new().route(
        "/_bulk",
        post(
            move |headers: axum::http::HeaderMap, body: axum::body::Bytes| {
                let bulk = bulk.clone();
                async move {
                    let text = String::from_utf8_lossy(&body).into_owned();
                    if headers.get("content-type").and_then(|v| v.to_str().ok())
                        != Some("application/x-ndjson")
                    {
                        bulk.bad.lock().unwrap().push("content-type".into());
                    }
                    if !text.ends_with('\n') {
                        bulk.bad.lock().unwrap().push("no final newline".into());
                    }
                    let lines: Vec<&str> = text.lines().collect();
                    let mut events = Vec::new();
                    let mut items = Vec::new();
                    for pair in lines.chunks(2) {
                        let action: serde_json::Value =
                            serde_json::from_str(pair[0]).unwrap_or_default();
                        if action != serde_json::json!({"index": {"_index": "ratelimit-deny"}}) {
                            bulk.bad.lock().unwrap().push(format!("action {}", pair[0]));
                        }
                        match pair.get(1).map(|l| serde_json::from_str(l)) {
                            Some(Ok(event)) => events.push(event),
                            _ => bulk.bad.lock().unwrap().push("no event line".into()),
                        }
                        items.push(serde_json::json!({"index": {"_index": "ratelimit-deny", "status": 201}}));
                    }
                    bulk.batches.lock().unwrap().push(events);
                    (
                        [(axum::http::header::CONTENT_TYPE, "application/json")],
                        serde_json::json!({"took": 1, "errors": false, "items": items})
                            .to_string(),
                    )
                }
            },
        ),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    format!("http://{addr}")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_of_denials_reaches_a_bulk_endpoint_whole_in_batches_of_at_most_1000() {
    let server = Server::start(Kind::Redis);
    let bulk = Arc::new(Bulk::default());
    let url = bulk_server(bulk.clone()).await;
    let events = DenyEvents::builder(Sink::bulk(&url).unwrap())
        .flush_interval(Duration::from_millis(200))
        .start()
        .unwrap();
    let client = Client::standalone(&server.url()).await.unwrap();
    let limiter = Limiter::builder(client)
        .deadline(Duration::from_secs(5))
        .deny_events(events.clone())
        .build();
    let set = limiter
        .rule_set(vec![Rule::fixed_window(1, 60_000)
            .name("flood")
            .key_prefix("obs:flood:")])
        .await
        .unwrap();
    // 8 callers, 6,000 requests of one key: 1 admitted, 5,999 denied (by
    // Redis, then from the deny cache).
    let mut tasks = Vec::new();
    for _ in 0..8 {
        let (limiter, set) = (limiter.clone(), set.clone());
        tasks.push(tokio::spawn(async move {
            let mut denied = 0u64;
            for _ in 0..750 {
                denied += u64::from(!limiter.check(&set, "mallory", 1).await.allowed);
            }
            denied
        }));
    }
    let mut denied = 0;
    for t in tasks {
        denied += t.await.unwrap();
    }
    assert_eq!(denied, 5_999);
    wait_for("every event shipped", async || {
        events.stats().shipped == denied
    })
    .await;
    let stats = events.stats();
    assert_eq!((stats.dropped, stats.sink_errors), (0, 0), "{stats:?}");
    assert!(
        bulk.bad.lock().unwrap().is_empty(),
        "{:?}",
        bulk.bad.lock().unwrap()
    );
    let batches = bulk.batches.lock().unwrap();
    let sizes: Vec<usize> = batches.iter().map(Vec::len).collect();
    assert!(sizes.iter().all(|&n| (1..=1000).contains(&n)), "{sizes:?}");
    assert!(
        sizes.len() >= 6,
        "5,999 events need at least 6 batches: {sizes:?}"
    );
    let all: Vec<&serde_json::Value> = batches.iter().flatten().collect();
    assert_eq!(all.len() as u64, denied);
    assert!(all.iter().all(|e| e["key"] == "obs:flood:mallory"
        && e["rule"] == "flood"
        && e["outcome"] == "denied"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn denials_append_to_a_file_as_json_lines() {
    let server = Server::start(Kind::Redis);
    let path = temp_file("file-sink");
    let events = DenyEvents::builder(Sink::file(&path))
        .flush_interval(Duration::from_millis(50))
        .flush_events(100)
        .start()
        .unwrap();
    let client = Client::standalone(&server.url()).await.unwrap();
    let limiter = Limiter::builder(client)
        .deadline(Duration::from_secs(5))
        .deny_cache(false)
        .deny_events(events.clone())
        .build();
    let set = limiter
        .rule_set(vec![Rule::sliding(2, 60_000)
            .name("file-rule")
            .key_prefix("obs:file:")])
        .await
        .unwrap();
    for i in 0..250 {
        limiter.check(&set, &format!("u{}", i % 10), 1).await;
    }
    // 10 users, 2 admitted each: 230 denials.
    wait_for("230 events shipped", async || events.stats().shipped == 230).await;
    events.close().await;
    let got = lines(&path);
    assert_eq!(got.len(), 230);
    for v in &got {
        assert_eq!(v["rule"], "file-rule");
        assert_eq!(v["level"], "redis");
        assert_eq!(v["limit"], 2);
        assert!(v.get("client_ip").is_none(), "unknown outside HTTP: {v}");
    }
    let _ = std::fs::remove_file(&path);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_callback_gets_the_batches_on_the_flusher() {
    let server = Server::start(Kind::Redis);
    let got: Arc<Mutex<Vec<usize>>> = Arc::default();
    let seen = got.clone();
    let events = DenyEvents::builder(Sink::callback(move |batch| {
        seen.lock().unwrap().push(batch.len());
        Ok(())
    }))
    .flush_events(10)
    .start()
    .unwrap();
    let client = Client::standalone(&server.url()).await.unwrap();
    let limiter = Limiter::builder(client)
        .deadline(Duration::from_secs(5))
        .deny_events(events.clone())
        .build();
    let set = limiter
        .rule_set(vec![Rule::fixed_window(1, 60_000)
            .name("cb")
            .key_prefix("obs:cb:")])
        .await
        .unwrap();
    for _ in 0..31 {
        limiter.check(&set, "dave", 1).await;
    }
    // 30 denials: three batches of ten, without waiting for the 5 s interval.
    wait_for("30 events shipped", async || events.stats().shipped == 30).await;
    let sizes = got.lock().unwrap().clone();
    assert_eq!(sizes.iter().sum::<usize>(), 30);
    assert!(sizes.iter().all(|&n| n <= 10), "{sizes:?}");
    // A callback's error is a failed flush: counted, the batch dropped.
    let failing = DenyEvents::builder(Sink::callback(|_| Err("refused".to_string())))
        .background(false)
        .start()
        .unwrap();
    for i in 0..5 {
        failing.record(event(i));
    }
    failing.flush().await;
    let s = failing.stats();
    assert_eq!((s.shipped, s.dropped, s.sink_errors), (0, 5, 1));
}

fn event(i: u64) -> DenyEvent {
    DenyEvent {
        timestamp: SystemTime::now(),
        key: format!("k{i}"),
        rule: Arc::from("r"),
        level: "redis",
        outcome: Outcome::Denied,
        limit: 1,
        remaining: 0,
        retry_after_ms: 1000,
        client_ip: None,
        user_agent: None,
    }
}

#[tokio::test]
async fn a_full_buffer_with_its_flusher_stopped_drops_exactly_the_oldest() {
    let got: Arc<Mutex<Vec<String>>> = Arc::default();
    let seen = got.clone();
    let events = DenyEvents::builder(Sink::callback(move |batch| {
        seen.lock()
            .unwrap()
            .extend(batch.iter().map(|e| e.key.clone()));
        Ok(())
    }))
    .capacity(100)
    .background(false)
    .start()
    .unwrap();
    for i in 0..250 {
        events.record(event(i));
    }
    let s = events.stats();
    assert_eq!((s.recorded, s.dropped, s.pending), (250, 150, 100));
    events.flush().await;
    let want: Vec<String> = (150..250).map(|i| format!("k{i}")).collect();
    assert_eq!(*got.lock().unwrap(), want, "the newest survive, in order");
    assert_eq!(events.stats().shipped, 100);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_connection_costs_counters_not_requests() {
    let server = Server::start(Kind::Redis);
    let dead = format!("http://127.0.0.1:{}", free_port());
    let metrics = Metrics::new();
    let events = DenyEvents::builder(Sink::bulk(&dead).unwrap())
        .flush_interval(Duration::from_millis(50))
        .start()
        .unwrap();
    let client = Client::standalone(&server.url()).await.unwrap();
    let limiter = Limiter::builder(client)
        .deadline(Duration::from_secs(5))
        .metrics(metrics.clone())
        .deny_events(events.clone())
        .build();
    let set = limiter
        .rule_set(vec![Rule::fixed_window(1, 60_000)
            .name("dead")
            .key_prefix("obs:dead:")])
        .await
        .unwrap();
    let mut denied = 0u64;
    for _ in 0..2_501 {
        denied += u64::from(!limiter.check(&set, "eve", 1).await.allowed);
    }
    assert_eq!(denied, 2_500, "every request decided");
    wait_for("every event dropped", async || {
        events.stats().dropped == denied
    })
    .await;
    let s = events.stats();
    assert_eq!(s.shipped, 0);
    assert!(
        s.sink_errors >= 3,
        "2,500 events, at most 1,000 a batch: {s:?}"
    );
    let (_, text) = metrics.render(None).unwrap();
    assert_eq!(
        sample(&text, "ratelimit_deny_events_dropped_total", &[]),
        Some(denied as f64),
        "{text}"
    );
    assert_eq!(
        sample(&text, "ratelimit_deny_events_sink_errors_total", &[]),
        Some(s.sink_errors as f64)
    );
}

/// A sink that accepts the connection and never answers: requests go on
/// while a flush waits on it; the flush then times out, and its batch is
/// dropped and counted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sink_that_never_answers_costs_counters_not_requests() {
    let server = Server::start(Kind::Redis);
    // Accepts, reads, never answers; holds every connection.
    let hung = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", hung.local_addr().unwrap());
    let accepted = Arc::new(AtomicU64::new(0));
    let count = accepted.clone();
    tokio::spawn(async move {
        let mut held = Vec::new();
        loop {
            let (socket, _) = hung.accept().await.unwrap();
            count.fetch_add(1, Ordering::Relaxed);
            held.push(socket);
        }
    });
    let client = Client::standalone(&server.url()).await.unwrap();
    let events = DenyEvents::builder(Sink::bulk(&url).unwrap())
        .flush_events(100)
        .timeout(Duration::from_secs(60))
        .start()
        .unwrap();
    let limiter = Limiter::builder(client)
        .deadline(Duration::from_secs(5))
        .deny_events(events.clone())
        .build();
    let layer = RateLimitLayer::builder(limiter)
        .key(|req| {
            req.headers
                .get("x-user")
                .and_then(|v| v.to_str().ok())
                .map(String::from)
        })
        .rule(
            Rule::fixed_window(1, 60_000)
                .name("hung")
                .key_prefix("obs:hung:"),
        )
        .build()
        .await
        .unwrap();
    let url = crate::harness::serve(layer).await;
    let http = Http::default();
    let user = [("x-user", "frank")];
    // 100 denials: a batch, which the flusher sends to the hung sink.
    assert_eq!(http.get(&url, &user).await.status, 200);
    for _ in 0..100 {
        assert_eq!(http.get(&url, &user).await.status, 429);
    }
    wait_for("the flush to reach the hung sink", async || {
        accepted.load(Ordering::Relaxed) >= 1
    })
    .await;
    // While that flush waits, requests are answered.
    for _ in 0..200 {
        assert_eq!(http.get(&url, &user).await.status, 429);
    }
    let s = events.stats();
    assert_eq!(s.sink_errors, 0, "the flush is still waiting: {s:?}");
    assert_eq!(s.shipped, 0);
    assert_eq!(s.recorded, 300);
}

#[tokio::test]
async fn bad_settings_are_refused_naming_them() {
    let sink = || Sink::callback(|_| Ok(()));
    let arg_of = |r: Result<DenyEvents, redis_ratelimit_client::Error>| match r {
        Err(redis_ratelimit_client::Error::BadArgument { arg, .. }) => arg,
        other => panic!("{other:?}"),
    };
    assert_eq!(
        arg_of(DenyEvents::builder(sink()).capacity(0).start()),
        "capacity"
    );
    assert_eq!(
        arg_of(DenyEvents::builder(sink()).flush_events(0).start()),
        "flush_events"
    );
    assert_eq!(
        arg_of(
            DenyEvents::builder(sink())
                .capacity(10)
                .flush_events(11)
                .start()
        ),
        "flush_events"
    );
    assert_eq!(
        arg_of(
            DenyEvents::builder(sink())
                .flush_interval(Duration::ZERO)
                .start()
        ),
        "flush_interval"
    );
    assert_eq!(
        arg_of(DenyEvents::builder(sink()).timeout(Duration::ZERO).start()),
        "timeout"
    );
    for url in [
        "",
        "https://es:9200",
        "es:9200",
        "http://",
        "http://es:9200/?pretty",
        "http://es:9200#x",
        "http://elastic:secret@es:9200",
    ] {
        match Sink::bulk(url) {
            Err(redis_ratelimit_client::Error::BadArgument { arg, .. }) => assert_eq!(arg, "url"),
            other => panic!("{url:?}: {other:?}"),
        }
    }
}

// ---- Review: cancellation, hung sinks, replies, runtime, huge headers ----

/// A TCP server that accepts, reads, and never answers (its URL).
async fn never_answering_server() -> String {
    let hung = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", hung.local_addr().unwrap());
    tokio::spawn(async move {
        let mut held = Vec::new();
        loop {
            let (socket, _) = hung.accept().await.unwrap();
            held.push(socket);
        }
    });
    url
}

/// A flush the application gives up on (its future dropped) counts the
/// batch it had taken as dropped: every recorded event is shipped, dropped
/// or pending, never lost from the counters.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flush_given_up_midway_counts_its_batch_as_dropped() {
    let url = never_answering_server().await;
    let events = DenyEvents::builder(Sink::bulk(&url).unwrap())
        .timeout(Duration::from_secs(60))
        .background(false)
        .start()
        .unwrap();
    for i in 0..10 {
        events.record(event(i));
    }
    assert!(
        tokio::time::timeout(Duration::from_millis(200), events.flush())
            .await
            .is_err(),
        "the sink never answers"
    );
    let s = events.stats();
    assert_eq!(
        (s.recorded, s.shipped, s.dropped, s.pending, s.sink_errors),
        (10, 0, 10, 0, 1),
        "{s:?}"
    );
    events.close().await;
    let s = events.stats();
    assert_eq!(
        (s.dropped, s.sink_errors),
        (10, 1),
        "not counted twice: {s:?}"
    );
}

/// A callback that hangs holds one blocking thread: the batches that come
/// while it hangs are refused at once (dropped, counted), not each given
/// another thread of tokio's blocking pool (which the application's
/// `spawn_blocking`, file I/O and DNS share).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hung_callback_holds_one_blocking_thread_not_one_per_flush() {
    let gate = Arc::new((Mutex::new(false), std::sync::Condvar::new()));
    let (active, most) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let (g, a, m) = (gate.clone(), active.clone(), most.clone());
    let events = DenyEvents::builder(Sink::callback(move |_| {
        let now = a.fetch_add(1, Ordering::SeqCst) + 1;
        m.fetch_max(now, Ordering::SeqCst);
        let (open, cv) = &*g;
        let mut open = open.lock().unwrap();
        while !*open {
            open = cv.wait(open).unwrap();
        }
        a.fetch_sub(1, Ordering::SeqCst);
        Ok(())
    }))
    .capacity(100)
    .flush_events(1)
    .flush_interval(Duration::from_millis(10))
    .timeout(Duration::from_millis(20))
    .start()
    .unwrap();
    let mut i = 0;
    wait_for("five failed flushes", async || {
        i += 1;
        events.record(event(i));
        events.stats().sink_errors >= 5
    })
    .await;
    let most = most.load(Ordering::SeqCst);
    // Let the hung callback go (the runtime waits for its thread at the end).
    *gate.0.lock().unwrap() = true;
    gate.1.notify_all();
    assert_eq!(most, 1, "callbacks running at once");
    events.close().await;
    let s = events.stats();
    assert_eq!(s.recorded, s.shipped + s.dropped + s.pending, "{s:?}");
}

/// Starting a flusher outside a tokio runtime is an error naming it, not a
/// panic; without a flusher no runtime is needed.
#[test]
fn starting_a_flusher_outside_a_runtime_is_an_error_naming_it() {
    let sink = || Sink::callback(|_| Ok(()));
    match DenyEvents::builder(sink()).start() {
        Err(redis_ratelimit_client::Error::BadArgument { arg, .. }) => {
            assert_eq!(arg, "background")
        }
        other => panic!("{other:?}"),
    }
    let events = DenyEvents::builder(sink())
        .background(false)
        .start()
        .unwrap();
    events.record(event(1));
    assert_eq!(events.stats().pending, 1);
}

/// A raw HTTP/1.1 `_bulk` endpoint answering each request with `reply`'s
/// chunks in a chunked body (its URL), and how many requests it read.
async fn chunked_bulk_server(reply: Vec<Vec<u8>>) -> (String, Arc<AtomicU64>) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let served = Arc::new(AtomicU64::new(0));
    let count = served.clone();
    let reply = Arc::new(reply);
    tokio::spawn(async move {
        loop {
            let (mut socket, _) = listener.accept().await.unwrap();
            let (reply, count) = (reply.clone(), count.clone());
            tokio::spawn(async move {
                let mut buf = Vec::new();
                loop {
                    // The head, then content-length bytes of body.
                    let mut chunk = [0u8; 65536];
                    let n = match socket.read(&mut chunk).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => n,
                    };
                    buf.extend_from_slice(&chunk[..n]);
                    let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") else {
                        continue;
                    };
                    let head = String::from_utf8_lossy(&buf[..end]).to_ascii_lowercase();
                    let length: usize = head
                        .lines()
                        .find_map(|l| l.strip_prefix("content-length:"))
                        .map_or(0, |v| v.trim().parse().unwrap());
                    if buf.len() < end + 4 + length {
                        continue;
                    }
                    buf.drain(..end + 4 + length);
                    count.fetch_add(1, Ordering::SeqCst);
                    let mut out = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ntransfer-encoding: chunked\r\n\r\n".to_vec();
                    socket.write_all(&out).await.unwrap();
                    for part in reply.iter() {
                        out = format!("{:x}\r\n", part.len()).into_bytes();
                        out.extend_from_slice(part);
                        out.extend_from_slice(b"\r\n");
                        if socket.write_all(&out).await.is_err() {
                            return;
                        }
                    }
                    if socket.write_all(b"0\r\n\r\n").await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    (url, served)
}

/// The `_bulk` reply read as a chunked body: `errors: false` split across
/// chunks ships; `errors: true` does not; a reply past the size bound (a
/// _bulk reply of 1,000 events is well under a megabyte) is refused
/// without holding it all.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bulk_replies_chunked_with_errors_or_too_large_are_judged_whole() {
    let ship = |url: String| async move {
        let events = DenyEvents::builder(Sink::bulk(&url).unwrap())
            .timeout(Duration::from_secs(30))
            .background(false)
            .start()
            .unwrap();
        for i in 0..3 {
            events.record(event(i));
        }
        events.flush().await;
        events.stats()
    };
    let split = |s: &str| {
        s.as_bytes()
            .chunks(3)
            .map(<[u8]>::to_vec)
            .collect::<Vec<_>>()
    };
    let (ok, n) = chunked_bulk_server(split(r#"{"took":1,"errors":false,"items":[]}"#)).await;
    let s = ship(ok).await;
    assert_eq!(
        (s.shipped, s.sink_errors, n.load(Ordering::SeqCst)),
        (3, 0, 1),
        "{s:?}"
    );
    let (bad, _) = chunked_bulk_server(split(r#"{"took":1,"errors":true,"items":[]}"#)).await;
    let s = ship(bad).await;
    assert_eq!((s.shipped, s.dropped, s.sink_errors), (0, 3, 1), "{s:?}");
    // 40 MiB of JSON whitespace after a reply that says it took everything.
    let mut huge = vec![br#"{"took":1,"errors":false}"#.to_vec()];
    huge.extend(std::iter::repeat_n(vec![b' '; 1 << 20], 40));
    let (big, _) = chunked_bulk_server(huge).await;
    let s = ship(big).await;
    assert_eq!((s.shipped, s.dropped, s.sink_errors), (0, 3, 1), "{s:?}");
}

/// A request's huge `User-Agent` (or a client-address closure answering a
/// whole `X-Forwarded-For`) is cut to 512 bytes in its deny event: the
/// buffer's 10,000 events cannot hold gigabytes of headers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn huge_request_headers_are_cut_in_deny_events() {
    let server = Server::start(Kind::Redis);
    let got: Arc<Mutex<Vec<DenyEvent>>> = Arc::default();
    let seen = got.clone();
    let events = DenyEvents::builder(Sink::callback(move |b| {
        seen.lock().unwrap().extend_from_slice(b);
        Ok(())
    }))
    .background(false)
    .start()
    .unwrap();
    let client = Client::standalone(&server.url()).await.unwrap();
    let limiter = Limiter::builder(client)
        .deadline(Duration::from_secs(5))
        .deny_events(events.clone())
        .build();
    let layer = RateLimitLayer::builder(limiter)
        .key(|_| Some("zed".to_string()))
        .client_ip(|req| {
            req.headers
                .get("x-forwarded-for")
                .and_then(|v| v.to_str().ok())
                .map(String::from)
        })
        .rule(
            Rule::fixed_window(1, 60_000)
                .name("huge")
                .key_prefix("obs:huge:"),
        )
        .build()
        .await
        .unwrap();
    let url = crate::harness::serve(layer).await;
    let http = Http::default();
    let ua = "Mozilla/5.0 (X11) ".repeat(2_000); // 36,000 bytes
    let xff = "10.0.0.1, ".repeat(4_000);
    let headers = [
        ("user-agent", ua.as_str()),
        ("x-forwarded-for", xff.as_str()),
    ];
    assert_eq!(http.get(&url, &headers).await.status, 200);
    assert_eq!(http.get(&url, &headers).await.status, 429);
    events.flush().await;
    let got = got.lock().unwrap();
    assert_eq!(got.len(), 1);
    let e = &got[0];
    let (agent, ip) = (
        e.user_agent.as_deref().unwrap(),
        e.client_ip.as_deref().unwrap(),
    );
    assert!(
        agent.len() == 512 && ua.starts_with(agent),
        "{}",
        agent.len()
    );
    assert!(ip.len() <= 512 && xff.starts_with(ip), "{}", ip.len());
}

/// The deny events' counters in the metrics never go back: a shipper
/// dropped (an application rebuilding its limiter) keeps its counts in the
/// sums, where a scrape read them falling to zero, a false counter reset.
#[tokio::test]
async fn deny_event_counters_never_go_back_when_their_shipper_is_dropped() {
    let metrics = Metrics::new();
    let scrape = |name: &str| sample(&metrics.render(None).unwrap().1, name, &[]);
    let events = DenyEvents::builder(Sink::callback(|_| Ok(())))
        .capacity(2)
        .background(false)
        .start()
        .unwrap();
    metrics.watch_deny_events(&events);
    for i in 0..5 {
        events.record(event(i));
    }
    events.flush().await;
    assert_eq!(scrape("ratelimit_deny_events_shipped_total"), Some(2.0));
    assert_eq!(scrape("ratelimit_deny_events_dropped_total"), Some(3.0));
    drop(events);
    let again = DenyEvents::builder(Sink::callback(|_| Ok(())))
        .background(false)
        .start()
        .unwrap();
    metrics.watch_deny_events(&again);
    again.record(event(9));
    again.flush().await;
    assert_eq!(scrape("ratelimit_deny_events_shipped_total"), Some(3.0));
    assert_eq!(scrape("ratelimit_deny_events_dropped_total"), Some(3.0));
}

//! The benchmark of metrics and deny events (bench.sh's last table):
//! decisions per second of one [`Limiter`] without them and with both on
//! (a kit registry, and deny events shipped to a file), side by side in
//! interleaved rounds, on two paths:
//! - `redis`: every decision one round trip, admitted (a limit that never
//!   binds, 1,000 keys);
//! - `deny_cache`: every decision a denial from the deny cache, each one a
//!   deny event (the path where their cost shows most).
//!
//! ```sh
//! observe <redis-url> <decisions per run> <tasks> <rounds> <events file>
//! ```
//! Prints one line per path: `path=... off=<rate> on=<rate> ratio=<on/off>`
//! (the medians of the rounds), then one `micro` line: what one deny event
//! costs on one thread, the medians of 5 rounds: `record_ns` (building it
//! as the limiter does and appending it to a full ring buffer, the request
//! path's part), `json_ns` (formatting it, the flusher's), `ship_ns` (per
//! event of a 1,000-event batch formatted and appended to a file by the
//! flusher's path).

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use redis_ratelimit_client::{
    Client, DenyEvent, DenyEvents, Limiter, Metrics, Outcome, Rule, RuleSet, Sink,
};

fn arg(i: usize, default: &str) -> String {
    std::env::args()
        .nth(i)
        .unwrap_or_else(|| default.to_string())
}

/// Decisions per second of `n` decisions by `tasks` tasks.
async fn run(limiter: &Limiter, set: &RuleSet, n: u64, tasks: u64, spread: u64) -> f64 {
    let started = Instant::now();
    let mut handles = Vec::new();
    for t in 0..tasks {
        let (limiter, set) = (limiter.clone(), set.clone());
        handles.push(tokio::spawn(async move {
            for i in 0..n / tasks {
                let user = format!("u{}", (t * 7919 + i) % spread);
                std::hint::black_box(limiter.check(&set, &user, 1).await);
            }
        }));
    }
    for h in handles {
        h.await.expect("a task");
    }
    (n / tasks * tasks) as f64 / started.elapsed().as_secs_f64()
}

/// One deny event as the limiter builds it on a denial.
fn denial(rule: &Arc<str>, key: &str) -> DenyEvent {
    DenyEvent {
        timestamp: SystemTime::now(),
        key: key.to_string(),
        rule: rule.clone(),
        level: "deny_cache",
        outcome: Outcome::Denied,
        limit: 1,
        remaining: 0,
        retry_after_ms: 3_599_000,
        client_ip: Some("10.1.2.3".to_string()),
        user_agent: Some("Mozilla/5.0 (X11; Linux x86_64) bench".to_string()),
    }
}

/// The `micro` line: ns per deny event recorded, formatted, shipped.
async fn micro(file: &str) -> (f64, f64, f64) {
    const N: u32 = 200_000;
    let rule: Arc<str> = Arc::from("deny_cache");
    let key = "bench-observe:deny:u0";
    let (mut record, mut json, mut ship) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..5 {
        let events = DenyEvents::builder(Sink::callback(|_| Ok(())))
            .background(false)
            .start()
            .expect("the defaults");
        for _ in 0..10_000 {
            events.record(denial(&rule, key));
        }
        let t = Instant::now();
        for _ in 0..N {
            events.record(denial(&rule, key));
        }
        record.push(t.elapsed().as_nanos() as f64 / f64::from(N));
        let e = denial(&rule, key);
        let t = Instant::now();
        for _ in 0..N {
            std::hint::black_box(std::hint::black_box(&e).to_json());
        }
        json.push(t.elapsed().as_nanos() as f64 / f64::from(N));
        let events = DenyEvents::builder(Sink::file(file))
            .background(false)
            .start()
            .expect("the defaults");
        for _ in 0..10_000 {
            events.record(denial(&rule, key));
        }
        let t = Instant::now();
        events.flush().await;
        ship.push(t.elapsed().as_nanos() as f64 / 10_000.0);
        assert_eq!(events.stats().shipped, 10_000, "the file sink took them");
    }
    (median(record), median(json), median(ship))
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

#[tokio::main]
async fn main() {
    let url = arg(1, "redis://127.0.0.1:6379/");
    let n: u64 = arg(2, "20000").parse().expect("decisions per run");
    let tasks: u64 = arg(3, "16").parse().expect("tasks");
    let rounds: usize = arg(4, "3").parse().expect("rounds");
    let file = arg(5, "/tmp/rl-observe-events.jsonl");
    let client = Client::standalone(&url)
        .await
        .expect("a server with the module");
    let events = DenyEvents::builder(Sink::file(&file))
        .start()
        .expect("the defaults");
    let metrics = Metrics::new();
    let builder = || {
        Limiter::builder(client.clone())
            .deadline(Duration::from_secs(1))
            .deny_cache_max(Duration::from_secs(3600))
    };
    let off = builder().build();
    let on = builder()
        .metrics(metrics.clone())
        .deny_events(events.clone())
        .build();
    for (path, rule, spread) in [
        (
            "redis",
            Rule::fixed_window(1_000_000_000, 60_000).key_prefix("bench-observe:admit:"),
            1000,
        ),
        (
            "deny_cache",
            Rule::fixed_window(1, 3_600_000).key_prefix("bench-observe:deny:"),
            1,
        ),
    ] {
        let rule = rule.name(path);
        let (mut r_off, mut r_on) = (Vec::new(), Vec::new());
        let sets = (
            off.rule_set(vec![rule.clone()]).await.expect("a rule"),
            on.rule_set(vec![rule]).await.expect("a rule"),
        );
        // Warm both (and put the denial in each deny cache).
        run(&off, &sets.0, 1000, 1, spread).await;
        run(&on, &sets.1, 1000, 1, spread).await;
        for _ in 0..rounds {
            r_off.push(run(&off, &sets.0, n, tasks, spread).await);
            r_on.push(run(&on, &sets.1, n, tasks, spread).await);
        }
        let (a, b) = (median(r_off), median(r_on));
        println!("path={path} off={a:.0} on={b:.0} ratio={:.3}", b / a);
    }
    events.close().await;
    let (record, json, ship) = micro(&file).await;
    println!("micro record_ns={record:.0} json_ns={json:.0} ship_ns={ship:.0}");
    let s = events.stats();
    eprintln!(
        "observe: deny events recorded {} shipped {} dropped {} sink errors {}",
        s.recorded, s.shipped, s.dropped, s.sink_errors
    );
    let _ = std::fs::remove_file(&file);
}

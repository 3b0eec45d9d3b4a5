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
//! (the medians of the rounds).

use std::time::{Duration, Instant};

use redis_ratelimit_client::{Client, DenyEvents, Limiter, Metrics, Rule, RuleSet, Sink};

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
    let s = events.stats();
    eprintln!(
        "observe: deny events recorded {} shipped {} dropped {} sink errors {}",
        s.recorded, s.shipped, s.dropped, s.sink_errors
    );
    let _ = std::fs::remove_file(&file);
}

//! One instance of an application sharing ONE global limit with others:
//! offers decisions at a fixed rate for a while on a token bucket rule,
//! one key, batched, striped or both, and prints what happened as one JSON
//! line. The kit's grants tests run several of these as processes; so does
//! bench/grants/run.sh.
//!
//! ```sh
//! grants_load --nodes redis://127.0.0.1:7000/[,redis://...] --mode batched \
//!     --capacity 400 --refill-count 40 --refill-ms 10 --rate 2000 --duration-ms 5000
//! ```
//! Options (all `--name value`):
//! - `nodes`: one URL (standalone) or several, comma-separated (a cluster;
//!   `--cluster 1` makes one URL a cluster's);
//! - `mode`: `one` (one key, a call per decision), `batched`, `striped`,
//!   `batched-striped`; `stripes` (3), `hold-ms` (50), `max-share-pct` (10);
//! - `key` (`grants:global`), `capacity`, `refill-count`, `refill-ms`;
//! - `rate`: decisions offered per second; `tasks`: concurrent deciders
//!   (8); `duration-ms`; `start-at-ms`: a Unix time to start at (to start
//!   several processes together);
//! - `pause-after-ms`: stop deciding then, print a line `{"paused":true,
//!   "admitted":..,"held":..}` and hold the units until killed.
//!
//! The line: `decisions`, `admitted`, `denied`, `redis_calls` (limiter calls
//! and `REFUND`s), `grant_asks`, `grant_units`, `grant_refunds`,
//! `stripe_spills`, `fallback`, `held_at_exit` (before `close`),
//! `elapsed_ms`, and `admitted_per_s` / `decisions_per_s` (one per second
//! of the run, from its start).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use redis_ratelimit_client::{Batch, Client, FallbackMode, Limiter, Rule};

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

#[tokio::main(flavor = "multi_thread", worker_threads = 1)]
async fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut opts: HashMap<String, String> = HashMap::new();
    for pair in args.chunks(2) {
        match pair {
            [k, v] if k.starts_with("--") => {
                opts.insert(k.trim_start_matches("--").to_string(), v.clone());
            }
            _ => {
                eprintln!("grants_load: options go as --name value pairs, not {pair:?}");
                std::process::exit(2);
            }
        }
    }
    let get = |k: &str, d: &str| opts.get(k).cloned().unwrap_or_else(|| d.to_string());
    let num = |k: &str, d: u64| -> u64 {
        let v = get(k, &d.to_string());
        v.parse().unwrap_or_else(|_| {
            eprintln!("grants_load: --{k} must be an integer, not {v:?}");
            std::process::exit(2);
        })
    };
    let nodes = get("nodes", "redis://127.0.0.1:6379/");
    let urls: Vec<&str> = nodes.split(',').collect();
    let mode = get("mode", "batched");
    let key = get("key", "grants:global");
    let (capacity, refill_count, refill_ms) = (
        num("capacity", 400),
        num("refill-count", 40),
        num("refill-ms", 10),
    );
    let rate = num("rate", 1000).max(1);
    let tasks = num("tasks", 8).max(1);
    let duration = Duration::from_millis(num("duration-ms", 5000));
    let pause_after = opts.get("pause-after-ms").map(|_| num("pause-after-ms", 0));
    let batch = Batch {
        hold_ms: num("hold-ms", 50),
        max_share_pct: num("max-share-pct", 10),
    };

    let client = if urls.len() > 1 || num("cluster", 0) == 1 {
        Client::cluster(&urls).await
    } else {
        Client::standalone(urls[0]).await
    };
    let client = match client {
        Ok(c) => c.with_deadline(Duration::from_secs(2)),
        Err(e) => {
            eprintln!("grants_load: {e}");
            std::process::exit(1);
        }
    };
    let rule = Rule::token_bucket(capacity, refill_count, refill_ms)
        .name("global")
        .fixed_key(key);
    let rule = match mode.as_str() {
        "one" => rule,
        "batched" => rule.batched_with(batch),
        "striped" => rule.striped(num("stripes", 3)),
        "batched-striped" => rule.batched_with(batch).striped(num("stripes", 3)),
        other => {
            eprintln!(
                "grants_load: --mode is one, batched, striped or batched-striped, not {other:?}"
            );
            std::process::exit(2);
        }
    };
    // Fail closed: nothing is admitted that the server did not grant, so the
    // bound holds even when a busy machine misses a deadline.
    let limiter = Limiter::builder(client)
        .local_level(false)
        .deny_cache(false)
        .fallback(FallbackMode::FailClosed)
        .build();
    let set = match limiter.rule_set(vec![rule]).await {
        Ok(set) => Arc::new(set),
        Err(e) => {
            eprintln!("grants_load: {e}");
            std::process::exit(2);
        }
    };

    if let Some(at) = opts.get("start-at-ms").and_then(|v| v.parse::<u64>().ok()) {
        tokio::time::sleep(Duration::from_millis(at.saturating_sub(now_ms()))).await;
    }
    let seconds = (duration.as_millis() as usize).div_ceil(1000).max(1);
    let per_s: Arc<Vec<[AtomicU64; 2]>> = Arc::new(
        (0..seconds)
            .map(|_| [AtomicU64::new(0), AtomicU64::new(0)])
            .collect(),
    );
    let start = Instant::now();
    let stop_at = start + pause_after.map_or(duration, |p| Duration::from_millis(p).min(duration));
    let period = Duration::from_nanos(1_000_000_000 * tasks / rate);
    let mut workers = Vec::new();
    for t in 0..tasks {
        let (limiter, set, per_s) = (limiter.clone(), set.clone(), per_s.clone());
        workers.push(tokio::spawn(async move {
            // Task t decides at start + (t + k * tasks) / rate.
            let mut next = start + Duration::from_nanos(1_000_000_000 * t / rate);
            while next < stop_at {
                tokio::time::sleep_until(next.into()).await;
                let d = limiter.check(&set, "", 1).await;
                let s = (start.elapsed().as_millis() as usize / 1000).min(per_s.len() - 1);
                per_s[s][0].fetch_add(1, Ordering::Relaxed);
                if d.allowed {
                    per_s[s][1].fetch_add(1, Ordering::Relaxed);
                }
                next += period;
            }
        }));
    }
    for w in workers {
        let _ = w.await;
    }
    let elapsed = start.elapsed();
    let stats = limiter.stats();
    let decisions: u64 = per_s.iter().map(|c| c[0].load(Ordering::Relaxed)).sum();
    let admitted: u64 = per_s.iter().map(|c| c[1].load(Ordering::Relaxed)).sum();
    let held = limiter.held_units();
    if pause_after.is_some() {
        println!(
            "{{\"paused\":true,\"decisions\":{decisions},\"admitted\":{admitted},\"held\":{held},\"grant_units\":{},\"grant_refunded_units\":{}}}",
            stats.grant_units, stats.grant_refunded_units
        );
        // Hold the units until killed.
        loop {
            tokio::time::sleep(Duration::from_secs(3600)).await;
        }
    }
    limiter.close().await;
    let after = limiter.stats();
    let list = |i: usize| {
        per_s
            .iter()
            .map(|c| c[i].load(Ordering::Relaxed).to_string())
            .collect::<Vec<_>>()
            .join(",")
    };
    println!(
        "{{\"mode\":\"{mode}\",\"decisions\":{decisions},\"admitted\":{admitted},\"denied\":{},\"redis_calls\":{},\"grant_asks\":{},\"grant_units\":{},\"grant_refunds\":{},\"grant_refunded_units\":{},\"stripe_spills\":{},\"fallback\":{},\"held_at_exit\":{held},\"elapsed_ms\":{},\"admitted_per_s\":[{}],\"decisions_per_s\":[{}]}}",
        decisions - admitted,
        after.redis_calls + after.grant_refunds,
        after.grant_asks,
        after.grant_units,
        after.grant_refunds,
        after.grant_refunded_units,
        after.stripe_spills,
        after.fallback_admitted + after.fallback_denied,
        elapsed.as_millis(),
        list(1),
        list(0),
    );
}

//! The round trip of one limiter call, measured to choose the default
//! deadline (docs/clients.md, "Deadline, fallback and the over-admission
//! bound"):
//!
//! ```sh
//! roundtrip URL [CALLS] [DEADLINE_MS]
//! ```
//! Connects as an application does (`Client::standalone`: `PING` and
//! `MODULE LIST` at start-up), then sends `CALLS` (20,000) `RL.SLIDING`
//! calls one after another, each timed from the call to its decision, with
//! a deadline far above any answer (10 s) so that none is cut short. Prints
//! one line: the first call, p50, p99, p99.9 and max in microseconds, and
//! how many took longer than `DEADLINE_MS` (100).

use std::time::{Duration, Instant};

use redis_ratelimit_client::{Client, Request};

fn arg(args: &[String], i: usize, default: u64) -> u64 {
    args.get(i).and_then(|a| a.parse().ok()).unwrap_or(default)
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    let url = args.get(1).expect("URL");
    let calls = arg(&args, 2, 20_000).max(1);
    let deadline_us = arg(&args, 3, 100) * 1000;

    let started = Instant::now();
    let client = Client::standalone(url)
        .await
        .expect("a server with the module")
        .with_deadline(Duration::from_secs(10));
    let connect_us = started.elapsed().as_micros() as u64;

    let mut latencies = Vec::with_capacity(calls as usize);
    for i in 0..calls {
        let key = format!("rt:{}", i % 1000);
        let sent = Instant::now();
        client
            .sliding(&key, 100_000, 60_000, Request::Cost(1))
            .await
            .expect("an answer within 10 s");
        latencies.push(sent.elapsed().as_micros() as u64);
    }
    let first = latencies[0];
    let over = latencies.iter().filter(|&&l| l > deadline_us).count();
    latencies.sort_unstable();
    let pct = |p: f64| latencies[((latencies.len() as f64 * p) as usize).min(latencies.len() - 1)];
    println!(
        "calls={} connect_us={connect_us} first_us={first} p50_us={} p99_us={} p999_us={} \
         max_us={} over_deadline={over}",
        latencies.len(),
        pct(0.5),
        pct(0.99),
        pct(0.999),
        latencies[latencies.len() - 1],
    );
}

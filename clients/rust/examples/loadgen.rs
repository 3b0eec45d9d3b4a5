//! A small HTTP load generator for the kit's benchmark (clients/rust/bench.sh):
//! keep-alive HTTP/1.1 connections, a fixed number of requests, each with an
//! `x-user` header drawn from a skewed mix.
//!
//! ```sh
//! loadgen URL REQUESTS CONCURRENCY USERS SKEW
//! ```
//! `SKEW` is the share (0 to 1) of requests sent as the one abusive user
//! `evil`; the others spread over `USERS` users. Prints one line:
//! `requests= seconds= rps= p50_us= p99_us= ok= limited= other=`.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;

fn arg<T: std::str::FromStr>(args: &[String], i: usize, default: T) -> T {
    args.get(i).and_then(|a| a.parse().ok()).unwrap_or(default)
}

#[tokio::main(flavor = "multi_thread", worker_threads = 1)]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    let url: Arc<str> = args.get(1).expect("URL").as_str().into();
    let requests: u64 = arg(&args, 2, 10_000);
    let concurrency: u64 = arg(&args, 3, 32);
    let users: u64 = arg(&args, 4, 1000).max(1);
    let skew: f64 = arg(&args, 5, 0.0);

    let client: Client<_, Empty<Bytes>> = Client::builder(TokioExecutor::new()).build_http();
    let next = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    let mut workers = Vec::new();
    for w in 0..concurrency {
        let (client, next, url) = (client.clone(), next.clone(), url.clone());
        workers.push(tokio::spawn(async move {
            let mut latencies = Vec::new();
            let mut counts = [0u64; 3];
            let mut x = 0x9E37_79B9_7F4A_7C15u64 ^ (w + 1);
            loop {
                let n = next.fetch_add(1, Ordering::Relaxed);
                if n >= requests {
                    break;
                }
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                let draw = (x >> 11) as f64 / (1u64 << 53) as f64;
                let user = if draw < skew {
                    "evil".to_string()
                } else {
                    format!("user{}", x % users)
                };
                let req = http::Request::get(&*url)
                    .header("x-user", user)
                    .body(Empty::new())
                    .unwrap();
                let sent = Instant::now();
                let status = match client.request(req).await {
                    Ok(resp) => {
                        let status = resp.status().as_u16();
                        let _ = resp.into_body().collect().await;
                        status
                    }
                    Err(_) => 0,
                };
                latencies.push(sent.elapsed().as_micros() as u64);
                counts[match status {
                    200 => 0,
                    429 => 1,
                    _ => 2,
                }] += 1;
            }
            (latencies, counts)
        }));
    }
    let mut latencies = Vec::new();
    let mut counts = [0u64; 3];
    for w in workers {
        let (l, c) = w.await.unwrap();
        latencies.extend(l);
        for i in 0..3 {
            counts[i] += c[i];
        }
    }
    let seconds = start.elapsed().as_secs_f64();
    latencies.sort_unstable();
    let pct = |p: f64| latencies[((latencies.len() as f64 * p) as usize).min(latencies.len() - 1)];
    println!(
        "requests={} seconds={:.3} rps={:.0} p50_us={} p99_us={} ok={} limited={} other={}",
        latencies.len(),
        seconds,
        latencies.len() as f64 / seconds,
        pct(0.5),
        pct(0.99),
        counts[0],
        counts[1],
        counts[2]
    );
}

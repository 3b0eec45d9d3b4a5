//! A load generator for any RLS v3 server (`ShouldRateLimit`): ours or
//! envoyproxy/ratelimit. bench/rls/run.sh runs it against both, side by
//! side; it prints what happened as one JSON line.
//!
//! ```sh
//! rls_load --addr 127.0.0.1:8081 --conns 4 --inflight 16 --duration-ms 5000 \
//!     --domain bench --descriptors 3
//! rls_load --addr 127.0.0.1:8081 --mode boundary --domain boundary --keys fixed \
//!     --rate 2000 --cycles 4
//! ```
//! Options (all `--name value`):
//! - `addr`: the server's gRPC address, `host:port` or `http://host:port`;
//! - `conns`: HTTP/2 connections (4); `inflight`: calls in flight on each (16);
//! - `domain` (`bench`); `keys`: the descriptors' keys, comma-separated
//!   (`k1,...,k8`); `descriptors`: how many of them each request carries (all);
//!   `values`: distinct values per key (1000): each request picks one at
//!   random (one "user"), the same for all its descriptors;
//! - `hits`: the request's `hits_addend` (unset when 0, the default);
//! - `wait-ms`: first wait this long at most for the server to answer a
//!   call with no error (not counted), then start (0: start at once);
//! - `mode`: `throughput` (default): calls as fast as the server answers,
//!   for `duration-ms` (5000);
//!   `boundary`: offered load across window boundaries: `cycles` bursts (4)
//!   of `rate` calls per second (2000) for `on-ms` (1000), each starting
//!   `phase-ms` (500) after a second of the wall clock, so that a burst
//!   straddles the boundary of the windows aligned to seconds, and `off-ms`
//!   (2000) of quiet between bursts, so each starts on empty windows. Calls
//!   are sent on schedule, whatever the replies' latency.
//!
//! The line: `mode`, `calls`, `calls_per_s`, `ok`, `over_limit`, `errors`,
//! `first_error`, `p50_us`, `p99_us` (latency of the calls answered, error
//! or not), `elapsed_ms`, `descriptors`; in boundary mode also `bin_ms`
//! (100), `admitted_bins` (calls answered OK per 100 ms bin, by the time each
//! was sent, from the first burst's start: bins align with the wall clock's
//! tenths of a second), `max_1s_admitted` (the most in any 10 consecutive
//! bins) and `offered`.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use redis_ratelimit_rls::proto::rate_limit_descriptor::Entry;
use redis_ratelimit_rls::proto::rate_limit_service_client::RateLimitServiceClient;
use redis_ratelimit_rls::proto::{RateLimitDescriptor, RateLimitRequest};
use tonic::transport::{Channel, Endpoint};

/// `RateLimitResponse.Code`'s values (rls.proto).
const CODE_OK: i32 = 1;
const CODE_OVER_LIMIT: i32 = 2;
const BIN_MS: u64 = 100;

fn fail(message: impl std::fmt::Display) -> ! {
    eprintln!("rls_load: {message}");
    std::process::exit(2);
}

struct Opts(HashMap<String, String>);

impl Opts {
    fn parse() -> Opts {
        let args: Vec<String> = std::env::args().skip(1).collect();
        let mut map = HashMap::new();
        for pair in args.chunks(2) {
            match pair {
                [k, v] if k.starts_with("--") => {
                    map.insert(k.trim_start_matches("--").to_string(), v.clone());
                }
                _ => fail(format!("options go as --name value pairs, not {pair:?}")),
            }
        }
        Opts(map)
    }

    fn get(&self, k: &str, d: &str) -> String {
        self.0.get(k).cloned().unwrap_or_else(|| d.to_string())
    }

    fn num(&self, k: &str, d: u64) -> u64 {
        let v = self.get(k, &d.to_string());
        v.parse()
            .unwrap_or_else(|_| fail(format!("--{k} must be an unsigned integer, not {v:?}")))
    }
}

/// What one task saw.
#[derive(Default)]
struct Tally {
    ok: u64,
    over_limit: u64,
    errors: u64,
    first_error: Option<String>,
    latencies_us: Vec<u32>,
    /// Boundary mode: calls answered OK, by the bin they were sent in.
    admitted_bins: Vec<u64>,
}

impl Tally {
    fn merge(&mut self, other: Tally) {
        self.ok += other.ok;
        self.over_limit += other.over_limit;
        self.errors += other.errors;
        if self.first_error.is_none() {
            self.first_error = other.first_error;
        }
        self.latencies_us.extend(other.latencies_us);
        if self.admitted_bins.len() < other.admitted_bins.len() {
            self.admitted_bins.resize(other.admitted_bins.len(), 0);
        }
        for (i, n) in other.admitted_bins.into_iter().enumerate() {
            self.admitted_bins[i] += n;
        }
    }

    /// Records one answered call; returns whether it was admitted.
    fn record(
        &mut self,
        started: Instant,
        reply: Result<
            tonic::Response<redis_ratelimit_rls::proto::RateLimitResponse>,
            tonic::Status,
        >,
    ) -> bool {
        let us = started.elapsed().as_micros().min(u32::MAX as u128) as u32;
        self.latencies_us.push(us);
        match reply {
            Ok(r) => match r.into_inner().overall_code {
                CODE_OK => {
                    self.ok += 1;
                    return true;
                }
                CODE_OVER_LIMIT => self.over_limit += 1,
                other => self.error(format!("overall_code {other}")),
            },
            Err(status) => self.error(format!("{:?}: {}", status.code(), status.message())),
        }
        false
    }

    fn error(&mut self, message: String) {
        self.errors += 1;
        if self.first_error.is_none() {
            self.first_error = Some(message);
        }
    }
}

/// A small xorshift generator: which value a request carries (no need
/// for a cryptographic or even a good one, only a spread over the keys).
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n.max(1)
    }
}

struct Shape {
    domain: String,
    keys: Vec<String>,
    values: u64,
    hits: u32,
}

impl Shape {
    fn request(&self, rng: &mut Rng) -> RateLimitRequest {
        let value = format!("u{}", rng.below(self.values));
        RateLimitRequest {
            domain: self.domain.clone(),
            descriptors: self
                .keys
                .iter()
                .map(|key| RateLimitDescriptor {
                    entries: vec![Entry {
                        key: key.clone(),
                        value: value.clone(),
                    }],
                    ..Default::default()
                })
                .collect(),
            hits_addend: self.hits,
        }
    }
}

fn json_string(s: &str) -> String {
    serde_json::Value::String(s.to_owned()).to_string()
}

fn percentile(sorted: &[u32], p: f64) -> u32 {
    if sorted.is_empty() {
        return 0;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

async fn connect(addr: &str) -> Channel {
    let uri = if addr.contains("://") {
        addr.to_string()
    } else {
        format!("http://{addr}")
    };
    let endpoint = Endpoint::from_shared(uri.clone())
        .unwrap_or_else(|e| fail(format!("--addr {addr:?}: {e}")))
        .tcp_nodelay(true)
        .connect_timeout(Duration::from_secs(2));
    endpoint
        .connect()
        .await
        .unwrap_or_else(|e| fail(format!("cannot connect to {uri}: {e}")))
}

/// Polls until a call is answered without an error, or `wait` passes.
async fn wait_ready(addr: &str, shape: &Shape, wait: Duration) {
    let deadline = Instant::now() + wait;
    let mut last = String::from("no attempt");
    while Instant::now() < deadline {
        let uri = if addr.contains("://") {
            addr.to_string()
        } else {
            format!("http://{addr}")
        };
        if let Ok(endpoint) = Endpoint::from_shared(uri) {
            match endpoint.connect().await {
                Ok(channel) => {
                    let mut client = RateLimitServiceClient::new(channel);
                    // A check only: nothing counted before the run.
                    let mut request = shape.request(&mut Rng(7));
                    for d in &mut request.descriptors {
                        d.hits_addend = Some(0);
                    }
                    match client.should_rate_limit(request).await {
                        Ok(_) => return,
                        Err(status) => last = format!("{:?}: {}", status.code(), status.message()),
                    }
                }
                Err(e) => last = e.to_string(),
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    fail(format!("{addr} did not answer within {wait:?}: {last}"));
}

async fn throughput(
    channels: Vec<Channel>,
    inflight: u64,
    duration: Duration,
    shape: Arc<Shape>,
) -> (Tally, Duration) {
    let start = Instant::now();
    let end = start + duration;
    let mut tasks = Vec::new();
    for (c, channel) in channels.into_iter().enumerate() {
        for i in 0..inflight {
            let mut client = RateLimitServiceClient::new(channel.clone());
            let shape = shape.clone();
            let mut rng = Rng(0x9E37_79B9_7F4A_7C15 ^ ((c as u64) << 32 | (i + 1)));
            tasks.push(tokio::spawn(async move {
                let mut tally = Tally::default();
                while Instant::now() < end {
                    let request = shape.request(&mut rng);
                    let started = Instant::now();
                    let reply = client.should_rate_limit(request).await;
                    tally.record(started, reply);
                }
                tally
            }));
        }
    }
    let mut tally = Tally::default();
    for t in tasks {
        tally.merge(
            t.await
                .unwrap_or_else(|e| fail(format!("a load task failed: {e}"))),
        );
    }
    (tally, start.elapsed())
}

struct Bursts {
    rate: u64,
    cycles: u64,
    on: Duration,
    off: Duration,
    phase: Duration,
}

async fn boundary(channels: Vec<Channel>, b: Bursts, shape: Arc<Shape>) -> (Tally, Duration, u64) {
    // The first burst starts phase-ms after a second of the wall clock,
    // at least half a second from now (time to set up).
    let now_wall = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_else(|e| fail(format!("the clock is before 1970: {e}")));
    let now = Instant::now();
    let ready_wall = now_wall + Duration::from_millis(500);
    let mut first_wall = Duration::from_secs(ready_wall.as_secs()) + b.phase;
    while first_wall < ready_wall {
        first_wall += Duration::from_secs(1);
    }
    let t0 = now + (first_wall - now_wall);
    let per_burst = b.rate * b.on.as_millis() as u64 / 1000;
    let cycle = b.on + b.off;
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<Tally>();
    let clients: Vec<_> = channels
        .into_iter()
        .map(RateLimitServiceClient::new)
        .collect();
    let mut rng = Rng(0x2545_F491_4F6C_DD1D);
    let mut sent = 0u64;
    for c in 0..b.cycles {
        let burst_start = t0 + cycle * c as u32;
        for i in 0..per_burst {
            let at = burst_start + Duration::from_nanos(i * 1_000_000_000 / b.rate.max(1));
            tokio::time::sleep_until(at.into()).await;
            let mut client = clients[(sent % clients.len() as u64) as usize].clone();
            sent += 1;
            let request = shape.request(&mut rng);
            let tx = tx.clone();
            tokio::spawn(async move {
                let started = Instant::now();
                let bin =
                    (started.saturating_duration_since(t0).as_millis() as u64 / BIN_MS) as usize;
                let reply = client.should_rate_limit(request).await;
                let mut tally = Tally::default();
                if tally.record(started, reply) {
                    tally.admitted_bins.resize(bin + 1, 0);
                    tally.admitted_bins[bin] = 1;
                }
                let _ = tx.send(tally);
            });
        }
    }
    drop(tx);
    let mut tally = Tally::default();
    while let Some(t) = rx.recv().await {
        tally.merge(t);
    }
    (tally, t0.elapsed(), sent)
}

#[tokio::main]
async fn main() {
    let opts = Opts::parse();
    let known = [
        "addr",
        "conns",
        "inflight",
        "domain",
        "keys",
        "descriptors",
        "values",
        "hits",
        "wait-ms",
        "mode",
        "duration-ms",
        "rate",
        "cycles",
        "on-ms",
        "off-ms",
        "phase-ms",
    ];
    if let Some(k) = opts.0.keys().find(|k| !known.contains(&k.as_str())) {
        fail(format!("unknown option --{k}"));
    }
    let addr = opts.get("addr", "127.0.0.1:8081");
    let conns = opts.num("conns", 4).max(1);
    let inflight = opts.num("inflight", 16).max(1);
    let all_keys: Vec<String> = opts
        .get("keys", "k1,k2,k3,k4,k5,k6,k7,k8")
        .split(',')
        .map(str::to_string)
        .collect();
    if all_keys.iter().any(String::is_empty) {
        fail("--keys has an empty key");
    }
    let n = opts.num("descriptors", all_keys.len() as u64) as usize;
    if n == 0 || n > all_keys.len() {
        fail(format!(
            "--descriptors {n}: between 1 and the number of --keys ({})",
            all_keys.len()
        ));
    }
    let hits =
        u32::try_from(opts.num("hits", 0)).unwrap_or_else(|_| fail("--hits must fit in 32 bits"));
    let shape = Arc::new(Shape {
        domain: opts.get("domain", "bench"),
        keys: all_keys[..n].to_vec(),
        values: opts.num("values", 1000).max(1),
        hits,
    });
    let wait = opts.num("wait-ms", 0);
    if wait > 0 {
        wait_ready(&addr, &shape, Duration::from_millis(wait)).await;
    }
    let mut channels = Vec::new();
    for _ in 0..conns {
        channels.push(connect(&addr).await);
    }
    let mode = opts.get("mode", "throughput");
    let (mut tally, elapsed, offered) = match mode.as_str() {
        "throughput" => {
            let duration = Duration::from_millis(opts.num("duration-ms", 5000));
            let (t, e) = throughput(channels, inflight, duration, shape.clone()).await;
            (t, e, 0)
        }
        "boundary" => {
            let bursts = Bursts {
                rate: opts.num("rate", 2000).max(1),
                cycles: opts.num("cycles", 4).max(1),
                on: Duration::from_millis(opts.num("on-ms", 1000).max(1)),
                off: Duration::from_millis(opts.num("off-ms", 2000)),
                phase: Duration::from_millis(opts.num("phase-ms", 500) % 1000),
            };
            boundary(channels, bursts, shape.clone()).await
        }
        other => fail(format!("--mode is throughput or boundary, not {other:?}")),
    };
    tally.latencies_us.sort_unstable();
    let calls = tally.ok + tally.over_limit + tally.errors;
    let secs = elapsed.as_secs_f64().max(1e-9);
    let mut line = format!(
        "{{\"mode\":{},\"descriptors\":{},\"calls\":{},\"calls_per_s\":{},\"ok\":{},\"over_limit\":{},\"errors\":{},\"first_error\":{},\"p50_us\":{},\"p99_us\":{},\"elapsed_ms\":{}",
        json_string(&mode),
        n,
        calls,
        (calls as f64 / secs).round() as u64,
        tally.ok,
        tally.over_limit,
        tally.errors,
        tally.first_error.as_deref().map_or("null".to_string(), json_string),
        percentile(&tally.latencies_us, 50.0),
        percentile(&tally.latencies_us, 99.0),
        elapsed.as_millis(),
    );
    if mode == "boundary" {
        let bins = &tally.admitted_bins;
        let window = (1000 / BIN_MS) as usize;
        let max_1s = (0..bins.len())
            .map(|i| bins[i..(i + window).min(bins.len())].iter().sum::<u64>())
            .max()
            .unwrap_or(0);
        let list: Vec<String> = bins.iter().map(u64::to_string).collect();
        line.push_str(&format!(
            ",\"offered\":{offered},\"bin_ms\":{BIN_MS},\"max_1s_admitted\":{max_1s},\"admitted_bins\":[{}]",
            list.join(",")
        ));
    }
    line.push('}');
    println!("{line}");
}

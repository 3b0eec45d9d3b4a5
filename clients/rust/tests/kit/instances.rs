//! Three instances of the example service, as real processes, share one
//! redis-server; 200 concurrent HTTP clients hit them. An exact sliding
//! window admits exactly its limit, the denials carry the right fields, and
//! a window boundary adds no burst.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::harness::{Http, Kind, Server, Service};

fn three_instances(server: &Server, limit: u64, window_ms: u64) -> Vec<Service> {
    (0..3)
        .map(|_| {
            Service::start(&[
                ("RL_URL", server.url()),
                ("RL_INSTANCES", "3".into()),
                ("RL_DEADLINE_MS", "5000".into()),
                ("RL_USER_LIMIT", limit.to_string()),
                ("RL_USER_WINDOW_MS", window_ms.to_string()),
            ])
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_instances_admit_exactly_the_limit_of_a_sliding_window() {
    let server = Server::start(Kind::Redis);
    let services = three_instances(&server, 100, 60_000);
    let urls: Arc<Vec<String>> = Arc::new(services.iter().map(|s| s.url("/")).collect());
    let http = Http::default();
    let mut clients = Vec::new();
    for c in 0..200 {
        let (http, urls) = (http.clone(), urls.clone());
        clients.push(tokio::spawn(async move {
            let mut out = Vec::new();
            for n in 0..3 {
                let r = http.get(&urls[(c + n) % 3], &[("x-user", "shared")]).await;
                out.push(r);
            }
            out
        }));
    }
    let mut admitted = 0;
    let mut denied = 0;
    for c in clients {
        for r in c.await.unwrap() {
            assert_eq!(
                r.header("ratelimit-policy"),
                Some("\"per-user\";q=100;w=60, \"global\";q=15000;w=1")
            );
            match r.status {
                200 => admitted += 1,
                429 => {
                    denied += 1;
                    let retry: u64 = r.header("retry-after").unwrap().parse().unwrap();
                    assert!((1..=60).contains(&retry), "{retry}");
                    let current = r.header("ratelimit").unwrap();
                    assert!(current.starts_with("\"per-user\";r=0;t="), "{current}");
                    assert!(
                        r.body.contains("\"violated-policies\":[\"per-user\"]"),
                        "{}",
                        r.body
                    );
                }
                other => panic!("status {other}"),
            }
        }
    }
    assert_eq!((admitted, denied), (100, 500));
    for s in &services {
        let stats = http.stats(s).await;
        assert_eq!(
            stats["fallback_admitted"] + stats["fallback_denied"],
            0,
            "{stats:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_window_boundary_adds_no_burst() {
    const LIMIT: usize = 20;
    let server = Server::start(Kind::Redis);
    let services = three_instances(&server, LIMIT as u64, 1000);
    let urls: Arc<Vec<String>> = Arc::new(services.iter().map(|s| s.url("/")).collect());
    let http = Http::default();
    let start = Instant::now();
    let mut clients = Vec::new();
    for c in 0..50 {
        let (http, urls) = (http.clone(), urls.clone());
        clients.push(tokio::spawn(async move {
            let mut admitted_at = Vec::new();
            let mut n = 0;
            while start.elapsed() < Duration::from_millis(2500) && n < 2000 {
                let sent = Instant::now();
                let r = http.get(&urls[(c + n) % 3], &[("x-user", "burst")]).await;
                if r.status == 200 {
                    // The admission happened between sending and receiving.
                    admitted_at.push((sent, Instant::now()));
                }
                n += 1;
            }
            admitted_at
        }));
    }
    let mut admitted = Vec::new();
    for c in clients {
        admitted.extend(c.await.unwrap());
    }
    assert!(admitted.len() >= 2 * LIMIT, "{} admitted", admitted.len());
    // An admission took place on the server between its request's sending
    // and its reply's receipt. Those that certainly took place within one
    // window from the sending of any of them are at most the limit: a
    // fixed window would admit twice the limit around its boundary.
    let window = Duration::from_millis(1000);
    for &(sent_i, _) in &admitted {
        let within = admitted
            .iter()
            .filter(|(sent_j, recv_j)| *sent_j >= sent_i && *recv_j < sent_i + window)
            .count();
        assert!(within <= LIMIT, "{within} admitted within one window");
    }
}

//! Redis goes away (`kill -9`) and comes back: every request is still
//! answered in each fallback mode; once the breaker is open only its probes
//! reach Redis and no call waits for its deadline (counters, not timings);
//! the local mode limits at the instance's share; after a restart, calls go
//! back to Redis.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use redis_ratelimit_client::{BreakerConfig, Client, FallbackMode, Limiter, Path, Rule};

use crate::harness::{wait_for, Http, Kind, Server, Service};

async fn redis_goes_away_and_comes_back(mode: FallbackMode) {
    let mut server = Server::start(Kind::Redis);
    let client = Client::standalone(&server.url()).await.unwrap();
    let lim = Limiter::builder(client)
        .deadline(Duration::from_millis(200))
        .fallback(mode)
        .instances(2)
        .deny_cache(false)
        .breaker(BreakerConfig {
            failures: 3,
            open_for: Duration::from_millis(200),
        })
        .build();
    let set = lim
        .rule_set(vec![Rule::sliding(10, 60_000).name("per-user")])
        .await
        .unwrap();
    for _ in 0..3 {
        let d = lim.check(&set, "before", 1).await;
        assert!(d.allowed && d.path == Path::Redis);
    }

    server.kill9();
    let mut n = 0;
    wait_for("the breaker to open", async || {
        n += 1;
        let d = lim.check(&set, &format!("during{n}"), 1).await;
        assert_eq!(d.path, Path::Fallback, "answered by the fallback: {d:?}");
        lim.stats().breaker_opened >= 1
    })
    .await;

    let before = lim.stats();
    let mut admitted = 0;
    for _ in 0..20 {
        let d = lim.check(&set, "x", 1).await;
        assert_eq!(d.path, Path::Fallback);
        admitted += d.allowed as u64;
        if !d.allowed {
            assert!(d.retry_after_s().is_some_and(|s| s >= 1));
        }
    }
    let after = lim.stats();
    assert_eq!(
        after.redis_calls, before.redis_calls,
        "only probes reach Redis"
    );
    assert_eq!(
        after.redis_timeouts, before.redis_timeouts,
        "no call waited for its deadline"
    );
    assert_eq!(after.breaker_skipped - before.breaker_skipped, 20);
    let expected = match mode {
        FallbackMode::FailOpen => 20,
        FallbackMode::FailClosed => 0,
        // ceil(10 / 2 * 1.1) = 6 for this instance.
        FallbackMode::LocalOnly => 6,
    };
    assert_eq!(admitted, expected, "{mode:?}");

    server.restart();
    wait_for("a probe to close the breaker", async || {
        lim.check(&set, "probing", 1).await;
        !lim.breaker_open()
    })
    .await;
    assert!(lim.stats().probes_ok >= 1 && lim.stats().probes >= 1);
    let (calls, seen) = (lim.stats().redis_calls, server.calls("rl.sliding"));
    let d = lim.check(&set, "after", 1).await;
    assert_eq!((d.allowed, d.path, d.remaining), (true, Path::Redis, 9));
    assert_eq!(lim.stats().redis_calls, calls + 1);
    assert_eq!(
        server.calls("rl.sliding"),
        seen + 1,
        "the new server saw the call"
    );
}

#[tokio::test]
async fn fail_open_admits_while_redis_is_away() {
    redis_goes_away_and_comes_back(FallbackMode::FailOpen).await;
}

#[tokio::test]
async fn fail_closed_denies_while_redis_is_away() {
    redis_goes_away_and_comes_back(FallbackMode::FailClosed).await;
}

#[tokio::test]
async fn local_only_limits_at_the_instance_share_while_redis_is_away() {
    redis_goes_away_and_comes_back(FallbackMode::LocalOnly).await;
}

/// The example service under load while its Redis is killed: every HTTP
/// request gets 200 or 429, never a 5xx.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_service_keeps_answering_http_when_redis_is_killed_mid_load() {
    let mut server = Server::start(Kind::Redis);
    let service = Service::start(&[
        ("RL_URL", server.url()),
        ("RL_FALLBACK", "local".into()),
        ("RL_DEADLINE_MS", "200".into()),
        ("RL_BREAKER_OPEN_MS", "200".into()),
        ("RL_USER_LIMIT", "1000".into()),
    ]);
    let http = Http::default();
    let stop = Arc::new(AtomicBool::new(false));
    let answered = Arc::new(AtomicU64::new(0));
    let mut load = Vec::new();
    for c in 0..20 {
        let (http, stop, answered) = (http.clone(), stop.clone(), answered.clone());
        let url = service.url("/");
        load.push(tokio::spawn(async move {
            let user = format!("c{c}");
            let mut n = 0u64;
            while !stop.load(Ordering::Relaxed) && n < 100_000 {
                let r = http.get(&url, &[("x-user", &user)]).await;
                assert!(
                    r.status == 200 || r.status == 429,
                    "status {}: {}",
                    r.status,
                    r.body
                );
                answered.fetch_add(1, Ordering::Relaxed);
                n += 1;
            }
        }));
    }
    wait_for("load to start", async || {
        answered.load(Ordering::Relaxed) > 200
    })
    .await;
    server.kill9();
    wait_for("the breaker to open", async || {
        http.stats(&service).await["breaker_opened"] >= 1
    })
    .await;
    let at_open = answered.load(Ordering::Relaxed);
    wait_for("requests answered meanwhile", async || {
        answered.load(Ordering::Relaxed) > at_open + 200
    })
    .await;
    let calls_while_down = http.stats(&service).await["redis_calls"];
    server.restart();
    // The kit's own counters, not the server's: a call that timed out while
    // Redis was down may still reach the new server from the client's queue.
    wait_for("the breaker's probe to find Redis again", async || {
        http.stats(&service).await["probes_ok"] >= 1
    })
    .await;
    wait_for("calls to go back to Redis", async || {
        http.stats(&service).await["redis_calls"] > calls_while_down && server.calls("rl.all") > 0
    })
    .await;
    stop.store(true, Ordering::Relaxed);
    for task in load {
        task.await.unwrap();
    }
    let stats = http.stats(&service).await;
    assert!(stats["fallback_admitted"] > 0, "{stats:?}");
}

//! Concurrency leases against real servers: the typed calls of
//! `RL.CONCURRENCY`, `RL.RELEASE` and `RL.RENEW`, never more than `limit`
//! leases held under concurrent use, a `LeaseGuard` releasing on drop and
//! renewing past `lease_ms`, and the layer's cap on requests in flight over
//! real HTTP.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::routing::get;
use axum::Router;
use redis_ratelimit_client::{
    Client, Error, Limiter, PolicyMode, RateLimitLayer, Request, Rule, RuleKind, Spec,
    QUOTA_EXCEEDED,
};
use tokio::sync::Notify;

use crate::harness::{wait_for, Http, Kind, Server};

async fn client(server: &Server) -> Client {
    Client::standalone(&server.url())
        .await
        .unwrap()
        .with_deadline(Duration::from_secs(5))
}

/// Units free on `key` now (`COST 0` takes nothing).
async fn free(client: &Client, key: &str, limit: u64) -> u64 {
    client
        .concurrency(key, limit, 60_000, Request::Cost(0))
        .await
        .unwrap()
        .remaining
}

async fn typed_calls(kind: Kind) {
    let server = Server::start(kind);
    let client = client(&server).await;

    let first = client
        .concurrency("jobs", 2, 60_000, Request::Cost(1))
        .await
        .unwrap();
    assert_eq!((first.allowed, first.limit, first.remaining), (true, 2, 1));
    let a = first.lease.expect("an admission carries its lease");
    let second = client
        .concurrency("jobs", 2, 60_000, Request::Cost(1))
        .await
        .unwrap();
    let b = second.lease.unwrap();
    assert!(b > a, "ids grow: {a} then {b}");
    assert_eq!(second.denied_by, None, "the sixth integer is the lease");
    let full = client
        .concurrency("jobs", 2, 60_000, Request::Cost(1))
        .await
        .unwrap();
    assert!(!full.allowed && full.lease.is_none() && full.remaining == 0);
    assert!(full.wait_ms > 0 && full.retry_after <= Duration::from_secs(60));
    let never = client
        .concurrency("jobs", 2, 60_000, Request::Cost(3))
        .await
        .unwrap();
    assert!(never.never());

    assert!(client.renew("jobs", a, 120_000).await.unwrap());
    assert!(client.release("jobs", a).await.unwrap());
    assert!(!client.release("jobs", a).await.unwrap(), "released once");
    assert!(!client.renew("jobs", a, 1000).await.unwrap());
    assert!(
        !client.release("jobs", 12345).await.unwrap(),
        "unknown lease"
    );
    assert!(!client.release("no-such-key", 1).await.unwrap());
    assert_eq!(free(&client, "jobs", 2).await, 1);

    // A CONCURRENCY policy through RL.HIT: the sixth integer is a lease.
    let spec = Spec::parse("p", "CONCURRENCY", &[1, 60_000]).unwrap();
    client
        .policy_set("reports", &spec, PolicyMode::Enforce, 100)
        .await
        .unwrap();
    let info = client.policy_get("reports").await.unwrap().unwrap();
    assert_eq!(info.spec, Some(spec));
    let hit = client
        .hit("reports", "reports:acme", Request::Cost(1))
        .await
        .unwrap();
    assert!(hit.allowed && hit.lease.is_some() && hit.denied_by.is_none());
    assert!(client
        .release("reports:acme", hit.lease.unwrap())
        .await
        .unwrap());

    // Bad input is refused before sending, naming the argument.
    let bad = |r: Result<(), Error>| match r {
        Err(Error::BadArgument { arg, .. }) => arg,
        other => panic!("{other:?}"),
    };
    assert_eq!(
        bad(client
            .concurrency("k", 0, 1000, Request::Cost(1))
            .await
            .map(drop)),
        "limit"
    );
    assert_eq!(
        bad(client
            .concurrency("k", 1, 0, Request::Cost(1))
            .await
            .map(drop)),
        "lease_ms"
    );
    assert_eq!(bad(client.release("k", u64::MAX).await.map(drop)), "lease");
    assert_eq!(bad(client.renew("k", 1, 0).await.map(drop)), "lease_ms");
    assert_eq!(
        bad(client.lease("k", 1, 1000, 0, None).await.map(drop)),
        "COST"
    );
    let conc = RuleKind::Inline(spec);
    assert_eq!(
        bad(client.all(&[("k", &conc)], 1).await.map(drop)),
        "CONCURRENCY"
    );
    // A key of another algorithm: the server's WRONGTYPE.
    client
        .sliding("sl", 5, 1000, Request::Cost(1))
        .await
        .unwrap();
    assert!(matches!(
        client.concurrency("sl", 5, 1000, Request::Cost(1)).await,
        Err(Error::Server(m)) if m.starts_with("WRONGTYPE")
    ));
}

#[tokio::test]
async fn concurrency_release_and_renew_answer_typed_on_redis() {
    typed_calls(Kind::Redis).await;
}

#[tokio::test]
async fn concurrency_release_and_renew_answer_typed_on_valkey() {
    typed_calls(Kind::Valkey).await;
}

/// 24 tasks take and give back leases of a limit of 3 as fast as they can:
/// the holders counted between grant and release never exceed 3.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn never_more_than_limit_leases_are_held_under_concurrent_use() {
    let server = Server::start(Kind::Redis);
    let client = client(&server).await;
    let held = Arc::new(AtomicU64::new(0));
    let most = Arc::new(AtomicU64::new(0));
    let granted = Arc::new(AtomicU64::new(0));
    let denied = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    for _ in 0..24 {
        let (client, held, most, granted, denied) = (
            client.clone(),
            held.clone(),
            most.clone(),
            granted.clone(),
            denied.clone(),
        );
        tasks.push(tokio::spawn(async move {
            for _ in 0..40 {
                match client.lease("pool", 3, 30_000, 1, None).await {
                    Ok(guard) => {
                        let now = held.fetch_add(1, Ordering::SeqCst) + 1;
                        most.fetch_max(now, Ordering::SeqCst);
                        granted.fetch_add(1, Ordering::Relaxed);
                        tokio::task::yield_now().await;
                        held.fetch_sub(1, Ordering::SeqCst);
                        assert!(guard.release().await.unwrap(), "still held");
                    }
                    Err(Error::Denied(d)) => {
                        assert!(!d.allowed && d.remaining == 0);
                        denied.fetch_add(1, Ordering::Relaxed);
                    }
                    Err(e) => panic!("{e}"),
                }
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let most = most.load(Ordering::SeqCst);
    assert!(most <= 3, "{most} held at once");
    assert!(granted.load(Ordering::Relaxed) > 0);
    assert!(denied.load(Ordering::Relaxed) > 0, "the limit was reached");
    assert_eq!(free(&client, "pool", 3).await, 3, "every lease given back");
}

#[tokio::test]
async fn a_dropped_guard_releases_its_lease() {
    let server = Server::start(Kind::Redis);
    let client = client(&server).await;
    let guard = client.lease("one", 1, 60_000, 1, None).await.unwrap();
    assert!(guard.id().is_some() && guard.key() == "one");
    match client.lease("one", 1, 60_000, 1, None).await {
        Err(Error::Denied(d)) => assert!(!d.allowed && d.wait_ms > 0, "{d:?}"),
        other => panic!("{other:?}"),
    }
    drop(guard);
    // The release is sent from a spawned task: the unit comes back soon,
    // long before the lease's 60 s.
    wait_for("the dropped guard's release", async || {
        free(&client, "one", 1).await == 1
    })
    .await;
    let again = client.lease("one", 1, 60_000, 1, None).await.unwrap();
    assert!(again.release().await.unwrap(), "an explicit release");
    assert_eq!(free(&client, "one", 1).await, 1);

    // A guard dropped by a cancelled task (the work aborted) releases too.
    let held = client.lease("one", 1, 60_000, 1, None).await.unwrap();
    let task = tokio::spawn(async move {
        let _held = held;
        std::future::pending::<()>().await;
    });
    assert_eq!(free(&client, "one", 1).await, 0);
    task.abort();
    wait_for("the aborted task's release", async || {
        free(&client, "one", 1).await == 1
    })
    .await;
}

/// A lease of 600 ms held for 3 s: the guard's renewals keep it, and the
/// unit stays taken until the guard goes.
#[tokio::test]
async fn a_held_guard_renews_its_lease_past_lease_ms() {
    let server = Server::start(Kind::Redis);
    let client = client(&server).await;
    let guard = client.lease("long", 1, 600, 1, None).await.unwrap();
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(3) {
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert_eq!(
            free(&client, "long", 1).await,
            0,
            "still held after {:?}",
            start.elapsed()
        );
    }
    assert!(!guard.lost());
    assert!(guard.release().await.unwrap(), "held to the end");
    assert_eq!(free(&client, "long", 1).await, 1);
}

#[tokio::test]
async fn a_policy_lease_renews_with_the_policy_lease_ms() {
    let server = Server::start(Kind::Redis);
    let client = client(&server).await;
    let spec = Spec::parse("p", "CONCURRENCY", &[1, 600]).unwrap();
    client
        .policy_set("exports", &spec, PolicyMode::Enforce, 100)
        .await
        .unwrap();
    let guard = client
        .lease_policy("exports", "exports:acme", 1, None)
        .await
        .unwrap();
    assert!(matches!(
        client
            .lease_policy("exports", "exports:acme", 1, None)
            .await,
        Err(Error::Denied(_))
    ));
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(!guard.lost(), "renewed past 600 ms");
    assert!(guard.release().await.unwrap());
    let again = client
        .lease_policy("exports", "exports:acme", 1, None)
        .await
        .unwrap();
    drop(again);
}

/// `GET /slow` waits until the test opens the gate; the layer caps it at
/// `limit` in flight per user.
async fn serve_capped(server: &Server, limit: u64) -> (String, Arc<AtomicUsize>, Arc<Notify>) {
    let client = Client::standalone(&server.url()).await.unwrap();
    let limiter = Limiter::builder(client)
        .deadline(Duration::from_secs(5))
        .build();
    let layer = RateLimitLayer::builder(limiter)
        .key(|req| {
            req.headers
                .get("x-user")
                .and_then(|v| v.to_str().ok())
                .map(String::from)
        })
        .concurrency(
            Rule::concurrency(limit, 30_000)
                .name("inflight")
                .key_prefix("rl:inflight:"),
        )
        .build()
        .await
        .unwrap();
    let entered = Arc::new(AtomicUsize::new(0));
    let gate = Arc::new(Notify::new());
    let (e, g) = (entered.clone(), gate.clone());
    let app = Router::new()
        .route(
            "/slow",
            get(move || {
                let (e, g) = (e.clone(), g.clone());
                async move {
                    let opened = g.notified();
                    e.fetch_add(1, Ordering::SeqCst);
                    opened.await;
                    "done"
                }
            }),
        )
        .route("/hang", get(std::future::pending::<&'static str>))
        .layer(layer);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (format!("http://{addr}"), entered, gate)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_layer_caps_requests_in_flight_and_frees_them_when_done() {
    let server = Server::start(Kind::Redis);
    let (url, entered, gate) = serve_capped(&server, 3).await;
    let http = Http::default();
    let slow = format!("{url}/slow");

    // 8 slow requests at once: 3 enter the handler, the other 5 get 429 at once.
    let mut requests = Vec::new();
    for _ in 0..8 {
        let (http, slow) = (http.clone(), slow.clone());
        requests.push(tokio::spawn(async move {
            http.get(&slow, &[("x-user", "alice")]).await
        }));
    }
    let mut denied = Vec::new();
    let mut pending = Vec::new();
    for r in requests {
        // Finished ones are the denials; the admitted wait on the gate.
        pending.push(r);
    }
    wait_for("3 requests in the handler and 5 answered", async || {
        entered.load(Ordering::SeqCst) == 3
            && pending.iter().filter(|r| r.is_finished()).count() == 5
    })
    .await;
    let mut admitted = Vec::new();
    for r in pending {
        if r.is_finished() {
            denied.push(r.await.unwrap());
        } else {
            admitted.push(r);
        }
    }
    for r in &denied {
        assert_eq!(r.status, 429);
        assert_eq!(r.header("ratelimit-policy"), Some("\"inflight\";q=3"));
        let field = r.header("ratelimit").unwrap();
        assert!(field.starts_with("\"inflight\";r=0;t="), "{field}");
        let retry: u64 = r.header("retry-after").unwrap().parse().unwrap();
        assert!((1..=30).contains(&retry), "{retry}");
        let body: serde_json::Value = serde_json::from_str(&r.body).unwrap();
        assert_eq!(body["type"], QUOTA_EXCEEDED);
        assert_eq!(body["violated-policies"], serde_json::json!(["inflight"]));
    }
    // Another user has a cap of their own.
    let client = client(&server).await;
    assert_eq!(
        client
            .concurrency("rl:inflight:bob", 3, 30_000, Request::Cost(0))
            .await
            .unwrap()
            .remaining,
        3
    );
    assert_eq!(free(&client, "rl:inflight:alice", 3).await, 0);

    // Open the gate: the 3 finish, and their leases come back.
    gate.notify_waiters();
    for r in admitted {
        let r = r.await.unwrap();
        assert_eq!((r.status, r.body.as_str()), (200, "done"));
        assert_eq!(r.header("ratelimit-policy"), Some("\"inflight\";q=3"));
        assert!(r
            .header("ratelimit")
            .unwrap()
            .starts_with("\"inflight\";r="));
    }
    wait_for("every lease released", async || {
        free(&client, "rl:inflight:alice", 3).await == 3
    })
    .await;

    // A request whose client goes away gives its lease back too.
    let hang = format!("{url}/hang");
    let gone = {
        let http = http.clone();
        tokio::spawn(async move { http.get(&hang, &[("x-user", "carol")]).await })
    };
    wait_for("the hanging request's lease", async || {
        free(&client, "rl:inflight:carol", 3).await == 2
    })
    .await;
    gone.abort();
    wait_for("the lease of the request whose client left", async || {
        free(&client, "rl:inflight:carol", 3).await == 3
    })
    .await;
}

#[tokio::test]
async fn the_layer_refuses_a_cap_that_is_not_concurrency() {
    let server = Server::start(Kind::Redis);
    let client = client(&server).await;
    let limiter = Limiter::builder(client.clone()).build();
    let by_user = || {
        RateLimitLayer::builder(limiter.clone()).key(|req| {
            req.headers
                .get("x-user")
                .and_then(|v| v.to_str().ok())
                .map(String::from)
        })
    };
    let err = by_user()
        .concurrency(Rule::sliding(5, 1000).name("c"))
        .build()
        .await
        .err()
        .unwrap();
    assert!(
        matches!(&err, Error::BadArgument { arg, .. } if arg == "algorithm"),
        "{err}"
    );
    let err = by_user()
        .rule(Rule::concurrency(5, 1000).name("c"))
        .build()
        .await
        .err()
        .unwrap();
    assert!(
        matches!(&err, Error::BadArgument { arg, .. } if arg == "algorithm"),
        "{err}"
    );
    let err = by_user()
        .concurrency(Rule::concurrency(0, 1000).name("c"))
        .build()
        .await
        .err()
        .unwrap();
    assert!(
        matches!(&err, Error::BadArgument { arg, .. } if arg == "limit"),
        "{err}"
    );
    // A policy set as CONCURRENCY is accepted, and read once for the header.
    let spec = Spec::parse("p", "CONCURRENCY", &[4, 10_000]).unwrap();
    client
        .policy_set("uploads", &spec, PolicyMode::Enforce, 100)
        .await
        .unwrap();
    by_user()
        .rule(Rule::sliding(10, 1000).name("per-user"))
        .concurrency(Rule::policy("uploads").name("uploads"))
        .build()
        .await
        .unwrap();
}

/// Rate rules and a cap together: both items in the fields.
#[tokio::test]
async fn a_rate_rule_and_a_cap_report_both() {
    let server = Server::start(Kind::Redis);
    let client = Client::standalone(&server.url()).await.unwrap();
    let limiter = Limiter::builder(client)
        .deadline(Duration::from_secs(5))
        .build();
    let layer = RateLimitLayer::builder(limiter)
        .key(|_| Some("dave".into()))
        .rule(Rule::sliding(2, 60_000).name("per-user"))
        .concurrency(Rule::concurrency(5, 30_000).name("inflight"))
        .build()
        .await
        .unwrap();
    let app = Router::new()
        .route("/", get(|| async { "ok" }))
        .layer(layer);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    let http = Http::default();
    let url = format!("http://{addr}/");
    let r = http.get(&url, &[]).await;
    assert_eq!(r.status, 200);
    assert_eq!(
        r.header("ratelimit-policy"),
        Some("\"per-user\";q=2;w=60, \"inflight\";q=5")
    );
    let field = r.header("ratelimit").unwrap();
    assert!(
        field.starts_with("\"per-user\";r=1;t=") && field.contains(", \"inflight\";r=4;t="),
        "{field}"
    );
    assert_eq!(http.get(&url, &[]).await.status, 200);
    let r = http.get(&url, &[]).await;
    assert_eq!(r.status, 429, "the rate rule denies first");
    assert!(r
        .header("ratelimit")
        .unwrap()
        .starts_with("\"per-user\";r=0"));
}

//! Blocking acquires (`BLOCK`) against real servers: a blocked call is
//! admitted when the limiter allows, a timeout answers the denial at about
//! the timeout, a wait stalls none of the client's other calls, an admitted
//! leaky bucket resolves after its `wait_ms`, and a release wakes a waiting
//! lease at once. Bounds on time are generous: the machine is shared.

use std::time::{Duration, Instant};

use redis_ratelimit_client::{Client, Error, PolicyMode, Request, RuleKind, Spec};

use crate::harness::{wait_for, Kind, Server};

async fn client(server: &Server) -> Client {
    Client::standalone(&server.url())
        .await
        .unwrap()
        .with_deadline(Duration::from_secs(5))
}

/// Clients the server holds blocked now (`INFO clients`).
fn blocked(server: &Server) -> u64 {
    server
        .info("clients")
        .get("blocked_clients")
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

async fn blocks_then_is_admitted(kind: Kind) {
    let server = Server::start(kind);
    let client = client(&server).await;
    let spec = Spec::parse("t", "TOKENBUCKET", &[1, 1, 1000]).unwrap();
    assert!(
        client
            .apply("tb", &spec, Request::Cost(1))
            .await
            .unwrap()
            .allowed
    );
    let start = Instant::now();
    let d = client
        .acquire("tb", &spec, Request::Cost(1), Duration::from_secs(20))
        .await
        .unwrap();
    let waited = start.elapsed();
    assert!(d.allowed, "{d:?}");
    assert!(
        waited >= Duration::from_millis(500) && waited < Duration::from_secs(20),
        "admitted after {waited:?}, the token being 1 s away"
    );
}

#[tokio::test]
async fn a_blocking_acquire_waits_and_is_admitted_on_redis() {
    blocks_then_is_admitted(Kind::Redis).await;
}

#[tokio::test]
async fn a_blocking_acquire_waits_and_is_admitted_on_valkey() {
    blocks_then_is_admitted(Kind::Valkey).await;
}

#[tokio::test]
async fn a_timeout_answers_the_denial_at_about_the_timeout() {
    let server = Server::start(Kind::Redis);
    let client = client(&server).await;
    // A lease of 1 s that its guard keeps renewing: a waiter's wait_ms
    // (about 1 s) is within its 2.5 s timeout, so the server holds it, and
    // the renewals keep the unit until the timeout passes. The client's own
    // deadline is 5 ms: the acquire's is the timeout plus its margin.
    let held = client.lease("renewed", 1, 1000, 1, None).await.unwrap();
    let quick = client.with_deadline(Duration::from_millis(5));
    let start = Instant::now();
    let denied = quick
        .lease("renewed", 1, 1000, 1, Some(Duration::from_millis(2500)))
        .await;
    let waited = start.elapsed();
    match denied {
        Err(Error::Denied(d)) => assert!(!d.allowed && d.wait_ms > 0, "{d:?}"),
        other => panic!("{other:?}"),
    }
    assert!(
        waited >= Duration::from_millis(2000) && waited < Duration::from_secs(15),
        "the timeout's denial came after {waited:?}"
    );
    assert!(!held.lost());
    drop(held);

    // 2 per 3 s, both taken: the next unit is ~3 s away, beyond the 1 s
    // timeout, so the denial comes at once.
    let spec = Spec::parse("s", "SLIDING", &[2, 3000]).unwrap();
    assert!(
        client
            .apply("sl", &spec, Request::Cost(2))
            .await
            .unwrap()
            .allowed
    );
    let start = Instant::now();
    let d = client
        .acquire("sl", &spec, Request::Cost(1), Duration::from_millis(1000))
        .await
        .unwrap();
    let waited = start.elapsed();
    assert!(!d.allowed && d.wait_ms > 0, "{d:?}");
    assert!(
        waited < Duration::from_secs(10),
        "the denial came after {waited:?}"
    );
    // Beyond any timeout (cost above the limit): the denial at once.
    let d = client
        .acquire("sl", &spec, Request::Cost(3), Duration::from_secs(30))
        .await
        .unwrap();
    assert!(d.never());
    // Within the timeout it waits instead: a 10 s timeout is admitted.
    let d = client
        .acquire("sl", &spec, Request::Cost(1), Duration::from_secs(10))
        .await
        .unwrap();
    assert!(d.allowed, "{d:?}");
}

/// While an acquire is blocked on the server, the client's other calls
/// answer at once: the acquire has a connection of its own.
#[tokio::test]
async fn a_blocked_acquire_stalls_no_other_call() {
    let server = Server::start(Kind::Redis);
    let client = client(&server).await;
    // One token per 20 s, taken: the next is within the 30 s timeout, so
    // the server holds the call.
    let spec = Spec::parse("t", "TOKENBUCKET", &[1, 1, 20_000]).unwrap();
    assert!(
        client
            .apply("fw", &spec, Request::Cost(1))
            .await
            .unwrap()
            .allowed
    );
    let dump = || -> Vec<u8> {
        redis::cmd("DUMP")
            .arg("fw")
            .query(&mut server.conn())
            .unwrap()
    };
    let before = dump();
    let waiter = {
        let client = client.clone();
        tokio::spawn(async move {
            client
                .acquire("fw", &spec, Request::Cost(1), Duration::from_secs(30))
                .await
        })
    };
    wait_for("the acquire to block", async || blocked(&server) >= 1).await;
    for i in 0..20 {
        let start = Instant::now();
        let d = client
            .token_bucket(&format!("other{i}"), 5, 1, 1000, Request::Cost(1))
            .await
            .unwrap();
        assert!(d.allowed);
        assert!(
            start.elapsed() < Duration::from_secs(2),
            "a call took {:?} beside a blocked acquire",
            start.elapsed()
        );
    }
    assert!(!waiter.is_finished(), "still blocked");
    // Dropping the acquire closes its connection: the server forgets it.
    waiter.abort();
    wait_for("the server to forget the cancelled acquire", async || {
        blocked(&server) == 0
    })
    .await;
    assert_eq!(dump(), before, "the cancelled acquire consumed nothing");
}

/// An admitted leaky bucket resolves after its queueing delay.
#[tokio::test]
async fn an_admitted_leaky_bucket_resolves_after_its_wait() {
    let server = Server::start(Kind::Redis);
    let client = client(&server).await;
    // A queue of 5, one unit out per 400 ms: 3 queued, the next waits ~1.2 s.
    let spec = Spec::parse("l", "LEAKYBUCKET", &[5, 1, 400]).unwrap();
    assert!(
        client
            .apply("lb", &spec, Request::Cost(3))
            .await
            .unwrap()
            .allowed
    );
    let start = Instant::now();
    let d = client
        .acquire("lb", &spec, Request::Cost(1), Duration::from_secs(10))
        .await
        .unwrap();
    assert!(d.allowed && d.wait_ms > 0, "{d:?}");
    assert!(
        start.elapsed() >= d.retry_after,
        "resolved after {:?}, before its wait of {:?}",
        start.elapsed(),
        d.retry_after
    );
}

/// A lease waiting with BLOCK is woken by the release, long before the
/// held lease would have expired.
#[tokio::test]
async fn a_release_wakes_a_waiting_lease() {
    let server = Server::start(Kind::Redis);
    let client = client(&server).await;
    // The held lease would expire in 20 s, within the waiter's 50 s: it blocks.
    let held = client.lease("slot", 1, 20_000, 1, None).await.unwrap();
    let waiter = {
        let client = client.clone();
        tokio::spawn(async move {
            let start = Instant::now();
            let guard = client
                .lease("slot", 1, 20_000, 1, Some(Duration::from_secs(50)))
                .await;
            (guard, start.elapsed())
        })
    };
    wait_for("the lease to block", async || blocked(&server) >= 1).await;
    drop(held);
    let (guard, waited) = waiter.await.unwrap();
    let guard = guard.unwrap();
    assert!(guard.id().is_some());
    assert!(
        waited < Duration::from_secs(15),
        "woken after {waited:?}, not by the expiry"
    );
    // A timeout: Error::Denied with the decision.
    match client
        .lease("slot", 1, 20_000, 1, Some(Duration::from_millis(300)))
        .await
    {
        Err(Error::Denied(d)) => assert!(!d.allowed && d.lease.is_none()),
        other => panic!("{other:?}"),
    }
    assert!(guard.release().await.unwrap());
}

#[tokio::test]
async fn policies_and_rl_all_acquire_too() {
    let server = Server::start(Kind::Redis);
    let client = client(&server).await;
    let spec = Spec::parse("p", "SLIDING", &[1, 1000]).unwrap();
    client
        .policy_set("login", &spec, PolicyMode::Enforce, 100)
        .await
        .unwrap();
    assert!(
        client
            .hit("login", "login:a", Request::Cost(1))
            .await
            .unwrap()
            .allowed
    );
    let d = client
        .acquire_hit(
            "login",
            "login:a",
            Request::Cost(1),
            Duration::from_secs(20),
        )
        .await
        .unwrap();
    assert!(d.allowed, "{d:?}");

    let user = RuleKind::Inline(Spec::parse("u", "SLIDING", &[1, 1000]).unwrap());
    let global = RuleKind::Inline(Spec::parse("g", "TOKENBUCKET", &[100, 100, 1000]).unwrap());
    let limits = [("all:user", &user), ("all:global", &global)];
    assert!(client.all(&limits, 1).await.unwrap().allowed);
    let d = client
        .acquire_all(&limits, 1, Duration::from_secs(20))
        .await
        .unwrap();
    assert!(d.allowed && d.denied_by.is_none(), "{d:?}");
    let d = client
        .acquire_all(&limits, 1, Duration::from_millis(200))
        .await
        .unwrap();
    assert_eq!((d.allowed, d.denied_by), (false, Some(0)), "{d:?}");
}

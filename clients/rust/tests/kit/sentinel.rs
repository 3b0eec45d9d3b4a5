//! Sentinel: the client asks the Sentinels for the master, and after a
//! failover its breaker's probe asks again and follows the new master.

use std::time::Duration;

use redis_ratelimit_client::{BreakerConfig, Client, FallbackMode, Limiter, Path, Rule};

use crate::harness::{wait_for, wait_until, Kind, Sentinel, Server};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_client_follows_the_master_through_a_failover() {
    let master = Server::start(Kind::Redis);
    let replica = Server::replica_of(&master, Kind::Redis);
    let sentinel = Sentinel::start(&master);
    let client = Client::sentinel(&[sentinel.url().as_str()], "mymaster")
        .await
        .unwrap();
    let lim = Limiter::builder(client)
        .deadline(Duration::from_secs(2))
        .deny_cache(false)
        .fallback(FallbackMode::FailClosed)
        .breaker(BreakerConfig {
            failures: 1,
            open_for: Duration::from_millis(100),
        })
        .build();
    let set = lim
        .rule_set(vec![Rule::sliding(100, 60_000).name("s")])
        .await
        .unwrap();
    let d = lim.check(&set, "a", 1).await;
    assert_eq!((d.allowed, d.path), (true, Path::Redis));
    assert_eq!(master.calls("rl.sliding"), 1);

    sentinel.failover();
    // A poll may meet a connection the Sentinel closes mid-failover: that
    // poll answers "not yet".
    let role = |s: &Server| {
        s.try_info("replication")
            .ok()
            .and_then(|i| i.get("role").cloned())
    };
    wait_until("the failover to complete", || {
        sentinel.master_port() == Some(replica.port)
            && role(&master).as_deref() == Some("slave")
            && role(&replica).as_deref() == Some("master")
    });
    // A replica counts the commands it replays: count from here.
    let before = replica.calls("rl.sliding");
    // The old master is a replica now (READONLY): the breaker opens, its
    // probe asks the Sentinel, and calls go to the new master.
    wait_for("calls to reach the new master", async || {
        lim.check(&set, "a", 1).await;
        replica.calls("rl.sliding") > before
    })
    .await;
    let d = lim.check(&set, "a", 1).await;
    assert_eq!(d.path, Path::Redis);
    assert!(d.remaining < 99, "the state came along: {d:?}");
    let stats = lim.stats();
    assert!(
        stats.breaker_opened >= 1 && stats.probes_ok >= 1,
        "{stats:?}"
    );
}

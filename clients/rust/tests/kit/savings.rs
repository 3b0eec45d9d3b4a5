//! The local level and the deny cache save round trips, and the limit still
//! holds: counted in the server's `INFO commandstats`.

use std::time::Duration;

use redis_ratelimit_client::{Client, Limiter, Path, Rule};

use crate::harness::{Kind, Server};

async fn limiter(server: &Server, local: bool, deny_cache: bool) -> Limiter {
    let client = Client::standalone(&server.url()).await.unwrap();
    Limiter::builder(client)
        .deadline(Duration::from_secs(5))
        .local_level(local)
        .deny_cache(deny_cache)
        .instances(1)
        .build()
}

/// 1,000 requests from many users against a global 50 per minute.
async fn global_run(local: bool) -> (u64, u64) {
    let server = Server::start(Kind::Redis);
    let lim = limiter(&server, local, false).await;
    let set = lim
        .rule_set(vec![Rule::sliding(50, 60_000)
            .name("global")
            .fixed_key("g")
            .global()])
        .await
        .unwrap();
    let mut admitted = 0;
    for i in 0..1000 {
        if lim.check(&set, &format!("user{i}"), 1).await.allowed {
            admitted += 1;
        }
    }
    (admitted, server.calls("rl.sliding"))
}

#[tokio::test]
async fn the_local_level_keeps_what_its_share_denies_away_from_redis() {
    let (admitted_without, calls_without) = global_run(false).await;
    let (admitted_with, calls_with) = global_run(true).await;
    assert_eq!((admitted_without, calls_without), (50, 1000));
    // One instance's share is the whole limit (ceil(50 * 1.1) = 55, capped at
    // 50): Redis sees the 50 calls it admits, and none of the 950 denials.
    assert_eq!((admitted_with, calls_with), (50, 50));
}

/// An abusive user sends 900 of 1,000 requests; a per-user 5 per minute.
async fn skewed_run(deny_cache: bool) -> (u64, u64, u64) {
    let server = Server::start(Kind::Redis);
    let lim = limiter(&server, true, deny_cache).await;
    let set = lim
        .rule_set(vec![Rule::sliding(5, 60_000).name("per-user")])
        .await
        .unwrap();
    let (mut evil, mut others) = (0, 0);
    for i in 0..1000 {
        let user = if i % 10 == 9 {
            format!("user{i}")
        } else {
            "evil".into()
        };
        let d = lim.check(&set, &user, 1).await;
        if d.allowed {
            if user == "evil" {
                evil += 1
            } else {
                others += 1
            }
        } else {
            assert!(matches!(d.path, Path::Redis | Path::DenyCache));
        }
    }
    (evil, others, server.calls("rl.sliding"))
}

#[tokio::test]
async fn the_deny_cache_answers_an_abusive_key_without_a_round_trip() {
    let (evil, others, calls_without) = skewed_run(false).await;
    assert_eq!((evil, others, calls_without), (5, 100, 1000));
    let (evil, others, calls_with) = skewed_run(true).await;
    assert_eq!((evil, others), (5, 100));
    // 100 others, 5 admitted for evil, then one denial per second of the run
    // at most (min(wait, 1 s)): the run is far shorter than 60 s.
    assert!((106..106 + 60).contains(&calls_with), "{calls_with}");
}

/// An `RL.ALL` denial waits for the slowest limiter that denied, not for
/// the one it names first: it is cached for its own set of rules only, so a
/// set with the fast rule alone passes once that rule admits again.
#[tokio::test]
async fn an_rl_all_denial_is_cached_for_its_set_only() {
    let server = Server::start(Kind::Redis);
    let client = Client::standalone(&server.url()).await.unwrap();
    let lim = Limiter::builder(client)
        .deadline(Duration::from_secs(5))
        .deny_cache_max(Duration::from_secs(60))
        .build();
    let fast = || Rule::sliding(1, 300).name("fast").fixed_key("f");
    let slow = Rule::sliding(1, 60_000).name("slow").fixed_key("s");
    let both = lim.rule_set(vec![fast(), slow]).await.unwrap();
    let alone = lim.rule_set(vec![fast()]).await.unwrap();
    assert!(lim.check(&both, "-", 1).await.allowed);
    let denied = lim.check(&both, "-", 1).await;
    assert_eq!(
        (denied.allowed, denied.denied_by),
        (false, Some(0)),
        "{denied:?}"
    );
    assert!(denied.retry_after > Duration::from_secs(50), "{denied:?}");
    // Until the fast rule admits again, on the server itself.
    let mut con = redis::Client::open(server.url())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    loop {
        let peek: Vec<i64> = redis::cmd("RL.SLIDING")
            .arg(&["f", "1", "300", "COST", "0"])
            .query_async(&mut con)
            .await
            .unwrap();
        if peek[2] == 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let d = lim.check(&alone, "-", 1).await;
    assert!(d.allowed && d.path == Path::Redis, "{d:?}");
    // The set itself is still answered from the cache.
    let d = lim.check(&both, "-", 1).await;
    assert!(!d.allowed && d.path == Path::DenyCache, "{d:?}");
}

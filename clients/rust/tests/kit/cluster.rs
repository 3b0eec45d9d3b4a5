//! Against a cluster of the suite's own (3 masters, 3 replicas): single
//! commands, RL.HIT (its key is the second argument) and RL.ALL with hash
//! tags reach the key's owner in one round trip: no `MOVED` anywhere.

use std::time::Duration;

use redis_ratelimit_client::{Client, Error, Limiter, PolicyMode, Request, Rule, Spec};

use crate::harness::{Cluster, Kind};

/// A cluster of `kind`, and the kit's client on it, with a deadline for a
/// busy machine.
async fn cluster_and_client(kind: Kind) -> (Cluster, Client) {
    let cluster = Cluster::start(kind);
    let urls = cluster.urls();
    let nodes: Vec<&str> = urls.iter().map(String::as_str).collect();
    let client = Client::cluster(&nodes).await.unwrap();
    (cluster, client.with_deadline(Duration::from_secs(5)))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_call_goes_to_the_owner_of_its_key_without_moved() {
    let (cluster, client) = cluster_and_client(Kind::Redis).await;
    let spec = Spec::parse("p", "FIXEDWINDOW", &[2, 60_000]).unwrap();
    client
        .policy_set("login", &spec, PolicyMode::Enforce, 100)
        .await
        .unwrap();
    for m in &cluster.nodes[..3] {
        let v: redis::Value = redis::cmd("RL.POLICY")
            .arg("GET")
            .arg("login")
            .query(&mut m.conn())
            .unwrap();
        assert_ne!(v, redis::Value::Nil, "the policy is on every master");
    }
    let moved_before = cluster.moved();
    for i in 0..60 {
        let key = format!("user:{i}");
        let d = client
            .sliding(&key, 1, 60_000, Request::Cost(1))
            .await
            .unwrap();
        assert!(d.allowed);
        // The policy name hashes elsewhere than the key: routed by the key.
        let d = client
            .hit("login", &format!("login:{i}"), Request::Cost(1))
            .await
            .unwrap();
        assert!(d.allowed);
    }
    let lim = Limiter::builder(client.clone()).deny_cache(false).build();
    let set = lim
        .rule_set(vec![
            Rule::sliding(3, 60_000)
                .name("per-user")
                .key_prefix("{api}:user:"),
            Rule::token_bucket(100, 100, 1000)
                .name("global")
                .fixed_key("{api}:global")
                .global(),
        ])
        .await
        .unwrap();
    let mut admitted = 0;
    for i in 0..30 {
        let d = lim.check(&set, &format!("u{}", i % 5), 1).await;
        admitted += d.allowed as u32;
    }
    assert_eq!(admitted, 15, "3 each for 5 users");
    assert_eq!(lim.stats().redis_calls, 30);
    assert_eq!(cluster.moved(), moved_before, "no MOVED reply on any node");
    assert!(client.log_len().await.unwrap() >= 15);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_valkey_cluster_routes_rl_all_and_rl_hit_too() {
    let (cluster, client) = cluster_and_client(Kind::Valkey).await;
    let spec = Spec::parse("p", "SLIDING", &[1, 60_000]).unwrap();
    client
        .policy_set("pay", &spec, PolicyMode::Enforce, 100)
        .await
        .unwrap();
    for i in 0..20 {
        assert!(
            client
                .hit("pay", &format!("k{i}"), Request::Cost(1))
                .await
                .unwrap()
                .allowed
        );
        assert!(
            !client
                .hit("pay", &format!("k{i}"), Request::Cost(1))
                .await
                .unwrap()
                .allowed
        );
    }
    let lim = Limiter::builder(client).deny_cache(false).build();
    let set = lim
        .rule_set(vec![
            Rule::sliding(1, 60_000).name("a").fixed_key("{t}:a"),
            Rule::policy("pay").name("b").fixed_key("{t}:b"),
        ])
        .await
        .unwrap();
    assert!(lim.check(&set, "-", 1).await.allowed);
    assert_eq!(lim.check(&set, "-", 1).await.denied_by, Some(0));
    assert_eq!(cluster.moved(), 0);

    // Keys in several slots would be CROSSSLOT at every request: refused at build.
    let apart = lim
        .rule_set(vec![
            Rule::sliding(1, 1000).fixed_key("{t}:a"),
            Rule::sliding(1, 1000).name("other").fixed_key("b"),
        ])
        .await
        .unwrap_err();
    assert!(
        matches!(apart, Error::BadArgument { ref arg, ref rule, .. } if arg == "key" && rule == "other"),
        "{apart}"
    );
}

/// Blocking acquires and leases in a cluster: each goes to its key's
/// master on a connection of its own (from `CLUSTER SLOTS`), no `MOVED`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acquires_and_leases_reach_the_owner_of_their_key() {
    let (cluster, client) = cluster_and_client(Kind::Redis).await;
    let moved_before = cluster.moved();
    let spec = Spec::parse("t", "TOKENBUCKET", &[1, 1, 1500]).unwrap();
    let mut waits = Vec::new();
    for i in 0..6 {
        let key = format!("acq:{i}");
        assert!(
            client
                .apply(&key, &spec, Request::Cost(1))
                .await
                .unwrap()
                .allowed
        );
        let client = client.clone();
        waits.push(tokio::spawn(async move {
            client
                .acquire(&key, &spec, Request::Cost(1), Duration::from_secs(20))
                .await
        }));
    }
    for w in waits {
        let d = w.await.unwrap().unwrap();
        assert!(d.allowed, "{d:?}");
    }
    for i in 0..6 {
        let key = format!("lease:{i}");
        let guard = client
            .lease(&key, 1, 30_000, 1, Some(Duration::from_secs(5)))
            .await
            .unwrap();
        assert!(matches!(
            client.lease(&key, 1, 30_000, 1, None).await,
            Err(Error::Denied(_))
        ));
        assert!(guard.release().await.unwrap());
    }
    assert_eq!(cluster.moved(), moved_before, "no MOVED");
}

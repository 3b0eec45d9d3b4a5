//! Redis Cluster: every limiter command declares its key, so a cluster client
//! routes it to the master that owns the key's slot; `RL.ALL` needs all its
//! keys in one slot (a hash tag) and otherwise gets the server's `CROSSSLOT`
//! error; resharding (`MIGRATE`) and a replica failover carry every limiter's
//! state over byte for byte, and the limiters continue where they were.
//!
//! Each test starts its own 3-master, 3-replica cluster (`harness/cluster.rs`)
//! on free loopback ports, once on Redis and once on Valkey, and drives it
//! with redis-rs's `ClusterClient`.

use crate::harness::cluster::*;
use crate::harness::*;
use std::time::Duration;

/// One limiter of each algorithm, with rates slow enough (one unit back per
/// hour) that nothing refills while a test runs: a count is exact from one
/// call to the next, whatever the machine's load.
struct Limiter {
    name: &'static str,
    /// The command and the parameters after the key.
    command: &'static str,
    params: &'static [&'static str],
    limit: i64,
}

const LIMITERS: &[Limiter] = &[
    Limiter {
        name: "tb",
        command: "RL.TOKENBUCKET",
        params: &["10", "1", "3600000"],
        limit: 10,
    },
    Limiter {
        name: "fw",
        command: "RL.FIXEDWINDOW",
        params: &["10", "86400000"],
        limit: 10,
    },
    Limiter {
        name: "lb",
        command: "RL.LEAKYBUCKET",
        params: &["10", "1", "3600000"],
        limit: 10,
    },
    Limiter {
        name: "sl",
        command: "RL.SLIDING",
        params: &["10", "3600000"],
        limit: 10,
    },
    Limiter {
        name: "hw",
        command: "RL.HASHWINDOW",
        params: &["10", "3600000", "60000"],
        limit: 10,
    },
];

impl Limiter {
    fn words<'a>(&'a self, key: &'a str) -> Vec<&'a str> {
        let mut words = vec![self.command, key];
        words.extend_from_slice(self.params);
        words
    }
}

/// The fixed window above is one UTC day: make sure a test's calls do not
/// straddle midnight.
fn away_from_midnight(cluster: &Cluster) {
    away_from_window_end(&mut cluster.nodes[0].conn(), 86_400_000, 120_000);
}

/// `MOVED` redirections the node has answered (`INFO errorstats`).
fn moved_count(node: &Node) -> u64 {
    let stats = node.server.info("errorstats");
    info_field(&stats, "errorstat_MOVED")
        .and_then(|v| v.strip_prefix("count=").map(str::to_string))
        .map_or(0, |n| n.parse().unwrap())
}

fn total_moved(cluster: &Cluster) -> u64 {
    cluster.nodes.iter().map(moved_count).sum()
}

/// Admitted with `remaining` units left.
fn assert_admitted(reply: Reply, limiter: &Limiter, remaining: i64, key: &str) {
    assert!(reply.allowed, "{key}: {reply:?}");
    assert_eq!(reply.limit, limiter.limit, "{key}: {reply:?}");
    assert_eq!(reply.remaining, remaining, "{key}: {reply:?}");
    assert!(
        reply.reset_ms > 0 && reply.reset_ms <= 86_400_000,
        "{key}: {reply:?}"
    );
    if limiter.name == "lb" {
        // The shaping delay: the units queued ahead, an hour each at most.
        let queued_ahead = limiter.limit - remaining - 1;
        assert!(
            reply.wait_ms <= queued_ahead * 3_600_000
                && (queued_ahead == 0) == (reply.wait_ms == 0),
            "{key}: {reply:?}"
        );
    } else {
        assert_eq!(reply.wait_ms, 0, "{key}: {reply:?}");
    }
}

#[test]
fn every_limiter_command_is_routed_to_the_owner_of_its_key() {
    for_each_server(|kind| {
        let cluster = Cluster::start(kind);
        away_from_midnight(&cluster);
        let mut client = cluster.client();
        let users = 300;
        let moved_before = total_moved(&cluster);
        for limiter in LIMITERS {
            for user in 0..users {
                let key = format!("rl:{}:user:{user}", limiter.name);
                let first = cluster_rl(&mut client, &limiter.words(&key));
                assert_admitted(first, limiter, limiter.limit - 1, &key);
                let second = cluster_rl(&mut client, &limiter.words(&key));
                assert_admitted(second, limiter, limiter.limit - 2, &key);
            }
        }
        // The client found each key's node from the key itself: no node had
        // to redirect a single call.
        assert_eq!(
            total_moved(&cluster),
            moved_before,
            "some limiter calls were redirected"
        );

        // Every key sits on the master owning its slot, the three masters
        // share them, and each replica holds its master's keys.
        let total = (users * LIMITERS.len()) as i64;
        let masters = cluster.masters();
        let mut held = 0;
        for master in &masters {
            let n = dbsize(&mut master.conn());
            assert!(
                n > total / 6,
                "master {} holds only {n} of {total}",
                master.port()
            );
            held += n;
            let acked: i64 = query(&mut master.conn(), &["WAIT", "1", "20000"]);
            assert_eq!(acked, 1, "replica of {} did not ack", master.port());
            let replica = cluster.replica_of(master);
            assert_eq!(dbsize(&mut replica.read_conn()), n);
        }
        assert_eq!(held, total);
        for user in (0..users).step_by(37) {
            for limiter in LIMITERS {
                let key = format!("rl:{}:user:{user}", limiter.name);
                let owner = cluster.master_of_slot(cluster.keyslot(&key));
                let mut con = owner.conn();
                assert!(exists(&mut con, &key), "{key} not on its slot's master");
                assert!(pttl(&mut con, &key) > 0, "{key} has no TTL");
            }
        }
    });
}

#[test]
fn rl_all_across_slots_is_crossslot() {
    for_each_server(|kind| {
        let cluster = Cluster::start(kind);
        let mut client = cluster.client();

        // Without a hash tag the two keys hash to different slots.
        let (user, global) = ("order:create:user:1", "order:create:global");
        assert_ne!(cluster.keyslot(user), cluster.keyslot(global));
        let across: &[&str] = &[
            "RL.ALL",
            "2",
            user,
            global,
            "TOKENBUCKET",
            "5",
            "5",
            "1000",
            "FIXEDWINDOW",
            "15000",
            "1000",
        ];
        // Through the cluster client, however it routes the call...
        let err = command(across).query::<Value>(&mut client).unwrap_err();
        assert_eq!(err.code(), Some("CROSSSLOT"), "{}", error_text(&err));
        let err = cluster_rl_all(&mut client, across).unwrap_err();
        assert_eq!(err.code(), Some("CROSSSLOT"), "{}", error_text(&err));
        // ...and on every node: the server refuses before the module runs.
        for node in &cluster.nodes {
            let err = query_err(&mut node.conn(), across);
            assert!(err.starts_with("CROSSSLOT"), "{}: {err}", node.port());
        }
        for node in &cluster.nodes {
            assert_eq!(dbsize(&mut node.conn()), 0, "a refused RL.ALL wrote a key");
        }
    });
}

#[test]
fn rl_all_with_a_hash_tag_runs_on_the_owner_of_its_slot() {
    for_each_server(|kind| {
        let cluster = Cluster::start(kind);
        let mut client = cluster.client();
        // With a hash tag, only the part in braces is hashed: one slot, one
        // node, and RL.ALL runs there. A small global limit (3 in all) shows
        // the all-or-nothing rule across users.
        let tag = "{order:create}";
        let slot = cluster.keyslot(tag);
        let global = format!("{tag}:global");
        let users: Vec<String> = (1..=3).map(|i| format!("{tag}:user:{i}")).collect();
        for key in users.iter().chain([&global]) {
            assert_eq!(cluster.keyslot(key), slot, "{key}");
        }
        // A master that does not own the slot redirects RL.ALL like any
        // command with keys: it must not run it on keys it does not hold.
        let owner = cluster.master_of_slot(slot);
        let owner_address = format!("127.0.0.1:{}", owner.port());
        for master in cluster.masters() {
            if master.id == owner.id {
                continue;
            }
            let words = [
                "RL.ALL",
                "2",
                &users[0],
                &global,
                "TOKENBUCKET",
                "5",
                "1",
                "60000",
                "TOKENBUCKET",
                "3",
                "1",
                "60000",
            ];
            let err = query_err(&mut master.conn(), &words);
            assert_eq!(
                err,
                format!("MOVED {slot} {owner_address}"),
                "RL.ALL on {}, which does not own slot {slot}",
                master.port()
            );
            assert_eq!(
                dbsize(&mut master.conn()),
                0,
                "RL.ALL ran on the wrong node"
            );
        }
        let both = |user: &str| -> Vec<String> {
            [
                "RL.ALL",
                "2",
                user,
                &global,
                "TOKENBUCKET",
                "5",
                "1",
                "60000",
                "TOKENBUCKET",
                "3",
                "1",
                "60000",
            ]
            .iter()
            .map(|w| w.to_string())
            .collect()
        };
        let call = |client: &mut redis::cluster::ClusterConnection, user: &str| -> Vec<i64> {
            let words = both(user);
            let words: Vec<&str> = words.iter().map(String::as_str).collect();
            match cluster_rl_all(client, &words) {
                Ok(value) => redis::from_redis_value(value).expect("six integers"),
                Err(e) => panic!("{words:?}: {}", error_text(&e)),
            }
        };
        // User 1 takes two, user 2 the last of the global three.
        assert_eq!(call(&mut client, &users[0])[..3], [1, 3, 2]);
        assert_eq!(call(&mut client, &users[0])[..3], [1, 3, 1]);
        let last = call(&mut client, &users[1]);
        assert_eq!((last[0], last[1], last[2], last[5]), (1, 3, 0, 0));
        // User 3 is denied by the global limit (position 2) and keeps every
        // one of their own tokens: their bucket was not even created.
        let denied = call(&mut client, &users[2]);
        assert_eq!((denied[0], denied[1], denied[2], denied[5]), (0, 3, 0, 2));
        assert!(denied[3] > 0 && denied[3] <= 60_000, "{denied:?}");
        let mut con = owner.conn();
        assert!(exists(&mut con, &users[0]) && exists(&mut con, &global));
        assert!(!exists(&mut con, &users[2]));
        let own = cluster_rl(
            &mut client,
            &["RL.TOKENBUCKET", &users[2], "5", "1", "60000", "COST", "0"],
        );
        assert_eq!(own.remaining, 5);

        // Many tags, many slots: routed by the first key, RL.ALL lands on the
        // right node at once; routed by its first argument (what a client
        // that does not know the command does), the redirection gets it there.
        let moved_before = total_moved(&cluster);
        for route_by_key in [true, false] {
            for i in 0..100 {
                let user = format!("{{tenant:{i}}}:user:{route_by_key}");
                let tenant = format!("{{tenant:{i}}}:all:{route_by_key}");
                let words = [
                    "RL.ALL",
                    "2",
                    &user,
                    &tenant,
                    "SLIDING",
                    "10",
                    "60000",
                    "HASHWINDOW",
                    "100",
                    "60000",
                    "1000",
                ];
                let reply: Vec<i64> = if route_by_key {
                    redis::from_redis_value(cluster_rl_all(&mut client, &words).unwrap()).unwrap()
                } else {
                    cluster_query(&mut client, &words)
                };
                assert_eq!(reply, [1, 10, 9, 0, reply[4], 0], "{words:?}");
            }
            if route_by_key {
                assert_eq!(total_moved(&cluster), moved_before, "RL.ALL was redirected");
            }
        }
    });
}

/// Calls every limiter of `LIMITERS` on `{tag}:<name>` `times` times through
/// the cluster client and returns the keys.
fn exercise(client: &mut redis::cluster::ClusterConnection, tag: &str, times: i64) -> Vec<String> {
    LIMITERS
        .iter()
        .map(|limiter| {
            let key = format!("{{{tag}}}:{}", limiter.name);
            for n in 1..=times {
                let reply = cluster_rl(client, &limiter.words(&key));
                assert_admitted(reply, limiter, limiter.limit - n, &key);
            }
            key
        })
        .collect()
}

#[test]
fn moving_a_slot_to_another_master_keeps_every_limiter() {
    for_each_server(|kind| {
        let cluster = Cluster::start(kind);
        away_from_midnight(&cluster);
        let mut client = cluster.client();
        let tag = "reshard";
        let slot = cluster.keyslot(&format!("{{{tag}}}"));
        let keys = exercise(&mut client, tag, 3);
        let source = cluster.master_of_slot(slot);
        let mut source_con = source.conn();
        let before: Vec<(Option<Vec<u8>>, i64)> = keys
            .iter()
            .map(|k| (dump(&mut source_con, k), pttl(&mut source_con, k)))
            .collect();
        assert!(before.iter().all(|(d, ttl)| d.is_some() && *ttl > 0));

        let target = cluster
            .masters()
            .into_iter()
            .find(|m| m.id != source.id)
            .expect("another master");
        cluster.move_slot(slot, target);

        // The very same state on the new owner, with its expiry, and nothing
        // left behind on the old one.
        let mut target_con = target.conn();
        for (key, (dump_before, ttl_before)) in keys.iter().zip(&before) {
            assert_eq!(
                &dump(&mut target_con, key),
                dump_before,
                "DUMP {key} changed"
            );
            let ttl = pttl(&mut target_con, key);
            assert!(
                ttl > 0 && ttl <= *ttl_before,
                "PTTL {key}: {ttl} after {ttl_before}"
            );
        }
        let left: i64 = query(
            &mut source_con,
            &["CLUSTER", "COUNTKEYSINSLOT", &slot.to_string()],
        );
        assert_eq!(left, 0);
        // The target's replica got the keys too.
        let acked: i64 = query(&mut target_con, &["WAIT", "1", "20000"]);
        assert_eq!(acked, 1);
        let mut replica_con = cluster.replica_of(target).read_conn();
        for (key, (dump_before, _)) in keys.iter().zip(&before) {
            assert_eq!(
                &dump(&mut replica_con, key),
                dump_before,
                "{key} on the replica"
            );
        }

        // The client's slot map is stale: it is redirected once, then every
        // limiter carries on from where it was (3 used, the 4th leaves 6).
        for (limiter, key) in LIMITERS.iter().zip(&keys) {
            let reply = cluster_rl(&mut client, &limiter.words(key));
            assert_admitted(reply, limiter, limiter.limit - 4, key);
        }
        // RL.ALL on the moved keys, now all on the target.
        let all: Vec<i64> = redis::from_redis_value(
            cluster_rl_all(
                &mut client,
                &[
                    "RL.ALL",
                    "2",
                    &keys[0],
                    &keys[3],
                    "TOKENBUCKET",
                    "10",
                    "1",
                    "3600000",
                    "SLIDING",
                    "10",
                    "3600000",
                ],
            )
            .unwrap(),
        )
        .unwrap();
        assert_eq!(all, [1, 10, 5, 0, all[4], 0]);
        assert_eq!(dbsize(&mut target_con) as usize, keys.len());
    });
}

#[test]
fn replica_failover_keeps_every_limiter() {
    for_each_server(|kind| {
        let cluster = Cluster::start(kind);
        away_from_midnight(&cluster);
        let mut client = cluster.client();
        let tag = "failover";
        let slot = cluster.keyslot(&format!("{{{tag}}}"));
        let keys = exercise(&mut client, tag, 3);
        let old_master = cluster.master_of_slot(slot);
        let replica = cluster.replica_of(old_master);

        // The replica has every call (WAIT), byte for byte.
        let mut master_con = old_master.conn();
        let acked: i64 = query(&mut master_con, &["WAIT", "1", "20000"]);
        assert_eq!(acked, 1);
        let before: Vec<Option<Vec<u8>>> = keys.iter().map(|k| dump(&mut master_con, k)).collect();
        let mut replica_con = replica.read_conn();
        for (key, dump_before) in keys.iter().zip(&before) {
            assert!(dump_before.is_some());
            assert_eq!(
                &dump(&mut replica_con, key),
                dump_before,
                "{key} on the replica"
            );
        }

        cluster.failover(replica);
        assert_eq!(cluster.master_of_slot(slot).id, replica.id);
        assert_eq!(old_master.role(), "slave");

        // The promoted replica serves the same state, and every limiter
        // continues: the 4th call leaves 6.
        let mut new_master_con = replica.conn();
        for (key, dump_before) in keys.iter().zip(&before) {
            assert_eq!(
                &dump(&mut new_master_con, key),
                dump_before,
                "DUMP {key} changed"
            );
            assert!(pttl(&mut new_master_con, key) > 0);
        }
        for (limiter, key) in LIMITERS.iter().zip(&keys) {
            let reply = cluster_rl(&mut client, &limiter.words(key));
            assert_admitted(reply, limiter, limiter.limit - 4, key);
        }
        // The old master now follows the new one and gets those calls too.
        let acked: i64 = query(&mut new_master_con, &["WAIT", "1", "20000"]);
        assert_eq!(acked, 1);
        let mut old_con = old_master.read_conn();
        for key in &keys {
            assert_eq!(
                dump(&mut old_con, key),
                dump(&mut new_master_con, key),
                "{key} on the old master, now a replica"
            );
        }
    });
}

#[test]
fn a_slot_move_redirects_blocked_clients_and_keeps_the_leases() {
    use std::io::{Read, Write};
    for_each_server(|kind| {
        let cluster = Cluster::start(kind);
        let mut client = cluster.client();
        let key = "{blocked}lease";
        let held: Vec<i64> = cluster_query(&mut client, &["RL.CONCURRENCY", key, "1", "600000"]);
        assert_eq!(held[0], 1, "{held:?}");
        let slot = cluster.keyslot(key);
        let source = cluster.master_of_slot(slot);
        // A client blocked on the key, on its owner (BLOCK 0: until the
        // lease ends, a minute from now).
        let mut socket = std::net::TcpStream::connect(("127.0.0.1", source.port())).unwrap();
        let call = ["RL.CONCURRENCY", key, "1", "600000", "BLOCK", "0"];
        let mut resp = format!("*{}\r\n", call.len());
        for w in call {
            resp.push_str(&format!("${}\r\n{w}\r\n", w.len()));
        }
        socket.write_all(resp.as_bytes()).unwrap();
        let blocked = |node: &Node| -> u64 {
            info_field(&node.server.info("ratelimit"), "ratelimit_blocked_now")
                .and_then(|v| v.parse().ok())
                .unwrap_or(0)
        };
        poll_until(
            "the client blocked on the source",
            Duration::from_secs(20),
            || blocked(source) == 1,
        );
        let target = cluster
            .masters()
            .into_iter()
            .find(|m| m.id != source.id)
            .expect("another master");
        cluster.move_slot(slot, target);
        // Redirected as BLPOP would be, and forgotten by the source.
        socket
            .set_read_timeout(Some(Duration::from_secs(30)))
            .unwrap();
        let mut buf = [0u8; 512];
        let n = socket
            .read(&mut buf)
            .expect("a reply to the blocked client");
        let reply = String::from_utf8_lossy(&buf[..n]).to_string();
        assert!(
            reply.starts_with("-MOVED") || reply.starts_with("-UNBLOCKED"),
            "{reply}"
        );
        poll_until(
            "the source forgot its waiter",
            Duration::from_secs(20),
            || blocked(source) == 0,
        );
        // The lease moved with the key: releasing it on the new owner frees
        // the unit.
        let released: i64 = cluster_query(&mut client, &["RL.RELEASE", key, &held[5].to_string()]);
        assert_eq!(released, 1);
        let again: Vec<i64> = cluster_query(&mut client, &["RL.CONCURRENCY", key, "1", "600000"]);
        assert_eq!(again[0], 1, "{again:?}");
        assert!(again[5] > held[5], "lease ids go on: {again:?}");
    });
}

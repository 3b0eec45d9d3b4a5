//! Faults a limiter must survive: a replica whose link is cut mid-traffic
//! ends byte-identical to its master, so does a replica attached (full
//! resync, disk-based or diskless) while clients keep hammering the master,
//! and under `maxmemory` with an eviction policy, limiter keys are evicted
//! like any other key while the server keeps serving.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread;
use std::time::Duration;

use crate::harness::*;

const KEYS: usize = 40;

fn traffic(con: &mut Connection, round: usize) {
    for i in 0..KEYS * 2 {
        let key = format!("f:{}", i % KEYS);
        let cost = ((i + round) % 3).to_string();
        if i % 2 == 0 {
            rl(
                con,
                &["RL.TOKENBUCKET", &key, "5", "1", "60000", "COST", &cost],
            );
        } else {
            rl(con, &["RL.SLIDING", &key, "5", "600000", "COST", &cost]);
        }
    }
}

fn dumps(con: &mut Connection) -> Vec<Option<Vec<u8>>> {
    (0..KEYS).map(|i| dump(con, &format!("f:{i}"))).collect()
}

#[test]
fn a_replica_whose_link_was_cut_ends_byte_identical() {
    for_each_server(|kind| {
        let master = Server::start(kind, &[]);
        let replica = replica_of(&master);
        let mut con = master.conn();
        traffic(&mut con, 0);
        // Cut the link from the replica side, keep writing, let it resume.
        let mut r = replica.conn();
        let _: Value = query(&mut r, &["CLIENT", "KILL", "TYPE", "master"]);
        traffic(&mut con, 1);
        poll_until(
            "replica link up again",
            std::time::Duration::from_secs(20),
            || {
                let info = replica.info("replication");
                info_field(&info, "master_link_status").as_deref() == Some("up")
            },
        );
        traffic(&mut con, 2);
        wait_for_sync(&master, &replica);
        assert_eq!(dumps(&mut con), dumps(&mut r));
    });
}

#[test]
fn eviction_removes_limiter_keys_safely() {
    for_each_server(|kind| {
        let server = Server::start(kind, &["--maxmemory-policy", "allkeys-lru"]);
        let mut con = server.conn();
        let used: u64 = info_field(&server.info("memory"), "used_memory")
            .unwrap()
            .parse()
            .unwrap();
        // Room for a few thousand limiters above what the server uses.
        let limit = (used + 600_000).to_string();
        let _: () = query(&mut con, &["CONFIG", "SET", "maxmemory", &limit]);
        for i in 0..20_000 {
            let key = format!("ev:{i}");
            // Never an error: eviction makes room for each new key.
            rl(&mut con, &["RL.TOKENBUCKET", &key, "5", "1", "60000"]);
        }
        let evicted: u64 = info_field(&server.info("stats"), "evicted_keys")
            .unwrap()
            .parse()
            .unwrap();
        assert!(evicted > 0, "the test should have filled memory");
        assert!(dbsize(&mut con) < 20_000);
        // An evicted limiter is an idle one: it starts again full.
        let r = rl(
            &mut con,
            &["RL.TOKENBUCKET", "ev:0", "5", "1", "60000", "COST", "0"],
        );
        assert!(r.remaining == 5 || r.remaining == 4, "{r:?}");
        let _: () = query(&mut con, &["PING"]);
    });
}

/// How a fresh replica gets its first copy of the master's data.
struct FullSync {
    name: &'static str,
    master_args: &'static [&'static str],
    replica_args: &'static [&'static str],
    /// What the master logs when it starts the snapshot for this kind of sync.
    master_log: &'static str,
    valkey_only: bool,
}

const FULL_SYNCS: [FullSync; 3] = [
    FullSync {
        name: "disk-based",
        master_args: &["--repl-diskless-sync", "no"],
        replica_args: &["--repl-diskless-load", "disabled"],
        master_log: "Starting BGSAVE for SYNC with target: disk",
        valkey_only: false,
    },
    FullSync {
        name: "diskless",
        master_args: &["--repl-diskless-sync", "yes"],
        replica_args: &["--repl-diskless-load", "on-empty-db"],
        master_log: "Starting BGSAVE for SYNC with target: replicas sockets",
        valkey_only: false,
    },
    // Valkey can stream the snapshot and the commands that follow it over two
    // connections at once: the replica buffers the commands while it loads.
    FullSync {
        name: "dual-channel",
        master_args: &[
            "--repl-diskless-sync",
            "yes",
            "--dual-channel-replication-enabled",
            "yes",
        ],
        replica_args: &["--dual-channel-replication-enabled", "yes"],
        master_log: "Starting BGSAVE for SYNC with target: replicas sockets",
        valkey_only: true,
    },
];

/// Limiters per algorithm in the full-sync test.
const SYNC_KEYS: usize = 400;
/// Traffic clients during the full sync.
const SYNC_CLIENTS: usize = 4;
/// Commands per pipeline of those clients.
const SYNC_PIPELINE: usize = 16;

/// Sets `stop` when dropped, so that traffic threads end even when the test
/// panics (a scoped thread that never ends would hang the test).
struct StopOnDrop<'a>(&'a AtomicBool);

impl Drop for StopOnDrop<'_> {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

/// The rule part of `RL.POLICY GET` (without the counters).
fn policy_rule(con: &mut Connection, name: &str) -> Vec<Value> {
    match query::<Value>(con, &["RL.POLICY", "GET", name]) {
        Value::Array(items) => items
            .into_iter()
            .take_while(|item| !matches!(item, Value::BulkString(b) if b == b"calls"))
            .collect(),
        other => panic!("RL.POLICY GET {name} replied {other:?}"),
    }
}

fn full_sync_during_traffic(kind: ServerKind, sync: &FullSync) {
    eprintln!("--- {kind}, {} full sync", sync.name);
    let master = Server::start(kind, sync.master_args);
    let mut con = master.conn();
    let traffic = MixedTraffic::new(&mut con, SYNC_KEYS);
    let mut tally = Tally::default();
    for calls in traffic.preload().chunks(500) {
        send_checked(&mut con, calls, &mut tally);
    }
    // Slow the snapshot down (the fork child pauses 500 us per key), so the
    // sync lasts about a second and a lot of traffic lands in the middle of
    // it: written while the child saves, buffered for the replica, replayed
    // after it loads.
    let _: () = query(&mut con, &["CONFIG", "SET", "rdb-key-save-delay", "500"]);
    let replica = Server::start(kind, sync.replica_args);

    let acked = AtomicU64::new(0);
    let stop = AtomicBool::new(false);
    let (after_replicaof, during_sync, at_link_up, at_stop) = thread::scope(|scope| {
        let clients: Vec<_> = (0..SYNC_CLIENTS)
            .map(|client| {
                let (master, traffic, acked, stop) = (&master, &traffic, &acked, &stop);
                scope.spawn(move || {
                    let mut con = master.conn();
                    let mut rng = Xorshift64(0x5eed_0000_f00d + client as u64);
                    let mut tally = Tally::default();
                    while !stop.load(Ordering::Relaxed) {
                        let calls: Vec<MixedCall> = (0..SYNC_PIPELINE)
                            .map(|_| traffic.random(&mut rng))
                            .collect();
                        send_checked(&mut con, &calls, &mut tally);
                        acked.fetch_add(calls.len() as u64, Ordering::Relaxed);
                    }
                    tally
                })
            })
            .collect();
        let stopper = StopOnDrop(&stop);
        let wait_for_acks = |what: &str, target: u64| {
            poll_until(what, Duration::from_secs(30), || {
                acked.load(Ordering::Relaxed) >= target
            })
        };
        wait_for_acks("traffic flowing before the replica attaches", 1000);

        let mut r = replica.conn();
        let _: () = query(
            &mut r,
            &["REPLICAOF", "127.0.0.1", &master.port.to_string()],
        );
        let after_replicaof = acked.load(Ordering::Relaxed);
        // Acknowledged commands counted when the replica was first and last
        // seen loading its snapshot.
        let mut during_sync: Option<(u64, u64)> = None;
        poll_until(
            "replica link up and initial sync done",
            Duration::from_secs(60),
            || {
                let info = replica.info("replication");
                let now = acked.load(Ordering::Relaxed);
                if info_field(&info, "master_sync_in_progress").as_deref() == Some("1") {
                    during_sync.get_or_insert((now, now)).1 = now;
                }
                info_field(&info, "master_link_status").as_deref() == Some("up")
                    && info_field(&info, "master_sync_in_progress").as_deref() == Some("0")
            },
        );
        let at_link_up = acked.load(Ordering::Relaxed);
        // And some more over the live link.
        wait_for_acks("traffic after the sync", at_link_up + 1000);
        drop(stopper);
        let at_stop = acked.load(Ordering::Relaxed);
        for client in clients {
            tally.add(&client.join().expect("a traffic client failed"));
        }
        (after_replicaof, during_sync, at_link_up, at_stop)
    });

    let (first_seen, last_seen) =
        during_sync.expect("the replica was never seen loading its snapshot");
    eprintln!(
        "{kind} {}: {} commands ({} admitted, {} denied); acknowledged after \
         REPLICAOF and before link up: {}, while the replica was seen syncing: {}, \
         after link up: {}",
        sync.name,
        tally.total(),
        tally.admitted,
        tally.denied,
        at_link_up - after_replicaof,
        last_seen - first_seen,
        at_stop - at_link_up,
    );
    assert!(
        last_seen > first_seen,
        "no command was acknowledged while the replica was syncing \
         (acknowledged counts when first and last seen syncing: {first_seen}, {last_seen})"
    );
    assert!(tally.admitted > 0 && tally.denied > 0, "{tally:?}");
    let stats = master.info("stats");
    assert_eq!(
        info_field(&stats, "sync_full").as_deref(),
        Some("1"),
        "exactly one full sync"
    );
    assert!(
        master.log().contains(sync.master_log),
        "the master did not log {:?}; log:\n{}",
        sync.master_log,
        master.log()
    );

    wait_for_sync(&master, &replica);
    let keys = traffic.keys();
    assert_eq!(dbsize(&mut con), keys.len() as i64, "every limiter exists");
    assert_same_dataset(&master, &replica, &keys);
    let mut r = replica.conn();
    for (policy, _) in MIXED_POLICIES {
        assert_eq!(
            policy_rule(&mut r, policy),
            policy_rule(&mut con, policy),
            "policy {policy} differs on the replica"
        );
    }
}

#[test]
fn a_replica_full_resyncing_during_live_traffic_ends_byte_identical() {
    for_each_server(|kind| {
        for sync in &FULL_SYNCS {
            if sync.valkey_only && kind != ServerKind::Valkey {
                continue;
            }
            full_sync_during_traffic(kind, sync);
        }
    });
}

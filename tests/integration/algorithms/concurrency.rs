//! `RL.CONCURRENCY key limit lease_ms [COST n]`, `RL.RELEASE key lease` and
//! `RL.RENEW key lease lease_ms` against real servers: never more than
//! `limit` units held, a lease that is not released ends after `lease_ms`,
//! a renewal keeps it, lease ids are the same on a replica and after a
//! restart and are never reused for a key name, and bad input is an error
//! naming the argument.
//!
//! Waits poll the server with deadlines; nothing asserts how long a call
//! took, only what the server's own clock (`TIME`) says had passed.

use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::Duration;

use crate::harness::*;

/// The six integers of `RL.CONCURRENCY`: the five of every limiter, then
/// the lease (0 when denied).
fn acquire(con: &mut Connection, words: &[&str]) -> (Reply, i64) {
    let mut call = vec!["RL.CONCURRENCY"];
    call.extend_from_slice(words);
    let ints: Vec<i64> = query(con, &call);
    assert_eq!(
        ints.len(),
        6,
        "RL.CONCURRENCY replies six integers: {ints:?}"
    );
    (Reply::from_ints(&ints[..5]), ints[5])
}

fn release(con: &mut Connection, key: &str, lease: i64) -> i64 {
    query(con, &["RL.RELEASE", key, &lease.to_string()])
}

fn renew(con: &mut Connection, key: &str, lease: i64, lease_ms: &str) -> i64 {
    query(con, &["RL.RENEW", key, &lease.to_string(), lease_ms])
}

#[test]
fn a_lease_is_granted_denied_at_the_limit_and_released_once() {
    for_each_server(|kind| {
        let server = Server::start(kind, &[]);
        let mut con = server.conn();
        let (r, first) = acquire(&mut con, &["cc", "2", "60000", "COST", "2"]);
        assert!(r.allowed && first > 0, "{r:?}");
        assert_eq!((r.limit, r.remaining, r.wait_ms), (2, 0, 0));
        assert!((59_000..=60_001).contains(&r.reset_ms), "{r:?}");
        assert_eq!(key_type(&mut con, "cc"), "rl-concur");
        let pttl = pttl(&mut con, "cc");
        assert!(pttl > 59_000 && pttl <= 60_001, "PTTL {pttl}");
        let (denied, none) = acquire(&mut con, &["cc", "2", "60000"]);
        assert!(!denied.allowed && none == 0, "{denied:?}");
        assert!(
            denied.wait_ms > 59_000 && denied.wait_ms <= 60_000,
            "{denied:?}"
        );
        let (never, _) = acquire(&mut con, &["cc", "2", "60000", "COST", "3"]);
        assert_eq!(never.wait_ms, -1);
        let (peek, none) = acquire(&mut con, &["cc", "2", "60000", "COST", "0"]);
        assert!(peek.allowed && none == 0 && peek.remaining == 0, "{peek:?}");
        // An unknown lease releases nothing.
        assert_eq!(release(&mut con, "cc", first + 1_000_000), 0);
        assert_eq!(release(&mut con, "missing", first), 0);
        assert_eq!(renew(&mut con, "cc", 12345, "1000"), 0);
        assert!(!acquire(&mut con, &["cc", "2", "60000"]).0.allowed);
        assert_eq!(release(&mut con, "cc", first), 1);
        assert_eq!(release(&mut con, "cc", first), 0, "a lease ends once");
        let (r, second) = acquire(&mut con, &["cc", "2", "60000"]);
        assert!(r.allowed && second > first, "{r:?} {second} after {first}");
    });
}

/// 50 clients acquire, hold and release: the holders counted by the
/// clients themselves never exceed the limit, and every lease is released.
#[test]
fn fifty_concurrent_clients_never_hold_more_than_the_limit() {
    for_each_server(|kind| {
        let server = Arc::new(Server::start(kind, &[]));
        const LIMIT: i64 = 5;
        let holding = Arc::new(AtomicI64::new(0));
        let most = Arc::new(AtomicI64::new(0));
        let granted = Arc::new(AtomicU64::new(0));
        let clients: Vec<_> = (0..50)
            .map(|_| {
                let (server, holding, most, granted) = (
                    server.clone(),
                    holding.clone(),
                    most.clone(),
                    granted.clone(),
                );
                thread::spawn(move || {
                    let mut con = server.conn();
                    for _ in 0..40 {
                        let (r, lease) = acquire(&mut con, &["jobs", "5", "600000"]);
                        if !r.allowed {
                            continue;
                        }
                        granted.fetch_add(1, Ordering::Relaxed);
                        let now = holding.fetch_add(1, Ordering::SeqCst) + 1;
                        most.fetch_max(now, Ordering::SeqCst);
                        assert!(now <= LIMIT, "{now} holders of a limit of {LIMIT}");
                        // Hold across a round trip, so that holders overlap.
                        let _: String = query(&mut con, &["PING"]);
                        holding.fetch_sub(1, Ordering::SeqCst);
                        assert_eq!(release(&mut con, "jobs", lease), 1);
                    }
                })
            })
            .collect();
        for client in clients {
            client.join().expect("a client failed");
        }
        assert!(most.load(Ordering::SeqCst) <= LIMIT);
        assert!(granted.load(Ordering::Relaxed) >= 40, "too few grants");
        let mut con = server.conn();
        let (peek, _) = acquire(&mut con, &["jobs", "5", "600000", "COST", "0"]);
        assert_eq!(peek.remaining, LIMIT, "every lease was released");
    });
}

/// A holder that never releases frees its units `lease_ms` after the grant,
/// by the server's clock; the key then vanishes, and a key made again under
/// the same name never hands out an id it gave before.
#[test]
fn an_unreleased_lease_ends_after_lease_ms_and_ids_are_never_reused() {
    for_each_server(|kind| {
        let server = Server::start(kind, &[]);
        let mut con = server.conn();
        let granted_us = server_time_us(&mut con);
        let (r, first) = acquire(&mut con, &["crash", "1", "300"]);
        assert!(r.allowed);
        let (denied, _) = acquire(&mut con, &["crash", "1", "300"]);
        assert!(
            !denied.allowed && (1..=300).contains(&denied.wait_ms),
            "{denied:?}"
        );
        let (again, second) = poll_for(
            "the unreleased lease to end",
            Duration::from_secs(20),
            || acquire(&mut con_of(&server), &["crash", "1", "300"]),
            |(r, _)| r.allowed,
        );
        assert!(again.allowed && second > first);
        let elapsed_us = server_time_us(&mut con) - granted_us;
        assert!(elapsed_us >= 300_000, "freed after {elapsed_us} us");
        assert_eq!(release(&mut con, "crash", second), 1);
        poll_until("the idle key to vanish", Duration::from_secs(20), || {
            !exists(&mut con, "crash")
        });
        let (r, third) = acquire(&mut con, &["crash", "1", "300"]);
        assert!(r.allowed && third > second, "{third} after {second}");
        assert_eq!(
            release(&mut con, "crash", first),
            0,
            "a stale release frees nothing"
        );
    });
}

fn con_of(server: &Server) -> Connection {
    server.conn()
}

/// RENEW keeps a lease past its first `lease_ms`, by the server's clock;
/// once the renewals stop it ends.
#[test]
fn a_renewed_lease_is_kept() {
    for_each_server(|kind| {
        let server = Server::start(kind, &[]);
        let mut con = server.conn();
        let start_us = server_time_us(&mut con);
        let (_, lease) = acquire(&mut con, &["long", "1", "1500"]);
        while server_time_us(&mut con) - start_us < 4_000_000 {
            assert_eq!(renew(&mut con, "long", lease, "1500"), 1, "renewed in time");
            assert!(!acquire(&mut con, &["long", "1", "1500"]).0.allowed);
            thread::sleep(Duration::from_millis(100));
        }
        let pttl = pttl(&mut con, "long");
        assert!(pttl > 0 && pttl <= 1500, "PTTL {pttl} follows the renewal");
        poll_until(
            "the lease to end once no longer renewed",
            Duration::from_secs(20),
            || {
                acquire(&mut con_of(&server), &["long", "1", "1500"])
                    .0
                    .allowed
            },
        );
        assert_eq!(renew(&mut con, "long", lease, "1500"), 0);
    });
}

#[test]
fn bad_input_is_an_error_naming_the_argument() {
    for_each_server(|kind| {
        let server = Server::start(kind, &[]);
        let mut con = server.conn();
        let (_, lease) = acquire(&mut con, &["e", "2", "60000"]);
        let _: () = query(&mut con, &["SET", "str", "x"]);
        let before = dump(&mut con, "e");
        let lease = lease.to_string();
        for (words, error) in [
            (
                vec!["RL.CONCURRENCY", "e", "0", "1000"],
                "limit must be an integer from 1 to 16777215",
            ),
            (
                vec!["RL.CONCURRENCY", "e", "2", "0"],
                "lease_ms must be an integer from 1 to",
            ),
            (
                vec!["RL.CONCURRENCY", "e", "2", "1000", "COST", "x"],
                "COST must be",
            ),
            (
                vec!["RL.RELEASE", "e", "x"],
                "lease must be an integer from 0 to",
            ),
            (
                vec!["RL.RELEASE", "e", "-1"],
                "lease must be an integer from 0 to",
            ),
            (vec!["RL.RELEASE", "e", &lease, "AT", "5"], "AT is reserved"),
            (
                vec!["RL.RELEASE", "e", &lease, "EXTRA"],
                "unknown option 'EXTRA'",
            ),
            (
                vec!["RL.RENEW", "e", &lease, "0"],
                "lease_ms must be an integer from 1 to",
            ),
            (
                vec!["RL.RENEW", "e", &lease, "1099511627777"],
                "lease_ms must be an integer from 1 to",
            ),
            (vec!["RL.RELEASE", "str", "1"], "WRONGTYPE"),
            (vec!["RL.TOKENBUCKET", "e", "1", "1", "1"], "WRONGTYPE"),
            (
                vec!["RL.ALL", "1", "k", "CONCURRENCY", "2", "1000"],
                "spec 1: CONCURRENCY cannot be used here",
            ),
            (vec!["RL.RELEASE", "e"], "wrong number of arguments"),
            (vec!["RL.RENEW", "e", "1"], "wrong number of arguments"),
        ] {
            let got = query_err(&mut con, &words);
            assert!(got.contains(error), "{words:?}: {got}");
        }
        assert_eq!(dump(&mut con, "e"), before, "an error wrote nothing");
    });
}

#[test]
fn policies_take_concurrency_and_rl_all_refuses_it() {
    for_each_server(|kind| {
        let server = Server::start(kind, &[]);
        let mut con = server.conn();
        let _: String = query(
            &mut con,
            &["RL.POLICY", "SET", "jobs", "CONCURRENCY", "1", "60000"],
        );
        let ints: Vec<i64> = query(&mut con, &["RL.HIT", "jobs", "p"]);
        assert_eq!(&ints[..3], &[1, 1, 0]);
        assert!(ints[5] > 0, "{ints:?}");
        let denied: Vec<i64> = query(&mut con, &["RL.HIT", "jobs", "p"]);
        assert_eq!((denied[0], denied[5]), (0, 0));
        assert_eq!(release(&mut con, "p", ints[5]), 1);
        let got = query_err(&mut con, &["RL.ALL", "1", "q", "POLICY", "jobs"]);
        assert!(
            got.contains("policy 'jobs' is CONCURRENCY, which cannot be used here"),
            "{got}"
        );
    });
}

/// Acquires, releases and renewals reach a replica as the master ran them:
/// the same leases with the same ids (byte-identical `DUMP`).
#[test]
fn a_replica_holds_the_same_leases() {
    for_each_server(|kind| {
        let master = Server::start(kind, &[]);
        let replica = replica_of(&master);
        let mut con = master.conn();
        let mut leases = Vec::new();
        for _ in 0..6 {
            leases.push(acquire(&mut con, &["rep", "10", "600000"]).1);
        }
        assert_eq!(release(&mut con, "rep", leases[1]), 1);
        assert_eq!(renew(&mut con, "rep", leases[2], "900000"), 1);
        acquire(&mut con, &["rep", "10", "600000", "COST", "3"]);
        wait_for_sync(&master, &replica);
        let mut rcon = replica.conn();
        assert_eq!(dump(&mut rcon, "rep"), dump(&mut con, "rep"));
        assert!(dump(&mut con, "rep").is_some());
        // A replica's copy releases as the master's would.
        let _: () = query(&mut rcon, &["REPLICAOF", "NO", "ONE"]);
        assert_eq!(release(&mut rcon, "rep", leases[3]), 1);
        assert_eq!(release(&mut rcon, "rep", leases[1]), 0);
    });
}

/// RDB restart, AOF restart, an AOF rewritten without the RDB preamble
/// (`RL.SETSTATE`), `DUMP`/`RESTORE` and `COPY` keep the leases.
#[test]
fn leases_survive_persistence() {
    for_each_server(|kind| {
        for args in [
            &[][..],
            &["--appendonly", "yes"][..],
            &["--appendonly", "yes", "--aof-use-rdb-preamble", "no"][..],
        ] {
            let mut server = Server::start(kind, args);
            let mut con = server.conn();
            let (_, a) = acquire(&mut con, &["p", "4", "600000", "COST", "2"]);
            let (_, b) = acquire(&mut con, &["p", "4", "600000"]);
            if args.len() == 4 {
                let _: Value = query(&mut con, &["BGREWRITEAOF"]);
                poll_until("the AOF rewrite", Duration::from_secs(20), || {
                    let info = server.info("persistence");
                    info_field(&info, "aof_rewrite_in_progress").as_deref() == Some("0")
                        && info_field(&info, "aof_rewrite_scheduled").as_deref() == Some("0")
                        && info_field(&info, "aof_rewrites").as_deref() != Some("0")
                });
                assert_eq!(renew(&mut con, "p", a, "700000"), 1);
            } else if args.is_empty() {
                save(&mut con);
            }
            let before = dump(&mut con, "p");
            server.restart();
            let mut con = server.conn();
            assert_eq!(dump(&mut con, "p"), before, "{args:?}");
            let _: i64 = query(&mut con, &["COPY", "p", "p2"]);
            assert_eq!(dump(&mut con, "p2"), before, "COPY");
            let payload = dump(&mut con, "p").unwrap();
            let _: () = redis::cmd("RESTORE")
                .arg("p3")
                .arg(60_000)
                .arg(payload)
                .query(&mut con)
                .unwrap();
            assert_eq!(dump(&mut con, "p3"), before, "RESTORE");
            let usage: i64 = query(&mut con, &["MEMORY", "USAGE", "p"]);
            assert!(usage > 0);
            assert_eq!(release(&mut con, "p", b), 1, "{args:?}");
            assert_eq!(release(&mut con, "p3", a), 1, "the restored copy");
            assert!(
                !acquire(&mut con, &["p", "4", "600000", "COST", "3"])
                    .0
                    .allowed
            );
        }
    });
}

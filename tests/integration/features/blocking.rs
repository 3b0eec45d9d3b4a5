//! `BLOCK timeout_ms` against real servers: a blocked request is admitted
//! when the limiter allows and before any call of a flood gets a unit,
//! blocked requests go in arrival order, a timeout answers the denial, a
//! disconnect consumes nothing, `MULTI` and scripts answer at once,
//! replicas and the AOF see the admissions, `ratelimit.max-blocked` is
//! enforced, a release or a `DEL` lets waiters in, `RL.ALL` admits all its
//! limiters together, and 10,000 blocked clients all get their replies.
//!
//! Each blocked call runs on a connection of its own, in a thread; the test
//! waits for the server to report it blocked (`ratelimit_blocked_now`)
//! before going on. Nothing asserts how long a call took but with wide
//! bounds; order and state are read from the server.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::{Arc, Mutex};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use crate::harness::*;

fn blocked_now(server: &Server) -> u64 {
    info_field(&server.info("ratelimit"), "ratelimit_blocked_now")
        .expect("ratelimit_blocked_now in INFO")
        .parse()
        .expect("a number")
}

fn info_count(server: &Server, field: &str) -> u64 {
    info_field(&server.info("ratelimit"), field)
        .unwrap_or_else(|| panic!("{field} in INFO"))
        .parse()
        .expect("a number")
}

/// Waits until `n` requests are blocked on the server.
fn until_blocked(server: &Server, n: u64) {
    poll_until(
        &format!("{n} blocked requests"),
        Duration::from_secs(20),
        || blocked_now(server) == n,
    );
}

/// Runs `words` on a new connection in a thread: the reply, and when it came.
fn call_in_thread(server: &Server, words: &[&str]) -> JoinHandle<(Vec<i64>, Instant)> {
    let mut con = server.conn();
    let words: Vec<String> = words.iter().map(|w| w.to_string()).collect();
    thread::spawn(move || {
        let words: Vec<&str> = words.iter().map(String::as_str).collect();
        let reply: Vec<i64> = query(&mut con, &words);
        (reply, Instant::now())
    })
}

/// The call `words` in RESP, as a client writes it.
fn resp(words: &[&str]) -> Vec<u8> {
    let mut out = format!("*{}\r\n", words.len()).into_bytes();
    for w in words {
        out.extend_from_slice(format!("${}\r\n{}\r\n", w.len(), w).as_bytes());
    }
    out
}

#[test]
fn a_blocked_request_waits_for_its_unit_and_a_flood_gets_none() {
    for_each_server(|kind| {
        let server = Server::start(kind, &[]);
        let mut con = server.conn();
        let bucket = ["RL.TOKENBUCKET", "b", "1", "1", "400"];
        let before_us = server_time_us(&mut con);
        assert!(rl(&mut con, &bucket).allowed, "the one token");
        let mut blocking = bucket.to_vec();
        blocking.extend(["BLOCK", "10000"]);
        let waiter = call_in_thread(&server, &blocking);
        until_blocked(&server, 1);
        // A flood of calls that do not block: none takes the unit the
        // blocked request waits for.
        let mut flood = 0;
        while blocked_now(&server) == 1 {
            let r = rl(&mut con, &bucket);
            assert!(!r.allowed, "a call of the flood got a unit: {r:?}");
            assert!(r.wait_ms > 0, "{r:?}");
            flood += 1;
        }
        let (reply, _) = waiter.join().expect("the waiter");
        let after_us = server_time_us(&mut con);
        let r = Reply::from_ints(&reply);
        assert!(r.allowed && r.remaining == 0, "{r:?}");
        assert!(
            after_us - before_us >= 400_000,
            "admitted no earlier than the bucket allows: {} µs",
            after_us - before_us
        );
        // The unit went to the waiter: the bucket is empty right after.
        let next = rl(&mut con, &bucket);
        assert!(!next.allowed && next.wait_ms > 300, "{next:?}");
        assert!(flood > 0);
        assert_eq!(info_count(&server, "ratelimit_blocked_admitted"), 1);
        assert_eq!(info_count(&server, "ratelimit_blocked_total"), 1);
        assert_eq!(blocked_now(&server), 0);
    });
}

#[test]
fn blocked_requests_are_admitted_in_arrival_order() {
    for_each_server(|kind| {
        let server = Server::start(kind, &[]);
        let mut con = server.conn();
        // One token per 1.5 s: the first waiter waits 4.5 s, long enough for
        // the others to block behind it on a loaded host.
        let params = ["3", "1", "1500"];
        let call = |cost: &str| {
            let mut words = vec!["RL.TOKENBUCKET", "q"];
            words.extend(params);
            words.extend(["COST", cost, "BLOCK", "20000"]);
            words.into_iter().map(String::from).collect::<Vec<_>>()
        };
        assert!(
            rl(
                &mut con,
                &["RL.TOKENBUCKET", "q", "3", "1", "1500", "COST", "3"]
            )
            .allowed
        );
        // A large request first, then small ones that would fit earlier:
        // they wait their turn.
        let costs = ["3", "1", "2", "1"];
        let mut waiters = Vec::new();
        for (i, cost) in costs.iter().enumerate() {
            let words = call(cost);
            let words: Vec<&str> = words.iter().map(String::as_str).collect();
            waiters.push(call_in_thread(&server, &words));
            until_blocked(&server, i as u64 + 1);
        }
        let done: Vec<(Vec<i64>, Instant)> = waiters
            .into_iter()
            .map(|w| w.join().expect("a waiter"))
            .collect();
        for (reply, _) in &done {
            assert_eq!(reply[0], 1, "{reply:?}");
        }
        for pair in done.windows(2) {
            assert!(
                pair[0].1 < pair[1].1,
                "admitted out of arrival order: {:?}",
                done.iter().map(|d| &d.0).collect::<Vec<_>>()
            );
        }
        assert_eq!(info_count(&server, "ratelimit_blocked_admitted"), 4);
    });
}

#[test]
fn a_timeout_answers_the_denial_and_consumes_nothing() {
    for_each_server(|kind| {
        let server = Server::start(kind, &[]);
        let mut con = server.conn();
        let bucket = ["RL.TOKENBUCKET", "t", "1", "1", "500"];
        assert!(rl(&mut con, &bucket).allowed);
        let mut blocking = bucket.to_vec();
        blocking.extend(["BLOCK", "700"]);
        let started = Instant::now();
        let waiter = call_in_thread(&server, &blocking);
        until_blocked(&server, 1);
        // A forced call puts the bucket in debt: the waiter's unit now comes
        // after its deadline.
        assert!(rl(&mut con, &["RL.TOKENBUCKET", "t", "1", "1", "500", "FORCE"]).allowed);
        let before = dump(&mut con, "t");
        let (reply, at) = waiter.join().expect("the waiter");
        let r = Reply::from_ints(&reply);
        assert!(!r.allowed && r.wait_ms > 0, "the denial: {r:?}");
        let waited = at - started;
        assert!(
            waited >= Duration::from_millis(690) && waited < Duration::from_millis(5000),
            "answered at the timeout: {waited:?}"
        );
        assert_eq!(dump(&mut con, "t"), before, "nothing consumed");
        assert_eq!(info_count(&server, "ratelimit_blocked_timed_out"), 1);
        assert_eq!(blocked_now(&server), 0);
        // Denied at once: never admissible, or not within the timeout.
        let never = rl(
            &mut con,
            &[
                "RL.TOKENBUCKET",
                "t",
                "1",
                "1",
                "500",
                "COST",
                "2",
                "BLOCK",
                "0",
            ],
        );
        assert_eq!(never.wait_ms, -1);
        let long = rl(
            &mut con,
            &["RL.TOKENBUCKET", "t", "1", "1", "500", "BLOCK", "10"],
        );
        assert!(!long.allowed && long.wait_ms > 10, "{long:?}");
        assert_eq!(info_count(&server, "ratelimit_blocked_total"), 1);
    });
}

#[test]
fn a_client_that_disconnects_while_blocked_consumes_nothing() {
    for_each_server(|kind| {
        let server = Server::start(kind, &[]);
        let mut con = server.conn();
        let bucket = ["RL.TOKENBUCKET", "d", "1", "1", "3000"];
        assert!(rl(&mut con, &bucket).allowed);
        let before = dump(&mut con, "d");
        let mut socket = TcpStream::connect(("127.0.0.1", server.port)).expect("connect");
        let mut blocking = bucket.to_vec();
        blocking.extend(["BLOCK", "20000"]);
        socket.write_all(&resp(&blocking)).expect("send");
        until_blocked(&server, 1);
        drop(socket);
        until_blocked(&server, 0);
        assert_eq!(dump(&mut con, "d"), before, "nothing consumed");
        // And nobody is waiting any more: the unit goes to the next call.
        let r = poll_for(
            "the bucket's token",
            Duration::from_secs(10),
            || rl(&mut con, &bucket),
            |r| r.allowed,
        );
        assert_eq!(r.remaining, 0);
        assert_eq!(info_count(&server, "ratelimit_blocked_admitted"), 0);
    });
}

#[test]
fn multi_scripts_and_functions_answer_at_once() {
    for_each_server(|kind| {
        let server = Server::start(kind, &[]);
        let mut con = server.conn();
        con.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let bucket = ["RL.TOKENBUCKET", "m", "1", "1", "3600000"];
        assert!(rl(&mut con, &bucket).allowed);
        let replies: Vec<Vec<i64>> = redis::pipe()
            .atomic()
            .cmd("RL.TOKENBUCKET")
            .arg(&["m", "1", "1", "3600000", "BLOCK", "0"])
            .query(&mut con)
            .expect("MULTI/EXEC answers at once");
        assert_eq!(replies[0][0], 0, "{replies:?}");
        let script = "return redis.call('RL.TOKENBUCKET', KEYS[1], 1, 1, 3600000, 'BLOCK', 0)";
        let reply: Vec<i64> = query(&mut con, &["EVAL", script, "1", "m"]);
        assert_eq!(reply[0], 0, "EVAL answers at once: {reply:?}");
        let library =
            "#!lua name=rlblock\nredis.register_function('rl_block', function(keys, args) \
            return redis.call('RL.TOKENBUCKET', keys[1], 1, 1, 3600000, 'BLOCK', 0) end)";
        let _: String = query(&mut con, &["FUNCTION", "LOAD", library]);
        let reply: Vec<i64> = query(&mut con, &["FCALL", "rl_block", "1", "m"]);
        assert_eq!(reply[0], 0, "FCALL answers at once: {reply:?}");
        assert_eq!(info_count(&server, "ratelimit_blocked_total"), 0);
    });
}

#[test]
fn max_blocked_is_enforced() {
    for_each_server(|kind| {
        let server = Server::start(kind, &["--ratelimit.max-blocked", "2"]);
        let mut con = server.conn();
        let bucket = ["RL.TOKENBUCKET", "x", "1", "1", "60000"];
        assert!(rl(&mut con, &bucket).allowed);
        let mut blocking = bucket.to_vec();
        blocking.extend(["BLOCK", "0"]);
        let mut sockets = Vec::new();
        for n in 1..=2 {
            let mut socket = TcpStream::connect(("127.0.0.1", server.port)).expect("connect");
            socket.write_all(&resp(&blocking)).expect("send");
            sockets.push(socket);
            until_blocked(&server, n);
        }
        // The third answers at once, as without BLOCK.
        let third = rl(&mut con, &blocking);
        assert!(!third.allowed && third.wait_ms > 0, "{third:?}");
        assert_eq!(blocked_now(&server), 2);
        let max: Vec<String> = query(&mut con, &["CONFIG", "GET", "ratelimit.max-blocked"]);
        assert_eq!(max[1], "2");
        drop(sockets);
        until_blocked(&server, 0);
    });
}

#[test]
fn a_release_wakes_a_blocked_acquirer_at_once() {
    for_each_server(|kind| {
        let server = Server::start(kind, &[]);
        let mut con = server.conn();
        let held: Vec<i64> = query(&mut con, &["RL.CONCURRENCY", "c", "1", "60000"]);
        assert_eq!(held[0], 1);
        let lease = held[5].to_string();
        // The lease would free only after a minute, beyond the waiter's
        // timeout: it waits all the same, for a release.
        let waiter = call_in_thread(
            &server,
            &["RL.CONCURRENCY", "c", "1", "60000", "BLOCK", "20000"],
        );
        until_blocked(&server, 1);
        assert_eq!(query::<i64>(&mut con, &["RL.RELEASE", "c", &lease]), 1);
        let (reply, _) = waiter.join().expect("the waiter");
        assert_eq!(reply.len(), 6, "{reply:?}");
        assert_eq!(reply[0], 1, "{reply:?}");
        assert!(reply[5] > held[5], "a new lease: {reply:?}");
        // It holds the one unit now.
        let denied: Vec<i64> = query(&mut con, &["RL.CONCURRENCY", "c", "1", "60000"]);
        assert_eq!(denied[0], 0);
        // With no release, the timeout answers the denial; nothing is held.
        let started = Instant::now();
        let (reply, at) = call_in_thread(
            &server,
            &["RL.CONCURRENCY", "c", "1", "60000", "BLOCK", "400"],
        )
        .join()
        .expect("the waiter");
        assert_eq!((reply[0], reply[5]), (0, 0), "{reply:?}");
        assert!(
            at - started >= Duration::from_millis(390),
            "{:?}",
            at - started
        );
        assert_eq!(info_count(&server, "ratelimit_blocked_timed_out"), 1);
    });
}

#[test]
fn a_deleted_key_lets_its_waiters_in() {
    for_each_server(|kind| {
        let server = Server::start(kind, &[]);
        let mut con = server.conn();
        let bucket = ["RL.TOKENBUCKET", "del", "1", "1", "4000"];
        assert!(rl(&mut con, &bucket).allowed);
        let mut blocking = bucket.to_vec();
        blocking.extend(["BLOCK", "20000"]);
        let started = Instant::now();
        let waiter = call_in_thread(&server, &blocking);
        until_blocked(&server, 1);
        assert_eq!(query::<i64>(&mut con, &["DEL", "del"]), 1);
        let (reply, at) = waiter.join().expect("the waiter");
        assert_eq!(reply[0], 1, "{reply:?}");
        let version: String = info_field(&server.info("server"), "redis_version").unwrap();
        let major_minor: Vec<u32> = version
            .split('.')
            .take(2)
            .map(|p| p.parse().unwrap())
            .collect();
        // Redis before 7.2 retries no client blocked on a missing key: the
        // waiter goes in at its own timer (when the bucket would have had
        // its token), not at once (docs/commands.md, "BLOCK").
        let at_once = kind == ServerKind::Valkey || major_minor >= vec![7, 2];
        if at_once {
            assert!(
                at - started < Duration::from_millis(3000),
                "{:?}",
                at - started
            );
        }
    });
}

#[test]
fn rl_all_with_block_admits_all_limiters_together() {
    for_each_server(|kind| {
        let server = Server::start(kind, &[]);
        let mut con = server.conn();
        assert!(rl(&mut con, &["RL.TOKENBUCKET", "{a}1", "1", "1", "300"]).allowed);
        assert!(rl(&mut con, &["RL.TOKENBUCKET", "{a}2", "1", "1", "900"]).allowed);
        let waiter = call_in_thread(
            &server,
            &[
                "RL.ALL",
                "2",
                "{a}1",
                "{a}2",
                "TOKENBUCKET",
                "1",
                "1",
                "300",
                "TOKENBUCKET",
                "1",
                "1",
                "900",
                "BLOCK",
                "10000",
            ],
        );
        until_blocked(&server, 1);
        let (reply, _) = waiter.join().expect("the waiter");
        assert_eq!(reply.len(), 6, "{reply:?}");
        assert_eq!((reply[0], reply[5]), (1, 0), "{reply:?}");
        // Both took their unit at the same instant, when the slower one had
        // it: the faster bucket is empty again right after.
        let first = rl(&mut con, &["RL.TOKENBUCKET", "{a}1", "1", "1", "300"]);
        let second = rl(&mut con, &["RL.TOKENBUCKET", "{a}2", "1", "1", "900"]);
        assert!(!first.allowed && first.wait_ms > 200, "{first:?}");
        assert!(!second.allowed && second.wait_ms > 800, "{second:?}");
    });
}

#[test]
fn rl_hit_blocks_on_an_enforced_policy() {
    for_each_server(|kind| {
        let server = Server::start(kind, &[]);
        let mut con = server.conn();
        let _: String = query(
            &mut con,
            &["RL.POLICY", "SET", "p", "FIXEDWINDOW", "1", "500"],
        );
        away_from_window_end(&mut con, 500, 300);
        assert!(rl(&mut con, &["RL.HIT", "p", "h"]).allowed);
        let waiter = call_in_thread(&server, &["RL.HIT", "p", "h", "BLOCK", "5000"]);
        let (reply, _) = waiter.join().expect("the waiter");
        assert_eq!(reply[0], 1, "admitted in the next window: {reply:?}");
        assert_eq!(info_count(&server, "ratelimit_blocked_admitted"), 1);
    });
}

#[test]
fn blocked_admissions_reach_the_replica_and_the_aof() {
    // Buckets of 100 emptied at once, one token back per 2 s: each waiter
    // stays blocked at least 2 s, far longer than the next one takes to
    // block on a loaded host (at 200 ms, a waiter could be admitted before
    // the next had blocked, and the count of blocked requests never reached
    // what the test waits for); the keys stay 200 s from idle, so none
    // expires while the replica, the AOF and the restart are compared.
    for_each_server(|kind| {
        let mut master = Server::start(kind, &["--appendonly", "yes"]);
        let replica = replica_of(&master);
        let mut con = master.conn();
        let keys: Vec<String> = (0..3).map(|i| format!("r{i}")).collect();
        for key in &keys {
            assert!(
                rl(
                    &mut con,
                    &["RL.TOKENBUCKET", key, "100", "1", "2000", "COST", "100"]
                )
                .allowed
            );
        }
        let mut waiters = Vec::new();
        for (i, key) in keys.iter().enumerate() {
            for j in 0..2 {
                waiters.push(call_in_thread(
                    &master,
                    &["RL.TOKENBUCKET", key, "100", "1", "2000", "BLOCK", "10000"],
                ));
                until_blocked(&master, (i * 2 + j + 1) as u64);
            }
        }
        // And one that times out: nothing of it propagates.
        waiters.push(call_in_thread(
            &master,
            &[
                "RL.TOKENBUCKET",
                "r0",
                "100",
                "1",
                "2000",
                "COST",
                "2",
                "BLOCK",
                "300",
            ],
        ));
        for w in waiters {
            w.join().expect("a waiter");
        }
        assert_eq!(info_count(&master, "ratelimit_blocked_admitted"), 6);
        wait_for_sync(&master, &replica);
        assert_same_dataset(&master, &replica, &keys);
        let before: Vec<Option<Vec<u8>>> = keys.iter().map(|k| dump(&mut con, k)).collect();
        drop(con);
        master.restart();
        let mut con = master.conn();
        let after: Vec<Option<Vec<u8>>> = keys.iter().map(|k| dump(&mut con, k)).collect();
        assert_eq!(before, after, "the AOF replays the blocked admissions");
    });
}

#[test]
fn ten_thousand_blocked_clients_all_get_their_replies() {
    const CLIENTS: usize = 10_000;
    const KEYS: usize = 100;
    raise_open_files(CLIENTS as u64 + 2_000);
    for_each_server(|kind| {
        let server = Server::start(kind, &["--maxclients", "11000"]);
        let mut con = server.conn();
        // Each key's one unit is held by a lease of a minute: every client
        // blocks (BLOCK 0, no limit) until the test releases it; then each
        // one's own 2 ms lease lets the next in as it expires.
        let mut held = Vec::new();
        for k in 0..KEYS {
            let key = format!("many{k}");
            let lease: Vec<i64> = query(&mut con, &["RL.CONCURRENCY", &key, "1", "60000"]);
            assert_eq!(lease[0], 1);
            held.push((key, lease[5].to_string()));
        }
        let mut sockets = Vec::with_capacity(CLIENTS);
        for i in 0..CLIENTS {
            let key = format!("many{}", i % KEYS);
            let mut socket = TcpStream::connect(("127.0.0.1", server.port))
                .unwrap_or_else(|e| panic!("client {i}: {e}"));
            socket
                .write_all(&resp(&["RL.CONCURRENCY", &key, "1", "2", "BLOCK", "0"]))
                .expect("send");
            sockets.push(socket);
        }
        until_blocked(&server, CLIENTS as u64);
        for (key, lease) in &held {
            assert_eq!(query::<i64>(&mut con, &["RL.RELEASE", key, lease]), 1);
        }
        let admitted = Arc::new(Mutex::new(0usize));
        for mut socket in sockets {
            socket
                .set_read_timeout(Some(Duration::from_secs(120)))
                .unwrap();
            let mut reply = Vec::new();
            let mut buf = [0u8; 256];
            // `*6\r\n` and six integers.
            while reply.iter().filter(|&&b| b == b'\n').count() < 7 {
                let n = socket.read(&mut buf).expect("a reply");
                assert!(n > 0, "the server closed a blocked client");
                reply.extend_from_slice(&buf[..n]);
            }
            assert!(
                reply.starts_with(b"*6\r\n:1\r\n"),
                "{}",
                String::from_utf8_lossy(&reply)
            );
            *admitted.lock().unwrap() += 1;
        }
        assert_eq!(*admitted.lock().unwrap(), CLIENTS);
        until_blocked(&server, 0);
        assert_eq!(
            info_count(&server, "ratelimit_blocked_admitted"),
            CLIENTS as u64
        );
    });
}

/// Raises this process's open-file limit to at least `n` (up to the hard
/// limit, raised too when the tests run as root).
fn raise_open_files(n: u64) {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: a valid pointer to a `rlimit`.
    unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) };
    if limit.rlim_cur >= n {
        return;
    }
    let wanted = libc::rlimit {
        rlim_cur: n.max(limit.rlim_cur),
        rlim_max: n.max(limit.rlim_max),
    };
    // SAFETY: a valid pointer to a `rlimit`.
    if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &wanted) } != 0 {
        let soft = libc::rlimit {
            rlim_cur: limit.rlim_max,
            rlim_max: limit.rlim_max,
        };
        // SAFETY: as above.
        unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &soft) };
    }
}

#[test]
fn a_master_turned_replica_unblocks_its_waiters_like_blpop() {
    for_each_server(|kind| {
        let server = Server::start(kind, &[]);
        let other = Server::start(kind, &[]);
        let mut con = server.conn();
        let bucket = ["RL.TOKENBUCKET", "f", "1", "1", "60000"];
        assert!(rl(&mut con, &bucket).allowed);
        let mut socket = TcpStream::connect(("127.0.0.1", server.port)).expect("connect");
        let mut blocking = bucket.to_vec();
        blocking.extend(["BLOCK", "0"]);
        socket.write_all(&resp(&blocking)).expect("send");
        until_blocked(&server, 1);
        // A failover makes the old master a replica: blocked clients are
        // disconnected or unblocked with an error, as for BLPOP.
        let port = other.port.to_string();
        let _: String = query(&mut con, &["REPLICAOF", "127.0.0.1", &port]);
        socket
            .set_read_timeout(Some(Duration::from_secs(20)))
            .unwrap();
        let mut buf = [0u8; 256];
        let n = socket.read(&mut buf).unwrap_or(0);
        let reply = String::from_utf8_lossy(&buf[..n]).to_string();
        assert!(n == 0 || reply.starts_with("-UNBLOCKED"), "{reply}");
        until_blocked(&server, 0);
        assert_eq!(info_count(&server, "ratelimit_blocked_admitted"), 0);
    });
}

#[test]
fn a_blocked_upto_waits_for_its_first_unit_and_takes_what_fits_then() {
    for_each_server(|kind| {
        let server = Server::start(kind, &[]);
        let mut con = server.conn();
        // Two tokens, one back every 400 ms: empty it, then wait.
        let bucket = ["RL.TOKENBUCKET", "bu", "2", "1", "400"];
        let mut take = bucket.to_vec();
        take.extend(["COST", "2"]);
        assert!(rl(&mut con, &take).allowed);
        let mut blocking = bucket.to_vec();
        blocking.extend(["UPTO", "5", "BLOCK", "10000"]);
        let waiter = call_in_thread(&server, &blocking);
        until_blocked(&server, 1);
        let (reply, _) = waiter.join().expect("the waiter");
        assert_eq!(reply.len(), 6, "{reply:?}");
        assert!(
            reply[0] == 1 && reply[5] >= 1,
            "admitted with at least one unit: {reply:?}"
        );
        assert_eq!(info_count(&server, "ratelimit_blocked_admitted"), 1);
        // A timeout answers the denial of one unit, granted 0.
        let mut short = bucket.to_vec();
        short.extend(["UPTO", "5", "BLOCK", "1"]);
        let r: Vec<i64> = query(&mut con, &short);
        assert_eq!(r.len(), 6, "{r:?}");
        assert_eq!(r[0] == 0, r[5] == 0, "granted 0 exactly on a denial: {r:?}");
    });
}

//! Keyspace notifications: a call that changes a limiter emits an event of
//! the module class named after its command (`rl.tokenbucket`, `rl.hit`,
//! `rl.all`, ...) on its key, then `expire` exactly when it writes the key's
//! expiry, as native write commands do; a call that changes nothing (a
//! denial, `COST 0`, a refund of nothing, an `OFF` policy) emits nothing.

use std::time::Duration;

use crate::harness::contract::*;
use crate::harness::*;

/// The `(event, key)` pairs the server publishes on `__keyevent@0__:*`
/// while `calls` run, up to a marker `SET` sent after them.
fn events(server: &Server, calls: impl FnOnce(&mut Connection)) -> Vec<(String, String)> {
    let mut listener = server.conn();
    let mut pubsub = listener.as_pubsub();
    pubsub.psubscribe("__keyevent@0__:*").expect("PSUBSCRIBE");
    pubsub
        .set_read_timeout(Some(Duration::from_secs(10)))
        .expect("a read timeout");
    let mut con = server.conn();
    calls(&mut con);
    let _: () = query(&mut con, &["SET", "marker", "1"]);
    let mut seen = Vec::new();
    loop {
        let message = pubsub.get_message().expect("an event before the marker");
        let event = message
            .get_channel_name()
            .trim_start_matches("__keyevent@0__:")
            .to_string();
        let key: String = message.get_payload().expect("a key name");
        if (event.as_str(), key.as_str()) == ("set", "marker") {
            return seen;
        }
        seen.push((event, key));
    }
}

fn pairs(expected: &[(&str, &str)]) -> Vec<(String, String)> {
    expected
        .iter()
        .map(|(e, k)| (e.to_string(), k.to_string()))
        .collect()
}

fn notifying(kind: ServerKind) -> Server {
    Server::start(kind, &["--notify-keyspace-events", "KEA"])
}

#[test]
fn every_limiter_command_notifies_its_writes_and_only_them() {
    for_each_server(|kind| {
        let server = notifying(kind);
        for alg in &ALGORITHMS {
            let event = alg.command.to_lowercase();
            let key = alg.key;
            let mut con = server.conn();
            alg.away_from_window_end(&mut con, &alg.valid());
            // A new key: written, and its expiry set.
            let seen = events(&server, |con| {
                alg.slow(con, key, "5", "2");
            });
            assert_eq!(seen, pairs(&[(&event, key), ("expire", key)]), "{alg}");
            // A denial, a peek, a refused call, a refund of nothing on
            // another key: nothing.
            let seen = events(&server, |con| {
                alg.slow(con, key, "5", "4");
                alg.slow(con, key, "5", "0");
                alg.call_err(con, key, &["0"]);
                let mut args = alg.slow_params("5");
                args.extend(["REFUND", "1"]);
                alg.call(con, "other", &args);
            });
            assert_eq!(
                seen,
                pairs(&[]),
                "{alg}: a call that changed nothing notified"
            );
            // A refund that gives something back, and a forced call.
            let seen = events(&server, |con| {
                let mut args = alg.slow_params("5");
                args.extend(["REFUND", "1"]);
                alg.call(con, key, &args);
                let mut args = alg.slow_params("5");
                args.extend(["COST", "9", "FORCE"]);
                alg.call(con, key, &args);
            });
            let written: Vec<&(String, String)> =
                seen.iter().filter(|(e, _)| *e == event).collect();
            assert_eq!(written.len(), 2, "{alg}: {seen:?}");
            assert!(
                seen.iter()
                    .all(|(e, k)| (e == &event || e == "expire") && k == key),
                "{alg}: {seen:?}"
            );
            let _: () = query(&mut con, &["FLUSHALL"]);
        }
    });
}

#[test]
fn expire_is_notified_exactly_when_the_expiry_is_written() {
    for_each_server(|kind| {
        let server = notifying(kind);
        let mut con = server.conn();
        away_from_window_end(&mut con, 3_600_000, 60_000);
        rl(&mut con, &["RL.FIXEDWINDOW", "fw", "10", "3600000"]);
        rl(&mut con, &["RL.TOKENBUCKET", "tb", "10", "1", "60000"]);
        // A fixed window's expiry is its window's end: set once per window.
        // A bucket's moves with every admission.
        let seen = events(&server, |con| {
            rl(con, &["RL.FIXEDWINDOW", "fw", "10", "3600000"]);
            rl(con, &["RL.TOKENBUCKET", "tb", "10", "1", "60000"]);
        });
        assert_eq!(
            seen,
            pairs(&[
                ("rl.fixedwindow", "fw"),
                ("rl.tokenbucket", "tb"),
                ("expire", "tb")
            ])
        );
        // A key that lost its expiry gets it back, and says so.
        let _: i64 = query(&mut con, &["PERSIST", "fw"]);
        let seen = events(&server, |con| {
            rl(con, &["RL.FIXEDWINDOW", "fw", "10", "3600000"]);
        });
        assert_eq!(seen, pairs(&[("rl.fixedwindow", "fw"), ("expire", "fw")]));
    });
}

#[test]
fn policies_and_rl_all_notify_under_their_own_names() {
    for_each_server(|kind| {
        let server = notifying(kind);
        let mut con = server.conn();
        let _: () = query(
            &mut con,
            &["RL.POLICY", "SET", "p", "TOKENBUCKET", "2", "1", SLOW],
        );
        let _: () = query(
            &mut con,
            &[
                "RL.POLICY",
                "SET",
                "off",
                "TOKENBUCKET",
                "2",
                "1",
                SLOW,
                "MODE",
                "OFF",
            ],
        );
        let seen = events(&server, |con| {
            rl(con, &["RL.HIT", "p", "u1"]);
            rl(con, &["RL.HIT", "off", "u2"]);
            let _: Vec<i64> = query(
                con,
                &[
                    "RL.ALL",
                    "2",
                    "{g}a",
                    "{g}b",
                    "POLICY",
                    "p",
                    "FIXEDWINDOW",
                    "5",
                    SLOW,
                ],
            );
        });
        assert_eq!(
            seen,
            pairs(&[
                ("rl.hit", "u1"),
                ("expire", "u1"),
                ("rl.all", "{g}a"),
                ("expire", "{g}a"),
                ("rl.all", "{g}b"),
                ("expire", "{g}b"),
            ])
        );
        // A denied RL.ALL changes nothing anywhere, and says nothing.
        let seen = events(&server, |con| {
            let _: Vec<i64> = query(
                con,
                &[
                    "RL.ALL",
                    "2",
                    "{g}a",
                    "{g}b",
                    "POLICY",
                    "p",
                    "FIXEDWINDOW",
                    "5",
                    SLOW,
                    "COST",
                    "2",
                ],
            );
            rl(con, &["RL.HIT", "p", "u1", "COST", "2"]);
        });
        assert_eq!(seen, pairs(&[]));
    });
}

#[test]
fn nothing_is_notified_when_notifications_are_off() {
    for_each_server(|kind| {
        let server = Server::start(kind, &[]);
        let seen = events(&server, |con| {
            let _: () = query(con, &["CONFIG", "SET", "notify-keyspace-events", ""]);
            rl(con, &["RL.TOKENBUCKET", "tb", "10", "1", "60000"]);
            let _: () = query(con, &["CONFIG", "SET", "notify-keyspace-events", "E$"]);
        });
        assert_eq!(seen, pairs(&[]));
    });
}

/// `RL.CONCURRENCY` notifies a granted lease; `RL.RELEASE` and `RL.RENEW`
/// notify under their own names (then `expire`) when they ended or renewed
/// a lease, and nothing for an unknown one.
#[test]
fn lease_commands_notify_what_they_change() {
    for_each_server(|kind| {
        let server = notifying(kind);
        let mut con = server.conn();
        let mut lease = 0;
        let seen = events(&server, |con| {
            let reply: Vec<i64> = query(con, &["RL.CONCURRENCY", "cc", "2", "600000"]);
            lease = reply[5];
        });
        assert_eq!(seen, pairs(&[("rl.concurrency", "cc"), ("expire", "cc")]));
        let lease = lease.to_string();
        let seen = events(&server, |con| {
            let _: i64 = query(con, &["RL.RELEASE", "cc", "1"]);
            let _: i64 = query(con, &["RL.RENEW", "cc", "1", "1000"]);
            let _: Vec<i64> = query(con, &["RL.CONCURRENCY", "cc", "2", "600000", "COST", "0"]);
        });
        assert_eq!(seen, pairs(&[]), "nothing changed, nothing notified");
        let seen = events(&server, |con| {
            let _: i64 = query(con, &["RL.RENEW", "cc", &lease, "900000"]);
        });
        assert_eq!(seen, pairs(&[("rl.renew", "cc"), ("expire", "cc")]));
        let seen = events(&server, |con| {
            let _: i64 = query(con, &["RL.RELEASE", "cc", &lease]);
        });
        assert_eq!(
            seen.first(),
            pairs(&[("rl.release", "cc")]).first(),
            "{seen:?}"
        );
        let _: () = query(&mut con, &["FLUSHALL"]);
    });
}

#[test]
fn upto_notifies_the_admission_it_was_and_a_denial_nothing() {
    for_each_server(|kind| {
        let server = notifying(kind);
        let seen = events(&server, |con| {
            let r: Vec<i64> = query(con, &["RL.FIXEDWINDOW", "nu", "3", "1000000", "UPTO", "5"]);
            assert_eq!((r[0], r[5]), (1, 3));
            let r: Vec<i64> = query(con, &["RL.FIXEDWINDOW", "nu", "3", "1000000", "UPTO", "5"]);
            assert_eq!((r[0], r[5]), (0, 0));
        });
        assert_eq!(seen, pairs(&[("rl.fixedwindow", "nu"), ("expire", "nu")]));
    });
}

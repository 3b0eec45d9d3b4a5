//! `RL.ALL numkeys key [key ...] <spec> [<spec> ...] [COST n]`: several
//! limiters in one call, all or nothing. Units are taken from every limiter
//! only if every one admits; a denial anywhere changes nothing anywhere (a
//! user denied by the global limit keeps their own tokens). The reply is the
//! five integers of the most restrictive limiter and `denied_by`.
//!
//! Also here, as tests: the two production set-ups that motivated RL.ALL (the
//! same scenarios are spelt out for redis-cli in tests/cli/scenarios.sh).

use crate::harness::*;

/// `RL.ALL`'s six integers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct AllReply {
    /// The most restrictive limiter's five integers.
    limiter: Reply,
    /// 1-based position of the first limiter that denied; 0 when admitted.
    denied_by: i64,
}

impl AllReply {
    fn from_value(value: &Value) -> AllReply {
        let ints: Vec<i64> = match value {
            Value::Array(items) => items
                .iter()
                .map(|item| match item {
                    Value::Int(i) => *i,
                    other => panic!("RL.ALL reply holds a non-integer: {other:?}"),
                })
                .collect(),
            other => panic!("RL.ALL reply is not an array: {other:?}"),
        };
        assert_eq!(ints.len(), 6, "RL.ALL replies 6 integers: {ints:?}");
        assert!(
            (ints[0] == 1) == (ints[5] == 0),
            "denied_by is 0 exactly when admitted: {ints:?}"
        );
        AllReply {
            limiter: Reply::from_ints(&ints[..5]),
            denied_by: ints[5],
        }
    }
}

fn all(con: &mut Connection, words: &[&str]) -> AllReply {
    AllReply::from_value(&query(con, words))
}

/// Builds `RL.ALL n key... spec... [COST cost]` from (key, spec) pairs.
fn all_words<'a>(limiters: &[(&'a str, &[&'a str])], cost: Option<&'a str>) -> Vec<&'a str> {
    let numkeys: &'static str = ["0", "1", "2", "3", "4", "5", "6"][limiters.len()];
    let mut words = vec!["RL.ALL", numkeys];
    words.extend(limiters.iter().map(|(key, _)| *key));
    for (_, spec) in limiters {
        words.extend_from_slice(spec);
    }
    if let Some(cost) = cost {
        words.extend(["COST", cost]);
    }
    words
}

/// Runs `words` as one MULTI/EXEC and returns each reply.
fn transaction(con: &mut Connection, commands: &[Vec<&str>]) -> Vec<Value> {
    let _: () = query(con, &["MULTI"]);
    for words in commands {
        let queued: String = query(con, words);
        assert_eq!(queued, "QUEUED", "{words:?}");
    }
    match query(con, &["EXEC"]) {
        Value::Array(items) => items,
        other => panic!("EXEC replied {other:?}"),
    }
}

/// Every key of the database with its `DUMP` and `PTTL`, sorted by name.
fn snapshot(con: &mut Connection) -> Vec<(String, Option<Vec<u8>>, i64)> {
    let mut keys: Vec<String> = query(con, &["KEYS", "*"]);
    keys.sort();
    keys.into_iter()
        .map(|key| {
            let dumped = dump(con, &key);
            let ttl = pttl(con, &key);
            (key, dumped, ttl)
        })
        .collect()
}

/// Asserts nothing changed since `before`: same keys, same `DUMP`, and no
/// TTL moved later (a denial never extends a key's life).
fn assert_unchanged(con: &mut Connection, before: &[(String, Option<Vec<u8>>, i64)], what: &str) {
    let after = snapshot(con);
    let names = |s: &[(String, Option<Vec<u8>>, i64)]| -> Vec<String> {
        s.iter().map(|(k, _, _)| k.clone()).collect()
    };
    assert_eq!(names(&after), names(before), "{what}: keys changed");
    for ((key, dump_before, ttl_before), (_, dump_after, ttl_after)) in before.iter().zip(&after) {
        assert_eq!(dump_after, dump_before, "{what}: DUMP {key} changed");
        assert!(
            *ttl_after <= *ttl_before,
            "{what}: PTTL {key} went from {ttl_before} to {ttl_after}"
        );
    }
}

// Limiters that do not move while a test runs (one unit back per hour), so
// counts are exact whatever the machine's load.
const TB_10: &[&str] = &["TOKENBUCKET", "10", "1", "3600000"];
const FW_20: &[&str] = &["FIXEDWINDOW", "20", "3600000"];
const LB_8: &[&str] = &["LEAKYBUCKET", "8", "1", "3600000"];
const SL_5: &[&str] = &["SLIDING", "5", "3600000"];
const HW_7: &[&str] = &["HASHWINDOW", "7", "3600000", "60000"];

/// The hourly fixed window must not roll over in the middle of a test.
fn away_from_the_hour(con: &mut Connection) {
    away_from_window_end(con, 3_600_000, 60_000);
}

/// `remaining` of one limiter, looked at with `COST 0` (which changes
/// nothing and creates nothing).
fn remaining(con: &mut Connection, key: &str, spec: &[&str]) -> i64 {
    let mut words = vec![match spec[0] {
        "TOKENBUCKET" => "RL.TOKENBUCKET",
        "FIXEDWINDOW" => "RL.FIXEDWINDOW",
        "LEAKYBUCKET" => "RL.LEAKYBUCKET",
        "SLIDING" => "RL.SLIDING",
        "HASHWINDOW" => "RL.HASHWINDOW",
        other => panic!("unknown algorithm {other}"),
    }];
    words.push(key);
    words.extend_from_slice(&spec[1..]);
    words.extend(["COST", "0"]);
    rl(con, &words).remaining
}

#[test]
fn admitted_call_takes_its_cost_from_every_limiter() {
    for_each_server(|kind| {
        let server = Server::start(kind, &[]);
        let mut con = server.conn();
        away_from_the_hour(&mut con);
        let limiters: [(&str, &[&str]); 5] = [
            ("tb", TB_10),
            ("fw", FW_20),
            ("lb", LB_8),
            ("sl", SL_5),
            ("hw", HW_7),
        ];
        let r = all(&mut con, &all_words(&limiters, None));
        // The sliding log (limit 5) is the most restrictive: 4 left.
        assert_eq!(r.denied_by, 0);
        assert_eq!(
            (
                r.limiter.allowed,
                r.limiter.limit,
                r.limiter.remaining,
                r.limiter.wait_ms
            ),
            (true, 5, 4, 0)
        );
        // (A sliding-log entry may leave the window up to 1 ms late.)
        assert!(
            r.limiter.reset_ms > 0 && r.limiter.reset_ms <= 3_600_001,
            "{r:?}"
        );
        let expected = [9, 19, 7, 4, 6];
        for ((key, spec), left) in limiters.iter().zip(expected) {
            assert_eq!(remaining(&mut con, key, spec), left, "{key}");
            assert!(pttl(&mut con, key) > 0, "{key} has no TTL");
        }
        // COST n takes n from each.
        let r = all(&mut con, &all_words(&limiters, Some("3")));
        assert_eq!((r.limiter.allowed, r.limiter.remaining), (true, 1));
        for ((key, spec), left) in limiters.iter().zip(expected) {
            assert_eq!(remaining(&mut con, key, spec), left - 3, "{key}");
        }
        // The leaky bucket's queueing delay is the call's wait_ms, whichever
        // limiter has the fewest units left: the caller must wait that long.
        assert!(
            r.limiter.wait_ms > 0 && r.limiter.wait_ms <= 3_600_000,
            "{r:?}"
        );
    });
}

#[test]
fn cost_zero_looks_without_taking_or_creating() {
    for_each_server(|kind| {
        let server = Server::start(kind, &[]);
        let mut con = server.conn();
        let _ = all(&mut con, &all_words(&[("tb", TB_10)], Some("4")));
        let before = snapshot(&mut con);
        let r = all(
            &mut con,
            &all_words(&[("tb", TB_10), ("new", SL_5)], Some("0")),
        );
        assert_eq!(r.denied_by, 0);
        assert_eq!(
            (r.limiter.allowed, r.limiter.limit, r.limiter.remaining),
            (true, 5, 5)
        );
        assert_unchanged(&mut con, &before, "COST 0");
        assert!(!exists(&mut con, "new"));
    });
}

#[test]
fn reply_is_the_most_restrictive_limiter_and_the_first_denier() {
    for_each_server(|kind| {
        let server = Server::start(kind, &[]);
        let mut con = server.conn();
        away_from_the_hour(&mut con);
        // Admitted: the limiter with the fewest units left answers.
        let r = all(
            &mut con,
            &all_words(
                &[("big", TB_10), ("small", FW_20), ("tiny", SL_5)],
                Some("2"),
            ),
        );
        assert_eq!(
            (
                r.limiter.allowed,
                r.limiter.limit,
                r.limiter.remaining,
                r.denied_by
            ),
            (true, 5, 3, 0)
        );

        // Two empty buckets: one back in a minute, one in an hour.
        let minute: &[&str] = &["TOKENBUCKET", "1", "1", "60000"];
        let hour: &[&str] = &["TOKENBUCKET", "1", "1", "3600000"];
        let _ = all(&mut con, &all_words(&[("m", minute), ("h", hour)], None));
        // Both deny: denied_by names the first, wait_ms is the longer wait
        // (the call can pass only when both have a token again).
        let r = all(&mut con, &all_words(&[("m", minute), ("h", hour)], None));
        assert_eq!((r.limiter.allowed, r.denied_by), (false, 1));
        assert!(
            r.limiter.wait_ms > 60_000 && r.limiter.wait_ms <= 3_600_000,
            "{r:?}"
        );
        let r = all(&mut con, &all_words(&[("h", hour), ("m", minute)], None));
        assert_eq!((r.limiter.allowed, r.denied_by), (false, 1));
        assert!(r.limiter.wait_ms > 60_000, "{r:?}");
        // Only the second denies.
        let r = all(
            &mut con,
            &all_words(&[("fresh", TB_10), ("m", minute)], None),
        );
        assert_eq!(
            (r.limiter.allowed, r.limiter.limit, r.denied_by),
            (false, 1, 2)
        );
        assert!(
            r.limiter.wait_ms > 0 && r.limiter.wait_ms <= 60_000,
            "{r:?}"
        );
        assert!(!exists(&mut con, "fresh"));

        // A cost above a limit can never pass: wait_ms -1, whatever else waits.
        let r = all(
            &mut con,
            &all_words(&[("h", hour), ("ten", TB_10), ("five", SL_5)], Some("6")),
        );
        assert_eq!(
            (r.limiter.allowed, r.limiter.wait_ms, r.denied_by),
            (false, -1, 1)
        );
        let r = all(
            &mut con,
            &all_words(&[("ten", TB_10), ("five", SL_5)], Some("6")),
        );
        assert_eq!(
            (
                r.limiter.allowed,
                r.limiter.limit,
                r.limiter.wait_ms,
                r.denied_by
            ),
            (false, 5, -1, 2)
        );
    });
}

#[test]
fn denied_reply_says_denied_even_when_a_leaky_bucket_would_queue_longer() {
    for_each_server(|kind| {
        let server = Server::start(kind, &[]);
        let mut con = server.conn();
        let queue: &[&str] = &["LEAKYBUCKET", "8", "1", "3600000"];
        let minute: &[&str] = &["TOKENBUCKET", "1", "1", "60000"];
        let r = all(&mut con, &all_words(&[("lb", queue), ("g", minute)], None));
        assert_eq!((r.limiter.allowed, r.denied_by), (true, 0));
        // The bucket denies (a token in a minute); the queue alone would
        // admit with an hour's delay. The call is denied: allowed is 0, and
        // the reply is the denier's (AllReply checks allowed == 0 with
        // denied_by != 0).
        for limiters in [
            [("lb", queue), ("g", minute)],
            [("g", minute), ("lb", queue)],
        ] {
            let words = all_words(&limiters, None);
            let r = all(&mut con, &words);
            assert!(!r.limiter.allowed, "{words:?}: {r:?}");
            assert!(
                r.limiter.wait_ms > 0 && r.limiter.wait_ms <= 3_600_000,
                "{words:?}: {r:?}"
            );
        }
        assert_eq!(remaining(&mut con, "lb", queue), 7);
    });
}

#[test]
fn denial_by_any_limiter_changes_no_key() {
    for_each_server(|kind| {
        let server = Server::start(kind, &[]);
        let mut con = server.conn();
        away_from_the_hour(&mut con);
        let global: &[&str] = &["FIXEDWINDOW", "3", "3600000"];
        // Some state in every limiter first.
        for key in ["u1", "u2", "u3"] {
            let r = all(
                &mut con,
                &all_words(&[(key, TB_10), ("global", global)], None),
            );
            assert!(r.limiter.allowed);
        }
        let _ = all(
            &mut con,
            &all_words(&[("sl", SL_5), ("hw", HW_7), ("lb", LB_8)], Some("2")),
        );
        let before = snapshot(&mut con);
        // The global limit denies, in every position; existing limiters that
        // would admit keep their state, missing ones are not created.
        let attempts: Vec<Vec<(&str, &[&str])>> = vec![
            vec![("u1", TB_10), ("global", global)],
            vec![("global", global), ("u1", TB_10)],
            vec![("u4", TB_10), ("global", global)],
            vec![
                ("sl", SL_5),
                ("hw", HW_7),
                ("lb", LB_8),
                ("new", FW_20),
                ("global", global),
            ],
        ];
        for limiters in &attempts {
            let words = all_words(limiters, None);
            let r = all(&mut con, &words);
            let position = limiters.iter().position(|(k, _)| *k == "global").unwrap() as i64 + 1;
            assert_eq!(
                (r.limiter.allowed, r.denied_by),
                (false, position),
                "{words:?}"
            );
            assert_unchanged(&mut con, &before, &format!("{words:?}"));
        }
        // Denied by a user's own limit too (COST beyond what is left).
        let words = all_words(&[("sl", SL_5), ("new", TB_10)], Some("4"));
        let r = all(&mut con, &words);
        assert_eq!((r.limiter.allowed, r.denied_by), (false, 1));
        assert_unchanged(&mut con, &before, "denied by the first limiter");
    });
}

#[test]
fn user_denied_by_the_global_limit_keeps_their_tokens() {
    for_each_server(|kind| {
        let server = Server::start(kind, &[]);
        let mut con = server.conn();
        let user: &[&str] = &["TOKENBUCKET", "5", "1", "3600000"];
        let global_2: &[&str] = &["TOKENBUCKET", "2", "1", "3600000"];
        for key in ["alice", "bob"] {
            let r = all(
                &mut con,
                &all_words(&[(key, user), ("global", global_2)], None),
            );
            assert!(r.limiter.allowed, "{key}: {r:?}");
        }
        let r = all(
            &mut con,
            &all_words(&[("carol", user), ("global", global_2)], None),
        );
        assert_eq!(
            (r.limiter.allowed, r.limiter.limit, r.denied_by),
            (false, 2, 2)
        );
        assert!(!exists(&mut con, "carol"), "carol's bucket was touched");
        assert_eq!(remaining(&mut con, "carol", user), 5);
        // Raising the global capacity (a rule change adds room, refills
        // nothing) lets carol in: she spends her first token, not her sixth.
        let global_3: &[&str] = &["TOKENBUCKET", "3", "1", "3600000"];
        let r = all(
            &mut con,
            &all_words(&[("carol", user), ("global", global_3)], None),
        );
        assert_eq!(
            (r.limiter.allowed, r.limiter.remaining, r.denied_by),
            (true, 0, 0)
        );
        assert_eq!(remaining(&mut con, "carol", user), 4);
        assert_eq!(remaining(&mut con, "alice", user), 4);
    });
}

#[test]
fn bad_calls_are_refused_naming_the_problem_and_write_nothing() {
    for_each_server(|kind| {
        let server = Server::start(kind, &[]);
        let mut con = server.conn();
        let many_keys: Vec<String> = (0..17).map(|i| format!("k{i}")).collect();
        let mut seventeen = vec!["RL.ALL", "17"];
        seventeen.extend(many_keys.iter().map(String::as_str));
        for _ in 0..17 {
            seventeen.extend_from_slice(TB_10);
        }
        let numkeys = "ERR numkeys must be an integer from 1 to 16";
        // (words, the error it must start with)
        let cases: Vec<(Vec<&str>, &str)> = vec![
            (
                vec!["RL.ALL", "0", "a", "TOKENBUCKET", "5", "5", "1000"],
                numkeys,
            ),
            (
                vec!["RL.ALL", "-1", "a", "TOKENBUCKET", "5", "5", "1000"],
                numkeys,
            ),
            (
                vec!["RL.ALL", "x", "a", "TOKENBUCKET", "5", "5", "1000"],
                numkeys,
            ),
            (seventeen.clone(), numkeys),
            (
                vec!["RL.ALL", "3", "a", "TOKENBUCKET", "5", "5", "1000"],
                "ERR wrong number of arguments",
            ),
            (vec!["RL.ALL", "1", "a"], "ERR wrong number of arguments"),
            (
                vec![
                    "RL.ALL",
                    "2",
                    "a",
                    "a",
                    "TOKENBUCKET",
                    "5",
                    "5",
                    "1000",
                    "SLIDING",
                    "5",
                    "1000",
                ],
                "ERR key 'a' is given more than once",
            ),
            (
                vec!["RL.ALL", "2", "a", "b", "TOKENBUCKET", "5", "5", "1000"],
                "ERR 2 keys need 2 specs, got 1",
            ),
            (
                vec!["RL.ALL", "1", "a", "GCRA", "5", "5", "1000"],
                "ERR spec 1: unknown algorithm 'GCRA'",
            ),
            (
                vec![
                    "RL.ALL", "2", "a", "b", "SLIDING", "5", "1000", "BUCKET", "1", "2",
                ],
                "ERR spec 2: unknown algorithm 'BUCKET'",
            ),
            (
                vec!["RL.ALL", "1", "a", "TOKENBUCKET", "5", "5"],
                "ERR spec 1",
            ),
            (
                vec!["RL.ALL", "1", "a", "POLICY", "x"],
                "ERR unknown policy 'x'",
            ),
            (
                vec![
                    "RL.ALL",
                    "2",
                    "a",
                    "b",
                    "TOKENBUCKET",
                    "5",
                    "5",
                    "1000",
                    "POLICY",
                    "checkout",
                ],
                "ERR unknown policy 'checkout'",
            ),
            (
                vec!["RL.ALL", "1", "a", "TOKENBUCKET", "5", "5", "1000", "COST"],
                "ERR COST needs a value",
            ),
            (
                vec![
                    "RL.ALL",
                    "1",
                    "a",
                    "TOKENBUCKET",
                    "5",
                    "5",
                    "1000",
                    "COST",
                    "-1",
                ],
                "ERR COST must be an integer",
            ),
            (
                vec![
                    "RL.ALL",
                    "1",
                    "a",
                    "TOKENBUCKET",
                    "5",
                    "5",
                    "1000",
                    "COST",
                    "1",
                    "COST",
                    "1",
                ],
                "ERR COST given more than once",
            ),
            (
                vec![
                    "RL.ALL",
                    "1",
                    "a",
                    "TOKENBUCKET",
                    "5",
                    "5",
                    "1000",
                    "BURST",
                    "3",
                ],
                "ERR unknown option 'BURST'",
            ),
            (
                vec![
                    "RL.ALL",
                    "1",
                    "a",
                    "TOKENBUCKET",
                    "5",
                    "5",
                    "1000",
                    "AT",
                    "1",
                ],
                "ERR AT is reserved for replication and AOF loading",
            ),
            (
                vec!["RL.ALL", "1", "a", "SLIDING", "100001", "1000"],
                "ERR limit is above ratelimit.sliding-max-limit (100000)",
            ),
            (
                vec!["RL.ALL", "1", "a", "HASHWINDOW", "5", "1000", "300"],
                "ERR bucket_ms must divide window_ms",
            ),
        ];
        for (words, expected) in &cases {
            let err = query_err(&mut con, words);
            assert!(
                err.starts_with(expected),
                "{words:?}: expected {expected}..., got: {err}"
            );
        }
        let err = query_err(
            &mut con,
            &[
                "RL.ALL",
                "2",
                "a",
                "b",
                "SLIDING",
                "5",
                "1000",
                "HASHWINDOW",
                "5",
                "1000",
            ],
        );
        assert!(
            err.starts_with("ERR spec 2") && err.contains("needs 3 parameters"),
            "a short spec: {err}"
        );

        // A bad parameter in any spec names the parameter; the limiters
        // before it are not touched.
        let named: &[(&[&str], &str)] = &[
            (&["TOKENBUCKET", "0", "5", "1000"], "capacity"),
            (&["TOKENBUCKET", "5", "0", "1000"], "refill_count"),
            (&["TOKENBUCKET", "5", "5", "x"], "refill_ms"),
            (&["FIXEDWINDOW", "-3", "1000"], "limit"),
            (&["FIXEDWINDOW", "3", "0"], "window_ms"),
            (&["LEAKYBUCKET", "1099511627777", "1", "1000"], "capacity"),
            (&["LEAKYBUCKET", "5", "1.5", "1000"], "leak_count"),
            (&["LEAKYBUCKET", "5", "1", ""], "leak_ms"),
            (&["SLIDING", "0", "1000"], "limit"),
            (&["SLIDING", "5", "1e3"], "window_ms"),
            (&["HASHWINDOW", "0", "1000", "100"], "limit"),
            (&["HASHWINDOW", "5", "0", "100"], "window_ms"),
            (&["HASHWINDOW", "5", "1000", "0"], "bucket_ms"),
        ];
        for (spec, name) in named {
            let mut words = vec!["RL.ALL", "2", "good", "bad"];
            words.extend_from_slice(TB_10);
            words.extend_from_slice(spec);
            let err = query_err(&mut con, &words);
            assert!(
                err.starts_with("ERR") && err.contains(name),
                "{words:?}: expected an ERR naming {name}, got: {err}"
            );
        }
        assert_eq!(dbsize(&mut con), 0, "a refused call wrote a key");
    });
}

#[test]
fn wrongtype_on_any_key_aborts_the_whole_call() {
    for_each_server(|kind| {
        let server = Server::start(kind, &[]);
        let mut con = server.conn();
        let _: () = query(&mut con, &["SET", "string", "x"]);
        let _ = all(&mut con, &all_words(&[("tb", TB_10), ("sl", SL_5)], None));
        let before = snapshot(&mut con);
        let wrongtype = "WRONGTYPE Operation against a key holding the wrong kind of value";
        let attempts: Vec<Vec<(&str, &[&str])>> = vec![
            // Another Redis type, last, after limiters that would admit.
            vec![("tb", TB_10), ("new", FW_20), ("string", SL_5)],
            // Another Redis type, first.
            vec![("string", TB_10), ("tb", TB_10)],
            // Another algorithm's state: the sliding log read as a bucket.
            vec![("tb", TB_10), ("new", HW_7), ("sl", TB_10)],
            vec![("sl", LB_8), ("tb", TB_10)],
        ];
        for limiters in &attempts {
            let words = all_words(limiters, None);
            assert_eq!(query_err(&mut con, &words), wrongtype, "{words:?}");
            assert_unchanged(&mut con, &before, &format!("{words:?}"));
        }
        let value: String = query(&mut con, &["GET", "string"]);
        assert_eq!(value, "x");
    });
}

#[test]
fn inside_multi_and_scripts_rl_all_behaves_the_same() {
    for_each_server(|kind| {
        let server = Server::start(kind, &[]);
        let mut con = server.conn();
        let global: &[&str] = &["TOKENBUCKET", "3", "1", "3600000"];
        let call = |user: &'static str| all_words(&[(user, TB_10), ("global", global)], None);
        let replies = transaction(
            &mut con,
            &[call("a"), call("a"), call("b"), call("c"), call("a")],
        );
        let replies: Vec<AllReply> = replies.iter().map(AllReply::from_value).collect();
        let outcome: Vec<(bool, i64, i64)> = replies
            .iter()
            .map(|r| (r.limiter.allowed, r.limiter.remaining, r.denied_by))
            .collect();
        assert_eq!(
            outcome,
            [
                (true, 2, 0),
                (true, 1, 0),
                (true, 0, 0),
                (false, 0, 2),
                (false, 0, 2)
            ]
        );
        assert!(!exists(&mut con, "c"));
        assert_eq!(remaining(&mut con, "a", TB_10), 8);

        // EVAL: the script passes the keys as KEYS, like any command.
        let script = "return redis.call('RL.ALL', 2, KEYS[1], KEYS[2], \
                      'SLIDING', 2, 3600000, 'FIXEDWINDOW', 100, 3600000)";
        let mut seen = Vec::new();
        for _ in 0..3 {
            let r =
                AllReply::from_value(&query(&mut con, &["EVAL", script, "2", "s:user", "s:all"]));
            seen.push((r.limiter.allowed, r.limiter.remaining, r.denied_by));
        }
        assert_eq!(seen, [(true, 1, 0), (true, 0, 0), (false, 0, 1)]);
        // A script may act on the answer, atomically.
        let script = "local r = redis.call('RL.ALL', 2, KEYS[1], KEYS[2], \
                      'TOKENBUCKET', 1, 1, 3600000, 'TOKENBUCKET', 10, 1, 3600000) \
                      if r[1] == 1 then redis.call('INCR', KEYS[3]) end return r[6]";
        let denied_by: Vec<i64> = (0..3)
            .map(|_| {
                query(
                    &mut con,
                    &["EVAL", script, "3", "e:user", "e:all", "e:admitted"],
                )
            })
            .collect();
        assert_eq!(denied_by, [0, 1, 1]);
        let admitted: i64 = query(&mut con, &["GET", "e:admitted"]);
        assert_eq!(admitted, 1);
        // An error inside a script is catchable and writes nothing.
        let script = "return redis.pcall('RL.ALL', 2, KEYS[1], KEYS[2], \
                      'TOKENBUCKET', 5, 5, 1000, 'POLICY', 'nope')['err']";
        let err: String = query(&mut con, &["EVAL", script, "2", "p:user", "p:all"]);
        assert_eq!(err, "ERR unknown policy 'nope'");
        assert!(!exists(&mut con, "p:user"));

        // FCALL, where the server has functions.
        let library = "#!lua name=rlall\n\
            redis.register_function('order', function(keys, args) \
            return redis.call('RL.ALL', 2, keys[1], keys[2], \
            'TOKENBUCKET', 5, 1, 3600000, 'TOKENBUCKET', 1, 1, 3600000) end)";
        let _: String = query(&mut con, &["FUNCTION", "LOAD", library]);
        let r = AllReply::from_value(&query(&mut con, &["FCALL", "order", "2", "f:u", "f:g"]));
        assert_eq!((r.limiter.allowed, r.limiter.remaining), (true, 0));
        let r = AllReply::from_value(&query(&mut con, &["FCALL", "order", "2", "f:u2", "f:g"]));
        assert_eq!((r.limiter.allowed, r.denied_by), (false, 2));
        assert!(!exists(&mut con, "f:u2"));
    });
}

// ---------------------------------------------------------------------------
// Replication

/// Keys and the spec each is always called with (a key keeps its algorithm;
/// parameters vary within it).
fn traffic_spec(random: &mut Xorshift64, key_index: usize) -> Vec<&'static str> {
    let choose = |random: &mut Xorshift64, options: &[&'static [&'static str]]| {
        options[random.below(options.len())].to_vec()
    };
    match key_index % 5 {
        0 => choose(
            random,
            &[
                &["TOKENBUCKET", "5", "5", "1000"],
                &["TOKENBUCKET", "20", "3", "997"],
                TB_10,
            ],
        ),
        1 => choose(
            random,
            &[
                &["FIXEDWINDOW", "15", "1000"],
                FW_20,
                &["FIXEDWINDOW", "4", "60000"],
            ],
        ),
        2 => choose(random, &[&["LEAKYBUCKET", "6", "3", "1000"], LB_8]),
        3 => choose(
            random,
            &[&["SLIDING", "10", "60000"], SL_5, &["SLIDING", "3", "1000"]],
        ),
        _ => choose(random, &[&["HASHWINDOW", "12", "60000", "1000"], HW_7]),
    }
}

/// `RL.ALL` from a script, its keys passed as `KEYS` and everything after
/// them as `ARGV`.
const FORWARD_SCRIPT: &str = "local args = {#KEYS} \
    for _, key in ipairs(KEYS) do table.insert(args, key) end \
    for _, arg in ipairs(ARGV) do table.insert(args, arg) end \
    return redis.call('RL.ALL', unpack(args))";

fn assert_same_on_replica(master: &mut Connection, replica: &mut Connection) {
    let keys: Vec<String> = query(master, &["KEYS", "*"]);
    assert!(!keys.is_empty());
    let mut compared = 0;
    for key in &keys {
        // Keys of the fastest limiters may be expiring right now; compare
        // the rest (most of them).
        if pttl(master, key) > 1000 {
            assert_eq!(dump(replica, key), dump(master, key), "DUMP {key} differs");
            let (ttl_master, ttl_replica) = (pttl(master, key), pttl(replica, key));
            assert!(
                (ttl_master - ttl_replica).abs() <= 1000,
                "PTTL {key}: master {ttl_master}, replica {ttl_replica}"
            );
            compared += 1;
        }
    }
    assert!(
        compared * 2 >= keys.len(),
        "only {compared} of {} keys compared",
        keys.len()
    );
}

#[test]
fn replica_is_byte_identical_after_mixed_rl_all_traffic() {
    for_each_server(|kind| {
        let master = Server::start(kind, QUIET_MASTER);
        let replica = replica_of(&master);
        let (mut m, mut r) = (master.conn(), replica.conn());
        let mut random = Xorshift64(0x0a11_0f0e_5eed);
        let keys: Vec<String> = (0..20).map(|i| format!("k{i}")).collect();
        let (mut admitted, mut denied) = (0, 0);
        for round in 0..500 {
            let count = 1 + random.below(4);
            let mut chosen: Vec<usize> = Vec::new();
            while chosen.len() < count {
                let k = random.below(keys.len());
                if !chosen.contains(&k) {
                    chosen.push(k);
                }
            }
            let specs: Vec<Vec<&str>> = chosen
                .iter()
                .map(|&k| traffic_spec(&mut random, k))
                .collect();
            let cost = ["0", "1", "1", "1", "2", "3"][random.below(6)];
            let numkeys = count.to_string();
            let mut words: Vec<&str> = vec!["RL.ALL", &numkeys];
            words.extend(chosen.iter().map(|&k| keys[k].as_str()));
            for spec in &specs {
                words.extend(spec.iter().copied());
            }
            words.extend(["COST", cost]);
            let reply = match round % 10 {
                // Some inside MULTI, some inside EVAL, the rest plain.
                0 => transaction(&mut m, &[words.clone()]).remove(0),
                1 => {
                    let mut eval = vec!["EVAL", FORWARD_SCRIPT, &numkeys];
                    eval.extend(&words[2..]);
                    query(&mut m, &eval)
                }
                _ => query(&mut m, &words),
            };
            if AllReply::from_value(&reply).limiter.allowed {
                admitted += 1;
            } else {
                denied += 1;
            }
        }
        assert!(
            admitted > 50 && denied > 50,
            "admitted {admitted}, denied {denied}"
        );
        wait_for_sync(&master, &replica);
        assert_same_on_replica(&mut m, &mut r);
    });
}

#[test]
fn denied_and_cost_zero_rl_all_calls_propagate_nothing() {
    for_each_server(|kind| {
        let master = Server::start(kind, QUIET_MASTER);
        let replica = replica_of(&master);
        let (mut m, mut r) = (master.conn(), replica.conn());
        let global: &[&str] = &["TOKENBUCKET", "2", "1", "3600000"];
        for user in ["a", "b"] {
            assert!(
                all(
                    &mut m,
                    &all_words(&[(user, TB_10), ("global", global)], None)
                )
                .limiter
                .allowed
            );
        }
        wait_for_sync(&master, &replica);
        let offset = master_offset(&master);
        for user in ["a", "b", "c", "d"] {
            for _ in 0..25 {
                let r = all(
                    &mut m,
                    &all_words(&[(user, TB_10), ("global", global)], None),
                );
                assert_eq!(r.denied_by, 2);
                let r = all(
                    &mut m,
                    &all_words(&[(user, TB_10), ("global", global)], Some("0")),
                );
                assert_eq!(r.denied_by, 0);
            }
        }
        assert_eq!(
            master_offset(&master),
            offset,
            "a denial or COST 0 was propagated"
        );
        assert_same_on_replica(&mut m, &mut r);
        assert_eq!(dbsize(&mut r), 3);
    });
}

// ---------------------------------------------------------------------------
// The production scenarios (also in tests/cli/scenarios.sh)

/// Order API: each user 5 requests per second (bursts of 5), the endpoint
/// 15,000 per second in all.
#[test]
fn scenario_order_api_user_5_per_second_endpoint_15000_per_second() {
    for_each_server(|kind| {
        let server = Server::start(kind, &[]);
        let mut con = server.conn();
        let user: &[&str] = &["TOKENBUCKET", "5", "5", "1000"];
        let endpoint: &[&str] = &["FIXEDWINDOW", "15000", "1000"];
        let call = |key: &'static str, endpoint: &'static [&'static str]| {
            all_words(&[(key, user), ("{order:api}:endpoint", endpoint)], None)
        };
        // A burst of 6 from one user, sent as one transaction so that it
        // lands within microseconds (no token comes back in between) and in
        // one window of the endpoint.
        away_from_window_end(&mut con, 1000, 300);
        let mut burst = vec![call("{order:api}:user:42", endpoint); 6];
        burst.push(vec![
            "RL.FIXEDWINDOW",
            "{order:api}:endpoint",
            "15000",
            "1000",
            "COST",
            "0",
        ]);
        let replies = transaction(&mut con, &burst);
        for (n, reply) in replies[..5].iter().enumerate() {
            let r = AllReply::from_value(reply);
            // The user's bucket is the most restrictive limiter.
            assert_eq!(
                (
                    r.limiter.allowed,
                    r.limiter.limit,
                    r.limiter.remaining,
                    r.denied_by
                ),
                (true, 5, 4 - n as i64, 0),
                "call {}",
                n + 1
            );
        }
        let sixth = AllReply::from_value(&replies[5]);
        assert_eq!((sixth.limiter.allowed, sixth.denied_by), (false, 1));
        assert!(
            sixth.limiter.wait_ms > 0 && sixth.limiter.wait_ms <= 200,
            "{sixth:?}"
        );
        // The endpoint counted the five admitted calls, not the denied one.
        assert_eq!(Reply::from_value(&replies[6]).remaining, 15000 - 5);

        // Now the endpoint is the one that is full (a small limit stands
        // for 15,000): the user it denies keeps their own 5 tokens.
        let endpoint_3: &'static [&'static str] = &["FIXEDWINDOW", "3", "1000"];
        let endpoint_key = "{order:api}:endpoint:small";
        let small = |key: &'static str| all_words(&[(key, user), (endpoint_key, endpoint_3)], None);
        away_from_window_end(&mut con, 1000, 300);
        let replies = transaction(
            &mut con,
            &[
                small("{order:api}:user:1"),
                small("{order:api}:user:1"),
                small("{order:api}:user:2"),
                small("{order:api}:user:3"),
                vec![
                    "RL.TOKENBUCKET",
                    "{order:api}:user:3",
                    "5",
                    "5",
                    "1000",
                    "COST",
                    "0",
                ],
            ],
        );
        let outcome: Vec<(bool, i64, i64)> = replies[..4]
            .iter()
            .map(AllReply::from_value)
            .map(|r| (r.limiter.allowed, r.limiter.limit, r.denied_by))
            .collect();
        // The endpoint (2, 1, 0 left) is the most restrictive limiter each
        // time; it denies user 3 (position 2).
        assert_eq!(
            outcome,
            [(true, 3, 0), (true, 3, 0), (true, 3, 0), (false, 3, 2)]
        );
        assert_eq!(Reply::from_value(&replies[4]).remaining, 5);
        assert!(!exists(&mut con, "{order:api}:user:3"));
        // In the next window user 3 gets in, and spends the first of their
        // five tokens.
        let user_3_left = "RL.TOKENBUCKET {order:api}:user:3 5 5 1000 COST 0";
        let mut left_after = None;
        poll_until(
            "the endpoint's next window",
            std::time::Duration::from_secs(10),
            || {
                let replies = transaction(
                    &mut con,
                    &[
                        small("{order:api}:user:3"),
                        user_3_left.split(' ').collect(),
                    ],
                );
                let admitted = AllReply::from_value(&replies[0]).limiter.allowed;
                left_after = admitted.then(|| Reply::from_value(&replies[1]).remaining);
                admitted
            },
        );
        assert_eq!(left_after, Some(4));
    });
}

/// Order submission: each user 10 per minute, exactly (sliding log), and
/// 1,000 per second for the whole service.
#[test]
fn scenario_order_submit_user_10_per_minute_1000_per_second_globally() {
    for_each_server(|kind| {
        let server = Server::start(kind, &[]);
        let mut con = server.conn();
        let user: &[&str] = &["SLIDING", "10", "60000"];
        let global: &[&str] = &["TOKENBUCKET", "1000", "1000", "1000"];
        let submit = all_words(
            &[
                ("{order:submit}:user:7", user),
                ("{order:submit}:global", global),
            ],
            None,
        );
        let global_left = "RL.TOKENBUCKET {order:submit}:global 1000 1000 1000 COST 0";
        let mut calls = vec![submit.clone(); 11];
        calls.push(global_left.split(' ').collect());
        let mut replies = transaction(&mut con, &calls).into_iter();
        for n in 0..10 {
            let r = AllReply::from_value(&replies.next().unwrap());
            assert_eq!(
                (
                    r.limiter.allowed,
                    r.limiter.limit,
                    r.limiter.remaining,
                    r.denied_by
                ),
                (true, 10, 9 - n, 0),
                "submit {}",
                n + 1
            );
        }
        // The 11th within the minute is refused by the user's own limit, and
        // told to come back when the first submit leaves the window.
        let r = AllReply::from_value(&replies.next().unwrap());
        assert_eq!(
            (r.limiter.allowed, r.limiter.limit, r.denied_by),
            (false, 10, 1)
        );
        assert!(
            r.limiter.wait_ms > 50_000 && r.limiter.wait_ms <= 60_001,
            "{r:?}"
        );
        // The global bucket gave 10 tokens, not 11 (it refills one per ms,
        // hardly any within one transaction).
        let global_left = Reply::from_value(&replies.next().unwrap()).remaining;
        assert!((990..=992).contains(&global_left), "{global_left}");

        // The global limit full (3 per second standing for 1,000): the user
        // it denies keeps all 10 of their submits for the minute.
        let global_3: &[&str] = &["TOKENBUCKET", "3", "3", "1000"];
        let small = |key: &'static str| {
            all_words(
                &[(key, user), ("{order:submit}:global:small", global_3)],
                None,
            )
        };
        let replies = transaction(
            &mut con,
            &[
                small("{order:submit}:user:1"),
                small("{order:submit}:user:1"),
                small("{order:submit}:user:2"),
                small("{order:submit}:user:3"),
                vec![
                    "RL.SLIDING",
                    "{order:submit}:user:3",
                    "10",
                    "60000",
                    "COST",
                    "0",
                ],
            ],
        );
        let outcome: Vec<(bool, i64)> = replies[..4]
            .iter()
            .map(AllReply::from_value)
            .map(|r| (r.limiter.allowed, r.denied_by))
            .collect();
        assert_eq!(outcome, [(true, 0), (true, 0), (true, 0), (false, 2)]);
        let denied = AllReply::from_value(&replies[3]);
        assert!(
            denied.limiter.wait_ms > 0 && denied.limiter.wait_ms <= 334,
            "{denied:?}"
        );
        assert_eq!(Reply::from_value(&replies[4]).remaining, 10);
        assert!(!exists(&mut con, "{order:submit}:user:3"));
        // Once a global token is back, user 3 submits and has 9 left.
        poll_until(
            "a global token back",
            std::time::Duration::from_secs(10),
            || {
                all(&mut con, &small("{order:submit}:user:3"))
                    .limiter
                    .allowed
            },
        );
        assert_eq!(remaining(&mut con, "{order:submit}:user:3", user), 9);
    });
}

// ---------------------------------------------------------------------------
// EACH: every limiter's own answer

/// `RL.ALL ... EACH`'s reply: the call's `head` integers (6, or 7 with
/// `UPTO`), then every limiter's five.
fn all_each(con: &mut Connection, words: &[&str], head: usize) -> (Vec<i64>, Vec<Reply>) {
    let ints: Vec<i64> = query(con, words);
    assert!(
        ints.len() >= head && (ints.len() - head).is_multiple_of(5),
        "{words:?} replied {ints:?}"
    );
    let each = ints[head..].chunks(5).map(Reply::from_ints).collect();
    (ints[..head].to_vec(), each)
}

/// `RL.<ALGORITHM> key <params> COST 0`: what one limiter answers alone,
/// taking nothing.
fn peek(con: &mut Connection, key: &str, spec: &[&str]) -> Reply {
    let command = format!("RL.{}", spec[0]);
    let mut words = vec![command.as_str(), key];
    words.extend_from_slice(&spec[1..]);
    words.extend(["COST", "0"]);
    rl(con, &words)
}

/// The fields a `COST 0` look taken later shares with a limiter's answer in
/// the call: its limit, its remaining units but for the `would_take` that
/// a denied call's admitting limiter counts as taken, and a `reset_ms`
/// that only counted down in between.
fn assert_as_alone(each: &Reply, alone: &Reply, would_take: i64, what: &str) {
    assert_eq!(
        (each.limit, each.remaining + would_take),
        (alone.limit, alone.remaining),
        "{what}: {each:?} in the call, {alone:?} alone"
    );
    assert!(
        alone.reset_ms <= each.reset_ms,
        "{what}: reset_ms {} in the call, {} alone later",
        each.reset_ms,
        alone.reset_ms
    );
}

#[test]
fn each_gives_every_limiter_s_own_answer_admitted_and_denied() {
    for_each_server(|kind| {
        let server = Server::start(kind, &[]);
        let mut con = server.conn();
        away_from_the_hour(&mut con);
        let limiters: [(&str, &[&str]); 4] = [
            ("e:tb", TB_10),
            ("e:fw", FW_20),
            ("e:sl", SL_5),
            ("e:hw", HW_7),
        ];
        // The same call without EACH on twin keys answers the same six.
        let twins: Vec<(String, &[&str])> = limiters
            .iter()
            .map(|(key, spec)| (format!("twin:{key}"), *spec))
            .collect();
        let twins: Vec<(&str, &[&str])> = twins.iter().map(|(k, s)| (k.as_str(), *s)).collect();
        let plain = all(&mut con, &all_words(&twins, Some("2")));
        let mut words = all_words(&limiters, Some("2"));
        words.push("EACH");
        let (head, each) = all_each(&mut con, &words, 6);
        assert_eq!(each.len(), 4);
        assert_eq!(head[5], 0, "admitted");
        let call = Reply::from_ints(&head[..5]);
        assert_eq!(
            (call.allowed, call.limit, call.remaining, call.wait_ms),
            (
                plain.limiter.allowed,
                plain.limiter.limit,
                plain.limiter.remaining,
                plain.limiter.wait_ms
            )
        );
        // Admitted: each answered after its take, as a look alone now
        // answers.
        for ((key, spec), mine) in limiters.iter().zip(&each) {
            assert!(mine.allowed, "{key}: {mine:?}");
            assert_as_alone(mine, &peek(&mut con, key, spec), 0, key);
        }
        assert_eq!(
            each.iter().map(|r| r.remaining).collect::<Vec<_>>(),
            [8, 18, 3, 5]
        );
        // Denied by the sliding log (3 left, 4 asked): nothing is taken;
        // each answers what it would have, alone, taking the 4.
        let before = snapshot(&mut con);
        let mut words = all_words(&limiters, Some("4"));
        // Before COST, in lower case.
        words.insert(words.len() - 2, "each");
        let (head, each) = all_each(&mut con, &words, 6);
        assert_eq!((head[0], head[5]), (0, 3), "denied by the third");
        assert_unchanged(&mut con, &before, "a denial with EACH");
        for ((key, spec), (mine, taken)) in limiters.iter().zip(each.iter().zip([4, 4, 0, 4])) {
            let alone = peek(&mut con, key, spec);
            // An admitting limiter's remaining counts the 4 it would take.
            assert_as_alone(mine, &alone, taken, key);
            assert_eq!(mine.allowed, taken > 0, "{key}: {mine:?}");
        }
        assert!(each[2].wait_ms > 0, "the log's denial waits: {:?}", each[2]);
    });
}

#[test]
fn each_with_upto_and_cost_zero() {
    for_each_server(|kind| {
        let server = Server::start(kind, &[]);
        let mut con = server.conn();
        away_from_the_hour(&mut con);
        let _ = rl(
            &mut con,
            &["RL.FIXEDWINDOW", "u:fw", "20", "3600000", "COST", "17"],
        );
        let limiters: [(&str, &[&str]); 2] = [("u:tb", TB_10), ("u:fw", FW_20)];
        let mut words = all_words(&limiters, None);
        words.extend(["EACH", "UPTO", "5"]);
        let (head, each) = all_each(&mut con, &words, 7);
        assert_eq!((head[0], head[5], head[6]), (1, 0, 3), "3 fit: {head:?}");
        assert_eq!(
            each.iter()
                .map(|r| (r.allowed, r.remaining))
                .collect::<Vec<_>>(),
            [(true, 7), (true, 0)]
        );
        for ((key, spec), mine) in limiters.iter().zip(&each) {
            assert_as_alone(mine, &peek(&mut con, key, spec), 0, key);
        }
        // COST 0 with EACH: every limiter looked at, nothing created.
        let before = snapshot(&mut con);
        let mut words = all_words(&[("u:tb", TB_10), ("u:new", SL_5)], Some("0"));
        words.push("EACH");
        let (head, each) = all_each(&mut con, &words, 6);
        assert_eq!(head[5], 0);
        assert_eq!(
            each.iter()
                .map(|r| (r.allowed, r.limit, r.remaining))
                .collect::<Vec<_>>(),
            [(true, 10, 7), (true, 5, 5)]
        );
        assert_unchanged(&mut con, &before, "COST 0 EACH");
        assert!(!exists(&mut con, "u:new"));
    });
}

#[test]
fn each_gives_a_shadowed_and_an_off_policy_s_own_answer() {
    for_each_server(|kind| {
        let server = Server::start(kind, &[]);
        let mut con = server.conn();
        away_from_the_hour(&mut con);
        let _: String = query(
            &mut con,
            &[
                "RL.POLICY",
                "SET",
                "each-sh",
                "FIXEDWINDOW",
                "2",
                "3600000",
                "MODE",
                "SHADOW",
            ],
        );
        let _: String = query(
            &mut con,
            &[
                "RL.POLICY",
                "SET",
                "each-off",
                "TOKENBUCKET",
                "7",
                "1",
                "1000",
                "MODE",
                "OFF",
            ],
        );
        let words = [
            "RL.ALL",
            "3",
            "p:en",
            "p:sh",
            "p:off",
            "FIXEDWINDOW",
            "20",
            "3600000",
            "POLICY",
            "each-sh",
            "POLICY",
            "each-off",
            "COST",
            "3",
            "EACH",
        ];
        let (head, each) = all_each(&mut con, &words, 6);
        // The shadowed policy would deny 3 of its 2: it never denies the
        // call, answers allowed without a wait, and takes nothing.
        assert_eq!((head[0], head[5]), (1, 0));
        assert_eq!(
            (each[0].allowed, each[0].limit, each[0].remaining),
            (true, 20, 17)
        );
        assert_eq!(
            (
                each[1].allowed,
                each[1].limit,
                each[1].remaining,
                each[1].wait_ms
            ),
            (true, 2, 2, 0)
        );
        assert_eq!(
            each[2],
            Reply {
                allowed: true,
                limit: 7,
                remaining: 7,
                wait_ms: 0,
                reset_ms: 0
            },
            "off: its limit, untouched"
        );
        assert!(!exists(&mut con, "p:off"));
        let hit = rl(&mut con, &["RL.HIT", "each-sh", "p:sh", "COST", "0"]);
        assert_eq!(hit.remaining, 2, "the shadow took nothing");
    });
}

#[test]
fn each_is_rl_all_s_option_at_most_once() {
    for_each_server(|kind| {
        let server = Server::start(kind, &[]);
        let mut con = server.conn();
        let mut twice = all_words(&[("x", TB_10)], Some("1"));
        twice.extend(["EACH", "each"]);
        assert_eq!(query_err(&mut con, &twice), "ERR EACH given more than once");
        let mut value = all_words(&[("x", TB_10)], None);
        value.extend(["COST", "EACH"]);
        assert!(
            query_err(&mut con, &value).starts_with("ERR COST must be an integer"),
            "COST's value stays COST's"
        );
        // Not an option of a limiter command or RL.HIT: their error is the
        // one it always was.
        let unknown = "ERR unknown option 'EACH' (expected COST, FORCE, REFUND, UPTO or BLOCK)";
        assert_eq!(
            query_err(&mut con, &["RL.TOKENBUCKET", "x", "1", "1", "1", "EACH"]),
            unknown
        );
        assert!(!exists(&mut con, "x"), "no refused call wrote its key");
        let _: String = query(
            &mut con,
            &["RL.POLICY", "SET", "each-p", "FIXEDWINDOW", "5", "1000"],
        );
        assert_eq!(
            query_err(&mut con, &["RL.HIT", "each-p", "x", "EACH"]),
            unknown
        );
        assert_eq!(dbsize(&mut con), 0, "errors write nothing");
    });
}

#[test]
fn each_propagates_what_the_call_without_it_does() {
    for_each_server(|kind| {
        let master = Server::start(kind, QUIET_MASTER);
        let replica = replica_of(&master);
        let (mut m, mut r) = (master.conn(), replica.conn());
        let mut random = Xorshift64(0x00ea_c4ed);
        let keys: Vec<String> = (0..10).map(|i| format!("k{i}")).collect();
        let (mut admitted, mut denied) = (0, 0);
        for round in 0..300 {
            let count = 1 + random.below(3);
            let mut chosen: Vec<usize> = Vec::new();
            while chosen.len() < count {
                let k = random.below(keys.len());
                if !chosen.contains(&k) {
                    chosen.push(k);
                }
            }
            let specs: Vec<Vec<&str>> = chosen
                .iter()
                .map(|&k| traffic_spec(&mut random, k))
                .collect();
            let cost = ["0", "1", "1", "2", "3"][random.below(5)];
            let numkeys = count.to_string();
            let mut words: Vec<&str> = vec!["RL.ALL", &numkeys];
            words.extend(chosen.iter().map(|&k| keys[k].as_str()));
            for spec in &specs {
                words.extend(spec.iter().copied());
            }
            words.extend(["EACH", "COST", cost]);
            let reply = if round % 10 == 0 {
                transaction(&mut m, &[words.clone()]).remove(0)
            } else {
                query(&mut m, &words)
            };
            let Value::Array(items) = &reply else {
                panic!("{words:?}: {reply:?}")
            };
            assert_eq!(items.len(), 6 + 5 * count, "{words:?}: {reply:?}");
            if items[0] == Value::Int(1) {
                admitted += 1;
            } else {
                denied += 1;
            }
        }
        assert!(
            admitted > 30 && denied > 30,
            "admitted {admitted}, denied {denied}"
        );
        wait_for_sync(&master, &replica);
        assert_same_on_replica(&mut m, &mut r);
        // A denial or a look with EACH propagates nothing, as without.
        let global: &[&str] = &["TOKENBUCKET", "1", "1", "3600000"];
        let mut words = all_words(&[("u", TB_10), ("g", global)], None);
        words.push("EACH");
        assert_eq!(all_each(&mut m, &words, 6).0[0], 1);
        wait_for_sync(&master, &replica);
        let offset = master_offset(&master);
        for cost in [None, Some("0")] {
            let mut words = all_words(&[("u", TB_10), ("g", global)], cost);
            words.push("EACH");
            let _ = all_each(&mut m, &words, 6);
        }
        assert_eq!(master_offset(&master), offset, "propagated");
    });
}

#[test]
fn each_answers_a_blocked_call_when_it_is_admitted() {
    for_each_server(|kind| {
        let server = Server::start(kind, &[]);
        let mut con = server.conn();
        let fast: &[&str] = &["TOKENBUCKET", "1", "1", "300"];
        let _ = all(&mut con, &all_words(&[("b:fast", fast)], None));
        // The bucket is empty: the call waits in the server for its token,
        // then answers with every limiter's own fields.
        let mut words = all_words(&[("b:fast", fast), ("b:tb", TB_10)], None);
        words.extend(["BLOCK", "60000", "EACH"]);
        let (head, each) = all_each(&mut con, &words, 6);
        assert_eq!((head[0], head[5]), (1, 0), "{head:?}");
        assert_eq!(
            each.iter()
                .map(|r| (r.allowed, r.limit, r.remaining))
                .collect::<Vec<_>>(),
            [(true, 1, 0), (true, 10, 9)]
        );
    });
}

//! What every limiter command promises its caller, checked for each of
//! `RL.TOKENBUCKET`, `RL.FIXEDWINDOW`, `RL.LEAKYBUCKET`, `RL.SLIDING`,
//! `RL.HASHWINDOW`, `RL.QUOTA` and `RL.CONCURRENCY` (the table in
//! `harness/contract.rs`; a quota, whose shortest period is a day, is never
//! idle again nor refilled within a test, which its row says): a denial changes
//! nothing, `COST` counts units, `COST 0` only looks, the key's TTL is its
//! `reset_ms` and an idle key goes away, a changed limit applies to what is
//! held, `wait_ms` is enough to wait.
//!
//! One server per server kind serves every algorithm in turn, emptied in
//! between. Time-dependent checks use slow limiters with generous bounds or
//! poll with a deadline; none asserts how long anything took.

use std::thread::sleep;
use std::time::Duration;

use crate::harness::contract::*;
use crate::harness::*;

#[test]
fn denied_request_changes_nothing() {
    for_each_algorithm_on_each_server(|alg, con| {
        let key = alg.key;
        alg.away_from_window_end(con, &alg.valid());
        assert!(alg.slow(con, key, "3", "3").allowed);
        let state_before = dump(con, key);
        let pttl_before = pttl(con, key);
        for cost in ["1", "2", "3", "4"] {
            for _ in 0..10 {
                let r = alg.slow(con, key, "3", cost);
                assert!(!r.allowed, "{alg}: COST {cost} on a full limiter: {r:?}");
            }
        }
        assert_eq!(
            dump(con, key),
            state_before,
            "{alg}: a denial changed the state"
        );
        let pttl_after = pttl(con, key);
        assert!(
            pttl_after <= pttl_before,
            "{alg}: a denial extended the TTL: {pttl_before} -> {pttl_after}"
        );
    });
}

#[test]
fn cost_above_the_limit_is_never_admitted() {
    for_each_algorithm_on_each_server(|alg, con| {
        let key = alg.key;
        alg.away_from_window_end(con, &alg.valid());
        let r = alg.slow(con, key, "5", "6");
        assert_eq!(
            r,
            Reply {
                allowed: false,
                limit: 5,
                remaining: 5,
                wait_ms: -1,
                reset_ms: 0
            },
            "{alg}"
        );
        assert!(!exists(con, key), "{alg}: a denial created the key");

        alg.slow(con, key, "5", "1");
        let r = alg.slow(con, key, "5", "6");
        assert!(!r.allowed, "{alg}: {r:?}");
        assert_eq!((r.remaining, r.wait_ms), (4, -1), "{alg}: {r:?}");
    });
}

#[test]
fn cost_counts_that_many_units() {
    for_each_algorithm_on_each_server(|alg, con| {
        let key = alg.key;
        alg.away_from_window_end(con, &alg.valid());
        let r = alg.slow(con, key, "5", "3");
        assert!(r.allowed, "{alg}: {r:?}");
        assert_eq!((r.limit, r.remaining, r.wait_ms), (5, 2, 0), "{alg}: {r:?}");
        let r = alg.slow(con, key, "5", "3");
        assert!(!r.allowed, "{alg}: 3 more on 2 left: {r:?}");
        assert_eq!(r.remaining, 2, "{alg}: {r:?}");
        assert!(r.wait_ms > 0, "{alg}: a denial without a wait: {r:?}");
        let r = alg.slow(con, key, "5", "2");
        assert!(r.allowed, "{alg}: 2 more on 2 left: {r:?}");
        assert_eq!(r.remaining, 0, "{alg}: {r:?}");
    });
}

#[test]
fn cost_zero_peeks_without_creating_the_key() {
    for_each_algorithm_on_each_server(|alg, con| {
        let r = alg.slow(con, alg.key, "5", "0");
        assert_eq!(
            r,
            Reply {
                allowed: true,
                limit: 5,
                remaining: 5,
                wait_ms: 0,
                reset_ms: 0
            },
            "{alg}"
        );
        assert!(!exists(con, alg.key), "{alg}: COST 0 created the key");
        assert_eq!(dbsize(con), 0, "{alg}");
    });
}

#[test]
fn cost_zero_reports_the_state_and_changes_nothing() {
    for_each_algorithm_on_each_server(|alg, con| {
        let key = alg.key;
        alg.away_from_window_end(con, &alg.valid());
        let taken = alg.slow(con, key, "5", "2");
        let state = dump(con, key);
        let pttl_before = pttl(con, key);
        let r = alg.slow(con, key, "5", "0");
        assert!(r.allowed, "{alg}: {r:?}");
        assert_eq!((r.limit, r.remaining), (5, 3), "{alg}: {r:?}");
        if !alg.shapes {
            assert_eq!(r.wait_ms, 0, "{alg}: {r:?}");
        }
        // The same instant of idleness the admitted call reported.
        assert!(
            r.reset_ms <= taken.reset_ms && r.reset_ms > taken.reset_ms - SLACK_MS,
            "{alg}: reset_ms {} after a call that reported {}",
            r.reset_ms,
            taken.reset_ms
        );
        // Under other parameters too (the state is converted only to look).
        let mut other = vec!["5"];
        other.extend_from_slice(alg.other);
        other.extend(["COST", "0"]);
        alg.call(con, key, &other);
        assert_eq!(dump(con, key), state, "{alg}: COST 0 changed the state");
        assert!(
            pttl(con, key) <= pttl_before,
            "{alg}: COST 0 extended the TTL"
        );

        // Peeking at a full limiter: nothing left, and still allowed (it
        // takes nothing).
        assert!(alg.slow(con, key, "5", "3").allowed);
        assert_ne!(
            dump(con, key),
            state,
            "{alg}: an admitted call changed nothing"
        );
        let state = dump(con, key);
        let r = alg.slow(con, key, "5", "0");
        assert_eq!((r.allowed, r.remaining), (true, 0), "{alg}: {r:?}");
        if !alg.shapes {
            assert_eq!(r.wait_ms, 0, "{alg}: {r:?}");
        }
        assert_eq!(dump(con, key), state, "{alg}: COST 0 changed the state");
    });
}

#[test]
fn key_ttl_follows_reset_ms() {
    for_each_algorithm_on_each_server(|alg, con| {
        let key = alg.key;
        alg.away_from_window_end(con, &alg.valid());
        for cost in ["1", "2"] {
            let r = alg.slow(con, key, "5", cost);
            assert!(r.allowed, "{alg}: {r:?}");
            let ttl = pttl(con, key);
            assert!(
                ttl > r.reset_ms - SLACK_MS && ttl <= alg.latest_expiry_ms(r.reset_ms),
                "{alg}: PTTL {ttl} vs reset_ms {}",
                r.reset_ms
            );
        }
    });
}

/// (Not for a limiter that cannot be idle again within a test: see
/// [`Algorithm::fast`].)
#[test]
fn idle_key_expires_by_itself_and_starts_afresh() {
    for_each_algorithm_on_each_server(|alg, con| {
        let Some(fast) = &alg.fast else {
            eprintln!("{alg}: skipped, no key of it is idle again within a test");
            return;
        };
        let key = alg.key;
        let limit: i64 = fast.params[0].parse().unwrap();
        let r = alg.call(con, key, fast.params);
        assert!(r.allowed, "{alg}: {r:?}");
        let (above, at_most) = fast.reset_ms;
        assert_between(&format!("{alg}: reset_ms"), r.reset_ms, above, at_most);
        poll_until(
            &format!("the idle {alg} key to expire"),
            Duration::from_secs(5),
            || !exists(con, key),
        );
        let r = alg.call(con, key, fast.params);
        assert_eq!(
            (r.allowed, r.remaining, r.wait_ms),
            (true, limit - 1, 0),
            "{alg}: idle again"
        );
    });
}

#[test]
fn lowering_the_limit_applies_to_the_units_held() {
    for_each_algorithm_on_each_server(|alg, con| {
        let key = alg.key;
        alg.away_from_window_end(con, &alg.valid());
        assert!(alg.slow(con, key, "5", "3").allowed);
        let r = alg.slow(con, key, "3", "1");
        assert!(!r.allowed, "{alg}: 3 held, limit lowered to 3: {r:?}");
        assert_eq!((r.limit, r.remaining), (3, 0), "{alg}: {r:?}");
        let r = alg.slow(con, key, "2", "0");
        assert_eq!((r.limit, r.remaining), (2, 0), "{alg}: {r:?}");
        let r = alg.slow(con, key, "4", "1");
        assert!(r.allowed, "{alg}: 3 held, limit 4: {r:?}");
        assert_eq!((r.limit, r.remaining), (4, 0), "{alg}: {r:?}");
    });
}

#[test]
fn raising_the_limit_gives_room_for_the_difference_only() {
    for_each_algorithm_on_each_server(|alg, con| {
        let key = alg.key;
        alg.away_from_window_end(con, &alg.valid());
        assert!(alg.slow(con, key, "5", "5").allowed);
        let r = alg.slow(con, key, "8", "0");
        assert_eq!(
            (r.limit, r.remaining),
            (8, 3),
            "{alg}: 5 held, limit 8: {r:?}"
        );
        for i in 0..3 {
            let r = alg.slow(con, key, "8", "1");
            assert!(r.allowed, "{alg}: unit {} of the 3 more: {r:?}", i + 1);
        }
        let r = alg.slow(con, key, "8", "1");
        assert!(!r.allowed, "{alg}: a 9th unit under a limit of 8: {r:?}");
    });
}

/// The SPEC's reading of a parameter change: what was consumed carries over.
/// 10 consumed of 10, raised to 100: 90 left at once; 10 consumed of 100,
/// lowered to 20: 10 left. Either way exactly that many more are admitted,
/// so nothing was refilled. (For the leaky bucket the limit is the queue's
/// capacity and `remaining` its free room.)
#[test]
fn consumed_units_carry_over_a_raised_or_lowered_limit() {
    // (case, old limit, new limit, left after the change)
    const CHANGES: [(&str, &str, &str, i64); 2] =
        [("raised", "10", "100", 90), ("lowered", "100", "20", 10)];
    for_each_algorithm_on_each_server(|alg, con| {
        for (case, old, new, left) in CHANGES {
            let key = format!("{}:{case}", alg.key);
            alg.away_from_window_end(con, &alg.slow_params(old));
            let r = alg.slow(con, &key, old, "10");
            assert!(r.allowed, "{alg}: 10 of {old}: {r:?}");
            let r = alg.slow(con, &key, new, "0");
            assert_eq!(
                (r.limit, r.remaining),
                (new.parse().unwrap(), left),
                "{alg}: 10 consumed of {old}, {case} to {new}: {r:?}"
            );
            let r = alg.slow(con, &key, new, &left.to_string());
            assert!(r.allowed, "{alg}: the {left} left under {new}: {r:?}");
            assert_eq!(r.remaining, 0, "{alg}: {r:?}");
            let r = alg.slow(con, &key, new, "1");
            assert!(!r.allowed, "{alg}: one more than the {left} left: {r:?}");
        }
    });
}

/// (Not for a limiter whose units cannot come back within a test: see
/// [`Algorithm::short`].)
#[test]
fn request_is_admitted_after_waiting_wait_ms() {
    for_each_algorithm_on_each_server(|alg, con| {
        let Some(short) = &alg.short else {
            eprintln!("{alg}: skipped, its units do not come back within a test");
            return;
        };
        let call = |con: &mut Connection, cost: &str| {
            let mut args = short.params.to_vec();
            args.extend(["COST", cost]);
            alg.call(con, alg.key, &args)
        };
        alg.away_from_window_end(con, short.params);
        assert!(call(con, "2").allowed, "{alg}");
        assert!(call(con, "1").allowed, "{alg}");
        let denied = call(con, "2");
        assert!(!denied.allowed, "{alg}: 2 more on a limit of 3: {denied:?}");
        assert_between(
            &format!("{alg}: wait_ms"),
            denied.wait_ms,
            0,
            short.wait_max_ms,
        );
        sleep(Duration::from_millis(denied.wait_ms as u64));
        let r = call(con, "2");
        assert!(
            r.allowed,
            "{alg}: denied again after waiting {}: {r:?}",
            denied.wait_ms
        );
    });
}

/// Right after a first admission, a limiter is idle again within its
/// nominal window (the `w` of `RateLimit-Policy`), so that
/// `t = ceil(reset_ms / 1000)` is 1 on a 1 s window: no millisecond that a
/// stamp was rounded up to shows in `reset_ms`. The hash window is the
/// exception by design: a unit counts until its whole bucket has left the
/// window, up to `bucket_ms` beyond it. Forty fresh keys each, so that the
/// calls land at many microseconds within a millisecond.
#[test]
fn reset_right_after_a_first_admission_is_at_most_the_window() {
    let cases: &[(&str, &[&str], i64)] = &[
        ("RL.SLIDING", &["5", "1000", "COST", "5"], 1000),
        ("RL.SLIDING", &["5", "1000"], 1000),
        ("RL.SLIDING", &["1", "1"], 1),
        ("RL.FIXEDWINDOW", &["5", "1000", "COST", "5"], 1000),
        ("RL.TOKENBUCKET", &["5", "5", "1000", "COST", "5"], 1000),
        ("RL.TOKENBUCKET", &["3", "3", "1000", "COST", "3"], 1000),
        ("RL.TOKENBUCKET", &["7", "3", "1000", "COST", "7"], 2334),
        ("RL.LEAKYBUCKET", &["3", "3", "1000", "COST", "3"], 1000),
        ("RL.CONCURRENCY", &["5", "1000", "COST", "5"], 1000),
        ("RL.HASHWINDOW", &["5", "1000", "100", "COST", "5"], 1100),
    ];
    for_each_server(|kind| {
        let server = Server::start(kind, &[]);
        let mut con = server.conn();
        for (i, (command, args, window_ms)) in cases.iter().enumerate() {
            for n in 0..40 {
                let key = format!("first:{i}:{n}");
                let mut words = vec![*command, key.as_str()];
                words.extend_from_slice(args);
                let reply: Vec<i64> = query(&mut con, &words);
                assert_eq!(reply[0], 1, "{words:?}: {reply:?}");
                assert_between(&format!("{words:?}: reset_ms"), reply[4], 0, *window_ms);
            }
        }
    });
}

/// `fast` where the row says so ([`Algorithm::fast_flag`]), and only there.
#[test]
fn command_info_declares_the_key_and_write_fast_flags() {
    for_each_algorithm_on_each_server(|alg, con| {
        let valid = alg.valid();
        for options in [&[][..], &["COST", "2"]] {
            let mut words = vec!["COMMAND", "GETKEYS", alg.command, "k"];
            words.extend_from_slice(&valid);
            words.extend_from_slice(options);
            let keys: Vec<String> = query(con, &words);
            assert_eq!(keys, ["k"], "{words:?}");
        }
        let reply: Vec<Value> = query(con, &["COMMAND", "INFO", alg.command]);
        let Some(Value::Array(info)) = reply.first() else {
            panic!("COMMAND INFO {alg}: {reply:?}");
        };
        // Variadic: the command, the key, the parameters, then options.
        let arity = -(2 + alg.params.len() as i64);
        assert_eq!(info[1], Value::Int(arity), "{alg} arity: {info:?}");
        assert_eq!(
            info[3..6],
            [Value::Int(1), Value::Int(1), Value::Int(1)],
            "{alg} key positions: {info:?}"
        );
        let flags = format!("{:?}", info[2]);
        assert!(flags.contains("write"), "{alg} flags {flags} lack write");
        assert_eq!(
            flags.contains("fast"),
            alg.fast_flag,
            "{alg} flags {flags}: fast or not"
        );
    });
}

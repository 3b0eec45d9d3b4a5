//! `RL.HASHWINDOW key limit window_ms bucket_ms [COST n]` against real
//! servers: the sliding window approximated by `window_ms / bucket_ms`
//! buckets aligned on the Unix epoch, in fixed memory. A request is admitted
//! when the units its window's buckets hold plus its cost stay within
//! `limit`. The approximation is conservative: a unit counts until its whole
//! bucket has left the window (up to `bucket_ms` longer than the exact log
//! keeps it, never shorter), so no span of `window_ms` ever holds more than
//! `limit` units.
//!
//! Time-dependent checks use slow windows with generous bounds, poll with a
//! deadline, or bound the server's clock reading between two `TIME` calls;
//! none asserts how long anything took.

mod common;

use std::fs;
use std::thread::sleep;
use std::time::Duration;

use common::payload::{self, Field};
use common::*;

/// A 1000 s window of ten 100 s buckets: nothing leaves it during a test.
const SLOW_MS: i64 = 1_000_000;
const SLOW: &str = "1000000";
const SLOW_BUCKET_MS: i64 = 100_000;
const SLOW_BUCKET: &str = "100000";
/// Slack for the time a test itself takes, far above any real run.
const SLACK_MS: i64 = 10_000;

fn assert_between(what: &str, value: i64, above: i64, at_most: i64) {
    assert!(
        value > above && value <= at_most,
        "{what} = {value}, expected in ({above}, {at_most}]"
    );
}

fn slow_window(con: &mut Connection, key: &str, limit: &str, cost: &str) -> Reply {
    rl(
        con,
        &["RL.HASHWINDOW", key, limit, SLOW, SLOW_BUCKET, "COST", cost],
    )
}

/// A limiter call with the server's clock read just before and just after
/// it (microseconds): the call's own reading lies in between.
fn timed(con: &mut Connection, words: &[&str]) -> (Reply, u64, u64) {
    let before = server_time_us(con);
    let reply = rl(con, words);
    let after = server_time_us(con);
    (reply, before, after)
}

/// Waits until the server's clock is at least `us`.
fn until_server_time(con: &mut Connection, us: u64) {
    poll_until(
        "the server clock to move on",
        Duration::from_secs(10),
        || server_time_us(con) >= us,
    );
}

/// Waits, if needed, until the server's clock is between `from_ms` and
/// `to_ms` into a `bucket_ms`-aligned bucket.
fn into_bucket(con: &mut Connection, bucket_ms: u64, from_ms: u64, to_ms: u64) {
    loop {
        let offset_ms = server_time_us(con) / 1000 % bucket_ms;
        if (from_ms..to_ms).contains(&offset_ms) {
            return;
        }
        let sleep_ms = if offset_ms < from_ms {
            from_ms - offset_ms
        } else {
            bucket_ms - offset_ms + from_ms
        };
        sleep(Duration::from_millis(sleep_ms));
    }
}

// ---------------------------------------------------------------------------
// Admission

#[test]
fn window_counts_up_to_limit_then_denies() {
    for_each_server(|kind| {
        let server = Server::start(kind, &[]);
        let mut con = server.conn();
        for remaining in [2, 1, 0] {
            let r = slow_window(&mut con, "hw", "3", "1");
            assert!(r.allowed, "{r:?}");
            assert_eq!((r.limit, r.remaining, r.wait_ms), (3, remaining, 0));
            assert_between(
                "reset_ms",
                r.reset_ms,
                SLOW_MS - SLOW_BUCKET_MS - SLACK_MS,
                SLOW_MS + SLOW_BUCKET_MS,
            );
        }
        let r = slow_window(&mut con, "hw", "3", "1");
        assert!(!r.allowed, "4th call on a limit of 3: {r:?}");
        assert_eq!((r.limit, r.remaining), (3, 0));
        // All three sit in one bucket: denied until it leaves, which is also
        // when the window is empty.
        assert_eq!(r.wait_ms, r.reset_ms, "{r:?}");
    });
}

#[test]
fn buckets_are_aligned_on_the_epoch() {
    for_each_server(|kind| {
        let server = Server::start(kind, &[]);
        let mut con = server.conn();
        for (window_ms, bucket_ms) in [
            (3_000u64, 1_000u64),
            (21_000, 7_000),
            (3_600_000, 60_000),
            (SLOW_MS as u64, SLOW_BUCKET_MS as u64),
        ] {
            let key = format!("hw:{bucket_ms}");
            let (r, before, after) = timed(
                &mut con,
                &[
                    "RL.HASHWINDOW",
                    &key,
                    "10",
                    &window_ms.to_string(),
                    &bucket_ms.to_string(),
                ],
            );
            assert!(r.allowed);
            // The window empties when a bucket edge passes: the instant
            // now + reset_ms (rounded up to the ms) is a multiple of bucket_ms.
            let reset_us = r.reset_ms as u64 * 1000;
            let (earliest, latest) = (before + reset_us - 999, after + reset_us);
            let bucket_us = bucket_ms * 1000;
            assert!(
                latest / bucket_us * bucket_us >= earliest,
                "window {window_ms}, bucket {bucket_ms}: reset_ms {} does not end on a bucket edge",
                r.reset_ms
            );
            let reset = r.reset_ms as u64;
            assert!(
                reset + bucket_ms > window_ms && reset <= window_ms + bucket_ms,
                "window {window_ms}, bucket {bucket_ms}: reset_ms {reset}"
            );
        }
    });
}

#[test]
fn no_window_span_ever_holds_more_than_the_limit() {
    for_each_server(|kind| {
        let server = Server::start(kind, &[]);
        let mut con = server.conn();
        // One unit per second in buckets of 100 ms. The first lands late in
        // its bucket, where leaving with the bucket would be early.
        let call = ["RL.HASHWINDOW", "hw", "1", "1000", "100"];
        into_bucket(&mut con, 100, 50, 80);
        let (r, first_before, _) = timed(&mut con, &call);
        assert!(r.allowed, "{r:?}");
        let mut admitted_after = 0;
        poll_until("the window to admit again", Duration::from_secs(5), || {
            let (r, _, after) = timed(&mut con, &call);
            admitted_after = after;
            r.allowed
        });
        assert!(
            admitted_after >= first_before + 1_000_000,
            "a second unit was admitted {} ms after the first, within one window of 1000 ms",
            (admitted_after - first_before) / 1000
        );
    });
}

#[test]
fn a_unit_counts_until_its_whole_bucket_has_left_the_window() {
    for_each_server(|kind| {
        let server = Server::start(kind, &[]);
        let mut con = server.conn();
        // One unit per 10 s, buckets of 1 s.
        const W: u64 = 10_000;
        const B: u64 = 1_000;
        let call = ["RL.HASHWINDOW", "hw", "1", "10000", "1000"];
        into_bucket(&mut con, B, 100, 900);
        let (r, first_before, first_after) = timed(&mut con, &call);
        assert!(r.allowed, "{r:?}");
        let (denied, before, after) = timed(&mut con, &call);
        assert!(!denied.allowed, "{denied:?}");
        let wait = denied.wait_ms as u64;
        // The unit came at some instant of bucket [j*B, (j+1)*B); it may go
        // once that whole bucket is a window old, at (j+1)*B + W: never
        // sooner (conservative) and never later (the approximation costs at
        // most one bucket over the exact log).
        let bucket = |us: u64| us / 1000 / B;
        let (j_first, j_last) = (bucket(first_before), bucket(first_after));
        let (goes_from_ms, goes_to_ms) = (before / 1000 + wait, after.div_ceil(1000) + wait);
        assert!(
            goes_to_ms >= (j_first + 1) * B + W,
            "wait_ms {wait} lets the unit go {} ms before its bucket has left the window",
            ((j_first + 1) * B + W) - goes_to_ms
        );
        assert!(
            goes_from_ms <= (j_last + 1) * B + W,
            "wait_ms {wait} holds the unit past its bucket's leaving"
        );
        assert_eq!(denied.reset_ms, denied.wait_ms, "{denied:?}");
    });
}

#[test]
fn units_leave_bucket_by_bucket_oldest_first() {
    for_each_server(|kind| {
        let server = Server::start(kind, &[]);
        let mut con = server.conn();
        // Ten buckets of 200 ms: 2 units in one bucket, 3 two buckets later.
        const B_US: u64 = 200_000;
        let call = |con: &mut Connection, cost: &str| {
            timed(
                con,
                &["RL.HASHWINDOW", "hw", "5", "2000", "200", "COST", cost],
            )
        };
        into_bucket(&mut con, 200, 20, 150);
        let (r, _, first_after) = call(&mut con, "2");
        assert!(r.allowed);
        until_server_time(&mut con, (first_after / B_US + 2) * B_US);
        let (r, second_before, _) = call(&mut con, "3");
        assert!(r.allowed);
        assert_eq!(r.remaining, 0);
        let first_bucket = first_after / B_US;
        assert_eq!(
            second_before / B_US,
            first_bucket + 2,
            "the test fell behind"
        );

        // A request for 1 or 2 waits for the first bucket to leave; one for
        // 3 or 5 for the second bucket, 2 buckets (400 ms) later.
        let mut goes = Vec::new();
        for cost in ["1", "2", "3", "5"] {
            let (r, before, after) = call(&mut con, cost);
            assert!(!r.allowed, "COST {cost}: {r:?}");
            let wait_us = r.wait_ms as u64 * 1000;
            goes.push((before + wait_us, after + wait_us));
        }
        let edge = |(from, to): (u64, u64)| {
            // The bucket edge within the (rounded-up) reading.
            let edge = to / B_US * B_US;
            assert!(edge + 1000 > from, "wait does not end on a bucket edge");
            edge
        };
        let edges: Vec<u64> = goes.iter().map(|&g| edge(g)).collect();
        assert_eq!(edges[0], edges[1], "COST 1 and 2 wait for the same bucket");
        assert_eq!(edges[2], edges[3], "COST 3 and 5 wait for the same bucket");
        assert_eq!(
            edges[2] - edges[0],
            2 * B_US,
            "the second bucket leaves 2 buckets after the first"
        );
        let (r, _, _) = call(&mut con, "6");
        assert_eq!((r.allowed, r.wait_ms), (false, -1));
    });
}

#[test]
fn denied_request_changes_nothing() {
    for_each_server(|kind| {
        let server = Server::start(kind, &[]);
        let mut con = server.conn();
        slow_window(&mut con, "hw", "3", "3");
        let state_before = dump(&mut con, "hw");
        let pttl_before = pttl(&mut con, "hw");
        for cost in ["1", "2", "3", "4"] {
            for _ in 0..10 {
                assert!(!slow_window(&mut con, "hw", "3", cost).allowed);
            }
        }
        assert_eq!(
            dump(&mut con, "hw"),
            state_before,
            "a denial changed the state"
        );
        let pttl_after = pttl(&mut con, "hw");
        assert!(
            pttl_after <= pttl_before,
            "a denial extended the TTL: {pttl_before} -> {pttl_after}"
        );
    });
}

#[test]
fn cost_counts_that_many_units() {
    for_each_server(|kind| {
        let server = Server::start(kind, &[]);
        let mut con = server.conn();
        let r = slow_window(&mut con, "hw", "5", "3");
        assert!(r.allowed);
        assert_eq!((r.limit, r.remaining, r.wait_ms), (5, 2, 0));
        let r = slow_window(&mut con, "hw", "5", "3");
        assert!(!r.allowed, "3 more on 2 left: {r:?}");
        assert_eq!(r.remaining, 2);
        assert_eq!(r.wait_ms, r.reset_ms, "{r:?}");
        let r = slow_window(&mut con, "hw", "5", "2");
        assert!(r.allowed);
        assert_eq!(r.remaining, 0);
    });
}

#[test]
fn cost_above_limit_is_never_admitted() {
    for_each_server(|kind| {
        let server = Server::start(kind, &[]);
        let mut con = server.conn();
        let r = slow_window(&mut con, "hw", "5", "6");
        assert_eq!(
            r,
            Reply {
                allowed: false,
                limit: 5,
                remaining: 5,
                wait_ms: -1,
                reset_ms: 0
            }
        );
        assert!(!exists(&mut con, "hw"), "a denial created the key");
        slow_window(&mut con, "hw", "5", "1");
        let r = slow_window(&mut con, "hw", "5", "6");
        assert!(!r.allowed);
        assert_eq!((r.remaining, r.wait_ms), (4, -1));
    });
}

#[test]
fn cost_zero_peeks_without_creating_or_changing_anything() {
    for_each_server(|kind| {
        let server = Server::start(kind, &[]);
        let mut con = server.conn();
        let r = slow_window(&mut con, "hw", "5", "0");
        assert_eq!(
            r,
            Reply {
                allowed: true,
                limit: 5,
                remaining: 5,
                wait_ms: 0,
                reset_ms: 0
            }
        );
        assert!(!exists(&mut con, "hw"), "COST 0 created the key");
        assert_eq!(dbsize(&mut con), 0);

        slow_window(&mut con, "hw", "5", "2");
        let state = dump(&mut con, "hw");
        let r = slow_window(&mut con, "hw", "5", "0");
        assert!(r.allowed);
        assert_eq!((r.remaining, r.wait_ms), (3, 0));
        assert_between(
            "reset_ms",
            r.reset_ms,
            SLOW_MS - SLOW_BUCKET_MS - SLACK_MS,
            SLOW_MS + SLOW_BUCKET_MS,
        );
        assert_eq!(dump(&mut con, "hw"), state, "COST 0 changed the state");
        // Under other parameters too (the state is converted only to look).
        rl(
            &mut con,
            &["RL.HASHWINDOW", "hw", "5", "60000", "1000", "COST", "0"],
        );
        assert_eq!(dump(&mut con, "hw"), state, "COST 0 changed the state");
    });
}

#[test]
fn key_ttl_follows_reset_ms() {
    for_each_server(|kind| {
        let server = Server::start(kind, &[]);
        let mut con = server.conn();
        for cost in ["1", "2"] {
            let r = slow_window(&mut con, "hw", "5", cost);
            assert!(r.allowed);
            let ttl = pttl(&mut con, "hw");
            assert!(
                ttl > r.reset_ms - SLACK_MS && ttl <= r.reset_ms,
                "PTTL {ttl} vs reset_ms {}",
                r.reset_ms
            );
        }
    });
}

#[test]
fn window_key_expires_by_itself() {
    for_each_server(|kind| {
        let server = Server::start(kind, &[]);
        let mut con = server.conn();
        let r = rl(&mut con, &["RL.HASHWINDOW", "hw", "5", "300", "100"]);
        assert!(r.allowed);
        assert_between("reset_ms", r.reset_ms, 100, 400);
        poll_until("the window key to expire", Duration::from_secs(5), || {
            !exists(&mut con, "hw")
        });
        let r = rl(&mut con, &["RL.HASHWINDOW", "hw", "5", "300", "100"]);
        assert_eq!((r.allowed, r.remaining), (true, 4), "empty again");
    });
}

#[test]
fn request_is_admitted_after_waiting_wait_ms() {
    for_each_server(|kind| {
        let server = Server::start(kind, &[]);
        let mut con = server.conn();
        let call = |con: &mut Connection| {
            rl(
                con,
                &["RL.HASHWINDOW", "hw", "2", "300", "100", "COST", "2"],
            )
        };
        assert!(call(&mut con).allowed);
        let denied = call(&mut con);
        assert!(!denied.allowed);
        assert_between("wait_ms", denied.wait_ms, 0, 400);
        sleep(Duration::from_millis(denied.wait_ms as u64));
        let r = call(&mut con);
        assert!(
            r.allowed,
            "denied again after waiting {}: {r:?}",
            denied.wait_ms
        );
    });
}

// ---------------------------------------------------------------------------
// Parameter changes: the units carry over, none leaves early.

#[test]
fn lowering_the_limit_applies_to_the_units_held() {
    for_each_server(|kind| {
        let server = Server::start(kind, &[]);
        let mut con = server.conn();
        slow_window(&mut con, "hw", "5", "3");
        let r = slow_window(&mut con, "hw", "3", "1");
        assert!(!r.allowed, "3 held, limit lowered to 3: {r:?}");
        assert_eq!((r.limit, r.remaining), (3, 0));
        let r = slow_window(&mut con, "hw", "4", "1");
        assert!(r.allowed, "3 held, limit 4: {r:?}");
        assert_eq!((r.limit, r.remaining), (4, 0));
    });
}

#[test]
fn new_bucket_sizes_and_windows_keep_the_units() {
    for_each_server(|kind| {
        let server = Server::start(kind, &[]);
        let mut con = server.conn();
        let call = |con: &mut Connection, window: &str, bucket: &str, cost: &str| {
            rl(
                con,
                &["RL.HASHWINDOW", "hw", "10", window, bucket, "COST", cost],
            )
        };
        assert!(call(&mut con, "60000", "1000", "7").allowed);
        for (window, bucket) in [
            ("60000", "10000"),
            ("60000", "60000"),
            ("120000", "1000"),
            ("60000", "100"),
            // A shorter window: the units may date from the end of their
            // old bucket, so they are still in it.
            ("1000", "100"),
            ("60000", "1000"),
        ] {
            let r = call(&mut con, window, bucket, "4");
            assert!(!r.allowed, "7 held, window {window}/{bucket}: {r:?}");
            assert_eq!(r.remaining, 3, "window {window}/{bucket}");
        }
        // An admitted call under new parameters keeps the old units too.
        let r = call(&mut con, "120000", "10000", "3");
        assert_eq!((r.allowed, r.remaining), (true, 0), "{r:?}");
        let r = call(&mut con, "60000", "1000", "1");
        assert_eq!((r.allowed, r.remaining), (false, 0), "{r:?}");
    });
}

#[test]
fn extreme_parameters_are_exact() {
    for_each_server(|kind| {
        let server = Server::start(kind, &[]);
        let mut con = server.conn();
        let max = MAX_PARAM.to_string();
        let max_ms = MAX_PARAM as i64;
        // One bucket of 2^40 ms, all 2^40 units at once.
        let r = rl(
            &mut con,
            &["RL.HASHWINDOW", "huge", &max, &max, &max, "COST", &max],
        );
        assert_eq!((r.allowed, r.limit, r.remaining), (true, max_ms, 0));
        assert_between("reset_ms", r.reset_ms, 0, 2 * max_ms);
        let r = rl(&mut con, &["RL.HASHWINDOW", "huge", &max, &max, &max]);
        assert!(!r.allowed);
        assert_eq!(r.wait_ms, r.reset_ms);
        // As many buckets as the default config allows.
        let r = rl(&mut con, &["RL.HASHWINDOW", "many", "5", "3600000", "1000"]);
        assert_eq!((r.allowed, r.remaining), (true, 4));
        let r = rl(&mut con, &["RL.HASHWINDOW", "ms", "5", "3600", "1"]);
        assert_eq!((r.allowed, r.remaining), (true, 4));
    });
}

#[test]
fn memory_is_fixed_per_key_8_bytes_per_bucket() {
    for_each_server(|kind| {
        let server = Server::start(kind, &[]);
        let mut con = server.conn();
        for (window, bucket, buckets) in [
            ("1000", "1000", 1i64),
            ("60000", "1000", 60),
            ("3600000", "1000", 3600),
        ] {
            let key = format!("hw:{buckets}");
            rl(&mut con, &["RL.HASHWINDOW", &key, "1000", window, bucket]);
            let first: i64 = query(&mut con, &["MEMORY", "USAGE", &key]);
            assert!(
                first >= 8 * buckets && first <= 8 * buckets + 200,
                "{buckets} buckets: MEMORY USAGE {first}"
            );
            for _ in 0..20 {
                rl(
                    &mut con,
                    &["RL.HASHWINDOW", &key, "1000", window, bucket, "COST", "7"],
                );
            }
            let later: i64 = query(&mut con, &["MEMORY", "USAGE", &key]);
            assert_eq!(
                later, first,
                "{buckets} buckets: memory changed with traffic"
            );
        }
        // A new layout takes the memory of its own bucket count.
        rl(
            &mut con,
            &["RL.HASHWINDOW", "hw:60", "1000", "10000", "1000"],
        );
        let now: i64 = query(&mut con, &["MEMORY", "USAGE", "hw:60"]);
        assert!((80..=280).contains(&now), "10 buckets: MEMORY USAGE {now}");
    });
}

// ---------------------------------------------------------------------------
// Errors

/// Values no integer parameter accepts.
const NOT_A_PARAMETER: &[&str] = &[
    "0",
    "-1",
    "1099511627777", // 2^40 + 1
    "18446744073709551616",
    "abc",
    "1.5",
    "1e3",
    " 1",
    "",
];

fn assert_err_naming(err: &str, name: &str, words: &[&str]) {
    assert!(
        err.starts_with("ERR") && err.contains(name),
        "{words:?}: expected an ERR naming {name}, got: {err}"
    );
}

#[test]
fn bad_parameters_are_named_and_write_nothing() {
    for_each_server(|kind| {
        let server = Server::start(kind, &[]);
        let mut con = server.conn();
        let good = ["5", "1000", "100"];
        for (position, name) in ["limit", "window_ms", "bucket_ms"].iter().enumerate() {
            for bad in NOT_A_PARAMETER {
                let mut params = good;
                params[position] = bad;
                let words = ["RL.HASHWINDOW", "hw", params[0], params[1], params[2]];
                let err = query_err(&mut con, &words);
                assert_err_naming(&err, name, &words);
            }
        }
        for (words, expected) in [
            (
                ["RL.HASHWINDOW", "hw", "5", "1000", "300"],
                "ERR bucket_ms must divide window_ms",
            ),
            (
                ["RL.HASHWINDOW", "hw", "5", "1000", "2000"],
                "ERR bucket_ms must divide window_ms",
            ),
            (
                ["RL.HASHWINDOW", "hw", "5", "3601", "1"],
                "ERR window_ms / bucket_ms is above ratelimit.hashwindow-max-buckets (3600)",
            ),
            (
                ["RL.HASHWINDOW", "hw", "5", "1000001", "1"],
                "ERR window_ms / bucket_ms must be an integer from 1 to 1000000",
            ),
            (
                ["RL.HASHWINDOW", "hw", "5", "1099511627776", "1"],
                "ERR window_ms / bucket_ms must be an integer from 1 to 1000000",
            ),
        ] {
            assert_eq!(query_err(&mut con, &words), expected, "{words:?}");
        }
        for bad in ["-1", "1099511627777", "x", "1.0", ""] {
            let words = ["RL.HASHWINDOW", "hw", "5", "1000", "100", "COST", bad];
            assert_err_naming(&query_err(&mut con, &words), "COST", &words);
        }
        for words in [
            ["RL.HASHWINDOW", "hw", "5", "1000", "100", "BUCKETS", "1"].as_slice(),
            [
                "RL.HASHWINDOW",
                "hw",
                "5",
                "1000",
                "100",
                "COST",
                "1",
                "BUCKETS",
                "1",
            ]
            .as_slice(),
        ] {
            assert_err_naming(&query_err(&mut con, words), "BUCKETS", words);
        }
        for words in [
            ["RL.HASHWINDOW", "hw", "5", "1000", "100", "COST"].as_slice(),
            [
                "RL.HASHWINDOW",
                "hw",
                "5",
                "1000",
                "100",
                "COST",
                "1",
                "COST",
                "1",
            ]
            .as_slice(),
        ] {
            assert_err_naming(&query_err(&mut con, words), "COST", words);
        }
        assert_eq!(dbsize(&mut con), 0, "an error wrote a key");
    });
}

#[test]
fn errors_leave_an_existing_window_untouched() {
    for_each_server(|kind| {
        let server = Server::start(kind, &[]);
        let mut con = server.conn();
        slow_window(&mut con, "hw", "5", "2");
        let (state, ttl) = (dump(&mut con, "hw"), pttl(&mut con, "hw"));
        for words in [
            ["RL.HASHWINDOW", "hw", "0", SLOW, SLOW_BUCKET].as_slice(),
            ["RL.HASHWINDOW", "hw", "5", SLOW, "300000"].as_slice(),
            ["RL.HASHWINDOW", "hw", "5", SLOW, "1"].as_slice(),
            ["RL.HASHWINDOW", "hw", "5", SLOW, SLOW_BUCKET, "COST", "-1"].as_slice(),
            ["RL.HASHWINDOW", "hw", "5", SLOW, SLOW_BUCKET, "FOO", "1"].as_slice(),
            ["RL.HASHWINDOW", "hw", "5", SLOW, SLOW_BUCKET, "AT", "1"].as_slice(),
        ] {
            query_err(&mut con, words);
        }
        assert_eq!(dump(&mut con, "hw"), state);
        assert!(pttl(&mut con, "hw") <= ttl);
    });
}

#[test]
fn wrong_argument_count_is_the_usual_arity_error() {
    for_each_server(|kind| {
        let server = Server::start(kind, &[]);
        let mut con = server.conn();
        for words in [
            ["RL.HASHWINDOW"].as_slice(),
            ["RL.HASHWINDOW", "hw"].as_slice(),
            ["RL.HASHWINDOW", "hw", "5"].as_slice(),
            ["RL.HASHWINDOW", "hw", "5", "1000"].as_slice(),
        ] {
            let err = query_err(&mut con, words);
            assert!(
                err.starts_with("ERR") && err.contains("wrong number of arguments"),
                "{words:?}: {err}"
            );
        }
        assert_eq!(dbsize(&mut con), 0, "an error wrote a key");
    });
}

#[test]
fn at_option_and_setstate_are_reserved_for_replication_and_aof_loading() {
    for_each_server(|kind| {
        let server = Server::start(kind, &[]);
        let mut con = server.conn();
        let now_us = server_time_us(&mut con).to_string();
        for words in [
            ["RL.HASHWINDOW", "hw", "5", "1000", "100", "AT", &now_us].as_slice(),
            [
                "RL.HASHWINDOW",
                "hw",
                "5",
                "1000",
                "100",
                "COST",
                "1",
                "AT",
                &now_us,
            ]
            .as_slice(),
        ] {
            let err = query_err(&mut con, words);
            assert_eq!(
                err, "ERR AT is reserved for replication and AOF loading",
                "{words:?}"
            );
        }
        let err = query_err(
            &mut con,
            &[
                "RL.SETSTATE",
                "hw",
                "HASHWINDOW",
                "1",
                "1000",
                "1",
                "0",
                "1",
                "0",
            ],
        );
        assert!(err.starts_with("ERR"), "{err}");
        assert_eq!(dbsize(&mut con), 0, "a reserved call wrote a key");
    });
}

#[test]
fn key_of_another_type_or_algorithm_is_wrongtype_and_untouched() {
    for_each_server(|kind| {
        let server = Server::start(kind, &[]);
        let mut con = server.conn();
        let _: () = query(&mut con, &["SET", "string", "hello", "PX", "1000000"]);
        let _: i64 = query(&mut con, &["HSET", "hash", "0", "5"]);
        rl(&mut con, &["RL.TOKENBUCKET", "tb", "5", "1", SLOW]);
        rl(&mut con, &["RL.FIXEDWINDOW", "fw", "5", SLOW]);
        rl(&mut con, &["RL.LEAKYBUCKET", "lb", "5", "1", SLOW]);
        rl(&mut con, &["RL.SLIDING", "sl", "5", SLOW]);
        slow_window(&mut con, "hw", "5", "1");
        let keys = ["string", "hash", "tb", "fw", "lb", "sl", "hw"];
        let before: Vec<_> = keys
            .iter()
            .map(|key| (dump(&mut con, key), pttl(&mut con, key)))
            .collect();
        for key in ["string", "hash", "tb", "fw", "lb", "sl"] {
            for cost in ["1", "0"] {
                let words = ["RL.HASHWINDOW", key, "5", SLOW, SLOW_BUCKET, "COST", cost];
                let err = query_err(&mut con, &words);
                assert!(err.starts_with("WRONGTYPE"), "{words:?}: {err}");
            }
        }
        for words in [
            ["RL.TOKENBUCKET", "hw", "5", "1", SLOW].as_slice(),
            ["RL.FIXEDWINDOW", "hw", "5", SLOW].as_slice(),
            ["RL.LEAKYBUCKET", "hw", "5", "1", SLOW].as_slice(),
            ["RL.SLIDING", "hw", "5", SLOW].as_slice(),
            ["RL.SLIDING", "hw", "5", SLOW, "COST", "0"].as_slice(),
        ] {
            let err = query_err(&mut con, words);
            assert!(err.starts_with("WRONGTYPE"), "{words:?}: {err}");
        }
        let after: Vec<_> = keys
            .iter()
            .map(|key| (dump(&mut con, key), pttl(&mut con, key)))
            .collect();
        for ((key, b), a) in keys.iter().zip(&before).zip(&after) {
            assert_eq!(a.0, b.0, "a WRONGTYPE call changed {key}");
            assert!(a.1 <= b.1, "a WRONGTYPE call changed the TTL of {key}");
        }
        assert_eq!(key_type(&mut con, "hw"), "rl-hashwn");
    });
}

#[test]
fn command_info_declares_the_key_and_write_fast_flags() {
    for_each_server(|kind| {
        let server = Server::start(kind, &[]);
        let mut con = server.conn();
        for words in [
            [
                "COMMAND",
                "GETKEYS",
                "RL.HASHWINDOW",
                "k",
                "5",
                "1000",
                "100",
            ]
            .as_slice(),
            [
                "COMMAND",
                "GETKEYS",
                "RL.HASHWINDOW",
                "k",
                "5",
                "1000",
                "100",
                "COST",
                "2",
            ]
            .as_slice(),
        ] {
            let keys: Vec<String> = query(&mut con, words);
            assert_eq!(keys, ["k"], "{words:?}");
        }
        let reply: Vec<Value> = query(&mut con, &["COMMAND", "INFO", "RL.HASHWINDOW"]);
        let Some(Value::Array(info)) = reply.first() else {
            panic!("COMMAND INFO RL.HASHWINDOW: {reply:?}");
        };
        assert_eq!(info[1], Value::Int(-5), "arity: {info:?}");
        assert_eq!(
            info[3..6],
            [Value::Int(1), Value::Int(1), Value::Int(1)],
            "key positions: {info:?}"
        );
        let flags = format!("{:?}", info[2]);
        for flag in ["write", "fast"] {
            assert!(flags.contains(flag), "flags {flags} lack {flag}");
        }
    });
}

// ---------------------------------------------------------------------------
// Replication and persistence

/// Master options: no periodic PING in the replication stream, so its offset
/// moves only when a command is propagated.
const QUIET_MASTER: &[&str] = &[
    "--repl-ping-replica-period",
    "3600",
    "--repl-timeout",
    "7200",
];

/// Traffic over windows that outlive the test, spread over a few
/// milliseconds so that the fine one fills several buckets: admitted,
/// denied and peeks, and a parameter change.
fn make_windows(con: &mut Connection) {
    for cost in ["1", "3", "0", "20", "2", "1", "1"] {
        let start = server_time_us(con);
        slow_window(con, "hw", "10", cost);
        rl(
            con,
            &[
                "RL.HASHWINDOW",
                "hw:fine",
                "1000",
                "7200",
                "2",
                "COST",
                cost,
            ],
        );
        rl(
            con,
            &[
                "RL.HASHWINDOW",
                "hw:ring",
                "100",
                "40000",
                "4000",
                "COST",
                cost,
            ],
        );
        until_server_time(con, start + 2000);
    }
    rl(
        con,
        &[
            "RL.HASHWINDOW",
            "hw:ring",
            "90",
            "80000",
            "4000",
            "COST",
            "4",
        ],
    );
}
const WINDOWS: [&str; 3] = ["hw", "hw:fine", "hw:ring"];

/// `DUMP` and `PTTL` of every key given.
fn snapshot(con: &mut Connection, keys: &[&str]) -> Vec<(Option<Vec<u8>>, i64)> {
    keys.iter()
        .map(|key| (dump(con, key), pttl(con, key)))
        .collect()
}

/// Same states, and expiries that did not move later.
fn assert_same_after(
    what: &str,
    con: &mut Connection,
    keys: &[&str],
    before: &[(Option<Vec<u8>>, i64)],
) {
    let after = snapshot(con, keys);
    for ((key, b), a) in keys.iter().zip(before).zip(&after) {
        assert!(b.0.is_some(), "{key} missing before {what}");
        assert_eq!(a.0, b.0, "{key}: state differs after {what}");
        assert!(
            a.1 > 0 && a.1 <= b.1,
            "{key}: PTTL {} before {what}, {} after",
            b.1,
            a.1
        );
    }
}

/// Asserts `key` is the same limiter on master and replica.
fn assert_same_state(master: &mut Connection, replica: &mut Connection, key: &str) {
    let on_master = dump(master, key);
    assert!(on_master.is_some(), "{key} missing on the master");
    assert_eq!(
        dump(replica, key),
        on_master,
        "DUMP {key} differs between master and replica"
    );
    let digest_master: Value = query(master, &["DEBUG", "DIGEST-VALUE", key]);
    let digest_replica: Value = query(replica, &["DEBUG", "DIGEST-VALUE", key]);
    assert_eq!(digest_replica, digest_master, "DIGEST-VALUE {key} differs");
    let (ttl_master, ttl_replica) = (pttl(master, key), pttl(replica, key));
    assert!(
        ttl_master > 0 && ttl_replica > 0 && (ttl_master - ttl_replica).abs() <= 1000,
        "PTTL {key}: master {ttl_master}, replica {ttl_replica}"
    );
}

/// A small deterministic generator (xorshift64), so a failure replays.
struct Xorshift(u64);

impl Xorshift {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn pick<'a>(&mut self, choices: &[&'a str]) -> &'a str {
        choices[(self.next() % choices.len() as u64) as usize]
    }
}

/// The same call from a Lua script.
const SCRIPT: &str =
    "return redis.call('RL.HASHWINDOW', KEYS[1], ARGV[1], ARGV[2], ARGV[3], 'COST', ARGV[4])";

#[test]
fn replica_state_equals_master_after_mixed_traffic() {
    for_each_server(|kind| {
        let master = Server::start(kind, &[]);
        let replica = replica_of(&master);
        let (mut m, mut r) = (master.conn(), replica.conn());
        let mut random = Xorshift(0x4a54_0bad_cafe_0005);
        for i in 0..1500 {
            let key = format!("hw{}", random.next() % 12);
            let limit = random.pick(&["2", "10", "10", "1000"]);
            let (window_ms, bucket_ms) = *[
                ("10", "1"),
                ("1000", "100"),
                ("3000", "1"),
                ("60000", "1000"),
                ("60000", "60000"),
                ("3600000", "60000"),
            ]
            .get((random.next() % 6) as usize)
            .unwrap();
            let cost = random.pick(&["0", "1", "1", "1", "2", "5", "11"]);
            let words = [
                "RL.HASHWINDOW",
                &key,
                limit,
                window_ms,
                bucket_ms,
                "COST",
                cost,
            ];
            let reply: Value = match i % 10 {
                // Inside a transaction and a script too.
                3 => {
                    let _: () = query(&mut m, &["MULTI"]);
                    let _: String = query(&mut m, &words);
                    let exec: Vec<Value> = query(&mut m, &["EXEC"]);
                    exec.into_iter().next().unwrap()
                }
                7 => query(
                    &mut m,
                    &["EVAL", SCRIPT, "1", &key, limit, window_ms, bucket_ms, cost],
                ),
                _ => query(&mut m, &words),
            };
            Reply::from_value(&reply);
        }
        wait_for_sync(&master, &replica);
        let keys: Vec<String> = query(&mut m, &["KEYS", "*"]);
        assert!(!keys.is_empty());
        let mut compared = 0;
        for key in &keys {
            // Keys of the shortest windows may just have expired; compare the rest.
            if pttl(&mut m, key) > 1000 {
                assert_same_state(&mut m, &mut r, key);
                compared += 1;
            }
        }
        assert!(compared > 0, "no long-lived window to compare");
    });
}

#[test]
fn replica_gets_existing_windows_through_full_sync() {
    for_each_server(|kind| {
        let master = Server::start(kind, &[]);
        let mut m = master.conn();
        make_windows(&mut m);
        let replica = replica_of(&master);
        let mut r = replica.conn();
        wait_for_sync(&master, &replica);
        for key in WINDOWS {
            assert_same_state(&mut m, &mut r, key);
        }
        slow_window(&mut m, "hw", "10", "1");
        wait_for_sync(&master, &replica);
        assert_same_state(&mut m, &mut r, "hw");
    });
}

#[test]
fn denials_and_cost_zero_propagate_nothing() {
    for_each_server(|kind| {
        let master = Server::start(kind, QUIET_MASTER);
        let replica = replica_of(&master);
        let mut m = master.conn();
        slow_window(&mut m, "hw", "2", "2");
        wait_for_sync(&master, &replica);
        let offset_before = master_offset(&master);
        for _ in 0..50 {
            assert!(!slow_window(&mut m, "hw", "2", "1").allowed);
            assert!(!slow_window(&mut m, "hw", "2", "3").allowed);
            slow_window(&mut m, "hw", "2", "0");
            rl(
                &mut m,
                &["RL.HASHWINDOW", "hw", "2", "60000", "1000", "COST", "0"],
            );
            slow_window(&mut m, "new", "2", "0");
            slow_window(&mut m, "new", "2", "3");
            query_err(&mut m, &["RL.HASHWINDOW", "hw", "0", SLOW, SLOW_BUCKET]);
            query_err(&mut m, &["RL.HASHWINDOW", "hw", "2", SLOW, "1"]);
            query_err(&mut m, &["RL.SLIDING", "hw", "5", SLOW]);
        }
        assert_eq!(
            master_offset(&master),
            offset_before,
            "denied, COST 0 or failed calls were propagated"
        );
        assert!(slow_window(&mut m, "other", "2", "1").allowed);
        assert!(master_offset(&master) > offset_before);
    });
}

#[test]
fn replica_refuses_calls_from_clients() {
    for_each_server(|kind| {
        let master = Server::start(kind, &[]);
        let replica = replica_of(&master);
        let mut r = replica.conn();
        let err = query_err(&mut r, &["RL.HASHWINDOW", "hw", "5", "1000", "100"]);
        assert!(err.starts_with("READONLY"), "{err}");
        assert_eq!(dbsize(&mut r), 0);
    });
}

#[test]
fn windows_survive_save_and_restart() {
    for_each_server(|kind| {
        let mut server = Server::start(kind, &[]);
        let mut con = server.conn();
        make_windows(&mut con);
        let before = snapshot(&mut con, &WINDOWS);
        let _: () = query(&mut con, &["SAVE"]);
        server.restart();
        let mut con = server.conn();
        assert_same_after("SAVE and restart", &mut con, &WINDOWS, &before);
        assert_eq!(key_type(&mut con, "hw"), "rl-hashwn");
        let r = slow_window(&mut con, "hw", "10", "0");
        assert_eq!(r.remaining, 10 - 8, "{r:?}");
    });
}

#[test]
fn windows_survive_an_aof_restart() {
    for_each_server(|kind| {
        let mut server = Server::start(kind, &["--appendonly", "yes"]);
        let mut con = server.conn();
        make_windows(&mut con);
        let before = snapshot(&mut con, &WINDOWS);
        server.restart();
        let mut con = server.conn();
        assert_same_after("an AOF restart", &mut con, &WINDOWS, &before);
    });
}

/// True once the AOF base file holds `RL.SETSTATE` for `algorithm`.
fn base_aof_has_setstate(server: &Server, algorithm: &str) -> bool {
    let Ok(entries) = fs::read_dir(server.dir.join("appendonlydir")) else {
        return false;
    };
    entries.filter_map(Result::ok).any(|entry| {
        entry.file_name().to_string_lossy().ends_with(".base.aof")
            && fs::read(entry.path())
                .map(|bytes| {
                    // The algorithm as an argument of its own.
                    let text = String::from_utf8_lossy(&bytes);
                    text.contains("RL.SETSTATE") && text.contains(&format!("\r\n{algorithm}\r\n"))
                })
                .unwrap_or(false)
    })
}

#[test]
fn windows_survive_an_aof_rewrite_without_rdb_preamble() {
    for_each_server(|kind| {
        let mut server = Server::start(
            kind,
            &["--appendonly", "yes", "--aof-use-rdb-preamble", "no"],
        );
        let mut con = server.conn();
        make_windows(&mut con);
        let _: Value = query(&mut con, &["BGREWRITEAOF"]);
        poll_until("the AOF rewrite to finish", Duration::from_secs(20), || {
            let info = server.info("persistence");
            info_field(&info, "aof_rewrite_in_progress").as_deref() == Some("0")
                && info_field(&info, "aof_rewrite_scheduled").as_deref() == Some("0")
                && base_aof_has_setstate(&server, "HASHWINDOW")
        });
        // More calls after the rewrite land in the incremental file.
        slow_window(&mut con, "hw", "10", "1");
        let before = snapshot(&mut con, &WINDOWS);
        server.restart();
        let mut con = server.conn();
        assert_same_after("BGREWRITEAOF and restart", &mut con, &WINDOWS, &before);
    });
}

#[test]
fn dump_restore_and_copy_keep_the_state() {
    for_each_server(|kind| {
        let server = Server::start(kind, &[]);
        let mut con = server.conn();
        make_windows(&mut con);
        let payload = dump(&mut con, "hw").unwrap();
        let _: () = redis::cmd("RESTORE")
            .arg("hw:restored")
            .arg(0)
            .arg(&payload)
            .query(&mut con)
            .expect("RESTORE of a DUMP payload");
        assert_eq!(dump(&mut con, "hw:restored"), Some(payload.clone()));
        assert_eq!(key_type(&mut con, "hw:restored"), "rl-hashwn");
        let copied: i64 = query(&mut con, &["COPY", "hw", "hw:copy"]);
        assert_eq!(copied, 1);
        assert_eq!(dump(&mut con, "hw:copy"), Some(payload.clone()));
        let original_ttl = pttl(&mut con, "hw");
        let ttl = pttl(&mut con, "hw:copy");
        assert!(
            ttl > 0 && ttl <= original_ttl,
            "COPY keeps the expiry: PTTL {ttl}, original {original_ttl}"
        );

        let peek = |con: &mut Connection, key: &str| slow_window(con, key, "10", "0").remaining;
        let original = peek(&mut con, "hw");
        assert_eq!(peek(&mut con, "hw:restored"), original);
        assert!(slow_window(&mut con, "hw:copy", "10", "1").allowed);
        assert_eq!(peek(&mut con, "hw:copy"), original - 1);
        assert_eq!(
            peek(&mut con, "hw"),
            original,
            "using the copy changed the original"
        );
        assert_eq!(dump(&mut con, "hw"), Some(payload));
    });
}

fn restore(con: &mut Connection, key: &str, payload: &[u8]) -> Result<(), String> {
    redis::cmd("RESTORE")
        .arg(key)
        .arg(0)
        .arg(payload)
        .arg("REPLACE")
        .query::<()>(con)
        .map_err(|e| error_text(&e))
}

/// After a `RESTORE` of a doubtful payload: if it was accepted, limiter
/// calls on the key still answer (a reply or a clean error, never a crash or
/// a caught panic).
fn exercise(con: &mut Connection, key: &str) {
    for words in [
        ["RL.HASHWINDOW", key, "100", "40000", "4000", "COST", "0"].as_slice(),
        ["RL.HASHWINDOW", key, "100", "40000", "4000", "COST", "200"].as_slice(),
        ["RL.HASHWINDOW", key, "100", "40000", "4000"].as_slice(),
        ["RL.HASHWINDOW", key, "100", "60000", "1000", "COST", "0"].as_slice(),
        ["RL.HASHWINDOW", key, "3", "10", "1"].as_slice(),
    ] {
        match command(words).query::<Value>(con) {
            Ok(value) => {
                Reply::from_value(&value);
            }
            Err(e) => {
                let text = error_text(&e);
                assert!(
                    !text.contains("internal error"),
                    "{words:?} on a restored key hit a caught panic: {text}"
                );
            }
        }
    }
    let _: Value = query(con, &["DUMP", key]);
    let _: Value = query(con, &["DEBUG", "DIGEST-VALUE", key]);
    let _: Value = query(con, &["MEMORY", "USAGE", key]);
}

#[test]
fn restore_of_corrupt_payloads_never_harms_the_server() {
    for_each_server(|kind| {
        let mut server = Server::start(kind, &[]);
        let mut con = server.conn();
        make_windows(&mut con);
        let payload = dump(&mut con, "hw:ring").unwrap();
        let body = payload::body_len(&payload);
        for pos in 10..body {
            let mutations: [fn(u8) -> u8; 4] = [|b| b ^ 0x01, |b| b ^ 0x80, |_| 0x00, |_| 0xff];
            for mutate in mutations {
                let mut bad = payload.clone();
                bad[pos] = mutate(bad[pos]);
                payload::reseal(&mut bad);
                if restore(&mut con, "victim", &bad).is_ok() {
                    exercise(&mut con, "victim");
                }
            }
        }
        let fields = payload::module_fields(&payload).expect("a module value of integers");
        for i in 0..fields.len() {
            for extreme in [0, 1, 1_000_001, (1 << 40) + 1, 1 << 53, 1 << 62, u64::MAX] {
                let mut bad_fields = fields.clone();
                bad_fields[i] = match &fields[i] {
                    Field::Unsigned(_) => Field::Unsigned(extreme),
                    Field::Signed(_) => Field::Signed(extreme),
                    Field::String(_) => continue,
                };
                let bad = payload::with_fields(&payload, &bad_fields);
                if restore(&mut con, "victim", &bad).is_ok() {
                    exercise(&mut con, "victim");
                }
            }
        }
        for len in 0..fields.len() {
            let bad = payload::with_fields(&payload, &fields[..len]);
            assert!(restore(&mut con, "victim", &bad).is_err(), "{len} fields");
        }
        let mut extra = fields.clone();
        extra.push(Field::Unsigned(1));
        let bad = payload::with_fields(&payload, &extra);
        assert!(
            restore(&mut con, "victim", &bad).is_err(),
            "a field too many"
        );
        assert!(server.is_running(), "the server died");
        let pong: String = query(&mut con, &["PING"]);
        assert_eq!(pong, "PONG");
    });
}

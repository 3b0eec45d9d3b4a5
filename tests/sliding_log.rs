//! `RL.SLIDING key limit window_ms [COST n]` against real servers: an exact
//! sliding log. Never more than `limit` units are admitted in any interval of
//! `window_ms`; an admitted request is logged at the next whole millisecond
//! (so it may leave the window up to 1 ms late, never early), and the key
//! expires when its newest entry leaves. The log takes about 8 bytes per
//! millisecond that holds units, in a ring that grows and shrinks.
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

/// A 1000 s window: nothing leaves it during a test.
const SLOW_MS: i64 = 1_000_000;
const SLOW: &str = "1000000";
/// Slack for the time a test itself takes, far above any real run.
const SLACK_MS: i64 = 10_000;

fn assert_between(what: &str, value: i64, above: i64, at_most: i64) {
    assert!(
        value > above && value <= at_most,
        "{what} = {value}, expected in ({above}, {at_most}]"
    );
}

fn slow_log(con: &mut Connection, key: &str, limit: &str, cost: &str) -> Reply {
    rl(con, &["RL.SLIDING", key, limit, SLOW, "COST", cost])
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

/// Waits, if needed, until the current `window_ms`-aligned window has
/// between `min_left_ms` and `max_left_ms` left.
fn near_window_end(con: &mut Connection, window_ms: u64, min_left_ms: u64, max_left_ms: u64) {
    loop {
        let now_ms = server_time_us(con) / 1000;
        let left_ms = window_ms - now_ms % window_ms;
        if left_ms > min_left_ms && left_ms <= max_left_ms {
            return;
        }
        let sleep_ms = if left_ms > max_left_ms {
            left_ms - max_left_ms
        } else {
            left_ms + 1
        };
        sleep(Duration::from_millis(sleep_ms));
    }
}

// ---------------------------------------------------------------------------
// Admission

#[test]
fn log_admits_up_to_limit_then_denies() {
    for_each_server(|kind| {
        let server = Server::start(kind, &[]);
        let mut con = server.conn();
        for remaining in [2, 1, 0] {
            let r = slow_log(&mut con, "sl", "3", "1");
            assert!(r.allowed, "{r:?}");
            assert_eq!((r.limit, r.remaining, r.wait_ms), (3, remaining, 0));
        }
        let r = slow_log(&mut con, "sl", "3", "1");
        assert!(!r.allowed, "4th call on a limit of 3: {r:?}");
        assert_eq!((r.limit, r.remaining), (3, 0));
        // Denied until the first unit leaves, one window after it came.
        assert_between("wait_ms", r.wait_ms, SLOW_MS - SLACK_MS, SLOW_MS + 1);
        assert_between("reset_ms", r.reset_ms, SLOW_MS - SLACK_MS, SLOW_MS + 1);
        assert!(r.wait_ms <= r.reset_ms, "{r:?}");
    });
}

#[test]
fn admitted_units_leave_one_window_after_the_next_whole_millisecond() {
    for_each_server(|kind| {
        let server = Server::start(kind, &[]);
        let mut con = server.conn();
        // The entry is stamped at the millisecond at or after the request, so
        // it leaves window_ms after that: reset_ms is window_ms, plus 1 when
        // the request came inside a millisecond.
        for window_ms in [1i64, 7, 1000, SLOW_MS, MAX_PARAM as i64] {
            let window = window_ms.to_string();
            for call in 0..5 {
                let r = rl(&mut con, &["RL.SLIDING", "sl", "100", &window]);
                assert!(r.allowed, "{r:?}");
                assert!(
                    r.reset_ms == window_ms || r.reset_ms == window_ms + 1,
                    "window {window_ms}, call {call}: reset_ms {}",
                    r.reset_ms
                );
            }
            let _: i64 = query(&mut con, &["DEL", "sl"]);
        }
    });
}

#[test]
fn log_has_no_double_burst_at_a_fixed_window_edge() {
    for_each_server(|kind| {
        let server = Server::start(kind, &[]);
        let mut con = server.conn();
        const W: u64 = 1000;
        let (fixed, sliding) = (
            ["RL.FIXEDWINDOW", "fw", "5", "1000"],
            ["RL.SLIDING", "sl", "5", "1000"],
        );
        // Both take a burst of 5 near the end of an aligned window; the
        // attempt is repeated if the burst happens to straddle the edge.
        let mut burst_start_us = 0;
        for attempt in 0.. {
            assert!(attempt < 10, "never managed a burst inside one window");
            let _: i64 = query(&mut con, &["DEL", "fw", "sl"]);
            near_window_end(&mut con, W, 100, 400);
            let before = server_time_us(&mut con);
            for _ in 0..5 {
                assert!(rl(&mut con, &fixed).allowed);
                assert!(rl(&mut con, &sliding).allowed);
            }
            let after = server_time_us(&mut con);
            if before / (W * 1000) == after / (W * 1000) {
                burst_start_us = before;
                break;
            }
        }
        // The fixed window reopens at its edge and admits a second burst ...
        poll_until("the next fixed window", Duration::from_secs(5), || {
            rl(
                &mut con,
                &["RL.FIXEDWINDOW", "fw", "5", "1000", "COST", "0"],
            )
            .remaining
                == 5
        });
        for i in 0..5 {
            let r = rl(&mut con, &fixed);
            assert!(r.allowed, "fixed window, second burst, call {i}: {r:?}");
        }
        // ... the log does not: its 5 units stay for a whole window.
        for i in 0..5 {
            let (r, _, after) = timed(&mut con, &sliding);
            assert!(!r.allowed, "sliding log, second burst, call {i}: {r:?}");
            assert_eq!(r.remaining, 0);
            // It may go once the first unit has left, a window after it came.
            assert!(
                after + r.wait_ms as u64 * 1000 >= burst_start_us + W * 1000,
                "wait_ms {} ends before the first unit leaves",
                r.wait_ms
            );
        }
        // When it admits again, a window has passed since the first burst.
        let mut admitted_after = 0;
        poll_until("the log to admit again", Duration::from_secs(5), || {
            let (r, _, after) = timed(&mut con, &sliding);
            admitted_after = after;
            r.allowed
        });
        assert!(
            admitted_after >= burst_start_us + W * 1000,
            "admitted {} us after the burst began, within one window",
            admitted_after - burst_start_us
        );
    });
}

#[test]
fn no_window_ever_holds_more_than_the_limit() {
    for_each_server(|kind| {
        let server = Server::start(kind, &[]);
        let mut con = server.conn();
        const LIMIT: u64 = 5;
        const W_US: u64 = 100_000;
        // Calls as fast as they come for a while, varied costs; every
        // admitted one recorded with bounds on its instant.
        let costs = ["1", "2", "1", "3", "1", "0", "1"];
        let start = server_time_us(&mut con);
        let mut admitted: Vec<(u64, u64, u64)> = Vec::new(); // (before, after, cost)
        let mut i = 0;
        while server_time_us(&mut con) < start + 5 * W_US {
            let cost = costs[i % costs.len()];
            i += 1;
            let (r, before, after) =
                timed(&mut con, &["RL.SLIDING", "sl", "5", "100", "COST", cost]);
            if r.allowed && cost != "0" {
                admitted.push((before, after, cost.parse().unwrap()));
            }
        }
        assert!(admitted.len() > 5, "too few admissions to tell");
        // Admissions certainly less than one window apart together fit in
        // the limit.
        for (k, &(first_before, _, _)) in admitted.iter().enumerate() {
            let units: u64 = admitted[k..]
                .iter()
                .take_while(|&&(_, after, _)| after < first_before + W_US)
                .map(|&(_, _, cost)| cost)
                .sum();
            assert!(
                units <= LIMIT,
                "{units} units admitted within one window of 100 ms"
            );
        }
    });
}

#[test]
fn wait_is_until_the_oldest_units_have_left() {
    for_each_server(|kind| {
        let server = Server::start(kind, &[]);
        let mut con = server.conn();
        let call = |con: &mut Connection, cost: &str| {
            timed(con, &["RL.SLIDING", "sl", "5", SLOW, "COST", cost])
        };
        // 2 units, then (at least 50 ms later) 3 more: the log is full.
        let (r, first_before, first_after) = call(&mut con, "2");
        assert!(r.allowed);
        until_server_time(&mut con, first_after + 50_000);
        let (r, second_before, second_after) = call(&mut con, "3");
        assert!(r.allowed);
        assert_eq!(r.remaining, 0);

        // Leaves at: entry millisecond (rounded up) + window.
        let leaves = |before: u64, after: u64| {
            (
                before.div_ceil(1000) + SLOW_MS as u64,
                after.div_ceil(1000) + SLOW_MS as u64,
            )
        };
        for (cost, (earliest, latest)) in [
            ("1", leaves(first_before, first_after)),
            ("2", leaves(first_before, first_after)),
            ("3", leaves(second_before, second_after)),
            ("5", leaves(second_before, second_after)),
        ] {
            let (r, before, after) = call(&mut con, cost);
            assert!(!r.allowed, "COST {cost} on a full log: {r:?}");
            let (goes_from, goes_to) = (
                before / 1000 + r.wait_ms as u64,
                after.div_ceil(1000) + r.wait_ms as u64,
            );
            assert!(
                goes_to >= earliest && goes_from <= latest,
                "COST {cost}: wait_ms {} does not end when the units it needs leave",
                r.wait_ms
            );
        }
        let (r, _, _) = call(&mut con, "6");
        assert_eq!((r.allowed, r.wait_ms), (false, -1));
    });
}

#[test]
fn denied_request_changes_nothing() {
    for_each_server(|kind| {
        let server = Server::start(kind, &[]);
        let mut con = server.conn();
        slow_log(&mut con, "sl", "3", "2");
        slow_log(&mut con, "sl", "3", "1");
        let state_before = dump(&mut con, "sl");
        let pttl_before = pttl(&mut con, "sl");
        for cost in ["1", "2", "3", "4"] {
            for _ in 0..10 {
                assert!(!slow_log(&mut con, "sl", "3", cost).allowed);
            }
        }
        assert_eq!(
            dump(&mut con, "sl"),
            state_before,
            "a denial changed the state"
        );
        let pttl_after = pttl(&mut con, "sl");
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
        let r = slow_log(&mut con, "sl", "5", "3");
        assert!(r.allowed);
        assert_eq!((r.limit, r.remaining, r.wait_ms), (5, 2, 0));
        let r = slow_log(&mut con, "sl", "5", "3");
        assert!(!r.allowed, "3 more on 2 left: {r:?}");
        assert_eq!(r.remaining, 2);
        assert_between("wait_ms", r.wait_ms, SLOW_MS - SLACK_MS, SLOW_MS + 1);
        let r = slow_log(&mut con, "sl", "5", "2");
        assert!(r.allowed);
        assert_eq!(r.remaining, 0);
    });
}

#[test]
fn cost_above_limit_is_never_admitted() {
    for_each_server(|kind| {
        let server = Server::start(kind, &[]);
        let mut con = server.conn();
        let r = slow_log(&mut con, "sl", "5", "6");
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
        assert!(!exists(&mut con, "sl"), "a denial created the key");
        slow_log(&mut con, "sl", "5", "1");
        let r = slow_log(&mut con, "sl", "5", "6");
        assert!(!r.allowed);
        assert_eq!((r.remaining, r.wait_ms), (4, -1));
    });
}

#[test]
fn cost_zero_peeks_without_creating_or_changing_anything() {
    for_each_server(|kind| {
        let server = Server::start(kind, &[]);
        let mut con = server.conn();
        let r = slow_log(&mut con, "sl", "5", "0");
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
        assert!(!exists(&mut con, "sl"), "COST 0 created the key");
        assert_eq!(dbsize(&mut con), 0);

        slow_log(&mut con, "sl", "5", "2");
        let state = dump(&mut con, "sl");
        let r = slow_log(&mut con, "sl", "5", "0");
        assert!(r.allowed);
        assert_eq!((r.remaining, r.wait_ms), (3, 0));
        assert_between("reset_ms", r.reset_ms, SLOW_MS - SLACK_MS, SLOW_MS + 1);
        slow_log(&mut con, "sl", "5", "3");
        let r = slow_log(&mut con, "sl", "5", "0");
        assert_eq!((r.allowed, r.remaining, r.wait_ms), (true, 0, 0), "{r:?}");
        assert_ne!(dump(&mut con, "sl"), state);
        let state = dump(&mut con, "sl");
        slow_log(&mut con, "sl", "5", "0");
        assert_eq!(dump(&mut con, "sl"), state, "COST 0 changed the state");
    });
}

#[test]
fn key_ttl_follows_reset_ms() {
    for_each_server(|kind| {
        let server = Server::start(kind, &[]);
        let mut con = server.conn();
        for cost in ["1", "2"] {
            let r = slow_log(&mut con, "sl", "5", cost);
            assert!(r.allowed);
            let ttl = pttl(&mut con, "sl");
            assert!(
                ttl > r.reset_ms - SLACK_MS && ttl <= r.reset_ms,
                "PTTL {ttl} vs reset_ms {}",
                r.reset_ms
            );
        }
    });
}

#[test]
fn log_key_expires_when_its_newest_entry_leaves() {
    for_each_server(|kind| {
        let server = Server::start(kind, &[]);
        let mut con = server.conn();
        let r = rl(&mut con, &["RL.SLIDING", "sl", "5", "200"]);
        assert!(r.allowed);
        assert!(r.reset_ms == 200 || r.reset_ms == 201, "{r:?}");
        poll_until("the log key to expire", Duration::from_secs(5), || {
            !exists(&mut con, "sl")
        });
        let r = rl(&mut con, &["RL.SLIDING", "sl", "5", "200"]);
        assert_eq!((r.allowed, r.remaining), (true, 4), "empty again");
    });
}

#[test]
fn request_is_admitted_after_waiting_wait_ms() {
    for_each_server(|kind| {
        let server = Server::start(kind, &[]);
        let mut con = server.conn();
        let call = |con: &mut Connection, cost: &str| {
            rl(con, &["RL.SLIDING", "sl", "3", "300", "COST", cost])
        };
        assert!(call(&mut con, "2").allowed);
        assert!(call(&mut con, "1").allowed);
        let denied = call(&mut con, "2");
        assert!(!denied.allowed);
        assert_between("wait_ms", denied.wait_ms, 0, 301);
        sleep(Duration::from_millis(denied.wait_ms as u64));
        let r = call(&mut con, "2");
        assert!(
            r.allowed,
            "denied again after waiting {}: {r:?}",
            denied.wait_ms
        );
    });
}

// ---------------------------------------------------------------------------
// Parameter changes: the log is kept as it is.

#[test]
fn lowering_the_limit_applies_to_the_units_held() {
    for_each_server(|kind| {
        let server = Server::start(kind, &[]);
        let mut con = server.conn();
        slow_log(&mut con, "sl", "5", "3");
        let r = slow_log(&mut con, "sl", "3", "1");
        assert!(!r.allowed, "3 held, limit lowered to 3: {r:?}");
        assert_eq!((r.limit, r.remaining), (3, 0));
        let r = slow_log(&mut con, "sl", "2", "0");
        assert_eq!((r.limit, r.remaining), (2, 0));
        let r = slow_log(&mut con, "sl", "4", "1");
        assert!(r.allowed, "3 held, limit 4: {r:?}");
        assert_eq!((r.limit, r.remaining), (4, 0));
    });
}

#[test]
fn widening_the_window_keeps_the_units_already_admitted() {
    for_each_server(|kind| {
        let server = Server::start(kind, &[]);
        let mut con = server.conn();
        // Admitted under a 100 ms window, then judged by a 1000 s one: they
        // are still in it, whenever the second call comes.
        assert!(rl(&mut con, &["RL.SLIDING", "sl", "3", "100", "COST", "3"]).allowed);
        let r = slow_log(&mut con, "sl", "3", "1");
        assert!(!r.allowed, "{r:?}");
        assert_between("wait_ms", r.wait_ms, SLOW_MS - SLACK_MS, SLOW_MS + 1);
    });
}

#[test]
fn extreme_parameters_are_exact() {
    for_each_server(|kind| {
        let server = Server::start(kind, &[]);
        let mut con = server.conn();
        let max = MAX_PARAM.to_string();
        let max_ms = MAX_PARAM as i64;
        // The largest window: about 35 years.
        let r = rl(&mut con, &["RL.SLIDING", "long", "2", &max]);
        assert!(r.allowed);
        assert!(r.reset_ms == max_ms || r.reset_ms == max_ms + 1, "{r:?}");
        let r = rl(&mut con, &["RL.SLIDING", "long", "2", &max, "COST", "2"]);
        assert!(!r.allowed);
        assert_between("wait_ms", r.wait_ms, max_ms - SLACK_MS, max_ms + 1);
        // The largest limit the default config allows, in one request.
        let r = rl(
            &mut con,
            &["RL.SLIDING", "big", "100000", "1000", "COST", "100000"],
        );
        assert_eq!((r.allowed, r.remaining), (true, 0));
        let r = rl(&mut con, &["RL.SLIDING", "big", "100000", "1000"]);
        assert!(!r.allowed);
        assert_between("wait_ms", r.wait_ms, 0, 1001);
    });
}

// ---------------------------------------------------------------------------
// Memory

/// `MEMORY USAGE key`.
fn memory_usage(con: &mut Connection, key: &str) -> i64 {
    query(con, &["MEMORY", "USAGE", key])
}

#[test]
fn memory_grows_about_8_bytes_per_millisecond_held_and_shrinks_back() {
    for_each_server(|kind| {
        let server = Server::start(kind, &[]);
        let mut con = server.conn();
        let call = |con: &mut Connection, key: &str| {
            let r = rl(con, &["RL.SLIDING", key, "100000", "1500"]);
            assert!(r.allowed, "{r:?}");
        };
        call(&mut con, "one");
        let one = memory_usage(&mut con, "one");
        assert!(
            one > 0 && one < 256,
            "MEMORY USAGE of a one-entry log: {one}"
        );

        // 300 requests, each in a millisecond of its own: 300 entries.
        const HELD: i64 = 300;
        let mut last_ms = 0;
        for _ in 0..HELD {
            let mut now_ms = last_ms;
            while now_ms == last_ms {
                now_ms = server_time_us(&mut con) / 1000;
            }
            last_ms = now_ms;
            call(&mut con, "sl");
        }
        let full = memory_usage(&mut con, "sl");
        let grown = full - one;
        // Each entry takes 8 bytes; the ring is at most twice as large as
        // its entries (a few of which may share a millisecond).
        assert!(
            (8 * (HELD - 20)..=16 * HELD + 64).contains(&grown),
            "{HELD} entries took {grown} bytes more than one ({one} -> {full})"
        );

        // Keep the key in use while the entries leave: one request every
        // 100 ms, until the whole burst is more than a window old.
        let burst_end_us = server_time_us(&mut con);
        let mut now_us = burst_end_us;
        while now_us < burst_end_us + 1_800_000 {
            until_server_time(&mut con, now_us + 100_000);
            call(&mut con, "sl");
            now_us = server_time_us(&mut con);
        }
        let after = memory_usage(&mut con, "sl");
        assert!(
            after - one <= grown / 4,
            "the burst left the window, the log still takes {after} bytes \
             (full: {full}, one entry: {one})"
        );
    });
}

#[test]
fn requests_in_one_millisecond_share_an_entry() {
    for_each_server(|kind| {
        let server = Server::start(kind, &[]);
        let mut con = server.conn();
        rl(&mut con, &["RL.SLIDING", "one", "100000", "60000"]);
        let one = memory_usage(&mut con, "one");
        // 1000 requests in one pipeline: they run within a few milliseconds.
        let mut pipe = redis::pipe();
        for _ in 0..1000 {
            pipe.cmd("RL.SLIDING").arg("sl").arg(100_000).arg(60_000);
        }
        let replies: Vec<Vec<i64>> = pipe.query(&mut con).expect("pipeline");
        assert!(replies.iter().all(|r| r[0] == 1));
        let r = rl(
            &mut con,
            &["RL.SLIDING", "sl", "100000", "60000", "COST", "0"],
        );
        assert_eq!(r.remaining, 100_000 - 1000);
        let many = memory_usage(&mut con, "sl");
        assert!(
            many - one < 2000,
            "1000 requests in a few milliseconds took {} bytes more than one",
            many - one
        );
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
        let good = ["5", "1000"];
        for (position, name) in ["limit", "window_ms"].iter().enumerate() {
            for bad in NOT_A_PARAMETER {
                let mut params = good;
                params[position] = bad;
                let words = ["RL.SLIDING", "sl", params[0], params[1]];
                let err = query_err(&mut con, &words);
                assert_err_naming(&err, name, &words);
            }
        }
        assert_eq!(
            query_err(&mut con, &["RL.SLIDING", "sl", "16777216", "1000"]),
            "ERR limit must be an integer from 1 to 16777215"
        );
        assert_eq!(
            query_err(&mut con, &["RL.SLIDING", "sl", "100001", "1000"]),
            "ERR limit is above ratelimit.sliding-max-limit (100000)"
        );
        assert_eq!(
            query_err(&mut con, &["RL.SLIDING", "sl", "5", "0"]),
            "ERR window_ms must be an integer from 1 to 1099511627776"
        );
        for bad in ["-1", "1099511627777", "x", "1.0", ""] {
            let words = ["RL.SLIDING", "sl", "5", "1000", "COST", bad];
            assert_err_naming(&query_err(&mut con, &words), "COST", &words);
        }
        for words in [
            ["RL.SLIDING", "sl", "5", "1000", "WINDOW", "1"].as_slice(),
            ["RL.SLIDING", "sl", "5", "1000", "COST", "1", "WINDOW", "1"].as_slice(),
        ] {
            assert_err_naming(&query_err(&mut con, words), "WINDOW", words);
        }
        for words in [
            ["RL.SLIDING", "sl", "5", "1000", "COST"].as_slice(),
            ["RL.SLIDING", "sl", "5", "1000", "COST", "1", "cost", "1"].as_slice(),
        ] {
            assert_err_naming(&query_err(&mut con, words), "COST", words);
        }
        assert_eq!(dbsize(&mut con), 0, "an error wrote a key");
    });
}

#[test]
fn errors_leave_an_existing_log_untouched() {
    for_each_server(|kind| {
        let server = Server::start(kind, &[]);
        let mut con = server.conn();
        slow_log(&mut con, "sl", "5", "2");
        let (state, ttl) = (dump(&mut con, "sl"), pttl(&mut con, "sl"));
        for words in [
            ["RL.SLIDING", "sl", "0", SLOW].as_slice(),
            ["RL.SLIDING", "sl", "100001", SLOW].as_slice(),
            ["RL.SLIDING", "sl", "5", SLOW, "COST", "-1"].as_slice(),
            ["RL.SLIDING", "sl", "5", SLOW, "FOO", "1"].as_slice(),
            ["RL.SLIDING", "sl", "5", SLOW, "AT", "1"].as_slice(),
        ] {
            query_err(&mut con, words);
        }
        assert_eq!(dump(&mut con, "sl"), state);
        assert!(pttl(&mut con, "sl") <= ttl);
    });
}

#[test]
fn wrong_argument_count_is_the_usual_arity_error() {
    for_each_server(|kind| {
        let server = Server::start(kind, &[]);
        let mut con = server.conn();
        for words in [
            ["RL.SLIDING"].as_slice(),
            ["RL.SLIDING", "sl"].as_slice(),
            ["RL.SLIDING", "sl", "5"].as_slice(),
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
            ["RL.SLIDING", "sl", "5", "1000", "AT", &now_us].as_slice(),
            ["RL.SLIDING", "sl", "5", "1000", "COST", "1", "at", &now_us].as_slice(),
        ] {
            let err = query_err(&mut con, words);
            assert_eq!(
                err, "ERR AT is reserved for replication and AOF loading",
                "{words:?}"
            );
        }
        let err = query_err(
            &mut con,
            &["RL.SETSTATE", "sl", "SLIDING", "1", "0", "0", "0", "0"],
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
        let _: i64 = query(&mut con, &["ZADD", "zset", "1", "a"]);
        rl(&mut con, &["RL.TOKENBUCKET", "tb", "5", "1", SLOW]);
        rl(&mut con, &["RL.FIXEDWINDOW", "fw", "5", SLOW]);
        rl(&mut con, &["RL.LEAKYBUCKET", "lb", "5", "1", SLOW]);
        rl(&mut con, &["RL.HASHWINDOW", "hw", "5", SLOW, "100000"]);
        slow_log(&mut con, "sl", "5", "1");
        let keys = ["string", "zset", "tb", "fw", "lb", "hw", "sl"];
        let before: Vec<_> = keys
            .iter()
            .map(|key| (dump(&mut con, key), pttl(&mut con, key)))
            .collect();
        for key in ["string", "zset", "tb", "fw", "lb", "hw"] {
            for cost in ["1", "0"] {
                let words = ["RL.SLIDING", key, "5", SLOW, "COST", cost];
                let err = query_err(&mut con, &words);
                assert!(err.starts_with("WRONGTYPE"), "{words:?}: {err}");
            }
        }
        for words in [
            ["RL.TOKENBUCKET", "sl", "5", "1", SLOW].as_slice(),
            ["RL.FIXEDWINDOW", "sl", "5", SLOW].as_slice(),
            ["RL.FIXEDWINDOW", "sl", "5", SLOW, "COST", "0"].as_slice(),
            ["RL.LEAKYBUCKET", "sl", "5", "1", SLOW].as_slice(),
            ["RL.HASHWINDOW", "sl", "5", SLOW, "100000"].as_slice(),
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
        assert_eq!(key_type(&mut con, "sl"), "rl-slilog");
    });
}

#[test]
fn command_info_declares_the_key_and_write_fast_flags() {
    for_each_server(|kind| {
        let server = Server::start(kind, &[]);
        let mut con = server.conn();
        for words in [
            ["COMMAND", "GETKEYS", "RL.SLIDING", "k", "5", "1000"].as_slice(),
            [
                "COMMAND",
                "GETKEYS",
                "RL.SLIDING",
                "k",
                "5",
                "1000",
                "COST",
                "2",
            ]
            .as_slice(),
        ] {
            let keys: Vec<String> = query(&mut con, words);
            assert_eq!(keys, ["k"], "{words:?}");
        }
        let reply: Vec<Value> = query(&mut con, &["COMMAND", "INFO", "RL.SLIDING"]);
        let Some(Value::Array(info)) = reply.first() else {
            panic!("COMMAND INFO RL.SLIDING: {reply:?}");
        };
        assert_eq!(info[1], Value::Int(-4), "arity: {info:?}");
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

/// Traffic over logs that outlive the test, spread over a few milliseconds
/// so that they hold several entries: admitted, denied and peeks, and a
/// parameter change.
fn make_logs(con: &mut Connection) {
    for cost in ["1", "3", "0", "20", "2", "1", "1"] {
        let start = server_time_us(con);
        rl(con, &["RL.SLIDING", "sl", "10", SLOW, "COST", cost]);
        rl(
            con,
            &["RL.SLIDING", "sl:big", "1000", "9999999", "COST", cost],
        );
        until_server_time(con, start + 2000);
    }
    rl(
        con,
        &["RL.SLIDING", "sl:big", "999", "8888888", "COST", "4"],
    );
}
const LOGS: [&str; 2] = ["sl", "sl:big"];

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
const SCRIPT: &str = "return redis.call('RL.SLIDING', KEYS[1], ARGV[1], ARGV[2], 'COST', ARGV[3])";

#[test]
fn replica_state_equals_master_after_mixed_traffic() {
    for_each_server(|kind| {
        let master = Server::start(kind, &[]);
        let replica = replica_of(&master);
        let (mut m, mut r) = (master.conn(), replica.conn());
        let mut random = Xorshift(0x5e1d_1234_abcd_0003);
        for i in 0..1500 {
            let key = format!("sl{}", random.next() % 12);
            let limit = random.pick(&["2", "10", "10", "1000"]);
            let window_ms = random.pick(&["1", "50", "1000", "60000", "3600000"]);
            let cost = random.pick(&["0", "1", "1", "1", "2", "5", "11"]);
            let words = ["RL.SLIDING", &key, limit, window_ms, "COST", cost];
            let reply: Value = match i % 10 {
                // Inside a transaction and a script too.
                3 => {
                    let _: () = query(&mut m, &["MULTI"]);
                    let _: String = query(&mut m, &words);
                    let exec: Vec<Value> = query(&mut m, &["EXEC"]);
                    exec.into_iter().next().unwrap()
                }
                7 => query(&mut m, &["EVAL", SCRIPT, "1", &key, limit, window_ms, cost]),
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
        assert!(compared > 0, "no long-lived log to compare");
    });
}

#[test]
fn replica_gets_existing_logs_through_full_sync() {
    for_each_server(|kind| {
        let master = Server::start(kind, &[]);
        let mut m = master.conn();
        make_logs(&mut m);
        let replica = replica_of(&master);
        let mut r = replica.conn();
        wait_for_sync(&master, &replica);
        for key in LOGS {
            assert_same_state(&mut m, &mut r, key);
        }
        rl(&mut m, &["RL.SLIDING", "sl", "10", SLOW]);
        wait_for_sync(&master, &replica);
        assert_same_state(&mut m, &mut r, "sl");
    });
}

#[test]
fn denials_and_cost_zero_propagate_nothing() {
    for_each_server(|kind| {
        let master = Server::start(kind, QUIET_MASTER);
        let replica = replica_of(&master);
        let mut m = master.conn();
        slow_log(&mut m, "sl", "2", "2");
        wait_for_sync(&master, &replica);
        let offset_before = master_offset(&master);
        for _ in 0..50 {
            assert!(!slow_log(&mut m, "sl", "2", "1").allowed);
            assert!(!slow_log(&mut m, "sl", "2", "3").allowed);
            slow_log(&mut m, "sl", "2", "0");
            slow_log(&mut m, "new", "2", "0");
            slow_log(&mut m, "new", "2", "3");
            query_err(&mut m, &["RL.SLIDING", "sl", "0", SLOW]);
            query_err(&mut m, &["RL.SLIDING", "sl", "100001", SLOW]);
            query_err(&mut m, &["RL.TOKENBUCKET", "sl", "5", "1", SLOW]);
        }
        assert_eq!(
            master_offset(&master),
            offset_before,
            "denied, COST 0 or failed calls were propagated"
        );
        assert!(slow_log(&mut m, "other", "2", "1").allowed);
        assert!(master_offset(&master) > offset_before);
    });
}

#[test]
fn replica_refuses_calls_from_clients() {
    for_each_server(|kind| {
        let master = Server::start(kind, &[]);
        let replica = replica_of(&master);
        let mut r = replica.conn();
        let err = query_err(&mut r, &["RL.SLIDING", "sl", "5", "1000"]);
        assert!(err.starts_with("READONLY"), "{err}");
        assert_eq!(dbsize(&mut r), 0);
    });
}

#[test]
fn logs_survive_save_and_restart() {
    for_each_server(|kind| {
        let mut server = Server::start(kind, &[]);
        let mut con = server.conn();
        make_logs(&mut con);
        let before = snapshot(&mut con, &LOGS);
        let _: () = query(&mut con, &["SAVE"]);
        server.restart();
        let mut con = server.conn();
        assert_same_after("SAVE and restart", &mut con, &LOGS, &before);
        assert_eq!(key_type(&mut con, "sl"), "rl-slilog");
        let r = slow_log(&mut con, "sl", "10", "0");
        assert_eq!(r.remaining, 10 - 8, "{r:?}");
    });
}

#[test]
fn logs_survive_an_aof_restart() {
    for_each_server(|kind| {
        let mut server = Server::start(kind, &["--appendonly", "yes"]);
        let mut con = server.conn();
        make_logs(&mut con);
        let before = snapshot(&mut con, &LOGS);
        server.restart();
        let mut con = server.conn();
        assert_same_after("an AOF restart", &mut con, &LOGS, &before);
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
fn logs_survive_an_aof_rewrite_without_rdb_preamble() {
    for_each_server(|kind| {
        let mut server = Server::start(
            kind,
            &["--appendonly", "yes", "--aof-use-rdb-preamble", "no"],
        );
        let mut con = server.conn();
        make_logs(&mut con);
        let _: Value = query(&mut con, &["BGREWRITEAOF"]);
        poll_until("the AOF rewrite to finish", Duration::from_secs(20), || {
            let info = server.info("persistence");
            info_field(&info, "aof_rewrite_in_progress").as_deref() == Some("0")
                && info_field(&info, "aof_rewrite_scheduled").as_deref() == Some("0")
                && base_aof_has_setstate(&server, "SLIDING")
        });
        // More calls after the rewrite land in the incremental file.
        rl(&mut con, &["RL.SLIDING", "sl", "10", SLOW]);
        let before = snapshot(&mut con, &LOGS);
        server.restart();
        let mut con = server.conn();
        assert_same_after("BGREWRITEAOF and restart", &mut con, &LOGS, &before);
    });
}

#[test]
fn dump_restore_and_copy_keep_the_state() {
    for_each_server(|kind| {
        let server = Server::start(kind, &[]);
        let mut con = server.conn();
        make_logs(&mut con);
        let payload = dump(&mut con, "sl").unwrap();
        let _: () = redis::cmd("RESTORE")
            .arg("sl:restored")
            .arg(0)
            .arg(&payload)
            .query(&mut con)
            .expect("RESTORE of a DUMP payload");
        assert_eq!(dump(&mut con, "sl:restored"), Some(payload.clone()));
        assert_eq!(key_type(&mut con, "sl:restored"), "rl-slilog");
        let copied: i64 = query(&mut con, &["COPY", "sl", "sl:copy"]);
        assert_eq!(copied, 1);
        assert_eq!(dump(&mut con, "sl:copy"), Some(payload.clone()));
        let original_ttl = pttl(&mut con, "sl");
        let ttl = pttl(&mut con, "sl:copy");
        assert!(
            ttl > 0 && ttl <= original_ttl,
            "COPY keeps the expiry: PTTL {ttl}, original {original_ttl}"
        );

        let peek = |con: &mut Connection, key: &str| slow_log(con, key, "10", "0").remaining;
        let original = peek(&mut con, "sl");
        assert_eq!(peek(&mut con, "sl:restored"), original);
        assert!(slow_log(&mut con, "sl:copy", "10", "1").allowed);
        assert_eq!(peek(&mut con, "sl:copy"), original - 1);
        assert_eq!(
            peek(&mut con, "sl"),
            original,
            "using the copy changed the original"
        );
        assert_eq!(dump(&mut con, "sl"), Some(payload));
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
        ["RL.SLIDING", key, "10", SLOW, "COST", "0"].as_slice(),
        ["RL.SLIDING", key, "10", SLOW, "COST", "3"].as_slice(),
        ["RL.SLIDING", key, "10", SLOW].as_slice(),
        ["RL.SLIDING", key, "3", "10"].as_slice(),
        ["RL.SLIDING", key, "100000", "1", "COST", "7"].as_slice(),
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
        make_logs(&mut con);
        let payload = dump(&mut con, "sl").unwrap();
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
            for extreme in [
                0,
                1,
                (1 << 24) - 1,
                1 << 24,
                (1 << 40) + 1,
                1 << 62,
                u64::MAX,
            ] {
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
        // Entries dropped or added, the count left as is (or not).
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

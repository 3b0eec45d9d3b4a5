//! `RL.SLIDING key limit window_ms [COST n]` against real servers: an exact
//! sliding log. Never more than `limit` units are admitted in any interval of
//! `window_ms`; an admitted request is logged at the next whole millisecond
//! (so it may leave the window up to 1 ms late, never early), and the key
//! expires when its newest entry leaves. The log takes about 8 bytes per
//! millisecond that holds units, in a ring that grows and shrinks. What
//! every limiter command promises (denials change nothing, `COST`,
//! `COST 0`, the TTL, errors, replication, persistence) is checked for it
//! with the others, in `contract/`.
//!
//! Time-dependent checks use slow windows with generous bounds, poll with a
//! deadline, or bound the server's clock reading between two `TIME` calls;
//! none asserts how long anything took.

use std::thread::sleep;
use std::time::Duration;

use crate::harness::contract::{assert_between, timed, until_server_time, SLACK_MS, SLOW, SLOW_MS};
use crate::harness::*;

/// A call under a 1000 s window: nothing leaves it during a test.
fn slow_log(con: &mut Connection, key: &str, limit: &str, cost: &str) -> Reply {
    rl(con, &["RL.SLIDING", key, limit, SLOW, "COST", cost])
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
        // it leaves window_ms after that; reset_ms counts from the request,
        // and is window_ms even when the request came inside a millisecond.
        for window_ms in [1i64, 7, 1000, SLOW_MS, MAX_PARAM as i64] {
            let window = window_ms.to_string();
            for call in 0..5 {
                let r = rl(&mut con, &["RL.SLIDING", "sl", "100", &window]);
                assert!(r.allowed, "{r:?}");
                assert_eq!(
                    r.reset_ms, window_ms,
                    "window {window_ms}, call {call}: {r:?}"
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
fn cost_beyond_what_is_left_waits_one_window() {
    for_each_server(|kind| {
        let server = Server::start(kind, &[]);
        let mut con = server.conn();
        assert!(slow_log(&mut con, "sl", "5", "3").allowed);
        let r = slow_log(&mut con, "sl", "5", "3");
        assert!(!r.allowed, "3 more on 2 left: {r:?}");
        assert_between("wait_ms", r.wait_ms, SLOW_MS - SLACK_MS, SLOW_MS + 1);
    });
}

// ---------------------------------------------------------------------------
// Parameter changes: the log is kept as it is (a lower limit applies to the
// units held: see `contract/decisions.rs`).

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

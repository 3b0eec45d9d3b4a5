//! `RL.HASHWINDOW key limit window_ms bucket_ms [COST n]` against real
//! servers: the sliding window approximated by `window_ms / bucket_ms`
//! buckets aligned on the Unix epoch, in fixed memory. A request is admitted
//! when the units its window's buckets hold plus its cost stay within
//! `limit`. The approximation is conservative: a unit counts until its whole
//! bucket has left the window (up to `bucket_ms` longer than the exact log
//! keeps it, never shorter), so no span of `window_ms` ever holds more than
//! `limit` units. What every limiter command promises (denials change
//! nothing, `COST`, `COST 0`, the TTL, errors, replication, persistence) is
//! checked for it with the others, in `contract/`.
//!
//! Time-dependent checks use slow windows with generous bounds, poll with a
//! deadline, or bound the server's clock reading between two `TIME` calls;
//! none asserts how long anything took.

use std::thread::sleep;
use std::time::Duration;

use crate::harness::contract::{assert_between, timed, until_server_time, SLACK_MS, SLOW, SLOW_MS};
use crate::harness::*;

/// A 1000 s window of ten 100 s buckets: nothing leaves it during a test.
const SLOW_BUCKET_MS: i64 = 100_000;
const SLOW_BUCKET: &str = "100000";

fn slow_window(con: &mut Connection, key: &str, limit: &str, cost: &str) -> Reply {
    rl(
        con,
        &["RL.HASHWINDOW", key, limit, SLOW, SLOW_BUCKET, "COST", cost],
    )
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
fn cost_beyond_what_is_left_waits_until_the_window_is_empty() {
    for_each_server(|kind| {
        let server = Server::start(kind, &[]);
        let mut con = server.conn();
        assert!(slow_window(&mut con, "hw", "5", "3").allowed);
        let r = slow_window(&mut con, "hw", "5", "3");
        assert!(!r.allowed, "3 more on 2 left: {r:?}");
        // All 3 sit in one bucket: it must leave, and then the window is empty.
        assert_eq!(r.wait_ms, r.reset_ms, "{r:?}");
    });
}

// ---------------------------------------------------------------------------
// Parameter changes: the units carry over, none leaves early (a lower limit
// applies to the units held: see `contract/decisions.rs`).

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

/// 2 bytes a bucket while every count fits in 16 bits, whatever the
/// traffic; a count that does not widens the whole ring (4 bytes a bucket).
/// `MEMORY USAGE` counts the ring's block as the allocator sized it: up to
/// a quarter more than asked for (jemalloc has four size classes in each
/// doubling), the 32-byte header beside it.
#[test]
fn memory_is_fixed_per_key_2_bytes_per_bucket_until_a_count_needs_more() {
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
                first >= 2 * buckets && first <= 2 * buckets * 5 / 4 + 200,
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
        // A count above 65535 (a raised limit): 4 bytes a bucket.
        let narrow: i64 = query(&mut con, &["MEMORY", "USAGE", "hw:3600"]);
        let r = rl(
            &mut con,
            &[
                "RL.HASHWINDOW",
                "hw:3600",
                "100000",
                "3600000",
                "1000",
                "COST",
                "70000",
            ],
        );
        assert!(r.allowed);
        let wide: i64 = query(&mut con, &["MEMORY", "USAGE", "hw:3600"]);
        assert!(
            wide >= narrow + 2 * 3600 && wide <= 4 * 3600 * 5 / 4 + 200,
            "3600 buckets widened: MEMORY USAGE {narrow} then {wide}"
        );
        // A new layout takes the memory of its own bucket count.
        rl(
            &mut con,
            &["RL.HASHWINDOW", "hw:60", "1000", "10000", "1000"],
        );
        let now: i64 = query(&mut con, &["MEMORY", "USAGE", "hw:60"]);
        assert!((20..=230).contains(&now), "10 buckets: MEMORY USAGE {now}");
    });
}

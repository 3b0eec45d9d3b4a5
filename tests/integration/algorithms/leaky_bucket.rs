//! `RL.LEAKYBUCKET key capacity leak_count leak_ms [COST n]` against real
//! servers: a shaping queue of at most `capacity` units that drains
//! `leak_count` units every `leak_ms`. An admitted request learns in
//! `wait_ms` when its turn comes, so callers that wait it act evenly spaced;
//! a request that would overflow the queue is denied. `remaining` is the free
//! room, `reset_ms` (and the key's TTL) the time until the queue is empty.
//! What every limiter command promises (denials change nothing, `COST`,
//! `COST 0`, the TTL, errors, replication, persistence) is checked for it
//! with the others, in `contract/`.
//!
//! Time-dependent checks use slow queues with generous bounds, poll with a
//! deadline, or bound the server's clock reading between two `TIME` calls;
//! none asserts how long anything took.

use std::time::Duration;

use crate::harness::contract::{assert_between, timed, SLACK_MS, SLOW, SLOW_MS};
use crate::harness::*;

/// A queue of 5 that lets one unit through every 1000 s: nothing drains
/// during a test.
fn slow_queue(con: &mut Connection, key: &str, cost: &str) -> Reply {
    rl(con, &["RL.LEAKYBUCKET", key, "5", "1", SLOW, "COST", cost])
}

// ---------------------------------------------------------------------------
// Shaping

#[test]
fn burst_is_spread_evenly_leak_ms_over_leak_count_apart() {
    for_each_server(|kind| {
        let server = Server::start(kind, &[]);
        let mut con = server.conn();
        // (capacity, leak_count, leak_ms, requests): one unit a second as in
        // the docs, and 3 a second, whose spacing is not a whole millisecond.
        for (capacity, leak_count, leak_ms, requests) in
            [(5u64, 1u64, 1000u64, 3u64), (10, 3, 1000, 6)]
        {
            let key = format!("lb:{leak_count}");
            let words = [
                "RL.LEAKYBUCKET",
                &key,
                &capacity.to_string(),
                &leak_count.to_string(),
                &leak_ms.to_string(),
            ];
            let calls: Vec<_> = (0..requests).map(|_| timed(&mut con, &words)).collect();
            let (_, first_before, first_after) = calls[0];
            for (i, &(r, before, after)) in calls.iter().enumerate() {
                assert!(r.allowed, "request {i} of a burst of {requests}: {r:?}");
                assert_eq!(r.remaining, (capacity - 1 - i as u64) as i64, "{r:?}");
                // Request i acts when the i units ahead of it have left: at the
                // first call's instant plus i * leak_ms / leak_count, exactly
                // (wait_ms rounds that delay up to the millisecond). Scaled by
                // leak_count to stay in integers.
                let i = i as i128;
                let (lc, period_us) = (leak_count as i128, leak_ms as i128 * 1000);
                let wait_us = r.wait_ms as i128 * 1000;
                assert!(
                    lc * first_before as i128 + i * period_us <= lc * (after as i128 + wait_us),
                    "request {i} acts too early: {r:?}"
                );
                assert!(
                    lc * first_after as i128 + i * period_us
                        > lc * (before as i128 + wait_us - 1000),
                    "request {i} waits too long: {r:?}"
                );
                // The queue is empty once the last unit has left.
                assert_between(
                    "reset_ms",
                    r.reset_ms,
                    r.wait_ms,
                    r.wait_ms + (leak_ms / leak_count) as i64 + 1,
                );
            }
            assert_eq!(calls[0].0.wait_ms, 0, "the first request goes at once");
        }
    });
}

#[test]
fn new_queue_admits_at_once_then_queues_one_period_per_unit() {
    for_each_server(|kind| {
        let server = Server::start(kind, &[]);
        let mut con = server.conn();
        for queued in 0..5i64 {
            let r = slow_queue(&mut con, "lb", "1");
            assert!(r.allowed, "call {} on a queue of 5: {r:?}", queued + 1);
            assert_eq!((r.limit, r.remaining), (5, 4 - queued));
            if queued == 0 {
                assert_eq!(r.wait_ms, 0, "an empty queue lets the first through");
            } else {
                assert_between(
                    "wait_ms",
                    r.wait_ms,
                    queued * SLOW_MS - SLACK_MS,
                    queued * SLOW_MS,
                );
            }
            assert_between(
                "reset_ms",
                r.reset_ms,
                (queued + 1) * SLOW_MS - SLACK_MS,
                (queued + 1) * SLOW_MS,
            );
        }
    });
}

#[test]
fn request_that_would_overflow_the_queue_is_denied_until_it_fits() {
    for_each_server(|kind| {
        let server = Server::start(kind, &[]);
        let mut con = server.conn();
        for _ in 0..5 {
            assert!(slow_queue(&mut con, "lb", "1").allowed);
        }
        let r = slow_queue(&mut con, "lb", "1");
        assert!(!r.allowed, "6th unit in a queue of 5: {r:?}");
        assert_eq!((r.limit, r.remaining), (5, 0));
        // One unit must leave first.
        assert_between("wait_ms", r.wait_ms, SLOW_MS - SLACK_MS, SLOW_MS);
        assert_between("reset_ms", r.reset_ms, 5 * SLOW_MS - SLACK_MS, 5 * SLOW_MS);
        let r = slow_queue(&mut con, "lb", "3");
        assert!(!r.allowed);
        assert_between(
            "wait_ms for 3",
            r.wait_ms,
            3 * SLOW_MS - SLACK_MS,
            3 * SLOW_MS,
        );
    });
}

#[test]
fn cost_takes_that_many_places_in_the_queue() {
    for_each_server(|kind| {
        let server = Server::start(kind, &[]);
        let mut con = server.conn();
        let r = slow_queue(&mut con, "lb", "3");
        assert!(r.allowed);
        assert_eq!((r.remaining, r.wait_ms), (2, 0), "{r:?}");
        assert_between("reset_ms", r.reset_ms, 3 * SLOW_MS - SLACK_MS, 3 * SLOW_MS);

        // The next request waits for all 3 units ahead of it.
        let r = slow_queue(&mut con, "lb", "1");
        assert!(r.allowed);
        assert_eq!(r.remaining, 1);
        assert_between("wait_ms", r.wait_ms, 3 * SLOW_MS - SLACK_MS, 3 * SLOW_MS);

        let r = slow_queue(&mut con, "lb", "2");
        assert!(!r.allowed, "2 units in a queue with room for 1: {r:?}");
        assert_eq!(r.remaining, 1);
        assert_between("wait_ms", r.wait_ms, SLOW_MS - SLACK_MS, SLOW_MS);

        let r = slow_queue(&mut con, "lb", "1");
        assert!(r.allowed);
        assert_eq!(r.remaining, 0);
    });
}

#[test]
fn cost_zero_tells_the_delay_a_request_would_get() {
    for_each_server(|kind| {
        let server = Server::start(kind, &[]);
        let mut con = server.conn();
        slow_queue(&mut con, "lb", "2");
        let peek = slow_queue(&mut con, "lb", "0");
        assert!(peek.allowed);
        assert_eq!((peek.limit, peek.remaining), (5, 3));
        // A request now would wait for the 2 queued units to leave.
        assert_between("wait_ms", peek.wait_ms, 2 * SLOW_MS - SLACK_MS, 2 * SLOW_MS);
        assert_eq!(peek.reset_ms, peek.wait_ms, "{peek:?}");

        let r = slow_queue(&mut con, "lb", "1");
        assert!(r.allowed);
        assert!(
            r.wait_ms <= peek.wait_ms && r.wait_ms > peek.wait_ms - SLACK_MS,
            "peeked a delay of {}, then got {}",
            peek.wait_ms,
            r.wait_ms
        );

        // Peeking at a full queue: no room, and still allowed (it takes none).
        slow_queue(&mut con, "lb", "2");
        let peek = slow_queue(&mut con, "lb", "0");
        assert_eq!((peek.allowed, peek.remaining), (true, 0), "{peek:?}");
        assert_between("wait_ms", peek.wait_ms, 5 * SLOW_MS - SLACK_MS, 5 * SLOW_MS);
    });
}

#[test]
fn queue_drains_one_unit_per_leak_period() {
    for_each_server(|kind| {
        let server = Server::start(kind, &[]);
        let mut con = server.conn();
        // One unit a second, not three at once.
        let call = |con: &mut Connection, cost: &str| {
            rl(
                con,
                &["RL.LEAKYBUCKET", "lb", "3", "1", "1000", "COST", cost],
            )
        };
        assert!(call(&mut con, "3").allowed);
        assert!(!call(&mut con, "1").allowed);
        let mut room = None;
        poll_until("one unit to leave", Duration::from_secs(5), || {
            let r = call(&mut con, "0");
            room = Some(r.remaining);
            r.remaining > 0
        });
        assert_eq!(room, Some(1), "more than one unit left at once");
        // The newcomer waits behind the 2 units still queued.
        let r = call(&mut con, "1");
        assert!(r.allowed, "{r:?}");
        assert_between("wait_ms", r.wait_ms, 1000, 2000);
        assert!(
            !call(&mut con, "1").allowed,
            "a second place opened at once"
        );
    });
}

// ---------------------------------------------------------------------------
// Parameter changes: the queued time carries over, nothing drains for free.

#[test]
fn raising_capacity_adds_room_behind_the_same_queue() {
    for_each_server(|kind| {
        let server = Server::start(kind, &[]);
        let mut con = server.conn();
        slow_queue(&mut con, "lb", "5");
        let r = rl(&mut con, &["RL.LEAKYBUCKET", "lb", "8", "1", SLOW]);
        assert!(r.allowed, "{r:?}");
        assert_eq!((r.limit, r.remaining), (8, 2));
        assert_between("wait_ms", r.wait_ms, 5 * SLOW_MS - SLACK_MS, 5 * SLOW_MS);
    });
}

#[test]
fn lowering_capacity_below_the_queue_denies_until_it_drained() {
    for_each_server(|kind| {
        let server = Server::start(kind, &[]);
        let mut con = server.conn();
        slow_queue(&mut con, "lb", "3");
        let r = rl(&mut con, &["RL.LEAKYBUCKET", "lb", "2", "1", SLOW]);
        assert!(!r.allowed, "3 queued, capacity lowered to 2: {r:?}");
        assert_eq!((r.limit, r.remaining), (2, 0));
        // 2 of the 3 queued units must leave before one more fits in 2.
        assert_between("wait_ms", r.wait_ms, 2 * SLOW_MS - SLACK_MS, 2 * SLOW_MS);
    });
}

#[test]
fn faster_leak_applies_to_the_queued_units() {
    for_each_server(|kind| {
        let server = Server::start(kind, &[]);
        let mut con = server.conn();
        slow_queue(&mut con, "lb", "4");
        // Twice the rate: the 4 queued units now leave in 2 periods.
        let r = rl(&mut con, &["RL.LEAKYBUCKET", "lb", "5", "2", SLOW]);
        assert!(r.allowed, "{r:?}");
        assert_eq!(r.remaining, 0);
        assert_between("wait_ms", r.wait_ms, 2 * SLOW_MS - SLACK_MS, 2 * SLOW_MS);
    });
}

#[test]
fn extreme_rates_are_exact() {
    for_each_server(|kind| {
        let server = Server::start(kind, &[]);
        let mut con = server.conn();
        let max = MAX_PARAM.to_string();
        let max = max.as_str();
        let max_ms = MAX_PARAM as i64;

        // 2^40 units queued at once, 2^40 leaving every 2^40 ms.
        let r = rl(
            &mut con,
            &["RL.LEAKYBUCKET", "huge", max, max, max, "COST", max],
        );
        assert!(r.allowed, "{r:?}");
        assert_eq!((r.limit, r.remaining, r.wait_ms), (max_ms, 0, 0));
        assert_between("reset_ms", r.reset_ms, max_ms - SLACK_MS, max_ms);

        // One unit per 2^40 ms (about 35 years): the second waits for it.
        let r = rl(&mut con, &["RL.LEAKYBUCKET", "slow", "2", "1", max]);
        assert_eq!((r.allowed, r.wait_ms), (true, 0));
        let r = rl(&mut con, &["RL.LEAKYBUCKET", "slow", "2", "1", max]);
        assert!(r.allowed);
        assert_between("wait_ms", r.wait_ms, max_ms - SLACK_MS, max_ms);

        // A million units per millisecond: a million queued drain within 1 ms.
        let r = rl(
            &mut con,
            &[
                "RL.LEAKYBUCKET",
                "fast",
                "1000000",
                "1000000",
                "1",
                "COST",
                "1000000",
            ],
        );
        assert!(r.allowed);
        assert_eq!((r.remaining, r.wait_ms), (0, 0));
        assert_between("reset_ms", r.reset_ms, 0, 1);
    });
}

// ---------------------------------------------------------------------------
// Limits and memory

#[test]
fn drain_time_of_exactly_2_pow_50_ms_is_accepted() {
    for_each_server(|kind| {
        let server = Server::start(kind, &[]);
        let mut con = server.conn();
        let max = MAX_PARAM.to_string();
        // 1024 units at one per 2^40 ms: exactly 2^50 ms to drain. (1025 are
        // refused: see the refusals of LEAKY_BUCKET in harness/contract.rs.)
        let r = rl(&mut con, &["RL.LEAKYBUCKET", "lb", "1024", "1", &max]);
        assert!(r.allowed);
        assert!(pttl(&mut con, "lb") > 0);
    });
}

#[test]
fn memory_usage_is_small_and_fixed() {
    for_each_server(|kind| {
        let server = Server::start(kind, &[]);
        let mut con = server.conn();
        slow_queue(&mut con, "lb", "1");
        let first: i64 = query(&mut con, &["MEMORY", "USAGE", "lb"]);
        assert!(first > 0 && first < 256, "MEMORY USAGE lb = {first}");
        slow_queue(&mut con, "lb", "4");
        let full: i64 = query(&mut con, &["MEMORY", "USAGE", "lb"]);
        assert_eq!(full, first, "a fuller queue takes more memory");
    });
}

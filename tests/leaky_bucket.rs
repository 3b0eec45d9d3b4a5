//! `RL.LEAKYBUCKET key capacity leak_count leak_ms [COST n]` against real
//! servers: a shaping queue of at most `capacity` units that drains
//! `leak_count` units every `leak_ms`. An admitted request learns in
//! `wait_ms` when its turn comes, so callers that wait it act evenly spaced;
//! a request that would overflow the queue is denied. `remaining` is the free
//! room, `reset_ms` (and the key's TTL) the time until the queue is empty.
//!
//! Time-dependent checks use slow queues with generous bounds, poll with a
//! deadline, or bound the server's clock reading between two `TIME` calls;
//! none asserts how long anything took.

mod common;

use std::fs;
use std::thread::sleep;
use std::time::Duration;

use common::payload::{self, Field};
use common::*;

/// One unit leaves per 1000 s: nothing drains during a test.
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

/// A queue of 5 that lets one unit through every 1000 s.
fn slow_queue(con: &mut Connection, key: &str, cost: &str) -> Reply {
    rl(con, &["RL.LEAKYBUCKET", key, "5", "1", SLOW, "COST", cost])
}

/// A limiter call with the server's clock read just before and just after
/// it (microseconds): the call's own reading lies in between.
fn timed(con: &mut Connection, words: &[&str]) -> (Reply, u64, u64) {
    let before = server_time_us(con);
    let reply = rl(con, words);
    let after = server_time_us(con);
    (reply, before, after)
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
fn denied_request_changes_nothing() {
    for_each_server(|kind| {
        let server = Server::start(kind, &[]);
        let mut con = server.conn();
        slow_queue(&mut con, "lb", "4");
        let state_before = dump(&mut con, "lb");
        let pttl_before = pttl(&mut con, "lb");
        for _ in 0..20 {
            assert!(!slow_queue(&mut con, "lb", "2").allowed);
            assert!(!slow_queue(&mut con, "lb", "6").allowed);
        }
        assert_eq!(
            dump(&mut con, "lb"),
            state_before,
            "a denial changed the state"
        );
        let pttl_after = pttl(&mut con, "lb");
        assert!(
            pttl_after <= pttl_before,
            "a denial extended the TTL: {pttl_before} -> {pttl_after}"
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
fn cost_above_capacity_is_never_admitted() {
    for_each_server(|kind| {
        let server = Server::start(kind, &[]);
        let mut con = server.conn();
        let r = slow_queue(&mut con, "lb", "6");
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
        assert!(!exists(&mut con, "lb"), "a denial created the key");

        slow_queue(&mut con, "lb", "1");
        let r = slow_queue(&mut con, "lb", "6");
        assert!(!r.allowed);
        assert_eq!((r.remaining, r.wait_ms), (4, -1));
    });
}

#[test]
fn cost_zero_peeks_without_creating_the_key() {
    for_each_server(|kind| {
        let server = Server::start(kind, &[]);
        let mut con = server.conn();
        let r = slow_queue(&mut con, "lb", "0");
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
        assert!(!exists(&mut con, "lb"), "COST 0 created the key");
        assert_eq!(dbsize(&mut con), 0);
    });
}

#[test]
fn cost_zero_tells_the_delay_a_request_would_get_and_changes_nothing() {
    for_each_server(|kind| {
        let server = Server::start(kind, &[]);
        let mut con = server.conn();
        slow_queue(&mut con, "lb", "2");
        let state = dump(&mut con, "lb");
        let peek = slow_queue(&mut con, "lb", "0");
        assert!(peek.allowed);
        assert_eq!((peek.limit, peek.remaining), (5, 3));
        // A request now would wait for the 2 queued units to leave.
        assert_between("wait_ms", peek.wait_ms, 2 * SLOW_MS - SLACK_MS, 2 * SLOW_MS);
        assert_eq!(peek.reset_ms, peek.wait_ms, "{peek:?}");
        assert_eq!(dump(&mut con, "lb"), state, "COST 0 changed the state");

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
        let state = dump(&mut con, "lb");
        let peek = slow_queue(&mut con, "lb", "0");
        assert_eq!((peek.allowed, peek.remaining), (true, 0), "{peek:?}");
        assert_between("wait_ms", peek.wait_ms, 5 * SLOW_MS - SLACK_MS, 5 * SLOW_MS);
        assert_eq!(dump(&mut con, "lb"), state, "COST 0 changed the state");
    });
}

#[test]
fn key_ttl_follows_reset_ms() {
    for_each_server(|kind| {
        let server = Server::start(kind, &[]);
        let mut con = server.conn();
        for cost in ["1", "2"] {
            let r = slow_queue(&mut con, "lb", cost);
            assert!(r.allowed);
            let ttl = pttl(&mut con, "lb");
            assert!(
                ttl > r.reset_ms - SLACK_MS && ttl <= r.reset_ms + 1,
                "PTTL {ttl} vs reset_ms {}",
                r.reset_ms
            );
        }
    });
}

#[test]
fn empty_queue_key_expires_by_itself() {
    for_each_server(|kind| {
        let server = Server::start(kind, &[]);
        let mut con = server.conn();
        // One unit leaves every 100 ms.
        let r = rl(&mut con, &["RL.LEAKYBUCKET", "lb", "3", "1", "100"]);
        assert!(r.allowed);
        assert_between("reset_ms", r.reset_ms, 0, 100);
        poll_until(
            "the drained queue to expire",
            Duration::from_secs(5),
            || !exists(&mut con, "lb"),
        );
        let r = rl(&mut con, &["RL.LEAKYBUCKET", "lb", "3", "1", "100"]);
        assert_eq!(
            (r.allowed, r.remaining, r.wait_ms),
            (true, 2, 0),
            "empty again"
        );
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

#[test]
fn request_is_admitted_after_waiting_wait_ms() {
    for_each_server(|kind| {
        let server = Server::start(kind, &[]);
        let mut con = server.conn();
        let call =
            |con: &mut Connection| rl(con, &["RL.LEAKYBUCKET", "lb", "2", "1", "300", "COST", "2"]);
        assert!(call(&mut con).allowed);
        let denied = call(&mut con);
        assert!(!denied.allowed);
        assert_between("wait_ms", denied.wait_ms, 0, 600);
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
        let good = ["5", "1", "1000"];
        for (position, name) in ["capacity", "leak_count", "leak_ms"].iter().enumerate() {
            for bad in NOT_A_PARAMETER {
                let mut params = good;
                params[position] = bad;
                let words = ["RL.LEAKYBUCKET", "lb", params[0], params[1], params[2]];
                let err = query_err(&mut con, &words);
                assert_err_naming(&err, name, &words);
            }
        }
        let err = query_err(&mut con, &["RL.LEAKYBUCKET", "lb", "5", "1", "0"]);
        assert_eq!(
            err,
            "ERR leak_ms must be an integer from 1 to 1099511627776"
        );
        for bad in ["-1", "1099511627777", "x", "1.0", ""] {
            let words = ["RL.LEAKYBUCKET", "lb", "5", "1", "1000", "COST", bad];
            assert_err_naming(&query_err(&mut con, &words), "COST", &words);
        }
        for words in [
            ["RL.LEAKYBUCKET", "lb", "5", "1", "1000", "BURST", "1"].as_slice(),
            [
                "RL.LEAKYBUCKET",
                "lb",
                "5",
                "1",
                "1000",
                "COST",
                "1",
                "BURST",
                "1",
            ]
            .as_slice(),
        ] {
            assert_err_naming(&query_err(&mut con, words), "BURST", words);
        }
        for words in [
            ["RL.LEAKYBUCKET", "lb", "5", "1", "1000", "COST"].as_slice(),
            [
                "RL.LEAKYBUCKET",
                "lb",
                "5",
                "1",
                "1000",
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
fn drain_time_above_2_pow_50_ms_is_refused() {
    for_each_server(|kind| {
        let server = Server::start(kind, &[]);
        let mut con = server.conn();
        let max = MAX_PARAM.to_string();
        // 1024 units at one per 2^40 ms: exactly 2^50 ms to drain.
        let r = rl(&mut con, &["RL.LEAKYBUCKET", "ok", "1024", "1", &max]);
        assert!(r.allowed);
        for words in [
            ["RL.LEAKYBUCKET", "lb", "1025", "1", &max].as_slice(),
            ["RL.LEAKYBUCKET", "lb", &max, "1", &max, "COST", "0"].as_slice(),
        ] {
            let err = query_err(&mut con, words);
            assert!(
                err.starts_with("ERR") && err.contains("capacity * leak_ms / leak_count"),
                "{words:?}: {err}"
            );
        }
        assert!(!exists(&mut con, "lb"), "an error wrote a key");
    });
}

#[test]
fn wrong_argument_count_is_the_usual_arity_error() {
    for_each_server(|kind| {
        let server = Server::start(kind, &[]);
        let mut con = server.conn();
        for words in [
            ["RL.LEAKYBUCKET"].as_slice(),
            ["RL.LEAKYBUCKET", "lb"].as_slice(),
            ["RL.LEAKYBUCKET", "lb", "5"].as_slice(),
            ["RL.LEAKYBUCKET", "lb", "5", "1"].as_slice(),
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
            ["RL.LEAKYBUCKET", "lb", "5", "1", "1000", "AT", &now_us].as_slice(),
            [
                "RL.LEAKYBUCKET",
                "lb",
                "5",
                "1",
                "1000",
                "COST",
                "0",
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
        let words = [
            "RL.SETSTATE",
            "lb",
            "LEAKYBUCKET",
            "1",
            &now_us,
            "0",
            "1",
            "1000",
        ];
        let err = query_err(&mut con, &words);
        assert!(err.starts_with("ERR"), "{words:?}: {err}");
        assert_eq!(dbsize(&mut con), 0, "a reserved call wrote a key");
    });
}

#[test]
fn key_of_another_type_or_algorithm_is_wrongtype_and_untouched() {
    for_each_server(|kind| {
        let server = Server::start(kind, &[]);
        let mut con = server.conn();
        let _: () = query(&mut con, &["SET", "string", "hello", "PX", "1000000"]);
        let _: i64 = query(&mut con, &["RPUSH", "list", "a", "b"]);
        rl(&mut con, &["RL.TOKENBUCKET", "tb", "5", "1", SLOW]);
        rl(&mut con, &["RL.FIXEDWINDOW", "fw", "5", SLOW]);
        rl(&mut con, &["RL.SLIDING", "sl", "5", SLOW]);
        rl(&mut con, &["RL.HASHWINDOW", "hw", "5", SLOW, "100000"]);
        slow_queue(&mut con, "lb", "1");
        let keys = ["string", "list", "tb", "fw", "sl", "hw", "lb"];
        let before: Vec<_> = keys
            .iter()
            .map(|key| (dump(&mut con, key), pttl(&mut con, key)))
            .collect();
        for key in ["string", "list", "tb", "fw", "sl", "hw"] {
            for cost in ["1", "0"] {
                let words = ["RL.LEAKYBUCKET", key, "5", "1", SLOW, "COST", cost];
                let err = query_err(&mut con, &words);
                assert!(err.starts_with("WRONGTYPE"), "{words:?}: {err}");
            }
        }
        for words in [
            ["RL.TOKENBUCKET", "lb", "5", "1", SLOW].as_slice(),
            ["RL.TOKENBUCKET", "lb", "5", "1", SLOW, "COST", "0"].as_slice(),
            ["RL.FIXEDWINDOW", "lb", "5", SLOW].as_slice(),
            ["RL.SLIDING", "lb", "5", SLOW].as_slice(),
            ["RL.HASHWINDOW", "lb", "5", SLOW, "100000"].as_slice(),
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
        assert_eq!(key_type(&mut con, "lb"), "rl-leakbk");
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
                "RL.LEAKYBUCKET",
                "k",
                "5",
                "1",
                "1000",
            ]
            .as_slice(),
            [
                "COMMAND",
                "GETKEYS",
                "RL.LEAKYBUCKET",
                "k",
                "5",
                "1",
                "1000",
                "COST",
                "2",
            ]
            .as_slice(),
        ] {
            let keys: Vec<String> = query(&mut con, words);
            assert_eq!(keys, ["k"], "{words:?}");
        }
        let reply: Vec<Value> = query(&mut con, &["COMMAND", "INFO", "RL.LEAKYBUCKET"]);
        let Some(Value::Array(info)) = reply.first() else {
            panic!("COMMAND INFO RL.LEAKYBUCKET: {reply:?}");
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

/// Traffic over slow queues whose states outlive the test: costs that are
/// admitted, denied and peeks, and a parameter change.
fn make_queues(con: &mut Connection) {
    for cost in ["1", "3", "0", "20", "2"] {
        rl(
            con,
            &["RL.LEAKYBUCKET", "lb", "10", "1", SLOW, "COST", cost],
        );
        rl(
            con,
            &["RL.LEAKYBUCKET", "lb:frac", "10", "3", "7001", "COST", cost],
        );
    }
    rl(con, &["RL.LEAKYBUCKET", "lb:frac", "12", "7", "9999999"]);
}
const QUEUES: [&str; 2] = ["lb", "lb:frac"];

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
    "return redis.call('RL.LEAKYBUCKET', KEYS[1], ARGV[1], ARGV[2], ARGV[3], 'COST', ARGV[4])";

#[test]
fn replica_state_equals_master_after_mixed_traffic() {
    for_each_server(|kind| {
        let master = Server::start(kind, &[]);
        let replica = replica_of(&master);
        let (mut m, mut r) = (master.conn(), replica.conn());
        let mut random = Xorshift(0x1eaf_b0c4_e700_0001);
        for i in 0..500 {
            let key = format!("lb{}", random.next() % 12);
            let capacity = random.pick(&["3", "10", "10", "1000"]);
            let leak_count = random.pick(&["1", "3", "7"]);
            let leak_ms = random.pick(&["1", "997", "1000", "86400000"]);
            let cost = random.pick(&["0", "1", "1", "1", "2", "5", "11"]);
            let words = [
                "RL.LEAKYBUCKET",
                &key,
                capacity,
                leak_count,
                leak_ms,
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
                    &[
                        "EVAL", SCRIPT, "1", &key, capacity, leak_count, leak_ms, cost,
                    ],
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
            // Keys of the fastest queues may just have expired; compare the rest.
            if pttl(&mut m, key) > 1000 {
                assert_same_state(&mut m, &mut r, key);
                compared += 1;
            }
        }
        assert!(compared > 0, "no long-lived queue to compare");
    });
}

#[test]
fn replica_gets_existing_queues_through_full_sync() {
    for_each_server(|kind| {
        let master = Server::start(kind, &[]);
        let mut m = master.conn();
        make_queues(&mut m);
        let replica = replica_of(&master);
        let mut r = replica.conn();
        wait_for_sync(&master, &replica);
        for key in QUEUES {
            assert_same_state(&mut m, &mut r, key);
        }
        rl(&mut m, &["RL.LEAKYBUCKET", "lb", "10", "1", SLOW]);
        wait_for_sync(&master, &replica);
        assert_same_state(&mut m, &mut r, "lb");
    });
}

#[test]
fn denials_and_cost_zero_propagate_nothing() {
    for_each_server(|kind| {
        let master = Server::start(kind, QUIET_MASTER);
        let replica = replica_of(&master);
        let mut m = master.conn();
        slow_queue(&mut m, "lb", "5");
        wait_for_sync(&master, &replica);
        let offset_before = master_offset(&master);
        for _ in 0..50 {
            assert!(!slow_queue(&mut m, "lb", "1").allowed);
            assert!(!slow_queue(&mut m, "lb", "6").allowed);
            slow_queue(&mut m, "lb", "0");
            slow_queue(&mut m, "new", "0");
            slow_queue(&mut m, "new", "6");
            query_err(&mut m, &["RL.LEAKYBUCKET", "lb", "0", "1", SLOW]);
            query_err(&mut m, &["RL.TOKENBUCKET", "lb", "5", "1", SLOW]);
        }
        assert_eq!(
            master_offset(&master),
            offset_before,
            "denied, COST 0 or failed calls were propagated"
        );
        assert!(slow_queue(&mut m, "other", "1").allowed);
        assert!(master_offset(&master) > offset_before);
    });
}

#[test]
fn replica_refuses_calls_from_clients() {
    for_each_server(|kind| {
        let master = Server::start(kind, &[]);
        let replica = replica_of(&master);
        let mut r = replica.conn();
        let err = query_err(&mut r, &["RL.LEAKYBUCKET", "lb", "5", "1", "1000"]);
        assert!(err.starts_with("READONLY"), "{err}");
        assert_eq!(dbsize(&mut r), 0);
    });
}

#[test]
fn queues_survive_save_and_restart() {
    for_each_server(|kind| {
        let mut server = Server::start(kind, &[]);
        let mut con = server.conn();
        make_queues(&mut con);
        let before = snapshot(&mut con, &QUEUES);
        let _: () = query(&mut con, &["SAVE"]);
        server.restart();
        let mut con = server.conn();
        assert_same_after("SAVE and restart", &mut con, &QUEUES, &before);
        assert_eq!(key_type(&mut con, "lb"), "rl-leakbk");
    });
}

#[test]
fn queues_survive_an_aof_restart() {
    for_each_server(|kind| {
        let mut server = Server::start(kind, &["--appendonly", "yes"]);
        let mut con = server.conn();
        make_queues(&mut con);
        let before = snapshot(&mut con, &QUEUES);
        server.restart();
        let mut con = server.conn();
        assert_same_after("an AOF restart", &mut con, &QUEUES, &before);
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
fn queues_survive_an_aof_rewrite_without_rdb_preamble() {
    for_each_server(|kind| {
        let mut server = Server::start(
            kind,
            &["--appendonly", "yes", "--aof-use-rdb-preamble", "no"],
        );
        let mut con = server.conn();
        make_queues(&mut con);
        let _: Value = query(&mut con, &["BGREWRITEAOF"]);
        poll_until("the AOF rewrite to finish", Duration::from_secs(20), || {
            let info = server.info("persistence");
            info_field(&info, "aof_rewrite_in_progress").as_deref() == Some("0")
                && info_field(&info, "aof_rewrite_scheduled").as_deref() == Some("0")
                && base_aof_has_setstate(&server, "LEAKYBUCKET")
        });
        // More calls after the rewrite land in the incremental file.
        rl(&mut con, &["RL.LEAKYBUCKET", "lb", "10", "1", SLOW]);
        let before = snapshot(&mut con, &QUEUES);
        server.restart();
        let mut con = server.conn();
        assert_same_after("BGREWRITEAOF and restart", &mut con, &QUEUES, &before);
    });
}

#[test]
fn dump_restore_and_copy_keep_the_state() {
    for_each_server(|kind| {
        let server = Server::start(kind, &[]);
        let mut con = server.conn();
        make_queues(&mut con);
        let payload = dump(&mut con, "lb").unwrap();
        let _: () = redis::cmd("RESTORE")
            .arg("lb:restored")
            .arg(0)
            .arg(&payload)
            .query(&mut con)
            .expect("RESTORE of a DUMP payload");
        assert_eq!(dump(&mut con, "lb:restored"), Some(payload.clone()));
        assert_eq!(key_type(&mut con, "lb:restored"), "rl-leakbk");
        let copied: i64 = query(&mut con, &["COPY", "lb", "lb:copy"]);
        assert_eq!(copied, 1);
        assert_eq!(dump(&mut con, "lb:copy"), Some(payload.clone()));
        let original_ttl = pttl(&mut con, "lb");
        let ttl = pttl(&mut con, "lb:copy");
        assert!(
            ttl > 0 && ttl <= original_ttl,
            "COPY keeps the expiry: PTTL {ttl}, original {original_ttl}"
        );

        // Each one goes on independently, from the same queue.
        let call = |con: &mut Connection, key: &str| {
            rl(con, &["RL.LEAKYBUCKET", key, "10", "1", SLOW, "COST", "0"])
        };
        let original = call(&mut con, "lb").remaining;
        assert_eq!(call(&mut con, "lb:restored").remaining, original);
        assert!(rl(&mut con, &["RL.LEAKYBUCKET", "lb:copy", "10", "1", SLOW]).allowed);
        assert_eq!(call(&mut con, "lb:copy").remaining, original - 1);
        assert_eq!(
            call(&mut con, "lb").remaining,
            original,
            "using the copy changed the original"
        );
        assert_eq!(dump(&mut con, "lb"), Some(payload));
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
        ["RL.LEAKYBUCKET", key, "10", "1", SLOW, "COST", "0"].as_slice(),
        ["RL.LEAKYBUCKET", key, "10", "1", SLOW].as_slice(),
        ["RL.LEAKYBUCKET", key, "3", "7", "10"].as_slice(),
        ["RL.LEAKYBUCKET", key, "1000", "1", "1", "COST", "5"].as_slice(),
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
        make_queues(&mut con);
        for key in QUEUES {
            let payload = dump(&mut con, key).unwrap();
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
                for extreme in [0, 1, (1 << 40) + 1, 1 << 53, 1 << 62, u64::MAX] {
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
            let short = payload::with_fields(&payload, &fields[..fields.len() - 1]);
            assert!(
                restore(&mut con, "victim", &short).is_err(),
                "a field short"
            );
            let mut extra = fields.clone();
            extra.push(Field::Unsigned(1));
            let long = payload::with_fields(&payload, &extra);
            assert!(
                restore(&mut con, "victim", &long).is_err(),
                "a field too many"
            );
        }
        assert!(server.is_running(), "the server died");
        let pong: String = query(&mut con, &["PING"]);
        assert_eq!(pong, "PONG");
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

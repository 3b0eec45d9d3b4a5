//! `RL.TOKENBUCKET key capacity refill_count refill_ms [COST n]` against real
//! servers: starts full, refills continuously, replies
//! `[allowed, limit, remaining, wait_ms, reset_ms]`, expires when full.
//!
//! Time-dependent checks use slow buckets with generous bounds, or poll with a
//! deadline; none asserts how long anything took.

mod common;

use std::thread::sleep;
use std::time::Duration;

use common::*;

/// One token per 1000 s: nothing refills during a test.
const SLOW_MS: i64 = 1_000_000;
/// Slack for the time a test itself takes, far above any real run.
const SLACK_MS: i64 = 10_000;

fn slow_bucket(con: &mut Connection, key: &str) -> Reply {
    rl(con, &["RL.TOKENBUCKET", key, "5", "1", "1000000"])
}

fn slow_bucket_cost(con: &mut Connection, key: &str, cost: &str) -> Reply {
    rl(
        con,
        &["RL.TOKENBUCKET", key, "5", "1", "1000000", "COST", cost],
    )
}

fn assert_between(what: &str, value: i64, above: i64, at_most: i64) {
    assert!(
        value > above && value <= at_most,
        "{what} = {value}, expected in ({above}, {at_most}]"
    );
}

#[test]
fn new_bucket_starts_full_and_counts_down() {
    for_each_server(|kind| {
        let server = Server::start(kind, &[]);
        let mut con = server.conn();
        for used in 1..=5i64 {
            let r = slow_bucket(&mut con, "tb");
            assert!(r.allowed, "call {used} of a full bucket of 5: {r:?}");
            assert_eq!((r.limit, r.remaining, r.wait_ms), (5, 5 - used, 0));
            // reset: the time to refill the `used` tokens taken.
            assert_between(
                "reset_ms",
                r.reset_ms,
                used * SLOW_MS - SLACK_MS,
                used * SLOW_MS,
            );
        }
    });
}

#[test]
fn request_beyond_capacity_is_denied_until_the_next_token() {
    for_each_server(|kind| {
        let server = Server::start(kind, &[]);
        let mut con = server.conn();
        for _ in 0..5 {
            assert!(slow_bucket(&mut con, "tb").allowed);
        }
        let r = slow_bucket(&mut con, "tb");
        assert!(!r.allowed, "6th call on a bucket of 5: {r:?}");
        assert_eq!((r.limit, r.remaining), (5, 0));
        assert_between("wait_ms", r.wait_ms, SLOW_MS - SLACK_MS, SLOW_MS);
        assert_between("reset_ms", r.reset_ms, 5 * SLOW_MS - SLACK_MS, 5 * SLOW_MS);
    });
}

#[test]
fn denied_request_changes_nothing() {
    for_each_server(|kind| {
        let server = Server::start(kind, &[]);
        let mut con = server.conn();
        for _ in 0..5 {
            slow_bucket(&mut con, "tb");
        }
        let state_before = dump(&mut con, "tb");
        let pttl_before = pttl(&mut con, "tb");
        for _ in 0..20 {
            assert!(!slow_bucket(&mut con, "tb").allowed);
            assert!(!slow_bucket_cost(&mut con, "tb", "3").allowed);
        }
        assert_eq!(
            dump(&mut con, "tb"),
            state_before,
            "a denial changed the state"
        );
        let pttl_after = pttl(&mut con, "tb");
        assert!(
            pttl_after <= pttl_before,
            "a denial extended the TTL: {pttl_before} -> {pttl_after}"
        );
    });
}

#[test]
fn cost_takes_that_many_tokens() {
    for_each_server(|kind| {
        let server = Server::start(kind, &[]);
        let mut con = server.conn();
        let r = slow_bucket_cost(&mut con, "tb", "3");
        assert!(r.allowed);
        assert_eq!((r.remaining, r.wait_ms), (2, 0));
        assert_between("reset_ms", r.reset_ms, 3 * SLOW_MS - SLACK_MS, 3 * SLOW_MS);

        let r = slow_bucket_cost(&mut con, "tb", "3");
        assert!(!r.allowed, "3 tokens from 2: {r:?}");
        assert_eq!(r.remaining, 2);
        // One more token is missing.
        assert_between("wait_ms", r.wait_ms, SLOW_MS - SLACK_MS, SLOW_MS);

        let r = slow_bucket_cost(&mut con, "tb", "2");
        assert!(r.allowed);
        assert_eq!(r.remaining, 0);
    });
}

#[test]
fn cost_above_capacity_is_never_admitted() {
    for_each_server(|kind| {
        let server = Server::start(kind, &[]);
        let mut con = server.conn();
        let r = slow_bucket_cost(&mut con, "tb", "6");
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
        assert!(!exists(&mut con, "tb"), "a denial created the key");

        slow_bucket(&mut con, "tb");
        let r = slow_bucket_cost(&mut con, "tb", "6");
        assert!(!r.allowed);
        assert_eq!((r.remaining, r.wait_ms), (4, -1));
    });
}

#[test]
fn cost_zero_peeks_without_creating_the_key() {
    for_each_server(|kind| {
        let server = Server::start(kind, &[]);
        let mut con = server.conn();
        let r = slow_bucket_cost(&mut con, "tb", "0");
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
        assert!(!exists(&mut con, "tb"), "COST 0 created the key");
        assert_eq!(dbsize(&mut con), 0);
    });
}

#[test]
fn cost_zero_reports_the_state_and_changes_nothing() {
    for_each_server(|kind| {
        let server = Server::start(kind, &[]);
        let mut con = server.conn();
        slow_bucket_cost(&mut con, "tb", "2");
        let state = dump(&mut con, "tb");
        let r = slow_bucket_cost(&mut con, "tb", "0");
        assert!(r.allowed);
        assert_eq!((r.limit, r.remaining, r.wait_ms), (5, 3, 0));
        assert_between("reset_ms", r.reset_ms, 2 * SLOW_MS - SLACK_MS, 2 * SLOW_MS);
        assert_eq!(dump(&mut con, "tb"), state, "COST 0 changed the state");

        slow_bucket_cost(&mut con, "tb", "3");
        let state = dump(&mut con, "tb");
        let r = slow_bucket_cost(&mut con, "tb", "0");
        assert_eq!(
            (r.remaining, r.wait_ms),
            (0, 0),
            "peek at an empty bucket: {r:?}"
        );
        assert_eq!(dump(&mut con, "tb"), state, "COST 0 changed the state");
    });
}

#[test]
fn bucket_refills_continuously_one_token_at_a_time() {
    for_each_server(|kind| {
        let server = Server::start(kind, &[]);
        let mut con = server.conn();
        // 10 tokens per 10 s: one token back every second, not ten at once.
        let call = |con: &mut Connection| rl(con, &["RL.TOKENBUCKET", "tb", "10", "10", "10000"]);
        let mut admitted = 0;
        let denied = loop {
            let r = call(&mut con);
            if !r.allowed {
                break r;
            }
            admitted += 1;
        };
        assert!(
            (10..=11).contains(&admitted),
            "a bucket of 10 admitted {admitted} in a row"
        );
        assert_between("wait_ms", denied.wait_ms, 0, 1000);

        let mut back = None;
        poll_until("one token back", Duration::from_secs(5), || {
            let r = call(&mut con);
            back = Some(r);
            r.allowed
        });
        assert_eq!(back.unwrap().remaining, 0, "more than one token came back");
        let r = call(&mut con);
        assert!(!r.allowed, "a second token came back at once: {r:?}");
        assert_between("wait_ms", r.wait_ms, 0, 1000);
    });
}

#[test]
fn request_is_admitted_after_waiting_wait_ms() {
    for_each_server(|kind| {
        let server = Server::start(kind, &[]);
        let mut con = server.conn();
        let call =
            |con: &mut Connection| rl(con, &["RL.TOKENBUCKET", "tb", "2", "1", "300", "COST", "2"]);
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

#[test]
fn key_ttl_follows_reset_ms() {
    for_each_server(|kind| {
        let server = Server::start(kind, &[]);
        let mut con = server.conn();
        for cost in ["1", "2"] {
            let r = slow_bucket_cost(&mut con, "tb", cost);
            assert!(r.allowed);
            let ttl = pttl(&mut con, "tb");
            assert!(
                ttl > r.reset_ms - SLACK_MS && ttl <= r.reset_ms + 1,
                "PTTL {ttl} vs reset_ms {}",
                r.reset_ms
            );
        }
    });
}

#[test]
fn full_bucket_key_expires_by_itself() {
    for_each_server(|kind| {
        let server = Server::start(kind, &[]);
        let mut con = server.conn();
        // One token back every 100 ms.
        let r = rl(&mut con, &["RL.TOKENBUCKET", "tb", "3", "1", "100"]);
        assert!(r.allowed);
        assert_between("reset_ms", r.reset_ms, 0, 100);
        poll_until("the idle key to expire", Duration::from_secs(5), || {
            !exists(&mut con, "tb")
        });
        let r = rl(&mut con, &["RL.TOKENBUCKET", "tb", "3", "1", "100"]);
        assert_eq!((r.allowed, r.remaining), (true, 2), "starts full again");
    });
}

#[test]
fn lowering_capacity_gives_no_tokens_back() {
    for_each_server(|kind| {
        let server = Server::start(kind, &[]);
        let mut con = server.conn();
        slow_bucket_cost(&mut con, "tb", "2");
        // 2 of 5 used; a bucket of 2 with 2 used has none left.
        let r = rl(&mut con, &["RL.TOKENBUCKET", "tb", "2", "1", "1000000"]);
        assert!(!r.allowed, "lowered capacity admitted: {r:?}");
        assert_eq!((r.limit, r.remaining), (2, 0));
    });
}

#[test]
fn raising_capacity_refills_nothing_already_taken() {
    for_each_server(|kind| {
        let server = Server::start(kind, &[]);
        let mut con = server.conn();
        slow_bucket_cost(&mut con, "tb", "5");
        let mut admitted = 0;
        while rl(&mut con, &["RL.TOKENBUCKET", "tb", "10", "1", "1000000"]).allowed {
            admitted += 1;
            assert!(admitted <= 10, "a bucket of 10 never denies");
        }
        assert!(
            admitted <= 5,
            "5 tokens taken, capacity raised 5 -> 10, then {admitted} admitted"
        );
    });
}

#[test]
fn extreme_rates_are_exact() {
    for_each_server(|kind| {
        let server = Server::start(kind, &[]);
        let mut con = server.conn();
        let max = MAX_PARAM.to_string();
        let max = max.as_str();

        // 2^40 tokens, 2^40 per 2^40 ms: takes them all at once.
        let r = rl(
            &mut con,
            &["RL.TOKENBUCKET", "huge", max, max, max, "COST", max],
        );
        assert!(r.allowed, "{r:?}");
        assert_eq!((r.limit, r.remaining), (MAX_PARAM as i64, 0));
        assert_between(
            "reset_ms",
            r.reset_ms,
            MAX_PARAM as i64 - SLACK_MS,
            MAX_PARAM as i64,
        );

        // One token per 2^40 ms (about 35 years).
        let r = rl(&mut con, &["RL.TOKENBUCKET", "slow", "1", "1", max]);
        assert!(r.allowed);
        let r = rl(&mut con, &["RL.TOKENBUCKET", "slow", "1", "1", max]);
        assert!(!r.allowed);
        assert_between(
            "wait_ms",
            r.wait_ms,
            MAX_PARAM as i64 - SLACK_MS,
            MAX_PARAM as i64,
        );

        // A million tokens per millisecond: a full bucket refills within 1 ms.
        let r = rl(
            &mut con,
            &[
                "RL.TOKENBUCKET",
                "fast",
                "1000000",
                "1000000",
                "1",
                "COST",
                "1000000",
            ],
        );
        assert!(r.allowed);
        assert_eq!(r.remaining, 0);
        assert_between("reset_ms", r.reset_ms, 0, 1);
    });
}

#[test]
fn idle_span_of_exactly_2_pow_50_ms_is_accepted() {
    for_each_server(|kind| {
        let server = Server::start(kind, &[]);
        let mut con = server.conn();
        // 1024 tokens, one per 2^40 ms: 2^50 ms to fill.
        let max = MAX_PARAM.to_string();
        let r = rl(&mut con, &["RL.TOKENBUCKET", "tb", "1024", "1", &max]);
        assert!(r.allowed);
        assert_eq!(r.remaining, 1023);
        assert!(pttl(&mut con, "tb") > 0);
    });
}

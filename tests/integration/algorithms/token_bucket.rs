//! `RL.TOKENBUCKET key capacity refill_count refill_ms [COST n]` against real
//! servers: starts full, refills continuously, one token at a time, and
//! `wait_ms` and `reset_ms` are exact to the millisecond. What every limiter
//! command promises (denials change nothing, `COST`, `COST 0`, the TTL,
//! errors, replication, persistence) is checked for it with the others, in `contract/`.
//!
//! Time-dependent checks use slow buckets with generous bounds, or poll with a
//! deadline; none asserts how long anything took.

use std::time::Duration;

use crate::harness::contract::{assert_between, SLACK_MS, SLOW_MS};
use crate::harness::*;

/// A bucket of 5, one token back per 1000 s: nothing refills during a test.
fn slow_bucket(con: &mut Connection, key: &str) -> Reply {
    rl(con, &["RL.TOKENBUCKET", key, "5", "1", "1000000"])
}

fn slow_bucket_cost(con: &mut Connection, key: &str, cost: &str) -> Reply {
    rl(
        con,
        &["RL.TOKENBUCKET", key, "5", "1", "1000000", "COST", cost],
    )
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
fn cost_beyond_the_tokens_left_waits_only_for_the_missing_ones() {
    for_each_server(|kind| {
        let server = Server::start(kind, &[]);
        let mut con = server.conn();
        let r = slow_bucket_cost(&mut con, "tb", "3");
        assert!(r.allowed);
        // reset: the time to refill the 3 tokens taken.
        assert_between("reset_ms", r.reset_ms, 3 * SLOW_MS - SLACK_MS, 3 * SLOW_MS);

        let r = slow_bucket_cost(&mut con, "tb", "3");
        assert!(!r.allowed, "3 tokens from 2: {r:?}");
        // One more token is missing.
        assert_between("wait_ms", r.wait_ms, SLOW_MS - SLACK_MS, SLOW_MS);
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
        // 1024 tokens, one per 2^40 ms: 2^50 ms to fill. (1025 are refused:
        // see the refusals of TOKEN_BUCKET in harness/contract.rs.)
        let max = MAX_PARAM.to_string();
        let r = rl(&mut con, &["RL.TOKENBUCKET", "tb", "1024", "1", &max]);
        assert!(r.allowed);
        assert_eq!(r.remaining, 1023);
        assert!(pttl(&mut con, "tb") > 0);
    });
}

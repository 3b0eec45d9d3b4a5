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

/// A bucket's key holds its state in the value pointer itself (one token per
/// period: no fraction of a microsecond to keep), in a 16-byte block (a
/// fraction below 2^32 ticks), or whole (32 bytes); `MEMORY USAGE` tells the
/// difference. The leaky bucket, the same GCRA state, is packed the same way.
/// A state moves between forms when a call changes its rate, and every form
/// survives `DUMP`/`RESTORE`, a restart from RDB and a replica (`DEBUG
/// DIGEST`), with the decisions it had.
#[test]
fn a_bucket_key_is_as_small_as_its_state_allows() {
    // refill_count 2^33 + 1 and refill_ms 2^39: a call of COST 10^6 leaves
    // a fraction of 10^6 * 2^39 * 1000 mod (2^33 + 1) = 4,719,476,744 ticks
    // (above 2^32), and 18 hours to refill.
    const WHOLE: [&str; 3] = ["1000000", "8589934593", "549755813888"];
    for_each_server(|kind| {
        let mut server = Server::start(kind, &[]);
        let replica = replica_of(&server);
        let mut con = server.conn();
        let usage =
            |con: &mut Connection, key: &str| -> i64 { query(con, &["MEMORY", "USAGE", key]) };
        for command in ["RL.TOKENBUCKET", "RL.LEAKYBUCKET"] {
            let key = |form: &str| format!("{}:{form}", &command[3..5]);
            rl(&mut con, &[command, &key("word"), "100", "1", "60000"]);
            rl(&mut con, &[command, &key("cmpt"), "100", "3", "1000000"]);
            let mut whole = vec![command];
            let name = key("whol");
            whole.push(&name);
            whole.extend(WHOLE);
            whole.extend(["COST", "1000000"]);
            rl(&mut con, &whole);
            let word = usage(&mut con, &key("word"));
            // A block is what the allocator gives for 16 or 32 bytes:
            // exactly that with jemalloc, 8 bytes more with glibc's malloc.
            let block = |bytes: i64| bytes..=bytes + 8;
            let compact = usage(&mut con, &key("cmpt")) - word;
            assert!(
                block(16).contains(&compact),
                "{command}: a 16-byte block: {compact}"
            );
            let whole = usage(&mut con, &key("whol")) - word;
            assert!(
                block(32).contains(&whole),
                "{command}: the whole state: {whole}"
            );
            // New rates move the state between forms, in both directions.
            let moved = key("move");
            rl(&mut con, &[command, &moved, "100", "1", "60000"]);
            assert_eq!(usage(&mut con, &moved), word, "{command}: in the pointer");
            let r = rl(&mut con, &[command, &moved, "100", "3", "1000000"]);
            assert!(r.allowed, "{command}: {r:?}");
            assert_eq!(
                usage(&mut con, &moved) - word,
                compact,
                "{command}: now fractional"
            );
            let r = rl(&mut con, &[command, &moved, "100", "1", "60000"]);
            assert!(r.allowed, "{command}: {r:?}");
            assert_eq!(
                usage(&mut con, &moved),
                word,
                "{command}: back in the pointer"
            );
            // Every form is a state like any other: DUMP, RESTORE, peeks.
            for (form, params) in [
                ("word", vec!["100", "1", "60000"]),
                ("cmpt", vec!["100", "3", "1000000"]),
                ("whol", WHOLE.to_vec()),
            ] {
                let original = key(form);
                let copy = format!("{original}:copy");
                let payload = dump(&mut con, &original).expect("a key");
                redis::cmd("RESTORE")
                    .arg(&copy)
                    .arg(0)
                    .arg(&payload)
                    .query::<()>(&mut con)
                    .unwrap_or_else(|e| panic!("{command} {form}: RESTORE: {e}"));
                let peek = |con: &mut Connection, k: &str| {
                    let mut words = vec![command, k];
                    words.extend(params.iter().copied());
                    words.extend(["COST", "0"]);
                    rl(con, &words)
                };
                let (a, b) = (peek(&mut con, &original), peek(&mut con, &copy));
                assert_eq!(
                    (a.allowed, a.remaining),
                    (b.allowed, b.remaining),
                    "{command} {form}"
                );
                assert_eq!(dump(&mut con, &copy), Some(payload), "{command} {form}");
            }
        }
        let rates: String = query(&mut con, &["INFO", "ratelimit"]);
        let rates: u64 = info_field(&rates, "ratelimit_bucket_rates")
            .expect("the field")
            .parse()
            .expect("a number");
        assert!(rates >= 3, "three rates numbered at least: {rates}");
        wait_for_sync(&server, &replica);
        let keys: Vec<String> = query(&mut con, &["KEYS", "*"]);
        assert_same_dataset(&server, &replica, &keys);
        let digest = debug_digest(&mut con);
        save(&mut con);
        drop(con);
        server.restart();
        let mut con = server.conn();
        assert_eq!(
            debug_digest(&mut con),
            digest,
            "the same keys after a restart from RDB"
        );
    });
}

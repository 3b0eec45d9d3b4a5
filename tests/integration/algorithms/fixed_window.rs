//! `RL.FIXEDWINDOW key limit window_ms [COST n]` against real servers: a
//! counter per window, windows aligned to multiples of window_ms since the
//! epoch, a denial waits for the window's end, and the key expires then.
//! What every limiter command promises (denials change nothing, `COST`,
//! `COST 0`, the TTL, errors, replication, persistence) is checked for it
//! with the others, in `contract/`.
//!
//! Tests that need all their calls in one window first move away from the
//! window's end (`away_from_window_end`); none asserts how long anything took.

use std::time::Duration;

use crate::harness::contract::{assert_between, SLOW, SLOW_MS};
use crate::harness::*;

/// Margin kept before the end of a slow (1000 s) window.
const MARGIN_MS: u64 = 10_000;

fn slow_window(con: &mut Connection, key: &str, limit: &str, cost: &str) -> Reply {
    rl(con, &["RL.FIXEDWINDOW", key, limit, SLOW, "COST", cost])
}

#[test]
fn window_counts_up_to_limit_then_denies() {
    for_each_server(|kind| {
        let server = Server::start(kind, &[]);
        let mut con = server.conn();
        away_from_window_end(&mut con, SLOW_MS as u64, MARGIN_MS);
        let mut first_reset = 0;
        for remaining in [2, 1, 0] {
            let r = rl(&mut con, &["RL.FIXEDWINDOW", "fw", "3", SLOW]);
            assert!(r.allowed, "{r:?}");
            assert_eq!((r.limit, r.remaining, r.wait_ms), (3, remaining, 0));
            assert_between("reset_ms", r.reset_ms, MARGIN_MS as i64, SLOW_MS);
            first_reset = first_reset.max(r.reset_ms);
        }
        let r = rl(&mut con, &["RL.FIXEDWINDOW", "fw", "3", SLOW]);
        assert!(!r.allowed, "4th call on a limit of 3: {r:?}");
        assert_eq!((r.limit, r.remaining), (3, 0));
        // Denied until the window ends, which is also when it resets.
        assert_eq!(r.wait_ms, r.reset_ms);
        assert_between("wait_ms", r.wait_ms, MARGIN_MS as i64 - 1000, first_reset);
    });
}

#[test]
fn windows_are_aligned_to_multiples_of_window_ms() {
    for_each_server(|kind| {
        let server = Server::start(kind, &[]);
        let mut con = server.conn();
        for (window_ms, margin_ms) in [
            (1_000u64, 300u64),
            (7_000, 1_000),
            (60_000, 5_000),
            (SLOW_MS as u64, MARGIN_MS),
        ] {
            away_from_window_end(&mut con, window_ms, margin_ms);
            let key = format!("fw:{window_ms}");
            let before_us = server_time_us(&mut con);
            let r = rl(
                &mut con,
                &["RL.FIXEDWINDOW", &key, "10", &window_ms.to_string()],
            );
            let after_us = server_time_us(&mut con);
            let window_us = window_ms * 1000;
            let end_us = (before_us / window_us + 1) * window_us;
            let earliest = end_us.saturating_sub(after_us).div_ceil(1000) as i64;
            let latest = end_us.saturating_sub(before_us).div_ceil(1000) as i64;
            assert!(
                (earliest..=latest).contains(&r.reset_ms),
                "window {window_ms}: reset_ms {} not in [{earliest}, {latest}]",
                r.reset_ms
            );
        }
    });
}

#[test]
fn count_starts_again_in_the_next_window() {
    for_each_server(|kind| {
        let server = Server::start(kind, &[]);
        let mut con = server.conn();
        let call = |con: &mut Connection| rl(con, &["RL.FIXEDWINDOW", "fw", "2", "500"]);
        away_from_window_end(&mut con, 500, 250);
        assert!(call(&mut con).allowed);
        assert!(call(&mut con).allowed);
        let denied = call(&mut con);
        assert!(!denied.allowed);
        assert_between("wait_ms", denied.wait_ms, 0, 500);

        let mut next = None;
        poll_until("the next window", Duration::from_secs(5), || {
            let r = call(&mut con);
            next = Some(r);
            r.allowed
        });
        let next = next.unwrap();
        assert_eq!(
            (next.limit, next.remaining),
            (2, 1),
            "a fresh window: {next:?}"
        );
    });
}

#[test]
fn cost_beyond_what_is_left_waits_for_the_window_end() {
    for_each_server(|kind| {
        let server = Server::start(kind, &[]);
        let mut con = server.conn();
        away_from_window_end(&mut con, SLOW_MS as u64, MARGIN_MS);
        assert!(slow_window(&mut con, "fw", "5", "3").allowed);
        let r = slow_window(&mut con, "fw", "5", "3");
        assert!(!r.allowed, "3 more on 2 left: {r:?}");
        assert_eq!(r.wait_ms, r.reset_ms, "denied until the window ends");
    });
}

#[test]
fn largest_parameters_are_accepted() {
    for_each_server(|kind| {
        let server = Server::start(kind, &[]);
        let mut con = server.conn();
        let max = MAX_PARAM.to_string();
        let r = rl(&mut con, &["RL.FIXEDWINDOW", "fw", &max, &max]);
        assert!(r.allowed);
        assert_eq!(
            (r.limit, r.remaining),
            (MAX_PARAM as i64, MAX_PARAM as i64 - 1)
        );
        let r = rl(
            &mut con,
            &["RL.FIXEDWINDOW", "all", &max, &max, "COST", &max],
        );
        assert!(r.allowed);
        assert_eq!(r.remaining, 0);
        assert!(pttl(&mut con, "all") > 0);
    });
}

/// A call under a longer window lands in the same (new) window as the
/// previous call, so the idle instant computed under the new parameters does
/// not move; the key's expiry, set at the old window's end, must still move
/// to the new one.
#[test]
fn a_longer_window_moves_the_expiry_to_its_end() {
    for_each_server(|kind| {
        let server = Server::start(kind, &[]);
        let mut con = server.conn();
        // Not in the last seconds of a minute: the 1 s window then ends
        // before the 60 s window.
        away_from_window_end(&mut con, 60_000, 2_000);
        let _: () = query(&mut con, &["MULTI"]);
        let _: String = query(&mut con, &["RL.FIXEDWINDOW", "fw", "5", "1000"]);
        let _: String = query(&mut con, &["RL.FIXEDWINDOW", "fw", "5", "60000"]);
        let replies: Vec<redis::Value> = query(&mut con, &["EXEC"]);
        let short = Reply::from_value(&replies[0]);
        let long = Reply::from_value(&replies[1]);
        assert!(short.allowed && long.allowed, "{short:?} {long:?}");
        assert!(long.reset_ms > 1000, "{long:?}");
        let ttl = pttl(&mut con, "fw");
        // The key may expire up to min(reset_ms, 1 s) after the window ends.
        assert!(
            ttl > 1000 && ttl <= long.reset_ms + long.reset_ms.min(1000),
            "PTTL {ttl} after the 60 s call (reset_ms {}): still the 1 s window's",
            long.reset_ms
        );
    });
}

/// A fixed window's key (and a calendar quota's, the same two integers)
/// holds its state in the value pointer itself while its count is below
/// 4,096, and in a 16-byte block from then on; `MEMORY USAGE` tells the
/// difference. Both forms survive `DUMP`/`RESTORE`, a replica and a restart
/// from RDB with the decisions they had.
#[test]
fn a_window_key_is_as_small_as_its_count_allows() {
    for_each_server(|kind| {
        let mut server = Server::start(kind, &[]);
        let replica = replica_of(&server);
        let mut con = server.conn();
        let usage =
            |con: &mut Connection, key: &str| -> i64 { query(con, &["MEMORY", "USAGE", key]) };
        // Every call of the test in one hour-long window.
        away_from_window_end(&mut con, 3_600_000, 30_000);
        for (command, params) in [
            ("RL.FIXEDWINDOW", ["10000", "3600000"]),
            ("RL.QUOTA", ["10000", "DAY"]),
        ] {
            let call = |con: &mut Connection, key: &str, cost: &str| {
                let mut words = vec![command, key];
                words.extend(params);
                words.extend(["COST", cost]);
                rl(con, &words)
            };
            let (small, large) = (format!("{command}:s"), format!("{command}:l"));
            assert!(call(&mut con, &small, "4095").allowed);
            assert!(call(&mut con, &large, "4095").allowed);
            let word = usage(&mut con, &small);
            assert_eq!(
                usage(&mut con, &large),
                word,
                "{command}: both in the pointer"
            );
            // One more unit: 4,096 no longer fits in 12 bits.
            assert!(call(&mut con, &large, "1").allowed);
            let block = usage(&mut con, &large) - word;
            assert!(
                (16..=24).contains(&block),
                "{command}: a 16-byte block: {block}"
            );
            for key in [&small, &large] {
                let copy = format!("{key}:copy");
                let payload = dump(&mut con, key).expect("a key");
                redis::cmd("RESTORE")
                    .arg(&copy)
                    .arg(0)
                    .arg(&payload)
                    .query::<()>(&mut con)
                    .unwrap_or_else(|e| panic!("{command}: RESTORE: {e}"));
                let (a, b) = (call(&mut con, key, "0"), call(&mut con, &copy, "0"));
                assert_eq!(
                    (a.allowed, a.remaining),
                    (b.allowed, b.remaining),
                    "{command} {key}"
                );
                assert_eq!(dump(&mut con, &copy), Some(payload), "{command} {key}");
            }
            assert_eq!(call(&mut con, &small, "0").remaining, 10000 - 4095);
            assert_eq!(call(&mut con, &large, "0").remaining, 10000 - 4096);
        }
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

//! `RL.FIXEDWINDOW key limit window_ms [COST n]` against real servers: a
//! counter per window, windows aligned to multiples of window_ms since the
//! epoch, replies `[allowed, limit, remaining, wait_ms, reset_ms]`, the key
//! expires at the window's end.
//!
//! Tests that need all their calls in one window first move away from the
//! window's end (`away_from_window_end`); none asserts how long anything took.

mod common;

use std::thread::sleep;
use std::time::Duration;

use common::*;

/// A 1000 s window: a test's calls all land in one.
const SLOW_MS: i64 = 1_000_000;
const SLOW: &str = "1000000";
/// Margin kept before the end of a slow window.
const MARGIN_MS: u64 = 10_000;

fn assert_between(what: &str, value: i64, above: i64, at_most: i64) {
    assert!(
        value > above && value <= at_most,
        "{what} = {value}, expected in ({above}, {at_most}]"
    );
}

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
fn denied_request_changes_nothing() {
    for_each_server(|kind| {
        let server = Server::start(kind, &[]);
        let mut con = server.conn();
        away_from_window_end(&mut con, SLOW_MS as u64, MARGIN_MS);
        slow_window(&mut con, "fw", "3", "3");
        let state_before = dump(&mut con, "fw");
        let pttl_before = pttl(&mut con, "fw");
        for cost in ["1", "2", "3", "4"] {
            for _ in 0..10 {
                assert!(!slow_window(&mut con, "fw", "3", cost).allowed);
            }
        }
        assert_eq!(
            dump(&mut con, "fw"),
            state_before,
            "a denial changed the state"
        );
        let pttl_after = pttl(&mut con, "fw");
        assert!(
            pttl_after <= pttl_before,
            "a denial extended the TTL: {pttl_before} -> {pttl_after}"
        );
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
fn request_is_admitted_after_waiting_wait_ms() {
    for_each_server(|kind| {
        let server = Server::start(kind, &[]);
        let mut con = server.conn();
        let call = |con: &mut Connection| rl(con, &["RL.FIXEDWINDOW", "fw", "1", "300"]);
        away_from_window_end(&mut con, 300, 150);
        assert!(call(&mut con).allowed);
        let denied = call(&mut con);
        assert!(!denied.allowed);
        assert_between("wait_ms", denied.wait_ms, 0, 300);
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
fn cost_counts_that_many_units() {
    for_each_server(|kind| {
        let server = Server::start(kind, &[]);
        let mut con = server.conn();
        away_from_window_end(&mut con, SLOW_MS as u64, MARGIN_MS);
        let r = slow_window(&mut con, "fw", "5", "3");
        assert!(r.allowed);
        assert_eq!((r.limit, r.remaining, r.wait_ms), (5, 2, 0));
        let r = slow_window(&mut con, "fw", "5", "3");
        assert!(!r.allowed, "3 more on 2 left: {r:?}");
        assert_eq!(r.remaining, 2);
        assert_eq!(r.wait_ms, r.reset_ms, "denied until the window ends");
        let r = slow_window(&mut con, "fw", "5", "2");
        assert!(r.allowed);
        assert_eq!(r.remaining, 0);
    });
}

#[test]
fn cost_above_limit_is_never_admitted() {
    for_each_server(|kind| {
        let server = Server::start(kind, &[]);
        let mut con = server.conn();
        away_from_window_end(&mut con, SLOW_MS as u64, MARGIN_MS);
        let r = slow_window(&mut con, "fw", "5", "6");
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
        assert!(!exists(&mut con, "fw"), "a denial created the key");

        slow_window(&mut con, "fw", "5", "1");
        let r = slow_window(&mut con, "fw", "5", "6");
        assert!(!r.allowed);
        assert_eq!((r.remaining, r.wait_ms), (4, -1));
    });
}

#[test]
fn cost_zero_peeks_without_creating_or_changing_anything() {
    for_each_server(|kind| {
        let server = Server::start(kind, &[]);
        let mut con = server.conn();
        away_from_window_end(&mut con, SLOW_MS as u64, MARGIN_MS);
        let r = slow_window(&mut con, "fw", "5", "0");
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
        assert!(!exists(&mut con, "fw"), "COST 0 created the key");
        assert_eq!(dbsize(&mut con), 0);

        slow_window(&mut con, "fw", "5", "2");
        let state = dump(&mut con, "fw");
        let r = slow_window(&mut con, "fw", "5", "0");
        assert!(r.allowed);
        assert_eq!((r.remaining, r.wait_ms), (3, 0));
        assert_between("reset_ms", r.reset_ms, 0, SLOW_MS);
        assert_eq!(dump(&mut con, "fw"), state, "COST 0 changed the state");
    });
}

#[test]
fn key_ttl_follows_reset_ms() {
    for_each_server(|kind| {
        let server = Server::start(kind, &[]);
        let mut con = server.conn();
        away_from_window_end(&mut con, SLOW_MS as u64, MARGIN_MS);
        let r = slow_window(&mut con, "fw", "5", "1");
        let ttl = pttl(&mut con, "fw");
        assert!(
            ttl > r.reset_ms - MARGIN_MS as i64 && ttl <= r.reset_ms + 1,
            "PTTL {ttl} vs reset_ms {}",
            r.reset_ms
        );
    });
}

#[test]
fn window_key_expires_at_the_window_end() {
    for_each_server(|kind| {
        let server = Server::start(kind, &[]);
        let mut con = server.conn();
        let r = rl(&mut con, &["RL.FIXEDWINDOW", "fw", "5", "200"]);
        assert!(r.allowed);
        assert_between("reset_ms", r.reset_ms, 0, 200);
        poll_until("the window key to expire", Duration::from_secs(5), || {
            !exists(&mut con, "fw")
        });
    });
}

#[test]
fn lowering_the_limit_applies_to_the_current_count() {
    for_each_server(|kind| {
        let server = Server::start(kind, &[]);
        let mut con = server.conn();
        away_from_window_end(&mut con, SLOW_MS as u64, MARGIN_MS);
        slow_window(&mut con, "fw", "5", "3");
        let r = slow_window(&mut con, "fw", "3", "1");
        assert!(!r.allowed, "3 counted, limit lowered to 3: {r:?}");
        assert_eq!((r.limit, r.remaining), (3, 0));
        let r = slow_window(&mut con, "fw", "4", "1");
        assert!(r.allowed, "3 counted, limit 4: {r:?}");
        assert_eq!((r.limit, r.remaining), (4, 0));
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

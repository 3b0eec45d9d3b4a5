//! `REFUND n` and `COST n FORCE` on every limiter command (the table in
//! `harness/contract.rs`) and through `RL.HIT`: refunded units are usable at
//! once, a refund never gives back more than is consumed, a forced call
//! leaves at most a limit of debt that time repays, replicas end
//! byte-identical, a call that changes nothing propagates nothing, and bad
//! options are refused without writing anything.

use std::thread::sleep;
use std::time::{Duration, Instant};

use crate::harness::contract::*;
use crate::harness::*;

/// `args...` after the slow parameters under `limit`.
fn slow_with(
    alg: &Algorithm,
    con: &mut Connection,
    key: &str,
    limit: &str,
    options: &[&str],
) -> Reply {
    let mut args = alg.slow_params(limit);
    args.extend_from_slice(options);
    alg.call(con, key, &args)
}

#[test]
fn refunded_units_are_usable_at_once() {
    for_each_algorithm_on_each_server(|alg, con| {
        let key = alg.key;
        alg.away_from_window_end(con, &alg.valid());
        assert_eq!(alg.slow(con, key, "5", "5").remaining, 0, "{alg}");
        assert!(!alg.slow(con, key, "5", "2").allowed, "{alg}");
        let sent = Instant::now();
        let refund = slow_with(alg, con, key, "5", &["REFUND", "2"]);
        let peek = alg.slow(con, key, "5", "0");
        // (reset_ms counts from each call's own clock reading: the peek, a
        // moment later, may say less, by at most the time between the two
        // calls, rounded up; a loaded host stretches it to milliseconds.)
        let between = sent.elapsed().as_millis() as i64 + 1;
        assert_eq!(
            (refund.allowed, refund.limit, refund.remaining),
            (peek.allowed, peek.limit, peek.remaining),
            "{alg}: a refund answers as COST 0 after it"
        );
        assert!(
            (peek.reset_ms..=peek.reset_ms + between).contains(&refund.reset_ms),
            "{alg}: reset_ms of the refund {refund:?} and of the peek after it {peek:?}, {between} ms apart at most"
        );
        assert_eq!(
            (refund.allowed, refund.limit, refund.remaining),
            (true, 5, 2),
            "{alg}: {refund:?}"
        );
        // (A queue's peek tells the delay a request sent now would get.)
        assert!(alg.shapes || refund.wait_ms == 0, "{alg}: {refund:?}");
        let r = alg.slow(con, key, "5", "2");
        assert!(r.allowed, "{alg}: refunded units denied: {r:?}");
        assert_eq!(r.remaining, 0, "{alg}");
    });
}

#[test]
fn a_refund_never_gives_back_more_than_is_consumed() {
    for_each_algorithm_on_each_server(|alg, con| {
        let key = alg.key;
        alg.away_from_window_end(con, &alg.valid());
        // On a key that does not exist: nothing to give back, nothing created.
        let r = slow_with(alg, con, key, "5", &["REFUND", "3"]);
        assert_eq!(
            (r.allowed, r.remaining, r.reset_ms),
            (true, 5, 0),
            "{alg}: {r:?}"
        );
        assert!(!exists(con, key), "{alg}: a refund created the key");

        alg.slow(con, key, "5", "2");
        let r = slow_with(alg, con, key, "5", &["refund", "100"]);
        assert_eq!(r.remaining, 5, "{alg}: {r:?}");
        // Idle again: one more refund changes nothing, not even the TTL. An
        // idle bucket's key may expire at any moment (its idle instant is
        // now): kept without a TTL, its state can be compared.
        let _: i64 = query(con, &["PERSIST", key]);
        let state = dump(con, key);
        let pttl_before = pttl(con, key);
        let r = slow_with(alg, con, key, "5", &["REFUND", "1"]);
        assert_eq!(r.remaining, 5, "{alg}: {r:?}");
        assert_eq!(
            dump(con, key),
            state,
            "{alg}: a refund of nothing changed the state"
        );
        assert!(
            pttl(con, key) <= pttl_before,
            "{alg}: a refund of nothing moved the TTL"
        );
        // Not above the idle state: five units, no more.
        assert!(alg.slow(con, key, "5", "5").allowed, "{alg}");
        assert!(
            !alg.slow(con, key, "5", "1").allowed,
            "{alg}: a refund lifted the limiter above idle"
        );
    });
}

#[test]
fn a_forced_call_is_admitted_and_leaves_at_most_a_limit_of_debt() {
    for_each_algorithm_on_each_server(|alg, con| {
        let key = alg.key;
        alg.away_from_window_end(con, &alg.valid());
        alg.slow(con, key, "5", "4");
        let unforced = alg.slow(con, key, "5", "3");
        assert!(!unforced.allowed, "{alg}");
        let forced = slow_with(alg, con, key, "5", &["FORCE", "COST", "3"]);
        assert!(forced.allowed, "{alg}: FORCE answers allowed: {forced:?}");
        assert_eq!(
            (forced.limit, forced.remaining),
            (unforced.limit, unforced.remaining),
            "{alg}: FORCE answers as the call would have been answered"
        );
        // 7 of 5 taken: 2 of debt. A huge penalty stops at 5 of debt (10).
        assert!(
            slow_with(alg, con, key, "5", &["COST", "1000", "FORCE"]).allowed,
            "{alg}"
        );
        let r = slow_with(alg, con, key, "5", &["REFUND", "5"]);
        assert_eq!(r.remaining, 0, "{alg}: debt beyond 5 units: {r:?}");
        let r = slow_with(alg, con, key, "5", &["REFUND", "1"]);
        assert_eq!(r.remaining, 1, "{alg}: debt above 5 units: {r:?}");
        // Denials and peeks while in debt are answered as usual.
        let r = alg.slow(con, key, "5", "2");
        assert!(!r.allowed && r.wait_ms > 0, "{alg}: {r:?}");
        let r = alg.slow(con, key, "5", "6");
        assert_eq!(r.wait_ms, -1, "{alg}: {r:?}");
    });
}

/// Where units come back within a test ([`Algorithm::short`]), the debt is
/// repaid by waiting the `wait_ms` a denial tells; elsewhere (a quota) the
/// same debt under the slow parameters, whose `wait_ms` the key's TTL must
/// still cover.
#[test]
fn forced_debt_is_repaid_by_time() {
    for_each_algorithm_on_each_server(|alg, con| {
        let key = alg.key;
        let (params, wait_max_ms) = match &alg.short {
            Some(short) => (short.params.to_vec(), 2 * short.wait_max_ms),
            None => (alg.slow_params("3"), i64::MAX),
        };
        let call = |con: &mut Connection, options: &[&str]| {
            let mut args = params.clone();
            args.extend_from_slice(options);
            alg.call(con, key, &args)
        };
        alg.away_from_window_end(con, &params);
        // A limit of 3, all taken, then 3 more forced.
        assert!(call(con, &["COST", "3"]).allowed, "{alg}");
        assert!(call(con, &["COST", "3", "FORCE"]).allowed, "{alg}");
        let sent = Instant::now();
        let denied = call(con, &["COST", "1"]);
        assert!(!denied.allowed, "{alg}: in debt: {denied:?}");
        assert!(
            denied.wait_ms > 0 && denied.wait_ms <= wait_max_ms,
            "{alg}: {denied:?}"
        );
        // The TTL covers the debt: the key outlives the time to repay it.
        // PTTL rounds down what wait_ms rounds up, and it is read a little
        // after the call: at most the time since the call was sent, which a
        // loaded host stretches to several milliseconds.
        let ttl = pttl(con, key);
        let since_call = sent.elapsed().as_millis() as i64;
        assert!(
            ttl + 1 + since_call >= denied.wait_ms,
            "{alg}: the key expires before its debt is repaid (PTTL {ttl} read {since_call} ms after the call, wait_ms {})",
            denied.wait_ms
        );
        if alg.short.is_none() {
            eprintln!("{alg}: the wait itself skipped, longer than a test");
            return;
        }
        sleep(Duration::from_millis(denied.wait_ms as u64));
        let r = call(con, &["COST", "1"]);
        assert!(
            r.allowed,
            "{alg}: denied again after waiting {}: {r:?}",
            denied.wait_ms
        );
        // Idle again in the end: the key goes away by itself.
        poll_until(
            &format!("{alg}: the key to expire"),
            Duration::from_secs(10),
            || !exists(con, key),
        );
    });
}

#[test]
fn refund_and_force_keep_replicas_byte_identical() {
    const STEPS: [&[&str]; 6] = [
        &["COST", "3"],
        &["REFUND", "1"],
        &["COST", "9", "FORCE"],
        &["REFUND", "4"],
        &["COST", "2", "FORCE"],
        &["REFUND", "100"],
    ];
    for_each_server(|kind| {
        let master = Server::start(kind, QUIET_MASTER);
        let replica = replica_of(&master);
        let mut con = master.conn();
        let mut keys = Vec::new();
        for alg in &ALGORITHMS {
            alg.away_from_window_end(&mut con, &alg.valid());
            // Key i has seen the first i + 1 steps.
            for i in 0..STEPS.len() {
                let key = format!("{}:{i}", alg.key);
                for step in &STEPS[..=i] {
                    slow_with(alg, &mut con, &key, "5", step);
                }
                keys.push(key);
            }
        }
        wait_for_sync(&master, &replica);
        assert_same_dataset(&master, &replica, &keys);
    });
}

#[test]
fn a_refund_or_force_that_changes_nothing_propagates_nothing() {
    for_each_server(|kind| {
        let master = Server::start(kind, QUIET_MASTER);
        let replica = replica_of(&master);
        let mut con = master.conn();
        for alg in &ALGORITHMS {
            alg.away_from_window_end(&mut con, &alg.valid());
            let key = alg.key;
            slow_with(alg, &mut con, key, "5", &["COST", "1000", "FORCE"]);
            wait_for_sync(&master, &replica);
            let offset = master_offset(&master);
            slow_with(alg, &mut con, "missing", "5", &["REFUND", "1"]);
            slow_with(alg, &mut con, key, "5", &["REFUND", "0"]);
            alg.slow(&mut con, key, "5", "0");
            assert_eq!(
                master_offset(&master),
                offset,
                "{alg}: a call that changed nothing was propagated"
            );
            // A refund that gives back something is propagated.
            slow_with(alg, &mut con, key, "5", &["REFUND", "1"]);
            poll_until(
                &format!("{alg}: the refund to propagate"),
                Duration::from_secs(10),
                || master_offset(&master) > offset,
            );
        }
    });
}

#[test]
fn bad_refund_and_force_options_are_refused_and_write_nothing() {
    for_each_algorithm_on_each_server(|alg, con| {
        let key = alg.key;
        alg.away_from_window_end(con, &alg.valid());
        let refused: &[(&[&str], &str)] = &[
            (
                &["REFUND", "1", "COST", "1"],
                "ERR REFUND cannot be given with COST",
            ),
            (
                &["COST", "1", "REFUND", "1"],
                "ERR REFUND cannot be given with COST",
            ),
            (
                &["REFUND", "1", "FORCE"],
                "ERR REFUND cannot be given with FORCE",
            ),
            (
                &["REFUND", "-1"],
                "ERR REFUND must be an integer from 0 to 1099511627776",
            ),
            (
                &["REFUND", "1.5"],
                "ERR REFUND must be an integer from 0 to 1099511627776",
            ),
            (
                &["REFUND", "x"],
                "ERR REFUND must be an integer from 0 to 1099511627776",
            ),
            (&["REFUND"], "ERR REFUND needs a value"),
            (
                &["REFUND", "1", "REFUND", "1"],
                "ERR REFUND given more than once",
            ),
            (&["FORCE", "FORCE"], "ERR FORCE given more than once"),
            (
                &["COST", "-2", "FORCE"],
                "ERR COST must be an integer from 0 to 1099511627776",
            ),
        ];
        for (options, error) in refused {
            let mut args = alg.valid();
            args.extend_from_slice(options);
            assert_eq!(alg.call_err(con, key, &args), *error, "{alg} {options:?}");
            assert!(
                !exists(con, key),
                "{alg} {options:?}: a refused call created the key"
            );
        }
        alg.slow(con, key, "5", "2");
        let state = dump(con, key);
        for (options, error) in refused {
            let mut args = alg.valid();
            args.extend_from_slice(options);
            assert_eq!(alg.call_err(con, key, &args), *error, "{alg} {options:?}");
        }
        assert_eq!(
            dump(con, key),
            state,
            "{alg}: a refused call changed the state"
        );
    });
}

#[test]
fn rl_hit_refunds_and_forces_through_a_policy() {
    for_each_server(|kind| {
        let server = Server::start(kind, &[]);
        let mut con = server.conn();
        let _: () = query(
            &mut con,
            &["RL.POLICY", "SET", "login", "TOKENBUCKET", "5", "1", SLOW],
        );
        assert_eq!(
            rl(&mut con, &["RL.HIT", "login", "u", "COST", "5"]).remaining,
            0
        );
        let r = rl(&mut con, &["RL.HIT", "login", "u", "REFUND", "2"]);
        assert_eq!((r.allowed, r.remaining), (true, 2));
        // A failed login counted twice.
        let r = rl(&mut con, &["RL.HIT", "login", "u", "COST", "4", "FORCE"]);
        assert!(r.allowed, "{r:?}");
        let r = rl(&mut con, &["RL.HIT", "login", "u", "COST", "0"]);
        assert_eq!(r.remaining, 0);
        let r = rl(&mut con, &["RL.HIT", "login", "u", "REFUND", "2"]);
        assert_eq!(r.remaining, 0, "2 of debt: {r:?}");
        let r = rl(&mut con, &["RL.HIT", "login", "u", "REFUND", "1"]);
        assert_eq!(r.remaining, 1, "{r:?}");
        assert_eq!(
            query_err(
                &mut con,
                &["RL.HIT", "login", "u", "REFUND", "1", "COST", "1"]
            ),
            "ERR REFUND cannot be given with COST"
        );
        // A policy that is off touches nothing, refund or not.
        let _: () = query(
            &mut con,
            &[
                "RL.POLICY",
                "SET",
                "login",
                "TOKENBUCKET",
                "5",
                "1",
                SLOW,
                "MODE",
                "OFF",
            ],
        );
        let before = dump(&mut con, "u");
        rl(&mut con, &["RL.HIT", "login", "u", "REFUND", "1"]);
        rl(&mut con, &["RL.HIT", "login", "u", "COST", "3", "FORCE"]);
        assert_eq!(dump(&mut con, "u"), before);
    });
}

#[test]
fn rl_all_takes_force_and_refuses_refund() {
    for_each_server(|kind| {
        let server = Server::start(kind, &[]);
        let mut con = server.conn();
        let all = |extra: &[&'static str]| -> Vec<&'static str> {
            let mut words = vec![
                "RL.ALL",
                "2",
                "{u}a",
                "{u}b",
                "TOKENBUCKET",
                "2",
                "1",
                SLOW,
                "FIXEDWINDOW",
                "5",
                SLOW,
            ];
            words.extend_from_slice(extra);
            words
        };
        let r = query::<Vec<i64>>(&mut con, &all(&["COST", "2"]));
        assert_eq!(r, vec![1, 2, 0, 0, r[4], 0]);
        let denied = query::<Vec<i64>>(&mut con, &all(&["COST", "2"]));
        assert_eq!((denied[0], denied[5]), (0, 1));
        let forced = query::<Vec<i64>>(&mut con, &all(&["COST", "2", "FORCE"]));
        assert_eq!((forced[0], forced[5]), (1, 0), "{forced:?}");
        // Both limiters took the forced units: 4 of 2 and 4 of 5.
        let b = rl(
            &mut con,
            &["RL.FIXEDWINDOW", "{u}b", "5", SLOW, "COST", "0"],
        );
        assert_eq!(b.remaining, 1);
        let a = rl(
            &mut con,
            &["RL.TOKENBUCKET", "{u}a", "2", "1", SLOW, "REFUND", "2"],
        );
        assert_eq!(a.remaining, 0, "2 of debt left: {a:?}");
        assert_eq!(
            query_err(&mut con, &all(&["REFUND", "1"])),
            "ERR REFUND is not an option of RL.ALL: refund each limiter with its own command"
        );
    });
}

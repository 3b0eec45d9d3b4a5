//! The protection loop (SPEC "The protection loop"): `ADAPT` lowering and
//! restoring a policy's scale from the outcomes `RL.OUTCOME` reports,
//! `STAGES` moving from the deny ratio of each window (shadow denials
//! included) and back one step per window, `RL.POLICY SCALE` and `STATS`,
//! and the scale and stage as node state: on a real replica, after RDB and
//! AOF restarts (with and without the RDB preamble) and after a failover.
//! Every bad argument is refused naming it, with nothing written.
//!
//! A window is evaluated at the first call after its end: [`end_window`]
//! waits for the server's clock to pass the window's end (read from
//! `STATS`) and then sends `RL.OUTCOME name 0 0`, whose reply is the loop
//! after the evaluation. The counts of a step are sent in one call (or one
//! `MULTI`), well inside a window, and checked in `current` before the
//! window ends, so no step depends on timing.

use std::time::Duration;

use crate::harness::*;

/// 2^40 ms: nothing refills or leaves a window while a test runs.
const LONG: &str = "1099511627776";

/// One window's counts, as `STATS` shows `current` and `last`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Window {
    calls: i64,
    admitted: i64,
    denied: i64,
    ok: i64,
    errors: i64,
    deny_permille: i64,
    error_permille: i64,
}

/// `RL.POLICY STATS name` (and `RL.OUTCOME`'s reply).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Stats {
    scale: i64,
    stage: i64,
    window_ms: i64,
    window_end_ms: i64,
    current: Window,
    last: Window,
    adapting: i64,
}

fn pairs(value: &Value) -> Vec<(String, Value)> {
    let Value::Array(items) = value else {
        panic!("expected a flat list of names and values, got {value:?}");
    };
    assert_eq!(items.len() % 2, 0, "{items:?}");
    items
        .chunks(2)
        .map(|p| (text(&p[0]), p[1].clone()))
        .collect()
}

fn window(value: &Value) -> Window {
    let fields = pairs(value);
    let names: Vec<&str> = fields.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(
        names,
        [
            "calls",
            "admitted",
            "denied",
            "ok",
            "errors",
            "deny_permille",
            "error_permille"
        ]
    );
    let v: Vec<i64> = fields.iter().map(|(_, v)| int(v)).collect();
    Window {
        calls: v[0],
        admitted: v[1],
        denied: v[2],
        ok: v[3],
        errors: v[4],
        deny_permille: v[5],
        error_permille: v[6],
    }
}

fn parse_stats(value: &Value) -> Stats {
    let fields = pairs(value);
    let names: Vec<&str> = fields.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(
        names,
        [
            "scale",
            "stage",
            "window_ms",
            "window_end_ms",
            "current",
            "last",
            "adapting"
        ]
    );
    Stats {
        scale: int(&fields[0].1),
        stage: int(&fields[1].1),
        window_ms: int(&fields[2].1),
        window_end_ms: int(&fields[3].1),
        current: window(&fields[4].1),
        last: window(&fields[5].1),
        adapting: int(&fields[6].1),
    }
}

fn stats(con: &mut Connection, name: &str) -> Stats {
    parse_stats(&query::<Value>(con, &["RL.POLICY", "STATS", name]))
}

fn outcome(con: &mut Connection, name: &str, ok: u64, errors: u64) -> Stats {
    let (ok, errors) = (ok.to_string(), errors.to_string());
    parse_stats(&query::<Value>(con, &["RL.OUTCOME", name, &ok, &errors]))
}

fn set_policy(con: &mut Connection, words: &[&str]) {
    let reply: String = query(con, &[&["RL.POLICY", "SET"][..], words].concat());
    assert_eq!(reply, "OK", "RL.POLICY SET {words:?}");
}

/// The scale and the stage `RL.POLICY GET` shows (its last four items).
fn get_scale_stage(con: &mut Connection, name: &str) -> (i64, i64) {
    let fields = pairs(&query::<Value>(con, &["RL.POLICY", "GET", name]));
    let n = fields.len();
    assert_eq!(fields[n - 2].0, "scale");
    assert_eq!(fields[n - 1].0, "stage");
    (int(&fields[n - 2].1), int(&fields[n - 1].1))
}

/// `scale=` and `stage=` of the policy's line in `INFO ratelimit`.
fn info_scale_stage(con: &mut Connection, name: &str) -> (i64, i64) {
    let info = info_via(con, "ratelimit");
    let line = info_field(&info, &format!("ratelimit_policy_{name}"))
        .unwrap_or_else(|| panic!("no INFO line for {name}: {info}"));
    let field = |f: &str| -> i64 {
        line.split(',')
            .find_map(|kv| kv.strip_prefix(&format!("{f}=")))
            .unwrap_or_else(|| panic!("{f}= in {line}"))
            .parse()
            .unwrap()
    };
    (field("scale"), field("stage"))
}

fn server_ms(con: &mut Connection) -> i64 {
    (server_time_us(con) / 1000) as i64
}

/// Ends the policy's current window: waits until the server's clock is past
/// its end, then makes the first call after it (`RL.OUTCOME name 0 0`); the
/// loop after the evaluation.
fn end_window(con: &mut Connection, name: &str) -> Stats {
    // A node that has not met the loop since it started (a restart, a
    // failover) starts its window at its first call.
    outcome(con, name, 0, 0);
    let end = stats(con, name).window_end_ms;
    poll_until(
        "the server's clock past the window's end",
        Duration::from_secs(30),
        || server_ms(con) >= end,
    );
    let after = outcome(con, name, 0, 0);
    assert!(after.window_end_ms > end, "{after:?}");
    after
}

/// In one window (well before its end): `admitted` calls on fresh keys and
/// `denied` on `hot` (a `FIXEDWINDOW 1` policy's exhausted key), in one
/// `MULTI`; checks that all of them landed in the current window.
fn calls(con: &mut Connection, name: &str, window_ms: u64, admitted: usize, denied: usize) {
    let hot = format!("{name}:hot");
    // The hot key is exhausted once, by a call the batch counts as admitted.
    let fresh = !exists(con, &hot);
    away_from_window_end(con, window_ms, window_ms / 2);
    let before = stats(con, name).current;
    let mut pipe = redis::pipe();
    pipe.atomic();
    let batch = server_time_us(con);
    let keys: Vec<String> = (0..admitted)
        .map(|i| {
            if fresh && i == 0 {
                hot.clone()
            } else {
                format!("{name}:fresh:{batch}:{i}")
            }
        })
        .collect();
    for key in &keys {
        pipe.cmd("RL.HIT").arg(name).arg(key);
    }
    for _ in 0..denied {
        pipe.cmd("RL.HIT").arg(name).arg(&hot);
    }
    let _: Vec<Value> = pipe.query(con).expect("the batch of calls");
    let after = stats(con, name).current;
    assert_eq!(
        (
            after.calls - before.calls,
            after.admitted - before.admitted,
            after.denied - before.denied
        ),
        ((admitted + denied) as i64, admitted as i64, denied as i64),
        "the batch landed in one window"
    );
}

/// `RL.OUTCOME` well before the end of the policy's `window_ms` window, so
/// that the window read next is the one holding the counts.
fn report(con: &mut Connection, name: &str, window_ms: u64, ok: u64, errors: u64) -> Stats {
    away_from_window_end(con, window_ms, window_ms / 2);
    outcome(con, name, ok, errors)
}

/// A decision's limit (its second field).
fn limit(con: &mut Connection, name: &str, key: &str) -> i64 {
    rl(con, &["RL.HIT", name, key, "COST", "0"]).limit
}

// ---------------------------------------------------------------------------
// ADAPT

#[test]
fn adapt_lowers_the_scale_above_the_error_percentage_and_recovers_below_half() {
    for_each_server(|kind| {
        let server = Server::start(kind, &[]);
        let mut con = server.conn();
        set_policy(
            &mut con,
            &[
                "ad",
                "TOKENBUCKET",
                "100",
                "100",
                LONG,
                "ADAPT",
                "ERRORS",
                "5",
                "MINCALLS",
                "20",
                "RECOVER",
                "10",
                "WINDOW",
                "300",
            ],
        );
        let s = stats(&mut con, "ad");
        assert_eq!(
            (s.scale, s.stage, s.window_ms, s.adapting),
            (100, 0, 300, 1)
        );
        assert_eq!(limit(&mut con, "ad", "k"), 100);
        // 10% errors in one window: 100 -> 80.
        let s = report(&mut con, "ad", 300, 90, 10);
        assert_eq!((s.current.ok, s.current.errors), (90, 10), "{s:?}");
        assert_eq!(s.current.error_permille, 100);
        let s = end_window(&mut con, "ad");
        assert_eq!(s.scale, 80, "{s:?}");
        assert_eq!((s.last.ok, s.last.errors), (90, 10), "{s:?}");
        assert_eq!(s.current, Window::default(), "{s:?}");
        // The limiter runs at 80% of its capacity, everywhere it shows.
        assert_eq!(limit(&mut con, "ad", "k"), 80);
        assert_eq!(get_scale_stage(&mut con, "ad"), (80, 0));
        assert_eq!(info_scale_stage(&mut con, "ad"), (80, 0));
        // Again: 80 -> 64.
        report(&mut con, "ad", 300, 80, 20);
        assert_eq!(end_window(&mut con, "ad").scale, 64);
        // Between half the percentage and the percentage (4%): no change.
        report(&mut con, "ad", 300, 96, 4);
        assert_eq!(end_window(&mut con, "ad").scale, 64);
        // An empty window changes nothing.
        assert_eq!(end_window(&mut con, "ad").scale, 64);
        // At most half (2.5% and below): RECOVER 10 a window, up to 100.
        for expected in [74, 84, 94, 100, 100] {
            report(&mut con, "ad", 300, 200, 5);
            let s = end_window(&mut con, "ad");
            assert_eq!(s.scale, expected, "{s:?}");
        }
        assert_eq!(limit(&mut con, "ad", "k"), 100);
    });
}

#[test]
fn adapt_never_goes_below_min_and_follows_factor() {
    for_each_server(|kind| {
        let server = Server::start(kind, &[]);
        let mut con = server.conn();
        set_policy(
            &mut con,
            &[
                "mn", "SLIDING", "1000", LONG, "ADAPT", "ERRORS", "10", "FACTOR", "50", "MIN",
                "30", "MINCALLS", "10", "WINDOW", "300",
            ],
        );
        for expected in [50, 30, 30] {
            report(&mut con, "mn", 300, 5, 5);
            assert_eq!(end_window(&mut con, "mn").scale, expected);
        }
        assert_eq!(limit(&mut con, "mn", "k"), 300);
    });
}

#[test]
fn a_window_with_fewer_outcomes_than_mincalls_changes_nothing() {
    for_each_server(|kind| {
        let server = Server::start(kind, &[]);
        let mut con = server.conn();
        set_policy(
            &mut con,
            &[
                "mc",
                "FIXEDWINDOW",
                "100",
                LONG,
                "ADAPT",
                "ERRORS",
                "5",
                "MINCALLS",
                "20",
                "WINDOW",
                "300",
            ],
        );
        // 19 outcomes, half of them errors: too few to judge.
        report(&mut con, "mc", 300, 10, 9);
        let s = end_window(&mut con, "mc");
        assert_eq!((s.scale, s.last.ok, s.last.errors), (100, 10, 9), "{s:?}");
        // 20 in two reports of one window: enough.
        report(&mut con, "mc", 300, 10, 5);
        outcome(&mut con, "mc", 5, 0);
        assert_eq!(end_window(&mut con, "mc").scale, 80);
    });
}

#[test]
fn scale_sets_it_by_hand_and_adapt_off_keeps_it() {
    for_each_server(|kind| {
        let server = Server::start(kind, &[]);
        let mut con = server.conn();
        set_policy(&mut con, &["sc", "TOKENBUCKET", "10", "10", LONG]);
        let ok: String = query(&mut con, &["RL.POLICY", "SCALE", "sc", "50"]);
        assert_eq!(ok, "OK");
        assert_eq!(limit(&mut con, "sc", "k"), 5);
        let s = stats(&mut con, "sc");
        assert_eq!((s.scale, s.stage, s.adapting), (50, 0, 0));
        // ADAPT OFF keeps it; a plain SET resets it.
        set_policy(
            &mut con,
            &["sc", "TOKENBUCKET", "10", "10", LONG, "ADAPT", "OFF"],
        );
        assert_eq!(get_scale_stage(&mut con, "sc"), (50, 0));
        set_policy(&mut con, &["sc", "TOKENBUCKET", "10", "10", LONG]);
        assert_eq!(get_scale_stage(&mut con, "sc"), (100, 0));
        assert_eq!(limit(&mut con, "sc", "k"), 10);
    });
}

// ---------------------------------------------------------------------------
// STAGES

#[test]
fn stages_move_up_with_the_deny_ratio_and_down_one_step_per_window() {
    for_each_server(|kind| {
        let server = Server::start(kind, &[]);
        let mut con = server.conn();
        set_policy(
            &mut con,
            &[
                "st",
                "FIXEDWINDOW",
                "1",
                LONG,
                "STAGES",
                "30",
                "50",
                "WINDOW",
                "1000",
            ],
        );
        assert_eq!(stats(&mut con, "st").adapting, 0);
        // 40% denied: stage 1.
        calls(&mut con, "st", 1000, 6, 4);
        let s = end_window(&mut con, "st");
        assert_eq!((s.stage, s.last.deny_permille), (1, 400), "{s:?}");
        assert_eq!(get_scale_stage(&mut con, "st"), (100, 1));
        assert_eq!(info_scale_stage(&mut con, "st"), (100, 1));
        // 60% denied: stage 2.
        calls(&mut con, "st", 1000, 4, 6);
        let s = end_window(&mut con, "st");
        assert_eq!((s.stage, s.last.deny_permille), (2, 600), "{s:?}");
        // Exactly 30% is not above it: one step down, then another.
        calls(&mut con, "st", 1000, 7, 3);
        let s = end_window(&mut con, "st");
        assert_eq!((s.stage, s.last.deny_permille), (1, 300), "{s:?}");
        let s = end_window(&mut con, "st");
        assert_eq!((s.stage, s.last.calls), (0, 0), "{s:?}");
        assert_eq!(end_window(&mut con, "st").stage, 0);
    });
}

/// `RL.OUTCOME ... DENIED n`: calls a kit denied without asking the server
/// (its deny cache, its local level) count as calls and denials of the
/// window, so a flood answered mostly by a deny cache still moves the
/// stage. Without DENIED the report is as before; a bad DENIED is refused
/// naming it, with nothing counted.
#[test]
fn denied_reported_by_a_kit_counts_as_calls_and_denials() {
    for_each_server(|kind| {
        let server = Server::start(kind, &[]);
        let mut con = server.conn();
        set_policy(
            &mut con,
            &[
                "dc",
                "FIXEDWINDOW",
                "1000",
                LONG,
                "STAGES",
                "30",
                "50",
                "WINDOW",
                "1000",
            ],
        );
        // The server saw 3 admitted calls; the kit denied 7 more itself.
        calls(&mut con, "dc", 1000, 3, 0);
        let before = stats(&mut con, "dc").current;
        for bad in [
            &["RL.OUTCOME", "dc", "3", "0", "DENIED"][..],
            &["RL.OUTCOME", "dc", "3", "0", "DENIED", "-1"][..],
            &["RL.OUTCOME", "dc", "3", "0", "DENIED", "1099511627777"][..],
            &["RL.OUTCOME", "dc", "3", "0", "DENY", "7"][..],
            &["RL.OUTCOME", "dc", "3", "0", "DENIED", "7", "x"][..],
        ] {
            let err = query_err(&mut con, bad);
            assert!(
                err.contains("DENIED") || err.contains("wrong number of arguments"),
                "{kind:?}: {bad:?}: {err}"
            );
        }
        assert_eq!(stats(&mut con, "dc").current, before, "nothing counted");
        let s = parse_stats(&query::<Value>(
            &mut con,
            &["RL.OUTCOME", "dc", "3", "0", "DENIED", "7"],
        ));
        assert_eq!(
            (
                s.current.calls,
                s.current.admitted,
                s.current.denied,
                s.current.ok
            ),
            (10, 3, 7, 3),
            "{kind:?}: {s:?}"
        );
        assert_eq!(s.current.deny_permille, 700);
        // 70% denied: stage 2 at the window's end.
        let s = end_window(&mut con, "dc");
        assert_eq!((s.stage, s.last.calls, s.last.denied), (2, 10, 7), "{s:?}");
    });
}

/// `RL.POLICY GET` and INFO's line show the scale and stage as `STATS`
/// does: windows that ended without a call are shown ended (the stage one
/// step lower each), not the state as of the last call.
#[test]
fn get_and_info_show_the_stage_as_stats_does_after_idle_windows() {
    for_each_server(|kind| {
        let server = Server::start(kind, &[]);
        let mut con = server.conn();
        set_policy(
            &mut con,
            &[
                "idle",
                "FIXEDWINDOW",
                "1",
                LONG,
                "STAGES",
                "30",
                "50",
                "WINDOW",
                "500",
            ],
        );
        calls(&mut con, "idle", 500, 1, 9);
        let s = end_window(&mut con, "idle");
        assert_eq!(s.stage, 2, "{s:?}");
        // No call from here on: STATS, GET and INFO agree on every read, and
        // all of them reach stage 0 once two windows have ended.
        poll_until("stage 0 everywhere", Duration::from_secs(30), || {
            let stats_stage = stats(&mut con, "idle").stage;
            let (_, get_stage) = get_scale_stage(&mut con, "idle");
            let (_, info_stage) = info_scale_stage(&mut con, "idle");
            // A window may end between two reads: never more than a step.
            assert!(
                (stats_stage - get_stage).abs() <= 1 && (get_stage - info_stage).abs() <= 1,
                "{kind:?}: STATS {stats_stage}, GET {get_stage}, INFO {info_stage}"
            );
            stats_stage == 0 && get_stage == 0 && info_stage == 0
        });
    });
}

#[test]
fn shadow_denials_count_in_the_deny_ratio() {
    for_each_server(|kind| {
        let server = Server::start(kind, &[]);
        let mut con = server.conn();
        set_policy(
            &mut con,
            &[
                "sh",
                "FIXEDWINDOW",
                "1",
                LONG,
                "MODE",
                "SHADOW",
                "STAGES",
                "30",
                "50",
                "WINDOW",
                "1000",
            ],
        );
        // Every call answers allowed, but the window counts the denials.
        calls(&mut con, "sh", 1000, 4, 6);
        assert!(hit_allowed(&mut con, "sh", "sh:hot"));
        let s = end_window(&mut con, "sh");
        assert_eq!((s.stage, s.last.denied), (2, 7), "{s:?}");
    });
}

fn hit_allowed(con: &mut Connection, name: &str, key: &str) -> bool {
    rl(con, &["RL.HIT", name, key]).allowed
}

// ---------------------------------------------------------------------------
// Node state: replica, failover, restarts

/// Brings `ad` (ADAPT) to scale 80 and `st` (STAGES) to stage 2.
fn degrade(con: &mut Connection) {
    set_policy(
        con,
        &[
            "ad",
            "TOKENBUCKET",
            "100",
            "100",
            LONG,
            "ADAPT",
            "ERRORS",
            "5",
            "MINCALLS",
            "20",
            "WINDOW",
            "300",
        ],
    );
    set_policy(
        con,
        &[
            "st",
            "FIXEDWINDOW",
            "1",
            LONG,
            "STAGES",
            "30",
            "50",
            "WINDOW",
            "1000",
        ],
    );
    report(con, "ad", 300, 90, 10);
    assert_eq!(end_window(con, "ad").scale, 80);
    calls(con, "st", 1000, 4, 6);
    assert_eq!(end_window(con, "st").stage, 2);
}

fn assert_degraded(con: &mut Connection, when: &str) {
    assert_eq!(get_scale_stage(con, "ad"), (80, 0), "{when}: ad");
    assert_eq!(get_scale_stage(con, "st"), (100, 2), "{when}: st");
    let (ad, st) = (stats(con, "ad"), stats(con, "st"));
    assert_eq!((ad.scale, ad.stage), (80, 0), "{when}: {ad:?}");
    assert_eq!((st.scale, st.stage), (100, 2), "{when}: {st:?}");
}

#[test]
fn a_replica_shows_the_master_s_scale_and_stage_and_keeps_them_when_promoted() {
    for_each_server(|kind| {
        let master = Server::start(kind, &[]);
        let replica = replica_of(&master);
        let mut con = master.conn();
        degrade(&mut con);
        wait_for_sync(&master, &replica);
        let mut rcon = replica.conn();
        assert_degraded(&mut rcon, "on the replica");
        assert_eq!(info_scale_stage(&mut rcon, "ad"), (80, 0));
        // A window's counts are the master's: the replica has none.
        assert_eq!(stats(&mut rcon, "st").current, Window::default());
        // The master recovers one step: the replica follows.
        let s = end_window(&mut con, "st");
        assert_eq!(s.stage, 1);
        wait_for_sync(&master, &replica);
        assert_eq!(get_scale_stage(&mut rcon, "st"), (100, 1));
        // Failover: the promoted replica keeps them and starts a fresh
        // window of its own.
        let _: () = query(&mut rcon, &["REPLICAOF", "NO", "ONE"]);
        drop(master);
        assert_eq!(get_scale_stage(&mut rcon, "ad"), (80, 0));
        assert_eq!(get_scale_stage(&mut rcon, "st"), (100, 1));
        assert_eq!(limit(&mut rcon, "ad", "k"), 80);
        let now = server_ms(&mut rcon);
        let s = stats(&mut rcon, "st");
        assert_eq!(s.current, Window::default(), "{s:?}");
        assert!(
            s.window_end_ms > now && s.window_end_ms <= now + 1000,
            "{s:?} at {now}"
        );
        // The loop goes on there: errors lower the scale further, an
        // empty window lowers the stage.
        report(&mut rcon, "ad", 300, 90, 10);
        assert_eq!(end_window(&mut rcon, "ad").scale, 64);
        assert_eq!(end_window(&mut rcon, "st").stage, 0);
    });
}

#[test]
fn scale_and_stage_survive_an_rdb_restart() {
    for_each_server(|kind| {
        let mut server = Server::start(kind, &[]);
        let mut con = server.conn();
        degrade(&mut con);
        save(&mut con);
        server.restart();
        let mut con = server.conn();
        assert_degraded(&mut con, "after an RDB restart");
        assert_eq!(limit(&mut con, "ad", "k"), 80);
        // The loop goes on from there.
        assert_eq!(end_window(&mut con, "st").stage, 1);
    });
}

#[test]
fn scale_and_stage_survive_an_aof_restart_with_and_without_the_rdb_preamble() {
    for_each_server(|kind| {
        for preamble in ["yes", "no"] {
            let mut server = Server::start(
                kind,
                &["--appendonly", "yes", "--aof-use-rdb-preamble", preamble],
            );
            let mut con = server.conn();
            degrade(&mut con);
            let ok: String = query(&mut con, &["RL.POLICY", "SCALE", "st", "70"]);
            assert_eq!(ok, "OK");
            // Replayed: RL.POLICY SET, RL.LOOPSTATE and RL.POLICY SCALE.
            server.restart();
            let mut con = server.conn();
            let when = format!("preamble {preamble}: after an AOF restart");
            assert_eq!(get_scale_stage(&mut con, "ad"), (80, 0), "{when}");
            assert_eq!(get_scale_stage(&mut con, "st"), (70, 2), "{when}");
            let _: Value = query(&mut con, &["BGREWRITEAOF"]);
            super::policies::wait_for_rewrite(&server, 2);
            server.restart();
            let mut con = server.conn();
            if preamble == "yes" {
                // The rewrite's base is an RDB: the policies' aux data.
                let when = "after a rewrite with the preamble and a restart";
                assert_eq!(get_scale_stage(&mut con, "ad"), (80, 0), "{when}");
                assert_eq!(get_scale_stage(&mut con, "st"), (70, 2), "{when}");
            } else {
                // The known limitation (docs/operations.md): a rewrite
                // without the preamble has no policy lines, so the policies
                // set before it are gone (and nothing fails on the way).
                let names: Vec<String> = query(&mut con, &["RL.POLICY", "LIST"]);
                assert!(names.is_empty(), "{names:?}");
                // Set again after the rewrite, their lines and the loop's
                // (RL.LOOPSTATE after each RL.POLICY SET) are in the new
                // incremental file and bring scale and stage back.
                degrade(&mut con);
                server.restart();
                let mut con = server.conn();
                assert_degraded(&mut con, "set again after a rewrite without the preamble");
            }
        }
    });
}

// ---------------------------------------------------------------------------
// Bad input

/// Writes the server counts: a refused call must not move it.
fn changes(con: &mut Connection) -> u64 {
    info_field(&info_via(con, "persistence"), "rdb_changes_since_last_save")
        .and_then(|v| v.parse().ok())
        .expect("rdb_changes_since_last_save")
}

#[test]
fn every_bad_argument_is_refused_naming_it_with_nothing_written() {
    for_each_server(|kind| {
        let server = Server::start(kind, &[]);
        let mut con = server.conn();
        set_policy(
            &mut con,
            &[
                "p",
                "TOKENBUCKET",
                "10",
                "10",
                "1000",
                "ADAPT",
                "ERRORS",
                "5",
                "STAGES",
                "30",
                "50",
                "WINDOW",
                "5000",
            ],
        );
        let get_before: Value = query(&mut con, &["RL.POLICY", "GET", "p"]);
        let stats_before = stats(&mut con, "p");
        let writes = changes(&mut con);
        let set = |words: &[&'static str]| -> Vec<&'static str> {
            [
                &["RL.POLICY", "SET", "p", "TOKENBUCKET", "10", "10", "1000"][..],
                words,
            ]
            .concat()
        };
        let cases: Vec<(Vec<&str>, &str)> = vec![
            (
                set(&["ADAPT", "ERRORS", "101"]),
                "ERR ERRORS must be an integer from 0 to 100",
            ),
            (
                set(&["ADAPT", "ERRORS", "-1"]),
                "ERR ERRORS must be an integer from 0 to 100",
            ),
            (
                set(&["ADAPT", "ERRORS", "5", "MIN", "0"]),
                "ERR MIN must be an integer from 1 to 100",
            ),
            (
                set(&["ADAPT", "ERRORS", "5", "MIN", "101"]),
                "ERR MIN must be an integer from 1 to 100",
            ),
            (
                set(&["ADAPT", "ERRORS", "5", "FACTOR", "0"]),
                "ERR FACTOR must be an integer from 1 to 100",
            ),
            (
                set(&["ADAPT", "ERRORS", "5", "RECOVER", "101"]),
                "ERR RECOVER must be an integer from 0 to 100",
            ),
            (
                set(&["ADAPT", "ERRORS", "5", "MINCALLS", "-5"]),
                "ERR MINCALLS must be an integer from 0 to 1099511627776",
            ),
            (
                set(&["WINDOW", "0"]),
                "ERR WINDOW must be an integer from 1 to 86400000",
            ),
            (
                set(&["ADAPT", "ERRORS", "5", "WINDOW", "0"]),
                "ERR WINDOW must be an integer from 1 to 86400000",
            ),
            (
                set(&["STAGES", "50", "30"]),
                "ERR break_pct must be an integer from 50 to 100",
            ),
            (
                set(&["STAGES", "101", "101"]),
                "ERR degrade_pct must be an integer from 0 to 100",
            ),
            (set(&["STAGES", "30"]), "ERR STAGES needs a value"),
            (
                set(&["ADAPT", "SOMETIMES"]),
                "ERR ADAPT must be followed by ERRORS <pct> or OFF, got 'SOMETIMES'",
            ),
            (
                vec!["RL.POLICY", "SCALE", "p", "0"],
                "ERR pct must be an integer from 1 to 100",
            ),
            (
                vec!["RL.POLICY", "SCALE", "p", "101"],
                "ERR pct must be an integer from 1 to 100",
            ),
            (
                vec!["RL.POLICY", "SCALE", "nope", "50"],
                "ERR unknown policy 'nope'",
            ),
            (
                vec!["RL.POLICY", "STATS", "nope"],
                "ERR unknown policy 'nope'",
            ),
            (
                vec!["RL.OUTCOME", "nope", "1", "1"],
                "ERR unknown policy 'nope'",
            ),
            (
                vec!["RL.OUTCOME", "p", "-1", "0"],
                "ERR ok must be an integer from 0 to 1099511627776",
            ),
            (
                vec!["RL.OUTCOME", "p", "0", "-1"],
                "ERR errors must be an integer from 0 to 1099511627776",
            ),
            (
                vec!["RL.OUTCOME", "p", "x", "0"],
                "ERR ok must be an integer from 0 to 1099511627776",
            ),
            (
                vec!["RL.LOOPSTATE", "p", "50", "1"],
                "ERR RL.LOOPSTATE is reserved for replication and AOF loading",
            ),
        ];
        for (words, expected) in &cases {
            let err = query_err(&mut con, words);
            assert!(
                err.starts_with(expected),
                "{words:?}: got {err:?}, expected {expected:?}"
            );
        }
        for arity in [
            &["RL.OUTCOME", "p", "1"][..],
            &["RL.OUTCOME", "p", "1", "1", "1"],
            &["RL.POLICY", "SCALE", "p"],
        ] {
            let err = query_err(&mut con, arity);
            assert!(
                err.contains("wrong number of arguments"),
                "{arity:?}: {err}"
            );
        }
        assert_eq!(changes(&mut con), writes, "a refused call wrote");
        let get_after: Value = query(&mut con, &["RL.POLICY", "GET", "p"]);
        assert_eq!(get_after, get_before);
        let stats_after = stats(&mut con, "p");
        assert_eq!(
            (stats_after.scale, stats_after.stage, stats_after.current),
            (stats_before.scale, stats_before.stage, stats_before.current)
        );
        assert_eq!(dbsize(&mut con), 0);
    });
}

/// Failed before: a master demoted to a replica kept its windows (a replica
/// never advances them), so when it was promoted again its first call
/// evaluated the counts of a window that ended before the failover: here
/// errors the new master had already been told of lowered the scale a
/// second time. A node that changes role starts a fresh window, keeping its
/// scale and stage.
#[test]
fn a_master_demoted_and_promoted_again_starts_a_fresh_window() {
    for_each_server(|kind| {
        let old = Server::start(kind, &[]);
        let new = replica_of(&old);
        let mut con = old.conn();
        set_policy(
            &mut con,
            &[
                "ad",
                "TOKENBUCKET",
                "100",
                "100",
                LONG,
                "ADAPT",
                "ERRORS",
                "5",
                "MINCALLS",
                "20",
                "WINDOW",
                "1000",
            ],
        );
        // Counts in the old master's window, not yet evaluated.
        let s = report(&mut con, "ad", 1000, 90, 10);
        assert_eq!((s.scale, s.current.errors), (100, 10), "{s:?}");
        let end = s.window_end_ms;
        wait_for_sync(&old, &new);
        // Failover: the replica takes over, the old master follows it.
        let mut ncon = new.conn();
        let _: () = query(&mut ncon, &["REPLICAOF", "NO", "ONE"]);
        let _: () = query(&mut con, &["REPLICAOF", "127.0.0.1", &new.port.to_string()]);
        poll_until(
            "the old master follows the new one",
            Duration::from_secs(30),
            || {
                let info = info_via(&mut con, "replication");
                info_field(&info, "master_link_status").as_deref() == Some("up")
                    && info_field(&info, "master_sync_in_progress").as_deref() == Some("0")
            },
        );
        assert_eq!(get_scale_stage(&mut con, "ad"), (100, 0));
        // Long after that window, the old master is promoted again.
        poll_until("the window's end", Duration::from_secs(30), || {
            server_ms(&mut con) >= end
        });
        let _: () = query(&mut con, &["REPLICAOF", "NO", "ONE"]);
        let s = outcome(&mut con, "ad", 0, 0);
        assert_eq!(
            s.scale, 100,
            "a window from before the failover was evaluated: {s:?}"
        );
        assert_eq!(s.current, Window::default(), "{s:?}");
    });
}

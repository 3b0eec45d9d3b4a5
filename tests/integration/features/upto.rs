//! `UPTO n` against real servers, on every limiter command that takes it
//! (the table in `harness/contract.rs`) and through `RL.HIT` and `RL.ALL`:
//! it takes all that fits (at most n) or nothing, its reply adds `granted`,
//! its denial is the one `COST 1` gets, replicas end byte-identical (it goes
//! out as `COST granted`), an AOF restart rebuilds the same state, `INFO`
//! counts it, and its errors name `UPTO` and write nothing.

use crate::harness::contract::*;
use crate::harness::*;

/// Whether `alg` grants part of a request (`UPTO`): not a shaping queue,
/// not leases.
fn grants(alg: &Algorithm) -> bool {
    !alg.shapes && !alg.lease
}

fn ints(con: &mut Connection, words: &[&str]) -> Vec<i64> {
    query(con, words)
}

/// `alg` under slow parameters with `limit`, then `options`.
fn call<'a>(alg: &'a Algorithm, key: &'a str, limit: &'a str, options: &[&'a str]) -> Vec<&'a str> {
    let mut args = alg.slow_params(limit);
    args.extend_from_slice(options);
    alg.words(key, &args)
}

#[test]
fn upto_takes_all_that_fits_or_nothing() {
    for_each_algorithm_on_each_server(|alg, con| {
        let key = alg.key;
        if !grants(alg) {
            let err = query_err(con, &call(alg, key, "10", &["UPTO", "2"]));
            assert_eq!(err, format!("ERR UPTO is not an option of {}", alg.command));
            assert!(!exists(con, key), "{alg}: an error wrote the key");
            return;
        }
        alg.away_from_window_end(con, &alg.valid());
        // All of it, when it fits: six fields, the sixth the units taken.
        let all = ints(con, &call(alg, key, "10", &["UPTO", "4"]));
        assert_eq!(
            (all.len(), all[0], all[2], all[5]),
            (6, 1, 6, 4),
            "{alg}: {all:?}"
        );
        // Part of it: what is left.
        let part = ints(con, &call(alg, key, "10", &["UPTO", "9"]));
        assert_eq!((part[0], part[2], part[5]), (1, 0, 6), "{alg}: {part:?}");
        // Nothing left: the denial of COST 1, granted 0, nothing written.
        let state = dump(con, key);
        let none = ints(con, &call(alg, key, "10", &["UPTO", "9"]));
        let one = ints(con, &call(alg, key, "10", &["COST", "1"]));
        assert_eq!(
            (none[0], none[1], none[2], none[5]),
            (0, 10, 0, 0),
            "{alg}: {none:?}"
        );
        assert_eq!(
            (none[0], none[1], none[2]),
            (one[0], one[1], one[2]),
            "{alg}"
        );
        assert!(
            none[3] > 0 && none[3] - one[3] <= SLACK_MS,
            "{alg}: {none:?} vs {one:?}"
        );
        assert_eq!(
            dump(con, key),
            state,
            "{alg}: a denied UPTO changed the key"
        );
        // The units it took are consumed: a peek shows none.
        let peek = alg.slow(con, key, "10", "0");
        assert_eq!(peek.remaining, 0, "{alg}");
    });
}

#[test]
fn upto_errors_name_upto_and_write_nothing() {
    for_each_algorithm_on_each_server(|alg, con| {
        if !grants(alg) {
            return;
        }
        let key = alg.key;
        for (options, message) in [
            (
                &["UPTO", "0"][..],
                "ERR UPTO must be an integer from 1 to 1099511627776",
            ),
            (
                &["UPTO", "1099511627777"][..],
                "ERR UPTO must be an integer from 1 to 1099511627776",
            ),
            (
                &["UPTO", "-1"][..],
                "ERR UPTO must be an integer from 1 to 1099511627776",
            ),
            (
                &["UPTO", "x"][..],
                "ERR UPTO must be an integer from 1 to 1099511627776",
            ),
            (&["UPTO"][..], "ERR UPTO needs a value"),
            (
                &["UPTO", "2", "UPTO", "2"][..],
                "ERR UPTO given more than once",
            ),
            (
                &["UPTO", "2", "COST", "1"][..],
                "ERR UPTO cannot be given with COST",
            ),
            (
                &["COST", "1", "FORCE", "UPTO", "2"][..],
                "ERR UPTO cannot be given with COST",
            ),
            (
                &["FORCE", "UPTO", "2"][..],
                "ERR UPTO cannot be given with FORCE",
            ),
            (
                &["UPTO", "2", "REFUND", "1"][..],
                "ERR UPTO cannot be given with REFUND",
            ),
        ] {
            let err = query_err(con, &call(alg, key, "10", options));
            assert_eq!(err, message, "{alg} {options:?}");
        }
        assert_eq!(dbsize(con), 0, "{alg}: an error wrote a key");
    });
}

#[test]
fn rl_hit_and_rl_all_take_what_every_limiter_admits_at_once() {
    for_each_server(|kind| {
        let server = Server::start(kind, &[]);
        let mut con = server.conn();
        let _: String = query(
            &mut con,
            &[
                "RL.POLICY",
                "SET",
                "up-tb",
                "TOKENBUCKET",
                "10",
                "1",
                "1000000",
            ],
        );
        let _: String = query(
            &mut con,
            &[
                "RL.POLICY",
                "SET",
                "up-lb",
                "LEAKYBUCKET",
                "10",
                "1",
                "1000",
            ],
        );
        let r = ints(&mut con, &["RL.HIT", "up-tb", "h", "UPTO", "4"]);
        assert_eq!((r.len(), r[0], r[2], r[5]), (6, 1, 6, 4), "{r:?}");
        assert_eq!(
            query_err(&mut con, &["RL.HIT", "up-lb", "h2", "UPTO", "4"]),
            "ERR UPTO is not an option of RL.HIT on a LEAKYBUCKET policy"
        );
        // The sliding log has 2 left, the bucket 6: both take 2.
        rl(&mut con, &["RL.SLIDING", "s", "10", "1000000", "COST", "8"]);
        let all = [
            "RL.ALL", "2", "s", "h", "SLIDING", "10", "1000000", "POLICY", "up-tb", "UPTO", "5",
        ];
        let r = ints(&mut con, &all);
        assert_eq!((r.len(), r[0], r[2], r[5], r[6]), (7, 1, 0, 0, 2), "{r:?}");
        let peek = ints(&mut con, &["RL.HIT", "up-tb", "h", "COST", "0"]);
        assert_eq!(peek[2], 4, "the bucket gave 2 more");
        // The log is empty now: denied by it, nothing taken anywhere.
        let r = ints(&mut con, &all);
        assert_eq!((r[0], r[5], r[6]), (0, 1, 0), "{r:?}");
        let peek = ints(&mut con, &["RL.HIT", "up-tb", "h", "COST", "0"]);
        assert_eq!(peek[2], 4, "a denied RL.ALL took nothing");
        let info = server.info("ratelimit");
        let count = |f: &str| info_field(&info, f).and_then(|v| v.parse::<u64>().ok());
        assert_eq!(count("ratelimit_upto_calls"), Some(3));
        assert_eq!(count("ratelimit_upto_granted_units"), Some(6));
        assert_eq!(count("ratelimit_upto_partial"), Some(1));
    });
}

#[test]
fn upto_reaches_replicas_and_the_aof_as_the_admission_it_was() {
    for_each_server(|kind| {
        let mut master = Server::start(kind, &["--appendonly", "yes"]);
        let replica = replica_of(&master);
        let mut m = master.conn();
        let mut keys = Vec::new();
        for alg in ALGORITHMS.iter().filter(|a| grants(a)) {
            alg.away_from_window_end(&mut m, &alg.valid());
            let mut random = Xorshift64(0x0b70_0000 + alg.index() as u64);
            for i in 0..300 {
                let key = format!("{}:upto:{}", alg.key, i % 4);
                let most = (1 + random.next() % 7).to_string();
                let cost = (random.next() % 3).to_string();
                let options: &[&str] = match i % 3 {
                    0 => &["COST", &cost],
                    _ => &["UPTO", &most],
                };
                let r = ints(&mut m, &call(alg, &key, "40", options));
                assert!(r.len() == 5 || r.len() == 6, "{alg}: {r:?}");
                if !keys.contains(&key) {
                    keys.push(key);
                }
            }
        }
        wait_for_sync(&master, &replica);
        let mut r = replica.conn();
        let before: Vec<_> = keys.iter().map(|k| dump(&mut m, k)).collect();
        for (key, dumped) in keys.iter().zip(&before) {
            assert!(dumped.is_some(), "{key} exists");
            assert_eq!(&dump(&mut r, key), dumped, "{key}: the replica differs");
        }
        // The AOF replays to the very same states.
        master.restart();
        let mut m = master.conn();
        for (key, dumped) in keys.iter().zip(&before) {
            assert_eq!(&dump(&mut m, key), dumped, "{key}: the AOF replay differs");
        }
    });
}

#[test]
fn rl_all_upto_behind_a_queue_waits_for_one_unit_as_a_single_key_does() {
    for_each_server(|kind| {
        let server = Server::start(kind, &[]);
        let mut con = server.conn();
        // Ten tokens, one back every second: 3 left, and a waiter for 5
        // ahead of any new call (it is admitted in about 2 s).
        let bucket = ["RL.TOKENBUCKET", "uq", "10", "1", "1000"];
        let mut take = bucket.to_vec();
        take.extend(["COST", "7"]);
        assert!(rl(&mut con, &take).allowed);
        let mut waiting = bucket.to_vec();
        waiting.extend(["COST", "5", "BLOCK", "60000"]);
        let mut waiter_con = server.conn();
        let waiter = std::thread::spawn(move || -> Vec<i64> { query(&mut waiter_con, &waiting) });
        poll_until(
            "one blocked request",
            std::time::Duration::from_secs(20),
            || {
                info_field(&server.info("ratelimit"), "ratelimit_blocked_now").as_deref()
                    == Some("1")
            },
        );
        // Behind the queue, UPTO is the denial of one unit: about 2 s for
        // the waiter, then 1 s for its own unit.
        let mut single = bucket.to_vec();
        single.extend(["UPTO", "3"]);
        let one = ints(&mut con, &single);
        let all = ints(
            &mut con,
            &[
                "RL.ALL",
                "1",
                "uq",
                "TOKENBUCKET",
                "10",
                "1",
                "1000",
                "UPTO",
                "3",
            ],
        );
        assert_eq!((one[0], one[5]), (0, 0), "{one:?}");
        assert_eq!((all[0], all[5], all[6]), (0, 1, 0), "{all:?}");
        assert!(
            all[3] <= one[3] + 500,
            "RL.ALL's wait {} is not the wait for one unit {}",
            all[3],
            one[3]
        );
        // The deny log holds the denial of one unit, as COST 1's.
        let log: Vec<(i64, i64, String, String, i64, i64)> =
            query(&mut con, &["RL.LOG", "GET", "2"]);
        let logged: Vec<(&str, i64)> = log.iter().map(|e| (e.3.as_str(), e.4)).collect();
        assert_eq!(
            logged,
            [("RL.ALL TOKENBUCKET", 1), ("RL.TOKENBUCKET", 1)],
            "{log:?}"
        );
        let _: i64 = query(&mut con, &["DEL", "uq"]);
        let admitted = waiter.join().expect("the waiter");
        assert_eq!(admitted[0], 1, "{admitted:?}");
    });
}

#[test]
fn a_call_behind_a_blocked_upto_counts_what_the_upto_will_take() {
    for_each_server(|kind| {
        let server = Server::start(kind, &[]);
        let mut con = server.conn();
        // A window of 5 per 3 s, drained early in a window; a waiter for up
        // to 5 will take all 5 of the next window the moment it opens.
        let window = ["RL.FIXEDWINDOW", "uw", "5", "3000"];
        let mut peek = window.to_vec();
        peek.extend(["COST", "0"]);
        // (A window's reset_ms is the time to its end once it holds units.)
        let clock = ["RL.FIXEDWINDOW", "uw-clock", "1000000", "3000"];
        poll_until(
            "the start of a window",
            std::time::Duration::from_secs(20),
            || ints(&mut con, &clock)[4] >= 1500,
        );
        let mut take = window.to_vec();
        take.extend(["COST", "5"]);
        assert!(rl(&mut con, &take).allowed);
        let mut waiting = window.to_vec();
        waiting.extend(["UPTO", "5", "BLOCK", "20000"]);
        let mut waiter_con = server.conn();
        let waiter = std::thread::spawn(move || -> Vec<i64> { query(&mut waiter_con, &waiting) });
        poll_until(
            "one blocked request",
            std::time::Duration::from_secs(20),
            || {
                info_field(&server.info("ratelimit"), "ratelimit_blocked_now").as_deref()
                    == Some("1")
            },
        );
        let to_next = ints(&mut con, &peek)[4];
        // One unit behind it: not in the next window, which the waiter
        // empties, but in the one after.
        let behind = ints(&mut con, &window);
        assert_eq!(behind[0], 0, "{behind:?}");
        assert!(
            behind[3] > to_next + 1000,
            "wait {} counts the waiter as one unit (the window opens in {to_next} ms)",
            behind[3]
        );
        // The waiter goes in when the window opens, with all of it.
        let admitted = waiter.join().expect("the waiter");
        assert_eq!((admitted[0], admitted[5]), (1, 5), "{admitted:?}");
    });
}

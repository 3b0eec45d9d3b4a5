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

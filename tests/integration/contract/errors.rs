//! Bad input, for every limiter command: each refusal is an error reply that
//! names what is wrong, and writes nothing (the key stays absent or
//! untouched, `DBSIZE` unchanged). The algorithms are described in
//! `harness/contract.rs`; a refusal only one of them has is in its `refusals`,
//! and a parameter that is a word (a quota's period) is refused as a word.
//!
//! One server per server kind serves every algorithm in turn.

use crate::harness::contract::*;
use crate::harness::*;

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

/// Values `COST` does not accept.
const NOT_A_COST: &[&str] = &[
    "-1",
    "1099511627777",
    "x",
    "1.0",
    "",
    "18446744073709551616",
];

fn assert_err_naming(err: &str, name: &str, words: &[&str]) {
    assert!(
        err.starts_with("ERR") && err.contains(name),
        "{words:?}: expected an ERR naming {name}, got: {err}"
    );
}

#[test]
fn bad_parameters_are_named_and_write_nothing() {
    for_each_algorithm_on_each_server(|alg, con| {
        let valid = alg.valid();
        for (position, param) in alg.params.iter().enumerate() {
            let with = |value: &str| -> Vec<String> {
                let mut params: Vec<&str> = valid.clone();
                params[position] = value;
                alg.words(alg.key, &params)
                    .iter()
                    .map(|w| w.to_string())
                    .collect()
            };
            match *param {
                Param::Integer(name, max) => {
                    let out_of_range = (max + 1).to_string();
                    for bad in NOT_A_PARAMETER.iter().chain([&out_of_range.as_str()]) {
                        let words = with(bad);
                        let words: Vec<&str> = words.iter().map(String::as_str).collect();
                        let err = query_err(con, &words);
                        assert_err_naming(&err, name, &words);
                        if *bad == "0" || *bad == out_of_range {
                            assert_eq!(
                                err,
                                format!("ERR {name} must be an integer from 1 to {max}"),
                                "{words:?}"
                            );
                        }
                    }
                }
                Param::Word(name, accepted) => {
                    // Anything but one of the words (in any case) or its
                    // index among them.
                    let past = accepted.len().to_string();
                    let is_index = |v: &&&str| v.parse::<usize>().is_ok_and(|i| i < accepted.len());
                    let refused = NOT_A_PARAMETER.iter().filter(|v| !is_index(v));
                    for bad in refused.chain([&past.as_str(), &"FORTNIGHT", &"DAYS"]) {
                        let words = with(bad);
                        let words: Vec<&str> = words.iter().map(String::as_str).collect();
                        assert_eq!(
                            query_err(con, &words),
                            format!(
                                "ERR {name} must be one of {}, not '{bad}'",
                                accepted.join(", ")
                            ),
                            "{words:?}"
                        );
                    }
                    for (i, word) in accepted.iter().enumerate() {
                        for good in [word.to_string(), word.to_lowercase(), i.to_string()] {
                            let mut args = with(&good).split_off(2);
                            args.extend(["COST".to_string(), "0".to_string()]);
                            let args: Vec<&str> = args.iter().map(String::as_str).collect();
                            let r = alg.call(con, alg.key, &args);
                            assert!(r.allowed, "{alg} {args:?}: {r:?}");
                        }
                    }
                }
            }
        }
        for (args, expected) in alg.refusals {
            let words = alg.words(alg.key, args);
            assert_eq!(query_err(con, &words), *expected, "{words:?}");
        }
        assert_eq!(dbsize(con), 0, "{alg}: an error wrote a key");
    });
}

#[test]
fn bad_cost_is_named_and_writes_nothing() {
    for_each_algorithm_on_each_server(|alg, con| {
        for bad in NOT_A_COST {
            let mut args = alg.valid();
            args.extend(["COST", bad]);
            let words = alg.words(alg.key, &args);
            let err = query_err(con, &words);
            assert_err_naming(&err, "COST", &words);
        }
        assert_eq!(dbsize(con), 0, "{alg}: an error wrote a key");
    });
}

#[test]
fn largest_cost_is_accepted() {
    for_each_algorithm_on_each_server(|alg, con| {
        let r = alg.slow(con, alg.key, "5", MAX);
        assert_eq!((r.allowed, r.wait_ms), (false, -1), "{alg}: {r:?}");
        assert_eq!(dbsize(con), 0, "{alg}");
    });
}

#[test]
fn unknown_option_is_named_and_writes_nothing() {
    for_each_algorithm_on_each_server(|alg, con| {
        // Options other commands or other limiters might have.
        for option in ["FOO", "COSTS", "EX", "BURST", "WINDOW", "BUCKETS"] {
            for options in [&[option, "1"][..], &["COST", "1", option, "1"]] {
                let mut args = alg.valid();
                args.extend_from_slice(options);
                let words = alg.words(alg.key, &args);
                assert_eq!(
                    query_err(con, &words),
                    format!(
                        "ERR unknown option '{option}' (expected COST, FORCE, REFUND, UPTO or BLOCK)"
                    ),
                    "{words:?}"
                );
            }
        }
        assert_eq!(dbsize(con), 0, "{alg}: an error wrote a key");
    });
}

#[test]
fn option_without_value_or_given_twice_is_named() {
    for_each_algorithm_on_each_server(|alg, con| {
        for (options, expected) in [
            (&["COST"][..], "ERR COST needs a value"),
            (&["COST", "1", "COST"], "ERR COST needs a value"),
            (&["COST", "1", "COST", "1"], "ERR COST given more than once"),
            (&["COST", "1", "cost", "1"], "ERR COST given more than once"),
        ] {
            let mut args = alg.valid();
            args.extend_from_slice(options);
            let words = alg.words(alg.key, &args);
            assert_eq!(query_err(con, &words), expected, "{words:?}");
        }
        assert_eq!(dbsize(con), 0, "{alg}: an error wrote a key");
    });
}

#[test]
fn command_and_option_names_are_case_insensitive() {
    for_each_algorithm_on_each_server(|alg, con| {
        let lower = alg.command.to_lowercase();
        for (command, cost) in [(alg.command, "cost"), (lower.as_str(), "Cost")] {
            let mut words = vec![command, alg.key];
            words.extend(alg.valid());
            words.extend([cost, "2"]);
            let r = alg.reply(&query::<Vec<i64>>(con, &words));
            assert_eq!((r.allowed, r.remaining), (true, 3), "{words:?}: {r:?}");
            let _: i64 = query(con, &["DEL", alg.key]);
        }
    });
}

#[test]
fn wrong_argument_count_is_the_usual_arity_error() {
    for_each_algorithm_on_each_server(|alg, con| {
        let valid = alg.valid();
        let mut words = vec![alg.command];
        let mut too_few = vec![words.clone()];
        words.push(alg.key);
        for param in &valid {
            too_few.push(words.clone());
            words.push(param);
        }
        for words in too_few {
            let err = query_err(con, &words);
            assert!(
                err.starts_with("ERR") && err.contains("wrong number of arguments"),
                "{words:?}: {err}"
            );
        }
        assert_eq!(dbsize(con), 0, "{alg}: an error wrote a key");
    });
}

#[test]
fn errors_leave_an_existing_limiter_untouched() {
    for_each_algorithm_on_each_server(|alg, con| {
        let key = alg.key;
        alg.slow(con, key, "5", "2");
        let (state, ttl) = (dump(con, key), pttl(con, key));
        let valid = alg.valid();
        let with = |options: &[&'static str]| {
            let mut args = valid.clone();
            args.extend_from_slice(options);
            args
        };
        let mut calls: Vec<Vec<&str>> = vec![
            with(&["COST", "-1"]),
            with(&["COST", "x"]),
            with(&["FOO", "1"]),
            with(&["COST", "1", "COST"]),
            with(&["AT", "1"]),
        ];
        for (position, param) in alg.params.iter().enumerate() {
            let mut params = valid.clone();
            params[position] = param.refused();
            calls.push(params);
        }
        calls.extend(alg.refusals.iter().map(|(args, _)| args.to_vec()));
        for args in calls {
            alg.call_err(con, key, &args);
        }
        assert_eq!(dump(con, key), state, "{alg}: an error changed the state");
        assert!(pttl(con, key) <= ttl, "{alg}: an error extended the TTL");
        assert_eq!(dbsize(con), 1, "{alg}: an error wrote a key");
    });
}

#[test]
fn at_option_is_reserved_for_replication_and_aof_loading() {
    for_each_algorithm_on_each_server(|alg, con| {
        let now_us = server_time_us(con).to_string();
        for options in [
            &["AT", &now_us][..],
            &["at", &now_us],
            &["COST", "1", "AT", &now_us],
            &["COST", "1", "at", &now_us],
            &["COST", "0", "AT", &now_us],
            &["COST", "0", "at", &now_us],
        ] {
            let mut args = alg.valid();
            args.extend_from_slice(options);
            let words = alg.words(alg.key, &args);
            assert_eq!(
                query_err(con, &words),
                "ERR AT is reserved for replication and AOF loading",
                "{words:?}"
            );
        }
        assert_eq!(dbsize(con), 0, "{alg}: an AT call wrote a key");
    });
}

#[test]
fn setstate_is_refused_from_clients() {
    for_each_algorithm_on_each_server(|alg, con| {
        let mut words = vec!["RL.SETSTATE", alg.key, alg.setstate_name];
        words.extend_from_slice(alg.setstate_fields);
        assert_eq!(
            query_err(con, &words),
            "ERR RL.SETSTATE is reserved for replication and AOF loading",
            "{words:?}"
        );
        assert_eq!(
            dbsize(con),
            0,
            "{alg}: RL.SETSTATE from a client wrote a key"
        );
    });
}

/// `DUMP` and `PTTL` of each key.
fn snapshot(con: &mut Connection, keys: &[&str]) -> Vec<(Option<Vec<u8>>, i64)> {
    keys.iter()
        .map(|key| (dump(con, key), pttl(con, key)))
        .collect()
}

fn assert_untouched(
    what: &str,
    con: &mut Connection,
    keys: &[&str],
    before: &[(Option<Vec<u8>>, i64)],
) {
    for ((key, b), a) in keys.iter().zip(before).zip(snapshot(con, keys)) {
        assert_eq!(a.0, b.0, "{what} changed {key}");
        assert!(a.1 <= b.1, "{what} changed the TTL of {key}");
    }
}

#[test]
fn key_of_another_type_is_wrongtype_and_untouched() {
    for_each_algorithm_on_each_server(|alg, con| {
        let _: () = query(con, &["SET", "string", "hello", "PX", "1000000"]);
        let _: i64 = query(con, &["RPUSH", "list", "a", "b"]);
        let _: i64 = query(con, &["HSET", "hash", "tokens", "5"]);
        let _: i64 = query(con, &["ZADD", "zset", "1", "a"]);
        let keys = ["string", "list", "hash", "zset"];
        let before = snapshot(con, &keys);
        for key in keys {
            for cost in ["1", "0"] {
                let mut args = alg.valid();
                args.extend(["COST", cost]);
                let err = alg.call_err(con, key, &args);
                assert!(err.starts_with("WRONGTYPE"), "{alg} on a {key}: {err}");
            }
        }
        assert_untouched(&format!("{alg} (WRONGTYPE)"), con, &keys, &before);
        let value: String = query(con, &["GET", "string"]);
        assert_eq!(value, "hello", "{alg}");
    });
}

#[test]
fn key_of_another_algorithm_is_wrongtype_and_untouched() {
    for_each_algorithm_on_each_server(|alg, con| {
        let others: Vec<&Algorithm> = ALGORITHMS
            .iter()
            .filter(|other| other.command != alg.command)
            .collect();
        for other in &others {
            assert!(other.slow(con, other.key, "5", "1").allowed, "{other}");
        }
        let keys: Vec<&str> = others.iter().map(|other| other.key).collect();
        let before = snapshot(con, &keys);
        for other in &others {
            for cost in ["1", "0"] {
                let mut args = alg.valid();
                args.extend(["COST", cost]);
                let err = alg.call_err(con, other.key, &args);
                assert!(
                    err.starts_with("WRONGTYPE"),
                    "{alg} on a {other} key: {err}"
                );
            }
        }
        assert_untouched(&format!("{alg} (WRONGTYPE)"), con, &keys, &before);
        for other in &others {
            assert_eq!(
                key_type(con, other.key),
                other.type_name,
                "{alg}: TYPE of the {other} key"
            );
        }
    });
}

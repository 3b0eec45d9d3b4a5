//! Bad input: every refusal is an error reply that names what is wrong, and
//! writes nothing (the key stays absent or untouched, `DBSIZE` unchanged).

mod common;

use common::*;

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

fn assert_err_naming(err: &str, name: &str, words: &[&str]) {
    assert!(
        err.starts_with("ERR") && err.contains(name),
        "{words:?}: expected an ERR naming {name}, got: {err}"
    );
}

#[test]
fn bad_token_bucket_parameters_are_named_and_write_nothing() {
    for_each_server(|kind| {
        let server = Server::start(kind, &[]);
        let mut con = server.conn();
        let good = ["5", "1", "1000"];
        for (position, name) in ["capacity", "refill_count", "refill_ms"].iter().enumerate() {
            for bad in NOT_A_PARAMETER {
                let mut params = good;
                params[position] = bad;
                let words = ["RL.TOKENBUCKET", "tb", params[0], params[1], params[2]];
                let err = query_err(&mut con, &words);
                assert_err_naming(&err, name, &words);
            }
        }
        assert_eq!(dbsize(&mut con), 0, "an error wrote a key");
    });
}

#[test]
fn bad_fixed_window_parameters_are_named_and_write_nothing() {
    for_each_server(|kind| {
        let server = Server::start(kind, &[]);
        let mut con = server.conn();
        let good = ["5", "1000"];
        for (position, name) in ["limit", "window_ms"].iter().enumerate() {
            for bad in NOT_A_PARAMETER {
                let mut params = good;
                params[position] = bad;
                let words = ["RL.FIXEDWINDOW", "fw", params[0], params[1]];
                let err = query_err(&mut con, &words);
                assert_err_naming(&err, name, &words);
            }
        }
        assert_eq!(dbsize(&mut con), 0, "an error wrote a key");
    });
}

#[test]
fn bad_cost_is_named_and_writes_nothing() {
    for_each_server(|kind| {
        let server = Server::start(kind, &[]);
        let mut con = server.conn();
        for bad in [
            "-1",
            "1099511627777",
            "x",
            "1.0",
            "",
            "18446744073709551616",
        ] {
            for words in [
                ["RL.TOKENBUCKET", "tb", "5", "1", "1000", "COST", bad].as_slice(),
                ["RL.FIXEDWINDOW", "fw", "5", "1000", "COST", bad].as_slice(),
            ] {
                let err = query_err(&mut con, words);
                assert_err_naming(&err, "COST", words);
            }
        }
        assert_eq!(dbsize(&mut con), 0, "an error wrote a key");
    });
}

#[test]
fn largest_cost_is_accepted() {
    for_each_server(|kind| {
        let server = Server::start(kind, &[]);
        let mut con = server.conn();
        let max = MAX_PARAM.to_string();
        let r = rl(
            &mut con,
            &["RL.TOKENBUCKET", "tb", "5", "1", "1000", "COST", &max],
        );
        assert_eq!((r.allowed, r.wait_ms), (false, -1));
        let r = rl(
            &mut con,
            &["RL.FIXEDWINDOW", "fw", "5", "1000", "COST", &max],
        );
        assert_eq!((r.allowed, r.wait_ms), (false, -1));
        assert_eq!(dbsize(&mut con), 0);
    });
}

#[test]
fn unknown_option_is_named_and_writes_nothing() {
    for_each_server(|kind| {
        let server = Server::start(kind, &[]);
        let mut con = server.conn();
        for option in ["FOO", "COSTS", "EX"] {
            for words in [
                ["RL.TOKENBUCKET", "tb", "5", "1", "1000", option, "1"].as_slice(),
                ["RL.FIXEDWINDOW", "fw", "5", "1000", option, "1"].as_slice(),
                [
                    "RL.TOKENBUCKET",
                    "tb",
                    "5",
                    "1",
                    "1000",
                    "COST",
                    "1",
                    option,
                    "1",
                ]
                .as_slice(),
            ] {
                let err = query_err(&mut con, words);
                assert_err_naming(&err, option, words);
            }
        }
        assert_eq!(dbsize(&mut con), 0, "an error wrote a key");
    });
}

#[test]
fn option_without_value_is_an_error() {
    for_each_server(|kind| {
        let server = Server::start(kind, &[]);
        let mut con = server.conn();
        for words in [
            ["RL.TOKENBUCKET", "tb", "5", "1", "1000", "COST"].as_slice(),
            ["RL.FIXEDWINDOW", "fw", "5", "1000", "COST"].as_slice(),
            ["RL.FIXEDWINDOW", "fw", "5", "1000", "COST", "1", "COST"].as_slice(),
        ] {
            let err = query_err(&mut con, words);
            assert!(err.starts_with("ERR"), "{words:?}: {err}");
        }
        assert_eq!(dbsize(&mut con), 0, "an error wrote a key");
    });
}

#[test]
fn option_names_are_case_insensitive() {
    for_each_server(|kind| {
        let server = Server::start(kind, &[]);
        let mut con = server.conn();
        let r = rl(
            &mut con,
            &["RL.TOKENBUCKET", "tb", "5", "1", "1000000", "cost", "2"],
        );
        assert_eq!((r.allowed, r.remaining), (true, 3));
        let r = rl(
            &mut con,
            &["rl.fixedwindow", "fw", "5", "1000000", "Cost", "2"],
        );
        assert_eq!((r.allowed, r.remaining), (true, 3));
    });
}

#[test]
fn wrong_argument_count_is_the_usual_arity_error() {
    for_each_server(|kind| {
        let server = Server::start(kind, &[]);
        let mut con = server.conn();
        for words in [
            ["RL.TOKENBUCKET"].as_slice(),
            ["RL.TOKENBUCKET", "tb"].as_slice(),
            ["RL.TOKENBUCKET", "tb", "5"].as_slice(),
            ["RL.TOKENBUCKET", "tb", "5", "1"].as_slice(),
            ["RL.FIXEDWINDOW"].as_slice(),
            ["RL.FIXEDWINDOW", "fw"].as_slice(),
            ["RL.FIXEDWINDOW", "fw", "5"].as_slice(),
        ] {
            let err = query_err(&mut con, words);
            assert!(
                err.starts_with("ERR") && err.contains("wrong number of arguments"),
                "{words:?}: {err}"
            );
        }
        assert_eq!(dbsize(&mut con), 0, "an error wrote a key");
    });
}

#[test]
fn idle_span_above_2_pow_50_ms_is_refused() {
    for_each_server(|kind| {
        let server = Server::start(kind, &[]);
        let mut con = server.conn();
        let max = MAX_PARAM.to_string();
        for words in [
            // 1025 tokens at one per 2^40 ms: 2^50 + 2^40 ms to fill.
            ["RL.TOKENBUCKET", "tb", "1025", "1", &max].as_slice(),
            ["RL.TOKENBUCKET", "tb", &max, "1", &max].as_slice(),
            ["RL.TOKENBUCKET", "tb", &max, "1", &max, "COST", "0"].as_slice(),
        ] {
            let err = query_err(&mut con, words);
            assert!(err.starts_with("ERR"), "{words:?}: {err}");
        }
        assert_eq!(dbsize(&mut con), 0, "an error wrote a key");
    });
}

#[test]
fn errors_leave_an_existing_limiter_untouched() {
    for_each_server(|kind| {
        let server = Server::start(kind, &[]);
        let mut con = server.conn();
        rl(&mut con, &["RL.TOKENBUCKET", "tb", "5", "1", "1000000"]);
        rl(&mut con, &["RL.FIXEDWINDOW", "fw", "5", "1000000"]);
        let tb = dump(&mut con, "tb");
        let fw = dump(&mut con, "fw");
        let (tb_ttl, fw_ttl) = (pttl(&mut con, "tb"), pttl(&mut con, "fw"));
        for words in [
            ["RL.TOKENBUCKET", "tb", "0", "1", "1000000"].as_slice(),
            ["RL.TOKENBUCKET", "tb", "5", "1", "1000000", "COST", "-1"].as_slice(),
            ["RL.TOKENBUCKET", "tb", "5", "1", "1000000", "FOO", "1"].as_slice(),
            [
                "RL.TOKENBUCKET",
                "tb",
                "5",
                "1",
                "1000000",
                "COST",
                "1",
                "COST",
            ]
            .as_slice(),
            ["RL.FIXEDWINDOW", "fw", "5", "0"].as_slice(),
            ["RL.FIXEDWINDOW", "fw", "5", "1000000", "COST", "x"].as_slice(),
            ["RL.FIXEDWINDOW", "fw", "5", "1000000", "AT", "1"].as_slice(),
        ] {
            query_err(&mut con, words);
        }
        assert_eq!(dump(&mut con, "tb"), tb);
        assert_eq!(dump(&mut con, "fw"), fw);
        assert!(pttl(&mut con, "tb") <= tb_ttl);
        assert!(pttl(&mut con, "fw") <= fw_ttl);
        assert_eq!(dbsize(&mut con), 2);
    });
}

#[test]
fn at_option_is_reserved_for_replication_and_aof_loading() {
    for_each_server(|kind| {
        let server = Server::start(kind, &[]);
        let mut con = server.conn();
        let now_us = server_time_us(&mut con).to_string();
        for words in [
            ["RL.TOKENBUCKET", "tb", "5", "1", "1000", "AT", &now_us].as_slice(),
            [
                "RL.TOKENBUCKET",
                "tb",
                "5",
                "1",
                "1000",
                "COST",
                "1",
                "AT",
                &now_us,
            ]
            .as_slice(),
            [
                "RL.TOKENBUCKET",
                "tb",
                "5",
                "1",
                "1000",
                "COST",
                "0",
                "at",
                &now_us,
            ]
            .as_slice(),
            [
                "RL.FIXEDWINDOW",
                "fw",
                "5",
                "1000",
                "COST",
                "1",
                "AT",
                &now_us,
            ]
            .as_slice(),
        ] {
            let err = query_err(&mut con, words);
            assert_eq!(
                err, "ERR AT is reserved for replication and AOF loading",
                "{words:?}"
            );
        }
        assert_eq!(dbsize(&mut con), 0, "an AT call wrote a key");
    });
}

#[test]
fn setstate_is_refused_from_clients() {
    for_each_server(|kind| {
        let server = Server::start(kind, &[]);
        let mut con = server.conn();
        for words in [
            [
                "RL.SETSTATE",
                "tb",
                "TOKENBUCKET",
                "1",
                "1",
                "0",
                "1",
                "1000",
            ]
            .as_slice(),
            ["RL.SETSTATE", "fw", "FIXEDWINDOW", "1", "0", "1000", "1"].as_slice(),
        ] {
            let err = query_err(&mut con, words);
            assert!(err.starts_with("ERR"), "{words:?}: {err}");
        }
        assert_eq!(dbsize(&mut con), 0, "RL.SETSTATE from a client wrote a key");
    });
}

#[test]
fn key_of_another_type_is_wrongtype_and_untouched() {
    for_each_server(|kind| {
        let server = Server::start(kind, &[]);
        let mut con = server.conn();
        let _: () = query(&mut con, &["SET", "string", "hello", "PX", "1000000"]);
        let _: i64 = query(&mut con, &["RPUSH", "list", "a", "b"]);
        let _: i64 = query(&mut con, &["HSET", "hash", "tokens", "5"]);
        let before: Vec<_> = ["string", "list", "hash"]
            .iter()
            .map(|key| (dump(&mut con, key), pttl(&mut con, key)))
            .collect();
        for key in ["string", "list", "hash"] {
            for words in [
                ["RL.TOKENBUCKET", key, "5", "1", "1000"].as_slice(),
                ["RL.TOKENBUCKET", key, "5", "1", "1000", "COST", "0"].as_slice(),
                ["RL.FIXEDWINDOW", key, "5", "1000"].as_slice(),
                ["RL.FIXEDWINDOW", key, "5", "1000", "COST", "0"].as_slice(),
            ] {
                let err = query_err(&mut con, words);
                assert!(err.starts_with("WRONGTYPE"), "{words:?}: {err}");
            }
        }
        let after: Vec<_> = ["string", "list", "hash"]
            .iter()
            .map(|key| (dump(&mut con, key), pttl(&mut con, key)))
            .collect();
        for (b, a) in before.iter().zip(&after) {
            assert_eq!(a.0, b.0, "a WRONGTYPE call changed the value");
            assert!(a.1 <= b.1, "a WRONGTYPE call changed the TTL");
        }
        let value: String = query(&mut con, &["GET", "string"]);
        assert_eq!(value, "hello");
    });
}

#[test]
fn key_of_the_other_algorithm_is_wrongtype_and_untouched() {
    for_each_server(|kind| {
        let server = Server::start(kind, &[]);
        let mut con = server.conn();
        rl(&mut con, &["RL.TOKENBUCKET", "tb", "5", "1", "1000000"]);
        rl(&mut con, &["RL.FIXEDWINDOW", "fw", "5", "1000000"]);
        let (tb, fw) = (dump(&mut con, "tb"), dump(&mut con, "fw"));
        for words in [
            ["RL.FIXEDWINDOW", "tb", "5", "1000000"].as_slice(),
            ["RL.FIXEDWINDOW", "tb", "5", "1000000", "COST", "0"].as_slice(),
            ["RL.TOKENBUCKET", "fw", "5", "1", "1000000"].as_slice(),
            ["RL.TOKENBUCKET", "fw", "5", "1", "1000000", "COST", "0"].as_slice(),
        ] {
            let err = query_err(&mut con, words);
            assert!(err.starts_with("WRONGTYPE"), "{words:?}: {err}");
        }
        assert_eq!(dump(&mut con, "tb"), tb);
        assert_eq!(dump(&mut con, "fw"), fw);
        assert_eq!(key_type(&mut con, "tb"), "rl-tokbkt");
        assert_eq!(key_type(&mut con, "fw"), "rl-fixwin");
    });
}

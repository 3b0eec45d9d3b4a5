//! Observability: the `INFO ratelimit` counters (per algorithm, for `RL.ALL`,
//! per policy with shadow denials apart), and the deny log (`RL.LOG GET|LEN|
//! RESET`, bounded by `ratelimit.log-max-len`).

use std::collections::BTreeMap;
use std::path::Path;

use super::policies::rollout_bucket;
use crate::harness::contract::ALGORITHMS;
use crate::harness::*;

/// 2^40 ms: nothing refills, leaks or leaves a window while a test runs (a
/// fixed window aligned on it that holds "now" ends in 2039).
const LONG: &str = "1099511627776";

/// Each algorithm's name in `INFO ratelimit` (`tokenbucket_calls`): its
/// spec word in lower case, in the table's order, which is the module's.
fn algorithm_words() -> Vec<String> {
    ALGORITHMS
        .iter()
        .map(|alg| alg.setstate_name.to_lowercase())
        .collect()
}

// ---------------------------------------------------------------------------
// Helpers

/// The lines of `INFO ratelimit` after its header, as (field, value).
fn info_lines(con: &mut Connection) -> Vec<(String, String)> {
    let info: String = query(con, &["INFO", "ratelimit"]);
    assert!(
        info.lines().next() == Some("# ratelimit"),
        "INFO ratelimit starts with its header: {info}"
    );
    info.lines()
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(|line| {
            let (name, value) = line
                .trim_end()
                .split_once(':')
                .unwrap_or_else(|| panic!("INFO line without ':': {line}"));
            assert!(name.starts_with("ratelimit_"), "{line}");
            (name.to_string(), value.to_string())
        })
        .collect()
}

/// The counters of `INFO ratelimit`, in the order given. A policy's line,
/// `ratelimit_policy_<escaped>:calls=N,admitted=N,...`, counts as the fields
/// `ratelimit_policy_<escaped>_calls`, `..._admitted` and so on.
fn info_fields(con: &mut Connection) -> Vec<(String, u64)> {
    let count = |line: &str, value: &str| -> u64 {
        value
            .parse()
            .unwrap_or_else(|_| panic!("INFO value not a count: {line}"))
    };
    let mut fields = Vec::new();
    for (name, value) in info_lines(con) {
        if name.starts_with("ratelimit_policy_") {
            for pair in value.split(',') {
                let (counter, n) = pair
                    .split_once('=')
                    .unwrap_or_else(|| panic!("{name}: not counter=N: {pair}"));
                fields.push((format!("{name}_{counter}"), count(&name, n)));
            }
        } else {
            fields.push((name.clone(), count(&name, &value)));
        }
    }
    fields
}

/// Percent-decoding, as an exporter does it to get a policy's name back
/// from its INFO line.
fn percent_decode(escaped: &str) -> String {
    let mut out = Vec::new();
    let mut bytes = escaped.bytes();
    while let Some(b) = bytes.next() {
        if b == b'%' {
            let hex: Vec<u8> = bytes.by_ref().take(2).collect();
            let hex = std::str::from_utf8(&hex).expect("ASCII");
            out.push(u8::from_str_radix(hex, 16).unwrap_or_else(|_| panic!("%{hex}")));
        } else {
            out.push(b);
        }
    }
    String::from_utf8(out).expect("an ASCII name")
}

/// The policies of INFO's lines: (decoded name, counters line), as given.
fn info_policies(con: &mut Connection) -> Vec<(String, String)> {
    info_lines(con)
        .into_iter()
        .filter_map(|(name, value)| {
            let escaped = name.strip_prefix("ratelimit_policy_")?;
            Some((percent_decode(escaped), value))
        })
        .collect()
}

/// Not a count of calls: it moves with every block the module allocates,
/// INFO's own included (`features/allocations.rs` reads it).
const ALLOCATIONS: &str = "ratelimit_module_allocations";
/// Not a count of calls either: the bucket rates the process has numbered
/// (`algorithms/token_bucket.rs` reads it).
const BUCKET_RATES: &str = "ratelimit_bucket_rates";

/// The counters of calls, by name (every field but [`ALLOCATIONS`] and
/// [`BUCKET_RATES`]).
fn counters(con: &mut Connection) -> BTreeMap<String, u64> {
    let fields = info_fields(con);
    let map: BTreeMap<String, u64> = fields.iter().cloned().collect();
    assert_eq!(
        map.len(),
        fields.len(),
        "an INFO field appears twice: {fields:?}"
    );
    // A policy line's scale= and stage= are levels, not counts of calls.
    let level = |name: &str| {
        name.starts_with("ratelimit_policy_")
            && (name.ends_with("_scale") || name.ends_with("_stage"))
    };
    map.into_iter()
        .filter(|(name, _)| name != ALLOCATIONS && name != BUCKET_RATES && !level(name))
        .collect()
}

fn counter(con: &mut Connection, name: &str) -> u64 {
    *counters(con)
        .get(name)
        .unwrap_or_else(|| panic!("no {name} in INFO ratelimit"))
}

/// Runs `action` and asserts that exactly the counters in `expected` moved,
/// by exactly those amounts (fields without the `ratelimit_` prefix).
fn assert_moves(
    con: &mut Connection,
    what: &str,
    expected: &[(&str, i64)],
    action: impl FnOnce(&mut Connection),
) {
    let before = counters(con);
    action(con);
    let after = counters(con);
    let mut moved = BTreeMap::new();
    for name in before.keys().chain(after.keys()) {
        let b = before.get(name).copied().unwrap_or(0) as i64;
        let a = after.get(name).copied().unwrap_or(0) as i64;
        if a != b {
            moved.insert(name.clone(), a - b);
        }
    }
    let expected: BTreeMap<String, i64> = expected
        .iter()
        .filter(|(_, d)| *d != 0)
        .map(|(n, d)| (format!("ratelimit_{n}"), *d))
        .collect();
    assert_eq!(moved, expected, "counters moved by {what}");
}

/// For every algorithm, and for RL.ALL: calls = admitted + denied + peeks.
fn assert_calls_add_up(con: &mut Connection) {
    let c = counters(con);
    for prefix in algorithm_words()
        .iter()
        .map(String::as_str)
        .chain(["throttle", "all"])
    {
        let get = |f: &str| c[&format!("ratelimit_{prefix}_{f}")];
        assert_eq!(
            get("calls"),
            get("admitted") + get("denied") + get("peeks"),
            "{prefix}: {c:?}"
        );
    }
}

fn set_policy(con: &mut Connection, words: &[&str]) {
    let reply: String = query(con, &[&["RL.POLICY", "SET"][..], words].concat());
    assert_eq!(reply, "OK");
}

/// One deny-log entry.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Entry {
    id: i64,
    unix_ms: i64,
    key: Vec<u8>,
    source: String,
    cost: i64,
    wait_ms: i64,
}

fn log_get(con: &mut Connection, count: Option<&str>) -> Vec<Entry> {
    let mut words = vec!["RL.LOG", "GET"];
    words.extend(count);
    let value: Value = query(con, &words);
    let Value::Array(entries) = value else {
        panic!("RL.LOG GET: not an array: {value:?}")
    };
    entries
        .into_iter()
        .map(|entry| {
            let Value::Array(f) = entry else {
                panic!("RL.LOG GET: an entry is not an array: {entry:?}")
            };
            assert_eq!(f.len(), 6, "an entry has 6 fields: {f:?}");
            let int = |v: &Value| match v {
                Value::Int(i) => *i,
                other => panic!("expected an integer: {other:?}"),
            };
            let bytes = |v: &Value| match v {
                Value::BulkString(b) => b.clone(),
                other => panic!("expected a string: {other:?}"),
            };
            Entry {
                id: int(&f[0]),
                unix_ms: int(&f[1]),
                key: bytes(&f[2]),
                source: String::from_utf8(bytes(&f[3])).expect("utf-8 source"),
                cost: int(&f[4]),
                wait_ms: int(&f[5]),
            }
        })
        .collect()
}

fn log_len(con: &mut Connection) -> i64 {
    query(con, &["RL.LOG", "LEN"])
}

fn config_set(con: &mut Connection, name: &str, value: &str) {
    let _: () = query(con, &["CONFIG", "SET", name, value]);
}

fn config_get(con: &mut Connection, name: &str) -> String {
    let pair: Vec<String> = query(con, &["CONFIG", "GET", name]);
    assert_eq!(pair.len(), 2, "CONFIG GET {name}: {pair:?}");
    pair[1].clone()
}

/// A call that must be denied; returns its reply.
fn denied(con: &mut Connection, words: &[&str]) -> Vec<i64> {
    let ints: Vec<i64> = query(con, words);
    assert_eq!(ints[0], 0, "{words:?} was not denied: {ints:?}");
    ints
}

/// A denial and what the deny log must say about it: the call that fills
/// the limiter, the denied call, then the entry's key, source and cost.
type DenialCase<'a> = (Vec<&'a str>, Vec<&'a str>, &'a str, &'a str, i64);

fn now_ms(con: &mut Connection) -> i64 {
    (server_time_us(con) / 1000) as i64
}

// ---------------------------------------------------------------------------
// INFO ratelimit

#[test]
fn info_ratelimit_shows_every_counter_from_the_start() {
    for_each_server(|kind| {
        let server = Server::start(kind, &[]);
        let mut con = server.conn();
        let names: Vec<String> = info_fields(&mut con).into_iter().map(|(n, _)| n).collect();
        let mut expected = Vec::new();
        for prefix in algorithm_words()
            .iter()
            .map(String::as_str)
            .chain(["throttle", "all"])
        {
            for field in ["calls", "admitted", "denied", "peeks"] {
                expected.push(format!("ratelimit_{prefix}_{field}"));
            }
        }
        for field in [
            "policies",
            "upto_calls",
            "upto_granted_units",
            "upto_partial",
            "blocked_now",
            "blocked_total",
            "blocked_admitted",
            "blocked_timed_out",
            "deny_log_len",
            "deny_log_max_len",
            "propagation_pinned",
        ] {
            expected.push(format!("ratelimit_{field}"));
        }
        expected.push(ALLOCATIONS.to_string());
        expected.push(BUCKET_RATES.to_string());
        assert_eq!(names, expected);
        let c = counters(&mut con);
        for name in expected
            .iter()
            .filter(|n| *n != ALLOCATIONS && *n != BUCKET_RATES)
        {
            let value = c[name];
            match name.as_str() {
                "ratelimit_deny_log_max_len" => assert_eq!(value, 128, "the default"),
                "ratelimit_propagation_pinned" => assert!(value <= 1),
                _ => assert_eq!(value, 0, "{name}"),
            }
        }
        // The section is part of INFO everything / INFO modules, not INFO all.
        let everything: String = query(&mut con, &["INFO", "everything"]);
        assert!(everything.contains("ratelimit_tokenbucket_calls:"));
        let modules: String = query(&mut con, &["INFO", "modules"]);
        assert!(modules.contains("ratelimit_tokenbucket_calls:"));
    });
}

#[test]
fn each_algorithm_counts_admitted_denied_and_peeks_and_nothing_else_moves() {
    for_each_server(|kind| {
        let server = Server::start(kind, &[]);
        let mut con = server.conn();
        // Limit 1 everywhere: the second call is denied.
        for alg in &ALGORITHMS {
            let word = alg.setstate_name.to_lowercase();
            let f = |field: &str| format!("{word}_{field}");
            let key = format!("k:{}", alg.key);
            let params = alg.slow_params("1");
            let call = |con: &mut Connection, key: &str, options: &[&'static str]| {
                let mut args = params.clone();
                args.extend_from_slice(options);
                alg.call(con, key, &args)
            };
            let words = alg.words(&key, &params);
            alg.away_from_window_end(&mut con, &params);
            assert_moves(
                &mut con,
                &format!("{words:?} admitted"),
                &[(&f("calls"), 1), (&f("admitted"), 1)],
                |con| assert!(call(con, &key, &[]).allowed),
            );
            assert_moves(
                &mut con,
                &format!("{words:?} denied"),
                &[(&f("calls"), 1), (&f("denied"), 1), ("deny_log_len", 1)],
                |con| assert!(!call(con, &key, &[]).allowed),
            );
            assert_moves(
                &mut con,
                &format!("{words:?} COST 0"),
                &[(&f("calls"), 1), (&f("peeks"), 1)],
                |con| {
                    call(con, &key, &["COST", "0"]);
                },
            );
            assert_moves(
                &mut con,
                &format!("{words:?} COST 0 on a missing key"),
                &[(&f("calls"), 1), (&f("peeks"), 1)],
                |con| {
                    call(con, "absent", &["COST", "0"]);
                },
            );
            assert_moves(
                &mut con,
                &format!("{words:?} COST 2 (never fits)"),
                &[(&f("calls"), 1), (&f("denied"), 1), ("deny_log_len", 1)],
                |con| {
                    let r = call(con, &key, &["COST", "2"]);
                    assert_eq!((r.allowed, r.wait_ms), (false, -1));
                },
            );
        }
        assert_calls_add_up(&mut con);
        let c = counters(&mut con);
        for word in algorithm_words() {
            assert_eq!(c[&format!("ratelimit_{word}_calls")], 5, "{word}");
        }
    });
}

#[test]
fn calls_that_fail_with_an_error_count_nothing() {
    for_each_server(|kind| {
        let server = Server::start(kind, &[]);
        let mut con = server.conn();
        let _: () = query(&mut con, &["SET", "str", "x"]);
        set_policy(&mut con, &["p", "TOKENBUCKET", "1", "1", LONG]);
        for words in [
            &["RL.TOKENBUCKET", "str", "1", "1", LONG][..],
            &["RL.TOKENBUCKET", "k", "0", "1", LONG][..],
            &["RL.FIXEDWINDOW", "k", "1", LONG, "COST", "-1"][..],
            &["RL.SLIDING", "k", "100001", "1000"][..],
            &["RL.HIT", "p", "str"][..],
            &["RL.HIT", "nope", "k"][..],
            &[
                "RL.ALL",
                "2",
                "a",
                "str",
                "FIXEDWINDOW",
                "1",
                LONG,
                "TOKENBUCKET",
                "1",
                "1",
                LONG,
            ][..],
            &["RL.ALL", "1", "a", "POLICY", "nope"][..],
        ] {
            assert_moves(&mut con, &format!("{words:?}"), &[], |con| {
                query_err(con, words);
            });
        }
    });
}

#[test]
fn rl_all_counts_the_call_once_and_each_limiter_for_its_algorithm() {
    for_each_server(|kind| {
        let server = Server::start(kind, &[]);
        let mut con = server.conn();
        let call = [
            "RL.ALL",
            "2",
            "{u}tb",
            "{u}fw",
            "TOKENBUCKET",
            "1",
            "1",
            LONG,
            "FIXEDWINDOW",
            "5",
            LONG,
        ];
        assert_moves(
            &mut con,
            "RL.ALL admitted",
            &[
                ("all_calls", 1),
                ("all_admitted", 1),
                ("tokenbucket_calls", 1),
                ("tokenbucket_admitted", 1),
                ("fixedwindow_calls", 1),
                ("fixedwindow_admitted", 1),
            ],
            |con| {
                let ints: Vec<i64> = query(con, &call);
                assert_eq!(ints[0], 1);
            },
        );
        // Denied by the bucket: the window, which would have admitted, took
        // nothing; it counts as a look (a peek).
        assert_moves(
            &mut con,
            "RL.ALL denied",
            &[
                ("all_calls", 1),
                ("all_denied", 1),
                ("tokenbucket_calls", 1),
                ("tokenbucket_denied", 1),
                ("fixedwindow_calls", 1),
                ("fixedwindow_peeks", 1),
                ("deny_log_len", 1),
            ],
            |con| {
                denied(con, &call);
            },
        );
        assert_moves(
            &mut con,
            "RL.ALL COST 0",
            &[
                ("all_calls", 1),
                ("all_peeks", 1),
                ("tokenbucket_calls", 1),
                ("tokenbucket_peeks", 1),
                ("fixedwindow_calls", 1),
                ("fixedwindow_peeks", 1),
            ],
            |con| {
                let _: Vec<i64> = query(con, &[&call[..], &["COST", "0"]].concat());
            },
        );
        assert_calls_add_up(&mut con);
    });
}

#[test]
fn policy_counters_count_each_mode_with_shadow_denials_apart() {
    for_each_server(|kind| {
        let server = Server::start(kind, &[]);
        let mut con = server.conn();
        assert_moves(&mut con, "RL.POLICY SET", &[("policies", 1)], |con| {
            set_policy(con, &["p", "TOKENBUCKET", "1", "1", LONG])
        });
        for field in ["calls", "admitted", "denied", "peeks", "shadow_denied"] {
            assert_eq!(counter(&mut con, &format!("ratelimit_policy_p_{field}")), 0);
        }
        let hit = |con: &mut Connection| rl(con, &["RL.HIT", "p", "k"]);

        // ENFORCE
        assert_moves(
            &mut con,
            "RL.HIT admitted",
            &[
                ("policy_p_calls", 1),
                ("policy_p_admitted", 1),
                ("tokenbucket_calls", 1),
                ("tokenbucket_admitted", 1),
            ],
            |con| assert!(hit(con).allowed),
        );
        assert_moves(
            &mut con,
            "RL.HIT denied",
            &[
                ("policy_p_calls", 1),
                ("policy_p_denied", 1),
                ("tokenbucket_calls", 1),
                ("tokenbucket_denied", 1),
                ("deny_log_len", 1),
            ],
            |con| assert!(!hit(con).allowed),
        );
        assert_moves(
            &mut con,
            "RL.HIT COST 0",
            &[
                ("policy_p_calls", 1),
                ("policy_p_peeks", 1),
                ("tokenbucket_calls", 1),
                ("tokenbucket_peeks", 1),
            ],
            |con| {
                rl(con, &["RL.HIT", "p", "k", "COST", "0"]);
            },
        );

        // SHADOW: a denial answered allowed counts as denied and as
        // shadow_denied, and is not logged.
        assert_moves(&mut con, "RL.POLICY SET again", &[], |con| {
            set_policy(con, &["p", "TOKENBUCKET", "1", "1", LONG, "MODE", "SHADOW"])
        });
        assert_moves(
            &mut con,
            "RL.HIT shadow-denied",
            &[
                ("policy_p_calls", 1),
                ("policy_p_denied", 1),
                ("policy_p_shadow_denied", 1),
                ("tokenbucket_calls", 1),
                ("tokenbucket_denied", 1),
            ],
            |con| assert!(hit(con).allowed),
        );
        assert_moves(
            &mut con,
            "RL.HIT shadow, admitted",
            &[
                ("policy_p_calls", 1),
                ("policy_p_admitted", 1),
                ("tokenbucket_calls", 1),
                ("tokenbucket_admitted", 1),
            ],
            |con| assert!(rl(con, &["RL.HIT", "p", "other"]).allowed),
        );
        assert_moves(
            &mut con,
            "RL.ALL POLICY shadow-denied",
            &[
                ("all_calls", 1),
                ("all_admitted", 1),
                ("policy_p_calls", 1),
                ("policy_p_denied", 1),
                ("policy_p_shadow_denied", 1),
                ("tokenbucket_calls", 1),
                ("tokenbucket_denied", 1),
            ],
            |con| {
                let ints: Vec<i64> = query(con, &["RL.ALL", "1", "k", "POLICY", "p"]);
                assert_eq!(ints[0], 1);
            },
        );

        // OFF: a call, nothing else, and no algorithm counter.
        set_policy(
            &mut con,
            &["p", "TOKENBUCKET", "1", "1", LONG, "MODE", "OFF"],
        );
        assert_moves(&mut con, "RL.HIT off", &[("policy_p_calls", 1)], |con| {
            assert!(hit(con).allowed)
        });
        assert_moves(
            &mut con,
            "RL.ALL POLICY off",
            &[("all_calls", 1), ("all_admitted", 1), ("policy_p_calls", 1)],
            |con| {
                let ints: Vec<i64> = query(con, &["RL.ALL", "1", "k", "POLICY", "p"]);
                assert_eq!(ints[0], 1);
            },
        );

        // ENFORCE inside RL.ALL.
        set_policy(&mut con, &["p", "TOKENBUCKET", "1", "1", LONG]);
        assert_moves(
            &mut con,
            "RL.ALL POLICY denied",
            &[
                ("all_calls", 1),
                ("all_denied", 1),
                ("policy_p_calls", 1),
                ("policy_p_denied", 1),
                ("tokenbucket_calls", 1),
                ("tokenbucket_denied", 1),
                ("deny_log_len", 1),
            ],
            |con| {
                denied(con, &["RL.ALL", "1", "k", "POLICY", "p"]);
            },
        );

        // INFO and RL.POLICY GET agree.
        let c = counters(&mut con);
        let get: Vec<Value> = query(&mut con, &["RL.POLICY", "GET", "p"]);
        let from_get = |field: &str| {
            let i = get
                .iter()
                .position(|v| matches!(v, Value::BulkString(b) if b == field.as_bytes()))
                .unwrap();
            match &get[i + 1] {
                Value::Int(n) => *n as u64,
                other => panic!("{other:?}"),
            }
        };
        for field in ["calls", "admitted", "denied", "shadow_denied"] {
            assert_eq!(
                c[&format!("ratelimit_policy_p_{field}")],
                from_get(field),
                "{field}"
            );
        }
        let get = |f: &str| c[&format!("ratelimit_policy_p_{f}")];
        assert_eq!(
            (
                get("calls"),
                get("admitted"),
                get("denied"),
                get("peeks"),
                get("shadow_denied")
            ),
            (9, 2, 4, 1, 2)
        );
        // calls = admitted + denied + peeks + the calls made while OFF (2).
        assert_eq!(
            get("calls"),
            get("admitted") + get("denied") + get("peeks") + 2
        );
        assert_calls_add_up(&mut con);
    });
}

#[test]
fn policy_counters_outlive_rule_changes_and_start_at_0_after_a_del() {
    for_each_server(|kind| {
        let server = Server::start(kind, &[]);
        let mut con = server.conn();
        set_policy(&mut con, &["p", "FIXEDWINDOW", "10", LONG]);
        for _ in 0..3 {
            rl(&mut con, &["RL.HIT", "p", "k"]);
        }
        set_policy(
            &mut con,
            &["p", "FIXEDWINDOW", "20", LONG, "MODE", "SHADOW"],
        );
        assert_eq!(
            counter(&mut con, "ratelimit_policy_p_calls"),
            3,
            "kept across SET"
        );

        let _: i64 = query(&mut con, &["RL.POLICY", "DEL", "p"]);
        let c = counters(&mut con);
        assert!(
            !c.keys().any(|k| k.starts_with("ratelimit_policy_p_")),
            "a deleted policy leaves INFO: {c:?}"
        );
        assert_eq!(c["ratelimit_policies"], 0);
        // DEL frees the counters with the policy: set again, it starts at 0
        // (Prometheus's rate() reads that as a counter reset).
        set_policy(&mut con, &["p", "FIXEDWINDOW", "10", LONG]);
        for field in ["calls", "admitted", "denied", "peeks", "shadow_denied"] {
            let name = format!("ratelimit_policy_p_{field}");
            assert_eq!(counter(&mut con, &name), 0, "{name}");
        }
        let get: Vec<Value> = query(&mut con, &["RL.POLICY", "GET", "p"]);
        assert_eq!(get[11], Value::Int(0), "RL.POLICY GET calls: {get:?}");
        rl(&mut con, &["RL.HIT", "p", "k"]);
        assert_eq!(counter(&mut con, "ratelimit_policy_p_calls"), 1);
        assert_eq!(counter(&mut con, "ratelimit_policies"), 1);
    });
}

/// Names of resources, as operators write them: INFO escapes them.
const ROUTE_NAMES: [(&str, &str); 5] = [
    ("POST:/api/order/create", "POST%3A%2Fapi%2Forder%2Fcreate"),
    ("GET:/v2/{org}/items", "GET%3A%2Fv2%2F%7Borg%7D%2Fitems"),
    ("tenant=acme;tier=free", "tenant%3Dacme%3Btier%3Dfree"),
    ("a:b", "a%3Ab"),
    ("a_b", "a_b"),
];

#[test]
fn info_has_one_line_per_policy_with_its_name_percent_escaped() {
    for_each_server(|kind| {
        let server = Server::start(kind, &[]);
        let mut con = server.conn();
        for (name, _) in ROUTE_NAMES {
            set_policy(&mut con, &[name, "FIXEDWINDOW", "1", LONG]);
        }
        // Every byte a name may hold, and the longest name.
        let every_byte: String = ('!'..='~').collect();
        let longest = "%".repeat(256);
        set_policy(&mut con, &[&every_byte, "FIXEDWINDOW", "1", LONG]);
        set_policy(&mut con, &[&longest, "FIXEDWINDOW", "1", LONG]);
        let route = ROUTE_NAMES[0].0;
        rl(&mut con, &["RL.HIT", route, "k"]);
        rl(&mut con, &["RL.HIT", route, "k"]);
        rl(&mut con, &["RL.HIT", route, "k", "COST", "0"]);

        let lines = info_lines(&mut con);
        let line_of = |escaped: &str| {
            let field = format!("ratelimit_policy_{escaped}");
            lines
                .iter()
                .find(|(name, _)| *name == field)
                .map(|(_, value)| value.clone())
                .unwrap_or_else(|| panic!("no INFO line {field}: {lines:?}"))
        };
        assert_eq!(
            line_of(ROUTE_NAMES[0].1),
            "calls=3,admitted=1,denied=1,shadow_denied=0,peeks=1,scale=100,stage=0"
        );
        for (_, escaped) in &ROUTE_NAMES[1..] {
            assert_eq!(
                line_of(escaped),
                "calls=0,admitted=0,denied=0,shadow_denied=0,peeks=0,scale=100,stage=0"
            );
        }
        line_of(&"%25".repeat(256));
        let info: String = query(&mut con, &["INFO", "ratelimit"]);
        let policy_lines: Vec<&str> = info
            .lines()
            .filter(|l| l.starts_with("ratelimit_policy_"))
            .collect();
        assert_eq!(policy_lines.len(), ROUTE_NAMES.len() + 2);
        for line in policy_lines {
            let (field, _) = line.split_once(':').unwrap();
            assert!(
                field
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"_%".contains(&b)),
                "only letters, digits, _ and %XX in the field: {line}"
            );
        }
        let mut names: Vec<String> = info_policies(&mut con).into_iter().map(|p| p.0).collect();
        names.sort();
        let listed: Vec<String> = query(&mut con, &["RL.POLICY", "LIST"]);
        assert_eq!(names, listed, "INFO's names, decoded, are LIST's");
        assert!(listed.contains(&every_byte) && listed.contains(&longest));
    });
}

#[test]
fn info_shows_exactly_the_policies_of_rl_policy_list_after_sets_and_deletes() {
    for_each_server(|kind| {
        let server = Server::start(kind, &[]);
        let mut con = server.conn();
        let assert_info_is_list = |con: &mut Connection, what: &str| {
            let listed: Vec<String> = query(con, &["RL.POLICY", "LIST"]);
            let mut from_info: Vec<String> = info_policies(con).into_iter().map(|p| p.0).collect();
            from_info.sort();
            assert_eq!(from_info, listed, "after {what}");
            assert_eq!(
                counter(con, "ratelimit_policies"),
                listed.len() as u64,
                "after {what}"
            );
        };
        let del = |con: &mut Connection, name: &str| {
            let _: i64 = query(con, &["RL.POLICY", "DEL", name]);
        };
        assert_info_is_list(&mut con, "start");
        for (name, _) in ROUTE_NAMES {
            set_policy(&mut con, &[name, "TOKENBUCKET", "5", "1", LONG]);
            rl(&mut con, &["RL.HIT", name, "k"]);
        }
        assert_info_is_list(&mut con, "SETs");
        del(&mut con, "a:b");
        del(&mut con, "POST:/api/order/create");
        del(&mut con, "never-set");
        assert_info_is_list(&mut con, "DELs");
        assert!(
            !info_lines(&mut con)
                .iter()
                .any(|(f, _)| f.contains("a%3Ab") || f.contains("POST")),
            "a deleted policy left its INFO line"
        );
        set_policy(
            &mut con,
            &["a:b", "FIXEDWINDOW", "9", LONG, "MODE", "SHADOW"],
        );
        set_policy(&mut con, &["a_b", "FIXEDWINDOW", "9", LONG]);
        assert_info_is_list(&mut con, "SET again and a rule changed");
        let lines = info_policies(&mut con);
        let line = |name: &str| lines.iter().find(|p| p.0 == name).unwrap().1.clone();
        assert_eq!(
            line("a:b"),
            "calls=0,admitted=0,denied=0,shadow_denied=0,peeks=0,scale=100,stage=0",
            "set again after DEL: from 0"
        );
        assert_eq!(
            line("a_b"),
            "calls=1,admitted=1,denied=0,shadow_denied=0,peeks=0,scale=100,stage=0",
            "rule changed: counters kept"
        );
        for (name, _) in ROUTE_NAMES {
            del(&mut con, name);
        }
        assert_info_is_list(&mut con, "deleting all");
        assert!(info_policies(&mut con).is_empty());
    });
}

/// The Python script that reads INFO with redis-py's `parse_info`.
fn parse_info_with_redis_py(info: &str) -> Vec<String> {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/python/policy_counters.py");
    let mut child = std::process::Command::new("python3")
        .arg(&script)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("python3 (scripts/setup.sh installs it, with redis-py)");
    use std::io::Write;
    child
        .stdin
        .take()
        .unwrap()
        .write_all(info.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{}: {}",
        script.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(String::from)
        .collect()
}

#[test]
fn redis_py_parse_info_reads_each_policy_line_and_its_counters() {
    for_each_server(|kind| {
        let server = Server::start(kind, &[]);
        let mut con = server.conn();
        for (name, _) in ROUTE_NAMES {
            set_policy(&mut con, &[name, "TOKENBUCKET", "1", "1", LONG]);
        }
        let longest = "=".repeat(256);
        set_policy(
            &mut con,
            &[&longest, "TOKENBUCKET", "1", "1", LONG, "MODE", "SHADOW"],
        );
        // Each on a key of its own: admitted, then denied.
        for name in ["POST:/api/order/create", "tenant=acme;tier=free", &longest] {
            rl(&mut con, &["RL.HIT", name, name]);
            rl(&mut con, &["RL.HIT", name, name]);
        }
        rl(
            &mut con,
            &["RL.HIT", "GET:/v2/{org}/items", "k", "COST", "0"],
        );
        let info: String = query(&mut con, &["INFO", "ratelimit"]);
        // Per policy, sorted by name: the name, percent-decoded, then calls,
        // admitted, denied, shadow_denied, peeks.
        assert_eq!(
            parse_info_with_redis_py(&info),
            [
                format!("{longest} 2 1 1 1 0"),
                "GET:/v2/{org}/items 1 0 0 0 1".to_string(),
                "POST:/api/order/create 2 1 1 0 0".to_string(),
                "a:b 0 0 0 0 0".to_string(),
                "a_b 0 0 0 0 0".to_string(),
                "tenant=acme;tier=free 2 1 1 0 0".to_string(),
            ]
        );
    });
}

// ---------------------------------------------------------------------------
// RL.LOG

#[test]
fn the_deny_log_records_each_enforced_denial_with_its_source_newest_first() {
    for_each_server(|kind| {
        let server = Server::start(kind, &[]);
        let mut con = server.conn();
        set_policy(&mut con, &["en", "TOKENBUCKET", "1", "1", LONG]);
        set_policy(
            &mut con,
            &["sh", "TOKENBUCKET", "1", "1", LONG, "MODE", "SHADOW"],
        );
        set_policy(
            &mut con,
            &["half", "TOKENBUCKET", "1", "1", LONG, "ROLLOUT", "50"],
        );
        let start_ms = now_ms(&mut con);

        // (call that fills, the denied call, key, source, cost)
        let long_key = format!("long:{}", "x".repeat(300));
        let cases: Vec<DenialCase> = vec![
            (
                vec!["RL.TOKENBUCKET", "tb", "1", "1", LONG],
                vec!["RL.TOKENBUCKET", "tb", "1", "1", LONG],
                "tb",
                "RL.TOKENBUCKET",
                1,
            ),
            (
                vec!["RL.FIXEDWINDOW", "fw", "5", LONG, "COST", "4"],
                vec!["RL.FIXEDWINDOW", "fw", "5", LONG, "COST", "3"],
                "fw",
                "RL.FIXEDWINDOW",
                3,
            ),
            (
                vec!["RL.LEAKYBUCKET", "lb", "1", "1", LONG],
                vec!["RL.LEAKYBUCKET", "lb", "1", "1", LONG],
                "lb",
                "RL.LEAKYBUCKET",
                1,
            ),
            (
                vec!["RL.SLIDING", "sl", "1", LONG],
                vec!["RL.SLIDING", "sl", "1", LONG, "COST", "2"],
                "sl",
                "RL.SLIDING",
                2,
            ),
            (
                vec!["RL.HASHWINDOW", "hw", "1", LONG, LONG],
                vec!["RL.HASHWINDOW", "hw", "1", LONG, LONG],
                "hw",
                "RL.HASHWINDOW",
                1,
            ),
            (
                vec!["RL.HIT", "en", "user:1"],
                vec!["RL.HIT", "en", "user:1"],
                "user:1",
                "policy:en",
                1,
            ),
            (
                vec!["RL.TOKENBUCKET", "{a}1", "1", "1", LONG],
                vec![
                    "RL.ALL",
                    "2",
                    "{a}2",
                    "{a}1",
                    "FIXEDWINDOW",
                    "9",
                    LONG,
                    "TOKENBUCKET",
                    "1",
                    "1",
                    LONG,
                ],
                "{a}1",
                "RL.ALL TOKENBUCKET",
                1,
            ),
            (
                vec!["RL.HIT", "en", "{a}3"],
                vec![
                    "RL.ALL",
                    "2",
                    "{a}4",
                    "{a}3",
                    "FIXEDWINDOW",
                    "9",
                    LONG,
                    "POLICY",
                    "en",
                ],
                "{a}3",
                "RL.ALL policy:en",
                1,
            ),
            (
                vec!["RL.TOKENBUCKET", &long_key, "1", "1", LONG],
                vec!["RL.TOKENBUCKET", &long_key, "1", "1", LONG],
                &long_key[..128],
                "RL.TOKENBUCKET",
                1,
            ),
        ];
        let mut replies = Vec::new();
        for (fill, deny, ..) in &cases {
            let _: Vec<i64> = query(&mut con, fill);
            replies.push(denied(&mut con, deny));
        }
        let end_ms = now_ms(&mut con);

        // Not logged: admitted calls, peeks, shadow denials, and denials of
        // keys a roll-out leaves in shadow.
        let shadowed = (0..)
            .map(|i| format!("s{i}"))
            .find(|k| rollout_bucket(k) >= 50)
            .unwrap();
        assert!(rl(&mut con, &["RL.HIT", "half", &shadowed]).allowed);
        let r = rl(&mut con, &["RL.HIT", "half", &shadowed]);
        assert_eq!((r.allowed, r.remaining, r.wait_ms), (true, 0, 0));
        assert_eq!(counter(&mut con, "ratelimit_policy_half_shadow_denied"), 1);
        rl(&mut con, &["RL.HIT", "sh", "user:2"]);
        assert!(rl(&mut con, &["RL.HIT", "sh", "user:2"]).allowed);
        rl(
            &mut con,
            &["RL.TOKENBUCKET", "tb", "1", "1", LONG, "COST", "0"],
        );

        let entries = log_get(&mut con, Some("100"));
        assert_eq!(entries.len(), cases.len(), "{entries:#?}");
        assert_eq!(log_len(&mut con), cases.len() as i64);
        // Newest first; ids grow by one per denial.
        let oldest_first: Vec<&Entry> = entries.iter().rev().collect();
        for (i, ((entry, (_, deny, key, source, cost)), reply)) in
            oldest_first.iter().zip(&cases).zip(&replies).enumerate()
        {
            assert_eq!(entry.id, oldest_first[0].id + i as i64, "{deny:?}");
            assert_eq!(entry.key, key.as_bytes(), "{deny:?}");
            assert_eq!(entry.source, *source, "{deny:?}");
            assert_eq!(entry.cost, *cost, "{deny:?}");
            assert_eq!(entry.wait_ms, reply[3], "{deny:?}: wait_ms as replied");
            assert!(
                start_ms <= entry.unix_ms && entry.unix_ms <= end_ms,
                "{deny:?}: unix_ms {} outside [{start_ms}, {end_ms}]",
                entry.unix_ms
            );
        }
        assert_eq!(entries[0].key.len(), 128, "long keys are cut");
        let never = entries.iter().find(|e| e.source == "RL.SLIDING").unwrap();
        assert_eq!(never.wait_ms, -1, "COST 2 on a limit of 1 never fits");
    });
}

#[test]
fn rl_log_get_takes_a_count_len_counts_and_reset_empties_without_reusing_ids() {
    for_each_server(|kind| {
        let server = Server::start(kind, &[]);
        let mut con = server.conn();
        assert_eq!(log_get(&mut con, None), []);
        assert_eq!(log_len(&mut con), 0);
        rl(&mut con, &["RL.FIXEDWINDOW", "k", "1", LONG]);
        for _ in 0..12 {
            denied(&mut con, &["RL.FIXEDWINDOW", "k", "1", LONG]);
        }
        assert_eq!(log_len(&mut con), 12);
        let ten = log_get(&mut con, None);
        assert_eq!(ten.len(), 10, "GET without a count: 10, like SLOWLOG");
        let all = log_get(&mut con, Some("12"));
        assert_eq!(&all[..10], &ten[..]);
        assert!(
            all.windows(2).all(|w| w[0].id == w[1].id + 1),
            "newest first"
        );
        assert_eq!(log_get(&mut con, Some("1000")), all);
        assert_eq!(log_get(&mut con, Some("3")), all[..3]);
        assert_eq!(log_get(&mut con, Some("0")), []);
        let last_id = all[0].id;

        let ok: String = query(&mut con, &["RL.LOG", "RESET"]);
        assert_eq!(ok, "OK");
        assert_eq!(log_len(&mut con), 0);
        assert_eq!(log_get(&mut con, None), []);
        assert_eq!(counter(&mut con, "ratelimit_deny_log_len"), 0);
        denied(&mut con, &["RL.FIXEDWINDOW", "k", "1", LONG]);
        assert_eq!(
            log_get(&mut con, None)[0].id,
            last_id + 1,
            "ids keep growing"
        );

        for (words, expected) in [
            (&["RL.LOG"][..], "ERR wrong number of arguments"),
            (&["RL.LOG", "GET", "-1"][..], "ERR count must be an integer"),
            (
                &["RL.LOG", "GET", "ten"][..],
                "ERR count must be an integer",
            ),
            (
                &["RL.LOG", "GET", "1", "2"][..],
                "ERR wrong number of arguments",
            ),
            (&["RL.LOG", "LEN", "1"][..], "ERR wrong number of arguments"),
            (
                &["RL.LOG", "RESET", "1"][..],
                "ERR wrong number of arguments",
            ),
            (&["RL.LOG", "TRIM"][..], "ERR unknown subcommand"),
        ] {
            let err = query_err(&mut con, words);
            assert!(err.starts_with(expected), "{words:?}: {err}");
        }
    });
}

#[test]
fn the_deny_log_keeps_the_newest_log_max_len_entries_and_0_turns_it_off() {
    for_each_server(|kind| {
        let server = Server::start(kind, &[]);
        let mut con = server.conn();
        assert_eq!(config_get(&mut con, "ratelimit.log-max-len"), "128");
        config_set(&mut con, "ratelimit.log-max-len", "3");
        assert_eq!(config_get(&mut con, "ratelimit.log-max-len"), "3");
        assert_eq!(counter(&mut con, "ratelimit_deny_log_max_len"), 3);
        rl(&mut con, &["RL.FIXEDWINDOW", "k", "1", LONG]);
        for _ in 0..5 {
            denied(&mut con, &["RL.FIXEDWINDOW", "k", "1", LONG]);
        }
        let kept = log_get(&mut con, Some("100"));
        assert_eq!(kept.len(), 3);
        assert_eq!(log_len(&mut con), 3);
        assert_eq!(counter(&mut con, "ratelimit_deny_log_len"), 3);
        let newest = kept[0].id;
        assert_eq!(
            kept.iter().map(|e| e.id).collect::<Vec<_>>(),
            [newest, newest - 1, newest - 2]
        );

        // Shrinking applies at once: the newest stay.
        config_set(&mut con, "ratelimit.log-max-len", "1");
        assert_eq!(log_len(&mut con), 1);
        assert_eq!(log_get(&mut con, None)[0].id, newest);

        // 0: nothing is recorded.
        config_set(&mut con, "ratelimit.log-max-len", "0");
        denied(&mut con, &["RL.FIXEDWINDOW", "k", "1", LONG]);
        assert_eq!(log_len(&mut con), 0);
        assert_eq!(log_get(&mut con, None), []);
        assert_eq!(counter(&mut con, "ratelimit_deny_log_max_len"), 0);

        for bad in ["-1", "1000001", "many"] {
            let err = query_err(&mut con, &["CONFIG", "SET", "ratelimit.log-max-len", bad]);
            assert!(err.starts_with("ERR"), "{bad}: {err}");
        }
        config_set(&mut con, "ratelimit.log-max-len", "1000000");
        assert_eq!(config_get(&mut con, "ratelimit.log-max-len"), "1000000");
    });
}

#[test]
fn turning_the_deny_log_off_and_on_again_starts_it_empty() {
    for_each_server(|kind| {
        let server = Server::start(kind, &[]);
        let mut con = server.conn();
        rl(&mut con, &["RL.FIXEDWINDOW", "k", "1", LONG]);
        for _ in 0..4 {
            denied(&mut con, &["RL.FIXEDWINDOW", "k", "1", LONG]);
        }
        config_set(&mut con, "ratelimit.log-max-len", "0");
        config_set(&mut con, "ratelimit.log-max-len", "128");
        assert_eq!(
            log_len(&mut con),
            0,
            "entries from before the log was off came back"
        );
        // Likewise, entries dropped by a smaller bound stay dropped.
        for _ in 0..4 {
            denied(&mut con, &["RL.FIXEDWINDOW", "k", "1", LONG]);
        }
        config_set(&mut con, "ratelimit.log-max-len", "2");
        config_set(&mut con, "ratelimit.log-max-len", "128");
        assert_eq!(
            log_len(&mut con),
            2,
            "entries beyond the old bound came back"
        );
    });
}

#[test]
fn log_max_len_is_taken_as_a_load_argument_and_on_the_command_line() {
    for_each_server(|kind| {
        // The harness puts these right after the module path.
        let server = Server::start(kind, &["log-max-len", "2"]);
        let mut con = server.conn();
        assert_eq!(config_get(&mut con, "ratelimit.log-max-len"), "2");
        rl(&mut con, &["RL.FIXEDWINDOW", "k", "1", LONG]);
        for _ in 0..3 {
            denied(&mut con, &["RL.FIXEDWINDOW", "k", "1", LONG]);
        }
        assert_eq!(log_len(&mut con), 2);
        drop(con);
        drop(server);

        let server = Server::start(kind, &["--ratelimit.log-max-len", "0"]);
        let mut con = server.conn();
        assert_eq!(config_get(&mut con, "ratelimit.log-max-len"), "0");
        rl(&mut con, &["RL.FIXEDWINDOW", "k", "1", LONG]);
        denied(&mut con, &["RL.FIXEDWINDOW", "k", "1", LONG]);
        assert_eq!(log_len(&mut con), 0);
    });
}

#[test]
fn a_bad_log_max_len_load_argument_fails_the_load_naming_it() {
    for_each_server(|kind| {
        let result = std::panic::catch_unwind(|| Server::start(kind, &["log-max-len", "-5"]));
        let message = match result {
            Ok(_) => panic!("the server started with log-max-len -5"),
            Err(panic) => panic.downcast_ref::<String>().cloned().unwrap_or_default(),
        };
        assert!(
            message.contains("ratelimit.log-max-len"),
            "the log names the config: {message}"
        );
    });
}

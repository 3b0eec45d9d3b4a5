//! Policies: rules kept in the server (`RL.POLICY SET|GET|DEL|LIST`), applied
//! with `RL.HIT name key [COST n]` or as `POLICY name` inside `RL.ALL`, with
//! the modes ENFORCE / SHADOW / OFF and the staged roll-out; and policies as
//! node state: replicated, saved in the RDB (and the AOF's RDB preamble),
//! replaced when a dataset is loaded.

use std::fs;
use std::time::Duration;

use crate::harness::*;

/// 2^40 ms as a duration: long enough that nothing refills, leaks or leaves
/// a window while a test runs, and a fixed window aligned on it that holds
/// "now" ends in 2039.
const LONG: &str = "1099511627776";

// ---------------------------------------------------------------------------
// Helpers

/// A policy's rule as `RL.POLICY GET` shows it.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Rule {
    algorithm: String,
    params: Vec<i64>,
    mode: String,
    rollout: i64,
}

/// A policy's counters as `RL.POLICY GET` shows them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Counts {
    calls: i64,
    admitted: i64,
    denied: i64,
    shadow_denied: i64,
}

/// `RL.POLICY GET name`, checked for its exact shape: `None` for nil.
fn policy_get(con: &mut Connection, name: &str) -> Option<(Rule, Counts)> {
    let value: Value = query(con, &["RL.POLICY", "GET", name]);
    let items = match value {
        Value::Nil => return None,
        Value::Array(items) => items,
        other => panic!("RL.POLICY GET {name}: not an array: {other:?}"),
    };
    let fields: Vec<String> = items.iter().step_by(2).map(text).collect();
    assert_eq!(
        fields,
        [
            "name",
            "algorithm",
            "params",
            "mode",
            "rollout",
            "calls",
            "admitted",
            "denied",
            "shadow_denied",
            "scale",
            "stage"
        ],
        "RL.POLICY GET {name}: fields (a policy without the protection loop)"
    );
    assert_eq!(text(&items[1]), name, "RL.POLICY GET {name}: name");
    let params = match &items[5] {
        Value::Array(params) => params.iter().map(int).collect(),
        other => panic!("RL.POLICY GET {name}: params is not an array: {other:?}"),
    };
    Some((
        Rule {
            algorithm: text(&items[3]),
            params,
            mode: text(&items[7]),
            rollout: int(&items[9]),
        },
        Counts {
            calls: int(&items[11]),
            admitted: int(&items[13]),
            denied: int(&items[15]),
            shadow_denied: int(&items[17]),
        },
    ))
}

fn rule(con: &mut Connection, name: &str) -> Rule {
    policy_get(con, name)
        .unwrap_or_else(|| panic!("policy {name} missing"))
        .0
}

fn counts(con: &mut Connection, name: &str) -> Counts {
    policy_get(con, name)
        .unwrap_or_else(|| panic!("policy {name} missing"))
        .1
}

/// `RL.POLICY SET <words...>`, which must answer OK.
fn set_policy(con: &mut Connection, words: &[&str]) {
    let reply: String = query(con, &[&["RL.POLICY", "SET"][..], words].concat());
    assert_eq!(reply, "OK", "RL.POLICY SET {words:?}");
}

fn set_policy_err(con: &mut Connection, words: &[&str]) -> String {
    query_err(con, &[&["RL.POLICY", "SET"][..], words].concat())
}

fn list(con: &mut Connection) -> Vec<String> {
    query(con, &["RL.POLICY", "LIST"])
}

fn hit(con: &mut Connection, name: &str, key: &str) -> Reply {
    rl(con, &["RL.HIT", name, key])
}

fn hit_cost(con: &mut Connection, name: &str, key: &str, cost: &str) -> Reply {
    rl(con, &["RL.HIT", name, key, "COST", cost])
}

/// The six integers of `RL.ALL`: the reply of the most restrictive limiter
/// and `denied_by`.
fn all(con: &mut Connection, words: &[&str]) -> (Reply, i64) {
    let ints: Vec<i64> = query(con, &[&["RL.ALL"][..], words].concat());
    assert_eq!(ints.len(), 6, "RL.ALL {words:?} replied {ints:?}");
    (Reply::from_ints(&ints[..5]), ints[5])
}

/// The roll-out percentile of a key, computed here independently of the
/// module: FNV-1a 64 of the key bytes, mod 100.
pub(super) fn rollout_bucket(key: &str) -> u64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for &byte in key.as_bytes() {
        hash ^= u64::from(byte);
        hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
    }
    hash % 100
}

/// `PEXPIRETIME key`: the absolute expiry in ms (-1 none, -2 no key).
fn pexpiretime(con: &mut Connection, key: &str) -> i64 {
    query(con, &["PEXPIRETIME", key])
}

/// Writes the server counts (`rdb_changes_since_last_save`): a call that
/// changes nothing must not move it.
fn changes(server: &Server) -> u64 {
    info_field(&server.info("persistence"), "rdb_changes_since_last_save")
        .and_then(|v| v.parse().ok())
        .expect("rdb_changes_since_last_save")
}

/// One policy of each algorithm, with every mode and some roll-outs.
const EVERY_KIND: &[&[&str]] = &[
    &["tb", "TOKENBUCKET", "5", "2", "3600000"],
    &["fw", "FIXEDWINDOW", "100", "3600000", "MODE", "SHADOW"],
    &["lb", "LEAKYBUCKET", "50", "10", "3600000", "ROLLOUT", "30"],
    &[
        "sl", "SLIDING", "1000", "3600000", "MODE", "OFF", "ROLLOUT", "0",
    ],
    &[
        "api:hash-1.v2",
        "HASHWINDOW",
        "600",
        "3600000",
        "60000",
        "MODE",
        "ENFORCE",
        "ROLLOUT",
        "70",
    ],
];

/// The rules of [`EVERY_KIND`] as GET shows them.
fn every_kind_rules() -> Vec<(String, Rule)> {
    let r = |alg: &str, params: &[i64], mode: &str, rollout: i64| Rule {
        algorithm: alg.into(),
        params: params.to_vec(),
        mode: mode.into(),
        rollout,
    };
    vec![
        (
            "tb".into(),
            r("TOKENBUCKET", &[5, 2, 3600000], "ENFORCE", 100),
        ),
        (
            "fw".into(),
            r("FIXEDWINDOW", &[100, 3600000], "SHADOW", 100),
        ),
        (
            "lb".into(),
            r("LEAKYBUCKET", &[50, 10, 3600000], "ENFORCE", 30),
        ),
        ("sl".into(), r("SLIDING", &[1000, 3600000], "OFF", 0)),
        (
            "api:hash-1.v2".into(),
            r("HASHWINDOW", &[600, 3600000, 60000], "ENFORCE", 70),
        ),
    ]
}

fn set_every_kind(con: &mut Connection) {
    for words in EVERY_KIND {
        set_policy(con, words);
    }
}

/// Every policy of a node: names sorted, with their rules.
fn all_rules(con: &mut Connection) -> Vec<(String, Rule)> {
    list(con)
        .into_iter()
        .map(|name| {
            let rule = rule(con, &name);
            (name, rule)
        })
        .collect()
}

fn sorted(mut rules: Vec<(String, Rule)>) -> Vec<(String, Rule)> {
    rules.sort_by(|a, b| a.0.cmp(&b.0));
    rules
}

// ---------------------------------------------------------------------------
// RL.POLICY SET / GET / DEL / LIST

#[test]
fn set_get_del_and_list_manage_named_rules() {
    for_each_server(|kind| {
        let server = Server::start(kind, &[]);
        let mut con = server.conn();
        assert_eq!(list(&mut con), Vec::<String>::new());
        assert_eq!(
            policy_get(&mut con, "tb"),
            None,
            "GET of a missing policy is nil"
        );

        set_every_kind(&mut con);
        assert_eq!(all_rules(&mut con), sorted(every_kind_rules()));
        assert_eq!(
            list(&mut con),
            ["api:hash-1.v2", "fw", "lb", "sl", "tb"],
            "LIST is sorted"
        );
        assert_eq!(counts(&mut con, "tb"), Counts::default());

        // Words are case-insensitive; GET shows them in capitals.
        set_policy(
            &mut con,
            &[
                "tb",
                "tokenbucket",
                "7",
                "1",
                "500",
                "mode",
                "shadow",
                "rollout",
                "15",
            ],
        );
        assert_eq!(
            rule(&mut con, "tb"),
            Rule {
                algorithm: "TOKENBUCKET".into(),
                params: vec![7, 1, 500],
                mode: "SHADOW".into(),
                rollout: 15
            },
            "SET replaces the rule"
        );
        // Names are case-sensitive.
        assert_eq!(policy_get(&mut con, "TB"), None);

        let deleted: i64 = query(&mut con, &["RL.POLICY", "DEL", "tb"]);
        assert_eq!(deleted, 1);
        let deleted: i64 = query(&mut con, &["RL.POLICY", "DEL", "tb"]);
        assert_eq!(deleted, 0, "DEL of a missing policy");
        assert_eq!(policy_get(&mut con, "tb"), None);
        assert_eq!(list(&mut con), ["api:hash-1.v2", "fw", "lb", "sl"]);
        // Policies are not keys.
        assert_eq!(dbsize(&mut con), 0);
        let _: () = query(&mut con, &["FLUSHALL"]);
        assert_eq!(list(&mut con).len(), 4, "FLUSHALL leaves policies alone");
    });
}

#[test]
fn policy_names_are_1_to_256_bytes_of_printable_ascii_without_spaces() {
    for_each_server(|kind| {
        let server = Server::start(kind, &[]);
        let mut con = server.conn();
        let every_byte: String = ('!'..='~').collect();
        let longest = format!("GET:/{}", "x".repeat(251));
        let mut good = vec![
            "a",
            "POST:/api/order/create",
            "GET:/v2/{org}/items",
            "tenant=acme;tier=free",
            "api:orders.create-v2_b",
            &every_byte,
            &longest,
        ];
        for name in &good {
            set_policy(&mut con, &[name, "FIXEDWINDOW", "1", LONG]);
            // GET checks that it shows the name as it is.
            assert!(policy_get(&mut con, name).is_some(), "{name}");
            // The limit is 1: this key's next call through it is denied.
            assert!(hit(&mut con, name, name).allowed, "{name}");
        }
        good.sort();
        assert_eq!(list(&mut con), good, "LIST shows the names as they are");

        // The deny log too, for RL.HIT and RL.ALL.
        let route = "POST:/api/order/create";
        assert!(!hit(&mut con, route, route).allowed);
        let route = "GET:/v2/{org}/items";
        let (reply, denied_by) = all(&mut con, &["1", route, "POLICY", route]);
        assert_eq!((reply.allowed, denied_by), (false, 1));
        assert!(!hit(&mut con, &longest, &longest).allowed);
        let log: Vec<Vec<Value>> = query(&mut con, &["RL.LOG", "GET", "3"]);
        let sources: Vec<String> = log.iter().map(|entry| text(&entry[3])).collect();
        assert_eq!(
            sources,
            [
                format!("policy:{longest}"),
                "RL.ALL policy:GET:/v2/{org}/items".to_string(),
                "policy:POST:/api/order/create".to_string(),
            ]
        );

        let writes = changes(&server);
        let too_long = "x".repeat(257);
        for bad in [
            "", &too_long, "a b", " a", "a\tb", "a\nb", "a\rb", "a\x00b", "a\x01", "a\x7fb",
            "naïve",
        ] {
            let err = set_policy_err(&mut con, &[bad, "FIXEDWINDOW", "10", "1000"]);
            assert!(
                err.starts_with(
                    "ERR policy name must be 1 to 256 bytes of printable ASCII without spaces, got '"
                ),
                "{bad:?}: {err}"
            );
        }
        assert_eq!(list(&mut con), good, "no bad name was created");
        assert_eq!(changes(&server), writes, "a refused name wrote something");
    });
}

#[test]
fn a_bad_rule_is_refused_naming_the_argument_and_leaves_the_policy_unchanged() {
    for_each_server(|kind| {
        let server = Server::start(kind, &[]);
        let mut con = server.conn();
        set_policy(
            &mut con,
            &["p", "TOKENBUCKET", "5", "1", "1000", "MODE", "SHADOW"],
        );
        let before = rule(&mut con, "p");
        let cases: &[(&[&str], &str)] = &[
            (
                &["p", "TOKENBUCKET", "0", "1", "1000"],
                "ERR capacity must be an integer from 1 to 1099511627776",
            ),
            (
                &["p", "TOKENBUCKET", "5", "x", "1000"],
                "ERR refill_count must be an integer from 1 to 1099511627776",
            ),
            (
                &["p", "FIXEDWINDOW", "10", "-5"],
                "ERR window_ms must be an integer from 1 to 1099511627776",
            ),
            (
                &["p", "LEAKYBUCKET", "5", "1", "1099511627777"],
                "ERR leak_ms must be an integer from 1 to 1099511627776",
            ),
            (&["p", "HASHWINDOW", "10", "1000", "3"], "ERR bucket_ms must divide window_ms"),
            (
                &["p", "SLIDING", "100001", "1000"],
                "ERR limit is above ratelimit.sliding-max-limit (100000)",
            ),
            (
                &["p", "HASHWINDOW", "10", "3601", "1"],
                "ERR window_ms / bucket_ms is above ratelimit.hashwindow-max-buckets (3600)",
            ),
            (&["p", "TOKENBUCKET", "5", "1"], "ERR policy needs 3 parameters"),
            (
                &["p", "GCRA", "5", "1"],
                "ERR policy: unknown algorithm 'GCRA' (expected TOKENBUCKET, FIXEDWINDOW, LEAKYBUCKET, SLIDING, HASHWINDOW, CONCURRENCY, QUOTA)",
            ),
            (
                &["p", "POLICY", "q", "1"],
                "ERR policy: unknown algorithm 'POLICY' (expected TOKENBUCKET, FIXEDWINDOW, LEAKYBUCKET, SLIDING, HASHWINDOW, CONCURRENCY, QUOTA)",
            ),
            (
                &["p", "FIXEDWINDOW", "10", "1000", "MODE", "LOUD"],
                "ERR MODE must be ENFORCE, SHADOW or OFF, got 'LOUD'",
            ),
            (&["p", "FIXEDWINDOW", "10", "1000", "MODE"], "ERR MODE needs a value"),
            (&["p", "FIXEDWINDOW", "10", "1000", "ROLLOUT"], "ERR ROLLOUT needs a value"),
            (
                &["p", "FIXEDWINDOW", "10", "1000", "ROLLOUT", "101"],
                "ERR ROLLOUT must be an integer from 0 to 100",
            ),
            (
                &["p", "FIXEDWINDOW", "10", "1000", "ROLLOUT", "-1"],
                "ERR ROLLOUT must be an integer from 0 to 100",
            ),
            (
                &["p", "FIXEDWINDOW", "10", "1000", "ROLLOUT", "50%"],
                "ERR ROLLOUT must be an integer from 0 to 100",
            ),
            (
                &["p", "FIXEDWINDOW", "10", "1000", "MODE", "OFF", "MODE", "OFF"],
                "ERR MODE given more than once",
            ),
            (
                &["p", "FIXEDWINDOW", "10", "1000", "ROLLOUT", "5", "ROLLOUT", "5"],
                "ERR ROLLOUT given more than once",
            ),
            (
                &["p", "FIXEDWINDOW", "10", "1000", "COST", "2"],
                "ERR unknown option 'COST' (expected MODE, ROLLOUT, ADAPT, STAGES or WINDOW)",
            ),
            (
                &["p", "FIXEDWINDOW", "10", "1000", "60"],
                "ERR unknown option '60' (expected MODE, ROLLOUT, ADAPT, STAGES or WINDOW)",
            ),
        ];
        for (words, expected) in cases {
            assert_eq!(&set_policy_err(&mut con, words), expected, "{words:?}");
            assert_eq!(rule(&mut con, "p"), before, "{words:?} changed the policy");
        }
        assert_eq!(list(&mut con), ["p"], "no failed SET created a policy");

        // Arity and subcommands.
        for (words, expected) in [
            (
                &["RL.POLICY"][..],
                "ERR wrong number of arguments for 'RL.POLICY' command",
            ),
            (
                &["RL.POLICY", "SET", "p", "TOKENBUCKET"][..],
                "ERR wrong number of arguments",
            ),
            (&["RL.POLICY", "GET"][..], "ERR wrong number of arguments"),
            (
                &["RL.POLICY", "GET", "p", "q"][..],
                "ERR wrong number of arguments",
            ),
            (&["RL.POLICY", "DEL"][..], "ERR wrong number of arguments"),
            (
                &["RL.POLICY", "LIST", "p"][..],
                "ERR wrong number of arguments",
            ),
            (
                &["RL.POLICY", "RENAME", "p", "q"][..],
                "ERR unknown subcommand",
            ),
            (&["RL.HIT", "p"][..], "ERR wrong number of arguments"),
        ] {
            let err = query_err(&mut con, words);
            assert!(err.starts_with(expected), "{words:?}: {err}");
        }
    });
}

#[test]
fn policy_subcommands_are_flagged_write_or_readonly() {
    for_each_server(|kind| {
        let server = Server::start(kind, &[]);
        let mut con = server.conn();
        let flags = |con: &mut Connection, name: &str| -> Vec<String> {
            let info: Value = query(con, &["COMMAND", "INFO", name]);
            let Value::Array(entries) = info else {
                panic!("COMMAND INFO {name}: {info:?}")
            };
            let Some(Value::Array(entry)) = entries.first() else {
                panic!("COMMAND INFO {name}: {entries:?}")
            };
            match &entry[2] {
                Value::Array(flags) => flags.iter().map(text).collect(),
                other => panic!("COMMAND INFO {name} flags: {other:?}"),
            }
        };
        for (name, expected, not) in [
            ("RL.POLICY|SET", "write", "readonly"),
            ("RL.POLICY|DEL", "write", "readonly"),
            ("RL.POLICY|GET", "readonly", "write"),
            ("RL.POLICY|LIST", "readonly", "write"),
            ("RL.HIT", "write", "readonly"),
        ] {
            let flags = flags(&mut con, name);
            assert!(flags.iter().any(|f| f == expected), "{name}: {flags:?}");
            assert!(!flags.iter().any(|f| f == not), "{name}: {flags:?}");
        }
        // RL.HIT declares its key (the second argument).
        let keys: Vec<String> = query(
            &mut con,
            &["COMMAND", "GETKEYS", "RL.HIT", "pol", "user:1", "COST", "2"],
        );
        assert_eq!(keys, ["user:1"]);
    });
}

// ---------------------------------------------------------------------------
// RL.HIT

#[test]
fn rl_hit_answers_as_the_algorithm_of_the_policy_on_the_same_key() {
    for_each_server(|kind| {
        let server = Server::start(kind, &[]);
        let mut con = server.conn();
        // (policy rule, the plain command's words after the key, type name)
        let cases: &[(&[&str], &[&str], &str)] = &[
            (
                &["TOKENBUCKET", "3", "1", LONG],
                &["RL.TOKENBUCKET", "3", "1", LONG],
                "rl-tokbkt",
            ),
            (
                &["FIXEDWINDOW", "3", LONG],
                &["RL.FIXEDWINDOW", "3", LONG],
                "rl-fixwin",
            ),
            (
                &["LEAKYBUCKET", "3", "1", LONG],
                &["RL.LEAKYBUCKET", "3", "1", LONG],
                "rl-leakbk",
            ),
            (
                &["SLIDING", "3", LONG],
                &["RL.SLIDING", "3", LONG],
                "rl-slilog",
            ),
            (
                &["HASHWINDOW", "3", LONG, LONG],
                &["RL.HASHWINDOW", "3", LONG, LONG],
                "rl-hashwn",
            ),
        ];
        for (i, (rule_words, plain, type_name)) in cases.iter().enumerate() {
            let name = format!("p{i}");
            set_policy(&mut con, &[&[name.as_str()][..], rule_words].concat());
            let (via_policy, twin) = (format!("hit:{i}"), format!("plain:{i}"));
            let plain_call = |key: &str, cost: &str| -> Vec<String> {
                let mut words = vec![plain[0].to_string(), key.to_string()];
                words.extend(plain[1..].iter().map(|w| w.to_string()));
                words.extend(["COST".to_string(), cost.to_string()]);
                words
            };
            let call = |con: &mut Connection, words: Vec<String>| {
                let words: Vec<&str> = words.iter().map(String::as_str).collect();
                rl(con, &words)
            };
            for cost in ["1", "0", "2", "1", "5", "0"] {
                let r = hit_cost(&mut con, &name, &via_policy, cost);
                let p = call(&mut con, plain_call(&twin, cost));
                assert_eq!(
                    (r.allowed, r.limit, r.remaining),
                    (p.allowed, p.limit, p.remaining),
                    "{plain:?} COST {cost}: RL.HIT {r:?}, plain {p:?}"
                );
                assert_eq!(r.wait_ms == 0, p.wait_ms == 0, "{plain:?} COST {cost}");
                assert_eq!(r.wait_ms == -1, p.wait_ms == -1, "{plain:?} COST {cost}");
            }
            assert_eq!(key_type(&mut con, &via_policy), *type_name);
            // The key RL.HIT made is a plain limiter: the command reads it.
            let through_plain = call(&mut con, plain_call(&via_policy, "0"));
            let through_hit = hit_cost(&mut con, &name, &via_policy, "0");
            assert_eq!(through_plain.remaining, through_hit.remaining, "{plain:?}");
        }
    });
}

#[test]
fn rl_hit_takes_cost_and_refuses_what_a_limiter_command_refuses() {
    for_each_server(|kind| {
        let server = Server::start(kind, &[]);
        let mut con = server.conn();
        set_policy(&mut con, &["p", "TOKENBUCKET", "10", "1", LONG]);

        // COST 0 peeks without creating the key.
        let r = hit_cost(&mut con, "p", "k", "0");
        assert_eq!(
            (r.allowed, r.limit, r.remaining, r.wait_ms),
            (true, 10, 10, 0)
        );
        assert!(!exists(&mut con, "k"), "a peek created the key");
        let r = hit_cost(&mut con, "p", "k", "4");
        assert_eq!((r.allowed, r.remaining), (true, 6));
        assert!(pttl(&mut con, "k") > 0, "an admitted call sets the TTL");
        let r = hit_cost(&mut con, "p", "k", "11");
        assert_eq!(
            (r.allowed, r.remaining, r.wait_ms),
            (false, 6, -1),
            "never fits"
        );
        let r = rl(&mut con, &["RL.HIT", "p", "k", "cost", "6"]);
        assert_eq!(
            (r.allowed, r.remaining),
            (true, 0),
            "options are case-insensitive"
        );

        let _: () = query(&mut con, &["SET", "str", "x"]);
        rl(&mut con, &["RL.FIXEDWINDOW", "fw", "10", LONG]);
        for (words, expected) in [
            (&["RL.HIT", "nope", "k"][..], "ERR unknown policy 'nope'"),
            (
                &["RL.HIT", "nope", "k", "COST", "0"][..],
                "ERR unknown policy 'nope'",
            ),
            (&["RL.HIT", "p", "k", "COST"][..], "ERR COST needs a value"),
            (
                &["RL.HIT", "p", "k", "COST", "-1"][..],
                "ERR COST must be an integer from 0 to 1099511627776",
            ),
            (
                &["RL.HIT", "p", "k", "COST", "1", "COST", "1"][..],
                "ERR COST given more than once",
            ),
            (
                &["RL.HIT", "p", "k", "LIMIT", "3"][..],
                "ERR unknown option 'LIMIT'",
            ),
            (
                &["RL.HIT", "p", "k", "AT", "1"][..],
                "ERR AT is reserved for replication and AOF loading",
            ),
            (
                &["RL.HIT", "p", "str"][..],
                "WRONGTYPE Operation against a key holding the wrong kind of value",
            ),
            (
                &["RL.HIT", "p", "fw"][..],
                "WRONGTYPE Operation against a key holding the wrong kind of value",
            ),
        ] {
            let err = query_err(&mut con, words);
            assert!(err.starts_with(expected), "{words:?}: {err}");
        }
        assert!(!exists(&mut con, "nope"));
        let s: String = query(&mut con, &["GET", "str"]);
        assert_eq!(s, "x", "WRONGTYPE left the key alone");
    });
}

#[test]
fn enforce_denies_like_the_algorithm_and_a_denial_changes_nothing() {
    for_each_server(|kind| {
        let server = Server::start(kind, &[]);
        let mut con = server.conn();
        set_policy(&mut con, &["p", "TOKENBUCKET", "2", "1", "3600000"]);
        assert!(hit(&mut con, "p", "k").allowed);
        assert!(hit(&mut con, "p", "k").allowed);
        let (state, expiry) = (dump(&mut con, "k"), pexpiretime(&mut con, "k"));
        let writes = changes(&server);
        let r = hit(&mut con, "p", "k");
        assert_eq!((r.allowed, r.limit, r.remaining), (false, 2, 0));
        assert!(
            r.wait_ms > 0 && r.wait_ms <= 3_600_000,
            "wait_ms {}",
            r.wait_ms
        );
        assert_eq!(dump(&mut con, "k"), state, "a denial changed the state");
        assert_eq!(
            pexpiretime(&mut con, "k"),
            expiry,
            "a denial moved the expiry"
        );
        assert_eq!(changes(&server), writes, "a denial counted as a write");
        assert_eq!(
            counts(&mut con, "p"),
            Counts {
                calls: 3,
                admitted: 2,
                denied: 1,
                shadow_denied: 0
            }
        );
    });
}

#[test]
fn shadow_evaluates_takes_only_what_it_admits_and_always_answers_allowed() {
    for_each_server(|kind| {
        let server = Server::start(kind, &[]);
        let mut con = server.conn();
        set_policy(
            &mut con,
            &["p", "TOKENBUCKET", "2", "1", "3600000", "MODE", "SHADOW"],
        );
        let r = hit(&mut con, "p", "k");
        assert_eq!((r.allowed, r.remaining, r.wait_ms), (true, 1, 0));
        let r = hit(&mut con, "p", "k");
        assert_eq!((r.allowed, r.remaining, r.wait_ms), (true, 0, 0));
        let (state, expiry) = (dump(&mut con, "k"), pexpiretime(&mut con, "k"));
        let writes = changes(&server);
        // Would be denied: answered allowed, with wait_ms 0, nothing taken.
        for cost in ["1", "2", "3"] {
            let r = hit_cost(&mut con, "p", "k", cost);
            assert_eq!(
                (r.allowed, r.limit, r.remaining, r.wait_ms),
                (true, 2, 0, 0),
                "a shadow denial of COST {cost}"
            );
        }
        assert_eq!(dump(&mut con, "k"), state, "a shadow denial took units");
        assert_eq!(pexpiretime(&mut con, "k"), expiry);
        assert_eq!(
            changes(&server),
            writes,
            "a shadow denial counted as a write"
        );
        assert_eq!(
            counts(&mut con, "p"),
            Counts {
                calls: 5,
                admitted: 2,
                denied: 3,
                shadow_denied: 3
            },
            "a shadow denial counts as denied and as shadow_denied"
        );
        let log_len: i64 = query(&mut con, &["RL.LOG", "LEN"]);
        assert_eq!(log_len, 0, "shadow denials are not in the deny log");

        // Going live: the state the shadow run built carries over.
        set_policy(
            &mut con,
            &["p", "TOKENBUCKET", "2", "1", "3600000", "MODE", "ENFORCE"],
        );
        let r = hit(&mut con, "p", "k");
        assert_eq!((r.allowed, r.remaining), (false, 0), "enforced at once");
        assert!(r.wait_ms > 0);
    });
}

#[test]
fn off_answers_allowed_at_once_and_touches_no_state() {
    for_each_server(|kind| {
        let server = Server::start(kind, &[]);
        let mut con = server.conn();
        let cases: &[(&[&str], i64)] = &[
            (&["TOKENBUCKET", "3", "1", LONG], 3),
            (&["FIXEDWINDOW", "4", LONG], 4),
            (&["LEAKYBUCKET", "5", "1", LONG], 5),
            (&["SLIDING", "6", LONG], 6),
            (&["HASHWINDOW", "7", LONG, LONG], 7),
        ];
        for (i, (rule_words, limit)) in cases.iter().enumerate() {
            let name = format!("p{i}");
            let key = format!("k{i}");
            // Some state first, in ENFORCE.
            set_policy(&mut con, &[&[name.as_str()][..], rule_words].concat());
            hit_cost(&mut con, &name, &key, "2");
            let (state, expiry) = (dump(&mut con, &key), pexpiretime(&mut con, &key));
            assert!(state.is_some() && expiry > 0);

            set_policy(
                &mut con,
                &[&[name.as_str()][..], rule_words, &["MODE", "OFF"]].concat(),
            );
            let writes = changes(&server);
            for (k, cost) in [(key.as_str(), "1"), (key.as_str(), "1000"), ("absent", "1")] {
                let r = hit_cost(&mut con, &name, k, cost);
                assert_eq!(
                    r,
                    Reply {
                        allowed: true,
                        limit: *limit,
                        remaining: *limit,
                        wait_ms: 0,
                        reset_ms: 0
                    },
                    "{rule_words:?} OFF on {k} COST {cost}"
                );
            }
            assert_eq!(
                dump(&mut con, &key),
                state,
                "{rule_words:?}: OFF changed the state"
            );
            assert_eq!(
                pexpiretime(&mut con, &key),
                expiry,
                "{rule_words:?}: OFF moved the TTL"
            );
            assert!(!exists(&mut con, "absent"), "OFF created a key");
            assert_eq!(changes(&server), writes, "OFF counted as a write");

            // The kill switch undone: the state is as it was.
            set_policy(&mut con, &[&[name.as_str()][..], rule_words].concat());
            let r = hit_cost(&mut con, &name, &key, "0");
            assert_eq!(r.remaining, limit - 2, "{rule_words:?}");
        }
        // OFF does not even look at the key.
        let _: () = query(&mut con, &["SET", "str", "x"]);
        set_policy(
            &mut con,
            &["p0", "TOKENBUCKET", "3", "1", LONG, "MODE", "OFF"],
        );
        let r = hit(&mut con, "p0", "str");
        assert_eq!((r.allowed, r.limit, r.remaining), (true, 3, 3));
        // Only calls are counted for OFF.
        let c = counts(&mut con, "p0");
        assert_eq!((c.admitted, c.denied, c.shadow_denied), (1, 0, 0), "{c:?}");
    });
}

#[test]
fn rollout_enforces_exactly_the_keys_whose_stable_hash_is_below_the_percentage() {
    for_each_server(|kind| {
        let server = Server::start(kind, &[]);
        let mut con = server.conn();
        let keys: Vec<String> = (0..1000).map(|i| format!("user:{i}")).collect();
        // One token per key, never refilled during the test: after a first
        // call every key's bucket is empty, and a call is denied exactly
        // when the key is enforced.
        set_policy(
            &mut con,
            &["p", "TOKENBUCKET", "1", "1", LONG, "MODE", "SHADOW"],
        );
        let hit_all = |con: &mut Connection| -> Vec<Reply> {
            let mut pipe = redis::pipe();
            for key in &keys {
                pipe.cmd("RL.HIT").arg("p").arg(key);
            }
            let replies: Vec<Vec<i64>> = pipe.query(con).expect("pipelined RL.HIT");
            replies.iter().map(|ints| Reply::from_ints(ints)).collect()
        };
        assert!(hit_all(&mut con)
            .iter()
            .all(|r| r.allowed && r.remaining == 0));

        let mut enforced_before = vec![false; keys.len()];
        let mut shadow_denied = 0;
        for p in [0u64, 10, 30, 50, 100] {
            set_policy(
                &mut con,
                &[
                    "p",
                    "TOKENBUCKET",
                    "1",
                    "1",
                    LONG,
                    "ROLLOUT",
                    &p.to_string(),
                ],
            );
            let replies = hit_all(&mut con);
            let enforced: Vec<bool> = replies.iter().map(|r| !r.allowed).collect();
            for ((key, r), &is) in keys.iter().zip(&replies).zip(&enforced) {
                assert_eq!(
                    is,
                    rollout_bucket(key) < p,
                    "ROLLOUT {p}: {key} (bucket {}) enforced={is}",
                    rollout_bucket(key)
                );
                if !is {
                    assert_eq!(r.wait_ms, 0, "a shadowed key waits for nothing");
                }
            }
            for (key, (&was, &is)) in keys.iter().zip(enforced_before.iter().zip(&enforced)) {
                assert!(!was || is, "raising ROLLOUT to {p} stopped enforcing {key}");
            }
            let share = enforced.iter().filter(|&&e| e).count() as i64;
            assert!(
                (share - p as i64 * 10).abs() <= 50,
                "ROLLOUT {p}: {share} of 1000 keys enforced"
            );
            shadow_denied += keys.len() as i64 - share;
            enforced_before = enforced;
        }
        assert_eq!(counts(&mut con, "p").shadow_denied, shadow_denied);

        // SHADOW ignores the roll-out: nothing is enforced.
        set_policy(
            &mut con,
            &[
                "p",
                "TOKENBUCKET",
                "1",
                "1",
                LONG,
                "MODE",
                "SHADOW",
                "ROLLOUT",
                "100",
            ],
        );
        assert!(hit_all(&mut con).iter().all(|r| r.allowed));
    });
}

#[test]
fn a_changed_policy_applies_to_the_next_call_and_the_state_carries_over() {
    for_each_server(|kind| {
        let server = Server::start(kind, &[]);
        let mut con = server.conn();
        // The same steps through the policy and through the plain command on
        // a twin key give the same answers.
        let steps: &[(&[&str], &str)] = &[
            (&["10", "1", LONG], "4"),
            (&["5", "1", LONG], "1"), // lower capacity: 4 of 5 used, 1 left
            (&["5", "1", LONG], "1"), // now empty: denied
            (&["20", "1", LONG], "10"), // more room: 20 - 5 used = 15
            (&["20", "1", LONG], "0"),
        ];
        let mut replies = Vec::new();
        for (params, cost) in steps {
            set_policy(&mut con, &[&["p", "TOKENBUCKET"][..], params].concat());
            let r = hit_cost(&mut con, "p", "k", cost);
            let twin = rl(
                &mut con,
                &[&["RL.TOKENBUCKET", "twin"][..], params, &["COST", cost]].concat(),
            );
            assert_eq!(
                (r.allowed, r.limit, r.remaining),
                (twin.allowed, twin.limit, twin.remaining),
                "{params:?} COST {cost}"
            );
            replies.push((r.allowed, r.limit, r.remaining));
        }
        assert_eq!(
            replies,
            [
                (true, 10, 6),
                (true, 5, 0),
                (false, 5, 0),
                (true, 20, 5),
                (true, 20, 5)
            ]
        );

        // A new algorithm on existing keys: WRONGTYPE until they expire, so
        // a rule changing algorithm needs a new key space (see
        // docs/operations.md).
        set_policy(&mut con, &["p", "FIXEDWINDOW", "10", LONG]);
        let err = query_err(&mut con, &["RL.HIT", "p", "k"]);
        assert!(err.starts_with("WRONGTYPE"), "{err}");
        assert!(hit(&mut con, "p", "k:v2").allowed);
    });
}

/// The SPEC's reading of a parameter change, through a policy: after
/// `RL.POLICY SET` with a new limit, `RL.HIT` on the same key keeps what was
/// consumed. 10 consumed of 10, raised to 100: 90 left at once; 10 consumed
/// of 100, lowered to 20: 10 left; either way exactly that many more are
/// admitted (nothing was refilled). For the leaky bucket the limit is the
/// queue's capacity and `remaining` its free room.
#[test]
fn a_policys_raised_or_lowered_limit_keeps_what_was_consumed() {
    // Periods under which nothing refills, leaks or leaves a window while
    // the test runs.
    let rules: &[(&str, &[&str])] = &[
        ("TOKENBUCKET", &["1", LONG]),
        ("LEAKYBUCKET", &["1", LONG]),
        ("FIXEDWINDOW", &[LONG]),
        ("SLIDING", &[LONG]),
        ("HASHWINDOW", &[LONG, LONG]),
    ];
    for_each_server(|kind| {
        let server = Server::start(kind, &[]);
        let mut con = server.conn();
        for &(algorithm, rest) in rules {
            for (case, old, new, left) in
                [("raised", "10", "100", 90), ("lowered", "100", "20", 10)]
            {
                let key = format!("{algorithm}:{case}");
                let what = format!("{algorithm}: 10 consumed of {old}, {case} to {new}");
                set_policy(&mut con, &[&["p", algorithm, old][..], rest].concat());
                assert!(hit_cost(&mut con, "p", &key, "10").allowed, "{what}");
                set_policy(&mut con, &[&["p", algorithm, new][..], rest].concat());
                let r = hit_cost(&mut con, "p", &key, "0");
                assert_eq!(
                    (r.limit, r.remaining),
                    (new.parse().unwrap(), left),
                    "{what}: {r:?}"
                );
                let r = hit_cost(&mut con, "p", &key, &left.to_string());
                assert_eq!((r.allowed, r.remaining), (true, 0), "{what}: {r:?}");
                let r = hit_cost(&mut con, "p", &key, "1");
                assert!(!r.allowed, "{what}: one more admitted: {r:?}");
            }
        }
    });
}

#[test]
fn a_deleted_policy_is_unknown_to_the_next_call_and_its_keys_stay() {
    for_each_server(|kind| {
        let server = Server::start(kind, &[]);
        let mut con = server.conn();
        set_policy(&mut con, &["p", "TOKENBUCKET", "5", "1", LONG]);
        hit(&mut con, "p", "k");
        let _: i64 = query(&mut con, &["RL.POLICY", "DEL", "p"]);
        assert_eq!(
            query_err(&mut con, &["RL.HIT", "p", "k"]),
            "ERR unknown policy 'p'"
        );
        assert!(
            exists(&mut con, "k"),
            "deleting a policy keeps its limiter keys"
        );
        set_policy(&mut con, &["p", "TOKENBUCKET", "5", "1", LONG]);
        assert_eq!(
            hit(&mut con, "p", "k").remaining,
            3,
            "the key's state is still used"
        );
    });
}

/// `used_memory`, once `con` is the only client left (a closed client's
/// buffers are freed when the server notices the close).
fn used_memory_alone(con: &mut Connection) -> i64 {
    poll_for(
        "every other client gone",
        Duration::from_secs(10),
        || info_field(&info_via(con, "clients"), "connected_clients"),
        |n| n.as_deref() == Some("1"),
    );
    info_field(&info_via(con, "memory"), "used_memory")
        .and_then(|v| v.parse().ok())
        .expect("used_memory in INFO memory")
}

/// `rounds` times, with a fresh name each: `RL.POLICY SET`, a call through
/// the policy (a peek, which creates no key) and `RL.POLICY DEL`; pipelined,
/// on a connection of its own, closed at the end with its buffers.
fn set_call_and_delete(server: &Server, prefix: &str, rounds: usize) {
    let mut con = server.conn();
    let names: Vec<String> = (0..rounds).map(|i| format!("{prefix}{i}")).collect();
    for chunk in names.chunks(1000) {
        let mut pipe = redis::pipe();
        for name in chunk {
            pipe.add_command(command(&[
                "RL.POLICY",
                "SET",
                name,
                "TOKENBUCKET",
                "5",
                "1",
                "1000",
            ]));
            pipe.add_command(command(&["RL.HIT", name, "k", "COST", "0"]));
            pipe.add_command(command(&["RL.POLICY", "DEL", name]));
        }
        let replies: Vec<Value> = pipe
            .query(&mut con)
            .unwrap_or_else(|e| panic!("SET/HIT/DEL pipeline: {}", error_text(&e)));
        for round in replies.chunks(3) {
            assert!(matches!(round[0], Value::Okay), "SET: {:?}", round[0]);
            assert_eq!(Reply::from_value(&round[1]).remaining, 5);
            assert_eq!(int(&round[2]), 1);
        }
    }
}

/// Automation that creates and deletes policies all day does not grow the
/// server: a deleted policy frees what it held, its counters too.
#[test]
fn deleting_policies_gives_their_memory_back() {
    for_each_server(|kind| {
        let server = Server::start(kind, &[]);
        let mut con = server.conn();
        set_call_and_delete(&server, "warm-up:", 2_000);
        let before = used_memory_alone(&mut con);
        set_call_and_delete(&server, "tenant:", 20_000);
        let after = used_memory_alone(&mut con);
        assert_eq!(list(&mut con), Vec::<String>::new());
        assert!(
            after - before < 64 * 1024,
            "20,000 policies set and deleted left {} bytes behind ({before} -> {after})",
            after - before
        );
        assert_eq!(dbsize(&mut con), 0, "the peeks created no key");
    });
}

// ---------------------------------------------------------------------------
// POLICY specs in RL.ALL

#[test]
fn rl_all_takes_policy_specs_enforced_shadowed_or_off() {
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
            &["off", "TOKENBUCKET", "1", "1", LONG, "MODE", "OFF"],
        );
        let three = [
            "3", "{t}a", "{t}b", "{t}c", "POLICY", "en", "POLICY", "sh", "POLICY", "off",
        ];

        let (r, denied_by) = all(&mut con, &three);
        assert_eq!((r.allowed, r.remaining, denied_by), (true, 0, 0));
        assert!(exists(&mut con, "{t}a") && exists(&mut con, "{t}b"));
        assert!(!exists(&mut con, "{t}c"), "an OFF limiter created its key");

        // The enforced limiter denies; nothing changes anywhere.
        let before: Vec<_> = ["{t}a", "{t}b"].iter().map(|k| dump(&mut con, k)).collect();
        let (r, denied_by) = all(&mut con, &three);
        assert_eq!((r.allowed, denied_by), (false, 1));
        assert!(r.wait_ms > 0);
        let after: Vec<_> = ["{t}a", "{t}b"].iter().map(|k| dump(&mut con, k)).collect();
        assert_eq!(after, before);

        // A shadowed limiter that would deny never denies the call; the
        // others take their units, the shadowed one takes nothing.
        let b_before = dump(&mut con, "{t}b");
        let (r, denied_by) = all(
            &mut con,
            &[
                "2",
                "{t}b",
                "{t}d",
                "POLICY",
                "sh",
                "TOKENBUCKET",
                "5",
                "1",
                LONG,
            ],
        );
        assert_eq!((r.allowed, denied_by), (true, 0));
        assert_eq!(dump(&mut con, "{t}b"), b_before);
        let d = rl(
            &mut con,
            &["RL.TOKENBUCKET", "{t}d", "5", "1", LONG, "COST", "0"],
        );
        assert_eq!(d.remaining, 4);
        assert_eq!(counts(&mut con, "sh").shadow_denied, 2);

        // Only OFF limiters: admitted, nothing created.
        let (r, denied_by) = all(
            &mut con,
            &["2", "{t}c", "{t}e", "POLICY", "off", "POLICY", "off"],
        );
        assert_eq!(
            (
                r.allowed,
                r.limit,
                r.remaining,
                r.wait_ms,
                r.reset_ms,
                denied_by
            ),
            (true, 1, 1, 0, 0, 0)
        );
        assert!(!exists(&mut con, "{t}c") && !exists(&mut con, "{t}e"));

        // Unknown policy: an error naming it, nothing changes.
        let err = query_err(
            &mut con,
            &[
                "RL.ALL",
                "2",
                "{t}f",
                "{t}g",
                "FIXEDWINDOW",
                "5",
                LONG,
                "POLICY",
                "nope",
            ],
        );
        assert_eq!(err, "ERR unknown policy 'nope'");
        assert!(!exists(&mut con, "{t}f"));
    });
}

#[test]
fn an_off_policy_in_rl_all_does_not_shape_the_reply() {
    for_each_server(|kind| {
        let server = Server::start(kind, &[]);
        let mut con = server.conn();
        // The OFF rule is tighter than the live one: it must not show.
        set_policy(
            &mut con,
            &["off", "TOKENBUCKET", "1", "1", LONG, "MODE", "OFF"],
        );
        let (r, denied_by) = all(
            &mut con,
            &[
                "2",
                "{t}off",
                "{t}live",
                "POLICY",
                "off",
                "FIXEDWINDOW",
                "10",
                LONG,
            ],
        );
        assert_eq!(denied_by, 0);
        assert_eq!(
            (r.allowed, r.limit, r.remaining),
            (true, 10, 9),
            "the reply is the live limiter's, not the switched-off one's"
        );
    });
}

#[test]
fn rollout_in_rl_all_follows_the_key_of_the_policy_spec() {
    for_each_server(|kind| {
        let server = Server::start(kind, &[]);
        let mut con = server.conn();
        // Two keys on either side of ROLLOUT 50.
        let low = (0..)
            .map(|i| format!("{{t}}u{i}"))
            .find(|k| rollout_bucket(k) < 50)
            .unwrap();
        let high = (0..)
            .map(|i| format!("{{t}}u{i}"))
            .find(|k| rollout_bucket(k) >= 50)
            .unwrap();
        set_policy(&mut con, &["p", "FIXEDWINDOW", "1", LONG, "ROLLOUT", "50"]);
        for key in [&low, &high] {
            let words = ["1", key.as_str(), "POLICY", "p"];
            assert!(all(&mut con, &words).0.allowed);
            let (r, denied_by) = all(&mut con, &words);
            let enforced = key == &low;
            assert_eq!(r.allowed, !enforced, "{key}");
            assert_eq!(denied_by, if enforced { 1 } else { 0 }, "{key}");
        }
    });
}

// ---------------------------------------------------------------------------
// Replication

#[test]
fn policies_replicate_and_rl_hit_reaches_the_replica_as_the_plain_limiter_call() {
    for_each_server(|kind| {
        let master = Server::start(
            kind,
            &[
                QUIET_MASTER,
                &["--ratelimit.sliding-max-limit", "200000"][..],
            ]
            .concat(),
        );
        let replica = replica_of(&master);
        let (mut m, mut r) = (master.conn(), replica.conn());
        set_every_kind(&mut m);
        // Accepted by the master's bound, above the replica's default one.
        set_policy(&mut m, &["big", "SLIDING", "150000", "3600000"]);
        set_policy(&mut m, &["gone", "FIXEDWINDOW", "1", "1000"]);
        let _: i64 = query(&mut m, &["RL.POLICY", "DEL", "gone"]);
        wait_for_sync(&master, &replica);
        assert_eq!(all_rules(&mut r), all_rules(&mut m));
        assert_eq!(list(&mut r).len(), 6);

        // Traffic through every policy, RL.HIT and RL.ALL.
        for round in 0..8 {
            for name in list(&mut m) {
                for user in 0..6 {
                    let key = format!("{name}:{user}");
                    hit_cost(&mut m, &name, &key, if round % 3 == 2 { "2" } else { "1" });
                }
            }
            all(
                &mut m,
                &[
                    "3", "{o}a", "{o}b", "{o}c", "POLICY", "tb", "POLICY", "fw", "POLICY", "lb",
                ],
            );
        }
        wait_for_sync(&master, &replica);
        let keys: Vec<String> = query(&mut m, &["KEYS", "*"]);
        assert!(keys.len() > 20, "only {} keys", keys.len());
        for key in &keys {
            assert_eq!(dump(&mut r, key), dump(&mut m, key), "DUMP {key} differs");
        }
        assert_eq!(dbsize(&mut r), dbsize(&mut m));
        // The replica replayed limiter calls, never RL.HIT: its policies
        // counted nothing.
        for name in list(&mut r) {
            assert_eq!(
                counts(&mut r, &name),
                Counts::default(),
                "{name} on the replica"
            );
        }

        // What changes nothing propagates nothing: a missing DEL, denials,
        // shadow denials, OFF, peeks.
        set_policy(
            &mut m,
            &["one", "TOKENBUCKET", "1", "1", LONG, "ROLLOUT", "100"],
        );
        hit(&mut m, "one", "k1");
        set_policy(
            &mut m,
            &["sh1", "TOKENBUCKET", "1", "1", LONG, "MODE", "SHADOW"],
        );
        hit(&mut m, "sh1", "k2");
        wait_for_sync(&master, &replica);
        let offset = master_offset(&master);
        let _: i64 = query(&mut m, &["RL.POLICY", "DEL", "never-was"]);
        assert!(!hit(&mut m, "one", "k1").allowed);
        assert!(hit(&mut m, "sh1", "k2").allowed);
        assert!(hit(&mut m, "sl", "k3").allowed); // OFF
        hit_cost(&mut m, "one", "k1", "0");
        assert_eq!(
            master_offset(&master),
            offset,
            "a call that changed nothing propagated"
        );

        // Read subcommands work on the replica; writes are refused.
        let _: Vec<String> = query(&mut r, &["RL.POLICY", "LIST"]);
        assert!(policy_get(&mut r, "tb").is_some());
        for words in [
            &["RL.POLICY", "SET", "x", "FIXEDWINDOW", "1", "1000"][..],
            &["RL.POLICY", "DEL", "tb"][..],
            &["RL.HIT", "tb", "k"][..],
        ] {
            let err = query_err(&mut r, words);
            assert!(err.starts_with("READONLY"), "{words:?} on a replica: {err}");
        }

        // DEL propagates; so do SET and DEL inside MULTI/EXEC and scripts.
        let _: i64 = query(&mut m, &["RL.POLICY", "DEL", "tb"]);
        let _: Value = redis::pipe()
            .atomic()
            .cmd("RL.POLICY")
            .arg(&["SET", "in-multi", "FIXEDWINDOW", "3", LONG])
            .cmd("RL.POLICY")
            .arg(&["DEL", "fw"])
            .query(&mut m)
            .expect("MULTI/EXEC");
        let _: Value = query(
            &mut m,
            &[
                "EVAL",
                "redis.call('RL.POLICY', 'SET', 'in-script', 'TOKENBUCKET', '3', '1', ARGV[1]) \
                 return redis.call('RL.POLICY', 'DEL', 'lb')",
                "0",
                LONG,
            ],
        );
        wait_for_sync(&master, &replica);
        assert_eq!(policy_get(&mut r, "tb"), None);
        assert_eq!(policy_get(&mut r, "fw"), None);
        assert!(policy_get(&mut r, "in-multi").is_some());
        assert!(policy_get(&mut r, "in-script").is_some());
        assert_eq!(all_rules(&mut r), all_rules(&mut m));
    });
}

#[test]
fn a_new_replica_gets_the_masters_policies_and_drops_its_own() {
    for_each_server(|kind| {
        for (sync, load) in [
            ("no", "disabled"),
            ("yes", "swapdb"),
            ("yes", "on-empty-db"),
        ] {
            eprintln!("repl-diskless-sync {sync}, repl-diskless-load {load}");
            new_replica_gets_the_masters_policies(kind, sync, load);
        }
    });
}

/// A full sync of `kind` with these diskless settings.
fn new_replica_gets_the_masters_policies(kind: ServerKind, sync: &str, load: &str) {
    let master = Server::start(kind, &["--repl-diskless-sync", sync]);
    let mut m = master.conn();
    set_every_kind(&mut m);
    hit(&mut m, "tb", "user:1");

    let replica = Server::start(kind, &["--repl-diskless-load", load]);
    let mut r = replica.conn();
    set_policy(&mut r, &["own", "FIXEDWINDOW", "1", "1000"]);
    set_policy(&mut r, &["tb", "FIXEDWINDOW", "9", "9000"]);
    let _: () = query(
        &mut r,
        &["REPLICAOF", "127.0.0.1", &master.port.to_string()],
    );
    poll_until("the full sync", Duration::from_secs(20), || {
        let info = replica.info("replication");
        info_field(&info, "master_link_status").as_deref() == Some("up")
            && info_field(&info, "master_sync_in_progress").as_deref() == Some("0")
    });
    wait_for_sync(&master, &replica);
    assert_eq!(all_rules(&mut r), sorted(every_kind_rules()));
    assert_eq!(dump(&mut r, "user:1"), dump(&mut m, "user:1"));
}

#[test]
fn a_replica_of_a_master_without_policies_ends_with_none() {
    for_each_server(|kind| {
        let master = Server::start(kind, &[]);
        let replica = Server::start(kind, &[]);
        let mut r = replica.conn();
        set_policy(&mut r, &["own", "FIXEDWINDOW", "1", "1000"]);
        let _: () = query(
            &mut r,
            &["REPLICAOF", "127.0.0.1", &master.port.to_string()],
        );
        poll_until("the full sync", Duration::from_secs(20), || {
            let info = replica.info("replication");
            info_field(&info, "master_link_status").as_deref() == Some("up")
                && info_field(&info, "master_sync_in_progress").as_deref() == Some("0")
        });
        assert_eq!(list(&mut r), Vec::<String>::new());
    });
}

// ---------------------------------------------------------------------------
// Persistence

#[test]
fn policies_survive_save_and_restart() {
    for_each_server(|kind| {
        let mut server = Server::start(kind, &[]);
        let mut con = server.conn();
        set_every_kind(&mut con);
        hit_cost(&mut con, "tb", "user:1", "3");
        save(&mut con);
        server.restart();
        let mut con = server.conn();
        assert_eq!(all_rules(&mut con), sorted(every_kind_rules()));
        // The limiter and its policy meet again.
        let r = hit(&mut con, "tb", "user:1");
        assert!(r.allowed && r.remaining <= 1, "{r:?}");
    });
}

/// Waits for a `BGREWRITEAOF` to finish: a new base file whose name holds
/// `.{seq}.base.`.
pub(super) fn wait_for_rewrite(server: &Server, seq: u32) {
    let marker = format!(".{seq}.base.");
    poll_until("the AOF rewrite to finish", Duration::from_secs(30), || {
        let info = server.info("persistence");
        let new_base = fs::read_dir(server.dir.join("appendonlydir"))
            .map(|entries| {
                entries
                    .filter_map(Result::ok)
                    .any(|e| e.file_name().to_string_lossy().contains(&marker))
            })
            .unwrap_or(false);
        info_field(&info, "aof_rewrite_in_progress").as_deref() == Some("0")
            && info_field(&info, "aof_rewrite_scheduled").as_deref() == Some("0")
            && new_base
    });
    assert_eq!(
        info_field(&server.info("persistence"), "aof_last_bgrewrite_status").as_deref(),
        Some("ok")
    );
}

#[test]
fn policies_survive_an_aof_restart_and_a_rewrite_with_the_rdb_preamble() {
    for_each_server(|kind| {
        let mut server = Server::start(kind, &["--appendonly", "yes"]);
        let mut con = server.conn();
        // Before the rewrite: in the base (RDB preamble, aux data).
        set_every_kind(&mut con);
        set_policy(&mut con, &["old", "FIXEDWINDOW", "1", "1000"]);
        let _: Value = query(&mut con, &["BGREWRITEAOF"]);
        wait_for_rewrite(&server, 2);
        // After it: in the incremental file, as commands.
        set_policy(
            &mut con,
            &["new", "SLIDING", "10", "1000", "MODE", "SHADOW"],
        );
        let _: i64 = query(&mut con, &["RL.POLICY", "DEL", "old"]);
        set_policy(&mut con, &["tb", "TOKENBUCKET", "6", "2", "1000"]);
        let expected = all_rules(&mut con);
        server.restart();
        let mut con = server.conn();
        assert_eq!(all_rules(&mut con), expected);
        assert!(policy_get(&mut con, "old").is_none());
        assert_eq!(rule(&mut con, "tb").params, [6, 2, 1000]);
    });
}

#[test]
fn loading_a_dataset_replaces_the_policies_of_the_node() {
    for_each_server(|kind| {
        let server = Server::start(kind, &[]);
        let mut con = server.conn();
        set_policy(&mut con, &["a", "FIXEDWINDOW", "1", "1000"]);
        save(&mut con);
        set_policy(&mut con, &["b", "FIXEDWINDOW", "2", "1000"]);
        let _: i64 = query(&mut con, &["RL.POLICY", "DEL", "a"]);
        // Loads the RDB saved above, without saving first.
        let _: () = query(&mut con, &["DEBUG", "RELOAD", "NOSAVE"]);
        assert_eq!(list(&mut con), ["a"]);
        // DEBUG RELOAD saves, then loads: policies kept.
        set_policy(
            &mut con,
            &["c", "TOKENBUCKET", "3", "1", "1000", "MODE", "OFF"],
        );
        let expected = all_rules(&mut con);
        let _: () = query(&mut con, &["DEBUG", "RELOAD"]);
        assert_eq!(all_rules(&mut con), expected);
    });
}

/// Known limitation, pinned: Redis gives modules no way to write non-key
/// state into an AOF rewritten without the RDB preamble, so such a rewrite
/// loses the policies set before it (those set after it are in the
/// incremental file). docs/operations.md says what to do.
#[test]
fn an_aof_rewrite_without_the_rdb_preamble_drops_the_policies_set_before_it() {
    for_each_server(|kind| {
        let mut server = Server::start(
            kind,
            &["--appendonly", "yes", "--aof-use-rdb-preamble", "no"],
        );
        let mut con = server.conn();
        set_policy(&mut con, &["before", "TOKENBUCKET", "5", "1", LONG]);
        hit(&mut con, "before", "k");
        let _: Value = query(&mut con, &["BGREWRITEAOF"]);
        wait_for_rewrite(&server, 2);
        assert_eq!(
            list(&mut con),
            ["before"],
            "the running server still has it"
        );
        set_policy(&mut con, &["after", "FIXEDWINDOW", "5", "1000"]);
        server.restart();
        let mut con = server.conn();
        assert_eq!(list(&mut con), ["after"], "the rewrite dropped 'before'");
        assert!(exists(&mut con, "k"), "limiter keys are kept (RL.SETSTATE)");
        assert_eq!(
            query_err(&mut con, &["RL.HIT", "before", "k"]),
            "ERR unknown policy 'before'"
        );
    });
}

#[test]
fn re_setting_the_policies_after_a_rewrite_without_preamble_keeps_them() {
    for_each_server(|kind| {
        let mut server = Server::start(
            kind,
            &["--appendonly", "yes", "--aof-use-rdb-preamble", "no"],
        );
        let mut con = server.conn();
        set_every_kind(&mut con);
        let _: Value = query(&mut con, &["BGREWRITEAOF"]);
        wait_for_rewrite(&server, 2);
        // The workaround of docs/operations.md: SET every policy again.
        for name in list(&mut con) {
            let r = rule(&mut con, &name);
            let params: Vec<String> = r.params.iter().map(|p| p.to_string()).collect();
            let rollout = r.rollout.to_string();
            let mut words: Vec<&str> = vec![&name, &r.algorithm];
            words.extend(params.iter().map(String::as_str));
            words.extend(["MODE", &r.mode, "ROLLOUT", &rollout]);
            set_policy(&mut con, &words);
        }
        server.restart();
        let mut con = server.conn();
        assert_eq!(all_rules(&mut con), sorted(every_kind_rules()));
    });
}

#[test]
fn a_shadowed_leaky_bucket_in_rl_all_never_makes_the_caller_wait() {
    for_each_server(|kind| {
        let server = Server::start(kind, &[]);
        let mut con = server.conn();
        let _: () = query(
            &mut con,
            &[
                "RL.POLICY",
                "SET",
                "lbs",
                "LEAKYBUCKET",
                "5",
                "1",
                "60000",
                "MODE",
                "SHADOW",
            ],
        );
        for _ in 0..3 {
            let reply: Vec<i64> = query(
                &mut con,
                &[
                    "RL.ALL",
                    "2",
                    "{s}q",
                    "{s}t",
                    "POLICY",
                    "lbs",
                    "TOKENBUCKET",
                    "10",
                    "1",
                    "1000",
                ],
            );
            assert_eq!((reply[0], reply[3], reply[5]), (1, 0, 0), "{reply:?}");
        }
        // the queue itself did fill: the same policy enforced would now wait
        let peek = rl(
            &mut con,
            &["RL.LEAKYBUCKET", "{s}q", "5", "1", "60000", "COST", "0"],
        );
        assert!(peek.wait_ms > 100_000, "{peek:?}");
    });
}

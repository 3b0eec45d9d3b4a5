//! The contract file the client kits are tested against
//! (`clients/contract/contract.json`, written from the core crate), checked
//! against real servers: every validation case of every algorithm, every
//! zone, every option case and every reply shape. So what the kits follow
//! is what the servers answer, word for word, not only what the core says.
//!
//! Every call here is a `COST 0` call or a refusal: none writes anything,
//! which the test checks too (`DBSIZE` stays 0).

use serde_json::Value as Json;

use crate::harness::contract::flushed;
use crate::harness::*;

fn contract() -> Json {
    let path =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("clients/contract/contract.json");
    let text = std::fs::read_to_string(&path).expect("clients/contract/contract.json");
    serde_json::from_str(&text).expect("the contract is JSON")
}

fn strings(v: &Json) -> Vec<String> {
    v.as_array()
        .expect("an array")
        .iter()
        .map(|a| a.as_str().expect("a string").to_string())
        .collect()
}

/// A call's words: the algorithm's parameters as the server reads them (a
/// period by its word), or `None` for a period index no word stands for
/// (a case for the kits' own integer form only).
fn words(alg: &Json, key: &str, params: &Json) -> Option<Vec<String>> {
    let mut words = vec![
        alg["command"].as_str().expect("command").to_string(),
        key.into(),
    ];
    for (param, value) in alg["params"]
        .as_array()
        .expect("params")
        .iter()
        .zip(params.as_array().expect("params").iter())
    {
        let value = value.as_u64().expect("an integer");
        let keywords = strings(&param["keywords"]);
        if keywords.is_empty() {
            words.push(value.to_string());
        } else {
            words.push(keywords.get(value as usize)?.clone());
        }
    }
    Some(words)
}

fn send(con: &mut Connection, words: &[String]) -> Result<Value, String> {
    let words: Vec<&str> = words.iter().map(String::as_str).collect();
    command(&words)
        .query::<Value>(con)
        .map_err(|e| error_text(&e))
}

/// The number of integers a reply holds (0 for anything else).
fn fields(reply: &Value) -> usize {
    match reply {
        Value::Array(items) if items.iter().all(|i| matches!(i, Value::Int(_))) => items.len(),
        _ => 0,
    }
}

#[test]
fn the_contract_files_cases_hold_on_every_server() {
    let contract = contract();
    let replies: Vec<(String, usize)> = contract["replies"]
        .as_array()
        .expect("replies")
        .iter()
        .filter_map(|r| {
            Some((
                r["command"].as_str()?.to_string(),
                r["fields"].as_array()?.len(),
            ))
        })
        .collect();
    let reply_len = |command: &str| {
        replies
            .iter()
            .find(|(c, _)| c == command)
            .unwrap_or_else(|| panic!("the contract has no reply shape for {command}"))
            .1
    };
    for_each_server(|kind| {
        let server = Server::start(kind, &[]);
        let mut con = flushed(&server);
        // The contract holds the core's rules; an operator's bounds below
        // them (`ratelimit.sliding-max-limit`, default 100,000, and
        // `ratelimit.hashwindow-max-buckets`, default 3,600) are the
        // server's own, so they are opened to their largest here.
        let _: () = query(
            &mut con,
            &["CONFIG", "SET", "ratelimit.sliding-max-limit", "16777215"],
        );
        let _: () = query(
            &mut con,
            &[
                "CONFIG",
                "SET",
                "ratelimit.hashwindow-max-buckets",
                "1000000",
            ],
        );
        let mut checked = 0;
        for alg in contract["algorithms"].as_array().expect("algorithms") {
            let command = alg["command"].as_str().expect("command");
            for case in alg["validation"].as_array().expect("validation") {
                let Some(mut call) = words(alg, "k", &case["params"]) else {
                    // A period index beyond the words: the server names the
                    // period too, in its own words.
                    let mut call = words(alg, "k", &json_with_period(&case["params"], 0))
                        .expect("period 0 has a word");
                    let last = call.len() - 1;
                    call[last] = case["params"][1].to_string();
                    let err = send(&mut con, &call).expect_err("refused");
                    assert!(err.starts_with("ERR period "), "{call:?}: {err}");
                    continue;
                };
                call.extend(["COST".into(), "0".into()]);
                match (send(&mut con, &call), case["ok"].as_bool()) {
                    (Ok(reply), Some(true)) => {
                        assert_eq!(fields(&reply), reply_len(command), "{call:?}: {reply:?}")
                    }
                    (Err(err), Some(false)) => assert_eq!(
                        err,
                        format!("ERR {}", case["message"].as_str().expect("message")),
                        "{call:?}"
                    ),
                    (got, _) => panic!("{kind}: {call:?} answered {got:?}; the contract: {case}"),
                }
                checked += 1;
            }
        }
        // Zones, on a quota.
        let quota = contract["algorithms"]
            .as_array()
            .expect("algorithms")
            .iter()
            .find(|a| a["word"] == "QUOTA")
            .expect("the quota");
        let zones = &contract["zones"];
        for (list, ok) in [
            ("accepted", true),
            ("refused", false),
            ("refused_by_server_only", false),
        ] {
            for zone in strings(&zones[list]) {
                let mut call = words(quota, "q", &serde_json::json!([10, 0])).expect("DAY");
                call.extend(["COST".into(), "0".into(), "TZ".into(), zone.clone()]);
                let got = send(&mut con, &call);
                assert_eq!(got.is_ok(), ok, "{kind}: {call:?}: {got:?}");
                if let Err(err) = got {
                    assert!(err.starts_with("ERR TZ "), "{call:?}: {err}");
                }
                checked += 1;
            }
        }
        // Options, on a token bucket that admits everything asked of it
        // (a COST above its capacity is denied, which writes nothing).
        let options = &contract["options"];
        let base: Vec<String> = ["RL.TOKENBUCKET", "o", "10", "1", "1000"]
            .map(String::from)
            .to_vec();
        let mut cases: Vec<&Json> = Vec::new();
        cases.extend(options["requests"].as_array().expect("requests"));
        cases.extend(options["blocks"].as_array().expect("blocks"));
        for case in cases {
            let mut call = base.clone();
            call.extend(strings(&case["args"]));
            if case.get("block_ms").is_some() {
                // A wait that must not happen: a peek is admitted at once.
                call.extend(["COST".into(), "0".into()]);
            }
            match (send(&mut con, &call), case["ok"].as_bool()) {
                (Ok(reply), Some(true)) => assert_eq!(fields(&reply), 5, "{call:?}"),
                (Err(err), Some(false)) => {
                    assert_eq!(err, case["message"].as_str().expect("message"), "{call:?}")
                }
                (got, _) => panic!("{kind}: {call:?} answered {got:?}; the contract: {case}"),
            }
            // An admitted COST n or COST n FORCE took units: start again.
            let _: () = query(&mut con, &["FLUSHALL"]);
            checked += 1;
        }
        for case in options["refused_words"].as_array().expect("refused_words") {
            let mut call = base.clone();
            call.extend(strings(&case["args"]));
            let err = send(&mut con, &call).expect_err("refused");
            assert_eq!(
                err,
                case["message"].as_str().expect("message"),
                "{kind}: {call:?}"
            );
            checked += 1;
        }
        assert_eq!(
            dbsize(&mut con),
            0,
            "{kind}: a refusal or a peek wrote a key"
        );
        // UPTO: its requests and refused words on the same token bucket (a
        // grant takes units: start again), its refusal elsewhere, and its
        // replies' widths.
        let grants = &contract["grants"];
        let cases = grants["requests"].as_array().expect("grants.requests");
        for case in cases {
            let mut call = base.clone();
            call.extend(strings(&case["args"]));
            match (send(&mut con, &call), case["ok"].as_bool()) {
                (Ok(reply), Some(true)) => assert_eq!(fields(&reply), 6, "{call:?}"),
                (Err(err), Some(false)) => {
                    assert_eq!(err, case["message"].as_str().expect("message"), "{call:?}")
                }
                (got, _) => panic!("{kind}: {call:?} answered {got:?}; the contract: {case}"),
            }
            let _: () = query(&mut con, &["FLUSHALL"]);
            checked += 1;
        }
        for case in grants["refused_words"].as_array().expect("refused_words") {
            let mut call = base.clone();
            call.extend(strings(&case["args"]));
            let err = send(&mut con, &call).expect_err("refused");
            assert_eq!(
                err,
                case["message"].as_str().expect("message"),
                "{kind}: {call:?}"
            );
            checked += 1;
        }
        let _: String = query(
            &mut con,
            &[
                "RL.POLICY",
                "SET",
                "contract-leaky",
                "LEAKYBUCKET",
                "5",
                "1",
                "1000",
            ],
        );
        for case in grants["refused_commands"]
            .as_array()
            .expect("refused_commands")
        {
            let call: Vec<&str> =
                match (case["command"].as_str().expect("command"), case.get("spec")) {
                    ("RL.LEAKYBUCKET", _) => vec!["RL.LEAKYBUCKET", "g", "5", "1", "1000"],
                    ("RL.CONCURRENCY", _) => vec!["RL.CONCURRENCY", "g", "5", "1000"],
                    ("RL.HIT", _) => vec!["RL.HIT", "contract-leaky", "g"],
                    ("RL.ALL", Some(_)) => vec![
                        "RL.ALL",
                        "2",
                        "g",
                        "h",
                        "FIXEDWINDOW",
                        "5",
                        "1000",
                        "LEAKYBUCKET",
                        "5",
                        "1",
                        "1000",
                    ],
                    (other, _) => panic!("a refused command the test does not know: {other}"),
                };
            let mut call: Vec<String> = call.into_iter().map(String::from).collect();
            call.extend(["UPTO".into(), "2".into()]);
            let err = send(&mut con, &call).expect_err("refused");
            assert_eq!(
                err,
                case["message"].as_str().expect("message"),
                "{kind}: {call:?}"
            );
            checked += 1;
        }
        let _: i64 = query(&mut con, &["RL.POLICY", "DEL", "contract-leaky"]);
        for (command, call) in [
            (
                "RL.TOKENBUCKET",
                &["RL.TOKENBUCKET", "u", "10", "1", "1000", "UPTO", "3"][..],
            ),
            (
                "RL.ALL",
                &["RL.ALL", "1", "u2", "SLIDING", "10", "1000", "UPTO", "3"][..],
            ),
        ] {
            let reply = send(
                &mut con,
                &call.iter().map(|w| w.to_string()).collect::<Vec<_>>(),
            )
            .expect(command);
            let want = grants["replies"]
                .as_array()
                .expect("grants.replies")
                .iter()
                .find(|r| r["command"] == command)
                .and_then(|r| r["fields"].as_array())
                .map(Vec::len)
                .expect("a reply shape");
            assert_eq!(fields(&reply), want, "{kind}: {command} {reply:?}");
        }
        let _: () = query(&mut con, &["FLUSHALL"]);
        // RL.ALL's reply: the five fields and denied_by.
        let all = send(
            &mut con,
            &[
                "RL.ALL",
                "1",
                "a",
                "TOKENBUCKET",
                "10",
                "1",
                "1000",
                "COST",
                "0",
            ]
            .map(String::from),
        )
        .expect("RL.ALL");
        assert_eq!(fields(&all), reply_len("RL.ALL"), "{all:?}");
        assert!(checked >= 140, "{kind}: {checked} cases");
    });
}

/// The parameters with the period (the second) replaced.
fn json_with_period(params: &Json, period: u64) -> Json {
    let mut params = params.clone();
    params[1] = Json::from(period);
    params
}

/// The names of a flat list of names and values.
fn names(reply: &Value) -> Vec<String> {
    let Value::Array(items) = reply else {
        panic!("not a list: {reply:?}");
    };
    items
        .iter()
        .step_by(2)
        .map(|n| match n {
            Value::BulkString(b) => String::from_utf8_lossy(b).into_owned(),
            other => panic!("a name: {other:?}"),
        })
        .collect()
}

/// The value after `name` in a flat list.
fn value_of<'a>(reply: &'a Value, name: &str) -> &'a Value {
    let Value::Array(items) = reply else {
        panic!("not a list: {reply:?}");
    };
    let at = items
        .iter()
        .step_by(2)
        .position(|n| *n == Value::BulkString(name.as_bytes().to_vec()))
        .unwrap_or_else(|| panic!("{name} in {reply:?}"));
    &items[2 * at + 1]
}

/// The contract's `protection` section on real servers: each argument's
/// range, refused at min - 1 and max + 1 with the message the contract
/// gives and taken at min and max; the fields of `RL.POLICY STATS`,
/// `RL.OUTCOME` and `RL.POLICY GET`, in order; the defaults GET shows.
#[test]
fn the_contract_files_protection_section_holds_on_every_server() {
    let contract = contract();
    let protection = &contract["protection"];
    let stats_fields = strings(&protection["stats_fields"]);
    let window_fields = strings(&protection["window_fields"]);
    let get = &protection["get_fields"];
    let defaults = &protection["defaults"];
    for_each_server(|kind| {
        let server = Server::start(kind, &[]);
        let mut con = flushed(&server);
        let set = |tail: &[String]| -> Vec<String> {
            let mut call: Vec<String> =
                ["RL.POLICY", "SET", "p", "TOKENBUCKET", "10", "10", "1000"]
                    .map(String::from)
                    .to_vec();
            call.extend(tail.iter().cloned());
            call
        };
        let ok = |con: &mut Connection, call: &[String]| {
            send(con, call).unwrap_or_else(|e| panic!("{kind}: {call:?}: {e}"));
        };
        ok(&mut con, &set(&[]));
        let mut checked = 0;
        for arg in protection["arguments"].as_array().expect("arguments") {
            let name = arg["name"].as_str().expect("name");
            let min = arg["min"].as_u64().expect("min");
            // break_pct's top is 100, its bottom degrade_pct.
            let (max, message) = match arg["max"].as_u64() {
                Some(max) => (
                    max,
                    format!("ERR {name} must be an integer from {min} to {max}"),
                ),
                None => (100, format!("ERR {name} must be an integer from 30 to 100")),
            };
            let call = |v: &str| -> Vec<String> {
                let v = v.to_string();
                let words = |w: &[&str]| w.iter().map(|s| s.to_string()).collect::<Vec<_>>();
                match name {
                    "ERRORS" => set(&[words(&["ADAPT", "ERRORS"]), vec![v]].concat()),
                    "FACTOR" | "MIN" | "RECOVER" | "MINCALLS" => {
                        set(&[words(&["ADAPT", "ERRORS", "5", name]), vec![v]].concat())
                    }
                    "WINDOW" => set(&[words(&["WINDOW"]), vec![v]].concat()),
                    "degrade_pct" => set(&[words(&["STAGES"]), vec![v], words(&["100"])].concat()),
                    "break_pct" => set(&[words(&["STAGES", "30"]), vec![v]].concat()),
                    "pct" => [words(&["RL.POLICY", "SCALE", "p"]), vec![v]].concat(),
                    "ok" => [words(&["RL.OUTCOME", "p"]), vec![v], words(&["0"])].concat(),
                    "errors" => [words(&["RL.OUTCOME", "p", "0"]), vec![v]].concat(),
                    "DENIED" => [words(&["RL.OUTCOME", "p", "0", "0", "DENIED"]), vec![v]].concat(),
                    other => {
                        panic!("the contract names an argument this test does not know: {other}")
                    }
                }
            };
            let low = if name == "break_pct" { 30 } else { min };
            let below = if low == 0 {
                "-1".to_string()
            } else {
                (low - 1).to_string()
            };
            for bad in [below, (max + 1).to_string()] {
                let call = call(&bad);
                assert_eq!(
                    send(&mut con, &call).expect_err("refused"),
                    message,
                    "{kind}: {call:?}"
                );
                checked += 1;
            }
            for good in [low, max] {
                ok(&mut con, &call(&good.to_string()));
                checked += 1;
            }
            // Back to a plain policy at full scale.
            ok(&mut con, &set(&[]));
        }
        assert_eq!(
            checked,
            4 * protection["arguments"].as_array().unwrap().len()
        );
        // A policy with every part of the loop: GET's fields in order, and
        // the defaults ADAPT ERRORS alone takes.
        ok(
            &mut con,
            &set(&["ADAPT", "ERRORS", "5", "STAGES", "30", "50"].map(String::from)),
        );
        let reply = send(&mut con, &["RL.POLICY", "GET", "p"].map(String::from)).expect("GET");
        let mut expected = strings(&get["always"]);
        expected.extend(strings(&get["when_set"]));
        expected.extend(strings(&get["then"]));
        assert_eq!(names(&reply), expected, "{kind}: GET");
        let adapt: Vec<i64> = match value_of(&reply, "adapt") {
            Value::Array(v) => v
                .iter()
                .map(|i| if let Value::Int(i) = i { *i } else { panic!() })
                .collect(),
            other => panic!("adapt: {other:?}"),
        };
        let d = |f: &str| defaults[f].as_i64().expect("a default");
        assert_eq!(
            adapt,
            [5, d("factor"), d("min"), d("recover"), d("mincalls")],
            "{kind}"
        );
        assert_eq!(
            value_of(&reply, "window_ms"),
            &Value::Int(d("window_ms")),
            "{kind}"
        );
        // Without the loop: the fields always there, then scale and stage.
        ok(&mut con, &set(&[]));
        let reply = send(&mut con, &["RL.POLICY", "GET", "p"].map(String::from)).expect("GET");
        let mut expected = strings(&get["always"]);
        expected.extend(strings(&get["then"]));
        assert_eq!(names(&reply), expected, "{kind}: GET of a plain policy");
        // STATS and RL.OUTCOME: the same fields, current and last alike.
        for call in [
            ["RL.POLICY", "STATS", "p", ""].map(String::from),
            ["RL.OUTCOME", "p", "1", "0"].map(String::from),
        ] {
            let call: Vec<String> = call.into_iter().filter(|w| !w.is_empty()).collect();
            let reply = send(&mut con, &call).expect("a reply");
            assert_eq!(names(&reply), stats_fields, "{kind}: {call:?}");
            for window in ["current", "last"] {
                assert_eq!(
                    names(value_of(&reply, window)),
                    window_fields,
                    "{kind}: {call:?} {window}"
                );
            }
        }
        assert_eq!(dbsize(&mut con), 0, "{kind}: the loop wrote a key");
    });
}

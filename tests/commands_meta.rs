//! What the server reports about the module: its name, its key types, and
//! each command's key positions and flags (what cluster clients and ACLs
//! rely on).

mod common;

use common::*;

/// The text of a bulk or simple string reply.
fn text(value: &Value) -> Option<String> {
    match value {
        Value::BulkString(bytes) => Some(String::from_utf8_lossy(bytes).into_owned()),
        Value::SimpleString(s) => Some(s.clone()),
        Value::Okay => Some("OK".to_string()),
        _ => None,
    }
}

/// The value after `field` in a flat `[field, value, ...]` reply (or a map).
fn field<'a>(reply: &'a Value, name: &str) -> Option<&'a Value> {
    match reply {
        Value::Array(items) => items
            .chunks(2)
            .find(|pair| pair.len() == 2 && text(&pair[0]).as_deref() == Some(name))
            .map(|pair| &pair[1]),
        Value::Map(pairs) => pairs
            .iter()
            .find(|(k, _)| text(k).as_deref() == Some(name))
            .map(|(_, v)| v),
        _ => None,
    }
}

#[test]
fn module_list_shows_the_name_ratelimit() {
    for_each_server(|kind| {
        let server = Server::start(kind, &[]);
        let mut con = server.conn();
        let modules: Vec<Value> = query(&mut con, &["MODULE", "LIST"]);
        let names: Vec<String> = modules
            .iter()
            .filter_map(|module| field(module, "name").and_then(text))
            .collect();
        assert!(
            names.iter().any(|n| n == "ratelimit"),
            "MODULE LIST names: {names:?}"
        );
    });
}

#[test]
fn type_names_the_algorithm() {
    for_each_server(|kind| {
        let server = Server::start(kind, &[]);
        let mut con = server.conn();
        rl(&mut con, &["RL.TOKENBUCKET", "tb", "5", "1", "1000"]);
        rl(&mut con, &["RL.FIXEDWINDOW", "fw", "5", "1000"]);
        assert_eq!(key_type(&mut con, "tb"), "rl-tokbkt");
        assert_eq!(key_type(&mut con, "fw"), "rl-fixwin");
    });
}

#[test]
fn command_getkeys_finds_the_limiter_key() {
    for_each_server(|kind| {
        let server = Server::start(kind, &[]);
        let mut con = server.conn();
        for words in [
            ["COMMAND", "GETKEYS", "RL.TOKENBUCKET", "k", "1", "1", "1"].as_slice(),
            [
                "COMMAND",
                "GETKEYS",
                "RL.TOKENBUCKET",
                "k",
                "1",
                "1",
                "1",
                "COST",
                "2",
            ]
            .as_slice(),
            ["COMMAND", "GETKEYS", "RL.FIXEDWINDOW", "k", "1", "1"].as_slice(),
            [
                "COMMAND",
                "GETKEYS",
                "RL.FIXEDWINDOW",
                "k",
                "1",
                "1",
                "COST",
                "0",
            ]
            .as_slice(),
        ] {
            let keys: Vec<String> = query(&mut con, words);
            assert_eq!(keys, ["k"], "{words:?}");
        }
    });
}

/// `COMMAND INFO name` as (arity, flags, first key, last key, step).
fn command_info(con: &mut Connection, name: &str) -> (i64, Vec<String>, i64, i64, i64) {
    let reply: Vec<Value> = query(con, &["COMMAND", "INFO", name]);
    let Some(Value::Array(info)) = reply.first() else {
        panic!("COMMAND INFO {name}: {reply:?}");
    };
    let int = |v: &Value| match v {
        Value::Int(i) => *i,
        other => panic!("COMMAND INFO {name}: expected an integer, got {other:?}"),
    };
    let flags = match &info[2] {
        Value::Array(flags) | Value::Set(flags) => flags.iter().filter_map(text).collect(),
        other => panic!("COMMAND INFO {name}: flags {other:?}"),
    };
    (
        int(&info[1]),
        flags,
        int(&info[3]),
        int(&info[4]),
        int(&info[5]),
    )
}

#[test]
fn command_info_declares_the_key_and_write_fast_flags() {
    for_each_server(|kind| {
        let server = Server::start(kind, &[]);
        let mut con = server.conn();
        for (name, arity) in [("RL.TOKENBUCKET", -5), ("RL.FIXEDWINDOW", -4)] {
            let (got_arity, flags, first, last, step) = command_info(&mut con, name);
            // Variadic (COST is optional). Modules that do not set their arity
            // show -1 and check it themselves (see errors.rs).
            assert!(
                got_arity == arity || got_arity == -1,
                "{name} arity {got_arity}, expected {arity} (or -1)"
            );
            assert_eq!((first, last, step), (1, 1, 1), "{name} key positions");
            for flag in ["write", "fast"] {
                assert!(
                    flags.iter().any(|f| f == flag),
                    "{name} flags {flags:?} lack {flag}"
                );
            }
        }
    });
}

#[test]
fn limiter_commands_are_case_insensitive() {
    for_each_server(|kind| {
        let server = Server::start(kind, &[]);
        let mut con = server.conn();
        let r = rl(&mut con, &["rl.tokenbucket", "tb", "5", "1", "1000"]);
        assert_eq!((r.allowed, r.remaining), (true, 4));
        let r = rl(&mut con, &["Rl.FixedWindow", "fw", "5", "1000"]);
        assert_eq!((r.allowed, r.remaining), (true, 4));
    });
}

//! Encodings already written keep loading: the `DUMP` payload of each limiter
//! type and an RDB with policies, written by encoding 1 of every type and
//! version 1 of the policies' aux data (the fixtures in
//! `tests/fixtures/encoding-v1/`, from Redis 7.0.15), are read back by this
//! build on every server, with the state they were saved with.

use std::fs;
use std::path::{Path, PathBuf};

use crate::harness::*;

/// 2^40 ms: the fixtures' refill period and window (nothing of what they
/// consumed comes back before 2039).
const LONG: &str = "1099511627776";

fn fixture_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/encoding-v1")
}

/// The bytes of a hex fixture (whitespace ignored).
fn hex_fixture(name: &str) -> Vec<u8> {
    let path = fixture_dir().join(name);
    let text = fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let digits: Vec<u8> = text.bytes().filter(|b| !b.is_ascii_whitespace()).collect();
    assert_eq!(digits.len() % 2, 0, "{name}: odd number of hex digits");
    digits
        .chunks(2)
        .map(|pair| {
            u8::from_str_radix(std::str::from_utf8(pair).unwrap(), 16)
                .unwrap_or_else(|_| panic!("{name}: not hex: {pair:?}"))
        })
        .collect()
}

/// Each fixture key: its type, what `TYPE` shows, the call that peeks at it
/// (after the key) and the units it holds consumed.
const KEYS: [(&str, &str, &[&str], i64); 5] = [
    ("tokenbucket", "rl-tokbkt", &["10", "1", LONG], 3),
    ("fixedwindow", "rl-fixwin", &["10", LONG], 3),
    ("leakybucket", "rl-leakbk", &["10", "1", LONG], 3),
    ("sliding", "rl-slilog", &["10", LONG], 5),
    ("hashwindow", "rl-hashwn", &["10", LONG, LONG], 5),
];

/// `key` holds the fixture's state of `alg`: it is of its type, a peek shows
/// its consumed units, and it takes one more unit.
fn assert_fixture_state(con: &mut Connection, key: &str, alg: &str, what: &str) {
    let (_, type_name, params, consumed) = KEYS.iter().find(|k| k.0 == alg).unwrap();
    assert_eq!(key_type(con, key), *type_name, "{what}: {alg}");
    let command = format!("RL.{}", alg.to_uppercase());
    let call = |cost: &'static str| {
        let mut words = vec![command.as_str(), key];
        words.extend_from_slice(params);
        words.extend(["COST", cost]);
        words
    };
    let peek = rl(con, &call("0"));
    assert_eq!(
        (peek.allowed, peek.limit, peek.remaining),
        (true, 10, 10 - consumed),
        "{what}: {alg} peek"
    );
    let taken = rl(con, &call("1"));
    assert_eq!(
        (taken.allowed, taken.remaining),
        (true, 9 - consumed),
        "{what}: {alg} admits one more"
    );
}

#[test]
fn dump_payloads_of_encoding_1_restore_with_their_state() {
    for_each_server(|kind| {
        let server = Server::start(kind, &[]);
        let mut con = server.conn();
        for (alg, ..) in KEYS {
            let payload = hex_fixture(&format!("dump-{alg}.hex"));
            let key = format!("restored:{alg}");
            let _: () = redis::cmd("RESTORE")
                .arg(&key)
                .arg(0)
                .arg(payload)
                .query(&mut con)
                .unwrap_or_else(|e| panic!("RESTORE of {alg}: {}", error_text(&e)));
            assert_fixture_state(&mut con, &key, alg, "RESTORE");
        }
    });
}

#[test]
fn an_rdb_of_redis_7_0_with_policies_loads() {
    for_each_server(|kind| {
        let mut server = Server::start(kind, &[]);
        fs::write(
            server.dir.join("dump.rdb"),
            hex_fixture("redis-7.0.rdb.hex"),
        )
        .expect("write dump.rdb");
        // Stopped without saving, started again: it loads the fixture.
        server.restart();
        let mut con = server.conn();
        let names: Vec<String> = query(&mut con, &["RL.POLICY", "LIST"]);
        assert_eq!(names, ["api:login", "orders.create-v2", "queue_1"]);
        let rules = [
            (
                "api:login",
                "TOKENBUCKET",
                &[20, 10, 1000][..],
                "SHADOW",
                30,
            ),
            (
                "orders.create-v2",
                "FIXEDWINDOW",
                &[100, 60000][..],
                "ENFORCE",
                100,
            ),
            ("queue_1", "LEAKYBUCKET", &[5, 1, 200][..], "OFF", 100),
        ];
        for (name, algorithm, params, mode, rollout) in rules {
            let get: Vec<Value> = query(&mut con, &["RL.POLICY", "GET", name]);
            let field = |f: &str| {
                let at = get
                    .iter()
                    .position(|v| matches!(v, Value::BulkString(b) if b == f.as_bytes()))
                    .unwrap_or_else(|| panic!("{name}: no {f} in {get:?}"));
                get[at + 1].clone()
            };
            assert_eq!(field("algorithm"), Value::BulkString(algorithm.into()));
            let ints: Vec<Value> = params.iter().map(|&p| Value::Int(p)).collect();
            assert_eq!(field("params"), Value::Array(ints), "{name}");
            assert_eq!(field("mode"), Value::BulkString(mode.into()), "{name}");
            assert_eq!(field("rollout"), Value::Int(rollout), "{name}");
        }
        for (alg, ..) in KEYS {
            assert_fixture_state(&mut con, &format!("fixture:{alg}"), alg, "RDB");
        }
        assert_eq!(dbsize(&mut con), 5);
    });
}

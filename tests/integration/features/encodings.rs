//! Encodings already written keep loading, and what is written now can be
//! read by the release before it when pinned:
//!
//! - the `DUMP` payload of each limiter type and an RDB with policies,
//!   written by encoding 1 of every type and version 1 of the policies' aux
//!   data (the fixtures in `tests/fixtures/encoding-v1/`, from release 0.1.0
//!   on Redis 7.0.15), are read back by this build on every server, with the
//!   state they were saved with;
//! - hash windows in encoding 2 (`tests/fixtures/encoding-v2/`, from the
//!   build that introduced it) restore with their state and counter width;
//! - a hash window written now is encoding 2 (its counters one byte string
//!   at their width) and survives `DUMP`/`RESTORE`, an RDB restart, an AOF
//!   rewrite with and without the RDB preamble, and a full sync (the replica
//!   byte-identical);
//! - under `ratelimit.write-encoding 1` every type writes encoding 1: the
//!   `DUMP` of each fixture state is the fixture's, byte for byte but the
//!   trailing RDB version and CRC (what release 0.1.0 wrote, so it reads
//!   it), and an RDB written so loads in this build;
//! - the config is immutable (`CONFIG SET` refuses it).

use std::fs;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::harness::payload::{self, Field};
use crate::harness::*;

/// 2^40 ms: the fixtures' refill period and window (nothing of what they
/// consumed comes back before 2039).
const LONG: &str = "1099511627776";

fn fixture_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/encoding-v1")
}

/// The bytes of a hex fixture of encoding 1 (whitespace ignored).
fn hex_fixture(name: &str) -> Vec<u8> {
    hex_file(&fixture_dir().join(name))
}

fn hex_file(path: &Path) -> Vec<u8> {
    let name = path.display();
    let text = fs::read_to_string(path).unwrap_or_else(|e| panic!("{name}: {e}"));
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
            // No protection loop then: full scale, stage 0.
            assert_eq!(field("scale"), Value::Int(100), "{name}");
            assert_eq!(field("stage"), Value::Int(0), "{name}");
        }
        for (alg, ..) in KEYS {
            assert_fixture_state(&mut con, &format!("fixture:{alg}"), alg, "RDB");
        }
        assert_eq!(dbsize(&mut con), 5);
    });
}

// ---------------------------------------------------------------------------
// Encoding 2 of the hash window

/// A bucket of 2^34 ms (about 200 days), 60 to the window: nothing leaves
/// the window before the tests end.
const BUCKET: &str = "17179869184";
const WINDOW: &str = "1030792151040";

/// Hash windows whose counters need each width: (key, limit, costs in
/// order with `FORCE` where said, counter width, remaining after).
const WIDE: [(&str, &str, &[&str], u64, i64); 4] = [
    ("hw:narrow", "1000", &["7"], 2, 993),
    (
        "hw:u32",
        "10000000000",
        &["70000"],
        4,
        10_000_000_000 - 70_000,
    ),
    ("hw:u64", "10000000000", &["5000000000"], 8, 5_000_000_000),
    // 60000 admitted, 60000 more forced: a count above the limit and 65535
    ("hw:forced", "60000", &["60000", "60000 FORCE"], 4, 0),
];

fn hw_call<'a>(key: &'a str, limit: &'a str, cost: &'a str) -> Vec<&'a str> {
    let mut words = vec!["RL.HASHWINDOW", key, limit, WINDOW, BUCKET, "COST"];
    words.extend(cost.split(' '));
    words
}

fn build_wide(con: &mut Connection) {
    for (key, limit, costs, ..) in WIDE {
        for cost in costs {
            let reply = rl(con, &hw_call(key, limit, cost));
            assert!(reply.allowed || cost.ends_with("FORCE"), "{key} {cost}");
        }
    }
}

/// Each wide key's peek is as built.
fn assert_wide_state(con: &mut Connection, prefix: &str, what: &str) {
    for (key, limit, _, _, remaining) in WIDE {
        let key = format!("{prefix}{key}");
        assert_eq!(key_type(con, &key), "rl-hashwn", "{what}: {key}");
        let peek = rl(con, &hw_call(&key, limit, "0"));
        assert_eq!(peek.remaining, remaining, "{what}: {key}");
    }
}

/// The encoding version of a module value's payload.
fn encver(payload: &[u8]) -> u64 {
    payload::module_id(payload).expect("a module value") & 1023
}

/// A hash window's `DUMP` is encoding 2: `bucket_ms, newest, sum`, 61
/// buckets, the width, then the counters as one string at that width,
/// little-endian, summing to `sum`.
fn assert_encoding_2(payload: &[u8], width: u64, what: &str) {
    assert_eq!(encver(payload), 2, "{what}");
    let fields = payload::module_fields(payload).expect("a module value");
    let [Field::Unsigned(bucket_ms), _, Field::Unsigned(sum), Field::Unsigned(len), Field::Unsigned(w), Field::String(counters)] =
        &fields[..]
    else {
        panic!("{what}: not encoding 2's fields: {fields:?}");
    };
    assert_eq!((*bucket_ms, *len, *w), (1 << 34, 61, width), "{what}");
    assert_eq!(counters.len() as u64, len * width, "{what}");
    let total: u64 = counters
        .chunks(width as usize)
        .map(|c| c.iter().rev().fold(0u64, |v, &b| (v << 8) | u64::from(b)))
        .sum();
    assert_eq!(total, *sum, "{what}");
}

fn wide_dumps(con: &mut Connection, prefix: &str) -> Vec<Vec<u8>> {
    WIDE.iter()
        .map(|(key, ..)| dump(con, &format!("{prefix}{key}")).expect("the key exists"))
        .collect()
}

#[test]
fn hash_windows_are_written_in_encoding_2_and_restore() {
    for_each_server(|kind| {
        let server = Server::start(kind, &[]);
        let mut con = server.conn();
        let all: Vec<String> = query(&mut con, &["CONFIG", "GET", "ratelimit.write-encoding"]);
        assert_eq!(all, ["ratelimit.write-encoding", "2"]);
        build_wide(&mut con);
        let dumps = wide_dumps(&mut con, "");
        for ((key, _, _, width, _), payload) in WIDE.iter().zip(&dumps) {
            assert_encoding_2(payload, *width, key);
            let copy = format!("copy:{key}");
            let _: () = redis::cmd("RESTORE")
                .arg(&copy)
                .arg(0)
                .arg(payload)
                .query(&mut con)
                .unwrap_or_else(|e| panic!("RESTORE of {key}: {}", error_text(&e)));
            assert_eq!(dump(&mut con, &copy).as_ref(), Some(payload), "{key}");
        }
        assert_wide_state(&mut con, "copy:", "RESTORE");
        // a counter widens on a restored key too
        let reply = rl(&mut con, &hw_call("copy:hw:narrow", "100000", "70000"));
        assert!(reply.allowed);
        assert_encoding_2(&dump(&mut con, "copy:hw:narrow").unwrap(), 4, "widened");
    });
}

/// The fixtures of `tests/fixtures/encoding-v2/`, written by the build
/// that introduced encoding 2, restore with their state and width, and are
/// written back as they are.
#[test]
fn hash_windows_of_encoding_2_fixtures_restore_with_their_state() {
    for_each_server(|kind| {
        let server = Server::start(kind, &[]);
        let mut con = server.conn();
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/encoding-v2");
        for (key, _, _, width, _) in WIDE {
            let name = format!("dump-{}.hex", key.replace(':', "-"));
            let fixture = hex_file(&dir.join(name));
            assert_encoding_2(&fixture, width, key);
            let restored = format!("fixture:{key}");
            restore(&mut con, &restored, &fixture);
            let payload = dump(&mut con, &restored).unwrap();
            assert_eq!(body(&payload), body(&fixture), "{kind}: {key}");
        }
        assert_wide_state(&mut con, "fixture:", "encoding 2 fixtures");
    });
}

/// The RESP form of one command.
fn resp(words: &[&[u8]]) -> Vec<u8> {
    let mut out = format!("*{}\r\n", words.len()).into_bytes();
    for word in words {
        out.extend_from_slice(format!("${}\r\n", word.len()).as_bytes());
        out.extend_from_slice(word);
        out.extend_from_slice(b"\r\n");
    }
    out
}

/// `RL.SETSTATE` reads encoding 2 (the header fields in decimal, then the
/// counters as one argument of raw bytes) as well as encoding 1, from an
/// AOF: the encoding 2 fixtures' fields, set so, are the fixtures' states.
#[test]
fn rl_setstate_reads_encoding_2_from_an_aof() {
    for_each_server(|kind| {
        let mut server = Server::start(kind, &["--appendonly", "yes"]);
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/encoding-v2");
        let mut aof = resp(&[b"SELECT", b"0"]);
        let mut fixtures = Vec::new();
        for (key, ..) in WIDE {
            let fixture = hex_file(&dir.join(format!("dump-{}.hex", key.replace(':', "-"))));
            let mut words: Vec<Vec<u8>> = vec![
                b"RL.SETSTATE".to_vec(),
                format!("set:{key}").into_bytes(),
                b"HASHWINDOW".to_vec(),
                b"2".to_vec(),
            ];
            for field in payload::module_fields(&fixture).unwrap() {
                words.push(match field {
                    Field::Unsigned(v) => v.to_string().into_bytes(),
                    Field::String(bytes) => bytes,
                    Field::Signed(_) => panic!("{key}: a signed field"),
                });
            }
            let words: Vec<&[u8]> = words.iter().map(Vec::as_slice).collect();
            aof.extend(resp(&words));
            fixtures.push(fixture);
        }
        server.stop();
        // An AOF of the single-file form, which the server takes as its base.
        fs::remove_dir_all(server.dir.join("appendonlydir")).expect("remove appendonlydir");
        fs::write(server.dir.join("appendonly.aof"), aof).expect("write the AOF");
        server.restart();
        let mut con = server.conn();
        for ((key, ..), fixture) in WIDE.iter().zip(&fixtures) {
            let payload = dump(&mut con, &format!("set:{key}")).expect("set by the AOF");
            assert_eq!(body(&payload), body(fixture), "{kind}: {key}");
        }
        assert_wide_state(&mut con, "set:", "RL.SETSTATE of encoding 2");
    });
}

#[test]
fn encoding_2_survives_an_rdb_restart() {
    for_each_server(|kind| {
        let mut server = Server::start(kind, &[]);
        let mut con = server.conn();
        build_wide(&mut con);
        let dumps = wide_dumps(&mut con, "");
        save(&mut con);
        server.restart();
        let mut con = server.conn();
        assert_eq!(wide_dumps(&mut con, ""), dumps);
        assert_wide_state(&mut con, "", "SAVE and restart");
    });
}

/// True once an AOF rewrite after the first base file is done.
fn rewritten(server: &Server) -> bool {
    let info = server.info("persistence");
    let idle = info_field(&info, "aof_rewrite_in_progress").as_deref() == Some("0")
        && info_field(&info, "aof_rewrite_scheduled").as_deref() == Some("0");
    let Ok(entries) = fs::read_dir(server.dir.join("appendonlydir")) else {
        return false;
    };
    idle && entries.filter_map(Result::ok).any(|entry| {
        let name = entry.file_name().to_string_lossy().into_owned();
        name.contains(".base.") && !name.contains(".1.base.")
    })
}

#[test]
fn encoding_2_survives_an_aof_rewrite_with_and_without_the_rdb_preamble() {
    for_each_server(|kind| {
        for preamble in ["yes", "no"] {
            let mut server = Server::start(
                kind,
                &["--appendonly", "yes", "--aof-use-rdb-preamble", preamble],
            );
            let mut con = server.conn();
            build_wide(&mut con);
            let dumps = wide_dumps(&mut con, "");
            let _: Value = query(&mut con, &["BGREWRITEAOF"]);
            poll_until("the AOF rewrite to finish", Duration::from_secs(20), || {
                rewritten(&server)
            });
            let info = server.info("persistence");
            assert_eq!(
                info_field(&info, "aof_last_bgrewrite_status").as_deref(),
                Some("ok")
            );
            server.restart();
            let mut con = server.conn();
            // (each ring is at the narrowest width of its counts, which the
            // decimal fields of RL.SETSTATE load back at)
            assert_eq!(wide_dumps(&mut con, ""), dumps, "preamble {preamble}");
            assert_wide_state(&mut con, "", &format!("AOF rewrite, preamble {preamble}"));
        }
    });
}

#[test]
fn a_replica_of_hash_windows_in_encoding_2_is_byte_identical() {
    for_each_server(|kind| {
        let master = Server::start(kind, &[]);
        let mut m = master.conn();
        build_wide(&mut m);
        rl(&mut m, &hw_call("hw:grows", "10000000000", "100"));
        // the full sync carries encoding 2
        let replica = replica_of(&master);
        let mut keys: Vec<String> = WIDE.iter().map(|w| w.0.to_string()).collect();
        keys.push("hw:grows".into());
        assert_same_dataset(&master, &replica, &keys);
        // a ring widened on the master by a propagated call
        rl(&mut m, &hw_call("hw:grows", "10000000000", "70000"));
        rl(&mut m, &hw_call("hw:narrow", "1000", "5 FORCE"));
        wait_for_sync(&master, &replica);
        assert_same_dataset(&master, &replica, &keys);
        let mut r = replica.conn();
        assert_encoding_2(&dump(&mut r, "hw:grows").unwrap(), 4, "replica");
    });
}

// ---------------------------------------------------------------------------
// ratelimit.write-encoding 1: what release 0.1.0 reads

/// The body of a payload: all but the RDB version and CRC.
fn body(payload: &[u8]) -> &[u8] {
    &payload[..payload::body_len(payload)]
}

fn restore(con: &mut Connection, key: &str, payload: &[u8]) {
    let _: () = redis::cmd("RESTORE")
        .arg(key)
        .arg(0)
        .arg(payload)
        .query(con)
        .unwrap_or_else(|e| panic!("RESTORE {key}: {}", error_text(&e)));
}

#[test]
fn pinned_to_encoding_1_each_fixture_state_dumps_as_the_fixture() {
    for_each_server(|kind| {
        // as a load argument
        let server = Server::start(kind, &["write-encoding", "1"]);
        let mut con = server.conn();
        let all: Vec<String> = query(&mut con, &["CONFIG", "GET", "ratelimit.write-encoding"]);
        assert_eq!(all, ["ratelimit.write-encoding", "1"]);
        for (alg, ..) in KEYS {
            let fixture = hex_fixture(&format!("dump-{alg}.hex"));
            let key = format!("restored:{alg}");
            restore(&mut con, &key, &fixture);
            let payload = dump(&mut con, &key).unwrap();
            assert_eq!(body(&payload), body(&fixture), "{kind}: {alg}");
            assert_eq!(encver(&payload), 1, "{alg}");
            assert_fixture_state(&mut con, &key, alg, "RESTORE pinned");
        }
        // and a ring with wide counters: its decimal fields
        build_wide(&mut con);
        for ((key, ..), payload) in WIDE.iter().zip(wide_dumps(&mut con, "")) {
            assert_eq!(encver(&payload), 1, "{key}");
            let fields = payload::module_fields(&payload).unwrap();
            assert_eq!(fields.len(), 4 + 61, "{key}");
            assert!(
                fields.iter().all(|f| matches!(f, Field::Unsigned(_))),
                "{key}"
            );
        }
    });
}

/// Unpinned, the other types still write the fixtures' bytes (only the hash
/// window has a new encoding), and the hash window's state is the fixture's
/// in encoding 2.
#[test]
fn unpinned_only_the_hash_window_writes_another_encoding() {
    for_each_server(|kind| {
        let server = Server::start(kind, &[]);
        let mut con = server.conn();
        for (alg, ..) in KEYS {
            let fixture = hex_fixture(&format!("dump-{alg}.hex"));
            let key = format!("restored:{alg}");
            restore(&mut con, &key, &fixture);
            let payload = dump(&mut con, &key).unwrap();
            if alg == "hashwindow" {
                assert_eq!(encver(&payload), 2);
                let fields = payload::module_fields(&payload).unwrap();
                let u = Field::Unsigned;
                assert_eq!(
                    fields,
                    [
                        u(1 << 40),
                        u(1),
                        u(5),
                        u(2),
                        u(2),
                        Field::String(vec![0, 0, 5, 0])
                    ]
                );
            } else {
                assert_eq!(body(&payload), body(&fixture), "{kind}: {alg}");
            }
        }
    });
}

#[test]
fn an_rdb_written_pinned_to_encoding_1_loads_unpinned() {
    for_each_server(|kind| {
        // on the command line
        let pinned = Server::start(kind, &["--ratelimit.write-encoding", "1"]);
        let mut con = pinned.conn();
        let all: Vec<String> = query(&mut con, &["CONFIG", "GET", "ratelimit.write-encoding"]);
        assert_eq!(all, ["ratelimit.write-encoding", "1"]);
        for (alg, ..) in KEYS {
            restore(
                &mut con,
                &format!("fixture:{alg}"),
                &hex_fixture(&format!("dump-{alg}.hex")),
            );
        }
        build_wide(&mut con);
        save(&mut con);
        let rdb = fs::read(pinned.dir.join("dump.rdb")).expect("the pinned RDB");
        let mut server = Server::start(kind, &[]);
        fs::write(server.dir.join("dump.rdb"), rdb).expect("write dump.rdb");
        server.restart();
        let mut con = server.conn();
        for (alg, ..) in KEYS {
            assert_fixture_state(&mut con, &format!("fixture:{alg}"), alg, "pinned RDB");
        }
        assert_wide_state(&mut con, "", "pinned RDB");
        // written again unpinned: encoding 2, at the narrowest width
        for ((key, _, _, width, _), payload) in WIDE.iter().zip(wide_dumps(&mut con, "")) {
            assert_encoding_2(&payload, *width, key);
        }
    });
}

#[test]
fn write_encoding_is_immutable() {
    for_each_server(|kind| {
        let server = Server::start(kind, &[]);
        let mut con = server.conn();
        for value in ["1", "2"] {
            let err = query_err(
                &mut con,
                &["CONFIG", "SET", "ratelimit.write-encoding", value],
            );
            assert!(err.contains("immutable"), "{err}");
        }
        let all: Vec<String> = query(&mut con, &["CONFIG", "GET", "ratelimit.*"]);
        let at = all.iter().position(|n| n == "ratelimit.write-encoding");
        assert_eq!(at.map(|i| all[i + 1].as_str()), Some("2"), "{all:?}");
    });
}

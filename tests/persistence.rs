//! Persistence: limiter state survives RDB and AOF restarts, AOF rewrites,
//! `DUMP`/`RESTORE` and `COPY` exactly (byte-identical `DUMP`), and corrupt
//! payloads are refused without harming the server.

mod common;

use std::fs;
use std::time::Duration;

use common::payload::{self, Field};
use common::*;

const TB: &[&str] = &["RL.TOKENBUCKET", "tb", "10", "1", "1000000"];
const FW: &[&str] = &["RL.FIXEDWINDOW", "fw", "10", "1000000"];

/// Puts some traffic, denials included, through a token bucket and a fixed
/// window whose states outlive the test.
fn make_limiters(con: &mut Connection) {
    for cost in ["1", "3", "0", "20", "2"] {
        rl(con, &[TB, &["COST", cost][..]].concat());
        rl(con, &[FW, &["COST", cost][..]].concat());
    }
}

/// `DUMP` and `PTTL` of every key given.
fn snapshot(con: &mut Connection, keys: &[&str]) -> Vec<(Option<Vec<u8>>, i64)> {
    keys.iter()
        .map(|key| (dump(con, key), pttl(con, key)))
        .collect()
}

/// Same states, and expiries that did not move later.
fn assert_same_after(
    what: &str,
    con: &mut Connection,
    keys: &[&str],
    before: &[(Option<Vec<u8>>, i64)],
) {
    let after = snapshot(con, keys);
    for ((key, b), a) in keys.iter().zip(before).zip(&after) {
        assert!(b.0.is_some(), "{key} missing before {what}");
        assert_eq!(a.0, b.0, "{key}: state differs after {what}");
        assert!(
            a.1 > 0 && a.1 <= b.1,
            "{key}: PTTL {} before {what}, {} after",
            b.1,
            a.1
        );
    }
}

/// The remaining units each limiter reports, without consuming any.
fn remaining(con: &mut Connection) -> (i64, i64) {
    (
        rl(con, &[TB, &["COST", "0"][..]].concat()).remaining,
        rl(con, &[FW, &["COST", "0"][..]].concat()).remaining,
    )
}

#[test]
fn limiters_survive_save_and_restart() {
    for_each_server(|kind| {
        let mut server = Server::start(kind, &[]);
        let mut con = server.conn();
        make_limiters(&mut con);
        let before = snapshot(&mut con, &["tb", "fw"]);
        let left = remaining(&mut con);
        let _: () = query(&mut con, &["SAVE"]);
        server.restart();
        let mut con = server.conn();
        assert_same_after("SAVE and restart", &mut con, &["tb", "fw"], &before);
        assert_eq!(key_type(&mut con, "tb"), "rl-tokbkt");
        assert_eq!(key_type(&mut con, "fw"), "rl-fixwin");
        assert_eq!(remaining(&mut con), left);
        let r = rl(&mut con, TB);
        assert_eq!((r.allowed, r.remaining), (true, left.0 - 1));
    });
}

#[test]
fn limiters_survive_an_aof_restart() {
    for_each_server(|kind| {
        let mut server = Server::start(kind, &["--appendonly", "yes"]);
        let mut con = server.conn();
        make_limiters(&mut con);
        // A parameter change is replayed too.
        rl(&mut con, &["RL.TOKENBUCKET", "tb", "12", "5", "999999"]);
        let before = snapshot(&mut con, &["tb", "fw"]);
        let left = remaining(&mut con);
        server.restart();
        let mut con = server.conn();
        assert_same_after("an AOF restart", &mut con, &["tb", "fw"], &before);
        assert_eq!(remaining(&mut con), left);
    });
}

#[test]
fn limiters_survive_an_aof_rewrite_without_rdb_preamble() {
    for_each_server(|kind| {
        let mut server = Server::start(
            kind,
            &["--appendonly", "yes", "--aof-use-rdb-preamble", "no"],
        );
        let mut con = server.conn();
        make_limiters(&mut con);
        let _: Value = query(&mut con, &["BGREWRITEAOF"]);
        let base_has_setstate = |server: &Server| {
            fs::read_dir(server.dir.join("appendonlydir"))
                .map(|entries| {
                    entries.filter_map(Result::ok).any(|entry| {
                        entry.file_name().to_string_lossy().ends_with(".base.aof")
                            && fs::read(entry.path())
                                .map(|bytes| {
                                    String::from_utf8_lossy(&bytes).contains("RL.SETSTATE")
                                })
                                .unwrap_or(false)
                    })
                })
                .unwrap_or(false)
        };
        poll_until("the AOF rewrite to finish", Duration::from_secs(20), || {
            let info = server.info("persistence");
            info_field(&info, "aof_rewrite_in_progress").as_deref() == Some("0")
                && info_field(&info, "aof_rewrite_scheduled").as_deref() == Some("0")
                && base_has_setstate(&server)
        });
        let info = server.info("persistence");
        assert_eq!(
            info_field(&info, "aof_last_bgrewrite_status").as_deref(),
            Some("ok")
        );

        // More calls after the rewrite land in the incremental file.
        rl(&mut con, TB);
        rl(&mut con, FW);
        let before = snapshot(&mut con, &["tb", "fw"]);
        let left = remaining(&mut con);
        server.restart();
        let mut con = server.conn();
        assert_same_after("BGREWRITEAOF and restart", &mut con, &["tb", "fw"], &before);
        assert_eq!(remaining(&mut con), left);
    });
}

#[test]
fn dump_and_restore_keep_the_state() {
    for_each_server(|kind| {
        let server = Server::start(kind, &[]);
        let mut con = server.conn();
        make_limiters(&mut con);
        for (key, copy) in [("tb", "tb:restored"), ("fw", "fw:restored")] {
            let payload = dump(&mut con, key).unwrap();
            let _: () = redis::cmd("RESTORE")
                .arg(copy)
                .arg(0)
                .arg(&payload)
                .query(&mut con)
                .expect("RESTORE of a DUMP payload");
            assert_eq!(dump(&mut con, copy).as_deref(), Some(payload.as_slice()));
            assert_eq!(key_type(&mut con, copy), key_type(&mut con, key));
        }
        let r = rl(
            &mut con,
            &["RL.TOKENBUCKET", "tb:restored", "10", "1", "1000000"],
        );
        let original = rl(&mut con, TB);
        assert_eq!(r.remaining, original.remaining);
        let r = rl(
            &mut con,
            &["RL.FIXEDWINDOW", "fw:restored", "10", "1000000"],
        );
        let original = rl(&mut con, FW);
        assert_eq!(r.remaining, original.remaining);
        assert!(
            pttl(&mut con, "tb:restored") > 0,
            "a call sets the TTL again"
        );
    });
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn restore(con: &mut Connection, key: &str, payload: &[u8]) -> Result<(), String> {
    redis::cmd("RESTORE")
        .arg(key)
        .arg(0)
        .arg(payload)
        .arg("REPLACE")
        .query::<()>(con)
        .map_err(|e| error_text(&e))
}

/// After a `RESTORE` of a doubtful payload: if it was accepted, limiter
/// calls on the key still answer (a reply or a clean error, never a crash or
/// a caught panic).
fn exercise(con: &mut Connection, key: &str) {
    for words in [
        ["RL.TOKENBUCKET", key, "10", "1", "1000000", "COST", "0"].as_slice(),
        ["RL.TOKENBUCKET", key, "10", "1", "1000000"].as_slice(),
        ["RL.TOKENBUCKET", key, "3", "7", "10"].as_slice(),
        ["RL.FIXEDWINDOW", key, "10", "1000000", "COST", "0"].as_slice(),
        ["RL.FIXEDWINDOW", key, "10", "1000000"].as_slice(),
        ["RL.FIXEDWINDOW", key, "3", "10"].as_slice(),
    ] {
        match command(words).query::<Value>(con) {
            Ok(value) => {
                Reply::from_value(&value);
            }
            Err(e) => {
                let text = error_text(&e);
                assert!(
                    !text.contains("internal error"),
                    "{words:?} on a restored key hit a caught panic: {text}"
                );
            }
        }
    }
    let _: Value = query(con, &["DUMP", key]);
    let _: Value = query(con, &["DEBUG", "DIGEST-VALUE", key]);
    let _: Value = query(con, &["MEMORY", "USAGE", key]);
}

#[test]
fn restore_refuses_truncated_payloads_and_the_server_stays_up() {
    for_each_server(|kind| {
        let mut server = Server::start(kind, &[]);
        let mut con = server.conn();
        make_limiters(&mut con);
        for key in ["tb", "fw"] {
            let payload = dump(&mut con, key).unwrap();
            assert!(
                payload::checksum_ok(&payload),
                "our CRC-64 disagrees with the server's"
            );
            // Cut anywhere, checksum left as is.
            for len in [0, 1, 5, payload.len() / 2, payload.len() - 1] {
                match restore(&mut con, "victim", &payload[..len]) {
                    Err(err) => assert!(err.starts_with("ERR"), "{err}"),
                    Ok(()) => panic!("RESTORE accepted {}", hex(&payload[..len])),
                }
            }
            // Body cut short, version and checksum fixed up: only the
            // module's own loader can tell. (RESTORE reads on into the
            // version and checksum bytes, which may happen to complete a
            // valid value: then it must be a sound limiter.)
            let body = payload::body_len(&payload);
            let mut refused = 0;
            for cut in 1..body - 10 {
                let mut short = payload[..body - cut].to_vec();
                short.extend_from_slice(&payload[body..]);
                payload::reseal(&mut short);
                match restore(&mut con, "victim", &short) {
                    Err(err) => {
                        assert!(err.starts_with("ERR"), "{key} body cut by {cut}: {err}");
                        refused += 1;
                    }
                    Ok(()) => {
                        exercise(&mut con, "victim");
                        let _: i64 = query(&mut con, &["DEL", "victim"]);
                    }
                }
            }
            assert!(
                refused >= (body - 11) / 2,
                "{key}: only {refused} truncations refused"
            );
        }
        assert!(!exists(&mut con, "victim"));
        assert!(server.is_running(), "the server died");
        let pong: String = query(&mut con, &["PING"]);
        assert_eq!(pong, "PONG");
    });
}

#[test]
fn restore_refuses_an_unknown_encoding_version() {
    for_each_server(|kind| {
        let server = Server::start(kind, &[]);
        let mut con = server.conn();
        make_limiters(&mut con);
        for key in ["tb", "fw"] {
            let payload = dump(&mut con, key).unwrap();
            let encver = payload::module_id(&payload).expect("a module value") & 1023;
            for other in [encver + 1, 1023] {
                let future = payload::with_encoding_version(&payload, other);
                let err = restore(&mut con, "victim", &future)
                    .expect_err("RESTORE of an unknown encoding version succeeded");
                assert!(err.starts_with("ERR"), "{err}");
            }
        }
        assert!(!exists(&mut con, "victim"));
    });
}

#[test]
fn restore_of_corrupt_payloads_never_harms_the_server() {
    for_each_server(|kind| {
        let mut server = Server::start(kind, &[]);
        let mut con = server.conn();
        make_limiters(&mut con);
        for key in ["tb", "fw"] {
            let payload = dump(&mut con, key).unwrap();
            let body = payload::body_len(&payload);
            // Every byte after the module id, mutated.
            for pos in 10..body {
                let mutations: [fn(u8) -> u8; 4] = [|b| b ^ 0x01, |b| b ^ 0x80, |_| 0x00, |_| 0xff];
                for mutate in mutations {
                    let mut bad = payload.clone();
                    bad[pos] = mutate(bad[pos]);
                    payload::reseal(&mut bad);
                    if restore(&mut con, "victim", &bad).is_ok() {
                        exercise(&mut con, "victim");
                    }
                }
            }
            // Every saved integer replaced by extreme values.
            let fields = payload::module_fields(&payload).expect("a module value of integers");
            assert!(!fields.is_empty());
            for i in 0..fields.len() {
                for extreme in [0, 1, (1 << 40) + 1, 1 << 53, 1 << 62, u64::MAX] {
                    let mut bad_fields = fields.clone();
                    bad_fields[i] = match &fields[i] {
                        Field::Unsigned(_) => Field::Unsigned(extreme),
                        Field::Signed(_) => Field::Signed(extreme),
                        Field::String(_) => continue,
                    };
                    let bad = payload::with_fields(&payload, &bad_fields);
                    if restore(&mut con, "victim", &bad).is_ok() {
                        exercise(&mut con, "victim");
                    }
                }
            }
            // A field missing or one too many.
            let bad = payload::with_fields(&payload, &fields[..fields.len() - 1]);
            assert!(
                restore(&mut con, "victim", &bad).is_err(),
                "{key}: a field short"
            );
            let mut extra = fields.clone();
            extra.push(Field::Unsigned(1));
            let bad = payload::with_fields(&payload, &extra);
            assert!(
                restore(&mut con, "victim", &bad).is_err(),
                "{key}: a field too many"
            );
            // The untouched payload still restores (the tools above are sound).
            let same = payload::with_fields(&payload, &fields);
            assert_eq!(same, payload, "re-encoding changed the payload");
        }
        assert!(server.is_running(), "the server died");
        let pong: String = query(&mut con, &["PING"]);
        assert_eq!(pong, "PONG");
    });
}

#[test]
fn copy_makes_an_independent_limiter() {
    for_each_server(|kind| {
        let server = Server::start(kind, &[]);
        let mut con = server.conn();
        make_limiters(&mut con);
        for (key, copy, call) in [
            (
                "tb",
                "tb:copy",
                ["RL.TOKENBUCKET", "tb:copy", "10", "1", "1000000"].as_slice(),
            ),
            (
                "fw",
                "fw:copy",
                ["RL.FIXEDWINDOW", "fw:copy", "10", "1000000"].as_slice(),
            ),
        ] {
            let copied: i64 = query(&mut con, &["COPY", key, copy]);
            assert_eq!(copied, 1);
            let original = dump(&mut con, key);
            assert_eq!(dump(&mut con, copy), original);
            let original_ttl = pttl(&mut con, key);
            let ttl = pttl(&mut con, copy);
            assert!(
                ttl > 0 && ttl <= original_ttl,
                "COPY keeps the expiry: PTTL {ttl}, original {original_ttl}"
            );
            let r = rl(&mut con, call);
            assert!(r.allowed);
            assert_ne!(dump(&mut con, copy), original, "the copy did not change");
            assert_eq!(
                dump(&mut con, key),
                original,
                "changing the copy changed the original"
            );
        }
    });
}

#[test]
fn memory_usage_is_reported_for_limiter_keys() {
    for_each_server(|kind| {
        let server = Server::start(kind, &[]);
        let mut con = server.conn();
        make_limiters(&mut con);
        for key in ["tb", "fw"] {
            let bytes: i64 = query(&mut con, &["MEMORY", "USAGE", key]);
            assert!(
                bytes > 0 && bytes < 1024,
                "MEMORY USAGE {key} = {bytes} for one small limiter"
            );
        }
    });
}

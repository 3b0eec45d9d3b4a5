//! Persistence, for every limiter type: state survives RDB and AOF restarts,
//! AOF rewrites, `DUMP`/`RESTORE` and `COPY` exactly (byte-identical
//! `DUMP`), and corrupt payloads are refused without harming the server.
//! The algorithms, and the limiters worth persisting each one builds, are in
//! `harness/contract.rs`.

use std::fs;
use std::time::Duration;

use crate::harness::contract::*;
use crate::harness::payload::{self, Field};
use crate::harness::*;

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

/// What one algorithm's limiters looked like before a restart.
struct Before {
    built: Vec<Built>,
    snapshot: Vec<(Option<Vec<u8>>, i64)>,
    /// What a peek at the first (slow) limiter reported.
    remaining: i64,
}

impl Before {
    fn keys(&self) -> Vec<&str> {
        self.built.iter().map(|b| b.key.as_str()).collect()
    }
}

/// Builds every algorithm's limiters.
fn build_all(kind: ServerKind, con: &mut Connection) -> Vec<Vec<Built>> {
    let mut all = Vec::new();
    for_each_algorithm(kind, |alg| all.push((alg.build)(con, alg.key)));
    all
}

/// Snapshots what `build_all` built.
fn before_restart(con: &mut Connection, built: Vec<Vec<Built>>) -> Vec<Before> {
    ALGORITHMS
        .iter()
        .zip(built)
        .map(|(alg, built)| {
            let keys: Vec<&str> = built.iter().map(|b| b.key.as_str()).collect();
            let snapshot = snapshot(con, &keys);
            let remaining = built[0].peek(alg, con).remaining;
            Before {
                built,
                snapshot,
                remaining,
            }
        })
        .collect()
}

/// After a restart: every limiter as it was, of its own type, and the first
/// one goes on from where it was.
fn assert_restored(kind: ServerKind, what: &str, server: &Server, before: &[Before]) {
    let mut con = server.conn();
    for_each_algorithm(kind, |alg| {
        let before = &before[alg.index()];
        assert_same_after(
            &format!("{what} ({alg})"),
            &mut con,
            &before.keys(),
            &before.snapshot,
        );
        let first = &before.built[0];
        assert_eq!(key_type(&mut con, &first.key), alg.type_name, "{alg}");
        let r = first.peek(alg, &mut con);
        assert_eq!(r.remaining, before.remaining, "{alg}: {r:?}");
        let r = first.take(alg, &mut con);
        assert_eq!(
            (r.allowed, r.remaining),
            (true, before.remaining - 1),
            "{alg}: {r:?}"
        );
    });
}

#[test]
fn limiters_survive_save_and_restart() {
    for_each_server(|kind| {
        let mut server = Server::start(kind, &[]);
        let mut con = server.conn();
        let built = build_all(kind, &mut con);
        let before = before_restart(&mut con, built);
        save(&mut con);
        server.restart();
        assert_restored(kind, "SAVE and restart", &server, &before);
    });
}

#[test]
fn limiters_survive_an_aof_restart() {
    for_each_server(|kind| {
        let mut server = Server::start(kind, &["--appendonly", "yes"]);
        let mut con = server.conn();
        let built = build_all(kind, &mut con);
        let before = before_restart(&mut con, built);
        server.restart();
        assert_restored(kind, "an AOF restart", &server, &before);
    });
}

/// True once the AOF base file holds `RL.SETSTATE` for every algorithm.
fn base_aof_has_setstate_for_all(server: &Server) -> bool {
    let Ok(entries) = fs::read_dir(server.dir.join("appendonlydir")) else {
        return false;
    };
    entries.filter_map(Result::ok).any(|entry| {
        entry.file_name().to_string_lossy().ends_with(".base.aof")
            && fs::read(entry.path())
                .map(|bytes| {
                    let text = String::from_utf8_lossy(&bytes);
                    // Each algorithm as an argument of its own.
                    text.contains("RL.SETSTATE")
                        && ALGORITHMS
                            .iter()
                            .all(|alg| text.contains(&format!("\r\n{}\r\n", alg.setstate_name)))
                })
                .unwrap_or(false)
    })
}

#[test]
fn limiters_survive_an_aof_rewrite_without_rdb_preamble() {
    for_each_server(|kind| {
        let mut server = Server::start(
            kind,
            &["--appendonly", "yes", "--aof-use-rdb-preamble", "no"],
        );
        let mut con = server.conn();
        let built = build_all(kind, &mut con);
        let _: Value = query(&mut con, &["BGREWRITEAOF"]);
        poll_until("the AOF rewrite to finish", Duration::from_secs(20), || {
            let info = server.info("persistence");
            info_field(&info, "aof_rewrite_in_progress").as_deref() == Some("0")
                && info_field(&info, "aof_rewrite_scheduled").as_deref() == Some("0")
                && base_aof_has_setstate_for_all(&server)
        });
        let info = server.info("persistence");
        assert_eq!(
            info_field(&info, "aof_last_bgrewrite_status").as_deref(),
            Some("ok")
        );
        // More calls after the rewrite land in the incremental file.
        for (alg, built) in ALGORITHMS.iter().zip(&built) {
            built[0].take(alg, &mut con);
        }
        let before = before_restart(&mut con, built);
        server.restart();
        assert_restored(kind, "BGREWRITEAOF and restart", &server, &before);
    });
}

#[test]
fn dump_and_restore_keep_the_state() {
    for_each_algorithm_on_each_server(|alg, con| {
        let built = (alg.build)(con, alg.key);
        for built in &built {
            let payload = dump(con, &built.key).unwrap();
            let restored = format!("{}:restored", built.key);
            restore(con, &restored, &payload)
                .unwrap_or_else(|e| panic!("{alg}: RESTORE of a DUMP payload: {e}"));
            assert_eq!(dump(con, &restored), Some(payload), "{alg}: {restored}");
            assert_eq!(key_type(con, &restored), alg.type_name, "{alg}");
        }
        // The slow one goes on exactly as its original.
        let original = &built[0];
        let restored = Built {
            key: format!("{}:restored", original.key),
            params: original.params.clone(),
            fuzz: false,
        };
        let (a, b) = (original.peek(alg, con), restored.peek(alg, con));
        assert_eq!(
            (b.allowed, b.limit, b.remaining),
            (a.allowed, a.limit, a.remaining),
            "{alg}: peek at {} and at its original",
            restored.key
        );
        let (a, b) = (original.take(alg, con), restored.take(alg, con));
        assert_eq!(
            (b.allowed, b.remaining),
            (a.allowed, a.remaining),
            "{alg}: a call on {} and on its original",
            restored.key
        );
    });
}

/// Asserts an admitted call gave `key` the expiry its `reset_ms` tells.
fn assert_expiry_follows(alg: &Algorithm, con: &mut Connection, key: &str, r: &Reply, what: &str) {
    assert!(r.allowed, "{alg}: {r:?}");
    let ttl = pttl(con, key);
    assert!(
        ttl > r.reset_ms - SLACK_MS && ttl <= alg.latest_expiry_ms(r.reset_ms),
        "{alg}: after an admitted call on {key} {what}, PTTL {ttl} vs reset_ms {}",
        r.reset_ms
    );
}

/// The expiry is part of the limiter (docs/commands.md: "After an admitted
/// call the key's TTL is set to the same instant, so idle limiters vanish by
/// themselves"), also when something took it away: a `RESTORE` with TTL 0,
/// or `PERSIST`.
#[test]
fn admitted_call_gives_a_key_without_expiry_its_expiry_back() {
    for_each_algorithm_on_each_server(|alg, con| {
        let key = alg.key;
        let mut call = alg.words(key, &alg.valid());
        call.extend(["COST", "1"]);
        alg.away_from_window_end(con, &alg.valid());
        assert!(alg.slow(con, key, "5", "1").allowed);

        let payload = dump(con, key).unwrap();
        let restored = format!("{key}:restored");
        restore(con, &restored, &payload)
            .unwrap_or_else(|e| panic!("{alg}: RESTORE of a DUMP payload: {e}"));
        assert_eq!(pttl(con, &restored), -1, "{alg}: RESTORE with TTL 0");
        let r = alg.slow(con, &restored, "5", "1");
        assert_expiry_follows(alg, con, &restored, &r, "restored with TTL 0");

        // PERSIST between two calls, all in one transaction (so in one
        // window, bucket or millisecond).
        let _: () = query(con, &["MULTI"]);
        let _: String = query(con, &call);
        let _: String = query(con, &["PERSIST", key]);
        let _: String = query(con, &call);
        let replies: Vec<Value> = query(con, &["EXEC"]);
        assert_eq!(replies[1], Value::Int(1), "{alg}: PERSIST {key}");
        let r = alg.reply_of(&replies[2]);
        assert_expiry_follows(alg, con, key, &r, "just after PERSIST");
    });
}

#[test]
fn copy_makes_an_independent_limiter() {
    for_each_algorithm_on_each_server(|alg, con| {
        let built = (alg.build)(con, alg.key);
        let original = &built[0];
        let copy = Built {
            key: format!("{}:copy", original.key),
            params: original.params.clone(),
            fuzz: false,
        };
        let copied: i64 = query(con, &["COPY", &original.key, &copy.key]);
        assert_eq!(copied, 1, "{alg}");
        let state = dump(con, &original.key);
        assert_eq!(dump(con, &copy.key), state, "{alg}: COPY");
        let original_ttl = pttl(con, &original.key);
        let ttl = pttl(con, &copy.key);
        assert!(
            ttl > 0 && ttl <= original_ttl,
            "{alg}: COPY keeps the expiry: PTTL {ttl}, original {original_ttl}"
        );

        let remaining = original.peek(alg, con).remaining;
        let r = copy.take(alg, con);
        assert!(r.allowed, "{alg}: {r:?}");
        assert_ne!(
            dump(con, &copy.key),
            state,
            "{alg}: the copy did not change"
        );
        assert_eq!(copy.peek(alg, con).remaining, remaining - 1, "{alg}");
        assert_eq!(
            original.peek(alg, con).remaining,
            remaining,
            "{alg}: using the copy changed the original"
        );
        assert_eq!(
            dump(con, &original.key),
            state,
            "{alg}: changing the copy changed the original"
        );
    });
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// `RESTORE key 0 payload REPLACE`: no expiry.
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
/// a caught panic), its own algorithm's and another's.
fn exercise(alg: &Algorithm, con: &mut Connection, key: &str) {
    let another = alg.another();
    let calls = alg
        .exercise
        .iter()
        .map(|args| (alg, alg.words(key, args)))
        .chain([(another, another.words(key, another.exercise[0]))]);
    for (alg, words) in calls {
        match command(&words).query::<Value>(con) {
            Ok(value) => {
                alg.reply_of(&value);
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

/// Runs `test` on the `DUMP` payload of each limiter every algorithm builds
/// that is small enough to corrupt byte by byte, on one server per kind
/// which must stay up through all of it.
fn for_each_payload_to_corrupt(test: impl Fn(&Algorithm, &mut Connection, &str, Vec<u8>)) {
    for_each_server(|kind| {
        let mut server = Server::start(kind, &[]);
        for_each_algorithm(kind, |alg| {
            let mut con = flushed(&server);
            for built in (alg.build)(&mut con, alg.key) {
                if built.fuzz {
                    let payload = dump(&mut con, &built.key).unwrap();
                    test(alg, &mut con, &built.key, payload);
                }
            }
        });
        assert!(server.is_running(), "the server died");
        let pong: String = query(&mut server.conn(), &["PING"]);
        assert_eq!(pong, "PONG");
    });
}

#[test]
fn restore_refuses_truncated_payloads_and_the_server_stays_up() {
    for_each_payload_to_corrupt(|alg, con, key, payload| {
        assert!(
            payload::checksum_ok(&payload),
            "our CRC-64 disagrees with the server's"
        );
        // Cut anywhere, checksum left as is.
        for len in [0, 1, 5, payload.len() / 2, payload.len() - 1] {
            match restore(con, "victim", &payload[..len]) {
                Err(err) => assert!(err.starts_with("ERR"), "{err}"),
                Ok(()) => panic!("{alg}: RESTORE accepted {}", hex(&payload[..len])),
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
            match restore(con, "victim", &short) {
                Err(err) => {
                    assert!(err.starts_with("ERR"), "{key} body cut by {cut}: {err}");
                    refused += 1;
                }
                Ok(()) => {
                    exercise(alg, con, "victim");
                    let _: i64 = query(con, &["DEL", "victim"]);
                }
            }
        }
        assert!(
            refused >= (body - 11) / 2,
            "{key}: only {refused} truncations refused"
        );
        assert!(!exists(con, "victim"), "{key}: a refused RESTORE wrote");
    });
}

#[test]
fn restore_refuses_an_unknown_encoding_version() {
    for_each_algorithm_on_each_server(|alg, con| {
        for built in (alg.build)(con, alg.key) {
            let payload = dump(con, &built.key).unwrap();
            let encver = payload::module_id(&payload).expect("a module value") & 1023;
            for other in [encver + 1, 1023] {
                let future = payload::with_encoding_version(&payload, other);
                let err = restore(con, "victim", &future).expect_err(&format!(
                    "{alg}: RESTORE of encoding version {other} succeeded"
                ));
                assert!(err.starts_with("ERR"), "{err}");
            }
        }
        assert!(!exists(con, "victim"), "{alg}");
    });
}

#[test]
fn restore_of_corrupt_payloads_never_harms_the_server() {
    for_each_payload_to_corrupt(|alg, con, key, payload| {
        let body = payload::body_len(&payload);
        // Every byte after the module id, mutated.
        for pos in 10..body {
            let mutations: [fn(u8) -> u8; 4] = [|b| b ^ 0x01, |b| b ^ 0x80, |_| 0x00, |_| 0xff];
            for mutate in mutations {
                let mut bad = payload.clone();
                bad[pos] = mutate(bad[pos]);
                payload::reseal(&mut bad);
                if restore(con, "victim", &bad).is_ok() {
                    exercise(alg, con, "victim");
                }
            }
        }
        // Every saved integer replaced by extreme values: around the
        // largest parameter, the largest log or bucket count, ...
        let fields = payload::module_fields(&payload).expect("a module value of integers");
        assert!(!fields.is_empty(), "{key}");
        for i in 0..fields.len() {
            for extreme in [
                0,
                1,
                (1 << 24) - 1,
                1 << 24,
                1_000_001,
                (1 << 40) + 1,
                1 << 53,
                1 << 62,
                u64::MAX,
            ] {
                let mut bad_fields = fields.clone();
                bad_fields[i] = match &fields[i] {
                    Field::Unsigned(_) => Field::Unsigned(extreme),
                    Field::Signed(_) => Field::Signed(extreme),
                    Field::String(_) => continue,
                };
                let bad = payload::with_fields(&payload, &bad_fields);
                if restore(con, "victim", &bad).is_ok() {
                    exercise(alg, con, "victim");
                }
            }
        }
        // Fields missing (entries dropped, the count left as is) or
        // one too many.
        for len in 0..fields.len() {
            let bad = payload::with_fields(&payload, &fields[..len]);
            assert!(
                restore(con, "victim", &bad).is_err(),
                "{key}: {len} of {} fields",
                fields.len()
            );
        }
        let mut extra = fields.clone();
        extra.push(Field::Unsigned(1));
        let bad = payload::with_fields(&payload, &extra);
        assert!(
            restore(con, "victim", &bad).is_err(),
            "{key}: a field too many"
        );
        // The untouched fields re-encode to the same fields, and to the
        // very payload once the server writes them again (the tools above
        // are sound; a string the server compressed is written back raw).
        let same = payload::with_fields(&payload, &fields);
        assert_eq!(
            payload::module_fields(&same).as_ref(),
            Some(&fields),
            "{key}"
        );
        restore(con, "victim", &same).unwrap_or_else(|e| panic!("{key}: {e}"));
        assert_eq!(
            dump(con, "victim").as_ref(),
            Some(&payload),
            "{key}: re-encoding changed the payload"
        );
        let _: i64 = query(con, &["DEL", "victim"]);
    });
}

#[test]
fn memory_usage_is_reported_for_limiter_keys() {
    for_each_algorithm_on_each_server(|alg, con| {
        let built = (alg.build)(con, alg.key);
        let key = &built[0].key;
        let bytes: i64 = query(con, &["MEMORY", "USAGE", key]);
        assert!(
            bytes > 0 && bytes < 1024,
            "{alg}: MEMORY USAGE {key} = {bytes} for one small limiter"
        );
    });
}

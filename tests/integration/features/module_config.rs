//! The module configs `ratelimit.sliding-max-limit` (default 100000, at most
//! 16777215) and `ratelimit.hashwindow-max-buckets` (default 3600, at most
//! 1000000): read and set with `CONFIG GET/SET`, given as load arguments
//! (`--loadmodule <so> sliding-max-limit 50`, with or without the
//! `ratelimit.` prefix) or on the command line (`--ratelimit.sliding-max-limit
//! 50`, which wins over a load argument). They bound what clients may ask;
//! calls from the master and the AOF are never refused by them.

use std::fs;
use std::process::{Command, ExitStatus, Stdio};
use std::thread::sleep;
use std::time::{Duration, Instant};

use crate::harness::*;

/// `CONFIG GET name` for one config: its value.
fn config_get(con: &mut Connection, name: &str) -> String {
    let reply: Vec<String> = query(con, &["CONFIG", "GET", name]);
    assert_eq!(reply.len(), 2, "CONFIG GET {name}: {reply:?}");
    assert_eq!(reply[0], name);
    reply[1].clone()
}

fn config_set(con: &mut Connection, name: &str, value: &str) {
    let _: () = query(con, &["CONFIG", "SET", name, value]);
}

const SLIDING_MAX: &str = "ratelimit.sliding-max-limit";
const HASHWINDOW_MAX: &str = "ratelimit.hashwindow-max-buckets";

/// The error for a sliding limit above `max`, the config's value (at the
/// config's own maximum, the parameter's range is what refuses).
fn sliding_above(max: u64) -> String {
    if max == 16_777_215 {
        "ERR limit must be an integer from 1 to 16777215".to_string()
    } else {
        format!("ERR limit is above ratelimit.sliding-max-limit ({max})")
    }
}

/// The error for more buckets than `max`, the config's value.
fn buckets_above(max: u64) -> String {
    if max == 1_000_000 {
        "ERR window_ms / bucket_ms must be an integer from 1 to 1000000".to_string()
    } else {
        format!("ERR window_ms / bucket_ms is above ratelimit.hashwindow-max-buckets ({max})")
    }
}

/// Asserts the configs' values and that calls just within them are
/// admitted while calls just above are refused with the error naming them.
fn assert_bounds(con: &mut Connection, sliding_max: u64, hashwindow_max: u64) {
    assert_eq!(config_get(con, SLIDING_MAX), sliding_max.to_string());
    assert_eq!(config_get(con, HASHWINDOW_MAX), hashwindow_max.to_string());
    let within = sliding_max.to_string();
    let above = (sliding_max + 1).to_string();
    let r = rl(con, &["RL.SLIDING", "bounds:sl", &within, "1000"]);
    assert!(r.allowed, "limit {within} within the config: {r:?}");
    assert_eq!(
        query_err(con, &["RL.SLIDING", "bounds:sl2", &above, "1000"]),
        sliding_above(sliding_max)
    );
    let within = hashwindow_max.to_string();
    let above = (hashwindow_max + 1).to_string();
    let r = rl(con, &["RL.HASHWINDOW", "bounds:hw", "5", &within, "1"]);
    assert!(r.allowed, "{within} buckets within the config: {r:?}");
    assert_eq!(
        query_err(con, &["RL.HASHWINDOW", "bounds:hw2", "5", &above, "1"]),
        buckets_above(hashwindow_max)
    );
    assert!(!exists(con, "bounds:sl2") && !exists(con, "bounds:hw2"));
    let _: i64 = query(con, &["DEL", "bounds:sl", "bounds:hw"]);
}

// ---------------------------------------------------------------------------
// CONFIG GET / SET

#[test]
fn configs_have_their_documented_defaults() {
    for_each_server(|kind| {
        let server = Server::start(kind, &[]);
        let mut con = server.conn();
        let all: Vec<String> = query(&mut con, &["CONFIG", "GET", "ratelimit.*"]);
        for name in [SLIDING_MAX, HASHWINDOW_MAX] {
            assert!(
                all.iter().any(|n| n == name),
                "CONFIG GET ratelimit.* lacks {name}: {all:?}"
            );
        }
        assert_bounds(&mut con, 100_000, 3600);
    });
}

#[test]
fn call_above_a_config_is_refused_naming_it_and_writes_nothing() {
    for_each_server(|kind| {
        let server = Server::start(kind, &[]);
        let mut con = server.conn();
        for words in [
            ["RL.SLIDING", "sl", "100001", "1000"].as_slice(),
            ["RL.SLIDING", "sl", "100001", "1000", "COST", "0"].as_slice(),
        ] {
            assert_eq!(query_err(&mut con, words), sliding_above(100_000));
        }
        for words in [
            ["RL.HASHWINDOW", "hw", "5", "3601000", "1000"].as_slice(),
            ["RL.HASHWINDOW", "hw", "5", "3601", "1", "COST", "0"].as_slice(),
        ] {
            assert_eq!(query_err(&mut con, words), buckets_above(3600));
        }
        assert_eq!(dbsize(&mut con), 0, "a refused call wrote a key");
    });
}

#[test]
fn config_set_applies_at_once() {
    for_each_server(|kind| {
        let server = Server::start(kind, &[]);
        let mut con = server.conn();
        // Limiters created under the defaults ...
        assert!(
            rl(
                &mut con,
                &["RL.SLIDING", "sl", "50", "1000000", "COST", "50"]
            )
            .allowed
        );
        assert!(rl(&mut con, &["RL.HASHWINDOW", "hw", "5", "60000", "1000"]).allowed);
        config_set(&mut con, SLIDING_MAX, "10");
        config_set(&mut con, HASHWINDOW_MAX, "10");
        assert_bounds(&mut con, 10, 10);
        // ... are held to the new bounds on their next call.
        let state = (dump(&mut con, "sl"), dump(&mut con, "hw"));
        assert_eq!(
            query_err(&mut con, &["RL.SLIDING", "sl", "50", "1000000"]),
            sliding_above(10)
        );
        assert_eq!(
            query_err(&mut con, &["RL.HASHWINDOW", "hw", "5", "60000", "1000"]),
            buckets_above(10)
        );
        assert_eq!((dump(&mut con, "sl"), dump(&mut con, "hw")), state);
        // Under the new bounds, the same keys go on.
        let r = rl(&mut con, &["RL.SLIDING", "sl", "10", "1000000"]);
        assert_eq!((r.allowed, r.remaining), (false, 0), "50 held: {r:?}");
        let r = rl(&mut con, &["RL.HASHWINDOW", "hw", "5", "10000", "1000"]);
        assert_eq!((r.allowed, r.remaining), (true, 3), "{r:?}");

        // Raised to the largest values.
        config_set(&mut con, SLIDING_MAX, "16777215");
        config_set(&mut con, HASHWINDOW_MAX, "1000000");
        assert_bounds(&mut con, 16_777_215, 1_000_000);
        let r = rl(&mut con, &["RL.SLIDING", "sl", "50", "1000000"]);
        assert!(!r.allowed, "{r:?}");
        // Beyond them, the parameter's own range.
        assert_eq!(
            query_err(&mut con, &["RL.SLIDING", "sl", "16777216", "1000"]),
            "ERR limit must be an integer from 1 to 16777215"
        );
        assert_eq!(
            query_err(&mut con, &["RL.HASHWINDOW", "hw", "5", "1000001", "1"]),
            "ERR window_ms / bucket_ms must be an integer from 1 to 1000000"
        );
    });
}

#[test]
fn out_of_range_config_set_is_an_error_and_keeps_the_value() {
    for_each_server(|kind| {
        let server = Server::start(kind, &[]);
        let mut con = server.conn();
        config_set(&mut con, SLIDING_MAX, "77");
        config_set(&mut con, HASHWINDOW_MAX, "88");
        for (name, bad) in [
            (SLIDING_MAX, "0"),
            (SLIDING_MAX, "-1"),
            (SLIDING_MAX, "16777216"),
            (SLIDING_MAX, "abc"),
            (SLIDING_MAX, ""),
            (HASHWINDOW_MAX, "0"),
            (HASHWINDOW_MAX, "1000001"),
            (HASHWINDOW_MAX, "1.5"),
        ] {
            let err = query_err(&mut con, &["CONFIG", "SET", name, bad]);
            assert!(
                err.starts_with("ERR") && err.contains(name),
                "CONFIG SET {name} {bad:?}: {err}"
            );
        }
        assert_bounds(&mut con, 77, 88);
    });
}

// ---------------------------------------------------------------------------
// Load arguments and the command line

#[test]
fn load_arguments_set_the_configs() {
    for_each_server(|kind| {
        // The harness puts these right after the module path.
        let server = Server::start(
            kind,
            &["sliding-max-limit", "50", "hashwindow-max-buckets", "10"],
        );
        let mut con = server.conn();
        assert_bounds(&mut con, 50, 10);
        // Still settable at run time.
        config_set(&mut con, SLIDING_MAX, "60");
        assert_bounds(&mut con, 60, 10);
    });
}

#[test]
fn load_arguments_may_carry_the_ratelimit_prefix() {
    for_each_server(|kind| {
        let server = Server::start(
            kind,
            &[
                "ratelimit.hashwindow-max-buckets",
                "20",
                "ratelimit.sliding-max-limit",
                "30",
            ],
        );
        let mut con = server.conn();
        assert_bounds(&mut con, 30, 20);
    });
}

#[test]
fn command_line_config_wins_over_a_load_argument() {
    for_each_server(|kind| {
        let server = Server::start(
            kind,
            &[
                "sliding-max-limit",
                "50",
                "hashwindow-max-buckets",
                "10",
                "--ratelimit.sliding-max-limit",
                "70",
            ],
        );
        let mut con = server.conn();
        assert_bounds(&mut con, 70, 10);
    });
}

#[test]
fn command_line_config_alone_sets_it() {
    for_each_server(|kind| {
        let server = Server::start(kind, &["--ratelimit.hashwindow-max-buckets", "7"]);
        let mut con = server.conn();
        assert_bounds(&mut con, 100_000, 7);
    });
}

/// Starts a server of `kind` loading the module with `module_args` after
/// its path, and `extra_args` after that; expects it to exit at start.
/// Returns its exit status and log.
fn start_expecting_failure(
    kind: ServerKind,
    module_args: &[&str],
    extra_args: &[&str],
) -> (ExitStatus, String) {
    let port = free_port();
    let dir = std::env::temp_dir().join(format!("rl-config-{}-{}", std::process::id(), port));
    let _ = fs::remove_dir_all(&dir);
    fs::create_dir_all(&dir).expect("create the server directory");
    let log_path = dir.join("server.log");
    let log = fs::File::create(&log_path).expect("create the server log");
    let module = module_path();
    let port_text = port.to_string();
    let mut args: Vec<&str> = vec![
        "--port",
        &port_text,
        "--bind",
        "127.0.0.1",
        "--save",
        "",
        "--appendonly",
        "no",
        "--daemonize",
        "no",
        "--loadmodule",
        module.to_str().expect("utf-8 module path"),
    ];
    args.extend_from_slice(module_args);
    args.extend_from_slice(extra_args);
    let mut child = Command::new(kind.binary())
        .args(&args)
        .current_dir(&dir)
        .stdin(Stdio::null())
        .stdout(log.try_clone().expect("dup log"))
        .stderr(log)
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start {}: {e}", kind.binary().display()));
    let deadline = Instant::now() + Duration::from_secs(10);
    let status = loop {
        if let Some(status) = child.try_wait().expect("try_wait") {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            let log = fs::read_to_string(&log_path).unwrap_or_default();
            let _ = fs::remove_dir_all(&dir);
            panic!("{kind} with {module_args:?} {extra_args:?} kept running; log:\n{log}");
        }
        sleep(Duration::from_millis(10));
    };
    let log = fs::read_to_string(&log_path).unwrap_or_default();
    let _ = fs::remove_dir_all(&dir);
    (status, log)
}

#[test]
fn bad_load_argument_stops_the_server_and_the_log_says_why() {
    for_each_server(|kind| {
        for (module_args, named) in [
            (["sliding-max-limit", "0"].as_slice(), "sliding-max-limit"),
            (
                ["sliding-max-limit", "16777216"].as_slice(),
                "sliding-max-limit",
            ),
            (
                ["ratelimit.sliding-max-limit", "-5"].as_slice(),
                "sliding-max-limit",
            ),
            (
                ["hashwindow-max-buckets", "abc"].as_slice(),
                "hashwindow-max-buckets",
            ),
            (
                ["hashwindow-max-buckets", "1000001"].as_slice(),
                "hashwindow-max-buckets",
            ),
            (["write-encoding", "3"].as_slice(), "write-encoding"),
            (["write-encoding", "0"].as_slice(), "write-encoding"),
            (
                ["ratelimit.write-encoding", "two"].as_slice(),
                "write-encoding",
            ),
            (["no-such-config", "5"].as_slice(), "no-such-config"),
            (["sliding-max-limit"].as_slice(), "ratelimit"),
            (
                ["sliding-max-limit", "50", "hashwindow-max-buckets"].as_slice(),
                "ratelimit",
            ),
        ] {
            let (status, log) = start_expecting_failure(kind, module_args, &[]);
            assert!(!status.success(), "{module_args:?}: exited with {status}");
            let module_lines: Vec<&str> = log
                .lines()
                .filter(|line| line.contains("ratelimit"))
                .collect();
            assert!(
                module_lines.iter().any(|line| line.contains(named)),
                "{module_args:?}: the log does not say why (mentioning {named}):\n{log}"
            );
        }
    });
}

#[test]
fn bad_command_line_config_stops_the_server() {
    for_each_server(|kind| {
        for value in ["0", "16777216", "abc"] {
            let (status, log) =
                start_expecting_failure(kind, &[], &["--ratelimit.sliding-max-limit", value]);
            assert!(!status.success(), "{value}: exited with {status}");
            assert!(
                log.contains("sliding-max-limit"),
                "{value}: the log does not name the config:\n{log}"
            );
        }
        for value in ["0", "3", "abc"] {
            let (status, log) =
                start_expecting_failure(kind, &[], &["--ratelimit.write-encoding", value]);
            assert!(!status.success(), "{value}: exited with {status}");
            assert!(
                log.contains("write-encoding"),
                "{value}: the log does not name the config:\n{log}"
            );
        }
    });
}

// ---------------------------------------------------------------------------
// Calls from the master and the AOF are never refused

/// Traffic over sliding logs and hash windows above low bounds: limits up
/// to 1000, 60 and 3600 buckets.
fn traffic_above_low_bounds(con: &mut Connection) {
    for cost in ["1", "3", "0", "2000", "2", "7"] {
        for words in [
            ["RL.SLIDING", "sl", "1000", "1000000"].as_slice(),
            ["RL.SLIDING", "sl:small", "5", "1000000"].as_slice(),
            ["RL.HASHWINDOW", "hw", "100", "60000", "1000"].as_slice(),
            ["RL.HASHWINDOW", "hw:many", "1000", "3600000", "1000"].as_slice(),
        ] {
            rl(con, &[words, &["COST", cost][..]].concat());
        }
    }
    // And parameter changes on existing keys.
    rl(con, &["RL.SLIDING", "sl", "900", "2000000"]);
    rl(con, &["RL.HASHWINDOW", "hw", "100", "120000", "2000"]);
}
const KEYS: [&str; 4] = ["sl", "sl:small", "hw", "hw:many"];

fn assert_same_state(master: &mut Connection, replica: &mut Connection, key: &str) {
    let on_master = dump(master, key);
    assert!(on_master.is_some(), "{key} missing on the master");
    assert_eq!(
        dump(replica, key),
        on_master,
        "DUMP {key} differs between master and replica"
    );
}

#[test]
fn replica_with_lower_bounds_applies_the_masters_calls() {
    for_each_server(|kind| {
        let master = Server::start(kind, &[]);
        let mut m = master.conn();
        // Some state before the replica attaches (full sync), some after.
        traffic_above_low_bounds(&mut m);
        let replica = replica_of_with(
            &master,
            &[
                "--ratelimit.sliding-max-limit",
                "5",
                "--ratelimit.hashwindow-max-buckets",
                "4",
            ],
        );
        let mut r = replica.conn();
        assert_eq!(config_get(&mut r, SLIDING_MAX), "5");
        traffic_above_low_bounds(&mut m);
        wait_for_sync(&master, &replica);
        for key in KEYS {
            assert_same_state(&mut m, &mut r, key);
        }
        // Lowered further at run time: still applied.
        config_set(&mut r, SLIDING_MAX, "1");
        config_set(&mut r, HASHWINDOW_MAX, "1");
        traffic_above_low_bounds(&mut m);
        wait_for_sync(&master, &replica);
        for key in KEYS {
            assert_same_state(&mut m, &mut r, key);
        }
        let info = replica.info("replication");
        assert_eq!(
            info_field(&info, "master_link_status").as_deref(),
            Some("up")
        );
    });
}

#[test]
fn aof_written_under_higher_bounds_loads_under_lower_ones() {
    for_each_server(|kind| {
        for preamble in ["yes", "no"] {
            let server = Server::start(
                kind,
                &["--appendonly", "yes", "--aof-use-rdb-preamble", preamble],
            );
            let mut con = server.conn();
            traffic_above_low_bounds(&mut con);
            if preamble == "no" {
                // The rewritten AOF holds RL.SETSTATE; more calls follow it.
                let _: Value = query(&mut con, &["BGREWRITEAOF"]);
                poll_until("the AOF rewrite to finish", Duration::from_secs(20), || {
                    let info = server.info("persistence");
                    info_field(&info, "aof_rewrite_in_progress").as_deref() == Some("0")
                        && info_field(&info, "aof_rewrite_scheduled").as_deref() == Some("0")
                        && info_field(&info, "aof_last_bgrewrite_status").as_deref() == Some("ok")
                });
                traffic_above_low_bounds(&mut con);
            }
            let before: Vec<_> = KEYS.iter().map(|key| dump(&mut con, key)).collect();
            config_set(&mut con, SLIDING_MAX, "1");
            config_set(&mut con, HASHWINDOW_MAX, "1");
            let _: () = query(&mut con, &["DEBUG", "LOADAOF"]);
            let after: Vec<_> = KEYS.iter().map(|key| dump(&mut con, key)).collect();
            for ((key, b), a) in KEYS.iter().zip(&before).zip(&after) {
                assert!(b.is_some(), "{key} missing before the reload");
                assert_eq!(
                    a, b,
                    "preamble {preamble}: {key} differs after DEBUG LOADAOF"
                );
            }
            assert_bounds(&mut con, 1, 1);
        }
    });
}

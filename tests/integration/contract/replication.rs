//! Replication, for every limiter command: the master propagates admitted
//! calls with its clock pinned (`RL.<ALG> key params COST n AT <unix_us>`),
//! so the replica reaches the very same state (`DUMP` byte-identical);
//! denials, `COST 0` and refused calls propagate nothing. The algorithms are
//! described in `harness/contract.rs`.
//!
//! One master (and replica) per server kind serves every algorithm in turn.

use std::fs;

use crate::harness::contract::*;
use crate::harness::*;

/// Asserts `key` is the same limiter on master and replica: same `DUMP`, same
/// type and digest, and an expiry at the same instant.
fn assert_same_state(master: &mut Connection, replica: &mut Connection, key: &str) {
    let on_master = dump(master, key);
    assert!(on_master.is_some(), "{key} missing on the master");
    assert_eq!(
        dump(replica, key),
        on_master,
        "DUMP {key} differs between master and replica"
    );
    assert_eq!(key_type(replica, key), key_type(master, key));
    let digest_master: Value = query(master, &["DEBUG", "DIGEST-VALUE", key]);
    let digest_replica: Value = query(replica, &["DEBUG", "DIGEST-VALUE", key]);
    assert_eq!(
        digest_replica, digest_master,
        "DEBUG DIGEST-VALUE {key} differs"
    );
    let (ttl_master, ttl_replica) = (pttl(master, key), pttl(replica, key));
    assert!(
        ttl_master > 0 && ttl_replica > 0 && (ttl_master - ttl_replica).abs() <= 1000,
        "PTTL {key}: master {ttl_master}, replica {ttl_replica}"
    );
}

#[test]
fn replica_state_equals_master_after_burst() {
    for_each_server(|kind| {
        let master = Server::start(kind, &[]);
        let replica = replica_of(&master);
        let (mut m, mut r) = (master.conn(), replica.conn());
        for_each_algorithm(kind, |alg| {
            // Admitted, denied and peeked calls, and a parameter change.
            let built = (alg.build)(&mut m, alg.key);
            wait_for_sync(&master, &replica);
            for built in &built {
                assert_same_state(&mut m, &mut r, &built.key);
            }
        });
        assert_eq!(dbsize(&mut r), dbsize(&mut m));
    });
}

/// Any call, from a Lua script.
const SCRIPT: &str = "return redis.call(ARGV[1], KEYS[1], unpack(ARGV, 2))";

#[test]
fn replica_state_equals_master_after_mixed_traffic() {
    for_each_server(|kind| {
        let master = Server::start(kind, &[]);
        let replica = replica_of(&master);
        let (mut m, mut r) = (master.conn(), replica.conn());
        for_each_algorithm(kind, |alg| {
            let mut random = Xorshift64(0x5eed_1234_abcd_0001 + alg.index() as u64);
            for i in 0..1500 {
                let key = format!("{}:traffic:{}", alg.key, random.next() % 12);
                let mut args = (alg.random_params)(&mut random);
                args.extend(["COST", random.pick(&["0", "1", "1", "1", "2", "5", "11"])]);
                let words = alg.words(&key, &args);
                let reply: Value = match i % 10 {
                    // Inside a transaction and a script too.
                    3 => {
                        let _: () = query(&mut m, &["MULTI"]);
                        let _: String = query(&mut m, &words);
                        let exec: Vec<Value> = query(&mut m, &["EXEC"]);
                        exec.into_iter().next().unwrap()
                    }
                    7 => {
                        let mut eval = vec!["EVAL", SCRIPT, "1", &key, alg.command];
                        eval.extend_from_slice(&args);
                        query(&mut m, &eval)
                    }
                    _ => query(&mut m, &words),
                };
                alg.reply_of(&reply);
            }
            wait_for_sync(&master, &replica);
            let keys: Vec<String> = query(&mut m, &["KEYS", &format!("{}:traffic:*", alg.key)]);
            let mut compared = 0;
            for key in &keys {
                // Keys of the fastest limiters may just have expired; compare
                // the rest.
                if pttl(&mut m, key) > 1000 {
                    assert_same_state(&mut m, &mut r, key);
                    compared += 1;
                }
            }
            assert!(compared > 0, "{alg}: no long-lived limiter to compare");
        });
    });
}

#[test]
fn replica_gets_existing_limiters_through_full_sync() {
    for_each_server(|kind| {
        let master = Server::start(kind, &[]);
        let mut m = master.conn();
        let mut built = Vec::new();
        for_each_algorithm(kind, |alg| built.push((alg.build)(&mut m, alg.key)));
        let replica = replica_of(&master);
        let mut r = replica.conn();
        wait_for_sync(&master, &replica);
        for_each_algorithm(kind, |alg| {
            let built = &built[alg.index()];
            for built in built {
                assert_same_state(&mut m, &mut r, &built.key);
            }
            // And it keeps up with calls after the sync.
            built[0].take(alg, &mut m);
            wait_for_sync(&master, &replica);
            assert_same_state(&mut m, &mut r, &built[0].key);
        });
    });
}

#[test]
fn denials_and_cost_zero_propagate_nothing() {
    for_each_server(|kind| {
        let master = Server::start(kind, QUIET_MASTER);
        let replica = replica_of(&master);
        let mut m = master.conn();
        for_each_algorithm(kind, |alg| {
            let key = alg.key;
            let new = format!("{key}:new");
            let another = alg.another();
            let mut refused: Vec<Vec<&str>> = (alg.params.iter().enumerate())
                .map(|(position, param)| {
                    let mut params = alg.valid();
                    params[position] = param.refused();
                    params
                })
                .collect();
            refused.extend(alg.refusals.iter().map(|(args, _)| args.to_vec()));
            let mut other = vec!["2"];
            other.extend_from_slice(alg.other);
            other.extend(["COST", "0"]);

            alg.away_from_window_end(&mut m, &alg.valid());
            assert!(alg.slow(&mut m, key, "2", "2").allowed);
            wait_for_sync(&master, &replica);
            let offset_before = master_offset(&master);
            for _ in 0..50 {
                assert!(!alg.slow(&mut m, key, "2", "1").allowed);
                assert!(!alg.slow(&mut m, key, "2", "3").allowed);
                alg.slow(&mut m, key, "2", "0");
                alg.call(&mut m, key, &other);
                alg.slow(&mut m, &new, "2", "0");
                alg.slow(&mut m, &new, "2", "3");
                for args in &refused {
                    alg.call_err(&mut m, key, args);
                }
                another.call_err(&mut m, key, &another.valid());
            }
            assert_eq!(
                master_offset(&master),
                offset_before,
                "{alg}: denied, COST 0 or failed calls were propagated"
            );
            assert!(
                !exists(&mut m, &new),
                "{alg}: a call that took nothing wrote"
            );

            // The offset does move for a call that changes something.
            assert!(alg.slow(&mut m, &format!("{key}:other"), "2", "1").allowed);
            assert!(master_offset(&master) > offset_before, "{alg}");
        });
    });
}

#[test]
fn replica_refuses_limiter_calls_from_clients() {
    for_each_server(|kind| {
        let master = Server::start(kind, &[]);
        let replica = replica_of(&master);
        let mut r = replica.conn();
        for_each_algorithm(kind, |alg| {
            let err = alg.call_err(&mut r, alg.key, &alg.valid());
            assert!(err.starts_with("READONLY"), "{alg} on a replica: {err}");
            assert_eq!(dbsize(&mut r), 0, "{alg}");
        });
    });
}

// ---------------------------------------------------------------------------
// What is propagated, read back from the master's AOF.

/// Parses the RESP arrays of an AOF (multi-bulk commands only).
fn aof_commands(bytes: &[u8]) -> Vec<Vec<String>> {
    fn line<'a>(bytes: &'a [u8], pos: &mut usize) -> &'a [u8] {
        let start = *pos;
        let end = start
            + bytes[start..]
                .windows(2)
                .position(|w| w == b"\r\n")
                .expect("CRLF in AOF");
        *pos = end + 2;
        &bytes[start..end]
    }
    let mut commands = Vec::new();
    let mut pos = 0;
    while pos < bytes.len() {
        let header = line(bytes, &mut pos);
        assert_eq!(header[0], b'*', "AOF entry is not an array");
        let n: usize = std::str::from_utf8(&header[1..]).unwrap().parse().unwrap();
        let mut words = Vec::with_capacity(n);
        for _ in 0..n {
            let len_line = line(bytes, &mut pos);
            assert_eq!(len_line[0], b'$');
            let len: usize = std::str::from_utf8(&len_line[1..])
                .unwrap()
                .parse()
                .unwrap();
            words.push(String::from_utf8_lossy(&bytes[pos..pos + len]).into_owned());
            pos += len + 2;
        }
        commands.push(words);
    }
    commands
}

/// Every command in the server's incremental AOF files.
fn incremental_aof(server: &Server) -> Vec<Vec<String>> {
    let dir = server.dir.join("appendonlydir");
    let mut commands = Vec::new();
    let mut files: Vec<_> = fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|entry| entry.unwrap().path())
        .filter(|path| path.to_string_lossy().ends_with(".incr.aof"))
        .collect();
    files.sort();
    for file in files {
        commands.extend(aof_commands(&fs::read(file).unwrap()));
    }
    commands
}

/// A propagated call of `alg`: its words with the values of `AT` (the
/// master's time) and `END` (the period's end) left out, and those values.
#[derive(Debug)]
struct Logged {
    shape: Vec<String>,
    at_us: u64,
    end_us: Option<u64>,
}

/// The AOF's commands of `alg` (its key).
fn logged_calls(logged: &[Vec<String>], alg: &Algorithm) -> Vec<Logged> {
    logged
        .iter()
        .filter(|words| words[0].eq_ignore_ascii_case(alg.command) && words[1] == alg.key)
        .map(|words| {
            let mut shape = words.to_vec();
            shape[0] = shape[0].to_ascii_uppercase();
            let mut take = |option: &str| {
                let at = shape.iter().position(|w| w == option)?;
                let value = shape.remove(at + 1);
                Some(value.parse::<u64>().expect("an integer"))
            };
            let at_us = take("AT").expect("AT");
            let end_us = take("END");
            Logged {
                shape,
                at_us,
                end_us,
            }
        })
        .collect()
}

#[test]
fn admitted_calls_propagate_with_the_masters_time_pinned() {
    for_each_server(|kind| {
        let master = Server::start(kind, &["--appendonly", "yes", "--appendfsync", "always"]);
        let mut m = master.conn();
        let mut call_times = Vec::new();
        for alg in &ALGORITHMS {
            alg.away_from_window_end(&mut m, &alg.valid());
            let before_us = server_time_us(&mut m);
            alg.call(&mut m, alg.key, &alg.valid());
            alg.slow(&mut m, alg.key, "5", "3");
            let after_us = server_time_us(&mut m);
            // Neither denials nor peeks reach the AOF.
            assert!(!alg.slow(&mut m, alg.key, "5", "2").allowed, "{alg}");
            alg.slow(&mut m, alg.key, "5", "0");
            call_times.push((before_us, after_us));
        }

        let logged = incremental_aof(&master);
        for_each_algorithm(kind, |alg| {
            let (before_us, after_us) = call_times[alg.index()];
            let calls = logged_calls(&logged, alg);
            let shapes: Vec<&Vec<String>> = calls.iter().map(|call| &call.shape).collect();
            let expected: Vec<Vec<String>> = ["1", "3"]
                .iter()
                .map(|cost| {
                    let mut words = alg.words(alg.key, &alg.valid());
                    words.extend(["COST", cost, "AT"]);
                    if alg.pins_period_end {
                        words.push("END");
                    }
                    words.iter().map(|w| w.to_string()).collect()
                })
                .collect();
            assert_eq!(
                shapes,
                expected.iter().collect::<Vec<_>>(),
                "{alg}: limiter commands in the AOF: {calls:?}"
            );
            for call in &calls {
                let at_us = call.at_us;
                assert!(
                    (before_us..=after_us).contains(&at_us),
                    "{alg}: AT {at_us} is not the master's time of the call \
                     ({before_us}..={after_us})"
                );
                // The end of the period the call counted in: here the end
                // of the aligned one that holds its time.
                if let (Some(end_us), Some(window_ms)) = (call.end_us, alg.aligned) {
                    let window_us = window_ms(&alg.valid()) * 1000;
                    assert_eq!(end_us, (at_us / window_us + 1) * window_us, "{alg}: END");
                }
            }
        });
    });
}

/// A fixed window of at least `from_ms`, in steps of `step_ms`, whose current
/// window has more than ten minutes left on a clock reading `now_ms`: keys
/// under it outlive the test, so master and replica can be compared key by
/// key.
fn window_with_time_left(now_ms: u64, from_ms: u64, step_ms: u64) -> u64 {
    (from_ms..)
        .step_by(step_ms as usize)
        .find(|window_ms| window_ms - now_ms % window_ms > 600_000)
        .expect("some window")
}

/// Calls through policies and `RL.ALL` propagate their parameters from a
/// small cache of strings: hundreds of distinct values (round ones, which
/// collide in a naive cache) evict each other within single calls, and the
/// replica still ends byte-identical (an evicted string in use by the call
/// being propagated once crashed the master).
#[test]
fn policy_and_rl_all_parameters_replicate_exactly_however_many_there_are() {
    for_each_server(|kind| {
        let master = Server::start(kind, QUIET_MASTER);
        let replica = replica_of(&master);
        let mut con = master.conn();
        let now_ms = server_time_us(&mut con) / 1000;
        // Windows of about a day, 300 distinct ones of each series: a
        // window ending while the keys are compared would make one side
        // see a key the other sees expired.
        let day_window =
            |from_ms: u64| window_with_time_left(now_ms, from_ms, 300 * 128).to_string();
        let mut pipe = redis::pipe();
        let mut keys = Vec::new();
        for i in 1..=300u64 {
            let (limit, window) = ((i * 64).to_string(), day_window(i * 128 + 86_400_000));
            let name = format!("p{i}");
            pipe.add_command(command(&[
                "RL.POLICY",
                "SET",
                &name,
                "FIXEDWINDOW",
                &limit,
                &window,
            ]))
            .ignore();
            let (key, a, b) = (format!("k{i}"), format!("{{x{i}}}a"), format!("{{x{i}}}b"));
            pipe.add_command(command(&["RL.HIT", &name, &key])).ignore();
            let (limit2, window2) = ((i * 7 + 1).to_string(), day_window(i * 64 + 86_405_000));
            pipe.add_command(command(&[
                "RL.ALL",
                "2",
                &a,
                &b,
                "POLICY",
                &name,
                "FIXEDWINDOW",
                &limit2,
                &window2,
            ]))
            .ignore();
            keys.extend([key, a, b]);
        }
        let _: () = pipe.query(&mut con).expect("the calls");
        wait_for_sync(&master, &replica);
        assert_same_dataset(&master, &replica, &keys);
    });
}

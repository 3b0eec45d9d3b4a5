//! Replication: the master propagates admitted calls with its clock pinned
//! (`RL.<ALG> key params COST n AT <unix_us>`), so the replica reaches the very
//! same state (`DUMP` byte-identical); denials and `COST 0` propagate nothing.

mod common;

use std::fs;

use common::*;

/// Master options: no periodic PING in the replication stream, so its offset
/// moves only when a command is propagated.
const QUIET_MASTER: &[&str] = &[
    "--repl-ping-replica-period",
    "3600",
    "--repl-timeout",
    "7200",
];

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
        for _ in 0..12 {
            rl(&mut m, &["RL.TOKENBUCKET", "tb", "10", "3", "1000"]);
            rl(
                &mut m,
                &["RL.TOKENBUCKET", "tb:cost", "10", "1", "60000", "COST", "3"],
            );
            rl(&mut m, &["RL.TOKENBUCKET", "tb:odd", "7", "3", "1001"]);
            rl(&mut m, &["RL.FIXEDWINDOW", "fw", "10", "60000"]);
            rl(
                &mut m,
                &["RL.FIXEDWINDOW", "fw:cost", "10", "60000", "COST", "4"],
            );
        }
        // Parameter changes on existing keys.
        rl(&mut m, &["RL.TOKENBUCKET", "tb", "20", "7", "3000"]);
        rl(&mut m, &["RL.FIXEDWINDOW", "fw", "30", "120000"]);
        wait_for_sync(&master, &replica);
        for key in ["tb", "tb:cost", "tb:odd", "fw", "fw:cost"] {
            assert_same_state(&mut m, &mut r, key);
        }
        assert_eq!(dbsize(&mut r), dbsize(&mut m));
    });
}

/// A small deterministic generator (xorshift64), so a failure replays.
struct Xorshift(u64);

impl Xorshift {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn pick<'a>(&mut self, choices: &[&'a str]) -> &'a str {
        choices[(self.next() % choices.len() as u64) as usize]
    }
}

#[test]
fn replica_state_equals_master_after_mixed_traffic() {
    for_each_server(|kind| {
        let master = Server::start(kind, &[]);
        let replica = replica_of(&master);
        let (mut m, mut r) = (master.conn(), replica.conn());
        let mut random = Xorshift(0x5eed_1234_abcd_0001);
        for _ in 0..600 {
            let n = random.next() % 16;
            let key = format!("k{n}");
            let cost = random.pick(&["0", "1", "1", "1", "2", "5", "11"]);
            let reply: Value = if n.is_multiple_of(2) {
                let capacity = random.pick(&["3", "10", "10", "1000"]);
                let refill_count = random.pick(&["1", "3", "7"]);
                let refill_ms = random.pick(&["1", "997", "1000", "86400000"]);
                query(
                    &mut m,
                    &[
                        "RL.TOKENBUCKET",
                        &key,
                        capacity,
                        refill_count,
                        refill_ms,
                        "COST",
                        cost,
                    ],
                )
            } else {
                let limit = random.pick(&["2", "10", "10", "100"]);
                let window_ms = random.pick(&["1000", "60000", "60000", "3600000"]);
                query(
                    &mut m,
                    &["RL.FIXEDWINDOW", &key, limit, window_ms, "COST", cost],
                )
            };
            Reply::from_value(&reply);
        }
        wait_for_sync(&master, &replica);
        let keys: Vec<String> = query(&mut m, &["KEYS", "*"]);
        assert!(!keys.is_empty());
        for key in &keys {
            // Keys of the fastest buckets may just have expired; compare the rest.
            if pttl(&mut m, key) > 1000 {
                assert_same_state(&mut m, &mut r, key);
            }
        }
    });
}

#[test]
fn replica_gets_existing_limiters_through_full_sync() {
    for_each_server(|kind| {
        let master = Server::start(kind, &[]);
        let mut m = master.conn();
        for _ in 0..3 {
            rl(&mut m, &["RL.TOKENBUCKET", "tb", "5", "1", "1000000"]);
            rl(&mut m, &["RL.FIXEDWINDOW", "fw", "5", "1000000"]);
        }
        let replica = replica_of(&master);
        let mut r = replica.conn();
        wait_for_sync(&master, &replica);
        assert_same_state(&mut m, &mut r, "tb");
        assert_same_state(&mut m, &mut r, "fw");
        // And it keeps up with calls after the sync.
        rl(&mut m, &["RL.TOKENBUCKET", "tb", "5", "1", "1000000"]);
        wait_for_sync(&master, &replica);
        assert_same_state(&mut m, &mut r, "tb");
    });
}

#[test]
fn denials_and_cost_zero_propagate_nothing() {
    for_each_server(|kind| {
        let master = Server::start(kind, QUIET_MASTER);
        let replica = replica_of(&master);
        let mut m = master.conn();
        rl(
            &mut m,
            &["RL.TOKENBUCKET", "tb", "2", "1", "1000000", "COST", "2"],
        );
        rl(
            &mut m,
            &["RL.FIXEDWINDOW", "fw", "2", "1000000", "COST", "2"],
        );
        wait_for_sync(&master, &replica);

        let offset_before = master_offset(&master);
        for _ in 0..50 {
            assert!(!rl(&mut m, &["RL.TOKENBUCKET", "tb", "2", "1", "1000000"]).allowed);
            assert!(!rl(&mut m, &["RL.FIXEDWINDOW", "fw", "2", "1000000"]).allowed);
            rl(
                &mut m,
                &["RL.TOKENBUCKET", "tb", "2", "1", "1000000", "COST", "0"],
            );
            rl(
                &mut m,
                &["RL.FIXEDWINDOW", "fw", "2", "1000000", "COST", "0"],
            );
            rl(
                &mut m,
                &["RL.TOKENBUCKET", "new", "2", "1", "1000000", "COST", "0"],
            );
            rl(
                &mut m,
                &["RL.TOKENBUCKET", "new", "2", "1", "1000000", "COST", "3"],
            );
            query_err(&mut m, &["RL.TOKENBUCKET", "tb", "0", "1", "1000000"]);
            query_err(&mut m, &["RL.FIXEDWINDOW", "tb", "2", "1000000"]);
        }
        assert_eq!(
            master_offset(&master),
            offset_before,
            "denied, COST 0 or failed calls were propagated"
        );

        // The offset does move for a call that changes something.
        assert!(rl(&mut m, &["RL.TOKENBUCKET", "other", "2", "1", "1000000"]).allowed);
        assert!(master_offset(&master) > offset_before);
    });
}

#[test]
fn replica_refuses_limiter_calls_from_clients() {
    for_each_server(|kind| {
        let master = Server::start(kind, &[]);
        let replica = replica_of(&master);
        let mut r = replica.conn();
        for words in [
            ["RL.TOKENBUCKET", "tb", "5", "1", "1000"].as_slice(),
            ["RL.FIXEDWINDOW", "fw", "5", "1000"].as_slice(),
        ] {
            let err = query_err(&mut r, words);
            assert!(err.starts_with("READONLY"), "{words:?} on a replica: {err}");
        }
        assert_eq!(dbsize(&mut r), 0);
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

fn limiter_commands(commands: &[Vec<String>]) -> Vec<Vec<String>> {
    commands
        .iter()
        .filter(|words| words[0].to_ascii_uppercase().starts_with("RL."))
        .cloned()
        .collect()
}

#[test]
fn admitted_calls_propagate_with_the_masters_time_pinned() {
    for_each_server(|kind| {
        let master = Server::start(kind, &["--appendonly", "yes", "--appendfsync", "always"]);
        let mut m = master.conn();
        let before_us = server_time_us(&mut m);
        rl(&mut m, &["RL.TOKENBUCKET", "tb", "5", "1", "1000000"]);
        rl(
            &mut m,
            &["RL.TOKENBUCKET", "tb", "5", "1", "1000000", "COST", "3"],
        );
        rl(
            &mut m,
            &["RL.FIXEDWINDOW", "fw", "5", "1000000", "COST", "2"],
        );
        let after_us = server_time_us(&mut m);
        // Neither denials nor peeks reach the AOF.
        rl(
            &mut m,
            &["RL.TOKENBUCKET", "tb", "5", "1", "1000000", "COST", "2"],
        );
        rl(
            &mut m,
            &["RL.TOKENBUCKET", "tb", "5", "1", "1000000", "COST", "0"],
        );
        rl(
            &mut m,
            &["RL.FIXEDWINDOW", "fw", "5", "1000000", "COST", "4"],
        );
        rl(
            &mut m,
            &["RL.FIXEDWINDOW", "fw", "5", "1000000", "COST", "0"],
        );

        let logged = limiter_commands(&incremental_aof(&master));
        let shapes: Vec<Vec<String>> = logged
            .iter()
            .map(|words| {
                let mut shape: Vec<String> = words.clone();
                shape[0] = shape[0].to_ascii_uppercase();
                if let Some(at) = shape.len().checked_sub(1) {
                    shape[at] = "<us>".to_string();
                }
                shape
            })
            .collect();
        let expected: Vec<Vec<String>> = [
            vec![
                "RL.TOKENBUCKET",
                "tb",
                "5",
                "1",
                "1000000",
                "COST",
                "1",
                "AT",
                "<us>",
            ],
            vec![
                "RL.TOKENBUCKET",
                "tb",
                "5",
                "1",
                "1000000",
                "COST",
                "3",
                "AT",
                "<us>",
            ],
            vec![
                "RL.FIXEDWINDOW",
                "fw",
                "5",
                "1000000",
                "COST",
                "2",
                "AT",
                "<us>",
            ],
        ]
        .iter()
        .map(|words| words.iter().map(|w| w.to_string()).collect())
        .collect();
        assert_eq!(shapes, expected, "limiter commands in the AOF: {logged:?}");
        for words in &logged {
            let at_us: u64 = words.last().unwrap().parse().expect("AT is an integer");
            assert!(
                (before_us..=after_us).contains(&at_us),
                "AT {at_us} is not the master's time of the call ({before_us}..={after_us})"
            );
        }
    });
}

//! The fuzz corpus as a regression suite, and the writer of its hand-made
//! seeds.

use super::*;
use crate::algorithms::word;
use crate::limiter::{
    Algorithm, Concurrency, FixedWindow, HashWindow, LeakyBucket, SlidingLog, TokenBucket,
};
use std::path::{Path, PathBuf};

fn fuzz_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz")
}

/// The entry point of a corpus directory (named after its target).
fn entry_point(target: &str) -> fn(&[u8]) {
    match target {
        "command" => command,
        "rdb" => rdb,
        other => panic!("no fuzz entry point for fuzz/*/{other}"),
    }
}

/// Every file of `fuzz/corpus/<target>/` and `fuzz/regressions/<target>/`
/// goes through its entry point: the corpus is a regression suite.
#[test]
fn the_fuzz_corpus_and_regressions_replay_cleanly() {
    let mut replayed = 0;
    let mut failed = Vec::new();
    for kind in ["corpus", "regressions"] {
        let Ok(targets) = std::fs::read_dir(fuzz_dir().join(kind)) else {
            assert_ne!(kind, "corpus", "fuzz/corpus is missing");
            continue;
        };
        for target in targets {
            let target = target.unwrap().path();
            let run = entry_point(target.file_name().unwrap().to_str().unwrap());
            for file in std::fs::read_dir(&target).unwrap() {
                let file = file.unwrap().path();
                let data = std::fs::read(&file).unwrap();
                if std::panic::catch_unwind(|| run(&data)).is_err() {
                    failed.push(file.display().to_string());
                }
                replayed += 1;
            }
        }
    }
    assert!(failed.is_empty(), "these inputs fail: {failed:#?}");
    assert!(replayed >= 50, "only {replayed} corpus files");
}

/// A `command` input: selector, argument text, then the [`Bytes`] tail.
fn cmd(selector: u8, text: &str, tail: &[u8]) -> Vec<u8> {
    let mut out = vec![selector];
    out.extend_from_slice(text.as_bytes());
    if !tail.is_empty() {
        out.push(0);
        out.extend_from_slice(tail);
    }
    out
}

/// Fields of a state, as [`Bytes`] values.
fn state_bytes<S: NativeState>(state: &S) -> Vec<u8> {
    let mut fields = Fields(Vec::new());
    state.encode(&mut fields);
    let mut out = Vec::new();
    for v in fields.0 {
        put_value(&mut out, v);
    }
    out
}

/// Encoding 2 of a state, as [`Bytes`] values and a byte string.
fn compact_bytes<S: NativeState>(state: &S) -> Vec<u8> {
    let mut compact = bytes::Compact::default();
    state.encode(&mut compact);
    let mut out = Vec::new();
    for v in compact.0 {
        put_value(&mut out, v);
    }
    put_bytes(&mut out, &compact.1.unwrap_or_default());
    out
}

/// Steps as [`read_steps`] reads them: (milliseconds forward, or back
/// when negative; cost).
fn steps_bytes(steps: &[(i64, u64)]) -> Vec<u8> {
    let mut out = Vec::new();
    for &(ms, cost) in steps {
        let moved = if ms >= 0 {
            (ms as u64) << 2 | 2
        } else {
            (ms.unsigned_abs() * 1000) << 2 | 1
        };
        put_value(&mut out, moved);
        put_value(&mut out, cost);
    }
    out
}

/// A state the algorithm built: `params` run over `steps` from idle.
fn built<L: Algorithm>(params: &L::Params, steps: &[(i64, u64)]) -> L::State {
    let mut now = T0_US;
    let mut state = L::idle(params, Micros::from_us(now));
    for &(ms, cost) in steps {
        now = now.saturating_add_signed(ms * 1000);
        L::apply(&mut state, params, cost, Micros::from_us(now));
    }
    state
}

const TRAFFIC: [(i64, u64); 8] = [
    (0, 2),
    (0, 1),
    (1, 1),
    (150, 2),
    (-40, 1),
    (999, 3),
    (1, 1),
    (2500, 1),
];

fn limiter_seeds<L: Listed + Guarantee>(
    seeds: &mut Vec<Vec<u8>>,
    rdb_seeds: &mut Vec<Vec<u8>>,
    selector: u8,
    params_text: &str,
    other_params_text: &str,
    near_valid: &[&str],
) {
    let parse = |text: &str| {
        let words: Vec<&[u8]> = text.split(' ').map(str::as_bytes).collect();
        L::Params::parse(&words).expect("seed parameters parse")
    };
    let params = parse(params_text);
    let other = parse(other_params_text);
    let replicated = selector | REPLICATED;
    for options in [
        "",
        " COST 0",
        " COST 3",
        " cost 1099511627776",
        " COST 2 AT 0",
        " UPTO 4",
        " upto 1099511627776 BLOCK 10",
    ] {
        seeds.push(cmd(selector, &format!("k {params_text}{options}"), &[]));
    }
    seeds.push(cmd(
        replicated,
        &format!("k {params_text} AT {T0_US} COST 1"),
        &[],
    ));
    seeds.push(cmd(
        replicated,
        &format!("k {params_text} AT 4611686018427387904"),
        &[],
    ));
    for bad in near_valid {
        seeds.push(cmd(selector, &format!("k {bad}"), &[]));
    }
    for bad in [
        " COST",
        " COST -1",
        " COST 1 COST 1",
        " LIMIT 5",
        " COST 1099511627777",
        " UPTO 0",
        " UPTO 2 COST 1",
        " REFUND 1 UPTO 2",
    ] {
        seeds.push(cmd(selector, &format!("k {params_text}{bad}"), &[]));
    }
    // Loaded states: built under the same parameters, and under others
    // (a rule change), then driven back and forth in time.
    let drive = steps_bytes(&[
        (0, 1),
        (0, 5),
        (10, 1),
        (-2000, 1),
        (3000, 0),
        (86_400_000, 2),
        (1, 1_000_000),
    ]);
    for state in [
        built::<L>(&params, &TRAFFIC),
        built::<L>(&other, &TRAFFIC),
        L::idle(&params, Micros::from_us(T0_US)),
    ] {
        let mut tail = state_bytes(&state);
        tail.extend_from_slice(&drive);
        seeds.push(cmd(selector, &format!("k {params_text}"), &tail));
        seeds.push(cmd(
            selector,
            &format!("k {other_params_text} COST 2"),
            &tail,
        ));
        // RL.SETSTATE's AOF form of the same state
        let mut fields = Fields(Vec::new());
        state.encode(&mut fields);
        let text: Vec<String> = fields.0.iter().map(u64::to_string).collect();
        seeds.push(cmd(
            SETSTATE | REPLICATED,
            &format!("k {} 1 {}", word::<L>(), text.join(" ")),
            &[],
        ));
        // and its RDB form, with parameters and steps to run it on, at
        // encodings 0 to 3 (encoding 2's own form where the type has it)
        for encoding in 0..4u8 {
            let mut rdb = vec![selector + (COUNT as u8 + 1) * encoding];
            if encoding == 2 && L::newest_encoding() >= 2 {
                rdb.extend_from_slice(&compact_bytes(&state));
            } else {
                rdb.extend_from_slice(&state_bytes(&state));
            }
            for word in params_text.split(' ') {
                put_value(&mut rdb, word.parse().unwrap());
            }
            rdb.extend_from_slice(&drive);
            rdb_seeds.push(rdb);
        }
    }
}

fn policy_rdb(rules: &[(&str, &str)]) -> Vec<u8> {
    // The policies' aux data, at encoding 1.
    let mut out = vec![COUNT as u8 + (COUNT as u8 + 1)];
    put_value(&mut out, rules.len() as u64);
    for (name, rule) in rules {
        let words: Vec<&[u8]> = rule.split(' ').map(str::as_bytes).collect();
        let rule = policy::parse_rule(&words).unwrap();
        put_bytes(&mut out, name.as_bytes());
        put_bytes(&mut out, rule.spec.name().as_bytes());
        let params = rule.spec.params();
        put_value(&mut out, params.as_slice().len() as u64);
        for &p in params.as_slice() {
            put_value(&mut out, p);
        }
        put_value(&mut out, rule.mode as u64);
        put_value(&mut out, u64::from(rule.rollout));
    }
    out
}

/// Writes the hand-made seeds of `fuzz/corpus/` (valid and near-valid
/// inputs for every command and state type), named by content:
/// `cargo test --lib write_fuzz_seeds -- --ignored`.
#[test]
#[ignore = "writes fuzz/corpus; run by hand"]
fn write_fuzz_seeds() {
    let mut command_seeds = Vec::new();
    let mut rdb_seeds = Vec::new();
    let (c, r) = (&mut command_seeds, &mut rdb_seeds);
    let tb_bad = [
        "0 5 1000",
        "5 0 1000",
        "5 5 0",
        "5 5",
        "1099511627776 1 1099511627776",
        "-1 1 1",
        "5 5 1e3",
    ];
    limiter_seeds::<TokenBucket>(c, r, 0, "5 5 1000", "50 1 10", &tb_bad);
    let fw_bad = [
        "0 1000",
        "3 0",
        "3",
        "1099511627777 1000",
        "3 18446744073709551616",
    ];
    limiter_seeds::<FixedWindow>(c, r, 1, "3 1000", "10 60000", &fw_bad);
    let lb_bad = ["3 0 100", "3 1 0", "1099511627776 1 1099511627776", "3 1"];
    limiter_seeds::<LeakyBucket>(c, r, 2, "3 1 100", "10 3 1000", &lb_bad);
    let sl_bad = [
        "100000 1000",
        "100001 1000",
        "16777215 1000",
        "16777216 1000",
        "0 1000",
        "3 1099511627776",
    ];
    limiter_seeds::<SlidingLog>(c, r, 3, "3 1000", "100 10", &sl_bad);
    let hw_bad = [
        "10 1000 300",
        "10 3600000 1000",
        "10 3601000 1000",
        "10 1000000 1",
        "10 1000001 1",
        "10 0 1",
        "10 1099511627776 1048576",
    ];
    limiter_seeds::<HashWindow>(c, r, 4, "10 6000 1000", "10 1000 100", &hw_bad);
    let cc_bad = ["0 1000", "3 0", "16777216 1000", "3 1099511627777", "3"];
    limiter_seeds::<Concurrency>(c, r, 5, "3 1000", "10 50", &cc_bad);
    let traffic = steps_bytes(&TRAFFIC);
    for text in [
        "k 1",
        "k 0",
        "k x",
        "k -1",
        "k 9223372036854775808",
        "k 1 AT",
        "k 1 FOO",
    ] {
        command_seeds.push(cmd(selector(COUNT + 11), text, &traffic));
    }
    command_seeds.push(cmd(
        selector(COUNT + 11) | REPLICATED,
        "k 1700000000123456 AT 1700000000123457",
        &traffic,
    ));
    for text in [
        "k 1 100",
        "k 1 0",
        "k 1",
        "k 1 1099511627777",
        "k 1 100 AT 5",
    ] {
        command_seeds.push(cmd(selector(COUNT + 12), text, &traffic));
    }

    for text in [
        "2 a b TOKENBUCKET 5 5 1000 FIXEDWINDOW 3 1000",
        "2 a b TOKENBUCKET 5 5 1000 FIXEDWINDOW 3 1000 EACH",
        "2 a b SLIDING 3 1000 POLICY tb each UPTO 5",
        "3 a b c POLICY tb POLICY fw POLICY lb COST 0 EACH",
        "1 a FIXEDWINDOW 3 1000 EACH COST 2 EACH",
        "1 a FIXEDWINDOW 3 1000 COST EACH",
        "1 a POLICY tb COST 2",
        "2 a b SLIDING 3 1000 POLICY tb UPTO 5",
        "2 a b FIXEDWINDOW 3 1000 LEAKYBUCKET 3 1 100 UPTO 2",
        "3 a b c SLIDING 3 1000 POLICY hw LEAKYBUCKET 3 1 100 COST 0",
        "5 a b c d e POLICY tb POLICY fw POLICY lb POLICY sl POLICY hw",
        "2 a b HASHWINDOW 10 60000 1000 sliding 5 100 cost 4",
        "2 a a FIXEDWINDOW 1 1 FIXEDWINDOW 1 1",
        "1 a POLICY nope",
        "2 a b POLICY tb",
        "17 a",
        "0 a FIXEDWINDOW 1 1",
        "1 a TOKENBUCKET 5 5 1000 AT 5",
        "1 a TOKENBUCKET 5 5",
        "1 a GCRA 5 5 1000",
        "1 a SLIDING 100001 1000",
        "1 a CONCURRENCY 3 1000",
        "1 a POLICY cc",
    ] {
        command_seeds.push(cmd(selector(COUNT), text, &traffic));
    }
    command_seeds.push(cmd(
        selector(COUNT) | REPLICATED,
        "1 a SLIDING 100001 1000",
        &traffic,
    ));
    // Out of memory: a new key fails the call, all or nothing.
    for text in [
        "2 a b TOKENBUCKET 5 5 1000 FIXEDWINDOW 3 1000",
        "2 a b TOKENBUCKET 5 5 1000 FIXEDWINDOW 3 1000 COST 0",
        "1 a POLICY tb COST 2 FORCE",
    ] {
        command_seeds.push(cmd(selector(COUNT) | OUT_OF_MEMORY, text, &traffic));
    }
    command_seeds.push(cmd(OUT_OF_MEMORY, "k 5 5 1000", &traffic));
    command_seeds.push(cmd(3 | OUT_OF_MEMORY, "k 3 1000 COST 0", &traffic));
    command_seeds.push(cmd(selector(COUNT + 1) | OUT_OF_MEMORY, "hw k", &traffic));
    for text in [
        "tb k",
        "fw k COST 4",
        "lb k COST 0",
        "sl k",
        "hw k COST 11",
        "sl k UPTO 3",
        "lb k UPTO 3",
        "nope k",
        "tb k AT 1",
        "tb",
    ] {
        command_seeds.push(cmd(selector(COUNT + 1), text, &traffic));
    }
    for text in [
        "p1 TOKENBUCKET 5 5 1000",
        "p2 FIXEDWINDOW 10 1000 MODE SHADOW ROLLOUT 30",
        "p:3 HASHWINDOW 10 60000 1000 MODE off",
        "p.4 LEAKYBUCKET 5 1 100 rollout 0 mode enforce",
        "p_5 SLIDING 3 1000",
        "p6 CONCURRENCY 3 1000",
        "bad\x00name SLIDING 1 1",
        "p LEAKYBUCKET 5 1 100 ROLLOUT 101",
        "p SLIDING 100001 1000",
        "p TOKENBUCKET 5 5",
        "p FOO 1 2 3",
        "p FIXEDWINDOW 1 1 MODE",
        "p FIXEDWINDOW 1 1 MODE LOUD",
        "p FIXEDWINDOW 1 1 MODE OFF MODE OFF",
    ] {
        command_seeds.push(cmd(selector(COUNT + 2), text, &traffic));
    }
    command_seeds.push(cmd(
        selector(COUNT + 2) | REPLICATED,
        "p SLIDING 16777215 1000",
        &traffic,
    ));
    command_seeds.push(cmd(selector(COUNT + 3), "tb", &[]));
    command_seeds.push(cmd(selector(COUNT + 4), "zz", &[]));
    command_seeds.push(cmd(selector(COUNT + 5), "", &[]));
    for text in ["", "10", "0", "4294967295", "4294967296", "1 2"] {
        command_seeds.push(cmd(selector(COUNT + 6), text, &[]));
    }
    command_seeds.push(cmd(selector(COUNT + 7), "", &[]));
    for text in [
        "k TOKENBUCKET 1 1700000000000000 0 5 1000",
        "k FOO 1 1 2",
        "k SLIDING 2 0 0 0 0",
        "k HASHWINDOW 1 1000 5 0 2 0 0",
        "k fixedwindow 1 1 2 3",
    ] {
        command_seeds.push(cmd(SETSTATE | REPLICATED, text, &traffic));
        command_seeds.push(cmd(selector(COUNT + 8), text, &[]));
    }
    for text in [
        "sliding-max-limit 5000",
        "ratelimit.hashwindow-max-buckets 60 log-max-len 0",
        "foo 1",
        "log-max-len",
        "sliding-max-limit 0",
        "hashwindow-max-buckets 1000001",
    ] {
        command_seeds.push(cmd(selector(COUNT + 9), text, &[]));
    }
    for text in [
        "k 15 30 60",
        "k 0 1 2 1",
        "k 4 1 1 0",
        "k 9999999 10000000 1 1000",
        "k 2 3 1",
        "k 1 1 1 1 1",
        "k -1 1 1",
        "k 1099511627776 1 1",
        "k 1 2000000000 1",
    ] {
        command_seeds.push(cmd(selector(COUNT + 13), text, &traffic));
    }
    // The protection loop: its arguments on RL.POLICY SET, RL.OUTCOME
    // (again at each step), RL.POLICY SCALE and STATS, RL.LOOPSTATE.
    for text in [
        "p TOKENBUCKET 5 5 1000 ADAPT ERRORS 5",
        "p SLIDING 10 1000 ADAPT ERRORS 5 FACTOR 50 MIN 20 RECOVER 10 WINDOW 100 MINCALLS 1 STAGES 30 50",
        "p FIXEDWINDOW 3 1000 STAGES 30 50 WINDOW 200 ADAPT OFF",
        "p FIXEDWINDOW 3 1000 ADAPT ERRORS 101",
        "p FIXEDWINDOW 3 1000 ADAPT ERRORS 5 MIN 0",
        "p FIXEDWINDOW 3 1000 ADAPT ERRORS 5 FACTOR 0",
        "p FIXEDWINDOW 3 1000 ADAPT ERRORS 5 WINDOW 5 WINDOW 5",
        "p FIXEDWINDOW 3 1000 WINDOW 0",
        "p FIXEDWINDOW 3 1000 STAGES 50 30",
        "p FIXEDWINDOW 3 1000 STAGES 30",
        "p FIXEDWINDOW 3 1000 ADAPT",
        "p FIXEDWINDOW 3 1000 ADAPT SOMETIMES",
    ] {
        command_seeds.push(cmd(selector(COUNT + 2), text, &traffic));
    }
    for text in [
        "ad 90 10",
        "ad 0 0",
        "st 5 5",
        "nope 1 1",
        "ad -1 0",
        "ad 1099511627777 0",
        "ad 1",
    ] {
        command_seeds.push(cmd(selector(COUNT + 14), text, &traffic));
    }
    for text in ["ad 50", "tb 1", "tb 100", "tb 0", "tb 101", "nope 50"] {
        command_seeds.push(cmd(selector(COUNT + 15), text, &[]));
    }
    for text in ["ad", "st", "tb", "nope"] {
        command_seeds.push(cmd(selector(COUNT + 16), text, &[]));
    }
    for text in ["ad 64 2", "ad 0 1", "ad 50 3", "nope 50 1"] {
        command_seeds.push(cmd(selector(COUNT + 17) | REPLICATED, text, &[]));
        command_seeds.push(cmd(selector(COUNT + 17), text, &[]));
    }
    for text in ["ad k", "ad k COST 10", "st k"] {
        command_seeds.push(cmd(selector(COUNT + 1), text, &traffic));
    }
    command_seeds.push(cmd(selector(COUNT), "2 a b POLICY ad POLICY st", &traffic));
    rdb_seeds.push(policy_rdb(&[]));
    rdb_seeds.push(policy_rdb(&POLICIES));
    rdb_seeds.push(policy_rdb(&[("a", "TOKENBUCKET 1 1 1 MODE OFF ROLLOUT 0")]));
    let mut truncated = policy_rdb(&POLICIES);
    truncated.truncate(truncated.len() / 2);
    rdb_seeds.push(truncated);
    for (target, seeds) in [("command", command_seeds), ("rdb", rdb_seeds)] {
        let dir = fuzz_dir().join("corpus").join(target);
        std::fs::create_dir_all(&dir).unwrap();
        for seed in seeds {
            let name = format!("seed-{:016x}", fnv(&seed));
            std::fs::write(dir.join(name), seed).unwrap();
        }
    }
}

fn fnv(data: &[u8]) -> u64 {
    data.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

#[test]
fn the_byte_decoder_reads_what_put_value_writes() {
    let values = [
        0,
        1,
        63,
        64,
        255,
        256,
        1 << 24,
        u64::MAX,
        T0_US,
        0x1234_5678_9abc,
    ];
    let mut out = Vec::new();
    for v in values {
        put_value(&mut out, v);
    }
    put_bytes(&mut out, b"name");
    let mut input = Bytes::new(&out);
    for v in values {
        assert_eq!(input.take(), Some(v));
    }
    assert_eq!(input.bytes(), Some(b"name".to_vec()));
    assert_eq!(input.take(), None);
    // a value cut short is the end of the input
    assert_eq!(Bytes::new(&[0x80, 1, 2]).take(), None);
}

//! Fuzz entry points: plain functions over bytes, called by the cargo-fuzz
//! targets in `fuzz/` and, in `cargo test`, by a test that replays the whole
//! seed corpus and every saved regression (see `docs/fuzzing.md`).
//!
//! - [`command`] turns bytes into the argv of one command and runs the real
//!   parser of that command on it, then the algorithm of every limiter call
//!   that parses, on a fresh state and on a state decoded from the same
//!   bytes, at fuzzed times (backwards too), asserting the algorithms'
//!   contract at every step.
//! - [`rdb`] feeds bytes to the RDB loaders of the native types (and of
//!   the policies), at encodings 0 to 3: whatever they accept must
//!   re-encode to the very same state, in every encoding the type has, and
//!   be safe to run.
//!
//! A broken invariant is a panic, which libFuzzer reports as a crash.

use std::cell::RefCell;

use crate::algorithms::{for_each_algorithm, with_algorithm, Listed, Site, Spec, COUNT};
use crate::args::{Params, MAX_AT_US};
use crate::commands::host::Origin;
use crate::commands::memory::{Called, Memory};
use crate::datatype::{decode_args, Decoder, NativeState};
use crate::error::Error;
use crate::limiter::contract::{self, Guarantee};
use crate::limiter::{Micros, Request, MAX_PARAM};
use crate::policy;

/// A realistic "now" (November 2023) for calls without `AT`.
pub const T0_US: u64 = 1_700_000_000_123_456;

/// Steps of one fuzzed run: enough to fill, drain and step back.
const MAX_STEPS: usize = 32;

mod bytes;
#[cfg(test)]
mod seeds;

pub use bytes::{put_bytes, put_value, Bytes};
use bytes::{Compact, Fields, Replay, ReplayCompact};

// ---------------------------------------------------------------------------
// The commands.

/// The commands of the module, as the first byte of a `command` input picks
/// them (its low four bits; bit 0x10 says the call comes from the master or
/// the AOF, where `AT` and `RL.SETSTATE` are allowed): first the command of
/// every row of the table of algorithms, in order (0 to [`COUNT`] - 1), then
/// these, from [`COUNT`] on.
pub const OTHER_COMMANDS: [&str; 18] = [
    "RL.ALL",
    "RL.HIT",
    "RL.POLICY SET",
    "RL.POLICY GET",
    "RL.POLICY DEL",
    "RL.POLICY LIST",
    "RL.LOG GET",
    "RL.LOG LEN",
    "RL.SETSTATE",
    "loadmodule arguments",
    "RL.LOG RESET",
    "RL.RELEASE",
    "RL.RENEW",
    "CL.THROTTLE",
    "RL.OUTCOME",
    "RL.POLICY SCALE",
    "RL.POLICY STATS",
    "RL.LOOPSTATE",
];

/// Bit of the selector byte that extends its low four bits (the pick) to
/// five: `pick = (selector & 0x0f) | (selector & 0x40) >> 2`.
pub const HIGH_PICK: u8 = 0x40;

/// The command a selector picks (see [`OTHER_COMMANDS`]).
pub fn pick(selector: u8) -> usize {
    usize::from(selector & 0x0f) | usize::from(selector & HIGH_PICK) >> 2
}

/// The selector that picks command `pick` (below 32).
pub const fn selector(pick: usize) -> u8 {
    (pick as u8 & 0x0f) | (pick as u8 & 0x10) << 2
}

/// Bit of the selector byte: the call comes from the master link or the AOF.
pub const REPLICATED: u8 = 0x10;

/// Bit of the selector byte: the server is out of memory under
/// `noeviction` (for the call itself; the steps after it run without).
pub const OUT_OF_MEMORY: u8 = 0x20;

/// The selector of `RL.SETSTATE`.
pub const SETSTATE: u8 = selector(COUNT + 8);

/// One command: `data[0]` picks it (see [`OTHER_COMMANDS`]), then its arguments
/// after the command name, separated by spaces, up to a NUL byte; what
/// follows the NUL is read by [`Bytes`]: a limiter state (as its RDB
/// fields), then up to 32 steps of (time move, request).
///
/// The call runs through the module's own step (`crate::commands`), on an
/// in-memory key space ([`Memory`]), as the server would run it: an error
/// must be one clean line and change nothing anywhere; a call that succeeds
/// must bring a replica that replays what it propagated to the very same
/// keys. A limiter call that parses then runs again at every step's instant
/// and request, through the step too (with the same replica check), and
/// its parameters run the core crate's contract ([`contract`]) on a fresh
/// state and on the state decoded from the input.
pub fn command(data: &[u8]) {
    install_policies();
    let Some((&selector, rest)) = data.split_first() else {
        return;
    };
    let (text, tail) = match rest.iter().position(|&b| b == 0) {
        Some(nul) => (&rest[..nul], &rest[nul + 1..]),
        None => (rest, &[][..]),
    };
    let words: Vec<&[u8]> = if text.is_empty() {
        Vec::new()
    } else {
        text.split(|&b| b == b' ').collect()
    };
    let origin = if selector & REPLICATED != 0 {
        Origin::Replicated
    } else {
        Origin::Client
    };
    let mut input = Bytes::new(tail);
    let pick = pick(selector);
    if pick < COUNT {
        for_each_algorithm!(L => {
            if L::INDEX == pick {
                return limiter::<L>(&words, origin, selector & OUT_OF_MEMORY != 0, &mut input);
            }
        });
    }
    let name: &[&[u8]] = match pick - COUNT {
        0 => &[b"RL.ALL"],
        1 => &[b"RL.HIT"],
        2 => &[b"RL.POLICY", b"SET"],
        3 => &[b"RL.POLICY", b"GET"],
        4 => &[b"RL.POLICY", b"DEL"],
        5 => &[b"RL.POLICY", b"LIST"],
        6 => &[b"RL.LOG", b"GET"],
        7 => &[b"RL.LOG", b"LEN"],
        8 => &[b"RL.SETSTATE"],
        10 => &[b"RL.LOG", b"RESET"],
        11 => &[b"RL.RELEASE"],
        12 => &[b"RL.RENEW"],
        13 => &[b"CL.THROTTLE"],
        14 => &[b"RL.OUTCOME"],
        15 => &[b"RL.POLICY", b"SCALE"],
        16 => &[b"RL.POLICY", b"STATS"],
        17 => &[b"RL.LOOPSTATE"],
        _ => return load_arguments(&words),
    };
    let mut argv = name.to_vec();
    argv.extend_from_slice(&words);
    let steps = read_steps(&mut input, Micros::from_us(T0_US), Request::Cost(1));
    let master = Memory::new(Micros::from_us(T0_US));
    let replica = Memory::new(Micros::from_us(T0_US));
    master.set_out_of_memory(selector & OUT_OF_MEMORY != 0);
    let called = call_checked(&master, &replica, origin, &argv);
    master.set_out_of_memory(false);
    if called.result.is_err() {
        return;
    }
    match pick - COUNT {
        // RL.ALL and RL.HIT again at each step's instant, then each limiter
        // of the call on the core crate's contract.
        0 | 1 => {
            for &(now, _) in steps.iter().skip(1) {
                master.set_now(now);
                call_checked(&master, &replica, Origin::Client, &argv);
            }
            if pick == COUNT {
                let call = crate::commands::all::parse(&argv).expect("a call that ran parses");
                for limit in call.limits.iter() {
                    run_spec(&limit.spec, &steps);
                }
            } else if let Some((rule, _)) = policy::get(words[0]) {
                run_spec(&rule.spec, &steps);
            }
        }
        // CL.THROTTLE and RL.OUTCOME again at each step's instant (the
        // protection loop's windows end as the clock moves).
        13 | 14 => {
            for &(now, _) in steps.iter().skip(1) {
                master.set_now(now);
                call_checked(&master, &replica, Origin::Client, &argv);
            }
        }
        // RL.POLICY SET: the rule survives the RDB form and runs.
        2 => {
            let (name, rule) = (
                words[0],
                policy::parse_rule(&words[1..]).expect("it was set"),
            );
            let rules = vec![(name.to_vec(), rule)];
            assert_eq!(policies_round_trip(&rules), rules);
            run_spec(&rule.spec, &steps);
        }
        // RL.SETSTATE: the state it set is checked and run like a loaded one.
        8 => {
            for_each_algorithm!(L => {
                if let Some(state) = master.state::<L>(words[0]) {
                    check_round_trip::<L>(&state);
                    run_loaded::<L>(state, &mut input);
                }
            });
        }
        _ => {}
    }
    // What RL.POLICY SET and DEL changed, and the scale, stage and windows
    // the calls left, back to the fixed policies.
    if matches!(pick - COUNT, 0 | 1 | 2 | 4 | 14 | 15 | 17) {
        reinstall_policies(&argv);
    }
}

/// Runs `argv` on `master`, checks its error or its replication to
/// `replica`, and returns what it did.
fn call_checked(master: &Memory, replica: &Memory, origin: Origin, argv: &[&[u8]]) -> Called {
    let before = master.snapshot();
    let called = master.call(origin, argv);
    if tracing() {
        eprintln!("{:?} {:?} -> {:?}", origin, text_of(argv), called.result);
    }
    match &called.result {
        Err(error) => {
            check_error(error);
            assert!(
                called.effects.propagated.is_empty(),
                "an error propagated something"
            );
            assert_eq!(master.snapshot(), before, "an error changed a key");
        }
        Ok(()) => {
            if origin == Origin::Client && master.out_of_memory() {
                let after = master.snapshot();
                assert!(
                    after.iter().all(|k| before.iter().any(|b| b.0 == k.0)),
                    "a key was created out of memory by {:?}",
                    text_of(argv)
                );
            }
            replica.set_now(master.now());
            let again = replica.replay(&called.effects.propagated);
            // Policies are the process's, shared here by master and replica:
            // a replayed RL.POLICY DEL finds the policy gone already.
            if !argv[0].eq_ignore_ascii_case(b"RL.POLICY") {
                assert_eq!(
                    again, called.effects.propagated,
                    "a replayed call propagated otherwise"
                );
            }
            assert_eq!(
                replica.snapshot(),
                master.snapshot(),
                "a replica diverged after {:?}",
                text_of(argv)
            );
        }
    }
    called
}

fn text_of(argv: &[&[u8]]) -> Vec<String> {
    argv.iter()
        .map(|w| String::from_utf8_lossy(w).into_owned())
        .collect()
}

/// The loadmodule arguments: `name value` pairs, or one clean error line.
fn load_arguments(words: &[&[u8]]) {
    if let Err(message) = crate::config::parse_load_arguments(words)
        .map(|parsed| assert!(parsed.len() * 2 == words.len()))
    {
        assert_one_line(&message);
    }
}

/// An error reply is one line with a Redis error code, never a panic.
fn check_error(error: &Error) {
    if *error == Error::Arity {
        // The server's own wording (`RedisModule_WrongArity`).
        return;
    }
    if let Error::Usage(text) = error {
        // CL.THROTTLE's arity error: redis-cell's text, with its code.
        assert!(text.starts_with("Cell error: "), "{text}");
        return;
    }
    let message = error.message();
    assert_one_line(&message);
    let code = message.split(' ').next().unwrap_or_default();
    assert!(
        ["ERR", "WRONGTYPE", "OOM"].contains(&code),
        "error without a code: {message}"
    );
}

fn assert_one_line(message: &str) {
    assert!(
        !message.bytes().any(|b| b == b'\r' || b == b'\n' || b == 0),
        "error reply not one clean line: {message:?}"
    );
}

/// The policies `RL.ALL ... POLICY name` and `RL.HIT name` can name: one per
/// algorithm and mode. The fuzzed `RL.POLICY SET` and `DEL` may change
/// them; each input starts from these again.
pub const POLICIES: [(&str, &str); 8] = [
    ("tb", "TOKENBUCKET 5 5 1000"),
    ("fw", "FIXEDWINDOW 3 1000 MODE SHADOW"),
    ("lb", "LEAKYBUCKET 4 1 250 ROLLOUT 50"),
    ("sl", "SLIDING 10 1000 MODE OFF"),
    ("hw", "HASHWINDOW 10 6000 1000"),
    ("cc", "CONCURRENCY 3 1000"),
    // The protection loop, on short windows the steps cross.
    (
        "ad",
        "TOKENBUCKET 5 5 1000 ADAPT ERRORS 5 MINCALLS 1 RECOVER 20 STAGES 30 50 WINDOW 100",
    ),
    ("st", "FIXEDWINDOW 3 1000 MODE SHADOW STAGES 0 0 WINDOW 50"),
];

fn install_policies() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| reinstall_policies(&[]));
}

/// Sets the fixed policies again, and deletes the one `argv` (an
/// `RL.POLICY SET` or `DEL`) named if it is not one of them.
fn reinstall_policies(argv: &[&[u8]]) {
    if let Some(name) = argv.get(2) {
        if !POLICIES.iter().any(|(fixed, _)| fixed.as_bytes() == *name) {
            policy::delete(name);
        }
    }
    for (name, rule) in POLICIES {
        let words: Vec<&[u8]> = rule.split(' ').map(str::as_bytes).collect();
        let rule = policy::parse_rule(&words).expect("a valid policy");
        policy::set(name.as_bytes(), rule);
    }
}

/// `RL.<ALGORITHM> key <params...> [options]`: the call through the step,
/// on a fresh key and on the state decoded from the input; then every step
/// through the step too; then the parameters on the core crate's contract.
fn limiter<L: Listed + Guarantee>(
    words: &[&[u8]],
    origin: Origin,
    out_of_memory: bool,
    input: &mut Bytes,
) {
    let mut argv: Vec<&[u8]> = vec![L::ROW.command.to_bytes()];
    argv.extend_from_slice(words);
    let loaded = decode_checked::<L>(input, 1);
    let first = crate::args::parse_call::<L::Params>(words.get(1..).unwrap_or_default())
        .map_or(Request::Cost(1), |(_, options)| options.request);
    let steps = read_steps(input, Micros::from_us(T0_US), first);
    let (master, replica) = (
        Memory::new(Micros::from_us(T0_US)),
        Memory::new(Micros::from_us(T0_US)),
    );
    let key = words.first().copied().unwrap_or_default();
    if let Some(state) = &loaded {
        master.insert::<L>(key, state.clone());
        replica.insert::<L>(key, state.clone());
    }
    master.set_out_of_memory(out_of_memory);
    let called = call_checked(&master, &replica, origin, &argv);
    master.set_out_of_memory(false);
    if called.result.is_err() {
        return;
    }
    let (params, _) =
        crate::args::parse_call::<L::Params>(&words[1..]).expect("a call that ran parses");
    // The same key, parameters as the call gave them, each step's request
    // at its instant, as a client sends it.
    let texts: Vec<String> = steps
        .iter()
        .map(|(_, request)| match *request {
            Request::Cost(n) => format!("COST {n}"),
            Request::Force(n) => format!("COST {n} FORCE"),
            Request::Refund(n) => format!("REFUND {n}"),
            Request::UpTo(n) => format!("UPTO {n}"),
        })
        .collect();
    let head = &argv[..2 + L::Params::COUNT];
    for ((now, _), request) in steps.iter().zip(&texts).skip(1) {
        master.set_now(*now);
        let mut step = head.to_vec();
        step.extend(request.split(' ').map(str::as_bytes));
        call_checked(&master, &replica, Origin::Client, &step);
    }
    run_fresh::<L>(&params, &steps);
    if let Some(mut state) = loaded {
        run_steps::<L>(&mut state, &params, &steps);
    }
}

// ---------------------------------------------------------------------------
// The RDB loaders.

/// One RDB payload: `data[0] % (COUNT + 1)` picks the type (the limiter
/// states in the order of the table of algorithms, then the policies' aux
/// data), `data[0] / (COUNT + 1) % 4` the
/// encoding version Redis passes (0 to 3: every type has 1, the hash window
/// 2 too, 0 and 3 exist for none; the aux loader ignores it, its payload
/// carries its own version); the rest is read by [`Bytes`] (encoding 2's
/// byte string as [`Bytes::bytes`]). What a loader accepts must re-encode to
/// the very same fields, refuse every truncation of them, and run safely.
pub fn rdb(data: &[u8]) {
    let Some((&selector, rest)) = data.split_first() else {
        return;
    };
    let types = COUNT + 1;
    let encoding = (usize::from(selector) / types % 4) as i32;
    let mut input = Bytes::new(rest);
    let pick = usize::from(selector) % types;
    for_each_algorithm!(L => {
        if L::INDEX == pick {
            return rdb_state::<L>(&mut input, encoding);
        }
    });
    rdb_policies(input)
}

fn rdb_state<L: Listed + Guarantee>(input: &mut Bytes, encoding: i32) {
    let Some(state) = decode_checked::<L>(input, encoding) else {
        return;
    };
    run_loaded::<L>(state, input);
}

/// Runs a loaded state under parameters read from `input` (checked by the
/// real parser, so only parameters a call could carry).
fn run_loaded<L: Listed + Guarantee>(mut state: L::State, input: &mut Bytes) {
    let mut texts = Vec::with_capacity(L::Params::COUNT);
    for _ in 0..L::Params::COUNT {
        let Some(value) = input.take() else { return };
        texts.push(value.to_string());
    }
    let words: Vec<&[u8]> = texts.iter().map(String::as_bytes).collect();
    let Ok(params) = L::Params::parse(&words) else {
        return;
    };
    let steps = read_steps(input, Micros::from_us(T0_US), Request::Cost(1));
    run_steps::<L>(&mut state, &params, &steps);
}

/// The policies' aux data (`Policies::load` in `datatype.rs`): accepted
/// sets survive a round trip and their rules run.
fn rdb_policies(input: Bytes) {
    let input = RefCell::new(input);
    let decoded = policy::decode(&mut || input.borrow_mut().take(), &mut || {
        input.borrow_mut().bytes()
    });
    let Some(rules) = decoded else { return };
    assert!(rules.len() <= policy::MAX_POLICIES);
    assert_eq!(policies_round_trip(&rules), rules);
    let steps = read_steps(
        &mut input.borrow_mut(),
        Micros::from_us(T0_US),
        Request::Cost(1),
    );
    for (_, rule) in rules.iter().take(4) {
        run_spec(&rule.spec, &steps);
    }
}

/// Encodes a set of rules as the RDB does, and decodes it back.
fn policies_round_trip(rules: &[(Vec<u8>, policy::Rule)]) -> Vec<(Vec<u8>, policy::Rule)> {
    let mut unsigned = Vec::new();
    let mut bytes = Vec::new();
    policy::encode_rules(rules, &mut |field| match field {
        policy::Field::Unsigned(v) => unsigned.push(v),
        policy::Field::Bytes(b) => bytes.push(b.to_vec()),
    });
    let mut unsigned = unsigned.into_iter();
    let mut bytes = bytes.into_iter();
    let decoded = policy::decode(&mut || unsigned.next(), &mut || bytes.next())
        .expect("encoded policies decode");
    assert!(unsigned.next().is_none() && bytes.next().is_none());
    decoded
}

// ---------------------------------------------------------------------------
// Loading and running states, with the invariants.

/// Decodes a state; one that is accepted must be at an encoding its type
/// has, re-encode to the same state (RDB and AOF forms), and refuse every
/// truncation of its fields.
fn decode_checked<L: Listed>(input: &mut Bytes, encoding: i32) -> Option<L::State> {
    let state = L::State::decode(input, encoding)?;
    assert!(
        (1..=L::newest_encoding()).contains(&encoding),
        "a state loaded at an unknown encoding"
    );
    check_round_trip::<L>(&state);
    Some(state)
}

/// Encode, then decode: the same state, from the RDB fields and from the
/// AOF's decimal arguments, and from encoding 2 where the type has it; and
/// no prefix of the fields loads.
fn check_round_trip<L: Listed>(state: &L::State) {
    if L::newest_encoding() >= 2 {
        check_compact_round_trip::<L>(state);
    }
    let encoding = 1;
    let mut fields = Fields(Vec::new());
    state.encode(&mut fields);
    let fields = fields.0;
    let again = L::State::decode(&mut Replay(fields.iter()), encoding);
    assert_eq!(
        again.as_ref(),
        Some(state),
        "RDB round trip changed the state"
    );
    if fields.len() <= 64 {
        for len in 0..fields.len() {
            assert!(
                L::State::decode(&mut Replay(fields[..len].iter()), encoding).is_none(),
                "a truncated state loaded ({len} of {} fields)",
                fields.len()
            );
        }
        let text: Vec<String> = fields.iter().map(u64::to_string).collect();
        let args: Vec<&[u8]> = text.iter().map(String::as_bytes).collect();
        let again = decode_args::<L::State>(&args, encoding);
        assert_eq!(
            again.as_ref(),
            Some(state),
            "AOF round trip changed the state"
        );
    }
}

/// Encoding 2 (the hash window's compact form): the same state, written
/// again byte for byte; no prefix of its fields or of its byte string
/// loads; and `RL.SETSTATE`'s form of it (the string as one argument).
fn check_compact_round_trip<L: Listed>(state: &L::State) {
    let mut compact = Compact::default();
    state.encode(&mut compact);
    let Compact(fields, string) = compact;
    let string = string.expect("encoding 2 ends with a byte string");
    let load = |len: usize, string: &[u8]| {
        L::State::decode(
            &mut ReplayCompact(fields[..len].iter(), Some(string.to_vec())),
            2,
        )
    };
    let again = load(fields.len(), &string);
    assert_eq!(again.as_ref(), Some(state), "encoding 2 changed the state");
    let mut rewritten = Compact::default();
    again.unwrap().encode(&mut rewritten);
    assert_eq!(
        (&rewritten.0, rewritten.1.as_deref()),
        (&fields, Some(&string[..])),
        "encoding 2 written back differs"
    );
    for len in 0..fields.len() {
        assert!(load(len, &string).is_none(), "a truncated state loaded");
    }
    if string.len() <= 64 {
        for cut in 0..string.len() {
            assert!(
                load(fields.len(), &string[..cut]).is_none(),
                "a cut string loaded"
            );
        }
        let text: Vec<String> = fields.iter().map(u64::to_string).collect();
        let mut args: Vec<&[u8]> = text.iter().map(String::as_bytes).collect();
        args.push(&string);
        assert_eq!(
            decode_args::<L::State>(&args, 2).as_ref(),
            Some(state),
            "RL.SETSTATE's encoding 2 changed the state"
        );
    }
}

/// Reads up to [`MAX_STEPS`] steps of (time, request) from `input`; the
/// first is the call itself, at `now`. Times stay within what the server can
/// see (`AT` is at most 2^62 us) but may go backwards. A step's request word
/// holds the kind in its top two bits (`COST`, `COST`, `COST n FORCE`,
/// `REFUND n`) and the units below them.
fn read_steps(input: &mut Bytes, now: Micros, first: Request) -> Vec<(Micros, Request)> {
    let mut steps = vec![(now, first)];
    let mut now = now.as_us();
    while steps.len() < MAX_STEPS {
        let (Some(moved), Some(word)) = (input.take(), input.take()) else {
            break;
        };
        let amount = moved >> 2;
        now = match moved & 3 {
            0 => now.saturating_add(amount),
            1 => now.saturating_sub(amount),
            2 => now.saturating_add(amount.saturating_mul(1000)),
            _ => amount,
        }
        .min(MAX_AT_US);
        let units = (word & ((1 << 62) - 1)) % (MAX_PARAM + 1);
        // A quarter of the plain calls ask `UPTO` (its n at least 1).
        let request = match word >> 62 {
            2 => Request::Force(units),
            3 => Request::Refund(units),
            1 if units & 1 == 1 => Request::UpTo((units >> 1).max(1)),
            _ => Request::Cost(units),
        };
        steps.push((Micros::from_us(now), request));
    }
    steps
}

/// Runs the steps of one spec, from a fresh state.
fn run_spec(spec: &Spec, steps: &[(Micros, Request)]) {
    with_algorithm!(*spec, L, p => run_fresh::<L>(&p, steps));
    // A spec survives being written as words and parsed back (policy GET,
    // RL.ALL propagation).
    let texts: Vec<String> = spec
        .params()
        .as_slice()
        .iter()
        .map(u64::to_string)
        .collect();
    let mut words: Vec<&[u8]> = vec![spec.name().as_bytes()];
    words.extend(texts.iter().map(String::as_bytes));
    assert_eq!(Spec::parse(&words, Site::Policy), Ok((*spec, words.len())));
}

/// The core crate's contract on `steps` from `state`; every changed state
/// must also survive the module's RDB and AOF forms.
fn run_steps<L: Listed + Guarantee>(
    state: &mut L::State,
    params: &L::Params,
    steps: &[(Micros, Request)],
) {
    contract::run_steps::<L>(state, params, steps, &mut check_round_trip::<L>);
}

/// The same from an idle limiter, with the algorithm's own guarantee.
fn run_fresh<L: Listed + Guarantee>(params: &L::Params, steps: &[(Micros, Request)]) {
    contract::run_fresh::<L>(params, steps, &mut check_round_trip::<L>);
}

/// `FUZZ_TRACE=1` prints every call (to read a crash: `FUZZ_TRACE=1 cargo
/// fuzz run ... <artifact>` or the replay test).
fn tracing() -> bool {
    static TRACE: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *TRACE.get_or_init(|| std::env::var_os("FUZZ_TRACE").is_some())
}

//! Fuzz entry points: plain functions over bytes, called by the cargo-fuzz
//! targets in `fuzz/` and, in `cargo test`, by a test that replays the whole
//! seed corpus and every saved regression (see `docs/fuzzing.md`).
//!
//! - [`command`] turns bytes into the argv of one command and runs the real
//!   parser of that command on it, then the algorithm of every limiter call
//!   that parses, on a fresh state and on a state decoded from the same
//!   bytes, at fuzzed times (backwards too), asserting the algorithms'
//!   contract at every step.
//! - [`rdb`] feeds bytes to the RDB loaders of the five native types (and of
//!   the policies), at encodings 0, 1 and 2: whatever they accept must
//!   re-encode to the very same state and be safe to run.
//!
//! A broken invariant is a panic, which libFuzzer reports as a crash.

use std::cell::RefCell;

use crate::algorithms::{for_each_algorithm, with_algorithm, Listed, Site, Spec, COUNT};
use crate::args::{Params, MAX_AT_US};
use crate::commands::host::Origin;
use crate::commands::memory::{Called, Memory};
use crate::datatype::{decode_args, Decoder, Encoder, NativeState};
use crate::error::Error;
use crate::limiter::contract::{self, Guarantee};
use crate::limiter::{Micros, Request, MAX_PARAM};
use crate::policy;

/// A realistic "now" (November 2023) for calls without `AT`.
pub const T0_US: u64 = 1_700_000_000_123_456;

/// Steps of one fuzzed run: enough to fill, drain and step back.
const MAX_STEPS: usize = 32;

// ---------------------------------------------------------------------------
// The byte decoder: small and edge values are one byte away.

/// Values one tag byte away: the edges of every bound in the module.
const SPECIAL: [u64; 32] = [
    u64::MAX,
    u64::MAX - 1,
    i64::MAX as u64,
    1 << 63,
    (1 << 62) + 1,
    1 << 62,
    (1 << 61) + 1,
    (1 << 52) + 1,
    1 << 52,
    (1 << 52) - 1,
    1 << 50,
    (1 << 50) + 1,
    (1 << 40) + 1,
    1 << 40,
    (1 << 40) - 1,
    (1 << 24) + 1,
    1 << 24,
    (1 << 24) - 1,
    u32::MAX as u64,
    1_000_001,
    1_000_000,
    100_000,
    3600,
    3601,
    1000,
    999,
    64,
    T0_US,
    T0_US / 1000,
    T0_US / 1000 / 1000,
    60_000,
    86_400_000,
];

/// Reads fuzz bytes as a stream of `u64` (the RDB loaders' view) and byte
/// strings. A tag byte picks the form of each value:
///
/// - `0x00..=0x3f`: the value itself, 0 to 63;
/// - `0x40..=0x7f`: one of [`SPECIAL`];
/// - `0x80..=0xbf`: the next 8 bytes, little-endian;
/// - `0xc0..=0xff`: the next `(tag & 7) + 1` bytes, little-endian.
///
/// Running out of bytes is what a truncated RDB is: `None`.
pub struct Bytes<'a> {
    data: &'a [u8],
}

impl<'a> Bytes<'a> {
    pub fn new(data: &'a [u8]) -> Self {
        Bytes { data }
    }

    fn raw(&mut self, len: usize) -> Option<&'a [u8]> {
        if self.data.len() < len {
            self.data = &[];
            return None;
        }
        let (head, tail) = self.data.split_at(len);
        self.data = tail;
        Some(head)
    }

    fn little_endian(&mut self, len: usize) -> Option<u64> {
        let bytes = self.raw(len)?;
        Some(
            bytes
                .iter()
                .rev()
                .fold(0u64, |v, &b| (v << 8) | u64::from(b)),
        )
    }

    /// A byte string: a length (a value as above), then that many bytes.
    pub fn bytes(&mut self) -> Option<Vec<u8>> {
        let len = self.take()?;
        let len = usize::try_from(len).ok()?;
        self.raw(len).map(<[u8]>::to_vec)
    }
}

impl Decoder for Bytes<'_> {
    fn take(&mut self) -> Option<u64> {
        let tag = self.raw(1)?[0];
        match tag {
            0x00..=0x3f => Some(u64::from(tag)),
            0x40..=0x7f => Some(SPECIAL[usize::from(tag & 0x3f) % SPECIAL.len()]),
            0x80..=0xbf => self.little_endian(8),
            _ => self.little_endian(usize::from(tag & 7) + 1),
        }
    }
}

/// Writes `value` in the form [`Bytes`] reads, as short as it goes (for
/// seeds and regression tests).
pub fn put_value(out: &mut Vec<u8>, value: u64) {
    if value < 0x40 {
        out.push(value as u8);
    } else if let Some(i) = SPECIAL.iter().position(|&s| s == value) {
        out.push(0x40 | i as u8);
    } else {
        let len = (8 - value.leading_zeros() as usize / 8).max(1);
        out.push(0xc0 | (len as u8 - 1));
        out.extend_from_slice(&value.to_le_bytes()[..len]);
    }
}

/// Writes a byte string in the form [`Bytes::bytes`] reads.
pub fn put_bytes(out: &mut Vec<u8>, bytes: &[u8]) {
    put_value(out, bytes.len() as u64);
    out.extend_from_slice(bytes);
}

struct Fields(Vec<u64>);

impl Encoder for Fields {
    fn put(&mut self, value: u64) {
        self.0.push(value);
    }
}

struct Replay<'a>(std::slice::Iter<'a, u64>);

impl Decoder for Replay<'_> {
    fn take(&mut self) -> Option<u64> {
        self.0.next().copied()
    }
}

// ---------------------------------------------------------------------------
// The commands.

/// The commands of the module, as the first byte of a `command` input picks
/// them (its low four bits; bit 0x10 says the call comes from the master or
/// the AOF, where `AT` and `RL.SETSTATE` are allowed): first the command of
/// every row of the table of algorithms, in order (0 to [`COUNT`] - 1), then
/// these, from [`COUNT`] on.
pub const OTHER_COMMANDS: [&str; 11] = [
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
];

/// Bit of the selector byte: the call comes from the master link or the AOF.
pub const REPLICATED: u8 = 0x10;

/// Bit of the selector byte: the server is out of memory under
/// `noeviction` (for the call itself; the steps after it run without).
pub const OUT_OF_MEMORY: u8 = 0x20;

/// The selector of `RL.SETSTATE`.
pub const SETSTATE: u8 = COUNT as u8 + 8;

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
    let pick = usize::from(selector & 0x0f);
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
    // What RL.POLICY SET and DEL changed, back to the fixed policies.
    if matches!(pick - COUNT, 2 | 4) {
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
            replica.set_now(master.now());
            let again = replica.replay(&called.effects.propagated);
            assert_eq!(
                again, called.effects.propagated,
                "a replayed call propagated otherwise"
            );
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
pub const POLICIES: [(&str, &str); 5] = [
    ("tb", "TOKENBUCKET 5 5 1000"),
    ("fw", "FIXEDWINDOW 3 1000 MODE SHADOW"),
    ("lb", "LEAKYBUCKET 4 1 250 ROLLOUT 50"),
    ("sl", "SLIDING 10 1000 MODE OFF"),
    ("hw", "HASHWINDOW 10 6000 1000"),
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
/// data), `data[0] / (COUNT + 1) % 3` the
/// encoding version Redis passes (0, 1 or 2; only 1 exists; the aux loader
/// ignores it, its payload carries its own version); the rest is read by
/// [`Bytes`]. What a loader accepts must re-encode to the very same fields,
/// refuse every truncation of them, and run safely.
pub fn rdb(data: &[u8]) {
    let Some((&selector, rest)) = data.split_first() else {
        return;
    };
    let types = COUNT + 1;
    let encoding = (usize::from(selector) / types % 3) as i32;
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

/// Decodes a state; one that is accepted must be at the current encoding,
/// re-encode to the same state (RDB and AOF forms), and refuse every
/// truncation of its fields.
fn decode_checked<L: Listed>(input: &mut Bytes, encoding: i32) -> Option<L::State> {
    let state = L::State::decode(input, encoding)?;
    assert_eq!(
        encoding,
        L::encoding(),
        "a state loaded at an unknown encoding"
    );
    check_round_trip::<L>(&state);
    Some(state)
}

/// Encode, then decode: the same state, from the RDB fields and from the
/// AOF's decimal arguments; and no prefix of the fields loads.
fn check_round_trip<L: Listed>(state: &L::State) {
    let encoding = L::encoding();
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
        let request = match word >> 62 {
            2 => Request::Force(units),
            3 => Request::Refund(units),
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::algorithms::word;
    use crate::limiter::{
        Algorithm, FixedWindow, HashWindow, LeakyBucket, SlidingLog, TokenBucket,
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
            // and its RDB form, with parameters and steps to run it on
            for encoding in 0..3u8 {
                let mut rdb = vec![selector + (COUNT as u8 + 1) * encoding];
                rdb.extend_from_slice(&state_bytes(&state));
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
        let traffic = steps_bytes(&TRAFFIC);
        for text in [
            "2 a b TOKENBUCKET 5 5 1000 FIXEDWINDOW 3 1000",
            "1 a POLICY tb COST 2",
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
        ] {
            command_seeds.push(cmd(5, text, &traffic));
        }
        command_seeds.push(cmd(5 | REPLICATED, "1 a SLIDING 100001 1000", &traffic));
        for text in [
            "tb k",
            "fw k COST 4",
            "lb k COST 0",
            "sl k",
            "hw k COST 11",
            "nope k",
            "tb k AT 1",
            "tb",
        ] {
            command_seeds.push(cmd(6, text, &traffic));
        }
        for text in [
            "p1 TOKENBUCKET 5 5 1000",
            "p2 FIXEDWINDOW 10 1000 MODE SHADOW ROLLOUT 30",
            "p:3 HASHWINDOW 10 60000 1000 MODE off",
            "p.4 LEAKYBUCKET 5 1 100 rollout 0 mode enforce",
            "p_5 SLIDING 3 1000",
            "bad\x00name SLIDING 1 1",
            "p LEAKYBUCKET 5 1 100 ROLLOUT 101",
            "p SLIDING 100001 1000",
            "p TOKENBUCKET 5 5",
            "p FOO 1 2 3",
            "p FIXEDWINDOW 1 1 MODE",
            "p FIXEDWINDOW 1 1 MODE LOUD",
            "p FIXEDWINDOW 1 1 MODE OFF MODE OFF",
        ] {
            command_seeds.push(cmd(7, text, &traffic));
        }
        command_seeds.push(cmd(7 | REPLICATED, "p SLIDING 16777215 1000", &traffic));
        command_seeds.push(cmd(8, "tb", &[]));
        command_seeds.push(cmd(9, "zz", &[]));
        command_seeds.push(cmd(10, "", &[]));
        for text in ["", "10", "0", "4294967295", "4294967296", "1 2"] {
            command_seeds.push(cmd(11, text, &[]));
        }
        command_seeds.push(cmd(12, "", &[]));
        for text in [
            "k TOKENBUCKET 1 1700000000000000 0 5 1000",
            "k FOO 1 1 2",
            "k SLIDING 2 0 0 0 0",
            "k HASHWINDOW 1 1000 5 0 2 0 0",
            "k fixedwindow 1 1 2 3",
        ] {
            command_seeds.push(cmd(SETSTATE | REPLICATED, text, &traffic));
            command_seeds.push(cmd(13, text, &[]));
        }
        for text in [
            "sliding-max-limit 5000",
            "ratelimit.hashwindow-max-buckets 60 log-max-len 0",
            "foo 1",
            "log-max-len",
            "sliding-max-limit 0",
            "hashwindow-max-buckets 1000001",
        ] {
            command_seeds.push(cmd(14, text, &[]));
        }
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
}

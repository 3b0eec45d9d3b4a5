//! Module configs: `ratelimit.*`, readable and settable with `CONFIG GET/SET`,
//! in redis.conf or on the command line (`--ratelimit.sliding-max-limit 5000`),
//! and as load arguments (`loadmodule /path/lib.so sliding-max-limit 5000`;
//! a value in redis.conf or on the command line wins over a load argument).
//!
//! They bound what clients may ask of one key (a replicated or AOF call is
//! never refused by them: the master already accepted it), and one,
//! `write-encoding`, fixes at load the encoding the native types write.

use std::sync::atomic::{AtomicU64, Ordering};

use crate::blocking;
use crate::deny_log;
use crate::ffi::NumericConfig;
use crate::limiter::sliding_log;

/// Largest `limit` of `RL.SLIDING` (each held unit costs up to 8 bytes):
/// the bound its row in the table of algorithms puts on a call.
pub static SLIDING_MAX_LIMIT: NumericConfig = NumericConfig {
    name: c"sliding-max-limit",
    value: &SLIDING_MAX_LIMIT_VALUE,
    min: 1,
    max: sliding_log::MAX_LIMIT,
    changed: None,
    immutable: false,
};
static SLIDING_MAX_LIMIT_VALUE: AtomicU64 = AtomicU64::new(100_000);

/// Largest `window_ms / bucket_ms` of `RL.HASHWINDOW` (2 to 8 bytes per
/// bucket, as its counts need): the bound its row puts on a call.
pub static HASHWINDOW_MAX_BUCKETS: NumericConfig = NumericConfig {
    name: c"hashwindow-max-buckets",
    value: &HASHWINDOW_MAX_BUCKETS_VALUE,
    min: 1,
    max: 1_000_000,
    changed: None,
    immutable: false,
};
static HASHWINDOW_MAX_BUCKETS_VALUE: AtomicU64 = AtomicU64::new(3600);

/// The encoding every native type writes (RDB, `DUMP`), at most its newest:
/// 2 (the default) writes the newest encodings, 1 pins every type to
/// encoding 1, which release 0.1.0 reads (for a rolling upgrade, or before
/// a downgrade). A type's encoding version is fixed when it is registered,
/// so this is read at load only (immutable). Loaders read every encoding.
pub static WRITE_ENCODING: AtomicU64 = AtomicU64::new(2);

/// Every config the module registers (names without the `ratelimit.`
/// prefix).
pub static NUMERIC: [&NumericConfig; 5] = [
    &SLIDING_MAX_LIMIT,
    &HASHWINDOW_MAX_BUCKETS,
    &NumericConfig {
        name: c"log-max-len",
        value: &deny_log::MAX_LEN,
        min: 0,
        max: 1_000_000,
        changed: Some(|max_len| deny_log::trim(max_len as usize)),
        immutable: false,
    },
    &NumericConfig {
        name: c"max-blocked",
        value: &blocking::MAX_BLOCKED,
        min: 0,
        max: 1_000_000,
        changed: None,
        immutable: false,
    },
    &NumericConfig {
        name: c"write-encoding",
        value: &WRITE_ENCODING,
        min: 1,
        max: 2,
        changed: None,
        immutable: true,
    },
];

/// Current value of a config.
pub fn get(value: &AtomicU64) -> u64 {
    value.load(Ordering::Relaxed)
}

/// `ratelimit.write-encoding`: the newest encoding a type may write.
pub fn write_encoding() -> i32 {
    get(&WRITE_ENCODING) as i32
}

/// Applies `name value` pairs given as load arguments (before registration,
/// so they become the defaults). Nothing is applied if any pair is wrong.
pub fn apply_load_arguments(args: &[&[u8]]) -> Result<(), String> {
    for (value, parsed) in parse_load_arguments(args)? {
        value.store(parsed, Ordering::Relaxed);
    }
    Ok(())
}

/// Checks load arguments and says which config takes which value, without
/// changing anything (pure, so that it can be tested and fuzzed alone).
pub fn parse_load_arguments(args: &[&[u8]]) -> Result<Vec<(&'static AtomicU64, u64)>, String> {
    if !args.len().is_multiple_of(2) {
        return Err("load arguments come in pairs: <config> <value>".into());
    }
    let mut parsed = Vec::with_capacity(args.len() / 2);
    for pair in args.chunks(2) {
        let name = pair[0].strip_prefix(b"ratelimit.").unwrap_or(pair[0]);
        let config = NUMERIC
            .iter()
            .find(|c| c.name.to_bytes().eq_ignore_ascii_case(name))
            .ok_or_else(|| format!("unknown config '{}'", crate::error::Error::quote(pair[0])))?;
        let value =
            crate::args::parse_int(pair[1], "value", config.min, config.max).map_err(|e| {
                format!(
                    "ratelimit.{}: {}",
                    config.name.to_string_lossy(),
                    e.message()
                )
            })?;
        parsed.push((config.value, value));
    }
    Ok(parsed)
}

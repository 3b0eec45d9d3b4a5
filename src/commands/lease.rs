//! The commands that come with an algorithm of leases (`RL.CONCURRENCY`):
//! `RL.RELEASE key lease` and `RL.RENEW key lease lease_ms`, one generic
//! step each.
//!
//! Both read the clock (whether a lease is still live, when a renewed one
//! ends), so they propagate with the master's time pinned,
//! `RL.RELEASE key lease AT <unix_us>`, like the limiter calls; a call that
//! ends or renews nothing (an unknown or ended lease, a missing key) answers
//! 0 and writes, expires and propagates nothing.

use super::host::{Host, Origin, Store};
use super::MAX_ARGS;
use crate::algorithms::{Companion, Listed};
use crate::args::{parse_int, MAX_AT_US};
use crate::error::Error;
use crate::limiter::{Micros, MAX_PARAM};

/// The largest lease id a call may name (ids are positive `i64`s).
const MAX_LEASE: u64 = i64::MAX as u64;

/// `RL.RELEASE key lease` or `RL.RENEW key lease lease_ms` on the leases
/// of algorithm `L`.
pub fn step<L: Listed, H: Host>(host: &H, which: Companion) -> Result<(), Error> {
    let fixed = match which {
        Companion::Release => 3,
        Companion::Renew => 4,
    };
    if host.argc() < fixed {
        return Err(Error::Arity);
    }
    let args = host.words::<MAX_ARGS>()?;
    let lease = parse_int(args[2], "lease", 0, MAX_LEASE)?;
    let lease_ms = match which {
        Companion::Release => 0,
        Companion::Renew => parse_int(args[3], "lease_ms", 1, MAX_PARAM)?,
    };
    let at = parse_at(&args[fixed..])?;
    if at.is_some() && host.origin() == Origin::Client {
        return Err(Error::ReservedForReplication("AT"));
    }
    let now = at.unwrap_or_else(|| host.now());
    let mut key = host.open_key(1);
    let ended = key.with_state::<L, _>(|state| match which {
        Companion::Release => L::release(state, lease, now),
        Companion::Renew => L::renew(state, lease, lease_ms, now),
    })?;
    let done = match ended.flatten() {
        Some(idle_at) => {
            let expiry_written = key.expires_at() != Some(idle_at);
            if expiry_written {
                key.expire_at(idle_at);
            }
            let command = name(which);
            host.propagate_pinned(command, 1..fixed, now);
            key.written(event(which), expiry_written);
            if which == Companion::Release {
                // A blocked acquirer may go at once.
                host.signal_ready(1);
            }
            true
        }
        None => false,
    };
    drop(key);
    host.reply_integer(done as i64);
    Ok(())
}

/// `[AT unix_us]`, the only option (from the master and the AOF).
fn parse_at(rest: &[&[u8]]) -> Result<Option<Micros>, Error> {
    match rest {
        [] => Ok(None),
        [name, rest @ ..] if name.eq_ignore_ascii_case(b"AT") => {
            let value = rest.first().ok_or(Error::MissingValue("AT"))?;
            let at = Micros::from_us(parse_int(value, "AT", 0, MAX_AT_US)?);
            match rest.get(1) {
                None => Ok(Some(at)),
                Some(extra) if extra.eq_ignore_ascii_case(b"AT") => {
                    Err(Error::DuplicateOption("AT"))
                }
                Some(extra) => Err(no_option(extra)),
            }
        }
        [other, ..] => Err(no_option(other)),
    }
}

/// An argument after the fixed ones: the commands take no option.
fn no_option(word: &[u8]) -> Error {
    Error::Syntax(format!(
        "unknown option '{}' (this command takes no options)",
        Error::quote(word)
    ))
}

/// The command's name.
pub const fn name(which: Companion) -> &'static std::ffi::CStr {
    match which {
        Companion::Release => c"RL.RELEASE",
        Companion::Renew => c"RL.RENEW",
    }
}

/// Its keyspace event.
const fn event(which: Companion) -> &'static std::ffi::CStr {
    match which {
        Companion::Release => c"rl.release",
        Companion::Renew => c"rl.renew",
    }
}

pub fn release<L: Listed, H: Host>(host: &H) -> Result<(), Error> {
    step::<L, H>(host, Companion::Release)
}

pub fn renew<L: Listed, H: Host>(host: &H) -> Result<(), Error> {
    step::<L, H>(host, Companion::Renew)
}

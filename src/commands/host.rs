//! The command seam: what a command needs from the server, as a trait.
//!
//! Every handler is a pure step, `fn step<H: Host>(host: &H) -> Result<(),
//! Error>`. It reads its arguments, where the call comes from, the clock and
//! the memory pressure from the host; it reads and writes limiter keys
//! through [`Store`]; and it hands the host what to propagate and what to
//! reply. An error returned before a write leaves every key as it was (the
//! steps check everything first), and the host replies it.
//!
//! Two hosts implement the trait:
//!
//! - [`super::live::Live`]: the running server, through `crate::ffi`: what the
//!   module registers;
//! - [`super::memory::Memory`] (tests and fuzzing only): a key space in a map,
//!   with a clock, an out-of-memory switch, and a record of what each call
//!   propagated and replied, so that a step is tested without a server, and
//!   a propagated call can be replayed on a second key space (a replica).
//!
//! The trait is generic, not `dyn`: a step is compiled once per host, and
//! the live one inlines to the calls a handler written against the FFI
//! would make (the hot path allocates nothing either way).
//!
//! Why a trait of effects rather than a plan value returned by the step: a
//! limiter's state is changed in place in the key's value (a sliding log
//! holds up to `limit` entries); a plan of new states would copy it on every
//! call.

use std::ffi::CStr;
use std::ops::Range;

use crate::algorithms::Listed;
use crate::args::ParamList;
use crate::error::Error;
use crate::ffi::Words;
use crate::limiter::{Micros, Request};

/// Where a call comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Origin {
    /// A client (also a script or `MULTI`, which run as the client).
    Client,
    /// The master link or an AOF being loaded: `AT` and `RL.SETSTATE` are
    /// accepted, and the configs' bounds are not applied (the master
    /// accepted the call).
    Replicated,
}

/// How the server runs a call: as it came, or again while it is blocked
/// (`BLOCK timeout_ms`; see `crate::blocking`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Turn {
    /// The call as the client sent it.
    Call,
    /// A blocked call, retried because one of its keys was signalled (a
    /// timer, a release, a deletion): it replies when it is admitted or its
    /// deadline passed, and otherwise stays blocked.
    Retry(u64),
    /// A blocked call the server's own timeout ends: it replies now.
    Timeout(u64),
}

impl Turn {
    /// The blocked call's waiter number.
    pub fn waiter(self) -> Option<u64> {
        match self {
            Turn::Call => None,
            Turn::Retry(w) | Turn::Timeout(w) => Some(w),
        }
    }
}

/// What a step sees of the server during one call.
pub trait Host {
    /// An open key.
    type Key<'h>: Store
    where
        Self: 'h;

    /// How many arguments, the command name included.
    fn argc(&self) -> usize;

    /// The arguments as byte slices, on the stack: at most `N`, so that the
    /// hot path allocates nothing. More is the error of an unknown option
    /// (the first one beyond `N`).
    fn words<const N: usize>(&self) -> Result<Words<'_, N>, Error>;

    /// Every argument (off the hot path).
    fn all_words(&self) -> Vec<&[u8]>;

    /// Where the call comes from.
    fn origin(&self) -> Origin;

    /// Whether a new key must not be created: memory is above `maxmemory`
    /// and the server may not evict (`noeviction`). With an eviction
    /// policy, the server has just evicted before the call, as for its own
    /// `deny-oom` commands, and what is left above the limit is transient.
    fn out_of_memory(&self) -> bool;

    /// The server's clock.
    fn now(&self) -> Micros;

    // Blocking (`BLOCK timeout_ms`).

    /// How the server runs this call.
    fn turn(&self) -> Turn {
        Turn::Call
    }

    /// The call's database (a key is its database and its name).
    fn db(&self) -> i32 {
        0
    }

    /// Whether the call may block its client now: a client's own call,
    /// outside `MULTI`, scripts and functions, with room under
    /// `ratelimit.max-blocked`.
    fn may_block(&self) -> bool {
        false
    }

    /// Blocks the client on the keys at arguments `keys` as `waiter`, for
    /// `timeout_ms` (0: no limit): the call replies later, from a retry.
    fn block(&self, keys: &[usize], waiter: u64, timeout_ms: u64) {
        let _ = (keys, waiter, timeout_ms);
        unreachable!("a host that never blocks");
    }

    /// The retried call stays blocked: it replies nothing now.
    fn keep_waiting(&self) {}

    /// Signals the key at argument `arg` ready, so that the calls blocked on
    /// it are decided again (after a write that may let them in).
    fn signal_ready(&self, arg: usize) {
        let _ = arg;
    }

    /// Opens the key that is argument `arg`, for reading and writing.
    fn open_key(&self, arg: usize) -> Self::Key<'_>;

    /// Propagates a limiter call that changed a state, with the master's time
    /// pinned: `command key params... <request> AT now` (see
    /// `crate::replicate`). The key and the parameters are the call's own
    /// arguments `key` and `params`, passed on as the client sent them.
    /// A calendar quota's call also carries the end of its period (`END`).
    fn propagate_limiter(
        &self,
        command: &'static CStr,
        key: usize,
        params: Range<usize>,
        request: Request,
        now: Micros,
        end: Option<Micros>,
    );

    /// Like [`Host::propagate_limiter`], with the parameters as numbers (a
    /// policy's), asked for only if the call is propagated in full.
    fn propagate_limiter_with(
        &self,
        command: &'static CStr,
        key: usize,
        params: impl FnOnce() -> ParamList,
        request: Request,
        now: Micros,
        end: Option<Micros>,
    );

    /// Propagates a call that read the clock and takes no request, as
    /// `command <its arguments args...> AT now` (`RL.RELEASE`, `RL.RENEW`).
    fn propagate_pinned(&self, command: &'static CStr, args: Range<usize>, now: Micros);

    /// Propagates the new value and expiry of the string key at argument
    /// `key` as `SET key <value> PXAT <unix_ms>` (`CL.THROTTLE`).
    fn propagate_string_set(&self, key: usize, value: u64, expire_at_ms: u64);

    /// Propagates the call as the client sent it (a deterministic one).
    fn propagate_verbatim(&self);

    /// Propagates a policy's new scale and stage, the result of a window
    /// the master ended: `RL.LOOPSTATE <name> <scale> <stage>`, the name
    /// being the call's argument `name`.
    fn propagate_loop(&self, name: usize, scale: u64, stage: u8);

    // Replies: one reply per call, which may be an array of the next ones.

    fn reply_integer(&self, value: i64);
    /// The header of an array of `len` elements: the next `len` replies.
    fn reply_array(&self, len: usize);
    fn reply_integers(&self, values: &[i64]) {
        self.reply_array(values.len());
        for &value in values {
            self.reply_integer(value);
        }
    }
    fn reply_bulk(&self, bytes: &[u8]);
    fn reply_simple(&self, status: &'static CStr);
    fn reply_null(&self);
}

/// An open key, seen by a step.
pub trait Store {
    /// Runs `f` on the state of algorithm `L` the key holds: `Ok(None)` if the
    /// key holds nothing, `WRONGTYPE` if it holds anything else (another
    /// Redis type or another algorithm's state), without calling `f`.
    fn with_state<L: Listed, R>(
        &mut self,
        f: impl FnOnce(&mut L::State) -> R,
    ) -> Result<Option<R>, Error>;

    /// Stores `state`, replacing whatever the key held.
    fn set_state<L: Listed>(&mut self, state: L::State);

    /// Runs `f` on the bytes of the string the key holds (`CL.THROTTLE`,
    /// whose state is redis-cell's string): `Ok(None)` if the key holds
    /// nothing, `WRONGTYPE` if it holds any other type (a limiter's state
    /// included), without calling `f`.
    fn with_string<R>(&mut self, f: impl FnOnce(&[u8]) -> R) -> Result<Option<R>, Error>;

    /// Makes the key a string holding `bytes`; it held nothing or a string
    /// (checked by [`Store::with_string`] first). Its expiry is the caller's
    /// to set.
    fn set_string(&mut self, bytes: &[u8]) -> Result<(), Error>;

    /// The key's expiry, in Unix milliseconds, if it has one.
    fn expires_at(&self) -> Option<u64>;

    /// Sets the key's expiry, in Unix milliseconds.
    fn expire_at(&mut self, unix_ms: u64);

    /// Tells the server the key was written by `event` (and had its expiry
    /// set, when `expiry_written`): `WATCH`, client-side caching and
    /// keyspace notifications learn of it.
    fn written(&mut self, event: &'static CStr, expiry_written: bool);
}

//! The limiter commands (`RL.TOKENBUCKET`, `RL.FIXEDWINDOW`, ...): one generic
//! handler, instantiated per algorithm.
//!
//! Hot path: arguments are read in place, the state is mutated in place in
//! the module value (a new key is boxed only when its first request is
//! admitted), and a call that changes nothing writes, expires and propagates
//! nothing.

use std::ffi::CStr;
use std::os::raw::c_int;

use redis_module::raw;

use super::{
    from_replication_or_loading, out_of_memory, reply_decision, Args, Key, Slot, MAX_ARGS,
};
use crate::args::{parse_call, Params};
use crate::clock;
use crate::config;
use crate::datatype::NativeState;
use crate::deny_log;
use crate::error::Error;
use crate::guard;
use crate::limiter::hash_window::HashWindowParams;
use crate::limiter::sliding_log::SlidingLogParams;
use crate::limiter::{
    self, Algorithm, FixedWindow, HashWindow, LeakyBucket, Micros, Outcome, Request, SlidingLog,
    TokenBucket,
};
use crate::replicate;
use crate::stats::Outcomes;

/// An algorithm served as a command.
pub trait LimiterCommand: Algorithm<State: NativeState, Params: Params> {
    /// The command name, as propagated.
    const NAME: &'static CStr;
    /// The keyspace event of a call that changed the limiter.
    const EVENT: &'static CStr;
    /// Index in `stats::ALGORITHMS`.
    const INDEX: usize;

    /// This algorithm's counters for `INFO ratelimit`.
    fn stats() -> &'static Outcomes {
        &crate::stats::ALGORITHMS[Self::INDEX]
    }

    /// Bounds the module configs put on client calls (never on replicated
    /// ones: the master accepted them).
    fn within_configured_bounds(_params: &Self::Params) -> Result<(), Error> {
        Ok(())
    }
}

impl LimiterCommand for TokenBucket {
    const NAME: &'static CStr = c"RL.TOKENBUCKET";
    const EVENT: &'static CStr = c"rl.tokenbucket";
    const INDEX: usize = 0;
}

impl LimiterCommand for FixedWindow {
    const NAME: &'static CStr = c"RL.FIXEDWINDOW";
    const EVENT: &'static CStr = c"rl.fixedwindow";
    const INDEX: usize = 1;
}

impl LimiterCommand for LeakyBucket {
    const NAME: &'static CStr = c"RL.LEAKYBUCKET";
    const EVENT: &'static CStr = c"rl.leakybucket";
    const INDEX: usize = 2;
}

impl LimiterCommand for SlidingLog {
    const NAME: &'static CStr = c"RL.SLIDING";
    const EVENT: &'static CStr = c"rl.sliding";
    const INDEX: usize = 3;

    fn within_configured_bounds(params: &SlidingLogParams) -> Result<(), Error> {
        let max = config::get(&config::SLIDING_MAX_LIMIT);
        if params.limit() > max {
            return Err(Error::AboveConfig {
                what: "limit",
                config: "sliding-max-limit",
                max,
            });
        }
        Ok(())
    }
}

impl LimiterCommand for HashWindow {
    const NAME: &'static CStr = c"RL.HASHWINDOW";
    const EVENT: &'static CStr = c"rl.hashwindow";
    const INDEX: usize = 4;

    fn within_configured_bounds(params: &HashWindowParams) -> Result<(), Error> {
        let max = config::get(&config::HASHWINDOW_MAX_BUCKETS);
        if params.buckets() > max {
            return Err(Error::AboveConfig {
                what: "window_ms / bucket_ms",
                config: "hashwindow-max-buckets",
                max,
            });
        }
        Ok(())
    }
}

/// `RL.<ALGORITHM> key <params...> [COST n [FORCE] | REFUND n]`.
pub unsafe extern "C" fn handler<L: LimiterCommand>(
    ctx: *mut raw::RedisModuleCtx,
    argv: *mut *mut raw::RedisModuleString,
    argc: c_int,
) -> c_int {
    guard::command(ctx, || unsafe { run::<L>(ctx, argv, argc) })
}

unsafe fn run<L: LimiterCommand>(
    ctx: *mut raw::RedisModuleCtx,
    argv: *mut *mut raw::RedisModuleString,
    argc: c_int,
) -> Result<(), Error> {
    if (argc as usize) < 2 + L::Params::COUNT {
        return Err(Error::Arity);
    }
    let args = unsafe { Args::<MAX_ARGS>::new(argv, argc) }?;
    let (params, options) = parse_call::<L::Params>(&args.all()[2..])?;
    let replicated = match options.at {
        Some(_) if !from_replication_or_loading(ctx) => {
            return Err(Error::ReservedForReplication("AT"))
        }
        Some(_) => true,
        None => {
            L::within_configured_bounds(&params)?;
            false
        }
    };
    let now: Micros = options.at.unwrap_or_else(clock::now);
    let request = options.request;
    let key_name = unsafe { *argv.add(1) };
    let key = Key::open_rw(ctx, key_name);
    let applied = apply_to_key::<L>(ctx, &key, &params, request, now, !replicated)?;
    let decision = applied.outcome.decision;
    L::stats().record(&decision, request.cost());
    if !decision.allowed {
        let name = args.all()[1];
        deny_log::record(
            now.as_ms_floor(),
            name,
            &[L::NAME.to_bytes()],
            request.cost(),
            decision.wait.as_reply(),
        );
    }
    if applied.outcome.changed {
        // The client's own key and parameter strings, passed on as they are.
        let key_and_params =
            unsafe { std::slice::from_raw_parts(argv.add(1), 1 + L::Params::COUNT) };
        replicate::limiter_call(ctx, L::NAME, key_and_params, request, now);
        key.written(L::EVENT, applied.expiry_written);
    }
    drop(key);
    reply_decision(ctx, &decision);
    Ok(())
}

/// What [`apply_to_key`] did.
pub(super) struct Applied {
    pub outcome: Outcome,
    /// The key's expiry was set (the `expire` keyspace event).
    pub expiry_written: bool,
}

/// Runs a request on the limiter in `key` and, when the state changed,
/// stores it and its expiry: the one place where a limiter's state changes.
/// With `check_memory`, a request that would create the key fails with OOM
/// when the server is out of memory (see [`out_of_memory`]); replicated calls
/// and `RL.ALL` (which checks once for all its keys before changing any)
/// pass `false`.
pub(super) fn apply_to_key<L: LimiterCommand>(
    ctx: *mut raw::RedisModuleCtx,
    key: &Key,
    params: &L::Params,
    request: Request,
    now: Micros,
    check_memory: bool,
) -> Result<Applied, Error> {
    Ok(match key.slot::<L::State>()? {
        Slot::Ours(state) => {
            let state = unsafe { &mut *state };
            let idle_before = L::idle_at_ms(state, params);
            let outcome = limiter::run::<L>(state, params, request, now);
            let idle_after = L::idle_at_ms(state, params);
            // The expiry follows the idle instant. When that did not move (a
            // fixed window's moves once per window, not per call), the key
            // usually has it already: it is read, which is cheaper than
            // setting it, and set only if it differs (a PERSIST, a RESTORE
            // without TTL, or new parameters).
            let expiry_written = outcome.changed
                && (idle_after != idle_before || key.expires_at() != Some(idle_after));
            if expiry_written {
                key.expire_at(idle_after);
            }
            Applied {
                outcome,
                expiry_written,
            }
        }
        Slot::Empty => {
            let mut state = L::idle(params, now);
            let outcome = limiter::run::<L>(&mut state, params, request, now);
            if outcome.changed {
                if check_memory && out_of_memory(ctx) {
                    return Err(Error::OutOfMemory);
                }
                let idle_at = L::idle_at_ms(&state, params);
                key.set(state);
                key.expire_at(idle_at);
            }
            Applied {
                outcome,
                expiry_written: outcome.changed,
            }
        }
    })
}

/// What a request would get on the limiter in `key`, changing nothing, and
/// whether the key holds nothing yet.
pub(super) fn decide_on_key<L: LimiterCommand>(
    key: &Key,
    params: &L::Params,
    request: Request,
    now: Micros,
) -> Result<(Outcome, bool), Error> {
    Ok(match key.slot::<L::State>()? {
        Slot::Ours(state) => (
            limiter::decide::<L>(unsafe { &*state }, params, request, now),
            false,
        ),
        Slot::Empty => (
            limiter::decide::<L>(&L::idle(params, now), params, request, now),
            true,
        ),
    })
}

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
    from_replication_or_loading, out_of_memory, reply_decision, signal_modified, Args, Key, Slot,
    MAX_ARGS,
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
    Algorithm, FixedWindow, HashWindow, LeakyBucket, Micros, SlidingLog, TokenBucket,
};
use crate::replicate;
use crate::stats::Outcomes;

/// An algorithm served as a command.
pub trait LimiterCommand: Algorithm<State: NativeState, Params: Params> {
    /// The command name, as propagated.
    const NAME: &'static CStr;
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
    const INDEX: usize = 0;
}

impl LimiterCommand for FixedWindow {
    const NAME: &'static CStr = c"RL.FIXEDWINDOW";
    const INDEX: usize = 1;
}

impl LimiterCommand for LeakyBucket {
    const NAME: &'static CStr = c"RL.LEAKYBUCKET";
    const INDEX: usize = 2;
}

impl LimiterCommand for SlidingLog {
    const NAME: &'static CStr = c"RL.SLIDING";
    const INDEX: usize = 3;

    fn within_configured_bounds(params: &SlidingLogParams) -> Result<(), Error> {
        let max = config::get(&config::SLIDING_MAX_LIMIT);
        if params.limit > max {
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

/// `RL.<ALGORITHM> key <params...> [COST n]`.
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
    let cost = options.cost;
    let key_name = unsafe { *argv.add(1) };
    let key = Key::open_rw(ctx, key_name);
    let decision = apply_to_key::<L>(ctx, &key, &params, cost, now, replicated)?;
    L::stats().record(&decision, cost);
    if !decision.allowed {
        let name = args.all()[1];
        deny_log::record(
            now.as_ms_floor(),
            name,
            &[L::NAME.to_bytes()],
            cost,
            decision.wait.as_reply(),
        );
    }
    if decision.allowed && cost > 0 {
        // The client's own key and parameter strings, passed on as they are.
        let key_and_params =
            unsafe { std::slice::from_raw_parts(argv.add(1), 1 + L::Params::COUNT) };
        replicate::limiter_call(ctx, L::NAME, key_and_params, cost, now);
        signal_modified(ctx, key_name);
    }
    drop(key);
    reply_decision(ctx, &decision);
    Ok(())
}

/// Decides a request on the limiter in `key` and, when it is admitted with a
/// cost, stores the new state and its expiry: the one place where a
/// limiter's state changes.
pub(super) fn apply_to_key<L: LimiterCommand>(
    ctx: *mut raw::RedisModuleCtx,
    key: &Key,
    params: &L::Params,
    cost: u64,
    now: Micros,
    replicated: bool,
) -> Result<crate::limiter::Decision, Error> {
    Ok(match key.slot::<L::State>()? {
        Slot::Ours(state) => {
            let state = unsafe { &mut *state };
            let idle_before = L::idle_at_ms(state, params);
            let decision = L::apply(state, params, cost, now);
            let idle_after = L::idle_at_ms(state, params);
            // The expiry follows the idle instant. When that did not move (a
            // fixed window's moves once per window, not per call), the key
            // usually has it already: it is read, which is cheaper than
            // setting it, and set only if it differs (a PERSIST, a RESTORE
            // without TTL, or new parameters).
            if decision.allowed
                && cost > 0
                && (idle_after != idle_before || key.expires_at() != Some(idle_after))
            {
                key.expire_at(idle_after);
            }
            decision
        }
        Slot::Empty => {
            let mut state = L::idle(params, now);
            let decision = L::apply(&mut state, params, cost, now);
            if decision.allowed && cost > 0 {
                if !replicated && out_of_memory(ctx) {
                    return Err(Error::OutOfMemory);
                }
                let idle_at = L::idle_at_ms(&state, params);
                key.set(state);
                key.expire_at(idle_at);
            }
            decision
        }
    })
}

/// The decision a request would get on the limiter in `key`, changing nothing.
pub(super) fn decide_on_key<L: LimiterCommand>(
    key: &Key,
    params: &L::Params,
    cost: u64,
    now: Micros,
) -> Result<crate::limiter::Decision, Error> {
    Ok(match key.slot::<L::State>()? {
        Slot::Ours(state) => L::decide(unsafe { &*state }, params, cost, now),
        Slot::Empty => L::decide(&L::idle(params, now), params, cost, now),
    })
}

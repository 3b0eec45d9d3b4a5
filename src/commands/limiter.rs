//! The limiter commands (`RL.TOKENBUCKET`, `RL.FIXEDWINDOW`, ...): one generic
//! handler, instantiated per row of the table of algorithms.
//!
//! Hot path: arguments are read in place, the state is mutated in place in
//! the module value (a new key is boxed only when its first request is
//! admitted), and a call that changes nothing writes, expires and propagates
//! nothing.

use super::{out_of_memory, MAX_ARGS};
use crate::algorithms::Listed;
use crate::args::{parse_call, Params};
use crate::clock;
use crate::deny_log;
use crate::error::Error;
use crate::ffi::{Argv, Context, Key, Slot};
use crate::limiter::{self, Micros, Outcome, Request};
use crate::replicate;

/// `RL.<ALGORITHM> key <params...> [COST n [FORCE] | REFUND n]`.
pub fn run<L: Listed>(ctx: &Context, argv: &Argv) -> Result<(), Error> {
    if argv.len() < 2 + L::Params::COUNT {
        return Err(Error::Arity);
    }
    let args = argv.words::<MAX_ARGS>()?;
    let (params, options) = parse_call::<L::Params>(&args[2..])?;
    let replicated = match options.at {
        Some(_) if !ctx.replicated_or_loading() => return Err(Error::ReservedForReplication("AT")),
        Some(_) => true,
        None => {
            (L::ROW.bounds)(&params)?;
            false
        }
    };
    let now: Micros = options.at.unwrap_or_else(clock::now);
    let request = options.request;
    let mut key = ctx.open_key(argv.string(1));
    let applied = apply_to_key::<L>(ctx, &mut key, &params, request, now, !replicated)?;
    let decision = applied.outcome.decision;
    L::stats().record(&decision, request.cost());
    if !decision.allowed {
        deny_log::record(
            now.as_ms_floor(),
            args[1],
            &[L::ROW.command.to_bytes()],
            request.cost(),
            decision.wait.as_reply(),
        );
    }
    if applied.outcome.changed {
        // The client's own key and parameter strings, passed on as they are.
        let key_and_params = &argv.strings()[1..2 + L::Params::COUNT];
        replicate::limiter_call(ctx, L::ROW.command, key_and_params, request, now);
        key.written(L::EVENT, applied.expiry_written);
    }
    drop(key);
    (L::ROW.reply)(ctx, &decision);
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
pub(super) fn apply_to_key<L: Listed>(
    ctx: &Context,
    key: &mut Key,
    params: &L::Params,
    request: Request,
    now: Micros,
    check_memory: bool,
) -> Result<Applied, Error> {
    let kind = L::data_type();
    let existing = key.with_value(kind, |slot| match slot {
        Slot::Ours(state) => {
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
            Some(Applied {
                outcome,
                expiry_written,
            })
        }
        Slot::Empty => None,
    })?;
    if let Some(applied) = existing {
        return Ok(applied);
    }
    let mut state = L::idle(params, now);
    let outcome = limiter::run::<L>(&mut state, params, request, now);
    if outcome.changed {
        if check_memory && out_of_memory(ctx) {
            return Err(Error::OutOfMemory);
        }
        let idle_at = L::idle_at_ms(&state, params);
        key.set_value(kind, state);
        key.expire_at(idle_at);
    }
    Ok(Applied {
        outcome,
        expiry_written: outcome.changed,
    })
}

/// What a request would get on the limiter in `key`, changing nothing, and
/// whether the key holds nothing yet.
pub(super) fn decide_on_key<L: Listed>(
    key: &Key,
    params: &L::Params,
    request: Request,
    now: Micros,
) -> Result<(Outcome, bool), Error> {
    key.with_value(L::data_type(), |slot| match slot {
        Slot::Ours(state) => (limiter::decide::<L>(state, params, request, now), false),
        Slot::Empty => (
            limiter::decide::<L>(&L::idle(params, now), params, request, now),
            true,
        ),
    })
}

//! `RL.ALL numkeys key [key ...] <spec> [<spec> ...] [COST n]`: several
//! limiters, all or nothing.
//!
//! Every limiter first decides without changing anything; only if all of them
//! admit are the units taken from each (and each change propagated, as its
//! own pinned single-limiter call, which Redis wraps in one MULTI/EXEC for
//! the replicas and the AOF). A denial anywhere changes nothing anywhere: a
//! user denied by a global limit keeps their own tokens.
//!
//! A spec is an algorithm name and its parameters, as after the key of the
//! single-limiter command (`TOKENBUCKET 5 5 1000`), or `POLICY name`.

use std::os::raw::c_int;

use redis_module::raw;

use super::limiter::{apply_to_key, decide_on_key, LimiterCommand};
use super::spec::{with_algorithm, Spec};
use super::{from_replication_or_loading, signal_modified, Args, Key};
use crate::api;
use crate::args::{parse_int, parse_options};
use crate::clock;
use crate::error::Error;
use crate::guard;
use crate::limiter::{Decision, Micros, Wait};
use crate::replicate;

/// Most limiters in one call.
pub const MAX_KEYS: usize = 16;
/// Most arguments of one call.
const MAX_ARGS: usize = 96;

/// `RL.ALL`.
///
/// # Safety
/// Called by Redis with a valid context and `argc` arguments.
pub unsafe extern "C" fn handler(
    ctx: *mut raw::RedisModuleCtx,
    argv: *mut *mut raw::RedisModuleString,
    argc: c_int,
) -> c_int {
    guard::command(ctx, || unsafe { run(ctx, argv, argc) })
}

unsafe fn run(
    ctx: *mut raw::RedisModuleCtx,
    argv: *mut *mut raw::RedisModuleString,
    argc: c_int,
) -> Result<(), Error> {
    let args = unsafe { Args::<MAX_ARGS>::new(argv, argc) }?;
    let all = args.all();
    if all.len() < 4 {
        return Err(Error::Arity);
    }
    let numkeys = parse_int(all[1], "numkeys", 1, MAX_KEYS as u64)? as usize;
    if all.len() < 2 + 2 * numkeys {
        return Err(Error::Arity);
    }
    let keys = &all[2..2 + numkeys];
    for (i, key) in keys.iter().enumerate() {
        if keys[..i].contains(key) {
            return Err(Error::Syntax(format!(
                "key '{}' is given more than once",
                Error::quote(key)
            )));
        }
    }
    // Specs, then options.
    let mut specs: [Option<(Spec, usize)>; MAX_KEYS] = [None; MAX_KEYS];
    let mut cursor = 2 + numkeys;
    for (i, slot) in specs.iter_mut().enumerate().take(numkeys) {
        if cursor >= all.len() {
            return Err(Error::Syntax(format!(
                "{numkeys} keys need {numkeys} specs, got {i}"
            )));
        }
        if all[cursor].eq_ignore_ascii_case(b"POLICY") {
            let name = all.get(cursor + 1).copied().unwrap_or_default();
            return Err(Error::UnknownPolicy(Error::quote(name)));
        }
        let (spec, words) = Spec::parse_in_call(&all[cursor..], i + 1)?;
        *slot = Some((spec, cursor));
        cursor += words;
    }
    let options = parse_options(&all[cursor..])?;
    if options.at.is_some() {
        // RL.ALL is never propagated as such: each limiter goes out on its own.
        return Err(Error::ReservedForReplication("AT"));
    }
    let replicated = from_replication_or_loading(ctx);
    if !replicated {
        for (spec, _) in specs.iter().flatten() {
            with_algorithm!(*spec, L, p => L::within_configured_bounds(&p))?;
        }
    }
    let now: Micros = clock::now();
    let cost = options.cost;

    // Decide everywhere first; nothing changes yet.
    let key_name = |i: usize| unsafe { *argv.add(2 + i) };
    let opened: Vec<Key> = (0..numkeys)
        .map(|i| Key::open_rw(ctx, key_name(i)))
        .collect();
    let mut decisions = [None; MAX_KEYS];
    for i in 0..numkeys {
        let (spec, _) = specs[i].expect("parsed");
        decisions[i] =
            Some(with_algorithm!(spec, L, p => decide_on_key::<L>(&opened[i], &p, cost, now))?);
    }
    let decisions: Vec<Decision> = decisions
        .iter()
        .take(numkeys)
        .map(|d| d.expect("decided"))
        .collect();
    let denied_by = decisions.iter().position(|d| !d.allowed);

    if denied_by.is_none() && cost > 0 {
        for i in 0..numkeys {
            let (spec, start) = specs[i].expect("parsed");
            let applied = with_algorithm!(spec, L, p => apply_to_key::<L>(ctx, &opened[i], &p, cost, now, replicated))?;
            debug_assert_eq!(applied, decisions[i]);
            let words = spec.param_count();
            let mut key_and_params = [std::ptr::null_mut(); 5];
            key_and_params[0] = key_name(i);
            for w in 0..words {
                key_and_params[1 + w] = unsafe { *argv.add(start + 1 + w) };
            }
            let command = with_algorithm!(spec, L, _p => L::NAME);
            replicate::limiter_call(ctx, command, &key_and_params[..1 + words], cost, now);
            signal_modified(ctx, key_name(i));
        }
    }
    drop(opened);
    reply(ctx, &decisions, denied_by);
    Ok(())
}

/// The five integers of the most restrictive limiter, then `denied_by`.
///
/// Admitted: the limiter with the fewest units left, with `wait_ms` the
/// longest queueing delay of any shaping limiter in the call. Denied: the
/// limiter that makes the caller wait longest (never, if any can never
/// admit).
fn reply(ctx: *mut raw::RedisModuleCtx, decisions: &[Decision], denied_by: Option<usize>) {
    let wait_rank = |w: Wait| match w {
        Wait::Never => u64::MAX,
        Wait::Ms(ms) => ms,
    };
    let mut chosen = match denied_by {
        None => *decisions
            .iter()
            .min_by_key(|d| d.remaining)
            .expect("at least one limiter"),
        Some(_) => *decisions
            .iter()
            .max_by_key(|d| wait_rank(d.wait))
            .expect("at least one limiter"),
    };
    if denied_by.is_none() {
        chosen.wait = decisions
            .iter()
            .map(|d| d.wait)
            .max_by_key(|&w| wait_rank(w))
            .unwrap_or(Wait::Ms(0));
    }
    let reply = api!(RedisModule_ReplyWithLongLong);
    unsafe {
        api!(RedisModule_ReplyWithArray)(ctx, 6);
        reply(ctx, chosen.allowed as i64);
        reply(ctx, chosen.limit as i64);
        reply(ctx, chosen.remaining as i64);
        reply(ctx, chosen.wait.as_reply());
        reply(ctx, chosen.reset_ms as i64);
        reply(ctx, denied_by.map_or(0, |i| i as i64 + 1));
    }
}

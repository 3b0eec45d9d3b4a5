//! `BLOCK timeout_ms` in the steps: waiting in the server instead of
//! failing (see `crate::blocking` for the queues and timers).
//!
//! A call with `BLOCK` runs as any other. Admitted: the usual reply.
//! Denied for good (`wait_ms` -1) or for longer than `timeout_ms`: the
//! denial at once. Otherwise the client blocks, nothing consumed, and the
//! server runs the same step again (a [`Turn::Retry`]) whenever one of its
//! keys is signalled: by the waiter's own timer when the limiter will admit
//! it, by a release, refund or deletion of the key, or at its deadline.
//! The retry replies when it is admitted (taking its units then, and
//! propagating as any admission) or when its deadline has passed (the
//! denial), and otherwise keeps waiting.
//!
//! On one key, waiters go in arrival order: a call behind a queue takes
//! nothing, and its `wait_ms` counts the queue in ([`behind`]).
//!
//! The retries themselves are the runner's (`live.rs`): a blocked call
//! re-enters through the one dispatcher (`super::dispatch`), so this file
//! names no step and no command.

use super::host::{Host, Store, Turn};
use crate::algorithms::Listed;
use crate::blocking::{self, Place};
use crate::error::Error;
use crate::limiter::{self, Decision, Micros, Request, Wait};

/// What a single-key call may do before its limiter decides.
pub(super) enum Gate {
    /// Decide as usual.
    Open,
    /// A waiter behind others: it stays blocked, untouched.
    Wait,
    /// Behind a queue: denied, with this decision, and nothing taken.
    Behind(Decision),
}

/// Whether a request takes units that waiters may be waiting for.
#[inline(always)]
pub(super) fn takes(request: Request) -> bool {
    matches!(request, Request::Cost(n) if n > 0) || matches!(request, Request::UpTo(_))
}

/// Where a single-key call stands among the waiters of its key (the key at
/// argument `key_arg`, named `name`).
#[inline(always)]
pub(super) fn gate<L: Listed, H: Host>(
    host: &H,
    key: &mut H::Key<'_>,
    name: &[u8],
    params: &L::Params,
    request: Request,
    now: Micros,
) -> Result<Gate, Error> {
    if !takes(request) || !blocking::any() {
        return Ok(Gate::Open);
    }
    let turn = host.turn();
    let ahead = match blocking::place(host.db(), name, turn.waiter()) {
        Place::Free | Place::Head => return Ok(Gate::Open),
        Place::Queued if !expired(turn, now) => return Ok(Gate::Wait),
        Place::Queued => blocking::ahead_of(host.db(), name, turn.waiter().unwrap_or(0)),
        Place::Behind(ahead) => ahead,
    };
    Ok(Gate::Behind(behind::<L>(
        key,
        params,
        request.cost(),
        now,
        &ahead,
    )?))
}

/// Whether the deadline of a blocked call has passed (a new call has none).
pub(super) fn expired(turn: Turn, now: Micros) -> bool {
    match turn {
        Turn::Call => false,
        Turn::Retry(waiter) => blocking::expired(waiter, now),
        Turn::Timeout(_) => true,
    }
}

/// The denial of a request of `cost` behind the queue `ahead` (each
/// waiter's request and deadline, in order): nothing is available to it,
/// and it would be admitted once every waiter ahead was, each as soon as the
/// limiter admits it (an `UPTO n` waiter: as soon as its first unit fits,
/// taking what fits then; a waiter whose deadline comes first is left out).
/// The waiters are taken to use this call's parameters, as they do when
/// one rule guards the key.
pub(super) fn behind<L: Listed>(
    key: &mut impl Store,
    params: &L::Params,
    cost: u64,
    now: Micros,
    ahead: &[(Request, Option<Micros>)],
) -> Result<Decision, Error> {
    let current = key.with_state::<L, _>(|state| state.clone())?;
    let mut state = current.unwrap_or_else(|| L::idle(params, now));
    let seen = limiter::decide::<L>(&state, params, Request::Cost(cost), now).decision;
    let mut at = now;
    for &(request, deadline) in ahead {
        let d = limiter::decide::<L>(&state, params, Request::Cost(request.cost()), at).decision;
        let admitted_at = match d.wait {
            _ if d.allowed => at,
            Wait::Ms(ms) => at.saturating_add_ms(ms),
            Wait::Never => continue,
        };
        if deadline.is_some_and(|deadline| admitted_at > deadline) {
            continue;
        }
        at = admitted_at;
        limiter::run::<L>(&mut state, params, request, at);
    }
    let mine = limiter::decide::<L>(&state, params, Request::Cost(cost), at).decision;
    let wait = match mine.wait {
        Wait::Never => Wait::Never,
        Wait::Ms(ms) => {
            let queue_ms = at.us_since(now).div_ceil(1000);
            let own = if mine.allowed { 0 } else { ms };
            Wait::Ms((queue_ms + own).max(1))
        }
    };
    Ok(Decision {
        allowed: false,
        remaining: 0,
        wait,
        ..seen
    })
}

/// How a call waits: on its key's queue or not, and whether its `wait_ms`
/// is a bound rather than a promise.
#[derive(Clone, Copy)]
pub(super) struct Waits {
    /// A single-key call joins its key's queue.
    pub queued: bool,
    /// A concurrency limiter's `wait_ms` is when enough leases expire; a
    /// release can let the call in earlier, so it waits even when that is
    /// beyond its timeout.
    pub released_early: bool,
}

/// After a call was denied: whether it waits (blocks now, or stays
/// blocked) instead of replying. `key_args` are its keys' arguments and
/// `names` their names.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
pub(super) fn park<H: Host>(
    host: &H,
    key_args: &[usize],
    names: &[&[u8]],
    waits: Waits,
    decision: &Decision,
    request: Request,
    block: Option<u64>,
    now: Micros,
) -> bool {
    if decision.allowed || !takes(request) {
        return false;
    }
    let Wait::Ms(wait) = decision.wait else {
        return false;
    };
    let wait = wait.max(1);
    match host.turn() {
        Turn::Call => {
            let Some(timeout) = block else {
                return false;
            };
            let too_long = timeout != 0 && wait > timeout && !waits.released_early;
            if too_long || !host.may_block() {
                return false;
            }
            let waiter = blocking::enqueue(
                host.db(),
                names.iter().map(|&name| Box::from(name)).collect(),
                waits.queued.then_some(request),
                timeout,
                Some(now.saturating_add_ms(wait)),
                now,
            );
            host.block(key_args, waiter, timeout);
            true
        }
        Turn::Retry(waiter) if !blocking::expired(waiter, now) => {
            blocking::keep(waiter, Some(now.saturating_add_ms(wait)), now);
            host.keep_waiting();
            true
        }
        Turn::Retry(_) | Turn::Timeout(_) => false,
    }
}

/// A call replies: a blocked one leaves the registry, counted as admitted
/// after waiting or timed out.
#[inline(always)]
pub(super) fn answered<H: Host>(host: &H, decision: &Decision) {
    match host.turn() {
        Turn::Call => {}
        Turn::Retry(waiter) => blocking::done(waiter, decision.allowed, true),
        Turn::Timeout(waiter) => blocking::done(waiter, decision.allowed, false),
    }
}

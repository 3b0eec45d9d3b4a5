//! The one place where a limiter's state changes ([`apply_to_key`]), and
//! the decision on a key that changes nothing ([`decide_on_key`]): what the
//! stages of `super::step` call to decide or apply, for every command.

use super::host::{Host, Store};
use crate::algorithms::Listed;
use crate::error::Error;
use crate::limiter::{self, Decision, Micros, Outcome, Request};

/// What [`apply_to_key`] did.
pub(super) struct Applied {
    pub outcome: Outcome,
    /// The key's expiry was set (the `expire` keyspace event).
    pub expiry_written: bool,
    /// The lease granted, for an algorithm of leases (0 if none was).
    pub lease: u64,
}

impl Applied {
    /// A decision that changed nothing.
    pub fn unchanged(decision: Decision) -> Applied {
        Applied {
            outcome: Outcome {
                decision,
                changed: false,
                granted: 0,
            },
            expiry_written: false,
            lease: 0,
        }
    }
}

/// Runs a request on the limiter in `key` and, when the state changed,
/// stores it and its expiry: the one place where a limiter's state changes.
/// With `check_memory`, a request that would create the key fails with OOM
/// when the server is out of memory (see [`Host::out_of_memory`]);
/// replicated calls and `RL.ALL` (which checks once for all its keys before
/// changing any) pass `false`.
#[inline(always)]
pub(super) fn apply_to_key<L: Listed, H: Host>(
    host: &H,
    key: &mut H::Key<'_>,
    params: &L::Params,
    request: Request,
    now: Micros,
    check_memory: bool,
) -> Result<Applied, Error> {
    let existing = key.with_state::<L, _>(|state| {
        let idle_before = L::idle_at_ms(state, params);
        let outcome = limiter::run::<L>(state, params, request, now);
        let lease = granted::<L>(state, &outcome, request);
        (outcome, idle_before, L::idle_at_ms(state, params), lease)
    })?;
    if let Some((outcome, idle_before, idle_after, lease)) = existing {
        // The expiry follows the idle instant, with the slack the contract
        // allows: a key may expire up to min(reset_ms, 1 s) after it is idle.
        // When the idle instant moved as far as that slack ever reaches (a
        // slow bucket's moves a whole token period per admission), the
        // expiry this module set at the last call is at best the new idle
        // instant: it is set without being read. Otherwise it is read (cheaper than setting
        // it) and kept while it lies within the slack, so a busy key whose
        // idle instant moves a little per call (a sliding log, a fast
        // bucket, a window) is not given a new expiry on every call; an
        // expiry somebody else set (PERSIST, EXPIRE, a RESTORE without TTL)
        // is replaced. It is set at the far end of the slack, so that the
        // next calls can keep it.
        let expiry_written = outcome.changed && {
            let slack = expiry_slack(idle_after, now);
            idle_after >= idle_before.saturating_add(MAX_EXPIRY_SLACK_MS)
                || !key
                    .expires_at()
                    .is_some_and(|at| at >= idle_after && at <= idle_after + slack)
        };
        if expiry_written {
            key.expire_at(idle_after + expiry_slack(idle_after, now));
        }
        return Ok(Applied {
            outcome,
            expiry_written,
            lease,
        });
    }
    let mut state = L::idle(params, now);
    let outcome = limiter::run::<L>(&mut state, params, request, now);
    let lease = granted::<L>(&state, &outcome, request);
    if outcome.changed {
        if check_memory && host.out_of_memory() {
            return Err(Error::OutOfMemory);
        }
        let idle_at = L::idle_at_ms(&state, params);
        key.set_state::<L>(state);
        key.expire_at(idle_at);
    }
    Ok(Applied {
        outcome,
        expiry_written: outcome.changed,
        lease,
    })
}

/// The most a key may expire after its idle instant (the contract's
/// `min(reset_ms, 1000)`, at most 1000).
const MAX_EXPIRY_SLACK_MS: u64 = 1000;

/// How long after its idle instant `idle_at_ms` a key may expire: the
/// contract's `min(reset_ms, 1000)`, `reset_ms` rounded down here so the
/// bound holds whatever the reply rounded.
#[inline(always)]
pub(super) fn expiry_slack(idle_at_ms: u64, now: Micros) -> u64 {
    idle_at_ms
        .saturating_sub(now.as_ms_ceil())
        .min(MAX_EXPIRY_SLACK_MS)
}

/// The lease a request was granted: a changed state after `COST n` or
/// `COST n FORCE` holds a new one (0 for the algorithms without leases).
#[inline(always)]
fn granted<L: Listed>(state: &L::State, outcome: &Outcome, request: Request) -> u64 {
    match request {
        Request::Cost(_) | Request::Force(_) if outcome.changed => L::lease_granted(state),
        _ => 0,
    }
}

/// What a request would get on the limiter in `key`, changing nothing, and
/// whether the key holds nothing yet.
#[inline(always)]
pub(super) fn decide_on_key<L: Listed>(
    key: &mut impl Store,
    params: &L::Params,
    request: Request,
    now: Micros,
) -> Result<(Outcome, bool), Error> {
    Ok(
        match key.with_state::<L, _>(|state| limiter::decide::<L>(state, params, request, now))? {
            Some(outcome) => (outcome, false),
            None => (
                limiter::decide::<L>(&L::idle(params, now), params, request, now),
                true,
            ),
        },
    )
}

/// How many units, at most `most`, the limiter in `key` admits now
/// (`UPTO`'s answer; an empty key is an idle limiter).
#[inline(always)]
pub(super) fn fits_on_key<L: Listed>(
    key: &mut impl Store,
    params: &L::Params,
    most: u64,
    now: Micros,
) -> Result<u64, Error> {
    Ok(key
        .with_state::<L, _>(|state| L::fits(state, params, most, now))?
        .unwrap_or_else(|| L::fits(&L::idle(params, now), params, most, now)))
}

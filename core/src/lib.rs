//! The rate-limiting algorithms of redis-ratelimit, as pure state machines:
//! `(state, parameters, request, now) -> (decision, state')`.
//!
//! The Redis module (the `RL.*` commands) runs this crate inside the server,
//! and a client can run it in its own process: the same seven algorithms, in
//! integer arithmetic, with no Redis, no I/O, no clock and no `unsafe`. The
//! caller owns each limiter's state, reads the clock once per call, and
//! chooses where the state lives (a Redis key, a map in memory).
//!
//! - [`TokenBucket`], [`LeakyBucket`] (a shaping queue), [`FixedWindow`],
//!   [`SlidingLog`] (exact), [`HashWindow`] (sliding, in fixed memory),
//!   [`Concurrency`] (leases) and [`Quota`] (calendar periods): each an
//!   [`Algorithm`], with its parameters and state types, listed once in
//!   [`for_each_algorithm`], which every per-algorithm test iterates.
//!   ([`Throttle`] is redis-cell's `CL.THROTTLE`, a drop-in beside them.)
//! - Parameters can only be built valid: [`TokenBucketParams::new`] and its
//!   siblings check every rule and return a [`ParamError`] that names the
//!   argument at fault. Each type lists its integers, their names and
//!   ranges, and is built from and read back as them ([`Parameters`]).
//! - Time is [`Micros`], whose integer is private: instants are built and
//!   read with their unit in the name.
//! - [`run`] applies a [`Request`] (`COST n`, `COST n FORCE`, `REFUND n`)
//!   and answers an [`Outcome`]: the [`Decision`] (the five integers of the
//!   module's reply) and whether the state changed. [`decide`] answers the
//!   same and changes nothing; [`Algorithm::idle_at_ms`] says when a state
//!   is idle again and may be dropped.
//! - A state is stored and rebuilt, validated, as a list of integers
//!   ([`StateFields`]).
//!
//! ```
//! use redis_ratelimit_core::{
//!     run, Algorithm, Micros, Request, TokenBucket, TokenBucketParams, Wait,
//! };
//!
//! // 10 tokens, one back every 100 ms.
//! let params = TokenBucketParams::new(10, 1, 100)?;
//! let now = Micros::from_ms(1_700_000_000_000);
//! let mut state = TokenBucket::idle(&params, now);
//!
//! let taken = run::<TokenBucket>(&mut state, &params, Request::Cost(10), now);
//! assert!(taken.decision.allowed && taken.changed);
//! assert_eq!(taken.decision.remaining, 0);
//!
//! // Empty: the next token is 100 ms away, and a denial changes nothing.
//! let denied = run::<TokenBucket>(&mut state, &params, Request::Cost(1), now);
//! assert!(!denied.decision.allowed && !denied.changed);
//! assert_eq!(denied.decision.wait, Wait::Ms(100));
//!
//! let later = now.saturating_add_ms(100);
//! let again = run::<TokenBucket>(&mut state, &params, Request::Cost(1), later);
//! assert!(again.decision.allowed);
//!
//! // Refused parameters name their argument.
//! assert_eq!(
//!     TokenBucketParams::new(0, 1, 100).unwrap_err().to_string(),
//!     "capacity must be an integer from 1 to 1099511627776"
//! );
//! # Ok::<(), redis_ratelimit_core::ParamError>(())
//! ```
//!
//! Every algorithm obeys one contract, checked by each file's tests:
//!
//! - a denied request or a `COST 0` request leaves the state bit-for-bit
//!   unchanged (the caller then writes and propagates nothing);
//! - an admitted request with `cost > 0` changes the state;
//! - a clock that steps backwards never gives units back;
//! - a change of parameters keeps what was consumed: at the instant of the
//!   change, `remaining` is the new limit minus the units consumed (0 if
//!   they exceed it), and exactly that many more units are admitted. A
//!   raised limit adds room at once, a lowered one applies at once, and no
//!   change refills anything.

#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod block;
pub mod cell;
pub mod concurrency;
pub mod contract;
mod error;
pub mod fixed_window;
pub mod hash_window;
pub mod leaky_bucket;
pub mod protection;
pub mod quota;
pub mod sliding_log;
mod time;
pub mod token_bucket;

pub use cell::{Throttle, ThrottleParams, TimeOutOfRange};
pub use concurrency::{Concurrency, ConcurrencyParams, ConcurrencyState};
pub use error::ParamError;
pub use fixed_window::{FixedWindow, FixedWindowParams, FixedWindowState};
pub use hash_window::{HashWindow, HashWindowParams, HashWindowState};
pub use leaky_bucket::{LeakyBucket, LeakyBucketParams, LeakyBucketState};
pub use quota::{Period, Quota, QuotaParams, QuotaState};
pub use sliding_log::{SlidingLog, SlidingLogParams, SlidingLogState};
pub use time::Micros;
pub use token_bucket::{TokenBucket, TokenBucketParams, TokenBucketState};

/// What runs something on every algorithm of the crate:
/// [`for_each_algorithm`] calls [`EachAlgorithm::visit`] once per
/// algorithm, with its command word.
pub trait EachAlgorithm {
    /// Called for algorithm `A`, whose command is `RL.<word>`.
    fn visit<A: Sampled + contract::Guarantee>(&mut self, word: &'static str);
}

/// The crate's algorithms, in the order of the module's table, each given
/// to `each`. Per-algorithm tests (the core's, the module's, the contract
/// file's) iterate this list, so a new algorithm is in all of them at once.
pub fn for_each_algorithm(each: &mut impl EachAlgorithm) {
    each.visit::<TokenBucket>("TOKENBUCKET");
    each.visit::<FixedWindow>("FIXEDWINDOW");
    each.visit::<LeakyBucket>("LEAKYBUCKET");
    each.visit::<SlidingLog>("SLIDING");
    each.visit::<HashWindow>("HASHWINDOW");
    each.visit::<Concurrency>("CONCURRENCY");
    each.visit::<Quota>("QUOTA");
}

/// The number of algorithms [`for_each_algorithm`] visits.
pub const ALGORITHMS: usize = 7;

/// Parameters for tests: every algorithm can give some with a given limit
/// under which, from a given instant on, nothing refills, leaks or leaves a
/// window for a long time.
pub trait Sampled: Algorithm {
    /// `limit` units (1 to [`MAX_PARAM`]; at most 2^24 - 1 where the
    /// algorithm bounds it lower) that stay consumed for at least a day
    /// after `now`.
    fn held_for_a_day(limit: u64, now: Micros) -> Self::Params;

    /// Parameters built from integers, made ready to run at `now` (a
    /// calendar quota learns where its period ends, in UTC).
    fn ready(params: Self::Params, _now: Micros) -> Self::Params {
        params
    }
}

const DAY_MS: u64 = 24 * 3600 * 1000;

impl Sampled for TokenBucket {
    fn held_for_a_day(limit: u64, _now: Micros) -> TokenBucketParams {
        TokenBucketParams::new(limit, 1, 400 * DAY_MS).expect("valid")
    }
}
impl Sampled for LeakyBucket {
    fn held_for_a_day(limit: u64, _now: Micros) -> LeakyBucketParams {
        LeakyBucketParams::new(limit, 1, 400 * DAY_MS).expect("valid")
    }
}
impl Sampled for FixedWindow {
    /// A window of 400 days, aligned on the epoch: `now` must not be in its
    /// last day (the tests' instants are far from it).
    fn held_for_a_day(limit: u64, _now: Micros) -> FixedWindowParams {
        FixedWindowParams::new(limit, 400 * DAY_MS).expect("valid")
    }
}
impl Sampled for SlidingLog {
    fn held_for_a_day(limit: u64, _now: Micros) -> SlidingLogParams {
        SlidingLogParams::new(limit, 400 * DAY_MS).expect("valid")
    }
}
impl Sampled for HashWindow {
    fn held_for_a_day(limit: u64, _now: Micros) -> HashWindowParams {
        HashWindowParams::new(limit, 40 * DAY_MS, DAY_MS).expect("valid")
    }
}
impl Sampled for Concurrency {
    fn held_for_a_day(limit: u64, _now: Micros) -> ConcurrencyParams {
        ConcurrencyParams::new(limit, 400 * DAY_MS).expect("valid")
    }
}
impl Sampled for Quota {
    /// A yearly quota whose period ends 400 days after `now`.
    fn held_for_a_day(limit: u64, now: Micros) -> QuotaParams {
        QuotaParams::new(limit, Period::Year)
            .expect("valid")
            .at_end(now.saturating_add_ms(400 * DAY_MS))
    }
    fn ready(params: QuotaParams, now: Micros) -> QuotaParams {
        params.at_end(quota::utc_period_end(params.period(), now))
    }
}

/// The largest value any integer parameter (and `COST`) may take: 2^40.
pub const MAX_PARAM: u64 = 1 << 40;

/// The longest span a limiter may need to get back to idle, in milliseconds
/// (2^50 ms, about 35,700 years). Parameters whose idle time would exceed it
/// are refused, so every reply and TTL fits comfortably in an `i64`.
pub const MAX_SPAN_MS: u64 = 1 << 50;

/// The latest instant a call can run at: 2^62 microseconds (year 148,000),
/// the bound of `AT` (a real clock is far below it).
pub const MAX_TIME_US: u64 = 1 << 62;

/// The latest millisecond a loaded state may refer to: twice [`MAX_TIME_US`],
/// so that every state the algorithms build at any allowed time loads back
/// (an RDB the server wrote always loads), while `(ms + 2^41) * 1000` still
/// fits a `u64`.
pub const MAX_STATE_MS: u64 = 1 << 53;

/// What a limiter answers for one request: the five integers of the reply.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Decision {
    /// The units were admitted (and consumed, when `cost > 0`).
    pub allowed: bool,
    /// Capacity of the bucket, or requests per window.
    pub limit: u64,
    /// Units still available right after this call.
    pub remaining: u64,
    /// Denied: milliseconds until the same request would be admitted, rounded
    /// up, or [`Wait::Never`]. Admitted: zero, except for shaping limiters.
    pub wait: Wait,
    /// Milliseconds until the limiter is idle again, rounded up.
    pub reset_ms: u64,
}

/// `wait_ms` of the reply.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Wait {
    /// This many milliseconds, rounded up.
    Ms(u64),
    /// The request can never be admitted: its cost exceeds the limit.
    Never,
}

impl Wait {
    /// The reply's integer: milliseconds, or -1 for never.
    pub fn as_reply(self) -> i64 {
        match self {
            // Bounded by MAX_SPAN_MS, far below i64::MAX.
            Wait::Ms(ms) => ms as i64,
            Wait::Never => -1,
        }
    }
}

/// What one call asks of a limiter: the `COST n [FORCE] | REFUND n` options.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Request {
    /// `COST n` (default 1): take `n` units if the limiter admits them; `COST 0`
    /// peeks.
    Cost(u64),
    /// `COST n FORCE`: take `n` units even if the limiter would deny them,
    /// leaving it in debt (at most `limit` units beyond empty).
    Force(u64),
    /// `REFUND n`: give back up to `n` of the units the limiter holds consumed.
    Refund(u64),
    /// `UPTO n` (`n` at least 1): take as many units as the limiter admits
    /// now, at most `n` and at least 1 ([`Algorithm::fits`]); when not even
    /// one fits, the denial `COST 1` gets. What it took is
    /// [`Outcome::granted`], and it is the admission `COST granted` would
    /// have been (how the module propagates it).
    UpTo(u64),
}

impl Request {
    /// Units the request would take (0 for a refund; 1 for `UPTO n`, the
    /// least it is admitted with, and what it waits for).
    pub fn cost(self) -> u64 {
        match self {
            Request::Cost(n) | Request::Force(n) => n,
            Request::Refund(_) => 0,
            Request::UpTo(_) => 1,
        }
    }

    /// The request as it was applied, once its `outcome` is known: `UPTO n`
    /// is `COST granted` (`COST 1` when denied); the others are themselves.
    pub fn as_applied(self, outcome: &Outcome) -> Request {
        match self {
            Request::UpTo(_) => Request::Cost(outcome.granted.max(1)),
            other => other,
        }
    }
}

/// What a request did: the reply, and whether the state changed (so the key
/// must be written, expired, propagated and notified).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Outcome {
    /// The answer to the request.
    pub decision: Decision,
    /// The state changed: it must be stored again.
    pub changed: bool,
    /// The units the request took: its cost when admitted (`FORCE`: always),
    /// the number `UPTO` took, 0 for a denial, a peek or a refund.
    pub granted: u64,
}

/// Runs one request on a limiter: the one entry point for its callers (the
/// module's commands, a client's in-process limiter).
///
/// - `Cost(n)`: [`Algorithm::apply`]; changed when admitted with `n > 0`.
/// - `Force(n)`: [`Algorithm::force`]; answers what `Cost(n)` would have
///   answered, with `allowed` set.
/// - `Refund(n)`: [`Algorithm::refund`]; answers as a `COST 0` call after it.
/// - `UpTo(n)`: `Cost(k)` for the `k` units that fit now
///   ([`Algorithm::fits`]), `Cost(1)` when none does; `granted` says `k`.
pub fn run<A: Algorithm>(
    state: &mut A::State,
    params: &A::Params,
    request: Request,
    now: Micros,
) -> Outcome {
    match request {
        Request::Cost(cost) => run_cost::<A>(state, params, cost, now),
        Request::Force(cost) => {
            let (mut decision, changed) = A::force(state, params, cost, now);
            decision.allowed = true;
            Outcome {
                decision,
                changed,
                granted: cost,
            }
        }
        Request::Refund(units) => {
            let changed = A::refund(state, params, units, now);
            Outcome {
                decision: A::decide(state, params, 0, now),
                changed,
                granted: 0,
            }
        }
        Request::UpTo(most) => {
            let fits = A::fits(state, params, most, now);
            run_cost::<A>(state, params, fits.max(1), now)
        }
    }
}

/// `COST cost`: what [`run`] does for it (apart, so that `run` does not call
/// itself for `UPTO` and stays inlined into its callers' hot paths).
#[inline(always)]
fn run_cost<A: Algorithm>(
    state: &mut A::State,
    params: &A::Params,
    cost: u64,
    now: Micros,
) -> Outcome {
    let decision = A::apply(state, params, cost, now);
    let allowed = decision.allowed && cost > 0;
    Outcome {
        decision,
        changed: allowed,
        granted: if allowed { cost } else { 0 },
    }
}

/// `COST cost` as [`decide`] answers it.
#[inline(always)]
fn decide_cost<A: Algorithm>(
    state: &A::State,
    params: &A::Params,
    cost: u64,
    now: Micros,
) -> Outcome {
    let decision = A::decide(state, params, cost, now);
    let allowed = decision.allowed && cost > 0;
    Outcome {
        decision,
        changed: allowed,
        granted: if allowed { cost } else { 0 },
    }
}

/// What [`run`] would answer, changing nothing (for all-or-nothing calls).
pub fn decide<A: Algorithm>(
    state: &A::State,
    params: &A::Params,
    request: Request,
    now: Micros,
) -> Outcome {
    match request {
        Request::Cost(cost) => decide_cost::<A>(state, params, cost, now),
        Request::UpTo(most) => {
            let fits = A::fits(state, params, most, now);
            decide_cost::<A>(state, params, fits.max(1), now)
        }
        _ => run::<A>(&mut state.clone(), params, request, now),
    }
}

/// A state as a flat list of `u64` fields, and back: how the module stores a
/// limiter in the RDB and the AOF (encoding 1 of each of its types), and how
/// any other caller can keep one.
///
/// The list is a stored format: changing a state's fields is a new encoding
/// in the module, which must still load the old one.
pub trait StateFields: Sized {
    /// Writes the state's fields to `out`, in the order
    /// [`StateFields::from_fields`] reads them.
    fn to_fields(&self, out: &mut impl FnMut(u64));

    /// Rebuilds a state from the fields [`StateFields::to_fields`] wrote,
    /// taking them one by one from `next`. `None` if `next` runs out first,
    /// or if the fields break an invariant the algorithm relies on: a
    /// corrupt or hostile list never gives a state the algorithm could
    /// overflow on, and a declared length is bounded before anything is
    /// allocated for it. Fields after the state are left unread.
    fn from_fields(next: &mut impl FnMut() -> Option<u64>) -> Option<Self>;

    /// Bytes the state owns on the heap beyond its own size (what a store
    /// counts as its memory, `MEMORY USAGE` in the module).
    fn heap_bytes(&self) -> usize {
        0
    }

    /// Whether the state has a compact form beside its fields: some fields,
    /// then one byte string ([`StateFields::to_compact`]). Only the hash
    /// window has one (its counters, at their width).
    const COMPACT: bool = false;

    /// Writes the compact form: fields to `out`, then one byte string to
    /// `bytes`, in the order [`StateFields::from_compact`] reads them. Where
    /// there is no compact form, the fields.
    fn to_compact(&self, out: &mut impl FnMut(u64), bytes: &mut impl FnMut(&[u8])) {
        let _ = bytes;
        self.to_fields(out);
    }

    /// Rebuilds a state from its compact form, validated as
    /// [`StateFields::from_fields`] validates the fields; `None` where there
    /// is no compact form.
    fn from_compact(
        next: &mut impl FnMut() -> Option<u64>,
        bytes: &mut impl FnMut() -> Option<Vec<u8>>,
    ) -> Option<Self> {
        let _ = (next, bytes);
        None
    }
}

/// One integer parameter of an algorithm: its name as the commands give it,
/// and the range its constructor accepts for it alone (the rules between
/// parameters come on top).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IntegerParam {
    /// Its name in errors and documentation (`capacity`, `window_ms`).
    pub name: &'static str,
    /// The smallest value it may take.
    pub min: u64,
    /// The largest value it may take.
    pub max: u64,
    /// Words that stand for its values, the n-th for n (`DAY`, `WEEK`, ...
    /// for a quota's period), matched in any case; empty for a plain
    /// integer.
    pub keywords: &'static [&'static str],
}

impl IntegerParam {
    /// `name`, from 1 to [`MAX_PARAM`] (most parameters).
    pub const fn positive(name: &'static str) -> IntegerParam {
        IntegerParam {
            name,
            min: 1,
            max: MAX_PARAM,
            keywords: &[],
        }
    }

    /// `name`, written as one of `keywords` (the n-th standing for n).
    pub const fn keyword(name: &'static str, keywords: &'static [&'static str]) -> IntegerParam {
        IntegerParam {
            name,
            min: 0,
            max: keywords.len() as u64 - 1,
            keywords,
        }
    }
}

/// An algorithm's parameters as the integers that follow a limiter's key,
/// and back: what a caller needs to read them from words, name each one in
/// an error, and write them out again.
pub trait Parameters: Sized {
    /// Each parameter, in command order.
    const INTEGERS: &'static [IntegerParam];

    /// Builds the parameters from one value per [`Parameters::INTEGERS`], in
    /// order, with every rule of the type's constructor (its `new`). Panics
    /// if `values` holds fewer.
    fn from_integers(values: &[u64]) -> Result<Self, ParamError>;

    /// The values back, in the order [`Parameters::from_integers`] reads
    /// them.
    fn to_integers(&self, out: &mut impl FnMut(u64));
}

/// One rate-limiting algorithm, as a pure state machine.
///
/// `apply` must leave `state` untouched unless it returns an admitted decision
/// for a request with `cost > 0`.
pub trait Algorithm {
    /// Validated parameters of one call.
    type Params: Copy + std::fmt::Debug + Parameters;
    /// The state of one limiter (what the module keeps in one Redis key).
    type State: Clone + std::fmt::Debug + PartialEq + StateFields;
    /// Whether admitted requests get a queueing delay in `wait_ms`.
    const SHAPES: bool = false;

    /// The state of a limiter that has seen no traffic (what a missing key means).
    fn idle(params: &Self::Params, now: Micros) -> Self::State;

    /// Decides one request of `cost` units at `now`, updating `state` only
    /// when the request is admitted with `cost > 0`.
    fn apply(state: &mut Self::State, params: &Self::Params, cost: u64, now: Micros) -> Decision;

    /// The decision `apply` would take, without changing anything (for
    /// all-or-nothing calls over several limiters).
    fn decide(state: &Self::State, params: &Self::Params, cost: u64, now: Micros) -> Decision {
        Self::apply(&mut state.clone(), params, cost, now)
    }

    /// `UPTO most`: how many units, at most `most`, `apply` would admit now:
    /// the largest `k <= most` with `apply(k)` admitted (0 if not even one
    /// is). Every admission rule here is monotone (fewer units fit whenever
    /// more do) and `remaining` of a peek is exactly the units that fit, so
    /// one peek answers it; each algorithm's tests check this against a
    /// brute-force search.
    fn fits(state: &Self::State, params: &Self::Params, most: u64, now: Micros) -> u64 {
        most.min(Self::decide(state, params, 0, now).remaining)
    }

    /// `COST n FORCE`: takes `cost` units even when `apply` would deny them,
    /// but never leaves more than `limit` units of debt beyond empty (what
    /// would go further is dropped). Returns what `apply` would have answered
    /// (the caller sets `allowed`) and whether the state changed.
    fn force(
        state: &mut Self::State,
        params: &Self::Params,
        cost: u64,
        now: Micros,
    ) -> (Decision, bool);

    /// `REFUND n`: gives back up to `units` of the units the limiter holds
    /// consumed at `now`, never lifting it above its idle state. Returns
    /// whether the state changed (nothing held consumed: nothing changes).
    fn refund(state: &mut Self::State, params: &Self::Params, units: u64, now: Micros) -> bool;

    /// The Unix time in milliseconds from which the state, just updated by an
    /// admitted call with `params`, is idle again and the key may vanish (the
    /// key's absolute expiry).
    fn idle_at_ms(state: &Self::State, params: &Self::Params) -> u64;

    /// For an algorithm of leases ([`Concurrency`]): the id of the lease the
    /// last admitted or forced request was granted; 0 for the others.
    fn lease_granted(_state: &Self::State) -> u64 {
        0
    }

    /// `RL.RELEASE`: ends lease `id` if it is live at `now`. The state's new
    /// idle instant (as [`Algorithm::idle_at_ms`]) if it was; `None` if not,
    /// and always for the algorithms without leases.
    fn release(_state: &mut Self::State, _id: u64, _now: Micros) -> Option<u64> {
        None
    }

    /// `RL.RENEW`: makes lease `id`, if live at `now`, end `lease_ms` after
    /// `now`. The state's new idle instant if it was live, as
    /// [`Algorithm::release`].
    fn renew(_state: &mut Self::State, _id: u64, _lease_ms: u64, _now: Micros) -> Option<u64> {
        None
    }
}

#[cfg(test)]
pub(crate) mod testkit {
    //! Helpers shared by the algorithm tests.
    use super::*;

    /// Runs `apply` on a copy and checks the universal contract: denials and
    /// `COST 0` change nothing, admissions with cost change something.
    pub fn apply_checked<A: Algorithm>(
        state: &mut A::State,
        params: &A::Params,
        cost: u64,
        now: Micros,
    ) -> Decision {
        let before = state.clone();
        let predicted = A::decide(state, params, cost, now);
        let d = A::apply(state, params, cost, now);
        assert_eq!(predicted, d, "decide and apply disagree");
        if !d.allowed || cost == 0 {
            assert_eq!(*state, before, "denied or COST 0 call changed the state");
        }
        if d.allowed && !A::SHAPES {
            assert_eq!(d.wait, Wait::Ms(0));
        }
        assert!(d.remaining <= d.limit);
        assert_fields_round_trip(state);
        d
    }

    /// The state survives its fields: what the module writes to the RDB
    /// loads back as the very same state, and reads no field more.
    pub fn assert_fields_round_trip<S: StateFields + PartialEq + std::fmt::Debug>(state: &S) {
        let mut fields = Vec::new();
        state.to_fields(&mut |field| fields.push(field));
        let mut next = fields.iter().copied();
        let back = S::from_fields(&mut || next.next());
        assert_eq!(back.as_ref(), Some(state), "from its fields {fields:?}");
        assert!(next.next().is_none(), "fields left over: {fields:?}");
    }

    /// Consumes `consumed` units of a new limiter under `old` at `now`, then
    /// switches to `new` at the same instant (so that no time can refill or
    /// drain anything), and returns the `remaining` a `COST 0` call then
    /// shows, after checking that exactly that many units are admitted
    /// before the next one is denied: the room a change shows is real, and
    /// nothing consumed was given back.
    pub fn remaining_after_change<A: Algorithm>(
        old: &A::Params,
        new: &A::Params,
        consumed: u64,
        now: Micros,
    ) -> u64 {
        let mut state = A::idle(old, now);
        if consumed > 0 {
            let d = apply_checked::<A>(&mut state, old, consumed, now);
            assert!(d.allowed, "{consumed} units under {old:?}: {d:?}");
        }
        let peek = apply_checked::<A>(&mut state, new, 0, now);
        let left = peek.remaining;
        if left > 0 {
            let d = apply_checked::<A>(&mut state, new, left, now);
            assert!(
                d.allowed && d.remaining == 0,
                "the {left} units shown under {new:?}: {d:?}"
            );
        }
        let d = apply_checked::<A>(&mut state, new, 1, now);
        assert!(
            !d.allowed,
            "a unit beyond the {left} shown under {new:?}: {d:?}"
        );
        left
    }
}

/// `REFUND` and `FORCE`, one contract for every algorithm, at a single
/// instant (so nothing refills or leaves the window between the steps) and
/// against a brute-force model: a plain count of units held.
#[cfg(test)]
mod refund_and_force {
    use super::fixed_window::FixedWindowParams;
    use super::hash_window::HashWindowParams;
    use super::leaky_bucket::LeakyBucketParams;
    use super::sliding_log::SlidingLogParams;
    use super::token_bucket::TokenBucketParams;
    use super::*;
    use proptest::prelude::*;

    /// An instant on every window and bucket edge used here.
    const T0: Micros = Micros::from_ms(1_699_999_200_000);

    /// One request on a limiter under test.
    type Call<'a> = dyn FnMut(Request) -> Outcome + 'a;

    /// Every algorithm of the crate ([`for_each_algorithm`]) with `limit`
    /// units that stay consumed.
    fn for_each_algorithm(limit: u64, check: &mut dyn FnMut(&str, &mut Call)) {
        struct Each<'c> {
            limit: u64,
            check: &'c mut dyn FnMut(&str, &mut Call),
            seen: usize,
        }
        impl EachAlgorithm for Each<'_> {
            fn visit<A: Sampled + contract::Guarantee>(&mut self, word: &'static str) {
                let params = A::held_for_a_day(self.limit, T0);
                let mut state = A::idle(&params, T0);
                let mut call = move |request| {
                    let before = state.clone();
                    let predicted = decide::<A>(&state, &params, request, T0);
                    let outcome = run::<A>(&mut state, &params, request, T0);
                    assert_eq!(predicted, outcome, "decide and run disagree on {request:?}");
                    assert_eq!(
                        outcome.changed,
                        state != before,
                        "changed is wrong for {request:?}"
                    );
                    outcome
                };
                (self.check)(word, &mut call);
                self.seen += 1;
            }
        }
        let mut each = Each {
            limit,
            check,
            seen: 0,
        };
        super::for_each_algorithm(&mut each);
        assert_eq!(each.seen, ALGORITHMS);
    }

    #[test]
    fn refunded_units_are_usable_at_once_and_never_above_idle() {
        for_each_algorithm(10, &mut |name, call| {
            assert_eq!(call(Request::Cost(6)).decision.remaining, 4, "{name}");
            let back = call(Request::Refund(2));
            assert!(back.changed, "{name}");
            assert_eq!(
                (back.decision.allowed, back.decision.remaining),
                (true, 6),
                "{name}"
            );
            assert!(
                call(Request::Cost(6)).decision.allowed,
                "{name}: refunded units usable"
            );
            // 10 consumed: a refund of 25 gives back 10, no more.
            let back = call(Request::Refund(25));
            assert_eq!(back.decision.remaining, 10, "{name}");
            let nothing = call(Request::Refund(1));
            assert!(
                !nothing.changed,
                "{name}: a refund of nothing changes nothing"
            );
            assert_eq!(nothing.decision.remaining, 10, "{name}");
            assert!(!call(Request::Refund(0)).changed, "{name}");
        });
    }

    #[test]
    fn a_forced_call_answers_as_unforced_but_allowed_and_takes_the_units() {
        for_each_algorithm(10, &mut |name, call| {
            call(Request::Cost(8));
            let unforced = call(Request::Cost(5)).decision;
            assert!(!unforced.allowed, "{name}");
            let forced = call(Request::Force(5));
            assert!(forced.changed, "{name}");
            assert_eq!(
                forced.decision,
                Decision {
                    allowed: true,
                    ..unforced
                },
                "{name}"
            );
            // 13 of 10 consumed: 3 units of debt.
            assert_eq!(call(Request::Cost(0)).decision.remaining, 0, "{name}");
            call(Request::Refund(3));
            assert_eq!(
                call(Request::Cost(0)).decision.remaining,
                0,
                "{name}: debt repaid first"
            );
            call(Request::Refund(1));
            assert_eq!(call(Request::Cost(0)).decision.remaining, 1, "{name}");
        });
    }

    #[test]
    fn debt_stops_at_one_limit_beyond_empty() {
        for_each_algorithm(10, &mut |name, call| {
            assert!(call(Request::Force(1_000)).changed, "{name}");
            assert!(
                !call(Request::Force(1)).changed,
                "{name}: no debt beyond the limit"
            );
            // 20 held: a refund of 10 reaches empty, one more gives one back.
            call(Request::Refund(10));
            assert_eq!(call(Request::Cost(0)).decision.remaining, 0, "{name}");
            call(Request::Refund(1));
            assert_eq!(call(Request::Cost(0)).decision.remaining, 1, "{name}");
        });
    }

    #[test]
    fn a_forced_call_that_fits_is_an_ordinary_admission() {
        for_each_algorithm(10, &mut |name, call| {
            let forced = call(Request::Force(4));
            assert!(forced.changed && forced.decision.allowed, "{name}");
            assert_eq!(forced.decision.remaining, 6, "{name}");
            assert!(
                !call(Request::Force(0)).changed,
                "{name}: FORCE with COST 0 peeks"
            );
        });
    }

    fn ms(n: u64) -> Micros {
        T0.saturating_add_ms(n)
    }

    /// A forced call's debt, as the instant the next unit is admitted: the
    /// request is denied one microsecond before, admitted at it, and the
    /// denial's `wait_ms` said so.
    fn assert_repaid_at<A: Algorithm>(
        state: &A::State,
        params: &A::Params,
        cost: u64,
        from: Micros,
        at: Micros,
    ) {
        let denied = A::decide(state, params, cost, from);
        assert_eq!(
            denied.wait,
            Wait::Ms(at.us_since(from).div_ceil(1000)),
            "{denied:?}"
        );
        assert!(!A::decide(state, params, cost, at.saturating_sub_us(1)).allowed);
        assert!(A::decide(state, params, cost, at).allowed);
    }

    #[test]
    fn a_buckets_debt_is_repaid_by_its_refill_exactly() {
        // 10 tokens, one back every 100 ms: 10 taken and 5 forced leave 15
        // owed; one more fits once 6 have come back, 600 ms later.
        let p = TokenBucketParams::new(10, 1, 100).unwrap();
        let mut s = TokenBucket::idle(&p, T0);
        run::<TokenBucket>(&mut s, &p, Request::Cost(10), T0);
        run::<TokenBucket>(&mut s, &p, Request::Force(5), T0);
        assert_repaid_at::<TokenBucket>(&s, &p, 1, T0, ms(600));
        assert_eq!(TokenBucket::idle_at_ms(&s, &p), ms(1500).as_ms_floor());
        // The queue drains its debt the same way.
        let p = LeakyBucketParams::new(10, 1, 100).unwrap();
        let mut s = LeakyBucket::idle(&p, T0);
        run::<LeakyBucket>(&mut s, &p, Request::Cost(10), T0);
        run::<LeakyBucket>(&mut s, &p, Request::Force(5), T0);
        assert_repaid_at::<LeakyBucket>(&s, &p, 1, T0, ms(600));
    }

    #[test]
    fn a_windows_debt_leaves_with_its_units() {
        // The fixed window forgets it at the window's end.
        let p = FixedWindowParams::new(10, 1000).unwrap();
        let mut s = FixedWindow::idle(&p, T0);
        run::<FixedWindow>(&mut s, &p, Request::Cost(10), T0);
        run::<FixedWindow>(&mut s, &p, Request::Force(5), ms(100));
        assert_repaid_at::<FixedWindow>(&s, &p, 10, ms(100), ms(1000));
        // The log: the 10 units of T0 leave at 1000 ms, the 5 forced at 100
        // ms leave at 1100 ms.
        let p = SlidingLogParams::new(10, 1000).unwrap();
        let mut s = SlidingLog::idle(&p, T0);
        run::<SlidingLog>(&mut s, &p, Request::Cost(10), T0);
        run::<SlidingLog>(&mut s, &p, Request::Force(5), ms(100));
        assert_repaid_at::<SlidingLog>(&s, &p, 5, ms(100), ms(1000));
        assert_repaid_at::<SlidingLog>(&s, &p, 6, ms(100), ms(1100));
        // Buckets of 100 ms: a unit counts until its whole bucket has left
        // the window, 1100 ms after the bucket began.
        let p = HashWindowParams::new(10, 1000, 100).unwrap();
        let mut s = HashWindow::idle(&p, T0);
        run::<HashWindow>(&mut s, &p, Request::Cost(10), T0);
        run::<HashWindow>(&mut s, &p, Request::Force(5), ms(100));
        assert_repaid_at::<HashWindow>(&s, &p, 5, ms(100), ms(1100));
        assert_repaid_at::<HashWindow>(&s, &p, 6, ms(100), ms(1200));
    }

    proptest! {
        /// Any sequence of COST, FORCE and REFUND at one instant holds what a
        /// plain counter says: held = min(held + cost, 2 * limit) when
        /// forced, held + cost when admitted (held + cost <= limit),
        /// held - min(n, held) on refund.
        #[test]
        fn every_algorithm_counts_like_the_model(
            limit in 1u64..40,
            steps in prop::collection::vec((0u8..3, 0u64..50), 1..40),
        ) {
            for_each_algorithm(limit, &mut |name, call| {
                let mut held = 0u64;
                for &(kind, n) in &steps {
                    let request = match kind {
                        0 => Request::Cost(n),
                        1 => Request::Force(n),
                        _ => Request::Refund(n),
                    };
                    let outcome = call(request);
                    let expected_allowed = match request {
                        Request::Cost(c) => c == 0 || held + c <= limit,
                        _ => true,
                    };
                    assert_eq!(outcome.decision.allowed, expected_allowed, "{name} {request:?} held {held}");
                    held = match request {
                        Request::Cost(c) if held + c <= limit => held + c,
                        Request::Cost(_) => held,
                        Request::Force(c) => (held + c).min(2 * limit).max(held),
                        Request::Refund(r) => held - r.min(held),
                        Request::UpTo(_) => unreachable!("not drawn"),
                    };
                    let peek = call(Request::Cost(0)).decision;
                    assert_eq!(peek.remaining, limit.saturating_sub(held), "{name} after {request:?}");
                }
            });
        }
    }
}

/// Each state's fields: their order is the module's encoding 1 (the
/// payloads of `tests/fixtures/encoding-v1/`), and what breaks an invariant
/// is refused.
#[cfg(test)]
mod state_fields {
    use super::fixed_window::FixedWindowState;
    use super::hash_window::{HashWindowState, MAX_BUCKETS};
    use super::leaky_bucket::LeakyBucketState;
    use super::sliding_log::SlidingLogState;
    use super::token_bucket::TokenBucketState;
    use super::*;

    fn fields<S: StateFields>(state: &S) -> Vec<u64> {
        let mut fields = Vec::new();
        state.to_fields(&mut |field| fields.push(field));
        fields
    }

    fn load<S: StateFields>(fields: &[u64]) -> Option<S> {
        let mut next = fields.iter().copied();
        S::from_fields(&mut || next.next())
    }

    /// Writes `state`, checks the fields are `expected`, that they load
    /// back as `state`, and that no prefix of them loads.
    fn pin<S: StateFields + PartialEq + std::fmt::Debug>(state: S, expected: &[u64]) {
        assert_eq!(fields(&state), expected);
        assert_eq!(load::<S>(expected), Some(state));
        for len in 0..expected.len() {
            assert_eq!(load::<S>(&expected[..len]), None, "{len} fields");
        }
    }

    #[test]
    fn every_state_writes_its_fields_in_encoding_order() {
        let bucket = TokenBucketState {
            tat_us: 0x0012_198e_408e_4030,
            tat_frac: 2,
            refill_count: 3,
            refill_ms: 1 << 40,
        };
        let bucket_fields = [0x0012_198e_408e_4030, 2, 3, 1 << 40];
        pin(bucket, &bucket_fields);
        pin(LeakyBucketState(bucket), &bucket_fields);
        pin(
            FixedWindowState {
                last_us: 0x0006_618e_408e_d5c4,
                count: 3,
            },
            &[0x0006_618e_408e_d5c4, 3],
        );
        let entries = [1, 0x1200_0002, 0x2300_0003, 0x2a00_0005];
        let p = sliding_log::SlidingLogParams::new(5, 1000).unwrap();
        let epoch_ms = 0x01a2_30b4_5dcd;
        let mut log = SlidingLog::idle(&p, Micros::from_ms(epoch_ms));
        for (ms, cost) in [(0, 1), (0x12, 1), (0x23, 1), (0x2a, 2)] {
            assert!(SlidingLog::apply(&mut log, &p, cost, Micros::from_ms(epoch_ms + ms)).allowed);
        }
        pin(log, &[&[epoch_ms, 5, 5, 4][..], &entries].concat());
        // (built by calls: the states keep their fields in one block)
        let p = hash_window::HashWindowParams::new(5, 1 << 40, 1 << 40).unwrap();
        let mut ring = HashWindow::idle(&p, Micros::from_ms(0));
        assert!(HashWindow::apply(&mut ring, &p, 5, Micros::from_ms(1 << 40)).allowed);
        pin(ring, &[1 << 40, 1, 5, 2, 0, 5]);
    }

    #[test]
    fn fields_that_break_an_invariant_are_refused() {
        // the sub-microsecond part of a TAT below the rate; a rate in range
        for bad in [[1, 5, 5, 1000], [1, 0, 0, 1000], [1, 0, 1, (1 << 40) + 1]] {
            assert_eq!(load::<TokenBucketState>(&bad), None, "{bad:?}");
            assert_eq!(load::<LeakyBucketState>(&bad), None, "{bad:?}");
        }
        // more than a forced call can leave counted; a time beyond MAX_TIME_US
        assert_eq!(load::<FixedWindowState>(&[0, 2 * MAX_PARAM + 1]), None);
        assert_eq!(load::<FixedWindowState>(&[MAX_TIME_US + 1, 1]), None);
        // units held that the entries do not add up to
        assert_eq!(load::<SlidingLogState>(&[0, 6, 5, 1, 5]), None);
        assert_eq!(load::<SlidingLogState>(&[0, 3, 3, 0]), None);
        // a sum that is not the buckets'
        assert_eq!(load::<HashWindowState>(&[1000, 1, 6, 2, 0, 5]), None);
    }

    #[test]
    fn a_declared_length_is_bounded_before_anything_is_allocated() {
        assert_eq!(load::<SlidingLogState>(&[0, 0, 0, u64::MAX]), None);
        assert_eq!(load::<SlidingLogState>(&[0, 0, 0, (1 << 24) + 1]), None);
        assert_eq!(load::<HashWindowState>(&[1, 0, 0, MAX_BUCKETS + 2]), None);
        // a length the fields do not hold
        assert_eq!(load::<HashWindowState>(&[1000, 5, 0, 1000, 0, 0]), None);
    }
}

/// Each parameter type's list of integers: the names and ranges it gives
/// are those its constructor checks, and its values read back in order.
#[cfg(test)]
mod parameters {
    use super::*;

    /// `valid` builds and reads back; each value just outside its listed
    /// range is refused with the range error naming it.
    fn pin<P: Parameters>(valid: &[u64]) {
        assert_eq!(valid.len(), P::INTEGERS.len());
        let params = P::from_integers(valid).expect("valid values");
        let mut back = Vec::new();
        params.to_integers(&mut |v| back.push(v));
        assert_eq!(back, valid);
        for (i, &IntegerParam { name, min, max, .. }) in P::INTEGERS.iter().enumerate() {
            let range = ParamError::Range {
                arg: name,
                min,
                max,
            };
            let mut values = valid.to_vec();
            for outside in [min.checked_sub(1), max.checked_add(1)]
                .into_iter()
                .flatten()
            {
                values[i] = outside;
                assert_eq!(
                    P::from_integers(&values).err(),
                    Some(range),
                    "{name} = {outside}"
                );
            }
        }
    }

    #[test]
    fn every_parameter_is_listed_with_the_range_its_constructor_checks() {
        pin::<TokenBucketParams>(&[10, 1, 100]);
        pin::<LeakyBucketParams>(&[10, 1, 100]);
        pin::<FixedWindowParams>(&[10, 1000]);
        pin::<SlidingLogParams>(&[10, 1000]);
        pin::<HashWindowParams>(&[10, 1000, 100]);
        pin::<ConcurrencyParams>(&[10, 1000]);
        assert_eq!(SlidingLogParams::INTEGERS[0].max, sliding_log::MAX_LIMIT);
    }
}

/// `UPTO n` on every algorithm, against a brute-force model: after any
/// history of calls at any instants, [`Algorithm::fits`] is the largest
/// `k <= n` that `COST k` admits, found by trying every `k`; and
/// `run(UpTo(n))` takes exactly that many, or is the denial of `COST 1`.
#[cfg(test)]
mod up_to {
    use super::*;
    use proptest::prelude::*;

    const T0: u64 = 1_699_999_200_000;

    /// A small deterministic generator, so one seed is one case.
    struct Rng(u64);
    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut z = self.0;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            z ^ (z >> 31)
        }
        fn below(&mut self, n: u64) -> u64 {
            self.next() % n
        }
    }

    /// Small parameters of every kind: counts to 30, spans to 3 s, any
    /// keyword; `None` when the constructor refuses them.
    fn params<A: Sampled>(rng: &mut Rng, now: Micros) -> Option<A::Params> {
        let mut values = [0u64; 3];
        for (i, int) in <A::Params as Parameters>::INTEGERS.iter().enumerate() {
            values[i] = if !int.keywords.is_empty() {
                int.min + rng.below(int.max - int.min + 1)
            } else if int.name == "bucket_ms" {
                // A window of whole buckets.
                let buckets = 1 + rng.below(8);
                let bucket = (values[i - 1] / buckets).max(1);
                values[i - 1] = bucket * buckets;
                bucket
            } else if int.name.ends_with("_ms") {
                1 + rng.below(3_000)
            } else {
                1 + rng.below(30)
            };
        }
        let params = A::Params::from_integers(&values[..A::Params::INTEGERS.len()]).ok()?;
        // A calendar quota needs its period resolved: the sample's own.
        Some(A::ready(params, now))
    }

    /// The brute-force answer: the largest `k <= most` that `COST k` admits.
    fn brute<A: Algorithm>(state: &A::State, p: &A::Params, most: u64, now: Micros) -> u64 {
        (1..=most)
            .rev()
            .find(|&k| A::decide(state, p, k, now).allowed)
            .unwrap_or(0)
    }

    /// One case per seed; `checked` counts the algorithms whose sampled
    /// parameters were valid.
    struct Check(u64, usize);
    impl EachAlgorithm for Check {
        fn visit<A: Sampled + contract::Guarantee>(&mut self, word: &'static str) {
            let mut rng = Rng(self.0);
            let mut now = Micros::from_ms(T0 + rng.below(10_000));
            let Some(p) = params::<A>(&mut rng, now) else {
                return;
            };
            self.1 += 1;
            let mut state = A::idle(&p, now);
            for _ in 0..60 {
                now = now.saturating_add_us(rng.below(400_000));
                let most = 1 + rng.below(40);
                let expected = brute::<A>(&state, &p, most, now);
                assert_eq!(
                    A::fits(&state, &p, most, now),
                    expected,
                    "{word} {p:?} {state:?} UPTO {most}"
                );
                let request = match rng.below(6) {
                    0 => Request::Force(rng.below(10)),
                    1 => Request::Refund(rng.below(10)),
                    2 => Request::Cost(rng.below(10)),
                    _ => Request::UpTo(most),
                };
                let before = state.clone();
                let predicted = decide::<A>(&state, &p, request, now);
                let outcome = run::<A>(&mut state, &p, request, now);
                assert_eq!(predicted, outcome, "{word}: decide and run on {request:?}");
                if let Request::UpTo(_) = request {
                    let as_cost =
                        run::<A>(&mut before.clone(), &p, request.as_applied(&outcome), now);
                    assert_eq!(
                        outcome.granted,
                        if outcome.decision.allowed {
                            expected
                        } else {
                            0
                        }
                    );
                    assert_eq!(outcome.decision.allowed, expected > 0, "{word}");
                    // What it did is what COST granted (COST 1 denied) does.
                    assert_eq!(as_cost, outcome, "{word}");
                    assert_eq!(state != before, expected > 0, "{word}");
                }
            }
        }
    }

    /// The same, with the parameters changing between calls (a policy
    /// set again, a protection loop's scale): what was consumed carries
    /// over, and `fits` is still exactly what `COST k` admits.
    struct Changing(u64, usize);
    impl EachAlgorithm for Changing {
        fn visit<A: Sampled + contract::Guarantee>(&mut self, word: &'static str) {
            let mut rng = Rng(self.0);
            let mut now = Micros::from_ms(T0 + rng.below(10_000));
            let (Some(p), Some(q)) = (params::<A>(&mut rng, now), params::<A>(&mut rng, now))
            else {
                return;
            };
            self.1 += 1;
            let mut state = A::idle(&p, now);
            for _ in 0..60 {
                now = now.saturating_add_us(rng.below(400_000));
                let params = if rng.below(2) == 0 { &p } else { &q };
                let most = 1 + rng.below(40);
                let expected = brute::<A>(&state, params, most, now);
                assert_eq!(
                    A::fits(&state, params, most, now),
                    expected,
                    "{word} {params:?} {state:?} UPTO {most}"
                );
                let request = match rng.below(5) {
                    0 => Request::Cost(rng.below(10)),
                    1 => Request::Force(rng.below(10)),
                    2 => Request::Refund(rng.below(10)),
                    _ => Request::UpTo(most),
                };
                run::<A>(&mut state, params, request, now);
            }
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(400))]
        #[test]
        fn fits_is_the_largest_admitted_cost_when_parameters_change(seed in any::<u64>()) {
            for_each_algorithm(&mut Changing(seed, 0));
        }

        #[test]
        fn fits_is_the_largest_admitted_cost(seed in any::<u64>()) {
            for_each_algorithm(&mut Check(seed, 0));
        }
    }

    #[test]
    fn the_samples_reach_every_algorithm() {
        let checked: usize = (0..100)
            .map(|seed| {
                let mut check = Check(seed, 0);
                for_each_algorithm(&mut check);
                check.1
            })
            .sum();
        // Most samples are valid: at least half of 100 x 7.
        assert!(checked >= 350, "{checked}");
    }

    #[test]
    fn up_to_takes_what_fits_or_is_the_denial_of_one_unit() {
        let p = TokenBucketParams::new(10, 1, 1_000).expect("valid");
        let now = Micros::from_ms(T0);
        let mut state = TokenBucket::idle(&p, now);
        run::<TokenBucket>(&mut state, &p, Request::Cost(7), now);
        let part = run::<TokenBucket>(&mut state, &p, Request::UpTo(5), now);
        assert_eq!(
            (part.decision.allowed, part.granted, part.decision.remaining),
            (true, 3, 0)
        );
        let none = run::<TokenBucket>(&mut state, &p, Request::UpTo(5), now);
        let one = decide::<TokenBucket>(&state, &p, Request::Cost(1), now);
        assert_eq!(none, one);
        assert_eq!(
            (none.decision.allowed, none.granted, none.changed),
            (false, 0, false)
        );
        assert_eq!(none.decision.wait, Wait::Ms(1_000));
    }
}

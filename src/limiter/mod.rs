//! Pure rate-limiting algorithms: `(state, parameters, cost, now) -> (decision, state')`.
//!
//! Nothing here touches Redis. Every algorithm works in integer arithmetic on
//! [`Micros`] read once per command by [`crate::clock`], and obeys one
//! contract, checked by each file's tests:
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

pub mod fixed_window;
pub mod hash_window;
pub mod leaky_bucket;
pub mod sliding_log;
pub mod token_bucket;

pub use fixed_window::FixedWindow;
pub use hash_window::HashWindow;
pub use leaky_bucket::LeakyBucket;
pub use sliding_log::SlidingLog;
pub use token_bucket::TokenBucket;

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

/// A point in time: microseconds since the Unix epoch.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Micros(pub u64);

impl Micros {
    pub const fn from_ms(ms: u64) -> Self {
        Micros(ms * 1000)
    }
    /// Whole milliseconds, rounded down.
    pub const fn as_ms_floor(self) -> u64 {
        self.0 / 1000
    }
}

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

/// One rate-limiting algorithm, as a pure state machine.
///
/// `apply` must leave `state` untouched unless it returns an admitted decision
/// for a request with `cost > 0`.
pub trait Algorithm {
    /// Validated parameters of one call.
    type Params: Copy + std::fmt::Debug;
    /// The state kept in one Redis key.
    type State: Clone + std::fmt::Debug + PartialEq;
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

    /// The Unix time in milliseconds from which the state, just updated by an
    /// admitted call with `params`, is idle again and the key may vanish (the
    /// key's absolute expiry).
    fn idle_at_ms(state: &Self::State, params: &Self::Params) -> u64;
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
        d
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

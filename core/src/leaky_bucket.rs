//! Leaky bucket as a shaping queue: requests wait their turn instead of
//! bursting.
//!
//! The bucket is a queue of at most `capacity` units that drains at a
//! constant `leak_count` units every `leak_ms`. An admitted request joins the
//! queue and gets, in `wait_ms`, the delay after which its turn comes: the
//! time for the units ahead of it to leave. Callers that sleep `wait_ms`
//! before acting therefore act evenly spaced, `leak_ms / leak_count` apart
//! per unit, with no burst at all. A request that would overfill the queue is
//! denied (and its `wait_ms` says when it would fit).
//!
//! With `T = leak_ms / leak_count` per unit and `tau = capacity * T`, the
//! queue is the GCRA of the token bucket (see `token_bucket.rs`), with the
//! same exact integer arithmetic; `tat` is the instant the queue is empty:
//!
//! ```text
//! ahead(now)   = max(tat - now, 0)                  queue delay
//! admit cost c iff ahead + c*T <= tau, then tat' = now + ahead + c*T
//! wait         = ahead (admitted), ahead + c*T - tau (denied), never if c*T > tau
//! remaining    = floor((tau - ahead') / T)          free room in the queue
//! reset        = ahead'                             until the queue is empty
//! ```
//!
//! `COST 0` looks without queueing: `wait_ms` is then the delay a request
//! sent now would get. Clock steps and parameter changes behave as in the
//! token bucket: the queued time carries over and a step back never shortens
//! the queue.

use super::token_bucket::{
    gcra, gcra_force, gcra_refund, Step, TokenBucketParams, TokenBucketState,
};
use crate::error::{param, ParamError};
use crate::{
    Algorithm, Decision, IntegerParam, Micros, Parameters, StateFields, Wait, MAX_SPAN_MS,
};

/// The parameters of a leaky bucket (`RL.LEAKYBUCKET`), valid by
/// construction: see [`LeakyBucketParams::new`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LeakyBucketParams {
    capacity: u64,
    leak_count: u64,
    leak_ms: u64,
}

impl LeakyBucketParams {
    /// A queue of at most `capacity` units that drains `leak_count` units
    /// every `leak_ms` milliseconds. Each is 1 to [`crate::MAX_PARAM`], and
    /// a full queue must drain within [`MAX_SPAN_MS`].
    pub fn new(capacity: u64, leak_count: u64, leak_ms: u64) -> Result<Self, ParamError> {
        let params = LeakyBucketParams {
            capacity: param("capacity", capacity)?,
            leak_count: param("leak_count", leak_count)?,
            leak_ms: param("leak_ms", leak_ms)?,
        };
        if !params.as_gcra().fills_within(MAX_SPAN_MS) {
            return Err(ParamError::SpanTooLong {
                what: "capacity * leak_ms / leak_count (the time to drain a full queue)",
            });
        }
        Ok(params)
    }

    /// Units the queue holds at most.
    pub fn capacity(&self) -> u64 {
        self.capacity
    }
    /// Units that leave every [`Self::leak_ms`].
    pub fn leak_count(&self) -> u64 {
        self.leak_count
    }
    /// Milliseconds in which [`Self::leak_count`] units leave.
    pub fn leak_ms(&self) -> u64 {
        self.leak_ms
    }

    /// The same rate, as the GCRA shared with the token bucket sees it.
    pub(crate) fn as_gcra(&self) -> TokenBucketParams {
        TokenBucketParams::from_checked(self.capacity, self.leak_count, self.leak_ms)
    }
}

/// The queue's state: the instant it is empty, and its leak rate.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LeakyBucketState(pub(crate) TokenBucketState);

impl LeakyBucketState {
    /// The GCRA's four integers (see [`TokenBucketState::to_parts`]).
    #[inline(always)]
    pub fn to_parts(&self) -> [u64; 4] {
        self.0.to_parts()
    }

    /// See [`TokenBucketState::from_parts`].
    #[inline(always)]
    pub fn from_parts(parts: [u64; 4]) -> Option<Self> {
        TokenBucketState::from_parts(parts).map(LeakyBucketState)
    }
}

/// The fields of the GCRA, as the token bucket's.
/// `capacity leak_count leak_ms`.
impl Parameters for LeakyBucketParams {
    const INTEGERS: &'static [IntegerParam] = &[
        IntegerParam::positive("capacity"),
        IntegerParam::positive("leak_count"),
        IntegerParam::positive("leak_ms"),
    ];
    fn from_integers(values: &[u64]) -> Result<Self, ParamError> {
        LeakyBucketParams::new(values[0], values[1], values[2])
    }
    fn to_integers(&self, out: &mut impl FnMut(u64)) {
        out(self.capacity);
        out(self.leak_count);
        out(self.leak_ms);
    }
}

impl StateFields for LeakyBucketState {
    fn to_fields(&self, out: &mut impl FnMut(u64)) {
        self.0.to_fields(out);
    }

    fn from_fields(next: &mut impl FnMut() -> Option<u64>) -> Option<Self> {
        TokenBucketState::from_fields(next).map(LeakyBucketState)
    }
}

/// The leaky bucket algorithm.
pub struct LeakyBucket;

/// A GCRA step as the queue answers it: an admitted request learns in
/// `wait_ms` when its turn comes (the units ahead of it have left).
fn shaped(step: Step, gcra_params: &TokenBucketParams) -> Decision {
    let mut decision = step.decision;
    if decision.allowed {
        let ahead_ms = step.ahead_ticks.div_ceil(gcra_params.ticks_per_ms());
        decision.wait = Wait::Ms(ahead_ms as u64);
    }
    decision
}

impl Algorithm for LeakyBucket {
    type Params = LeakyBucketParams;
    type State = LeakyBucketState;
    const SHAPES: bool = true;

    fn idle(params: &LeakyBucketParams, now: Micros) -> LeakyBucketState {
        LeakyBucketState(super::TokenBucket::idle(&params.as_gcra(), now))
    }

    fn apply(
        state: &mut LeakyBucketState,
        params: &LeakyBucketParams,
        cost: u64,
        now: Micros,
    ) -> Decision {
        let gcra_params = params.as_gcra();
        shaped(gcra(&mut state.0, &gcra_params, cost, now), &gcra_params)
    }

    fn force(
        state: &mut LeakyBucketState,
        params: &LeakyBucketParams,
        cost: u64,
        now: Micros,
    ) -> (Decision, bool) {
        let gcra_params = params.as_gcra();
        let (step, changed) = gcra_force(&mut state.0, &gcra_params, cost, now);
        (shaped(step, &gcra_params), changed)
    }

    fn refund(
        state: &mut LeakyBucketState,
        params: &LeakyBucketParams,
        units: u64,
        now: Micros,
    ) -> bool {
        gcra_refund(&mut state.0, &params.as_gcra(), units, now)
    }

    fn idle_at_ms(state: &LeakyBucketState, params: &LeakyBucketParams) -> u64 {
        super::TokenBucket::idle_at_ms(&state.0, &params.as_gcra())
    }
}

/// The guarantee the contract checks (`crate::contract`).
impl crate::contract::Guarantee for LeakyBucket {
    fn limit(params: &LeakyBucketParams) -> u64 {
        params.capacity()
    }
    fn check_admissions(p: &LeakyBucketParams, admitted: &[(u64, u64)]) {
        crate::contract::check_bucket_bound(p.capacity(), p.leak_count(), p.leak_ms(), admitted);
    }
}

#[cfg(test)]
mod tests {
    use super::super::testkit::{apply_checked, remaining_after_change};
    use super::super::MAX_PARAM;
    use super::*;
    use proptest::prelude::*;

    const T0: Micros = Micros::from_us(1_700_000_000_000_000);

    fn params(capacity: u64, leak_count: u64, leak_ms: u64) -> LeakyBucketParams {
        LeakyBucketParams::new(capacity, leak_count, leak_ms).expect("valid parameters")
    }
    fn at(ms: u64) -> Micros {
        T0.saturating_add_ms(ms)
    }
    fn hit(s: &mut LeakyBucketState, p: &LeakyBucketParams, cost: u64, now: Micros) -> Decision {
        apply_checked::<LeakyBucket>(s, p, cost, now)
    }

    #[test]
    fn parameters_are_checked_in_argument_order() {
        let range = |arg| ParamError::Range {
            arg,
            min: 1,
            max: MAX_PARAM,
        };
        assert_eq!(LeakyBucketParams::new(0, 1, 1), Err(range("capacity")));
        assert_eq!(LeakyBucketParams::new(5, 0, 0), Err(range("leak_count")));
        assert_eq!(
            LeakyBucketParams::new(5, 1, MAX_PARAM + 1),
            Err(range("leak_ms"))
        );
        // a full queue of 2^40 units, one every 2^40 ms, would take 2^80 ms
        assert_eq!(
            LeakyBucketParams::new(MAX_PARAM, 1, MAX_PARAM),
            Err(ParamError::SpanTooLong {
                what: "capacity * leak_ms / leak_count (the time to drain a full queue)"
            })
        );
        let p = params(3, 2, 100);
        assert_eq!((p.capacity(), p.leak_count(), p.leak_ms()), (3, 2, 100));
    }

    #[test]
    fn a_burst_is_spread_evenly_and_the_overflow_denied() {
        let p = params(3, 1, 100);
        let mut s = LeakyBucket::idle(&p, T0);
        let waits: Vec<Wait> = (0..3).map(|_| hit(&mut s, &p, 1, T0).wait).collect();
        assert_eq!(waits, [Wait::Ms(0), Wait::Ms(100), Wait::Ms(200)]);
        let d = hit(&mut s, &p, 1, T0);
        assert!(!d.allowed);
        assert_eq!((d.remaining, d.wait, d.reset_ms), (0, Wait::Ms(100), 300));
        // 150 ms later one and a half units have left: the next acts at 300
        let d = hit(&mut s, &p, 1, at(150));
        assert!(d.allowed);
        assert_eq!(d.wait, Wait::Ms(150));
    }

    #[test]
    fn fractional_spacing_is_exact() {
        // 3 per second: 333.33 ms apart, the delays rounded up
        let p = params(10, 3, 1000);
        let mut s = LeakyBucket::idle(&p, T0);
        let waits: Vec<Wait> = (0..4).map(|_| hit(&mut s, &p, 1, T0).wait).collect();
        assert_eq!(
            waits,
            [Wait::Ms(0), Wait::Ms(334), Wait::Ms(667), Wait::Ms(1000)]
        );
    }

    #[test]
    fn a_cost_takes_its_room_and_peeks_show_the_delay() {
        let p = params(10, 1, 10);
        let mut s = LeakyBucket::idle(&p, T0);
        assert_eq!(hit(&mut s, &p, 4, T0).wait, Wait::Ms(0));
        let d = hit(&mut s, &p, 0, at(5));
        assert_eq!((d.allowed, d.remaining, d.wait), (true, 6, Wait::Ms(35)));
        assert_eq!(hit(&mut s, &p, 11, at(5)).wait, Wait::Never);
    }

    /// The SPEC's reading of a parameter change, for a queue: its limit is
    /// the capacity, and what is queued stays queued. 10 queued of 10,
    /// raised to 100: room for 90 more at once.
    #[test]
    fn a_raised_capacity_adds_room_at_once() {
        let left = remaining_after_change::<LeakyBucket>(
            &params(10, 1, 1000),
            &params(100, 1, 1000),
            10,
            T0,
        );
        assert_eq!(left, 90);
    }

    /// 10 queued of 100, lowered to 20: room for 10, not 20.
    #[test]
    fn a_lowered_capacity_applies_at_once() {
        let left = remaining_after_change::<LeakyBucket>(
            &params(100, 1, 1000),
            &params(20, 1, 1000),
            10,
            T0,
        );
        assert_eq!(left, 10);
    }

    /// A faster leak does not empty the queue in the past: at the instant
    /// of the change, the 10 queued units still fill it.
    #[test]
    fn a_new_leak_rate_frees_nothing_at_once() {
        let left = remaining_after_change::<LeakyBucket>(
            &params(10, 1, 1000),
            &params(10, 1000, 1),
            10,
            T0,
        );
        assert_eq!(left, 0);
    }

    fn arb_params() -> impl Strategy<Value = LeakyBucketParams> {
        prop_oneof![
            (1u64..20, 1u64..20, 1u64..2000),
            (1u64..MAX_PARAM, 1u64..MAX_PARAM, 1u64..1000),
        ]
        .prop_filter_map("fits the span limit", |(c, lc, ms)| {
            LeakyBucketParams::new(c, lc, ms).ok()
        })
    }

    proptest! {
        /// At the instant of any change (capacity, rate or both), the room
        /// left is the new capacity minus what is queued, at least 0.
        #[test]
        fn a_change_keeps_what_is_queued(
            a in arb_params(),
            b in arb_params(),
            used in any::<u64>(),
            dt in 0u64..10_000_000,
        ) {
            let used = used % (a.capacity + 1);
            let now = T0.saturating_add_us(dt);
            let left = remaining_after_change::<LeakyBucket>(&a, &b, used, now);
            prop_assert_eq!(left, b.capacity.saturating_sub(used));
        }

        /// Reference: an explicit queue of unit departure times.
        #[test]
        fn agrees_with_an_explicit_queue(
            capacity in 1u64..12,
            leak_ms in 1u64..500,
            steps in prop::collection::vec((0u64..300_000, 1u64..4), 1..200),
        ) {
            let p = params(capacity, 1, leak_ms);
            let period_us = leak_ms * 1000;
            let mut now = T0.as_us();
            let mut s = LeakyBucket::idle(&p, T0);
            // departure time of each queued unit: a unit occupies the queue
            // until it has leaked, one period after the one before it
            let mut leaves: std::collections::VecDeque<u64> = Default::default();
            for (dt, cost) in steps {
                now += dt;
                while leaves.front().is_some_and(|&t| t <= now) {
                    leaves.pop_front();
                }
                let fits = leaves.len() as u64 + cost <= capacity;
                let d = hit(&mut s, &p, cost, Micros::from_us(now));
                prop_assert_eq!(d.allowed, fits);
                if fits {
                    let start = leaves.back().copied().unwrap_or(now).max(now);
                    // the request acts when the units ahead have left
                    prop_assert_eq!(d.wait, Wait::Ms((start - now).div_ceil(1000)));
                    for i in 1..=cost {
                        leaves.push_back(start + i * period_us);
                    }
                }
                prop_assert_eq!(d.remaining, capacity - leaves.len() as u64);
            }
        }
    }
}

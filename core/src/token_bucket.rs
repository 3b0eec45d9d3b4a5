//! Token bucket with continuous refill, computed exactly as GCRA.
//!
//! A bucket holds at most `capacity` tokens and gains `refill_count` tokens
//! every `refill_ms`, continuously. A request of `cost` tokens is admitted when
//! the bucket holds at least `cost` tokens, which it then takes.
//!
//! Instead of a token count and a timestamp, the state keeps one instant, the
//! GCRA *theoretical arrival time* `tat`: the moment the bucket will be full
//! again. With `T = refill_ms / refill_count` the time one token takes to come
//! back and `tau = capacity * T` the time an empty bucket takes to fill:
//!
//! ```text
//! deficit(now)   = max(tat - now, 0)                 time still to refill
//! tokens(now)    = floor(max(tau - deficit, 0) / T)
//! admit cost c   iff deficit + c*T <= tau,  then tat' = now + deficit + c*T
//! wait (denied)  = deficit + c*T - tau               (never, if c*T > tau)
//! reset          = deficit                           (time until full)
//! ```
//!
//! Exactness: `T` is a fraction of microseconds, so time is counted in
//! *ticks* of `1 / refill_count` microsecond, in which one token is exactly
//! `P = refill_ms * 1000` ticks. Everything is then integer arithmetic in
//! `u128`, without rounding or drift, from one token a year to 2^40 tokens per
//! millisecond. The guarantee: from a full bucket, tokens admitted in any span
//! `t` never exceed `capacity + refill_count * t / refill_ms`, and a request is
//! always admitted once the bucket holds its cost.
//!
//! Clock steps backwards: `deficit` grows by the step, so tokens go and never
//! come back; the bucket refills again as the clock moves forward.
//!
//! Parameter changes: what was consumed carries over. The deficit, as a number
//! of tokens, is converted from the old token period to the new one (rounding
//! up), so no change refills anything: raising the capacity gives only the
//! added room, and lowering it below what was consumed leaves the bucket empty
//! until the excess has drained. The new rate takes over at the first call
//! admitted under it, which stores the bucket at that rate; until then (a
//! denial or a peek writes nothing) the bucket keeps refilling at the rate it
//! was stored with, and `wait_ms` and `reset_ms` are computed at that rate,
//! so that the request is admitted when `wait_ms` says. The key's expiry
//! stays as the last admitted call set it, which is never earlier than the
//! old settings would have refilled the bucket.

use crate::error::{param, ParamError};
use crate::{
    Algorithm, Decision, IntegerParam, Micros, Parameters, StateFields, Wait, MAX_SPAN_MS,
};

/// The parameters of a token bucket (`RL.TOKENBUCKET`), valid by
/// construction: see [`TokenBucketParams::new`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TokenBucketParams {
    capacity: u64,
    refill_count: u64,
    refill_ms: u64,
}

/// The state of one bucket: its TAT and the refill rate it was computed with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TokenBucketState {
    /// Whole microseconds of the theoretical arrival time (when full again).
    pub(crate) tat_us: u64,
    /// Sub-microsecond part of the TAT in ticks: `0 <= tat_frac < refill_count`.
    pub(crate) tat_frac: u64,
    /// The refill rate `tat` is expressed in.
    pub(crate) refill_count: u64,
    pub(crate) refill_ms: u64,
}

/// The token bucket algorithm.
pub struct TokenBucket;

impl TokenBucketParams {
    /// A bucket of `capacity` tokens that gains `refill_count` tokens every
    /// `refill_ms` milliseconds. Each is 1 to [`crate::MAX_PARAM`], and an
    /// empty bucket must fill within [`MAX_SPAN_MS`].
    pub fn new(capacity: u64, refill_count: u64, refill_ms: u64) -> Result<Self, ParamError> {
        let params = TokenBucketParams {
            capacity: param("capacity", capacity)?,
            refill_count: param("refill_count", refill_count)?,
            refill_ms: param("refill_ms", refill_ms)?,
        };
        if !params.fills_within(MAX_SPAN_MS) {
            return Err(ParamError::SpanTooLong {
                what: "capacity * refill_ms / refill_count (the time to fill the bucket)",
            });
        }
        Ok(params)
    }

    /// Tokens a full bucket holds.
    pub fn capacity(&self) -> u64 {
        self.capacity
    }
    /// Tokens that come back every [`Self::refill_ms`].
    pub fn refill_count(&self) -> u64 {
        self.refill_count
    }
    /// Milliseconds in which [`Self::refill_count`] tokens come back.
    pub fn refill_ms(&self) -> u64 {
        self.refill_ms
    }

    /// Parameters checked by another constructor with the same rules (the
    /// leaky bucket's, whose queue is this GCRA).
    pub(crate) const fn from_checked(capacity: u64, refill_count: u64, refill_ms: u64) -> Self {
        TokenBucketParams {
            capacity,
            refill_count,
            refill_ms,
        }
    }

    /// Ticks one token takes to refill.
    fn period(&self) -> u128 {
        self.refill_ms as u128 * 1000
    }
    /// Ticks an empty bucket takes to fill.
    fn tau(&self) -> u128 {
        self.capacity as u128 * self.period()
    }
    /// Ticks in one millisecond.
    pub(super) fn ticks_per_ms(&self) -> u128 {
        self.refill_count as u128 * 1000
    }
    /// Milliseconds an empty bucket takes to fill, rounded up.
    pub fn fill_ms(&self) -> u128 {
        (self.capacity as u128 * self.refill_ms as u128).div_ceil(self.refill_count as u128)
    }
    /// Whether an empty bucket fills within `span_ms` (`fill_ms() <= span_ms`,
    /// without a division).
    pub fn fills_within(&self, span_ms: u64) -> bool {
        self.capacity as u128 * self.refill_ms as u128
            <= span_ms as u128 * self.refill_count as u128
    }
}

impl TokenBucketState {
    /// The state's four integers, `tat_us, tat_frac, refill_count,
    /// refill_ms`, as [`StateFields`] lists them (for a store that packs
    /// them its own way).
    #[inline(always)]
    pub fn to_parts(&self) -> [u64; 4] {
        [
            self.tat_us,
            self.tat_frac,
            self.refill_count,
            self.refill_ms,
        ]
    }

    /// The state of [`TokenBucketState::to_parts`]'s integers, or `None` if
    /// they break an invariant (as [`StateFields::from_fields`]).
    #[inline(always)]
    pub fn from_parts([tat_us, tat_frac, refill_count, refill_ms]: [u64; 4]) -> Option<Self> {
        let state = TokenBucketState {
            tat_us,
            tat_frac,
            refill_count,
            refill_ms,
        };
        state.is_valid().then_some(state)
    }

    fn tat_ticks(&self) -> u128 {
        self.tat_us as u128 * self.refill_count as u128 + self.tat_frac as u128
    }

    /// Checks the invariants a loaded state must hold.
    pub(crate) fn is_valid(&self) -> bool {
        (1..=crate::MAX_PARAM).contains(&self.refill_count)
            && (1..=crate::MAX_PARAM).contains(&self.refill_ms)
            && self.tat_frac < self.refill_count
    }

    /// Whether the state is kept at the rate of `params`.
    fn same_rate(&self, params: &TokenBucketParams) -> bool {
        self.refill_count == params.refill_count && self.refill_ms == params.refill_ms
    }

    /// Time still to refill at `now`, in ticks of the state's own rate.
    fn own_deficit(&self, now: Micros) -> u128 {
        self.tat_ticks()
            .saturating_sub(now.as_us() as u128 * self.refill_count as u128)
    }

    /// Time still to refill at `now`, in ticks of `params`, after converting a
    /// state kept at another rate. Bounded by MAX_SPAN_MS, so that every reply
    /// and expiry fits an `i64` whatever the parameters were.
    fn deficit(&self, params: &TokenBucketParams, now: Micros) -> u128 {
        let old_deficit = self.own_deficit(now);
        let old_period = self.refill_ms as u128 * 1000;
        let new_period = params.period();
        let deficit = if old_period == new_period {
            old_deficit
        } else {
            // tokens = old_deficit / old_period; rescale without overflow,
            // rounding the fractional token up (never a free refill).
            let whole = old_deficit / old_period;
            let frac = old_deficit % old_period;
            whole
                .saturating_mul(new_period)
                .saturating_add((frac * new_period).div_ceil(old_period))
        };
        deficit.min(MAX_SPAN_MS as u128 * params.ticks_per_ms())
    }

    fn set_tat(&mut self, params: &TokenBucketParams, tat_ticks: u128) {
        let rc = params.refill_count as u128;
        // tat <= now + tau: at most 2^60 us by MAX_SPAN_MS, fits u64.
        self.tat_us = (tat_ticks / rc) as u64;
        self.tat_frac = (tat_ticks % rc) as u64;
        self.refill_count = params.refill_count;
        self.refill_ms = params.refill_ms;
    }
}

/// `tat_us, tat_frac, refill_count, refill_ms`.
/// `capacity refill_count refill_ms`.
impl Parameters for TokenBucketParams {
    const INTEGERS: &'static [IntegerParam] = &[
        IntegerParam::positive("capacity"),
        IntegerParam::positive("refill_count"),
        IntegerParam::positive("refill_ms"),
    ];
    fn from_integers(values: &[u64]) -> Result<Self, ParamError> {
        TokenBucketParams::new(values[0], values[1], values[2])
    }
    fn to_integers(&self, out: &mut impl FnMut(u64)) {
        out(self.capacity);
        out(self.refill_count);
        out(self.refill_ms);
    }
}

impl StateFields for TokenBucketState {
    fn to_fields(&self, out: &mut impl FnMut(u64)) {
        out(self.tat_us);
        out(self.tat_frac);
        out(self.refill_count);
        out(self.refill_ms);
    }

    fn from_fields(next: &mut impl FnMut() -> Option<u64>) -> Option<Self> {
        let state = TokenBucketState {
            tat_us: next()?,
            tat_frac: next()?,
            refill_count: next()?,
            refill_ms: next()?,
        };
        state.is_valid().then_some(state)
    }
}

/// One GCRA step, shared with the leaky bucket (the same admission rule; the
/// leaky bucket also tells when the admitted request's turn comes).
pub(super) struct Step {
    pub decision: Decision,
    /// Ticks of `params` still to refill before this call: for a queue, the
    /// time until the units ahead of an admitted request have left.
    pub ahead_ticks: u128,
}

pub(super) fn gcra(
    state: &mut TokenBucketState,
    params: &TokenBucketParams,
    cost: u64,
    now: Micros,
) -> Step {
    let period = params.period();
    let tau = params.tau();
    let ticks_per_ms = params.ticks_per_ms();
    let deficit = state.deficit(params, now);
    let need = cost as u128 * period;
    let remaining_for = |deficit: u128| (tau.saturating_sub(deficit) / period) as u64;

    if cost > 0 && deficit + need <= tau {
        let after = deficit + need;
        let now_ticks = now.as_us() as u128 * params.refill_count as u128;
        state.set_tat(params, now_ticks + after);
        return Step {
            decision: Decision {
                allowed: true,
                limit: params.capacity,
                remaining: remaining_for(after),
                wait: Wait::Ms(0),
                reset_ms: after.div_ceil(ticks_per_ms) as u64,
            },
            ahead_ticks: deficit,
        };
    }
    let (short_ms, reset_ms) = if state.same_rate(params) {
        let short = (deficit + need).saturating_sub(tau);
        (short.div_ceil(ticks_per_ms), deficit.div_ceil(ticks_per_ms))
    } else {
        // New parameters on a state kept at another rate: nothing is written
        // on this call, so the state keeps draining at its own rate until an
        // admission stores it at the new one. The request fits once at most
        // `capacity - cost` tokens are owed (the conversion rounds tokens up),
        // and the bucket is full once none is.
        let own = state.own_deficit(now);
        let own_per_ms = state.refill_count as u128 * 1000;
        let fits = params.capacity.saturating_sub(cost) as u128 * (state.refill_ms as u128 * 1000);
        let cap = MAX_SPAN_MS as u128;
        (
            own.saturating_sub(fits).div_ceil(own_per_ms).min(cap),
            own.div_ceil(own_per_ms).min(cap),
        )
    };
    let wait = if cost == 0 {
        Wait::Ms(0)
    } else if need > tau {
        Wait::Never
    } else {
        Wait::Ms(short_ms as u64)
    };
    Step {
        decision: Decision {
            allowed: cost == 0,
            limit: params.capacity,
            remaining: remaining_for(deficit),
            wait,
            reset_ms: reset_ms as u64,
        },
        ahead_ticks: deficit,
    }
}

/// `COST n FORCE` on the GCRA: a denied request's units are taken anyway,
/// the deficit growing up to twice `tau` (a full bucket's worth of debt) and
/// no further. Shared with the leaky bucket.
pub(super) fn gcra_force(
    state: &mut TokenBucketState,
    params: &TokenBucketParams,
    cost: u64,
    now: Micros,
) -> (Step, bool) {
    let step = gcra(state, params, cost, now);
    if step.decision.allowed || cost == 0 {
        let changed = step.decision.allowed && cost > 0;
        return (step, changed);
    }
    let deficit = state.deficit(params, now);
    let debt_cap = params
        .tau()
        .saturating_mul(2)
        .min(MAX_SPAN_MS as u128 * params.ticks_per_ms());
    let after = (deficit + cost as u128 * params.period()).min(debt_cap);
    if after <= deficit {
        return (step, false);
    }
    let now_ticks = now.as_us() as u128 * params.refill_count as u128;
    state.set_tat(params, now_ticks + after);
    (step, true)
}

/// `REFUND n` on the GCRA: the deficit shrinks by `n` tokens' time, to zero
/// at most (a full bucket). Shared with the leaky bucket.
pub(super) fn gcra_refund(
    state: &mut TokenBucketState,
    params: &TokenBucketParams,
    units: u64,
    now: Micros,
) -> bool {
    let deficit = state.deficit(params, now);
    if deficit == 0 || units == 0 {
        return false;
    }
    let after = deficit.saturating_sub(units as u128 * params.period());
    let now_ticks = now.as_us() as u128 * params.refill_count as u128;
    state.set_tat(params, now_ticks + after);
    true
}

impl Algorithm for TokenBucket {
    type Params = TokenBucketParams;
    type State = TokenBucketState;

    fn idle(params: &TokenBucketParams, now: Micros) -> TokenBucketState {
        TokenBucketState {
            tat_us: now.as_us(),
            tat_frac: 0,
            refill_count: params.refill_count,
            refill_ms: params.refill_ms,
        }
    }

    fn apply(
        state: &mut TokenBucketState,
        params: &TokenBucketParams,
        cost: u64,
        now: Micros,
    ) -> Decision {
        gcra(state, params, cost, now).decision
    }

    fn force(
        state: &mut TokenBucketState,
        params: &TokenBucketParams,
        cost: u64,
        now: Micros,
    ) -> (Decision, bool) {
        let (step, changed) = gcra_force(state, params, cost, now);
        (step.decision, changed)
    }

    fn refund(
        state: &mut TokenBucketState,
        params: &TokenBucketParams,
        units: u64,
        now: Micros,
    ) -> bool {
        gcra_refund(state, params, units, now)
    }

    fn idle_at_ms(state: &TokenBucketState, _params: &TokenBucketParams) -> u64 {
        state
            .tat_ticks()
            .div_ceil(state.refill_count as u128 * 1000) as u64
    }
}

/// The guarantee the contract checks (`crate::contract`).
impl crate::contract::Guarantee for TokenBucket {
    fn limit(params: &TokenBucketParams) -> u64 {
        params.capacity()
    }
    fn check_admissions(p: &TokenBucketParams, admitted: &[(u64, u64)]) {
        crate::contract::check_bucket_bound(
            p.capacity(),
            p.refill_count(),
            p.refill_ms(),
            admitted,
        );
    }
}

#[cfg(test)]
mod tests {
    use super::super::testkit::{apply_checked, remaining_after_change};
    use super::super::MAX_PARAM;
    use super::*;
    use proptest::prelude::*;

    const T0: Micros = Micros::from_us(1_700_000_000_000_000);

    fn params(capacity: u64, refill_count: u64, refill_ms: u64) -> TokenBucketParams {
        TokenBucketParams::new(capacity, refill_count, refill_ms).expect("valid parameters")
    }

    fn at(ms: u64) -> Micros {
        T0.saturating_add_ms(ms)
    }

    fn hit(s: &mut TokenBucketState, p: &TokenBucketParams, cost: u64, now: Micros) -> Decision {
        apply_checked::<TokenBucket>(s, p, cost, now)
    }

    #[test]
    fn parameters_are_checked_in_argument_order() {
        let range = |arg| ParamError::Range {
            arg,
            min: 1,
            max: MAX_PARAM,
        };
        assert_eq!(TokenBucketParams::new(0, 0, 0), Err(range("capacity")));
        assert_eq!(
            TokenBucketParams::new(1, MAX_PARAM + 1, 0),
            Err(range("refill_count"))
        );
        assert_eq!(TokenBucketParams::new(1, 1, 0), Err(range("refill_ms")));
        let p = params(MAX_PARAM, MAX_PARAM, MAX_PARAM);
        assert_eq!(
            (p.capacity(), p.refill_count(), p.refill_ms()),
            (MAX_PARAM, MAX_PARAM, MAX_PARAM)
        );
    }

    #[test]
    fn an_empty_bucket_must_fill_within_the_longest_span() {
        // 2^40 tokens, one every 2^10 ms: 2^50 ms to fill, the most allowed
        assert!(TokenBucketParams::new(1 << 40, 1, 1 << 10).is_ok());
        assert!(matches!(
            TokenBucketParams::new(1 << 40, 1, (1 << 10) + 1),
            Err(ParamError::SpanTooLong { .. })
        ));
        assert!(TokenBucketParams::new(1 << 40, 3, 3 << 10).is_ok());
    }

    #[test]
    fn a_new_bucket_is_full_and_admits_its_capacity_at_once() {
        let p = params(5, 1, 1000);
        let mut s = TokenBucket::idle(&p, T0);
        for left in (0..5).rev() {
            let d = hit(&mut s, &p, 1, T0);
            assert!(d.allowed);
            assert_eq!(d.remaining, left);
        }
        let d = hit(&mut s, &p, 1, T0);
        assert!(!d.allowed);
        assert_eq!(d.wait, Wait::Ms(1000));
        assert_eq!(d.reset_ms, 5000);
    }

    #[test]
    fn refill_is_continuous_not_stepped() {
        // 10 tokens per second: one token every 100 ms exactly.
        let p = params(10, 10, 1000);
        let mut s = TokenBucket::idle(&p, T0);
        assert!(hit(&mut s, &p, 10, T0).allowed);
        let d = hit(&mut s, &p, 1, at(99));
        assert!(!d.allowed);
        assert_eq!(d.wait, Wait::Ms(1));
        assert!(hit(&mut s, &p, 1, at(100)).allowed);
        assert!(!hit(&mut s, &p, 1, at(199)).allowed);
        assert!(hit(&mut s, &p, 1, at(200)).allowed);
    }

    #[test]
    fn wait_ms_is_rounded_up_and_then_sufficient() {
        // 3 tokens per 1000 ms: one every 333.33 ms.
        let p = params(1, 3, 1000);
        let mut s = TokenBucket::idle(&p, T0);
        assert!(hit(&mut s, &p, 1, T0).allowed);
        let d = hit(&mut s, &p, 1, T0);
        assert_eq!(d.wait, Wait::Ms(334));
        assert!(!hit(&mut s, &p, 1, T0.saturating_add_us(333_333)).allowed);
        assert!(hit(&mut s, &p, 1, T0.saturating_add_us(333_334)).allowed);
    }

    #[test]
    fn cost_above_capacity_never_fits() {
        let p = params(3, 1, 1000);
        let mut s = TokenBucket::idle(&p, T0);
        let d = hit(&mut s, &p, 4, T0);
        assert!(!d.allowed);
        assert_eq!(d.wait, Wait::Never);
        assert_eq!(d.remaining, 3);
    }

    #[test]
    fn cost_zero_peeks() {
        let p = params(3, 1, 1000);
        let mut s = TokenBucket::idle(&p, T0);
        hit(&mut s, &p, 2, T0);
        let d = hit(&mut s, &p, 0, at(500));
        assert_eq!(
            d,
            Decision {
                allowed: true,
                limit: 3,
                remaining: 1,
                wait: Wait::Ms(0),
                reset_ms: 1500
            }
        );
    }

    #[test]
    fn idle_at_is_when_the_bucket_is_full() {
        let p = params(4, 1, 250);
        let mut s = TokenBucket::idle(&p, T0);
        let d = hit(&mut s, &p, 3, T0);
        assert_eq!(d.reset_ms, 750);
        assert_eq!(TokenBucket::idle_at_ms(&s, &p), T0.as_ms_floor() + 750);
        let d = hit(&mut s, &p, 0, at(750));
        assert_eq!((d.remaining, d.reset_ms), (4, 0));
    }

    #[test]
    fn a_million_per_second_is_exact() {
        let p = params(1_000_000, 1_000_000, 1000);
        let mut s = TokenBucket::idle(&p, T0);
        assert!(hit(&mut s, &p, 1_000_000, T0).allowed);
        // one token per microsecond
        for us in 1..=1000u64 {
            assert!(hit(&mut s, &p, 1, T0.saturating_add_us(us)).allowed);
            assert!(!hit(&mut s, &p, 1, T0.saturating_add_us(us)).allowed);
        }
    }

    #[test]
    fn one_per_year_is_exact() {
        let year_ms = 365 * 24 * 3600 * 1000;
        let p = params(1, 1, year_ms);
        let mut s = TokenBucket::idle(&p, T0);
        assert!(hit(&mut s, &p, 1, T0).allowed);
        let d = hit(&mut s, &p, 1, T0);
        assert_eq!(d.wait, Wait::Ms(year_ms));
        assert!(!hit(&mut s, &p, 1, at(year_ms).saturating_sub_us(1)).allowed);
        assert!(hit(&mut s, &p, 1, at(year_ms)).allowed);
    }

    #[test]
    fn fills_within_agrees_with_fill_ms() {
        for (c, rc, ms) in [
            (1, 1, 1),
            (7, 3, 5),
            (1 << 40, 1, 1 << 10),
            (1 << 40, 3, 1 << 11),
        ] {
            let p = params(c, rc, ms);
            for span in [0, 1, 1 << 50, (1 << 50) + 1] {
                assert_eq!(p.fills_within(span), p.fill_ms() <= span as u128);
            }
        }
    }

    #[test]
    fn huge_parameters_do_not_overflow() {
        let p = params(MAX_PARAM, MAX_PARAM, 1);
        let mut s = TokenBucket::idle(&p, Micros::from_us(u64::MAX / 2));
        let d = hit(&mut s, &p, MAX_PARAM, Micros::from_us(u64::MAX / 2));
        assert!(d.allowed);
        assert_eq!(d.remaining, 0);
        assert_eq!(d.reset_ms, 1);
        // a rate of 2^40 per ms refills 2^37 tokens in 125 us
        let d = hit(&mut s, &p, 0, Micros::from_us(u64::MAX / 2 + 125));
        assert_eq!(d.remaining, MAX_PARAM / 8);
    }

    #[test]
    fn clock_step_backwards_never_refills() {
        let p = params(10, 1, 100);
        let mut s = TokenBucket::idle(&p, T0);
        hit(&mut s, &p, 5, at(1000));
        let before = hit(&mut s, &p, 0, at(1000)).remaining;
        let after = hit(&mut s, &p, 0, at(900)).remaining;
        assert!(after <= before);
        // a step far back: nothing until the clock has caught up again
        let d = hit(&mut s, &p, 1, at(0));
        assert!(!d.allowed);
        assert_eq!(d.wait, Wait::Ms(600));
    }

    #[test]
    fn raising_capacity_adds_room_and_keeps_consumption() {
        let small = params(5, 1, 1000);
        let big = params(50, 1, 1000);
        let mut s = TokenBucket::idle(&small, T0);
        hit(&mut s, &small, 5, T0);
        let d = hit(&mut s, &big, 0, T0);
        assert_eq!(d.remaining, 45);
    }

    #[test]
    fn lowering_capacity_keeps_what_was_consumed() {
        let big = params(100, 1, 1000);
        let small = params(10, 1, 1000);
        let mut s = TokenBucket::idle(&big, T0);
        hit(&mut s, &big, 95, T0);
        let d = hit(&mut s, &small, 1, T0);
        assert_eq!((d.allowed, d.remaining), (false, 0));
        // 95 consumed against a capacity of 10: 86 s until one token is back
        assert_eq!(d.wait, Wait::Ms(86_000));
        assert!(!hit(&mut s, &small, 1, at(86_000).saturating_sub_us(1)).allowed);
        assert!(hit(&mut s, &small, 1, at(86_000)).allowed);
    }

    #[test]
    fn a_faster_rate_does_not_refill_the_past() {
        let slow = params(10, 1, 1000);
        let fast = params(10, 1000, 1000);
        let mut s = TokenBucket::idle(&slow, T0);
        hit(&mut s, &slow, 10, T0);
        // 500 ms at the slow rate refilled half a token: still none whole
        let d = hit(&mut s, &fast, 0, at(500));
        assert_eq!(d.remaining, 0);
        // nothing was stored: the bucket still refills at the slow rate
        assert_eq!(d.reset_ms, 9500);
        assert_eq!(hit(&mut s, &fast, 1, at(500)).wait, Wait::Ms(500));
        // the first admission stores it at the fast rate: 9 tokens short,
        // then 1 more taken, 1 per ms
        let d = hit(&mut s, &fast, 1, at(1000));
        assert_eq!((d.allowed, d.reset_ms), (true, 10));
    }

    /// Found while writing the fuzz targets' `wait_ms` check (which now
    /// holds it on loaded states too): on a state kept at another rate, a denial's
    /// `wait_ms` and `reset_ms` assumed the new rate, though nothing is
    /// written and the state keeps refilling at its own: a bucket moved from
    /// 1 token a second to 1 a millisecond said "wait 1 ms" for a whole
    /// second.
    #[test]
    fn after_a_rate_change_wait_ms_is_when_the_request_fits() {
        let slow = params(10, 1, 1000);
        let fast = params(10, 1, 1);
        let mut s = TokenBucket::idle(&slow, T0);
        hit(&mut s, &slow, 10, T0);
        let d = hit(&mut s, &fast, 1, T0);
        assert_eq!(
            (d.allowed, d.wait, d.reset_ms),
            (false, Wait::Ms(1000), 10_000)
        );
        assert!(!hit(&mut s, &fast, 1, at(999)).allowed);
        assert!(hit(&mut s, &fast, 1, at(1000)).allowed);
        // a slower rate: the fast state is due sooner than the new one says
        let mut s = TokenBucket::idle(&fast, T0);
        hit(&mut s, &fast, 10, T0);
        let d = hit(&mut s, &slow, 3, T0);
        assert_eq!((d.allowed, d.wait), (false, Wait::Ms(3)));
        assert!(!hit(&mut s, &slow, 3, at(2)).allowed);
        assert!(hit(&mut s, &slow, 3, at(3)).allowed);
    }

    /// The SPEC's reading of a parameter change: what was consumed carries
    /// over, so a raised capacity is room at once (10 taken of 10, raised to
    /// 100: 90 left, and 90 more are admitted).
    #[test]
    fn a_raised_capacity_adds_room_at_once() {
        let left = remaining_after_change::<TokenBucket>(
            &params(10, 1, 1000),
            &params(100, 1, 1000),
            10,
            T0,
        );
        assert_eq!(left, 90);
    }

    /// 10 taken of 100, lowered to 20: 10 left, not 20 (nothing refilled).
    #[test]
    fn a_lowered_capacity_applies_at_once() {
        let left = remaining_after_change::<TokenBucket>(
            &params(100, 1, 1000),
            &params(20, 1, 1000),
            10,
            T0,
        );
        assert_eq!(left, 10);
    }

    /// A new refill rate converts what is owed, token for token: at the
    /// instant of the change nothing comes back, however fast the new rate.
    #[test]
    fn a_new_refill_rate_refills_nothing_at_once() {
        let slow = params(10, 1, 1000);
        for new in [
            params(10, 1000, 1),
            params(10, 1, 3_600_000),
            params(100, 7, 3),
        ] {
            let left = remaining_after_change::<TokenBucket>(&slow, &new, 10, T0);
            assert_eq!(left, new.capacity - 10, "{new:?}");
        }
        // a part of a token refilled before the change stays a part
        let mut s = TokenBucket::idle(&slow, T0);
        hit(&mut s, &slow, 10, T0);
        let d = hit(&mut s, &params(10, 1000, 1), 0, at(999));
        assert_eq!(d.remaining, 0);
    }

    /// Reference model: a token level counted in "drops" (1 token = P drops,
    /// 1 us adds refill_count drops), advanced step by step.
    #[derive(Debug)]
    struct Reference {
        level: u128,
        last_us: u64,
    }

    impl Reference {
        fn new(p: &TokenBucketParams, now: Micros) -> Self {
            Reference {
                level: p.capacity as u128 * p.refill_ms as u128 * 1000,
                last_us: now.as_us(),
            }
        }
        fn hit(&mut self, p: &TokenBucketParams, cost: u64, now: Micros) -> bool {
            let cap = p.capacity as u128 * p.refill_ms as u128 * 1000;
            let elapsed = now.as_us().saturating_sub(self.last_us) as u128;
            self.level = (self.level + elapsed * p.refill_count as u128).min(cap);
            self.last_us = self.last_us.max(now.as_us());
            let need = cost as u128 * p.refill_ms as u128 * 1000;
            if self.level >= need {
                self.level -= need;
                true
            } else {
                false
            }
        }
    }

    fn arb_params() -> impl Strategy<Value = TokenBucketParams> {
        prop_oneof![
            (1u64..20, 1u64..20, 1u64..2000),
            (1u64..MAX_PARAM, 1u64..MAX_PARAM, 1u64..1000),
            (1u64..5, 1u64..3, 1u64..40_000_000_000),
        ]
        .prop_filter_map("fits the span limit", |(c, rc, ms)| {
            TokenBucketParams::new(c, rc, ms).ok()
        })
    }

    proptest! {
        #[test]
        fn agrees_with_the_reference_model(
            p in arb_params(),
            steps in prop::collection::vec((0u64..3_000_000, 0u64..25), 1..200),
        ) {
            let mut now = T0;
            let mut s = TokenBucket::idle(&p, now);
            let mut r = Reference::new(&p, now);
            for (dt, cost) in steps {
                now = now.saturating_add_us(dt);
                let cost = cost.min(p.capacity + 1);
                let d = hit(&mut s, &p, cost, now);
                let admitted = r.hit(&p, cost, now);
                prop_assert_eq!(d.allowed, admitted || cost == 0);
                let period = p.refill_ms as u128 * 1000;
                prop_assert_eq!(d.remaining as u128, r.level / period);
                if !d.allowed {
                    // the same request is admitted after wait_ms, not 1 ms before
                    let wait = match d.wait { Wait::Ms(w) => w, Wait::Never => {
                        prop_assert!(cost > p.capacity); continue } };
                    let mut later = s;
                    prop_assert!(hit(&mut later, &p, cost, now.saturating_add_ms(wait)).allowed);
                    if wait > 0 {
                        let mut early = s;
                        prop_assert!(!hit(&mut early, &p, cost, now.saturating_add_ms(wait - 1)).allowed);
                    }
                }
            }
        }

        #[test]
        fn admitted_units_never_exceed_capacity_plus_refill(
            p in arb_params(),
            steps in prop::collection::vec((0u64..500_000, 1u64..8), 1..300),
        ) {
            let mut now = T0;
            let mut s = TokenBucket::idle(&p, now);
            let mut admitted: Vec<(u64, u64)> = Vec::new();
            for (dt, cost) in steps {
                now = now.saturating_add_us(dt);
                if hit(&mut s, &p, cost, now).allowed {
                    admitted.push((now.as_us(), cost));
                }
            }
            // every span [a.0, b.0]: sum <= capacity + rc * span / refill_ms
            for i in 0..admitted.len() {
                let mut sum = 0u128;
                for b in &admitted[i..] {
                    sum += b.1 as u128;
                    let span_us = (b.0 - admitted[i].0) as u128;
                    let bound = p.capacity as u128 * p.refill_ms as u128 * 1000
                        + p.refill_count as u128 * span_us;
                    prop_assert!(sum * p.refill_ms as u128 * 1000 <= bound);
                }
            }
        }

        #[test]
        fn a_backwards_clock_never_gives_tokens(
            p in arb_params(),
            used in 0u64..50,
            elapsed in 0u64..5_000_000,
            back in 0u64..50_000_000,
            cost in 1u64..50,
        ) {
            let mut s = TokenBucket::idle(&p, T0);
            hit(&mut s, &p, used.min(p.capacity), T0);
            let now = T0.saturating_add_us(elapsed);
            let before = hit(&mut s, &p, 0, now).remaining;
            let earlier = now.saturating_sub_us(back);
            prop_assert!(hit(&mut s, &p, 0, earlier).remaining <= before);
            if hit(&mut s, &p, cost, earlier).allowed {
                prop_assert!(cost <= before);
            }
        }

        #[test]
        fn parameter_changes_never_open_a_burst(
            a in arb_params(),
            b in arb_params(),
            used in 0u64..50,
            dt in 0u64..10_000_000,
        ) {
            let mut s = TokenBucket::idle(&a, T0);
            let used = used.min(a.capacity);
            hit(&mut s, &a, used, T0);
            let now = T0.saturating_add_us(dt);
            let under_old = hit(&mut s.clone(), &a, 0, now).remaining;
            let under_new = hit(&mut s, &b, 0, now).remaining;
            // neither more than the new capacity, nor more than the old
            // bucket would hold plus the new room
            prop_assert!(under_new <= b.capacity);
            let room = b.capacity.saturating_sub(a.capacity);
            prop_assert!(under_new <= under_old.saturating_add(room));
        }

        /// At the instant of any change (capacity, rate or both), what is
        /// left is the new capacity minus what was consumed, at least 0.
        #[test]
        fn a_change_keeps_what_was_consumed(
            a in arb_params(),
            b in arb_params(),
            used in any::<u64>(),
            dt in 0u64..10_000_000,
        ) {
            let used = used % (a.capacity + 1);
            let now = T0.saturating_add_us(dt);
            let left = remaining_after_change::<TokenBucket>(&a, &b, used, now);
            prop_assert_eq!(left, b.capacity.saturating_sub(used));
        }
    }
}

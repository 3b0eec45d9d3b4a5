//! Fixed window counter, with windows aligned on the Unix epoch.
//!
//! Time is cut into windows `[k * window_ms, (k + 1) * window_ms)` since the
//! epoch, so every node and every client agrees on the boundaries. A window
//! admits requests while its count plus the cost stays within `limit`; the
//! count starts again at zero in the next window.
//!
//! ```text
//! window(now) = [now - now % W, now - now % W + W)
//! admit c     iff count + c <= limit, then count' = count + c
//! wait        = window end - now    (never, if c > limit)
//! reset       = window end - now
//! ```
//!
//! The guarantee is the algorithm's own: at most `limit` units per aligned
//! window, hence at most `2 * limit` in any span of `window_ms` that straddles
//! a boundary. Use the sliding log when that burst matters.
//!
//! The state is the count and the time of the last admitted request: the
//! count belongs to the window that contains that instant.
//!
//! Clock steps backwards: time is taken as `max(now, last)`, so the stored
//! window stays current until the clock passes its end again; a step back
//! never reopens a window.
//!
//! Parameter changes: the count carries over. A new `limit` applies to it at
//! once; under a new `window_ms` the count belongs to the new window that
//! contains the last admitted request, which is where the new setting would
//! have counted that request (earlier ones are counted there too, which is
//! conservative). Shrinking a day window to a second thus frees the counter
//! at the next second boundary, not at midnight.

use super::{Algorithm, Decision, IntegerParam, Micros, Parameters, StateFields, Wait};
use crate::error::{param, ParamError};

/// The parameters of a fixed window (`RL.FIXEDWINDOW`), valid by
/// construction: see [`FixedWindowParams::new`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FixedWindowParams {
    limit: u64,
    window_ms: u64,
}

/// The state of one counter.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FixedWindowState {
    /// When the last admitted request was counted (Unix microseconds).
    pub(crate) last_us: u64,
    /// Units admitted in the window that contains `last_us`.
    pub(crate) count: u64,
}

/// The fixed window algorithm.
pub struct FixedWindow;

impl FixedWindowParams {
    /// `limit` units per window of `window_ms` milliseconds, each 1 to
    /// [`crate::MAX_PARAM`].
    pub fn new(limit: u64, window_ms: u64) -> Result<Self, ParamError> {
        Ok(FixedWindowParams {
            limit: param("limit", limit)?,
            window_ms: param("window_ms", window_ms)?,
        })
    }

    /// Units admitted per window.
    pub fn limit(&self) -> u64 {
        self.limit
    }
    /// The length of a window, in milliseconds.
    pub fn window_ms(&self) -> u64 {
        self.window_ms
    }

    /// End of the window containing `t`, in Unix microseconds.
    fn window_end_us(&self, t: Micros) -> u64 {
        let window_us = self.window_ms * 1000;
        let t = t.as_us();
        t - t % window_us + window_us
    }
}

impl FixedWindowState {
    /// The state's two integers, `last_us, count`, as [`crate::StateFields`]
    /// lists them (for a store that packs them its own way).
    #[inline(always)]
    pub fn to_parts(&self) -> [u64; 2] {
        [self.last_us, self.count]
    }

    /// The state of [`FixedWindowState::to_parts`]'s integers, or `None` if they
    /// break an invariant (as [`crate::StateFields::from_fields`]).
    #[inline(always)]
    pub fn from_parts([last_us, count]: [u64; 2]) -> Option<Self> {
        let state = FixedWindowState { last_us, count };
        state.is_valid().then_some(state)
    }

    /// Checks the invariants a loaded state must hold (a forced call may
    /// leave up to twice the limit counted).
    pub(crate) fn is_valid(&self) -> bool {
        self.last_us <= super::MAX_TIME_US && self.count <= 2 * super::MAX_PARAM
    }

    /// The instant a call at `now` counts at (never before the last counted
    /// request: a step back reopens nothing), and the units its window holds.
    fn current(&self, params: &FixedWindowParams, now: Micros) -> (Micros, u64) {
        let now_eff = now.max(Micros::from_us(self.last_us));
        let same_window =
            params.window_end_us(Micros::from_us(self.last_us)) == params.window_end_us(now_eff);
        (now_eff, if same_window { self.count } else { 0 })
    }
}

/// `limit window_ms`.
impl Parameters for FixedWindowParams {
    const INTEGERS: &'static [IntegerParam] = &[
        IntegerParam::positive("limit"),
        IntegerParam::positive("window_ms"),
    ];
    fn from_integers(values: &[u64]) -> Result<Self, ParamError> {
        FixedWindowParams::new(values[0], values[1])
    }
    fn to_integers(&self, out: &mut impl FnMut(u64)) {
        out(self.limit);
        out(self.window_ms);
    }
}

/// `last_us, count`.
impl StateFields for FixedWindowState {
    fn to_fields(&self, out: &mut impl FnMut(u64)) {
        out(self.last_us);
        out(self.count);
    }

    fn from_fields(next: &mut impl FnMut() -> Option<u64>) -> Option<Self> {
        let state = FixedWindowState {
            last_us: next()?,
            count: next()?,
        };
        state.is_valid().then_some(state)
    }
}

impl Algorithm for FixedWindow {
    type Params = FixedWindowParams;
    type State = FixedWindowState;

    fn idle(_params: &FixedWindowParams, now: Micros) -> FixedWindowState {
        FixedWindowState {
            last_us: now.as_us(),
            count: 0,
        }
    }

    fn apply(
        state: &mut FixedWindowState,
        params: &FixedWindowParams,
        cost: u64,
        now: Micros,
    ) -> Decision {
        let (now_eff, count) = state.current(params, now);
        let end_us = params.window_end_us(now_eff);
        let to_end_ms = (end_us - now.as_us().min(end_us)).div_ceil(1000);
        let remaining = params.limit.saturating_sub(count);
        if cost > 0 && cost <= remaining {
            *state = FixedWindowState {
                last_us: now_eff.as_us(),
                count: count + cost,
            };
            return Decision {
                allowed: true,
                limit: params.limit,
                remaining: remaining - cost,
                wait: Wait::Ms(0),
                reset_ms: to_end_ms,
            };
        }
        Decision {
            allowed: cost == 0,
            limit: params.limit,
            remaining,
            wait: if cost == 0 {
                Wait::Ms(0)
            } else if cost > params.limit {
                Wait::Never
            } else {
                Wait::Ms(to_end_ms)
            },
            reset_ms: if count == 0 { 0 } else { to_end_ms },
        }
    }

    fn force(
        state: &mut FixedWindowState,
        params: &FixedWindowParams,
        cost: u64,
        now: Micros,
    ) -> (Decision, bool) {
        let decision = Self::apply(state, params, cost, now);
        if decision.allowed || cost == 0 {
            return (decision, decision.allowed && cost > 0);
        }
        let (now_eff, count) = state.current(params, now);
        let forced = (count + cost).min(params.limit.saturating_mul(2));
        if forced <= count {
            return (decision, false);
        }
        *state = FixedWindowState {
            last_us: now_eff.as_us(),
            count: forced,
        };
        (decision, true)
    }

    fn refund(
        state: &mut FixedWindowState,
        params: &FixedWindowParams,
        units: u64,
        now: Micros,
    ) -> bool {
        let (_, count) = state.current(params, now);
        let back = units.min(count);
        if back == 0 {
            return false;
        }
        // Still the window of `last_us`: the expiry does not move.
        state.count = count - back;
        true
    }

    fn idle_at_ms(state: &FixedWindowState, params: &FixedWindowParams) -> u64 {
        params.window_end_us(Micros::from_us(state.last_us)) / 1000
    }
}

/// The guarantee the contract checks (`crate::contract`).
impl crate::contract::Guarantee for FixedWindow {
    fn limit(params: &FixedWindowParams) -> u64 {
        params.limit()
    }
    fn check_admissions(p: &FixedWindowParams, admitted: &[(u64, u64)]) {
        // at most `limit` in each window aligned on the epoch
        let window_us = p.window_ms() * 1000;
        for (i, &(first_us, _)) in admitted.iter().enumerate() {
            let window = first_us / window_us;
            let units: u64 = admitted[i..]
                .iter()
                .take_while(|a| a.0 / window_us == window)
                .map(|a| a.1)
                .sum();
            assert!(
                units <= p.limit(),
                "{units} units in the window of {first_us} us"
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::testkit::{apply_checked, remaining_after_change};
    use super::super::MAX_PARAM;
    use super::*;
    use proptest::prelude::*;

    // A multiple of every window used below, so windows start at T0.
    const T0_MS: u64 = 1_700_000_000_000 - 1_700_000_000_000 % 3_600_000;
    const T0: Micros = Micros::from_ms(T0_MS);

    fn params(limit: u64, window_ms: u64) -> FixedWindowParams {
        FixedWindowParams::new(limit, window_ms).expect("valid parameters")
    }
    fn at(ms: u64) -> Micros {
        Micros::from_ms(T0_MS + ms)
    }
    fn hit(s: &mut FixedWindowState, p: &FixedWindowParams, cost: u64, now: Micros) -> Decision {
        apply_checked::<FixedWindow>(s, p, cost, now)
    }

    #[test]
    fn parameters_are_checked_in_argument_order() {
        let range = |arg| ParamError::Range {
            arg,
            min: 1,
            max: MAX_PARAM,
        };
        assert_eq!(FixedWindowParams::new(0, 0), Err(range("limit")));
        assert_eq!(
            FixedWindowParams::new(MAX_PARAM, MAX_PARAM + 1),
            Err(range("window_ms"))
        );
        let p = params(MAX_PARAM, MAX_PARAM);
        assert_eq!((p.limit(), p.window_ms()), (MAX_PARAM, MAX_PARAM));
    }

    #[test]
    fn admits_limit_per_window_then_denies_until_the_boundary() {
        let p = params(3, 1000);
        let mut s = FixedWindow::idle(&p, at(250));
        for left in (0..3).rev() {
            let d = hit(&mut s, &p, 1, at(250));
            assert!(d.allowed);
            assert_eq!((d.remaining, d.reset_ms), (left, 750));
        }
        let d = hit(&mut s, &p, 1, at(250).saturating_add_us(1));
        assert!(!d.allowed);
        assert_eq!(d.wait, Wait::Ms(750)); // 749.999 ms rounded up
        assert!(!hit(&mut s, &p, 1, at(1000).saturating_sub_us(1)).allowed);
        let d = hit(&mut s, &p, 1, at(1000));
        assert!(d.allowed);
        assert_eq!((d.remaining, d.reset_ms), (2, 1000));
    }

    #[test]
    fn windows_are_aligned_on_the_epoch() {
        let p = params(1, 60_000);
        let mut s = FixedWindow::idle(&p, at(123_456));
        let d = hit(&mut s, &p, 1, at(123_456));
        assert_eq!(d.reset_ms, 180_000 - 123_456);
        assert_eq!(FixedWindow::idle_at_ms(&s, &p), T0_MS + 180_000);
    }

    #[test]
    fn cost_above_limit_never_fits_and_cost_zero_peeks() {
        let p = params(5, 1000);
        let mut s = FixedWindow::idle(&p, T0);
        assert_eq!(hit(&mut s, &p, 6, T0).wait, Wait::Never);
        hit(&mut s, &p, 2, T0);
        let d = hit(&mut s, &p, 0, at(400));
        assert_eq!((d.allowed, d.remaining, d.reset_ms), (true, 3, 600));
    }

    #[test]
    fn a_backwards_clock_never_reopens_the_window() {
        let p = params(2, 1000);
        let mut s = FixedWindow::idle(&p, at(5000));
        hit(&mut s, &p, 2, at(5000));
        assert!(!hit(&mut s, &p, 1, at(3500)).allowed);
        assert!(!hit(&mut s, &p, 1, at(5999)).allowed);
        assert!(hit(&mut s, &p, 1, at(6000)).allowed);
    }

    #[test]
    fn lowering_the_limit_applies_to_the_count_so_far() {
        let mut s = FixedWindow::idle(&params(10, 1000), T0);
        hit(&mut s, &params(10, 1000), 8, T0);
        let d = hit(&mut s, &params(5, 1000), 1, at(10));
        assert!(!d.allowed);
        assert_eq!(d.remaining, 0);
        let d = hit(&mut s, &params(20, 1000), 1, at(10));
        assert_eq!((d.allowed, d.remaining), (true, 11));
    }

    #[test]
    fn a_new_window_length_keeps_the_count() {
        let mut s = FixedWindow::idle(&params(10, 60_000), T0);
        hit(&mut s, &params(10, 60_000), 10, at(30_500));
        let d = hit(&mut s, &params(10, 1000), 1, at(30_700));
        assert!(!d.allowed);
        assert_eq!(d.wait, Wait::Ms(300));
        assert!(hit(&mut s, &params(10, 1000), 1, at(31_000)).allowed);
        // and back to a minute: the count of the last second is in this minute
        let d = hit(&mut s, &params(10, 60_000), 0, at(31_500));
        assert_eq!(d.remaining, 9);
    }

    /// The SPEC's reading of a parameter change: the count carries over, so
    /// a raised limit is room at once (10 counted of 10, raised to 100: 90
    /// left, and 90 more are admitted in this window).
    #[test]
    fn a_raised_limit_adds_room_at_once() {
        let left = remaining_after_change::<FixedWindow>(
            &params(10, 60_000),
            &params(100, 60_000),
            10,
            at(30_000),
        );
        assert_eq!(left, 90);
    }

    /// 10 counted of 100, lowered to 20: 10 left, not 20.
    #[test]
    fn a_lowered_limit_applies_at_once() {
        let left = remaining_after_change::<FixedWindow>(
            &params(100, 60_000),
            &params(20, 60_000),
            10,
            at(30_000),
        );
        assert_eq!(left, 10);
    }

    #[test]
    fn huge_parameters_do_not_overflow() {
        let p = params(MAX_PARAM, MAX_PARAM);
        let now = Micros::from_us(u64::MAX / 4);
        let mut s = FixedWindow::idle(&p, now);
        let d = hit(&mut s, &p, MAX_PARAM, now);
        assert!(d.allowed);
        assert!(!hit(&mut s, &p, 1, now).allowed);
    }

    proptest! {
        /// Reference: a plain list of admitted (time, cost), summed per window.
        #[test]
        fn agrees_with_recounting_the_log(
            limit in 1u64..20,
            window_ms in prop_oneof![1u64..10, 1u64..5000, Just(60_000u64)],
            steps in prop::collection::vec((0u64..400_000, 0u64..6), 1..300),
        ) {
            let p = params(limit, window_ms);
            let mut now = T0.as_us() + 7;
            let mut s = FixedWindow::idle(&p, Micros::from_us(now));
            let mut log: Vec<(u64, u64)> = Vec::new();
            for (dt, cost) in steps {
                now += dt;
                let w = (now / 1000) / window_ms;
                let used: u64 = log.iter().filter(|e| e.0 / 1000 / window_ms == w).map(|e| e.1).sum();
                let d = hit(&mut s, &p, cost, Micros::from_us(now));
                prop_assert_eq!(d.allowed, cost == 0 || used + cost <= limit);
                prop_assert_eq!(d.remaining, limit - used - if d.allowed { cost } else { 0 });
                if d.allowed && cost > 0 {
                    log.push((now, cost));
                }
                let window_end_us = (w + 1) * window_ms * 1000;
                if !d.allowed && cost <= limit {
                    prop_assert_eq!(d.wait, Wait::Ms((window_end_us - now).div_ceil(1000)));
                }
            }
        }

        #[test]
        fn parameter_changes_never_drop_the_count(
            a in (1u64..100, 1u64..100_000),
            b in (1u64..100, 1u64..100_000),
            used in 0u64..100,
            dt in 0u64..100_000_000,
        ) {
            let (pa, pb) = (params(a.0, a.1), params(b.0, b.1));
            let mut s = FixedWindow::idle(&pa, T0);
            let used = used.min(pa.limit);
            hit(&mut s, &pa, used, T0);
            let now = T0.saturating_add_us(dt);
            let old = hit(&mut s.clone(), &pa, 0, now).remaining;
            let new = hit(&mut s, &pb, 0, now).remaining;
            // the last request's window under the new setting still runs:
            // the count is kept under the new limit
            let last_window_end = (T0.as_us() / 1000 / pb.window_ms + 1) * pb.window_ms * 1000;
            if now.as_us() < last_window_end && used > 0 {
                prop_assert_eq!(new, pb.limit.saturating_sub(used));
            }
            if dt < pa.window_ms * 1000 && now.as_us() < last_window_end {
                prop_assert!(new <= old.saturating_add(pb.limit.saturating_sub(pa.limit)));
            }
        }

        /// At the instant of any change (limit, window or both), what is
        /// left is the new limit minus the count, at least 0: the window
        /// the count moves to holds that instant.
        #[test]
        fn a_change_keeps_what_was_counted(
            a in (1u64..MAX_PARAM, 1u64..MAX_PARAM),
            b in (1u64..MAX_PARAM, 1u64..MAX_PARAM),
            used in any::<u64>(),
            dt in 0u64..100_000_000_000,
        ) {
            let (pa, pb) = (params(a.0, a.1), params(b.0, b.1));
            let used = used % (pa.limit + 1);
            let now = T0.saturating_add_us(dt);
            let left = remaining_after_change::<FixedWindow>(&pa, &pb, used, now);
            prop_assert_eq!(left, pb.limit.saturating_sub(used));
        }
    }
}

//! Calendar quota: at most `limit` units per calendar period (a day, an ISO
//! week, a month, a year) in a time zone.
//!
//! A quota is a fixed window whose windows are calendar periods rather than
//! multiples of a length: a day in `America/New_York` lasts 23 hours on the
//! day daylight saving starts. The calendar is the caller's: this crate reads
//! no time-zone database. The caller resolves the period of a call, that is
//! the end of the period that contains `now` in the quota's zone
//! ([`QuotaParams::at_end`]), and the algorithm counts in it.
//!
//! ```text
//! period(now) = [start, end) in the zone, end given by the caller
//! admit c     iff count + c <= limit, then count' = count + c
//! wait        = end - now        (the next period starts; never if c > limit)
//! reset       = end - now
//! ```
//!
//! The state is the end of the period it counts in and the count. While that
//! end is ahead of `now`, the count stays in it, whatever the call's period:
//! a change of period or zone keeps the count until the period the key was
//! counting in ends. Then a new period starts from zero, ending where the
//! call says. A clock that steps backwards stays in the stored period.
//!
//! Parameter changes: a new `limit` applies to the count at once.

use super::{Algorithm, Decision, IntegerParam, Micros, Parameters, StateFields, Wait};
use crate::error::{param, ParamError};

/// The calendar periods, as the `period` parameter numbers them.
pub const PERIODS: &[&str] = &["DAY", "WEEK", "MONTH", "YEAR"];

/// A calendar period.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Period {
    /// From midnight to midnight.
    Day,
    /// An ISO 8601 week, from Monday 00:00 to the next.
    Week,
    /// From the first of a month to the first of the next.
    Month,
    /// From the first of January to the next.
    Year,
}

impl Period {
    /// The period numbered `n` in [`PERIODS`].
    pub fn from_index(n: u64) -> Option<Period> {
        Some(match n {
            0 => Period::Day,
            1 => Period::Week,
            2 => Period::Month,
            3 => Period::Year,
            _ => return None,
        })
    }

    /// Its number in [`PERIODS`].
    pub fn index(self) -> u64 {
        self as u64
    }
}

/// The parameters of a quota (`RL.QUOTA`), valid by construction: see
/// [`QuotaParams::new`]. The zone is the caller's to keep (this crate reads
/// no time-zone database): the parameters carry the end of the period of the
/// call instead, which the caller sets with [`QuotaParams::at_end`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QuotaParams {
    limit: u64,
    period: Period,
    /// End of the period that contains the call's time (Unix microseconds);
    /// 0 until the caller resolves it.
    end_us: u64,
}

/// The state of one quota.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QuotaState {
    /// End of the period the count belongs to (Unix microseconds).
    pub(crate) end_us: u64,
    /// Units admitted in that period.
    pub(crate) count: u64,
}

/// The calendar quota algorithm.
pub struct Quota;

impl QuotaParams {
    /// `limit` units (1 to [`crate::MAX_PARAM`]) per `period`.
    pub fn new(limit: u64, period: Period) -> Result<Self, ParamError> {
        Ok(QuotaParams {
            limit: param("limit", limit)?,
            period,
            end_us: 0,
        })
    }

    /// Units admitted per period.
    pub fn limit(&self) -> u64 {
        self.limit
    }

    /// The period.
    pub fn period(&self) -> Period {
        self.period
    }

    /// The same parameters for a call whose period (in the quota's zone)
    /// ends at `end` (after the call's time, at most [`crate::MAX_TIME_US`]).
    pub fn at_end(self, end: Micros) -> Self {
        QuotaParams {
            end_us: end.as_us().min(super::MAX_TIME_US),
            ..self
        }
    }

    /// The end of the call's period, as set by [`QuotaParams::at_end`].
    pub fn end(&self) -> Micros {
        Micros::from_us(self.end_us)
    }

    /// The end of the period of a call at `now`: the caller's, or, if it
    /// set none after `now`, the end of the period in UTC; always after
    /// `now` (at the very end of time, a microsecond after it).
    fn end_after(&self, now: Micros) -> u64 {
        let end = if self.end_us > now.as_us() {
            self.end_us
        } else {
            utc_period_end(self.period, now).as_us()
        };
        end.max(now.as_us() + 1)
    }
}

/// The end of the `period` that contains `now` in UTC (pure calendar
/// arithmetic: no time-zone database is needed for UTC).
pub fn utc_period_end(period: Period, now: Micros) -> Micros {
    const DAY_US: u64 = 86_400_000_000;
    let day = now.as_us() / DAY_US;
    let next_day = match period {
        Period::Day => day + 1,
        // 1970-01-01 was a Thursday: Monday is day 4 (mod 7).
        Period::Week => day + 7 - (day + 3) % 7,
        Period::Month => {
            let (y, m, _) = civil_from_days(day);
            let (y, m) = if m == 12 { (y + 1, 1) } else { (y, m + 1) };
            days_from_civil(y, m, 1)
        }
        Period::Year => {
            let (y, _, _) = civil_from_days(day);
            days_from_civil(y + 1, 1, 1)
        }
    };
    Micros::from_us(next_day.saturating_mul(DAY_US).min(super::MAX_TIME_US))
}

/// Days since 1970-01-01 to (year, month, day), proleptic Gregorian
/// (H. Hinnant's `civil_from_days`, for days from the epoch on).
fn civil_from_days(days: u64) -> (u64, u64, u64) {
    let z = days + 719_468;
    let era = z / 146_097;
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + u64::from(m <= 2);
    (y, m, d)
}

/// (year, month, day) to days since 1970-01-01 (the inverse, from 1970 on).
fn days_from_civil(y: u64, m: u64, d: u64) -> u64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y / 400;
    let yoe = y - era * 400;
    let mp = if m > 2 { m - 3 } else { m + 9 };
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    (era * 146_097 + doe).saturating_sub(719_468)
}

impl QuotaState {
    /// The state's two integers, `end_us, count`, as [`crate::StateFields`]
    /// lists them (for a store that packs them its own way).
    #[inline(always)]
    pub fn to_parts(&self) -> [u64; 2] {
        [self.end_us, self.count]
    }

    /// The state of [`QuotaState::to_parts`]'s integers, or `None` if they
    /// break an invariant (as [`crate::StateFields::from_fields`]).
    #[inline(always)]
    pub fn from_parts([end_us, count]: [u64; 2]) -> Option<Self> {
        let state = QuotaState { end_us, count };
        state.is_valid().then_some(state)
    }

    pub(crate) fn is_valid(&self) -> bool {
        self.end_us <= super::MAX_TIME_US + 1 && self.count <= 2 * super::MAX_PARAM
    }

    /// The end of the period a call at `now` counts in, and its count.
    fn current(&self, params: &QuotaParams, now: Micros) -> (u64, u64) {
        if now.as_us() < self.end_us {
            (self.end_us, self.count)
        } else {
            (params.end_after(now), 0)
        }
    }
}

/// `limit period` (the period by its number in [`PERIODS`]).
impl Parameters for QuotaParams {
    const INTEGERS: &'static [IntegerParam] = &[
        IntegerParam::positive("limit"),
        IntegerParam::keyword("period", PERIODS),
    ];
    fn from_integers(values: &[u64]) -> Result<Self, ParamError> {
        let period = Period::from_index(values[1]).ok_or(ParamError::Range {
            arg: "period",
            min: 0,
            max: PERIODS.len() as u64 - 1,
        })?;
        QuotaParams::new(values[0], period)
    }
    fn to_integers(&self, out: &mut impl FnMut(u64)) {
        out(self.limit);
        out(self.period.index());
    }
}

/// `end_us, count`.
impl StateFields for QuotaState {
    fn to_fields(&self, out: &mut impl FnMut(u64)) {
        out(self.end_us);
        out(self.count);
    }

    fn from_fields(next: &mut impl FnMut() -> Option<u64>) -> Option<Self> {
        let state = QuotaState {
            end_us: next()?,
            count: next()?,
        };
        state.is_valid().then_some(state)
    }
}

/// At most `limit` units in each period (here the UTC periods, which the
/// contract's calls, with no end set, count in).
impl crate::contract::Guarantee for Quota {
    fn limit(params: &QuotaParams) -> u64 {
        params.limit()
    }
    fn check_admissions(p: &QuotaParams, admitted: &[(u64, u64)]) {
        for (i, &(first_us, _)) in admitted.iter().enumerate() {
            let end = p.end_after(Micros::from_us(first_us));
            let units: u64 = admitted[i..]
                .iter()
                .take_while(|a| a.0 < end)
                .map(|a| a.1)
                .sum();
            assert!(
                units <= p.limit(),
                "{units} units in the period of {first_us} us"
            );
        }
    }
}

impl Algorithm for Quota {
    type Params = QuotaParams;
    type State = QuotaState;

    fn idle(_params: &QuotaParams, _now: Micros) -> QuotaState {
        QuotaState {
            end_us: 0,
            count: 0,
        }
    }

    fn apply(state: &mut QuotaState, params: &QuotaParams, cost: u64, now: Micros) -> Decision {
        let (end_us, count) = state.current(params, now);
        let to_end_ms = (end_us - now.as_us().min(end_us)).div_ceil(1000);
        let remaining = params.limit.saturating_sub(count);
        if cost > 0 && cost <= remaining {
            *state = QuotaState {
                end_us,
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
                Wait::Ms(to_end_ms.max(1))
            },
            reset_ms: if count == 0 { 0 } else { to_end_ms },
        }
    }

    fn force(
        state: &mut QuotaState,
        params: &QuotaParams,
        cost: u64,
        now: Micros,
    ) -> (Decision, bool) {
        let decision = Self::apply(state, params, cost, now);
        if decision.allowed || cost == 0 {
            return (decision, decision.allowed && cost > 0);
        }
        let (end_us, count) = state.current(params, now);
        let forced = (count + cost).min(params.limit.saturating_mul(2));
        if forced <= count {
            return (decision, false);
        }
        *state = QuotaState {
            end_us,
            count: forced,
        };
        (decision, true)
    }

    fn refund(state: &mut QuotaState, params: &QuotaParams, units: u64, now: Micros) -> bool {
        let (end_us, count) = state.current(params, now);
        let back = units.min(count);
        if back == 0 {
            return false;
        }
        *state = QuotaState {
            end_us,
            count: count - back,
        };
        true
    }

    fn idle_at_ms(state: &QuotaState, _params: &QuotaParams) -> u64 {
        if state.count == 0 {
            0
        } else {
            state.end_us.div_ceil(1000)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::testkit::{apply_checked, assert_fields_round_trip};
    use super::*;
    use proptest::prelude::*;

    const DAY_MS: u64 = 86_400_000;
    // 2026-03-08T00:00:00Z.
    const T0_MS: u64 = 1_772_928_000_000;

    fn at(ms: u64) -> Micros {
        Micros::from_ms(T0_MS + ms)
    }
    /// A daily quota in UTC, resolved for a call at `now`.
    fn daily(limit: u64, now: Micros) -> QuotaParams {
        let end = now.as_ms_floor() - now.as_ms_floor() % DAY_MS + DAY_MS;
        QuotaParams::new(limit, Period::Day)
            .unwrap()
            .at_end(Micros::from_ms(end))
    }
    fn hit(s: &mut QuotaState, limit: u64, cost: u64, now: Micros) -> Decision {
        apply_checked::<Quota>(s, &daily(limit, now), cost, now)
    }

    #[test]
    fn periods_are_words_and_limits_are_checked() {
        assert_eq!(PERIODS, ["DAY", "WEEK", "MONTH", "YEAR"]);
        for (i, _) in PERIODS.iter().enumerate() {
            assert_eq!(Period::from_index(i as u64).unwrap().index(), i as u64);
        }
        assert_eq!(Period::from_index(4), None);
        assert!(QuotaParams::new(0, Period::Day).is_err());
        assert!(QuotaParams::from_integers(&[5, 4]).is_err());
        let p = QuotaParams::from_integers(&[5, 2]).unwrap();
        assert_eq!((p.limit(), p.period()), (5, Period::Month));
        let mut back = Vec::new();
        p.to_integers(&mut |v| back.push(v));
        assert_eq!(back, [5, 2]);
    }

    #[test]
    fn admits_limit_per_period_then_denies_until_it_ends() {
        let mut s = Quota::idle(&daily(3, at(0)), at(0));
        for left in (0..3).rev() {
            let d = hit(&mut s, 3, 1, at(1000));
            assert!(d.allowed);
            assert_eq!((d.remaining, d.reset_ms), (left, DAY_MS - 1000));
        }
        let d = hit(&mut s, 3, 1, at(2000));
        assert!(!d.allowed);
        assert_eq!(d.wait, Wait::Ms(DAY_MS - 2000));
        assert_eq!(hit(&mut s, 3, 4, at(2000)).wait, Wait::Never);
        assert!(!hit(&mut s, 3, 1, at(DAY_MS - 1)).allowed);
        let d = hit(&mut s, 3, 1, at(DAY_MS));
        assert!(d.allowed && d.remaining == 2 && d.reset_ms == DAY_MS);
        assert_eq!(
            Quota::idle_at_ms(&s, &daily(3, at(DAY_MS))),
            T0_MS + 2 * DAY_MS
        );
    }

    #[test]
    fn a_new_period_or_zone_keeps_the_count_until_the_old_period_ends() {
        let mut s = Quota::idle(&daily(2, at(0)), at(0));
        assert!(hit(&mut s, 2, 2, at(0)).allowed);
        // The same instant, asked as a month: the count stays in the day.
        let month = QuotaParams::new(2, Period::Month)
            .unwrap()
            .at_end(Micros::from_ms(T0_MS + 24 * DAY_MS));
        let d = apply_checked::<Quota>(&mut s, &month, 1, at(5));
        assert!(!d.allowed && d.wait == Wait::Ms(DAY_MS - 5));
        // From the end of the day on, the month counts afresh.
        let d = apply_checked::<Quota>(&mut s, &month, 1, at(DAY_MS));
        assert!(d.allowed && d.reset_ms == 23 * DAY_MS);
        // A raised limit gives room at once; the count carries over.
        let raised = month.at_end(Micros::from_ms(T0_MS + 24 * DAY_MS));
        let raised = QuotaParams {
            limit: 10,
            ..raised
        };
        assert_eq!(
            apply_checked::<Quota>(&mut s, &raised, 0, at(DAY_MS)).remaining,
            9
        );
    }

    #[test]
    fn force_refund_and_a_clock_stepping_back() {
        let mut s = Quota::idle(&daily(2, at(0)), at(0));
        let (d, changed) = Quota::force(&mut s, &daily(2, at(10)), 5, at(10));
        assert!(!d.allowed && changed);
        assert_eq!(s.count, 4, "at most a limit of debt");
        assert!(Quota::refund(&mut s, &daily(2, at(20)), 3, at(20)));
        assert_eq!(s.count, 1);
        assert!(!Quota::refund(
            &mut QuotaState {
                end_us: 0,
                count: 0
            },
            &daily(2, at(0)),
            1,
            at(0)
        ));
        // A step back stays in the stored period.
        assert!(hit(&mut s, 2, 1, at(5)).allowed);
        assert!(!hit(&mut s, 2, 1, at(1)).allowed);
    }

    #[test]
    fn utc_periods_end_on_the_calendar() {
        let ms = |text_ms: u64| Micros::from_ms(text_ms);
        // 2026-03-08T12:00Z (a Sunday).
        let t = ms(T0_MS + 12 * 3_600_000);
        assert_eq!(utc_period_end(Period::Day, t), ms(T0_MS + DAY_MS));
        assert_eq!(
            utc_period_end(Period::Week, t),
            ms(T0_MS + DAY_MS),
            "Monday 03-09"
        );
        assert_eq!(
            utc_period_end(Period::Week, ms(T0_MS + DAY_MS)),
            ms(T0_MS + 8 * DAY_MS)
        );
        // 2026-04-01 and 2027-01-01.
        assert_eq!(utc_period_end(Period::Month, t), ms(1_775_001_600_000));
        assert_eq!(utc_period_end(Period::Year, t), ms(1_798_761_600_000));
        // 2028-02-29T23:59:59Z ends on 2028-03-01; 2028-02-28 has a 29th next.
        assert_eq!(
            utc_period_end(Period::Month, ms(1_835_481_599_000)),
            ms(1_835_481_600_000)
        );
        assert_eq!(
            utc_period_end(Period::Day, ms(1_835_308_800_000)),
            ms(1_835_395_200_000)
        );
        for days in [0u64, 59, 365, 10_956, 20_520, 2_932_896] {
            let (y, m, d) = civil_from_days(days);
            assert_eq!(days_from_civil(y, m, d), days, "{y}-{m}-{d}");
        }
    }

    #[test]
    fn at_the_end_of_time_a_period_still_ends_after_the_call() {
        // The fuzzer's finding: at the latest instant a call may run at, the
        // UTC period's end is clamped to that instant; the count must still
        // hold for a peek at the same instant.
        let now = Micros::from_us(super::super::MAX_TIME_US);
        let p = QuotaParams::new(5, Period::Day).unwrap();
        let mut s = Quota::idle(&p, now);
        assert!(apply_checked::<Quota>(&mut s, &p, 2, now).allowed);
        assert_eq!(Quota::decide(&s, &p, 0, now).remaining, 3);
        let (_, changed) = Quota::force(&mut s, &p, 9, now);
        assert!(changed && s.count == 10);
        assert_fields_round_trip(&s);
    }

    proptest! {
        /// Against a brute-force model: per UTC day, the admitted units
        /// never exceed the limit, and a request is denied only when it
        /// would.
        #[test]
        fn at_most_limit_per_day(limit in 1u64..20, calls in proptest::collection::vec((0u64..3 * DAY_MS, 0u64..6), 1..60)) {
            let mut calls = calls;
            calls.sort();
            let mut s = Quota::idle(&daily(limit, at(0)), at(0));
            let mut per_day = std::collections::HashMap::new();
            for (t, cost) in calls {
                let day = t / DAY_MS;
                let used = *per_day.get(&day).unwrap_or(&0);
                let d = hit(&mut s, limit, cost, at(t));
                prop_assert_eq!(d.allowed, cost == 0 || used + cost <= limit);
                if d.allowed {
                    per_day.insert(day, used + cost);
                }
            }
        }
    }
}

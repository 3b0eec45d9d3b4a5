//! Concurrency limiter: at most `limit` units held at once, by leases.
//!
//! A request of `cost` units is granted a lease when the units held by live
//! leases plus `cost` stay within `limit`. A lease ends when it is released
//! or `lease_ms` after it was granted or last renewed, whichever comes
//! first, so a holder that crashes frees its units by itself (Stripe's
//! concurrent-requests limiter, the IETF draft's `qu="concurrent-requests"`).
//!
//! ```text
//! held(now)   = sum of units of leases with expires > now
//! admit c     iff held(now) + c <= limit: lease (id, now + lease_ms, c)
//! wait        = time until enough leases expire for c to fit (never, if c > limit)
//! reset       = time until the key may vanish: every lease expired
//! ```
//!
//! Lease ids: a new id is `max(last id + 1, now in Unix microseconds)`, so
//! ids grow, and an id is never handed out twice for a key name, even after
//! the key vanished and came back: the key lives at least until the clock has
//! passed its last id ([`Algorithm::idle_at_ms`]), so a key made again later
//! starts above every id the old one gave. The ids are a pure function of the
//! calls and their (pinned) times, so a replica and an AOF replay give the
//! same ids. (A clock stepped back by more than a key's idle time can reuse an
//! id, as it would make Redis's own expiries misbehave.)
//!
//! Clock steps backwards: time is taken as `max(now, last)`, so a lease never
//! comes back to life and never ends early.
//!
//! Parameter changes: a new `limit` applies at once to the units held; a new
//! `lease_ms` applies to leases granted or renewed from then on.
//!
//! `COST n FORCE` grants a lease even when the units do not fit, never
//! holding more than `2 * limit`; `REFUND n` takes units back from the newest
//! leases first (a lease left with none ends).
//!
//! Memory: one lease (24 bytes) per holder; calls are O(N) in the leases.

use super::{Algorithm, Decision, IntegerParam, Micros, Parameters, StateFields, Wait};
use crate::error::{in_range, param, ParamError};

/// The largest `limit`: 2^24 - 1 units held, so a key holds at most
/// `2 * MAX_LIMIT` leases (each holds at least one unit).
pub const MAX_LIMIT: u64 = (1 << 24) - 1;

/// The parameters of a concurrency limiter (`RL.CONCURRENCY`), valid by
/// construction: see [`ConcurrencyParams::new`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConcurrencyParams {
    limit: u64,
    lease_ms: u64,
}

/// One lease: its id, when it ends (Unix microseconds) and its units.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Lease {
    /// Its id (at least 1), as the reply gives it.
    pub id: u64,
    /// When it ends, unless renewed (Unix microseconds, exclusive).
    pub expires_us: u64,
    /// The units it holds (at least 1).
    pub units: u64,
}

/// The state of one concurrency limiter.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConcurrencyState {
    /// The latest instant a call changed the state at (Unix microseconds).
    pub(crate) last_us: u64,
    /// The last id granted (0 before any).
    pub(crate) last_id: u64,
    /// The leases, in the order granted (ids ascending); some may have
    /// expired since the last change.
    pub(crate) leases: Vec<Lease>,
    /// The latest `expires_us` of `leases` (0 if none): derived from them,
    /// not one of the state's fields, kept so that the key's idle instant
    /// and `reset_ms` take no walk over the leases.
    pub(crate) end_us: u64,
}

/// The concurrency algorithm.
pub struct Concurrency;

impl ConcurrencyParams {
    /// At most `limit` units (1 to [`MAX_LIMIT`]) held at once, each lease
    /// for `lease_ms` milliseconds (1 to [`crate::MAX_PARAM`]).
    pub fn new(limit: u64, lease_ms: u64) -> Result<Self, ParamError> {
        Ok(ConcurrencyParams {
            limit: in_range("limit", limit, 1, MAX_LIMIT)?,
            lease_ms: param("lease_ms", lease_ms)?,
        })
    }

    /// Units held at most.
    pub fn limit(&self) -> u64 {
        self.limit
    }
    /// How long a lease lasts unless released or renewed, in milliseconds.
    pub fn lease_ms(&self) -> u64 {
        self.lease_ms
    }
}

impl ConcurrencyState {
    /// The leases live at `now`.
    pub fn live(&self, now: Micros) -> impl Iterator<Item = &Lease> {
        let now = now.as_us().max(self.last_us);
        self.leases.iter().filter(move |l| l.expires_us > now)
    }

    /// Units held by the leases live at `now`.
    pub fn held(&self, now: Micros) -> u64 {
        self.live(now).map(|l| l.units).sum()
    }

    /// The instant a call at `now` runs at: never before the last change.
    fn effective(&self, now: Micros) -> u64 {
        now.as_us().max(self.last_us)
    }

    /// Drops the leases that ended by `at_us` (and learns when the others
    /// end, in the same walk).
    fn prune(&mut self, at_us: u64) {
        let mut end_us = 0;
        self.leases.retain(|l| {
            let live = l.expires_us > at_us;
            if live {
                end_us = end_us.max(l.expires_us);
            }
            live
        });
        self.end_us = end_us;
    }

    /// The latest expiry of the leases, walked (after a change that may
    /// have taken it away).
    fn latest_end(leases: &[Lease]) -> u64 {
        leases.iter().map(|l| l.expires_us).fold(0, u64::max)
    }

    /// The id of the last lease granted.
    pub fn last_id(&self) -> u64 {
        self.last_id
    }

    /// When the last live lease ends (Unix microseconds), or `at_us` if none.
    fn all_end_us(&self, at_us: u64) -> u64 {
        debug_assert_eq!(self.end_us, Self::latest_end(&self.leases));
        self.end_us.max(at_us)
    }

    /// The key's TTL from `now`, in milliseconds, rounded up.
    fn reset_ms(&self, now: Micros) -> u64 {
        idle_at_us(self.all_end_us(0), self.last_id)
            .saturating_sub(now.as_us())
            .div_ceil(1000)
    }

    /// Grants a lease of `units` at `at_us` for `lease_ms`.
    fn grant(&mut self, at_us: u64, lease_ms: u64, units: u64) {
        self.prune(at_us);
        let id = (self.last_id + 1)
            .max(at_us)
            .max(1)
            .min(i64::MAX as u64 - 1);
        let expires_us = at_us.saturating_add(lease_ms * 1000);
        self.leases.push(Lease {
            id,
            expires_us,
            units,
        });
        self.end_us = self.end_us.max(expires_us);
        self.last_id = id;
        self.last_us = at_us;
    }

    /// Ends lease `id` if it is live at `now`; whether it was.
    pub fn release(&mut self, id: u64, now: Micros) -> bool {
        let at = self.effective(now);
        let Some(i) = self
            .leases
            .iter()
            .position(|l| l.id == id && l.expires_us > at)
        else {
            return false;
        };
        self.leases.remove(i);
        self.prune(at);
        self.last_us = at;
        true
    }

    /// Makes lease `id`, if live at `now`, end `lease_ms` after `now`;
    /// whether it was live.
    pub fn renew(&mut self, id: u64, lease_ms: u64, now: Micros) -> bool {
        let at = self.effective(now);
        let Some(lease) = self
            .leases
            .iter_mut()
            .find(|l| l.id == id && l.expires_us > at)
        else {
            return false;
        };
        lease.expires_us = at.saturating_add(lease_ms.min(crate::MAX_PARAM) * 1000);
        self.prune(at);
        self.last_us = at;
        true
    }

    fn is_valid(&self) -> bool {
        let mut previous = 0;
        self.last_us <= super::MAX_TIME_US
            && self.last_id < i64::MAX as u64
            && self.leases.iter().all(|l| {
                let ordered = l.id > previous && l.id <= self.last_id;
                previous = l.id;
                ordered
                    && (1..=2 * MAX_LIMIT).contains(&l.units)
                    && l.expires_us <= super::MAX_STATE_MS * 1000
            })
            && self.leases.iter().map(|l| l.units).sum::<u64>() <= 2 * MAX_LIMIT
    }
}

/// The Unix millisecond from which the state is idle and its key may vanish:
/// every lease ended, and the clock past the last id (so that ids are never
/// reused for the key name).
fn idle_at(state: &ConcurrencyState) -> u64 {
    idle_at_us(state.all_end_us(0), state.last_id).div_ceil(1000)
}

/// The instant (Unix microseconds) the leases ending by `leases_end_us`
/// have ended and the clock is past `last_id` in the millisecond of it.
fn idle_at_us(leases_end_us: u64, last_id: u64) -> u64 {
    leases_end_us.max((last_id / 1000 + 1) * 1000)
}

/// `limit lease_ms`.
impl Parameters for ConcurrencyParams {
    const INTEGERS: &'static [IntegerParam] = &[
        IntegerParam {
            name: "limit",
            min: 1,
            max: MAX_LIMIT,
            keywords: &[],
        },
        IntegerParam::positive("lease_ms"),
    ];
    fn from_integers(values: &[u64]) -> Result<Self, ParamError> {
        ConcurrencyParams::new(values[0], values[1])
    }
    fn to_integers(&self, out: &mut impl FnMut(u64)) {
        out(self.limit);
        out(self.lease_ms);
    }
}

/// `last_us, last_id, n, (id, expires_us, units) * n`.
impl StateFields for ConcurrencyState {
    fn to_fields(&self, out: &mut impl FnMut(u64)) {
        out(self.last_us);
        out(self.last_id);
        out(self.leases.len() as u64);
        for lease in &self.leases {
            out(lease.id);
            out(lease.expires_us);
            out(lease.units);
        }
    }

    fn from_fields(next: &mut impl FnMut() -> Option<u64>) -> Option<Self> {
        let last_us = next()?;
        let last_id = next()?;
        let len = next()?;
        if len > 2 * MAX_LIMIT {
            return None;
        }
        let mut leases = Vec::new();
        for _ in 0..len {
            leases.push(Lease {
                id: next()?,
                expires_us: next()?,
                units: next()?,
            });
        }
        let state = ConcurrencyState {
            last_us,
            last_id,
            end_us: ConcurrencyState::latest_end(&leases),
            leases,
        };
        state.is_valid().then_some(state)
    }

    fn heap_bytes(&self) -> usize {
        self.leases.capacity() * std::mem::size_of::<Lease>()
    }
}

impl Algorithm for Concurrency {
    type Params = ConcurrencyParams;
    type State = ConcurrencyState;

    fn idle(_params: &ConcurrencyParams, now: Micros) -> ConcurrencyState {
        ConcurrencyState {
            last_us: now.as_us(),
            last_id: 0,
            leases: Vec::new(),
            end_us: 0,
        }
    }

    fn apply(
        state: &mut ConcurrencyState,
        params: &ConcurrencyParams,
        cost: u64,
        now: Micros,
    ) -> Decision {
        let decision = Self::decide(state, params, cost, now);
        if decision.allowed && cost > 0 {
            state.grant(state.effective(now), params.lease_ms, cost);
            return Decision {
                reset_ms: state.reset_ms(now),
                ..decision
            };
        }
        decision
    }

    fn decide(
        state: &ConcurrencyState,
        params: &ConcurrencyParams,
        cost: u64,
        now: Micros,
    ) -> Decision {
        let held = state.held(now);
        let remaining = params.limit.saturating_sub(held);
        let fits = cost <= remaining;
        let wait = if fits {
            Wait::Ms(0)
        } else if cost > params.limit {
            Wait::Never
        } else {
            // Leases end in order of expiry: the first instant enough of
            // them have ended for `cost` to fit.
            let mut ends: Vec<(u64, u64)> =
                state.live(now).map(|l| (l.expires_us, l.units)).collect();
            ends.sort_unstable();
            let mut still = held;
            let mut at = now.as_us();
            for (end, units) in ends {
                still -= units;
                at = end;
                if still + cost <= params.limit {
                    break;
                }
            }
            Wait::Ms((at - now.as_us().min(at)).div_ceil(1000))
        };
        let remaining = if fits && cost > 0 {
            remaining - cost
        } else {
            remaining
        };
        let reset_ms = if fits && cost > 0 {
            // A lease granted now ends lease_ms from now.
            let at_us = state.effective(now);
            let id = (state.last_id + 1).max(at_us).max(1);
            let end_us = state
                .all_end_us(0)
                .max(at_us.saturating_add(params.lease_ms * 1000));
            idle_at_us(end_us, id)
                .saturating_sub(now.as_us())
                .div_ceil(1000)
        } else {
            state.reset_ms(now)
        };
        Decision {
            allowed: fits,
            limit: params.limit,
            remaining,
            wait,
            reset_ms,
        }
    }

    fn force(
        state: &mut ConcurrencyState,
        params: &ConcurrencyParams,
        cost: u64,
        now: Micros,
    ) -> (Decision, bool) {
        let decision = Self::apply(state, params, cost, now);
        if decision.allowed || cost == 0 {
            return (decision, decision.allowed && cost > 0);
        }
        let held = state.held(now);
        let units = cost.min((params.limit * 2).saturating_sub(held));
        if units == 0 {
            return (decision, false);
        }
        state.grant(state.effective(now), params.lease_ms, units);
        (decision, true)
    }

    fn refund(
        state: &mut ConcurrencyState,
        _params: &ConcurrencyParams,
        units: u64,
        now: Micros,
    ) -> bool {
        let at = state.effective(now);
        if units == 0 || state.held(now) == 0 {
            return false;
        }
        state.prune(at);
        let mut left = units;
        while left > 0 {
            let Some(newest) = state.leases.last_mut() else {
                break;
            };
            let back = left.min(newest.units);
            newest.units -= back;
            left -= back;
            if newest.units == 0 {
                state.leases.pop();
            }
        }
        state.end_us = ConcurrencyState::latest_end(&state.leases);
        state.last_us = at;
        true
    }

    fn idle_at_ms(state: &ConcurrencyState, _params: &ConcurrencyParams) -> u64 {
        idle_at(state)
    }

    fn lease_granted(state: &ConcurrencyState) -> u64 {
        state.last_id
    }

    fn release(state: &mut ConcurrencyState, id: u64, now: Micros) -> Option<u64> {
        state.release(id, now).then(|| idle_at(state))
    }

    fn renew(state: &mut ConcurrencyState, id: u64, lease_ms: u64, now: Micros) -> Option<u64> {
        state.renew(id, lease_ms, now).then(|| idle_at(state))
    }
}

/// The guarantee the contract checks (`crate::contract`): without releases,
/// every admitted unit is held for `lease_ms`, so the units admitted in any
/// span shorter than `lease_ms` never exceed `limit`.
impl crate::contract::Guarantee for Concurrency {
    fn limit(params: &ConcurrencyParams) -> u64 {
        params.limit()
    }
    fn check_admissions(p: &ConcurrencyParams, admitted: &[(u64, u64)]) {
        let lease_us = p.lease_ms() * 1000;
        for (i, &(first_us, _)) in admitted.iter().enumerate() {
            let held: u64 = admitted[i..]
                .iter()
                .take_while(|a| a.0 < first_us + lease_us)
                .map(|a| a.1)
                .sum();
            assert!(
                held <= p.limit(),
                "{held} units held within a lease of {first_us} us"
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::testkit::{apply_checked, remaining_after_change};
    use super::super::{run, Request};
    use super::*;
    use proptest::prelude::*;

    const T0: Micros = Micros::from_ms(1_700_000_000_000);

    fn at(ms: u64) -> Micros {
        T0.saturating_add_ms(ms)
    }

    fn params(limit: u64, lease_ms: u64) -> ConcurrencyParams {
        ConcurrencyParams::new(limit, lease_ms).unwrap()
    }

    #[test]
    fn parameters_are_checked_in_argument_order() {
        assert_eq!(
            ConcurrencyParams::new(0, 0).unwrap_err().to_string(),
            "limit must be an integer from 1 to 16777215"
        );
        assert_eq!(
            ConcurrencyParams::new(1, 0).unwrap_err().to_string(),
            "lease_ms must be an integer from 1 to 1099511627776"
        );
    }

    #[test]
    fn holds_at_most_limit_and_a_release_frees_at_once() {
        let p = params(2, 1000);
        let mut s = Concurrency::idle(&p, T0);
        assert!(apply_checked::<Concurrency>(&mut s, &p, 1, T0).allowed);
        let first = Concurrency::lease_granted(&s);
        let d = apply_checked::<Concurrency>(&mut s, &p, 1, at(10));
        assert!(d.allowed && d.remaining == 0);
        let second = Concurrency::lease_granted(&s);
        assert!(second > first && first >= T0.as_us());
        let denied = apply_checked::<Concurrency>(&mut s, &p, 1, at(20));
        assert_eq!(
            (denied.allowed, denied.wait),
            (false, Wait::Ms(980)),
            "the first lease ends first"
        );
        assert!(s.release(first, at(30)));
        assert!(!s.release(first, at(30)), "a lease ends once");
        assert!(apply_checked::<Concurrency>(&mut s, &p, 1, at(30)).allowed);
        assert!(Concurrency::lease_granted(&s) > second, "ids never reused");
    }

    #[test]
    fn an_unreleased_lease_ends_after_lease_ms_and_a_renewal_keeps_it() {
        let p = params(1, 100);
        let mut s = Concurrency::idle(&p, T0);
        let d = apply_checked::<Concurrency>(&mut s, &p, 1, T0);
        assert_eq!((d.allowed, d.reset_ms), (true, 100));
        let id = Concurrency::lease_granted(&s);
        assert!(!Concurrency::decide(&s, &p, 1, at(99)).allowed);
        assert!(s.renew(id, 100, at(99)));
        assert!(!Concurrency::decide(&s, &p, 1, at(198)).allowed);
        assert!(Concurrency::decide(&s, &p, 1, at(199)).allowed);
        assert!(!s.renew(id, 100, at(199)), "an ended lease is not renewed");
        assert!(!s.release(id, at(199)));
        assert_eq!(Concurrency::idle_at_ms(&s, &p), at(199).as_ms_floor());
    }

    #[test]
    fn cost_above_limit_never_fits_and_cost_zero_peeks() {
        let p = params(3, 1000);
        let mut s = Concurrency::idle(&p, T0);
        let d = apply_checked::<Concurrency>(&mut s, &p, 4, T0);
        assert_eq!((d.allowed, d.wait), (false, Wait::Never));
        let d = apply_checked::<Concurrency>(&mut s, &p, 0, T0);
        assert_eq!((d.allowed, d.remaining, d.reset_ms), (true, 3, 0));
        assert_eq!(Concurrency::lease_granted(&s), 0);
    }

    #[test]
    fn a_backwards_clock_never_revives_or_shortens_a_lease() {
        let p = params(1, 100);
        let mut s = Concurrency::idle(&p, T0);
        apply_checked::<Concurrency>(&mut s, &p, 1, at(50));
        let id = Concurrency::lease_granted(&s);
        assert!(!Concurrency::decide(&s, &p, 1, T0).allowed);
        assert!(
            s.renew(id, 100, at(10)),
            "renewed at 50, the latest time seen"
        );
        assert!(!Concurrency::decide(&s, &p, 1, at(149)).allowed);
        assert!(Concurrency::decide(&s, &p, 1, at(150)).allowed);
    }

    #[test]
    fn ids_stay_above_the_clock_so_a_key_made_again_never_reuses_one() {
        let p = params(1000, 1);
        let mut s = Concurrency::idle(&p, T0);
        for _ in 0..500 {
            apply_checked::<Concurrency>(&mut s, &p, 1, T0);
        }
        let last = Concurrency::lease_granted(&s);
        assert_eq!(last, T0.as_us() + 499);
        // The key vanishes at its idle instant; a new key made then starts
        // above the old ids.
        let gone = Micros::from_ms(Concurrency::idle_at_ms(&s, &p));
        let mut again = Concurrency::idle(&p, gone);
        apply_checked::<Concurrency>(&mut again, &p, 1, gone);
        assert!(Concurrency::lease_granted(&again) > last);
    }

    #[test]
    fn a_changed_limit_applies_to_what_is_held() {
        assert_eq!(
            remaining_after_change::<Concurrency>(&params(10, 1000), &params(100, 1000), 10, T0),
            90
        );
        assert_eq!(
            remaining_after_change::<Concurrency>(&params(100, 1000), &params(20, 5), 10, T0),
            10
        );
    }

    #[test]
    fn loaded_fields_are_validated() {
        let p = params(3, 1000);
        let mut s = Concurrency::idle(&p, T0);
        apply_checked::<Concurrency>(&mut s, &p, 2, T0);
        apply_checked::<Concurrency>(&mut s, &p, 1, T0);
        let mut fields = Vec::new();
        s.to_fields(&mut |f| fields.push(f));
        let load = |fields: &[u64]| {
            let mut next = fields.iter().copied();
            ConcurrencyState::from_fields(&mut || next.next())
        };
        assert_eq!(load(&fields), Some(s));
        for len in 0..fields.len() {
            assert_eq!(load(&fields[..len]), None);
        }
        let mut bad = fields.clone();
        bad[3 + 3] = bad[3]; // two leases with one id
        assert_eq!(load(&bad), None);
        let mut bad = fields.clone();
        bad[5] = 0; // a lease of no units
        assert_eq!(load(&bad), None);
        assert_eq!(load(&[0, 0, u64::MAX]), None);
    }

    #[test]
    fn states_built_at_the_latest_time_load_back() {
        let p = params(2, 1 << 40);
        let latest = Micros::from_us(crate::MAX_TIME_US);
        let mut s = Concurrency::idle(&p, latest);
        for _ in 0..10 {
            apply_checked::<Concurrency>(&mut s, &p, 2, latest);
            assert!(s.release(Concurrency::lease_granted(&s), latest));
        }
        apply_checked::<Concurrency>(&mut s, &p, 1, latest);
        assert!(Concurrency::lease_granted(&s) > crate::MAX_TIME_US);
        let mut fields = Vec::new();
        s.to_fields(&mut |f| fields.push(f));
        let mut next = fields.iter().copied();
        assert_eq!(ConcurrencyState::from_fields(&mut || next.next()), Some(s));
    }

    /// What a brute-force model says of one step: the leases as a map from
    /// id to (end, units), held = the live ones' units.
    #[derive(Clone, Debug)]
    enum Step {
        Acquire(u64),
        Release(usize),
        Renew(usize, u64),
        Advance(u64),
    }

    fn step() -> impl Strategy<Value = Step> {
        prop_oneof![
            (0u64..4).prop_map(Step::Acquire),
            (0usize..8).prop_map(Step::Release),
            (0usize..8, 1u64..300).prop_map(|(i, ms)| Step::Renew(i, ms)),
            (0u64..150).prop_map(Step::Advance),
        ]
    }

    proptest! {
        /// Never more than `limit` held; an unreleased lease ends at
        /// lease_ms; a renewal keeps it; ids grow; decide and run agree with
        /// a model that keeps every lease.
        #[test]
        fn agrees_with_a_model_of_every_lease(
            limit in 1u64..6,
            lease_ms in 1u64..200,
            steps in prop::collection::vec(step(), 1..60),
        ) {
            let p = params(limit, lease_ms);
            let mut now = T0;
            let mut s = Concurrency::idle(&p, now);
            // id -> (end_us, units), every lease ever granted
            let mut model: Vec<(u64, u64, u64)> = Vec::new();
            let held = |model: &[(u64, u64, u64)], now: Micros| -> u64 {
                model.iter().filter(|l| l.1 > now.as_us()).map(|l| l.2).sum()
            };
            for step in steps {
                match step {
                    Step::Acquire(cost) => {
                        let before = Concurrency::lease_granted(&s);
                        let out = run::<Concurrency>(&mut s, &p, Request::Cost(cost), now);
                        let fits = held(&model, now) + cost <= limit;
                        prop_assert_eq!(out.decision.allowed, fits);
                        if fits && cost > 0 {
                            let id = Concurrency::lease_granted(&s);
                            prop_assert!(id > before);
                            model.push((id, now.as_us() + lease_ms * 1000, cost));
                        }
                        if !fits && cost <= limit {
                            // the wait is when the model frees enough
                            let Wait::Ms(w) = out.decision.wait else { panic!() };
                            let later = now.saturating_add_ms(w);
                            prop_assert!(held(&model, later) + cost <= limit);
                            if w > 0 {
                                let before = now.saturating_add_us(w * 1000 - 1000);
                                prop_assert!(held(&model, before) + cost > limit);
                            }
                        }
                    }
                    Step::Release(i) => {
                        let Some(&(id, end, _)) = model.get(i) else { continue };
                        let live = end > now.as_us();
                        prop_assert_eq!(s.release(id, now), live);
                        if live { model[i].1 = now.as_us(); }
                    }
                    Step::Renew(i, ms) => {
                        let Some(&(id, end, _)) = model.get(i) else { continue };
                        let live = end > now.as_us();
                        prop_assert_eq!(s.renew(id, ms, now), live);
                        if live { model[i].1 = now.as_us() + ms * 1000; }
                    }
                    Step::Advance(ms) => now = now.saturating_add_ms(ms),
                }
                prop_assert!(s.held(now) <= limit);
                prop_assert_eq!(s.held(now), held(&model, now));
                let idle = Concurrency::idle_at_ms(&s, &p) * 1000;
                prop_assert!(model.iter().all(|l| l.0 < idle && (l.1 <= now.as_us() || l.1 <= idle)));
            }
        }
    }
}

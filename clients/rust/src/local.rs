//! In-process limiters with the core crate's algorithms: the local level
//! in front of Redis, and the instance's accounts that the local-only
//! fallback decides against. Bounded: idle limiters are dropped first, then
//! the ones idle soonest, a tenth of the cap at a time so that a full map
//! does not sort itself at every new key.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{SystemTime, UNIX_EPOCH};

use redis_ratelimit_core::{
    decide, run, Algorithm, Concurrency, Decision, FixedWindow, HashWindow, LeakyBucket, Micros,
    Outcome, Quota, Request, SlidingLog, TokenBucket,
};

use crate::rule::Spec;

enum State {
    TokenBucket(<TokenBucket as Algorithm>::State),
    FixedWindow(<FixedWindow as Algorithm>::State),
    LeakyBucket(<LeakyBucket as Algorithm>::State),
    Sliding(<SlidingLog as Algorithm>::State),
    HashWindow(<HashWindow as Algorithm>::State),
    Concurrency(<Concurrency as Algorithm>::State),
    Quota(<Quota as Algorithm>::State),
}

pub(crate) struct Entry {
    state: State,
    idle_at_ms: u64,
    /// Units the fallback admitted from this account without a call to
    /// Redis (the breaker open, an error reply): Redis never counted them.
    owed: u64,
}

/// The wall clock, as the core crate counts it.
pub(crate) fn now() -> Micros {
    Micros::from_duration(
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default(),
    )
}

/// One step of one algorithm on an entry, creating (or, after a change of
/// algorithm, recreating) its state.
macro_rules! step {
    ($alg:ty, $variant:ident, $params:expr, $slot:expr, $request:expr, $now:expr, $dry:expr) => {{
        let params = $params;
        let fresh = !matches!(
            $slot,
            Some(Entry {
                state: State::$variant(_),
                ..
            })
        );
        if fresh {
            *$slot = Some(Entry {
                state: State::$variant(<$alg>::idle(params, $now)),
                idle_at_ms: 0,
                owed: 0,
            });
        }
        let Some(Entry {
            state: State::$variant(state),
            idle_at_ms,
            ..
        }) = $slot
        else {
            unreachable!("just set")
        };
        if $dry {
            decide::<$alg>(state, params, $request, $now)
        } else {
            let outcome = run::<$alg>(state, params, $request, $now);
            if outcome.changed {
                *idle_at_ms = <$alg>::idle_at_ms(state, params);
            }
            outcome
        }
    }};
}

pub(crate) fn step(
    spec: &Spec,
    slot: &mut Option<Entry>,
    request: Request,
    now: Micros,
    dry: bool,
) -> Outcome {
    match spec {
        Spec::TokenBucket(p) => step!(TokenBucket, TokenBucket, p, slot, request, now, dry),
        Spec::FixedWindow(p) => step!(FixedWindow, FixedWindow, p, slot, request, now, dry),
        Spec::LeakyBucket(p) => step!(LeakyBucket, LeakyBucket, p, slot, request, now, dry),
        Spec::Sliding(p) => step!(SlidingLog, Sliding, p, slot, request, now, dry),
        Spec::HashWindow(p) => step!(HashWindow, HashWindow, p, slot, request, now, dry),
        Spec::Concurrency(p) => step!(Concurrency, Concurrency, p, slot, request, now, dry),
        Spec::Quota(p, zone) => {
            // The period in UTC or a fixed offset; a named zone is never
            // local (its rule cannot be global, and the fallback skips it).
            let end = crate::rule::local_period_end(p.period(), *zone, now);
            let p = &end.map_or(*p, |end| p.at_end(end));
            step!(Quota, Quota, p, slot, request, now, dry)
        }
    }
}

/// A bounded map of in-process limiters.
pub(crate) struct LocalLimiters {
    map: Mutex<HashMap<String, Entry>>,
    cap: usize,
    /// Entries that owe units (changed under the map's lock), so that a
    /// call need not look when none do.
    owing: AtomicUsize,
}

impl LocalLimiters {
    pub(crate) fn new(cap: usize) -> Self {
        LocalLimiters {
            map: Mutex::new(HashMap::new()),
            cap: cap.max(1),
            owing: AtomicUsize::new(0),
        }
    }

    /// Records that the fallback admitted `cost` from each of `limits`
    /// (just taken) without a call to Redis.
    pub(crate) fn owe_all(&self, limits: &[(String, Spec)], cost: u64) {
        if limits.is_empty() || cost == 0 {
            return;
        }
        let mut map = self.map.lock().unwrap_or_else(|e| e.into_inner());
        for (key, _) in limits {
            if let Some(entry) = map.get_mut(key) {
                if entry.owed == 0 {
                    self.owing.fetch_add(1, Ordering::Relaxed);
                }
                entry.owed = entry.owed.saturating_add(cost);
            }
        }
    }

    /// The units each of `limits` owes Redis, which the caller now sends;
    /// the debts are cleared.
    pub(crate) fn take_owed(&self, limits: &[(String, Spec)]) -> Vec<u64> {
        if self.owing.load(Ordering::Relaxed) == 0 {
            return vec![0; limits.len()];
        }
        let mut map = self.map.lock().unwrap_or_else(|e| e.into_inner());
        let mut owed = Vec::with_capacity(limits.len());
        for (key, _) in limits {
            let units = map.get_mut(key).map_or(0, |e| std::mem::take(&mut e.owed));
            if units > 0 {
                self.owing.fetch_sub(1, Ordering::Relaxed);
            }
            owed.push(units);
        }
        owed
    }

    /// All or nothing over `limits`: if every one admits `cost`, takes it
    /// from each and answers their decisions, in order; otherwise takes
    /// nothing and answers the position and decision of the first that
    /// denied.
    pub(crate) fn take_all(
        &self,
        limits: &[(String, Spec)],
        cost: u64,
    ) -> Result<Vec<Decision>, (usize, Decision)> {
        let now = now();
        let mut map = self.map.lock().unwrap_or_else(|e| e.into_inner());
        for (i, (key, spec)) in limits.iter().enumerate() {
            let mut slot = map.remove(key);
            let outcome = step(spec, &mut slot, Request::Cost(cost), now, true);
            if let Some(entry) = slot {
                map.insert(key.clone(), entry);
            }
            if !outcome.decision.allowed {
                return Err((i, outcome.decision));
            }
        }
        Ok(self.apply_all(&mut map, limits, Request::Cost(cost), now))
    }

    /// Charges `cost` to every one of `limits`, admitted or not (`COST n
    /// FORCE`: an account may go into debt, at most its limit beyond
    /// empty): units that Redis admitted for this instance, or may have
    /// (a call whose answer was lost).
    pub(crate) fn charge_all(&self, limits: &[(String, Spec)], cost: u64) {
        if limits.is_empty() || cost == 0 {
            return;
        }
        let now = now();
        let mut map = self.map.lock().unwrap_or_else(|e| e.into_inner());
        self.apply_all(&mut map, limits, Request::Force(cost), now);
    }

    fn apply_all(
        &self,
        map: &mut HashMap<String, Entry>,
        limits: &[(String, Spec)],
        request: Request,
        now: Micros,
    ) -> Vec<Decision> {
        if map.len() + limits.len() > self.cap {
            let keep = self.cap - self.cap / 10;
            let dropped = evict(map, keep.saturating_sub(limits.len()), now);
            self.owing.fetch_sub(dropped, Ordering::Relaxed);
        }
        let mut decisions = Vec::with_capacity(limits.len());
        for (key, spec) in limits {
            let mut slot = map.remove(key);
            decisions.push(step(spec, &mut slot, request, now, false).decision);
            if let Some(entry) = slot {
                map.insert(key.clone(), entry);
            }
        }
        decisions
    }

    /// Gives back what [`Self::take_all`] took (Redis denied the request).
    pub(crate) fn refund_all(&self, limits: &[(String, Spec)], cost: u64) {
        let now = now();
        let mut map = self.map.lock().unwrap_or_else(|e| e.into_inner());
        for (key, spec) in limits {
            if let Some(entry) = map.remove(key) {
                let mut slot = Some(entry);
                step(spec, &mut slot, Request::Refund(cost), now, false);
                if let Some(back) = slot {
                    map.insert(key.clone(), back);
                }
            }
        }
    }

    /// Limiters held (for tests of the bound).
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.map.lock().unwrap_or_else(|e| e.into_inner()).len()
    }
}

/// Drops idle limiters, then the ones idle soonest, until `map` holds at
/// most `keep`; answers how many of those dropped owed units (their debts
/// are forgotten: the bound on memory comes first).
fn evict(map: &mut HashMap<String, Entry>, keep: usize, now: Micros) -> usize {
    let now_ms = now.as_ms_floor();
    let mut dropped = 0;
    map.retain(|_, e| {
        let live = e.idle_at_ms > now_ms;
        dropped += (!live && e.owed > 0) as usize;
        live
    });
    if map.len() > keep {
        let mut by_idle: Vec<(u64, String)> =
            map.iter().map(|(k, e)| (e.idle_at_ms, k.clone())).collect();
        by_idle.sort_unstable();
        for (_, key) in by_idle.into_iter().take(map.len() - keep) {
            if map.remove(&key).is_some_and(|e| e.owed > 0) {
                dropped += 1;
            }
        }
    }
    dropped
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rule::Spec;

    fn sliding(limit: u64) -> Spec {
        Spec::parse("t", "SLIDING", &[limit, 60_000]).unwrap()
    }

    #[test]
    fn all_or_nothing_then_a_refund_gives_the_units_back() {
        let local = LocalLimiters::new(10);
        let limits = vec![("a".to_string(), sliding(2)), ("b".to_string(), sliding(1))];
        assert!(local.take_all(&limits, 1).is_ok());
        let (pos, d) = local.take_all(&limits, 1).unwrap_err();
        assert_eq!((pos, d.allowed), (1, false));
        // Nothing was taken from "a" by the denied call: one unit is left.
        assert!(local.take_all(&limits[..1], 1).is_ok());
        assert!(local.take_all(&limits[..1], 1).is_err());
        local.refund_all(&limits[..1], 1);
        assert!(local.take_all(&limits[..1], 1).is_ok());
    }

    #[test]
    fn a_forced_charge_goes_into_debt_and_the_account_admits_nothing_until_it_is_paid() {
        let local = LocalLimiters::new(10);
        let account = vec![("a".to_string(), sliding(3))];
        let d = local.take_all(&account, 1).unwrap();
        assert_eq!((d[0].allowed, d[0].remaining), (true, 2));
        // Two units Redis admitted, and two of a call whose answer was lost.
        local.charge_all(&account, 2);
        local.charge_all(&account, 2);
        let (_, d) = local.take_all(&account, 1).unwrap_err();
        assert_eq!((d.allowed, d.remaining), (false, 0));
        // Five units held of three: two back still leave it full.
        local.refund_all(&account, 2);
        assert!(local.take_all(&account, 1).is_err());
        local.refund_all(&account, 2);
        let d = local.take_all(&account, 1).unwrap();
        assert_eq!((d[0].allowed, d[0].remaining), (true, 1));
    }

    #[test]
    fn units_owed_are_handed_over_once() {
        let local = LocalLimiters::new(10);
        let limits = vec![("a".to_string(), sliding(5)), ("b".to_string(), sliding(5))];
        assert_eq!(local.take_owed(&limits), [0, 0]);
        local.take_all(&limits, 2).unwrap();
        local.owe_all(&limits[..1], 2);
        local.take_all(&limits, 1).unwrap();
        local.owe_all(&limits, 1);
        assert_eq!(local.take_owed(&limits), [3, 1]);
        assert_eq!(local.take_owed(&limits), [0, 0]);
        assert_eq!(local.owing.load(Ordering::Relaxed), 0);
    }

    #[test]
    fn memory_is_bounded_by_the_size_cap() {
        let local = LocalLimiters::new(50);
        for i in 0..1000 {
            local.take_all(&[(format!("k{i}"), sliding(5))], 1).unwrap();
        }
        assert!(local.len() <= 50, "{}", local.len());
    }
}

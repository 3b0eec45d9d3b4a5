//! In-process limiters with the core crate's algorithms: the local level
//! in front of Redis, and the local-only fallback. Bounded: idle limiters
//! are dropped first, then the ones idle soonest.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{SystemTime, UNIX_EPOCH};

use redis_ratelimit_core::{
    decide, run, Algorithm, Concurrency, FixedWindow, HashWindow, LeakyBucket, Micros, Outcome,
    Quota, Request, SlidingLog, TokenBucket,
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

struct Entry {
    state: State,
    idle_at_ms: u64,
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
            });
        }
        let Some(Entry {
            state: State::$variant(state),
            idle_at_ms,
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

fn step(
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
}

impl LocalLimiters {
    pub(crate) fn new(cap: usize) -> Self {
        LocalLimiters {
            map: Mutex::new(HashMap::new()),
            cap: cap.max(1),
        }
    }

    /// All or nothing over `limits`: if every one admits `cost`, takes it
    /// from each and answers `Ok`; otherwise takes nothing and answers the
    /// position and decision of the first that denied.
    pub(crate) fn take_all(
        &self,
        limits: &[(String, Spec)],
        cost: u64,
    ) -> Result<(), (usize, redis_ratelimit_core::Decision)> {
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
        if map.len() + limits.len() > self.cap {
            evict(&mut map, self.cap.saturating_sub(limits.len()), now);
        }
        for (key, spec) in limits {
            let mut slot = map.remove(key);
            step(spec, &mut slot, Request::Cost(cost), now, false);
            if let Some(entry) = slot {
                map.insert(key.clone(), entry);
            }
        }
        Ok(())
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
/// most `keep`.
fn evict(map: &mut HashMap<String, Entry>, keep: usize, now: Micros) {
    let now_ms = now.as_ms_floor();
    map.retain(|_, e| e.idle_at_ms > now_ms);
    if map.len() > keep {
        let mut by_idle: Vec<(u64, String)> =
            map.iter().map(|(k, e)| (e.idle_at_ms, k.clone())).collect();
        by_idle.sort_unstable();
        for (_, key) in by_idle.into_iter().take(map.len() - keep) {
            map.remove(&key);
        }
    }
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
    fn memory_is_bounded_by_the_size_cap() {
        let local = LocalLimiters::new(50);
        for i in 0..1000 {
            local.take_all(&[(format!("k{i}"), sliding(5))], 1).unwrap();
        }
        assert!(local.len() <= 50, "{}", local.len());
    }
}

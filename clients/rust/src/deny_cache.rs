//! The local deny cache: after a denial with `wait_ms` w, the same rule and
//! key deny in process for `min(w, max)`, with the reply's fields counting
//! down, without a round trip. Bounded by a size cap.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::decision::{Decision, Path};

struct Entry {
    decision: Decision,
    at: Instant,
    until: Instant,
}

pub(crate) struct DenyCache {
    map: Mutex<HashMap<String, Entry>>,
    max: Duration,
    cap: usize,
}

impl DenyCache {
    pub(crate) fn new(max: Duration, cap: usize) -> Self {
        DenyCache {
            map: Mutex::new(HashMap::new()),
            max,
            cap: cap.max(1),
        }
    }

    /// The cached denial of `key`, its times counted down to now.
    pub(crate) fn get(&self, key: &str) -> Option<Decision> {
        let now = Instant::now();
        let mut map = self.map.lock().unwrap_or_else(|e| e.into_inner());
        let entry = map.get(key)?;
        if entry.until <= now {
            map.remove(key);
            return None;
        }
        let elapsed = now.duration_since(entry.at);
        let mut d = entry.decision.clone();
        let elapsed_ms = elapsed.as_millis() as i64;
        // Never below 1 ms while the entry denies: a denial always says to wait.
        d.wait_ms = (d.wait_ms - elapsed_ms).max(1);
        d.retry_after = Duration::from_millis(d.wait_ms as u64);
        d.reset_after = d.reset_after.saturating_sub(elapsed);
        d.path = Path::DenyCache;
        Some(d)
    }

    /// Remembers a denial of `key` for `min(wait, max)`; a denial that can
    /// never pass, or has no wait, is not cached.
    pub(crate) fn put(&self, key: String, decision: &Decision) {
        if decision.allowed || decision.wait_ms <= 0 {
            return;
        }
        let ttl = decision.retry_after.min(self.max);
        if ttl.is_zero() {
            return;
        }
        let now = Instant::now();
        let mut map = self.map.lock().unwrap_or_else(|e| e.into_inner());
        if map.len() >= self.cap && !map.contains_key(&key) {
            map.retain(|_, e| e.until > now);
            if map.len() >= self.cap {
                if let Some(soonest) = map
                    .iter()
                    .min_by_key(|(_, e)| e.until)
                    .map(|(k, _)| k.clone())
                {
                    map.remove(&soonest);
                }
            }
        }
        map.insert(
            key,
            Entry {
                decision: decision.clone(),
                at: now,
                until: now + ttl,
            },
        );
    }

    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.map.lock().unwrap_or_else(|e| e.into_inner()).len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn denial(wait_ms: i64) -> Decision {
        Decision::from_fields(false, 5, 0, wait_ms, 60_000, Path::Redis)
    }

    #[test]
    fn a_denial_is_cached_for_its_wait_at_most_max_with_fields_counting_down() {
        let cache = DenyCache::new(Duration::from_secs(1), 10);
        cache.put("k".into(), &denial(60_000));
        let hit = cache.get("k").unwrap();
        assert_eq!(hit.path, Path::DenyCache);
        assert!(hit.wait_ms <= 60_000 && hit.wait_ms > 59_000, "{hit:?}");
        assert!(hit.reset_after <= Duration::from_secs(60));
        let until = cache.map.lock().unwrap()["k"].until;
        let at = cache.map.lock().unwrap()["k"].at;
        assert_eq!(until - at, Duration::from_secs(1), "min(60 s, max 1 s)");
        cache.put("short".into(), &denial(3));
        let at = cache.map.lock().unwrap()["short"].at;
        assert_eq!(
            cache.map.lock().unwrap()["short"].until - at,
            Duration::from_millis(3)
        );
    }

    #[test]
    fn admissions_and_denials_that_never_pass_are_not_cached() {
        let cache = DenyCache::new(Duration::from_secs(1), 10);
        cache.put("never".into(), &denial(-1));
        let mut ok = denial(0);
        ok.allowed = true;
        cache.put("ok".into(), &ok);
        assert_eq!(cache.len(), 0);
        assert!(cache.get("never").is_none());
    }

    #[test]
    fn memory_is_bounded_by_the_size_cap() {
        let cache = DenyCache::new(Duration::from_secs(1), 100);
        for i in 0..10_000 {
            cache.put(format!("k{i}"), &denial(1000));
        }
        assert_eq!(cache.len(), 100);
        assert!(cache.get("k9999").is_some(), "the newest stays");
    }
}

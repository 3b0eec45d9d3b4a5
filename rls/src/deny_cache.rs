//! The local deny cache (`LOCAL_CACHE_SIZE_IN_BYTES`): a limiter that
//! denied is remembered until its `wait_ms` passes, so that the requests
//! that follow are answered OVER_LIMIT without a call to Redis.
//!
//! Each entry keeps the units the limiter had left when it denied: a
//! request asking more than that is denied from the cache; one asking no
//! more goes to Redis (a denial of 5 units says nothing of a request for 1).
//! Entries cost their key's length plus [`ENTRY_OVERHEAD`] bytes; past the
//! budget the oldest entries are evicted first.
use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// What an entry costs besides its key: the map's and the queue's
/// bookkeeping, counted so that a budget of N bytes holds about what N
/// bytes of memory can.
pub const ENTRY_OVERHEAD: u64 = 64;

struct Entry {
    until: Instant,
    remaining: u64,
    /// Which insertion this is: the queue's stale records are skipped.
    seq: u64,
}

struct Inner {
    map: HashMap<Box<str>, Entry>,
    /// Keys in insertion order, with the insertion's seq.
    order: VecDeque<(Box<str>, u64)>,
    bytes: u64,
    next_seq: u64,
}

/// A bounded map of denying keys; safe to share between threads.
pub struct DenyCache {
    budget: u64,
    inner: Mutex<Inner>,
}

impl DenyCache {
    /// A cache of at most `budget` bytes (see [`ENTRY_OVERHEAD`]).
    pub fn new(budget: u64) -> DenyCache {
        DenyCache {
            budget,
            inner: Mutex::new(Inner {
                map: HashMap::new(),
                order: VecDeque::new(),
                bytes: 0,
                next_seq: 0,
            }),
        }
    }

    fn cost(key: &str) -> u64 {
        key.len() as u64 + ENTRY_OVERHEAD
    }

    /// Whether a request for `hits` units on `key` is denied by a denial
    /// remembered at `now`. An expired entry is removed.
    pub fn denies(&self, key: &str, hits: u64, now: Instant) -> bool {
        if hits == 0 {
            return false;
        }
        let mut inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        let Some(entry) = inner.map.get(key) else {
            return false;
        };
        if entry.until <= now {
            // Its queue record stays until it reaches the front; the bytes
            // are freed now.
            inner.map.remove(key);
            inner.bytes = inner.bytes.saturating_sub(Self::cost(key));
            return false;
        }
        hits > entry.remaining
    }

    /// Remembers that `key` denied with `remaining` units left, until `wait`
    /// from `now`. A key longer than the whole budget is not kept.
    pub fn remember(&self, key: &str, remaining: u64, wait: Duration, now: Instant) {
        let cost = Self::cost(key);
        if cost > self.budget || wait.is_zero() {
            return;
        }
        // A wait past what Instant can hold (a server's reply is not
        // trusted to be sane) is not kept rather than a panic.
        let Some(until) = now.checked_add(wait) else {
            return;
        };
        let mut inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        let seq = inner.next_seq;
        inner.next_seq += 1;
        let boxed: Box<str> = key.into();
        let entry = Entry {
            until,
            remaining,
            seq,
        };
        if inner.map.insert(boxed.clone(), entry).is_none() {
            inner.bytes += cost;
        }
        inner.order.push_back((boxed, seq));
        while inner.bytes > self.budget || inner.order.len() > 2 * inner.map.len() + 16 {
            let Some((oldest, seq)) = inner.order.pop_front() else {
                break;
            };
            // Only the record of the entry's latest insertion evicts it.
            if inner.map.get(&oldest).is_some_and(|e| e.seq == seq) {
                inner.map.remove(&oldest);
                inner.bytes = inner.bytes.saturating_sub(Self::cost(&oldest));
            }
        }
    }

    /// The bytes the entries cost now.
    pub fn bytes(&self) -> u64 {
        self.inner.lock().unwrap_or_else(|e| e.into_inner()).bytes
    }

    /// The number of entries (expired ones not yet looked up included).
    pub fn len(&self) -> usize {
        self.inner
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .map
            .len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: Duration = Duration::from_secs(1);

    #[test]
    fn a_wait_past_what_an_instant_holds_is_not_kept() {
        let cache = DenyCache::new(1 << 20);
        cache.remember("k", 0, Duration::MAX, Instant::now());
        assert!(cache.is_empty());
    }

    #[test]
    fn a_remembered_denial_denies_until_its_wait_passes() {
        let cache = DenyCache::new(1 << 20);
        let t0 = Instant::now();
        cache.remember("k", 0, S, t0);
        assert!(cache.denies("k", 1, t0));
        assert!(cache.denies("k", 1, t0 + S / 2));
        assert!(!cache.denies("k", 1, t0 + S));
        assert!(cache.is_empty(), "the expired entry is removed");
        assert_eq!(cache.bytes(), 0);
    }

    #[test]
    fn only_requests_larger_than_what_was_left_are_denied() {
        let cache = DenyCache::new(1 << 20);
        let t0 = Instant::now();
        cache.remember("k", 2, S, t0);
        assert!(!cache.denies("k", 2, t0));
        assert!(cache.denies("k", 3, t0));
        assert!(!cache.denies("k", 0, t0), "a check takes nothing");
        assert!(!cache.denies("other", 5, t0));
    }

    #[test]
    fn the_budget_evicts_the_oldest() {
        let per = 1 + ENTRY_OVERHEAD;
        let cache = DenyCache::new(3 * per);
        let t0 = Instant::now();
        for k in ["a", "b", "c", "d"] {
            cache.remember(k, 0, S, t0);
        }
        assert_eq!(cache.len(), 3);
        assert_eq!(cache.bytes(), 3 * per);
        assert!(!cache.denies("a", 1, t0), "the oldest went first");
        for k in ["b", "c", "d"] {
            assert!(cache.denies(k, 1, t0), "{k}");
        }
    }

    #[test]
    fn renewing_a_key_keeps_one_entry_and_its_latest_place() {
        let per = 1 + ENTRY_OVERHEAD;
        let cache = DenyCache::new(2 * per);
        let t0 = Instant::now();
        cache.remember("a", 0, S, t0);
        cache.remember("b", 0, S, t0);
        cache.remember("a", 0, 2 * S, t0);
        assert_eq!(cache.bytes(), 2 * per);
        cache.remember("c", 0, S, t0);
        assert!(!cache.denies("b", 1, t0), "b is now the oldest");
        assert!(cache.denies("a", 1, t0 + S), "a's renewal counts");
        assert!(cache.denies("c", 1, t0));
    }

    #[test]
    fn a_key_larger_than_the_budget_is_not_kept() {
        let cache = DenyCache::new(10);
        cache.remember("key", 0, S, Instant::now());
        assert!(cache.is_empty());
        assert_eq!(cache.bytes(), 0);
    }

    #[test]
    fn the_queue_of_a_renewed_key_stays_bounded() {
        let cache = DenyCache::new(1 << 20);
        let t0 = Instant::now();
        for _ in 0..1000 {
            cache.remember("hot", 0, S, t0);
        }
        let inner = cache.inner.lock().unwrap();
        assert!(inner.order.len() <= 2 * inner.map.len() + 16);
        assert_eq!(inner.map.len(), 1);
    }
}

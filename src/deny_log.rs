//! The deny log: the most recent denials in a bounded ring, like SLOWLOG, so
//! that a collector reads them in batches (`RL.LOG GET`) instead of the module
//! writing anything per denial.
//!
//! Its size is [`MAX_LEN`], the config `ratelimit.log-max-len` (0 turns it
//! off). Recording reuses the buffer of the entry it evicts, so a full log
//! records without allocating.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

/// Most entries kept; 0 turns the log off. The config module registers it
/// as `ratelimit.log-max-len` and calls [`trim`] when it changes.
pub static MAX_LEN: AtomicU64 = AtomicU64::new(128);

fn max_len() -> usize {
    MAX_LEN.load(Ordering::Relaxed) as usize
}

/// Longest key kept in an entry; longer keys are cut, like SLOWLOG does.
pub const MAX_KEY_BYTES: usize = 128;

/// One denial.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Entry {
    /// Grows by one per denial, never reused (also across `RL.LOG RESET`).
    pub id: u64,
    pub unix_ms: u64,
    pub key: Vec<u8>,
    /// The command (`RL.TOKENBUCKET`) or the policy (`policy:name`).
    pub source: Vec<u8>,
    pub cost: u64,
    /// As replied: milliseconds, or -1 for never.
    pub wait_ms: i64,
}

struct Log {
    next_id: u64,
    entries: VecDeque<Entry>,
}

static LOG: Mutex<Log> = Mutex::new(Log {
    next_id: 0,
    entries: VecDeque::new(),
});

fn log() -> std::sync::MutexGuard<'static, Log> {
    LOG.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Records a denial (nothing if the log is off).
pub fn record(unix_ms: u64, key: &[u8], source: &[&[u8]], cost: u64, wait_ms: i64) {
    let max_len = max_len();
    if max_len == 0 {
        return;
    }
    let mut log = log();
    while log.entries.len() > max_len {
        log.entries.pop_back();
    }
    let mut entry = if log.entries.len() == max_len {
        log.entries.pop_back().unwrap_or_default()
    } else {
        Entry::default()
    };
    entry.id = log.next_id;
    log.next_id += 1;
    entry.unix_ms = unix_ms;
    entry.key.clear();
    entry
        .key
        .extend_from_slice(&key[..key.len().min(MAX_KEY_BYTES)]);
    entry.source.clear();
    for part in source {
        entry.source.extend_from_slice(part);
    }
    entry.cost = cost;
    entry.wait_ms = wait_ms;
    log.entries.push_front(entry);
}

/// The `count` most recent denials, newest first.
pub fn recent(count: usize) -> Vec<Entry> {
    let max_len = max_len();
    let log = log();
    log.entries
        .iter()
        .take(count.min(max_len))
        .cloned()
        .collect()
}

/// How many denials the log holds.
pub fn len() -> usize {
    let max_len = max_len();
    log().entries.len().min(max_len)
}

/// Drops the oldest entries beyond `max_len` (the bound just changed).
pub fn trim(max_len: usize) {
    let mut log = log();
    log.entries.truncate(max_len);
    log.entries.shrink_to(max_len);
}

/// Empties the log (ids keep growing).
pub fn reset() {
    log().entries.clear();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_log_is_bounded_newest_first_and_cuts_long_keys() {
        MAX_LEN.store(3, Ordering::Relaxed);
        reset();
        for i in 0..5u64 {
            record(
                1000 + i,
                format!("k{i}").as_bytes(),
                &[b"RL.TOKENBUCKET"],
                1,
                10,
            );
        }
        let newest = recent(10);
        assert_eq!(newest.len(), 3);
        assert_eq!(newest[0].key, b"k4");
        assert_eq!(newest[2].key, b"k2");
        assert!(newest[0].id > newest[1].id);
        record(9, &[b'x'; 500], &[b"policy:", b"p"], 2, -1);
        assert_eq!(recent(1)[0].key.len(), MAX_KEY_BYTES);
        assert_eq!(recent(1)[0].source, b"policy:p");
        // shrinking the bound applies at once, and 0 turns the log off
        MAX_LEN.store(1, Ordering::Relaxed);
        trim(1);
        assert_eq!(len(), 1);
        MAX_LEN.store(0, Ordering::Relaxed);
        trim(0);
        record(9, b"off", &[b"RL.SLIDING"], 1, 1);
        assert_eq!(len(), 0);
        // turned on again, it starts empty
        MAX_LEN.store(128, Ordering::Relaxed);
        assert_eq!(len(), 0);
    }
}

//! The only place the module reads the clock.
//!
//! Limiters run on the server's wall clock (`CLOCK_REALTIME`, the clock Redis
//! uses for expiry, which `SystemTime` reads), read once per command, in
//! microseconds. Replicas and the AOF never read it: they replay the master's
//! reading (see `replicate.rs`).

use std::time::{SystemTime, UNIX_EPOCH};

use crate::limiter::Micros;

/// The current wall-clock time.
pub fn now() -> Micros {
    // A clock set before 1970 reads as the epoch, not as a wrapped negative.
    let since_epoch = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    Micros::from_us(u64::try_from(since_epoch.as_micros()).unwrap_or(u64::MAX))
}

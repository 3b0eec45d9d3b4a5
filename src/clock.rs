//! The only place the module reads the clock.
//!
//! Limiters run on the server's wall clock (`CLOCK_REALTIME`, the clock Redis
//! uses for expiry), read once per command, in microseconds. Replicas and the
//! AOF never read it: they replay the master's reading (see `replicate.rs`).

use crate::limiter::Micros;

/// The current wall-clock time.
pub fn now() -> Micros {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid out-pointer; CLOCK_REALTIME always exists.
    unsafe { libc::clock_gettime(libc::CLOCK_REALTIME, &mut ts) };
    // A clock set before 1970 reads as the epoch, not as a wrapped negative.
    let secs = u64::try_from(ts.tv_sec).unwrap_or(0);
    let micros = u64::try_from(ts.tv_nsec / 1000).unwrap_or(0);
    Micros::from_us(secs.saturating_mul(1_000_000).saturating_add(micros))
}

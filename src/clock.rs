//! The only place the module reads the clock.
//!
//! Limiters run on the server's wall clock (`CLOCK_REALTIME`, the clock Redis
//! uses for expiry), read once per command, in microseconds. Replicas and the
//! AOF never read it: they replay the master's reading (see `replicate.rs`).

use crate::limiter::Micros;

/// The current wall-clock time.
pub fn now() -> Micros {
    Micros::from_us(crate::ffi::wall_clock_us())
}

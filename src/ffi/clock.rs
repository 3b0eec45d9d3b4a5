//! The operating system's wall clock.

/// `CLOCK_REALTIME` (the clock the server uses for expiry) in microseconds
/// since the Unix epoch; a clock set before 1970 reads as the epoch.
#[inline]
pub fn wall_clock_us() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid out-pointer; CLOCK_REALTIME always exists.
    unsafe { libc::clock_gettime(libc::CLOCK_REALTIME, &mut ts) };
    let secs = u64::try_from(ts.tv_sec).unwrap_or(0);
    let micros = u64::try_from(ts.tv_nsec / 1000).unwrap_or(0);
    secs.saturating_mul(1_000_000).saturating_add(micros)
}

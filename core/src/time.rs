//! Time as the algorithms see it: an instant in whole microseconds since the
//! Unix epoch. Its integer is private, so that a millisecond can never pass
//! for a microsecond: every instant is built with a unit in its name
//! ([`Micros::from_us`], [`Micros::from_ms`]) and read the same way.

use std::time::Duration;

/// A point in time: microseconds since the Unix epoch.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Micros(u64);

impl Micros {
    /// The Unix epoch.
    pub const EPOCH: Micros = Micros(0);

    /// The instant `us` microseconds after the epoch.
    pub const fn from_us(us: u64) -> Self {
        Micros(us)
    }

    /// The instant `ms` milliseconds after the epoch (saturating, far
    /// beyond any time a limiter accepts).
    pub const fn from_ms(ms: u64) -> Self {
        Micros(ms.saturating_mul(1000))
    }

    /// The instant `since_epoch` after the epoch, in whole microseconds
    /// (saturating): how a caller turns its clock's reading into an instant,
    /// e.g. `SystemTime::now().duration_since(UNIX_EPOCH)`.
    pub fn from_duration(since_epoch: Duration) -> Self {
        Micros(u64::try_from(since_epoch.as_micros()).unwrap_or(u64::MAX))
    }

    /// Microseconds since the epoch.
    pub const fn as_us(self) -> u64 {
        self.0
    }

    /// Whole milliseconds since the epoch, rounded down.
    pub const fn as_ms_floor(self) -> u64 {
        self.0 / 1000
    }

    /// Milliseconds since the epoch, rounded up.
    pub const fn as_ms_ceil(self) -> u64 {
        self.0.div_ceil(1000)
    }

    /// `us` microseconds later, saturating.
    pub const fn saturating_add_us(self, us: u64) -> Self {
        Micros(self.0.saturating_add(us))
    }

    /// `ms` milliseconds later, saturating.
    pub const fn saturating_add_ms(self, ms: u64) -> Self {
        Micros(self.0.saturating_add(ms.saturating_mul(1000)))
    }

    /// `us` microseconds earlier, at the epoch at the earliest.
    pub const fn saturating_sub_us(self, us: u64) -> Self {
        Micros(self.0.saturating_sub(us))
    }

    /// Microseconds from `earlier` to `self`; 0 if `earlier` is not before.
    pub const fn us_since(self, earlier: Micros) -> u64 {
        self.0.saturating_sub(earlier.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn milliseconds_and_microseconds_meet_only_through_named_conversions() {
        let t = Micros::from_ms(1_700_000_000_123);
        assert_eq!(t.as_us(), 1_700_000_000_123_000);
        assert_eq!(t.as_ms_floor(), 1_700_000_000_123);
        assert_eq!(t.as_ms_ceil(), 1_700_000_000_123);
        let later = t.saturating_add_us(1);
        assert_eq!(later.as_ms_floor(), 1_700_000_000_123);
        assert_eq!(later.as_ms_ceil(), 1_700_000_000_124);
        assert_eq!(t.saturating_add_ms(2), Micros::from_us(t.as_us() + 2000));
        assert_eq!(later.us_since(t), 1);
        assert_eq!(t.us_since(later), 0);
    }

    #[test]
    fn a_duration_since_the_epoch_counts_whole_microseconds() {
        let d = Duration::new(1_700_000_000, 123_456_789);
        assert_eq!(Micros::from_duration(d).as_us(), 1_700_000_000_123_456);
        assert_eq!(Micros::from_duration(Duration::MAX).as_us(), u64::MAX);
    }

    #[test]
    fn arithmetic_saturates_at_both_ends() {
        assert_eq!(Micros::from_ms(u64::MAX).as_us(), u64::MAX);
        assert_eq!(
            Micros::from_us(u64::MAX - 1).saturating_add_ms(1).as_us(),
            u64::MAX
        );
        assert_eq!(Micros::from_us(5).saturating_sub_us(6), Micros::EPOCH);
    }
}

//! Calendar periods in time zones, for `RL.QUOTA`: where the day, ISO week,
//! month or year that contains an instant ends, in `UTC`, a fixed offset
//! (`+05:30`) or an IANA zone (`America/New_York`, with its 23- and 25-hour
//! days).
//!
//! Only the master reads a time-zone database (through `jiff`: the system's
//! `/usr/share/zoneinfo`, which the OS's tzdata package keeps current, and a
//! copy bundled in the module where a system has none). It propagates the
//! end it found with the call (`END <unix_us>`), so a replica or an AOF
//! replay never asks its own database, and agrees with the master even when
//! theirs differ.
//!
//! A zone is kept as a small number, so that the parameters of a call stay
//! plain integers: 0 is UTC, and every other zone a call names is interned
//! on first use (at most one entry per distinct name the database knows, so
//! the table is bounded by the database).

use std::sync::{Mutex, MutexGuard};

use jiff::civil::Date;
use jiff::tz::{Offset, TimeZone};
use jiff::Timestamp;

use crate::limiter::quota::Period;
use crate::limiter::Micros;

/// A zone, as a call names it: 0 is UTC.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Zone(u32);

/// UTC, the default.
pub const UTC: Zone = Zone(0);

/// The zones named so far (the n-th is `Zone(n + 1)`).
static ZONES: Mutex<Vec<(Box<[u8]>, TimeZone)>> = Mutex::new(Vec::new());

fn zones() -> MutexGuard<'static, Vec<(Box<[u8]>, TimeZone)>> {
    ZONES
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// The widest fixed offset a call may name, in seconds: +/-18:00, the range
/// of java.time's `ZoneOffset` (and of every zone in the database, whose
/// widest is +14:00), so that the server and the kits accept the same zones.
const MAX_OFFSET_S: i32 = 18 * 3600;

/// The widest fixed offset builds before the +/-18:00 bound accepted
/// (+/-25:59), which their RDB files may still hold in a policy.
const STORED_MAX_OFFSET_S: i32 = 25 * 3600 + 59 * 60;

/// Why a `TZ` value is refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BadZone {
    /// Neither UTC, an offset, nor a name the database knows.
    Unknown,
    /// A fixed offset beyond +/-18:00.
    OffsetOutOfRange,
}

impl BadZone {
    /// The error text for `value`, naming `TZ`.
    pub fn message(self, value: &[u8]) -> String {
        match self {
            BadZone::Unknown => format!(
                "TZ must be UTC, a fixed offset such as +05:30, or a time zone name such as America/New_York, not '{}'",
                crate::error::Error::quote(value)
            ),
            BadZone::OffsetOutOfRange => format!(
                "TZ offset must be between -18:00 and +18:00, not '{}'",
                crate::error::Error::quote(value)
            ),
        }
    }
}

/// The zone a call names (`TZ zone`): `UTC`, `Z`, a fixed offset
/// `+HH:MM` / `-HH:MM` from -18:00 to +18:00, or an IANA name the database
/// knows (in any case).
pub fn zone(name: &[u8]) -> Result<Zone, BadZone> {
    intern(name, MAX_OFFSET_S)
}

/// The zone of a policy read from an RDB file: as [`zone`], and the fixed
/// offsets up to +/-25:59 that older builds accepted, so that a file they
/// wrote still loads.
pub fn stored_zone(name: &[u8]) -> Option<Zone> {
    intern(name, STORED_MAX_OFFSET_S).ok()
}

fn intern(name: &[u8], max_offset_s: i32) -> Result<Zone, BadZone> {
    if name.eq_ignore_ascii_case(b"UTC") || name.eq_ignore_ascii_case(b"Z") {
        return Ok(UTC);
    }
    // Before the table: an offset an RDB file brought in is no licence for
    // a call to name it.
    let offset = fixed_offset(name);
    if offset.is_some_and(|seconds| seconds.abs() > max_offset_s) {
        return Err(BadZone::OffsetOutOfRange);
    }
    let mut table = zones();
    if let Some(i) = table.iter().position(|(known, _)| **known == *name) {
        return Ok(Zone(i as u32 + 1));
    }
    let tz = match offset {
        Some(seconds) => Offset::from_seconds(seconds).ok().map(TimeZone::fixed),
        None => std::str::from_utf8(name).ok().and_then(|text| {
            // Names only: no paths, no POSIX TZ strings.
            if text.is_empty() || text.len() > 64 || text.starts_with('/') || text.contains("..") {
                return None;
            }
            TimeZone::get(text).ok()
        }),
    }
    .ok_or(BadZone::Unknown)?;
    table.push((Box::from(name), tz));
    Ok(Zone(table.len() as u32))
}

/// `+HH:MM` or `-HH:MM`, in seconds east of UTC (any two-digit hours;
/// minutes up to 59).
fn fixed_offset(name: &[u8]) -> Option<i32> {
    let [sign, h1, h2, b':', m1, m2] = *name else {
        return None;
    };
    let digit = |b: u8| b.is_ascii_digit().then(|| i32::from(b - b'0'));
    let hours = digit(h1)? * 10 + digit(h2)?;
    let minutes = digit(m1)? * 10 + digit(m2)?;
    if minutes > 59 {
        return None;
    }
    let seconds = (hours * 60 + minutes) * 60;
    match sign {
        b'+' => Some(seconds),
        b'-' => Some(-seconds),
        _ => None,
    }
}

/// The name of `zone`, as the call that named it first wrote it (`UTC`
/// for the default).
pub fn name(zone: Zone) -> Vec<u8> {
    if zone == UTC {
        return b"UTC".to_vec();
    }
    zones()
        .get(zone.0 as usize - 1)
        .map(|(name, _)| name.to_vec())
        .unwrap_or_else(|| b"UTC".to_vec())
}

/// The time zone of `zone`.
fn time_zone(zone: Zone) -> TimeZone {
    if zone == UTC {
        return TimeZone::UTC;
    }
    zones()
        .get(zone.0 as usize - 1)
        .map(|(_, tz)| tz.clone())
        .unwrap_or(TimeZone::UTC)
}

/// The end of the `period` that contains `now` in `zone` (the start of the
/// next one: its first day's first instant, which is midnight but where the
/// zone skips midnight), in Unix microseconds. Beyond the calendar's range
/// (year 9999) the period never ends.
pub fn period_end(period: Period, zone: Zone, now: Micros) -> Micros {
    let never = Micros::from_us(crate::limiter::MAX_TIME_US);
    let Ok(now_us) = i64::try_from(now.as_us()) else {
        return never;
    };
    let Ok(ts) = Timestamp::from_microsecond(now_us) else {
        return never;
    };
    let tz = time_zone(zone);
    let date = ts.to_zoned_datetime(tz.clone()).date();
    let next: Option<Date> = match period {
        Period::Day => date.tomorrow().ok(),
        Period::Week => {
            let to_monday = 7 - i64::from(date.weekday().to_monday_zero_offset());
            date.checked_add(jiff::Span::new().days(to_monday)).ok()
        }
        Period::Month => date.last_of_month().tomorrow().ok(),
        Period::Year => Date::new(date.year() + 1, 1, 1).ok(),
    };
    next.and_then(|next| next.to_zoned_datetime(tz).ok())
        .and_then(|start| u64::try_from(start.timestamp().as_microsecond()).ok())
        .map_or(never, Micros::from_us)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(text: &str) -> Micros {
        let ts: Timestamp = text.parse().expect("a timestamp");
        Micros::from_us(ts.as_microsecond() as u64)
    }
    fn end(period: Period, zone_name: &str, now: &str) -> Micros {
        period_end(period, zone(zone_name.as_bytes()).expect("a zone"), at(now))
    }

    #[test]
    fn days_end_at_midnight_in_their_zone_with_23_and_25_hour_days() {
        assert_eq!(
            end(Period::Day, "UTC", "2026-03-08T12:00:00Z"),
            at("2026-03-09T00:00:00Z")
        );
        assert_eq!(
            end(Period::Day, "+05:30", "2026-03-08T20:00:00Z"),
            at("2026-03-09T18:30:00Z")
        );
        // New York: 2026-03-08 starts at 05:00 UTC and lasts 23 hours.
        let ny = "America/New_York";
        assert_eq!(
            end(Period::Day, ny, "2026-03-08T12:00:00Z"),
            at("2026-03-09T04:00:00Z")
        );
        assert_eq!(
            end(Period::Day, ny, "2026-03-08T04:59:59Z"),
            at("2026-03-08T05:00:00Z")
        );
        // 2026-11-01 lasts 25 hours: from 04:00 UTC to 05:00 UTC the next day.
        assert_eq!(
            end(Period::Day, ny, "2026-11-01T04:00:00Z"),
            at("2026-11-02T05:00:00Z")
        );
        assert_eq!(
            end(Period::Day, ny, "2026-11-01T03:59:59Z"),
            at("2026-11-01T04:00:00Z")
        );
    }

    #[test]
    fn weeks_start_on_monday_months_and_years_on_the_first() {
        // 2026-12-31 is a Thursday; its ISO week ends on Monday 2027-01-04.
        assert_eq!(
            end(Period::Week, "UTC", "2026-12-31T10:00:00Z"),
            at("2027-01-04T00:00:00Z")
        );
        // A Monday at midnight starts a week.
        assert_eq!(
            end(Period::Week, "UTC", "2027-01-04T00:00:00Z"),
            at("2027-01-11T00:00:00Z")
        );
        assert_eq!(
            end(Period::Month, "UTC", "2028-02-29T23:59:59Z"),
            at("2028-03-01T00:00:00Z")
        );
        assert_eq!(
            end(Period::Month, "UTC", "2027-02-01T00:00:00Z"),
            at("2027-03-01T00:00:00Z")
        );
        assert_eq!(
            end(Period::Month, "UTC", "2026-04-15T00:00:00Z"),
            at("2026-05-01T00:00:00Z")
        );
        assert_eq!(
            end(Period::Year, "-08:00", "2026-12-31T23:00:00Z"),
            at("2027-01-01T08:00:00Z")
        );
        assert_eq!(
            end(Period::Month, "America/New_York", "2026-03-31T12:00:00Z"),
            at("2026-04-01T04:00:00Z")
        );
    }

    #[test]
    fn zones_are_utc_offsets_or_names_the_database_knows() {
        assert_eq!(zone(b"UTC"), Ok(UTC));
        assert_eq!(zone(b"utc"), Ok(UTC));
        assert!(zone(b"+08:00").is_ok());
        assert_eq!(zone(b"Europe/Paris"), zone(b"Europe/Paris"));
        for bad in [
            &b""[..],
            b"Mars/Olympus",
            b"+8",
            b"+05:60",
            b"*05:00",
            b"../etc/passwd",
            b"/etc/localtime",
            b"EST5EDT,M3.2.0,M11.1.0",
        ] {
            assert_eq!(
                zone(bad),
                Err(BadZone::Unknown),
                "{:?}",
                String::from_utf8_lossy(bad)
            );
        }
    }

    /// Fixed offsets go from -18:00 to +18:00, as java.time's `ZoneOffset`
    /// (which the Java kit parses zones with) accepts them.
    #[test]
    fn fixed_offsets_are_at_most_18_hours_either_way() {
        for good in [&b"+18:00"[..], b"-18:00", b"+14:00", b"-00:00", b"+17:59"] {
            assert!(zone(good).is_ok(), "{:?}", String::from_utf8_lossy(good));
        }
        for bad in [
            &b"+18:01"[..],
            b"-18:01",
            b"+19:00",
            b"+25:00",
            b"-25:59",
            b"+26:00",
            b"+99:59",
        ] {
            assert_eq!(
                zone(bad),
                Err(BadZone::OffsetOutOfRange),
                "{:?}",
                String::from_utf8_lossy(bad)
            );
        }
        assert_eq!(
            BadZone::OffsetOutOfRange.message(b"+25:00"),
            "TZ offset must be between -18:00 and +18:00, not '+25:00'"
        );
    }

    /// An RDB file of a build that took offsets up to 25:59 still loads,
    /// and what it brought in gives a call no licence to name such an
    /// offset.
    #[test]
    fn stored_offsets_up_to_25_59_load_but_calls_cannot_name_them() {
        let stored = stored_zone(b"+25:30").expect("an older build's offset");
        assert_eq!(name(stored), b"+25:30");
        assert_eq!(zone(b"+25:30"), Err(BadZone::OffsetOutOfRange));
        assert_eq!(stored_zone(b"+26:00"), None);
        assert_eq!(stored_zone(b"Europe/Paris"), zone(b"Europe/Paris").ok());
    }
}

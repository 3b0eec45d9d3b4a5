//! redis-cell's `CL.THROTTLE`: the GCRA of `token_bucket.rs` on redis-cell's
//! parameters, state and reply.
//!
//! `max_burst count period` is a bucket of `max_burst + 1` units that gains
//! `count` units every `period` seconds, continuously. The state is the one
//! redis-cell keeps in its string key: the theoretical arrival time `tat`, an
//! instant in Unix nanoseconds (the moment the bucket is full again), so that
//! a key redis-cell wrote is continued here, and the reverse.
//!
//! With `T = period / count` the time one unit takes to come back and
//! `tau = (max_burst + 1) * T`:
//!
//! ```text
//! deficit(now)    = max(tat - now, 0)
//! limited         iff deficit + q*T > tau      (also for q = 0, as redis-cell)
//! admitted, q > 0 tat' = now + deficit + q*T   (stored; nothing else is written)
//! remaining       = floor((tau - after) / T),  after = deficit (+ q*T if admitted)
//! retry_after     = deficit + q*T - tau        (limited; -1 if q*T > tau, or admitted)
//! reset_after     = after
//! ```
//!
//! Exactness: `T` is a fraction of nanoseconds, so time is counted in ticks
//! of `1 / count` nanosecond, in which one unit is exactly `period * 10^9`
//! ticks; all of it is integer arithmetic in `u128`. Only the stored instant
//! is whole nanoseconds (redis-cell's format): it keeps the exact TAT rounded
//! down. So a rate whose unit lasts a whole number of nanoseconds (every rate
//! that divides 10^9 per second: 10,000/s, 1,000,000/s, 10,000,000/s) is
//! exact, and any other gains less than 1 ns per admitted call (3 per second:
//! a unit is 333,333,333.3 ns, a call of one unit advances the TAT 333,333,333
//! ns, as redis-cell's does). Rounding down never denies what the exact
//! algorithm admits (a bucket filled to the brim at once takes every unit).
//! A unit may not be shorter than a nanosecond (`count <= period * 10^9`).
//!
//! Replies are in seconds, rounded up: a caller that waits `retry_after`
//! seconds is admitted. (redis-cell rounds up only a part above a
//! millisecond: 2.0004 s reads 2 there, 3 here.)
//!
//! Clock steps backwards: the deficit grows by the step, as for the token
//! bucket; nothing comes back until the clock moves forward again.

use crate::error::{in_range, ParamError};
use crate::{Micros, MAX_PARAM};

/// Nanoseconds in a second.
const NS_PER_S: u128 = 1_000_000_000;

/// The latest TAT: `i64::MAX` nanoseconds (redis-cell computes in `i64`).
const MAX_TAT_NS: u128 = i64::MAX as u128;

/// The longest time an empty bucket may take to fill: 100 years (of 365.25
/// days), in seconds, so that the TAT, in nanoseconds, fits redis-cell's
/// `i64` until the year 2160.
pub const MAX_THROTTLE_SPAN_S: u64 = 3_155_760_000;

/// The parameters of `CL.THROTTLE key max_burst count period`, valid by
/// construction: see [`ThrottleParams::new`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ThrottleParams {
    max_burst: u64,
    count: u64,
    period_s: u64,
}

/// What one `CL.THROTTLE` call answers, and the state it leaves.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Throttle {
    /// The request was refused (nothing changed).
    pub limited: bool,
    /// `max_burst + 1`.
    pub limit: u64,
    /// Units left right after the call.
    pub remaining: u64,
    /// Limited: seconds until the same request is admitted, rounded up, or
    /// -1 if it never can be (more units than the bucket holds); admitted: -1.
    pub retry_after_s: i64,
    /// The same in milliseconds, rounded up (for the deny log).
    pub retry_after_ms: i64,
    /// Seconds until the bucket is full again, rounded up.
    pub reset_after_s: u64,
    /// The TAT to store, in Unix nanoseconds: `Some` only when units were
    /// admitted (`quantity > 0`); a denial or a peek writes nothing.
    pub new_tat_ns: Option<u64>,
}

impl Throttle {
    /// The Unix millisecond the key may expire at: the TAT rounded up to a
    /// whole millisecond, so that the key never expires before the bucket is
    /// full again.
    pub fn expire_at_ms(tat_ns: u64) -> u64 {
        tat_ns.div_ceil(1_000_000)
    }
}

/// The instant a call ran at, or its TAT, beyond what an `i64` of
/// nanoseconds holds (the year 2262, redis-cell's bound too): a server clock
/// far in the future.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TimeOutOfRange;

impl ThrottleParams {
    /// A bucket of `max_burst + 1` units that gains `count` units every
    /// `period` seconds: `max_burst` from 0, `count` and `period` from 1,
    /// each at most [`MAX_PARAM`]; a unit no shorter than a nanosecond, and
    /// an empty bucket full again within [`MAX_THROTTLE_SPAN_S`].
    pub fn new(max_burst: u64, count: u64, period_s: u64) -> Result<Self, ParamError> {
        let params = ThrottleParams {
            max_burst: in_range("max_burst", max_burst, 0, MAX_PARAM)?,
            count: in_range("count", count, 1, MAX_PARAM)?,
            period_s: in_range("period", period_s, 1, MAX_PARAM)?,
        };
        if params.count as u128 > params.period_s as u128 * NS_PER_S {
            return Err(ParamError::SpanOutOfRange {
                what: "period / count (the time one unit takes to come back)",
                bound: "at least 1 ns (the state counts nanoseconds)",
            });
        }
        if params.limit() as u128 * params.period_s as u128
            > MAX_THROTTLE_SPAN_S as u128 * params.count as u128
        {
            return Err(ParamError::SpanOutOfRange {
                what: "(max_burst + 1) * period / count (the time to fill the bucket)",
                bound: "at most 100 years (3155760000 s)",
            });
        }
        Ok(params)
    }

    /// Whether a call at `now` can store its TAT: `now` plus the time to
    /// fill an empty bucket is within `i64` nanoseconds. When it is,
    /// [`throttle`] at `now` never fails.
    pub fn fits_at(&self, now: Micros) -> bool {
        let span_ns = self.tau().div_ceil(self.count as u128);
        now.as_us() as u128 * 1000 + span_ns <= MAX_TAT_NS
    }

    /// `max_burst + 1`: the units a full bucket holds.
    pub fn limit(&self) -> u64 {
        self.max_burst + 1
    }

    /// Ticks (of `1 / count` ns) one unit takes to come back.
    fn unit(&self) -> u128 {
        self.period_s as u128 * NS_PER_S
    }

    /// Ticks an empty bucket takes to fill.
    fn tau(&self) -> u128 {
        self.limit() as u128 * self.unit()
    }

    /// `ticks` in whole `per`-nanosecond steps, rounded up.
    fn ceil_in(&self, ticks: u128, ns_per_step: u128) -> u128 {
        ticks.div_ceil(self.count as u128 * ns_per_step)
    }
}

/// One `CL.THROTTLE` call of `quantity` units at `now` on a key holding
/// `tat_ns` (`None`: no key).
pub fn throttle(
    tat_ns: Option<u64>,
    params: &ThrottleParams,
    quantity: u64,
    now: Micros,
) -> Result<Throttle, TimeOutOfRange> {
    let c = params.count as u128;
    let now_ns = now.as_us() as u128 * 1000;
    if now_ns > MAX_TAT_NS {
        return Err(TimeOutOfRange);
    }
    let deficit_ns = (tat_ns.unwrap_or(0) as u128).saturating_sub(now_ns);
    let deficit = deficit_ns * c;
    let need = quantity as u128 * params.unit();
    let tau = params.tau();
    let limit = params.limit();
    let remaining = |after: u128| (tau.saturating_sub(after) / params.unit()) as u64;
    // Every span here is below 2^64 s: the replies fit an i64.
    let seconds = |ticks: u128| params.ceil_in(ticks, NS_PER_S) as u64;
    if deficit + need <= tau {
        let (after, new_tat_ns) = if quantity == 0 {
            (deficit, None)
        } else {
            // The exact TAT, rounded down to the nanosecond redis-cell stores.
            let after_ns = deficit_ns + need / c;
            let tat = now_ns + after_ns;
            if tat > MAX_TAT_NS {
                return Err(TimeOutOfRange);
            }
            (after_ns * c, Some(tat as u64))
        };
        return Ok(Throttle {
            limited: false,
            limit,
            remaining: remaining(after),
            retry_after_s: -1,
            retry_after_ms: -1,
            reset_after_s: seconds(after),
            new_tat_ns,
        });
    }
    let (retry_after_s, retry_after_ms) = if need > tau {
        (-1, -1)
    } else {
        let short = deficit + need - tau;
        (
            seconds(short) as i64,
            params.ceil_in(short, 1_000_000) as i64,
        )
    };
    Ok(Throttle {
        limited: true,
        limit,
        remaining: remaining(deficit),
        retry_after_s,
        retry_after_ms,
        reset_after_s: seconds(deficit),
        new_tat_ns: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: u64 = 1_000_000;
    /// A round instant, in microseconds.
    const T0: u64 = 1_780_000_000 * S;

    fn at(us: u64) -> Micros {
        Micros::from_us(us)
    }

    fn params(max_burst: u64, count: u64, period: u64) -> ThrottleParams {
        ThrottleParams::new(max_burst, count, period).unwrap()
    }

    /// The reply's five integers, as redis-cell orders them.
    fn reply(t: &Throttle) -> [i64; 5] {
        [
            t.limited as i64,
            t.limit as i64,
            t.remaining as i64,
            t.retry_after_s,
            t.reset_after_s as i64,
        ]
    }

    /// Calls in turn on one key: `(at_us, quantity)`, each reply.
    fn run(p: &ThrottleParams, calls: &[(u64, u64)]) -> Vec<[i64; 5]> {
        let mut tat = None;
        calls
            .iter()
            .map(|&(now, q)| {
                let t = throttle(tat, p, q, at(now)).unwrap();
                if let Some(new) = t.new_tat_ns {
                    tat = Some(new);
                }
                reply(&t)
            })
            .collect()
    }

    #[test]
    fn readme_example_allows_and_counts_down() {
        assert_eq!(run(&params(15, 30, 60), &[(T0, 1)]), [[0, 16, 15, -1, 2]]);
    }

    /// redis-cell's end-to-end test: burst 0, 1 per 2 s.
    #[test]
    fn end_to_end_sequence_limits_then_allows_after_the_retry() {
        let p = params(0, 1, 2);
        assert_eq!(
            run(&p, &[(T0, 1), (T0 + 1, 1), (T0 + 2 * S, 1)]),
            [[0, 1, 0, -1, 2], [1, 1, 0, 2, 2], [0, 1, 0, -1, 2]]
        );
    }

    /// The cases of redis-cell's own unit test (limit 5, 1 per second).
    #[test]
    fn redis_cells_unit_cases() {
        let p = params(4, 1, 1);
        let ms = 1000;
        let got = run(
            &p,
            &[
                (T0, 6),
                (T0, 1),
                (T0, 1),
                (T0, 1),
                (T0, 1),
                (T0, 1),
                (T0, 1),
                (T0 + 3000 * ms, 1),
                (T0 + 3100 * ms, 1),
                (T0 + 4000 * ms, 1),
                (T0 + 8000 * ms, 1),
                (T0 + 9500 * ms, 1),
                (T0 + 9500 * ms, 0),
                (T0 + 9500 * ms, 2),
                (T0 + 9500 * ms, 5),
            ],
        );
        let want = [
            [1, 5, 5, -1, 0],
            [0, 5, 4, -1, 1],
            [0, 5, 3, -1, 2],
            [0, 5, 2, -1, 3],
            [0, 5, 1, -1, 4],
            [0, 5, 0, -1, 5],
            [1, 5, 0, 1, 5],
            [0, 5, 2, -1, 3],
            // 3.9 s to reset (rounded up: 4).
            [0, 5, 1, -1, 4],
            [0, 5, 1, -1, 4],
            [0, 5, 4, -1, 1],
            [0, 5, 4, -1, 1],
            [0, 5, 4, -1, 1],
            [0, 5, 2, -1, 3],
            [1, 5, 2, 3, 3],
        ];
        assert_eq!(got, want);
    }

    #[test]
    fn a_peek_writes_nothing_and_an_admission_stores_the_tat_in_nanoseconds() {
        let p = params(9, 10, 1);
        let peek = throttle(None, &p, 0, at(T0)).unwrap();
        assert_eq!((reply(&peek), peek.new_tat_ns), ([0, 10, 10, -1, 0], None));
        let took = throttle(None, &p, 3, at(T0)).unwrap();
        assert_eq!(took.new_tat_ns, Some(T0 * 1000 + 300_000_000));
        let denied = throttle(took.new_tat_ns, &p, 8, at(T0)).unwrap();
        assert_eq!((denied.limited, denied.new_tat_ns), (true, None));
        assert_eq!(denied.retry_after_ms, 100);
    }

    /// A peek on a key whose deficit exceeds the bucket (new, lower
    /// parameters) says limited, as redis-cell does, and takes nothing.
    #[test]
    fn a_peek_beyond_the_bucket_is_limited() {
        let tat = Some(T0 * 1000 + 10_000_000_000);
        let t = throttle(tat, &params(1, 1, 1), 0, at(T0)).unwrap();
        assert_eq!(reply(&t), [1, 2, 0, 8, 10]);
        assert_eq!(t.new_tat_ns, None);
    }

    #[test]
    fn more_than_the_bucket_never_fits() {
        let t = throttle(None, &params(4, 1, 1), 6, at(T0)).unwrap();
        assert_eq!(
            (t.limited, t.retry_after_s, t.retry_after_ms),
            (true, -1, -1)
        );
    }

    /// Rates whose unit is a whole number of nanoseconds are exact, remaining
    /// included, also above 1,000,000 per second.
    #[test]
    fn high_rates_are_exact() {
        for count in [10_000u64, 1_000_000, 10_000_000, 1_000_000_000] {
            let p = params(count - 1, count, 1);
            let unit_ns = 1_000_000_000 / count;
            let mut tat = None;
            for taken in 1..=50u64 {
                let t = throttle(tat, &p, 1, at(T0)).unwrap();
                assert!(!t.limited, "{count}/s, call {taken}");
                assert_eq!(t.remaining, count - taken, "{count}/s, call {taken}");
                assert_eq!(t.new_tat_ns, Some(T0 * 1000 + taken * unit_ns));
                tat = t.new_tat_ns;
            }
            // A microsecond later, that many units came back.
            let back = 1000 / unit_ns;
            let t = throttle(tat, &p, 0, at(T0 + 1)).unwrap();
            assert_eq!(t.remaining, (count - 50 + back).min(count), "{count}/s");
        }
    }

    /// A bucket filled to the brim at once takes every unit, whatever the
    /// rate (the stored TAT rounds down, never up).
    #[test]
    fn a_burst_takes_the_whole_bucket_at_a_rate_of_fractional_nanoseconds() {
        for (count, period) in [
            (3u64, 1u64),
            (7, 1),
            (3_000_000, 1),
            (300_000_000, 1),
            (7, 3),
        ] {
            let p = params(2, count, period);
            let mut tat = None;
            for taken in 1..=3u64 {
                let t = throttle(tat, &p, 1, at(T0)).unwrap();
                assert!(!t.limited, "{count}/{period}s: call {taken}");
                assert_eq!(t.remaining, 3 - taken, "{count}/{period}s: call {taken}");
                tat = t.new_tat_ns;
            }
            assert!(throttle(tat, &p, 1, at(T0)).unwrap().limited);
        }
    }

    #[test]
    fn retry_and_reset_round_up_to_the_second() {
        // 1 per 10 s, burst 0: taken at T0; 1 us later the retry is 9.999999 s.
        let p = params(0, 1, 10);
        let tat = throttle(None, &p, 1, at(T0)).unwrap().new_tat_ns;
        let t = throttle(tat, &p, 1, at(T0 + 1)).unwrap();
        assert_eq!((t.retry_after_s, t.reset_after_s), (10, 10));
        assert_eq!(t.retry_after_ms, 10_000);
        // A second later: 9 s exactly.
        let t = throttle(tat, &p, 1, at(T0 + S)).unwrap();
        assert_eq!((t.retry_after_s, t.reset_after_s), (9, 9));
    }

    #[test]
    fn a_clock_going_back_refills_nothing() {
        let p = params(0, 1, 1);
        let tat = throttle(None, &p, 1, at(T0)).unwrap().new_tat_ns;
        let t = throttle(tat, &p, 1, at(T0 - 5 * S)).unwrap();
        assert_eq!((t.limited, t.retry_after_s, t.reset_after_s), (true, 6, 6));
    }

    #[test]
    fn parameters_are_checked_and_name_the_argument() {
        let range = |arg, min| ParamError::Range {
            arg,
            min,
            max: MAX_PARAM,
        };
        assert_eq!(
            ThrottleParams::new(MAX_PARAM + 1, 1, 1),
            Err(range("max_burst", 0))
        );
        assert_eq!(ThrottleParams::new(0, 0, 1), Err(range("count", 1)));
        assert_eq!(ThrottleParams::new(0, 1, 0), Err(range("period", 1)));
        assert!(matches!(
            ThrottleParams::new(0, 1_000_000_001, 1),
            Err(ParamError::SpanOutOfRange { .. })
        ));
        assert!(ThrottleParams::new(0, 1_000_000_000, 1).is_ok());
        assert!(ThrottleParams::new(MAX_PARAM - 1, MAX_PARAM, MAX_THROTTLE_SPAN_S).is_ok());
        assert!(matches!(
            ThrottleParams::new(MAX_PARAM, 1, MAX_PARAM),
            Err(ParamError::SpanOutOfRange { .. })
        ));
    }

    /// The largest values never overflow, and every reply fits an `i64`.
    #[test]
    fn extremes_stay_in_range() {
        let p = params(MAX_PARAM - 1, MAX_PARAM, MAX_THROTTLE_SPAN_S);
        let t = throttle(Some(u64::MAX), &p, MAX_PARAM, at(T0)).unwrap();
        assert!(t.limited && t.retry_after_s > 0 && t.reset_after_s < i64::MAX as u64);
        let t = throttle(None, &p, MAX_PARAM, at(T0)).unwrap();
        assert!(!t.limited && t.new_tat_ns.is_some());
        assert!(p.fits_at(at(T0)));
        let late = Micros::from_us(i64::MAX as u64 / 1000 + 1);
        assert!(!p.fits_at(late));
        assert_eq!(throttle(None, &p, 1, late), Err(TimeOutOfRange));
        let close = Micros::from_us(i64::MAX as u64 / 1000 - 1000);
        assert_eq!(throttle(None, &p, 1, close), Err(TimeOutOfRange));
        assert!(!p.fits_at(close));
    }

    #[test]
    fn the_key_expires_at_the_tat_rounded_up_to_the_millisecond() {
        assert_eq!(Throttle::expire_at_ms(1_000_000), 1);
        assert_eq!(Throttle::expire_at_ms(1_000_001), 2);
    }
}

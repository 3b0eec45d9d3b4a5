//! Rules: an algorithm with its parameters (checked when built, with the
//! core crate's own checks) or the name of a policy kept in the server,
//! and the key each applies to.

use std::fmt;

use redis_ratelimit_core::{
    quota::{utc_period_end, PERIODS},
    ConcurrencyParams, FixedWindowParams, HashWindowParams, LeakyBucketParams, Micros, Period,
    QuotaParams, SlidingLogParams, TokenBucketParams,
};

use crate::Error;

/// An algorithm and its parameters, valid by construction.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Spec {
    /// `TOKENBUCKET capacity refill_count refill_ms`
    TokenBucket(TokenBucketParams),
    /// `FIXEDWINDOW limit window_ms`
    FixedWindow(FixedWindowParams),
    /// `LEAKYBUCKET capacity leak_count leak_ms`
    LeakyBucket(LeakyBucketParams),
    /// `SLIDING limit window_ms`
    Sliding(SlidingLogParams),
    /// `HASHWINDOW limit window_ms bucket_ms`
    HashWindow(HashWindowParams),
    /// `CONCURRENCY limit lease_ms`: units held by leases, not a rate.
    Concurrency(ConcurrencyParams),
    /// `QUOTA limit DAY|WEEK|MONTH|YEAR [TZ zone]`: `limit` units per
    /// calendar period in a time zone. A policy keeps its zone (`RL.POLICY
    /// SET ... TZ zone`); `RL.ALL`'s inline specs count in UTC only, so a
    /// zoned inline quota is a rule applied on its own (`RL.QUOTA ... TZ`).
    Quota(QuotaParams, Zone),
}

/// The longest zone name the module takes.
const MAX_ZONE: usize = 64;

/// The time zone of a calendar quota, checked as the module checks it:
/// `UTC` (the default; also `Z`), a fixed offset `+HH:MM` / `-HH:MM` (hours
/// up to 25), or an IANA name such as `America/New_York` (whether the
/// server's database knows the name is the server's answer). Small and
/// `Copy`: the name is kept inline.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct Zone {
    len: u8,
    name: [u8; MAX_ZONE],
}

/// What a [`Zone`] is, for the local level (which reads no time-zone
/// database).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ZoneKind {
    Utc,
    /// Seconds east of UTC.
    Offset(i64),
    Named,
}

impl Zone {
    /// UTC.
    pub const UTC: Zone = Zone {
        len: 3,
        name: utc_name(),
    };

    /// A zone by name, or [`Error::BadArgument`] naming `zone`.
    pub fn new(name: &str) -> Result<Zone, Error> {
        let bad = || {
            Error::bad(
                "RL.QUOTA",
                "zone",
                format!(
                    "TZ must be UTC, a fixed offset such as +05:30, or a time zone name such as \
                     America/New_York, not {name:?}"
                ),
            )
        };
        if name.eq_ignore_ascii_case("UTC") || name.eq_ignore_ascii_case("Z") {
            return Ok(Zone::UTC);
        }
        let b = name.as_bytes();
        let looks_like_offset = matches!(b.first(), Some(b'+' | b'-'));
        if looks_like_offset {
            fixed_offset(b).ok_or_else(bad)?;
        } else if b.is_empty()
            || b.len() > MAX_ZONE
            || name.contains("..")
            || !b[0].is_ascii_alphabetic()
            || !b
                .iter()
                .all(|c| c.is_ascii_alphanumeric() || b"/_-+".contains(c))
        {
            return Err(bad());
        }
        let mut zone = Zone {
            len: b.len() as u8,
            name: [0; MAX_ZONE],
        };
        zone.name[..b.len()].copy_from_slice(b);
        Ok(zone)
    }

    /// The name, as sent after `TZ`.
    pub fn as_str(&self) -> &str {
        std::str::from_utf8(&self.name[..self.len as usize]).unwrap_or("UTC")
    }

    /// Whether this is UTC (then no `TZ` is sent).
    pub fn is_utc(&self) -> bool {
        self.kind() == ZoneKind::Utc
    }

    pub(crate) fn kind(&self) -> ZoneKind {
        let b = &self.name[..self.len as usize];
        if b.eq_ignore_ascii_case(b"UTC") || b.eq_ignore_ascii_case(b"Z") {
            return ZoneKind::Utc;
        }
        match fixed_offset(b) {
            Some(s) => ZoneKind::Offset(s),
            None => ZoneKind::Named,
        }
    }
}

impl Default for Zone {
    fn default() -> Zone {
        Zone::UTC
    }
}

impl fmt::Debug for Zone {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Zone({:?})", self.as_str())
    }
}

impl fmt::Display for Zone {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

const fn utc_name() -> [u8; MAX_ZONE] {
    let mut name = [0; MAX_ZONE];
    name[0] = b'U';
    name[1] = b'T';
    name[2] = b'C';
    name
}

/// `+HH:MM` or `-HH:MM` from -18:00 to +18:00 (as the module takes them,
/// and java.time's `ZoneOffset`), in seconds east of UTC.
fn fixed_offset(b: &[u8]) -> Option<i64> {
    let [sign, h1, h2, b':', m1, m2] = *b else {
        return None;
    };
    let digit = |c: u8| c.is_ascii_digit().then(|| i64::from(c - b'0'));
    let (hours, minutes) = (digit(h1)? * 10 + digit(h2)?, digit(m1)? * 10 + digit(m2)?);
    if minutes > 59 || hours * 60 + minutes > 18 * 60 {
        return None;
    }
    let s = (hours * 60 + minutes) * 60;
    match sign {
        b'+' => Some(s),
        b'-' => Some(-s),
        _ => None,
    }
}

/// A period by its word (`DAY`, `WEEK`, `MONTH`, `YEAR`, in any case), or
/// [`Error::BadArgument`] naming `period`.
pub fn parse_period(word: &str) -> Result<Period, Error> {
    PERIODS
        .iter()
        .position(|p| p.eq_ignore_ascii_case(word))
        .and_then(|i| Period::from_index(i as u64))
        .ok_or_else(|| {
            Error::bad(
                "RL.QUOTA",
                "period",
                format!("period must be one of DAY, WEEK, MONTH, YEAR, not {word:?}"),
            )
        })
}

/// The word of a period, as the commands take it.
pub fn period_word(period: Period) -> &'static str {
    PERIODS[period.index() as usize]
}

/// The nominal length of a period in seconds, the `w` of `RateLimit-Policy`
/// for a quota: 86400 for a day, 604800 for a week, 2592000 (30 days) for a
/// month, 31536000 (365 days) for a year.
pub fn period_nominal_s(period: Period) -> u64 {
    match period {
        Period::Day => 86_400,
        Period::Week => 604_800,
        Period::Month => 2_592_000,
        Period::Year => 31_536_000,
    }
}

/// The end of the period that contains `now` in a UTC or fixed-offset
/// zone (`None` for a named zone: the kit reads no time-zone database).
pub(crate) fn local_period_end(period: Period, zone: Zone, now: Micros) -> Option<Micros> {
    let offset_us = match zone.kind() {
        ZoneKind::Utc => 0,
        ZoneKind::Offset(s) => s * 1_000_000,
        ZoneKind::Named => return None,
    };
    let shift = |t: Micros, by: i64| {
        if by >= 0 {
            t.saturating_add_us(by as u64)
        } else {
            t.saturating_sub_us(by.unsigned_abs())
        }
    };
    let local_end = utc_period_end(period, shift(now, offset_us));
    Some(shift(local_end, -offset_us))
}

impl Spec {
    /// The algorithm's name in commands and specs (`TOKENBUCKET`, ...).
    pub fn algorithm(&self) -> &'static str {
        match self {
            Spec::TokenBucket(_) => "TOKENBUCKET",
            Spec::FixedWindow(_) => "FIXEDWINDOW",
            Spec::LeakyBucket(_) => "LEAKYBUCKET",
            Spec::Sliding(_) => "SLIDING",
            Spec::HashWindow(_) => "HASHWINDOW",
            Spec::Concurrency(_) => "CONCURRENCY",
            Spec::Quota(..) => "QUOTA",
        }
    }

    /// The parameters, in the commands' order (a quota's period as its
    /// number in `DAY, WEEK, MONTH, YEAR`, from 0; see [`Spec::args`]).
    pub fn params(&self) -> Vec<u64> {
        match self {
            Spec::TokenBucket(p) => vec![p.capacity(), p.refill_count(), p.refill_ms()],
            Spec::FixedWindow(p) => vec![p.limit(), p.window_ms()],
            Spec::LeakyBucket(p) => vec![p.capacity(), p.leak_count(), p.leak_ms()],
            Spec::Sliding(p) => vec![p.limit(), p.window_ms()],
            Spec::HashWindow(p) => vec![p.limit(), p.window_ms(), p.bucket_ms()],
            Spec::Concurrency(p) => vec![p.limit(), p.lease_ms()],
            Spec::Quota(p, _) => vec![p.limit(), p.period().index()],
        }
    }

    /// The arguments after the algorithm's name (in a policy or `RL.ALL`)
    /// or after the key (in the command): the parameters, with a quota's
    /// period as its word and its zone as `TZ zone` when it is not UTC.
    pub fn args(&self) -> Vec<String> {
        match self {
            Spec::Quota(p, zone) => {
                let mut out = vec![p.limit().to_string(), period_word(p.period()).to_string()];
                if !zone.is_utc() {
                    out.push("TZ".into());
                    out.push(zone.as_str().into());
                }
                out
            }
            other => other.params().iter().map(u64::to_string).collect(),
        }
    }

    /// [`Spec::args`] without a quota's `TZ zone`: the spec as `RL.POLICY
    /// SET` and `RL.ALL` take it (a policy's zone goes among its options).
    pub(crate) fn params_args(&self) -> Vec<String> {
        let mut args = self.args();
        args.truncate(match self {
            Spec::Quota(..) => 2,
            _ => args.len(),
        });
        args
    }

    /// A calendar quota: `limit` units per `period` in `zone` (`None`: UTC).
    pub fn quota(limit: u64, period: Period, zone: Option<&str>) -> Result<Spec, Error> {
        let zone = zone.map(Zone::new).transpose()?.unwrap_or_default();
        let params = QuotaParams::new(limit, period)
            .map_err(|e| Error::bad("RL.QUOTA", "limit", e.to_string()))?;
        Ok(Spec::Quota(params, zone))
    }

    /// The quota's zone, when this is a quota.
    pub fn zone(&self) -> Option<Zone> {
        match self {
            Spec::Quota(_, zone) => Some(*zone),
            _ => None,
        }
    }

    /// Builds a spec from an algorithm name and its parameters, as
    /// `RL.POLICY GET` answers them.
    pub fn parse(rule: &str, algorithm: &str, params: &[u64]) -> Result<Spec, Error> {
        let arity = match algorithm.to_ascii_uppercase().as_str() {
            "TOKENBUCKET" | "LEAKYBUCKET" | "HASHWINDOW" => 3,
            "FIXEDWINDOW" | "SLIDING" | "CONCURRENCY" | "QUOTA" => 2,
            other => {
                return Err(Error::bad(
                    rule,
                    "algorithm",
                    format!("unknown algorithm {other}"),
                ))
            }
        };
        if params.len() != arity {
            return Err(Error::bad(
                rule,
                "params",
                format!("{algorithm} takes {arity} parameters"),
            ));
        }
        let p = |i: usize| params[i];
        let checked = |r: Result<Spec, redis_ratelimit_core::ParamError>| {
            r.map_err(|e| {
                let arg = match e {
                    redis_ratelimit_core::ParamError::Range { arg, .. } => arg,
                    redis_ratelimit_core::ParamError::SpanTooLong { .. }
                    | redis_ratelimit_core::ParamError::SpanOutOfRange { .. } => "span",
                    redis_ratelimit_core::ParamError::BucketDoesNotDivide => "bucket_ms",
                };
                Error::bad(rule, arg, e.to_string())
            })
        };
        checked(match algorithm.to_ascii_uppercase().as_str() {
            "TOKENBUCKET" => TokenBucketParams::new(p(0), p(1), p(2)).map(Spec::TokenBucket),
            "LEAKYBUCKET" => LeakyBucketParams::new(p(0), p(1), p(2)).map(Spec::LeakyBucket),
            "HASHWINDOW" => HashWindowParams::new(p(0), p(1), p(2)).map(Spec::HashWindow),
            "FIXEDWINDOW" => FixedWindowParams::new(p(0), p(1)).map(Spec::FixedWindow),
            "CONCURRENCY" => ConcurrencyParams::new(p(0), p(1)).map(Spec::Concurrency),
            "QUOTA" => {
                let Some(period) = Period::from_index(p(1)) else {
                    return Err(Error::bad(
                        rule,
                        "period",
                        format!(
                            "the period is 0 to 3 (DAY, WEEK, MONTH, YEAR), not {}",
                            p(1)
                        ),
                    ));
                };
                QuotaParams::new(p(0), period).map(|q| Spec::Quota(q, Zone::UTC))
            }
            _ => SlidingLogParams::new(p(0), p(1)).map(Spec::Sliding),
        })
    }

    /// Requests (or units) per window: the `q` of `RateLimit-Policy`.
    pub fn limit(&self) -> u64 {
        match self {
            Spec::TokenBucket(p) => p.capacity(),
            Spec::LeakyBucket(p) => p.capacity(),
            Spec::FixedWindow(p) => p.limit(),
            Spec::Sliding(p) => p.limit(),
            Spec::HashWindow(p) => p.limit(),
            Spec::Concurrency(p) => p.limit(),
            Spec::Quota(p, _) => p.limit(),
        }
    }

    /// Whether this is `CONCURRENCY`: leases held, not a rate.
    pub fn is_concurrency(&self) -> bool {
        matches!(self, Spec::Concurrency(_))
    }

    /// The `w` of `RateLimit-Policy`, in seconds, rounded up: the window for
    /// the windows, the time to refill an empty bucket (`capacity * refill_ms
    /// / refill_count`) for the buckets, the period's nominal length for a
    /// quota ([`period_nominal_s`]: a month is 30 days, a year 365); `None`
    /// for concurrency, which has no window.
    pub fn window_s(&self) -> Option<u64> {
        let ms = match self {
            Spec::TokenBucket(p) => ceil_div(
                p.capacity() as u128 * p.refill_ms() as u128,
                p.refill_count() as u128,
            ),
            Spec::LeakyBucket(p) => ceil_div(
                p.capacity() as u128 * p.leak_ms() as u128,
                p.leak_count() as u128,
            ),
            Spec::FixedWindow(p) => p.window_ms() as u128,
            Spec::Sliding(p) => p.window_ms() as u128,
            Spec::HashWindow(p) => p.window_ms() as u128,
            Spec::Concurrency(_) => return None,
            Spec::Quota(p, _) => return Some(period_nominal_s(p.period())),
        };
        Some(u64::try_from(ceil_div(ms, 1000)).unwrap_or(u64::MAX))
    }

    /// The spec a policy runs at `scale` percent (the protection loop's
    /// scale): its size and rate parameters (the capacity or limit, and a
    /// bucket's refill or leak count) become max(1, floor(p x scale / 100)),
    /// as the server runs them; the periods stay. At 100 or more, itself.
    pub fn scaled(&self, scale: u8) -> Spec {
        if scale >= 100 {
            return *self;
        }
        let s = |p: u64| redis_ratelimit_core::protection::scaled(p, u64::from(scale));
        let params = self.params();
        let scaled: Vec<u64> = match self {
            Spec::TokenBucket(_) | Spec::LeakyBucket(_) => {
                vec![s(params[0]), s(params[1]), params[2]]
            }
            _ => std::iter::once(s(params[0]))
                .chain(params[1..].iter().copied())
                .collect(),
        };
        match Spec::parse("-", self.algorithm(), &scaled) {
            Ok(Spec::Quota(p, _)) => Spec::Quota(p, self.zone().unwrap_or_default()),
            Ok(spec) => spec,
            // A parameter the rules would refuse scaled: unscaled, as the
            // server does.
            Err(_) => *self,
        }
    }

    /// Stripe `i` of `n`: every size and rate parameter (a bucket's
    /// capacity and refill count, a window's or a quota's limit) split as
    /// `p / n`, plus 1 for the first `p % n` stripes; periods unchanged. An
    /// error naming `striped` when a share would be 0.
    pub fn stripe(&self, rule: &str, n: u64, i: u64) -> Result<Spec, Error> {
        let share = |p: u64| p / n + u64::from(i < p % n);
        let params = self.params();
        let split: Vec<u64> = match self {
            Spec::TokenBucket(_) | Spec::LeakyBucket(_) => {
                vec![share(params[0]), share(params[1]), params[2]]
            }
            _ => std::iter::once(share(params[0]))
                .chain(params[1..].iter().copied())
                .collect(),
        };
        let smallest = match self {
            Spec::TokenBucket(_) | Spec::LeakyBucket(_) => params[0].min(params[1]),
            _ => params[0],
        };
        if n > smallest {
            return Err(Error::bad(
                rule,
                "striped",
                format!(
                    "{n} stripes leave a stripe without a unit: every share of the limit (and \
                     of a bucket's refill count) must be at least 1, so at most {smallest}"
                ),
            ));
        }
        match Spec::parse(rule, self.algorithm(), &split) {
            Ok(Spec::Quota(p, _)) => Ok(Spec::Quota(p, self.zone().unwrap_or_default())),
            Ok(spec) => Ok(spec),
            Err(Error::BadArgument { reason, .. }) => Err(Error::bad(rule, "striped", reason)),
            Err(e) => Err(e),
        }
    }

    /// The same algorithm at a share of its limit: `ceil(limit * 11 /
    /// (instances * 10))` (or `share` when given), at least 1, for the
    /// capacity or limit and for the refill or leak count alike, so the
    /// window or refill period stays.
    pub(crate) fn local_share(&self, rule: &str, share: Share) -> Result<Spec, Error> {
        let s = |n: u64| share.of(n);
        let params = self.params();
        let scaled: Vec<u64> = match self {
            Spec::TokenBucket(_) | Spec::LeakyBucket(_) => {
                vec![s(params[0]), s(params[1]), params[2]]
            }
            Spec::HashWindow(_) => vec![s(params[0]), params[1], params[2]],
            Spec::FixedWindow(_) | Spec::Sliding(_) | Spec::Concurrency(_) => {
                vec![s(params[0]), params[1]]
            }
            Spec::Quota(_, zone) => {
                let local = Spec::parse(rule, "QUOTA", &[s(params[0]), params[1]])?;
                return Ok(match local {
                    Spec::Quota(p, _) => Spec::Quota(p, *zone),
                    other => other,
                });
            }
        };
        Spec::parse(rule, self.algorithm(), &scaled)
    }
}

fn ceil_div(a: u128, b: u128) -> u128 {
    a.div_ceil(b.max(1))
}

/// How much of a global limit one instance takes locally.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Share {
    /// `ceil(total / instances * 1.1)`, at least 1 (seed 000's rule: 15,000/s
    /// over 20 instances gives 825 each).
    Instances(u64),
    /// `ceil(total * ratio)`, at least 1.
    Ratio(f64),
}

impl Share {
    /// This instance's part of `total`.
    pub fn of(self, total: u64) -> u64 {
        let part = match self {
            Share::Instances(n) => {
                let n = n.max(1) as u128;
                (total as u128 * 11).div_ceil(n * 10).min(u64::MAX as u128) as u64
            }
            Share::Ratio(r) => (total as f64 * r).ceil().min(u64::MAX as f64) as u64,
        };
        part.clamp(1, total.max(1))
    }
}

/// What a rule asks the server: an inline algorithm or a policy by name.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RuleKind {
    /// An algorithm with its parameters, sent with every call.
    Inline(Spec),
    /// `RL.HIT name key` / `POLICY name`: the rule kept in the server.
    Policy(String),
}

/// Where the limiter key of a rule comes from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum KeyShape {
    /// `prefix + identity`: one limiter per user, IP, tenant...
    PerIdentity(String),
    /// One key for everybody (a global limit).
    Fixed(String),
}

/// One limit: its name (for headers and logs), what the server applies,
/// the key, and whether it is global (then the local level may take part
/// of it in process).
#[derive(Clone, Debug, PartialEq)]
pub struct Rule {
    pub(crate) name: String,
    pub(crate) kind: Result<RuleKind, Error>,
    pub(crate) key: KeyShape,
    pub(crate) global: bool,
    pub(crate) breaker: Option<String>,
    pub(crate) batch: Option<Batch>,
    pub(crate) stripes: u64,
}

/// How a batched rule takes its grants ([`Rule::batched_with`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Batch {
    /// How long units may stay held in process before they go back with
    /// `REFUND` (1 to 60,000 ms; 50 by default); a batch is about this
    /// long's worth of the instance's observed rate.
    pub hold_ms: u64,
    /// The largest batch, in percent of the rule's limit (1 to 100; 10 by
    /// default): what one instance may hold at once.
    pub max_share_pct: u64,
}

impl Default for Batch {
    fn default() -> Batch {
        Batch {
            hold_ms: 50,
            max_share_pct: 10,
        }
    }
}

/// The most stripes a rule may have ([`Rule::striped`]).
pub const MAX_STRIPES: u64 = 64;

impl Rule {
    fn inline(algorithm: &str, params: &[u64]) -> Rule {
        let name = algorithm.to_ascii_lowercase();
        Rule {
            kind: Spec::parse(&name, algorithm, params).map(RuleKind::Inline),
            key: KeyShape::PerIdentity(format!("rl:{name}:")),
            name,
            global: false,
            breaker: None,
            batch: None,
            stripes: 1,
        }
    }

    /// `capacity` tokens, `refill_count` more every `refill_ms`.
    pub fn token_bucket(capacity: u64, refill_count: u64, refill_ms: u64) -> Rule {
        Rule::inline("TOKENBUCKET", &[capacity, refill_count, refill_ms])
    }
    /// `limit` per window of `window_ms`, aligned on the epoch.
    pub fn fixed_window(limit: u64, window_ms: u64) -> Rule {
        Rule::inline("FIXEDWINDOW", &[limit, window_ms])
    }
    /// A shaping queue of `capacity` units leaving at `leak_count` per `leak_ms`.
    pub fn leaky_bucket(capacity: u64, leak_count: u64, leak_ms: u64) -> Rule {
        Rule::inline("LEAKYBUCKET", &[capacity, leak_count, leak_ms])
    }
    /// Exact sliding log: `limit` in any `window_ms`.
    pub fn sliding(limit: u64, window_ms: u64) -> Rule {
        Rule::inline("SLIDING", &[limit, window_ms])
    }
    /// Sliding window over buckets of `bucket_ms`.
    pub fn hash_window(limit: u64, window_ms: u64, bucket_ms: u64) -> Rule {
        Rule::inline("HASHWINDOW", &[limit, window_ms, bucket_ms])
    }
    /// At most `limit` requests in flight per key, each holding a lease of
    /// `lease_ms` (renewed while it runs): for
    /// [`crate::RateLimitLayerBuilder::concurrency`], not for a rule set.
    pub fn concurrency(limit: u64, lease_ms: u64) -> Rule {
        Rule::inline("CONCURRENCY", &[limit, lease_ms])
    }
    /// A calendar quota: `limit` units per `period` (a day, an ISO week from
    /// Monday, a month, a year) in UTC. Usable wherever rules go: alone,
    /// with others in one `RL.ALL`, global with the local level.
    pub fn quota(limit: u64, period: Period) -> Rule {
        Rule::quota_in(limit, period, "UTC")
    }
    /// [`Rule::quota`] in the time zone `zone` (`UTC`, `+05:30`,
    /// `America/New_York`). A zone other than UTC needs the rule's own
    /// `RL.QUOTA ... TZ` call: it cannot join other rules in one `RL.ALL`
    /// (a quota policy in a zone can: see [`crate::Client::policy_set`]),
    /// and only a fixed offset can be global (the local level reads no
    /// time-zone database).
    pub fn quota_in(limit: u64, period: Period, zone: &str) -> Rule {
        let name = "quota".to_string();
        Rule {
            kind: Spec::quota(limit, period, Some(zone))
                .map(RuleKind::Inline)
                .map_err(|e| match e {
                    Error::BadArgument { arg, reason, .. } => Error::BadArgument {
                        rule: name.clone(),
                        arg,
                        reason,
                    },
                    other => other,
                }),
            key: KeyShape::PerIdentity(format!("rl:{name}:")),
            name,
            global: false,
            breaker: None,
            batch: None,
            stripes: 1,
        }
    }
    /// The policy `name` kept in the server (`RL.POLICY SET`), applied with
    /// `RL.HIT` (or `POLICY name` in `RL.ALL`).
    pub fn policy(name: impl Into<String>) -> Rule {
        let name = name.into();
        let kind =
            if name.is_empty() || name.len() > 256 || !name.bytes().all(|b| b.is_ascii_graphic()) {
                Err(Error::bad(
                    &name,
                    "policy name",
                    "must be 1 to 256 bytes of printable ASCII without spaces",
                ))
            } else {
                Ok(RuleKind::Policy(name.clone()))
            };
        Rule {
            key: KeyShape::PerIdentity(format!("rl:{name}:")),
            name,
            kind,
            global: false,
            breaker: None,
            batch: None,
            stripes: 1,
        }
    }

    /// The name in `RateLimit-Policy`, `RateLimit` and `violated-policies`.
    pub fn name(mut self, name: impl Into<String>) -> Rule {
        self.name = name.into();
        if let Err(Error::BadArgument { rule, .. }) = &mut self.kind {
            rule.clone_from(&self.name);
        }
        self
    }
    /// The limiter key is `prefix` followed by the request's identity.
    pub fn key_prefix(mut self, prefix: impl Into<String>) -> Rule {
        self.key = KeyShape::PerIdentity(prefix.into());
        self
    }
    /// The limiter key is `key` for every request (a global limit).
    pub fn fixed_key(mut self, key: impl Into<String>) -> Rule {
        self.key = KeyShape::Fixed(key.into());
        self
    }
    /// Marks the rule global: with a local level, each instance first takes
    /// its share of it in process, and what the share denies never reaches
    /// Redis. Only inline rules can be global.
    pub fn global(mut self) -> Rule {
        self.global = true;
        self
    }

    /// Batches the rule (and marks it global): a [`crate::Limiter`] takes
    /// units from the server with `UPTO b` and spends them in process, about
    /// `hold_ms` worth of the instance's own rate per call, so that most
    /// decisions need no round trip. Every unit admitted was taken from the
    /// server first: the limit is never exceeded, whatever the number of
    /// instances; units held longer than `hold_ms`, and all of them at
    /// [`crate::Limiter::close`], go back with `REFUND`. For an inline
    /// `TOKENBUCKET`, `FIXEDWINDOW`, `SLIDING`, `HASHWINDOW` or `QUOTA` rule
    /// with a fixed key. [`Batch::default`]: `hold_ms` 50, `max_share_pct` 10.
    pub fn batched(self) -> Rule {
        self.batched_with(Batch::default())
    }

    /// [`Rule::batched`] with its settings.
    pub fn batched_with(mut self, batch: Batch) -> Rule {
        self.batch = Some(batch);
        self.global = true;
        self
    }

    /// Stripes the rule over `n` keys (2 to 64; 1: not striped), and marks
    /// it global: stripe `i` has `limit / n` of every size and rate
    /// parameter (plus 1 for the first `limit % n`), and its key is the
    /// rule's key behind a hash tag that puts stripe `i` on master `i mod
    /// M` of the cluster. An instance takes from its own stripe (chosen at
    /// random) and, on a denial, from the next one before it denies: the
    /// sum never exceeds the limit. Combines with [`Rule::batched`].
    pub fn striped(mut self, n: u64) -> Rule {
        self.stripes = n;
        self.global = true;
        self
    }

    /// The batch settings, when the rule is batched.
    pub fn batch(&self) -> Option<Batch> {
        self.batch
    }

    /// The number of stripes (1: not striped).
    pub fn stripes(&self) -> u64 {
        self.stripes
    }

    /// Names the [`crate::CircuitBreaker`] this policy's stage moves: in a
    /// layer with a [`crate::Protection`], the breaker (taken from the
    /// protection by name, made if new) is forced open while the policy is
    /// at stage 2, and released when it falls below. Only policy rules have
    /// a stage.
    pub fn breaker(mut self, name: impl Into<String>) -> Rule {
        self.breaker = Some(name.into());
        self
    }

    /// The breaker this rule names.
    pub fn breaker_name(&self) -> Option<&str> {
        self.breaker.as_deref()
    }

    /// The rule's name.
    pub fn rule_name(&self) -> &str {
        &self.name
    }

    /// The checked rule: the first bad parameter, named.
    pub fn check(&self) -> Result<&RuleKind, Error> {
        let kind = self.kind.as_ref().map_err(Clone::clone)?;
        self.check_grants(kind)?;
        if self.global && matches!(kind, RuleKind::Policy(_)) {
            return Err(Error::bad(
                &self.name,
                "global",
                "a policy rule cannot be global: its parameters live in the server",
            ));
        }
        if self.breaker.is_some() && !matches!(kind, RuleKind::Policy(_)) {
            return Err(Error::bad(
                &self.name,
                "breaker",
                "only a policy rule has a stage to move a breaker",
            ));
        }
        if let RuleKind::Inline(Spec::Quota(_, zone)) = kind {
            if self.global && zone.kind() == ZoneKind::Named {
                return Err(Error::bad(
                    &self.name,
                    "zone",
                    "a quota in a named time zone cannot be global: the local level reads no \
                     time-zone database (use UTC or a fixed offset)",
                ));
            }
        }
        if self.name.is_empty() || self.name.contains('"') || self.name.contains('\\') {
            return Err(Error::bad(
                &self.name,
                "name",
                "must be non-empty, without quotes or backslashes",
            ));
        }
        Ok(kind)
    }

    /// Checks the batch and stripe options against the rule.
    fn check_grants(&self, kind: &RuleKind) -> Result<(), Error> {
        let grants_of = |what: &str| -> Result<&Spec, Error> {
            let algorithms =
                "an inline TOKENBUCKET, FIXEDWINDOW, SLIDING, HASHWINDOW or QUOTA rule";
            match kind {
                RuleKind::Inline(
                    spec @ (Spec::TokenBucket(_)
                    | Spec::FixedWindow(_)
                    | Spec::Sliding(_)
                    | Spec::HashWindow(_)
                    | Spec::Quota(..)),
                ) => Ok(spec),
                RuleKind::Inline(spec) => Err(Error::bad(
                    &self.name,
                    what,
                    format!("{what} needs {algorithms}, not {}", spec.algorithm()),
                )),
                RuleKind::Policy(_) => Err(Error::bad(
                    &self.name,
                    what,
                    format!("{what} needs {algorithms}: a policy's parameters live in the server"),
                )),
            }
        };
        if let Some(batch) = self.batch {
            grants_of("batched")?;
            if !(1..=60_000).contains(&batch.hold_ms) {
                return Err(Error::bad(
                    &self.name,
                    "hold_ms",
                    "must be an integer from 1 to 60000",
                ));
            }
            if !(1..=100).contains(&batch.max_share_pct) {
                return Err(Error::bad(
                    &self.name,
                    "max_share_pct",
                    "must be an integer from 1 to 100",
                ));
            }
        }
        if self.stripes != 1 {
            let spec = grants_of("striped")?;
            if !(2..=MAX_STRIPES).contains(&self.stripes) {
                return Err(Error::bad(
                    &self.name,
                    "striped",
                    format!("must be an integer from 2 to {MAX_STRIPES} (1: not striped)"),
                ));
            }
            spec.stripe(&self.name, self.stripes, 0)?;
        }
        if (self.batch.is_some() || self.stripes != 1) && !matches!(self.key, KeyShape::Fixed(_)) {
            let what = if self.batch.is_some() {
                "batched"
            } else {
                "striped"
            };
            return Err(Error::bad(
                &self.name,
                what,
                format!("{what} needs one key for everybody: give it a fixed_key"),
            ));
        }
        Ok(())
    }

    /// The limiter key for `identity`.
    pub fn key_for(&self, identity: &str) -> String {
        match &self.key {
            KeyShape::PerIdentity(prefix) => format!("{prefix}{identity}"),
            KeyShape::Fixed(key) => key.clone(),
        }
    }

    /// The hash tag of the rule's keys (`api` in `{api}:user:`), when the
    /// fixed part of the key has one: what puts every key of an `RL.ALL` in
    /// one cluster slot.
    pub fn hash_tag(&self) -> Option<&str> {
        let fixed = match &self.key {
            KeyShape::PerIdentity(prefix) => prefix,
            KeyShape::Fixed(key) => key,
        };
        let open = fixed.find('{')?;
        let len = fixed[open + 1..].find('}')?;
        (len > 0).then(|| &fixed[open + 1..open + 1 + len])
    }

    /// Whether the rule is global.
    pub fn is_global(&self) -> bool {
        self.global
    }
}

#[cfg(test)]
mod quota_tests {
    use super::*;

    #[test]
    fn zones_are_checked_as_the_module_checks_them() {
        for ok in [
            "UTC",
            "utc",
            "Z",
            "+05:30",
            "-18:00",
            "America/New_York",
            "Etc/GMT+5",
        ] {
            assert!(Zone::new(ok).is_ok(), "{ok}");
        }
        for bad in [
            "",
            "+26:00",
            "-25:59",
            "+18:01",
            "+5:30",
            "05:30",
            "/etc/x",
            "a/../b",
            "Europe/Paris x",
        ] {
            assert!(
                matches!(Zone::new(bad), Err(Error::BadArgument { ref arg, .. }) if arg == "zone"),
                "{bad:?}"
            );
        }
        assert!(Zone::new(&"A".repeat(65)).is_err());
        assert_eq!(
            Zone::new("+05:30").unwrap().kind(),
            ZoneKind::Offset(19_800)
        );
        assert_eq!(Zone::new("Asia/Tokyo").unwrap().to_string(), "Asia/Tokyo");
    }

    #[test]
    fn a_quota_spec_sends_its_period_as_a_word_and_its_zone_as_tz() {
        let day = Spec::quota(5, Period::Day, None).unwrap();
        assert_eq!(
            (day.algorithm(), day.args()),
            ("QUOTA", vec!["5".into(), "DAY".into()])
        );
        assert_eq!(day.params(), [5, 0]);
        assert_eq!(Spec::parse("p", "quota", &[5, 0]).unwrap(), day);
        let ny = Spec::quota(5, Period::Month, Some("America/New_York")).unwrap();
        assert_eq!(ny.args(), ["5", "MONTH", "TZ", "America/New_York"]);
        assert!(matches!(
            Spec::parse("p", "QUOTA", &[5, 4]),
            Err(Error::BadArgument { ref arg, .. }) if arg == "period"
        ));
        assert!(matches!(
            Spec::quota(0, Period::Day, None),
            Err(Error::BadArgument { ref arg, .. }) if arg == "limit"
        ));
        let w = |p| Spec::quota(1, p, None).unwrap().window_s();
        assert_eq!(
            [
                w(Period::Day),
                w(Period::Week),
                w(Period::Month),
                w(Period::Year)
            ],
            [
                Some(86_400),
                Some(604_800),
                Some(2_592_000),
                Some(31_536_000)
            ]
        );
        // The local share keeps the period and the zone.
        let share = ny.local_share("r", Share::Instances(2)).unwrap();
        assert_eq!(share.args(), ["3", "MONTH", "TZ", "America/New_York"]);
    }

    #[test]
    fn local_periods_in_utc_and_fixed_offsets() {
        // 2026-12-01T20:00:00Z, a Tuesday.
        let now = Micros::from_ms(1_796_155_200_000);
        let end = |p, z: &str| {
            local_period_end(p, Zone::new(z).unwrap(), now).map(|e| e.as_ms_floor() / 1000)
        };
        // UTC: 2026-12-02T00:00Z; +05:30 is already 01:30 on the 2nd there,
        // so the day ends 2026-12-02T18:30Z; -05:00 ends 2026-12-02T05:00Z.
        assert_eq!(end(Period::Day, "UTC"), Some(1_796_169_600));
        assert_eq!(
            end(Period::Day, "+05:30"),
            Some(1_796_169_600 + 86_400 - 19_800)
        );
        assert_eq!(end(Period::Day, "-05:00"), Some(1_796_169_600 + 18_000));
        // The ISO week ends on Monday 2026-12-07T00:00Z.
        assert_eq!(end(Period::Week, "UTC"), Some(1_796_169_600 + 5 * 86_400));
        // 2027-01-01T00:00Z for the month and the year.
        assert_eq!(end(Period::Month, "UTC"), Some(1_798_761_600));
        assert_eq!(end(Period::Year, "UTC"), Some(1_798_761_600));
        assert_eq!(end(Period::Day, "Europe/Paris"), None);
    }
}

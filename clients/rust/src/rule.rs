//! Rules: an algorithm with its parameters (checked when built, with the
//! core crate's own checks) or the name of a policy kept in the server,
//! and the key each applies to.

use redis_ratelimit_core::{
    ConcurrencyParams, FixedWindowParams, HashWindowParams, LeakyBucketParams, SlidingLogParams,
    TokenBucketParams,
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
        }
    }

    /// The parameters, in the commands' order.
    pub fn params(&self) -> Vec<u64> {
        match self {
            Spec::TokenBucket(p) => vec![p.capacity(), p.refill_count(), p.refill_ms()],
            Spec::FixedWindow(p) => vec![p.limit(), p.window_ms()],
            Spec::LeakyBucket(p) => vec![p.capacity(), p.leak_count(), p.leak_ms()],
            Spec::Sliding(p) => vec![p.limit(), p.window_ms()],
            Spec::HashWindow(p) => vec![p.limit(), p.window_ms(), p.bucket_ms()],
            Spec::Concurrency(p) => vec![p.limit(), p.lease_ms()],
        }
    }

    /// Builds a spec from an algorithm name and its parameters, as
    /// `RL.POLICY GET` answers them.
    pub fn parse(rule: &str, algorithm: &str, params: &[u64]) -> Result<Spec, Error> {
        let arity = match algorithm.to_ascii_uppercase().as_str() {
            "TOKENBUCKET" | "LEAKYBUCKET" | "HASHWINDOW" => 3,
            "FIXEDWINDOW" | "SLIDING" | "CONCURRENCY" => 2,
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
                    redis_ratelimit_core::ParamError::SpanTooLong { .. } => "span",
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
        }
    }

    /// Whether this is `CONCURRENCY`: leases held, not a rate.
    pub fn is_concurrency(&self) -> bool {
        matches!(self, Spec::Concurrency(_))
    }

    /// The `w` of `RateLimit-Policy`, in seconds, rounded up: the window for
    /// the windows, the time to refill an empty bucket (`capacity * refill_ms
    /// / refill_count`) for the buckets; `None` for concurrency, which has
    /// no window.
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
        };
        Some(u64::try_from(ceil_div(ms, 1000)).unwrap_or(u64::MAX))
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
}

impl Rule {
    fn inline(algorithm: &str, params: &[u64]) -> Rule {
        let name = algorithm.to_ascii_lowercase();
        Rule {
            kind: Spec::parse(&name, algorithm, params).map(RuleKind::Inline),
            key: KeyShape::PerIdentity(format!("rl:{name}:")),
            name,
            global: false,
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

    /// The rule's name.
    pub fn rule_name(&self) -> &str {
        &self.name
    }

    /// The checked rule: the first bad parameter, named.
    pub fn check(&self) -> Result<&RuleKind, Error> {
        let kind = self.kind.as_ref().map_err(Clone::clone)?;
        if self.global && matches!(kind, RuleKind::Policy(_)) {
            return Err(Error::bad(
                &self.name,
                "global",
                "a policy rule cannot be global: its parameters live in the server",
            ));
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

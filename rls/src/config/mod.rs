//! envoyproxy/ratelimit's YAML configuration, unchanged, plus extensions
//! inside `rate_limit` (`algorithm`, `unit_multiplier`, `burst`, `buckets`,
//! and a list of limits).
//!
//! Loading follows the reference's `config_impl.go`: the same keys, the same
//! checks and messages, every error given as `path:line: message`. Matching
//! ([`Config::get_limit`]) follows its `GetLimit`: at each level the
//! request's `key_value` first, then the wildcard values in declaration
//! order, then the key alone; a limit applies only when the request's last
//! entry lands on it; the stats key is computed as the reference computes
//! it (detailed_metric, value_to_metric, share_threshold).

mod load;
pub mod runtime;
#[cfg(test)]
mod tests;
mod yaml;

use std::collections::HashMap;
use std::fmt;
use std::path::PathBuf;
use std::sync::Arc;

/// The unit of a limit's period, as the proto enum
/// `RateLimitResponse.RateLimit.Unit` (month = 30 days, year = 365 days, as
/// the reference's `UnitToDivider`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Unit {
    Second,
    Minute,
    Hour,
    Day,
    Week,
    Month,
    Year,
}

impl Unit {
    /// The unit's length in seconds.
    pub fn seconds(self) -> u64 {
        match self {
            Unit::Second => 1,
            Unit::Minute => 60,
            Unit::Hour => 3_600,
            Unit::Day => 86_400,
            Unit::Week => 7 * 86_400,
            Unit::Month => 30 * 86_400,
            Unit::Year => 365 * 86_400,
        }
    }

    /// The unit of a proto enum value; `None` for UNKNOWN (0) and unknown
    /// values.
    pub fn from_proto(value: i32) -> Option<Unit> {
        Some(match value {
            1 => Unit::Second,
            2 => Unit::Minute,
            3 => Unit::Hour,
            4 => Unit::Day,
            5 => Unit::Month,
            6 => Unit::Year,
            7 => Unit::Week,
            _ => return None,
        })
    }

    /// The proto enum value (WEEK was added last, so it is 7).
    pub fn to_proto(self) -> i32 {
        match self {
            Unit::Second => 1,
            Unit::Minute => 2,
            Unit::Hour => 3,
            Unit::Day => 4,
            Unit::Month => 5,
            Unit::Year => 6,
            Unit::Week => 7,
        }
    }

    /// The proto enum's name, upper case (`SECOND`, ...), as the reference's
    /// /rlconfig prints it.
    pub fn name(self) -> &'static str {
        match self {
            Unit::Second => "SECOND",
            Unit::Minute => "MINUTE",
            Unit::Hour => "HOUR",
            Unit::Day => "DAY",
            Unit::Week => "WEEK",
            Unit::Month => "MONTH",
            Unit::Year => "YEAR",
        }
    }

    /// A unit written in a configuration file, any case (the reference
    /// upper-cases it and looks it up in the proto enum).
    pub fn parse(text: &str) -> Option<Unit> {
        [
            Unit::Second,
            Unit::Minute,
            Unit::Hour,
            Unit::Day,
            Unit::Week,
            Unit::Month,
            Unit::Year,
        ]
        .into_iter()
        .find(|u| u.name().eq_ignore_ascii_case(text))
    }
}

/// How a limit decides.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Algorithm {
    /// The reference's windows: a counter per period, aligned to multiples
    /// of the period since the Unix epoch.
    FixedWindow,
    /// An exact sliding log (RL.SLIDING).
    SlidingWindow,
    /// A token bucket (RL.TOKENBUCKET) holding `burst` tokens, refilled by
    /// requests_per_unit per period.
    TokenBucket { burst: u64 },
    /// An approximate sliding window of `buckets` sub-buckets per period
    /// (RL.HASHWINDOW).
    HashWindow { buckets: u64 },
}

impl Algorithm {
    /// The name written in configuration files.
    pub fn name(&self) -> &'static str {
        match self {
            Algorithm::FixedWindow => "fixed_window",
            Algorithm::SlidingWindow => "sliding_window",
            Algorithm::TokenBucket { .. } => "token_bucket",
            Algorithm::HashWindow { .. } => "hash_window",
        }
    }
}

/// One limit of a descriptor.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Limit {
    pub unit: Unit,
    /// 0 denies every request (the reference's way to block a value).
    pub requests_per_unit: u32,
    /// The period is this many units (at least 1).
    pub unit_multiplier: u32,
    pub algorithm: Algorithm,
}

impl Limit {
    /// The period in milliseconds: unit_multiplier units.
    pub fn period_ms(&self) -> u64 {
        // Loading refuses periods past i64::MAX ms; saturate for limits
        // built by hand.
        (self.unit.seconds() * 1000).saturating_mul(u64::from(self.unit_multiplier))
    }
}

/// What [`Config::get_limit`] finds for one descriptor.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Matched {
    /// The reference's stats key (its `FullKey`), e.g. `domain.key_value`.
    pub stats_key: String,
    /// The limits to enforce; empty when unlimited.
    pub limits: Arc<[Limit]>,
    pub unlimited: bool,
    pub shadow_mode: bool,
    pub quota_mode: bool,
    /// The limit's `name` (for `replaces` and the reply's current_limit).
    pub name: Option<String>,
    /// The names of the limits this one replaces.
    pub replaces: Vec<String>,
    pub detailed_metric: bool,
    /// With share_threshold: per request entry, the value to put in the
    /// cache key instead of the request's (the wildcard value, `*`
    /// included), `None` for entries that keep their own.
    pub share_values: Option<Vec<Option<String>>>,
}

/// A refused configuration: the file, the 1-based line of the offending node
/// when there is one, and what is wrong.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConfigError {
    pub path: PathBuf,
    pub line: Option<usize>,
    pub message: String,
}

impl ConfigError {
    pub(crate) fn at(path: &std::path::Path, line: usize, message: impl Into<String>) -> Self {
        ConfigError {
            path: path.to_path_buf(),
            line: Some(line),
            message: message.into(),
        }
    }
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.line {
            Some(line) => write!(f, "{}:{}: {}", self.path.display(), line, self.message),
            None => write!(f, "{}: {}", self.path.display(), self.message),
        }
    }
}

impl std::error::Error for ConfigError {}

/// A descriptor's rate limit as loaded.
#[derive(Debug)]
struct Rule {
    /// The config path: `domain.key_value.key`.
    full_key: String,
    limits: Arc<[Limit]>,
    unlimited: bool,
    /// An unlimited rule's requests_per_unit as written: the reference
    /// keeps it and prints it in /rlconfig.
    written_requests_per_unit: u32,
    shadow_mode: bool,
    quota_mode: bool,
    name: Option<String>,
    replaces: Vec<String>,
    detailed_metric: bool,
}

/// One level of descriptors (a domain's top level, or a descriptor's
/// children).
#[derive(Debug, Default)]
struct Level {
    /// By composite key: `key_value`, or `key` when the value is empty.
    children: HashMap<String, Descriptor>,
    /// Composite keys in declaration order (for dump).
    order: Vec<String>,
    /// Composite keys ending in `*`, in declaration order: tried in this
    /// order after the exact `key_value`.
    wildcards: Vec<String>,
}

#[derive(Debug)]
struct Descriptor {
    rule: Option<Rule>,
    value_to_metric: bool,
    /// The composite key (`key_value*`) when share_threshold is set.
    share_pattern: Option<String>,
    level: Level,
}

/// A loaded configuration: immutable, shared between requests.
#[derive(Debug, Default)]
pub struct Config {
    domains: HashMap<String, Level>,
}

impl Config {
    /// Loads files (path, contents), in the given order, into one
    /// configuration. A domain may appear in several files only with
    /// `merge_domains` (MERGE_DOMAIN_CONFIG); even then a descriptor may be
    /// declared once.
    pub fn load(files: &[(PathBuf, String)], merge_domains: bool) -> Result<Config, ConfigError> {
        let mut config = Config::default();
        for (path, text) in files {
            load::load_file(&mut config, path, text, merge_domains)?;
        }
        Ok(config)
    }

    /// Whether `domain` has a configuration. The reference answers an
    /// unknown domain's descriptors with no limit, even those carrying a
    /// `limit` override.
    pub fn has_domain(&self, domain: &str) -> bool {
        self.domains.contains_key(domain)
    }

    /// The limit for one request descriptor (`entries` as (key, value)), or
    /// `None` when nothing applies.
    pub fn get_limit(&self, domain: &str, entries: &[(&str, &str)]) -> Option<Matched> {
        let mut level = self.domains.get(domain)?;
        let mut found: Option<&Rule> = None;
        // The three candidate stats keys, built along the way as the
        // reference builds them.
        let mut detailed_key = String::from(domain);
        let mut value_key = String::from(domain);
        let mut share: Vec<Option<String>> = vec![None; entries.len()];
        for (i, &(key, value)) in entries.iter().enumerate() {
            let composite = format!("{key}_{value}");
            detailed_key.push('.');
            detailed_key.push_str(&composite);

            let mut next = level.children.get(&composite);
            let mut wildcard: Option<&str> = None;
            if next.is_none() {
                for w in &level.wildcards {
                    if composite.starts_with(&w[..w.len() - 1]) {
                        next = level.children.get(w);
                        wildcard = Some(w);
                        break;
                    }
                }
            }
            let by_value = next.is_some();
            if next.is_none() {
                next = level.children.get(key);
            }

            let key_prefix = format!("{key}_");
            if let (Some(_), Some(d)) = (wildcard, next) {
                if let Some(pattern) = &d.share_pattern {
                    share[i] = Some(strip(pattern, &key_prefix).to_string());
                }
            }

            value_key.push('.');
            value_key.push_str(key);
            if let Some(d) = next {
                let shown: &str = match (wildcard, &share[i]) {
                    (Some(_), Some(pattern)) => pattern,
                    (Some(_), None) if d.value_to_metric => value,
                    (Some(w), None) => strip(w, &key_prefix),
                    (None, _) if by_value => value,
                    (None, _) if d.value_to_metric => value,
                    (None, _) => "",
                };
                if !shown.is_empty() {
                    value_key.push('_');
                    value_key.push_str(shown);
                }
            }

            let Some(d) = next else { break };
            if i == entries.len() - 1 {
                found = d.rule.as_ref();
            }
            if d.level.children.is_empty() {
                break;
            }
            level = &d.level;
        }

        let rule = found?;
        let any_share = share.iter().any(Option::is_some);
        let stats_key = if rule.detailed_metric {
            if any_share {
                let mut k = String::from(domain);
                for (i, &(key, value)) in entries.iter().enumerate() {
                    k.push('.');
                    k.push_str(key);
                    match &share[i] {
                        Some(pattern) => {
                            k.push('_');
                            k.push_str(pattern);
                        }
                        None if !value.is_empty() => {
                            k.push('_');
                            k.push_str(value);
                        }
                        None => {}
                    }
                }
                k
            } else {
                detailed_key
            }
        } else {
            value_key
        };
        Some(Matched {
            stats_key,
            limits: rule.limits.clone(),
            unlimited: rule.unlimited,
            shadow_mode: rule.shadow_mode,
            quota_mode: rule.quota_mode,
            name: rule.name.clone(),
            replaces: rule.replaces.clone(),
            detailed_metric: rule.detailed_metric,
            share_values: any_share.then_some(share),
        })
    }

    /// The limit a request descriptor brings itself (its `limit` field): a
    /// fixed window, never shadow, with the reference's stats key
    /// (`domain.key_value.key_value`, `_value` left out when empty).
    pub fn override_limit(
        domain: &str,
        entries: &[(&str, &str)],
        unit: Unit,
        requests_per_unit: u32,
    ) -> Matched {
        let mut stats_key = String::from(domain);
        stats_key.push('.');
        for (i, &(key, value)) in entries.iter().enumerate() {
            if i > 0 {
                stats_key.push('.');
            }
            stats_key.push_str(key);
            if !value.is_empty() {
                stats_key.push('_');
                stats_key.push_str(value);
            }
        }
        let limit = Limit {
            unit,
            requests_per_unit,
            unit_multiplier: 1,
            algorithm: Algorithm::FixedWindow,
        };
        Matched {
            stats_key,
            limits: Arc::from([limit]),
            unlimited: false,
            shadow_mode: false,
            quota_mode: false,
            name: None,
            replaces: Vec::new(),
            detailed_metric: false,
            share_values: None,
        }
    }

    /// Whether no domain is configured.
    pub fn is_empty(&self) -> bool {
        self.domains.is_empty()
    }

    /// The number of domains.
    pub fn domains(&self) -> usize {
        self.domains.len()
    }

    /// One line per limit, as the reference's /rlconfig:
    /// `key: unit=MINUTE requests_per_unit=10, shadow_mode: false, quota_mode: false`
    /// (unlimited: `unit=UNKNOWN` and requests_per_unit as written, 0 if
    /// none). Our extensions, when not the default, follow as
    /// `, unit_multiplier: 15` and `, algorithm: token_bucket, burst: 50`.
    /// Domains sorted by name, descriptors in declaration order (the
    /// reference's order is Go's map order: random).
    pub fn dump(&self) -> String {
        let mut names: Vec<&String> = self.domains.keys().collect();
        names.sort();
        let mut out = String::new();
        for name in names {
            dump_level(&self.domains[name], &mut out);
        }
        out
    }
}

fn strip<'a>(s: &'a str, prefix: &str) -> &'a str {
    s.strip_prefix(prefix).unwrap_or(s)
}

fn dump_level(level: &Level, out: &mut String) {
    use std::fmt::Write;
    for key in &level.order {
        let d = &level.children[key];
        if let Some(rule) = &d.rule {
            if rule.unlimited {
                let _ = writeln!(
                    out,
                    "{}: unit=UNKNOWN requests_per_unit={}, shadow_mode: {}, quota_mode: {}",
                    rule.full_key,
                    rule.written_requests_per_unit,
                    rule.shadow_mode,
                    rule.quota_mode
                );
            }
            for limit in rule.limits.iter() {
                let _ = write!(
                    out,
                    "{}: unit={} requests_per_unit={}, shadow_mode: {}, quota_mode: {}",
                    rule.full_key,
                    limit.unit.name(),
                    limit.requests_per_unit,
                    rule.shadow_mode,
                    rule.quota_mode
                );
                if limit.unit_multiplier != 1 {
                    let _ = write!(out, ", unit_multiplier: {}", limit.unit_multiplier);
                }
                match limit.algorithm {
                    Algorithm::FixedWindow => {}
                    Algorithm::SlidingWindow => out.push_str(", algorithm: sliding_window"),
                    Algorithm::TokenBucket { burst } => {
                        let _ = write!(out, ", algorithm: token_bucket, burst: {burst}");
                    }
                    Algorithm::HashWindow { buckets } => {
                        let _ = write!(out, ", algorithm: hash_window, buckets: {buckets}");
                    }
                }
                out.push('\n');
            }
        }
        dump_level(&d.level, out);
    }
}

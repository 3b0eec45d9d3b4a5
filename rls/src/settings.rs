//! The environment: envoyproxy/ratelimit's variables (names and defaults as
//! its src/settings/settings.go gives them, unless said) and ours
//! (`RLS_*`). A bad value of a variable this service honours is a start-up
//! error naming the variable; the reference's variables this service does
//! not use are accepted and ignored (README.md lists them with why).
use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

/// Everything the service reads from its environment.
#[derive(Clone, Debug, PartialEq)]
pub struct Settings {
    /// `HOST`, `PORT`: the HTTP port (/healthcheck, /json, /metrics, /rlconfig).
    pub host: String,
    pub port: u16,
    /// `GRPC_HOST`, `GRPC_PORT`: the RLS gRPC port.
    pub grpc_host: String,
    pub grpc_port: u16,
    /// `LOG_LEVEL`: logrus's level names (trace, debug, info, warn, warning,
    /// error, fatal, panic), any case; kept lower case.
    pub log_level: String,
    /// `LOG_FORMAT`: `text` or `json`, kept lower case.
    pub log_format: String,
    /// `RUNTIME_ROOT`, `RUNTIME_SUBDIRECTORY`, `RUNTIME_APPDIRECTORY`,
    /// `RUNTIME_IGNOREDOTFILES`: where the YAML files are.
    pub runtime_root: PathBuf,
    pub runtime_subdirectory: String,
    pub runtime_appdirectory: String,
    pub runtime_ignore_dot_files: bool,
    /// `MERGE_DOMAIN_CONFIG`: files of one domain merge instead of clashing.
    pub merge_domain_config: bool,
    /// `REDIS_*`: where the module is.
    pub redis: RedisSettings,
    /// `SHADOW_MODE`: every OVER_LIMIT answered OK (counted).
    pub shadow_mode: bool,
    /// `QUOTA_MODE`: every descriptor in quota mode.
    pub quota_mode: bool,
    /// `LOCAL_CACHE_SIZE_IN_BYTES`: the deny cache's budget (0: off).
    pub local_cache_size_in_bytes: u64,
    /// `NEAR_LIMIT_RATIO`: 0 to 1.
    pub near_limit_ratio: f32,
    /// `CACHE_KEY_PREFIX`: put before every Redis key.
    pub cache_key_prefix: String,
    /// `LIMIT_RESPONSE_HEADERS_ENABLED` and the three header names.
    pub response_headers: Option<HeaderNames>,
    /// `HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED`.
    pub healthy_with_at_least_one_config_loaded: bool,
    /// `USE_PROMETHEUS`, `PROMETHEUS_ADDR`, `PROMETHEUS_PATH`: metrics also
    /// served on a listener of their own.
    pub prometheus: Option<PrometheusSettings>,
    /// `RLS_CONFIG_POLL_MS`: how often the configuration folder is checked.
    pub config_poll: Duration,
    /// `RLS_BREAKER_FAILURES`, `RLS_BREAKER_OPEN_MS`.
    pub breaker_failures: u32,
    pub breaker_open: Duration,
    /// `RLS_HASH_TAG`.
    pub hash_tag: HashTag,
}

/// `LIMIT_LIMIT_HEADER`, `LIMIT_REMAINING_HEADER`, `LIMIT_RESET_HEADER`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HeaderNames {
    pub limit: String,
    pub remaining: String,
    pub reset: String,
}

/// Where a second metrics listener serves.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PrometheusSettings {
    /// `PROMETHEUS_ADDR` as given (`:9090` listens on every address).
    pub addr: String,
    /// `PROMETHEUS_PATH`, starting with `/`.
    pub path: String,
}

/// `REDIS_TYPE`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RedisType {
    Single,
    Sentinel,
    Cluster,
}

/// `REDIS_SOCKET_TYPE`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SocketType {
    Tcp,
    Unix,
}

/// `RLS_HASH_TAG`: what the keys' hash tag covers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HashTag {
    /// No hash tag: the reference's keys; in a cluster, each key's slot.
    None,
    /// `{domain}`: a domain's keys share a slot, so a cluster decides a
    /// request in one call (at the cost of one node per domain).
    Domain,
}

/// The Redis side, parsed into what the kit connects with.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RedisSettings {
    pub kind: RedisType,
    pub socket_type: SocketType,
    /// `REDIS_URL` as given (logged with its credentials masked).
    pub url: String,
    /// What to connect to, credentials included.
    pub target: RedisTarget,
    /// `REDIS_TIMEOUT`: the deadline of each call.
    pub timeout: Duration,
}

/// The connection the kit opens.
#[derive(Clone, PartialEq, Eq)]
pub enum RedisTarget {
    /// One server: a `redis://` or `unix://` URL.
    Single(String),
    /// Sentinels (`host:port`) and the master's name.
    Sentinel {
        master: String,
        sentinels: Vec<String>,
    },
    /// Cluster nodes, as `redis://` URLs.
    Cluster(Vec<String>),
}

impl fmt::Debug for RedisTarget {
    // Credentials never reach a log line.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RedisTarget::Single(u) => write!(f, "Single({})", mask(u)),
            RedisTarget::Sentinel { master, sentinels } => {
                write!(f, "Sentinel({master}, {sentinels:?})")
            }
            RedisTarget::Cluster(nodes) => {
                let masked: Vec<String> = nodes.iter().map(|u| mask(u)).collect();
                write!(f, "Cluster({masked:?})")
            }
        }
    }
}

/// A variable with a value this service refuses.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SettingsError {
    pub variable: &'static str,
    pub message: String,
}

impl fmt::Display for SettingsError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.variable, self.message)
    }
}

impl std::error::Error for SettingsError {}

fn bad(variable: &'static str, message: impl Into<String>) -> SettingsError {
    SettingsError {
        variable,
        message: message.into(),
    }
}

/// The variables of the reference that this service accepts and ignores:
/// listed for README.md and for the start-up log (one line naming those set).
/// `CONFIG_TYPE`, the xDS client's and the gRPC TLS variables are read by
/// [`crate::xds`] and [`crate::tls`].
pub const IGNORED: &[&str] = &[
    "DEBUG_HOST",
    "DEBUG_PORT",
    "GRPC_UDS",
    "GRPC_MAX_CONNECTION_AGE",
    "GRPC_MAX_CONNECTION_AGE_GRACE",
    "USE_DOG_STATSD",
    "USE_DOG_STATSD_MOGRIFIERS",
    "USE_STATSD",
    "STATSD_HOST",
    "STATSD_PORT",
    "EXTRA_TAGS",
    "STATS_FLUSH_INTERVAL",
    "DISABLE_STATS",
    "PROMETHEUS_MAPPER_YAML",
    "RUNTIME_WATCH_ROOT",
    "EXPIRATION_JITTER_MAX_SECONDS",
    "BACKEND_TYPE",
    "STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT",
    "REDIS_POOL_SIZE",
    "REDIS_TLS",
    "REDIS_TLS_CLIENT_CERT",
    "REDIS_TLS_CLIENT_KEY",
    "REDIS_TLS_CACERT",
    "REDIS_TLS_SKIP_HOSTNAME_VERIFICATION",
    "REDIS_PIPELINE_WINDOW",
    "REDIS_PIPELINE_LIMIT",
    "REDIS_PERSECOND",
    "REDIS_PERSECOND_SOCKET_TYPE",
    "REDIS_PERSECOND_TYPE",
    "REDIS_PERSECOND_URL",
    "REDIS_PERSECOND_POOL_SIZE",
    "REDIS_PERSECOND_AUTH",
    "REDIS_PERSECOND_TLS",
    "REDIS_PERSECOND_SENTINEL_AUTH",
    "REDIS_PERSECOND_PIPELINE_WINDOW",
    "REDIS_PERSECOND_PIPELINE_LIMIT",
    "REDIS_PERSECOND_TIMEOUT",
    "REDIS_PERSECOND_POOL_ON_EMPTY_BEHAVIOR",
    "REDIS_HEALTH_CHECK_ACTIVE_CONNECTION",
    "REDIS_POOL_ON_EMPTY_BEHAVIOR",
    "MEMCACHE_HOST_PORT",
    "MEMCACHE_MAX_IDLE_CONNS",
    "MEMCACHE_SRV",
    "MEMCACHE_SRV_REFRESH",
    "MEMCACHE_TLS",
    "MEMCACHE_TLS_CLIENT_CERT",
    "MEMCACHE_TLS_CLIENT_KEY",
    "MEMCACHE_TLS_CACERT",
    "MEMCACHE_TLS_SKIP_HOSTNAME_VERIFICATION",
    "RESPONSE_DYNAMIC_METADATA",
    "TRACING_ENABLED",
    "TRACING_SERVICE_NAME",
    "TRACING_SERVICE_NAMESPACE",
    "TRACING_SERVICE_INSTANCE_ID",
    "TRACING_EXPORTER_PROTOCOL",
    "TRACING_SAMPLING_RATE",
    "OTEL_EXPORTER_OTLP_ENDPOINT",
];

impl Settings {
    /// Reads the process's environment.
    pub fn from_env() -> Result<Settings, SettingsError> {
        Settings::from_lookup(|name| std::env::var(name).ok())
    }

    /// Reads the variables through `lookup` (the environment, or a test's
    /// map). An empty value is the variable unset, as envconfig treats it.
    pub fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> Result<Settings, SettingsError> {
        let get = |name: &str| lookup(name).filter(|v| !v.is_empty());
        let string = |name: &str, default: &str| get(name).unwrap_or_else(|| default.to_string());
        let boolean = |name: &'static str| get(name).map_or(Ok(false), |v| parse_bool(name, &v));
        let port = |name: &'static str, default: u16| {
            get(name).map_or(Ok(default), |v| {
                v.trim()
                    .parse::<u16>()
                    .map_err(|_| bad(name, format!("{v:?} is not a port (0 to 65535)")))
            })
        };
        let number = |name: &'static str, default: u64, min: u64| {
            get(name).map_or(Ok(default), |v| match v.trim().parse::<u64>() {
                Ok(n) if n >= min => Ok(n),
                _ => Err(bad(name, format!("{v:?} is not a whole number >= {min}"))),
            })
        };

        let log_level = string("LOG_LEVEL", "WARN").to_ascii_lowercase();
        if !matches!(
            log_level.as_str(),
            "trace" | "debug" | "info" | "warn" | "warning" | "error" | "fatal" | "panic"
        ) {
            return Err(bad(
                "LOG_LEVEL",
                format!(
                    "{log_level:?} is not one of trace, debug, info, warn, error, fatal, panic"
                ),
            ));
        }
        let log_format = string("LOG_FORMAT", "text").to_ascii_lowercase();
        if !matches!(log_format.as_str(), "text" | "json") {
            return Err(bad(
                "LOG_FORMAT",
                format!("{log_format:?} is not text or json"),
            ));
        }

        let near_limit_ratio = match get("NEAR_LIMIT_RATIO") {
            None => 0.8,
            Some(v) => match v.trim().parse::<f32>() {
                Ok(r) if (0.0..=1.0).contains(&r) => r,
                _ => {
                    return Err(bad(
                        "NEAR_LIMIT_RATIO",
                        format!("{v:?} is not a number from 0 to 1"),
                    ))
                }
            },
        };

        let response_headers = if boolean("LIMIT_RESPONSE_HEADERS_ENABLED")? {
            let header = |name: &'static str, default: &str| {
                let v = string(name, default);
                if is_header_name(&v) {
                    Ok(v)
                } else {
                    Err(bad(name, format!("{v:?} is not an HTTP header name")))
                }
            };
            Some(HeaderNames {
                limit: header("LIMIT_LIMIT_HEADER", "RateLimit-Limit")?,
                remaining: header("LIMIT_REMAINING_HEADER", "RateLimit-Remaining")?,
                reset: header("LIMIT_RESET_HEADER", "RateLimit-Reset")?,
            })
        } else {
            None
        };

        let prometheus = if boolean("USE_PROMETHEUS")? {
            let path = string("PROMETHEUS_PATH", "/metrics");
            if !path.starts_with('/') {
                return Err(bad(
                    "PROMETHEUS_PATH",
                    format!("{path:?} does not start with /"),
                ));
            }
            Some(PrometheusSettings {
                addr: string("PROMETHEUS_ADDR", ":9090"),
                path,
            })
        } else {
            None
        };

        let hash_tag = match string("RLS_HASH_TAG", "none").to_ascii_lowercase().as_str() {
            "none" => HashTag::None,
            "domain" => HashTag::Domain,
            other => {
                return Err(bad(
                    "RLS_HASH_TAG",
                    format!("{other:?} is not none or domain"),
                ))
            }
        };

        Ok(Settings {
            host: string("HOST", "0.0.0.0"),
            port: port("PORT", 8080)?,
            grpc_host: string("GRPC_HOST", "0.0.0.0"),
            grpc_port: port("GRPC_PORT", 8081)?,
            log_level,
            log_format,
            runtime_root: PathBuf::from(string("RUNTIME_ROOT", "/srv/runtime_data/current")),
            runtime_subdirectory: string("RUNTIME_SUBDIRECTORY", ""),
            runtime_appdirectory: string("RUNTIME_APPDIRECTORY", "config"),
            runtime_ignore_dot_files: boolean("RUNTIME_IGNOREDOTFILES")?,
            merge_domain_config: boolean("MERGE_DOMAIN_CONFIG")?,
            redis: redis_settings(&get)?,
            shadow_mode: boolean("SHADOW_MODE")?,
            quota_mode: boolean("QUOTA_MODE")?,
            local_cache_size_in_bytes: number("LOCAL_CACHE_SIZE_IN_BYTES", 0, 0)?,
            near_limit_ratio,
            cache_key_prefix: string("CACHE_KEY_PREFIX", ""),
            response_headers,
            healthy_with_at_least_one_config_loaded: boolean(
                "HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED",
            )?,
            prometheus,
            config_poll: Duration::from_millis(number("RLS_CONFIG_POLL_MS", 1000, 1)?),
            breaker_failures: u32::try_from(number("RLS_BREAKER_FAILURES", 5, 1)?)
                .map_err(|_| bad("RLS_BREAKER_FAILURES", "at most 4294967295"))?,
            breaker_open: Duration::from_millis(number("RLS_BREAKER_OPEN_MS", 1000, 1)?),
            hash_tag,
        })
    }
}

/// The Redis variables: `REDIS_TYPE`, `REDIS_SOCKET_TYPE`, `REDIS_URL`,
/// `REDIS_AUTH`, `REDIS_SENTINEL_AUTH`, `REDIS_TIMEOUT`.
fn redis_settings(get: &dyn Fn(&str) -> Option<String>) -> Result<RedisSettings, SettingsError> {
    let kind = match get("REDIS_TYPE")
        .unwrap_or_else(|| "SINGLE".into())
        .to_ascii_lowercase()
        .as_str()
    {
        "single" => RedisType::Single,
        "sentinel" => RedisType::Sentinel,
        "cluster" => RedisType::Cluster,
        other => {
            return Err(bad(
                "REDIS_TYPE",
                format!("{other:?} is not single, sentinel or cluster"),
            ))
        }
    };
    let socket_type = match get("REDIS_SOCKET_TYPE")
        .unwrap_or_else(|| "unix".into())
        .to_ascii_lowercase()
        .as_str()
    {
        "tcp" => SocketType::Tcp,
        "unix" => SocketType::Unix,
        other => {
            return Err(bad(
                "REDIS_SOCKET_TYPE",
                format!("{other:?} is not tcp or unix"),
            ))
        }
    };
    let url = get("REDIS_URL").unwrap_or_else(|| "/var/run/nutcracker/ratelimit.sock".into());
    let auth = get("REDIS_AUTH").map(|a| parse_auth(&a));
    let timeout = match get("REDIS_TIMEOUT") {
        None => Duration::from_millis(100),
        Some(v) => match parse_go_duration(&v) {
            Ok(d) if !d.is_zero() => d,
            Ok(_) => return Err(bad("REDIS_TIMEOUT", "must be more than 0")),
            Err(e) => return Err(bad("REDIS_TIMEOUT", e)),
        },
    };
    let parts: Vec<&str> = url
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .collect();
    let target = match kind {
        RedisType::Single => {
            if parts.len() != 1 {
                return Err(bad(
                    "REDIS_URL",
                    "REDIS_TYPE=single takes one address (host:port, a redis:// URL, or a socket path)",
                ));
            }
            RedisTarget::Single(node_url(parts[0], socket_type, auth.as_ref())?)
        }
        RedisType::Cluster => {
            if socket_type == SocketType::Unix && parts.iter().any(|p| !p.contains("://")) {
                return Err(bad(
                    "REDIS_SOCKET_TYPE",
                    "a cluster is reached over tcp: set REDIS_SOCKET_TYPE=tcp",
                ));
            }
            if parts.is_empty() {
                return Err(bad(
                    "REDIS_URL",
                    "REDIS_TYPE=cluster takes host:port,host:port...",
                ));
            }
            RedisTarget::Cluster(
                parts
                    .iter()
                    .map(|p| node_url(p, SocketType::Tcp, auth.as_ref()))
                    .collect::<Result<_, _>>()?,
            )
        }
        RedisType::Sentinel => {
            if parts.len() < 2 {
                return Err(bad(
                    "REDIS_URL",
                    "REDIS_TYPE=sentinel takes master_name,host:port[,host:port...]",
                ));
            }
            if auth.is_some() {
                // The kit's Sentinel connection takes the master's address from
                // the Sentinels and has no credentials to give it.
                return Err(bad(
                    "REDIS_AUTH",
                    "not supported with REDIS_TYPE=sentinel (the master is reached without credentials)",
                ));
            }
            let sentinel_auth = get("REDIS_SENTINEL_AUTH").map(|a| parse_auth(&a));
            RedisTarget::Sentinel {
                master: parts[0].to_string(),
                sentinels: parts[1..]
                    .iter()
                    .map(|p| node_url(p, SocketType::Tcp, sentinel_auth.as_ref()))
                    .collect::<Result<_, _>>()?,
            }
        }
    };
    Ok(RedisSettings {
        kind,
        socket_type,
        url,
        target,
        timeout,
    })
}

/// `REDIS_AUTH`: `password`, or `user:password` (split at the first `:`).
fn parse_auth(auth: &str) -> (Option<String>, String) {
    match auth.split_once(':') {
        Some((user, pass)) => (Some(user.to_string()), pass.to_string()),
        None => (None, auth.to_string()),
    }
}

/// One node's URL for the kit, with the credentials of `REDIS_AUTH` put in.
fn node_url(
    addr: &str,
    socket_type: SocketType,
    auth: Option<&(Option<String>, String)>,
) -> Result<String, SettingsError> {
    if addr.starts_with("rediss://") || addr.starts_with("valkeys://") {
        return Err(bad(
            "REDIS_URL",
            "TLS (rediss://) is not supported: reach Redis over a trusted network or a local TLS proxy",
        ));
    }
    if let Some(rest) = addr
        .strip_prefix("redis://")
        .or_else(|| addr.strip_prefix("valkey://"))
    {
        let authority = rest.split('/').next().unwrap_or("");
        if authority.contains('@') {
            if auth.is_some() {
                return Err(bad(
                    "REDIS_AUTH",
                    "REDIS_URL has credentials already: give them in one place",
                ));
            }
            return Ok(addr.to_string());
        }
        if authority.is_empty() {
            return Err(bad("REDIS_URL", format!("{addr:?} has no host")));
        }
        return Ok(match auth {
            None => addr.to_string(),
            Some(a) => format!("redis://{}@{rest}", userinfo(a)),
        });
    }
    if addr.starts_with("unix://") || addr.starts_with("redis+unix://") {
        return Ok(match auth {
            None => addr.to_string(),
            Some(a) => with_query_auth(addr, a),
        });
    }
    if addr.contains("://") {
        return Err(bad(
            "REDIS_URL",
            format!("{addr:?}: only redis:// and unix:// URLs are known"),
        ));
    }
    match socket_type {
        SocketType::Unix => {
            if !addr.starts_with('/') {
                return Err(bad(
                    "REDIS_URL",
                    format!(
                        "{addr:?} is not an absolute socket path (REDIS_SOCKET_TYPE=unix; set tcp for host:port)"
                    ),
                ));
            }
            let url = format!("unix://{addr}");
            Ok(match auth {
                None => url,
                Some(a) => with_query_auth(&url, a),
            })
        }
        SocketType::Tcp => {
            let Some((host, port)) = addr.rsplit_once(':') else {
                return Err(bad("REDIS_URL", format!("{addr:?} is not host:port")));
            };
            if host.is_empty() || port.parse::<u16>().is_err() {
                return Err(bad("REDIS_URL", format!("{addr:?} is not host:port")));
            }
            Ok(match auth {
                None => format!("redis://{addr}/"),
                Some(a) => format!("redis://{}@{addr}/", userinfo(a)),
            })
        }
    }
}

fn userinfo((user, pass): &(Option<String>, String)) -> String {
    match user {
        Some(u) => format!("{}:{}", percent_encode(u), percent_encode(pass)),
        None => format!(":{}", percent_encode(pass)),
    }
}

fn with_query_auth(url: &str, (user, pass): &(Option<String>, String)) -> String {
    let sep = if url.contains('?') { '&' } else { '?' };
    let mut out = format!("{url}{sep}pass={}", percent_encode(pass));
    if let Some(u) = user {
        out.push_str("&user=");
        out.push_str(&percent_encode(u));
    }
    out
}

/// Every byte but the URL's unreserved ones as `%XX`: valid in a URL's
/// userinfo and in a query (where `+` would otherwise read as a space).
fn percent_encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// A URL with its userinfo (and `pass=` / `user=` query values) masked,
/// for logs.
pub fn mask(url: &str) -> String {
    let mut out = url.to_string();
    if let Some(scheme_end) = out.find("://") {
        let rest = &out[scheme_end + 3..];
        let authority_end = rest.find('/').unwrap_or(rest.len());
        if let Some(at) = rest[..authority_end].rfind('@') {
            out = format!("{}*****{}", &out[..scheme_end + 3], &rest[at..]);
        }
    }
    if let Some(q) = out.find('?') {
        let masked: Vec<String> = out[q + 1..]
            .split('&')
            .map(|kv| match kv.split_once('=') {
                Some((k, _)) if k == "pass" || k == "user" => format!("{k}=*****"),
                _ => kv.to_string(),
            })
            .collect();
        out = format!("{}?{}", &out[..q], masked.join("&"));
    }
    out
}

/// Go's strconv.ParseBool: 1, t, T, TRUE, true, True, 0, f, F, FALSE,
/// false, False.
fn parse_bool(name: &'static str, v: &str) -> Result<bool, SettingsError> {
    match v.trim() {
        "1" | "t" | "T" | "TRUE" | "true" | "True" => Ok(true),
        "0" | "f" | "F" | "FALSE" | "false" | "False" => Ok(false),
        _ => Err(bad(name, format!("{v:?} is not a boolean (true or false)"))),
    }
}

/// A token of RFC 9110 (what an HTTP header name may be).
fn is_header_name(s: &str) -> bool {
    !s.is_empty()
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b))
}

/// Go's time.ParseDuration, for the durations this service reads: a
/// sequence of decimal numbers, each with a unit (`ns`, `us`, `µs`, `ms`,
/// `s`, `m`, `h`), such as `100ms`, `1.5s`, `1m30s`; `0` alone. Negative
/// durations are refused (no deadline is negative).
pub fn parse_go_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    let body = s.strip_prefix('+').unwrap_or(s);
    if body.starts_with('-') {
        return Err("a negative duration".into());
    }
    if body == "0" {
        return Ok(Duration::ZERO);
    }
    if body.is_empty() {
        return Err("an empty duration".into());
    }
    let mut total_ns: f64 = 0.0;
    let mut rest = body;
    while !rest.is_empty() {
        let num_len = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        let (num, after) = rest.split_at(num_len);
        if num.is_empty() || num == "." || num.matches('.').count() > 1 {
            return Err(format!("{s:?} is not a duration such as 100ms, 10s or 1m"));
        }
        let unit_len = after
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(after.len());
        let (unit, next) = after.split_at(unit_len);
        let scale = match unit {
            "ns" => 1.0,
            "us" | "µs" | "μs" => 1e3,
            "ms" => 1e6,
            "s" => 1e9,
            "m" => 60e9,
            "h" => 3600e9,
            "" => {
                return Err(format!(
                    "{s:?}: a number without a unit (ns, us, ms, s, m, h)"
                ))
            }
            other => {
                return Err(format!(
                    "{s:?}: unknown unit {other:?} (ns, us, ms, s, m, h)"
                ))
            }
        };
        let value: f64 = num
            .parse()
            .map_err(|_| format!("{s:?} is not a duration such as 100ms, 10s or 1m"))?;
        total_ns += value * scale;
        rest = next;
    }
    if !total_ns.is_finite() || total_ns > u64::MAX as f64 {
        return Err(format!("{s:?} is too long"));
    }
    Ok(Duration::from_nanos(total_ns.round() as u64))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn with(vars: &[(&str, &str)]) -> Result<Settings, SettingsError> {
        let map: HashMap<String, String> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        Settings::from_lookup(move |k| map.get(k).cloned())
    }

    fn err_of(vars: &[(&str, &str)]) -> SettingsError {
        with(vars).expect_err("refused")
    }

    #[test]
    fn defaults_are_the_references_and_ours() {
        let s = with(&[]).unwrap();
        assert_eq!((s.host.as_str(), s.port), ("0.0.0.0", 8080));
        assert_eq!((s.grpc_host.as_str(), s.grpc_port), ("0.0.0.0", 8081));
        assert_eq!(s.log_level, "warn");
        assert_eq!(s.log_format, "text");
        assert_eq!(s.runtime_root, PathBuf::from("/srv/runtime_data/current"));
        assert_eq!(s.runtime_subdirectory, "");
        assert_eq!(s.runtime_appdirectory, "config");
        assert!(!s.runtime_ignore_dot_files && !s.merge_domain_config);
        assert_eq!(s.redis.kind, RedisType::Single);
        assert_eq!(s.redis.socket_type, SocketType::Unix);
        assert_eq!(
            s.redis.target,
            RedisTarget::Single("unix:///var/run/nutcracker/ratelimit.sock".into())
        );
        assert_eq!(s.redis.timeout, Duration::from_millis(100));
        assert!(!s.shadow_mode && !s.quota_mode);
        assert_eq!(s.local_cache_size_in_bytes, 0);
        assert_eq!(s.near_limit_ratio, 0.8);
        assert_eq!(s.cache_key_prefix, "");
        assert_eq!(s.response_headers, None);
        assert!(!s.healthy_with_at_least_one_config_loaded);
        assert_eq!(s.prometheus, None);
        assert_eq!(s.config_poll, Duration::from_millis(1000));
        assert_eq!(s.breaker_failures, 5);
        assert_eq!(s.breaker_open, Duration::from_millis(1000));
        assert_eq!(s.hash_tag, HashTag::None);
    }

    #[test]
    fn an_empty_value_is_the_variable_unset() {
        assert_eq!(with(&[("PORT", "")]).unwrap().port, 8080);
    }

    #[test]
    fn ports_are_checked() {
        assert_eq!(with(&[("GRPC_PORT", "9000")]).unwrap().grpc_port, 9000);
        assert_eq!(err_of(&[("PORT", "http")]).variable, "PORT");
        assert_eq!(err_of(&[("GRPC_PORT", "70000")]).variable, "GRPC_PORT");
    }

    #[test]
    fn log_level_and_format_are_checked() {
        assert_eq!(with(&[("LOG_LEVEL", "Debug")]).unwrap().log_level, "debug");
        assert_eq!(err_of(&[("LOG_LEVEL", "loud")]).variable, "LOG_LEVEL");
        assert_eq!(with(&[("LOG_FORMAT", "JSON")]).unwrap().log_format, "json");
        assert_eq!(err_of(&[("LOG_FORMAT", "xml")]).variable, "LOG_FORMAT");
    }

    #[test]
    fn booleans_are_gos() {
        for t in ["1", "t", "T", "TRUE", "true", "True"] {
            assert!(with(&[("SHADOW_MODE", t)]).unwrap().shadow_mode, "{t}");
        }
        for f in ["0", "f", "F", "FALSE", "false", "False"] {
            assert!(!with(&[("QUOTA_MODE", f)]).unwrap().quota_mode, "{f}");
        }
        let e = err_of(&[("MERGE_DOMAIN_CONFIG", "yes")]);
        assert_eq!(e.variable, "MERGE_DOMAIN_CONFIG");
        assert!(e.to_string().contains("yes"), "{e}");
    }

    #[test]
    fn near_limit_ratio_is_from_0_to_1() {
        assert_eq!(
            with(&[("NEAR_LIMIT_RATIO", "0.5")])
                .unwrap()
                .near_limit_ratio,
            0.5
        );
        assert_eq!(
            err_of(&[("NEAR_LIMIT_RATIO", "1.5")]).variable,
            "NEAR_LIMIT_RATIO"
        );
        assert_eq!(
            err_of(&[("NEAR_LIMIT_RATIO", "most")]).variable,
            "NEAR_LIMIT_RATIO"
        );
    }

    #[test]
    fn local_cache_size_is_a_whole_number() {
        assert_eq!(
            with(&[("LOCAL_CACHE_SIZE_IN_BYTES", "1048576")])
                .unwrap()
                .local_cache_size_in_bytes,
            1 << 20
        );
        assert_eq!(
            err_of(&[("LOCAL_CACHE_SIZE_IN_BYTES", "-1")]).variable,
            "LOCAL_CACHE_SIZE_IN_BYTES"
        );
    }

    #[test]
    fn response_headers_when_enabled() {
        let s = with(&[
            ("LIMIT_RESPONSE_HEADERS_ENABLED", "true"),
            ("LIMIT_REMAINING_HEADER", "X-Left"),
        ])
        .unwrap();
        assert_eq!(
            s.response_headers,
            Some(HeaderNames {
                limit: "RateLimit-Limit".into(),
                remaining: "X-Left".into(),
                reset: "RateLimit-Reset".into(),
            })
        );
        assert_eq!(
            err_of(&[
                ("LIMIT_RESPONSE_HEADERS_ENABLED", "true"),
                ("LIMIT_RESET_HEADER", "bad header"),
            ])
            .variable,
            "LIMIT_RESET_HEADER"
        );
    }

    #[test]
    fn prometheus_when_enabled() {
        let s = with(&[("USE_PROMETHEUS", "true")]).unwrap();
        assert_eq!(
            s.prometheus,
            Some(PrometheusSettings {
                addr: ":9090".into(),
                path: "/metrics".into()
            })
        );
        assert_eq!(
            err_of(&[("USE_PROMETHEUS", "true"), ("PROMETHEUS_PATH", "metrics")]).variable,
            "PROMETHEUS_PATH"
        );
    }

    #[test]
    fn our_variables_are_checked() {
        let s = with(&[
            ("RLS_CONFIG_POLL_MS", "250"),
            ("RLS_BREAKER_FAILURES", "3"),
            ("RLS_BREAKER_OPEN_MS", "500"),
            ("RLS_HASH_TAG", "Domain"),
        ])
        .unwrap();
        assert_eq!(s.config_poll, Duration::from_millis(250));
        assert_eq!(s.breaker_failures, 3);
        assert_eq!(s.breaker_open, Duration::from_millis(500));
        assert_eq!(s.hash_tag, HashTag::Domain);
        for (var, value) in [
            ("RLS_CONFIG_POLL_MS", "0"),
            ("RLS_BREAKER_FAILURES", "0"),
            ("RLS_BREAKER_FAILURES", "99999999999"),
            ("RLS_BREAKER_OPEN_MS", "soon"),
            ("RLS_HASH_TAG", "key"),
        ] {
            assert_eq!(err_of(&[(var, value)]).variable, var, "{var}={value}");
        }
    }

    #[test]
    fn redis_type_and_socket_type_any_case() {
        let s = with(&[
            ("REDIS_TYPE", "Cluster"),
            ("REDIS_SOCKET_TYPE", "TCP"),
            ("REDIS_URL", "10.0.0.1:7000, 10.0.0.2:7000"),
        ])
        .unwrap();
        assert_eq!(s.redis.kind, RedisType::Cluster);
        assert_eq!(
            s.redis.target,
            RedisTarget::Cluster(vec![
                "redis://10.0.0.1:7000/".into(),
                "redis://10.0.0.2:7000/".into()
            ])
        );
        assert_eq!(err_of(&[("REDIS_TYPE", "ring")]).variable, "REDIS_TYPE");
        assert_eq!(
            err_of(&[("REDIS_SOCKET_TYPE", "udp")]).variable,
            "REDIS_SOCKET_TYPE"
        );
    }

    #[test]
    fn single_urls_and_auth() {
        let tcp = |url: &str, auth: &str| {
            let mut vars = vec![("REDIS_SOCKET_TYPE", "tcp"), ("REDIS_URL", url)];
            if !auth.is_empty() {
                vars.push(("REDIS_AUTH", auth));
            }
            with(&vars).map(|s| s.redis.target)
        };
        assert_eq!(
            tcp("localhost:6380", ""),
            Ok(RedisTarget::Single("redis://localhost:6380/".into()))
        );
        assert_eq!(
            tcp("localhost:6380", "s3cret"),
            Ok(RedisTarget::Single(
                "redis://:s3cret@localhost:6380/".into()
            ))
        );
        assert_eq!(
            tcp("localhost:6380", "app:p@ss:w"),
            Ok(RedisTarget::Single(
                "redis://app:p%40ss%3Aw@localhost:6380/".into()
            ))
        );
        assert_eq!(
            tcp("redis://h:1/2", "pw"),
            Ok(RedisTarget::Single("redis://:pw@h:1/2".into()))
        );
        assert_eq!(
            tcp("redis://u:p@h:1", "pw").unwrap_err().variable,
            "REDIS_AUTH"
        );
        assert_eq!(tcp("rediss://h:1", "").unwrap_err().variable, "REDIS_URL");
        assert_eq!(tcp("localhost", "").unwrap_err().variable, "REDIS_URL");
        assert_eq!(tcp("a:1,b:2", "").unwrap_err().variable, "REDIS_URL");
        let unix = with(&[("REDIS_URL", "/tmp/r.sock"), ("REDIS_AUTH", "a b")]).unwrap();
        assert_eq!(
            unix.redis.target,
            RedisTarget::Single("unix:///tmp/r.sock?pass=a%20b".into())
        );
        assert_eq!(
            err_of(&[("REDIS_URL", "localhost:6379")]).variable,
            "REDIS_URL"
        );
    }

    #[test]
    fn sentinel_urls() {
        let s = with(&[
            ("REDIS_TYPE", "sentinel"),
            ("REDIS_SOCKET_TYPE", "tcp"),
            ("REDIS_URL", "mymaster,s1:26379,s2:26379"),
        ])
        .unwrap();
        assert_eq!(
            s.redis.target,
            RedisTarget::Sentinel {
                master: "mymaster".into(),
                sentinels: vec!["redis://s1:26379/".into(), "redis://s2:26379/".into()],
            }
        );
        assert_eq!(
            err_of(&[("REDIS_TYPE", "sentinel"), ("REDIS_URL", "mymaster")]).variable,
            "REDIS_URL"
        );
        assert_eq!(
            err_of(&[
                ("REDIS_TYPE", "sentinel"),
                ("REDIS_SOCKET_TYPE", "tcp"),
                ("REDIS_URL", "m,s1:1"),
                ("REDIS_AUTH", "pw"),
            ])
            .variable,
            "REDIS_AUTH"
        );
    }

    #[test]
    fn redis_timeout_is_a_go_duration() {
        let t = |v: &str| with(&[("REDIS_TIMEOUT", v)]).map(|s| s.redis.timeout);
        assert_eq!(t("100ms"), Ok(Duration::from_millis(100)));
        assert_eq!(t("10s"), Ok(Duration::from_secs(10)));
        assert_eq!(t("1m"), Ok(Duration::from_secs(60)));
        assert_eq!(t("1.5s"), Ok(Duration::from_millis(1500)));
        assert_eq!(t("1m30s"), Ok(Duration::from_secs(90)));
        assert_eq!(t("250us"), Ok(Duration::from_micros(250)));
        for v in ["0", "-1s", "10", "ten", "5x", "1..5s", "ms"] {
            assert_eq!(t(v).unwrap_err().variable, "REDIS_TIMEOUT", "{v}");
        }
    }

    #[test]
    fn masked_urls_hide_credentials() {
        assert_eq!(mask("redis://u:p@h:1/"), "redis://*****@h:1/");
        assert_eq!(
            mask("unix:///s?pass=x&user=y"),
            "unix:///s?pass=*****&user=*****"
        );
        assert_eq!(mask("redis://h:1/"), "redis://h:1/");
        let target = RedisTarget::Single("redis://:pw@h:1/".into());
        assert!(!format!("{target:?}").contains("pw"));
    }
}

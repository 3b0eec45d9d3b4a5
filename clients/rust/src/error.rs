//! The one error type of the kit.

use std::fmt;
use std::time::Duration;

/// Why a call, a start-up check or a build failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Error {
    /// A rule or an argument was refused before anything was sent; `arg`
    /// names the parameter (`capacity`, `window_ms`, `policy name`, ...).
    BadArgument {
        /// The rule's name, or the command's, where the argument belongs.
        rule: String,
        /// The argument at fault, as the commands name it.
        arg: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The server answered an error reply (`ERR ...`, `WRONGTYPE ...`).
    Server(String),
    /// The server did not answer within the call's deadline. The call may
    /// still have been applied: the kit never retries it, and the limiter
    /// counts it as admitted in the instance's account.
    Timeout(Duration),
    /// No connection to the server (refused, reset, closed).
    Connection(String),
    /// The server answers, but has not loaded the module (or an older one).
    ModuleMissing(String),
    /// The reply did not have the shape the contract gives it.
    Protocol(String),
    /// The limiter denied a call that answers a guard rather than a
    /// [`crate::Decision`] ([`crate::Client::lease`]): the denial, with its
    /// `retry_after`.
    Denied(Box<crate::Decision>),
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::BadArgument { rule, arg, reason } => {
                write!(f, "rule {rule:?}: bad argument {arg}: {reason}")
            }
            Error::Server(msg) => write!(f, "server error: {msg}"),
            Error::Timeout(d) => write!(f, "no reply within the deadline of {d:?}"),
            Error::Connection(msg) => write!(f, "connection error: {msg}"),
            Error::ModuleMissing(msg) => write!(f, "redis-ratelimit module missing: {msg}"),
            Error::Protocol(msg) => write!(f, "unexpected reply: {msg}"),
            Error::Denied(d) => match d.retry_after_s() {
                Some(_) => write!(f, "denied; retry after {:?}", d.retry_after),
                None => write!(f, "denied; this request can never pass"),
            },
        }
    }
}

impl std::error::Error for Error {}

impl Error {
    /// A failure of the path to Redis (not of the request): what the
    /// fallback and the circuit breaker count.
    pub fn is_unavailable(&self) -> bool {
        matches!(self, Error::Timeout(_) | Error::Connection(_))
    }

    /// Whether the server may have applied the call although no decision
    /// came back: a timeout, a connection lost (the kit cannot tell a call
    /// lost in flight from one never sent, so it counts both), a reply it
    /// could not read. Not for an error reply, which the server sends
    /// instead of applying the call (`LOADING`, `READONLY`, `WRONGTYPE`...).
    /// The [`crate::Limiter`] charges such a call to the instance's account,
    /// so that its fallback never admits on top of what Redis may have
    /// counted.
    pub fn may_have_applied(&self) -> bool {
        match self {
            Error::Timeout(_) | Error::Protocol(_) => true,
            Error::Connection(msg) => !answered_unavailable(msg),
            _ => false,
        }
    }

    pub(crate) fn bad(rule: &str, arg: &str, reason: impl Into<String>) -> Self {
        Error::BadArgument {
            rule: rule.to_string(),
            arg: arg.to_string(),
            reason: reason.into(),
        }
    }
}

/// Codes that say the server cannot serve now (loading, failing over, a
/// slot moving): unavailability, for the breaker, not a bad request.
const UNAVAILABLE_CODES: &[&str] = &[
    "LOADING",
    "MASTERDOWN",
    "READONLY",
    "TRYAGAIN",
    "CLUSTERDOWN",
    "MOVED",
    "ASK",
    "BUSY",
];

/// A [`Error::Connection`] made from the server's own unavailability reply
/// (its message starts with the code: see [`server_error`] and `From`).
fn answered_unavailable(msg: &str) -> bool {
    let code = msg.split(' ').next().unwrap_or_default();
    UNAVAILABLE_CODES.contains(&code)
}

pub(crate) fn server_error(e: &redis::ServerError) -> Error {
    let text = format!("{} {}", e.code(), e.details().unwrap_or_default());
    if UNAVAILABLE_CODES.contains(&e.code()) {
        Error::Connection(text)
    } else {
        Error::Server(text)
    }
}

impl From<redis::RedisError> for Error {
    fn from(e: redis::RedisError) -> Self {
        if let Some(code) = e.code().filter(|c| UNAVAILABLE_CODES.contains(c)) {
            return Error::Connection(format!("{code} {}", e.detail().unwrap_or_default()));
        }
        if e.is_timeout() {
            Error::Timeout(Duration::ZERO)
        } else if e.is_io_error()
            || e.is_connection_dropped()
            || e.is_connection_refusal()
            || e.is_unrecoverable_error()
        {
            Error::Connection(e.to_string())
        } else if let Some(code) = e.code() {
            Error::Server(format!("{code} {}", e.detail().unwrap_or_default()))
        } else {
            Error::Connection(e.to_string())
        }
    }
}

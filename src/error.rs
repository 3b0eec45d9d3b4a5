//! The one error type of the module, and its wording as a Redis error reply.

use std::fmt;

use crate::limiter::{ParamError, MAX_PARAM};

/// Everything a command can refuse. Rendered to a reply in [`Error::message`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Error {
    /// Wrong number of arguments: answered with Redis's own arity error.
    Arity,
    /// The key holds another Redis type or another algorithm's state.
    WrongType,
    /// An argument is not an integer in `min..=max`.
    Range {
        arg: &'static str,
        min: u64,
        max: u64,
    },
    /// Parameters that would need more than [`MAX_SPAN_MS`] to get back to idle.
    SpanTooLong { what: &'static str },
    /// `bucket_ms` does not divide `window_ms`.
    BucketDoesNotDivide,
    /// A span the parameters imply is out of range (`CL.THROTTLE`).
    SpanOutOfRange {
        what: &'static str,
        bound: &'static str,
    },
    /// Wrong number of arguments to `CL.THROTTLE`: redis-cell's own reply,
    /// its usage text (with its error code, `Cell`), word for word.
    Usage(&'static str),
    /// A `CL.THROTTLE` key holding a string that is not a time in Unix
    /// nanoseconds (the key, escaped and shortened).
    NotATime(String),
    /// The server's clock beyond what a nanosecond state holds.
    ClockOutOfRange,
    /// A parameter above the bound a module config sets.
    AboveConfig {
        what: &'static str,
        config: &'static str,
        max: u64,
    },
    /// An option we do not know (its text, escaped and shortened).
    UnknownOption(String),
    /// An option given twice.
    DuplicateOption(&'static str),
    /// An option without its value.
    MissingValue(&'static str),
    /// Two options that cannot be given together.
    Exclusive(&'static str, &'static str),
    /// `AT` or `RL.SETSTATE` from a normal client.
    ReservedForReplication(&'static str),
    /// A malformed command, said in words.
    Syntax(String),
    /// `POLICY name` naming no policy.
    UnknownPolicy(String),
    /// An algorithm name we do not know.
    UnknownAlgorithm(String),
    /// A state payload that fails validation.
    BadState,
    /// Creating a key while used memory is above `maxmemory`.
    OutOfMemory,
    /// A blocked call whose key moved to another node (a slot migration)
    /// before the server redirected it.
    KeyMoved,
    /// A panic caught at the FFI boundary: a bug, reported instead of aborting.
    Internal,
}

impl Error {
    /// The error reply, starting with its Redis error code.
    pub fn message(&self) -> String {
        match self {
            Error::Arity => "ERR wrong number of arguments".to_string(),
            Error::WrongType => {
                "WRONGTYPE Operation against a key holding the wrong kind of value".to_string()
            }
            // The parameters' errors read as the core crate words them (one
            // rendering, `ParamError`'s), so that a client running the
            // algorithms in process tells its users the same.
            Error::Range { arg, min, max } => format!(
                "ERR {}",
                ParamError::Range {
                    arg,
                    min: *min,
                    max: *max
                }
            ),
            Error::SpanTooLong { what } => format!("ERR {}", ParamError::SpanTooLong { what }),
            Error::BucketDoesNotDivide => format!("ERR {}", ParamError::BucketDoesNotDivide),
            Error::SpanOutOfRange { what, bound } => {
                format!("ERR {}", ParamError::SpanOutOfRange { what, bound })
            }
            Error::Usage(text) => text.to_string(),
            Error::NotATime(key) => format!(
                "ERR key '{key}' holds a string that is not a CL.THROTTLE state (a time in Unix nanoseconds)"
            ),
            Error::ClockOutOfRange => {
                "ERR the server's clock is beyond what a CL.THROTTLE state can hold".to_string()
            }
            Error::AboveConfig { what, config, max } => {
                format!("ERR {what} is above ratelimit.{config} ({max})")
            }
            Error::UnknownOption(text) => {
                format!("ERR unknown option '{text}' (expected COST, FORCE, REFUND, UPTO or BLOCK)")
            }
            Error::DuplicateOption(name) => format!("ERR {name} given more than once"),
            Error::MissingValue(name) => format!("ERR {name} needs a value"),
            Error::Exclusive(a, b) => format!("ERR {a} cannot be given with {b}"),
            Error::ReservedForReplication(what) => {
                format!("ERR {what} is reserved for replication and AOF loading")
            }
            Error::UnknownAlgorithm(text) => format!("ERR unknown algorithm '{text}'"),
            Error::Syntax(text) => format!("ERR {text}"),
            Error::UnknownPolicy(name) => format!("ERR unknown policy '{name}'"),
            Error::KeyMoved => {
                "TRYAGAIN the key moved to another node while the call waited".to_string()
            }
            Error::BadState => "ERR invalid limiter state".to_string(),
            Error::OutOfMemory => {
                "OOM command not allowed when used memory > 'maxmemory'.".to_string()
            }
            Error::Internal => {
                "ERR internal error in the ratelimit module (a bug, please report it); nothing was changed"
                    .to_string()
            }
        }
    }

    /// Shows at most 64 bytes of client input, escaping anything unprintable,
    /// so an error reply stays one clean line.
    pub fn quote(text: &[u8]) -> String {
        let mut out = String::new();
        for &b in text.iter().take(64) {
            match b {
                b' '..=b'~' if b != b'\'' && b != b'\\' => out.push(b as char),
                _ => out.push_str(&format!("\\x{b:02x}")),
            }
        }
        if text.len() > 64 {
            out.push_str("...");
        }
        out
    }

    /// The range error of a limiter parameter (1 to 2^40).
    pub const fn param(arg: &'static str) -> Error {
        Error::Range {
            arg,
            min: 1,
            max: MAX_PARAM,
        }
    }
}

/// Parameters the core crate refused, as the argument error of the command
/// that carried them.
impl From<ParamError> for Error {
    fn from(error: ParamError) -> Self {
        match error {
            ParamError::Range { arg, min, max } => Error::Range { arg, min, max },
            ParamError::SpanTooLong { what } => Error::SpanTooLong { what },
            ParamError::BucketDoesNotDivide => Error::BucketDoesNotDivide,
            ParamError::SpanOutOfRange { what, bound } => Error::SpanOutOfRange { what, bound },
        }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_message_is_one_line_with_an_error_code() {
        let all = [
            Error::Arity,
            Error::WrongType,
            Error::param("capacity"),
            Error::SpanTooLong { what: "x" },
            Error::UnknownOption(Error::quote(b"a\r\nb")),
            Error::DuplicateOption("COST"),
            Error::BucketDoesNotDivide,
            Error::AboveConfig {
                what: "limit",
                config: "sliding-max-limit",
                max: 5,
            },
            Error::MissingValue("COST"),
            Error::Exclusive("REFUND", "COST"),
            Error::ReservedForReplication("AT"),
            Error::UnknownAlgorithm("x".into()),
            Error::Syntax("x".into()),
            Error::UnknownPolicy("x".into()),
            Error::BadState,
            Error::SpanOutOfRange {
                what: "x",
                bound: "y",
            },
            Error::NotATime(Error::quote(b"k\r\n")),
            Error::ClockOutOfRange,
            Error::OutOfMemory,
            Error::KeyMoved,
            Error::Internal,
        ];
        for e in all {
            let m = e.message();
            assert!(!m.contains('\r') && !m.contains('\n'), "{m}");
            let code = m.split(' ').next().unwrap();
            assert!(
                ["ERR", "WRONGTYPE", "OOM", "TRYAGAIN"].contains(&code),
                "{m}"
            );
        }
    }

    /// The core crate words its errors as the replies do, so that a client
    /// running the algorithms in process tells its users the same.
    #[test]
    fn parameter_errors_read_as_the_core_crate_words_them() {
        for e in [
            ParamError::Range {
                arg: "capacity",
                min: 1,
                max: MAX_PARAM,
            },
            ParamError::SpanTooLong { what: "x" },
            ParamError::BucketDoesNotDivide,
            ParamError::SpanOutOfRange {
                what: "x",
                bound: "y",
            },
        ] {
            assert_eq!(Error::from(e).message(), format!("ERR {e}"));
        }
    }

    #[test]
    fn quoting_escapes_and_shortens_client_input() {
        assert_eq!(Error::quote(b"FOO"), "FOO");
        assert_eq!(Error::quote(b"a'\x00"), "a\\x27\\x00");
        assert!(Error::quote(&[b'x'; 100]).ends_with("..."));
    }
}

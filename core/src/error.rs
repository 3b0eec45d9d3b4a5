//! Why a set of parameters was refused: the one error of the crate.

use std::fmt;

use crate::MAX_SPAN_MS;

/// Parameters that no limiter can be built from. Each variant names what is
/// wrong in the words of the commands' arguments, so that a caller can tell
/// its user which argument to fix.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ParamError {
    /// The argument `arg` is outside `min..=max`.
    Range {
        /// The argument, as the commands name it (`capacity`, `window_ms`).
        arg: &'static str,
        /// The smallest value it may take.
        min: u64,
        /// The largest value it may take.
        max: u64,
    },
    /// The limiter would take more than [`MAX_SPAN_MS`] to get back to idle;
    /// `what` says which span, as a formula of the arguments.
    SpanTooLong {
        /// The span, as a formula of the arguments.
        what: &'static str,
    },
    /// A hash window's `bucket_ms` does not divide its `window_ms`.
    BucketDoesNotDivide,
    /// A span the parameters imply is out of range: `what` (a formula of
    /// the arguments) must be `bound` (`CL.THROTTLE`, whose state counts
    /// nanoseconds).
    SpanOutOfRange {
        /// The span, as a formula of the arguments.
        what: &'static str,
        /// What it must be, in words.
        bound: &'static str,
    },
}

impl fmt::Display for ParamError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ParamError::Range { arg, min, max } => {
                write!(f, "{arg} must be an integer from {min} to {max}")
            }
            ParamError::SpanTooLong { what } => write!(
                f,
                "{what} is too long: a limiter may take at most {MAX_SPAN_MS} ms to get back to idle"
            ),
            ParamError::BucketDoesNotDivide => f.write_str("bucket_ms must divide window_ms"),
            ParamError::SpanOutOfRange { what, bound } => write!(f, "{what} must be {bound}"),
        }
    }
}

impl std::error::Error for ParamError {}

/// `value` if it is in `min..=max`, else the range error naming `arg`.
pub(crate) fn in_range(
    arg: &'static str,
    value: u64,
    min: u64,
    max: u64,
) -> Result<u64, ParamError> {
    if (min..=max).contains(&value) {
        Ok(value)
    } else {
        Err(ParamError::Range { arg, min, max })
    }
}

/// An integer parameter: 1 to [`crate::MAX_PARAM`].
pub(crate) fn param(arg: &'static str, value: u64) -> Result<u64, ParamError> {
    in_range(arg, value, 1, crate::MAX_PARAM)
}

//! A limiter spec: an algorithm and its parameters, as `RL.ALL` and
//! `RL.POLICY SET` take them (`TOKENBUCKET 5 5 1000`), and the dispatch from
//! a spec to its algorithm's generic code.

use crate::args::Params;
use crate::error::Error;
use crate::limiter::fixed_window::FixedWindowParams;
use crate::limiter::hash_window::HashWindowParams;
use crate::limiter::leaky_bucket::LeakyBucketParams;
use crate::limiter::sliding_log::SlidingLogParams;
use crate::limiter::token_bucket::TokenBucketParams;

/// One algorithm with validated parameters.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Spec {
    TokenBucket(TokenBucketParams),
    FixedWindow(FixedWindowParams),
    LeakyBucket(LeakyBucketParams),
    Sliding(SlidingLogParams),
    HashWindow(HashWindowParams),
}

/// Runs `$body` with `$L` the algorithm of `$spec` and `$p` its parameters.
macro_rules! with_algorithm {
    ($spec:expr, $L:ident, $p:ident => $body:expr) => {
        match $spec {
            $crate::commands::spec::Spec::TokenBucket($p) => {
                type $L = $crate::limiter::TokenBucket;
                $body
            }
            $crate::commands::spec::Spec::FixedWindow($p) => {
                type $L = $crate::limiter::FixedWindow;
                $body
            }
            $crate::commands::spec::Spec::LeakyBucket($p) => {
                type $L = $crate::limiter::LeakyBucket;
                $body
            }
            $crate::commands::spec::Spec::Sliding($p) => {
                type $L = $crate::limiter::SlidingLog;
                $body
            }
            $crate::commands::spec::Spec::HashWindow($p) => {
                type $L = $crate::limiter::HashWindow;
                $body
            }
        }
    };
}
pub(crate) use with_algorithm;

/// Where a spec was given, to name it in an error.
#[derive(Clone, Copy, Debug)]
pub enum Site {
    /// `RL.POLICY SET` (and a policy loaded from RDB).
    Policy,
    /// The n-th spec of `RL.ALL`, from 1.
    InCall(usize),
}

impl std::fmt::Display for Site {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Site::Policy => f.write_str("policy"),
            Site::InCall(n) => write!(f, "spec {n}"),
        }
    }
}

/// A spec's parameters in command order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ParamList {
    values: [u64; 3],
    len: usize,
}

impl ParamList {
    pub fn as_slice(&self) -> &[u64] {
        &self.values[..self.len]
    }
}

/// The algorithm names a spec may start with.
pub const ALGORITHMS: &str = "TOKENBUCKET, FIXEDWINDOW, LEAKYBUCKET, SLIDING, HASHWINDOW";

impl Spec {
    /// Parses `<ALGORITHM> <params...>` at the start of `args`; returns the
    /// spec and how many words it took. `what` names it in errors (and is
    /// only formatted for one, so a good call builds no string).
    pub fn parse(args: &[&[u8]], what: Site) -> Result<(Spec, usize), Error> {
        fn params<P: Params>(args: &[&[u8]], what: Site) -> Result<P, Error> {
            if args.len() < 1 + P::COUNT {
                return Err(Error::Syntax(format!(
                    "{what} needs {} parameters",
                    P::COUNT
                )));
            }
            P::parse(&args[1..1 + P::COUNT])
        }
        let name = args.first().copied().unwrap_or_default();
        let is = |word: &str| name.eq_ignore_ascii_case(word.as_bytes());
        let spec = if is("TOKENBUCKET") {
            Spec::TokenBucket(params(args, what)?)
        } else if is("FIXEDWINDOW") {
            Spec::FixedWindow(params(args, what)?)
        } else if is("LEAKYBUCKET") {
            Spec::LeakyBucket(params(args, what)?)
        } else if is("SLIDING") {
            Spec::Sliding(params(args, what)?)
        } else if is("HASHWINDOW") {
            Spec::HashWindow(params(args, what)?)
        } else {
            return Err(Error::Syntax(format!(
                "{what}: unknown algorithm '{}' (expected {ALGORITHMS})",
                Error::quote(name)
            )));
        };
        Ok((spec, 1 + spec.param_count()))
    }

    /// The algorithm's name, as in a spec.
    pub fn name(&self) -> &'static str {
        match self {
            Spec::TokenBucket(_) => "TOKENBUCKET",
            Spec::FixedWindow(_) => "FIXEDWINDOW",
            Spec::LeakyBucket(_) => "LEAKYBUCKET",
            Spec::Sliding(_) => "SLIDING",
            Spec::HashWindow(_) => "HASHWINDOW",
        }
    }

    /// The parameters, in command order (at most three; no allocation).
    pub fn params(&self) -> ParamList {
        let (values, len) = match *self {
            Spec::TokenBucket(p) => ([p.capacity(), p.refill_count(), p.refill_ms()], 3),
            Spec::FixedWindow(p) => ([p.limit(), p.window_ms(), 0], 2),
            Spec::LeakyBucket(p) => ([p.capacity(), p.leak_count(), p.leak_ms()], 3),
            Spec::Sliding(p) => ([p.limit(), p.window_ms(), 0], 2),
            Spec::HashWindow(p) => ([p.limit(), p.window_ms(), p.bucket_ms()], 3),
        };
        ParamList { values, len }
    }

    /// The limit a caller is told about: the capacity, or requests per window.
    pub fn limit(&self) -> u64 {
        self.params().as_slice()[0]
    }

    pub fn param_count(&self) -> usize {
        with_algorithm!(*self, L, _p => <<L as crate::limiter::Algorithm>::Params as Params>::COUNT)
    }
}

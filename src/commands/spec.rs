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

/// The algorithm names a spec may start with.
pub const ALGORITHMS: &str = "TOKENBUCKET, FIXEDWINDOW, LEAKYBUCKET, SLIDING, HASHWINDOW";

impl Spec {
    /// Parses `<ALGORITHM> <params...>` at the start of `args`; returns the
    /// spec and how many words it took. `what` names it in errors.
    pub fn parse(args: &[&[u8]], what: &str) -> Result<(Spec, usize), Error> {
        fn params<P: Params>(args: &[&[u8]], what: &str) -> Result<P, Error> {
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

    /// Like [`Spec::parse`], for the `position`-th spec of `RL.ALL`.
    pub fn parse_in_call(args: &[&[u8]], position: usize) -> Result<(Spec, usize), Error> {
        Spec::parse(args, &format!("spec {position}"))
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

    /// The parameters, in command order.
    pub fn params(&self) -> Vec<u64> {
        match *self {
            Spec::TokenBucket(p) => vec![p.capacity, p.refill_count, p.refill_ms],
            Spec::FixedWindow(p) => vec![p.limit, p.window_ms],
            Spec::LeakyBucket(p) => vec![p.capacity, p.leak_count, p.leak_ms],
            Spec::Sliding(p) => vec![p.limit, p.window_ms],
            Spec::HashWindow(p) => vec![p.limit, p.window_ms, p.bucket_ms],
        }
    }

    pub fn param_count(&self) -> usize {
        with_algorithm!(*self, L, _p => <<L as crate::limiter::Algorithm>::Params as Params>::COUNT)
    }
}

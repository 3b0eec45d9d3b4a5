//! The limiter commands (`RL.TOKENBUCKET`, `RL.FIXEDWINDOW`, ...): one generic
//! handler, instantiated per row of the table of algorithms.
//!
//! Hot path: arguments are read in place, the state is mutated in place in
//! the module value (a new key is boxed only when its first request is
//! admitted), and a call that changes nothing writes, expires and propagates
//! nothing.

use super::host::{Host, Origin};
use super::step::{Command, OneKey};
use super::MAX_ARGS;
use crate::algorithms::Listed;
use crate::args::{parse_call, Params};
use crate::error::Error;

/// `RL.<ALGORITHM> key <params...> [COST n [FORCE] | REFUND n] [BLOCK t]`:
/// the stages of `super::step`, on the key at argument 1.
#[inline(always)]
pub fn step<L: Listed, H: Host>(host: &H) -> Result<(), Error> {
    if host.argc() < 2 + L::Params::COUNT {
        return Err(Error::Arity);
    }
    let args = host.words::<MAX_ARGS>()?;
    let (params, options) = parse_call::<L::Params>(&args[2..])?;
    // Asked only of a call that pins a time: where a call comes from costs
    // a module API call.
    if (options.at.is_some() || options.end.is_some()) && host.origin() == Origin::Client {
        options.refuse_pinned()?;
    }
    super::step::run(
        host,
        &mut OneKey::<L, _> {
            key: args[1],
            params,
            request: options.request,
            block: options.block,
            via: Command {
                at: options.at,
                end: options.end,
                zone: options.zone,
            },
        },
    )
}

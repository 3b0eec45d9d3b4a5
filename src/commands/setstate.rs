//! `RL.SETSTATE key <ALGORITHM> <encoding> <fields...>`: sets a limiter's raw
//! state, in encoding 1 (every type's decimal fields) or 2 (the hash
//! window's compact form: its header fields, then its counters as one
//! argument of raw bytes). It is what an AOF rewrite without the RDB preamble writes for each
//! limiter key (Redis adds the `PEXPIREAT`), and it is accepted only while the
//! AOF loads or from the master link. Fields are validated exactly like an
//! RDB payload.

use super::host::{Host, Origin, Store};
use crate::algorithms::{for_each_algorithm, Listed};
use crate::args::parse_int;
use crate::datatype::decode_args;
use crate::error::Error;

pub fn step<H: Host>(host: &H) -> Result<(), Error> {
    if host.argc() < 4 {
        return Err(Error::Arity);
    }
    if host.origin() == Origin::Client {
        return Err(Error::ReservedForReplication("RL.SETSTATE"));
    }
    let all = host.all_words();
    // 1, the decimal fields every type has (what the AOF rewrite writes);
    // 2, the hash window's compact form (its byte string one argument).
    let encoding = parse_int(all[3], "encoding", 1, 2)? as i32;
    let mut key = host.open_key(1);
    let (algorithm, fields) = (all[2], &all[4..]);
    set_any(&mut key, algorithm, fields, encoding)?;
    drop(key);
    host.propagate_verbatim();
    host.reply_simple(c"OK");
    Ok(())
}

/// Sets the state of the algorithm named `algorithm` (its spec word, in any
/// case).
fn set_any(
    key: &mut impl Store,
    algorithm: &[u8],
    fields: &[&[u8]],
    encoding: i32,
) -> Result<(), Error> {
    for_each_algorithm!(L => {
        if algorithm.eq_ignore_ascii_case(L::WORD.to_bytes()) {
            return set::<L>(key, fields, encoding);
        }
    });
    Err(Error::UnknownAlgorithm(Error::quote(algorithm)))
}

fn set<L: Listed>(key: &mut impl Store, fields: &[&[u8]], encoding: i32) -> Result<(), Error> {
    let state = decode_args::<L::State>(fields, encoding).ok_or(Error::BadState)?;
    key.set_state::<L>(state);
    Ok(())
}

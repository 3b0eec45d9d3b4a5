//! `RL.SETSTATE key <ALGORITHM> <encoding> <fields...>`: sets a limiter's raw
//! state. It is what an AOF rewrite without the RDB preamble writes for each
//! limiter key (Redis adds the `PEXPIREAT`), and it is accepted only while the
//! AOF loads or from the master link. Fields are validated exactly like an
//! RDB payload.

use std::os::raw::c_int;

use redis_module::raw;

use super::{all_args, from_replication_or_loading, Key};
use crate::api;
use crate::args::parse_int;
use crate::datatype::{decode_args, NativeState};
use crate::error::Error;
use crate::guard;
use crate::limiter::fixed_window::FixedWindowState;
use crate::limiter::hash_window::HashWindowState;
use crate::limiter::leaky_bucket::LeakyBucketState;
use crate::limiter::sliding_log::SlidingLogState;
use crate::limiter::token_bucket::TokenBucketState;

pub unsafe extern "C" fn handler(
    ctx: *mut raw::RedisModuleCtx,
    argv: *mut *mut raw::RedisModuleString,
    argc: c_int,
) -> c_int {
    guard::command(ctx, || unsafe { run(ctx, argv, argc) })
}

unsafe fn run(
    ctx: *mut raw::RedisModuleCtx,
    argv: *mut *mut raw::RedisModuleString,
    argc: c_int,
) -> Result<(), Error> {
    if argc < 4 {
        return Err(Error::Arity);
    }
    if !from_replication_or_loading(ctx) {
        return Err(Error::ReservedForReplication("RL.SETSTATE"));
    }
    let all = unsafe { all_args(argv, argc) };
    let encoding = parse_int(all[3], "encoding", 1, 1)? as c_int;
    let key = Key::open_rw(ctx, unsafe { *argv.add(1) });
    let (algorithm, fields) = (all[2], &all[4..]);
    let is = |name: &str| algorithm.eq_ignore_ascii_case(name.as_bytes());
    if is(TokenBucketState::ALGORITHM) {
        set::<TokenBucketState>(&key, fields, encoding)?;
    } else if is(FixedWindowState::ALGORITHM) {
        set::<FixedWindowState>(&key, fields, encoding)?;
    } else if is(LeakyBucketState::ALGORITHM) {
        set::<LeakyBucketState>(&key, fields, encoding)?;
    } else if is(SlidingLogState::ALGORITHM) {
        set::<SlidingLogState>(&key, fields, encoding)?;
    } else if is(HashWindowState::ALGORITHM) {
        set::<HashWindowState>(&key, fields, encoding)?;
    } else {
        return Err(Error::UnknownAlgorithm(Error::quote(algorithm)));
    }
    drop(key);
    unsafe {
        api!(RedisModule_ReplicateVerbatim)(ctx);
        api!(RedisModule_ReplyWithSimpleString)(ctx, c"OK".as_ptr());
    }
    Ok(())
}

fn set<S: NativeState>(key: &Key, fields: &[&[u8]], encoding: c_int) -> Result<(), Error> {
    let state = decode_args::<S>(fields, encoding).ok_or(Error::BadState)?;
    key.set(state);
    Ok(())
}

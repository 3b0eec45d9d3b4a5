//! What the module propagates to replicas and the AOF, and in which form.
//!
//! A limiter call reads the master's clock, so it is never propagated as the
//! client sent it: it goes out with the master's time pinned (`AT <unix_us>`),
//! like Redis turns `SET ... EX` into `PXAT`. The algorithms are pure
//! functions of `(state, params, cost, now)`, so replaying the pinned call
//! reaches the master's state bit for bit, hours later from an AOF as well as
//! live on a replica. Calls that changed nothing are not propagated at all.

use std::ffi::CStr;
use std::os::raw::c_longlong;

use redis_module::raw;

use crate::api;
use crate::limiter::Micros;

/// Propagates an admitted limiter call as
/// `<command> key <params...> COST <cost> AT <now_us>`.
///
/// `argv[1..1 + key_and_params]` are the client's own key and (validated)
/// parameter strings, passed on without copying.
pub fn limiter_call(
    ctx: *mut raw::RedisModuleCtx,
    command: &CStr,
    argv: *mut *mut raw::RedisModuleString,
    key_and_params: usize,
    cost: u64,
    now: Micros,
) {
    unsafe {
        api!(RedisModule_Replicate)(
            ctx,
            command.as_ptr(),
            c"vclcl".as_ptr(),
            argv.add(1),
            key_and_params,
            c"COST".as_ptr(),
            cost as c_longlong,
            c"AT".as_ptr(),
            now.0 as c_longlong,
        );
    }
}

//! What the module propagates to replicas and the AOF, and in which form.
//!
//! A limiter call reads the master's clock, so it is never propagated as the
//! client sent it: it goes out with the master's time pinned,
//! `<command> key <params...> COST n AT <unix_us>`, like Redis turns
//! `SET ... EX` into `PXAT`. The algorithms are pure functions of
//! `(state, params, cost, now)`, so replaying the pinned call reaches the
//! master's state bit for bit, live on a replica or hours later from an AOF.
//! Calls that changed nothing are not propagated at all.
//!
//! Building the pinned call costs more than the limiter itself (Redis looks
//! the command up by name and allocates every argument). Redis drops
//! propagated commands when nothing can consume them: no AOF, no replica and
//! no replication backlog. The module skips building them in exactly that
//! case, and only while it is sure of it: it starts in the pinned mode unless,
//! at load, the server is a master without AOF, replicas or backlog; and it
//! switches to the pinned mode for good on the first sign that a consumer may
//! appear, each of which Redis announces before any later command runs:
//!
//! - a fork (every full sync and every AOF rewrite, including turning AOF on,
//!   starts with one, and the stream a replica or a new AOF reads starts at
//!   that fork);
//! - a replica connecting or a change of replication role;
//! - data loaded from disk (a master restarted from its RDB may recreate its
//!   backlog without a fork, so that replicas can resume).
//!
//! In the fast mode the call is still reported with `ReplicateVerbatim`,
//! which Redis drops at once for lack of a consumer, but which counts the
//! write for `save` points and `rdb_changes_since_last_save`.

use std::ffi::CStr;
use std::os::raw::{c_int, c_longlong};
use std::ptr;
use std::sync::atomic::{AtomicBool, AtomicPtr, Ordering};

use redis_module::raw;

use crate::api;
use crate::limiter::Micros;

/// Whether a replica, an AOF or a replication backlog may consume the stream.
static PINNED: AtomicBool = AtomicBool::new(true);

/// Argument strings every pinned call uses, created once at load.
static COST_WORD: AtomicPtr<raw::RedisModuleString> = AtomicPtr::new(ptr::null_mut());
static AT_WORD: AtomicPtr<raw::RedisModuleString> = AtomicPtr::new(ptr::null_mut());
static ONE: AtomicPtr<raw::RedisModuleString> = AtomicPtr::new(ptr::null_mut());

/// Whether admitted calls are currently propagated in their pinned form.
pub fn pinned() -> bool {
    PINNED.load(Ordering::Relaxed)
}

/// Sets up propagation at module load: the shared argument strings, the
/// initial mode, and the server events that switch to the pinned mode.
///
/// # Safety
/// `ctx` must be the context passed to `RedisModule_OnLoad`.
pub unsafe fn init(ctx: *mut raw::RedisModuleCtx) {
    for (slot, text) in [(&COST_WORD, "COST"), (&AT_WORD, "AT"), (&ONE, "1")] {
        let s = unsafe {
            api!(RedisModule_CreateString)(ptr::null_mut(), text.as_ptr().cast(), text.len())
        };
        slot.store(s, Ordering::Relaxed);
    }
    let events = [
        raw::REDISMODULE_EVENT_FORK_CHILD,
        raw::REDISMODULE_EVENT_REPLICATION_ROLE_CHANGED,
        raw::REDISMODULE_EVENT_REPLICA_CHANGE,
        raw::REDISMODULE_EVENT_LOADING,
    ];
    let mut subscribed = true;
    for id in events {
        let event = raw::RedisModuleEvent { id, dataver: 1 };
        let status = unsafe {
            api!(RedisModule_SubscribeToServerEvent)(ctx, event, Some(crate::on_server_event))
        };
        subscribed &= status == raw::REDISMODULE_OK as c_int;
    }
    let quiet = subscribed && unsafe { nothing_consumes_the_stream(ctx) };
    PINNED.store(!quiet, Ordering::Relaxed);
}

/// At load: a master without AOF, replicas or replication backlog.
unsafe fn nothing_consumes_the_stream(ctx: *mut raw::RedisModuleCtx) -> bool {
    let flags = unsafe { api!(RedisModule_GetContextFlags)(ctx) } as u32;
    if flags & (raw::REDISMODULE_CTX_FLAGS_AOF | raw::REDISMODULE_CTX_FLAGS_SLAVE) != 0 {
        return false;
    }
    let info = unsafe { api!(RedisModule_GetServerInfo)(ctx, c"replication".as_ptr()) };
    if info.is_null() {
        return false;
    }
    let field = |name: &CStr| {
        let mut err: c_int = 0;
        let value =
            unsafe { api!(RedisModule_ServerInfoGetFieldSigned)(info, name.as_ptr(), &mut err) };
        if err != 0 {
            None
        } else {
            Some(value)
        }
    };
    let quiet = field(c"repl_backlog_active") == Some(0) && field(c"connected_slaves") == Some(0);
    unsafe { api!(RedisModule_FreeServerInfo)(ctx, info) };
    quiet
}

/// Any of the events [`init`] subscribes to: from now on, pin.
pub fn consumer_may_appear(ctx: *mut raw::RedisModuleCtx) {
    if !PINNED.swap(true, Ordering::Relaxed) {
        crate::log_notice(
            ctx,
            c"a fork, replica, role change or data load was seen: admitted calls are now propagated with the master's time pinned",
        );
    }
}

/// Propagates an admitted limiter call as
/// `<command> key <params...> COST <cost> AT <now_us>`.
///
/// `key_and_params` are the client's own (validated) strings, passed on
/// without copying.
pub fn limiter_call(
    ctx: *mut raw::RedisModuleCtx,
    command: &CStr,
    key_and_params: &[*mut raw::RedisModuleString],
    cost: u64,
    now: Micros,
) {
    if !pinned() {
        // Nothing consumes the stream: only count the write.
        unsafe { api!(RedisModule_ReplicateVerbatim)(ctx) };
        return;
    }
    let word = |slot: &AtomicPtr<raw::RedisModuleString>| slot.load(Ordering::Relaxed);
    unsafe {
        if cost == 1 {
            api!(RedisModule_Replicate)(
                ctx,
                command.as_ptr(),
                c"vsssl".as_ptr(),
                key_and_params.as_ptr(),
                key_and_params.len(),
                word(&COST_WORD),
                word(&ONE),
                word(&AT_WORD),
                now.0 as c_longlong,
            );
        } else {
            api!(RedisModule_Replicate)(
                ctx,
                command.as_ptr(),
                c"vslsl".as_ptr(),
                key_and_params.as_ptr(),
                key_and_params.len(),
                word(&COST_WORD),
                cost as c_longlong,
                word(&AT_WORD),
                now.0 as c_longlong,
            );
        }
    }
}

/// Propagates an admitted call made through a policy or `RL.ALL`'s parsed
/// parameters: like [`limiter_call`], with the parameters given as numbers.
pub fn limiter_call_with_params(
    ctx: *mut raw::RedisModuleCtx,
    command: &CStr,
    key: *mut raw::RedisModuleString,
    params: &[u64],
    cost: u64,
    now: Micros,
) {
    if !pinned() {
        unsafe { api!(RedisModule_ReplicateVerbatim)(ctx) };
        return;
    }
    let mut strings = [ptr::null_mut(); 8];
    strings[0] = key;
    for (slot, &value) in strings[1..].iter_mut().zip(params) {
        *slot = unsafe { api!(RedisModule_CreateStringFromLongLong)(ctx, value as c_longlong) };
    }
    limiter_call(ctx, command, &strings[..1 + params.len()], cost, now);
    for &s in &strings[1..1 + params.len()] {
        unsafe { api!(RedisModule_FreeString)(ctx, s) };
    }
}

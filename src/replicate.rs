//! What the module propagates to replicas and the AOF, and in which form.
//!
//! A limiter call reads the master's clock, so it is never propagated as the
//! client sent it: it goes out with the master's time pinned,
//! `<command> key <params...> COST n [FORCE] AT <unix_us>` (or `REFUND n AT
//! <unix_us>`), like Redis turns
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
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU64, Ordering};

use redis_module::raw;

use crate::api;
use crate::limiter::{Micros, Request};

/// Whether a replica, an AOF or a replication backlog may consume the stream.
static PINNED: AtomicBool = AtomicBool::new(true);

/// Argument strings every pinned call uses, created once at load.
static COST_WORD: AtomicPtr<raw::RedisModuleString> = AtomicPtr::new(ptr::null_mut());
static AT_WORD: AtomicPtr<raw::RedisModuleString> = AtomicPtr::new(ptr::null_mut());
static ONE: AtomicPtr<raw::RedisModuleString> = AtomicPtr::new(ptr::null_mut());
static FORCE_WORD: AtomicPtr<raw::RedisModuleString> = AtomicPtr::new(ptr::null_mut());
static REFUND_WORD: AtomicPtr<raw::RedisModuleString> = AtomicPtr::new(ptr::null_mut());

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
    for (slot, text) in [
        (&COST_WORD, "COST"),
        (&AT_WORD, "AT"),
        (&ONE, "1"),
        (&FORCE_WORD, "FORCE"),
        (&REFUND_WORD, "REFUND"),
    ] {
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

/// Propagates a limiter call that changed the state as
/// `<command> key <params...> COST <n> [FORCE] AT <now_us>` or
/// `<command> key <params...> REFUND <n> AT <now_us>`.
///
/// `key_and_params` are the client's own (validated) strings, passed on
/// without copying.
pub fn limiter_call(
    ctx: *mut raw::RedisModuleCtx,
    command: &CStr,
    key_and_params: &[*mut raw::RedisModuleString],
    request: Request,
    now: Micros,
) {
    if !pinned() {
        // Nothing consumes the stream: only count the write.
        unsafe { api!(RedisModule_ReplicateVerbatim)(ctx) };
        return;
    }
    let word = |slot: &AtomicPtr<raw::RedisModuleString>| slot.load(Ordering::Relaxed);
    let replicate = api!(RedisModule_Replicate);
    let (name, args) = (command.as_ptr(), key_and_params.as_ptr());
    let (len, at) = (key_and_params.len(), now.as_us() as c_longlong);
    unsafe {
        match request {
            Request::Cost(1) => replicate(
                ctx,
                name,
                c"vsssl".as_ptr(),
                args,
                len,
                word(&COST_WORD),
                word(&ONE),
                word(&AT_WORD),
                at,
            ),
            Request::Cost(n) => replicate(
                ctx,
                name,
                c"vslsl".as_ptr(),
                args,
                len,
                word(&COST_WORD),
                n as c_longlong,
                word(&AT_WORD),
                at,
            ),
            Request::Force(n) => replicate(
                ctx,
                name,
                c"vslssl".as_ptr(),
                args,
                len,
                word(&COST_WORD),
                n as c_longlong,
                word(&FORCE_WORD),
                word(&AT_WORD),
                at,
            ),
            Request::Refund(n) => replicate(
                ctx,
                name,
                c"vslsl".as_ptr(),
                args,
                len,
                word(&REFUND_WORD),
                n as c_longlong,
                word(&AT_WORD),
                at,
            ),
        };
    }
}

/// Propagates a call made through a policy or `RL.ALL`'s parsed parameters:
/// like [`limiter_call`], with the parameters given as numbers. Their
/// strings come from [`param_string`]'s cache, so the hot path allocates
/// nothing.
pub fn limiter_call_with_params(
    ctx: *mut raw::RedisModuleCtx,
    command: &CStr,
    key: *mut raw::RedisModuleString,
    params: &[u64],
    request: Request,
    now: Micros,
) {
    if !pinned() {
        unsafe { api!(RedisModule_ReplicateVerbatim)(ctx) };
        return;
    }
    let mut strings = [ptr::null_mut(); 4];
    // A string the cache lets go of may be one this call uses: it is
    // released only once the call is propagated (Redis keeps a reference).
    let mut evicted = [ptr::null_mut(); 3];
    strings[0] = key;
    for ((slot, old), &value) in strings[1..].iter_mut().zip(&mut evicted).zip(params) {
        (*slot, *old) = param_string(value);
    }
    limiter_call(ctx, command, &strings[..1 + params.len()], request, now);
    for old in evicted.into_iter().filter(|s| !s.is_null()) {
        unsafe { api!(RedisModule_FreeString)(ptr::null_mut(), old) };
    }
}

/// Slots of the parameter string cache.
const PARAM_SLOTS: usize = 128;

/// Strings of recently propagated parameter values, direct-mapped by a hash
/// of the value: policies and `RL.ALL` specs use a handful of values over and
/// over, so their strings are made once (Redis only takes a reference to a
/// string it propagates). Touched only on the main thread.
static PARAM_CACHE: [(AtomicU64, AtomicPtr<raw::RedisModuleString>); PARAM_SLOTS] =
    [const { (AtomicU64::new(0), AtomicPtr::new(ptr::null_mut())) }; PARAM_SLOTS];

/// The decimal string of `value`, from the cache, and the string the cache
/// let go of to make room for it (null on a hit), which the caller releases.
fn param_string(value: u64) -> (*mut raw::RedisModuleString, *mut raw::RedisModuleString) {
    // Fibonacci hashing: round numbers (1000, 60000, 86400000) spread out.
    let slot = (value.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 57) as usize % PARAM_SLOTS;
    let (cached_value, cached) = &PARAM_CACHE[slot];
    let string = cached.load(Ordering::Relaxed);
    if !string.is_null() && cached_value.load(Ordering::Relaxed) == value {
        return (string, ptr::null_mut());
    }
    let made =
        unsafe { api!(RedisModule_CreateStringFromLongLong)(ptr::null_mut(), value as c_longlong) };
    cached_value.store(value, Ordering::Relaxed);
    cached.store(made, Ordering::Relaxed);
    (made, string)
}

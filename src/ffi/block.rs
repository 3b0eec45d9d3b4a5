//! Blocked clients and timers: what `BLOCK timeout_ms` needs of the server.
//!
//! A blocked call is a client blocked on its keys
//! (`RedisModule_BlockClientOnKeys`), like `BLPOP`: the server retries it
//! (the `retry` callback, with the call's own arguments) whenever one of
//! its keys is signalled ready, redirects it when its slot moves, and
//! disconnects it on a failover. The module identifies a blocked call by a
//! number (its private data, never a pointer), and wakes keys with timers
//! (`RedisModule_CreateTimer`) whose data is a number too, so nothing here
//! owns memory the server could lose track of.
//!
//! Timers and key signals go through one detached context made at load,
//! so that they can be used from any callback (a blocked client's private
//! data is freed with a context that may not be a client's).

use std::os::raw::{c_int, c_longlong, c_void};
use std::ptr;
use std::sync::atomic::{AtomicPtr, Ordering};

use redis_module::raw;

use super::argv::{Argv, RString};
use super::context::Context;
use super::entry::function;
use super::guard;
use super::register::Load;
use super::string::Owned;
use crate::error::Error;

/// A timer, as the server numbers it.
pub type TimerId = u64;

/// A blocked client, as the server knows it: valid until the server frees
/// its private data (the `forget` callback of [`Context::block_on_keys`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockedClient(usize);

/// The context timers and key signals use (made at load).
static DETACHED: AtomicPtr<raw::RedisModuleCtx> = AtomicPtr::new(ptr::null_mut());

fn detached() -> *mut raw::RedisModuleCtx {
    let ctx = DETACHED.load(Ordering::Relaxed);
    assert!(!ctx.is_null(), "blocking used before the module loaded");
    ctx
}

impl Load<'_> {
    /// Makes the context of timers and key signals; whether the server can
    /// block clients on keys at all (without it, `BLOCK` is ignored).
    pub fn init_blocking(&self) -> bool {
        // SAFETY: plain reads (copies) of function pointers set before the
        // load.
        let (make, all) = unsafe {
            let (block, timer, stop, signal, data, select) = (
                raw::RedisModule_BlockClientOnKeys,
                raw::RedisModule_CreateTimer,
                raw::RedisModule_StopTimer,
                raw::RedisModule_SignalKeyAsReady,
                raw::RedisModule_GetBlockedClientPrivateData,
                raw::RedisModule_SelectDb,
            );
            (
                raw::RedisModule_GetDetachedThreadSafeContext,
                block.is_some()
                    && timer.is_some()
                    && stop.is_some()
                    && signal.is_some()
                    && data.is_some()
                    && select.is_some(),
            )
        };
        let (Some(make), true) = (make, all) else {
            return false;
        };
        // SAFETY: the load context; the detached context lives as long as
        // the module (it is never freed).
        let ctx = unsafe { make(self.ctx().as_ptr()) };
        DETACHED.store(ctx, Ordering::Relaxed);
        !ctx.is_null()
    }
}

/// Whether blocking is available (see [`Load::init_blocking`]).
pub fn blocking_available() -> bool {
    !DETACHED.load(Ordering::Relaxed).is_null()
}

impl Context {
    /// Whether the call may block its client: a client's own call, not
    /// inside `MULTI`, a script or a function, not replicated or loaded.
    #[inline]
    pub fn may_block(&self) -> bool {
        let refused = raw::REDISMODULE_CTX_FLAGS_MULTI
            | raw::REDISMODULE_CTX_FLAGS_LUA
            | raw::REDISMODULE_CTX_FLAGS_DENY_BLOCKING
            | raw::REDISMODULE_CTX_FLAGS_REPLICATED
            | raw::REDISMODULE_CTX_FLAGS_LOADING;
        blocking_available() && self.flags().bits() & refused == 0
    }

    /// The database the call runs in.
    #[inline]
    pub fn selected_db(&self) -> i32 {
        // SAFETY: a valid context.
        unsafe { api!(RedisModule_GetSelectedDb)(self.as_ptr()) }
    }

    /// Blocks the client on `keys` until `retry` serves it (returns
    /// `Ok(true)` after replying), or for `timeout_ms` (0: no limit), after
    /// which `timeout` replies. `waiter` (not 0) is handed to each, and to
    /// `forget` when the server lets go of the blocked client, whatever the
    /// reason (served, timed out, disconnected, redirected). A key deleted
    /// wakes the client too, where the server can say so
    /// ([`wakes_missing_keys`]).
    pub fn block_on_keys<R, T, F>(
        &self,
        keys: &[&RString],
        timeout_ms: u64,
        waiter: u64,
        retry: R,
        timeout: T,
        forget: F,
    ) -> BlockedClient
    where
        R: Fn(&Context, &Argv, u64) -> Result<bool, Error> + Copy + 'static,
        T: Fn(&Context, &Argv, u64) -> Result<(), Error> + Copy + 'static,
        F: Fn(u64) + Copy + 'static,
    {
        let _ = (retry, timeout, forget);
        assert!(waiter != 0, "a waiter is never 0");
        let keys_ptr = keys
            .as_ptr()
            .cast::<*mut raw::RedisModuleString>()
            .cast_mut();
        let timeout_ms = c_longlong::try_from(timeout_ms).unwrap_or(c_longlong::MAX);
        let data = waiter as usize as *mut c_void;
        // SAFETY: a valid context, `keys.len()` live strings (the server
        // takes its own references) and callbacks that live as long as the
        // module.
        let handle = unsafe {
            if let Some(with_flags) = raw::RedisModule_BlockClientOnKeysWithFlags {
                with_flags(
                    self.as_ptr(),
                    Some(retry_trampoline::<R>),
                    Some(timeout_trampoline::<T>),
                    Some(forget_trampoline::<F>),
                    timeout_ms,
                    keys_ptr,
                    keys.len() as c_int,
                    data,
                    raw::REDISMODULE_BLOCK_UNBLOCK_DELETED as c_int,
                )
            } else {
                api!(RedisModule_BlockClientOnKeys)(
                    self.as_ptr(),
                    Some(retry_trampoline::<R>),
                    Some(timeout_trampoline::<T>),
                    Some(forget_trampoline::<F>),
                    timeout_ms,
                    keys_ptr,
                    keys.len() as c_int,
                    data,
                )
            }
        };
        BlockedClient(handle as usize)
    }
}

/// Whether the server retries a client blocked on a key that does not
/// exist (Redis 7.2 and later, Valkey: `REDISMODULE_BLOCK_UNBLOCK_DELETED`).
/// Before that, a signal of a missing key wakes nobody, and such a waiter
/// is ended through [`unblock`] instead.
pub fn wakes_missing_keys() -> bool {
    // SAFETY: a plain read (copy) of a function pointer set at load.
    let with_flags = unsafe { raw::RedisModule_BlockClientOnKeysWithFlags };
    with_flags.is_some()
}

/// Ends the wait of `client` now: the server runs its `timeout` callback
/// at once, which replies.
pub fn unblock(client: BlockedClient, waiter: u64) {
    // SAFETY: a blocked client the server has not let go of (the caller
    // forgets it when the server does), and the same private data.
    unsafe { api!(RedisModule_UnblockClient)(client.0 as *mut _, waiter as usize as *mut c_void) };
}

/// How long key `key` of database `db` has left: `None` if it does not
/// exist (or has just expired), `Some(None)` if it has no expiry.
pub fn key_ttl_ms(db: i32, key: &[u8]) -> Option<Option<u64>> {
    let ctx = detached();
    let name = Owned::from_bytes(key);
    // SAFETY: the detached context on the main thread, a live string, and
    // the key opened here closed before returning.
    unsafe {
        api!(RedisModule_SelectDb)(ctx, db);
        let key = api!(RedisModule_OpenKey)(ctx, name.as_ptr(), raw::REDISMODULE_READ as c_int);
        if key.is_null() {
            return None;
        }
        let ttl = if api!(RedisModule_KeyType)(key) as isize == raw::REDISMODULE_KEYTYPE_EMPTY {
            None
        } else {
            let ms = api!(RedisModule_GetExpire)(key);
            Some(u64::try_from(ms).ok())
        };
        api!(RedisModule_CloseKey)(key);
        ttl
    }
}

/// The waiter of the blocked call a callback runs for.
fn waiter_of(ctx: &Context) -> u64 {
    // SAFETY: a valid context of a blocked client's callback.
    let data = unsafe { api!(RedisModule_GetBlockedClientPrivateData)(ctx.as_ptr()) };
    data as usize as u64
}

unsafe extern "C" fn retry_trampoline<R>(
    ctx: *mut raw::RedisModuleCtx,
    argv: *mut *mut raw::RedisModuleString,
    argc: c_int,
) -> c_int
where
    R: Fn(&Context, &Argv, u64) -> Result<bool, Error> + Copy + 'static,
{
    // SAFETY: the server calls a blocked client's reply callback with its
    // live context and the call's `argc` live arguments.
    let (ctx, argv) = unsafe { (Context::from_ptr(ctx), Argv::from_raw(argv, argc)) };
    let served = guard::callback(Err(Error::Internal), || {
        function::<R>()(&ctx, &argv, waiter_of(&ctx))
    });
    let served = match served {
        Ok(served) => served,
        Err(error) => {
            // An error ends the wait: it is the call's reply.
            guard::callback((), || ctx.reply_error(&error));
            true
        }
    };
    if served {
        raw::REDISMODULE_OK as c_int
    } else {
        raw::REDISMODULE_ERR as c_int
    }
}

unsafe extern "C" fn timeout_trampoline<T>(
    ctx: *mut raw::RedisModuleCtx,
    argv: *mut *mut raw::RedisModuleString,
    argc: c_int,
) -> c_int
where
    T: Fn(&Context, &Argv, u64) -> Result<(), Error> + Copy + 'static,
{
    // SAFETY: as for `retry_trampoline`: the timeout callback of a blocked
    // client, which must reply.
    let (ctx, argv) = unsafe { (Context::from_ptr(ctx), Argv::from_raw(argv, argc)) };
    let waiter = waiter_of(&ctx);
    guard::command(&ctx, || function::<T>()(&ctx, &argv, waiter));
    raw::REDISMODULE_OK as c_int
}

unsafe extern "C" fn forget_trampoline<F>(_ctx: *mut raw::RedisModuleCtx, data: *mut c_void)
where
    F: Fn(u64) + Copy + 'static,
{
    guard::callback((), || function::<F>()(data as usize as u64));
}

/// Starts a timer that calls `fire(token)` in `ms` milliseconds, on the
/// main thread.
pub fn create_timer<F>(ms: u64, token: u64, fire: F) -> TimerId
where
    F: Fn(u64) + Copy + 'static,
{
    let _ = fire;
    let ms = raw::mstime_t::try_from(ms).unwrap_or(raw::mstime_t::MAX);
    // SAFETY: the detached context, a callback that lives as long as the
    // module, and a number as data (never dereferenced).
    unsafe {
        api!(RedisModule_CreateTimer)(
            detached(),
            ms,
            Some(timer_trampoline::<F>),
            token as usize as *mut c_void,
        )
    }
}

/// Stops a timer that has not fired; whether it was still pending.
pub fn stop_timer(id: TimerId) -> bool {
    let mut data: *mut c_void = ptr::null_mut();
    // SAFETY: the detached context (the module's, which made the timer)
    // and a place for the data, a number that needs no freeing.
    let status = unsafe { api!(RedisModule_StopTimer)(detached(), id, &mut data) };
    status == raw::REDISMODULE_OK as c_int
}

unsafe extern "C" fn timer_trampoline<F>(_ctx: *mut raw::RedisModuleCtx, data: *mut c_void)
where
    F: Fn(u64) + Copy + 'static,
{
    guard::callback((), || function::<F>()(data as usize as u64));
}

/// Tells the server that key `key` of database `db` is ready: the clients
/// blocked on it are retried, in the order they blocked, once the current
/// command or event is done.
pub fn signal_ready(db: i32, key: &[u8]) {
    let ctx = detached();
    let key = Owned::from_bytes(key);
    // SAFETY: the detached context, on the main thread (every caller is a
    // command or a callback of the server), and a live string the server
    // copies.
    unsafe {
        api!(RedisModule_SelectDb)(ctx, db);
        api!(RedisModule_SignalKeyAsReady)(ctx, key.as_ptr());
    }
}

/// Whether this node serves key `key` of database `db` now: always outside
/// a cluster; in a cluster, unless its slot is another node's, or is being
/// migrated away and the key is gone already (where a client's call would
/// be redirected with `-MOVED` or `-ASK`).
pub fn key_served_here(db: i32, key: &[u8]) -> bool {
    let ctx = detached();
    // SAFETY: the detached context on the main thread.
    let flags = unsafe { api!(RedisModule_GetContextFlags)(ctx) } as u32;
    if flags & raw::REDISMODULE_CTX_FLAGS_CLUSTER == 0 {
        return true;
    }
    let name = Owned::from_bytes(key);
    // SAFETY: the detached context on the main thread; "s" takes one live
    // string; the reply, if any, is freed once.
    unsafe {
        api!(RedisModule_SelectDb)(ctx, db);
        let reply = api!(RedisModule_Call)(ctx, c"EXISTS".as_ptr(), c"s".as_ptr(), name.as_ptr());
        if reply.is_null() {
            // The server refuses a call of a key it does not serve (EPERM).
            return std::io::Error::last_os_error().raw_os_error() != Some(libc::EPERM);
        }
        api!(RedisModule_FreeCallReply)(reply);
    }
    true
}

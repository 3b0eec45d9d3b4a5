//! Command handlers: parse, load state, decide, store, propagate, reply.
//! No arithmetic lives here; the decisions come from `crate::limiter`.

pub mod all;
pub mod docs;
pub mod limiter;
pub mod log;
pub mod policy;
pub mod setstate;
pub mod spec;

use std::ffi::CStr;
use std::os::raw::{c_int, c_void};
use std::slice;

use redis_module::raw;

use crate::api;
use crate::datatype::NativeState;
use crate::error::Error;
use crate::limiter::Decision;

/// Most arguments a single-limiter command accepts; more is an error before
/// any parsing, so argument slices live on the stack.
pub const MAX_ARGS: usize = 16;

/// The command's arguments as byte slices, borrowed from Redis's strings;
/// at most `N`, on the stack.
pub struct Args<'a, const N: usize> {
    items: [&'a [u8]; N],
    len: usize,
}

impl<'a, const N: usize> Args<'a, N> {
    /// # Safety
    /// `argv` must hold `argc` valid strings that outlive `'a`.
    pub unsafe fn new(argv: *mut *mut raw::RedisModuleString, argc: c_int) -> Result<Self, Error> {
        let len = usize::try_from(argc).map_err(|_| Error::Arity)?;
        let mut items: [&[u8]; N] = [&[]; N];
        if len > N {
            let extra = unsafe { bytes(*argv.add(N)) };
            return Err(Error::UnknownOption(Error::quote(extra)));
        }
        for (i, item) in items.iter_mut().enumerate().take(len) {
            *item = unsafe { bytes(*argv.add(i)) };
        }
        Ok(Args { items, len })
    }

    pub fn all(&self) -> &[&'a [u8]] {
        &self.items[..self.len]
    }
}

/// All arguments, however many (for commands off the hot path).
///
/// # Safety
/// `argv` must hold `argc` valid strings that outlive `'a`.
pub unsafe fn all_args<'a>(argv: *mut *mut raw::RedisModuleString, argc: c_int) -> Vec<&'a [u8]> {
    (0..argc.max(0) as usize)
        .map(|i| unsafe { bytes(*argv.add(i)) })
        .collect()
}

pub(crate) unsafe fn bytes<'a>(s: *mut raw::RedisModuleString) -> &'a [u8] {
    let mut len = 0usize;
    let ptr = unsafe { api!(RedisModule_StringPtrLen)(s, &mut len) };
    if ptr.is_null() {
        return &[];
    }
    unsafe { slice::from_raw_parts(ptr.cast::<u8>(), len) }
}

/// Whether this call comes from the master link or the AOF being loaded:
/// the only callers allowed to pin the clock or set raw state.
pub fn from_replication_or_loading(ctx: *mut raw::RedisModuleCtx) -> bool {
    let flags = unsafe { api!(RedisModule_GetContextFlags)(ctx) } as u32;
    flags & (raw::REDISMODULE_CTX_FLAGS_REPLICATED | raw::REDISMODULE_CTX_FLAGS_LOADING) != 0
}

/// Whether a new key must not be created: used memory is above `maxmemory`
/// and the server may not evict (`noeviction`). With an eviction policy,
/// Redis has just evicted before running the command, as it does for its own
/// `deny-oom` commands, and what is left above the limit is transient.
pub fn out_of_memory(ctx: *mut raw::RedisModuleCtx) -> bool {
    let flags = unsafe { api!(RedisModule_GetContextFlags)(ctx) } as u32;
    flags & raw::REDISMODULE_CTX_FLAGS_OOM != 0 && !may_evict(ctx)
}

/// `maxmemory-policy` is not `noeviction` (asked only when over the limit).
fn may_evict(ctx: *mut raw::RedisModuleCtx) -> bool {
    let reply = unsafe {
        api!(RedisModule_Call)(
            ctx,
            c"CONFIG".as_ptr(),
            c"cc".as_ptr(),
            c"GET".as_ptr(),
            c"maxmemory-policy".as_ptr(),
        )
    };
    if reply.is_null() {
        return false;
    }
    let mut may = false;
    unsafe {
        if api!(RedisModule_CallReplyLength)(reply) == 2 {
            let value = api!(RedisModule_CallReplyArrayElement)(reply, 1);
            let mut len = 0usize;
            let ptr = api!(RedisModule_CallReplyStringPtr)(value, &mut len);
            if !ptr.is_null() {
                may = slice::from_raw_parts(ptr.cast::<u8>(), len) != b"noeviction";
            }
        }
        api!(RedisModule_FreeCallReply)(reply);
    }
    may
}

/// An open key, closed when dropped.
pub struct Key {
    ptr: *mut raw::RedisModuleKey,
    ctx: *mut raw::RedisModuleCtx,
    name: *mut raw::RedisModuleString,
}

/// What a key holds, seen from one algorithm.
pub enum Slot<S> {
    Empty,
    Ours(*mut S),
}

impl Key {
    pub fn open_rw(ctx: *mut raw::RedisModuleCtx, name: *mut raw::RedisModuleString) -> Key {
        let mode = (raw::REDISMODULE_READ | raw::REDISMODULE_WRITE) as c_int;
        let ptr = unsafe { api!(RedisModule_OpenKey)(ctx, name, mode) };
        Key {
            ptr: ptr.cast(),
            ctx,
            name,
        }
    }

    /// The state of algorithm `S`, nothing, or `WRONGTYPE`.
    pub fn slot<S: NativeState>(&self) -> Result<Slot<S>, Error> {
        let kind = unsafe { api!(RedisModule_KeyType)(self.ptr) } as isize;
        if kind == raw::REDISMODULE_KEYTYPE_EMPTY {
            return Ok(Slot::Empty);
        }
        if kind == raw::REDISMODULE_KEYTYPE_MODULE {
            let ours = S::registered().load(std::sync::atomic::Ordering::Relaxed);
            if unsafe { api!(RedisModule_ModuleTypeGetType)(self.ptr) } == ours {
                let value = unsafe { api!(RedisModule_ModuleTypeGetValue)(self.ptr) };
                return Ok(Slot::Ours(value.cast()));
            }
        }
        Err(Error::WrongType)
    }

    /// Stores a new state, replacing whatever the key held.
    pub fn set<S: NativeState>(&self, state: S) {
        let kind = S::registered().load(std::sync::atomic::Ordering::Relaxed);
        let value: *mut c_void = crate::datatype::into_value(state);
        unsafe { api!(RedisModule_ModuleTypeSetValue)(self.ptr, kind, value) };
    }

    /// Sets the key's absolute expiry, in Unix milliseconds.
    pub fn expire_at(&self, unix_ms: u64) {
        unsafe { api!(RedisModule_SetAbsExpire)(self.ptr, unix_ms as i64) };
    }

    /// The key's expiry in Unix milliseconds, if it has one.
    pub fn expires_at(&self) -> Option<u64> {
        let ms = unsafe { api!(RedisModule_GetAbsExpire)(self.ptr) };
        u64::try_from(ms).ok()
    }

    /// Tells the server the key was written by `event` (a module-class
    /// keyspace event such as `rl.tokenbucket`), and that its expiry was set
    /// when `expiry_written`, as native write commands do: `WATCH` and
    /// client-side caching learn of the change, keyspace notifications get
    /// the command's event, then `expire`.
    pub fn written(&self, event: &CStr, expiry_written: bool) {
        let notify = api!(RedisModule_NotifyKeyspaceEvent);
        unsafe {
            api!(RedisModule_SignalModifiedKey)(self.ctx, self.name);
            notify(
                self.ctx,
                raw::REDISMODULE_NOTIFY_MODULE as c_int,
                event.as_ptr(),
                self.name,
            );
            if expiry_written {
                notify(
                    self.ctx,
                    raw::REDISMODULE_NOTIFY_GENERIC as c_int,
                    c"expire".as_ptr(),
                    self.name,
                );
            }
        }
    }
}

impl Drop for Key {
    fn drop(&mut self) {
        if !self.ptr.is_null() {
            unsafe { api!(RedisModule_CloseKey)(self.ptr) };
        }
    }
}

/// The five-integer reply of every limiter command.
pub fn reply_decision(ctx: *mut raw::RedisModuleCtx, decision: &Decision) {
    reply_decision_and(ctx, decision, None);
}

/// The five integers, and a sixth (`RL.ALL`'s `denied_by`).
pub fn reply_decision_and(ctx: *mut raw::RedisModuleCtx, decision: &Decision, sixth: Option<i64>) {
    let reply = api!(RedisModule_ReplyWithLongLong);
    unsafe {
        api!(RedisModule_ReplyWithArray)(ctx, if sixth.is_some() { 6 } else { 5 });
        reply(ctx, decision.allowed as i64);
        reply(ctx, decision.limit as i64);
        reply(ctx, decision.remaining as i64);
        reply(ctx, decision.wait.as_reply());
        reply(ctx, decision.reset_ms as i64);
        if let Some(value) = sixth {
            reply(ctx, value);
        }
    }
}

/// A HELP reply: one status line per entry.
pub fn reply_lines(ctx: *mut raw::RedisModuleCtx, lines: &[&str]) {
    unsafe { api!(RedisModule_ReplyWithArray)(ctx, lines.len() as i64) };
    for line in lines {
        unsafe { api!(RedisModule_ReplyWithStringBuffer)(ctx, line.as_ptr().cast(), line.len()) };
    }
}

//! An open key: what it holds, its value, its expiry, and the signals a
//! write sends.

use std::ffi::CStr;
use std::os::raw::c_int;
use std::ptr;
use std::sync::atomic::{AtomicPtr, AtomicUsize, Ordering};

use redis_module::raw;

use super::argv::RString;
use super::context::Context;
use super::datatype::{DataType, TypeMethods};
use crate::error::Error;

/// A key opened for reading and writing, closed when dropped.
pub struct Key<'a> {
    ptr: *mut raw::RedisModuleKey,
    ctx: &'a Context,
    name: &'a RString,
}

/// Most keys open at once (`RL.ALL` opens up to 16).
const MAX_OPEN: usize = 32;

/// The names of the keys open now. A key is open at most once: two handles
/// on one key could each lend out its value mutably ([`Key::value`]), so a
/// second `open_key` of an open key is refused. Commands run on the server's
/// main thread, one at a time, so this is the current call's list.
static OPEN: [AtomicPtr<raw::RedisModuleString>; MAX_OPEN] =
    [const { AtomicPtr::new(ptr::null_mut()) }; MAX_OPEN];
static OPEN_LEN: AtomicUsize = AtomicUsize::new(0);

/// Records `name` as open; a panic (caught by the guard) if it already is.
fn check_in(name: &RString) {
    let len = OPEN_LEN.load(Ordering::Relaxed);
    assert!(len < MAX_OPEN, "too many keys open at once");
    for open in &OPEN[..len] {
        // SAFETY: the name of a key still open, which borrows it.
        let open = unsafe { RString::from_ptr(open.load(Ordering::Relaxed)) };
        assert!(
            open.as_bytes() != name.as_bytes(),
            "a key opened twice in one call"
        );
    }
    OPEN[len].store(name.as_ptr(), Ordering::Relaxed);
    OPEN_LEN.store(len + 1, Ordering::Relaxed);
}

/// Forgets `name` (its key is closed).
fn check_out(name: &RString) {
    let len = OPEN_LEN.load(Ordering::Relaxed);
    if let Some(i) = OPEN[..len]
        .iter()
        .position(|o| o.load(Ordering::Relaxed) == name.as_ptr())
    {
        OPEN[i].store(OPEN[len - 1].load(Ordering::Relaxed), Ordering::Relaxed);
        OPEN_LEN.store(len - 1, Ordering::Relaxed);
    }
}

/// What a key holds, seen from one native type.
pub enum Slot<'k, V> {
    Empty,
    Ours(&'k mut V),
}

impl Context {
    /// Opens key `name` for reading and writing (a panic, caught by the
    /// guard, if this call has it open already).
    #[inline]
    pub fn open_key<'a>(&'a self, name: &'a RString) -> Key<'a> {
        check_in(name);
        let mode = (raw::REDISMODULE_READ | raw::REDISMODULE_WRITE) as c_int;
        // SAFETY: a valid context and a live string; the key handle is closed
        // by `Drop`, before the context's call returns.
        let ptr = unsafe { api!(RedisModule_OpenKey)(self.as_ptr(), name.as_ptr(), mode) };
        Key {
            ptr: ptr.cast(),
            ctx: self,
            name,
        }
    }
}

impl Key<'_> {
    /// The value of native type `T` in the key, nothing, or `WRONGTYPE`
    /// (another Redis type, or another native type).
    #[inline]
    pub fn value<T: TypeMethods>(
        &mut self,
        kind: &DataType<T>,
    ) -> Result<Slot<'_, T::Value>, Error> {
        // SAFETY: an open key.
        let held = unsafe { api!(RedisModule_KeyType)(self.ptr) } as isize;
        if held == raw::REDISMODULE_KEYTYPE_EMPTY {
            return Ok(Slot::Empty);
        }
        if held == raw::REDISMODULE_KEYTYPE_MODULE {
            let ours = kind.as_ptr();
            // SAFETY: an open key holding a module value.
            if !ours.is_null() && unsafe { api!(RedisModule_ModuleTypeGetType)(self.ptr) } == ours {
                // SAFETY: the value of a key of type `kind` is a
                // `Box<T::Value>` (`DataType` explains why). No other handle
                // has the key open (`check_in`), and `&mut self` lends the
                // value out once at a time: the reference is the only one.
                let value = unsafe {
                    &mut *api!(RedisModule_ModuleTypeGetValue)(self.ptr).cast::<T::Value>()
                };
                return Ok(Slot::Ours(value));
            }
        }
        Err(Error::WrongType)
    }

    /// Stores `value` as the key's value of type `T`, replacing whatever the
    /// key held.
    pub fn set_value<T: TypeMethods>(&mut self, kind: &DataType<T>, value: T::Value) {
        let ptr = kind.as_ptr();
        assert!(
            !ptr.is_null(),
            "a native type used before it was registered"
        );
        let boxed = Box::into_raw(Box::new(value));
        // SAFETY: an open key and a registered type; the server owns the box
        // from now on and gives it back to `T`'s free callback.
        let status = unsafe { api!(RedisModule_ModuleTypeSetValue)(self.ptr, ptr, boxed.cast()) };
        if status != raw::REDISMODULE_OK as c_int {
            // SAFETY: the server did not take the box: it is still ours.
            drop(unsafe { Box::from_raw(boxed) });
        }
    }

    /// Sets the key's absolute expiry, in Unix milliseconds.
    #[inline]
    pub fn expire_at(&self, unix_ms: u64) {
        // SAFETY: an open key.
        unsafe { api!(RedisModule_SetAbsExpire)(self.ptr, unix_ms as i64) };
    }

    /// The key's expiry in Unix milliseconds, if it has one.
    #[inline]
    pub fn expires_at(&self) -> Option<u64> {
        // SAFETY: an open key.
        let ms = unsafe { api!(RedisModule_GetAbsExpire)(self.ptr) };
        u64::try_from(ms).ok()
    }

    /// Tells the server the key was written by `event` (a module-class
    /// keyspace event such as `rl.tokenbucket`), and that its expiry was set
    /// when `expiry_written`, as native write commands do: `WATCH` and
    /// client-side caching learn of the change, keyspace notifications get
    /// the command's event, then `expire`.
    #[inline]
    pub fn written(&self, event: &CStr, expiry_written: bool) {
        let (ctx, name) = (self.ctx.as_ptr(), self.name.as_ptr());
        let notify = api!(RedisModule_NotifyKeyspaceEvent);
        // SAFETY: a valid context, a live key name and NUL-terminated events.
        unsafe {
            api!(RedisModule_SignalModifiedKey)(ctx, name);
            notify(
                ctx,
                raw::REDISMODULE_NOTIFY_MODULE as c_int,
                event.as_ptr(),
                name,
            );
            if expiry_written {
                notify(
                    ctx,
                    raw::REDISMODULE_NOTIFY_GENERIC as c_int,
                    c"expire".as_ptr(),
                    name,
                );
            }
        }
    }
}

impl Drop for Key<'_> {
    fn drop(&mut self) {
        check_out(self.name);
        if !self.ptr.is_null() {
            // SAFETY: an open key, closed once.
            unsafe { api!(RedisModule_CloseKey)(self.ptr) };
        }
    }
}

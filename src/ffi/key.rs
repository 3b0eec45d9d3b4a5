//! An open key: what it holds, its value, its expiry, and the signals a
//! write sends.

use std::ffi::CStr;
use std::os::raw::c_int;
use std::sync::atomic::{AtomicBool, Ordering};

use redis_module::raw;

use super::argv::RString;
use super::context::Context;
use super::datatype::{with_mut_stored, DataType, Repr, TypeMethods};
use crate::error::Error;

/// A key opened for reading and writing, closed when dropped.
pub struct Key<'a> {
    ptr: *mut raw::RedisModuleKey,
    ctx: &'a Context,
    name: &'a RString,
}

/// Whether a value is lent out now ([`Key::with_value`]). At most one is,
/// in the whole server: a second handle on the same key (or a command called
/// from inside the first) could otherwise lend out the same value again, or
/// free it. Commands run on the server's main thread.
static LENT: AtomicBool = AtomicBool::new(false);

/// Ends a loan, also when its function panics.
struct Loan;

impl Loan {
    #[inline]
    fn start() -> Loan {
        assert!(
            !LENT.load(Ordering::Relaxed),
            "a module value lent out twice"
        );
        LENT.store(true, Ordering::Relaxed);
        Loan
    }
}

impl Drop for Loan {
    #[inline]
    fn drop(&mut self) {
        LENT.store(false, Ordering::Relaxed);
    }
}

/// What a key holds, seen from one native type.
pub enum Slot<'k, V> {
    Empty,
    Ours(&'k mut V),
}

impl Context {
    /// Opens key `name` for reading and writing.
    #[inline]
    pub fn open_key<'a>(&'a self, name: &'a RString) -> Key<'a> {
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
    /// Runs `f` on what the key holds, seen as native type `T`: nothing,
    /// or its value, lent mutably for the call of `f`; or `WRONGTYPE` (another
    /// Redis type, or another native type), without calling `f`.
    #[inline(always)]
    pub fn with_value<T: TypeMethods, R>(
        &self,
        kind: &DataType<T>,
        f: impl FnOnce(Slot<'_, T::Value>) -> R,
    ) -> Result<R, Error> {
        // SAFETY: an open key.
        let held = unsafe { api!(RedisModule_KeyType)(self.ptr) } as isize;
        if held == raw::REDISMODULE_KEYTYPE_EMPTY {
            return Ok(f(Slot::Empty));
        }
        if held == raw::REDISMODULE_KEYTYPE_MODULE {
            let ours = kind.as_ptr();
            // SAFETY: an open key holding a module value.
            if !ours.is_null() && unsafe { api!(RedisModule_ModuleTypeGetType)(self.ptr) } == ours {
                // SAFETY: an open key holding a module value.
                let value = unsafe { api!(RedisModule_ModuleTypeGetValue)(self.ptr) };
                let _loan = Loan::start();
                let store = |moved| {
                    // SAFETY: an open key holding a value of type `kind`,
                    // opened for writing; the old pointer is already freed
                    // (`Repr::with_mut`), so it is not asked back.
                    let status = unsafe {
                        api!(RedisModule_ModuleTypeReplaceValue)(
                            self.ptr,
                            ours,
                            moved,
                            std::ptr::null_mut(),
                        )
                    };
                    assert_eq!(
                        status,
                        raw::REDISMODULE_OK as c_int,
                        "a key's value could not be replaced in place"
                    );
                };
                // SAFETY: the value of a key of type `kind` is a value
                // pointer of `T::Repr` (`DataType` explains why), and no
                // other reference to it exists while `f` runs: one value at
                // a time is lent (`Loan`), `f` cannot keep the reference,
                // and no value is replaced or freed meanwhile (`set_value`
                // refuses, and needs `&mut self` besides). A panic in `f`
                // is resumed once the value's pointer is stored: a value may
                // have moved before it.
                let result = unsafe {
                    with_mut_stored::<T::Value, T::Repr, R>(value, |v| f(Slot::Ours(v)), store)
                };
                return Ok(result);
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
        let value = T::Repr::into_ptr(value);
        // SAFETY: an open key and a registered type; the server owns the
        // value from now on and gives it back to `T`'s free callback.
        let status = unsafe { api!(RedisModule_ModuleTypeSetValue)(self.ptr, ptr, value) };
        if status != raw::REDISMODULE_OK as c_int {
            // SAFETY: the server did not take the value: it is still ours.
            unsafe { T::Repr::free(value) };
        }
    }

    /// Runs `f` on the bytes of the string the key holds: nothing (`None`),
    /// its bytes, or `WRONGTYPE` (any other type, a module value included),
    /// without calling `f`.
    ///
    /// The server hands out a string only as a raw buffer, which it first
    /// makes a plain string of its own if it was encoded otherwise (an
    /// integer, or embedded in its object): the value is the same, only its
    /// encoding in memory changes.
    #[inline(always)]
    pub fn with_string<R>(&self, f: impl FnOnce(&[u8]) -> R) -> Result<Option<R>, Error> {
        // SAFETY: an open key.
        let held = unsafe { api!(RedisModule_KeyType)(self.ptr) } as isize;
        if held == raw::REDISMODULE_KEYTYPE_EMPTY {
            return Ok(None);
        }
        if held != raw::REDISMODULE_KEYTYPE_STRING {
            return Err(Error::WrongType);
        }
        let mut len = 0usize;
        // SAFETY: an open key holding a string; the server writes its length.
        let ptr = unsafe {
            api!(RedisModule_StringDMA)(self.ptr, &mut len, raw::REDISMODULE_READ as c_int)
        };
        if ptr.is_null() {
            return Err(Error::WrongType);
        }
        let _loan = Loan::start();
        // SAFETY: the server's buffer of `len` bytes, valid until the key is
        // written or closed: neither can happen while `f` runs (`set_string`
        // needs `&mut self`, a second loan is refused, and `f` cannot keep
        // the slice).
        let bytes = unsafe { std::slice::from_raw_parts(ptr.cast::<u8>(), len) };
        Ok(Some(f(bytes)))
    }

    /// Makes the key a string holding `bytes` (it held nothing or a
    /// string; its expiry, if any, stays): whether it could (not for a key
    /// of another type). A string of the same length is overwritten in
    /// place, without allocating.
    #[inline]
    pub fn set_string(&mut self, bytes: &[u8]) -> bool {
        let mut len = 0usize;
        // SAFETY: an open key.
        let held = unsafe { api!(RedisModule_KeyType)(self.ptr) } as isize;
        let mut ptr = std::ptr::null_mut();
        if held == raw::REDISMODULE_KEYTYPE_STRING {
            // SAFETY: an open key holding a string, opened for writing; the
            // server writes the string's length.
            ptr = unsafe {
                api!(RedisModule_StringDMA)(self.ptr, &mut len, raw::REDISMODULE_WRITE as c_int)
            };
        }
        if ptr.is_null() || len != bytes.len() {
            // SAFETY: an open key, opened for writing, empty or a string:
            // the server creates or resizes it.
            if unsafe { api!(RedisModule_StringTruncate)(self.ptr, bytes.len()) }
                != raw::REDISMODULE_OK as c_int
            {
                return false;
            }
            // SAFETY: as above; the key is now a string of `bytes.len()`.
            ptr = unsafe {
                api!(RedisModule_StringDMA)(self.ptr, &mut len, raw::REDISMODULE_WRITE as c_int)
            };
        }
        if ptr.is_null() || len != bytes.len() {
            return false;
        }
        // SAFETY: the server's writable buffer of `len` bytes, which nothing
        // else holds; `bytes` is the module's own memory, not the buffer.
        unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), ptr.cast::<u8>(), len) };
        true
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
        if !self.ptr.is_null() {
            // SAFETY: an open key, closed once.
            unsafe { api!(RedisModule_CloseKey)(self.ptr) };
        }
    }
}

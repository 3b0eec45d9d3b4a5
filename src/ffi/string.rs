//! Module strings the module makes itself: the fixed words of the calls it
//! propagates, created once at load, and a cache of the decimal strings of
//! the numbers it propagates most (a policy's parameters), so that
//! propagating allocates nothing per call. The server only takes a reference
//! to a string it propagates.

use std::ffi::CStr;
use std::ptr;
use std::sync::atomic::{AtomicPtr, AtomicU64, Ordering};

use redis_module::raw;

use super::argv::RString;

/// A word made once, at load, and kept for the life of the module.
pub struct SharedString {
    text: &'static CStr,
    string: AtomicPtr<raw::RedisModuleString>,
}

impl SharedString {
    pub const fn new(text: &'static CStr) -> Self {
        SharedString {
            text,
            string: AtomicPtr::new(ptr::null_mut()),
        }
    }

    /// The word.
    #[cfg(any(test, feature = "fuzzing"))]
    pub const fn text(&self) -> &'static CStr {
        self.text
    }

    /// Makes the server string (at load; again is a no-op).
    pub(super) fn create(&self) {
        if !self.string.load(Ordering::Relaxed).is_null() {
            return;
        }
        let text = self.text.to_bytes();
        // SAFETY: a buffer of `text.len()` bytes, copied by the server; a null
        // context makes a string the module owns until it frees it (never).
        let made = unsafe {
            api!(RedisModule_CreateString)(ptr::null_mut(), text.as_ptr().cast(), text.len())
        };
        self.string.store(made, Ordering::Relaxed);
    }

    /// The string (a panic, caught by the guard, if it was never made).
    #[inline(always)]
    pub(super) fn get(&self) -> &'static RString {
        let string = self.string.load(Ordering::Relaxed);
        assert!(
            !string.is_null(),
            "a shared string used before the module loaded"
        );
        // SAFETY: made by `create` and never freed, so valid for the life of
        // the module.
        unsafe { RString::from_ptr(string) }
    }
}

/// A string the module owns, freed when dropped.
pub(super) struct Owned(*mut raw::RedisModuleString);

impl Owned {
    pub(super) fn from_bytes(bytes: &[u8]) -> Owned {
        // SAFETY: the server copies `bytes.len()` bytes; a null context makes
        // a string the module owns (freed by `Drop`).
        Owned(unsafe {
            api!(RedisModule_CreateString)(ptr::null_mut(), bytes.as_ptr().cast(), bytes.len())
        })
    }

    pub(super) fn as_ptr(&self) -> *mut raw::RedisModuleString {
        self.0
    }
}

impl Drop for Owned {
    fn drop(&mut self) {
        if !self.0.is_null() {
            // SAFETY: a string the module made with a null context and still
            // owns; the server keeps its own reference to any it propagated.
            unsafe { api!(RedisModule_FreeString)(ptr::null_mut(), self.0) };
        }
    }
}

/// Slots of the number string cache.
const NUMBER_SLOTS: usize = 128;

/// Strings of recently propagated numbers, direct-mapped by a hash of the
/// value: policies and `RL.ALL` specs use a handful of values over and over,
/// so their strings are made once. Touched only on the main thread.
static NUMBERS: [(AtomicU64, AtomicPtr<raw::RedisModuleString>); NUMBER_SLOTS] =
    [const { (AtomicU64::new(0), AtomicPtr::new(ptr::null_mut())) }; NUMBER_SLOTS];

/// The decimal string of `value`, from the cache, and the string the cache
/// let go of to make room for it, if any: the caller keeps that one until the
/// string it was given is propagated (it may be the same string, when two
/// values of one call share a slot), then drops it.
#[inline]
pub(super) fn number(value: u64) -> (*mut raw::RedisModuleString, Option<Owned>) {
    // Fibonacci hashing: round numbers (1000, 60000, 86400000) spread out.
    let slot = (value.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 57) as usize % NUMBER_SLOTS;
    let (cached_value, cached) = &NUMBERS[slot];
    let string = cached.load(Ordering::Relaxed);
    if !string.is_null() && cached_value.load(Ordering::Relaxed) == value {
        return (string, None);
    }
    // SAFETY: a null context makes a string the module owns; the cache holds
    // it until it evicts it, and hands it to the caller then.
    let made = unsafe {
        api!(RedisModule_CreateStringFromLongLong)(
            ptr::null_mut(),
            value as std::os::raw::c_longlong,
        )
    };
    cached_value.store(value, Ordering::Relaxed);
    cached.store(made, Ordering::Relaxed);
    let evicted = (!string.is_null()).then_some(Owned(string));
    (made, evicted)
}

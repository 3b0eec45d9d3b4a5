//! A command's arguments, borrowed from the server's strings.

use std::marker::PhantomData;
use std::slice;

use redis_module::raw;

use crate::error::Error;

/// A server string (`RedisModuleString`), seen through a shared reference
/// like a `&CStr`: `&RString` is the server's pointer itself, so a slice of
/// them is the server's `argv`, passed back to it without copying.
#[repr(transparent)]
pub struct RString {
    // Opaque and zero-sized, as the server's type is to Rust: a reference to
    // it claims no bytes, so the server may change the string behind it
    // (reference counts) without breaking Rust's aliasing rules.
    _opaque: [u8; 0],
    // Not `Send` or `Sync`: strings belong to the server's main thread.
    _not_send: PhantomData<*mut raw::RedisModuleString>,
}

impl RString {
    /// # Safety
    /// `ptr` is a valid, non-null server string that outlives `'a`.
    #[inline]
    pub(super) unsafe fn from_ptr<'a>(ptr: *mut raw::RedisModuleString) -> &'a RString {
        debug_assert!(!ptr.is_null());
        // SAFETY: `RString` is a zero-sized, 1-aligned view of the string,
        // and the caller promises the pointer is valid for `'a`.
        unsafe { &*ptr.cast::<RString>() }
    }

    /// The server's pointer, to pass back to it.
    #[inline]
    pub(super) fn as_ptr(&self) -> *mut raw::RedisModuleString {
        (self as *const RString).cast_mut().cast()
    }

    /// The string's bytes (no copy).
    #[inline]
    pub fn as_bytes(&self) -> &[u8] {
        let mut len = 0usize;
        // SAFETY: a valid string (the contract of `from_ptr`); the server
        // writes the length and returns its buffer, which lives as long as
        // the string.
        let ptr = unsafe { api!(RedisModule_StringPtrLen)(self.as_ptr(), &mut len) };
        if ptr.is_null() {
            return &[];
        }
        // SAFETY: the server's buffer holds `len` bytes and is not changed
        // while the module holds the string (strings are immutable to the
        // module API but for their reference count).
        unsafe { slice::from_raw_parts(ptr.cast::<u8>(), len) }
    }
}

/// A command's arguments, the command name first, as the server passed them.
#[derive(Clone, Copy)]
pub struct Argv<'a> {
    strings: &'a [&'a RString],
}

impl<'a> Argv<'a> {
    /// # Safety
    /// `argv` holds `argc` valid, non-null strings that outlive `'a`.
    #[inline]
    pub(super) unsafe fn from_raw(argv: *mut *mut raw::RedisModuleString, argc: i32) -> Self {
        let len = usize::try_from(argc).unwrap_or(0);
        if argv.is_null() || len == 0 {
            return Argv { strings: &[] };
        }
        // SAFETY: `&RString` has the layout of the server's pointer (see
        // `RString`), and the caller promises `len` valid, non-null entries
        // that outlive `'a`.
        let strings = unsafe { slice::from_raw_parts(argv.cast::<&'a RString>(), len) };
        Argv { strings }
    }

    /// How many arguments, the command name included.
    #[inline]
    pub fn len(&self) -> usize {
        self.strings.len()
    }

    /// Argument `i` (0 is the command name), as a server string.
    #[inline]
    pub fn string(&self, i: usize) -> &'a RString {
        self.strings[i]
    }

    /// The arguments as byte slices, on the stack: at most `N`, so that the
    /// hot path allocates nothing. More is the error of an unknown option
    /// (the first one beyond `N`), before any parsing.
    #[inline]
    pub fn words<const N: usize>(&self) -> Result<Words<'a, N>, Error> {
        if self.strings.len() > N {
            return Err(Error::UnknownOption(Error::quote(
                self.strings[N].as_bytes(),
            )));
        }
        let mut items: [&'a [u8]; N] = [&[]; N];
        let string_ptr_len = api!(RedisModule_StringPtrLen);
        for (item, string) in items.iter_mut().zip(self.strings) {
            let mut len = 0usize;
            // SAFETY: a valid argument string (see `RString::as_bytes`).
            let ptr = unsafe { string_ptr_len(string.as_ptr(), &mut len) };
            if !ptr.is_null() {
                // SAFETY: as in `RString::as_bytes`: `len` bytes that live as
                // long as the argument.
                *item = unsafe { slice::from_raw_parts(ptr.cast::<u8>(), len) };
            }
        }
        Ok(Words {
            items,
            len: self.strings.len(),
        })
    }

    /// Every argument as byte slices, however many (off the hot path).
    pub fn all_words(&self) -> Vec<&'a [u8]> {
        self.strings.iter().map(|s| s.as_bytes()).collect()
    }
}

/// Arguments as byte slices, at most `N`, on the stack (see [`Argv::words`]).
pub struct Words<'a, const N: usize> {
    items: [&'a [u8]; N],
    len: usize,
}

#[cfg(any(test, feature = "fuzzing"))]
impl<'a, const N: usize> Words<'a, N> {
    /// Arguments that are byte slices already (a host other than the
    /// server's), with the limit of [`Argv::words`].
    pub fn from_slices(words: &[&'a [u8]]) -> Result<Self, Error> {
        if words.len() > N {
            return Err(Error::UnknownOption(Error::quote(words[N])));
        }
        let mut items: [&'a [u8]; N] = [&[]; N];
        items[..words.len()].copy_from_slice(words);
        Ok(Words {
            items,
            len: words.len(),
        })
    }
}

impl<'a, const N: usize> std::ops::Deref for Words<'a, N> {
    type Target = [&'a [u8]];

    #[inline]
    fn deref(&self) -> &[&'a [u8]] {
        &self.items[..self.len]
    }
}

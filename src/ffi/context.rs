//! The context of a call from the server: what the command may ask of it and
//! tell it (flags, replies, propagation, `CONFIG GET`, logging).

use std::ffi::CStr;
use std::os::raw::{c_int, c_long, c_longlong};
use std::slice;

use redis_module::raw;
use smallvec::SmallVec;

use super::argv::RString;
use super::string::{self, Owned, SharedString};
use crate::error::Error;

/// The server's context of one call (a command, an event, the load).
pub struct Context {
    ptr: *mut raw::RedisModuleCtx,
}

/// What the server says of the current call (`RedisModule_GetContextFlags`).
#[derive(Clone, Copy)]
pub struct Flags(u32);

impl Flags {
    fn has(self, flag: u32) -> bool {
        self.0 & flag != 0
    }
    /// The call comes from the master link.
    pub fn replicated(self) -> bool {
        self.has(raw::REDISMODULE_CTX_FLAGS_REPLICATED)
    }
    /// The server is loading (an AOF being replayed, an RDB).
    pub fn loading(self) -> bool {
        self.has(raw::REDISMODULE_CTX_FLAGS_LOADING)
    }
    /// Used memory is above `maxmemory`.
    pub fn out_of_memory(self) -> bool {
        self.has(raw::REDISMODULE_CTX_FLAGS_OOM)
    }
    /// The AOF is on.
    pub fn aof(self) -> bool {
        self.has(raw::REDISMODULE_CTX_FLAGS_AOF)
    }
    /// The server is a replica.
    pub fn replica(self) -> bool {
        self.has(raw::REDISMODULE_CTX_FLAGS_SLAVE)
    }
}

/// One word of a propagated call (see [`Context::replicate`]).
#[derive(Clone, Copy)]
pub enum Word<'a> {
    /// A string the call has (an argument, passed on as it came).
    Str(&'a RString),
    /// A word made at load.
    Shared(&'static SharedString),
    /// A number as a decimal string kept in the module's cache: for values
    /// that repeat across calls (parameters).
    Number(u64),
    /// A number the server writes out (for values that change every call).
    Int(i64),
}

/// Most words of a propagated call built without touching the heap.
const MAX_WORDS: usize = 16;

/// Log levels of the server log.
#[derive(Clone, Copy)]
pub enum Level {
    Notice,
    Warning,
}

impl Context {
    /// # Safety
    /// `ptr` is the context the server passed to the entry point running now,
    /// and the `Context` does not outlive that call.
    #[inline]
    pub(super) unsafe fn from_ptr(ptr: *mut raw::RedisModuleCtx) -> Context {
        Context { ptr }
    }

    #[inline]
    pub(super) fn as_ptr(&self) -> *mut raw::RedisModuleCtx {
        self.ptr
    }

    /// The flags of the current call.
    #[inline]
    pub fn flags(&self) -> Flags {
        // SAFETY: a valid context (the contract of `from_ptr`).
        let flags = unsafe { api!(RedisModule_GetContextFlags)(self.ptr) };
        Flags(flags as u32)
    }

    /// Whether this call comes from the master link or the AOF being loaded:
    /// the only callers allowed to pin the clock or set raw state.
    #[inline]
    pub fn replicated_or_loading(&self) -> bool {
        let flags = self.flags();
        flags.replicated() || flags.loading()
    }

    // ---------------------------------------------------------------------
    // Replies.

    /// An integer reply.
    #[inline]
    pub fn reply_integer(&self, value: i64) {
        // SAFETY: a valid context.
        unsafe { api!(RedisModule_ReplyWithLongLong)(self.ptr, value) };
    }

    /// The header of an array reply of `len` elements (the next `len`
    /// replies).
    #[inline]
    pub fn reply_array(&self, len: usize) {
        // SAFETY: a valid context.
        unsafe { api!(RedisModule_ReplyWithArray)(self.ptr, len as c_long) };
    }

    /// An array of integers.
    #[inline]
    pub fn reply_integers(&self, values: &[i64]) {
        self.reply_array(values.len());
        let reply = api!(RedisModule_ReplyWithLongLong);
        for &value in values {
            // SAFETY: a valid context.
            unsafe { reply(self.ptr, value) };
        }
    }

    /// A bulk string reply (the server copies the bytes).
    #[inline]
    pub fn reply_bulk(&self, bytes: &[u8]) {
        // SAFETY: a valid context and `bytes.len()` readable bytes.
        unsafe {
            api!(RedisModule_ReplyWithStringBuffer)(self.ptr, bytes.as_ptr().cast(), bytes.len())
        };
    }

    /// A status reply (`+OK`).
    #[inline]
    pub fn reply_simple(&self, status: &CStr) {
        // SAFETY: a valid context and a NUL-terminated string.
        unsafe { api!(RedisModule_ReplyWithSimpleString)(self.ptr, status.as_ptr()) };
    }

    /// A null reply.
    #[inline]
    pub fn reply_null(&self) {
        // SAFETY: a valid context.
        unsafe { api!(RedisModule_ReplyWithNull)(self.ptr) };
    }

    /// The error reply of `error`: the server's own arity error, or the
    /// error's message.
    pub fn reply_error(&self, error: &Error) {
        if *error == Error::Arity {
            // Redis's own wording: "wrong number of arguments for '<cmd>' command".
            // SAFETY: a valid context.
            unsafe { api!(RedisModule_WrongArity)(self.ptr) };
            return;
        }
        let mut message = error.message().into_bytes();
        message.retain(|&b| b != 0);
        message.push(0);
        // SAFETY: a valid context and a NUL-terminated message, copied by the
        // server.
        unsafe { api!(RedisModule_ReplyWithError)(self.ptr, message.as_ptr().cast()) };
    }

    // ---------------------------------------------------------------------
    // Propagation.

    /// Reports the call to replicas and the AOF as the client sent it.
    #[inline]
    pub fn replicate_verbatim(&self) {
        // SAFETY: a valid context.
        unsafe { api!(RedisModule_ReplicateVerbatim)(self.ptr) };
    }

    /// Propagates `command words...` to replicas and the AOF.
    ///
    /// Strings are passed by reference (the server takes its own), so the
    /// common shapes (strings, then an integer, possibly twice) allocate
    /// nothing of the module's; any other shape makes strings of its
    /// integers first.
    pub fn replicate(&self, command: &CStr, words: &[Word]) {
        let mut strings: SmallVec<[*mut raw::RedisModuleString; MAX_WORDS]> = SmallVec::new();
        // Strings the number cache let go of during this call: one of them
        // may be a string this call uses, so they go only once it is sent.
        let mut evicted: SmallVec<[Owned; 4]> = SmallVec::new();
        // The words as runs of strings, each ended by an integer: (end of
        // the run in `strings`, the integer after it).
        let mut runs: SmallVec<[(usize, Option<i64>); 3]> = SmallVec::new();
        for word in words {
            let string = match *word {
                Word::Str(s) => s.as_ptr(),
                Word::Shared(s) => s.get().as_ptr(),
                Word::Number(value) => {
                    let (string, old) = string::number(value);
                    evicted.extend(old);
                    string
                }
                Word::Int(value) => {
                    runs.push((strings.len(), Some(value)));
                    continue;
                }
            };
            strings.push(string);
        }
        if runs.last().is_none_or(|&(end, _)| end != strings.len()) {
            runs.push((strings.len(), None));
        }
        let replicate = api!(RedisModule_Replicate);
        let (name, all) = (command.as_ptr(), strings.as_ptr());
        // SAFETY: a valid context; every string pointer is a live string (the
        // caller's, a shared one, or the cache's, kept alive by `evicted`);
        // each format letter has its argument: `v` a pointer and a count
        // within `strings`, `l` a long long.
        unsafe {
            match runs.as_slice() {
                [(a, None)] if *a > 0 => {
                    replicate(self.ptr, name, c"v".as_ptr(), all, *a);
                }
                [(a, Some(x))] if *a > 0 => {
                    replicate(self.ptr, name, c"vl".as_ptr(), all, *a, *x as c_longlong);
                }
                // `COST n AT t`: the second run is one word.
                [(a, Some(x)), (b, Some(y))] if *a > 0 && *b == a + 1 => {
                    replicate(
                        self.ptr,
                        name,
                        c"vlsl".as_ptr(),
                        all,
                        *a,
                        *x as c_longlong,
                        strings[*a],
                        *y as c_longlong,
                    );
                }
                [(a, Some(x)), (b, Some(y))] if *a > 0 && b > a => {
                    replicate(
                        self.ptr,
                        name,
                        c"vlvl".as_ptr(),
                        all,
                        *a,
                        *x as c_longlong,
                        all.add(*a),
                        b - a,
                        *y as c_longlong,
                    );
                }
                _ => self.replicate_as_strings(command, words),
            }
        }
        drop(evicted);
    }

    /// [`Context::replicate`] for any shape: every word as a string.
    fn replicate_as_strings(&self, command: &CStr, words: &[Word]) {
        let owned: Vec<Option<Owned>> = words
            .iter()
            .map(|word| match *word {
                Word::Number(value) => Some(Owned::from_bytes(value.to_string().as_bytes())),
                Word::Int(value) => Some(Owned::from_bytes(value.to_string().as_bytes())),
                Word::Str(_) | Word::Shared(_) => None,
            })
            .collect();
        let strings: Vec<*mut raw::RedisModuleString> = words
            .iter()
            .zip(&owned)
            .map(|(word, owned)| match (word, owned) {
                (_, Some(owned)) => owned.as_ptr(),
                (Word::Str(s), None) => s.as_ptr(),
                (Word::Shared(s), None) => s.get().as_ptr(),
                _ => unreachable!("numbers are owned"),
            })
            .collect();
        // SAFETY: a valid context and `strings.len()` live strings (the
        // owned ones are freed after the server took its references).
        unsafe {
            api!(RedisModule_Replicate)(
                self.ptr,
                command.as_ptr(),
                c"v".as_ptr(),
                strings.as_ptr(),
                strings.len(),
            )
        };
    }

    // ---------------------------------------------------------------------
    // Keys of a call, for cluster routing and ACLs.

    /// Whether the server asks where the keys of this call are (the
    /// `getkeys-api` flag), instead of running it.
    #[inline]
    pub fn is_keys_position_request(&self) -> bool {
        // SAFETY: a valid context.
        unsafe { api!(RedisModule_IsKeysPositionRequest)(self.ptr) != 0 }
    }

    /// Declares argument `position` a key (in a keys position request).
    #[inline]
    pub fn key_at(&self, position: usize) {
        // SAFETY: a valid context; the server ignores positions outside argv.
        unsafe { api!(RedisModule_KeyAtPos)(self.ptr, position as c_int) };
    }

    // ---------------------------------------------------------------------
    // Asking the server.

    /// The value of server config `name` (`CONFIG GET name`), read by `read`.
    pub fn config_get<R>(&self, name: &CStr, read: impl FnOnce(&[u8]) -> R) -> Option<R> {
        // SAFETY: a valid context; "cc" takes two NUL-terminated strings.
        let reply = unsafe {
            api!(RedisModule_Call)(
                self.ptr,
                c"CONFIG".as_ptr(),
                c"cc".as_ptr(),
                c"GET".as_ptr(),
                name.as_ptr(),
            )
        };
        if reply.is_null() {
            return None;
        }
        let mut value = None;
        // SAFETY: `reply` is the live reply of the call above; an element of
        // an array of two is a live reply, and a string pointer of it holds
        // `len` bytes until the reply is freed, which happens last.
        unsafe {
            if api!(RedisModule_CallReplyLength)(reply) == 2 {
                let element = api!(RedisModule_CallReplyArrayElement)(reply, 1);
                let mut len = 0usize;
                let ptr = api!(RedisModule_CallReplyStringPtr)(element, &mut len);
                if !ptr.is_null() {
                    value = Some(read(slice::from_raw_parts(ptr.cast::<u8>(), len)));
                }
            }
            api!(RedisModule_FreeCallReply)(reply);
        }
        value
    }

    /// Integer fields of INFO section `section`, `None` for each one the
    /// server does not have, or `None` if it cannot tell.
    pub fn server_info<const N: usize>(
        &self,
        section: &CStr,
        fields: [&CStr; N],
    ) -> Option<[Option<i64>; N]> {
        // SAFETY: a valid context and a NUL-terminated section name.
        let info = unsafe { api!(RedisModule_GetServerInfo)(self.ptr, section.as_ptr()) };
        if info.is_null() {
            return None;
        }
        let values = fields.map(|name| {
            let mut err: c_int = 0;
            // SAFETY: `info` is live until freed below; a NUL-terminated name.
            let value = unsafe {
                api!(RedisModule_ServerInfoGetFieldSigned)(info, name.as_ptr(), &mut err)
            };
            (err == 0).then_some(value)
        });
        // SAFETY: the data the server gave above, freed once.
        unsafe { api!(RedisModule_FreeServerInfo)(self.ptr, info) };
        Some(values)
    }

    /// Writes `message` to the server log (nothing if the server has no log
    /// function, as when it is gone).
    pub fn log(&self, level: Level, message: &str) {
        // SAFETY: a plain read of a function pointer set at load.
        let Some(log) = (unsafe { raw::RedisModule_Log }) else {
            return;
        };
        let mut text = message.as_bytes().to_vec();
        text.retain(|&b| b != 0);
        text.push(0);
        let level = match level {
            Level::Notice => c"notice",
            Level::Warning => c"warning",
        };
        // SAFETY: a valid context; "%s" takes one NUL-terminated string.
        unsafe { log(self.ptr, level.as_ptr(), c"%s".as_ptr(), text.as_ptr()) };
    }
}

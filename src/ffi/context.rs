//! The context of a call from the server: what the command may ask of it and
//! tell it (flags, replies, propagation, `CONFIG GET`, logging).

use std::ffi::CStr;
use std::os::raw::{c_int, c_long, c_longlong};
use std::slice;

use redis_module::raw;

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
    /// The flags as the server gives them.
    pub(super) fn bits(self) -> u32 {
        self.0
    }
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

/// The words of a propagated call after the command name, before its tail
/// (see [`Context::replicate`]).
#[derive(Clone, Copy)]
pub enum Head<'a> {
    /// Strings the call has (its key and parameters, passed on as they came).
    Strings(&'a [&'a RString]),
    /// A key, then numbers as decimal strings the module keeps from call to
    /// call (a policy's parameters, which repeat): at most [`MAX_NUMBERS`].
    KeyAndNumbers(&'a RString, &'a [u64]),
}

/// Most numbers of a [`Head::KeyAndNumbers`].
pub const MAX_NUMBERS: usize = 3;

/// One word of the tail of a propagated call (see [`Context::replicate`]).
#[derive(Clone, Copy)]
pub enum Word {
    /// A word made at load.
    Shared(&'static SharedString),
    /// A number the server writes out (for values that change every call).
    Int(i64),
}

impl Word {
    /// The word as text (a number in decimal).
    #[cfg(any(test, feature = "fuzzing"))]
    pub fn text(self) -> Vec<u8> {
        match self {
            Word::Shared(s) => s.text().to_bytes().to_vec(),
            Word::Int(n) => n.to_string().into_bytes(),
        }
    }

    /// The string of a string word.
    #[inline(always)]
    fn string(&self) -> Option<*mut raw::RedisModuleString> {
        match *self {
            Word::Shared(s) => Some(s.get().as_ptr()),
            Word::Int(_) => None,
        }
    }
}

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

    /// Propagates `command head... tail...` to replicas and the AOF.
    ///
    /// Strings are passed by reference (the server takes its own), so the
    /// tails of a pinned limiter call (`COST 1 AT t`, `COST n AT t`, `COST n
    /// FORCE AT t`, `REFUND n AT t`, and `<value> PXAT ms` after `SET key`)
    /// allocate nothing of the module's; any other tail makes strings of its
    /// integers first.
    #[inline(always)]
    pub fn replicate(&self, command: &CStr, head: Head, tail: &[Word]) {
        match head {
            Head::Strings(strings) => {
                // `&RString` has the layout of the server's pointer.
                self.replicate_vector(command, strings.as_ptr().cast(), strings.len(), head, tail);
            }
            Head::KeyAndNumbers(key, numbers) => {
                assert!(
                    numbers.len() <= MAX_NUMBERS,
                    "too many numbers in a propagated call"
                );
                let mut strings = [key.as_ptr(); 1 + MAX_NUMBERS];
                // Strings the cache lets go of: one may be a string this call
                // uses, so they are freed only once it is sent.
                let mut evicted: [Option<Owned>; MAX_NUMBERS] = [const { None }; MAX_NUMBERS];
                for ((slot, old), &value) in strings[1..].iter_mut().zip(&mut evicted).zip(numbers)
                {
                    (*slot, *old) = string::number(value);
                }
                self.replicate_vector(command, strings.as_ptr(), 1 + numbers.len(), head, tail);
                drop(evicted);
            }
        }
    }

    /// [`Context::replicate`] with the head's `len` strings at `head_strings`.
    #[inline(always)]
    fn replicate_vector(
        &self,
        command: &CStr,
        head_strings: *const *mut raw::RedisModuleString,
        len: usize,
        head: Head,
        tail: &[Word],
    ) {
        let replicate = api!(RedisModule_Replicate);
        let name = command.as_ptr();
        // SAFETY: a valid context; `head_strings` holds `len` live strings,
        // every string of the tail is live, and each format letter has its
        // argument: `v` a pointer and a count, `s` a string, `l` a long long.
        unsafe {
            match *tail {
                [a, Word::Int(n), b, Word::Int(t)] => match (a.string(), b.string()) {
                    (Some(a), Some(b)) => {
                        replicate(
                            self.ptr,
                            name,
                            c"vslsl".as_ptr(),
                            head_strings,
                            len,
                            a,
                            n as c_longlong,
                            b,
                            t as c_longlong,
                        );
                    }
                    _ => self.replicate_as_strings(command, head, tail),
                },
                [a, Word::Int(n), b, c, Word::Int(t)] => match (a.string(), b.string(), c.string())
                {
                    (Some(a), Some(b), Some(c)) => {
                        replicate(
                            self.ptr,
                            name,
                            c"vslssl".as_ptr(),
                            head_strings,
                            len,
                            a,
                            n as c_longlong,
                            b,
                            c,
                            t as c_longlong,
                        );
                    }
                    _ => self.replicate_as_strings(command, head, tail),
                },
                // `SET key <value> PXAT <ms>` (CL.THROTTLE).
                [Word::Int(n), b, Word::Int(t)] => match b.string() {
                    Some(b) => {
                        replicate(
                            self.ptr,
                            name,
                            c"vlsl".as_ptr(),
                            head_strings,
                            len,
                            n as c_longlong,
                            b,
                            t as c_longlong,
                        );
                    }
                    None => self.replicate_as_strings(command, head, tail),
                },
                [a, b, c, Word::Int(t)] => match (a.string(), b.string(), c.string()) {
                    (Some(a), Some(b), Some(c)) => {
                        replicate(
                            self.ptr,
                            name,
                            c"vsssl".as_ptr(),
                            head_strings,
                            len,
                            a,
                            b,
                            c,
                            t as c_longlong,
                        );
                    }
                    _ => self.replicate_as_strings(command, head, tail),
                },
                _ => self.replicate_as_strings(command, head, tail),
            }
        }
    }

    /// [`Context::replicate`] for any tail: every word as a string.
    fn replicate_as_strings(&self, command: &CStr, head: Head, tail: &[Word]) {
        let mut owned = Vec::new();
        let mut strings: Vec<*mut raw::RedisModuleString> = Vec::new();
        let mut own = |bytes: &[u8], strings: &mut Vec<_>| {
            let string = Owned::from_bytes(bytes);
            strings.push(string.as_ptr());
            owned.push(string);
        };
        match head {
            Head::Strings(head) => strings.extend(head.iter().map(|s| s.as_ptr())),
            Head::KeyAndNumbers(key, numbers) => {
                strings.push(key.as_ptr());
                for n in numbers {
                    own(n.to_string().as_bytes(), &mut strings);
                }
            }
        }
        for word in tail {
            match (word.string(), *word) {
                (Some(string), _) => strings.push(string),
                (None, Word::Int(n)) => own(n.to_string().as_bytes(), &mut strings),
                (None, _) => unreachable!("every other word is a string"),
            }
        }
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
        drop(owned);
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

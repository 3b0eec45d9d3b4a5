//! The one panic guard every `extern "C"` entry point goes through.
//!
//! A Rust panic unwinding into redis-server's C frames would abort the whole
//! server. Every command handler and type callback therefore runs inside
//! [`catch_unwind`]: a command answers an error reply instead (having changed
//! nothing, since every handler writes only after it has decided), and a type
//! callback returns its failure value.

use std::os::raw::c_int;
use std::panic::{catch_unwind, AssertUnwindSafe};

use redis_module::raw;

use crate::error::Error;

/// Calls a Redis module API function by name, panicking (inside the guard) if
/// the server does not provide it.
#[macro_export]
macro_rules! api {
    ($name:ident) => {{
        #[allow(unused_unsafe)]
        // SAFETY: a plain read of a function pointer Redis set at module load.
        let function = unsafe { redis_module::raw::$name };
        match function {
            Some(f) => f,
            None => panic!(concat!(
                stringify!($name),
                " is not provided by this server"
            )),
        }
    }};
}

/// Runs a command body; its error (or a caught panic) becomes the error reply.
pub fn command(ctx: *mut raw::RedisModuleCtx, body: impl FnOnce() -> Result<(), Error>) -> c_int {
    let outcome = catch_unwind(AssertUnwindSafe(body)).unwrap_or(Err(Error::Internal));
    if let Err(error) = outcome {
        // Replying may itself fail only on a broken server; never unwind from here.
        let _ = catch_unwind(AssertUnwindSafe(|| reply_error(ctx, &error)));
    }
    raw::REDISMODULE_OK as c_int
}

/// Runs a type callback; a caught panic yields `failed`.
pub fn callback<T>(failed: T, body: impl FnOnce() -> T) -> T {
    catch_unwind(AssertUnwindSafe(body)).unwrap_or(failed)
}

fn reply_error(ctx: *mut raw::RedisModuleCtx, error: &Error) {
    if *error == Error::Arity {
        // Redis's own wording: "wrong number of arguments for '<cmd>' command".
        unsafe { api!(RedisModule_WrongArity)(ctx) };
        return;
    }
    let mut message = error.message().into_bytes();
    message.retain(|&b| b != 0);
    message.push(0);
    unsafe { api!(RedisModule_ReplyWithError)(ctx, message.as_ptr().cast()) };
}

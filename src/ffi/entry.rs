//! Safe Rust functions as `extern "C"` entry points.
//!
//! A command is a plain function `fn(&Context, &Argv) -> Result<(), Error>`;
//! [`command`] turns it into what the server calls: one `extern "C"`
//! trampoline per function, made by the compiler from one generic, which
//! wraps the raw arguments and runs the function under the panic guard.
//! The function is not stored anywhere: a function item's type names it,
//! so the trampoline needs no pointer to it, and the call inlines.

use std::os::raw::c_int;

use redis_module::raw;

use super::argv::Argv;
use super::context::Context;
use super::guard;
use crate::error::Error;

/// What the server calls for a command.
pub(super) type RawCommand = unsafe extern "C" fn(
    *mut raw::RedisModuleCtx,
    *mut *mut raw::RedisModuleString,
    c_int,
) -> c_int;

/// A command's entry point, for a row of a command table.
#[derive(Clone, Copy)]
pub struct Handler(pub(super) RawCommand);

/// The entry point of command `run`, a function item (or a closure that
/// captures nothing).
pub const fn command<F>(run: F) -> Handler
where
    F: Fn(&Context, &Argv) -> Result<(), Error> + Copy + 'static,
{
    let _ = run;
    Handler(command_trampoline::<F>)
}

unsafe extern "C" fn command_trampoline<F>(
    ctx: *mut raw::RedisModuleCtx,
    argv: *mut *mut raw::RedisModuleString,
    argc: c_int,
) -> c_int
where
    F: Fn(&Context, &Argv) -> Result<(), Error> + Copy + 'static,
{
    // SAFETY: the server calls a command with its live context and `argc`
    // live arguments, for the duration of this call.
    let (ctx, argv) = unsafe { (Context::from_ptr(ctx), Argv::from_raw(argv, argc)) };
    let run = function::<F>();
    guard::command(&ctx, || run(&ctx, &argv));
    raw::REDISMODULE_OK as c_int
}

/// The function whose type is `F`: a function item or a closure capturing
/// nothing, whose value carries no data (a compile-time check).
#[inline]
pub(super) fn function<F: Copy + 'static>() -> F {
    const {
        assert!(
            std::mem::size_of::<F>() == 0,
            "only a function item can be an entry point"
        )
    };
    // SAFETY: `F` is zero-sized (checked above) and `Copy`, so it has no
    // bytes to be invalid and no destructor: its one value is the function
    // itself, which this conjures, as the compiler would to call it.
    unsafe { std::mem::transmute_copy::<(), F>(&()) }
}

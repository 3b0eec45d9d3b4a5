//! `RL.LOG GET [count]`, `RL.LOG LEN`, `RL.LOG RESET`: the deny log, read
//! like SLOWLOG.

use std::os::raw::c_int;

use redis_module::raw;

use super::all_args;
use super::docs::{Arg, Subcommand};
use crate::api;
use crate::args::parse_int;
use crate::deny_log;
use crate::error::Error;
use crate::guard;

/// Entries `RL.LOG GET` returns without a count (like SLOWLOG GET).
const DEFAULT_COUNT: u64 = 10;

/// The subcommands of `RL.LOG`, with what `COMMAND DOCS` says of each.
/// Like SLOWLOG, they read module state, not keys, and work on replicas and
/// while loading.
pub const SUBCOMMANDS: [Subcommand; 4] = [
    Subcommand {
        name: c"HELP",
        handler: help_handler,
        flags: c"allow-loading allow-stale fast",
        arity: 2,
        summary: c"Shows helpful text about the different subcommands",
        complexity: c"O(1)",
        args: &[],
    },
    Subcommand {
        name: c"GET",
        handler: get_handler,
        flags: c"admin allow-loading allow-stale",
        arity: -2,
        summary: c"Returns the most recent denials, newest first",
        complexity: c"O(N) where N is the number of entries returned",
        args: &[Arg::integer(c"count")
            .optional()
            .summary(c"how many entries at most (default 10)")],
    },
    Subcommand {
        name: c"LEN",
        handler: len_handler,
        flags: c"admin allow-loading allow-stale fast",
        arity: 2,
        summary: c"Returns the number of entries in the deny log",
        complexity: c"O(1)",
        args: &[],
    },
    Subcommand {
        name: c"RESET",
        handler: reset_handler,
        flags: c"admin allow-loading allow-stale",
        arity: 2,
        summary: c"Empties the deny log",
        complexity: c"O(N) where N is the number of entries in the deny log",
        args: &[],
    },
];

/// # Safety
/// Called by Redis with a valid context and `argc` arguments.
pub unsafe extern "C" fn get_handler(
    ctx: *mut raw::RedisModuleCtx,
    argv: *mut *mut raw::RedisModuleString,
    argc: c_int,
) -> c_int {
    guard::command(ctx, || {
        let args = unsafe { all_args(argv, argc) };
        let count = match args.get(2) {
            Some(text) => parse_int(text, "count", 0, u64::from(u32::MAX))?,
            None => DEFAULT_COUNT,
        };
        if args.len() > 3 {
            return Err(Error::Arity);
        }
        let entries = deny_log::recent(count as usize);
        unsafe {
            api!(RedisModule_ReplyWithArray)(ctx, entries.len() as i64);
            for e in entries {
                api!(RedisModule_ReplyWithArray)(ctx, 6);
                api!(RedisModule_ReplyWithLongLong)(ctx, e.id as i64);
                api!(RedisModule_ReplyWithLongLong)(ctx, e.unix_ms as i64);
                api!(RedisModule_ReplyWithStringBuffer)(ctx, e.key.as_ptr().cast(), e.key.len());
                api!(RedisModule_ReplyWithStringBuffer)(
                    ctx,
                    e.source.as_ptr().cast(),
                    e.source.len(),
                );
                api!(RedisModule_ReplyWithLongLong)(ctx, e.cost as i64);
                api!(RedisModule_ReplyWithLongLong)(ctx, e.wait_ms);
            }
        }
        Ok(())
    })
}

/// # Safety
/// Called by Redis with a valid context and `argc` arguments.
pub unsafe extern "C" fn len_handler(
    ctx: *mut raw::RedisModuleCtx,
    _argv: *mut *mut raw::RedisModuleString,
    _argc: c_int,
) -> c_int {
    guard::command(ctx, || {
        unsafe { api!(RedisModule_ReplyWithLongLong)(ctx, deny_log::len() as i64) };
        Ok(())
    })
}

/// # Safety
/// Called by Redis with a valid context and `argc` arguments.
pub unsafe extern "C" fn reset_handler(
    ctx: *mut raw::RedisModuleCtx,
    _argv: *mut *mut raw::RedisModuleString,
    _argc: c_int,
) -> c_int {
    guard::command(ctx, || {
        deny_log::reset();
        unsafe { api!(RedisModule_ReplyWithSimpleString)(ctx, c"OK".as_ptr()) };
        Ok(())
    })
}

/// # Safety
/// Called by Redis with a valid context and `argc` arguments.
pub unsafe extern "C" fn help_handler(
    ctx: *mut raw::RedisModuleCtx,
    _argv: *mut *mut raw::RedisModuleString,
    _argc: c_int,
) -> c_int {
    guard::command(ctx, || {
        super::reply_lines(
            ctx,
            &[
                "RL.LOG GET [<count>]",
                "    The most recent denials, newest first (default 10): id, unix time in ms, key, command or policy, cost, wait_ms.",
                "RL.LOG LEN",
                "    How many denials the log holds (at most ratelimit.log-max-len).",
                "RL.LOG RESET",
                "    Empty the log (ids keep growing).",
            ],
        );
        Ok(())
    })
}

//! `RL.LOG GET [count]`, `RL.LOG LEN`, `RL.LOG RESET`: the deny log, read
//! like SLOWLOG.

use super::host::Host;
use super::live::live;
use super::reply_lines;
use crate::args::parse_int;
use crate::deny_log;
use crate::error::Error;
use crate::ffi::{command, Arg, Subcommand};

/// Entries `RL.LOG GET` returns without a count (like SLOWLOG GET).
const DEFAULT_COUNT: u64 = 10;

/// The subcommands of `RL.LOG`, with what `COMMAND DOCS` says of each.
/// Like SLOWLOG, they read module state, not keys, and work on replicas and
/// while loading.
pub const SUBCOMMANDS: [Subcommand; 4] = [
    Subcommand {
        name: c"HELP",
        handler: command(live!(help)),
        flags: c"allow-loading allow-stale fast",
        arity: 2,
        summary: c"Shows helpful text about the different subcommands",
        complexity: c"O(1)",
        args: &[],
    },
    Subcommand {
        name: c"GET",
        handler: command(live!(get)),
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
        handler: command(live!(len)),
        flags: c"admin allow-loading allow-stale fast",
        arity: 2,
        summary: c"Returns the number of entries in the deny log",
        complexity: c"O(1)",
        args: &[],
    },
    Subcommand {
        name: c"RESET",
        handler: command(live!(reset)),
        flags: c"admin allow-loading allow-stale",
        arity: 2,
        summary: c"Empties the deny log",
        complexity: c"O(N) where N is the number of entries in the deny log",
        args: &[],
    },
];

/// `RL.LOG GET [count]`
pub(super) fn get<H: Host>(host: &H) -> Result<(), Error> {
    let args = host.all_words();
    let count = match args.get(2) {
        Some(text) => parse_int(text, "count", 0, u64::from(u32::MAX))?,
        None => DEFAULT_COUNT,
    };
    if args.len() > 3 {
        return Err(Error::Arity);
    }
    let entries = deny_log::recent(count as usize);
    host.reply_array(entries.len());
    for e in entries {
        host.reply_array(6);
        host.reply_integer(e.id as i64);
        host.reply_integer(e.unix_ms as i64);
        host.reply_bulk(&e.key);
        host.reply_bulk(&e.source);
        host.reply_integer(e.cost as i64);
        host.reply_integer(e.wait_ms);
    }
    Ok(())
}

/// `RL.LOG LEN`
pub(super) fn len<H: Host>(host: &H) -> Result<(), Error> {
    host.reply_integer(deny_log::len() as i64);
    Ok(())
}

/// `RL.LOG RESET`
pub(super) fn reset<H: Host>(host: &H) -> Result<(), Error> {
    deny_log::reset();
    host.reply_simple(c"OK");
    Ok(())
}

/// `RL.LOG HELP`
pub(super) fn help<H: Host>(host: &H) -> Result<(), Error> {
    reply_lines(
        host,
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
}

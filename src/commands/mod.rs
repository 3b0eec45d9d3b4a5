//! Command handlers: parse, load state, decide, store, propagate, reply.
//! No arithmetic lives here; the decisions come from `crate::limiter`.
//!
//! Every handler is a step generic over the server it runs on,
//! `fn step<H: Host>(host: &H) -> Result<(), Error>` (`host.rs`, the command
//! seam). The module registers each step on the live server (`live.rs`);
//! unit tests and the fuzz targets run the very same steps on an in-memory
//! key space (`memory.rs`).

pub mod all;
mod apply;
pub mod host;
pub mod lease;
pub mod limiter;
pub mod live;
pub mod log;
#[cfg(any(test, feature = "fuzzing"))]
#[cfg_attr(not(test), allow(dead_code))] // the unit tests use all of it
pub mod memory;
pub mod policy;
pub mod setstate;
mod step;
#[cfg(test)]
mod tests_steps;
pub mod throttle;
mod wait;

use crate::algorithms::{Companion, Listed, ReplyShape};
use crate::args::{BLOCK, COST, COST_REFUND_OR_UPTO, UPTO};
use crate::ffi::{command, Arg, Command, KeySpec};
use crate::limiter::Decision;
use host::Host;
use live::live;

/// Most arguments a single-limiter command accepts; more is an error before
/// any parsing, so argument slices live on the stack.
pub const MAX_ARGS: usize = 16;

impl ReplyShape {
    /// Replies `decision` in this shape (`lease`: the lease granted, 0 if
    /// none, for the shapes that show it).
    #[inline(always)]
    pub fn send<H: Host>(self, host: &H, decision: &Decision, lease: u64) {
        match self {
            ReplyShape::Decision => host.reply_integers(&decision_fields(decision)),
            ReplyShape::Lease => reply_decision_and(host, decision, lease as i64),
        }
    }
}

/// The five integers, and a sixth (`RL.ALL`'s `denied_by`).
pub fn reply_decision_and<H: Host>(host: &H, decision: &Decision, sixth: i64) {
    let [a, b, c, d, e] = decision_fields(decision);
    host.reply_integers(&[a, b, c, d, e, sixth]);
}

/// The five integers, then `RL.ALL`'s `denied_by` and `UPTO`'s `granted`.
pub fn reply_decision_and_two<H: Host>(host: &H, decision: &Decision, sixth: i64, seventh: i64) {
    let [a, b, c, d, e] = decision_fields(decision);
    host.reply_integers(&[a, b, c, d, e, sixth, seventh]);
}

/// A decision's five integers: `allowed limit remaining wait_ms reset_ms`.
pub(crate) fn decision_fields(decision: &Decision) -> [i64; 5] {
    [
        decision.allowed as i64,
        decision.limit as i64,
        decision.remaining as i64,
        decision.wait.as_reply(),
        decision.reset_ms as i64,
    ]
}

/// A HELP reply: one line per entry.
pub fn reply_lines<H: Host>(host: &H, lines: &[&str]) {
    host.reply_array(lines.len());
    for line in lines {
        host.reply_bulk(line.as_bytes());
    }
}

/// The commands beside the algorithms' own (which come from the table of
/// algorithms) and the containers `RL.POLICY` and `RL.LOG` (whose
/// subcommands are in their files).
pub const COMMANDS: &[Command] = &[
    Command {
        name: c"RL.ALL",
        handler: command(all::run),
        flags: c"write getkeys-api",
        keys: KeySpec::AfterNumkeys,
        arity: -5,
        summary: c"Several limiters at once, all or nothing: units are taken from every limiter only if every one admits",
        complexity: c"O(K) for K limiters, each as its own command",
        args: &[
            Arg::integer(c"numkeys"),
            Arg::key(c"key").multiple(),
            Arg::string(c"spec")
                .multiple()
                .summary(c"an algorithm and its parameters, or POLICY name"),
            Arg::one_of(c"cost-or-upto", &[COST, UPTO]).optional(),
            BLOCK,
            Arg::keyword(c"each", c"EACH").optional().summary(
                c"the reply adds every limiter's own five integers, in order (allowed limit remaining wait_ms reset_ms)",
            ),
        ],
        acl: c"write",
    },
    Command {
        name: c"RL.HIT",
        handler: command(live!(policy::hit)),
        flags: c"write fast",
        keys: KeySpec::At {
            first: 2,
            last: 2,
            step: 1,
        },
        arity: -3,
        summary: c"Applies policy `name` to limiter key `key`: the policy's algorithm, mode and roll-out",
        complexity: c"As the policy's algorithm",
        args: &[Arg::string(c"name"), Arg::key(c"key"), COST_REFUND_OR_UPTO, BLOCK],
        acl: c"write fast",
    },
    Command {
        name: c"RL.OUTCOME",
        handler: command(live!(policy::outcome)),
        flags: c"write fast",
        keys: KeySpec::None,
        arity: -4,
        summary: c"Adds outcomes (ok, errors) of requests a policy admitted, and calls a client denied without asking the server, to its current window: the protection loop's input",
        complexity: c"O(1)",
        args: &[
            Arg::string(c"name"),
            Arg::integer(c"ok"),
            Arg::integer(c"errors"),
            Arg::integer(c"denied").token(c"DENIED").optional(),
        ],
        acl: c"write fast",
    },
    Command {
        name: c"RL.LOOPSTATE",
        handler: command(live!(policy::loop_state)),
        flags: c"write",
        keys: KeySpec::None,
        arity: 4,
        summary: c"Internal: sets a policy's scale and stage as its master computed them; accepted only while loading or from the master",
        complexity: c"O(1)",
        args: &[
            Arg::string(c"name"),
            Arg::integer(c"scale"),
            Arg::integer(c"stage"),
        ],
        acl: c"write",
    },
    Command {
        name: c"RL.SETSTATE",
        handler: command(live!(setstate::step)),
        flags: c"write",
        keys: KeySpec::At {
            first: 1,
            last: 1,
            step: 1,
        },
        arity: -5,
        summary: c"Internal: sets a limiter's raw state (AOF rewrite); accepted only while loading or from the master",
        complexity: c"O(1)",
        args: &[
            Arg::key(c"key"),
            Arg::string(c"algorithm"),
            Arg::integer(c"encoding"),
            Arg::integer(c"fields").multiple(),
        ],
        acl: c"write",
    },
];

/// `CL.THROTTLE` and `RL.THROTTLE` (`throttle.rs`): redis-cell's command
/// under both names, registered with any arity, as redis-cell is, so that a
/// wrong number of arguments gets its usage text.
pub const THROTTLE_COMMANDS: [Command; 2] = [throttle_command(true), throttle_command(false)];

const THROTTLE_ARGS: &[Arg] = &[
    Arg::key(c"key"),
    Arg::integer(c"max_burst").summary(c"units a full bucket holds beyond the first"),
    Arg::integer(c"count").summary(c"units that come back every period"),
    Arg::integer(c"period").summary(c"seconds"),
    Arg::integer(c"quantity")
        .summary(c"units this call takes (default 1; 0 inspects)")
        .optional(),
];

const fn throttle_command(cell: bool) -> Command {
    Command {
        // In lower case as redis-cell registers it: `INFO commandstats`
        // shows `cmdstat_cl.throttle`, as dashboards built on it expect.
        name: if cell { c"cl.throttle" } else { c"RL.THROTTLE" },
        handler: if cell {
            command(live!(throttle::cell))
        } else {
            command(live!(throttle::rl))
        },
        flags: c"write fast",
        keys: KeySpec::At {
            first: 1,
            last: 1,
            step: 1,
        },
        arity: -1,
        summary: if cell {
            c"redis-cell's GCRA rate limiter, on its keys and with its reply: [limited, max_burst + 1, remaining, retry_after, reset_after], in seconds"
        } else {
            c"CL.THROTTLE under the name proposed for Valkey: [limited, max_burst + 1, remaining, retry_after, reset_after], in seconds"
        },
        complexity: c"O(1)",
        args: THROTTLE_ARGS,
        acl: c"write fast",
    }
}

/// The command of an algorithm's row: `RL.<ALGORITHM> key <params...>
/// [options]`, its key first.
pub fn algorithm_command<L: Listed>() -> Command {
    let row = &L::ROW;
    Command {
        name: row.command,
        handler: command(live!(limiter::step::<L, _>)),
        flags: row.flags,
        keys: KeySpec::At {
            first: 1,
            last: 1,
            step: 1,
        },
        arity: L::ARITY,
        summary: row.summary,
        complexity: row.complexity,
        args: row.args,
        acl: row.acl,
    }
}

const RELEASE_ARGS: &[Arg] = &[Arg::key(c"key"), Arg::integer(c"lease")];
const RENEW_ARGS: &[Arg] = &[
    Arg::key(c"key"),
    Arg::integer(c"lease"),
    Arg::integer(c"lease_ms"),
];

/// A command that comes with algorithm `L` (`RL.RELEASE`, `RL.RENEW`).
pub fn companion_command<L: Listed>(which: Companion) -> Command {
    let keys = KeySpec::At {
        first: 1,
        last: 1,
        step: 1,
    };
    match which {
        Companion::Release => Command {
            name: lease::name(which),
            handler: command(live!(lease::release::<L, _>)),
            flags: c"write",
            keys,
            arity: -3,
            summary: c"Ends a lease granted by RL.CONCURRENCY: 1 if it was held, 0 if it had already ended or is unknown",
            complexity: c"O(N), N the leases held on the key",
            args: RELEASE_ARGS,
            acl: c"write",
        },
        Companion::Renew => Command {
            name: lease::name(which),
            handler: command(live!(lease::renew::<L, _>)),
            flags: c"write",
            keys,
            arity: -4,
            summary: c"Makes a lease of RL.CONCURRENCY end lease_ms from now: 1 if it was held, 0 if it had already ended or is unknown",
            complexity: c"O(N), N the leases held on the key",
            args: RENEW_ARGS,
            acl: c"write",
        },
    }
}

/// Runs the step of the command the call names (`RL.POLICY` and `RL.LOG`
/// with their subcommand), after the server's arity check, as the server
/// would dispatch it: for hosts other than the live server, which
/// dispatches a call by itself, and for the live server's retries of a
/// blocked call (`live.rs`), so that no other table of command names
/// exists.
pub fn dispatch<H: Host>(host: &H) -> Result<(), crate::error::Error> {
    use crate::algorithms::for_each_algorithm;
    use crate::error::Error;
    let words = host.all_words();
    let name = |i: usize| words.get(i).map(|w| w.to_ascii_uppercase());
    let argc = words.len();
    let arity = |arity: i32| -> Result<(), Error> {
        let ok = match usize::try_from(arity) {
            Ok(exact) => argc == exact,
            Err(_) => argc >= arity.unsigned_abs() as usize,
        };
        if ok {
            Ok(())
        } else {
            Err(Error::Arity)
        }
    };
    let Some(command) = name(0) else {
        return Err(Error::Arity);
    };
    for_each_algorithm!(L => {
        if command == L::ROW.command.to_bytes() {
            arity(L::ARITY)?;
            return limiter::step::<L, H>(host);
        }
        for &which in L::ROW.companions {
            if command == lease::name(which).to_bytes() {
                arity(companion_command::<L>(which).arity)?;
                return lease::step::<L, H>(host, which);
            }
        }
    });
    let registered = |name: &[u8]| {
        COMMANDS
            .iter()
            .find(|c| c.name.to_bytes() == name)
            .map_or(0, |c| c.arity)
    };
    let subcommand = |subcommands: &[crate::ffi::Subcommand]| -> Result<Vec<u8>, Error> {
        let sub = name(1).ok_or(Error::Arity)?;
        let found = subcommands.iter().find(|s| s.name.to_bytes() == sub);
        let found = found
            .ok_or_else(|| Error::Syntax(format!("unknown subcommand '{}'", Error::quote(&sub))))?;
        arity(found.arity)?;
        Ok(sub)
    };
    match command.as_slice() {
        b"RL.ALL" => {
            arity(registered(&command))?;
            all::step(host)
        }
        b"RL.HIT" => {
            arity(registered(&command))?;
            policy::hit(host)
        }
        b"RL.SETSTATE" => {
            arity(registered(&command))?;
            setstate::step(host)
        }
        b"RL.LOOPSTATE" => {
            arity(registered(&command))?;
            policy::loop_state(host)
        }
        b"RL.OUTCOME" => {
            arity(registered(&command))?;
            policy::outcome(host)
        }
        b"CL.THROTTLE" => throttle::cell(host),
        b"RL.THROTTLE" => throttle::rl(host),
        b"RL.POLICY" => match subcommand(&policy::SUBCOMMANDS)?.as_slice() {
            b"SET" => policy::set(host),
            b"GET" => policy::get(host),
            b"DEL" => policy::del(host),
            b"LIST" => policy::list(host),
            b"STATS" => policy::stats(host),
            b"SCALE" => policy::scale(host),
            _ => policy::help(host),
        },
        b"RL.LOG" => match subcommand(&log::SUBCOMMANDS)?.as_slice() {
            b"GET" => log::get(host),
            b"LEN" => log::len(host),
            b"RESET" => log::reset(host),
            _ => log::help(host),
        },
        _ => Err(Error::Syntax(format!(
            "unknown command '{}'",
            Error::quote(&command)
        ))),
    }
}

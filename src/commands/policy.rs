//! `RL.POLICY SET|GET|DEL|LIST` and `RL.HIT name key [COST n]`: rules kept in
//! the server (see `crate::policy` for what modes and roll-outs mean).

use std::os::raw::c_int;

use redis_module::raw;

use super::docs::{Arg, Subcommand};
use super::limiter::{apply_to_key, LimiterCommand};
use super::spec::{with_algorithm, Spec};
use super::{all_args, reply_decision, Key, MAX_ARGS};
use crate::api;
use crate::args::parse_options;
use crate::clock;
use crate::deny_log;
use crate::error::Error;
use crate::guard;
use crate::limiter::{Decision, Wait};
use crate::policy::{self, Mode, Rule};
use crate::replicate;

/// A command handler, as Redis calls it.
pub type HandlerFn = unsafe extern "C" fn(
    *mut raw::RedisModuleCtx,
    *mut *mut raw::RedisModuleString,
    c_int,
) -> c_int;

macro_rules! handler {
    ($name:ident, $run:ident) => {
        /// # Safety
        /// Called by Redis with a valid context and `argc` arguments.
        pub unsafe extern "C" fn $name(
            ctx: *mut raw::RedisModuleCtx,
            argv: *mut *mut raw::RedisModuleString,
            argc: c_int,
        ) -> c_int {
            guard::command(ctx, || unsafe { $run(ctx, &all_args(argv, argc), argv) })
        }
    };
}

handler!(set_handler, set);
handler!(get_handler, get);
handler!(del_handler, del);
handler!(list_handler, list);
handler!(help_handler, help);

/// `RL.POLICY HELP`
unsafe fn help(
    ctx: *mut raw::RedisModuleCtx,
    _args: &Args,
    _argv: *mut *mut raw::RedisModuleString,
) -> Result<(), Error> {
    super::reply_lines(
        ctx,
        &[
            "RL.POLICY SET <name> <ALGORITHM> <params...> [MODE ENFORCE|SHADOW|OFF] [ROLLOUT <percent>]",
            "    Create or replace a policy. ALGORITHM is TOKENBUCKET, FIXEDWINDOW, LEAKYBUCKET, SLIDING or HASHWINDOW.",
            "RL.POLICY GET <name>",
            "    The policy's rule and counters, or nil.",
            "RL.POLICY DEL <name>",
            "    Delete a policy (its limiter keys stay and expire by themselves).",
            "RL.POLICY LIST",
            "    The names of all policies.",
            "RL.HIT <name> <key> [COST <n> [FORCE] | REFUND <n>]",
            "    Apply a policy to a limiter key.",
        ],
    );
    Ok(())
}

/// The subcommands of `RL.POLICY`, with what `COMMAND DOCS` says of each.
pub const SUBCOMMANDS: [Subcommand; 5] = [
    Subcommand {
        name: c"SET",
        handler: set_handler,
        flags: c"write deny-oom",
        arity: -5,
        summary:
            c"Creates or replaces a policy: an algorithm with its parameters, a mode and a roll-out",
        complexity: c"O(1)",
        args: &[
            Arg::string(c"name"),
            Arg::one_of(
                c"algorithm",
                &[
                    Arg::keyword(c"tokenbucket", c"TOKENBUCKET"),
                    Arg::keyword(c"fixedwindow", c"FIXEDWINDOW"),
                    Arg::keyword(c"leakybucket", c"LEAKYBUCKET"),
                    Arg::keyword(c"sliding", c"SLIDING"),
                    Arg::keyword(c"hashwindow", c"HASHWINDOW"),
                ],
            ),
            Arg::integer(c"params")
                .multiple()
                .summary(c"the algorithm's parameters, as after the key of its command"),
            Arg::one_of(
                c"mode",
                &[
                    Arg::keyword(c"enforce", c"ENFORCE"),
                    Arg::keyword(c"shadow", c"SHADOW"),
                    Arg::keyword(c"off", c"OFF"),
                ],
            )
            .token(c"MODE")
            .optional(),
            Arg::integer(c"percent")
                .token(c"ROLLOUT")
                .optional()
                .summary(c"the percentage of keys enforced (0 to 100); the others run in shadow"),
        ],
    },
    Subcommand {
        name: c"HELP",
        handler: help_handler,
        flags: c"readonly fast allow-loading allow-stale",
        arity: 2,
        summary: c"Shows helpful text about the different subcommands",
        complexity: c"O(1)",
        args: &[],
    },
    Subcommand {
        name: c"GET",
        handler: get_handler,
        flags: c"readonly fast",
        arity: 3,
        summary: c"Returns a policy's rule and counters, or nil",
        complexity: c"O(1)",
        args: &[Arg::string(c"name")],
    },
    Subcommand {
        name: c"DEL",
        handler: del_handler,
        flags: c"write fast",
        arity: 3,
        summary: c"Deletes a policy (its limiter keys stay and expire by themselves)",
        complexity: c"O(1)",
        args: &[Arg::string(c"name")],
    },
    Subcommand {
        name: c"LIST",
        handler: list_handler,
        flags: c"readonly",
        arity: 2,
        summary: c"Returns the names of all policies",
        complexity: c"O(N) where N is the number of policies",
        args: &[],
    },
];

type Args<'a> = [&'a [u8]];

/// `RL.POLICY SET name <ALGORITHM> <params...> [MODE m] [ROLLOUT p]`
unsafe fn set(
    ctx: *mut raw::RedisModuleCtx,
    args: &Args,
    _argv: *mut *mut raw::RedisModuleString,
) -> Result<(), Error> {
    if args.len() < 5 {
        return Err(Error::Arity);
    }
    let name = args[2];
    policy::check_name(name)?;
    let rule = policy::parse_rule(&args[3..])?;
    policy::check_room_for(name)?;
    if !super::from_replication_or_loading(ctx) {
        with_algorithm!(rule.spec, L, p => L::within_configured_bounds(&p))?;
    }
    policy::set(name, rule);
    unsafe {
        // Deterministic: replicas and the AOF replay it as it is.
        api!(RedisModule_ReplicateVerbatim)(ctx);
        api!(RedisModule_ReplyWithSimpleString)(ctx, c"OK".as_ptr());
    }
    Ok(())
}

/// `RL.POLICY GET name`: the rule as field/value pairs, with its counters.
unsafe fn get(
    ctx: *mut raw::RedisModuleCtx,
    args: &Args,
    _argv: *mut *mut raw::RedisModuleString,
) -> Result<(), Error> {
    let Some((rule, stats)) = policy::get(args[2]) else {
        unsafe { api!(RedisModule_ReplyWithNull)(ctx) };
        return Ok(());
    };
    let text = |s: &[u8]| unsafe {
        api!(RedisModule_ReplyWithStringBuffer)(ctx, s.as_ptr().cast(), s.len());
    };
    let int = |v: i64| unsafe {
        api!(RedisModule_ReplyWithLongLong)(ctx, v);
    };
    let params = rule.spec.params();
    unsafe { api!(RedisModule_ReplyWithArray)(ctx, 18) };
    text(b"name");
    text(args[2]);
    text(b"algorithm");
    text(rule.spec.name().as_bytes());
    text(b"params");
    unsafe { api!(RedisModule_ReplyWithArray)(ctx, params.as_slice().len() as i64) };
    for &p in params.as_slice() {
        int(p as i64);
    }
    text(b"mode");
    text(rule.mode.name().as_bytes());
    text(b"rollout");
    int(i64::from(rule.rollout));
    text(b"calls");
    int(stats.outcomes.calls.get() as i64);
    text(b"admitted");
    int(stats.outcomes.admitted.get() as i64);
    text(b"denied");
    int(stats.outcomes.denied.get() as i64);
    text(b"shadow_denied");
    int(stats.shadow_denied.get() as i64);
    Ok(())
}

/// `RL.POLICY DEL name`: 1 if it existed.
unsafe fn del(
    ctx: *mut raw::RedisModuleCtx,
    args: &Args,
    _argv: *mut *mut raw::RedisModuleString,
) -> Result<(), Error> {
    let existed = policy::delete(args[2]);
    unsafe {
        if existed {
            api!(RedisModule_ReplicateVerbatim)(ctx);
        }
        api!(RedisModule_ReplyWithLongLong)(ctx, existed as i64);
    }
    Ok(())
}

/// `RL.POLICY LIST`: the names, sorted.
unsafe fn list(
    ctx: *mut raw::RedisModuleCtx,
    _args: &Args,
    _argv: *mut *mut raw::RedisModuleString,
) -> Result<(), Error> {
    let all = policy::list();
    unsafe {
        api!(RedisModule_ReplyWithArray)(ctx, all.len() as i64);
        for (name, _, _) in all {
            api!(RedisModule_ReplyWithStringBuffer)(ctx, name.as_ptr().cast(), name.len());
        }
    }
    Ok(())
}

/// What a call through a rule does with the key: enforce, shadow or nothing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Through {
    Enforce,
    Shadow,
    Off,
}

impl Through {
    pub fn of(rule: &Rule, key: &[u8]) -> Through {
        match rule.mode {
            Mode::Off => Through::Off,
            _ if rule.enforces(key) => Through::Enforce,
            _ => Through::Shadow,
        }
    }
}

/// The answer of a limiter that is off: allowed, nothing looked at.
pub fn off_decision(spec: Spec) -> Decision {
    let limit = spec.limit();
    Decision {
        allowed: true,
        limit,
        remaining: limit,
        wait: Wait::Ms(0),
        reset_ms: 0,
    }
}

/// A shadowed decision as the caller sees it: allowed, with no wait.
pub fn shadowed(mut decision: Decision) -> Decision {
    decision.allowed = true;
    decision.wait = Wait::Ms(0);
    decision
}

/// `RL.HIT name key [COST n [FORCE] | REFUND n]`
///
/// # Safety
/// Called by Redis with a valid context and `argc` arguments.
pub unsafe extern "C" fn hit_handler(
    ctx: *mut raw::RedisModuleCtx,
    argv: *mut *mut raw::RedisModuleString,
    argc: c_int,
) -> c_int {
    guard::command(ctx, || unsafe { hit(ctx, argv, argc) })
}

unsafe fn hit(
    ctx: *mut raw::RedisModuleCtx,
    argv: *mut *mut raw::RedisModuleString,
    argc: c_int,
) -> Result<(), Error> {
    // On the stack: the hot path allocates nothing.
    let args = unsafe { super::Args::<MAX_ARGS>::new(argv, argc) }?;
    let args = args.all();
    if args.len() < 3 {
        return Err(Error::Arity);
    }
    let (name, key) = (args[1], args[2]);
    let options = parse_options(&args[3..])?;
    if options.at.is_some() {
        // RL.HIT is never propagated as such: the limiter call goes out.
        return Err(Error::ReservedForReplication("AT"));
    }
    let (rule, stats) =
        policy::get(name).ok_or_else(|| Error::UnknownPolicy(Error::quote(name)))?;
    let request = options.request;
    let cost = request.cost();
    let through = Through::of(&rule, key);
    if through == Through::Off {
        stats.outcomes.calls.bump();
        reply_decision(ctx, &off_decision(rule.spec));
        return Ok(());
    }
    let now = clock::now();
    let key_name = unsafe { *argv.add(2) };
    let open = Key::open_rw(ctx, key_name);
    let decision = with_algorithm!(rule.spec, L, p => {
        let applied = apply_to_key::<L>(ctx, &open, &p, request, now, true)?;
        let decision = applied.outcome.decision;
        L::stats().record(&decision, cost);
        if applied.outcome.changed {
            replicate::limiter_call_with_params(ctx, L::NAME, key_name, rule.spec.params().as_slice(), request, now);
            open.written(c"rl.hit", applied.expiry_written);
        }
        decision
    });
    drop(open);
    stats.outcomes.record(&decision, cost);
    let reply = if decision.allowed || cost == 0 {
        decision
    } else if through == Through::Enforce {
        deny_log::record(
            now.as_ms_floor(),
            key,
            &[b"policy:", name],
            cost,
            decision.wait.as_reply(),
        );
        decision
    } else {
        stats.shadow_denied.bump();
        shadowed(decision)
    };
    reply_decision(ctx, &reply);
    Ok(())
}

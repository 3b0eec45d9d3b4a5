//! `RL.POLICY SET|GET|DEL|LIST` and `RL.HIT name key [COST n]`: rules kept in
//! the server (see `crate::policy` for what modes and roll-outs mean).

use super::host::{Host, Origin};
use super::live::live;
use super::step::{OneKey, Policy, Through};
use super::{reply_lines, MAX_ARGS};
use crate::algorithms::{with_algorithm, words_allowed, Listed, Site, POLICY_KEYWORDS};
use crate::args::parse_options;
use crate::error::Error;
use crate::ffi::{command, Arg, Subcommand};
use crate::policy::{self, Rule};

/// `RL.POLICY HELP`
pub(super) fn help<H: Host>(host: &H) -> Result<(), Error> {
    let words = words_allowed(Site::Policy);
    let algorithms = match words.split_last() {
        Some((last, [])) => last.to_string(),
        Some((last, rest)) => format!("{} or {last}", rest.join(", ")),
        None => String::new(),
    };
    let set = format!("    Create or replace a policy. ALGORITHM is {algorithms}.");
    reply_lines(
        host,
        &[
            "RL.POLICY SET <name> <ALGORITHM> <params...> [MODE ENFORCE|SHADOW|OFF] [ROLLOUT <percent>] [TZ <zone>]",
            "    [ADAPT ERRORS <pct> [FACTOR <f>] [MIN <m>] [RECOVER <r>] [WINDOW <ms>] [MINCALLS <n>] | ADAPT OFF]",
            "    [STAGES <degrade_pct> <break_pct>] [WINDOW <ms>]",
            &set,
            "RL.POLICY GET <name>",
            "    The policy's rule and counters, or nil.",
            "RL.POLICY DEL <name>",
            "    Delete a policy (its limiter keys stay and expire by themselves).",
            "RL.POLICY LIST",
            "    The names of all policies.",
            "RL.POLICY SCALE <name> <pct>",
            "    Set a policy's scale by hand (1 to 100 percent of its size and rate parameters).",
            "RL.POLICY STATS <name>",
            "    A policy's protection loop: scale, stage, and the current and last window's counts.",
            "RL.OUTCOME <name> <ok> <errors>",
            "    Add outcomes of requests a policy admitted to its current window.",
            "RL.HIT <name> <key> [COST <n> [FORCE] | REFUND <n>]",
            "    Apply a policy to a limiter key.",
        ],
    );
    Ok(())
}

/// The subcommands of `RL.POLICY`, with what `COMMAND DOCS` says of each.
pub const SUBCOMMANDS: [Subcommand; 7] = [
    Subcommand {
        name: c"SET",
        handler: command(live!(set)),
        flags: c"write deny-oom",
        arity: -5,
        summary:
            c"Creates or replaces a policy: an algorithm with its parameters, a mode and a roll-out",
        complexity: c"O(1)",
        args: &[
            Arg::string(c"name"),
            Arg::one_of(c"algorithm", POLICY_KEYWORDS.as_slice()),
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
            Arg::string(c"zone")
                .token(c"TZ")
                .optional()
                .summary(c"a calendar quota's time zone (default UTC)"),
            Arg::one_of(
                c"adapt",
                &[
                    Arg::block(
                        c"errors",
                        &[
                            Arg::integer(c"pct").token(c"ERRORS").summary(
                                c"the error percentage of a window's outcomes above which the scale drops (0 to 100)",
                            ),
                            Arg::integer(c"factor")
                                .token(c"FACTOR")
                                .optional()
                                .summary(c"the scale is multiplied by factor / 100 (1 to 100, default 80)"),
                            Arg::integer(c"min")
                                .token(c"MIN")
                                .optional()
                                .summary(c"the lowest scale (1 to 100, default 50)"),
                            Arg::integer(c"recover")
                                .token(c"RECOVER")
                                .optional()
                                .summary(c"added to the scale after a window at half the error percentage or less (0 to 100, default 5)"),
                            Arg::integer(c"window_ms")
                                .token(c"WINDOW")
                                .optional()
                                .summary(c"the loop's window, as WINDOW below"),
                            Arg::integer(c"mincalls")
                                .token(c"MINCALLS")
                                .optional()
                                .summary(c"the fewest outcomes a window needs to change the scale (default 100)"),
                        ],
                    ),
                    Arg::keyword(c"off", c"OFF")
                        .summary(c"stop adapting and keep the scale the policy has"),
                ],
            )
            .token(c"ADAPT")
            .optional(),
            Arg::block(
                c"stages",
                &[
                    Arg::integer(c"degrade_pct")
                        .summary(c"stage 1 (degrade) after a window denying more than this percentage of calls"),
                    Arg::integer(c"break_pct")
                        .summary(c"stage 2 (break) above this percentage (degrade_pct to 100)"),
                ],
            )
            .token(c"STAGES")
            .optional(),
            Arg::integer(c"window_ms")
                .token(c"WINDOW")
                .optional()
                .summary(c"the protection loop's window in milliseconds (1 to 86400000, default 10000)"),
        ],
    },
    Subcommand {
        name: c"HELP",
        handler: command(live!(help)),
        flags: c"readonly fast allow-loading allow-stale",
        arity: 2,
        summary: c"Shows helpful text about the different subcommands",
        complexity: c"O(1)",
        args: &[],
    },
    Subcommand {
        name: c"GET",
        handler: command(live!(get)),
        flags: c"readonly fast",
        arity: 3,
        summary: c"Returns a policy's rule and counters, or nil",
        complexity: c"O(1)",
        args: &[Arg::string(c"name")],
    },
    Subcommand {
        name: c"DEL",
        handler: command(live!(del)),
        flags: c"write fast",
        arity: 3,
        summary: c"Deletes a policy (its limiter keys stay and expire by themselves)",
        complexity: c"O(1)",
        args: &[Arg::string(c"name")],
    },
    Subcommand {
        name: c"SCALE",
        handler: command(live!(scale)),
        flags: c"write fast",
        arity: 4,
        summary: c"Sets a policy's scale by hand (1 to 100 percent of its size and rate parameters)",
        complexity: c"O(1)",
        args: &[Arg::string(c"name"), Arg::integer(c"pct")],
    },
    Subcommand {
        name: c"STATS",
        handler: command(live!(stats)),
        flags: c"readonly fast",
        arity: 3,
        summary: c"Returns a policy's protection loop: scale, stage, and the current and last window's counts",
        complexity: c"O(1)",
        args: &[Arg::string(c"name")],
    },
    Subcommand {
        name: c"LIST",
        handler: command(live!(list)),
        flags: c"readonly",
        arity: 2,
        summary: c"Returns the names of all policies",
        complexity: c"O(N) where N is the number of policies",
        args: &[],
    },
];

/// `RL.OUTCOME name ok errors [DENIED n]`: adds outcomes of requests policy
/// `name` admitted, and `n` calls a kit denied without asking the server
/// (deny cache, local level), to its current window (kits send it about once a second, to
/// every master). Ends the windows that ended, as a call does, and
/// propagates only their result (`RL.LOOPSTATE`). Reply: as `RL.POLICY
/// STATS`.
pub(super) fn outcome<H: Host>(host: &H) -> Result<(), Error> {
    let args = host.all_words();
    let denied = match args.len() {
        4 => 0,
        6 if args[4].eq_ignore_ascii_case(b"DENIED") => {
            crate::args::parse_int(args[5], "DENIED", 0, crate::limiter::MAX_PARAM)?
        }
        6 => {
            return Err(Error::Syntax(format!(
                "unknown option '{}' (expected DENIED)",
                Error::quote(args[4])
            )))
        }
        5 if args[4].eq_ignore_ascii_case(b"DENIED") => return Err(Error::MissingValue("DENIED")),
        _ => return Err(Error::Arity),
    };
    let ok = crate::args::parse_int(args[2], "ok", 0, crate::limiter::MAX_PARAM)?;
    let errors = crate::args::parse_int(args[3], "errors", 0, crate::limiter::MAX_PARAM)?;
    let (rule, stats) =
        policy::get(args[1]).ok_or_else(|| Error::UnknownPolicy(Error::quote(args[1])))?;
    let now_ms = host.now().as_ms_floor();
    let mut protection = policy::lock(&stats.protection);
    if rule.protect.is_on() {
        if protection.advance(&rule.protect, now_ms) {
            let (scale, stage) = protection.current();
            host.propagate_loop(1, scale, stage);
            stats.synced(&protection);
        }
        protection.count_outcomes(ok, errors, denied);
    }
    reply_stats(host, &rule, &protection, now_ms);
    Ok(())
}

/// `RL.POLICY STATS name`: the loop as of now (windows that ended are shown
/// ended, without changing anything): scale, stage, window, and the current
/// and the last finished window's counts and ratios (per mille).
pub(super) fn stats<H: Host>(host: &H) -> Result<(), Error> {
    let args = host.all_words();
    let (rule, stats) =
        policy::get(args[2]).ok_or_else(|| Error::UnknownPolicy(Error::quote(args[2])))?;
    let protection = policy::lock(&stats.protection);
    reply_stats(host, &rule, &protection, host.now().as_ms_floor());
    Ok(())
}

fn reply_stats<H: Host>(host: &H, rule: &Rule, protection: &policy::Protection, now_ms: u64) {
    use crate::limiter::protection::{window_end, Counts};
    let config = &rule.protect;
    let view = protection.view(config, now_ms);
    let counts = |c: &Counts| {
        host.reply_array(14);
        for (name, value) in [
            ("calls", c.calls),
            ("admitted", c.admitted),
            ("denied", c.denied),
            ("ok", c.ok),
            ("errors", c.errors),
            ("deny_permille", c.deny_permille()),
            ("error_permille", c.error_permille()),
        ] {
            host.reply_bulk(name.as_bytes());
            host.reply_integer(value as i64);
        }
    };
    host.reply_array(14);
    host.reply_bulk(b"scale");
    host.reply_integer(view.scale as i64);
    host.reply_bulk(b"stage");
    host.reply_integer(i64::from(view.stage));
    host.reply_bulk(b"window_ms");
    host.reply_integer(config.window_ms() as i64);
    host.reply_bulk(b"window_end_ms");
    host.reply_integer(window_end(now_ms, config.window_ms()).max(view.window_end_ms) as i64);
    host.reply_bulk(b"current");
    counts(&view.current);
    host.reply_bulk(b"last");
    counts(&view.last);
    host.reply_bulk(b"adapting");
    host.reply_integer(i64::from(config.adapt().is_some()));
}

/// `RL.POLICY SCALE name pct`: sets a policy's scale by hand (1 to 100),
/// keeping its stage: the operator's switch to degrade a limit at once.
/// Deterministic: it propagates as it is.
pub(super) fn scale<H: Host>(host: &H) -> Result<(), Error> {
    let args = host.all_words();
    let pct = crate::args::parse_int(args[3], "pct", 1, 100)?;
    let (_, stats) =
        policy::get(args[2]).ok_or_else(|| Error::UnknownPolicy(Error::quote(args[2])))?;
    let mut protection = policy::lock(&stats.protection);
    let (_, stage) = protection.current();
    protection.set(pct, stage);
    stats.synced(&protection);
    drop(protection);
    host.propagate_verbatim();
    host.reply_simple(c"OK");
    Ok(())
}

/// `RL.LOOPSTATE name scale stage`: a policy's scale and stage as the master
/// computed them at the end of a window (or an AOF holds them). Accepted
/// only from the master link or while the AOF loads: a client sets the
/// scale with `RL.POLICY SCALE`. A policy this node does not hold is
/// skipped.
pub(super) fn loop_state<H: Host>(host: &H) -> Result<(), Error> {
    if host.origin() == Origin::Client {
        return Err(Error::ReservedForReplication("RL.LOOPSTATE"));
    }
    let args = host.all_words();
    if args.len() != 4 {
        return Err(Error::Arity);
    }
    let scale = crate::args::parse_int(args[2], "scale", 1, 100)?;
    let stage = crate::args::parse_int(args[3], "stage", 0, 2)? as u8;
    if let Some((_, stats)) = policy::get(args[1]) {
        let mut protection = policy::lock(&stats.protection);
        protection.set(scale, stage);
        stats.synced(&protection);
    }
    host.propagate_verbatim();
    host.reply_simple(c"OK");
    Ok(())
}

/// `RL.POLICY SET name <ALGORITHM> <params...> [MODE m] [ROLLOUT p]`
pub(super) fn set<H: Host>(host: &H) -> Result<(), Error> {
    let args = host.all_words();
    if args.len() < 5 {
        return Err(Error::Arity);
    }
    let name = args[2];
    policy::check_name(name)?;
    let rule = policy::parse_rule(&args[3..])?;
    policy::check_room_for(name)?;
    if host.origin() == Origin::Client {
        with_algorithm!(rule.spec, L, p => L::ROW.check_bound(&p))?;
    }
    policy::set(name, rule);
    // Deterministic: replicas and the AOF replay it as it is.
    host.propagate_verbatim();
    host.reply_simple(c"OK");
    Ok(())
}

/// `RL.POLICY GET name`: the rule as field/value pairs, with its counters.
pub(super) fn get<H: Host>(host: &H) -> Result<(), Error> {
    let args = host.all_words();
    let name = args[2];
    let Some((rule, stats)) = policy::get(name) else {
        host.reply_null();
        return Ok(());
    };
    let text = |s: &[u8]| host.reply_bulk(s);
    let int = |v: i64| host.reply_integer(v);
    let params = rule.spec.params();
    // A calendar quota also says its zone.
    let zoned = rule.spec.has_zone();
    let protect = &rule.protect;
    // ADAPT's five arguments, STAGES' two and the window, when on.
    let adapt = protect.adapt().map(|a| a.values());
    let stages = protect.stages().map(|s| s.values());
    let looped = protect.is_on();
    host.reply_array(
        18 + if zoned { 2 } else { 0 }
            + 4
            + if adapt.is_some() { 2 } else { 0 }
            + if stages.is_some() { 2 } else { 0 }
            + if looped { 2 } else { 0 },
    );
    text(b"name");
    text(name);
    text(b"algorithm");
    text(rule.spec.name().as_bytes());
    text(b"params");
    host.reply_array(params.as_slice().len());
    for (i, &p) in params.as_slice().iter().enumerate() {
        // A keyword parameter (a quota's period) as its word.
        match rule.spec.keyword(i, p) {
            Some(word) => text(word.as_bytes()),
            None => int(p as i64),
        }
    }
    text(b"mode");
    text(rule.mode.name().as_bytes());
    text(b"rollout");
    int(i64::from(rule.rollout));
    if zoned {
        text(b"zone");
        text(&crate::calendar::name(rule.zone));
    }
    text(b"calls");
    int(stats.outcomes.calls.get() as i64);
    text(b"admitted");
    int(stats.outcomes.admitted.get() as i64);
    text(b"denied");
    int(stats.outcomes.denied.get() as i64);
    text(b"shadow_denied");
    int(stats.shadow_denied.get() as i64);
    if let Some(values) = adapt {
        // ERRORS, FACTOR, MIN, RECOVER, MINCALLS.
        text(b"adapt");
        host.reply_array(values.len());
        for v in values {
            int(v as i64);
        }
    }
    if let Some(values) = stages {
        text(b"stages");
        host.reply_array(values.len());
        for v in values {
            int(v as i64);
        }
    }
    if looped {
        text(b"window_ms");
        int(protect.window_ms() as i64);
    }
    // As STATS shows them: windows that ended are ended.
    let view = policy::lock(&stats.protection).view(protect, host.now().as_ms_floor());
    let (scale, stage) = (view.scale, view.stage);
    text(b"scale");
    int(scale as i64);
    text(b"stage");
    int(i64::from(stage));
    Ok(())
}

/// `RL.POLICY DEL name`: 1 if it existed.
pub(super) fn del<H: Host>(host: &H) -> Result<(), Error> {
    let existed = policy::delete(host.all_words()[2]);
    if existed {
        host.propagate_verbatim();
    }
    host.reply_integer(existed as i64);
    Ok(())
}

/// `RL.POLICY LIST`: the names, sorted.
pub(super) fn list<H: Host>(host: &H) -> Result<(), Error> {
    let all = policy::list();
    host.reply_array(all.len());
    for (name, _, _) in all {
        host.reply_bulk(&name);
    }
    Ok(())
}

/// `RL.HIT name key [COST n [FORCE] | REFUND n] [BLOCK timeout_ms]`
#[inline(always)]
pub fn hit<H: Host>(host: &H) -> Result<(), Error> {
    // On the stack: the hot path allocates nothing.
    let args = host.words::<MAX_ARGS>()?;
    if args.len() < 3 {
        return Err(Error::Arity);
    }
    let (name, key) = (args[1], args[2]);
    let options = parse_options(&args[3..])?;
    // RL.HIT is never propagated as such: the limiter call goes out.
    options.refuse_pinned()?;
    if options.zone.is_some() {
        // A policy's zone is part of its rule.
        return Err(Error::Syntax(
            "TZ is not an option of RL.HIT: a policy's rule says its zone".to_string(),
        ));
    }
    let (rule, stats) =
        policy::get(name).ok_or_else(|| Error::UnknownPolicy(Error::quote(name)))?;
    // Refused before the protection loop below may move (an error writes
    // nothing): `UPTO` on a policy whose algorithm never grants part.
    if let crate::limiter::Request::UpTo(_) = options.request {
        with_algorithm!(rule.spec, L, _p => if !L::ROW.upto {
            return Err(<Policy as super::step::Via>::no_upto::<L>());
        });
    }
    let through = Through::of(&rule, key);
    let zone = rule.spec.has_zone().then_some(rule.zone);
    let now = host.now();
    // The protection loop: windows that ended are evaluated on this call's
    // instant (their result goes to replicas as it is), and the limiter
    // runs at the policy's scale.
    let counts = rule.protect.is_on() && through != Through::Off;
    let mut spec = rule.spec;
    if counts || stats.is_scaled() {
        let mut protection = policy::lock(&stats.protection);
        if counts && protection.advance(&rule.protect, now.as_ms_floor()) {
            let (scale, stage) = protection.current();
            host.propagate_loop(1, scale, stage);
            stats.synced(&protection);
        }
        spec = spec.scaled(protection.current().0);
    }
    with_algorithm!(spec, L, p => super::step::run(
        host,
        &mut OneKey::<L, _> {
            key,
            params: p,
            request: options.request,
            block: options.block,
            via: Policy {
                name,
                stats,
                through,
                zone,
                now,
                counts,
            },
        },
    ))
}

//! redis-ratelimit: rate limiting as native, atomic Redis commands.
//!
//! This file registers the module: its name, its native types, commands
//! and configs, from the table of algorithms (`algorithms.rs`) and the
//! command table of `commands/`. See `docs/design.md` for the layout.
//! Every call of the module API lives in `ffi/`; the rest is safe Rust,
//! which the first lint enforces.

#![deny(unsafe_code)]
#![deny(unsafe_op_in_unsafe_fn)]
#![deny(clippy::undocumented_unsafe_blocks)]

mod algorithms;
pub mod args;
mod blocking;
mod calendar;
pub mod clock;
mod commands;
mod config;
mod datatype;
mod deny_log;
pub mod error;
#[allow(unsafe_code)]
mod ffi;
/// Fuzz entry points (`fuzz/`, `docs/fuzzing.md`); not part of the module.
#[cfg(any(test, feature = "fuzzing"))]
#[doc(hidden)]
pub mod fuzzing;
mod info;
/// The check that `src/` keeps the layers of `docs/design.md`.
#[cfg(test)]
mod layers;
mod packing;
/// The algorithms live in the core crate (`core/`, `redis-ratelimit-core`):
/// pure state machines without Redis. `crate::limiter` is its name here.
pub use redis_ratelimit_core as limiter;
mod policy;
mod replicate;
mod stats;

use std::ffi::CStr;

use crate::algorithms::{for_each_algorithm, Listed};
use crate::ffi::{Argv, Context, Load, ServerEvent};

#[global_allocator]
static ALLOCATOR: ffi::ModuleAlloc = ffi::ModuleAlloc;

/// The name `MODULE LIST` shows.
const MODULE_NAME: &CStr = c"ratelimit";
/// `MODULE LIST` version: major * 10000 + minor * 100 + patch.
const MODULE_VERSION: i32 = 100;

/// The ACL category of every command, where the server lets modules add one.
const ACL_CATEGORY: &CStr = c"ratelimit";

ffi::module! {
    name: MODULE_NAME,
    version: MODULE_VERSION,
    on_load: on_load,
}

/// Called by `RedisModule_OnLoad` once the module API is initialised, with
/// the load arguments (module configs, `name value` pairs).
fn on_load(load: &Load, argv: &Argv) -> Result<(), String> {
    config::apply_load_arguments(&argv.all_words())
        .map_err(|message| format!("ratelimit: {message}"))?;
    register(load).map_err(str::to_string)
}

fn register(load: &Load) -> Result<(), &'static str> {
    load.set_module_options();
    // Configs first: `ratelimit.write-encoding` fixes the encoding version
    // each type is registered with.
    load.register_configs(&config::NUMERIC)?;
    datatype::register(load)?;
    let subscribed = load.subscribe(on_server_event);
    if !load.init_blocking() {
        load.context().log(
            ffi::Level::Warning,
            "ratelimit: this server cannot block clients on keys; BLOCK answers at once",
        );
    }
    replicate::init(load, subscribed);
    load.register_info(info::section)?;
    let category = load.add_acl_category(ACL_CATEGORY).then_some(ACL_CATEGORY);
    load.create_container(
        c"RL.POLICY",
        c"Manages policies: SET, GET, DEL, LIST, HELP",
        &commands::policy::SUBCOMMANDS,
        category,
    )?;
    load.create_container(
        c"RL.LOG",
        c"Reads the deny log: GET, LEN, RESET, HELP",
        &commands::log::SUBCOMMANDS,
        category,
    )?;
    for_each_algorithm!(L => {
        load.create_command(&commands::algorithm_command::<L>(), category)?;
        for &companion in L::ROW.companions {
            load.create_command(&commands::companion_command::<L>(companion), category)?;
        }
    });
    for command in commands::COMMANDS
        .iter()
        .chain(&commands::THROTTLE_COMMANDS)
    {
        load.create_command(command, category)?;
    }
    Ok(())
}

/// Server events the module follows: any of them may bring a consumer of the
/// replication stream (see `replicate.rs`); a dataset being loaded also
/// brings its own policies; a node that becomes a master or a replica starts
/// its policies' protection windows afresh.
fn on_server_event(ctx: &Context, event: ServerEvent) {
    replicate::consumer_may_appear(ctx);
    match event {
        ServerEvent::Loading { starts: true } => policy::clear(),
        ServerEvent::RoleChanged => policy::restart_windows(),
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::commands::{algorithm_command, COMMANDS};
    use crate::ffi::{words, Arg, Subcommand};

    /// Every command and subcommand with its arity and the words before its
    /// arguments.
    fn every_command() -> Vec<(String, i32, &'static [Arg], usize)> {
        let subcommands = |container: &str, table: &'static [Subcommand]| {
            table
                .iter()
                .map(|s| {
                    let name = format!("{container} {}", s.name.to_string_lossy());
                    (name, s.arity, s.args, 2)
                })
                .collect::<Vec<_>>()
        };
        let mut all = Vec::new();
        for_each_algorithm!(L => {
            let c = algorithm_command::<L>();
            all.push((c.name.to_string_lossy().into_owned(), c.arity, c.args, 1));
            for &which in L::ROW.companions {
                let c = crate::commands::companion_command::<L>(which);
                all.push((c.name.to_string_lossy().into_owned(), c.arity, c.args, 1));
            }
        });
        all.extend(
            COMMANDS
                .iter()
                .chain(&crate::commands::THROTTLE_COMMANDS)
                .map(|c| (c.name.to_string_lossy().into_owned(), c.arity, c.args, 1)),
        );
        all.extend(subcommands("RL.POLICY", &commands::policy::SUBCOMMANDS));
        all.extend(subcommands("RL.LOG", &commands::log::SUBCOMMANDS));
        all
    }

    /// The arguments `COMMAND DOCS` shows fit the arity the server checks: a
    /// call with only the required ones has the arity's words, and a fixed
    /// arity has no optional or repeated argument.
    #[test]
    fn documented_arguments_agree_with_the_arity() {
        for (name, arity, args, before) in every_command() {
            let (min, max) = words(args);
            if arity == -1 {
                // CL.THROTTLE: any count, checked by the command (redis-cell's
                // usage text); it takes the key, three parameters and one
                // optional.
                assert_eq!((min, max), (4, Some(5)), "{name}");
            } else if arity > 0 {
                let arity = arity as usize;
                assert_eq!((min, max), (arity - before, Some(arity - before)), "{name}");
            } else {
                // RL.ALL: a spec is at least two words (`POLICY name`).
                let spec_words = usize::from(name == "RL.ALL");
                assert_eq!(
                    min + spec_words,
                    arity.unsigned_abs() as usize - before,
                    "{name}"
                );
            }
        }
    }

    /// The table's arities are those the commands always had.
    #[test]
    fn algorithm_commands_take_the_key_and_their_parameters() {
        let mut arities = Vec::new();
        for_each_algorithm!(L => arities.push((L::ROW.command, L::ARITY)));
        assert_eq!(
            arities,
            [
                (c"RL.TOKENBUCKET", -5),
                (c"RL.FIXEDWINDOW", -4),
                (c"RL.LEAKYBUCKET", -5),
                (c"RL.SLIDING", -4),
                (c"RL.HASHWINDOW", -5),
                (c"RL.CONCURRENCY", -4),
                (c"RL.QUOTA", -4),
            ]
        );
    }
}

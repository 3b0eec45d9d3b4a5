//! redis-ratelimit: rate limiting as native, atomic Redis commands.
//!
//! This file only registers the module: its name, data types, commands with
//! their flags and key positions. See `docs/design.md` for the layout.

mod alloc;
pub mod args;
pub mod clock;
mod commands;
mod config;
mod datatype;
mod deny_log;
pub mod error;
/// Fuzz entry points (`fuzz/`, `docs/fuzzing.md`); not part of the module.
#[cfg(any(test, feature = "fuzzing"))]
#[doc(hidden)]
pub mod fuzzing;
mod guard;
/// The algorithms live in the core crate (`core/`, `redis-ratelimit-core`):
/// pure state machines without Redis. `crate::limiter` is its name here.
pub use redis_ratelimit_core as limiter;
mod policy;
mod replicate;
mod stats;

use std::ffi::CStr;
use std::os::raw::c_int;

use redis_module::raw;

use crate::commands::docs::{raw_args, Arg, Subcommand, COST, COST_OR_REFUND};
use crate::commands::limiter::handler as limiter;
use crate::limiter::fixed_window::FixedWindowState;
use crate::limiter::hash_window::HashWindowState;
use crate::limiter::leaky_bucket::LeakyBucketState;
use crate::limiter::sliding_log::SlidingLogState;
use crate::limiter::token_bucket::TokenBucketState;
use crate::limiter::{FixedWindow, HashWindow, LeakyBucket, SlidingLog, TokenBucket};

#[global_allocator]
static ALLOCATOR: alloc::ModuleAlloc = alloc::ModuleAlloc;

/// The name `MODULE LIST` shows.
const MODULE_NAME: &CStr = c"ratelimit";
/// `MODULE LIST` version: major * 10000 + minor * 100 + patch.
const MODULE_VERSION: c_int = 100;

const OK: c_int = raw::REDISMODULE_OK as c_int;
const ERR: c_int = raw::REDISMODULE_ERR as c_int;

type Handler = unsafe extern "C" fn(
    *mut raw::RedisModuleCtx,
    *mut *mut raw::RedisModuleString,
    c_int,
) -> c_int;

/// One command: name, handler, Redis flags, key positions (first, last,
/// step), arity (negative: at least that many words, command name included),
/// what `COMMAND DOCS` shows (summary, complexity, arguments), and the ACL
/// categories where the server supports them.
struct Command {
    name: &'static CStr,
    handler: Handler,
    flags: &'static CStr,
    keys: (c_int, c_int, c_int),
    arity: c_int,
    summary: &'static CStr,
    complexity: &'static CStr,
    args: &'static [Arg],
    acl: &'static CStr,
}

const COMMANDS: &[Command] = &[
    Command {
        name: c"RL.TOKENBUCKET",
        handler: limiter::<TokenBucket>,
        flags: c"write fast",
        keys: (1, 1, 1),
        arity: -5,
        summary: c"Token bucket with continuous refill: admits a request of COST units (default 1) if the bucket holds them",
        complexity: c"O(1)",
        args: &[
            Arg::key(c"key"),
            Arg::integer(c"capacity"),
            Arg::integer(c"refill_count"),
            Arg::integer(c"refill_ms"),
            COST_OR_REFUND,
        ],
        acl: c"write fast",
    },
    Command {
        name: c"RL.FIXEDWINDOW",
        handler: limiter::<FixedWindow>,
        flags: c"write fast",
        keys: (1, 1, 1),
        arity: -4,
        summary: c"Fixed window counter aligned on the Unix epoch: admits a request of COST units (default 1) if the window has room",
        complexity: c"O(1)",
        args: &[
            Arg::key(c"key"),
            Arg::integer(c"limit"),
            Arg::integer(c"window_ms"),
            COST_OR_REFUND,
        ],
        acl: c"write fast",
    },
    Command {
        name: c"RL.LEAKYBUCKET",
        handler: limiter::<LeakyBucket>,
        flags: c"write fast",
        keys: (1, 1, 1),
        arity: -5,
        summary: c"Leaky bucket as a shaping queue: admits a request of COST units if the queue has room, and tells in wait_ms when its turn comes",
        complexity: c"O(1)",
        args: &[
            Arg::key(c"key"),
            Arg::integer(c"capacity"),
            Arg::integer(c"leak_count"),
            Arg::integer(c"leak_ms"),
            COST_OR_REFUND,
        ],
        acl: c"write fast",
    },
    Command {
        name: c"RL.SLIDING",
        handler: limiter::<SlidingLog>,
        flags: c"write fast",
        keys: (1, 1, 1),
        arity: -4,
        summary: c"Exact sliding log: admits a request of COST units if no window_ms interval would hold more than limit units",
        complexity: c"O(1) amortised for admissions, O(log N) for denials, N the entries in the window",
        args: &[
            Arg::key(c"key"),
            Arg::integer(c"limit"),
            Arg::integer(c"window_ms"),
            COST_OR_REFUND,
        ],
        acl: c"write fast",
    },
    Command {
        name: c"RL.HASHWINDOW",
        handler: limiter::<HashWindow>,
        flags: c"write fast",
        keys: (1, 1, 1),
        arity: -5,
        summary: c"Sliding window approximated by fixed buckets: admits a request of COST units if the buckets covering window_ms have room",
        complexity: c"O(1) amortised for admissions, O(B) for denials, B = window_ms / bucket_ms",
        args: &[
            Arg::key(c"key"),
            Arg::integer(c"limit"),
            Arg::integer(c"window_ms"),
            Arg::integer(c"bucket_ms"),
            COST_OR_REFUND,
        ],
        acl: c"write fast",
    },
    Command {
        name: c"RL.ALL",
        handler: commands::all::handler,
        flags: c"write getkeys-api",
        keys: (0, 0, 0),
        arity: -5,
        summary: c"Several limiters at once, all or nothing: units are taken from every limiter only if every one admits",
        complexity: c"O(K) for K limiters, each as its own command",
        args: &[
            Arg::integer(c"numkeys"),
            Arg::key(c"key").multiple(),
            Arg::string(c"spec")
                .multiple()
                .summary(c"an algorithm and its parameters, or POLICY name"),
            COST.optional(),
        ],
        acl: c"write",
    },
    Command {
        name: c"RL.HIT",
        handler: commands::policy::hit_handler,
        flags: c"write fast",
        keys: (2, 2, 1),
        arity: -3,
        summary: c"Applies policy `name` to limiter key `key`: the policy's algorithm, mode and roll-out",
        complexity: c"As the policy's algorithm",
        args: &[Arg::string(c"name"), Arg::key(c"key"), COST_OR_REFUND],
        acl: c"write fast",
    },
    Command {
        name: c"RL.SETSTATE",
        handler: commands::setstate::handler,
        flags: c"write",
        keys: (1, 1, 1),
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

/// The ACL category of every command, where the server lets modules add one.
const ACL_CATEGORY: &CStr = c"ratelimit";

/// Entry point called by redis-server on `--loadmodule` / `MODULE LOAD`.
///
/// # Safety
/// Called by Redis with a valid context and `argc` arguments.
#[no_mangle]
pub unsafe extern "C" fn RedisModule_OnLoad(
    ctx: *mut raw::RedisModuleCtx,
    argv: *mut *mut raw::RedisModuleString,
    argc: c_int,
) -> c_int {
    // Everything, from Init on, inside the guard: a panic while reading the
    // load arguments fails the load instead of aborting the server.
    guard::callback(ERR, || {
        let init = unsafe {
            raw::Export_RedisModule_Init(
                ctx,
                MODULE_NAME.as_ptr(),
                MODULE_VERSION,
                raw::REDISMODULE_APIVER_1 as c_int,
            )
        };
        if init != OK {
            return ERR;
        }
        let arguments = unsafe { commands::all_args(argv, argc) };
        if let Err(message) = config::apply_load_arguments(&arguments) {
            let mut message = format!("ratelimit: {message}").into_bytes();
            message.retain(|&b| b != 0);
            message.push(0);
            if let Ok(message) = CStr::from_bytes_with_nul(&message) {
                log_warning(ctx, message);
            }
            return ERR;
        }
        match unsafe { load(ctx) } {
            Ok(()) => OK,
            Err(message) => {
                log_warning(ctx, message);
                ERR
            }
        }
    })
}

unsafe fn load(ctx: *mut raw::RedisModuleCtx) -> Result<(), &'static CStr> {
    unsafe {
        api!(RedisModule_SetModuleOptions)(
            ctx,
            (raw::REDISMODULE_OPTIONS_HANDLE_IO_ERRORS
                | raw::REDISMODULE_OPTION_NO_IMPLICIT_SIGNAL_MODIFIED) as c_int,
        );
        datatype::register::<TokenBucketState>(ctx, true)?;
        datatype::register::<FixedWindowState>(ctx, false)?;
        datatype::register::<LeakyBucketState>(ctx, false)?;
        datatype::register::<SlidingLogState>(ctx, false)?;
        datatype::register::<HashWindowState>(ctx, false)?;
        replicate::init(ctx);
        config::register(ctx)?;
        if api!(RedisModule_RegisterInfoFunc)(ctx, Some(stats::info)) != OK {
            return Err(c"could not register the INFO section");
        }
    }
    // Module-defined ACL categories exist from Redis 7.4; older servers and
    // Valkey load without it.
    let custom_category = match unsafe { raw::RedisModule_AddACLCategory } {
        Some(add) => (unsafe { add(ctx, ACL_CATEGORY.as_ptr()) }) == OK,
        None => false,
    };
    register_container(
        ctx,
        c"RL.POLICY",
        c"Manages policies: SET, GET, DEL, LIST, HELP",
        &commands::policy::SUBCOMMANDS,
        custom_category,
    )?;
    register_container(
        ctx,
        c"RL.LOG",
        c"Reads the deny log: GET, LEN, RESET, HELP",
        &commands::log::SUBCOMMANDS,
        custom_category,
    )?;
    for command in COMMANDS {
        let (first, last, step) = command.keys;
        let created = unsafe {
            api!(RedisModule_CreateCommand)(
                ctx,
                command.name.as_ptr(),
                Some(command.handler),
                command.flags.as_ptr(),
                first,
                last,
                step,
            )
        };
        if created != OK {
            return Err(c"could not create a command");
        }
        let cmd = unsafe { api!(RedisModule_GetCommand)(ctx, command.name.as_ptr()) };
        if cmd.is_null() {
            return Err(c"could not find a command just created");
        }
        let info = Info {
            summary: command.summary,
            complexity: command.complexity,
            arity: command.arity,
            args: command.args,
            keys_by_numkeys: command.keys == (0, 0, 0),
        };
        set_command_info(cmd, &info)?;
        set_acl_categories(ctx, cmd, command.acl, custom_category);
    }
    Ok(())
}

/// A command made of subcommands (`RL.POLICY SET ...`), each with its own
/// flags, arity and `COMMAND DOCS`.
fn register_container(
    ctx: *mut raw::RedisModuleCtx,
    name: &'static CStr,
    summary: &'static CStr,
    subcommands: &'static [Subcommand],
    custom_category: bool,
) -> Result<(), &'static CStr> {
    let created =
        unsafe { api!(RedisModule_CreateCommand)(ctx, name.as_ptr(), None, c"".as_ptr(), 0, 0, 0) };
    if created != OK {
        return Err(c"could not create a command");
    }
    let parent = unsafe { api!(RedisModule_GetCommand)(ctx, name.as_ptr()) };
    if parent.is_null() {
        return Err(c"could not find a command just created");
    }
    let container = Info {
        summary,
        // Redis's own words for its containers (CONFIG, CLIENT, ...).
        complexity: c"Depends on subcommand.",
        arity: -2,
        args: &[],
        keys_by_numkeys: false,
    };
    set_command_info(parent, &container)?;
    for sub in subcommands {
        let created = unsafe {
            api!(RedisModule_CreateSubcommand)(
                parent,
                sub.name.as_ptr(),
                Some(sub.handler),
                sub.flags.as_ptr(),
                0,
                0,
                0,
            )
        };
        if created != OK {
            return Err(c"could not create a subcommand");
        }
        let full = format!(
            "{}|{}",
            name.to_string_lossy(),
            sub.name.to_string_lossy().to_lowercase()
        );
        let full = std::ffi::CString::new(full).expect("no NUL in a name");
        let cmd = unsafe { api!(RedisModule_GetCommand)(ctx, full.as_ptr()) };
        if cmd.is_null() {
            return Err(c"could not find a subcommand just created");
        }
        let info = Info {
            summary: sub.summary,
            complexity: sub.complexity,
            arity: sub.arity,
            args: sub.args,
            keys_by_numkeys: false,
        };
        set_command_info(cmd, &info)?;
        let acl = if sub.flags.to_bytes().starts_with(b"write") {
            c"write"
        } else {
            c"read"
        };
        set_acl_categories(ctx, cmd, acl, custom_category);
    }
    Ok(())
}

/// What `COMMAND INFO` and `COMMAND DOCS` say of a command beyond its flags
/// and key positions.
struct Info {
    summary: &'static CStr,
    complexity: &'static CStr,
    arity: c_int,
    args: &'static [Arg],
    /// RL.ALL: the keys follow `numkeys`, declared as a key spec.
    keys_by_numkeys: bool,
}

/// Arity (so that a wrong argument count inside `MULTI` aborts the
/// transaction at once, like Redis's own commands) and `COMMAND DOCS`:
/// summary, complexity, arguments. The key positions stay those given to
/// `CreateCommand`.
fn set_command_info(
    cmd: *mut raw::RedisModuleCommand,
    command: &Info,
) -> Result<(), &'static CStr> {
    static VERSION: raw::RedisModuleCommandInfoVersion = raw::RedisModuleCommandInfoVersion {
        version: 1,
        sizeof_historyentry: std::mem::size_of::<raw::RedisModuleCommandHistoryEntry>(),
        sizeof_keyspec: std::mem::size_of::<raw::RedisModuleCommandKeySpec>(),
        sizeof_arg: std::mem::size_of::<raw::RedisModuleCommandArg>(),
    };
    // RL.ALL: `numkeys` at argv[1], then the keys.
    let mut numkeys_spec = [
        raw::RedisModuleCommandKeySpec {
            notes: std::ptr::null(),
            flags: (raw::REDISMODULE_CMD_KEY_RW | raw::REDISMODULE_CMD_KEY_UPDATE) as u64,
            begin_search_type: raw::RedisModuleKeySpecBeginSearchType_REDISMODULE_KSPEC_BS_INDEX,
            bs: raw::RedisModuleCommandKeySpec__bindgen_ty_1 {
                index: raw::RedisModuleCommandKeySpec__bindgen_ty_1__bindgen_ty_1 { pos: 1 },
            },
            find_keys_type: raw::RedisModuleKeySpecFindKeysType_REDISMODULE_KSPEC_FK_KEYNUM,
            fk: raw::RedisModuleCommandKeySpec__bindgen_ty_2 {
                keynum: raw::RedisModuleCommandKeySpec__bindgen_ty_2__bindgen_ty_2 {
                    keynumidx: 0,
                    firstkey: 1,
                    keystep: 1,
                },
            },
        },
        // terminator
        unsafe { std::mem::zeroed() },
    ];
    let key_specs = if command.keys_by_numkeys {
        numkeys_spec.as_mut_ptr()
    } else {
        std::ptr::null_mut()
    };
    let mut info = raw::RedisModuleCommandInfo {
        version: &VERSION,
        summary: command.summary.as_ptr(),
        complexity: command.complexity.as_ptr(),
        since: c"0.1.0".as_ptr(),
        history: std::ptr::null_mut(),
        tips: std::ptr::null(),
        arity: command.arity,
        key_specs,
        args: raw_args(command.args),
    };
    if unsafe { api!(RedisModule_SetCommandInfo)(cmd, &mut info) } != OK {
        return Err(c"could not set command info");
    }
    Ok(())
}

/// Command ACL categories exist from Redis 7.2 (and in Valkey); on older
/// servers the commands carry only the categories their flags imply.
fn set_acl_categories(
    ctx: *mut raw::RedisModuleCtx,
    cmd: *mut raw::RedisModuleCommand,
    acl: &CStr,
    custom: bool,
) {
    let Some(set) = (unsafe { raw::RedisModule_SetCommandACLCategories }) else {
        return;
    };
    let mut categories = acl.to_bytes().to_vec();
    if custom {
        categories.push(b' ');
        categories.extend_from_slice(ACL_CATEGORY.to_bytes());
    }
    categories.push(0);
    if unsafe { set(cmd, categories.as_ptr().cast()) } != OK {
        log_warning(ctx, c"could not set ACL categories");
    }
}

fn log_warning(ctx: *mut raw::RedisModuleCtx, message: &CStr) {
    log(ctx, c"warning", message);
}

pub(crate) fn log_notice(ctx: *mut raw::RedisModuleCtx, message: &CStr) {
    log(ctx, c"notice", message);
}

fn log(ctx: *mut raw::RedisModuleCtx, level: &CStr, message: &CStr) {
    if let Some(log) = unsafe { raw::RedisModule_Log } {
        unsafe { log(ctx, level.as_ptr(), c"%s".as_ptr(), message.as_ptr()) };
    }
}

/// Server events the module follows: any of them may bring a consumer of the
/// replication stream (see `replicate.rs`); a dataset being loaded also
/// brings its own policies.
pub(crate) unsafe extern "C" fn on_server_event(
    ctx: *mut raw::RedisModuleCtx,
    event: raw::RedisModuleEvent,
    subevent: u64,
    _data: *mut std::os::raw::c_void,
) {
    guard::callback((), || {
        replicate::consumer_may_appear(ctx);
        let loading_starts = [
            raw::REDISMODULE_SUBEVENT_LOADING_RDB_START,
            raw::REDISMODULE_SUBEVENT_LOADING_AOF_START,
            raw::REDISMODULE_SUBEVENT_LOADING_REPL_START,
        ];
        if event.id == raw::REDISMODULE_EVENT_LOADING && loading_starts.contains(&subevent) {
            policy::clear();
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::commands::docs::words;

    /// Every command and subcommand with its arity and the words before its
    /// arguments.
    fn every_command() -> Vec<(String, c_int, &'static [Arg], usize)> {
        let subcommands = |container: &str, table: &'static [Subcommand]| {
            table
                .iter()
                .map(|s| {
                    let name = format!("{container} {}", s.name.to_string_lossy());
                    (name, s.arity, s.args, 2)
                })
                .collect::<Vec<_>>()
        };
        let mut all: Vec<_> = COMMANDS
            .iter()
            .map(|c| (c.name.to_string_lossy().into_owned(), c.arity, c.args, 1))
            .collect();
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
            if arity > 0 {
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
}

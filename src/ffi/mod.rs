//! The one home of the module API.
//!
//! Every call into redis-server (`RedisModule_*`) and every entry point
//! redis-server calls (`extern "C"`: the commands, the type callbacks, INFO,
//! server events, configs, `RedisModule_OnLoad`) lives in this folder
//! (`RedisModule_OnLoad` is declared by [`module!`] at the crate's root, so
//! that nothing here names what lies above it). The
//! rest of the module is safe Rust: it sees a [`Context`], an [`Argv`], a
//! [`Key`], [`RdbIo`], and registers what it offers through the functions
//! of `register.rs`; it never holds a raw pointer.
//!
//! - `guard.rs`: the one panic guard every entry point runs under;
//! - `entry.rs`: the generic trampolines: a safe Rust function becomes an
//!   `extern "C"` entry point;
//! - `context.rs`: the command context: flags, replies, propagation,
//!   keyspace events, `CONFIG GET`, logging;
//! - `argv.rs`: a command's arguments, borrowed from the server's strings;
//! - `block.rs`: blocked clients (`BLOCK`), timers and key signals;
//! - `string.rs`: module strings the module owns (the words and numbers it
//!   propagates);
//! - `key.rs`: an open key: type check, value, expiry, write signals;
//! - `packed.rs`, `thin.rs`: the loans of a key's value pointer for the
//!   states packed into it (the forms themselves are `crate::packing`'s, safe
//!   arithmetic) or kept in one block behind it; the row of each algorithm
//!   (`src/algorithms.rs`) says which representation its state has;
//! - `datatype.rs`: the native types' callbacks and their RDB, AOF and
//!   digest streams;
//! - `info.rs`, `config.rs`, `events.rs`: the `INFO` section, module
//!   configs and server events;
//! - `register.rs`, `docs.rs`: module load, commands with their
//!   `COMMAND DOCS`, ACL categories;
//! - `alloc.rs`: the global allocator (the server's);
//! - `clock.rs`: the operating system's wall clock (`clock_gettime`).
//!
//! The wrappers are thin: `#[inline]` calls through the server's function
//! pointers, nothing allocated on the way, so the hot path costs what the
//! raw calls cost (see `docs/design.md`, "Why the module wraps the raw API
//! itself").

/// The server's function `$name`, panicking (inside the guard) if the server
/// does not provide it.
macro_rules! api {
    ($name:ident) => {{
        #[allow(unused_unsafe)]
        // SAFETY: a plain read of a function pointer the server sets once, at
        // module load, before it calls anything of the module.
        let function = unsafe { ::redis_module::raw::$name };
        match function {
            Some(f) => f,
            None => panic!(concat!(
                stringify!($name),
                " is not provided by this server"
            )),
        }
    }};
}

mod alloc;
mod argv;
mod block;
mod clock;
mod config;
mod context;
mod datatype;
mod docs;
mod entry;
mod events;
mod guard;
mod info;
mod key;
mod packed;
mod register;
mod string;
mod thin;

pub use alloc::{allocations, ModuleAlloc};
pub use argv::{Argv, RString, Words};
pub use block::{
    create_timer, key_served_here, key_ttl_ms, signal_ready, stop_timer, unblock,
    wakes_missing_keys, BlockedClient, TimerId,
};
pub use clock::wall_clock_us;
pub use config::NumericConfig;
pub use context::{Context, Head, Level, Word, MAX_NUMBERS};
pub use datatype::Boxed;
pub use datatype::{AuxData, DataType, Digest, RdbIo, Repr, Rewrite, TypeMethods};
#[cfg(test)]
pub use docs::words;
pub use docs::Arg;
pub use entry::command;
pub use events::ServerEvent;
pub use info::InfoContext;
pub use key::{Key, Slot};
#[allow(unused_imports)] // `Stored`: the in-memory key space's
pub use packed::{BucketRepr, CounterRepr, Stored};
pub(crate) use register::module;
pub use register::{load_module, Command, KeySpec, Load, Subcommand};
pub use string::SharedString;
pub use thin::ThinRepr;

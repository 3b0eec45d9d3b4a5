//! Module load: `RedisModule_OnLoad`, and the registration of commands with
//! their flags, key positions, arity, `COMMAND DOCS` and ACL categories.
//! (Types, configs, the INFO section and server events register from their
//! own files, through the same [`Load`].)

use std::ffi::{CStr, CString};
use std::os::raw::c_int;
use std::ptr;

use redis_module::raw;

use super::argv::Argv;
use super::context::{Context, Level};
use super::docs::{raw_args, Arg};
use super::entry::Handler;
use super::guard;
use super::string::SharedString;

const OK: c_int = raw::REDISMODULE_OK as c_int;
const ERR: c_int = raw::REDISMODULE_ERR as c_int;

/// Declares the module's entry point, `RedisModule_OnLoad`, where the
/// crate's root invokes it: the server calls it on `--loadmodule` / `MODULE
/// LOAD`, and it runs [`load_module`] with the module's name, version and
/// `on_load` (a `fn(&Load, &Argv) -> Result<(), String>`). The macro lets
/// this folder own the entry point without naming anything above it.
macro_rules! module {
    (name: $name:expr, version: $version:expr, on_load: $on_load:expr $(,)?) => {
        /// The module's entry point (see `ffi::load_module`).
        ///
        /// # Safety
        /// Called by the server with a valid context and `argc` arguments.
        #[no_mangle]
        #[allow(unsafe_code)]
        pub unsafe extern "C" fn RedisModule_OnLoad(
            ctx: *mut ::redis_module::raw::RedisModuleCtx,
            argv: *mut *mut ::redis_module::raw::RedisModuleString,
            argc: ::std::os::raw::c_int,
        ) -> ::std::os::raw::c_int {
            // SAFETY: the server's own arguments to OnLoad, passed on as
            // they came.
            unsafe { $crate::ffi::load_module(ctx, argv, argc, $name, $version, $on_load) }
        }
    };
}
pub(crate) use module;

/// What `RedisModule_OnLoad` does: initialises the module API for module
/// `name` at `version`, then hands the rest to `on_load`, whose error it
/// logs and turns into a failed load.
///
/// # Safety
/// Called with the context and the `argc` arguments the server passed to
/// `RedisModule_OnLoad`.
pub unsafe fn load_module(
    ctx: *mut raw::RedisModuleCtx,
    argv: *mut *mut raw::RedisModuleString,
    argc: c_int,
    name: &CStr,
    version: i32,
    on_load: impl FnOnce(&Load, &Argv) -> Result<(), String>,
) -> c_int {
    // Everything, from Init on, inside the guard: a panic while reading the
    // load arguments fails the load instead of aborting the server.
    guard::callback(ERR, || {
        // SAFETY: the context the server passed to OnLoad, and NUL-terminated
        // name; Init fills in the API's function pointers.
        let init = unsafe {
            raw::Export_RedisModule_Init(
                ctx,
                name.as_ptr(),
                version,
                raw::REDISMODULE_APIVER_1 as c_int,
            )
        };
        if init != OK {
            return ERR;
        }
        // SAFETY: the context and the `argc` load arguments of this call.
        let (ctx, argv) = unsafe { (Context::from_ptr(ctx), Argv::from_raw(argv, argc)) };
        match on_load(&Load { ctx: &ctx }, &argv) {
            Ok(()) => OK,
            Err(message) => {
                ctx.log(Level::Warning, &message);
                ERR
            }
        }
    })
}

/// The module being loaded: what it registers with the server.
pub struct Load<'a> {
    ctx: &'a Context,
}

/// One command, as registered: name, handler, flags, key positions, arity
/// (negative: at least that many words, the command name included), what
/// `COMMAND DOCS` shows (summary, complexity, arguments), and its ACL
/// categories where the server supports them.
pub struct Command {
    pub name: &'static CStr,
    pub handler: Handler,
    pub flags: &'static CStr,
    pub keys: KeySpec,
    pub arity: i32,
    pub summary: &'static CStr,
    pub complexity: &'static CStr,
    pub args: &'static [Arg],
    pub acl: &'static CStr,
}

/// Where a command's keys are.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum KeySpec {
    /// Argument positions: first, last (negative from the end), step.
    At { first: i32, last: i32, step: i32 },
    /// `numkeys` at argv[1], the keys after it (`RL.ALL`): declared as a key
    /// spec, and found by the command itself when the server asks
    /// ([`Context::is_keys_position_request`]).
    AfterNumkeys,
    /// No key: a command on node state (a policy's loop).
    None,
}

/// One subcommand of a container (`RL.POLICY SET`), as registered.
pub struct Subcommand {
    pub name: &'static CStr,
    pub handler: Handler,
    pub flags: &'static CStr,
    /// Counting the container's name and the subcommand's (`RL.LOG LEN` is 2).
    pub arity: i32,
    pub summary: &'static CStr,
    pub complexity: &'static CStr,
    pub args: &'static [Arg],
}

impl Load<'_> {
    pub(super) fn ctx(&self) -> &Context {
        self.ctx
    }

    /// The load's context, as commands see theirs.
    pub fn context(&self) -> &Context {
        self.ctx
    }

    /// Makes the server string of `word`, for the life of the module.
    pub fn make_shared(&self, word: &SharedString) {
        word.create();
    }

    /// Writes `message` to the server log as a warning.
    pub fn warn(&self, message: &str) {
        self.ctx.log(Level::Warning, message);
    }

    /// The options the module runs with: it handles RDB read errors itself
    /// (`RdbIo` reports them), and signals the keys it modifies itself
    /// (`Key::written`, only when something changed).
    pub fn set_module_options(&self) {
        let options = raw::REDISMODULE_OPTIONS_HANDLE_IO_ERRORS
            | raw::REDISMODULE_OPTION_NO_IMPLICIT_SIGNAL_MODIFIED;
        // SAFETY: the load context.
        unsafe { api!(RedisModule_SetModuleOptions)(self.ctx.as_ptr(), options as c_int) };
    }

    /// Adds ACL category `name`; `false` where the server cannot (module
    /// categories exist from Redis 7.4; older servers and Valkey load
    /// without).
    pub fn add_acl_category(&self, name: &CStr) -> bool {
        // SAFETY: a plain read of a function pointer set at load.
        match unsafe { raw::RedisModule_AddACLCategory } {
            // SAFETY: the load context and a NUL-terminated name.
            Some(add) => unsafe { add(self.ctx.as_ptr(), name.as_ptr()) == OK },
            None => false,
        }
    }

    /// Registers `command`, with ACL category `category` beside its own.
    pub fn create_command(
        &self,
        command: &Command,
        category: Option<&CStr>,
    ) -> Result<(), &'static str> {
        let (first, last, step) = match command.keys {
            KeySpec::At { first, last, step } => (first, last, step),
            KeySpec::AfterNumkeys | KeySpec::None => (0, 0, 0),
        };
        // SAFETY: the load context, NUL-terminated name and flags, and a
        // handler that lives as long as the module.
        let created = unsafe {
            api!(RedisModule_CreateCommand)(
                self.ctx.as_ptr(),
                command.name.as_ptr(),
                Some(command.handler.0),
                command.flags.as_ptr(),
                first,
                last,
                step,
            )
        };
        if created != OK {
            return Err("could not create a command");
        }
        let cmd = self
            .get_command(command.name)
            .ok_or("could not find a command just created")?;
        let info = Info {
            summary: command.summary,
            complexity: command.complexity,
            arity: command.arity,
            args: command.args,
            keys_by_numkeys: command.keys == KeySpec::AfterNumkeys,
        };
        set_command_info(cmd, &info)?;
        self.set_acl_categories(cmd, command.acl, category);
        Ok(())
    }

    /// Registers a command made of subcommands (`RL.POLICY SET ...`), each
    /// with its own flags, arity and `COMMAND DOCS`.
    pub fn create_container(
        &self,
        name: &'static CStr,
        summary: &'static CStr,
        subcommands: &[Subcommand],
        category: Option<&CStr>,
    ) -> Result<(), &'static str> {
        // SAFETY: the load context and NUL-terminated name and flags; a
        // container has no handler of its own.
        let created = unsafe {
            api!(RedisModule_CreateCommand)(
                self.ctx.as_ptr(),
                name.as_ptr(),
                None,
                c"".as_ptr(),
                0,
                0,
                0,
            )
        };
        if created != OK {
            return Err("could not create a command");
        }
        let parent = self
            .get_command(name)
            .ok_or("could not find a command just created")?;
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
            // SAFETY: a command the server just gave, NUL-terminated name and
            // flags, and a handler that lives as long as the module.
            let created = unsafe {
                api!(RedisModule_CreateSubcommand)(
                    parent,
                    sub.name.as_ptr(),
                    Some(sub.handler.0),
                    sub.flags.as_ptr(),
                    0,
                    0,
                    0,
                )
            };
            if created != OK {
                return Err("could not create a subcommand");
            }
            let full = format!(
                "{}|{}",
                name.to_string_lossy(),
                sub.name.to_string_lossy().to_lowercase()
            );
            let full = CString::new(full).map_err(|_| "a NUL in a command name")?;
            let cmd = self
                .get_command(&full)
                .ok_or("could not find a subcommand just created")?;
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
            self.set_acl_categories(cmd, acl, category);
        }
        Ok(())
    }

    fn get_command(&self, name: &CStr) -> Option<*mut raw::RedisModuleCommand> {
        // SAFETY: the load context and a NUL-terminated name.
        let cmd = unsafe { api!(RedisModule_GetCommand)(self.ctx.as_ptr(), name.as_ptr()) };
        (!cmd.is_null()).then_some(cmd)
    }

    /// Command ACL categories exist from Redis 7.2 (and in Valkey); on older
    /// servers the commands carry only the categories their flags imply.
    fn set_acl_categories(
        &self,
        cmd: *mut raw::RedisModuleCommand,
        acl: &CStr,
        category: Option<&CStr>,
    ) {
        // SAFETY: a plain read of a function pointer set at load.
        let Some(set) = (unsafe { raw::RedisModule_SetCommandACLCategories }) else {
            return;
        };
        let mut categories = acl.to_bytes().to_vec();
        if let Some(category) = category {
            categories.push(b' ');
            categories.extend_from_slice(category.to_bytes());
        }
        categories.push(0);
        // SAFETY: a command the server gave and a NUL-terminated list.
        if unsafe { set(cmd, categories.as_ptr().cast()) } != OK {
            self.warn("could not set ACL categories");
        }
    }
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
fn set_command_info(cmd: *mut raw::RedisModuleCommand, command: &Info) -> Result<(), &'static str> {
    static VERSION: raw::RedisModuleCommandInfoVersion = raw::RedisModuleCommandInfoVersion {
        version: 1,
        sizeof_historyentry: std::mem::size_of::<raw::RedisModuleCommandHistoryEntry>(),
        sizeof_keyspec: std::mem::size_of::<raw::RedisModuleCommandKeySpec>(),
        sizeof_arg: std::mem::size_of::<raw::RedisModuleCommandArg>(),
    };
    // RL.ALL: `numkeys` at argv[1], then the keys.
    let mut numkeys_spec = [
        raw::RedisModuleCommandKeySpec {
            notes: ptr::null(),
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
        // SAFETY: an all-zero key spec (null pointers, zero integers, the
        // first variants) is valid, and is the terminator the server reads.
        unsafe { std::mem::zeroed() },
    ];
    let key_specs = if command.keys_by_numkeys {
        numkeys_spec.as_mut_ptr()
    } else {
        ptr::null_mut()
    };
    let mut info = raw::RedisModuleCommandInfo {
        version: &VERSION,
        summary: command.summary.as_ptr(),
        complexity: command.complexity.as_ptr(),
        since: c"0.1.0".as_ptr(),
        history: ptr::null_mut(),
        tips: ptr::null(),
        arity: command.arity,
        key_specs,
        args: raw_args(command.args),
    };
    // SAFETY: a command the server gave, and an info whose every pointer is
    // static or leaked (`raw_args`) but `key_specs`, which the server copies
    // before this returns.
    if unsafe { api!(RedisModule_SetCommandInfo)(cmd, &mut info) } != OK {
        return Err("could not set command info");
    }
    Ok(())
}

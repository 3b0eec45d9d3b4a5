//! What `COMMAND DOCS` says of a command's arguments, as `redis-cli` hints
//! and client generators read them.
//!
//! Descriptions built in `const` tables; [`raw_args`] turns them into what
//! `RedisModule_SetCommandInfo` reads, once, at load time.

use std::ffi::CStr;
use std::os::raw::c_int;
use std::ptr;

use redis_module::raw;

/// One argument of a command. Built only by the constructors below, so that
/// what the server would refuse (a keyword without its token, a block
/// without members) cannot be written.
#[derive(Clone, Copy, Debug)]
pub struct Arg {
    name: &'static CStr,
    kind: Kind,
    token: Option<&'static CStr>,
    summary: Option<&'static CStr>,
    optional: bool,
    multiple: bool,
}

#[derive(Clone, Copy, Debug)]
enum Kind {
    /// A key name, found by the command's only key spec.
    Key,
    String,
    Integer,
    /// A keyword standing alone: its token is the whole argument.
    Keyword,
    /// Exactly one of the members.
    OneOf(&'static [Arg]),
    /// The members in order, as one unit.
    Block(&'static [Arg]),
}

impl Arg {
    const fn new(name: &'static CStr, kind: Kind) -> Arg {
        Arg {
            name,
            kind,
            token: None,
            summary: None,
            optional: false,
            multiple: false,
        }
    }

    pub const fn key(name: &'static CStr) -> Arg {
        Arg::new(name, Kind::Key)
    }

    pub const fn string(name: &'static CStr) -> Arg {
        Arg::new(name, Kind::String)
    }

    pub const fn integer(name: &'static CStr) -> Arg {
        Arg::new(name, Kind::Integer)
    }

    /// A pure token: `name` is its lower-case form, `token` what is typed.
    pub const fn keyword(name: &'static CStr, token: &'static CStr) -> Arg {
        Arg::new(name, Kind::Keyword).token(token)
    }

    pub const fn one_of(name: &'static CStr, members: &'static [Arg]) -> Arg {
        assert!(!members.is_empty(), "a oneof needs members");
        Arg::new(name, Kind::OneOf(members))
    }

    pub const fn block(name: &'static CStr, members: &'static [Arg]) -> Arg {
        assert!(!members.is_empty(), "a block needs members");
        Arg::new(name, Kind::Block(members))
    }

    /// The keyword typed before the value (`COST` before `n`).
    pub const fn token(mut self, token: &'static CStr) -> Arg {
        self.token = Some(token);
        self
    }

    pub const fn summary(mut self, summary: &'static CStr) -> Arg {
        self.summary = Some(summary);
        self
    }

    pub const fn optional(mut self) -> Arg {
        self.optional = true;
        self
    }

    pub const fn multiple(mut self) -> Arg {
        self.multiple = true;
        self
    }

    /// Its name in `COMMAND DOCS`.
    #[cfg(test)]
    pub fn name(&self) -> &'static CStr {
        self.name
    }

    /// The fewest and the most words this argument takes when present (no
    /// most for a repeated one).
    #[cfg(test)]
    pub fn words(&self) -> (usize, Option<usize>) {
        let token = usize::from(self.token.is_some() && !matches!(self.kind, Kind::Keyword));
        let (min, max) = match self.kind {
            Kind::Key | Kind::String | Kind::Integer | Kind::Keyword => (1, Some(1)),
            Kind::OneOf(members) => {
                let each = members.iter().map(Arg::words);
                let min = each.clone().map(|(min, _)| min).min().unwrap_or(0);
                let max = each
                    .map(|(_, max)| max)
                    .try_fold(0, |a, m| m.map(|m| a.max(m)));
                (min, max)
            }
            Kind::Block(members) => words(members),
        };
        let max = if self.multiple { None } else { max };
        (token + min, max.map(|max| token + max))
    }
}

/// The fewest and the most words a call with `args` takes after the
/// command's name (no most when an argument repeats).
#[cfg(test)]
pub fn words(args: &[Arg]) -> (usize, Option<usize>) {
    args.iter().fold((0, Some(0)), |(min, max), arg| {
        let (arg_min, arg_max) = arg.words();
        let min = if arg.optional { min } else { min + arg_min };
        (min, max.zip(arg_max).map(|(a, b)| a + b))
    })
}

/// `args` as the server reads them: an array ended by an entry without a
/// name, members hanging from their oneof or block. Null for no arguments.
///
/// Leaked: Redis 7.0 and Valkey copy what they are given, but the module API
/// does not promise it, so the arrays live as long as the module (a few
/// kilobytes, built once at load).
pub(super) fn raw_args(args: &'static [Arg]) -> *mut raw::RedisModuleCommandArg {
    if args.is_empty() {
        return ptr::null_mut();
    }
    let mut out: Vec<raw::RedisModuleCommandArg> = args.iter().map(raw_arg).collect();
    // SAFETY: an all-zero `RedisModuleCommandArg` (null pointers, zero
    // integers) is valid, and is the terminator the server looks for.
    out.push(unsafe { std::mem::zeroed() });
    Box::leak(out.into_boxed_slice()).as_mut_ptr()
}

fn raw_arg(arg: &'static Arg) -> raw::RedisModuleCommandArg {
    let text = |s: Option<&'static CStr>| s.map_or(ptr::null(), CStr::as_ptr);
    let (type_, subargs) = match arg.kind {
        Kind::Key => (
            raw::RedisModuleCommandArgType_REDISMODULE_ARG_TYPE_KEY,
            ptr::null_mut(),
        ),
        Kind::String => (
            raw::RedisModuleCommandArgType_REDISMODULE_ARG_TYPE_STRING,
            ptr::null_mut(),
        ),
        Kind::Integer => (
            raw::RedisModuleCommandArgType_REDISMODULE_ARG_TYPE_INTEGER,
            ptr::null_mut(),
        ),
        Kind::Keyword => (
            raw::RedisModuleCommandArgType_REDISMODULE_ARG_TYPE_PURE_TOKEN,
            ptr::null_mut(),
        ),
        Kind::OneOf(members) => (
            raw::RedisModuleCommandArgType_REDISMODULE_ARG_TYPE_ONEOF,
            raw_args(members),
        ),
        Kind::Block(members) => (
            raw::RedisModuleCommandArgType_REDISMODULE_ARG_TYPE_BLOCK,
            raw_args(members),
        ),
    };
    let mut flags = raw::REDISMODULE_CMD_ARG_NONE;
    if arg.optional {
        flags |= raw::REDISMODULE_CMD_ARG_OPTIONAL;
    }
    if arg.multiple {
        flags |= raw::REDISMODULE_CMD_ARG_MULTIPLE;
    }
    raw::RedisModuleCommandArg {
        name: arg.name.as_ptr(),
        type_,
        // Every command has one key spec: from its key positions, or from
        // `numkeys` for RL.ALL. The servers want -1 for anything else.
        key_spec_index: if matches!(arg.kind, Kind::Key) { 0 } else { -1 },
        token: text(arg.token),
        summary: text(arg.summary),
        since: ptr::null(),
        flags: flags as c_int,
        deprecated_since: ptr::null(),
        subargs,
        // Hints show the name (Redis 7.0 keeps no display text; Valkey
        // fills it in with the name).
        display_text: ptr::null(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A limiter's options, as the module documents them (`crate::args`,
    /// which sits above this folder).
    const COST_OR_REFUND: Arg = Arg::one_of(
        c"cost-or-refund",
        &[
            Arg::block(
                c"cost",
                &[
                    Arg::integer(c"units"),
                    Arg::keyword(c"force", c"FORCE").optional(),
                ],
            )
            .token(c"COST"),
            Arg::block(c"refund", &[Arg::integer(c"units")]).token(c"REFUND"),
        ],
    )
    .optional();

    /// One raw argument, read back as the server reads it.
    #[derive(Debug)]
    struct ReadBack {
        name: String,
        type_: raw::RedisModuleCommandArgType,
        key_spec_index: c_int,
        token: Option<String>,
        flags: c_int,
        members: Vec<ReadBack>,
    }

    fn read_back(args: *const raw::RedisModuleCommandArg) -> Vec<ReadBack> {
        let text = |p: *const std::os::raw::c_char| {
            // SAFETY: every text `raw_arg` writes is null or a `&'static CStr`.
            (!p.is_null()).then(|| unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned())
        };
        let mut out = Vec::new();
        for i in 0.. {
            // SAFETY: `raw_args` ends every array with a nameless entry.
            let arg = unsafe { &*args.add(i) };
            let Some(name) = text(arg.name) else { break };
            let members = if arg.subargs.is_null() {
                Vec::new()
            } else {
                read_back(arg.subargs)
            };
            out.push(ReadBack {
                name,
                type_: arg.type_,
                key_spec_index: arg.key_spec_index,
                token: text(arg.token),
                flags: arg.flags,
                members,
            });
        }
        out
    }

    #[test]
    fn the_server_gets_every_argument_then_a_terminator() {
        static ARGS: [Arg; 2] = [Arg::key(c"key"), COST_OR_REFUND];
        let got = read_back(raw_args(&ARGS));
        assert_eq!(got.len(), 2);
        let key = &got[0];
        assert_eq!(key.name, "key");
        assert_eq!(
            key.type_,
            raw::RedisModuleCommandArgType_REDISMODULE_ARG_TYPE_KEY
        );
        assert_eq!(key.key_spec_index, 0, "the command's one key spec");
        let options = &got[1];
        assert_eq!(options.name, "cost-or-refund");
        assert_eq!(
            options.type_,
            raw::RedisModuleCommandArgType_REDISMODULE_ARG_TYPE_ONEOF
        );
        assert_eq!(options.key_spec_index, -1, "not a key");
        assert_eq!(options.token, None);
        assert_eq!(options.flags, raw::REDISMODULE_CMD_ARG_OPTIONAL as c_int);
        let [cost, refund] = &options.members[..] else {
            panic!("{:?}", options.members);
        };
        assert_eq!(
            (cost.name.as_str(), cost.token.as_deref()),
            ("cost", Some("COST"))
        );
        let names: Vec<&str> = cost.members.iter().map(|m| m.name.as_str()).collect();
        assert_eq!(names, ["units", "force"]);
        assert_eq!(
            cost.members[1].flags,
            raw::REDISMODULE_CMD_ARG_OPTIONAL as c_int
        );
        assert_eq!(
            (refund.name.as_str(), refund.token.as_deref()),
            ("refund", Some("REFUND"))
        );
    }

    #[test]
    fn a_keyword_carries_its_token() {
        static ARGS: [Arg; 1] = [Arg::keyword(c"force", c"FORCE")];
        let got = read_back(raw_args(&ARGS));
        assert_eq!(
            got[0].type_,
            raw::RedisModuleCommandArgType_REDISMODULE_ARG_TYPE_PURE_TOKEN
        );
        assert_eq!(got[0].token.as_deref(), Some("FORCE"));
    }

    #[test]
    fn no_arguments_are_a_null_array() {
        assert!(raw_args(&[]).is_null());
    }

    #[test]
    fn a_multiple_argument_takes_at_least_one_word() {
        assert_eq!(words(&[Arg::integer(c"params").multiple()]), (1, None));
    }
}

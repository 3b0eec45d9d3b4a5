//! What the server reports about the module: its name, its key types, each
//! command's key positions and flags (what cluster clients and ACLs rely
//! on), and each command's `COMMAND DOCS` (what `redis-cli` hints and client
//! generators read).

use crate::harness::*;

/// The text of a bulk or simple string reply.
fn text(value: &Value) -> Option<String> {
    match value {
        Value::BulkString(bytes) => Some(String::from_utf8_lossy(bytes).into_owned()),
        Value::SimpleString(s) => Some(s.clone()),
        Value::Okay => Some("OK".to_string()),
        _ => None,
    }
}

/// The value after `field` in a flat `[field, value, ...]` reply (or a map).
fn field<'a>(reply: &'a Value, name: &str) -> Option<&'a Value> {
    match reply {
        Value::Array(items) => items
            .chunks(2)
            .find(|pair| pair.len() == 2 && text(&pair[0]).as_deref() == Some(name))
            .map(|pair| &pair[1]),
        Value::Map(pairs) => pairs
            .iter()
            .find(|(k, _)| text(k).as_deref() == Some(name))
            .map(|(_, v)| v),
        _ => None,
    }
}

#[test]
fn module_list_shows_the_name_ratelimit() {
    for_each_server(|kind| {
        let server = Server::start(kind, &[]);
        let mut con = server.conn();
        let modules: Vec<Value> = query(&mut con, &["MODULE", "LIST"]);
        let names: Vec<String> = modules
            .iter()
            .filter_map(|module| field(module, "name").and_then(text))
            .collect();
        assert!(
            names.iter().any(|n| n == "ratelimit"),
            "MODULE LIST names: {names:?}"
        );
    });
}

#[test]
fn type_names_the_algorithm() {
    for_each_server(|kind| {
        let server = Server::start(kind, &[]);
        let mut con = server.conn();
        rl(&mut con, &["RL.TOKENBUCKET", "tb", "5", "1", "1000"]);
        rl(&mut con, &["RL.FIXEDWINDOW", "fw", "5", "1000"]);
        assert_eq!(key_type(&mut con, "tb"), "rl-tokbkt");
        assert_eq!(key_type(&mut con, "fw"), "rl-fixwin");
    });
}

#[test]
fn command_getkeys_finds_the_limiter_key() {
    for_each_server(|kind| {
        let server = Server::start(kind, &[]);
        let mut con = server.conn();
        for words in [
            ["COMMAND", "GETKEYS", "RL.TOKENBUCKET", "k", "1", "1", "1"].as_slice(),
            [
                "COMMAND",
                "GETKEYS",
                "RL.TOKENBUCKET",
                "k",
                "1",
                "1",
                "1",
                "COST",
                "2",
            ]
            .as_slice(),
            ["COMMAND", "GETKEYS", "RL.FIXEDWINDOW", "k", "1", "1"].as_slice(),
            [
                "COMMAND",
                "GETKEYS",
                "RL.FIXEDWINDOW",
                "k",
                "1",
                "1",
                "COST",
                "0",
            ]
            .as_slice(),
        ] {
            let keys: Vec<String> = query(&mut con, words);
            assert_eq!(keys, ["k"], "{words:?}");
        }
    });
}

/// `COMMAND INFO name` as (arity, flags, first key, last key, step).
fn command_info(con: &mut Connection, name: &str) -> (i64, Vec<String>, i64, i64, i64) {
    let reply: Vec<Value> = query(con, &["COMMAND", "INFO", name]);
    let Some(Value::Array(info)) = reply.first() else {
        panic!("COMMAND INFO {name}: {reply:?}");
    };
    let int = |v: &Value| match v {
        Value::Int(i) => *i,
        other => panic!("COMMAND INFO {name}: expected an integer, got {other:?}"),
    };
    let flags = match &info[2] {
        Value::Array(flags) | Value::Set(flags) => flags.iter().filter_map(text).collect(),
        other => panic!("COMMAND INFO {name}: flags {other:?}"),
    };
    (
        int(&info[1]),
        flags,
        int(&info[3]),
        int(&info[4]),
        int(&info[5]),
    )
}

#[test]
fn command_info_declares_the_key_and_write_fast_flags() {
    for_each_server(|kind| {
        let server = Server::start(kind, &[]);
        let mut con = server.conn();
        for (name, arity) in [("RL.TOKENBUCKET", -5), ("RL.FIXEDWINDOW", -4)] {
            let (got_arity, flags, first, last, step) = command_info(&mut con, name);
            // Variadic (COST is optional). Modules that do not set their arity
            // show -1 and check it themselves (see errors.rs).
            assert!(
                got_arity == arity || got_arity == -1,
                "{name} arity {got_arity}, expected {arity} (or -1)"
            );
            assert_eq!((first, last, step), (1, 1, 1), "{name} key positions");
            for flag in ["write", "fast"] {
                assert!(
                    flags.iter().any(|f| f == flag),
                    "{name} flags {flags:?} lack {flag}"
                );
            }
        }
    });
}

#[test]
fn limiter_commands_are_case_insensitive() {
    for_each_server(|kind| {
        let server = Server::start(kind, &[]);
        let mut con = server.conn();
        let r = rl(&mut con, &["rl.tokenbucket", "tb", "5", "1", "1000"]);
        assert_eq!((r.allowed, r.remaining), (true, 4));
        let r = rl(&mut con, &["Rl.FixedWindow", "fw", "5", "1000"]);
        assert_eq!((r.allowed, r.remaining), (true, 4));
    });
}

/// The value after `name` in a flat `[name, value, ...]` reply (or a map),
/// the name compared without case: servers show command names as registered.
fn entry<'a>(reply: &'a Value, name: &str) -> Option<&'a Value> {
    let matches = |k: &Value| text(k).is_some_and(|k| k.eq_ignore_ascii_case(name));
    match reply {
        Value::Array(items) => items
            .chunks(2)
            .find(|pair| pair.len() == 2 && matches(&pair[0]))
            .map(|pair| &pair[1]),
        Value::Map(pairs) => pairs.iter().find(|(k, _)| matches(k)).map(|(_, v)| v),
        _ => None,
    }
}

fn items(value: &Value) -> &[Value] {
    match value {
        Value::Array(items) | Value::Set(items) => items,
        other => panic!("expected an array, got {other:?}"),
    }
}

/// What `COMMAND DOCS` says of one command: `RL.POLICY SET` is looked up in
/// the container's `subcommands`, where the servers nest it.
fn docs(con: &mut Connection, name: &str) -> Value {
    let (container, sub) = match name.split_once(' ') {
        Some((container, sub)) => (container, Some(sub)),
        None => (name, None),
    };
    let reply: Value = query(con, &["COMMAND", "DOCS", container]);
    let doc =
        entry(&reply, container).unwrap_or_else(|| panic!("COMMAND DOCS {container}: {reply:?}"));
    match sub {
        None => doc.clone(),
        Some(sub) => {
            let subcommands = field(doc, "subcommands")
                .unwrap_or_else(|| panic!("{container} has no subcommands: {doc:?}"));
            entry(subcommands, &format!("{container}|{sub}"))
                .unwrap_or_else(|| panic!("{container} lacks {sub}: {subcommands:?}"))
                .clone()
        }
    }
}

/// A documented field's text, `""` when absent.
fn doc_text(doc: &Value, name: &str) -> String {
    field(doc, name).and_then(text).unwrap_or_default()
}

/// The arguments as syntax, the way `redis-cli` hints show them:
/// `key capacity ... [COST units [FORCE]|REFUND units]`.
fn syntax(args: &[Value]) -> String {
    let words: Vec<String> = args.iter().map(syntax_of).collect();
    words.join(" ")
}

fn syntax_of(arg: &Value) -> String {
    let kind = doc_text(arg, "type");
    let token = doc_text(arg, "token");
    let members = || items(field(arg, "arguments").expect("members of a oneof or block"));
    let flags: Vec<String> = field(arg, "flags")
        .map(|f| items(f).iter().filter_map(text).collect())
        .unwrap_or_default();
    let mut shown = match kind.as_str() {
        "pure-token" => token.clone(),
        "oneof" => {
            let each: Vec<String> = members().iter().map(syntax_of).collect();
            each.join("|")
        }
        "block" => syntax(members()),
        _ => doc_text(arg, "name"),
    };
    if !token.is_empty() && kind != "pure-token" {
        shown = format!("{token} {shown}");
    }
    if flags.iter().any(|f| f == "multiple") {
        shown = format!("{shown} [{shown} ...]");
    }
    if flags.iter().any(|f| f == "optional") {
        shown = format!("[{shown}]");
    }
    shown
}

/// Every argument, depth first, as `name:type`; a key must name the
/// command's key spec.
fn names_and_types(args: &[Value], out: &mut Vec<String>) {
    for arg in args {
        let kind = doc_text(arg, "type");
        if kind == "key" {
            assert_eq!(
                field(arg, "key_spec_index"),
                Some(&Value::Int(0)),
                "key {arg:?}"
            );
        }
        out.push(format!("{}:{kind}", doc_text(arg, "name")));
        if let Some(members) = field(arg, "arguments") {
            names_and_types(items(members), out);
        }
    }
}

/// `[COST n [FORCE] | REFUND n] [BLOCK timeout_ms]`, the options of every
/// limiter and RL.HIT.
const COST_OR_REFUND: &str = "[COST units [FORCE]|REFUND units] [BLOCK timeout_ms]";
const COST_OR_REFUND_ARGS: [&str; 7] = [
    "cost-or-refund:oneof",
    "cost:block",
    "units:integer",
    "force:pure-token",
    "refund:block",
    "units:integer",
    "timeout_ms:integer",
];

/// `[COST n [FORCE] | REFUND n | UPTO n] [BLOCK timeout_ms]`, the options of
/// the limiters that grant part of a request and of RL.HIT.
const COST_REFUND_OR_UPTO: &str = "[COST units [FORCE]|REFUND units|UPTO most] [BLOCK timeout_ms]";
const COST_REFUND_OR_UPTO_ARGS: [&str; 8] = [
    "cost-refund-or-upto:oneof",
    "cost:block",
    "units:integer",
    "force:pure-token",
    "refund:block",
    "units:integer",
    "most:integer",
    "timeout_ms:integer",
];

/// What `COMMAND DOCS` must say of a command or subcommand.
struct Documented {
    name: &'static str,
    /// The complexity, or how it starts.
    complexity: &'static str,
    syntax: String,
    /// Every argument, depth first, as `name:type`.
    args: Vec<String>,
}

fn documented(
    name: &'static str,
    complexity: &'static str,
    syntax: &str,
    args: &[&str],
) -> Documented {
    Documented {
        name,
        complexity,
        syntax: syntax.to_string(),
        args: args.iter().map(|a| a.to_string()).collect(),
    }
}

/// A limiter command: the key, integer parameters, then the options
/// (`UPTO` among them unless it is a shaping queue or leases).
fn limiter(name: &'static str, complexity: &'static str, params: &[&str]) -> Documented {
    let upto = !matches!(name, "RL.LEAKYBUCKET" | "RL.CONCURRENCY");
    let mut args = vec!["key:key".to_string()];
    args.extend(params.iter().map(|p| format!("{p}:integer")));
    let (options, options_args) = if upto {
        (COST_REFUND_OR_UPTO, &COST_REFUND_OR_UPTO_ARGS[..])
    } else {
        (COST_OR_REFUND, &COST_OR_REFUND_ARGS[..])
    };
    args.extend(options_args.iter().map(|a| a.to_string()));
    Documented {
        name,
        complexity,
        syntax: format!("key {} {options}", params.join(" ")),
        args,
    }
}

/// `CL.THROTTLE`'s arguments, redis-cell's.
const THROTTLE_ARGS: &[&str] = &[
    "key:key",
    "max_burst:integer",
    "count:integer",
    "period:integer",
    "quantity:integer",
];

/// Every command and subcommand.
fn every_command() -> Vec<Documented> {
    let mut hit_args = vec!["name:string", "key:key"];
    hit_args.extend(COST_REFUND_OR_UPTO_ARGS);
    vec![
        limiter(
            "RL.TOKENBUCKET",
            "O(1)",
            &["capacity", "refill_count", "refill_ms"],
        ),
        limiter(
            "RL.LEAKYBUCKET",
            "O(1)",
            &["capacity", "leak_count", "leak_ms"],
        ),
        limiter("RL.SLIDING", "O(1) amortised", &["limit", "window_ms"]),
        limiter(
            "RL.HASHWINDOW",
            "O(1) amortised",
            &["limit", "window_ms", "bucket_ms"],
        ),
        limiter("RL.FIXEDWINDOW", "O(1)", &["limit", "window_ms"]),
        limiter("RL.CONCURRENCY", "O(N)", &["limit", "lease_ms"]),
        Documented {
            name: "RL.QUOTA",
            complexity: "O(1)",
            syntax: format!("key limit DAY|WEEK|MONTH|YEAR [TZ zone] {COST_REFUND_OR_UPTO}"),
            args: ["key:key", "limit:integer", "period:oneof", "day:pure-token", "week:pure-token", "month:pure-token", "year:pure-token", "zone:string"]
                .iter()
                .map(|a| a.to_string())
                .chain(COST_REFUND_OR_UPTO_ARGS.map(String::from))
                .collect(),
        },
        documented(
            "RL.RELEASE",
            "O(N)",
            "key lease",
            &["key:key", "lease:integer"],
        ),
        documented(
            "RL.RENEW",
            "O(N)",
            "key lease lease_ms",
            &["key:key", "lease:integer", "lease_ms:integer"],
        ),
        documented(
            "RL.ALL",
            "O(K)",
            "numkeys key [key ...] spec [spec ...] [COST units [FORCE]|UPTO most] [BLOCK timeout_ms] [EACH]",
            &[
                "numkeys:integer",
                "key:key",
                "spec:string",
                "cost-or-upto:oneof",
                "cost:block",
                "units:integer",
                "force:pure-token",
                "most:integer",
                "timeout_ms:integer",
                "each:pure-token",
            ],
        ),
        documented(
            "RL.HIT",
            "As the policy's algorithm",
            &format!("name key {COST_REFUND_OR_UPTO}"),
            &hit_args,
        ),
        documented(
            "RL.SETSTATE",
            "O(1)",
            "key algorithm encoding fields [fields ...]",
            &[
                "key:key",
                "algorithm:string",
                "encoding:integer",
                "fields:integer",
            ],
        ),
        documented(
            "RL.POLICY SET",
            "O(1)",
            "name TOKENBUCKET|FIXEDWINDOW|LEAKYBUCKET|SLIDING|HASHWINDOW|CONCURRENCY|QUOTA params [params ...] \
             [MODE ENFORCE|SHADOW|OFF] [ROLLOUT percent] [TZ zone] \
             [ADAPT ERRORS pct [FACTOR factor] [MIN min] [RECOVER recover] [WINDOW window_ms] [MINCALLS mincalls]|OFF] \
             [STAGES degrade_pct break_pct] [WINDOW window_ms]",
            &[
                "name:string",
                "algorithm:oneof",
                "tokenbucket:pure-token",
                "fixedwindow:pure-token",
                "leakybucket:pure-token",
                "sliding:pure-token",
                "hashwindow:pure-token",
                "concurrency:pure-token",
                "quota:pure-token",
                "params:integer",
                "mode:oneof",
                "enforce:pure-token",
                "shadow:pure-token",
                "off:pure-token",
                "percent:integer",
                "zone:string",
                "adapt:oneof",
                "errors:block",
                "pct:integer",
                "factor:integer",
                "min:integer",
                "recover:integer",
                "window_ms:integer",
                "mincalls:integer",
                "off:pure-token",
                "stages:block",
                "degrade_pct:integer",
                "break_pct:integer",
                "window_ms:integer",
            ],
        ),
        documented(
            "RL.OUTCOME",
            "O(1)",
            "name ok errors [DENIED denied]",
            &["name:string", "ok:integer", "errors:integer", "denied:integer"],
        ),
        // Internal, as RL.SETSTATE: documented all the same.
        documented(
            "RL.LOOPSTATE",
            "O(1)",
            "name scale stage",
            &["name:string", "scale:integer", "stage:integer"],
        ),
        documented(
            "RL.POLICY SCALE",
            "O(1)",
            "name pct",
            &["name:string", "pct:integer"],
        ),
        documented("RL.POLICY STATS", "O(1)", "name", &["name:string"]),
        documented(
            "CL.THROTTLE",
            "O(1)",
            "key max_burst count period [quantity]",
            THROTTLE_ARGS,
        ),
        documented(
            "RL.THROTTLE",
            "O(1)",
            "key max_burst count period [quantity]",
            THROTTLE_ARGS,
        ),
        documented("RL.POLICY GET", "O(1)", "name", &["name:string"]),
        documented("RL.POLICY DEL", "O(1)", "name", &["name:string"]),
        documented(
            "RL.POLICY LIST",
            "O(N) where N is the number of policies",
            "",
            &[],
        ),
        documented("RL.POLICY HELP", "O(1)", "", &[]),
        documented(
            "RL.LOG GET",
            "O(N) where N is the number of entries returned",
            "[count]",
            &["count:integer"],
        ),
        documented("RL.LOG LEN", "O(1)", "", &[]),
        documented("RL.LOG RESET", "O(N)", "", &[]),
        documented("RL.LOG HELP", "O(1)", "", &[]),
    ]
}

#[test]
fn command_docs_give_every_command_its_complexity_and_arguments() {
    for_each_server(|kind| {
        let server = Server::start(kind, &[]);
        let mut con = server.conn();
        for expected in every_command() {
            let name = expected.name;
            let doc = docs(&mut con, name);
            let complexity = doc_text(&doc, "complexity");
            assert!(
                complexity.starts_with(expected.complexity),
                "{name} complexity {complexity:?}"
            );
            let args = field(&doc, "arguments").map(items).unwrap_or_default();
            assert_eq!(syntax(args), expected.syntax, "{name} syntax");
            let mut got = Vec::new();
            names_and_types(args, &mut got);
            assert_eq!(got, expected.args, "{name} arguments");
        }
    });
}

#[test]
fn command_docs_give_every_command_its_own_summary() {
    for_each_server(|kind| {
        let server = Server::start(kind, &[]);
        let mut con = server.conn();
        let containers = ["RL.POLICY", "RL.LOG"].map(|c| doc_text(&docs(&mut con, c), "summary"));
        for container in &containers {
            assert!(!container.is_empty(), "containers {containers:?}");
        }
        let mut seen: Vec<(&str, String)> = Vec::new();
        for Documented { name, .. } in every_command() {
            let summary = doc_text(&docs(&mut con, name), "summary");
            assert!(!summary.is_empty(), "{name} has no summary");
            assert!(
                !containers.contains(&summary),
                "{name} shows its container's summary"
            );
            // The two HELPs say the same, as Redis's own HELP subcommands do.
            if !name.ends_with(" HELP") {
                if let Some((other, _)) = seen.iter().find(|(_, s)| *s == summary) {
                    panic!("{name} has the summary of {other}: {summary:?}");
                }
            }
            seen.push((name, summary));
        }
    });
}

#[test]
fn command_docs_nest_every_subcommand_in_its_container() {
    for_each_server(|kind| {
        let server = Server::start(kind, &[]);
        let mut con = server.conn();
        for (container, subs) in [
            (
                "RL.POLICY",
                ["SET", "GET", "DEL", "LIST", "HELP", "SCALE", "STATS"].as_slice(),
            ),
            ("RL.LOG", ["GET", "LEN", "RESET", "HELP"].as_slice()),
        ] {
            let doc = docs(&mut con, container);
            assert_eq!(
                doc_text(&doc, "complexity"),
                "Depends on subcommand.",
                "{container}"
            );
            let subcommands = field(&doc, "subcommands").expect("subcommands");
            let count = match subcommands {
                Value::Array(items) => items.len() / 2,
                Value::Map(pairs) => pairs.len(),
                other => panic!("{container} subcommands {other:?}"),
            };
            assert_eq!(count, subs.len(), "{container}: {subcommands:?}");
        }
    });
}

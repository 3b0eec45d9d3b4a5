//! Talking to a server: connections, commands and their replies (the
//! five integers of a limiter), a few key and clock queries, and `INFO`
//! readings.

use std::thread::sleep;
use std::time::Duration;

pub use redis::{Connection, Value};

use super::*;

/// 2^40: the largest parameter and `COST` the commands accept.
pub const MAX_PARAM: u64 = 1 << 40;

// ---------------------------------------------------------------------------
// Connections

impl Server {
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    /// A new connection (30 s read timeout, so a hung server fails the test
    /// instead of hanging it).
    pub fn conn(&self) -> Connection {
        let client = redis::Client::open(self.url()).expect("client");
        let con = client
            .get_connection_with_timeout(Duration::from_secs(5))
            .unwrap_or_else(|e| panic!("connect to {} on {}: {e}", self.kind, self.port));
        con.set_read_timeout(Some(Duration::from_secs(30)))
            .expect("set_read_timeout");
        con
    }

    /// `INFO section` as text.
    pub fn info(&self, section: &str) -> String {
        let mut con = self.conn();
        redis::cmd("INFO")
            .arg(section)
            .query::<String>(&mut con)
            .expect("INFO")
    }
}

// ---------------------------------------------------------------------------
// Commands and replies

/// A command from its words, as redis-cli would send them.
pub fn command(words: &[&str]) -> redis::Cmd {
    let mut cmd = redis::cmd(words[0]);
    for word in &words[1..] {
        cmd.arg(*word);
    }
    cmd
}

/// Runs a command that must succeed.
pub fn query<T: redis::FromRedisValue>(con: &mut Connection, words: &[&str]) -> T {
    command(words)
        .query(con)
        .unwrap_or_else(|e| panic!("{words:?} failed: {}", error_text(&e)))
}

/// Runs a command that must fail; returns the error as the server wrote it,
/// e.g. `ERR wrong number of arguments for 'rl.tokenbucket' command`.
pub fn query_err(con: &mut Connection, words: &[&str]) -> String {
    match command(words).query::<Value>(con) {
        Ok(v) => panic!("{words:?} succeeded with {v:?}, expected an error"),
        Err(e) => error_text(&e),
    }
}

/// A server error as its raw text: `CODE detail`.
pub fn error_text(e: &redis::RedisError) -> String {
    match (e.code(), e.detail()) {
        (Some(code), Some(detail)) => format!("{code} {detail}"),
        (Some(code), None) => code.to_string(),
        _ => e.to_string(),
    }
}

/// The five integers every limiter command replies.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Reply {
    pub allowed: bool,
    pub limit: i64,
    pub remaining: i64,
    pub wait_ms: i64,
    pub reset_ms: i64,
}

impl Reply {
    pub fn from_ints(ints: &[i64]) -> Reply {
        assert_eq!(ints.len(), 5, "a limiter reply has 5 integers: {ints:?}");
        assert!(
            ints[0] == 0 || ints[0] == 1,
            "allowed must be 0 or 1: {ints:?}"
        );
        Reply {
            allowed: ints[0] == 1,
            limit: ints[1],
            remaining: ints[2],
            wait_ms: ints[3],
            reset_ms: ints[4],
        }
    }

    pub fn from_value(value: &Value) -> Reply {
        match value {
            Value::Array(items) => {
                let ints: Vec<i64> = items
                    .iter()
                    .map(|item| match item {
                        Value::Int(i) => *i,
                        other => panic!("limiter reply holds a non-integer: {other:?}"),
                    })
                    .collect();
                Reply::from_ints(&ints)
            }
            other => panic!("limiter reply is not an array: {other:?}"),
        }
    }
}

/// Runs a limiter command that must succeed, e.g.
/// `rl(&mut con, &["RL.TOKENBUCKET", "user:1", "5", "1", "1000"])`.
pub fn rl(con: &mut Connection, words: &[&str]) -> Reply {
    Reply::from_ints(&query::<Vec<i64>>(con, words))
}

/// `DUMP key`, `None` when the key does not exist.
pub fn dump(con: &mut Connection, key: &str) -> Option<Vec<u8>> {
    query(con, &["DUMP", key])
}

pub fn pttl(con: &mut Connection, key: &str) -> i64 {
    query(con, &["PTTL", key])
}

pub fn exists(con: &mut Connection, key: &str) -> bool {
    query::<i64>(con, &["EXISTS", key]) == 1
}

pub fn dbsize(con: &mut Connection) -> i64 {
    query(con, &["DBSIZE"])
}

pub fn key_type(con: &mut Connection, key: &str) -> String {
    query(con, &["TYPE", key])
}

/// The server's clock (`TIME`) in microseconds since the epoch.
pub fn server_time_us(con: &mut Connection) -> u64 {
    let (secs, micros): (u64, u64) = query(con, &["TIME"]);
    secs * 1_000_000 + micros
}

/// Waits, if needed, until the current `window_ms`-aligned window has more
/// than `margin_ms` left, so a test's few calls all land in one window.
pub fn away_from_window_end(con: &mut Connection, window_ms: u64, margin_ms: u64) {
    loop {
        let now_ms = server_time_us(con) / 1000;
        let left_ms = window_ms - now_ms % window_ms;
        if left_ms > margin_ms {
            return;
        }
        sleep(Duration::from_millis(left_ms + 1));
    }
}

// ---------------------------------------------------------------------------
// INFO

/// The value of `field` in an `INFO` text.
pub fn info_field(info: &str, field: &str) -> Option<String> {
    info.lines().find_map(|line| {
        let (name, value) = line.trim_end().split_once(':')?;
        (name == field).then(|| value.to_string())
    })
}

/// `INFO commandstats` as `(lowercased command, field, value)` for each
/// numeric field of each command whose name starts with `prefix`.
pub fn command_stats(server: &Server, prefix: &str) -> Vec<(String, String, u64)> {
    let info = server.info("commandstats");
    let mut stats = Vec::new();
    for line in info.lines() {
        let Some((name, fields)) = line.trim_end().split_once(':') else {
            continue;
        };
        let Some(command) = name.strip_prefix("cmdstat_") else {
            continue;
        };
        let command = command.to_lowercase();
        if !command.starts_with(prefix) {
            continue;
        }
        for field in fields.split(',') {
            if let Some((field, value)) = field.split_once('=') {
                if let Ok(value) = value.parse() {
                    stats.push((command.clone(), field.to_string(), value));
                }
            }
        }
    }
    stats
}

/// `field` of `command` in [`command_stats`], 0 if absent.
pub fn command_stat(stats: &[(String, String, u64)], command: &str, field: &str) -> u64 {
    stats
        .iter()
        .find(|(c, f, _)| c == command && f == field)
        .map_or(0, |(_, _, v)| *v)
}

/// `INFO section` over an open connection. Unlike [`Server::info`], it opens
/// no connection (a new connection from this client sends `CLIENT SETINFO`,
/// an error reply on Redis 7.0 that `INFO stats` counts).
pub fn info_via(con: &mut Connection, section: &str) -> String {
    query(con, &["INFO", section])
}

/// `total_error_replies` from `INFO stats`, read over an open connection.
pub fn error_replies_via(con: &mut Connection) -> u64 {
    info_field(&info_via(con, "stats"), "total_error_replies")
        .and_then(|v| v.parse().ok())
        .expect("total_error_replies in INFO stats")
}

/// `SAVE`, once no background save is running: the one a replica's full
/// sync started may still be writing when the replica is already in sync
/// (on Redis 8 it outlives the sync), and `SAVE` refuses to run beside it.
pub fn save(con: &mut Connection) {
    poll_until(
        "a background save to end before SAVE",
        Duration::from_secs(20),
        || {
            info_field(&info_via(con, "persistence"), "rdb_bgsave_in_progress").as_deref()
                == Some("0")
        },
    );
    let _: () = query(con, &["SAVE"]);
}

/// A string reply (bulk or simple), or a panic naming what came instead.
pub fn text(value: &Value) -> String {
    match value {
        Value::BulkString(bytes) => String::from_utf8_lossy(bytes).into_owned(),
        Value::SimpleString(s) => s.clone(),
        other => panic!("expected a string, got {other:?}"),
    }
}

/// An integer reply, or a panic naming what came instead.
pub fn int(value: &Value) -> i64 {
    match value {
        Value::Int(i) => *i,
        other => panic!("expected an integer, got {other:?}"),
    }
}

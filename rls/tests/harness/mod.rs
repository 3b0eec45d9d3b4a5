//! What the service's end-to-end tests share: real redis-server processes
//! with the module on free loopback ports (one server, or a 3-master
//! cluster), a runtime folder whose `current` symlink can be swapped, the
//! `redis-ratelimit-rls` binary as a process with its log in a file, its
//! gRPC client over TCP, a raw HTTP/1.1 client for `/healthcheck`,
//! `/metrics` and `/json`, and waiting by polling with deadlines.
//!
//! - `RL_MODULE`: the module (`make test` sets it; default the workspace's
//!   target/release one).
//! - `REDIS_SERVER`, `VALKEY_SERVER`: the binaries (default: `redis-server`
//!   on `PATH`; what `scripts/valkey-path.sh` prints).

#![allow(dead_code)]

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

pub use redis_ratelimit_rls::proto::{
    rate_limit_descriptor::{Entry, RateLimitOverride},
    rate_limit_response::{Code, DescriptorStatus},
    rate_limit_service_client::RateLimitServiceClient,
    RateLimitDescriptor, RateLimitRequest, RateLimitResponse,
};
use tonic::transport::Channel;

/// How long anything may take to come up or to converge on a busy machine.
pub const PATIENCE: Duration = Duration::from_secs(60);

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

pub fn module() -> PathBuf {
    if let Some(m) = std::env::var_os("RL_MODULE").filter(|m| !m.is_empty()) {
        return m.into();
    }
    workspace().join("target/release/libredis_ratelimit.so")
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Redis,
    Valkey,
}

impl Kind {
    fn binary(self) -> PathBuf {
        match self {
            Kind::Redis => std::env::var_os("REDIS_SERVER")
                .filter(|p| !p.is_empty())
                .map(PathBuf::from)
                .unwrap_or_else(|| "redis-server".into()),
            Kind::Valkey => {
                if let Some(p) = std::env::var_os("VALKEY_SERVER").filter(|p| !p.is_empty()) {
                    return p.into();
                }
                let out = Command::new(workspace().join("scripts/valkey-path.sh"))
                    .output()
                    .expect("scripts/valkey-path.sh");
                assert!(out.status.success(), "no valkey-server: run make setup");
                String::from_utf8_lossy(&out.stdout).trim().into()
            }
        }
    }
}

/// Polls `cond` until it holds, or fails the test after [`PATIENCE`].
pub fn wait_until(what: &str, mut cond: impl FnMut() -> bool) {
    let start = Instant::now();
    while !cond() {
        assert!(start.elapsed() < PATIENCE, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The async twin of [`wait_until`]: `cond` is polled every 20 ms.
pub async fn wait_for<F, Fut>(what: &str, mut cond: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let start = Instant::now();
    while !cond().await {
        assert!(start.elapsed() < PATIENCE, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A loopback port nobody listens on now, below the ephemeral range; the
/// counter keeps the tests of one binary from picking the same one.
pub fn free_port() -> u16 {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let base = 20_000 + (std::process::id() % 300) * 30;
    loop {
        let port = (base + NEXT.fetch_add(1, Ordering::Relaxed) % 9_000) as u16;
        // Both the port and, for cluster nodes, its bus port must be free.
        if TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
}

pub fn temp_dir(tag: &str) -> PathBuf {
    static N: AtomicU32 = AtomicU32::new(0);
    let dir = std::env::temp_dir().join(format!(
        "rl-rls-{}-{}-{tag}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// One server process on a port of its own; `restart` brings it back on
/// the same port after `kill9`.
pub struct Server {
    pub kind: Kind,
    pub port: u16,
    args: Vec<String>,
    dir: PathBuf,
    child: Option<Child>,
}

impl Server {
    pub fn start(kind: Kind) -> Server {
        Server::start_with(kind, &[], true)
    }

    /// A server without the module.
    pub fn start_bare(kind: Kind) -> Server {
        Server::start_with(kind, &[], false)
    }

    pub fn start_with(kind: Kind, extra: &[&str], with_module: bool) -> Server {
        let port = free_port();
        let dir = temp_dir(&port.to_string());
        let mut args: Vec<String> = ["--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        args.extend(extra.iter().map(|s| s.to_string()));
        if with_module {
            let module = module();
            assert!(
                module.exists(),
                "no module at {} (set RL_MODULE or build it)",
                module.display()
            );
            args.push("--loadmodule".into());
            args.push(module.to_string_lossy().into());
        }
        let mut server = Server {
            kind,
            port,
            args,
            dir,
            child: None,
        };
        server.restart();
        server
    }

    /// Starts the process (again) on its port, and waits until that very
    /// process answers.
    pub fn restart(&mut self) {
        assert!(self.child.is_none(), "the server still runs");
        let child = Command::new(self.kind.binary())
            .arg("--port")
            .arg(self.port.to_string())
            .arg("--dir")
            .arg(&self.dir)
            .args(&self.args)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start the server");
        let pid = child.id().to_string();
        self.child = Some(child);
        let port = self.port;
        wait_until(&format!("{:?} {pid} on {port}", self.kind), || {
            match self.try_info("server") {
                Ok(info) => {
                    assert_eq!(
                        info.get("process_id").map(String::as_str),
                        Some(pid.as_str()),
                        "another server answers on {port}"
                    );
                    true
                }
                Err(_) => false,
            }
        });
    }

    pub fn addr(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    pub fn conn(&self) -> redis::Connection {
        redis::Client::open(self.url())
            .unwrap()
            .get_connection_with_timeout(Duration::from_secs(5))
            .unwrap()
    }

    /// Runs a command and converts its reply.
    pub fn query<T: redis::FromRedisValue>(&self, args: &[&str]) -> T {
        let mut cmd = redis::cmd(args[0]);
        for a in &args[1..] {
            cmd.arg(*a);
        }
        cmd.query(&mut self.conn())
            .unwrap_or_else(|e| panic!("{args:?}: {e}"))
    }

    pub fn try_info(&self, section: &str) -> redis::RedisResult<HashMap<String, String>> {
        let mut conn =
            redis::Client::open(self.url())?.get_connection_with_timeout(Duration::from_secs(2))?;
        let text: String = redis::cmd("INFO").arg(section).query(&mut conn)?;
        Ok(text
            .lines()
            .filter_map(|l| l.split_once(':'))
            .map(|(k, v)| (k.to_string(), v.trim().to_string()))
            .collect())
    }

    /// Calls of `command` (`rl.all`) in `INFO commandstats`.
    pub fn calls(&self, command: &str) -> u64 {
        let wanted = format!("cmdstat_{command}").to_ascii_lowercase();
        self.try_info("commandstats")
            .unwrap()
            .into_iter()
            .find(|(k, _)| k.to_ascii_lowercase() == wanted)
            .and_then(|(_, v)| {
                v.split(',')
                    .find_map(|f| f.strip_prefix("calls="))
                    .and_then(|n| n.parse().ok())
            })
            .unwrap_or(0)
    }

    /// The server's clock (`TIME`) in microseconds since the epoch.
    pub fn time_us(&self) -> u64 {
        let t: Vec<u64> = self.query(&["TIME"]);
        t[0] * 1_000_000 + t[1]
    }

    /// Every key of the server's database (tests' databases are small).
    pub fn keys(&self) -> Vec<String> {
        let mut keys: Vec<String> = self.query(&["KEYS", "*"]);
        keys.sort();
        keys
    }

    /// `kill -9`.
    pub fn kill9(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.kill9();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A cluster of 3 masters (no replicas: the tests need slots on several
/// nodes, not failover), every node loading the module.
pub struct Cluster {
    pub nodes: Vec<Server>,
}

impl Cluster {
    pub fn start(kind: Kind) -> Cluster {
        let nodes: Vec<Server> = (0..3)
            .map(|_| {
                let bus = free_port().to_string();
                Server::start_with(
                    kind,
                    &[
                        "--cluster-enabled",
                        "yes",
                        "--cluster-port",
                        &bus,
                        "--cluster-node-timeout",
                        "15000",
                        "--cluster-config-file",
                        "nodes.conf",
                    ],
                    true,
                )
            })
            .collect();
        for (i, m) in nodes.iter().enumerate() {
            let lo = (i * 16384 / 3).to_string();
            let hi = ((i + 1) * 16384 / 3 - 1).to_string();
            let _: String = m.query(&["CLUSTER", "SET-CONFIG-EPOCH", &(i + 1).to_string()]);
            let _: String = m.query(&["CLUSTER", "ADDSLOTSRANGE", &lo, &hi]);
        }
        for n in &nodes[1..] {
            let bus: Vec<String> = n.query(&["CONFIG", "GET", "cluster-port"]);
            let _: String =
                nodes[0].query(&["CLUSTER", "MEET", "127.0.0.1", &n.port.to_string(), &bus[1]]);
        }
        wait_until("cluster_state:ok on every node", || {
            nodes.iter().all(|n| {
                let text: String = n.query(&["CLUSTER", "NODES"]);
                let info: String = n.query(&["CLUSTER", "INFO"]);
                text.lines().count() == 3
                    && !text.contains("handshake")
                    && info.contains("cluster_state:ok")
            })
        });
        Cluster { nodes }
    }

    /// `REDIS_URL` for `REDIS_TYPE=cluster`.
    pub fn redis_url(&self) -> String {
        self.nodes
            .iter()
            .map(Server::addr)
            .collect::<Vec<_>>()
            .join(",")
    }

    /// `RL.ALL` calls on each master.
    pub fn rl_all_calls(&self) -> Vec<u64> {
        self.nodes.iter().map(|n| n.calls("rl.all")).collect()
    }

    pub fn keyslot(&self, key: &str) -> u64 {
        self.nodes[0].query(&["CLUSTER", "KEYSLOT", key])
    }

    /// Every key of every master, with the index of the node that holds it.
    pub fn keys(&self) -> Vec<(usize, String)> {
        self.nodes
            .iter()
            .enumerate()
            .flat_map(|(i, n)| n.keys().into_iter().map(move |k| (i, k)))
            .collect()
    }
}

/// The runtime folder: `RUNTIME_ROOT` is `<base>/current`, a symlink to a
/// version folder `<base>/vN` holding `ratelimit/config/*.yaml`
/// (`RUNTIME_SUBDIRECTORY=ratelimit`, `RUNTIME_APPDIRECTORY=config`).
pub struct Runtime {
    pub base: PathBuf,
    version: u32,
}

impl Runtime {
    pub fn new(files: &[(&str, &str)]) -> Runtime {
        let mut rt = Runtime {
            base: temp_dir("runtime"),
            version: 0,
        };
        rt.swap(files);
        rt
    }

    pub fn root(&self) -> PathBuf {
        self.base.join("current")
    }

    /// The config folder `current` points to now.
    pub fn config_dir(&self) -> PathBuf {
        self.base
            .join(format!("v{}", self.version))
            .join("ratelimit/config")
    }

    /// Writes `files` into a new version folder and points `current` at it
    /// by renaming a new symlink over the old one (atomic, as deployments
    /// swap runtime folders).
    pub fn swap(&mut self, files: &[(&str, &str)]) {
        self.version += 1;
        let dir = self.config_dir();
        std::fs::create_dir_all(&dir).unwrap();
        for (name, text) in files {
            std::fs::write(dir.join(name), text).unwrap();
        }
        let link = self.base.join(format!("current.new{}", self.version));
        std::os::unix::fs::symlink(format!("v{}", self.version), &link).unwrap();
        std::fs::rename(&link, self.root()).unwrap();
    }

    /// Writes (or rewrites) one file in place in the current version: a
    /// file edited where it is, as without symlinks. The write goes through
    /// a temporary file and a rename so the poller never sees half a file.
    pub fn write(&self, name: &str, text: &str) {
        let dir = self.config_dir();
        let tmp = dir.join(format!(".{name}.tmp"));
        std::fs::write(&tmp, text).unwrap();
        std::fs::rename(&tmp, dir.join(name)).unwrap();
    }
}

impl Drop for Runtime {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.base);
    }
}

/// A fixture of the CONFIG helper (rls/tests/fixtures/NAME).
pub fn fixture(name: &str) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The service under test: this crate's binary, or `RLS_BIN` (the
/// reference's `service_cmd`, to check what the tests expect of it).
pub fn rls_binary() -> PathBuf {
    std::env::var_os("RLS_BIN")
        .filter(|b| !b.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(|| env!("CARGO_BIN_EXE_redis-ratelimit-rls").into())
}

/// The environment every test's service starts with: loopback ports, the
/// runtime folder, a fast config poll, JSON logs at debug level.
pub fn base_env(redis_url: &str, runtime: &Runtime) -> Vec<(String, String)> {
    [
        ("HOST", "127.0.0.1".to_string()),
        ("GRPC_HOST", "127.0.0.1".to_string()),
        ("REDIS_URL", redis_url.to_string()),
        ("REDIS_TYPE", "single".to_string()),
        (
            "RUNTIME_ROOT",
            runtime.root().to_string_lossy().into_owned(),
        ),
        ("RUNTIME_SUBDIRECTORY", "ratelimit".to_string()),
        ("RUNTIME_APPDIRECTORY", "config".to_string()),
        ("RLS_CONFIG_POLL_MS", "100".to_string()),
        ("LOG_FORMAT", "json".to_string()),
        ("LOG_LEVEL", "debug".to_string()),
        // A generous Redis deadline: the machine is shared and busy; the
        // fault tests set their own.
        ("REDIS_TIMEOUT", "2s".to_string()),
        // The reference's own (ignored here), for runs with RLS_BIN.
        ("USE_STATSD", "false".to_string()),
        ("REDIS_SOCKET_TYPE", "tcp".to_string()),
        ("DEBUG_PORT", free_port().to_string()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect()
}

/// Sets `key` in `env`, replacing an earlier value.
pub fn set_env(env: &mut Vec<(String, String)>, key: &str, value: &str) {
    env.retain(|(k, _)| k != key);
    env.push((key.to_string(), value.to_string()));
}

/// The service as a process: its ports, its log file (stdout and stderr).
pub struct Rls {
    pub http_port: u16,
    pub grpc_port: u16,
    pub log: PathBuf,
    child: Child,
}

impl Rls {
    /// Starts the binary with exactly `env` (plus the ports), and waits
    /// until `/healthcheck` answers 200 and the gRPC port accepts.
    pub fn start(env: &[(String, String)]) -> Rls {
        let (http_port, grpc_port) = (free_port(), free_port());
        let log = temp_dir("rls-log").join("rls.log");
        let out = std::fs::File::create(&log).unwrap();
        let child = Command::new(rls_binary())
            .env_clear()
            .envs(env.iter().map(|(k, v)| (k, v)))
            .env("PORT", http_port.to_string())
            .env("GRPC_PORT", grpc_port.to_string())
            .stdout(out.try_clone().unwrap())
            .stderr(out)
            .spawn()
            .expect("start redis-ratelimit-rls");
        let mut rls = Rls {
            http_port,
            grpc_port,
            log,
            child,
        };
        let start = Instant::now();
        loop {
            if let Ok(Some(status)) = rls.child.try_wait() {
                panic!("the service exited ({status}):\n{}", rls.log_text());
            }
            let healthy = rls
                .try_http("GET", "/healthcheck", "")
                .is_ok_and(|r| r.status == 200);
            if healthy && TcpStream::connect(("127.0.0.1", grpc_port)).is_ok() {
                break;
            }
            assert!(
                start.elapsed() < PATIENCE,
                "the service never became healthy:\n{}",
                rls.log_text()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        rls
    }

    /// Runs the binary with `env` and waits for it to exit (it must, before
    /// [`PATIENCE`]): its status and what it wrote.
    pub fn run_to_exit(env: &[(String, String)]) -> (ExitStatus, String) {
        let (http_port, grpc_port) = (free_port(), free_port());
        let mut child = Command::new(rls_binary())
            .env_clear()
            .envs(env.iter().map(|(k, v)| (k, v)))
            .env("PORT", http_port.to_string())
            .env("GRPC_PORT", grpc_port.to_string())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start redis-ratelimit-rls");
        let start = Instant::now();
        let status = loop {
            if let Some(status) = child.try_wait().unwrap() {
                break status;
            }
            if start.elapsed() > PATIENCE {
                let _ = child.kill();
                let out = child.wait_with_output().unwrap();
                panic!(
                    "the service did not exit: {}{}",
                    String::from_utf8_lossy(&out.stdout),
                    String::from_utf8_lossy(&out.stderr)
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        let out = child.wait_with_output().unwrap();
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        (status, text)
    }

    /// What the service logged so far.
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// A gRPC client on a new TCP connection.
    pub async fn client(&self) -> RateLimitServiceClient<Channel> {
        let channel = Channel::from_shared(format!("http://127.0.0.1:{}", self.grpc_port))
            .unwrap()
            .connect_timeout(Duration::from_secs(5))
            .connect()
            .await
            .expect("connect to the gRPC port");
        RateLimitServiceClient::new(channel)
    }

    /// One HTTP/1.1 request on a new connection (`Connection: close`).
    pub fn try_http(&self, method: &str, path: &str, body: &str) -> std::io::Result<HttpReply> {
        http(self.http_port, method, path, body)
    }

    pub fn http(&self, method: &str, path: &str, body: &str) -> HttpReply {
        self.try_http(method, path, body)
            .unwrap_or_else(|e| panic!("{method} {path}: {e}"))
    }

    /// `GET /metrics`, parsed.
    pub fn metrics(&self) -> Metrics {
        let reply = self.http("GET", "/metrics", "");
        assert_eq!(reply.status, 200, "{}", reply.body);
        Metrics::parse(&reply.body)
    }

    /// `POST /json` with `body`.
    pub fn json(&self, body: &str) -> (u16, serde_json::Value) {
        let reply = self.http("POST", "/json", body);
        let value = serde_json::from_str(&reply.body).unwrap_or(serde_json::Value::Null);
        (reply.status, value)
    }
}

impl Drop for Rls {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if let Some(dir) = self.log.parent() {
            if !std::thread::panicking() {
                let _ = std::fs::remove_dir_all(dir);
            } else {
                eprintln!("the service's log stays at {}", self.log.display());
            }
        }
    }
}

pub struct HttpReply {
    pub status: u16,
    /// Header names in lower case.
    pub headers: Vec<(String, String)>,
    pub body: String,
}

impl HttpReply {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

/// A raw HTTP/1.1 exchange on 127.0.0.1:`port`: enough for the service's
/// small, complete answers (a body by `Content-Length`, chunks, or to EOF).
pub fn http(port: u16, method: &str, path: &str, body: &str) -> std::io::Result<HttpReply> {
    let mut stream = TcpStream::connect(("127.0.0.1", port))?;
    stream.set_read_timeout(Some(Duration::from_secs(10)))?;
    let mut req =
        format!("{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\n");
    if method == "POST" {
        req.push_str(&format!(
            "Content-Type: application/json\r\nContent-Length: {}\r\n",
            body.len()
        ));
    }
    req.push_str("\r\n");
    req.push_str(body);
    stream.write_all(req.as_bytes())?;
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw)?;
    let bad = |what: &str| std::io::Error::new(std::io::ErrorKind::InvalidData, what.to_string());
    let split = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .ok_or_else(|| bad("no end of headers"))?;
    let head = String::from_utf8_lossy(&raw[..split]).into_owned();
    let mut rest = &raw[split + 4..];
    let mut lines = head.split("\r\n");
    let status: u16 = lines
        .next()
        .and_then(|l| l.split(' ').nth(1))
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| bad("no status line"))?;
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_string()))
        .collect();
    let chunked = headers
        .iter()
        .any(|(k, v)| k == "transfer-encoding" && v.eq_ignore_ascii_case("chunked"));
    let mut body = Vec::new();
    if chunked {
        loop {
            let eol = rest
                .windows(2)
                .position(|w| w == b"\r\n")
                .ok_or_else(|| bad("bad chunk"))?;
            let size = usize::from_str_radix(String::from_utf8_lossy(&rest[..eol]).trim(), 16)
                .map_err(|_| bad("bad chunk size"))?;
            rest = &rest[eol + 2..];
            if size == 0 {
                break;
            }
            body.extend_from_slice(&rest[..size]);
            rest = &rest[size + 2..];
        }
    } else if let Some(len) = headers
        .iter()
        .find(|(k, _)| k == "content-length")
        .and_then(|(_, v)| v.parse::<usize>().ok())
    {
        body.extend_from_slice(&rest[..len.min(rest.len())]);
    } else {
        body.extend_from_slice(rest);
    }
    Ok(HttpReply {
        status,
        headers,
        body: String::from_utf8_lossy(&body).into_owned(),
    })
}

/// One sample of a scrape: its name, its labels, its value.
#[derive(Debug, Clone)]
pub struct Sample {
    pub name: String,
    pub labels: Vec<(String, String)>,
    pub value: f64,
}

/// A `/metrics` scrape (Prometheus text or OpenMetrics).
#[derive(Debug, Default)]
pub struct Metrics {
    pub samples: Vec<Sample>,
    pub text: String,
}

impl Metrics {
    pub fn parse(text: &str) -> Metrics {
        let mut samples = Vec::new();
        for line in text.lines() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let (series, value) = match line.split_once('}') {
                Some((s, rest)) => (format!("{s}}}"), rest.trim()),
                None => match line.split_once(' ') {
                    Some((s, rest)) => (s.to_string(), rest.trim()),
                    None => continue,
                },
            };
            // OpenMetrics may append a timestamp or an exemplar.
            let value = value.split_whitespace().next().unwrap_or("");
            let Ok(value) = value.parse::<f64>() else {
                continue;
            };
            let (name, labels) = match series.split_once('{') {
                Some((n, l)) => (n.to_string(), parse_labels(l.trim_end_matches('}'))),
                None => (series, Vec::new()),
            };
            samples.push(Sample {
                name,
                labels,
                value,
            });
        }
        Metrics {
            samples,
            text: text.to_string(),
        }
    }

    /// The sum of the samples named `name` (or `name_total`, as OpenMetrics
    /// names counters) whose labels include every pair of `labels`.
    pub fn sum(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        let total = format!("{name}_total");
        self.samples
            .iter()
            .filter(|s| s.name == name || s.name == total)
            .filter(|s| {
                labels
                    .iter()
                    .all(|(k, v)| s.labels.iter().any(|(lk, lv)| lk == k && lv == v))
            })
            .map(|s| s.value)
            .sum()
    }

    /// Whether any sample has this name (or `name_total`).
    pub fn has(&self, name: &str) -> bool {
        let total = format!("{name}_total");
        self.samples
            .iter()
            .any(|s| s.name == name || s.name == total)
    }

    /// The names of every sample, for failure messages.
    pub fn names(&self) -> Vec<String> {
        let mut names: Vec<String> = self.samples.iter().map(|s| s.name.clone()).collect();
        names.sort();
        names.dedup();
        names
    }
}

fn parse_labels(text: &str) -> Vec<(String, String)> {
    let mut labels = Vec::new();
    let mut rest = text.trim();
    while !rest.is_empty() {
        let Some((key, after)) = rest.split_once("=\"") else {
            break;
        };
        let mut value = String::new();
        let mut chars = after.char_indices();
        let mut end = after.len();
        while let Some((i, c)) = chars.next() {
            match c {
                '\\' => {
                    if let Some((_, n)) = chars.next() {
                        value.push(if n == 'n' { '\n' } else { n });
                    }
                }
                '"' => {
                    end = i + 1;
                    break;
                }
                c => value.push(c),
            }
        }
        labels.push((key.trim().trim_start_matches(',').trim().to_string(), value));
        rest = after[end..].trim_start_matches(',').trim();
    }
    labels
}

// ---- building requests and reading replies ----

/// A descriptor of `(key, value)` entries.
pub fn desc(entries: &[(&str, &str)]) -> RateLimitDescriptor {
    RateLimitDescriptor {
        entries: entries
            .iter()
            .map(|(k, v)| Entry {
                key: k.to_string(),
                value: v.to_string(),
            })
            .collect(),
        ..Default::default()
    }
}

/// A descriptor with its own `hits_addend`.
pub fn desc_hits(entries: &[(&str, &str)], hits: u64) -> RateLimitDescriptor {
    let mut d = desc(entries);
    d.hits_addend = Some(hits);
    d
}

pub fn request(domain: &str, descriptors: Vec<RateLimitDescriptor>) -> RateLimitRequest {
    RateLimitRequest {
        domain: domain.to_string(),
        descriptors,
        hits_addend: 0,
    }
}

/// One call; a failure is the status's code and message.
pub async fn call(
    client: &mut RateLimitServiceClient<Channel>,
    req: RateLimitRequest,
) -> Result<RateLimitResponse, tonic::Status> {
    client.should_rate_limit(req).await.map(|r| r.into_inner())
}

/// One call that must succeed.
pub async fn ok(
    client: &mut RateLimitServiceClient<Channel>,
    req: RateLimitRequest,
) -> RateLimitResponse {
    let what = format!("{req:?}");
    call(client, req)
        .await
        .unwrap_or_else(|e| panic!("{what}: {e:?}"))
}

pub fn overall(resp: &RateLimitResponse) -> Code {
    Code::try_from(resp.overall_code).unwrap_or(Code::Unknown)
}

pub fn code(status: &DescriptorStatus) -> Code {
    Code::try_from(status.code).unwrap_or(Code::Unknown)
}

/// A status's `current_limit` as (requests_per_unit, unit number).
pub fn limit_of(status: &DescriptorStatus) -> Option<(u32, i32)> {
    status
        .current_limit
        .as_ref()
        .map(|l| (l.requests_per_unit, l.unit))
}

/// A status's `duration_until_reset` in whole seconds.
pub fn reset_s(status: &DescriptorStatus) -> Option<i64> {
    status.duration_until_reset.as_ref().map(|d| d.seconds)
}

/// The unit numbers of the protocol's enum (rls.proto).
pub mod unit {
    pub const SECOND: i32 = 1;
    pub const MINUTE: i32 = 2;
    pub const HOUR: i32 = 3;
    pub const DAY: i32 = 4;
}

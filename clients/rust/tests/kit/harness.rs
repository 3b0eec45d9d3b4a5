//! What the kit's tests share: real server processes (redis-server, and
//! valkey-server for a subset) with the module on free loopback ports, a
//! 3-master, 3-replica cluster, the example service as a process, a real
//! HTTP client, and waiting by polling with deadlines.
//!
//! - `RL_MODULE`: the module (default: the workspace's target/release one).
//! - `REDIS_SERVER`, `VALKEY_SERVER`: the binaries (default: `redis-server`
//!   on `PATH`; what `scripts/valkey-path.sh` prints).

#![allow(dead_code)]

use std::collections::HashMap;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper_util::client::legacy::Client as HttpClient;
use hyper_util::rt::TokioExecutor;

/// How long anything may take to come up or to converge on a busy machine.
pub const PATIENCE: Duration = Duration::from_secs(60);

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

pub fn module() -> PathBuf {
    std::env::var_os("RL_MODULE")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace().join("target/release/libredis_ratelimit.so"))
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

/// The async twin of [`wait_until`].
pub async fn wait_for(what: &str, mut cond: impl AsyncFnMut() -> bool) {
    let start = Instant::now();
    while !cond().await {
        assert!(start.elapsed() < PATIENCE, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A loopback port nobody listens on now, below the ephemeral range: a
/// server killed and restarted on it never finds it taken by another test's
/// `bind(0)` or by a client connection's local port meanwhile.
pub fn free_port() -> u16 {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let base = 20_000 + (std::process::id() % 400) * 30;
    loop {
        let port = (base + NEXT.fetch_add(1, Ordering::Relaxed) % 12_000) as u16;
        if TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
}

fn temp_dir(tag: &str) -> PathBuf {
    static N: AtomicU32 = AtomicU32::new(0);
    let dir = std::env::temp_dir().join(format!(
        "rl-kit-{}-{}-{tag}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// One server process with the module (unless `bare`).
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

    /// A server without the module: what a managed Redis looks like.
    pub fn start_bare(kind: Kind) -> Server {
        Server::start_with(kind, &[], false)
    }

    /// A replica of `master` (same kind, with the module), returned once its
    /// link to the master is up.
    pub fn replica_of(master: &Server, kind: Kind) -> Server {
        let replica = Server::start_with(
            kind,
            &["--replicaof", "127.0.0.1", &master.port.to_string()],
            true,
        );
        wait_until("the replica in sync", || {
            replica
                .info("replication")
                .get("master_link_status")
                .is_some_and(|s| s == "up")
        });
        replica
    }

    pub fn start_with(kind: Kind, extra: &[&str], with_module: bool) -> Server {
        let port = free_port();
        let dir = temp_dir(&port.to_string());
        let mut args: Vec<String> = [
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
            "--enable-debug-command",
            "yes",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        args.extend(extra.iter().map(|s| s.to_string()));
        if with_module {
            args.push("--loadmodule".into());
            args.push(module().to_string_lossy().into());
        }
        let mut server = Server {
            kind,
            port,
            args,
            dir,
            child: None,
        };
        server.spawn();
        server
    }

    fn spawn(&mut self) {
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
        let pid = child.id();
        self.child = Some(child);
        let url = self.url();
        // The server answering must be this one: another suite's server may
        // have taken the port while this one was down (a restart).
        wait_until(&format!("{:?} {pid} on {}", self.kind, self.port), || {
            let answering = redis::Client::open(url.as_str())
                .and_then(|c| c.get_connection())
                .and_then(|mut c| redis::cmd("INFO").arg("server").query::<String>(&mut c));
            match answering {
                Ok(info) => {
                    let theirs = info
                        .lines()
                        .find_map(|l| l.strip_prefix("process_id:"))
                        .map(|p| p.trim().to_string());
                    assert_eq!(
                        theirs.as_deref(),
                        Some(pid.to_string().as_str()),
                        "another server answers on port {}",
                        self.port
                    );
                    true
                }
                Err(_) => false,
            }
        });
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    pub fn conn(&self) -> redis::Connection {
        redis::Client::open(self.url())
            .unwrap()
            .get_connection()
            .unwrap()
    }

    /// `kill -9`: no shutdown, no goodbye to clients.
    pub fn kill9(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts it again on the same port (empty: nothing persisted).
    pub fn restart(&mut self) {
        self.kill9();
        self.spawn();
    }

    /// `INFO section` as field -> value.
    pub fn info(&self, section: &str) -> HashMap<String, String> {
        self.try_info(section).unwrap()
    }

    /// `INFO section`, or the error: while a Sentinel turns this server into
    /// a replica it closes client connections (`CLIENT KILL TYPE normal`), so
    /// a poll during a failover may see its connection end.
    pub fn try_info(&self, section: &str) -> redis::RedisResult<HashMap<String, String>> {
        let mut conn = redis::Client::open(self.url())?.get_connection()?;
        let text: String = redis::cmd("INFO").arg(section).query(&mut conn)?;
        Ok(text
            .lines()
            .filter_map(|l| l.split_once(':'))
            .map(|(k, v)| (k.to_string(), v.trim().to_string()))
            .collect())
    }

    /// `CLUSTER NODES` or `CLUSTER INFO`: text.
    pub fn cluster(&self, what: &str) -> String {
        redis::cmd("CLUSTER")
            .arg(what)
            .query(&mut self.conn())
            .unwrap()
    }

    /// Calls of `command` (lower case, `rl.all`) in `INFO commandstats`.
    pub fn calls(&self, command: &str) -> u64 {
        let wanted = format!("cmdstat_{command}").to_ascii_lowercase();
        self.info("commandstats")
            .into_iter()
            .find(|(k, _)| k.to_ascii_lowercase() == wanted)
            .map(|(_, v)| v)
            .as_deref()
            .and_then(|v| v.split(',').find_map(|f| f.strip_prefix("calls=")))
            .and_then(|n| n.parse().ok())
            .unwrap_or(0)
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.kill9();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A Sentinel monitoring `master` as `mymaster` (quorum 1).
pub struct Sentinel {
    pub port: u16,
    dir: PathBuf,
    child: Child,
}

impl Sentinel {
    pub fn start(master: &Server) -> Sentinel {
        let port = free_port();
        let dir = temp_dir(&format!("sentinel{port}"));
        let conf = dir.join("sentinel.conf");
        std::fs::write(
            &conf,
            format!(
                "port {port}\nbind 127.0.0.1\ndir {}\n\
                 sentinel monitor mymaster 127.0.0.1 {} 1\n\
                 sentinel down-after-milliseconds mymaster 60000\n\
                 sentinel failover-timeout mymaster 60000\n",
                dir.display(),
                master.port
            ),
        )
        .unwrap();
        let child = Command::new(Kind::Redis.binary())
            .arg(&conf)
            .arg("--sentinel")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start redis-server --sentinel");
        let sentinel = Sentinel { port, dir, child };
        wait_until("the Sentinel", || sentinel.master_port().is_some());
        sentinel
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    fn query(&self, args: &[&str]) -> redis::RedisResult<redis::Value> {
        let mut con = redis::Client::open(self.url())?.get_connection()?;
        let mut cmd = redis::cmd("SENTINEL");
        cmd.arg(args);
        cmd.query(&mut con)
    }

    /// The port of the master it names now.
    pub fn master_port(&self) -> Option<u16> {
        match self.query(&["GET-MASTER-ADDR-BY-NAME", "mymaster"]).ok()? {
            redis::Value::Array(a) => match a.get(1)? {
                redis::Value::BulkString(p) => String::from_utf8_lossy(p).parse().ok(),
                _ => None,
            },
            _ => None,
        }
    }

    /// `SENTINEL FAILOVER mymaster`, once it knows a replica to promote.
    pub fn failover(&self) {
        wait_until("the Sentinel to accept a failover", || {
            self.query(&["FAILOVER", "mymaster"]).is_ok()
        });
    }
}

impl Drop for Sentinel {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Three masters, one replica each, on free ports (client and bus).
pub struct Cluster {
    pub nodes: Vec<Server>,
}

impl Cluster {
    pub fn start(kind: Kind) -> Cluster {
        let nodes: Vec<Server> = (0..6)
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
        let q = |s: &Server, args: &[&str]| -> redis::Value {
            let mut cmd = redis::cmd(args[0]);
            for a in &args[1..] {
                cmd.arg(*a);
            }
            cmd.query(&mut s.conn()).unwrap()
        };
        let id = |s: &Server| -> String {
            redis::cmd("CLUSTER")
                .arg("MYID")
                .query(&mut s.conn())
                .unwrap()
        };
        let bus = |s: &Server| -> String {
            let v: Vec<String> = redis::cmd("CONFIG")
                .arg("GET")
                .arg("cluster-port")
                .query(&mut s.conn())
                .unwrap();
            v[1].clone()
        };
        for (i, m) in nodes[..3].iter().enumerate() {
            let lo = (i * 16384 / 3).to_string();
            let hi = ((i + 1) * 16384 / 3 - 1).to_string();
            q(m, &["CLUSTER", "SET-CONFIG-EPOCH", &(i + 1).to_string()]);
            q(m, &["CLUSTER", "ADDSLOTSRANGE", &lo, &hi]);
        }
        for n in &nodes[1..] {
            let b = bus(n);
            q(
                &nodes[0],
                &["CLUSTER", "MEET", "127.0.0.1", &n.port.to_string(), &b],
            );
        }
        wait_until("all nodes to know each other", || {
            nodes.iter().all(|n| {
                let text = n.cluster("NODES");
                text.lines().count() == 6 && !text.contains("handshake")
            })
        });
        for i in 0..3 {
            let master = id(&nodes[i]);
            q(&nodes[i + 3], &["CLUSTER", "REPLICATE", &master]);
        }
        wait_until("cluster_state:ok on every node", || {
            nodes
                .iter()
                .all(|n| n.cluster("INFO").contains("cluster_state:ok"))
        });
        wait_until("every replica in sync", || {
            nodes[3..].iter().all(|n| {
                n.info("replication")
                    .get("master_link_status")
                    .is_some_and(|s| s == "up")
            })
        });
        Cluster { nodes }
    }

    pub fn urls(&self) -> Vec<String> {
        self.nodes.iter().map(Server::url).collect()
    }

    /// `MOVED` replies sent, over every node (`INFO errorstats`).
    pub fn moved(&self) -> u64 {
        self.nodes
            .iter()
            .map(|n| {
                n.info("errorstats")
                    .get("errorstat_MOVED")
                    .and_then(|v| v.strip_prefix("count="))
                    .and_then(|c| c.parse::<u64>().ok())
                    .unwrap_or(0)
            })
            .sum()
    }
}

/// The example service as a process, with its environment.
pub struct Service {
    pub port: u16,
    child: Child,
}

impl Service {
    pub fn start(env: &[(&str, String)]) -> Service {
        let exe = std::env::current_exe().unwrap();
        let bin = exe
            .parent()
            .and_then(Path::parent)
            .map(|d| d.join("examples/service"))
            .unwrap();
        assert!(
            bin.exists(),
            "{} missing: cargo test builds the examples",
            bin.display()
        );
        let port = free_port();
        let child = Command::new(bin)
            .env("PORT", port.to_string())
            .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let service = Service { port, child };
        wait_until("the example service", || {
            std::net::TcpStream::connect(("127.0.0.1", port)).is_ok()
        });
        service
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{path}", self.port)
    }
}

impl Drop for Service {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A real HTTP/1.1 client with keep-alive.
#[derive(Clone)]
pub struct Http {
    client: HttpClient<hyper_util::client::legacy::connect::HttpConnector, Empty<Bytes>>,
}

pub struct Reply {
    pub status: u16,
    pub headers: http::HeaderMap,
    pub body: String,
}

impl Reply {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }
}

impl Default for Http {
    fn default() -> Self {
        Http {
            client: HttpClient::builder(TokioExecutor::new()).build_http(),
        }
    }
}

impl Http {
    pub async fn get(&self, url: &str, headers: &[(&str, &str)]) -> Reply {
        let mut req = http::Request::get(url);
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        let resp = self
            .client
            .request(req.body(Empty::new()).unwrap())
            .await
            .unwrap_or_else(|e| panic!("GET {url}: {e}"));
        let status = resp.status().as_u16();
        let headers = resp.headers().clone();
        let body = resp.into_body().collect().await.unwrap().to_bytes();
        Reply {
            status,
            headers,
            body: String::from_utf8_lossy(&body).into_owned(),
        }
    }

    /// The service's counters (`GET /stats`).
    pub async fn stats(&self, service: &Service) -> HashMap<String, u64> {
        let body = self.get(&service.url("/stats"), &[]).await.body;
        let v: serde_json::Value = serde_json::from_str(&body).unwrap();
        v.as_object()
            .unwrap()
            .iter()
            .map(|(k, v)| {
                (
                    k.clone(),
                    v.as_u64().unwrap_or(v.as_bool().map_or(0, u64::from)),
                )
            })
            .collect()
    }
}

/// Serves `GET /` behind `layer` on a free port; its URL.
pub async fn serve(layer: redis_ratelimit_client::RateLimitLayer) -> String {
    let app = axum::Router::new()
        .route("/", axum::routing::get(|| async { "ok" }))
        .layer(layer);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    format!("http://{addr}/")
}

/// A layer keyed by the `x-user` header.
pub fn by_user(
    limiter: redis_ratelimit_client::Limiter,
) -> redis_ratelimit_client::RateLimitLayerBuilder {
    redis_ratelimit_client::RateLimitLayer::builder(limiter).key(|req| {
        req.headers
            .get("x-user")
            .and_then(|v| v.to_str().ok())
            .map(String::from)
    })
}

//! What the exporter's tests share: real server processes (redis-server and
//! valkey-server with the module) on free loopback ports, the exporter binary
//! as a process, a real HTTP client, promtool, and waiting by polling.
//!
//! - `RL_MODULE`: the module (default: the workspace's target/release one).
//! - `REDIS_SERVER`, `VALKEY_SERVER`: the binaries (default: `redis-server`
//!   on `PATH`; what `scripts/valkey-path.sh` prints).
//! - `PROMTOOL`: promtool (default: `promtool` on `PATH`).

#![allow(dead_code)]

use std::collections::{BTreeMap, HashMap};
use std::io::{BufRead, BufReader};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper_util::client::legacy::Client as HttpClient;
use hyper_util::rt::TokioExecutor;

/// How long anything may take to come up on a busy machine.
pub const PATIENCE: Duration = Duration::from_secs(60);

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

pub fn module() -> PathBuf {
    let module = std::env::var_os("RL_MODULE")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace().join("target/release/libredis_ratelimit.so"));
    assert!(
        module.exists(),
        "no module at {} (build it: cargo build --release, or set RL_MODULE)",
        module.display()
    );
    module
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

/// A loopback port nobody listens on now, below the ephemeral range.
pub fn free_port() -> u16 {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let base = 32_000 + (std::process::id() % 200) * 20;
    loop {
        let port = (base + NEXT.fetch_add(1, Ordering::Relaxed) % 4_000) as u16;
        if TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
}

fn temp_dir(tag: &str) -> PathBuf {
    static N: AtomicU32 = AtomicU32::new(0);
    let dir = std::env::temp_dir().join(format!(
        "rl-exporter-{}-{}-{tag}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// One server process, with the module unless `bare`.
pub struct Server {
    pub kind: Kind,
    pub port: u16,
    dir: PathBuf,
    child: Option<Child>,
}

impl Server {
    pub fn start(kind: Kind) -> Server {
        Server::start_with(kind, true)
    }

    /// A server without the module.
    pub fn start_bare(kind: Kind) -> Server {
        Server::start_with(kind, false)
    }

    fn start_with(kind: Kind, with_module: bool) -> Server {
        let port = free_port();
        let dir = temp_dir(&port.to_string());
        let mut cmd = Command::new(kind.binary());
        cmd.arg("--port")
            .arg(port.to_string())
            .arg("--bind")
            .arg("127.0.0.1")
            .arg("--dir")
            .arg(&dir)
            .args(["--save", "", "--appendonly", "no"]);
        if with_module {
            cmd.arg("--loadmodule").arg(module());
        }
        let child = cmd
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start the server");
        let pid = child.id().to_string();
        let server = Server {
            kind,
            port,
            dir,
            child: Some(child),
        };
        // The server answering must be this one.
        wait_until(&format!("{kind:?} {pid} on {port}"), || {
            let info = redis::Client::open(server.url())
                .and_then(|c| c.get_connection())
                .and_then(|mut c| redis::cmd("INFO").arg("server").query::<String>(&mut c));
            match info {
                Ok(info) => {
                    let theirs = info.lines().find_map(|l| l.strip_prefix("process_id:"));
                    assert_eq!(
                        theirs.map(str::trim),
                        Some(pid.as_str()),
                        "another server on {port}"
                    );
                    true
                }
                Err(_) => false,
            }
        });
        server
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    /// The exporter's `node` label of this server.
    pub fn node(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    pub fn conn(&self) -> redis::Connection {
        redis::Client::open(self.url())
            .unwrap()
            .get_connection()
            .unwrap()
    }

    /// Runs a command, whatever it answers.
    pub fn call(&self, args: &[&str]) -> redis::Value {
        let mut cmd = redis::cmd(args[0]);
        for a in &args[1..] {
            cmd.arg(*a);
        }
        cmd.query(&mut self.conn())
            .unwrap_or_else(|e| panic!("{args:?}: {e}"))
    }

    /// `INFO ratelimit` as field -> value, as the server writes it.
    pub fn info(&self) -> BTreeMap<String, String> {
        let text: String = redis::cmd("INFO")
            .arg("ratelimit")
            .query(&mut self.conn())
            .unwrap();
        text.lines()
            .filter_map(|l| l.split_once(':'))
            .map(|(k, v)| (k.to_string(), v.trim().to_string()))
            .collect()
    }

    /// Sends `signal` (`STOP`, `CONT`) to the process.
    pub fn signal(&self, signal: &str) {
        let pid = self.child.as_ref().expect("a running server").id();
        let status = Command::new("kill")
            .arg(format!("-{signal}"))
            .arg(pid.to_string())
            .status()
            .expect("kill");
        assert!(status.success(), "kill -{signal} {pid}");
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

pub fn exporter_binary() -> &'static str {
    env!("CARGO_BIN_EXE_redis-ratelimit-exporter")
}

/// The exporter as a process, listening on a port it picked.
pub struct Exporter {
    pub addr: String,
    child: Child,
}

impl Exporter {
    /// Starts it with `args` (plus `--listen 127.0.0.1:0`) and `env`, and
    /// reads the address it listens on from its first line on stderr.
    pub fn start(args: &[String], env: &[(&str, &str)]) -> Exporter {
        let mut child = Command::new(exporter_binary())
            .args(["--listen", "127.0.0.1:0"])
            .args(args)
            .env_remove("RL_EXPORTER_REDIS_URLS")
            .env_remove("RL_EXPORTER_POLICY_INFO")
            .envs(env.iter().copied())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start the exporter");
        let mut stderr = BufReader::new(child.stderr.take().unwrap());
        let mut line = String::new();
        stderr.read_line(&mut line).unwrap();
        let addr = line
            .split("listening on ")
            .nth(1)
            .and_then(|rest| rest.split(',').next())
            .unwrap_or_else(|| panic!("no address in the exporter's first line {line:?}"))
            .to_string();
        // Keep draining its log so it never blocks on a full pipe.
        std::thread::spawn(move || {
            let mut sink = String::new();
            while stderr.read_line(&mut sink).is_ok_and(|n| n > 0) {
                sink.clear();
            }
        });
        Exporter { addr, child }
    }

    pub fn for_servers(servers: &[&Server]) -> Exporter {
        let args: Vec<String> = servers
            .iter()
            .flat_map(|s| ["--redis-url".to_string(), s.url()])
            .collect();
        Exporter::start(&args, &[])
    }

    /// `GET path`: status, content type, body.
    pub async fn get(&self, path: &str) -> (u16, String, String) {
        let client = HttpClient::builder(TokioExecutor::new()).build_http::<Empty<Bytes>>();
        let uri: hyper::Uri = format!("http://{}{path}", self.addr).parse().unwrap();
        let res = client.get(uri).await.expect("GET the exporter");
        let status = res.status().as_u16();
        let ctype = res
            .headers()
            .get("content-type")
            .map(|v| v.to_str().unwrap().to_string())
            .unwrap_or_default();
        let body = res.into_body().collect().await.unwrap().to_bytes();
        (status, ctype, String::from_utf8(body.to_vec()).unwrap())
    }

    /// A scrape of /metrics, checked with promtool, parsed.
    pub async fn scrape(&self) -> Scrape {
        let (status, ctype, body) = self.get("/metrics").await;
        assert_eq!(status, 200, "{body}");
        assert_eq!(ctype, "text/plain; version=0.0.4; charset=utf-8");
        promtool_check(&body);
        Scrape::parse(&body)
    }
}

impl Drop for Exporter {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `promtool check metrics` on `body`: it must succeed with nothing to say.
pub fn promtool_check(body: &str) {
    use std::io::Write;
    let promtool = std::env::var("PROMTOOL").unwrap_or_else(|_| "promtool".into());
    let mut child = Command::new(&promtool)
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("{promtool}: {e} (install Debian's prometheus: make setup)"));
    child
        .stdin
        .take()
        .unwrap()
        .write_all(body.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success(),
        "promtool check metrics failed: {said}\n{body}"
    );
    assert!(said.trim().is_empty(), "promtool check metrics: {said}");
}

/// One family's HELP and TYPE.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Described {
    pub help: String,
    pub kind: String,
}

/// A sample's labels, in order, and its value.
pub type Sample = (Vec<(String, String)>, f64);

/// A scrape's body: families as described, samples by name and labels.
#[derive(Debug, Default)]
pub struct Scrape {
    pub families: BTreeMap<String, Described>,
    /// name -> (labels, in order) -> value
    pub samples: BTreeMap<String, Vec<Sample>>,
}

impl Scrape {
    pub fn parse(body: &str) -> Scrape {
        let mut s = Scrape::default();
        for line in body.lines() {
            if let Some(rest) = line.strip_prefix("# HELP ") {
                let (name, help) = rest.split_once(' ').unwrap();
                s.families
                    .entry(name.into())
                    .or_insert_with(|| Described {
                        help: String::new(),
                        kind: String::new(),
                    })
                    .help = help.into();
            } else if let Some(rest) = line.strip_prefix("# TYPE ") {
                let (name, kind) = rest.split_once(' ').unwrap();
                s.families
                    .entry(name.into())
                    .or_insert_with(|| Described {
                        help: String::new(),
                        kind: String::new(),
                    })
                    .kind = kind.into();
            } else if !line.is_empty() {
                let (series, value) = line.rsplit_once(' ').unwrap();
                let value: f64 = value.parse().unwrap();
                let (name, labels) = match series.split_once('{') {
                    Some((n, l)) => (n, parse_labels(l.strip_suffix('}').unwrap())),
                    None => (series, Vec::new()),
                };
                s.samples
                    .entry(name.into())
                    .or_default()
                    .push((labels, value));
            }
        }
        s
    }

    /// The value of `name` with exactly these labels (any order).
    pub fn get(&self, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
        let want: HashMap<&str, &str> = labels.iter().copied().collect();
        self.samples.get(name)?.iter().find_map(|(l, v)| {
            let have: HashMap<&str, &str> =
                l.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
            (have == want).then_some(*v)
        })
    }

    /// The samples of `name` whose labels include `labels`.
    pub fn matching(&self, name: &str, labels: &[(&str, &str)]) -> Vec<Sample> {
        self.samples
            .get(name)
            .map(|all| {
                all.iter()
                    .filter(|(l, _)| {
                        labels
                            .iter()
                            .all(|(k, v)| l.iter().any(|(lk, lv)| lk == k && lv == v))
                    })
                    .cloned()
                    .collect()
            })
            .unwrap_or_default()
    }
}

/// `a="x",b="y\"z"` with the exposition format's escapes undone.
fn parse_labels(text: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut chars = text.chars().peekable();
    loop {
        let mut key = String::new();
        for c in chars.by_ref() {
            if c == '=' {
                break;
            }
            key.push(c);
        }
        if key.is_empty() {
            return out;
        }
        assert_eq!(chars.next(), Some('"'), "label {key} in {text}");
        let mut value = String::new();
        while let Some(c) = chars.next() {
            match c {
                '\\' => match chars.next() {
                    Some('n') => value.push('\n'),
                    Some(other) => value.push(other),
                    None => panic!("dangling escape in {text}"),
                },
                '"' => break,
                c => value.push(c),
            }
        }
        out.push((key, value));
        if chars.peek() == Some(&',') {
            chars.next();
        }
    }
}

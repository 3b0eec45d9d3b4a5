//! Reading the nodes: `INFO ratelimit`, then `RL.POLICY LIST` and one
//! pipelined `RL.POLICY GET` per policy for the fingerprints. All nodes are
//! read at once, each within the scrape timeout; a node that fails gives
//! `up` 0 and a scrape error, and the others are exported all the same.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use redis::aio::MultiplexedConnection;
use redis::AsyncConnectionConfig;
use tokio::sync::Mutex;

use crate::config::{node_label, Config};
use crate::fingerprint;
use crate::info::{self, Info};

/// One node and what the exporter keeps of it between scrapes.
#[derive(Debug)]
pub struct Node {
    /// The `node` label: `host:port`.
    pub label: String,
    client: redis::Client,
    /// The connection, kept between scrapes; dropped when a command was cut
    /// off (the scrape timeout) or the connection broke, kept after an error
    /// reply.
    conn: Mutex<Option<MultiplexedConnection>>,
    /// Scrapes that failed, since the exporter started.
    pub scrape_errors: AtomicU64,
    /// INFO lines skipped as unreadable, since the exporter started.
    pub garbled_lines: AtomicU64,
}

/// The nodes and how to read them.
#[derive(Debug)]
pub struct Scraper {
    pub nodes: Vec<Arc<Node>>,
    connect_timeout: Duration,
    scrape_timeout: Duration,
    policy_info: bool,
}

/// What one scrape read from one node.
#[derive(Clone, Debug)]
pub struct NodeScrape {
    pub label: String,
    /// `INFO ratelimit`, when the node answered it (`up` 1).
    pub info: Option<Info>,
    /// (policy, fingerprint) for the policies `RL.POLICY GET` described.
    pub fingerprints: Vec<(String, String)>,
    pub duration: Duration,
    pub scrape_errors: u64,
    pub garbled_lines: u64,
}

impl Scraper {
    pub fn new(config: &Config) -> Result<Scraper, String> {
        let mut nodes = Vec::new();
        for url in &config.redis_urls {
            let client =
                redis::Client::open(url.as_str()).map_err(|e| format!("redis URL {url:?}: {e}"))?;
            nodes.push(Arc::new(Node {
                label: node_label(url)?,
                client,
                conn: Mutex::new(None),
                scrape_errors: AtomicU64::new(0),
                garbled_lines: AtomicU64::new(0),
            }));
        }
        Ok(Scraper {
            nodes,
            connect_timeout: config.connect_timeout,
            scrape_timeout: config.scrape_timeout,
            policy_info: config.policy_info,
        })
    }

    /// Reads every node at once; the result is in the nodes' order.
    pub async fn scrape(&self) -> Vec<NodeScrape> {
        let tasks: Vec<_> = self
            .nodes
            .iter()
            .map(|node| {
                let node = Arc::clone(node);
                let (connect, timeout, policy_info) =
                    (self.connect_timeout, self.scrape_timeout, self.policy_info);
                tokio::spawn(async move { scrape_node(&node, connect, timeout, policy_info).await })
            })
            .collect();
        let mut out = Vec::with_capacity(tasks.len());
        for (task, node) in tasks.into_iter().zip(&self.nodes) {
            out.push(match task.await {
                Ok(scrape) => scrape,
                // The task cannot panic, but a scrape must not fail with it.
                Err(e) => failed(node, Duration::ZERO, &format!("scrape task: {e}")),
            });
        }
        out
    }
}

/// The record of a failed scrape (counted, logged).
fn failed(node: &Node, duration: Duration, why: &str) -> NodeScrape {
    let errors = node.scrape_errors.fetch_add(1, Ordering::Relaxed) + 1;
    eprintln!("redis-ratelimit-exporter: node {}: {why}", node.label);
    NodeScrape {
        label: node.label.clone(),
        info: None,
        fingerprints: Vec::new(),
        duration,
        scrape_errors: errors,
        garbled_lines: node.garbled_lines.load(Ordering::Relaxed),
    }
}

async fn scrape_node(
    node: &Node,
    connect_timeout: Duration,
    scrape_timeout: Duration,
    policy_info: bool,
) -> NodeScrape {
    let start = Instant::now();
    let read = tokio::time::timeout(
        scrape_timeout,
        read_node(node, connect_timeout, scrape_timeout, policy_info),
    )
    .await;
    let timed_out = read.is_err();
    let result = match read {
        Ok(r) => r,
        Err(_) => Err(Failure::Down(format!(
            "no answer within the scrape timeout ({scrape_timeout:?})"
        ))),
    };
    if timed_out {
        // Cut off mid-command: start afresh next time. (An error reply in
        // time leaves the connection fine: read_node keeps it.)
        if let Ok(mut conn) = node.conn.try_lock() {
            *conn = None;
        }
    }
    let duration = start.elapsed();
    match result {
        Ok((info, fingerprints)) => {
            let garbled = node
                .garbled_lines
                .fetch_add(info.garbled, Ordering::Relaxed)
                + info.garbled;
            NodeScrape {
                label: node.label.clone(),
                info: Some(info),
                fingerprints,
                duration,
                scrape_errors: node.scrape_errors.load(Ordering::Relaxed),
                garbled_lines: garbled,
            }
        }
        Err(Failure::Down(why)) => failed(node, duration, &why),
        Err(Failure::Partial(info, why)) => {
            // INFO answered (up 1), the fingerprints did not.
            let mut scrape = failed(node, duration, &why);
            scrape.garbled_lines = node
                .garbled_lines
                .fetch_add(info.garbled, Ordering::Relaxed)
                + info.garbled;
            scrape.info = Some(*info);
            scrape
        }
    }
}

enum Failure {
    /// No usable INFO: `up` 0.
    Down(String),
    /// INFO read, the policies' definitions not.
    Partial(Box<Info>, String),
}

type Read = Result<(Info, Vec<(String, String)>), Failure>;

async fn read_node(
    node: &Node,
    connect_timeout: Duration,
    response_timeout: Duration,
    policy_info: bool,
) -> Read {
    let mut guard = node.conn.lock().await;
    let mut conn = match guard.as_ref() {
        Some(c) => c.clone(),
        None => {
            let config = AsyncConnectionConfig::new()
                .set_connection_timeout(Some(connect_timeout))
                .set_response_timeout(Some(response_timeout));
            let c = node
                .client
                .get_multiplexed_async_connection_with_config(&config)
                .await
                .map_err(|e| Failure::Down(format!("connect: {e}")))?;
            *guard = Some(c.clone());
            c
        }
    };
    // One scrape of a node at a time keeps concurrent scrapes from
    // stacking commands on a slow node; the lock is held to the end.
    let text: String = match redis::cmd("INFO")
        .arg("ratelimit")
        .query_async(&mut conn)
        .await
    {
        Ok(t) => t,
        Err(e) => {
            if broken(&e) {
                *guard = None;
            }
            return Err(Failure::Down(format!("INFO ratelimit: {e}")));
        }
    };
    let info = info::parse(&text);
    if !info.section {
        return Err(Failure::Down(
            "INFO ratelimit has no ratelimit section: is the module loaded?".into(),
        ));
    }
    if !policy_info {
        return Ok((info, Vec::new()));
    }
    match fingerprints(&mut conn).await {
        Ok(f) => Ok((info, f)),
        Err((why, is_broken)) => {
            if is_broken {
                *guard = None;
            }
            Err(Failure::Partial(Box::new(info), why))
        }
    }
}

/// Whether `e` leaves the connection unusable (an I/O error, a response
/// timeout, a dropped connection), as opposed to an error reply (NOPERM,
/// an unknown command, a reply of another type), after which the
/// connection is in step and is kept: reconnecting at every scrape of a
/// node that keeps refusing a command would only add connections and AUTHs.
fn broken(e: &redis::RedisError) -> bool {
    e.is_io_error() || e.is_unrecoverable_error()
}

/// `RL.POLICY LIST`, then every policy's `RL.POLICY GET` in one pipeline.
/// An error says what failed and whether the connection is [`broken`].
async fn fingerprints(
    conn: &mut MultiplexedConnection,
) -> Result<Vec<(String, String)>, (String, bool)> {
    let names: Vec<Vec<u8>> = redis::cmd("RL.POLICY")
        .arg("LIST")
        .query_async(conn)
        .await
        .map_err(|e| (format!("RL.POLICY LIST: {e}"), broken(&e)))?;
    if names.is_empty() {
        return Ok(Vec::new());
    }
    let mut pipe = redis::pipe();
    for name in &names {
        pipe.cmd("RL.POLICY").arg("GET").arg(name);
    }
    let replies: Vec<redis::Value> = pipe
        .query_async(conn)
        .await
        .map_err(|e| (format!("RL.POLICY GET: {e}"), broken(&e)))?;
    let mut out = Vec::with_capacity(names.len());
    for (name, reply) in names.iter().zip(&replies) {
        let Ok(name) = String::from_utf8(name.clone()) else {
            continue;
        };
        // A policy deleted since LIST answers nil: it has no definition.
        if let Some(fp) =
            fingerprint::of_reply(reply).map_err(|e| (format!("{name}: {e}"), false))?
        {
            out.push((name, fp));
        }
    }
    Ok(out)
}

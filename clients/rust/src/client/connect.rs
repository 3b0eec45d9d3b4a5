//! The connections (standalone, Sentinel, Cluster), where a command goes,
//! its deadline, and the start-up checks.

use std::sync::{Arc, RwLock};
use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{
    MultipleNodeRoutingInfo, ResponsePolicy, Route, RoutingInfo, SingleNodeRoutingInfo, SlotAddr,
};
use redis::sentinel::{SentinelClient, SentinelServerType};
use redis::{Cmd, IntoConnectionInfo, Value};

use super::{text, Client};
use crate::acquire::AcquirePool;
use crate::Error;

/// The oldest module version (`MODULE LIST`'s `ver`) the kit speaks to.
pub const MIN_MODULE_VERSION: i64 = 100;

/// The default deadline of one call: 100 ms. It is what a healthy Redis
/// meets on a loaded host: measured on a 2-core host with two CPU burners,
/// from a cold process, the round trip's p99.9 stays far below it (the
/// figures are in docs/clients.md). A deadline of a few milliseconds is
/// missed by a healthy Redis whenever the host is busy, and every miss is a
/// request decided by the fallback: a slow answer costs a latency, a missed
/// one costs accuracy.
pub const DEFAULT_DEADLINE: Duration = Duration::from_millis(100);

/// The deadline of the start-up checks (`PING`, `MODULE LIST`), which also
/// open the connections.
const START_DEADLINE: Duration = Duration::from_secs(5);

/// The connection of the calls: one server's, or a cluster's.
#[derive(Clone)]
pub(super) enum Conn {
    Single(ConnectionManager),
    Cluster(ClusterConnection),
}

/// Where a command goes.
pub(super) enum Target<'a> {
    /// The master owning this key's slot.
    Key(&'a str),
    /// Every master (policies are node state); the replies combined.
    AllMasters(ResponsePolicy),
    /// Every master, each reply kept (a map of node to reply in a cluster;
    /// the one reply of a single server).
    EachMaster,
    /// Any node.
    Any,
}

/// What the clones of a [`Client`] share.
pub(super) struct Inner {
    conn: RwLock<Conn>,
    sentinel: Option<tokio::sync::Mutex<SentinelClient>>,
    /// Connections of their own for blocking calls (`BLOCK`).
    pub(super) acquire: AcquirePool,
}

fn manager_config() -> ConnectionManagerConfig {
    ConnectionManagerConfig::new()
        .set_number_of_retries(1)
        .set_connection_timeout(Some(Duration::from_secs(1)))
        .set_max_delay(Duration::from_millis(200))
}

impl Client {
    /// Connects to one server (`redis://host:port/`), and checks that it has
    /// loaded the module.
    pub async fn standalone(url: &str) -> Result<Client, Error> {
        let client = redis::Client::open(url).map_err(Error::from)?;
        let acquire = AcquirePool::single(client.clone());
        let manager = ConnectionManager::new_with_config(client, manager_config())
            .await
            .map_err(Error::from)?;
        Client::start(Conn::Single(manager), None, acquire).await
    }

    /// Asks the Sentinels for the master of `service`, connects to it and
    /// checks the module; after a failover, the breaker's probe asks again.
    pub async fn sentinel(sentinels: &[&str], service: &str) -> Result<Client, Error> {
        let mut sentinel = SentinelClient::build(
            sentinels.to_vec(),
            service.to_string(),
            None,
            SentinelServerType::Master,
        )
        .map_err(Error::from)?;
        let (conn, master) = sentinel_master(&mut sentinel).await?;
        Client::start(
            conn,
            Some(tokio::sync::Mutex::new(sentinel)),
            AcquirePool::single(master),
        )
        .await
    }

    /// Connects to a Redis Cluster from any of its nodes, and checks that
    /// every master has loaded the module. The cluster client itself never
    /// retries a command: a lost limiter reply goes to the fallback.
    pub async fn cluster(nodes: &[&str]) -> Result<Client, Error> {
        let Some(first) = nodes.first() else {
            return Err(Error::bad("cluster", "nodes", "at least one node"));
        };
        let acquire = AcquirePool::cluster(first.into_connection_info().map_err(Error::from)?);
        let client = redis::cluster::ClusterClient::builder(nodes.to_vec())
            .retries(0)
            .connection_timeout(Duration::from_secs(1))
            .build()
            .map_err(Error::from)?;
        let conn = client.get_async_connection().await.map_err(Error::from)?;
        Client::start(Conn::Cluster(conn), None, acquire).await
    }

    async fn start(
        conn: Conn,
        sentinel: Option<tokio::sync::Mutex<SentinelClient>>,
        acquire: AcquirePool,
    ) -> Result<Client, Error> {
        let client = Client {
            inner: Arc::new(Inner {
                conn: RwLock::new(conn),
                sentinel,
                acquire,
            }),
            deadline: DEFAULT_DEADLINE,
        };
        // Open and check the connections now (on every master of a
        // cluster), so that the first requests do not pay for the connect.
        client
            .send_within(redis::cmd("PING"), Target::Any, START_DEADLINE)
            .await?;
        client.check_module().await?;
        Ok(client)
    }

    /// The same connection with another deadline per call.
    pub fn with_deadline(&self, deadline: Duration) -> Client {
        Client {
            inner: self.inner.clone(),
            deadline,
        }
    }

    /// Whether this is a cluster connection (then `RL.ALL`'s keys must share
    /// a slot).
    pub fn is_cluster(&self) -> bool {
        matches!(self.conn(), Conn::Cluster(_))
    }

    /// The masters and the slot ranges each owns, ordered by the lowest
    /// slot each owns (`CLUSTER SLOTS`); standalone or Sentinel: one master
    /// owning every slot.
    pub(crate) async fn masters(&self) -> Result<crate::grants::Masters, Error> {
        if !self.is_cluster() {
            return Ok(vec![vec![(0, 16383)]]);
        }
        let mut cmd = redis::cmd("CLUSTER");
        cmd.arg("SLOTS");
        let reply = self
            .send_within(cmd, Target::Any, Duration::from_secs(1))
            .await?;
        parse_masters(&reply)
    }

    /// The deadline of one call.
    pub fn deadline(&self) -> Duration {
        self.deadline
    }

    fn conn(&self) -> Conn {
        self.inner
            .conn
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// `MODULE LIST` has `ratelimit` at version [`MIN_MODULE_VERSION`] or
    /// later (on every master of a cluster); its version. Not bound by the
    /// call deadline: it runs once, at start-up.
    pub async fn check_module(&self) -> Result<i64, Error> {
        let mut cmd = redis::cmd("MODULE");
        cmd.arg("LIST");
        let reply = self
            .send_within(
                cmd,
                Target::AllMasters(ResponsePolicy::CombineArrays),
                START_DEADLINE,
            )
            .await
            .map_err(|e| match e {
                Error::Server(msg) => Error::ModuleMissing(format!(
                    "MODULE LIST refused ({msg}): the server may not allow modules"
                )),
                other => other,
            })?;
        let Value::Array(modules) = reply else {
            return Err(Error::Protocol(format!("MODULE LIST: {reply:?}")));
        };
        let mut version = None;
        for module in modules {
            let fields = match module {
                Value::Array(f) => f,
                Value::Map(pairs) => pairs.into_iter().flat_map(|(k, v)| [k, v]).collect(),
                _ => continue,
            };
            let mut name = None;
            let mut ver = None;
            for pair in fields.chunks(2) {
                if let [k, v] = pair {
                    match (text(k).as_deref(), v) {
                        (Some("name"), v) => name = text(v),
                        (Some("ver"), Value::Int(n)) => ver = Some(*n),
                        _ => {}
                    }
                }
            }
            if name.as_deref() == Some("ratelimit") {
                let v = ver.unwrap_or(0);
                version = Some(version.map_or(v, |old: i64| old.min(v)));
            }
        }
        match version {
            None => Err(Error::ModuleMissing(
                "MODULE LIST has no `ratelimit`: load libredis_ratelimit.so with --loadmodule \
                 (a managed server that cannot load modules cannot run the RL.* commands)"
                    .into(),
            )),
            Some(v) if v < MIN_MODULE_VERSION => Err(Error::ModuleMissing(format!(
                "module ratelimit version {v} is older than {MIN_MODULE_VERSION}"
            ))),
            Some(v) => Ok(v),
        }
    }

    /// `PING` within the deadline; for Sentinel, asks the Sentinels for the
    /// master again first. What the circuit breaker probes with.
    pub async fn ping(&self) -> Result<(), Error> {
        if let Some(sentinel) = &self.inner.sentinel {
            let mut sentinel = sentinel.lock().await;
            let (conn, master) = sentinel_master(&mut sentinel).await?;
            *self.inner.conn.write().unwrap_or_else(|e| e.into_inner()) = conn;
            self.inner.acquire.retarget(master);
        }
        self.send(redis::cmd("PING"), Target::Any).await.map(drop)
    }

    pub(super) async fn send(&self, cmd: Cmd, target: Target<'_>) -> Result<Value, Error> {
        self.send_within(cmd, target, self.deadline).await
    }

    pub(super) async fn send_within(
        &self,
        cmd: Cmd,
        target: Target<'_>,
        deadline: Duration,
    ) -> Result<Value, Error> {
        let call = async {
            match self.conn() {
                Conn::Single(mut c) => cmd.query_async::<Value>(&mut c).await,
                Conn::Cluster(mut c) => {
                    let routing = match target {
                        Target::Key(key) => {
                            RoutingInfo::SingleNode(SingleNodeRoutingInfo::SpecificNode(
                                Route::with_key(key.as_bytes(), SlotAddr::Master),
                            ))
                        }
                        Target::AllMasters(policy) => RoutingInfo::MultiNode((
                            MultipleNodeRoutingInfo::AllMasters,
                            Some(policy),
                        )),
                        Target::EachMaster => {
                            RoutingInfo::MultiNode((MultipleNodeRoutingInfo::AllMasters, None))
                        }
                        Target::Any => {
                            RoutingInfo::SingleNode(SingleNodeRoutingInfo::RandomPrimary)
                        }
                    };
                    c.route_command(cmd, routing).await
                }
            }
        };
        match tokio::time::timeout(deadline, call).await {
            Err(_) => Err(Error::Timeout(deadline)),
            Ok(Err(e)) => Err(match Error::from(e) {
                Error::Timeout(_) => Error::Timeout(deadline),
                other => other,
            }),
            Ok(Ok(Value::ServerError(e))) => Err(crate::error::server_error(&e)),
            Ok(Ok(v)) => Ok(v),
        }
    }
}

async fn sentinel_master(sentinel: &mut SentinelClient) -> Result<(Conn, redis::Client), Error> {
    let client = sentinel.async_get_client().await.map_err(Error::from)?;
    let manager = ConnectionManager::new_with_config(client.clone(), manager_config())
        .await
        .map_err(Error::from)?;
    Ok((Conn::Single(manager), client))
}

/// `CLUSTER SLOTS` as the masters' slot ranges, ordered by each one's lowest
/// slot.
fn parse_masters(reply: &Value) -> Result<crate::grants::Masters, Error> {
    let bad = || Error::Protocol(format!("CLUSTER SLOTS: {reply:?}"));
    let Value::Array(ranges) = reply else {
        return Err(bad());
    };
    let mut by_node: Vec<(String, Vec<(u16, u16)>)> = Vec::new();
    for range in ranges {
        let Value::Array(fields) = range else {
            return Err(bad());
        };
        let (Some(Value::Int(lo)), Some(Value::Int(hi)), Some(Value::Array(node))) =
            (fields.first(), fields.get(1), fields.get(2))
        else {
            return Err(bad());
        };
        let host = node.first().and_then(text).unwrap_or_default();
        let port = match node.get(1) {
            Some(Value::Int(p)) => *p,
            _ => return Err(bad()),
        };
        let id = format!("{host}:{port}");
        let slots = (
            u16::try_from(*lo).map_err(|_| bad())?,
            u16::try_from(*hi).map_err(|_| bad())?,
        );
        match by_node.iter_mut().find(|(n, _)| *n == id) {
            Some((_, owned)) => owned.push(slots),
            None => by_node.push((id, vec![slots])),
        }
    }
    let mut masters: Vec<Vec<(u16, u16)>> = by_node.into_iter().map(|(_, r)| r).collect();
    for owned in &mut masters {
        owned.sort_unstable();
    }
    masters.sort_by_key(|owned| owned.first().map_or(u16::MAX, |r| r.0));
    Ok(masters)
}

//! The connection to the server (standalone, Sentinel, Cluster) and the
//! typed calls of every `RL.*` command: one round trip each, to the node
//! that owns the key, within a deadline, never retried.

use std::sync::{Arc, RwLock};
use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{
    MultipleNodeRoutingInfo, ResponsePolicy, Route, RoutingInfo, SingleNodeRoutingInfo, SlotAddr,
};
use redis::sentinel::{SentinelClient, SentinelServerType};
use redis::{Cmd, IntoConnectionInfo, Value};
use redis_ratelimit_core::{Period, Request, MAX_PARAM};

use crate::acquire::{AcquirePool, Block};
use crate::decision::{Decision, Sixth};
use crate::lease::{LeaseGuard, LeaseMs};
use crate::rule::{RuleKind, Spec, Zone};
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

#[derive(Clone)]
enum Conn {
    Single(ConnectionManager),
    Cluster(ClusterConnection),
}

/// Where a command goes.
enum Target<'a> {
    /// The master owning this key's slot.
    Key(&'a str),
    /// Every master (policies are node state); the replies combined.
    AllMasters(ResponsePolicy),
    /// Any node.
    Any,
}

struct Inner {
    conn: RwLock<Conn>,
    sentinel: Option<tokio::sync::Mutex<SentinelClient>>,
    /// Connections of their own for blocking calls (`BLOCK`).
    acquire: AcquirePool,
}

/// A connection to a server (or a cluster) with the module loaded, and the
/// typed calls of its commands. Cheap to clone: clones share the connection.
#[derive(Clone)]
pub struct Client {
    inner: Arc<Inner>,
    deadline: Duration,
}

/// The former name of [`Request`] (how many units a call takes or gives
/// back: `COST n`, `COST n FORCE`, `REFUND n`), kept for one release: the
/// kits now call it `Request` in every language.
#[deprecated(since = "0.2.0", note = "use `Request`, the same type")]
pub type Units = Request;

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

    async fn send(&self, cmd: Cmd, target: Target<'_>) -> Result<Value, Error> {
        self.send_within(cmd, target, self.deadline).await
    }

    async fn send_within(
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

    async fn decision(&self, cmd: Cmd, key: &str, sixth: Sixth) -> Result<Decision, Error> {
        Decision::from_reply(self.send(cmd, Target::Key(key)).await?, sixth)
    }

    /// Any limiter command, on `key`, with a checked spec.
    pub async fn apply(&self, key: &str, spec: &Spec, units: Request) -> Result<Decision, Error> {
        self.decision(limiter_cmd(key, spec, units)?, key, Sixth::Lease)
            .await
    }

    async fn inline(
        &self,
        algorithm: &str,
        key: &str,
        params: &[u64],
        units: Request,
    ) -> Result<Decision, Error> {
        let spec = Spec::parse(&format!("RL.{algorithm}"), algorithm, params)?;
        self.apply(key, &spec, units).await
    }

    /// `RL.TOKENBUCKET key capacity refill_count refill_ms [COST n [FORCE] | REFUND n]`
    pub async fn token_bucket(
        &self,
        key: &str,
        capacity: u64,
        refill_count: u64,
        refill_ms: u64,
        units: Request,
    ) -> Result<Decision, Error> {
        self.inline(
            "TOKENBUCKET",
            key,
            &[capacity, refill_count, refill_ms],
            units,
        )
        .await
    }

    /// `RL.FIXEDWINDOW key limit window_ms [...]`
    pub async fn fixed_window(
        &self,
        key: &str,
        limit: u64,
        window_ms: u64,
        units: Request,
    ) -> Result<Decision, Error> {
        self.inline("FIXEDWINDOW", key, &[limit, window_ms], units)
            .await
    }

    /// `RL.LEAKYBUCKET key capacity leak_count leak_ms [...]`
    pub async fn leaky_bucket(
        &self,
        key: &str,
        capacity: u64,
        leak_count: u64,
        leak_ms: u64,
        units: Request,
    ) -> Result<Decision, Error> {
        self.inline("LEAKYBUCKET", key, &[capacity, leak_count, leak_ms], units)
            .await
    }

    /// `RL.SLIDING key limit window_ms [...]`
    pub async fn sliding(
        &self,
        key: &str,
        limit: u64,
        window_ms: u64,
        units: Request,
    ) -> Result<Decision, Error> {
        self.inline("SLIDING", key, &[limit, window_ms], units)
            .await
    }

    /// `RL.HASHWINDOW key limit window_ms bucket_ms [...]`
    pub async fn hash_window(
        &self,
        key: &str,
        limit: u64,
        window_ms: u64,
        bucket_ms: u64,
        units: Request,
    ) -> Result<Decision, Error> {
        self.inline("HASHWINDOW", key, &[limit, window_ms, bucket_ms], units)
            .await
    }

    /// `RL.CONCURRENCY key limit lease_ms [COST n [FORCE] | REFUND n]`: at
    /// most `limit` units held at once. An admission holds a lease,
    /// [`Decision::lease`], until [`Client::release`] or `lease_ms` after it
    /// was granted or renewed. [`Client::lease`] holds it in a guard instead.
    pub async fn concurrency(
        &self,
        key: &str,
        limit: u64,
        lease_ms: u64,
        units: Request,
    ) -> Result<Decision, Error> {
        self.inline("CONCURRENCY", key, &[limit, lease_ms], units)
            .await
    }

    /// `RL.QUOTA key limit DAY|WEEK|MONTH|YEAR [TZ zone] [...]`: at most
    /// `limit` units per calendar period in `zone` (`None`: UTC; a fixed
    /// offset `+05:30`; an IANA name `America/New_York`). `reset_after` runs
    /// to the end of the period; a denial's `retry_after` to the start of
    /// the next one. The limit and the zone are checked before sending.
    pub async fn quota(
        &self,
        key: &str,
        limit: u64,
        period: Period,
        zone: Option<&str>,
        units: Request,
    ) -> Result<Decision, Error> {
        let spec = Spec::quota(limit, period, zone)?;
        self.apply(key, &spec, units).await
    }

    /// `RL.RELEASE key lease`: whether the lease was still held (false when
    /// it had ended, was never granted, or the key is gone).
    pub async fn release(&self, key: &str, lease: u64) -> Result<bool, Error> {
        check_lease("RL.RELEASE", lease)?;
        let mut cmd = redis::cmd("RL.RELEASE");
        cmd.arg(key).arg(lease);
        self.flag(cmd, key, "RL.RELEASE").await
    }

    /// `RL.RENEW key lease lease_ms`: the lease now ends `lease_ms` from
    /// now; whether it was still held.
    pub async fn renew(&self, key: &str, lease: u64, lease_ms: u64) -> Result<bool, Error> {
        check_lease("RL.RENEW", lease)?;
        if lease_ms == 0 || lease_ms > MAX_PARAM {
            return Err(Error::bad(
                "RL.RENEW",
                "lease_ms",
                format!("must be an integer from 1 to {MAX_PARAM}"),
            ));
        }
        let mut cmd = redis::cmd("RL.RENEW");
        cmd.arg(key).arg(lease).arg(lease_ms);
        self.flag(cmd, key, "RL.RENEW").await
    }

    async fn flag(&self, cmd: Cmd, key: &str, command: &str) -> Result<bool, Error> {
        match self.send(cmd, Target::Key(key)).await? {
            Value::Int(n) => Ok(n == 1),
            other => Err(Error::Protocol(format!("{command}: {other:?}"))),
        }
    }

    /// `RL.HIT policy key [...]`, sent to the owner of `key` (its second
    /// argument), not of the policy name. On a `CONCURRENCY` policy, an
    /// admission carries its [`Decision::lease`].
    pub async fn hit(&self, policy: &str, key: &str, units: Request) -> Result<Decision, Error> {
        self.decision(hit_cmd(policy, key, units)?, key, Sixth::Lease)
            .await
    }

    /// `RL.ALL numkeys key... spec... [COST n]`: all or nothing, sent to the
    /// owner of the first key (in a cluster they must share a slot: use a
    /// hash tag). `denied_by` is the 0-based position of the rule that
    /// denied.
    pub async fn all(&self, limits: &[(&str, &RuleKind)], cost: u64) -> Result<Decision, Error> {
        let (cmd, first) = all_cmd(limits, cost)?;
        self.decision(cmd, first, Sixth::DeniedBy).await
    }

    /// A blocking acquire: the limiter command with `BLOCK`, which the
    /// server answers when the request is admitted, or with the denial when
    /// `timeout` passes first (or at once when it could not pass within
    /// it). Resolves when the caller may act: for an admitted leaky bucket,
    /// after its `wait_ms`.
    ///
    /// The call goes on a connection of its own (a small pool made from the
    /// client's settings, to the key's master), so a wait stalls no other
    /// call; its deadline is `timeout` plus max(1 s, 10 %), not the
    /// client's deadline. `Duration::ZERO` does not wait; a timeout above
    /// 2^40 ms (`Duration::MAX`) waits without a limit (`BLOCK 0`). Never
    /// retried. Cancel-safe: dropping the future closes its connection, and
    /// the server then consumes nothing for it.
    pub async fn acquire(
        &self,
        key: &str,
        spec: &Spec,
        units: Request,
        timeout: Duration,
    ) -> Result<Decision, Error> {
        self.blocking(limiter_cmd(key, spec, units)?, key, Sixth::Lease, timeout)
            .await
    }

    /// [`Client::acquire`] on a policy: `RL.HIT policy key ... BLOCK`.
    pub async fn acquire_hit(
        &self,
        policy: &str,
        key: &str,
        units: Request,
        timeout: Duration,
    ) -> Result<Decision, Error> {
        self.blocking(hit_cmd(policy, key, units)?, key, Sixth::Lease, timeout)
            .await
    }

    /// [`Client::acquire`] on several limiters at once: `RL.ALL ... BLOCK`,
    /// admitted when all of them admit together.
    pub async fn acquire_all(
        &self,
        limits: &[(&str, &RuleKind)],
        cost: u64,
        timeout: Duration,
    ) -> Result<Decision, Error> {
        let (cmd, first) = all_cmd(limits, cost)?;
        self.blocking(cmd, first, Sixth::DeniedBy, timeout).await
    }

    async fn blocking(
        &self,
        mut cmd: Cmd,
        key: &str,
        sixth: Sixth,
        timeout: Duration,
    ) -> Result<Decision, Error> {
        let block = Block::new(timeout);
        block.args(&mut cmd);
        let pool = &self.inner.acquire;
        if pool.needs_slots() {
            let mut slots = redis::cmd("CLUSTER");
            slots.arg("SLOTS");
            let reply = self
                .send_within(slots, Target::Any, Duration::from_secs(1))
                .await?;
            pool.set_slots(&reply)?;
        }
        let d = Decision::from_reply(pool.send(cmd, key, block.deadline).await?, sixth)?;
        if d.allowed && d.wait_ms > 0 {
            tokio::time::sleep(d.retry_after).await;
        }
        Ok(d)
    }

    /// Takes a lease of `cost` units on `key` (at most `limit` held, each
    /// lease `lease_ms` unless renewed) and holds it in a [`LeaseGuard`]:
    /// released when dropped, renewed in the background while held. A
    /// denial is [`Error::Denied`] with the decision.
    ///
    /// `wait`: `None` answers at once; `Some(timeout)` waits for a unit as
    /// [`Client::acquire`] does (`BLOCK`, on a connection of its own; a
    /// release wakes it at once).
    pub async fn lease(
        &self,
        key: &str,
        limit: u64,
        lease_ms: u64,
        cost: u64,
        wait: Option<Duration>,
    ) -> Result<LeaseGuard, Error> {
        let spec = Spec::parse("RL.CONCURRENCY", "CONCURRENCY", &[limit, lease_ms])?;
        let cmd = limiter_cmd(key, &spec, lease_units("RL.CONCURRENCY", cost)?)?;
        self.hold(cmd, key, LeaseMs::Known(lease_ms), wait).await
    }

    /// [`Client::lease`] on a `CONCURRENCY` policy (`RL.HIT policy key`).
    /// The guard reads the policy's `lease_ms` (`RL.POLICY GET`) in the
    /// background, for its renewals. An `OFF` policy admits without a
    /// lease: the guard then holds nothing.
    pub async fn lease_policy(
        &self,
        policy: &str,
        key: &str,
        cost: u64,
        wait: Option<Duration>,
    ) -> Result<LeaseGuard, Error> {
        let cmd = hit_cmd(policy, key, lease_units("RL.HIT", cost)?)?;
        self.hold(cmd, key, LeaseMs::Policy(policy.to_string()), wait)
            .await
    }

    pub(crate) async fn hold(
        &self,
        cmd: Cmd,
        key: &str,
        lease_ms: LeaseMs,
        wait: Option<Duration>,
    ) -> Result<LeaseGuard, Error> {
        let d = match wait {
            None => self.decision(cmd, key, Sixth::Lease).await?,
            Some(timeout) => self.blocking(cmd, key, Sixth::Lease, timeout).await?,
        };
        if !d.allowed {
            return Err(Error::Denied(Box::new(d)));
        }
        Ok(LeaseGuard::start(self.clone(), key, d, lease_ms))
    }

    /// `RL.POLICY SET name <spec> MODE mode ROLLOUT percent [TZ zone]`, on
    /// every master (`TZ` for a quota in a zone other than UTC: `RL.HIT` and
    /// `RL.ALL ... POLICY` then count in it; it needs a module whose
    /// policies take `TZ`).
    pub async fn policy_set(
        &self,
        name: &str,
        spec: &Spec,
        mode: PolicyMode,
        rollout: u8,
    ) -> Result<(), Error> {
        crate::Rule::policy(name).check()?;
        if rollout > 100 {
            return Err(Error::bad(name, "ROLLOUT", "must be 0 to 100"));
        }
        let mut cmd = redis::cmd("RL.POLICY");
        cmd.arg("SET")
            .arg(name)
            .arg(spec.algorithm())
            .arg(spec.params_args())
            .arg("MODE")
            .arg(mode.word())
            .arg("ROLLOUT")
            .arg(rollout);
        // A quota's zone is an option of the policy (the module counts
        // RL.HIT and RL.ALL ... POLICY in it).
        if let Some(zone) = spec.zone().filter(|z| !z.is_utc()) {
            cmd.arg("TZ").arg(zone.as_str());
        }
        self.send(cmd, Target::AllMasters(ResponsePolicy::AllSucceeded))
            .await
            .map(drop)
    }

    /// `RL.POLICY GET name`: the rule and its counters, or `None`.
    pub async fn policy_get(&self, name: &str) -> Result<Option<PolicyInfo>, Error> {
        let mut cmd = redis::cmd("RL.POLICY");
        cmd.arg("GET").arg(name);
        let reply = self.send(cmd, Target::Any).await?;
        let fields = match reply {
            Value::Nil => return Ok(None),
            Value::Array(f) => f,
            Value::Map(pairs) => pairs.into_iter().flat_map(|(k, v)| [k, v]).collect(),
            other => return Err(Error::Protocol(format!("RL.POLICY GET: {other:?}"))),
        };
        let mut info = PolicyInfo {
            name: name.to_string(),
            spec: None,
            mode: String::new(),
            rollout: 100,
            calls: 0,
            admitted: 0,
            denied: 0,
            shadow_denied: 0,
        };
        let mut algorithm = String::new();
        let mut params: Vec<u64> = Vec::new();
        let mut zone = None;
        for pair in fields.chunks(2) {
            let [k, v] = pair else { continue };
            let int = match v {
                Value::Int(i) => *i,
                _ => 0,
            };
            match text(k).as_deref() {
                Some("algorithm") => algorithm = text(v).unwrap_or_default(),
                Some("params") => {
                    if let Value::Array(ps) = v {
                        // Integers, and a quota's period as its word.
                        params = ps
                            .iter()
                            .filter_map(|p| match p {
                                Value::Int(i) => Some(*i as u64),
                                other => text(other)
                                    .and_then(|w| crate::rule::parse_period(&w).ok())
                                    .map(Period::index),
                            })
                            .collect();
                    }
                }
                Some("mode") => info.mode = text(v).unwrap_or_default(),
                Some("rollout") => info.rollout = int as u8,
                Some("zone") => zone = text(v),
                Some("calls") => info.calls = int as u64,
                Some("admitted") => info.admitted = int as u64,
                Some("denied") => info.denied = int as u64,
                Some("shadow_denied") => info.shadow_denied = int as u64,
                _ => {}
            }
        }
        info.spec = Spec::parse(name, &algorithm, &params).ok();
        if let (Some(Spec::Quota(p, _)), Some(zone)) = (info.spec, zone) {
            info.spec = Zone::new(&zone).ok().map(|z| Spec::Quota(p, z));
        }
        Ok(Some(info))
    }

    /// `RL.POLICY DEL name`, on every master: whether it existed (on any).
    pub async fn policy_del(&self, name: &str) -> Result<bool, Error> {
        let mut cmd = redis::cmd("RL.POLICY");
        cmd.arg("DEL").arg(name);
        let reply = self
            .send(
                cmd,
                Target::AllMasters(ResponsePolicy::Aggregate(
                    redis::cluster_routing::AggregateOp::Sum,
                )),
            )
            .await?;
        Ok(matches!(reply, Value::Int(n) if n > 0))
    }

    /// `RL.POLICY LIST`: the names, sorted.
    pub async fn policy_list(&self) -> Result<Vec<String>, Error> {
        let mut cmd = redis::cmd("RL.POLICY");
        cmd.arg("LIST");
        match self.send(cmd, Target::Any).await? {
            Value::Array(names) => Ok(names.iter().filter_map(text).collect()),
            other => Err(Error::Protocol(format!("RL.POLICY LIST: {other:?}"))),
        }
    }

    /// `RL.LOG GET count`: the most recent denials, newest first (of every
    /// master, in a cluster).
    pub async fn log_get(&self, count: u64) -> Result<Vec<LogEntry>, Error> {
        let mut cmd = redis::cmd("RL.LOG");
        cmd.arg("GET").arg(count);
        let reply = self
            .send(cmd, Target::AllMasters(ResponsePolicy::CombineArrays))
            .await?;
        let Value::Array(entries) = reply else {
            return Err(Error::Protocol(format!("RL.LOG GET: {reply:?}")));
        };
        let mut out = Vec::new();
        for entry in entries {
            let Value::Array(f) = entry else { continue };
            if f.len() < 6 {
                continue;
            }
            let int = |v: &Value| match v {
                Value::Int(i) => *i,
                _ => 0,
            };
            out.push(LogEntry {
                id: int(&f[0]) as u64,
                unix_ms: int(&f[1]) as u64,
                key: text(&f[2]).unwrap_or_default(),
                source: text(&f[3]).unwrap_or_default(),
                cost: int(&f[4]) as u64,
                wait_ms: int(&f[5]),
            });
        }
        Ok(out)
    }

    /// `RL.LOG LEN` (summed over the masters of a cluster).
    pub async fn log_len(&self) -> Result<u64, Error> {
        let mut cmd = redis::cmd("RL.LOG");
        cmd.arg("LEN");
        let reply = self
            .send(
                cmd,
                Target::AllMasters(ResponsePolicy::Aggregate(
                    redis::cluster_routing::AggregateOp::Sum,
                )),
            )
            .await?;
        match reply {
            Value::Int(n) => Ok(n.max(0) as u64),
            other => Err(Error::Protocol(format!("RL.LOG LEN: {other:?}"))),
        }
    }

    /// `RL.LOG RESET` (on every master).
    pub async fn log_reset(&self) -> Result<(), Error> {
        let mut cmd = redis::cmd("RL.LOG");
        cmd.arg("RESET");
        self.send(cmd, Target::AllMasters(ResponsePolicy::AllSucceeded))
            .await
            .map(drop)
    }
}

/// `MODE` of a policy.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PolicyMode {
    /// Denies what the limiter denies.
    Enforce,
    /// Counts, consumes what it admits, always answers allowed.
    Shadow,
    /// The kill switch: allowed at once, no state touched.
    Off,
}

impl PolicyMode {
    fn word(self) -> &'static str {
        match self {
            PolicyMode::Enforce => "ENFORCE",
            PolicyMode::Shadow => "SHADOW",
            PolicyMode::Off => "OFF",
        }
    }
}

/// `RL.POLICY GET`'s answer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PolicyInfo {
    /// The policy's name.
    pub name: String,
    /// Its rule (`None` for an algorithm this kit does not know).
    pub spec: Option<Spec>,
    /// `ENFORCE`, `SHADOW` or `OFF`.
    pub mode: String,
    /// The percentage of keys enforced.
    pub rollout: u8,
    /// Calls, admitted, denied and shadow denials counted by the server.
    pub calls: u64,
    /// See `calls`.
    pub admitted: u64,
    /// See `calls`.
    pub denied: u64,
    /// See `calls`.
    pub shadow_denied: u64,
}

/// One entry of `RL.LOG GET`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LogEntry {
    /// Grows by one per denial logged.
    pub id: u64,
    /// When, in Unix milliseconds.
    pub unix_ms: u64,
    /// The limiter key (cut to 128 bytes).
    pub key: String,
    /// The command, `policy:<name>`, or `RL.ALL <ALGORITHM>`.
    pub source: String,
    /// The units asked.
    pub cost: u64,
    /// The denial's wait.
    pub wait_ms: i64,
}

fn text(v: &Value) -> Option<String> {
    match v {
        Value::BulkString(b) => Some(String::from_utf8_lossy(b).into_owned()),
        Value::SimpleString(s) => Some(s.clone()),
        Value::VerbatimString { text, .. } => Some(text.clone()),
        _ => None,
    }
}

fn check_units(command: &str, units: Request) -> Result<(), Error> {
    let (arg, n) = match units {
        Request::Cost(n) | Request::Force(n) => ("COST", n),
        Request::Refund(n) => ("REFUND", n),
    };
    if n > MAX_PARAM {
        return Err(Error::bad(
            command,
            arg,
            format!("must be an integer from 0 to {MAX_PARAM}"),
        ));
    }
    Ok(())
}

fn check_lease(command: &str, lease: u64) -> Result<(), Error> {
    if lease > i64::MAX as u64 {
        return Err(Error::bad(
            command,
            "lease",
            format!("must be an integer from 0 to {}", i64::MAX),
        ));
    }
    Ok(())
}

fn lease_units(command: &str, cost: u64) -> Result<Request, Error> {
    if cost == 0 {
        return Err(Error::bad(command, "COST", "a lease holds at least 1 unit"));
    }
    Ok(Request::Cost(cost))
}

pub(crate) fn limiter_cmd(key: &str, spec: &Spec, units: Request) -> Result<Cmd, Error> {
    check_units(spec.algorithm(), units)?;
    let mut cmd = redis::cmd(&format!("RL.{}", spec.algorithm()));
    cmd.arg(key).arg(spec.args());
    units_args(&mut cmd, units);
    Ok(cmd)
}

pub(crate) fn hit_cmd(policy: &str, key: &str, units: Request) -> Result<Cmd, Error> {
    check_units("RL.HIT", units)?;
    crate::Rule::policy(policy).check()?;
    let mut cmd = redis::cmd("RL.HIT");
    cmd.arg(policy).arg(key);
    units_args(&mut cmd, units);
    Ok(cmd)
}

fn all_cmd<'a>(limits: &[(&'a str, &RuleKind)], cost: u64) -> Result<(Cmd, &'a str), Error> {
    check_units("RL.ALL", Request::Cost(cost))?;
    let Some((first, _)) = limits.first() else {
        return Err(Error::bad("RL.ALL", "numkeys", "at least one limiter"));
    };
    let mut cmd = redis::cmd("RL.ALL");
    cmd.arg(limits.len());
    for (key, _) in limits {
        cmd.arg(*key);
    }
    for (_, kind) in limits {
        if let RuleKind::Inline(spec @ Spec::Concurrency(_)) = kind {
            return Err(Error::bad(
                "RL.ALL",
                spec.algorithm(),
                "RL.ALL refuses CONCURRENCY: a lease is taken and released on its own key",
            ));
        }
        if let RuleKind::Inline(spec) = kind {
            utc_only("RL.ALL", spec, "RL.ALL")?;
        }
        match kind {
            RuleKind::Inline(spec) => cmd.arg(spec.algorithm()).arg(spec.args()),
            RuleKind::Policy(name) => cmd.arg("POLICY").arg(name.as_str()),
        };
    }
    if cost != 1 {
        cmd.arg("COST").arg(cost);
    }
    Ok((cmd, first))
}

/// `RL.ALL`'s inline specs count quotas in UTC only (a policy's quota counts
/// in the policy's zone).
pub(crate) fn utc_only(rule: &str, spec: &Spec, what: &str) -> Result<(), Error> {
    match spec.zone() {
        Some(zone) if !zone.is_utc() => Err(Error::bad(
            rule,
            "zone",
            format!(
                "{what} counts a quota in UTC only, not in {zone}: apply a zoned quota with its \
                 own RL.QUOTA call"
            ),
        )),
        _ => Ok(()),
    }
}

fn units_args(cmd: &mut Cmd, units: Request) {
    match units {
        Request::Cost(1) => {}
        Request::Cost(n) => {
            cmd.arg("COST").arg(n);
        }
        Request::Force(n) => {
            cmd.arg("COST").arg(n).arg("FORCE");
        }
        Request::Refund(n) => {
            cmd.arg("REFUND").arg(n);
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

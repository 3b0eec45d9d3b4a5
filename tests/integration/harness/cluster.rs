//! A real Redis Cluster for the integration tests: three masters, one replica
//! each, every node a [`Server`] of the same kind with the module loaded, on
//! free loopback ports (client port and cluster bus port both picked free, so
//! nothing depends on `port + 10000` being available).
//!
//! The cluster is built by hand, as `redis-cli --cluster create` does, but
//! without its fixed one-second sleeps: distinct config epochs, slots with
//! `CLUSTER ADDSLOTSRANGE`, `CLUSTER MEET`, `CLUSTER REPLICATE`; then polling
//! until every node reports `cluster_state:ok` and all six agree on who owns
//! which slot and who replicates whom.
//!
//! Topology changes a test makes ([`Cluster::move_slot`],
//! [`Cluster::failover`]) also return only once every node agrees.

use std::collections::BTreeMap;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::time::Duration;

use redis::cluster::{ClusterClient, ClusterConnection};
use redis::cluster_routing::{Route, RoutingInfo, SingleNodeRoutingInfo, SlotAddr};

use super::*;

/// Slots in a Redis Cluster.
pub const SLOTS: u16 = 16384;
/// How long the nodes may take to agree after a change. Gossip converges in a
/// second or two; the margin is for a busy two-core machine.
const CONVERGE_TIMEOUT: Duration = Duration::from_secs(60);
/// Node timeout: generous, so a node slowed by a loaded machine is never
/// flagged as failing (which would start an automatic failover mid-test).
const NODE_TIMEOUT_MS: &str = "15000";

/// One node: its server and its cluster node id.
pub struct Node {
    pub server: Server,
    pub id: String,
    pub bus_port: u16,
}

impl Node {
    pub fn port(&self) -> u16 {
        self.server.port
    }

    /// A plain connection to this node (no redirections followed).
    pub fn conn(&self) -> Connection {
        self.server.conn()
    }

    /// A connection that may read from this node while it is a replica
    /// (`READONLY`), for comparing a replica's keys with its master's.
    pub fn read_conn(&self) -> Connection {
        let mut con = self.conn();
        let _: () = query(&mut con, &["READONLY"]);
        con
    }

    /// `ROLE`'s first word: `master` or `slave`.
    pub fn role(&self) -> String {
        let role: Vec<Value> = query(&mut self.conn(), &["ROLE"]);
        match role.first() {
            Some(Value::BulkString(bytes)) => String::from_utf8_lossy(bytes).into_owned(),
            Some(Value::SimpleString(text)) => text.clone(),
            other => panic!("unexpected ROLE reply: {other:?}"),
        }
    }

    fn cluster_info(&self) -> String {
        query(&mut self.conn(), &["CLUSTER", "INFO"])
    }
}

/// One line of `CLUSTER NODES`, the parts the harness needs.
#[derive(Clone, Debug, PartialEq, Eq)]
struct NodeLine {
    id: String,
    flags: Vec<String>,
    /// The master's id for a replica, `None` for a master.
    master: Option<String>,
    connected: bool,
    /// Slot ranges owned (importing/migrating markers left out).
    slots: Vec<(u16, u16)>,
}

fn parse_nodes(text: &str) -> Vec<NodeLine> {
    text.lines()
        .filter(|line| !line.trim().is_empty())
        .map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            assert!(fields.len() >= 8, "short CLUSTER NODES line: {line}");
            let slots = fields[8..]
                .iter()
                .filter(|f| !f.starts_with('['))
                .map(|f| match f.split_once('-') {
                    Some((lo, hi)) => (lo.parse().unwrap(), hi.parse().unwrap()),
                    None => {
                        let slot = f.parse().unwrap();
                        (slot, slot)
                    }
                })
                .collect();
            NodeLine {
                id: fields[0].to_string(),
                flags: fields[2]
                    .split(',')
                    .filter(|f| *f != "myself")
                    .map(str::to_string)
                    .collect(),
                master: (fields[3] != "-").then(|| fields[3].to_string()),
                connected: fields[7] == "connected",
                slots,
            }
        })
        .collect()
}

/// What one node believes about the whole cluster: which node owns which
/// slot ranges, and which master each replica follows.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Topology {
    /// Slot range start -> (end, owner id).
    pub owners: BTreeMap<u16, (u16, String)>,
    /// Replica id -> master id.
    pub replicas: BTreeMap<String, String>,
}

impl Topology {
    pub fn owner_of(&self, slot: u16) -> Option<&str> {
        self.owners
            .range(..=slot)
            .next_back()
            .filter(|(_, (end, _))| slot <= *end)
            .map(|(_, (_, id))| id.as_str())
    }
}

/// A running cluster; dropping it stops every node.
pub struct Cluster {
    pub kind: ServerKind,
    pub nodes: Vec<Node>,
}

impl Cluster {
    /// Starts six nodes of `kind` and forms a 3-master, 3-replica cluster:
    /// node `i` (0..3) is a master with a third of the slots, node `i + 3` its
    /// replica. Returns once every node agrees and every replica has synced.
    pub fn start(kind: ServerKind) -> Cluster {
        let nodes: Vec<Node> = (0..6).map(|_| start_node(kind)).collect();
        let cluster = Cluster { kind, nodes };

        // Distinct config epochs before anyone meets, as redis-cli does, so
        // no epoch collision has to be resolved by gossip.
        let thirds = [(0u16, 5460u16), (5461, 10922), (10923, SLOTS - 1)];
        for (i, (lo, hi)) in thirds.iter().enumerate() {
            let mut con = cluster.nodes[i].conn();
            let epoch = (i + 1).to_string();
            let _: () = query(&mut con, &["CLUSTER", "SET-CONFIG-EPOCH", &epoch]);
            let _: () = query(
                &mut con,
                &["CLUSTER", "ADDSLOTSRANGE", &lo.to_string(), &hi.to_string()],
            );
        }
        let mut first = cluster.nodes[0].conn();
        for node in &cluster.nodes[1..] {
            let _: () = query(
                &mut first,
                &[
                    "CLUSTER",
                    "MEET",
                    "127.0.0.1",
                    &node.port().to_string(),
                    &node.bus_port.to_string(),
                ],
            );
        }
        // A replica can follow its master only once it knows it.
        poll_until("every node knows all six", CONVERGE_TIMEOUT, || {
            cluster.nodes.iter().all(|node| {
                let lines = parse_nodes(&query::<String>(&mut node.conn(), &["CLUSTER", "NODES"]));
                lines.len() == 6
                    && lines
                        .iter()
                        .all(|l| !l.flags.iter().any(|f| f == "handshake" || f == "noaddr"))
            })
        });
        for i in 0..3 {
            let master_id = cluster.nodes[i].id.clone();
            let _: () = query(
                &mut cluster.nodes[i + 3].conn(),
                &["CLUSTER", "REPLICATE", &master_id],
            );
        }
        cluster.wait_until_agreed("the new cluster");
        cluster
    }

    /// A cluster-aware client (redis-rs `ClusterClient`) seeded with every
    /// node; it follows `MOVED` and `ASK` by itself.
    pub fn client(&self) -> ClusterConnection {
        let urls: Vec<String> = self.nodes.iter().map(|n| n.server.url()).collect();
        ClusterClient::builder(urls)
            .connection_timeout(Duration::from_secs(5))
            .response_timeout(Duration::from_secs(30))
            .build()
            .expect("cluster client")
            .get_connection()
            .unwrap_or_else(|e| panic!("connect to the {} cluster: {e}", self.kind))
    }

    pub fn node(&self, id: &str) -> &Node {
        self.nodes
            .iter()
            .find(|n| n.id == id)
            .unwrap_or_else(|| panic!("no node {id}"))
    }

    /// The slot of `key` (`CLUSTER KEYSLOT`).
    pub fn keyslot(&self, key: &str) -> u16 {
        query(&mut self.nodes[0].conn(), &["CLUSTER", "KEYSLOT", key])
    }

    /// The topology as `node` sees it.
    pub fn topology_seen_by(&self, node: &Node) -> Topology {
        let lines = parse_nodes(&query::<String>(&mut node.conn(), &["CLUSTER", "NODES"]));
        let mut owners = BTreeMap::new();
        let mut replicas = BTreeMap::new();
        for line in lines {
            for (lo, hi) in &line.slots {
                owners.insert(*lo, (*hi, line.id.clone()));
            }
            if let Some(master) = line.master {
                replicas.insert(line.id, master);
            }
        }
        Topology { owners, replicas }
    }

    /// The topology every node agrees on (call after [`wait_until_agreed`]).
    ///
    /// [`wait_until_agreed`]: Cluster::wait_until_agreed
    pub fn topology(&self) -> Topology {
        self.topology_seen_by(&self.nodes[0])
    }

    /// The master that owns `slot`.
    pub fn master_of_slot(&self, slot: u16) -> &Node {
        let topology = self.topology();
        let id = topology
            .owner_of(slot)
            .unwrap_or_else(|| panic!("nobody owns slot {slot}"))
            .to_string();
        self.node(&id)
    }

    /// The replica that follows `master`.
    pub fn replica_of(&self, master: &Node) -> &Node {
        let topology = self.topology();
        let id = topology
            .replicas
            .iter()
            .find(|(_, m)| **m == master.id)
            .map(|(replica, _)| replica.clone())
            .unwrap_or_else(|| panic!("{} has no replica", master.port()));
        self.node(&id)
    }

    /// The masters, in node order.
    pub fn masters(&self) -> Vec<&Node> {
        let topology = self.topology();
        self.nodes
            .iter()
            .filter(|n| !topology.replicas.contains_key(&n.id))
            .collect()
    }

    /// Polls until every node is `cluster_state:ok` with all 16384 slots
    /// served, no node is flagged or disconnected, all six report the same
    /// topology (3 masters owning every slot, 3 replicas), and every replica's
    /// link to its master is up with no sync in progress.
    pub fn wait_until_agreed(&self, what: &str) {
        poll_until(
            &format!("{what}: every node ok and agreeing"),
            CONVERGE_TIMEOUT,
            || self.agreed(),
        );
    }

    fn agreed(&self) -> bool {
        let mut seen: Option<Topology> = None;
        for node in &self.nodes {
            let info = node.cluster_info();
            if info_field(&info, "cluster_state").as_deref() != Some("ok")
                || info_field(&info, "cluster_slots_ok").as_deref() != Some("16384")
                || info_field(&info, "cluster_known_nodes").as_deref() != Some("6")
            {
                return false;
            }
            let lines = parse_nodes(&query::<String>(&mut node.conn(), &["CLUSTER", "NODES"]));
            let healthy = lines.iter().all(|l| {
                l.connected
                    && !l
                        .flags
                        .iter()
                        .any(|f| matches!(f.as_str(), "fail" | "fail?" | "handshake" | "noaddr"))
            });
            if !healthy {
                return false;
            }
            let topology = self.topology_seen_by(node);
            if topology.replicas.len() != 3 {
                return false;
            }
            match &seen {
                None => seen = Some(topology),
                Some(first) if *first != topology => return false,
                Some(_) => {}
            }
        }
        let topology = seen.expect("six nodes");
        topology.replicas.keys().all(|id| {
            let info = self.node(id).server.info("replication");
            info_field(&info, "master_link_status").as_deref() == Some("up")
                && info_field(&info, "master_sync_in_progress").as_deref() == Some("0")
        })
    }

    /// Moves `slot`, with its keys, to the master `to`, the way resharding
    /// does it: `SETSLOT IMPORTING` on the target, `SETSLOT MIGRATING` on the
    /// source, `MIGRATE ... KEYS` in batches, then `SETSLOT NODE` on the
    /// target, the source and the other masters. Returns once every node
    /// agrees that `to` owns the slot.
    pub fn move_slot(&self, slot: u16, to: &Node) {
        let from = self.master_of_slot(slot);
        assert_ne!(from.id, to.id, "slot {slot} is already on {}", to.port());
        let slot_text = slot.to_string();
        let mut source = from.conn();
        let mut target = to.conn();
        let _: () = query(
            &mut target,
            &["CLUSTER", "SETSLOT", &slot_text, "IMPORTING", &from.id],
        );
        let _: () = query(
            &mut source,
            &["CLUSTER", "SETSLOT", &slot_text, "MIGRATING", &to.id],
        );
        loop {
            let keys: Vec<String> = query(
                &mut source,
                &["CLUSTER", "GETKEYSINSLOT", &slot_text, "100"],
            );
            if keys.is_empty() {
                break;
            }
            let port = to.port().to_string();
            let mut words = vec!["MIGRATE", "127.0.0.1", &port, "", "0", "10000", "KEYS"];
            words.extend(keys.iter().map(String::as_str));
            let reply: String = query(&mut source, &words);
            assert_eq!(reply, "OK", "MIGRATE of slot {slot}");
        }
        let assign = ["CLUSTER", "SETSLOT", &slot_text, "NODE", &to.id];
        let _: () = query(&mut target, &assign);
        let _: () = query(&mut source, &assign);
        for master in self.masters() {
            if master.id != from.id && master.id != to.id {
                let _: () = query(&mut master.conn(), &assign);
            }
        }
        poll_until(
            &format!("every node sees slot {slot} on {}", to.port()),
            CONVERGE_TIMEOUT,
            || self.agreed() && self.topology().owner_of(slot) == Some(to.id.as_str()),
        );
    }

    /// A manual failover: `CLUSTER FAILOVER` on `replica`, which waits for
    /// its master's stream to be fully applied before taking over. Returns
    /// once `replica` is a master and every node agrees (its old master now
    /// following it).
    pub fn failover(&self, replica: &Node) {
        let old_master_id = self.topology().replicas[&replica.id].clone();
        let _: () = query(&mut replica.conn(), &["CLUSTER", "FAILOVER"]);
        poll_until(
            &format!("{} promoted and every node agreeing", replica.port()),
            CONVERGE_TIMEOUT,
            || {
                replica.role() == "master"
                    && self.agreed()
                    && self.topology().replicas.get(&old_master_id) == Some(&replica.id)
            },
        );
    }
}

/// Starts one cluster node. The bus port is picked free like the client
/// port; should another process take it in between, try another.
fn start_node(kind: ServerKind) -> Node {
    for _attempt in 0..5 {
        let bus_port = free_port();
        let bus_text = bus_port.to_string();
        let args = [
            "--cluster-enabled",
            "yes",
            "--cluster-config-file",
            "nodes.conf",
            "--cluster-node-timeout",
            NODE_TIMEOUT_MS,
            "--cluster-port",
            &bus_text,
        ];
        let started = catch_unwind(AssertUnwindSafe(|| Server::start(kind, &args)));
        if let Ok(server) = started {
            let id: String = query(&mut server.conn(), &["CLUSTER", "MYID"]);
            return Node {
                server,
                id,
                bus_port,
            };
        }
    }
    panic!("could not start a {kind} cluster node after 5 attempts");
}

// ---------------------------------------------------------------------------
// Commands through the cluster client

/// Runs a command through the cluster client, which routes it by its first
/// argument (the key of every limiter command).
pub fn cluster_query<T: redis::FromRedisValue>(con: &mut ClusterConnection, words: &[&str]) -> T {
    command(words)
        .query(con)
        .unwrap_or_else(|e| panic!("{words:?} failed: {}", error_text(&e)))
}

/// A limiter command through the cluster client.
pub fn cluster_rl(con: &mut ClusterConnection, words: &[&str]) -> Reply {
    Reply::from_ints(&cluster_query::<Vec<i64>>(con, words))
}

/// `RL.ALL` sent straight to the master of its first key's slot, as a client
/// that knows the command's key positions (`COMMAND INFO`: keys from
/// argument 2, counted by argument 1) routes it. A client that routes every
/// unknown command by its first argument sends `RL.ALL` by the slot of
/// `numkeys` instead and gets there through a `MOVED` redirection.
pub fn cluster_rl_all(con: &mut ClusterConnection, words: &[&str]) -> redis::RedisResult<Value> {
    assert!(words[0].eq_ignore_ascii_case("RL.ALL") && words.len() > 2);
    let route = Route::with_key(words[2], SlotAddr::Master);
    con.route_command(
        &command(words),
        RoutingInfo::SingleNode(SingleNodeRoutingInfo::SpecificNode(route)),
    )
}

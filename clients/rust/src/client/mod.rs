//! The connection to the server (standalone, Sentinel, Cluster) and the
//! typed calls of every `RL.*` command: one round trip each, to the node
//! that owns the key, within a deadline, never retried.
//!
//! One concept per file:
//! - `connect.rs`: the connections, where a command goes, the deadline, the
//!   start-up checks (`PING`, `MODULE LIST`);
//! - `calls.rs`: the typed calls of the limiter commands, `RL.HIT`,
//!   `RL.ALL`, the blocking acquires and the leases;
//! - `admin.rs`: `RL.POLICY` and `RL.LOG`, and their answers;
//! - `policy_stats.rs`: the protection loop's calls (`RL.OUTCOME`,
//!   `RL.POLICY STATS` on every master, `RL.POLICY SCALE`) and their answer;
//! - `args.rs`: the arguments of a call, checked before sending.

use std::sync::Arc;
use std::time::Duration;

use redis::Value;
use redis_ratelimit_core::Request;

mod admin;
mod args;
mod calls;
mod connect;
mod policy_stats;

pub use admin::{Adapt, LogEntry, PolicyInfo, PolicyMode, PolicyProtection};
pub use args::MAX_UPTO;
pub(crate) use args::{hit_cmd, limiter_cmd, utc_only};
pub use connect::{DEFAULT_DEADLINE, MIN_MODULE_VERSION};
pub use policy_stats::{PolicyStats, WindowCounts};

/// A connection to a server (or a cluster) with the module loaded, and the
/// typed calls of its commands. Cheap to clone: clones share the connection.
#[derive(Clone)]
pub struct Client {
    inner: Arc<connect::Inner>,
    deadline: Duration,
}

/// The former name of [`Request`] (how many units a call takes or gives
/// back: `COST n`, `COST n FORCE`, `REFUND n`), kept for one release: the
/// kits now call it `Request` in every language.
#[deprecated(since = "0.2.0", note = "use `Request`, the same type")]
pub type Units = Request;

/// A reply's text (bulk, simple or verbatim string).
fn text(v: &Value) -> Option<String> {
    match v {
        Value::BulkString(b) => Some(String::from_utf8_lossy(b).into_owned()),
        Value::SimpleString(s) => Some(s.clone()),
        Value::VerbatimString { text, .. } => Some(text.clone()),
        _ => None,
    }
}

//! The protection loop's calls: `RL.OUTCOME` and `RL.POLICY STATS` (sent to
//! every master, each master's answer kept), `RL.POLICY SCALE`, and their
//! answer, [`PolicyStats`].

use redis::cluster_routing::ResponsePolicy;
use redis::Value;

use super::connect::Target;
use super::{text, Client};
use crate::Error;

/// One window's counts in `RL.POLICY STATS` (the contract's
/// `window_fields`, in order).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WindowCounts {
    /// Calls of the policy (`RL.HIT`, `RL.ALL ... POLICY`).
    pub calls: u64,
    /// Of those, admitted.
    pub admitted: u64,
    /// Of those, denied (shadow denials included).
    pub denied: u64,
    /// Outcomes reported ok (`RL.OUTCOME`).
    pub ok: u64,
    /// Outcomes reported as errors.
    pub errors: u64,
    /// `denied * 1000 / calls`, rounded down (0 without calls).
    pub deny_permille: u64,
    /// `errors * 1000 / (ok + errors)`, rounded down (0 without outcomes).
    pub error_permille: u64,
}

impl WindowCounts {
    /// The names of a window's fields, in the order the server sends them.
    pub const FIELDS: [&'static str; 7] = [
        "calls",
        "admitted",
        "denied",
        "ok",
        "errors",
        "deny_permille",
        "error_permille",
    ];

    fn parse(what: &str, v: &Value) -> Result<WindowCounts, Error> {
        let mut values = pairs(what, v)?;
        let mut take = |name: &str| {
            values
                .remove(name)
                .ok_or_else(|| Error::Protocol(format!("{what}: no {name}")))
        };
        Ok(WindowCounts {
            calls: take(Self::FIELDS[0])?.int()?,
            admitted: take(Self::FIELDS[1])?.int()?,
            denied: take(Self::FIELDS[2])?.int()?,
            ok: take(Self::FIELDS[3])?.int()?,
            errors: take(Self::FIELDS[4])?.int()?,
            deny_permille: take(Self::FIELDS[5])?.int()?,
            error_permille: take(Self::FIELDS[6])?.int()?,
        })
    }
}

/// `RL.POLICY STATS name` (and `RL.OUTCOME`'s answer) from one master:
/// the policy's scale and stage, its window, and the counts of the current
/// and the last finished window.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PolicyStats {
    /// The percentage its size and rate parameters run at (1 to 100).
    pub scale: u8,
    /// 0 normal, 1 degrade, 2 break.
    pub stage: u8,
    /// The policy's window.
    pub window_ms: u64,
    /// When the current window ends (Unix ms, the master's clock).
    pub window_end_ms: u64,
    /// The window under way.
    pub current: WindowCounts,
    /// The last window that ended.
    pub last: WindowCounts,
    /// Whether `ADAPT ERRORS` is on.
    pub adapting: bool,
}

impl PolicyStats {
    /// The names of the reply's fields, in the order the server sends them.
    pub const FIELDS: [&'static str; 7] = [
        "scale",
        "stage",
        "window_ms",
        "window_end_ms",
        "current",
        "last",
        "adapting",
    ];

    /// Reads one master's reply: a flat list of names and values (or a
    /// map). A field missing, or of the wrong type, is a protocol error;
    /// a field this kit does not know is skipped.
    pub(crate) fn parse(what: &str, v: &Value) -> Result<PolicyStats, Error> {
        let mut values = pairs(what, v)?;
        let mut take = |name: &str| {
            values
                .remove(name)
                .ok_or_else(|| Error::Protocol(format!("{what}: no {name}")))
        };
        let small = |n: u64, max: u64, name: &str| {
            if n > max {
                Err(Error::Protocol(format!("{what}: {name} {n}")))
            } else {
                Ok(n as u8)
            }
        };
        Ok(PolicyStats {
            scale: small(take(Self::FIELDS[0])?.int()?, 100, "scale")?,
            stage: small(take(Self::FIELDS[1])?.int()?, 2, "stage")?,
            window_ms: take(Self::FIELDS[2])?.int()?,
            window_end_ms: take(Self::FIELDS[3])?.int()?,
            current: WindowCounts::parse(what, take(Self::FIELDS[4])?.0)?,
            last: WindowCounts::parse(what, take(Self::FIELDS[5])?.0)?,
            adapting: take(Self::FIELDS[6])?.int()? == 1,
        })
    }
}

/// A reply's value, for the parsers above.
struct Field<'a>(&'a Value);

impl Field<'_> {
    fn int(&self) -> Result<u64, Error> {
        match self.0 {
            Value::Int(i) if *i >= 0 => Ok(*i as u64),
            other => Err(Error::Protocol(format!("not a count: {other:?}"))),
        }
    }
}

fn pairs<'a>(
    what: &str,
    v: &'a Value,
) -> Result<std::collections::HashMap<String, Field<'a>>, Error> {
    let mut out = std::collections::HashMap::new();
    match v {
        Value::Array(items) => {
            for pair in items.chunks(2) {
                if let [k, v] = pair {
                    if let Some(k) = text(k) {
                        out.insert(k, Field(v));
                    }
                }
            }
        }
        Value::Map(items) => {
            for (k, v) in items {
                if let Some(k) = text(k) {
                    out.insert(k, Field(v));
                }
            }
        }
        other => return Err(Error::Protocol(format!("{what}: {other:?}"))),
    }
    Ok(out)
}

impl Client {
    /// `RL.POLICY STATS name` on every master (the one server, or each
    /// master of a cluster): each master's answer. A master that errors
    /// (`ERR unknown policy`) or cannot be reached fails the whole call.
    pub async fn policy_stats(&self, name: &str) -> Result<Vec<PolicyStats>, Error> {
        let mut cmd = redis::cmd("RL.POLICY");
        cmd.arg("STATS").arg(name);
        self.each_master(cmd, "RL.POLICY STATS").await
    }

    /// `RL.OUTCOME name ok errors` on every master, so that each sees the
    /// same totals: each master's answer (as [`Client::policy_stats`]).
    /// Never retried: a report lost is a count lost.
    pub async fn outcome(
        &self,
        name: &str,
        ok: u64,
        errors: u64,
    ) -> Result<Vec<PolicyStats>, Error> {
        self.outcome_denied(name, ok, errors, 0).await
    }

    /// `RL.OUTCOME name ok errors DENIED n`: also `denied` calls of the
    /// policy that this kit denied without asking the server (its deny
    /// cache, its local level), counted by the server as calls and denials
    /// of the policy's current window. `DENIED` is left out when 0 (the
    /// plain form). Never retried.
    pub async fn outcome_denied(
        &self,
        name: &str,
        ok: u64,
        errors: u64,
        denied: u64,
    ) -> Result<Vec<PolicyStats>, Error> {
        let mut cmd = redis::cmd("RL.OUTCOME");
        cmd.arg(name).arg(ok).arg(errors);
        if denied > 0 {
            cmd.arg("DENIED").arg(denied);
        }
        self.each_master(cmd, "RL.OUTCOME").await
    }

    /// `RL.POLICY SCALE name pct` (1 to 100) on every master: the
    /// operator's "auto-degrade" switch.
    pub async fn policy_scale(&self, name: &str, pct: u8) -> Result<(), Error> {
        if !(1..=100).contains(&pct) {
            return Err(Error::bad(name, "pct", "must be an integer from 1 to 100"));
        }
        let mut cmd = redis::cmd("RL.POLICY");
        cmd.arg("SCALE").arg(name).arg(pct);
        self.send(cmd, Target::AllMasters(ResponsePolicy::AllSucceeded))
            .await
            .map(drop)
    }

    async fn each_master(&self, cmd: redis::Cmd, what: &str) -> Result<Vec<PolicyStats>, Error> {
        let reply = self.send(cmd, Target::EachMaster).await?;
        let replies = match (self.is_cluster(), reply) {
            (true, Value::Map(nodes)) => nodes.into_iter().map(|(_, v)| v).collect(),
            (_, single) => vec![single],
        };
        replies
            .iter()
            .map(|v| match v {
                Value::ServerError(e) => Err(crate::error::server_error(e)),
                v => PolicyStats::parse(what, v),
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn int(i: i64) -> Value {
        Value::Int(i)
    }
    fn s(t: &str) -> Value {
        Value::BulkString(t.as_bytes().to_vec())
    }
    fn window(values: [i64; 7]) -> Value {
        Value::Array(
            WindowCounts::FIELDS
                .iter()
                .zip(values)
                .flat_map(|(k, v)| [s(k), int(v)])
                .collect(),
        )
    }

    #[test]
    fn a_stats_reply_is_read_by_its_names() {
        let reply = Value::Array(vec![
            s("scale"),
            int(80),
            s("stage"),
            int(1),
            s("window_ms"),
            int(1000),
            s("window_end_ms"),
            int(1_700_000_001_000),
            s("current"),
            window([10, 7, 3, 6, 1, 300, 142]),
            s("last"),
            window([0; 7]),
            s("adapting"),
            int(1),
        ]);
        let stats = PolicyStats::parse("STATS", &reply).unwrap();
        assert_eq!((stats.scale, stats.stage, stats.window_ms), (80, 1, 1000));
        assert_eq!(stats.current.denied, 3);
        assert_eq!(stats.current.error_permille, 142);
        assert!(stats.adapting);
    }

    #[test]
    fn a_stats_reply_missing_a_field_or_out_of_range_is_refused() {
        let reply = Value::Array(vec![s("scale"), int(80)]);
        assert!(matches!(
            PolicyStats::parse("STATS", &reply),
            Err(Error::Protocol(_))
        ));
        let reply = Value::Array(vec![
            s("scale"),
            int(80),
            s("stage"),
            int(3),
            s("window_ms"),
            int(1000),
            s("window_end_ms"),
            int(1),
            s("current"),
            window([0; 7]),
            s("last"),
            window([0; 7]),
            s("adapting"),
            int(0),
        ]);
        assert!(matches!(
            PolicyStats::parse("STATS", &reply),
            Err(Error::Protocol(_))
        ));
    }
}

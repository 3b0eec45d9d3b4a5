//! The administration calls: `RL.POLICY` (set, get, delete, list) and
//! `RL.LOG` (the denial log), and their answers.

use redis::cluster_routing::{AggregateOp, ResponsePolicy};
use redis::Value;
use redis_ratelimit_core::Period;

use super::connect::Target;
use super::{text, Client};
use crate::rule::{Spec, Zone};
use crate::Error;

/// Every master, the replies summed: a count of node state (`RL.POLICY DEL`,
/// `RL.LOG LEN`).
const SUM_OF_MASTERS: Target<'static> =
    Target::AllMasters(ResponsePolicy::Aggregate(AggregateOp::Sum));

/// `ADAPT ERRORS pct [FACTOR f] [MIN m] [RECOVER r] [WINDOW ms]
/// [MINCALLS n]`: the scale drops by `factor` % (down to `min`) after a
/// window with more than `errors` % errors, and climbs by `recover` after a
/// window with less than half that. `None`: the server's default.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Adapt {
    /// ERRORS: the error percentage that scales down (0 to 100).
    pub errors: u8,
    /// FACTOR (1 to 100).
    pub factor: Option<u8>,
    /// MIN (1 to 100).
    pub min: Option<u8>,
    /// RECOVER (0 to 100).
    pub recover: Option<u8>,
    /// ADAPT's WINDOW in ms (1 to 86,400,000).
    pub window_ms: Option<u64>,
    /// MINCALLS (0 to 2^40).
    pub mincalls: Option<u64>,
}

/// The protection loop's options of `RL.POLICY SET`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PolicyProtection {
    /// `Some(Some(a))`: ADAPT ERRORS ...; `Some(None)`: ADAPT OFF;
    /// `None`: not sent.
    pub adapt: Option<Option<Adapt>>,
    /// STAGES degrade_pct break_pct (0 to 100, break_pct at least
    /// degrade_pct).
    pub stages: Option<(u8, u8)>,
    /// WINDOW ms, the policy's window (1 to 86,400,000).
    pub window_ms: Option<u64>,
}

impl PolicyProtection {
    /// The ranges the kit checks, as the contract's `protection.arguments`
    /// (name, min, max; break_pct's lower bound is degrade_pct).
    pub const RANGES: [(&'static str, u64, u64); 8] = [
        ("ERRORS", 0, 100),
        ("FACTOR", 1, 100),
        ("MIN", 1, 100),
        ("RECOVER", 0, 100),
        ("MINCALLS", 0, 1 << 40),
        ("WINDOW", 1, 86_400_000),
        ("degrade_pct", 0, 100),
        ("break_pct", 0, 100),
    ];

    fn range(name: &str) -> (u64, u64) {
        let (_, min, max) = Self::RANGES
            .iter()
            .find(|(n, _, _)| *n == name)
            .expect("a known argument");
        (*min, *max)
    }

    /// The first argument out of its range, named.
    pub fn check(&self, policy: &str) -> Result<(), Error> {
        let within = |name: &str, v: u64| {
            let (min, max) = Self::range(name);
            if (min..=max).contains(&v) {
                Ok(())
            } else {
                Err(Error::bad(
                    policy,
                    name,
                    format!("must be an integer from {min} to {max}"),
                ))
            }
        };
        if let Some(Some(a)) = &self.adapt {
            within("ERRORS", a.errors.into())?;
            if let Some(v) = a.factor {
                within("FACTOR", v.into())?;
            }
            if let Some(v) = a.min {
                within("MIN", v.into())?;
            }
            if let Some(v) = a.recover {
                within("RECOVER", v.into())?;
            }
            if let Some(v) = a.window_ms {
                within("WINDOW", v)?;
            }
            if let Some(v) = a.mincalls {
                within("MINCALLS", v)?;
            }
        }
        if let Some((degrade, brk)) = self.stages {
            within("degrade_pct", degrade.into())?;
            within("break_pct", brk.into())?;
            if brk < degrade {
                return Err(Error::bad(
                    policy,
                    "break_pct",
                    format!("must be an integer from {degrade} (degrade_pct) to 100"),
                ));
            }
        }
        if let Some(v) = self.window_ms {
            within("WINDOW", v)?;
        }
        Ok(())
    }

    /// The words sent after the policy's parameters.
    pub fn args(&self) -> Vec<String> {
        let mut out: Vec<String> = Vec::new();
        match &self.adapt {
            Some(Some(a)) => {
                out.push("ADAPT".into());
                out.push("ERRORS".into());
                out.push(a.errors.to_string());
                let mut push = |w: &str, v: Option<u64>| {
                    if let Some(v) = v {
                        out.push(w.to_string());
                        out.push(v.to_string());
                    }
                };
                push("FACTOR", a.factor.map(u64::from));
                push("MIN", a.min.map(u64::from));
                push("RECOVER", a.recover.map(u64::from));
                push("WINDOW", a.window_ms);
                push("MINCALLS", a.mincalls);
            }
            Some(None) => {
                out.push("ADAPT".into());
                out.push("OFF".into());
            }
            None => {}
        }
        if let Some((degrade, brk)) = self.stages {
            out.extend(["STAGES".into(), degrade.to_string(), brk.to_string()]);
        }
        if let Some(v) = self.window_ms {
            out.extend(["WINDOW".into(), v.to_string()]);
        }
        out
    }
}

impl Client {
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
        self.policy_set_with(name, spec, mode, rollout, None).await
    }

    async fn policy_set_with(
        &self,
        name: &str,
        spec: &Spec,
        mode: PolicyMode,
        rollout: u8,
        protection: Option<&PolicyProtection>,
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
        if let Some(protection) = protection {
            protection.check(name)?;
            cmd.arg(protection.args());
        }
        self.send(cmd, Target::AllMasters(ResponsePolicy::AllSucceeded))
            .await
            .map(drop)
    }

    /// [`Client::policy_set`] with the protection loop's options (`ADAPT
    /// ... | ADAPT OFF`, `STAGES`, `WINDOW`), each checked against the
    /// contract's ranges before sending.
    pub async fn policy_set_protected(
        &self,
        name: &str,
        spec: &Spec,
        mode: PolicyMode,
        rollout: u8,
        protection: &PolicyProtection,
    ) -> Result<(), Error> {
        self.policy_set_with(name, spec, mode, rollout, Some(protection))
            .await
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
            scale: 100,
            stage: 0,
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
                // A module without the protection loop sends neither.
                Some("scale") => info.scale = int.clamp(1, 100) as u8,
                Some("stage") => info.stage = int.clamp(0, 2) as u8,
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
        let reply = self.send(cmd, SUM_OF_MASTERS).await?;
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
        let reply = self.send(cmd, SUM_OF_MASTERS).await?;
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
    /// The percentage its size and rate parameters run at (100 unless the
    /// protection loop or `RL.POLICY SCALE` lowered it).
    pub scale: u8,
    /// Its stage: 0 normal, 1 degrade, 2 break.
    pub stage: u8,
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

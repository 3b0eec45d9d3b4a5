//! The arguments of a call, checked before sending: the request's words
//! (`COST n`, `COST n FORCE`, `REFUND n`), a lease, and the commands built
//! from a spec or a policy.

use redis::Cmd;
use redis_ratelimit_core::{Request, MAX_PARAM};

use crate::rule::{RuleKind, Spec};
use crate::Error;

/// The largest `UPTO n` the server takes: 2^40.
pub const MAX_UPTO: u64 = 1 << 40;

pub(super) fn check_units(command: &str, units: Request) -> Result<(), Error> {
    let (arg, n) = match units {
        Request::Cost(n) | Request::Force(n) => ("COST", n),
        Request::Refund(n) => ("REFUND", n),
        Request::UpTo(n) => {
            if n == 0 || n > MAX_UPTO {
                return Err(Error::bad(
                    command,
                    "UPTO",
                    format!("UPTO must be an integer from 1 to {MAX_UPTO}"),
                ));
            }
            return Ok(());
        }
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

pub(super) fn check_lease(command: &str, lease: u64) -> Result<(), Error> {
    if lease > i64::MAX as u64 {
        return Err(Error::bad(
            command,
            "lease",
            format!("must be an integer from 0 to {}", i64::MAX),
        ));
    }
    Ok(())
}

pub(super) fn lease_units(command: &str, cost: u64) -> Result<Request, Error> {
    if cost == 0 {
        return Err(Error::bad(command, "COST", "a lease holds at least 1 unit"));
    }
    Ok(Request::Cost(cost))
}

pub(crate) fn limiter_cmd(key: &str, spec: &Spec, units: Request) -> Result<Cmd, Error> {
    check_units(spec.algorithm(), units)?;
    if matches!(units, Request::UpTo(_))
        && matches!(spec, Spec::LeakyBucket(_) | Spec::Concurrency(_))
    {
        return Err(Error::bad(
            spec.algorithm(),
            "UPTO",
            format!("UPTO is not an option of RL.{}", spec.algorithm()),
        ));
    }
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

pub(super) fn all_cmd<'a>(
    limits: &[(&'a str, &RuleKind)],
    units: Request,
) -> Result<(Cmd, &'a str), Error> {
    if matches!(units, Request::Force(_) | Request::Refund(_)) {
        return Err(Error::bad(
            "RL.ALL",
            "COST",
            "RL.ALL takes COST n or UPTO n, not FORCE or REFUND",
        ));
    }
    all_args(limits, units)
}

/// `RL.ALL ... <units> EACH`: `COST n` (0 included: a check) or
/// `COST n FORCE`; `UPTO` and `REFUND` are refused, naming them.
pub(super) fn all_each_cmd<'a>(
    limits: &[(&'a str, &RuleKind)],
    units: Request,
) -> Result<(Cmd, &'a str), Error> {
    match units {
        Request::Cost(_) | Request::Force(_) => {}
        Request::UpTo(_) => {
            return Err(Error::bad(
                "RL.ALL",
                "UPTO",
                "RL.ALL ... EACH takes COST n [FORCE], not UPTO",
            ))
        }
        Request::Refund(_) => {
            return Err(Error::bad(
                "RL.ALL",
                "REFUND",
                "RL.ALL ... EACH takes COST n [FORCE], not REFUND",
            ))
        }
    }
    let (mut cmd, first) = all_args(limits, units)?;
    cmd.arg("EACH");
    Ok((cmd, first))
}

fn all_args<'a>(limits: &[(&'a str, &RuleKind)], units: Request) -> Result<(Cmd, &'a str), Error> {
    check_units("RL.ALL", units)?;
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
    units_args(&mut cmd, units);
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

/// Appends the request's words: none for `COST 1`, the default.
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
        Request::UpTo(n) => {
            cmd.arg("UPTO").arg(n);
        }
    }
}

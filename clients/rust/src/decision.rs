//! What a limiter answered, in the units an application uses.

use std::time::Duration;

use redis::Value;

use crate::Error;

/// Which path decided a request (each has its counter in
/// [`crate::StatsSnapshot`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Path {
    /// The server's limiter.
    Redis,
    /// The in-process level, for a global rule, without a round trip.
    Local,
    /// The local deny cache, without a round trip.
    DenyCache,
    /// The fallback, Redis being unreachable or late.
    Fallback,
    /// A batched rule, in process: a unit held from an `UPTO` grant, or a
    /// denial before the rule's next ask (metrics level `grant`).
    Grant,
}

/// The five fields of a limiter's reply (`[allowed, limit, remaining,
/// wait_ms, reset_ms]`), and the sixth: `denied_by` for `RL.ALL`, `lease`
/// for `RL.CONCURRENCY` (and `RL.HIT` on a `CONCURRENCY` policy).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Decision {
    /// Admitted (its units consumed) or denied (nothing changed).
    pub allowed: bool,
    /// The limiter's capacity or requests per window.
    pub limit: u64,
    /// Units left right after this call.
    pub remaining: u64,
    /// `wait_ms` as the server sent it: -1 when the request can never pass.
    pub wait_ms: i64,
    /// Denied: the time until the same request would pass (zero when it
    /// never can; see [`Decision::never`]). Admitted: zero, except for the
    /// leaky bucket, where it is the delay before acting.
    pub retry_after: Duration,
    /// The time until the limiter is idle again.
    pub reset_after: Duration,
    /// `RL.ALL`: the 0-based position of the first rule that denied.
    pub denied_by: Option<usize>,
    /// `RL.CONCURRENCY`: the id of the lease granted (`None` when denied,
    /// and for the other limiters). Give it back with
    /// [`crate::Client::release`], or hold it in a [`crate::LeaseGuard`].
    pub lease: Option<u64>,
    /// `UPTO n`: the units taken (0 on a denial). `None` for a call without
    /// `UPTO` (it takes its `COST` when admitted, nothing when denied). A
    /// [`crate::Limiter`] decision of a batched rule has `Some(1)` when
    /// admitted (one unit of its grant), `Some(0)` when denied.
    pub granted: Option<u64>,
    /// Which path decided.
    pub path: Path,
}

/// What the sixth integer of a reply is, when there is one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Sixth {
    /// `RL.ALL`: the 1-based position of the limiter that denied, 0 if none.
    DeniedBy,
    /// `RL.CONCURRENCY`, `RL.HIT`: the lease granted, 0 if none.
    Lease,
    /// A call with `UPTO`: the sixth is `granted`.
    Granted,
    /// `RL.ALL ... UPTO`: `denied_by`, then `granted` (seven fields).
    DeniedByGranted,
}

impl Decision {
    pub(crate) fn from_fields(
        allowed: bool,
        limit: u64,
        remaining: u64,
        wait_ms: i64,
        reset_ms: u64,
        path: Path,
    ) -> Decision {
        Decision {
            allowed,
            limit,
            remaining,
            wait_ms,
            retry_after: Duration::from_millis(wait_ms.max(0) as u64),
            reset_after: Duration::from_millis(reset_ms),
            denied_by: None,
            lease: None,
            granted: None,
            path,
        }
    }

    /// A denied request that can never pass (its cost exceeds the limit).
    pub fn never(&self) -> bool {
        self.wait_ms < 0
    }

    /// `reset_ms`.
    pub fn reset_ms(&self) -> u64 {
        self.reset_after.as_millis() as u64
    }

    /// `Retry-After` in whole seconds, `ceil(wait_ms / 1000)`; `None` when the
    /// request can never pass.
    pub fn retry_after_s(&self) -> Option<u64> {
        (self.wait_ms >= 0).then(|| (self.wait_ms as u64).div_ceil(1000))
    }

    /// Parses a five-integer reply, or a six-integer one whose sixth is
    /// `sixth`.
    pub(crate) fn from_reply(value: Value, sixth: Sixth) -> Result<Decision, Error> {
        let ints = reply_ints(value)?;
        let expected: &[usize] = match sixth {
            Sixth::DeniedBy | Sixth::Lease => &[5, 6],
            Sixth::Granted => &[6],
            Sixth::DeniedByGranted => &[7],
        };
        if !expected.contains(&ints.len()) {
            return Err(Error::Protocol(format!("{} fields", ints.len())));
        }
        Ok(Decision::from_ints(&ints, sixth))
    }

    /// Parses the reply of `RL.ALL ... EACH` on `n` limiters: the call's six
    /// integers (`denied_by` sixth), then five per limiter, in order.
    pub(crate) fn from_each_reply(
        value: Value,
        n: usize,
    ) -> Result<(Decision, Vec<Decision>), Error> {
        let ints = reply_ints(value)?;
        if ints.len() != 6 + 5 * n {
            return Err(Error::Protocol(format!(
                "{} fields, not {} (RL.ALL ... EACH on {n} limiters)",
                ints.len(),
                6 + 5 * n
            )));
        }
        let call = Decision::from_ints(&ints[..6], Sixth::DeniedBy);
        let each = ints[6..]
            .chunks_exact(5)
            .map(|f| Decision::from_ints(f, Sixth::Lease))
            .collect();
        Ok((call, each))
    }

    /// The decision of 5, 6 or 7 integers whose width was checked.
    fn from_ints(ints: &[i64], sixth: Sixth) -> Decision {
        let u = |i: i64| i.max(0) as u64;
        let mut d = Decision::from_fields(
            ints[0] == 1,
            u(ints[1]),
            u(ints[2]),
            ints[3],
            u(ints[4]),
            Path::Redis,
        );
        match sixth {
            Sixth::DeniedBy | Sixth::DeniedByGranted if ints.len() >= 6 && ints[5] > 0 => {
                d.denied_by = Some(ints[5] as usize - 1)
            }
            Sixth::Lease if ints.len() == 6 && ints[5] > 0 => d.lease = Some(ints[5] as u64),
            _ => {}
        }
        match sixth {
            Sixth::Granted => d.granted = Some(u(ints[5])),
            Sixth::DeniedByGranted => d.granted = Some(u(ints[6])),
            _ => {}
        }
        d
    }
}

/// A reply's integers: a server error is the kit's error for it, anything
/// but an array of integers a protocol error.
fn reply_ints(value: Value) -> Result<Vec<i64>, Error> {
    let items = match value {
        Value::Array(items) => items,
        Value::ServerError(e) => return Err(crate::error::server_error(&e)),
        other => return Err(Error::Protocol(format!("{other:?}"))),
    };
    items
        .iter()
        .map(|v| match v {
            Value::Int(i) => Ok(*i),
            other => Err(Error::Protocol(format!("{other:?}"))),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ints(values: &[i64]) -> Value {
        Value::Array(values.iter().map(|&i| Value::Int(i)).collect())
    }

    #[test]
    fn an_each_reply_gives_the_call_then_every_limiter_in_order() {
        let reply = ints(&[0, 5, 0, 400, 900, 2, 1, 10, 6, 0, 800, 0, 5, 0, 400, 900]);
        let (call, each) = Decision::from_each_reply(reply, 2).unwrap();
        assert_eq!(
            (call.allowed, call.denied_by, call.remaining),
            (false, Some(1), 0)
        );
        assert_eq!(each.len(), 2);
        assert_eq!(
            (each[0].allowed, each[0].limit, each[0].remaining),
            (true, 10, 6)
        );
        assert_eq!(each[1].retry_after, Duration::from_millis(400));
        assert!(each
            .iter()
            .all(|d| d.denied_by.is_none() && d.lease.is_none()));
    }

    #[test]
    fn an_each_reply_of_the_wrong_width_is_a_protocol_error() {
        for width in [5, 6, 7, 10, 15, 17] {
            let reply = ints(&vec![1; width]);
            match Decision::from_each_reply(reply, 2) {
                Err(Error::Protocol(_)) => {}
                other => panic!("{width} fields: {other:?}"),
            }
        }
    }
}

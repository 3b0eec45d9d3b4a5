//! The typed calls: the limiter commands, `RL.RELEASE` and `RL.RENEW`,
//! `RL.HIT`, `RL.ALL`, the blocking acquires (`BLOCK`) and the leases held
//! in a guard.

use std::time::Duration;

use redis::{Cmd, Value};
use redis_ratelimit_core::{Period, Request, MAX_PARAM};

use super::args::{all_cmd, all_each_cmd, check_lease, hit_cmd, lease_units, limiter_cmd};
use super::connect::Target;
use super::Client;
use crate::acquire::Block;
use crate::decision::{Decision, Sixth};
use crate::lease::{LeaseGuard, LeaseMs};
use crate::rule::{RuleKind, Spec};
use crate::Error;

impl Client {
    /// One call on `key`, its reply read as a decision.
    pub(super) async fn decision(
        &self,
        cmd: Cmd,
        key: &str,
        sixth: Sixth,
    ) -> Result<Decision, Error> {
        Decision::from_reply(self.send(cmd, Target::Key(key)).await?, sixth)
    }

    /// Any limiter command, on `key`, with a checked spec.
    /// `units` may be [`Request::UpTo`] (not on `LEAKYBUCKET` or
    /// `CONCURRENCY`: an error naming `UPTO`): the decision's
    /// [`Decision::granted`] is then the units taken.
    pub async fn apply(&self, key: &str, spec: &Spec, units: Request) -> Result<Decision, Error> {
        self.decision(limiter_cmd(key, spec, units)?, key, sixth_of(units))
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
    /// With [`Request::UpTo`], [`Decision::granted`] is the units taken
    /// (the server refuses `UPTO` on a `LEAKYBUCKET` or `CONCURRENCY`
    /// policy, naming `UPTO`).
    pub async fn hit(&self, policy: &str, key: &str, units: Request) -> Result<Decision, Error> {
        self.decision(hit_cmd(policy, key, units)?, key, sixth_of(units))
            .await
    }

    /// `RL.ALL numkeys key... spec... [COST n]`: all or nothing, sent to the
    /// owner of the first key (in a cluster they must share a slot: use a
    /// hash tag). `denied_by` is the 0-based position of the rule that
    /// denied.
    pub async fn all(&self, limits: &[(&str, &RuleKind)], cost: u64) -> Result<Decision, Error> {
        let (cmd, first) = all_cmd(limits, Request::Cost(cost))?;
        self.decision(cmd, first, Sixth::DeniedBy).await
    }

    /// `RL.ALL numkeys key... spec... [COST n [FORCE]] EACH`: the call's
    /// decision, as [`Client::all`] gives it (with `denied_by`), and every
    /// limiter's own, in the order of `limits` (`denied_by` `None`, path
    /// [`Path::Redis`](crate::Path::Redis)). Admitted, each limiter's is what
    /// it answered after the take; denied, what each would have answered,
    /// nothing taken; a policy in `SHADOW` or `OFF` mode gives its shadowed
    /// or off answer.
    ///
    /// `request` is [`Request::Cost`] (`Cost(0)` checks without taking) or
    /// [`Request::Force`]; [`Request::UpTo`] and [`Request::Refund`] are
    /// refused before sending, naming `UPTO` or `REFUND`. Needs a server
    /// that knows `EACH` (an older one answers an error naming it).
    pub async fn all_each(
        &self,
        limits: &[(&str, &RuleKind)],
        request: Request,
    ) -> Result<(Decision, Vec<Decision>), Error> {
        let (cmd, first) = all_each_cmd(limits, request)?;
        Decision::from_each_reply(self.send(cmd, Target::Key(first)).await?, limits.len())
    }

    /// `RL.ALL numkeys key... spec... UPTO n`: the largest number of units,
    /// at most `n`, that every limiter admits at once, in
    /// [`Decision::granted`] (0 on a denial, which is `COST 1`'s).
    pub async fn all_upto(&self, limits: &[(&str, &RuleKind)], n: u64) -> Result<Decision, Error> {
        let (cmd, first) = all_cmd(limits, Request::UpTo(n))?;
        self.decision(cmd, first, Sixth::DeniedByGranted).await
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
        self.blocking(
            limiter_cmd(key, spec, units)?,
            key,
            sixth_of(units),
            timeout,
        )
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
        self.blocking(hit_cmd(policy, key, units)?, key, sixth_of(units), timeout)
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
        let (cmd, first) = all_cmd(limits, Request::Cost(cost))?;
        self.blocking(cmd, first, Sixth::DeniedBy, timeout).await
    }

    /// A call with `BLOCK`, on a connection of its own (see [`Client::acquire`]).
    pub(super) async fn blocking(
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
}

/// What a reply's sixth field is for a call with `units`.
fn sixth_of(units: Request) -> Sixth {
    match units {
        Request::UpTo(_) => Sixth::Granted,
        _ => Sixth::Lease,
    }
}

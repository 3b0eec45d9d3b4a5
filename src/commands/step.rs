//! The skeleton of every call that decides: the limiter commands
//! (`RL.TOKENBUCKET`, ...), `RL.HIT` and `RL.ALL` run the same stages in the
//! same order, written once here ([`run`]); each command says what a stage
//! does for it ([`Step`]).
//!
//! 1. **bounds**: the operator's bounds on a client's call, and the
//!    parameters resolved at the call's instant (a calendar quota learns
//!    where its period ends);
//! 2. **gate**: where the call stands among its key's waiters (a waiter
//!    behind others stays blocked, untouched);
//! 3. **decide or apply**: a single-key call applies its request as it
//!    decides; `RL.ALL` decides on every key first and changes nothing yet;
//! 4. **park**: with `BLOCK`, a denial waits in the server instead of
//!    answering;
//! 5. **stats and deny log**;
//! 6. **commit: propagate and signal**: `RL.ALL` takes its units now, when
//!    every limiter admitted; a change goes to the replicas and the AOF with
//!    the master's time pinned, the key is marked written, and waiters on
//!    it are signalled;
//! 7. **reply**.
//!
//! Single-key calls are one [`Step`], [`OneKey`]: a limiter command's call
//! and a policy's (`RL.HIT`) differ only in where the key and the
//! parameters come from, and in a policy's mode (a shadowed call never waits
//! and never denies; a call through a policy that is off touches nothing).
//!
//! Hot path: everything here is generic and inlined, so each command
//! compiles to the straight line it was written as before (`make
//! bench-compare` counts the instructions).

use std::ffi::CStr;
use std::sync::Arc;

use super::apply::{apply_to_key, Applied};
use super::host::{Host, Store, Turn};
use super::wait::{self, Gate, Waits};
use crate::algorithms::Spec;
use crate::algorithms::{Listed, ReplyShape};
use crate::args::Params;
use crate::calendar::Zone;
use crate::deny_log;
use crate::error::Error;
use crate::limiter::{Decision, Micros, Request, Wait};
use crate::policy::{Mode, PolicyStats, Rule};

/// The stages of one call (see the file's header for what each does).
pub(super) trait Step<'h, H: Host + 'h> {
    /// What the decision stage hands to the later ones: the keys it opened
    /// and what it decided.
    type Made;
    /// The call's instant: the master's clock, or the one a replicated call
    /// carries.
    fn now(&self, host: &H) -> Micros;
    /// 1. Bounds.
    fn bounds(&mut self, now: Micros) -> Result<(), Error>;
    /// 2 and 3. Gate, and decide or apply; `None` when a blocked call stays
    /// blocked, untouched.
    fn decide(&mut self, host: &'h H, now: Micros) -> Result<Option<Self::Made>, Error>;
    /// What the call is answered (a denial: how long it would wait).
    fn answer(&self, made: &Self::Made) -> Decision;
    /// 4. Park: whether the call waits instead of answering now.
    fn park(&self, host: &H, made: &Self::Made, now: Micros) -> bool;
    /// 5. Stats and deny log.
    fn record(&self, made: &Self::Made, now: Micros);
    /// 6. Commit: take what is still to take, propagate, signal.
    fn commit(&mut self, host: &H, made: &mut Self::Made, now: Micros) -> Result<(), Error>;
    /// 7. Reply.
    fn reply(&mut self, host: &H, made: Self::Made);
}

/// Runs the stages of `step` in order: the one skeleton.
#[inline(always)]
pub(super) fn run<'h, H: Host + 'h, S: Step<'h, H>>(
    host: &'h H,
    step: &mut S,
) -> Result<(), Error> {
    let now = step.now(host);
    step.bounds(now)?;
    let Some(mut made) = step.decide(host, now)? else {
        host.keep_waiting();
        return Ok(());
    };
    if step.park(host, &made, now) {
        return Ok(());
    }
    wait::answered(host, &step.answer(&made));
    step.record(&made, now);
    step.commit(host, &mut made, now)?;
    step.reply(host, made);
    Ok(())
}

/// Where a single-key call comes from: its algorithm's own command
/// ([`Command`]) or a policy (`RL.HIT`, [`Policy`]). A type, not a value,
/// so that each command compiles to its own straight line.
pub(super) trait Via {
    /// The argument the key is.
    const KEY_ARG: usize;
    /// The call's instant.
    fn now(&self, host: &impl Host) -> Micros;
    /// How the call goes through: enforced, shadowed or off.
    fn through(&self) -> Through;
    /// 1. The operator's bounds, and the parameters resolved at `now`.
    fn bounds<L: Listed>(&self, params: &mut L::Params, now: Micros) -> Result<(), Error>;
    /// Whether a call that would create its key is refused when memory is
    /// short.
    fn check_memory(&self) -> bool;
    /// 5. Stats and deny log.
    fn record<L: Listed>(&self, key: &[u8], decision: &Decision, cost: u64, now: Micros);
    /// 6. Propagates a change; the keyspace event.
    fn propagate<L: Listed, H: Host>(
        &self,
        host: &H,
        params: &L::Params,
        request: Request,
        now: Micros,
    ) -> &'static CStr;
    /// The error of `UPTO` on an algorithm that never grants part of a
    /// request.
    fn no_upto<L: Listed>() -> Error;
}

/// The algorithm's own command: the key is argument 1, the parameters follow
/// it.
pub(super) struct Command {
    /// A replicated call's pinned instant (the operator's bounds are not
    /// applied to it: the master accepted it).
    pub at: Option<Micros>,
    /// A calendar quota's period end, pinned by the master.
    pub end: Option<Micros>,
    /// The quota's zone (`TZ`).
    pub zone: Option<Zone>,
}

impl Via for Command {
    const KEY_ARG: usize = 1;

    #[inline(always)]
    fn now(&self, host: &impl Host) -> Micros {
        self.at.unwrap_or_else(|| host.now())
    }

    #[inline(always)]
    fn through(&self) -> Through {
        Through::Enforce
    }

    #[inline(always)]
    fn bounds<L: Listed>(&self, params: &mut L::Params, now: Micros) -> Result<(), Error> {
        if self.at.is_none() {
            L::ROW.check_bound(params)?;
        }
        (L::ROW.resolve)(params, self.zone, self.end, now)
    }

    #[inline(always)]
    fn check_memory(&self) -> bool {
        self.at.is_none()
    }

    #[inline(always)]
    fn record<L: Listed>(&self, key: &[u8], decision: &Decision, cost: u64, now: Micros) {
        L::stats().record(decision, cost);
        if !decision.allowed {
            deny_log::record(
                now.as_ms_floor(),
                key,
                &[L::ROW.command.to_bytes()],
                cost,
                decision.wait.as_reply(),
            );
        }
    }

    #[inline(always)]
    fn propagate<L: Listed, H: Host>(
        &self,
        host: &H,
        params: &L::Params,
        request: Request,
        now: Micros,
    ) -> &'static CStr {
        let end = (L::ROW.period_end)(params);
        host.propagate_limiter(
            L::ROW.command,
            1,
            2..2 + L::Params::COUNT,
            request,
            now,
            end,
        );
        L::EVENT
    }

    #[cold]
    fn no_upto<L: Listed>() -> Error {
        Error::Syntax(format!(
            "UPTO is not an option of {}",
            L::ROW.command.to_string_lossy()
        ))
    }
}

/// `RL.HIT name key`: the key is argument 2, the parameters the policy's.
pub(super) struct Policy<'a> {
    pub name: &'a [u8],
    pub stats: Arc<PolicyStats>,
    pub through: Through,
    /// A calendar quota's zone, if the policy is one.
    pub zone: Option<Zone>,
    /// The call's instant, read once (the protection loop read it first).
    pub now: Micros,
    /// The policy's protection loop counts the call.
    pub counts: bool,
}

impl Via for Policy<'_> {
    const KEY_ARG: usize = 2;

    #[inline(always)]
    fn now(&self, _host: &impl Host) -> Micros {
        self.now
    }

    #[inline(always)]
    fn through(&self) -> Through {
        self.through
    }

    #[inline(always)]
    fn bounds<L: Listed>(&self, params: &mut L::Params, now: Micros) -> Result<(), Error> {
        // A policy's bounds were checked when it was set; one that is off
        // looks at nothing.
        if self.through == Through::Off {
            return Ok(());
        }
        (L::ROW.resolve)(params, self.zone, None, now)
    }

    #[inline(always)]
    fn check_memory(&self) -> bool {
        true
    }

    #[inline(always)]
    fn record<L: Listed>(&self, key: &[u8], decision: &Decision, cost: u64, now: Micros) {
        let stats = &self.stats;
        if self.through == Through::Off {
            stats.outcomes.calls.bump();
            return;
        }
        L::stats().record(decision, cost);
        stats.outcomes.record(decision, cost);
        if self.counts && cost > 0 {
            crate::policy::lock(&stats.protection).count_call(decision.allowed);
        }
        if !decision.allowed && cost > 0 {
            if self.through == Through::Enforce {
                deny_log::record(
                    now.as_ms_floor(),
                    key,
                    &[b"policy:", self.name],
                    cost,
                    decision.wait.as_reply(),
                );
            } else {
                stats.shadow_denied.bump();
            }
        }
    }

    #[inline(always)]
    fn propagate<L: Listed, H: Host>(
        &self,
        host: &H,
        params: &L::Params,
        request: Request,
        now: Micros,
    ) -> &'static CStr {
        let end = (L::ROW.period_end)(params);
        host.propagate_limiter_with(L::ROW.command, 2, || params.values(), request, now, end);
        c"rl.hit"
    }

    #[cold]
    fn no_upto<L: Listed>() -> Error {
        Error::Syntax(format!(
            "UPTO is not an option of RL.HIT on a {} policy",
            crate::algorithms::word::<L>()
        ))
    }
}

/// One limiter's call, through its command or a policy.
pub(super) struct OneKey<'a, L: Listed, V: Via> {
    pub key: &'a [u8],
    pub params: L::Params,
    pub request: Request,
    pub block: Option<u64>,
    pub via: V,
}

/// What a single-key call decided, with its key (none for a policy that is
/// off, which looks at nothing).
pub(super) struct OneMade<K> {
    key: Option<K>,
    applied: Applied,
}

impl<'h, H: Host + 'h, L: Listed, V: Via> Step<'h, H> for OneKey<'_, L, V> {
    type Made = OneMade<H::Key<'h>>;

    #[inline(always)]
    fn now(&self, host: &H) -> Micros {
        self.via.now(host)
    }

    #[inline(always)]
    fn bounds(&mut self, now: Micros) -> Result<(), Error> {
        if let Request::UpTo(_) = self.request {
            if !L::ROW.upto {
                return Err(V::no_upto::<L>());
            }
        }
        self.via.bounds::<L>(&mut self.params, now)
    }

    #[inline(always)]
    fn decide(&mut self, host: &'h H, now: Micros) -> Result<Option<Self::Made>, Error> {
        let through = self.via.through();
        if through == Through::Off {
            return Ok(Some(OneMade {
                key: None,
                applied: Applied::unchanged(off_decision(L::spec(self.params))),
            }));
        }
        let mut key = host.open_key(V::KEY_ARG);
        // A dry run never makes the caller wait, nor waits itself.
        let gate = if through == Through::Enforce {
            wait::gate::<L, H>(host, &mut key, self.key, &self.params, self.request, now)?
        } else {
            Gate::Open
        };
        let applied = match gate {
            Gate::Open => apply_to_key::<L, H>(
                host,
                &mut key,
                &self.params,
                self.request,
                now,
                self.via.check_memory(),
            )?,
            Gate::Wait => return Ok(None),
            Gate::Behind(decision) => Applied::unchanged(decision),
        };
        Ok(Some(OneMade {
            key: Some(key),
            applied,
        }))
    }

    #[inline(always)]
    fn answer(&self, made: &Self::Made) -> Decision {
        made.applied.outcome.decision
    }

    #[inline(always)]
    fn park(&self, host: &H, made: &Self::Made, now: Micros) -> bool {
        let waits = Waits {
            queued: true,
            released_early: L::ROW.reply == ReplyShape::Lease,
        };
        self.via.through() == Through::Enforce
            && wait::park(
                host,
                &[V::KEY_ARG],
                &[self.key],
                waits,
                &made.applied.outcome.decision,
                self.request,
                self.block,
                now,
            )
    }

    #[inline(always)]
    fn record(&self, made: &Self::Made, now: Micros) {
        let decision = &made.applied.outcome.decision;
        self.via
            .record::<L>(self.key, decision, self.request.cost(), now);
        if let Request::UpTo(most) = self.request {
            if self.via.through() != Through::Off {
                crate::stats::UPTO.record(most, made.applied.outcome.granted);
            }
        }
    }

    #[inline(always)]
    fn commit(&mut self, host: &H, made: &mut Self::Made, now: Micros) -> Result<(), Error> {
        let applied = &made.applied;
        let Some(key) = made.key.as_mut() else {
            return Ok(());
        };
        if !applied.outcome.changed {
            return Ok(());
        }
        // `UPTO n` goes out as the admission it was: `COST granted`.
        let request = self.request.as_applied(&applied.outcome);
        let event = self.via.propagate::<L, H>(host, &self.params, request, now);
        key.written(event, applied.expiry_written);
        if host.turn() == Turn::Call {
            // A release, a refund or new parameters may let waiters in.
            host.signal_ready(V::KEY_ARG);
        }
        Ok(())
    }

    #[inline(always)]
    fn reply(&mut self, host: &H, made: Self::Made) {
        let OneMade { key, applied } = made;
        drop(key);
        let decision = applied.outcome.decision;
        // A shadowed denial is answered allowed.
        let answer = if !decision.allowed
            && self.request.cost() > 0
            && self.via.through() == Through::Shadow
        {
            shadowed(decision)
        } else {
            decision
        };
        match self.request {
            // The units taken follow the five fields; a limiter that is off
            // grants all that was asked, taking nothing.
            Request::UpTo(most) => {
                let granted = if self.via.through() == Through::Off {
                    most
                } else {
                    applied.outcome.granted
                };
                super::reply_decision_and(host, &answer, granted as i64);
            }
            _ => L::ROW.reply.send(host, &answer, applied.lease),
        }
    }
}

/// What a call through a rule does with the key: enforce, shadow or nothing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Through {
    Enforce,
    Shadow,
    Off,
}

impl Through {
    pub fn of(rule: &Rule, key: &[u8]) -> Through {
        match rule.mode {
            Mode::Off => Through::Off,
            _ if rule.enforces(key) => Through::Enforce,
            _ => Through::Shadow,
        }
    }
}

/// The answer of a limiter that is off: allowed, nothing looked at.
pub fn off_decision(spec: Spec) -> Decision {
    let limit = spec.limit();
    Decision {
        allowed: true,
        limit,
        remaining: limit,
        wait: Wait::Ms(0),
        reset_ms: 0,
    }
}

/// A shadowed decision as the caller sees it: allowed, with no wait.
pub fn shadowed(mut decision: Decision) -> Decision {
    decision.allowed = true;
    decision.wait = Wait::Ms(0);
    decision
}

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
    fn answer(made: &Self::Made) -> Decision;
    /// 4. Park: whether the call waits instead of answering now.
    fn park(&self, host: &H, made: &Self::Made, now: Micros) -> bool;
    /// 5. Stats and deny log.
    fn record(&self, made: &Self::Made, now: Micros);
    /// 6. Commit: take what is still to take, propagate, signal.
    fn commit(&self, host: &H, made: &mut Self::Made, now: Micros) -> Result<(), Error>;
    /// 7. Reply.
    fn reply(self, host: &H, made: Self::Made);
}

/// Runs the stages of `step` in order: the one skeleton.
#[inline(always)]
pub(super) fn run<'h, H: Host + 'h, S: Step<'h, H>>(host: &'h H, mut step: S) -> Result<(), Error> {
    let now = step.now(host);
    step.bounds(now)?;
    let Some(mut made) = step.decide(host, now)? else {
        host.keep_waiting();
        return Ok(());
    };
    if step.park(host, &made, now) {
        return Ok(());
    }
    wait::answered(host, &S::answer(&made));
    step.record(&made, now);
    step.commit(host, &mut made, now)?;
    step.reply(host, made);
    Ok(())
}

/// Where a single-key call comes from.
pub(super) enum Via<'a> {
    /// The algorithm's own command: the key is argument 1, the parameters
    /// follow it.
    Command {
        /// A replicated call (its instant pinned, the operator's bounds not
        /// applied: the master accepted it).
        at: Option<Micros>,
        /// A calendar quota's period end, pinned by the master.
        end: Option<Micros>,
        /// The quota's zone (`TZ`).
        zone: Option<Zone>,
    },
    /// `RL.HIT name key`: the key is argument 2, the parameters the
    /// policy's.
    Policy {
        name: &'a [u8],
        stats: Arc<PolicyStats>,
        through: Through,
        /// A calendar quota's zone, if the policy is one.
        zone: Option<Zone>,
    },
}

/// One limiter's call, through its command or a policy.
pub(super) struct OneKey<'a, L: Listed> {
    pub key: &'a [u8],
    pub params: L::Params,
    pub request: Request,
    pub block: Option<u64>,
    pub via: Via<'a>,
}

/// What a single-key call decided, with its key (none for a policy that is
/// off, which looks at nothing).
pub(super) struct OneMade<K> {
    key: Option<K>,
    applied: Applied,
}

impl<L: Listed> OneKey<'_, L> {
    /// The argument the key is.
    #[inline(always)]
    fn key_arg(&self) -> usize {
        match self.via {
            Via::Command { .. } => 1,
            Via::Policy { .. } => 2,
        }
    }

    #[inline(always)]
    fn through(&self) -> Through {
        match self.via {
            Via::Command { .. } => Through::Enforce,
            Via::Policy { through, .. } => through,
        }
    }
}

impl<'h, H: Host + 'h, L: Listed> Step<'h, H> for OneKey<'_, L> {
    type Made = OneMade<H::Key<'h>>;

    #[inline(always)]
    fn now(&self, host: &H) -> Micros {
        match self.via {
            Via::Command { at: Some(at), .. } => at,
            _ => host.now(),
        }
    }

    #[inline(always)]
    fn bounds(&mut self, now: Micros) -> Result<(), Error> {
        let (zone, end) = match self.via {
            Via::Command { at, end, zone } => {
                if at.is_none() {
                    L::ROW.check_bound(&self.params)?;
                }
                (zone, end)
            }
            // A policy that is off looks at nothing.
            Via::Policy {
                through: Through::Off,
                ..
            } => return Ok(()),
            // A policy's bounds were checked when it was set.
            Via::Policy { zone, .. } => (zone, None),
        };
        (L::ROW.resolve)(&mut self.params, zone, end, now)
    }

    #[inline(always)]
    fn decide(&mut self, host: &'h H, now: Micros) -> Result<Option<Self::Made>, Error> {
        let through = self.through();
        if through == Through::Off {
            return Ok(Some(OneMade {
                key: None,
                applied: Applied::unchanged(off_decision(L::spec(self.params))),
            }));
        }
        let mut key = host.open_key(self.key_arg());
        // A dry run never makes the caller wait, nor waits itself.
        let gate = if through == Through::Enforce {
            wait::gate::<L, H>(host, &mut key, self.key, &self.params, self.request, now)?
        } else {
            Gate::Open
        };
        let applied = match gate {
            Gate::Open => {
                // A replicated call is never refused for memory: the master
                // took it.
                let check_memory = !matches!(self.via, Via::Command { at: Some(_), .. });
                apply_to_key::<L, H>(
                    host,
                    &mut key,
                    &self.params,
                    self.request,
                    now,
                    check_memory,
                )?
            }
            Gate::Wait => return Ok(None),
            Gate::Behind(decision) => Applied::unchanged(decision),
        };
        Ok(Some(OneMade {
            key: Some(key),
            applied,
        }))
    }

    #[inline(always)]
    fn answer(made: &Self::Made) -> Decision {
        made.applied.outcome.decision
    }

    #[inline(always)]
    fn park(&self, host: &H, made: &Self::Made, now: Micros) -> bool {
        let waits = Waits {
            queued: true,
            released_early: L::ROW.reply == ReplyShape::Lease,
        };
        self.through() == Through::Enforce
            && wait::park(
                host,
                &[self.key_arg()],
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
        let cost = self.request.cost();
        match &self.via {
            Via::Command { .. } => {
                L::stats().record(decision, cost);
                if !decision.allowed {
                    deny_log::record(
                        now.as_ms_floor(),
                        self.key,
                        &[L::ROW.command.to_bytes()],
                        cost,
                        decision.wait.as_reply(),
                    );
                }
            }
            Via::Policy { stats, through, .. } if *through == Through::Off => {
                stats.outcomes.calls.bump();
            }
            Via::Policy {
                name,
                stats,
                through,
                ..
            } => {
                L::stats().record(decision, cost);
                stats.outcomes.record(decision, cost);
                if !decision.allowed && cost > 0 {
                    if *through == Through::Enforce {
                        deny_log::record(
                            now.as_ms_floor(),
                            self.key,
                            &[b"policy:", name],
                            cost,
                            decision.wait.as_reply(),
                        );
                    } else {
                        stats.shadow_denied.bump();
                    }
                }
            }
        }
    }

    #[inline(always)]
    fn commit(&self, host: &H, made: &mut Self::Made, now: Micros) -> Result<(), Error> {
        let applied = &made.applied;
        let Some(key) = made.key.as_mut() else {
            return Ok(());
        };
        if !applied.outcome.changed {
            return Ok(());
        }
        let end = (L::ROW.period_end)(&self.params);
        let event = match self.via {
            Via::Command { .. } => {
                host.propagate_limiter(
                    L::ROW.command,
                    1,
                    2..2 + L::Params::COUNT,
                    self.request,
                    now,
                    end,
                );
                L::EVENT
            }
            Via::Policy { .. } => {
                host.propagate_limiter_with(
                    L::ROW.command,
                    2,
                    || self.params.values(),
                    self.request,
                    now,
                    end,
                );
                c"rl.hit"
            }
        };
        key.written(event, applied.expiry_written);
        if host.turn() == Turn::Call {
            // A release, a refund or new parameters may let waiters in.
            host.signal_ready(self.key_arg());
        }
        Ok(())
    }

    #[inline(always)]
    fn reply(self, host: &H, made: Self::Made) {
        let OneMade { key, applied } = made;
        drop(key);
        let decision = applied.outcome.decision;
        // A shadowed denial is answered allowed.
        let answer =
            if !decision.allowed && self.request.cost() > 0 && self.through() == Through::Shadow {
                shadowed(decision)
            } else {
                decision
            };
        L::ROW.reply.send(host, &answer, applied.lease);
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

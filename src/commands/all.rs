//! `RL.ALL numkeys key [key ...] <spec> [<spec> ...] [COST n [FORCE] | UPTO n] [BLOCK t] [EACH]`:
//! several limiters, all or nothing.
//!
//! Every limiter first decides without changing anything; only if all of them
//! admit are the units taken from each (and each change propagated, as its
//! own pinned single-limiter call, which Redis wraps in one MULTI/EXEC for
//! the replicas and the AOF). A denial anywhere changes nothing anywhere: a
//! user denied by a global limit keeps their own tokens.
//!
//! A spec is an algorithm name and its parameters, as after the key of the
//! single-limiter command (`TOKENBUCKET 5 5 1000`), or `POLICY name`.
//!
//! `EACH` appends every limiter's own five integers to the reply, so that a
//! gateway learns each one's remaining units from the one call.

use std::sync::Arc;

use smallvec::SmallVec;

use super::apply::{apply_to_key, decide_on_key, fits_on_key};
use super::host::{Host, Origin};
use super::step::{off_decision, shadowed, Step, Through};
use super::wait;
use super::{decision_fields, reply_decision_and};
use crate::algorithms::{with_algorithm, Listed, Site, Spec};
use crate::args::{parse_int, parse_options, Options};
use crate::blocking::{self, Place};
use crate::calendar::{self, Zone};
use crate::deny_log;
use crate::error::Error;
use crate::ffi::{Argv, Context};
use crate::limiter::{Decision, Micros, Outcome, Request, Wait};
use crate::policy::{self, PolicyStats};

/// Most limiters in one call.
pub const MAX_KEYS: usize = 16;
/// Most arguments of one call.
const MAX_ARGS: usize = 96;

/// `RL.ALL` on the live server: the server may also ask where the keys
/// are.
pub fn run(ctx: &Context, argv: &Argv) -> Result<(), Error> {
    if ctx.is_keys_position_request() {
        // Cluster routing and ACLs ask where the keys are: after numkeys.
        // Such a call has no client, so the guard's error reply after a
        // panic goes nowhere.
        key_positions(ctx, argv);
        return Ok(());
    }
    step(&super::live::Live::new(ctx, argv))
}

/// Declares the keys of a call: `numkeys` at argv[1], the keys after it.
fn key_positions(ctx: &Context, argv: &Argv) {
    if argv.len() < 3 {
        return;
    }
    // Asked on every call by some servers (Valkey): nothing allocated.
    let numkeys = argv.string(1).as_bytes();
    let Ok(numkeys) = parse_int(numkeys, "numkeys", 1, MAX_KEYS as u64) else {
        return;
    };
    for position in 2..(2 + numkeys as usize).min(argv.len()) {
        ctx.key_at(position);
    }
}

/// A parsed call, before any key is opened.
pub(crate) struct Call<'a> {
    pub keys: &'a [&'a [u8]],
    /// One per key, in order.
    pub limits: Limits<'a>,
    pub options: Options,
    /// `EACH`: the reply adds every limiter's own decision.
    pub each: bool,
}

/// Room for every limiter of a call without touching the heap.
pub(crate) type Limits<'a> = SmallVec<[Limit<'a>; MAX_KEYS]>;

/// Parses the words of a call (`all[0]` is the command name): pure, but for
/// looking up named policies.
pub(crate) fn parse<'a>(all: &'a [&'a [u8]]) -> Result<Call<'a>, Error> {
    if all.len() < 4 {
        return Err(Error::Arity);
    }
    let numkeys = parse_int(all[1], "numkeys", 1, MAX_KEYS as u64)? as usize;
    if all.len() < 2 + 2 * numkeys {
        return Err(Error::Arity);
    }
    let keys = &all[2..2 + numkeys];
    for (i, key) in keys.iter().enumerate() {
        if keys[..i].contains(key) {
            return Err(Error::Syntax(format!(
                "key '{}' is given more than once",
                Error::quote(key)
            )));
        }
    }
    // Specs, then options.
    let mut limits = Limits::new();
    let mut cursor = 2 + numkeys;
    for (i, &key) in keys.iter().enumerate() {
        if cursor >= all.len() {
            return Err(Error::Syntax(format!(
                "{numkeys} keys need {numkeys} specs, got {i}"
            )));
        }
        if all[cursor].eq_ignore_ascii_case(b"POLICY") {
            let name = all.get(cursor + 1).copied().unwrap_or_default();
            let (rule, stats) =
                policy::get(name).ok_or_else(|| Error::UnknownPolicy(Error::quote(name)))?;
            if !rule.spec.in_all() {
                return Err(Error::Syntax(format!(
                    "spec {}: policy '{}' is {}, which cannot be used here",
                    i + 1,
                    Error::quote(name),
                    rule.spec.name()
                )));
            }
            limits.push(Limit {
                spec: rule.spec,
                source: Source::Policy {
                    name,
                    name_arg: cursor + 1,
                    through: Through::of(&rule, key),
                    stats,
                    zone: rule.zone,
                    protect: rule.protect,
                },
            });
            cursor += 2;
        } else {
            let (spec, words) = Spec::parse(&all[cursor..], Site::InCall(i + 1))?;
            let start = cursor;
            cursor += words;
            // A calendar quota's spec may name its zone: `QUOTA 10 DAY TZ zone`.
            let mut zone = None;
            if spec.has_zone()
                && all
                    .get(cursor)
                    .is_some_and(|w| w.eq_ignore_ascii_case(b"TZ"))
            {
                let value = all.get(cursor + 1).ok_or(Error::MissingValue("TZ"))?;
                zone = Some(calendar::zone(value).map_err(|bad| {
                    Error::Syntax(format!("spec {}: {}", i + 1, bad.message(value)))
                })?);
                cursor += 2;
            }
            limits.push(Limit {
                spec,
                source: Source::Inline { start, zone },
            });
        }
    }
    let (options, each) = parse_all_options(&all[cursor..])?;
    // RL.ALL is never propagated as such: each limiter goes out on its own.
    options.refuse_pinned()?;
    if options.zone.is_some() {
        return Err(Error::Syntax(
            "TZ is not an option of RL.ALL: a quota's spec names its zone (QUOTA 10 DAY TZ zone)"
                .to_string(),
        ));
    }
    if let Request::Refund(_) = options.request {
        // A refund gives back what one limiter took: RL.HIT or the limiter's
        // own command says which.
        return Err(Error::Syntax(
            "REFUND is not an option of RL.ALL: refund each limiter with its own command"
                .to_string(),
        ));
    }
    Ok(Call {
        keys,
        limits,
        options,
        each,
    })
}

/// The options of every limiter call, and `EACH`, `RL.ALL`'s own (a flag,
/// anywhere among them, at most once): the other commands never see it, so
/// their unknown-option error stays theirs.
fn parse_all_options(rest: &[&[u8]]) -> Result<(Options, bool), Error> {
    if !rest.iter().any(|w| w.eq_ignore_ascii_case(b"EACH")) {
        return Ok((parse_options(rest)?, false));
    }
    let mut others: SmallVec<[&[u8]; MAX_ARGS]> = SmallVec::new();
    let mut each = false;
    let mut i = 0;
    while i < rest.len() {
        let word = rest[i];
        if word.eq_ignore_ascii_case(b"EACH") {
            if each {
                return Err(Error::DuplicateOption("EACH"));
            }
            each = true;
            i += 1;
            continue;
        }
        // An option's value is its own, even when it reads `EACH` (`COST
        // EACH` stays COST's error); every option but FORCE has one.
        let width = if word.eq_ignore_ascii_case(b"FORCE") {
            1
        } else {
            2
        };
        others.extend(rest[i..].iter().take(width).copied());
        i += width;
    }
    Ok((parse_options(&others)?, each))
}

/// `RL.ALL numkeys key [key ...] <spec> [<spec> ...] [COST n [FORCE]]`:
/// the stages of `super::step`, on every key of the call.
pub fn step<H: Host>(host: &H) -> Result<(), Error> {
    let args = host.words::<MAX_ARGS>()?;
    let call = parse(&args)?;
    let mut all = AllCall::<H> {
        call,
        replicated: host.origin() == Origin::Replicated,
        loops: SmallVec::new(),
        granting: None,
        made: AllMade {
            opened: SmallVec::new(),
            actual: SmallVec::new(),
            answered: SmallVec::new(),
            denied_by: None,
        },
    };
    super::step::run(host, &mut all)
}

/// One `RL.ALL` call, through the stages. What its limiters decide stays
/// in it (`made`), where every stage reads it: it is large, and moving it
/// between the stages would cost more than the call's own work.
struct AllCall<'a, 'h, H: Host + 'h> {
    call: Call<'a>,
    replicated: bool,
    /// Policies whose loop ended a window on this call: (the name's
    /// argument, scale, stage), propagated as `RL.LOOPSTATE`.
    loops: SmallVec<[(usize, u64, u8); 2]>,
    /// `UPTO n`'s `n`, once the decision stage made the call `COST k`:
    /// the reply then adds the units granted.
    granting: Option<u64>,
    made: AllMade<H::Key<'h>>,
}

/// What the limiters of a call decided, before any of them changed.
struct AllMade<K> {
    /// Each limiter's key (none for a policy that is off).
    opened: SmallVec<[Option<K>; MAX_KEYS]>,
    /// Each limiter's outcome, and whether its key holds nothing yet.
    actual: SmallVec<[(Outcome, bool); MAX_KEYS]>,
    /// Each limiter's decision as the caller sees it (a dry run admits).
    answered: Decisions,
    /// The first limiter that denied.
    denied_by: Option<usize>,
}

impl<K> AllMade<K> {
    /// Whether the call takes the units of the limiter with this outcome.
    fn takes(&self, (outcome, _): &(Outcome, bool)) -> bool {
        self.denied_by.is_none() && outcome.changed
    }
}

impl<'h, H: Host + 'h> Step<'h, H> for AllCall<'_, 'h, H> {
    type Made = ();

    fn now(&self, host: &H) -> Micros {
        host.now()
    }

    fn bounds(&mut self, now: Micros) -> Result<(), Error> {
        let limits = &mut self.call.limits;
        if let Request::UpTo(_) = self.call.options.request {
            if let Some(i) = limits
                .iter()
                .position(|l| !with_algorithm!(l.spec, L, _p => L::ROW.upto))
            {
                return Err(Error::Syntax(format!(
                    "UPTO is not an option of RL.ALL with a {} limiter (spec {})",
                    limits[i].spec.name(),
                    i + 1
                )));
            }
        }
        if !self.replicated {
            for limit in limits
                .iter()
                .filter(|l| matches!(l.source, Source::Inline { .. }))
            {
                with_algorithm!(limit.spec, L, p => L::ROW.check_bound(&p))?;
            }
        }
        for limit in limits.iter_mut() {
            // A policy's protection loop: windows that ended are evaluated
            // on this call's instant (their result is propagated by the
            // decision stage), and the limiter runs at the policy's scale.
            // Before the quota's period is resolved: scaling rebuilds the
            // parameters.
            if let Source::Policy {
                name_arg,
                through,
                stats,
                protect,
                ..
            } = &limit.source
            {
                let counts = protect.is_on() && *through != Through::Off;
                if counts || stats.is_scaled() {
                    let mut protection = crate::policy::lock(&stats.protection);
                    if counts && protection.advance(protect, now.as_ms_floor()) {
                        let (scale, stage) = protection.current();
                        self.loops.push((*name_arg, scale, stage));
                        stats.synced(&protection);
                    }
                    limit.spec = limit.spec.scaled(protection.current().0);
                }
            }
            // A calendar quota learns where its period ends (in its policy's
            // zone; an inline quota counts in UTC).
            let zone = match limit.source {
                Source::Policy { zone, .. } => limit.spec.has_zone().then_some(zone),
                Source::Inline { zone, .. } => zone,
            };
            limit.spec = with_algorithm!(limit.spec, L, p => {
                let mut p = p;
                (L::ROW.resolve)(&mut p, zone, None, now)?;
                L::spec(p)
            });
        }
        Ok(())
    }

    fn decide(&mut self, host: &'h H, now: Micros) -> Result<Option<()>, Error> {
        for &(name_arg, scale, stage) in &self.loops {
            host.propagate_loop(name_arg, scale, stage);
        }
        let Call {
            keys,
            limits,
            options,
            ..
        } = &mut self.call;
        let made = &mut self.made;
        // Decide everywhere first; nothing changes yet. A limiter that is
        // off is not even looked at; a shadowed one never denies the call.
        made.opened.extend(
            limits
                .iter()
                .enumerate()
                .map(|(i, l)| (!l.is_off()).then(|| host.open_key(2 + i))),
        );
        // A limiter with a queue of blocked requests takes nothing they wait
        // for: it denies (a dry run still admits).
        let queues = wait::takes(options.request) && blocking::any();
        let db = if queues { host.db() } else { 0 };
        // `UPTO n`: the most units, at most n, that every enforced limiter
        // admits now; the call is then `COST` that many (`COST 1`, denied,
        // when one limiter has none or a queue is ahead of the call), all
        // or nothing, as any other.
        let request = match options.request {
            Request::UpTo(most) => {
                let mut fits = most;
                for (i, (limit, key)) in limits.iter().zip(made.opened.iter_mut()).enumerate() {
                    if let (Some(key), false) = (key, limit.is_shadow()) {
                        if queues
                            && matches!(
                                blocking::place(db, keys[i], host.turn().waiter()),
                                Place::Behind(_)
                            )
                        {
                            fits = 0;
                            break;
                        }
                        let here = with_algorithm!(limit.spec, L, p => fits_on_key::<L>(key, &p, fits, now))?;
                        fits = fits.min(here);
                    }
                }
                self.granting = Some(most);
                Request::Cost(fits.max(1))
            }
            request => request,
        };
        options.request = request;
        let cost = request.cost();
        for (i, (limit, key)) in limits.iter().zip(made.opened.iter_mut()).enumerate() {
            let place = if queues && !limit.is_shadow() {
                blocking::place(db, keys[i], host.turn().waiter())
            } else {
                Place::Free
            };
            made.actual.push(match (key, &limit.source) {
                // A shadowed limiter under `UPTO` is asked what it would
                // grant of the call's units, as `RL.HIT ... UPTO` asks it:
                // it takes what fits and denies (in shadow) only when not
                // one unit does.
                (Some(key), _) if self.granting.is_some() && limit.is_shadow() => {
                    with_algorithm!(limit.spec, L, p => {
                        let own = fits_on_key::<L>(key, &p, cost, now)?;
                        decide_on_key::<L>(key, &p, Request::Cost(own.max(1)), now)
                    })?
                }
                (Some(key), _) => with_algorithm!(limit.spec, L, p => match place {
                    Place::Behind(ahead) => wait::behind::<L>(key, &p, cost, now, &ahead).map(|decision| {
                        (Outcome { decision, changed: false, granted: 0 }, false)
                    }),
                    _ => decide_on_key::<L>(key, &p, request, now),
                })?,
                (None, Source::Policy { .. }) => (
                    Outcome {
                        decision: off_decision(limit.spec),
                        changed: false,
                        granted: 0,
                    },
                    false,
                ),
                (None, Source::Inline { .. }) => unreachable!("inline limiters are never off"),
            });
        }
        // A dry run answers allowed and never makes the caller wait.
        let answered = limits.iter().zip(&made.actual).map(|(l, (o, _))| {
            if l.is_shadow() {
                shadowed(o.decision)
            } else {
                o.decision
            }
        });
        made.answered.extend(answered);
        made.denied_by = made.answered.iter().position(|d| !d.allowed);
        // Out of memory is decided once, before any limiter changes: a key
        // the call would create fails the whole call, all or nothing.
        if !self.replicated
            && made.actual.iter().any(|a| made.takes(a) && a.1)
            && host.out_of_memory()
        {
            return Err(Error::OutOfMemory);
        }
        Ok(Some(()))
    }

    /// Admitted: the first limiter's fields; denied: with the longest wait
    /// of the limiters that denied, which a `BLOCK` waits for.
    fn answer(&self, _: &()) -> Decision {
        let made = &self.made;
        let wait = match made.denied_by {
            None => made.answered[0].wait,
            Some(_) => made
                .answered
                .iter()
                .filter(|d| !d.allowed)
                .map(|d| d.wait)
                .max_by_key(|&w| wait_rank(w))
                .unwrap_or(Wait::Ms(0)),
        };
        Decision {
            allowed: made.denied_by.is_none(),
            wait,
            ..made.answered[0]
        }
    }

    fn park(&self, host: &H, _: &(), now: Micros) -> bool {
        let made = &self.made;
        // With BLOCK, the call waits until every limiter admits at once.
        if made.denied_by.is_none() {
            return false;
        }
        let keys = self.call.keys;
        let args: SmallVec<[usize; MAX_KEYS]> = (2..2 + keys.len()).collect();
        let waits = wait::Waits {
            queued: false,
            released_early: false,
        };
        let options = &self.call.options;
        wait::park(
            host,
            &args,
            keys,
            waits,
            &<Self as Step<'h, H>>::answer(self, &()),
            options.request,
            options.block,
            now,
        )
    }

    fn record(&self, _: &(), now: Micros) {
        let made = &self.made;
        let cost = self.call.options.request.cost();
        for (limit, planned) in self.call.limits.iter().zip(&made.actual) {
            let decision = &planned.0.decision;
            if limit.is_off() {
                if let Source::Policy { stats, .. } = &limit.source {
                    stats.outcomes.calls.bump();
                }
                continue;
            }
            // What this limiter did: its own decision if the call went
            // through or it denied; a peek if another limiter denied the
            // call.
            let outcome = if made.takes(planned) || !decision.allowed || cost == 0 {
                cost
            } else {
                0
            };
            with_algorithm!(limit.spec, L, _p => L::stats().record(decision, outcome));
            if let Source::Policy { stats, protect, .. } = &limit.source {
                if protect.is_on() && cost > 0 {
                    crate::policy::lock(&stats.protection).count_call(decision.allowed);
                }
                stats.outcomes.record(decision, outcome);
                if !decision.allowed && limit.is_shadow() {
                    stats.shadow_denied.bump();
                }
            }
        }
        let overall = Decision {
            allowed: made.denied_by.is_none(),
            ..made.answered[0]
        };
        crate::stats::ALL.record(&overall, cost);
        // (A call whose limiters are all off looked at none: not counted,
        // as `RL.HIT` through a policy that is off.)
        if let Some(most) = self.granting {
            if self.call.limits.iter().any(|l| !l.is_off()) {
                crate::stats::UPTO.record(most, if overall.allowed { cost } else { 0 });
            }
        }
        if let Some(i) = made.denied_by {
            let limit = &self.call.limits[i];
            let source: [&[u8]; 2] = match limit.source {
                Source::Policy { name, .. } => [b"RL.ALL policy:", name],
                Source::Inline { .. } => [b"RL.ALL ", limit.spec.name().as_bytes()],
            };
            deny_log::record(
                now.as_ms_floor(),
                self.call.keys[i],
                &source,
                cost,
                made.answered[i].wait.as_reply(),
            );
        }
    }

    /// All admitted: each limiter whose state the request changes takes its
    /// units (a shadowed one that would deny takes nothing), and each
    /// change goes out as its own pinned call.
    fn commit(&mut self, host: &H, _: &mut (), now: Micros) -> Result<(), Error> {
        let made = &mut self.made;
        for (i, limit) in self.call.limits.iter().enumerate() {
            let planned = made.actual[i];
            if !made.takes(&planned) {
                continue;
            }
            // Under `UPTO`, each limiter takes what it admitted (a shadowed
            // one may take fewer units than the call's).
            let request = match self.granting {
                Some(_) => Request::Cost(planned.0.granted),
                None => self.call.options.request,
            };
            let key = made.opened[i]
                .as_mut()
                .expect("an admitting limiter is open");
            let applied = with_algorithm!(limit.spec, L, p => apply_to_key::<L, H>(host, key, &p, request, now, false))?;
            debug_assert_eq!(applied.outcome, planned.0);
            propagate(host, limit, 2 + i, request, now);
            super::host::Store::written(key, c"rl.all", applied.expiry_written);
        }
        Ok(())
    }

    fn reply(&mut self, host: &H, _: ()) {
        let made = &mut self.made;
        made.opened.clear();
        let answered = &made.answered;
        // A limiter that is off answers nothing about the call: it never
        // shapes the reply, unless every limiter is off.
        let live: Decisions = self
            .call
            .limits
            .iter()
            .zip(answered)
            .filter(|(l, _)| !l.is_off())
            .map(|(_, d)| *d)
            .collect();
        let granted = self.granting.map(|most| match made.denied_by {
            Some(_) => 0,
            // Every limiter off: all that was asked, nothing taken.
            None if live.is_empty() => most,
            None => self.call.options.request.cost(),
        });
        // `EACH`: every limiter's own answer, an off one's included.
        let each = self.call.each.then_some(&answered[..]);
        reply(
            host,
            if live.is_empty() { answered } else { &live },
            made.denied_by,
            granted,
            each,
        );
    }
}

/// A wait's rank: never is the longest.
fn wait_rank(w: Wait) -> u64 {
    match w {
        Wait::Never => u64::MAX,
        Wait::Ms(ms) => ms,
    }
}

type Decisions = SmallVec<[Decision; MAX_KEYS]>;

/// One limiter of the call.
#[derive(Clone)]
pub(crate) struct Limit<'a> {
    pub spec: Spec,
    pub source: Source<'a>,
}

#[derive(Clone)]
pub(crate) enum Source<'a> {
    /// Given in the call; its parameters start after argv[start]; a
    /// calendar quota's zone, if the spec names one.
    Inline { start: usize, zone: Option<Zone> },
    /// `POLICY name`.
    Policy {
        name: &'a [u8],
        /// The argument the name is (what `RL.LOOPSTATE` propagates).
        name_arg: usize,
        through: Through,
        /// Held for the call: the policy may go, its counters stay sound.
        stats: Arc<PolicyStats>,
        /// A calendar quota's zone.
        zone: Zone,
        /// The policy's protection loop.
        protect: crate::limiter::protection::Loop,
    },
}

impl Limit<'_> {
    fn is_off(&self) -> bool {
        matches!(
            self.source,
            Source::Policy {
                through: Through::Off,
                ..
            }
        )
    }
    fn is_shadow(&self) -> bool {
        matches!(
            self.source,
            Source::Policy {
                through: Through::Shadow,
                ..
            }
        )
    }
}

/// Propagates one limiter's change as its own pinned call.
fn propagate<H: Host>(host: &H, limit: &Limit, key: usize, request: Request, now: Micros) {
    let (command, end) =
        with_algorithm!(limit.spec, L, p => (L::ROW.command, (L::ROW.period_end)(&p)));
    match limit.source {
        Source::Inline { start, .. } => {
            let params = start + 1..start + 1 + limit.spec.param_count();
            host.propagate_limiter(command, key, params, request, now, end);
        }
        Source::Policy { .. } => {
            host.propagate_limiter_with(command, key, || limit.spec.params(), request, now, end);
        }
    }
}

/// The five integers of the most restrictive limiter, then `denied_by`
/// (and `UPTO`'s `granted`), then with `EACH` five for each limiter.
///
/// Admitted: the limiter with the fewest units left, with `wait_ms` the
/// longest queueing delay of any shaping limiter in the call. Denied: the
/// limiter that makes the caller wait longest (never, if any can never
/// admit).
fn reply<H: Host>(
    host: &H,
    decisions: &[Decision],
    denied_by: Option<usize>,
    granted: Option<u64>,
    each: Option<&[Decision]>,
) {
    let mut chosen = match denied_by {
        None => *decisions
            .iter()
            .min_by_key(|d| d.remaining)
            .expect("at least one limiter"),
        Some(_) => *decisions
            .iter()
            .filter(|d| !d.allowed)
            .max_by_key(|d| wait_rank(d.wait))
            .expect("a limiter denied"),
    };
    if denied_by.is_none() {
        chosen.wait = decisions
            .iter()
            .map(|d| d.wait)
            .max_by_key(|&w| wait_rank(w))
            .unwrap_or(Wait::Ms(0));
    }
    let denied_by = denied_by.map_or(0, |i| i as i64 + 1);
    let Some(each) = each else {
        match granted {
            None => reply_decision_and(host, &chosen, denied_by),
            Some(granted) => {
                super::reply_decision_and_two(host, &chosen, denied_by, granted as i64)
            }
        }
        return;
    };
    // On the stack: at most 7 + 5 * MAX_KEYS integers.
    let mut ints = [0i64; 7 + 5 * MAX_KEYS];
    ints[..5].copy_from_slice(&decision_fields(&chosen));
    ints[5] = denied_by;
    let mut len = 6;
    if let Some(granted) = granted {
        ints[6] = granted as i64;
        len = 7;
    }
    for decision in each {
        ints[len..len + 5].copy_from_slice(&decision_fields(decision));
        len += 5;
    }
    host.reply_integers(&ints[..len]);
}

//! Policies: named limiter rules kept in the server, so operators change
//! them while the system runs, with the staged roll-out a limiter needs.
//!
//! A policy is a spec (`TOKENBUCKET 5 5 1000`) with a mode and a roll-out:
//!
//! - `ENFORCE` (default) denies what the limiter denies;
//! - `SHADOW` evaluates and counts, takes only what the limiter admits, and
//!   always answers allowed: the dry run before a rule goes live;
//! - `OFF` answers allowed at once and touches no state: the kill switch.
//! - `ROLLOUT p` (0 to 100, default 100): only keys whose stable hash falls in
//!   the first `p` percent are enforced, the others run in shadow. The hash
//!   of a key never changes, so raising `p` keeps enforced keys enforced.
//!
//! Policies are node state, like Redis Functions: `RL.POLICY SET` and `DEL`
//! are deterministic and propagate as they are, and the set of policies is
//! saved in the RDB (module aux data, so also in the AOF's RDB preamble) and
//! replaced by the one in the RDB when a server loads a dataset. Limiter
//! calls made through a policy propagate as the plain limiter call, with the
//! master's time pinned: replicas never need the policy to replay them.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard};

use crate::algorithms::{Site, Spec};
use crate::calendar::{self, Zone};
use crate::error::Error;
use crate::limiter::protection::{Adapt, Loop, LoopState, Stages, DEFAULT_WINDOW_MS};
use crate::stats::{Counter, Outcomes};

/// How a policy acts on what its limiter decides.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    Enforce,
    Shadow,
    Off,
}

impl Mode {
    pub fn name(self) -> &'static str {
        match self {
            Mode::Enforce => "ENFORCE",
            Mode::Shadow => "SHADOW",
            Mode::Off => "OFF",
        }
    }
    fn code(self) -> u64 {
        self as u64
    }
    fn from_code(code: u64) -> Option<Mode> {
        [Mode::Enforce, Mode::Shadow, Mode::Off]
            .get(code as usize)
            .copied()
    }
}

/// One rule.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Rule {
    pub spec: Spec,
    pub mode: Mode,
    /// Percent of keys enforced (the rest in shadow), 0 to 100.
    pub rollout: u8,
    /// The time zone of a calendar quota (`TZ zone`; UTC by default).
    pub zone: Zone,
    /// The protection loop: `ADAPT`, `STAGES`, `WINDOW` (off by default).
    pub protect: Loop,
    /// `ADAPT OFF`: the loop stops adapting and keeps the scale it has
    /// (without it, a rule set anew starts at full scale).
    pub keep_scale: bool,
    /// The scale and the stage a saved policy had (the RDB's, the AOF
    /// preamble's): restored when it is set again; `None` from a command.
    pub resume: Option<(u64, u8)>,
}

impl Rule {
    /// Whether calls on `key` are enforced (as opposed to shadowed or off).
    pub fn enforces(&self, key: &[u8]) -> bool {
        self.mode == Mode::Enforce && rollout_bucket(key) < u64::from(self.rollout)
    }
}

/// The percentile (0 to 99) of a key in roll-outs: FNV-1a, stable across
/// nodes, restarts and versions.
pub fn rollout_bucket(key: &[u8]) -> u64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for &byte in key {
        hash ^= u64::from(byte);
        hash = hash.wrapping_mul(0x0100_0000_01b3);
    }
    hash % 100
}

/// A policy's counters for `INFO ratelimit`: they live with the policy, kept
/// when its rule changes, freed with it by `DEL` (a policy set again starts
/// from zero). A call holds its own handle, so counting stays sound even if
/// the policy goes meanwhile.
#[derive(Default)]
pub struct PolicyStats {
    pub outcomes: Outcomes,
    /// Denials a shadowed call answered as allowed.
    pub shadow_denied: Counter,
    /// The protection loop as it runs (see [`Protection`]).
    pub protection: Mutex<Protection>,
    /// Whether the scale is below 100, readable without the lock: a call
    /// through a policy without a loop and at full scale takes no lock.
    pub scaled: std::sync::atomic::AtomicBool,
}

impl PolicyStats {
    /// Records what `protection` now says of the scale (after a change).
    pub fn synced(&self, protection: &Protection) {
        self.scaled.store(
            protection.current().0 < 100,
            std::sync::atomic::Ordering::Relaxed,
        );
    }

    /// Whether the scale is below 100.
    pub fn is_scaled(&self) -> bool {
        self.scaled.load(std::sync::atomic::Ordering::Relaxed)
    }
}

/// A policy's protection loop as it runs on this node: its scale and stage,
/// and, once a call has met it, its windows. The scale and the stage are
/// node state (replicated as `RL.LOOPSTATE`, saved in the RDB); the
/// windows' counts are the master's own, and a node that starts counting
/// (after a restart, a failover, a new rule) starts a fresh window.
#[derive(Debug)]
pub struct Protection {
    scale: u64,
    stage: u8,
    windows: Option<LoopState>,
}

impl Default for Protection {
    fn default() -> Self {
        Protection {
            scale: 100,
            stage: 0,
            windows: None,
        }
    }
}

impl Protection {
    /// The scale (percent) and the stage.
    pub fn current(&self) -> (u64, u8) {
        match &self.windows {
            Some(w) => (w.scale, w.stage),
            None => (self.scale, self.stage),
        }
    }

    /// Ends the windows that ended by `now_ms`: whether the scale or the
    /// stage changed (then the caller propagates them).
    pub fn advance(&mut self, config: &Loop, now_ms: u64) -> bool {
        match &mut self.windows {
            Some(w) => {
                let changed = w.advance(config, now_ms);
                (self.scale, self.stage) = (w.scale, w.stage);
                changed
            }
            None => {
                self.windows = Some(LoopState::with(self.scale, self.stage, config, now_ms));
                false
            }
        }
    }

    /// Counts a call the policy decided, in the current window.
    pub fn count_call(&mut self, allowed: bool) {
        if let Some(w) = &mut self.windows {
            w.current.calls += 1;
            if allowed {
                w.current.admitted += 1;
            } else {
                w.current.denied += 1;
            }
        }
    }

    /// Adds outcomes reported for the requests the policy admitted, and the
    /// calls a kit denied without asking the server (its deny cache, its
    /// local level): they count as calls and denials, so a deny cache does
    /// not hide a flood from the stages.
    pub fn count_outcomes(&mut self, ok: u64, errors: u64, denied: u64) {
        if let Some(w) = &mut self.windows {
            w.current.ok = w.current.ok.saturating_add(ok);
            w.current.errors = w.current.errors.saturating_add(errors);
            w.current.calls = w.current.calls.saturating_add(denied);
            w.current.denied = w.current.denied.saturating_add(denied);
        }
    }

    /// The loop as of `now_ms`, without changing it: windows that ended
    /// are shown ended, as the next call will find them. A node that never
    /// counted (a replica: it follows the master's `RL.LOOPSTATE`) shows
    /// the scale and stage it holds.
    pub fn view(&self, config: &Loop, now_ms: u64) -> LoopState {
        let mut view = self
            .windows
            .unwrap_or_else(|| LoopState::with(self.scale, self.stage, config, now_ms));
        if config.is_on() {
            view.advance(config, now_ms);
        }
        view
    }

    /// Sets the scale and the stage as the master (or the operator) says;
    /// the windows start afresh.
    pub fn set(&mut self, scale: u64, stage: u8) {
        self.scale = scale.clamp(1, 100);
        self.stage = stage.min(2);
        self.windows = None;
    }
}

struct Entry {
    rule: Rule,
    stats: Arc<PolicyStats>,
}

/// Every policy of this node, by name, with everything it holds: memory is
/// bounded by the live policies.
static POLICIES: Mutex<BTreeMap<Vec<u8>, Entry>> = Mutex::new(BTreeMap::new());

/// A lock that a panic elsewhere does not poison for good.
pub fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

fn policies() -> MutexGuard<'static, BTreeMap<Vec<u8>, Entry>> {
    POLICIES.lock().unwrap_or_else(|p| p.into_inner())
}

/// Longest policy name, in bytes.
pub const MAX_NAME: usize = 256;

/// Checks a policy name: 1 to 256 bytes of printable ASCII without spaces
/// (`!` to `~`), so that rules can be named after the routes they protect
/// (`POST:/api/order/create`), and a name is one word in `redis-cli`, logs
/// and replies. INFO escapes what its format cannot hold ([`info_escaped`]).
pub fn check_name(name: &[u8]) -> Result<(), Error> {
    let ok = (1..=MAX_NAME).contains(&name.len()) && name.iter().all(|b| (b'!'..=b'~').contains(b));
    if ok {
        Ok(())
    } else {
        Err(Error::Syntax(format!(
            "policy name must be 1 to {MAX_NAME} bytes of printable ASCII without spaces, got '{}'",
            Error::quote(name)
        )))
    }
}

/// Parses `<ALGORITHM> <params...> [MODE m] [ROLLOUT p] [TZ zone]` (`TZ`
/// for a calendar quota only).
pub fn parse_rule(args: &[&[u8]]) -> Result<Rule, Error> {
    let (spec, words) = Spec::parse(args, Site::Policy)?;
    let mut mode = None;
    let mut rollout = None;
    let mut zone = None;
    let mut adapt: Option<Option<Adapt>> = None;
    let mut stages = None;
    let mut window = None;
    let mut rest = &args[words..];
    while let [option, tail @ ..] = rest {
        let value = tail.first().copied();
        if option.eq_ignore_ascii_case(b"MODE") {
            let value = value.ok_or(Error::MissingValue("MODE"))?;
            if mode.is_some() {
                return Err(Error::DuplicateOption("MODE"));
            }
            mode = Some(
                [Mode::Enforce, Mode::Shadow, Mode::Off]
                    .into_iter()
                    .find(|m| value.eq_ignore_ascii_case(m.name().as_bytes()))
                    .ok_or_else(|| {
                        Error::Syntax(format!(
                            "MODE must be ENFORCE, SHADOW or OFF, got '{}'",
                            Error::quote(value)
                        ))
                    })?,
            );
        } else if option.eq_ignore_ascii_case(b"ROLLOUT") {
            let value = value.ok_or(Error::MissingValue("ROLLOUT"))?;
            if rollout.is_some() {
                return Err(Error::DuplicateOption("ROLLOUT"));
            }
            rollout = Some(crate::args::parse_int(value, "ROLLOUT", 0, 100)? as u8);
        } else if option.eq_ignore_ascii_case(b"ADAPT") {
            if adapt.is_some() {
                return Err(Error::DuplicateOption("ADAPT"));
            }
            let (parsed, used, own_window) = parse_adapt(tail)?;
            adapt = Some(parsed);
            if let Some(ms) = own_window {
                if window.replace(ms).is_some() {
                    return Err(Error::DuplicateOption("WINDOW"));
                }
            }
            rest = &tail[used..];
            continue;
        } else if option.eq_ignore_ascii_case(b"STAGES") {
            if stages.is_some() {
                return Err(Error::DuplicateOption("STAGES"));
            }
            let degrade = tail.first().ok_or(Error::MissingValue("STAGES"))?;
            let brk = tail.get(1).ok_or(Error::MissingValue("STAGES"))?;
            let degrade = crate::args::parse_int(degrade, "degrade_pct", 0, 100)?;
            // The core's range (degrade_pct to 100), so that 101 and a value
            // below degrade_pct get the same message.
            let brk = crate::args::parse_int(brk, "break_pct", degrade, 100)?;
            stages = Some(Stages::new(degrade, brk)?);
            rest = &tail[2..];
            continue;
        } else if option.eq_ignore_ascii_case(b"WINDOW") {
            let value = value.ok_or(Error::MissingValue("WINDOW"))?;
            if window.is_some() {
                return Err(Error::DuplicateOption("WINDOW"));
            }
            window = Some(crate::args::parse_int(
                value,
                "WINDOW",
                1,
                crate::limiter::protection::MAX_WINDOW_MS,
            )?);
        } else if option.eq_ignore_ascii_case(b"TZ") && spec.has_zone() {
            let value = value.ok_or(Error::MissingValue("TZ"))?;
            if zone.is_some() {
                return Err(Error::DuplicateOption("TZ"));
            }
            zone = Some(calendar::zone(value).map_err(|bad| Error::Syntax(bad.message(value)))?);
        } else {
            return Err(Error::Syntax(format!(
                "unknown option '{}' (expected MODE, ROLLOUT, ADAPT, STAGES or WINDOW{})",
                Error::quote(option),
                if spec.has_zone() { " or TZ" } else { "" }
            )));
        }
        rest = &tail[1..];
    }
    let protect = Loop::new(adapt.flatten(), stages, window.unwrap_or(DEFAULT_WINDOW_MS))?;
    Ok(Rule {
        spec,
        mode: mode.unwrap_or(Mode::Enforce),
        rollout: rollout.unwrap_or(100),
        zone: zone.unwrap_or(calendar::UTC),
        protect,
        keep_scale: matches!(adapt, Some(None)),
        resume: None,
    })
}

/// Parses what follows `ADAPT`: `OFF`, or `ERRORS pct [FACTOR f] [MIN m]
/// [RECOVER r] [WINDOW ms] [MINCALLS n]` in any order after `ERRORS pct`;
/// the rule (`None` for `OFF`), the words taken and the window if given.
fn parse_adapt(words: &[&[u8]]) -> Result<(Option<Adapt>, usize, Option<u64>), Error> {
    let first = words.first().ok_or(Error::MissingValue("ADAPT"))?;
    if first.eq_ignore_ascii_case(b"OFF") {
        return Ok((None, 1, None));
    }
    if !first.eq_ignore_ascii_case(b"ERRORS") {
        return Err(Error::Syntax(format!(
            "ADAPT must be followed by ERRORS <pct> or OFF, got '{}'",
            Error::quote(first)
        )));
    }
    let pct = words.get(1).ok_or(Error::MissingValue("ERRORS"))?;
    let errors = crate::args::parse_int(pct, "ERRORS", 0, 100)?;
    let mut factor = None;
    let mut min = None;
    let mut recover = None;
    let mut min_calls = None;
    let mut window = None;
    let mut used = 2;
    while let Some(word) = words.get(used) {
        // The ranges are the core's (`Adapt::new`), so that the error names
        // the same bounds whichever check refuses the value.
        let (slot, name, least, max) = if word.eq_ignore_ascii_case(b"FACTOR") {
            (&mut factor, "FACTOR", 1, 100)
        } else if word.eq_ignore_ascii_case(b"MIN") {
            (&mut min, "MIN", 1, 100)
        } else if word.eq_ignore_ascii_case(b"RECOVER") {
            (&mut recover, "RECOVER", 0, 100)
        } else if word.eq_ignore_ascii_case(b"MINCALLS") {
            (&mut min_calls, "MINCALLS", 0, crate::limiter::MAX_PARAM)
        } else if word.eq_ignore_ascii_case(b"WINDOW") {
            (
                &mut window,
                "WINDOW",
                1,
                crate::limiter::protection::MAX_WINDOW_MS,
            )
        } else {
            break;
        };
        let value = words.get(used + 1).ok_or(Error::MissingValue(name))?;
        if slot.is_some() {
            return Err(Error::DuplicateOption(name));
        }
        *slot = Some(crate::args::parse_int(value, name, least, max)?);
        used += 2;
    }
    let adapt = Adapt::new(
        errors,
        factor.unwrap_or(Adapt::DEFAULT_FACTOR),
        min.unwrap_or(Adapt::DEFAULT_MIN),
        recover.unwrap_or(Adapt::DEFAULT_RECOVER),
        min_calls.unwrap_or(Adapt::DEFAULT_MIN_CALLS),
    )?;
    Ok((Some(adapt), used, window))
}

/// Most policies a node holds.
pub const MAX_POLICIES: usize = 10_000;

/// Appends `name` as INFO shows it (`ratelimit_policy_<escaped>:...`): every
/// byte other than `A-Z a-z 0-9 _` written `%XX`, upper-case hex. INFO
/// parsers split a line at its first `:`, a value at `,` and `=`, and some
/// servers rewrite `#` or `:` in field names: none of these survive, and the
/// escaping is injective, so two policies never share a line and an
/// exporter gets the name back by percent-decoding.
pub fn info_escaped(name: &[u8], out: &mut String) {
    const HEX: &[u8; 16] = b"0123456789ABCDEF";
    for &b in name {
        if b.is_ascii_alphanumeric() || b == b'_' {
            out.push(char::from(b));
        } else {
            out.push('%');
            out.push(char::from(HEX[usize::from(b >> 4)]));
            out.push(char::from(HEX[usize::from(b & 0xf)]));
        }
    }
}

/// Checks that `name` may be set: an existing policy, or room for one more.
pub fn check_room_for(name: &[u8]) -> Result<(), Error> {
    let all = policies();
    if all.contains_key(name) || all.len() < MAX_POLICIES {
        return Ok(());
    }
    Err(Error::Syntax(format!(
        "a node holds at most {MAX_POLICIES} policies"
    )))
}

/// Creates a policy, or changes its rule (keeping its counters). A rule set
/// anew starts its loop at full scale and stage 0, unless it says `ADAPT
/// OFF`, which keeps the scale and the stage it had.
pub fn set(name: &[u8], rule: Rule) {
    let mut all = policies();
    match all.get_mut(name) {
        Some(entry) => {
            let mut protection = lock(&entry.stats.protection);
            let (scale, stage) = protection.current();
            match rule.resume {
                Some((scale, stage)) => protection.set(scale, stage),
                None if rule.keep_scale => protection.set(scale, stage),
                None => protection.set(100, 0),
            }
            entry.stats.synced(&protection);
            drop(protection);
            entry.rule = rule;
        }
        None => {
            let stats = Arc::<PolicyStats>::default();
            if let Some((scale, stage)) = rule.resume {
                let mut protection = lock(&stats.protection);
                protection.set(scale, stage);
                stats.synced(&protection);
            }
            all.insert(name.to_vec(), Entry { rule, stats });
        }
    }
}

/// The rule of a policy and a handle on its counters, for one call.
pub fn get(name: &[u8]) -> Option<(Rule, Arc<PolicyStats>)> {
    policies().get(name).map(|e| (e.rule, Arc::clone(&e.stats)))
}

/// Deletes a policy and frees what it held; whether it existed.
pub fn delete(name: &[u8]) -> bool {
    policies().remove(name).is_some()
}

/// Every policy, by name.
pub fn list() -> Vec<(Vec<u8>, Rule, Arc<PolicyStats>)> {
    policies()
        .iter()
        .map(|(name, e)| (name.clone(), e.rule, Arc::clone(&e.stats)))
        .collect()
}

/// Starts every policy's windows afresh, keeping its scale and stage: the
/// node became a master or a replica. A replica never advances its windows
/// (the master's results reach it as `RL.LOOPSTATE`), so a master demoted
/// and later promoted again would otherwise evaluate, at its first call,
/// counts of a window that ended before the failover.
pub fn restart_windows() {
    for entry in policies().values() {
        let mut protection = lock(&entry.stats.protection);
        let (scale, stage) = protection.current();
        protection.set(scale, stage);
    }
}

/// Forgets every policy: a dataset is about to be loaded, with its own.
pub fn clear() {
    policies().clear();
}

/// The set of policies as unsigned fields and byte strings, for the RDB.
pub fn encode(out: &mut impl FnMut(Field)) {
    let rules: Vec<(Vec<u8>, Rule)> = list()
        .into_iter()
        .map(|(n, mut r, stats)| {
            // The scale and stage as they are now: never the ones the rule
            // was loaded with (`resume` of a loaded rule), which an
            // operator's RL.POLICY SCALE may have undone since.
            let current = lock(&stats.protection).current();
            r.resume = (r.protect.is_on() || current != (100, 0)).then_some(current);
            (n, r)
        })
        .collect();
    encode_rules(&rules, out);
}

/// The version of the policies' RDB aux data, written inside the payload.
///
/// Redis hands `aux_load` the encoding version of the type the aux data is
/// registered on (the token bucket's), which moves with that type's state,
/// not with this payload; so the payload carries its own version, in its
/// first unsigned field, marked by the top bit: `AUX_VERSIONED | version`.
/// Version 1 was written before that, without the field: its first field is
/// the policy count, at most [`MAX_POLICIES`], so never has the top bit set.
/// - version 1: count, then per policy name, algorithm, parameter count,
///   parameters, mode code, roll-out (read, no longer written);
/// - version 2: the marked version field, then the fields of version 1;
/// - version 3: as version 2, with each policy's zone name after its
///   roll-out. Written only when a policy has a zone other than UTC, so
///   that a build that reads version 2 only still loads everything else.
/// - version 4: as version 3, with each policy's protection loop after its
///   zone: ADAPT (a flag, then its five arguments), STAGES (a flag, then
///   two), the window, `ADAPT OFF`'s flag, and the scale and stage it had
///   (a flag, then both). Written only when a policy has a loop or a scale
///   or stage other than 100 and 0.
pub const AUX_VERSION: u64 = 4;
/// The top bit: the first field is a version, not a version-1 count.
const AUX_VERSIONED: u64 = 1 << 63;

/// The RDB form of `all` (also used by the fuzz targets).
pub(crate) fn encode_rules(all: &[(Vec<u8>, Rule)], out: &mut impl FnMut(Field)) {
    let looped = all
        .iter()
        .any(|(_, r)| r.protect.is_on() || r.resume.is_some() || r.keep_scale);
    let zoned = looped || all.iter().any(|(_, rule)| rule.zone != calendar::UTC);
    let version = if looped {
        AUX_VERSION
    } else if zoned {
        3
    } else {
        2
    };
    out(Field::Unsigned(AUX_VERSIONED | version));
    out(Field::Unsigned(all.len() as u64));
    for (name, rule) in all {
        out(Field::Bytes(name));
        out(Field::Bytes(rule.spec.name().as_bytes()));
        let params = rule.spec.params();
        out(Field::Unsigned(params.as_slice().len() as u64));
        for &p in params.as_slice() {
            out(Field::Unsigned(p));
        }
        out(Field::Unsigned(rule.mode.code()));
        out(Field::Unsigned(u64::from(rule.rollout)));
        if zoned {
            out(Field::Bytes(&calendar::name(rule.zone)));
        }
        if looped {
            let p = &rule.protect;
            out(Field::Unsigned(u64::from(p.adapt().is_some())));
            for v in p.adapt().iter().flat_map(|a| a.values()) {
                out(Field::Unsigned(v));
            }
            out(Field::Unsigned(u64::from(p.stages().is_some())));
            for v in p.stages().iter().flat_map(|s| s.values()) {
                out(Field::Unsigned(v));
            }
            out(Field::Unsigned(p.window_ms()));
            out(Field::Unsigned(u64::from(rule.keep_scale)));
            let (has, scale, stage) = match rule.resume {
                Some((scale, stage)) => (1, scale, u64::from(stage)),
                None => (0, 100, 0),
            };
            out(Field::Unsigned(has));
            out(Field::Unsigned(scale));
            out(Field::Unsigned(stage));
        }
    }
}

/// What version 4 keeps of a policy's loop: the loop, `ADAPT OFF`'s flag,
/// and the scale and stage it had.
type SavedLoop = (Loop, bool, Option<(u64, u8)>);

/// A policy's protection loop as version 4 writes it (see
/// [`AUX_VERSION`]); `None` if anything is off.
fn decode_loop(unsigned: &mut impl FnMut() -> Option<u64>) -> Option<SavedLoop> {
    let flag = |v: u64| match v {
        0 => Some(false),
        1 => Some(true),
        _ => None,
    };
    let adapt = if flag(unsigned()?)? {
        let [e, f, m, r, n] = [
            unsigned()?,
            unsigned()?,
            unsigned()?,
            unsigned()?,
            unsigned()?,
        ];
        Some(Adapt::new(e, f, m, r, n).ok()?)
    } else {
        None
    };
    let stages = if flag(unsigned()?)? {
        let [d, b] = [unsigned()?, unsigned()?];
        Some(Stages::new(d, b).ok()?)
    } else {
        None
    };
    let protect = Loop::new(adapt, stages, unsigned()?).ok()?;
    let keep_scale = flag(unsigned()?)?;
    let has = flag(unsigned()?)?;
    let (scale, stage) = (unsigned()?, unsigned()?);
    if !(1..=100).contains(&scale) || stage > 2 {
        return None;
    }
    Some((protect, keep_scale, has.then_some((scale, stage as u8))))
}

/// One field of the RDB form.
pub enum Field<'a> {
    Unsigned(u64),
    Bytes(&'a [u8]),
}

/// Reads the RDB form back, of any version written (see [`AUX_VERSION`]);
/// `None` if anything is off.
pub fn decode(
    unsigned: &mut impl FnMut() -> Option<u64>,
    bytes: &mut impl FnMut() -> Option<Vec<u8>>,
) -> Option<Vec<(Vec<u8>, Rule)>> {
    let first = unsigned()?;
    let (count, zoned, looped) = if first & AUX_VERSIONED == 0 {
        (first, false, false) // version 1: no version field, the count comes first
    } else {
        match first & !AUX_VERSIONED {
            2 => (unsigned()?, false, false),
            3 => (unsigned()?, true, false),
            4 => (unsigned()?, true, true),
            _ => return None,
        }
    };
    // No more than RL.POLICY SET lets a node hold.
    if count > MAX_POLICIES as u64 {
        return None;
    }
    let mut out: Vec<(Vec<u8>, Rule)> = Vec::new();
    let mut names = std::collections::BTreeSet::new();
    for _ in 0..count {
        let name = bytes()?;
        check_name(&name).ok()?;
        // A name twice: never written by a server, so corrupt.
        if !names.insert(name.clone()) {
            return None;
        }
        let algorithm = bytes()?;
        let n = unsigned()?;
        if n > 8 {
            return None;
        }
        let params: Vec<String> = (0..n)
            .map(|_| unsigned().map(|v| v.to_string()))
            .collect::<Option<_>>()?;
        let mut words: Vec<&[u8]> = vec![&algorithm];
        words.extend(params.iter().map(|p| p.as_bytes()));
        let (spec, used) = Spec::parse(&words, Site::Policy).ok()?;
        if used != words.len() {
            return None;
        }
        let mode = Mode::from_code(unsigned()?)?;
        let rollout = unsigned()?;
        if rollout > 100 {
            return None;
        }
        let zone = if zoned {
            calendar::stored_zone(&bytes()?)?
        } else {
            calendar::UTC
        };
        let (protect, keep_scale, resume) = if looped {
            decode_loop(unsigned)?
        } else {
            (Loop::default(), false, None)
        };
        out.push((
            name,
            Rule {
                spec,
                mode,
                rollout: rollout as u8,
                zone,
                protect,
                keep_scale,
                resume,
            },
        ));
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rules_parse_with_defaults_and_named_errors() {
        let r = parse_rule(&[b"TOKENBUCKET", b"5", b"5", b"1000"]).unwrap();
        assert_eq!((r.mode, r.rollout), (Mode::Enforce, 100));
        let r = parse_rule(&[
            b"fixedwindow",
            b"10",
            b"1000",
            b"mode",
            b"shadow",
            b"ROLLOUT",
            b"30",
        ])
        .unwrap();
        assert_eq!((r.mode, r.rollout), (Mode::Shadow, 30));
        assert!(parse_rule(&[b"TOKENBUCKET", b"5", b"5"]).is_err());
        assert_eq!(
            parse_rule(&[b"FIXEDWINDOW", b"1", b"1", b"ROLLOUT", b"101"]).unwrap_err(),
            Error::Range {
                arg: "ROLLOUT",
                min: 0,
                max: 100
            }
        );
        assert!(parse_rule(&[b"FIXEDWINDOW", b"1", b"1", b"MODE", b"LOUD"]).is_err());
        assert_eq!(
            parse_rule(&[b"FIXEDWINDOW", b"1", b"1", b"MODE"]).unwrap_err(),
            Error::MissingValue("MODE")
        );
    }

    #[test]
    fn names_are_1_to_256_bytes_of_printable_ascii_without_spaces() {
        let longest = [b'~'; MAX_NAME];
        for good in [
            &b"orders:create-v2.1_a"[..],
            b"POST:/api/order/create",
            b"GET:/v2/{org}/items",
            b"tenant=acme;tier=free",
            b"!\"#$%&'()*+,-./:;<=>?@[\\]^`{|}~",
            &longest,
        ] {
            assert_eq!(check_name(good), Ok(()), "{good:?}");
        }
        for bad in [
            &b""[..],
            b"a b",
            b"a\tb",
            b"a\nb",
            b"a\x00b",
            b"a\x7fb",
            "naïve".as_bytes(),
            &[b'x'; MAX_NAME + 1],
        ] {
            let err = check_name(bad).unwrap_err().message();
            assert!(
                err.starts_with(
                    "ERR policy name must be 1 to 256 bytes of printable ASCII without spaces, got '"
                ),
                "{bad:?}: {err}"
            );
        }
    }

    #[test]
    fn info_escapes_every_byte_but_letters_digits_and_underscore() {
        let escaped = |name: &[u8]| {
            let mut out = String::new();
            info_escaped(name, &mut out);
            out
        };
        assert_eq!(
            escaped(b"POST:/api/order/create"),
            "POST%3A%2Fapi%2Forder%2Fcreate"
        );
        assert_eq!(
            escaped(b"GET:/v2/{org}/items"),
            "GET%3A%2Fv2%2F%7Borg%7D%2Fitems"
        );
        assert_eq!(
            escaped(b"tenant=acme;tier=free"),
            "tenant%3Dacme%3Btier%3Dfree"
        );
        assert_eq!(escaped(b"a_Z9"), "a_Z9");
        assert_eq!(escaped(b"%~!"), "%25%7E%21");
        // Injective: a:b and a_b, which shared INFO fields before, differ.
        assert_ne!(escaped(b"a:b"), escaped(b"a_b"));
        // Every printable byte round-trips through percent-decoding.
        let all: Vec<u8> = (b'!'..=b'~').collect();
        let text = escaped(&all);
        assert!(text
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'%'));
        let mut decoded = Vec::new();
        let mut rest = text.as_bytes();
        while let [first, tail @ ..] = rest {
            if *first == b'%' {
                let hex = std::str::from_utf8(&tail[..2]).unwrap();
                decoded.push(u8::from_str_radix(hex, 16).unwrap());
                rest = &tail[2..];
            } else {
                decoded.push(*first);
                rest = tail;
            }
        }
        assert_eq!(decoded, all);
    }

    #[test]
    fn the_protection_loop_parses_with_defaults_and_named_errors() {
        let rule = |words: &[&[u8]]| parse_rule(words);
        let r = rule(&[b"SLIDING", b"100", b"1000", b"ADAPT", b"ERRORS", b"5"]).unwrap();
        assert_eq!(r.protect.adapt(), Adapt::errors(5).ok());
        assert_eq!(r.protect.window_ms(), DEFAULT_WINDOW_MS);
        assert!(!r.keep_scale);
        let r = rule(&[
            b"SLIDING", b"100", b"1000", b"ADAPT", b"ERRORS", b"5", b"MIN", b"20", b"WINDOW",
            b"2000", b"FACTOR", b"50", b"STAGES", b"30", b"50", b"MODE", b"SHADOW",
        ])
        .unwrap();
        assert_eq!(r.protect.adapt(), Adapt::new(5, 50, 20, 5, 100).ok());
        assert_eq!(r.protect.stages(), Stages::new(30, 50).ok());
        assert_eq!((r.protect.window_ms(), r.mode), (2000, Mode::Shadow));
        let r = rule(&[
            b"SLIDING", b"100", b"1000", b"ADAPT", b"OFF", b"STAGES", b"1", b"2",
        ])
        .unwrap();
        assert!(r.keep_scale && r.protect.adapt().is_none());
        let err = |words: &[&[u8]]| rule(words).unwrap_err().message();
        assert_eq!(
            err(&[b"SLIDING", b"1", b"1", b"ADAPT", b"ERRORS", b"101"]),
            "ERR ERRORS must be an integer from 0 to 100"
        );
        assert_eq!(
            err(&[b"SLIDING", b"1", b"1", b"STAGES", b"50", b"30"]),
            "ERR break_pct must be an integer from 50 to 100"
        );
        // Above 100: the same range in the message (it said 0 to 100).
        assert_eq!(
            err(&[b"SLIDING", b"1", b"1", b"STAGES", b"50", b"101"]),
            "ERR break_pct must be an integer from 50 to 100"
        );
        assert_eq!(
            err(&[b"SLIDING", b"1", b"1", b"ADAPT", b"ERRORS", b"5", b"FACTOR", b"0"]),
            "ERR FACTOR must be an integer from 1 to 100"
        );
        assert_eq!(
            err(&[
                b"SLIDING", b"1", b"1", b"ADAPT", b"ERRORS", b"5", b"WINDOW", b"9", b"WINDOW", b"9"
            ]),
            "ERR WINDOW given more than once"
        );
        assert_eq!(
            err(&[b"SLIDING", b"1", b"1", b"ADAPT", b"SOMETIMES"]),
            "ERR ADAPT must be followed by ERRORS <pct> or OFF, got 'SOMETIMES'"
        );
    }

    #[test]
    fn rollout_is_monotone_and_roughly_uniform() {
        let keys: Vec<String> = (0..10_000).map(|i| format!("user:{i}")).collect();
        let rule = |p| Rule {
            spec: parse_rule(&[b"FIXEDWINDOW", b"1", b"1"]).unwrap().spec,
            mode: Mode::Enforce,
            rollout: p,
            zone: calendar::UTC,
            protect: Loop::default(),
            keep_scale: false,
            resume: None,
        };
        let mut previous: Vec<bool> = vec![false; keys.len()];
        for p in [0, 10, 30, 50, 100] {
            let now: Vec<bool> = keys
                .iter()
                .map(|k| rule(p).enforces(k.as_bytes()))
                .collect();
            for (was, is) in previous.iter().zip(&now) {
                assert!(!was || *is, "raising the roll-out un-enforced a key");
            }
            let share = now.iter().filter(|&&e| e).count() as f64 / keys.len() as f64;
            assert!((share - p as f64 / 100.0).abs() < 0.03, "{p}%: {share}");
            previous = now;
        }
    }

    /// Found while writing the RDB fuzz target: a payload could declare up to
    /// 2^20 policies, more than `RL.POLICY SET` lets a node hold; and a name
    /// twice, which no server writes.
    #[test]
    fn the_rdb_form_refuses_what_policy_set_refuses() {
        let rule = parse_rule(&[b"FIXEDWINDOW", b"1", b"1"]).unwrap();
        let decode_all = |all: &[(Vec<u8>, Rule)]| {
            let mut unsigned = Vec::new();
            let mut bytes = Vec::new();
            encode_rules(all, &mut |f: Field| match f {
                Field::Unsigned(v) => unsigned.push(v),
                Field::Bytes(b) => bytes.push(b.to_vec()),
            });
            let mut u = unsigned.into_iter();
            let mut b = bytes.into_iter();
            decode(&mut || u.next(), &mut || b.next())
        };
        let many: Vec<(Vec<u8>, Rule)> = (0..=MAX_POLICIES)
            .map(|i| (format!("p{i}").into_bytes(), rule))
            .collect();
        assert_eq!(
            decode_all(&many[..MAX_POLICIES]).unwrap().len(),
            MAX_POLICIES
        );
        assert!(decode_all(&many).is_none());
        assert!(decode_all(&[(b"a".to_vec(), rule), (b"a".to_vec(), rule)]).is_none());
        assert!(decode_all(&[(b"a b".to_vec(), rule)]).is_none());
        // Names of any kind RL.POLICY SET takes load back.
        let routes = [
            (b"POST:/api/order/create".to_vec(), rule),
            (b"a:b".to_vec(), rule),
            (b"a_b".to_vec(), rule),
            (vec![b'~'; MAX_NAME], rule),
        ];
        assert_eq!(decode_all(&routes).unwrap(), routes.to_vec());
    }

    /// What `Policies::load` in `datatype.rs` hands to `decode`: the
    /// unsigned fields and the byte strings of a payload, each in order.
    fn decode_fields(unsigned: &[u64], bytes: &[&[u8]]) -> Option<Vec<(Vec<u8>, Rule)>> {
        let mut u = unsigned.iter().copied();
        let mut b = bytes.iter().map(|b| b.to_vec());
        decode(&mut || u.next(), &mut || b.next())
    }

    /// The aux loader reads version 1 (no version field: the count first),
    /// as builds before version 2 wrote it, and the versioned payload; it
    /// refuses a version it does not know.
    #[test]
    fn the_aux_loader_reads_the_legacy_and_the_versioned_payload() {
        let rule = |words: &[&[u8]]| parse_rule(words).unwrap();
        let expected = vec![
            (
                b"api:login".to_vec(),
                rule(&[
                    b"TOKENBUCKET",
                    b"20",
                    b"10",
                    b"1000",
                    b"MODE",
                    b"SHADOW",
                    b"ROLLOUT",
                    b"30",
                ]),
            ),
            (
                b"orders".to_vec(),
                rule(&[b"FIXEDWINDOW", b"100", b"60000"]),
            ),
        ];
        // Version 1, field by field as the old encoder wrote it.
        let body = [2, 3, 20, 10, 1000, 1, 30, 2, 100, 60000, 0, 100];
        let bytes: [&[u8]; 4] = [b"api:login", b"TOKENBUCKET", b"orders", b"FIXEDWINDOW"];
        assert_eq!(decode_fields(&body, &bytes), Some(expected.clone()));
        // Version 2: the marked version, then the same fields.
        let versioned = [&[AUX_VERSIONED | 2][..], &body].concat();
        assert_eq!(decode_fields(&versioned, &bytes), Some(expected.clone()));
        // What the encoder writes today, with no zone but UTC, is version 2
        // (which builds without zones read).
        let mut unsigned = Vec::new();
        encode_rules(&expected, &mut |f: Field| {
            if let Field::Unsigned(v) = f {
                unsigned.push(v)
            }
        });
        assert_eq!(unsigned, versioned);
        // Versions never written are refused, and so is a marked version 1.
        for version in [0, 1, 4, AUX_VERSIONED - 1] {
            let other = [&[AUX_VERSIONED | version][..], &body].concat();
            assert_eq!(decode_fields(&other, &bytes), None, "version {version}");
        }
    }

    /// A quota's zone makes the payload version 3, with each policy's zone
    /// name after its roll-out; it reads back.
    #[test]
    fn a_zoned_quota_is_written_as_version_3_and_reads_back() {
        let zoned = parse_rule(&[b"QUOTA", b"5", b"DAY", b"TZ", b"Europe/Paris"]).unwrap();
        let plain = parse_rule(&[b"FIXEDWINDOW", b"1", b"1000"]).unwrap();
        let all = vec![(b"a".to_vec(), zoned), (b"b".to_vec(), plain)];
        let mut unsigned = Vec::new();
        let mut bytes: Vec<Vec<u8>> = Vec::new();
        encode_rules(&all, &mut |f: Field| match f {
            Field::Unsigned(v) => unsigned.push(v),
            Field::Bytes(b) => bytes.push(b.to_vec()),
        });
        assert_eq!(unsigned[0], AUX_VERSIONED | 3);
        assert!(bytes.contains(&b"Europe/Paris".to_vec()) && bytes.contains(&b"UTC".to_vec()));
        let refs: Vec<&[u8]> = bytes.iter().map(Vec::as_slice).collect();
        assert_eq!(decode_fields(&unsigned, &refs), Some(all));
        assert!(parse_rule(&[b"FIXEDWINDOW", b"1", b"1000", b"TZ", b"UTC"]).is_err());
    }

    /// A policy an older build stored with a fixed offset beyond 18 hours
    /// (it took up to 25:59) still loads, while `RL.POLICY SET` refuses
    /// such an offset naming `TZ`.
    #[test]
    fn an_offset_beyond_18_hours_loads_from_an_older_file_but_is_refused_in_a_call() {
        assert_eq!(
            parse_rule(&[b"QUOTA", b"5", b"DAY", b"TZ", b"+25:00"]),
            Err(Error::Syntax(
                "TZ offset must be between -18:00 and +18:00, not '+25:00'".into()
            ))
        );
        // What an older build wrote: this build's form with the other zone.
        let rule = parse_rule(&[b"QUOTA", b"5", b"DAY", b"TZ", b"+08:00"]).unwrap();
        let mut unsigned = Vec::new();
        let mut bytes: Vec<Vec<u8>> = Vec::new();
        encode_rules(&[(b"old".to_vec(), rule)], &mut |f: Field| match f {
            Field::Unsigned(v) => unsigned.push(v),
            Field::Bytes(b) if b == b"+08:00" => bytes.push(b"+25:00".to_vec()),
            Field::Bytes(b) => bytes.push(b.to_vec()),
        });
        let refs: Vec<&[u8]> = bytes.iter().map(Vec::as_slice).collect();
        let loaded = decode_fields(&unsigned, &refs).expect("an older build's file loads");
        assert_eq!(calendar::name(loaded[0].1.zone), b"+25:00");
    }

    /// The scale a policy has when it is saved, not the one it was loaded
    /// with. Failed before: a policy loaded at scale 50 (no loop), set back
    /// to 100 by hand, was saved again at 50 (the loaded rule's `resume`),
    /// so the next restart brought back the scale the operator had undone.
    #[test]
    fn a_saved_policy_carries_its_scale_now_not_the_one_it_was_loaded_with() {
        let saved = |name: &[u8]| {
            let mut unsigned = Vec::new();
            let mut bytes: Vec<Vec<u8>> = Vec::new();
            encode(&mut |f: Field| match f {
                Field::Unsigned(v) => unsigned.push(v),
                Field::Bytes(b) => bytes.push(b.to_vec()),
            });
            let refs: Vec<&[u8]> = bytes.iter().map(Vec::as_slice).collect();
            let all = decode_fields(&unsigned, &refs).expect("what encode writes loads");
            all.into_iter().find(|(n, _)| n == name).map(|(_, r)| r)
        };
        let name = b"unit:resume-stale";
        let mut loaded = parse_rule(&[b"FIXEDWINDOW", b"10", b"1000"]).unwrap();
        loaded.resume = Some((50, 0));
        set(name, loaded);
        let (_, stats) = get(name).unwrap();
        assert_eq!(lock(&stats.protection).current(), (50, 0));
        assert_eq!(saved(name).unwrap().resume, Some((50, 0)));
        // The operator's RL.POLICY SCALE 100.
        lock(&stats.protection).set(100, 0);
        assert_eq!(saved(name).unwrap().resume, None);
        assert!(delete(name));
    }

    /// A policy with a loop, and one with a scale set by hand, are written
    /// as version 4 and read back with their loop, scale and stage.
    #[test]
    fn the_loop_is_written_as_version_4_and_reads_back() {
        let mut looped = parse_rule(&[
            b"SLIDING", b"100", b"1000", b"ADAPT", b"ERRORS", b"5", b"STAGES", b"30", b"50",
            b"WINDOW", b"2000",
        ])
        .unwrap();
        looped.resume = Some((64, 2));
        let mut scaled = parse_rule(&[b"FIXEDWINDOW", b"1", b"1000"]).unwrap();
        scaled.resume = Some((50, 0));
        let plain = parse_rule(&[b"FIXEDWINDOW", b"1", b"1000", b"ADAPT", b"OFF"]).unwrap();
        let all = vec![
            (b"a".to_vec(), looped),
            (b"b".to_vec(), scaled),
            (b"c".to_vec(), plain),
        ];
        let mut unsigned = Vec::new();
        let mut bytes: Vec<Vec<u8>> = Vec::new();
        encode_rules(&all, &mut |f: Field| match f {
            Field::Unsigned(v) => unsigned.push(v),
            Field::Bytes(b) => bytes.push(b.to_vec()),
        });
        assert_eq!(unsigned[0], AUX_VERSIONED | 4);
        let refs: Vec<&[u8]> = bytes.iter().map(Vec::as_slice).collect();
        assert_eq!(decode_fields(&unsigned, &refs), Some(all));
    }

    #[test]
    fn the_rdb_form_round_trips() {
        let rule = parse_rule(&[
            b"HASHWINDOW",
            b"10",
            b"60000",
            b"1000",
            b"MODE",
            b"OFF",
            b"ROLLOUT",
            b"7",
        ])
        .unwrap();
        let mut unsigned = Vec::new();
        let mut bytes = Vec::new();
        let all = [(b"p1".to_vec(), rule)];
        encode_rules(&all, &mut |f: Field| match f {
            Field::Unsigned(v) => unsigned.push(v),
            Field::Bytes(b) => bytes.push(b.to_vec()),
        });
        let mut u = unsigned.into_iter();
        let mut b = bytes.into_iter();
        let decoded = decode(&mut || u.next(), &mut || b.next()).unwrap();
        assert_eq!(decoded, all.to_vec());
    }
}

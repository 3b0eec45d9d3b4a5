//! Grants (issue 27): batched rules, which take units from the server with
//! `UPTO b` and spend them in process, and striped rules, whose limit is
//! kept in N keys on N masters.
//!
//! What this file holds is the state of each batched (rule, key) and the
//! stripes' tags; the calls themselves are the limiter's (`limiter.rs`),
//! through its breaker and fallback.

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use crate::client::MAX_UPTO;
use crate::decision::{Decision, Path};
use crate::rule::{Batch, Spec};

/// The cluster's key hash slot of `key` (its hash tag's when it has one):
/// CRC16-XMODEM mod 16384, as `CLUSTER KEYSLOT` answers.
pub fn key_slot(key: &str) -> u16 {
    crate::acquire::key_slot(key.as_bytes())
}

/// CRC16-XMODEM (polynomial 0x1021, initial 0), as Redis Cluster hashes keys.
pub(crate) fn crc16(bytes: &[u8]) -> u16 {
    let mut crc: u16 = 0;
    for &b in bytes {
        crc ^= u16::from(b) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc
}

/// The batch of a rule: clamp(ceil(rate_per_s * hold_ms / 1000), 1,
/// max(1, limit * max_share_pct / 100)), in integers.
pub(crate) fn batch_size(rate_per_s: u64, hold_ms: u64, limit: u64, max_share_pct: u64) -> u64 {
    let want = (u128::from(rate_per_s) * u128::from(hold_ms)).div_ceil(1000);
    let cap = (u128::from(limit) * u128::from(max_share_pct) / 100).max(1);
    want.clamp(1, cap) as u64
}

/// The masters of a slot map, each as the slot ranges it owns (inclusive),
/// ordered by the lowest slot each owns. Standalone or Sentinel: one master
/// owning every slot.
pub(crate) type Masters = Vec<Vec<(u16, u16)>>;

/// The masters in the order of the lowest slot each owns (a master that
/// owns none last).
fn ordered(masters: &Masters) -> Masters {
    let mut out: Masters = masters
        .iter()
        .map(|ranges| {
            let mut r = ranges.clone();
            r.sort_unstable();
            r
        })
        .collect();
    out.sort_by_key(|ranges| ranges.first().map_or(u32::MAX, |r| u32::from(r.0)));
    out
}

/// Which master of `masters` owns `slot`.
fn owner(masters: &Masters, slot: u16) -> Option<usize> {
    masters
        .iter()
        .position(|ranges| ranges.iter().any(|&(lo, hi)| (lo..=hi).contains(&slot)))
}

/// The next tag `rl0`, `rl1`, ... (from `*counter`) whose slot `master`
/// owns and that is not in `taken`.
fn next_tag(masters: &Masters, master: usize, taken: &[String], counter: &mut u64) -> String {
    // Every master owns at least one slot of 16384, and a tag falls in any
    // one slot with odds 1/16384: this ends long before a million tries.
    for _ in 0..10_000_000u64 {
        let tag = format!("rl{counter}");
        *counter += 1;
        if owner(masters, key_slot(&tag)) == Some(master) && !taken.contains(&tag) {
            return tag;
        }
    }
    format!("rl{counter}")
}

/// The tags of `n` stripes (grants.md): stripe `i` on master `i mod M`,
/// its tag the first `rl<k>` owned by that master and not already taken by
/// a stripe before it.
pub(crate) fn pick_tags(masters: &Masters, n: usize) -> Vec<String> {
    let masters = &ordered(masters);
    let m = masters.len().max(1);
    let mut tags: Vec<String> = Vec::with_capacity(n);
    for i in 0..n {
        let mut counter = 0;
        let tag = if masters.is_empty() {
            format!("rl{i}")
        } else {
            next_tag(masters, i % m, &tags, &mut counter)
        };
        tags.push(tag);
    }
    tags
}

/// The tags after the slot map changed: a stripe keeps its tag while the
/// master now owning it holds no more than its fair share (`ceil(n / M)`)
/// of the stripes kept before it; the others move, in order, to the master
/// with the fewest stripes (the first in slot order on a tie), with that
/// master's first free tag. Units consumed under a moved stripe's old key
/// are not seen by its new key.
pub(crate) fn repick_tags(masters: &Masters, old: &[String]) -> Vec<String> {
    let masters = &ordered(masters);
    let n = old.len();
    if masters.is_empty() {
        return old.to_vec();
    }
    let m = masters.len();
    let fair = n.div_ceil(m);
    let mut load = vec![0usize; m];
    let mut kept: Vec<Option<String>> = vec![None; n];
    for (i, tag) in old.iter().enumerate() {
        if let Some(o) = owner(masters, key_slot(tag)) {
            if load[o] < fair {
                load[o] += 1;
                kept[i] = Some(tag.clone());
            }
        }
    }
    let mut taken: Vec<String> = kept.iter().flatten().cloned().collect();
    let mut out = Vec::with_capacity(n);
    for k in kept {
        match k {
            Some(tag) => out.push(tag),
            None => {
                let (target, _) = load
                    .iter()
                    .enumerate()
                    .min_by_key(|&(i, l)| (*l, i))
                    .unwrap_or((0, &0));
                load[target] += 1;
                let tag = next_tag(masters, target, &taken, &mut 0);
                taken.push(tag.clone());
                out.push(tag);
            }
        }
    }
    out
}

/// A striped rule's stripes: their specs, this instance's own stripe, and
/// the tags (re-picked when the slot map changes).
pub(crate) struct Stripes {
    pub(crate) specs: Vec<Spec>,
    pub(crate) own: usize,
    pub(crate) tags: RwLock<Vec<String>>,
    /// The slot map the tags were picked from.
    pub(crate) masters: Mutex<Masters>,
}

impl Stripes {
    /// Stripe `i`'s key for the rule's `key`: `{tag_i}key`.
    pub(crate) fn key(&self, i: usize, key: &str) -> String {
        let tags = self.tags.read().unwrap_or_else(|e| e.into_inner());
        format!("{{{}}}{key}", tags[i % tags.len()])
    }

    /// The stripes a decision tries, in order: its own, then the next.
    pub(crate) fn order(&self) -> [usize; 2] {
        let n = self.specs.len();
        [self.own, (self.own + 1) % n]
    }

    /// Re-picks the tags for `masters` when it differs from the map they
    /// were picked from; whether they changed.
    pub(crate) fn repick(&self, masters: Masters) -> bool {
        let mut seen = self.masters.lock().unwrap_or_else(|e| e.into_inner());
        if *seen == masters {
            return false;
        }
        let mut tags = self.tags.write().unwrap_or_else(|e| e.into_inner());
        let new = repick_tags(&masters, &tags);
        let changed = new != *tags;
        *tags = new;
        *seen = masters;
        changed
    }
}

/// What a batched rule needs of the grants on one of its keys (a striped
/// rule: one per stripe key).
pub(crate) struct GrantKey {
    pub(crate) key: String,
    pub(crate) spec: Spec,
    pub(crate) batch: Batch,
    state: Mutex<Held>,
    /// One `UPTO` call in flight per (rule, key): the others wait on it and
    /// share its grant.
    pub(crate) flight: tokio::sync::Mutex<()>,
}

impl fmt::Debug for GrantKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GrantKey").field("key", &self.key).finish()
    }
}

struct Held {
    held: u64,
    granted_at: Instant,
    /// No ask before this instant (`None`: ask when nothing is held).
    next_ask_at: Option<Instant>,
    /// The server answered `wait_ms` -1: deny until the rule changes.
    never: bool,
    /// The rate counter: decisions in the current second of the instance's
    /// clock (`second`) and in the one before it.
    second: u64,
    current: u64,
    previous: u64,
    /// Replies received: a waiter that sees it move shared that grant.
    asks: u64,
    /// The last reply's fields.
    limit: u64,
    remaining: u64,
    wait_ms: i64,
    reset_ms: u64,
}

/// What a decision on a batched key does next.
#[derive(Debug)]
pub(crate) enum Step {
    /// Decided in process.
    Done(Decision),
    /// Ask the server for `UPTO n`; `seen` is the reply count when it was
    /// decided (for [`GrantKey::after_wait`]).
    Ask { n: u64, seen: u64 },
}

impl GrantKey {
    pub(crate) fn new(key: String, spec: Spec, batch: Batch, now: Instant) -> GrantKey {
        GrantKey {
            key,
            spec,
            batch,
            state: Mutex::new(Held {
                held: 0,
                granted_at: now,
                next_ask_at: None,
                never: false,
                second: 0,
                current: 0,
                previous: 0,
                asks: 0,
                limit: spec.limit(),
                remaining: 0,
                wait_ms: 0,
                reset_ms: 0,
            }),
            flight: tokio::sync::Mutex::new(()),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Held> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The units held now.
    pub(crate) fn held(&self) -> u64 {
        self.lock().held
    }

    /// The first look of a decision of `cost` units at `now` (`epoch`: the
    /// instance's clock's origin, for the rate counter): taken from what is
    /// held, denied before the next ask, or an ask. Also answers the units
    /// held longer than `hold_ms`, to be refunded (taken off first).
    pub(crate) fn first_look(&self, epoch: Instant, now: Instant, cost: u64) -> (Step, u64) {
        let mut s = self.lock();
        s.count(now.saturating_duration_since(epoch).as_secs());
        let stale = self.take_stale(&mut s, now);
        (self.step(&mut s, now, cost, None), stale)
    }

    /// The look of a decision that waited for the call in flight (`seen`:
    /// the reply count before it waited): it takes from that grant, or is
    /// denied with its fields when nothing is left of it.
    pub(crate) fn after_wait(&self, now: Instant, cost: u64, seen: u64) -> Step {
        let mut s = self.lock();
        self.step(&mut s, now, cost, Some(seen))
    }

    fn take_stale(&self, s: &mut Held, now: Instant) -> u64 {
        let hold = Duration::from_millis(self.batch.hold_ms);
        if s.held > 0 && now.saturating_duration_since(s.granted_at) >= hold {
            std::mem::take(&mut s.held)
        } else {
            0
        }
    }

    fn step(&self, s: &mut Held, now: Instant, cost: u64, seen: Option<u64>) -> Step {
        if s.held >= cost && cost > 0 {
            s.held -= cost;
            return Step::Done(s.decision(true, s.held, 0));
        }
        if s.never {
            return Step::Done(s.decision(false, 0, -1));
        }
        if let Some(at) = s.next_ask_at.filter(|&at| now < at) {
            let wait = at.duration_since(now).as_millis().max(1) as i64;
            return Step::Done(s.decision(false, 0, wait));
        }
        if seen.is_some_and(|seen| seen != s.asks) {
            // The grant this decision waited for ran out before its turn.
            return Step::Done(s.decision(false, 0, s.wait_ms.max(0)));
        }
        Step::Ask {
            n: self.batch_size(s).max(cost).min(MAX_UPTO),
            seen: s.asks,
        }
    }

    /// b = clamp(ceil(rate * hold_ms / 1000), 1, max(1, limit *
    /// max_share_pct / 100)), rate the larger of the previous whole second's
    /// decisions and the current one's.
    fn batch_size(&self, s: &Held) -> u64 {
        batch_size(
            s.previous.max(s.current),
            self.batch.hold_ms,
            self.spec.limit(),
            self.batch.max_share_pct,
        )
    }

    /// The server's reply `d` to `UPTO asked`, sent at `asked_at`, for a
    /// decision of `cost`: that decision's answer, and the units to refund
    /// at once (none unless the grant is too small for `cost`).
    pub(crate) fn granted(
        &self,
        asked_at: Instant,
        now: Instant,
        asked: u64,
        cost: u64,
        d: &Decision,
    ) -> (Decision, u64) {
        let mut s = self.lock();
        let g = d.granted.unwrap_or(0);
        s.asks += 1;
        s.limit = d.limit;
        s.remaining = d.remaining;
        s.wait_ms = d.wait_ms;
        s.reset_ms = d.reset_ms();
        let hold = Duration::from_millis(self.batch.hold_ms);
        if g >= 1 {
            s.held += g;
            s.granted_at = now;
            s.never = false;
            s.next_ask_at = (g < asked).then_some(asked_at + hold);
            if s.held >= cost {
                s.held -= cost;
                let mut out = d.clone();
                out.granted = Some(cost);
                return (out, 0);
            }
            // Too few for this decision: they go back now.
            let back = std::mem::take(&mut s.held);
            let mut out = s.decision(false, 0, 0);
            out.path = Path::Redis;
            return (out, back);
        }
        if d.wait_ms < 0 {
            s.never = true;
        } else {
            let extra = if asked > 1 { hold } else { Duration::ZERO };
            let wait = Duration::from_millis(d.wait_ms as u64).max(extra);
            s.next_ask_at = Some(asked_at + wait);
        }
        let mut out = d.clone();
        out.granted = Some(0);
        (out, 0)
    }

    /// Gives back `units` a decision took but its set denied (another rule
    /// of the set denied it).
    pub(crate) fn put_back(&self, units: u64) {
        self.lock().held += units;
    }

    /// Takes what is held longer than `hold_ms` (`all`: everything), for a
    /// `REFUND`.
    pub(crate) fn take_for_refund(&self, now: Instant, all: bool) -> u64 {
        let mut s = self.lock();
        if all {
            std::mem::take(&mut s.held)
        } else {
            self.take_stale(&mut s, now)
        }
    }
}

impl Held {
    fn count(&mut self, second: u64) {
        if second != self.second {
            self.previous = if second == self.second + 1 {
                self.current
            } else {
                0
            };
            self.current = 0;
            self.second = second;
        }
        self.current += 1;
    }

    /// A decision in process, with the last reply's fields.
    fn decision(&self, allowed: bool, remaining: u64, wait_ms: i64) -> Decision {
        let mut d = Decision::from_fields(
            allowed,
            self.limit,
            remaining,
            wait_ms,
            self.reset_ms,
            Path::Grant,
        );
        d.granted = Some(u64::from(allowed));
        d
    }
}

/// Every batched key of a limiter, by rule signature and key.
#[derive(Default)]
pub(crate) struct GrantKeys {
    keys: Mutex<HashMap<String, Arc<GrantKey>>>,
}

impl GrantKeys {
    /// The state of `key` under the rule `signature` (made at first use).
    pub(crate) fn get(
        &self,
        signature: &str,
        key: &str,
        spec: Spec,
        batch: Batch,
        now: Instant,
    ) -> Arc<GrantKey> {
        let id = format!("{signature}\0{key}");
        let mut keys = self.keys.lock().unwrap_or_else(|e| e.into_inner());
        keys.entry(id)
            .or_insert_with(|| Arc::new(GrantKey::new(key.to_string(), spec, batch, now)))
            .clone()
    }

    /// Every key's state.
    pub(crate) fn all(&self) -> Vec<Arc<GrantKey>> {
        let keys = self.keys.lock().unwrap_or_else(|e| e.into_inner());
        keys.values().cloned().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crc16_and_slots_are_the_cluster_s() {
        // Redis Cluster's specification: CRC16 of "123456789" is 0x31C3.
        assert_eq!(crc16(b"123456789"), 0x31C3);
        // CLUSTER KEYSLOT answers, as printed by a server.
        assert_eq!(key_slot("foo"), 12182);
        assert_eq!(key_slot("bar"), 5061);
        assert_eq!(key_slot("{user1000}.following"), key_slot("user1000"));
        assert_eq!(key_slot("{}foo"), key_slot("{}foo"));
        assert_ne!(key_slot("{}foo"), key_slot("foo"));
    }

    #[test]
    fn standalone_tags_are_rl0_rl1_rl2() {
        let one: Masters = vec![vec![(0, 16383)]];
        assert_eq!(pick_tags(&one, 3), ["rl0", "rl1", "rl2"]);
    }

    #[test]
    fn three_masters_get_one_stripe_each() {
        let three: Masters = vec![vec![(0, 5460)], vec![(5461, 10922)], vec![(10923, 16383)]];
        let tags = pick_tags(&three, 3);
        for (i, tag) in tags.iter().enumerate() {
            assert_eq!(owner(&three, key_slot(tag)), Some(i), "{tag}");
        }
        // Six stripes: two per master, all different.
        let six = pick_tags(&three, 6);
        for (i, tag) in six.iter().enumerate() {
            assert_eq!(owner(&three, key_slot(tag)), Some(i % 3));
        }
        let mut uniq = six.clone();
        uniq.sort();
        uniq.dedup();
        assert_eq!(uniq.len(), 6);
        // The same map picks the same tags; a moved slot range moves only
        // the stripes it held.
        assert_eq!(repick_tags(&three, &tags), tags);
        let moved: Masters = vec![vec![(0, 5460), (10923, 16383)], vec![(5461, 10922)], vec![]];
        let re = repick_tags(&moved, &tags);
        assert_eq!(re[0], tags[0]);
        assert_eq!(re[1], tags[1]);
        assert_eq!(owner(&moved, key_slot(&re[2])), Some(0));
    }

    /// The contract's `grants` section (clients/contract/contract.json):
    /// the batch sizes, the stripes' shares and tags, the UPTO range.
    #[test]
    fn the_contracts_grants_vectors() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../contract/contract.json");
        let text = std::fs::read_to_string(path).expect("contract.json");
        let contract: serde_json::Value = serde_json::from_str(&text).expect("JSON");
        let grants = &contract["grants"];
        assert!(grants.is_object(), "contract.json has a grants section");
        let n = |v: &serde_json::Value| v.as_u64().expect("an integer");
        let batched = &grants["batched"];
        assert_eq!(n(&batched["hold_ms"]["default"]), Batch::default().hold_ms);
        assert_eq!(
            n(&batched["max_share_pct"]["default"]),
            Batch::default().max_share_pct
        );
        let vectors = batched["vectors"].as_array().expect("batch vectors");
        assert!(!vectors.is_empty());
        for v in vectors {
            let got = batch_size(
                n(&v["rate_per_s"]),
                n(&v["hold_ms"]),
                n(&v["limit"]),
                n(&v["max_share_pct"]),
            );
            assert_eq!(got, n(&v["batch"]), "{v}");
        }
        let stripes = &grants["stripes"];
        assert_eq!(n(&stripes["n"]["max"]), crate::rule::MAX_STRIPES);
        for v in stripes["share_vectors"].as_array().expect("share vectors") {
            let (total, count) = (n(&v["total"]), n(&v["n"]));
            let spec = Spec::parse("c", "FIXEDWINDOW", &[total, 1000]).unwrap();
            let shares: Vec<u64> = (0..count)
                .map(|i| spec.stripe("c", count, i).map(|s| s.limit()).unwrap_or(0))
                .collect();
            let want: Vec<u64> = v["shares"].as_array().unwrap().iter().map(n).collect();
            if want.contains(&0) {
                assert!(spec.stripe("c", count, 0).is_err(), "{v}");
            } else {
                assert_eq!(shares, want, "{v}");
            }
        }
        for v in stripes["tag_vectors"].as_array().expect("tag vectors") {
            let masters: Masters = v["masters"]
                .as_array()
                .unwrap()
                .iter()
                .map(|m| {
                    m.as_array()
                        .unwrap()
                        .iter()
                        .map(|r| (n(&r[0]) as u16, n(&r[1]) as u16))
                        .collect()
                })
                .collect();
            let tags = pick_tags(&masters, n(&v["n"]) as usize);
            let want: Vec<&str> = v["tags"]
                .as_array()
                .unwrap()
                .iter()
                .map(|t| t.as_str().unwrap())
                .collect();
            assert_eq!(tags, want, "{v}");
            let slots: Vec<u64> = tags.iter().map(|t| u64::from(key_slot(t))).collect();
            let want: Vec<u64> = v["slots"].as_array().unwrap().iter().map(n).collect();
            assert_eq!(slots, want, "{v}");
        }
        // The UPTO range, as the kit checks it before sending.
        for case in grants["requests"].as_array().expect("requests") {
            let Some(upto) = case["request"]["upto"].as_i64() else {
                continue;
            };
            let ok = case["ok"].as_bool().unwrap();
            let checked = u64::try_from(upto)
                .ok()
                .filter(|&u| (1..=MAX_UPTO).contains(&u))
                .is_some();
            assert_eq!(checked, ok, "{case}");
        }
    }

    fn tb(capacity: u64) -> Spec {
        Spec::parse("t", "TOKENBUCKET", &[capacity, 1, 1000]).unwrap()
    }

    fn reply(granted: u64, wait_ms: i64) -> Decision {
        let mut d = Decision::from_fields(granted > 0, 1000, 10, wait_ms, 5, Path::Redis);
        d.granted = Some(granted);
        d
    }

    #[test]
    fn the_batch_follows_the_rate_within_the_share() {
        let t0 = Instant::now();
        let k = GrantKey::new("k".into(), tb(1000), Batch::default(), t0);
        // The first decision asks for one unit.
        let (step, stale) = k.first_look(t0, t0, 1);
        assert_eq!(stale, 0);
        assert!(matches!(step, Step::Ask { n: 1, .. }));
        let (d, back) = k.granted(t0, t0, 1, 1, &reply(1, 0));
        assert!(d.allowed && back == 0 && k.held() == 0);
        // 400 decisions in one second: 400 * 50 / 1000 = 20 per batch,
        // below the share (10% of 1000 = 100).
        for _ in 0..399 {
            k.lock().count(0);
        }
        let (step, _) = k.first_look(t0, t0, 1);
        assert!(matches!(step, Step::Ask { n: 21, .. }), "{step:?}");
        // 5000/s would be 250: capped at 100.
        for _ in 0..5000 {
            k.lock().count(0);
        }
        let (step, _) = k.first_look(t0, t0, 1);
        assert!(matches!(step, Step::Ask { n: 100, .. }), "{step:?}");
        // The next second still sees the previous one's rate.
        let t1 = t0 + Duration::from_millis(1500);
        let (step, _) = k.first_look(t0, t1, 1);
        assert!(matches!(step, Step::Ask { n: 100, .. }), "{step:?}");
        // Two seconds later, the rate is the current second's.
        let t3 = t0 + Duration::from_millis(3500);
        let (step, _) = k.first_look(t0, t3, 1);
        assert!(matches!(step, Step::Ask { n: 1, .. }), "{step:?}");
    }

    #[test]
    fn held_units_are_spent_then_go_back_after_hold_ms() {
        let t0 = Instant::now();
        let k = GrantKey::new("k".into(), tb(1000), Batch::default(), t0);
        let (d, _) = k.granted(t0, t0, 10, 1, &reply(10, 0));
        assert!(d.allowed);
        assert_eq!(k.held(), 9);
        for left in (6..9).rev() {
            let (step, _) = k.first_look(t0, t0, 1);
            let Step::Done(d) = step else { panic!() };
            assert!(d.allowed && d.path == Path::Grant && d.remaining == left);
        }
        // A waiter that shared a grant that ran out is denied in process.
        assert!(matches!(k.after_wait(t0, 7, 0), Step::Done(ref d) if !d.allowed));
        assert_eq!(k.take_for_refund(t0 + Duration::from_millis(49), false), 0);
        assert_eq!(k.take_for_refund(t0 + Duration::from_millis(50), false), 6);
        assert_eq!(k.held(), 0);
    }

    #[test]
    fn a_short_grant_or_a_denial_waits_before_the_next_ask() {
        let t0 = Instant::now();
        let k = GrantKey::new("k".into(), tb(1000), Batch::default(), t0);
        // Asked 10, got 3: no ask for hold_ms once they are spent.
        k.granted(t0, t0, 10, 1, &reply(3, 0));
        for _ in 0..2 {
            assert!(matches!(k.first_look(t0, t0, 1).0, Step::Done(ref d) if d.allowed));
        }
        let (step, _) = k.first_look(t0, t0 + Duration::from_millis(10), 1);
        let Step::Done(d) = step else { panic!() };
        assert!(!d.allowed && d.wait_ms == 40 && d.path == Path::Grant);
        let (step, _) = k.first_look(t0, t0 + Duration::from_millis(50), 1);
        assert!(matches!(step, Step::Ask { .. }));
        // A denial asking 10 waits max(wait_ms, hold_ms); asking 1, wait_ms.
        let t1 = t0 + Duration::from_millis(60);
        k.granted(t1, t1, 10, 1, &reply(0, 20));
        let (step, _) = k.first_look(t0, t1 + Duration::from_millis(49), 1);
        assert!(matches!(step, Step::Done(ref d) if !d.allowed));
        let t2 = t1 + Duration::from_millis(50);
        k.granted(t2, t2, 1, 1, &reply(0, 20));
        let (step, _) = k.first_look(t0, t2 + Duration::from_millis(20), 1);
        assert!(matches!(step, Step::Ask { .. }));
        // wait_ms -1: never again.
        k.granted(t2, t2, 1, 1, &reply(0, -1));
        let (step, _) = k.first_look(t0, t2 + Duration::from_secs(9), 1);
        assert!(matches!(step, Step::Done(ref d) if d.never()));
    }

    #[test]
    fn a_grant_too_small_for_the_cost_goes_back_at_once() {
        let t0 = Instant::now();
        let k = GrantKey::new("k".into(), tb(1000), Batch::default(), t0);
        let (d, back) = k.granted(t0, t0, 5, 5, &reply(2, 0));
        assert!(!d.allowed);
        assert_eq!((back, k.held()), (2, 0));
    }
}

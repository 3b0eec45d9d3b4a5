//! Exact sliding log: never more than `limit` units admitted in any interval
//! of `window_ms`.
//!
//! The log keeps one entry per millisecond that admitted something: the
//! millisecond, rounded *up* from the request's microsecond (so an entry may
//! leave the window up to 1 ms late, never early), and the running count of
//! units admitted. A request at `now` is admitted when the units of the
//! entries still inside `(now - window_ms, now]` plus its cost stay within
//! `limit`.
//!
//! ```text
//! held(now)  = sum of counts of entries e with e.ms + window_ms > now
//! admit c    iff held + c <= limit, then append (ceil_ms(now), c)
//! wait       = time until the oldest entries holding held + c - limit units
//!              have left, found by binary search on the running counts
//! reset      = newest entry's ms + window_ms - now, but window_ms when
//!              the newest entry is the current millisecond's (and never
//!              below a denial's wait)
//! ```
//!
//! Memory: an entry is one `u64` (40 bits of milliseconds from the log's
//! epoch, 24 bits of running count), so a log holds 8 bytes per millisecond
//! with traffic, plus its ring buffer's spare room, and nothing for
//! milliseconds without. The ring and the log's 32-byte header share one
//! allocation ([`Block`]: 48 bytes for an idle log), so a call over a large
//! keyspace misses the cache once, not twice. Entries leave from the front
//! in amortised O(1) per call; the block doubles when the ring is full and
//! halves when it is mostly empty.
//!
//! Clock steps backwards: a new entry is never stamped before the newest
//! one, and entries leave by the clock, so a step back only keeps them
//! longer. Parameter changes: the log is kept as it is; a new limit applies
//! to what it holds, a new window to its entries' times.

use super::block::{Block, InBlock};
use super::{Algorithm, Decision, IntegerParam, Micros, Parameters, StateFields, Wait};
use crate::error::{in_range, param, ParamError};

/// Largest `limit` a sliding log can take: the running count in an entry has
/// 24 bits, and the units held never exceed the limit.
pub const MAX_LIMIT: u64 = (1 << 24) - 1;

/// The parameters of a sliding log (`RL.SLIDING`), valid by construction:
/// see [`SlidingLogParams::new`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SlidingLogParams {
    limit: u64,
    window_ms: u64,
}

impl SlidingLogParams {
    /// At most `limit` units (1 to [`MAX_LIMIT`]) in any interval of
    /// `window_ms` milliseconds (1 to [`crate::MAX_PARAM`]).
    pub fn new(limit: u64, window_ms: u64) -> Result<Self, ParamError> {
        Ok(SlidingLogParams {
            limit: in_range("limit", limit, 1, MAX_LIMIT)?,
            window_ms: param("window_ms", window_ms)?,
        })
    }

    /// Units admitted in any window.
    pub fn limit(&self) -> u64 {
        self.limit
    }
    /// The length of the window, in milliseconds.
    pub fn window_ms(&self) -> u64 {
        self.window_ms
    }
}

/// The log of one limiter, in one allocation ([`Block`]): its header,
/// then a ring of entries.
///
/// Two logs are equal when they hold the same header and entries, whatever
/// their ring's capacity and where in it they begin.
#[derive(Clone, Debug)]
pub struct SlidingLogState {
    /// Words [`EPOCH`], [`ADMITTED`], [`HELD`] and [`RING`], then the ring
    /// of `offset_ms << 24 | running_count` entries, oldest first from the
    /// ring's head.
    block: Block,
}

/// The words of a log's block: entries' milliseconds are offsets from the
/// Unix millisecond `EPOCH`; `ADMITTED` counts the units ever admitted into
/// the log (entries keep its low 24 bits); `HELD` the units its entries
/// hold; `RING` the ring's head (low 32 bits) and length (high 32 bits);
/// the entries follow from `ENTRIES`.
const EPOCH: usize = 0;
const ADMITTED: usize = 1;
const HELD: usize = 2;
const RING: usize = 3;
const ENTRIES: usize = 4;

/// Entries of an idle log's ring: its block is 48 bytes, a size class of
/// the server's allocator.
const IDLE_CAPACITY: usize = 1;

impl PartialEq for SlidingLogState {
    fn eq(&self, other: &Self) -> bool {
        let header = |s: &Self| (s.epoch_ms(), s.admitted(), s.held(), s.len());
        header(self) == header(other) && (0..self.len()).all(|i| self.entry(i) == other.entry(i))
    }
}

impl Eq for SlidingLogState {}

impl InBlock for SlidingLogState {
    fn into_block(self) -> Block {
        self.block
    }
    fn from_block(block: Block) -> Self {
        SlidingLogState { block }
    }
}

const COUNT_BITS: u32 = 24;
const COUNT_MASK: u64 = (1 << COUNT_BITS) - 1;
/// Largest offset an entry can hold (2^40 ms, about 35 years).
const MAX_OFFSET_MS: u64 = (1 << 40) - 1;

fn entry(offset_ms: u64, running: u64) -> u64 {
    offset_ms << COUNT_BITS | (running & COUNT_MASK)
}
fn offset_of(entry: u64) -> u64 {
    entry >> COUNT_BITS
}

/// The sliding log algorithm.
pub struct SlidingLog;

/// The millisecond a request admitted at `now` is stamped with: rounded up,
/// and never before the newest entry.
fn stamp(state: &SlidingLogState, now: Micros) -> u64 {
    now.as_ms_ceil().max(state.newest_ms().unwrap_or(0))
}

/// The decision, and the index of the oldest entry still in the window.
fn evaluate(
    state: &SlidingLogState,
    params: &SlidingLogParams,
    cost: u64,
    now: Micros,
) -> (Decision, usize) {
    let window_ms = params.window_ms;
    let leaves_after = |ms: u64| {
        ((ms + window_ms) * 1000)
            .saturating_sub(now.as_us())
            .div_ceil(1000)
    };
    // An entry of the current millisecond holds requests of this very
    // millisecond, at or before now, which leave the exact window at most
    // `window_ms` from now. Its stamp, rounded up, keeps them up to 1 ms
    // longer (late, never early; the key's expiry covers it), which reset_ms
    // does not count: a 1 s window says 1000, not 1001.
    let reset_after = |ms: u64| {
        if ms == now.as_ms_ceil() {
            window_ms
        } else {
            leaves_after(ms)
        }
    };
    // Entries that have left the window count for nothing. They are removed
    // only when a call is admitted, so that a denial leaves the state bit for
    // bit; until then they are skipped by binary search.
    let first = state.first_live(window_ms, now);
    let before = if first > 0 {
        state.units_through(first - 1)
    } else {
        0
    };
    let held = state.held() - before;
    let remaining = params.limit.saturating_sub(held);
    if cost > 0 && cost <= remaining {
        let decision = Decision {
            allowed: true,
            limit: params.limit,
            remaining: remaining - cost,
            wait: Wait::Ms(0),
            reset_ms: reset_after(stamp(state, now)),
        };
        return (decision, first);
    }
    let reset_ms = match state.newest_ms() {
        Some(ms) if held > 0 => reset_after(ms),
        _ => 0,
    };
    let wait = if cost == 0 {
        Wait::Ms(0)
    } else if cost > params.limit {
        Wait::Never
    } else {
        // The oldest live entries must leave until `excess` units have: the
        // first entry whose running count reaches it.
        let excess = held + cost - params.limit;
        let k = state.search(first, |i| state.units_through(i) - before >= excess);
        Wait::Ms(leaves_after(state.epoch_ms() + offset_of(state.entry(k))))
    };
    // A denial that waits for this millisecond's entry waits for its late
    // millisecond too; the limiter is no sooner idle than it is admitted.
    let reset_ms = match wait {
        Wait::Ms(wait_ms) => reset_ms.max(wait_ms),
        Wait::Never => reset_ms,
    };
    let decision = Decision {
        allowed: cost == 0,
        limit: params.limit,
        remaining,
        wait,
        reset_ms,
    };
    (decision, first)
}

impl SlidingLogState {
    /// An empty log with room for `capacity` entries.
    fn with_capacity(epoch_ms: u64, capacity: usize) -> SlidingLogState {
        let mut block = Block::zeroed(ENTRIES + capacity);
        block.words_mut()[EPOCH] = epoch_ms;
        SlidingLogState { block }
    }

    /// The Unix millisecond entries' offsets count from.
    fn epoch_ms(&self) -> u64 {
        self.block.get(EPOCH)
    }
    /// Units ever admitted into this log (modulo 2^64).
    fn admitted(&self) -> u64 {
        self.block.get(ADMITTED)
    }
    /// Units held by the entries.
    fn held(&self) -> u64 {
        self.block.get(HELD)
    }
    /// Index in the ring of the oldest entry.
    #[inline(always)]
    fn head(&self) -> usize {
        (self.block.get(RING) & 0xffff_ffff) as usize
    }
    /// Entries in the log.
    #[inline(always)]
    fn len(&self) -> usize {
        (self.block.get(RING) >> 32) as usize
    }
    fn set_ring(&mut self, head: usize, len: usize) {
        self.block.set(RING, (len as u64) << 32 | head as u64);
    }
    /// Entries the ring has room for.
    #[inline(always)]
    fn capacity(&self) -> usize {
        self.block.words().len() - ENTRIES
    }

    /// Where entry `i` (0 the oldest) sits in the block.
    #[inline(always)]
    fn slot(&self, i: usize) -> usize {
        let at = self.head() + i;
        let capacity = self.capacity();
        ENTRIES + if at >= capacity { at - capacity } else { at }
    }
    /// Entry `i`, 0 the oldest (`i < len`).
    #[inline(always)]
    fn entry(&self, i: usize) -> u64 {
        debug_assert!(i < self.len());
        self.block.get(self.slot(i))
    }
    fn set_entry(&mut self, i: usize, value: u64) {
        debug_assert!(i < self.len());
        let slot = self.slot(i);
        self.block.set(slot, value);
    }

    /// Moves the log into a block with room for `capacity` entries (at
    /// least `len`), its entries from the ring's start.
    fn reallocate(&mut self, capacity: usize) {
        let len = self.len();
        debug_assert!(capacity >= len);
        let mut moved = SlidingLogState::with_capacity(self.epoch_ms(), capacity);
        moved.block.set(ADMITTED, self.admitted());
        moved.block.set(HELD, self.held());
        moved.set_ring(0, len);
        for i in 0..len {
            moved.block.set(ENTRIES + i, self.entry(i));
        }
        *self = moved;
    }

    /// Appends an entry, the block doubling when the ring is full.
    fn push_entry(&mut self, value: u64) {
        let len = self.len();
        if len == self.capacity() {
            // Blocks of 6, 8, 16, 32, ... words: the allocator's size classes.
            let words = 1 + ENTRIES + self.capacity();
            let grown = if words < 8 { 8 } else { 2 * words };
            self.reallocate(grown - 1 - ENTRIES);
        }
        let head = self.head();
        self.set_ring(head, len + 1);
        self.set_entry(len, value);
    }

    /// Removes the newest entry.
    fn pop_entry(&mut self) {
        let (head, len) = (self.head(), self.len());
        debug_assert!(len > 0);
        self.set_ring(head, len - 1);
    }

    /// Removes the `count` oldest entries.
    fn drop_oldest(&mut self, count: usize) {
        let (len, capacity) = (self.len(), self.capacity());
        debug_assert!(count <= len);
        let head = (self.head() + count) % capacity;
        self.set_ring(head, len - count);
    }

    /// The newest entry, if any.
    fn newest(&self) -> Option<u64> {
        self.len().checked_sub(1).map(|i| self.entry(i))
    }

    /// Units admitted before the oldest entry, modulo 2^24.
    fn base(&self) -> u64 {
        self.admitted().wrapping_sub(self.held())
    }

    /// Units in entries `0..=i` (exact: they never exceed `held` < 2^24).
    fn units_through(&self, i: usize) -> u64 {
        (self.entry(i).wrapping_sub(self.base())) & COUNT_MASK
    }

    fn newest_ms(&self) -> Option<u64> {
        self.newest().map(|e| self.epoch_ms() + offset_of(e))
    }

    /// The first index in `from..len` where the monotone `reached` holds
    /// (`len` if nowhere), by binary search.
    fn search(&self, from: usize, reached: impl Fn(usize) -> bool) -> usize {
        let (mut lo, mut hi) = (from, self.len());
        while lo < hi {
            let mid = lo + (hi - lo) / 2;
            if reached(mid) {
                hi = mid;
            } else {
                lo = mid + 1;
            }
        }
        lo
    }

    /// Index of the oldest entry still inside the window at `now`.
    fn first_live(&self, window_ms: u64, now: Micros) -> usize {
        let epoch_ms = self.epoch_ms();
        self.search(0, |i| {
            (epoch_ms + offset_of(self.entry(i)) + window_ms) * 1000 > now.as_us()
        })
    }

    /// Drops the entries before `first`: amortised O(1), each entry leaves once.
    fn expire(&mut self, first: usize) {
        if first > 0 {
            let held = self.held() - self.units_through(first - 1);
            self.block.set(HELD, held);
            self.drop_oldest(first);
        }
        // Give memory back once the ring is mostly empty (its block halved
        // still holds twice the entries).
        let capacity = self.capacity();
        if capacity > 16 && self.len() < capacity / 4 {
            let words = 1 + ENTRIES + capacity;
            self.reallocate(words / 2 - 1 - ENTRIES);
        }
    }

    /// Appends `cost` units at millisecond `ms` (never before the newest).
    fn push(&mut self, ms: u64, cost: u64) {
        if self.len() == 0 {
            self.block.set(EPOCH, ms);
        } else if ms - self.epoch_ms() > MAX_OFFSET_MS {
            self.rebase();
        }
        let admitted = self.admitted().wrapping_add(cost);
        self.block.set(ADMITTED, admitted);
        self.block.set(HELD, self.held() + cost);
        let offset = ms - self.epoch_ms();
        match self.newest() {
            Some(last) if offset_of(last) == offset => {
                self.set_entry(self.len() - 1, entry(offset, admitted))
            }
            _ => self.push_entry(entry(offset, admitted)),
        }
    }

    /// Units held by the entries from `first` on (the live ones).
    fn live_units(&self, first: usize) -> u64 {
        if first == 0 {
            self.held()
        } else {
            self.held() - self.units_through(first - 1)
        }
    }

    /// Takes `units` (at most `held`) off the newest entries: a refund gives
    /// back the units admitted last.
    fn pop_newest(&mut self, mut units: u64) {
        while units > 0 {
            let Some(last) = self.newest() else {
                return;
            };
            let len = self.len();
            let below = if len >= 2 {
                self.units_through(len - 2)
            } else {
                0
            };
            let in_last = self.units_through(len - 1) - below;
            let back = units.min(in_last);
            self.block.set(HELD, self.held() - back);
            let admitted = self.admitted().wrapping_sub(back);
            self.block.set(ADMITTED, admitted);
            units -= back;
            if back == in_last {
                self.pop_entry();
            } else {
                self.set_entry(len - 1, entry(offset_of(last), admitted));
            }
        }
    }

    /// Moves the epoch to the oldest entry (once in decades of traffic).
    fn rebase(&mut self) {
        let shift = if self.len() > 0 {
            offset_of(self.entry(0))
        } else {
            0
        };
        for i in 0..self.len() {
            let e = self.entry(i);
            self.set_entry(i, entry(offset_of(e) - shift, e));
        }
        self.block.set(EPOCH, self.epoch_ms() + shift);
    }

    /// Checks the invariants a loaded state must hold.
    pub(crate) fn is_valid(&self) -> bool {
        if self.held() > MAX_LIMIT || self.epoch_ms() > super::MAX_STATE_MS {
            return false;
        }
        let Some(newest) = self.newest() else {
            return self.held() == 0;
        };
        let mut previous_offset = 0;
        let mut previous_units = 0;
        for i in 0..self.len() {
            let offset = offset_of(self.entry(i));
            let units = self.units_through(i);
            if offset < previous_offset || units <= previous_units {
                return false;
            }
            previous_offset = offset;
            previous_units = units;
        }
        previous_units == self.held() && self.admitted() & COUNT_MASK == newest & COUNT_MASK
    }
}

/// Most entries a loaded log may declare: a valid one holds fewer, each
/// entry holding at least one of its at most [`MAX_LIMIT`] units.
const MAX_LOADED_ENTRIES: u64 = 1 << 24;

/// `limit window_ms`.
impl Parameters for SlidingLogParams {
    const INTEGERS: &'static [IntegerParam] = &[
        IntegerParam {
            name: "limit",
            min: 1,
            max: MAX_LIMIT,
            keywords: &[],
        },
        IntegerParam::positive("window_ms"),
    ];
    fn from_integers(values: &[u64]) -> Result<Self, ParamError> {
        SlidingLogParams::new(values[0], values[1])
    }
    fn to_integers(&self, out: &mut impl FnMut(u64)) {
        out(self.limit);
        out(self.window_ms);
    }
}

/// `epoch_ms, admitted, held`, the number of entries, then the entries.
impl StateFields for SlidingLogState {
    fn to_fields(&self, out: &mut impl FnMut(u64)) {
        out(self.epoch_ms());
        out(self.admitted());
        out(self.held());
        out(self.len() as u64);
        for i in 0..self.len() {
            out(self.entry(i));
        }
    }

    /// Its block (header and entries).
    fn heap_bytes(&self) -> usize {
        self.block.bytes()
    }

    fn from_fields(next: &mut impl FnMut() -> Option<u64>) -> Option<Self> {
        let epoch_ms = next()?;
        let admitted = next()?;
        let held = next()?;
        let len = next()?;
        if len > MAX_LOADED_ENTRIES {
            return None;
        }
        // Read first, allocated after: a declared length allocates only as
        // many entries as the payload really holds.
        let mut entries = Vec::new();
        for _ in 0..len {
            entries.push(next()?);
        }
        let mut state = SlidingLogState::with_capacity(epoch_ms, entries.len().max(IDLE_CAPACITY));
        state.block.set(ADMITTED, admitted);
        state.block.set(HELD, held);
        state.set_ring(0, entries.len());
        state.block.words_mut()[ENTRIES..ENTRIES + entries.len()].copy_from_slice(&entries);
        state.is_valid().then_some(state)
    }
}

impl Algorithm for SlidingLog {
    type Params = SlidingLogParams;
    type State = SlidingLogState;

    fn idle(_params: &SlidingLogParams, now: Micros) -> SlidingLogState {
        SlidingLogState::with_capacity(now.as_ms_floor(), IDLE_CAPACITY)
    }

    fn apply(
        state: &mut SlidingLogState,
        params: &SlidingLogParams,
        cost: u64,
        now: Micros,
    ) -> Decision {
        let (decision, first) = evaluate(state, params, cost, now);
        if decision.allowed && cost > 0 {
            state.expire(first);
            state.push(stamp(state, now), cost);
        }
        decision
    }

    fn decide(
        state: &SlidingLogState,
        params: &SlidingLogParams,
        cost: u64,
        now: Micros,
    ) -> Decision {
        evaluate(state, params, cost, now).0
    }

    fn force(
        state: &mut SlidingLogState,
        params: &SlidingLogParams,
        cost: u64,
        now: Micros,
    ) -> (Decision, bool) {
        let (decision, first) = evaluate(state, params, cost, now);
        if decision.allowed || cost == 0 {
            let changed = decision.allowed && cost > 0;
            if changed {
                state.expire(first);
                state.push(stamp(state, now), cost);
            }
            return (decision, changed);
        }
        // At most a limit's worth of debt, and within what an entry's
        // running count can tell apart.
        let held = state.live_units(first);
        let cap = params.limit.saturating_mul(2).min(MAX_LIMIT);
        let take = cost.min(cap.saturating_sub(held));
        if take == 0 {
            return (decision, false);
        }
        state.expire(first);
        state.push(stamp(state, now), take);
        (decision, true)
    }

    fn refund(
        state: &mut SlidingLogState,
        params: &SlidingLogParams,
        units: u64,
        now: Micros,
    ) -> bool {
        let first = state.first_live(params.window_ms, now);
        let back = units.min(state.live_units(first));
        if back == 0 {
            return false;
        }
        state.expire(first);
        state.pop_newest(back);
        true
    }

    fn idle_at_ms(state: &SlidingLogState, params: &SlidingLogParams) -> u64 {
        state.newest_ms().map_or(0, |ms| ms + params.window_ms)
    }
}

/// The guarantee the contract checks (`crate::contract`).
impl crate::contract::Guarantee for SlidingLog {
    fn limit(params: &SlidingLogParams) -> u64 {
        params.limit()
    }
    fn check_admissions(p: &SlidingLogParams, admitted: &[(u64, u64)]) {
        crate::contract::check_window_bound(p.limit(), p.window_ms(), admitted);
    }
}

#[cfg(test)]
mod tests {
    use super::super::testkit::{apply_checked, remaining_after_change};
    use super::super::MAX_PARAM;
    use super::*;
    use proptest::prelude::*;

    const T0: Micros = Micros::from_us(1_700_000_000_000_000);

    fn params(limit: u64, window_ms: u64) -> SlidingLogParams {
        SlidingLogParams::new(limit, window_ms).expect("valid parameters")
    }
    fn at(ms: u64) -> Micros {
        T0.saturating_add_ms(ms)
    }
    fn hit(s: &mut SlidingLogState, p: &SlidingLogParams, cost: u64, now: Micros) -> Decision {
        apply_checked::<SlidingLog>(s, p, cost, now)
    }

    #[test]
    fn parameters_are_checked_in_argument_order() {
        assert_eq!(
            SlidingLogParams::new(MAX_LIMIT + 1, 0),
            Err(ParamError::Range {
                arg: "limit",
                min: 1,
                max: MAX_LIMIT
            })
        );
        assert_eq!(
            SlidingLogParams::new(MAX_LIMIT, 0),
            Err(ParamError::Range {
                arg: "window_ms",
                min: 1,
                max: MAX_PARAM
            })
        );
        let p = params(MAX_LIMIT, MAX_PARAM);
        assert_eq!((p.limit(), p.window_ms()), (MAX_LIMIT, MAX_PARAM));
    }

    #[test]
    fn no_double_burst_at_a_window_edge() {
        let p = params(3, 1000);
        let mut s = SlidingLog::idle(&p, T0);
        assert!(hit(&mut s, &p, 3, at(999)).allowed);
        // a fixed window would reopen at 1000; the log waits for 1999
        assert!(!hit(&mut s, &p, 1, at(1000)).allowed);
        let d = hit(&mut s, &p, 1, at(1500));
        assert_eq!(d.wait, Wait::Ms(499));
        assert!(!hit(&mut s, &p, 1, at(1999).saturating_sub_us(1)).allowed);
        assert!(hit(&mut s, &p, 1, at(1999)).allowed);
    }

    #[test]
    fn wait_is_until_enough_of_the_oldest_units_leave() {
        let p = params(5, 100);
        let mut s = SlidingLog::idle(&p, T0);
        hit(&mut s, &p, 2, at(0));
        hit(&mut s, &p, 1, at(10));
        hit(&mut s, &p, 2, at(20));
        let d = hit(&mut s, &p, 3, at(30));
        // 3 must leave: the 2 at 0 and the 1 at 10, gone at 110
        assert_eq!((d.allowed, d.wait, d.reset_ms), (false, Wait::Ms(80), 90));
        assert!(hit(&mut s, &p, 3, at(110)).allowed);
    }

    #[test]
    fn entries_are_stamped_up_to_the_next_millisecond() {
        let p = params(1, 10);
        let mut s = SlidingLog::idle(&p, T0);
        assert!(hit(&mut s, &p, 1, T0.saturating_add_us(200)).allowed);
        // stamped at 1 ms: it leaves at 11 ms, not 10.2
        assert!(!hit(&mut s, &p, 1, T0.saturating_add_us(10_500)).allowed);
        assert!(hit(&mut s, &p, 1, at(11)).allowed);
    }

    /// Right after a first admission the log is idle again a window later:
    /// `reset_ms` is the window, not the window plus the millisecond its
    /// entry was rounded up to (`t=2` on a 1 s window in every kit).
    #[test]
    fn reset_is_at_most_the_window_right_after_a_first_admission() {
        let p = params(5, 1000);
        for us in [0, 1, 300, 999] {
            let now = T0.saturating_add_us(us);
            let mut s = SlidingLog::idle(&p, now);
            let d = hit(&mut s, &p, 1, now);
            assert_eq!((d.allowed, d.reset_ms), (true, 1000), "at +{us} us");
            // A peek in the same microsecond says the same; a denial that
            // must wait for the entry waits for its late millisecond, and
            // reset_ms is never below wait_ms.
            assert_eq!(hit(&mut s, &p, 0, now).reset_ms, 1000);
            let late = if us % 1000 == 0 { 1000 } else { 1001 };
            let denied = hit(&mut s, &p, 5, now);
            assert_eq!(
                (denied.allowed, denied.wait, denied.reset_ms),
                (false, Wait::Ms(late), late)
            );
            // The entry still leaves late, never early, and the key lives
            // at least as long as reset_ms says.
            assert!(SlidingLog::idle_at_ms(&s, &p) * 1000 >= now.as_us() + d.reset_ms * 1000);
        }
    }

    #[test]
    fn requests_in_one_millisecond_share_an_entry() {
        let p = params(100, 1000);
        let mut s = SlidingLog::idle(&p, T0);
        for i in 0..10 {
            hit(&mut s, &p, 1, T0.saturating_add_us(1 + i * 90));
        }
        assert_eq!(s.len(), 1);
        assert_eq!(s.held(), 10);
    }

    #[test]
    fn a_thousand_held_units_take_about_eight_bytes_each() {
        let p = params(10_000, 60_000);
        let mut s = SlidingLog::idle(&p, T0);
        for i in 0..1000 {
            assert!(hit(&mut s, &p, 1, at(i)).allowed);
        }
        let bytes = s.heap_bytes();
        assert!(bytes <= 10 * 1000, "{bytes} bytes for 1000 units");
    }

    #[test]
    fn the_ring_shrinks_once_traffic_drops() {
        let p = params(100_000, 1000);
        let mut s = SlidingLog::idle(&p, T0);
        for i in 0..5000 {
            hit(&mut s, &p, 1, T0.saturating_add_us(i * 1000 + 1));
        }
        let big = s.capacity();
        for i in 0..50 {
            hit(&mut s, &p, 1, at(10_000 + i * 100));
        }
        assert!(s.capacity() < big / 4);
    }

    #[test]
    fn a_backwards_clock_never_frees_units() {
        let p = params(2, 1000);
        let mut s = SlidingLog::idle(&p, T0);
        hit(&mut s, &p, 2, at(5000));
        assert!(!hit(&mut s, &p, 1, at(4000)).allowed);
        assert!(!hit(&mut s, &p, 1, at(5999)).allowed);
        assert!(hit(&mut s, &p, 1, at(6000)).allowed);
    }

    /// The SPEC's reading of a parameter change: the log is kept, so a
    /// raised limit is room at once (10 held of 10, raised to 100: 90 left,
    /// and 90 more are admitted).
    #[test]
    fn a_raised_limit_adds_room_at_once() {
        let left =
            remaining_after_change::<SlidingLog>(&params(10, 60_000), &params(100, 60_000), 10, T0);
        assert_eq!(left, 90);
    }

    /// 10 held of 100, lowered to 20: 10 left, not 20.
    #[test]
    fn a_lowered_limit_applies_at_once() {
        let left =
            remaining_after_change::<SlidingLog>(&params(100, 60_000), &params(20, 60_000), 10, T0);
        assert_eq!(left, 10);
    }

    #[test]
    fn epoch_rebases_after_decades() {
        // A window longer than any call may ask for (2^40 ms), so that both
        // entries, 2^40 ms apart, stay in it.
        let p = SlidingLogParams {
            limit: 3,
            window_ms: 1 << 41,
        };
        let mut s = SlidingLog::idle(&p, T0);
        hit(&mut s, &p, 1, T0);
        hit(&mut s, &p, 1, at(MAX_OFFSET_MS + 5));
        assert!(s.is_valid());
        assert!(!hit(&mut s, &p, 2, at(MAX_OFFSET_MS + 6)).allowed);
        assert_eq!(s.held(), 2);
    }

    proptest! {
        /// Reference: a plain list of (microsecond, cost) of admitted requests.
        /// Limits up to 300 and steps down to a few microseconds make logs
        /// of hundreds of entries, whose ring wraps, grows and shrinks.
        #[test]
        fn agrees_with_a_list_of_timestamps(
            limit in prop_oneof![1u64..20, 100u64..300],
            window_ms in prop_oneof![1u64..5, 1u64..2000],
            steps in prop::collection::vec(
                (prop_oneof![0u64..300_000, 0u64..3_000], 0u64..5, prop::bool::weighted(0.1)),
                1..300,
            ),
        ) {
            let p = params(limit, window_ms);
            let mut now = T0.as_us();
            let mut s = SlidingLog::idle(&p, T0);
            let mut log: Vec<(u64, u64)> = Vec::new();
            for (dt, cost, back) in steps {
                now = if back { now - dt.min(now - T0.as_us()) } else { now + dt };
                // entries are stamped at the ms at or after the request, and
                // never before the newest one
                let held = |t: u64| -> u64 {
                    log.iter().filter(|e| (e.0 + window_ms) * 1000 > t).map(|e| e.1).sum()
                };
                let used = held(now);
                let d = hit(&mut s, &p, cost, Micros::from_us(now));
                prop_assert_eq!(d.allowed, cost == 0 || used + cost <= limit);
                prop_assert_eq!(d.remaining, limit.saturating_sub(used) - if d.allowed { cost } else { 0 });
                if d.allowed && cost > 0 {
                    // gone is gone: what left the window does not come back
                    // if the clock later steps back
                    log.retain(|e| (e.0 + window_ms) * 1000 > now);
                    let newest = log.last().map_or(0, |e| e.0);
                    log.push((now.div_ceil(1000).max(newest), cost));
                } else if !d.allowed && cost <= limit {
                    let Wait::Ms(w) = d.wait else { panic!("finite wait expected") };
                    prop_assert!(held(now + w * 1000) + cost <= limit);
                    if w > 0 {
                        prop_assert!(held(now + w * 1000 - 1000) + cost > limit);
                    }
                }
                prop_assert!(s.is_valid());
            }
        }

        /// On a clock that never steps back, `reset_ms` never exceeds the
        /// window after an admission or a peek; it is never below a
        /// denial's `wait_ms`; and the key (which expires at the state's idle instant)
        /// has at least that PTTL after an admission.
        #[test]
        fn reset_never_exceeds_the_window(
            limit in 1u64..20,
            window_ms in prop_oneof![1u64..5, 1u64..2000],
            steps in prop::collection::vec((0u64..3_000_000, 0u64..5, prop::bool::weighted(0.1)), 1..100),
        ) {
            let p = params(limit, window_ms);
            let mut now = T0.as_us();
            let mut latest = now;
            let mut s = SlidingLog::idle(&p, T0);
            for (dt, cost, back) in steps {
                now = if back { now - dt.min(now - T0.as_us()) } else { now + dt };
                latest = latest.max(now);
                let d = hit(&mut s, &p, cost, Micros::from_us(now));
                if now == latest && (d.allowed || cost == 0) {
                    prop_assert!(d.reset_ms <= window_ms, "{:?}", d);
                }
                if let Wait::Ms(wait_ms) = d.wait {
                    prop_assert!(wait_ms <= d.reset_ms, "{:?}", d);
                }
                if d.allowed && cost > 0 {
                    // What PTTL says right after the call (Redis counts in
                    // whole milliseconds) is at least reset_ms.
                    let pttl = SlidingLog::idle_at_ms(&s, &p) - now / 1000;
                    prop_assert!(pttl >= d.reset_ms, "PTTL {} < {:?}", pttl, d);
                }
            }
        }

        /// At the instant of any change (limit, window or both), what is
        /// left is the new limit minus the units held, at least 0: entries
        /// are stamped at or after the instant, so even a 1 ms window holds
        /// them then.
        #[test]
        fn a_change_keeps_what_is_held(
            a in (1u64..=MAX_LIMIT, 1u64..MAX_PARAM),
            b in (1u64..=MAX_LIMIT, 1u64..MAX_PARAM),
            used in any::<u64>(),
            dt in 0u64..10_000_000,
        ) {
            let (pa, pb) = (params(a.0, a.1), params(b.0, b.1));
            let used = used % (pa.limit + 1);
            let now = T0.saturating_add_us(dt);
            let left = remaining_after_change::<SlidingLog>(&pa, &pb, used, now);
            prop_assert_eq!(left, pb.limit.saturating_sub(used));
        }

        #[test]
        fn no_window_ever_holds_more_than_the_limit(
            limit in 1u64..10,
            window_ms in 1u64..50,
            steps in prop::collection::vec((0u64..20_000, 1u64..4), 1..300),
        ) {
            let p = params(limit, window_ms);
            let mut now = T0.as_us();
            let mut s = SlidingLog::idle(&p, T0);
            let mut admitted: Vec<(u64, u64)> = Vec::new();
            for (dt, cost) in steps {
                now += dt;
                if hit(&mut s, &p, cost, Micros::from_us(now)).allowed {
                    admitted.push((now, cost));
                }
            }
            for (i, a) in admitted.iter().enumerate() {
                let in_window: u64 = admitted[i..].iter()
                    .take_while(|b| b.0 < a.0 + window_ms * 1000)
                    .map(|b| b.1).sum();
                prop_assert!(in_window <= limit);
            }
        }
    }
}

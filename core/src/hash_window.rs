//! Hash window: the sliding window approximated by fixed sub-buckets (the
//! "hash buckets" design of the Lua world), in fixed memory and O(1).
//!
//! Time is cut into buckets of `bucket_ms` aligned on the Unix epoch, with
//! `n = window_ms / bucket_ms`. The window `(now - window_ms, now]` reaches
//! into `n + 1` buckets: the current one, `n - 1` whole ones, and the oldest,
//! of which it covers a part. A request is admitted when the units of those
//! `n + 1` buckets plus its cost stay within `limit`. (Counting only `n`
//! buckets, as many Lua scripts do, lets a unit leave up to one bucket early,
//! so `limit` could be exceeded within a window.) A running sum makes a call
//! O(1): buckets are zeroed as time moves past them (each once per turn of
//! the ring), never summed.
//!
//! ```text
//! b(now)       = floor(now / bucket_ms)
//! held(now)    = sum of count[j] for b(now) - n <= j <= b(now)
//! admit c      iff held + c <= limit, then count[b(now)] += c
//! wait         = until enough of the oldest buckets have left (bucket j
//!                leaves at (j + n + 1) * bucket_ms); computed only on denial
//! reset        = (newest bucket + n + 1) * bucket_ms - now
//! ```
//!
//! It is an approximation of the sliding window, in the conservative
//! direction: a unit counts until its whole bucket has left the window, up
//! to `bucket_ms` longer than the exact log would keep it; it never leaves
//! early. So in any span of `window_ms` at most `limit` units are admitted.
//!
//! Clock steps backwards: the newest bucket stays current until the clock
//! passes it again. Parameter changes: each old bucket's units move to the
//! new bucket holding that old bucket's last millisecond (the latest moment
//! they can have been admitted), and are kept while that bucket is in the
//! new window.

use super::block::{Block, InBlock};
use super::{Algorithm, Decision, IntegerParam, Micros, Parameters, StateFields, Wait};
use crate::error::{param, ParamError};

/// Most buckets a hash window may have: its ring is allocated at once.
pub const MAX_BUCKETS: u64 = 1_000_000;

/// The parameters of a hash window (`RL.HASHWINDOW`), valid by
/// construction: see [`HashWindowParams::new`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HashWindowParams {
    limit: u64,
    window_ms: u64,
    bucket_ms: u64,
}

impl HashWindowParams {
    /// At most `limit` units in any window of `window_ms` milliseconds,
    /// counted in buckets of `bucket_ms`. Each is 1 to [`crate::MAX_PARAM`];
    /// `bucket_ms` divides `window_ms`, into at most [`MAX_BUCKETS`] buckets.
    pub fn new(limit: u64, window_ms: u64, bucket_ms: u64) -> Result<Self, ParamError> {
        let params = HashWindowParams {
            limit: param("limit", limit)?,
            window_ms: param("window_ms", window_ms)?,
            bucket_ms: param("bucket_ms", bucket_ms)?,
        };
        if !window_ms.is_multiple_of(bucket_ms) {
            return Err(ParamError::BucketDoesNotDivide);
        }
        if params.buckets() > MAX_BUCKETS {
            return Err(ParamError::Range {
                arg: "window_ms / bucket_ms",
                min: 1,
                max: MAX_BUCKETS,
            });
        }
        Ok(params)
    }

    /// Units admitted in any window.
    pub fn limit(&self) -> u64 {
        self.limit
    }
    /// The length of the window, in milliseconds.
    pub fn window_ms(&self) -> u64 {
        self.window_ms
    }
    /// The length of a bucket, in milliseconds.
    pub fn bucket_ms(&self) -> u64 {
        self.bucket_ms
    }
    /// Buckets in a window, `window_ms / bucket_ms` (what the config bounds).
    pub fn buckets(&self) -> u64 {
        self.window_ms / self.bucket_ms
    }
    /// Buckets the ring keeps: one more than a window, since a window is
    /// rarely aligned on bucket edges.
    pub fn ring_len(&self) -> u64 {
        self.buckets() + 1
    }
}

/// The ring of bucket counts of one limiter, in one allocation
/// ([`Block`]): its header, then its counters.
///
/// Two states are equal when they hold the same counts, whatever the width
/// each keeps them at.
#[derive(Clone, Debug)]
pub struct HashWindowState {
    /// Words [`BUCKET_MS`], [`NEWEST`] and [`SUM`], then the counters:
    /// bucket `j` is counter `j % len`, for `newest - len < j <= newest`.
    /// The block's tag is the ring's shape: the number of counters (low 24
    /// bits, at most [`MAX_BUCKETS`] + 1) and their width in bytes (the
    /// high 8).
    block: Block,
}

/// The words of a ring's block: the length of a bucket (`BUCKET_MS`); the
/// index (Unix ms / bucket_ms) of the newest bucket in the ring (`NEWEST`);
/// the units in the ring (`SUM`); the counters from `COUNTS`, packed
/// little-endian into words at their width (counter 0 in the low bits of
/// the first word). With word 0, a 32-byte header: 61 counters of 2 bytes
/// take a block of 160 bytes, a size class of the server's allocator.
const BUCKET_MS: usize = 0;
const NEWEST: usize = 1;
const SUM: usize = 2;
const COUNTS: usize = 3;

/// The bits of the block's tag that hold the number of counters.
const LEN_MASK: u32 = (1 << 24) - 1;
const _: () = assert!(MAX_BUCKETS < LEN_MASK as u64);

impl PartialEq for HashWindowState {
    fn eq(&self, other: &Self) -> bool {
        let header = |s: &Self| (s.bucket_ms(), s.newest(), s.sum(), s.len());
        header(self) == header(other) && (0..self.len()).all(|i| self.get(i) == other.get(i))
    }
}

impl Eq for HashWindowState {}

impl InBlock for HashWindowState {
    fn into_block(self) -> Block {
        self.block
    }
    fn from_block(block: Block) -> Self {
        HashWindowState { block }
    }
}

/// The width, in bytes, that holds `value`: 2, 4 or 8.
pub fn width_for(value: u64) -> usize {
    if value <= u64::from(u16::MAX) {
        2
    } else if value <= u64::from(u32::MAX) {
        4
    } else {
        8
    }
}

/// The counters of a ring are all at one width: 2 bytes while every count
/// fits in a `u16`, widened as a whole to 4 and then 8 bytes when a count
/// would not fit (a forced call, or a limit lowered below what is held, can
/// leave counts above `limit`: the width follows the values, never the
/// limit). Adding widens; nothing on the hot path narrows (an idle ring, a
/// layout conversion and encoding 1's loader start at the narrowest width
/// that fits).
impl HashWindowState {
    /// A ring of `len` zero counters at `width` bytes each.
    fn zeroed(bucket_ms: u64, newest: u64, len: usize, width: usize) -> HashWindowState {
        let mut block = Block::zeroed(COUNTS + (len * width).div_ceil(8));
        let words = block.words_mut();
        words[BUCKET_MS] = bucket_ms;
        words[NEWEST] = newest;
        block.set_tag((width as u32) << 24 | len as u32);
        HashWindowState { block }
    }

    /// A ring of the counters `values`, at `width` bytes each (2, 4 or 8;
    /// `None` if a value does not fit).
    fn from_values(
        bucket_ms: u64,
        newest: u64,
        sum: u64,
        values: &[u64],
        width: usize,
    ) -> Option<HashWindowState> {
        if !matches!(width, 2 | 4 | 8) || values.iter().any(|&v| width_for(v) > width) {
            return None;
        }
        let mut state = HashWindowState::zeroed(bucket_ms, newest, values.len(), width);
        state.block.set(SUM, sum);
        for (slot, &value) in values.iter().enumerate() {
            state.put(slot, value);
        }
        Some(state)
    }

    fn bucket_ms(&self) -> u64 {
        self.block.get(BUCKET_MS)
    }
    /// Index (Unix ms / bucket_ms) of the newest bucket in the ring.
    pub(crate) fn newest(&self) -> u64 {
        self.block.get(NEWEST)
    }
    /// Units in the ring.
    pub(crate) fn sum(&self) -> u64 {
        self.block.get(SUM)
    }
    /// Counters in the ring.
    #[inline(always)]
    fn len(&self) -> usize {
        (self.block.tag() & LEN_MASK) as usize
    }

    /// Bytes per counter of the ring: 2 while every count fits in a `u16`,
    /// then 4, then 8 (see [`width_for`]).
    #[inline(always)]
    pub fn counter_width(&self) -> usize {
        (self.block.tag() >> 24) as usize
    }

    /// Bytes of the counters, at their width.
    pub fn counter_bytes(&self) -> usize {
        self.len() * self.counter_width()
    }

    /// Counter `slot`.
    #[inline(always)]
    fn get(&self, slot: usize) -> u64 {
        match self.counter_width() {
            2 => (self.block.get(COUNTS + slot / 4) >> (slot % 4 * 16)) & 0xffff,
            4 => (self.block.get(COUNTS + slot / 2) >> (slot % 2 * 32)) & 0xffff_ffff,
            _ => self.block.get(COUNTS + slot),
        }
    }

    /// Sets a counter to a value that fits the width.
    #[inline(always)]
    fn put(&mut self, slot: usize, value: u64) {
        let (at, shift, mask) = match self.counter_width() {
            2 => (COUNTS + slot / 4, slot % 4 * 16, 0xffff),
            4 => (COUNTS + slot / 2, slot % 2 * 32, 0xffff_ffff),
            _ => (COUNTS + slot, 0, u64::MAX),
        };
        debug_assert!(value <= mask);
        let word = self.block.get(at) & !(mask << shift) | value << shift;
        self.block.set(at, word);
    }

    /// Adds `units` to a counter, widening the whole ring first if the new
    /// count does not fit.
    fn add(&mut self, slot: usize, units: u64) {
        let value = self.get(slot) + units;
        let width = width_for(value);
        if width > self.counter_width() {
            *self = self.with_width(width);
        }
        self.put(slot, value);
    }

    /// Takes `units` (at most the count) from a counter.
    fn sub(&mut self, slot: usize, units: u64) {
        let value = self.get(slot) - units;
        self.put(slot, value);
    }

    /// The same ring with its counters at `width` bytes (which holds them).
    pub(crate) fn with_width(&self, width: usize) -> HashWindowState {
        let values: Vec<u64> = self.values().collect();
        HashWindowState::from_values(self.bucket_ms(), self.newest(), self.sum(), &values, width)
            .expect("the width holds every count")
    }

    /// Zeroes every counter, at the same width.
    fn clear(&mut self) {
        self.block.words_mut()[COUNTS..].fill(0);
    }

    pub(crate) fn values(&self) -> impl Iterator<Item = u64> + '_ {
        (0..self.len()).map(|i| self.get(i))
    }

    /// The counters, little-endian at their width (encoding 2's byte
    /// string): the counters' words' bytes, as they are packed.
    fn to_le_bytes(&self) -> Vec<u8> {
        let mut out: Vec<u8> = self.block.words()[COUNTS..]
            .iter()
            .flat_map(|w| w.to_le_bytes())
            .collect();
        out.truncate(self.counter_bytes());
        out
    }

    /// A ring of `len` counters of `width` bytes from `bytes`, which must
    /// hold exactly them.
    fn from_le_bytes(
        bucket_ms: u64,
        newest: u64,
        sum: u64,
        bytes: &[u8],
        len: usize,
        width: usize,
    ) -> Option<HashWindowState> {
        if !matches!(width, 2 | 4 | 8) || len.checked_mul(width)? != bytes.len() {
            return None;
        }
        let mut state = HashWindowState::zeroed(bucket_ms, newest, len, width);
        state.block.set(SUM, sum);
        for (i, chunk) in bytes.chunks(8).enumerate() {
            let mut word = [0; 8];
            word[..chunk.len()].copy_from_slice(chunk);
            state.block.set(COUNTS + i, u64::from_le_bytes(word));
        }
        Some(state)
    }
}

/// The hash window algorithm.
pub struct HashWindow;

/// The decision on a ring of the right layout, and the current bucket.
fn evaluate(
    state: &HashWindowState,
    params: &HashWindowParams,
    cost: u64,
    now: Micros,
) -> (Decision, u64) {
    let n = state.n();
    let bucket_us = params.bucket_ms * 1000;
    // Never before the newest bucket: a step back reopens nothing.
    let current = (now.as_us() / bucket_us).max(state.newest());
    let held = state.held_at(current);
    let leaves_after = |bucket: u64| {
        ((bucket + n) * bucket_us)
            .saturating_sub(now.as_us())
            .div_ceil(1000)
    };
    let remaining = params.limit.saturating_sub(held);
    if cost > 0 && cost <= remaining {
        let decision = Decision {
            allowed: true,
            limit: params.limit,
            remaining: remaining - cost,
            wait: Wait::Ms(0),
            reset_ms: leaves_after(current),
        };
        return (decision, current);
    }
    let wait = if cost == 0 {
        Wait::Ms(0)
    } else if cost > params.limit {
        Wait::Never
    } else {
        // Oldest first, until enough units have left (only on denial).
        let excess = held + cost - params.limit;
        let mut freed = 0;
        // (no bucket before the epoch: a window may reach back past it)
        let mut bucket = (current + 1).saturating_sub(n);
        loop {
            if bucket <= state.newest() {
                freed += state.count(bucket);
            }
            if freed >= excess {
                break;
            }
            bucket += 1;
        }
        Wait::Ms(leaves_after(bucket))
    };
    let decision = Decision {
        allowed: cost == 0,
        limit: params.limit,
        remaining,
        wait,
        reset_ms: if held == 0 {
            0
        } else {
            leaves_after(state.newest())
        },
    };
    (decision, current)
}

impl HashWindowState {
    fn n(&self) -> u64 {
        self.len() as u64
    }

    fn same_layout(&self, params: &HashWindowParams) -> bool {
        self.bucket_ms() == params.bucket_ms && self.n() == params.ring_len()
    }

    fn count(&self, bucket: u64) -> u64 {
        self.get((bucket % self.n()) as usize)
    }

    /// Units of the buckets still in the window when bucket `current` is
    /// the newest (`current >= newest`).
    fn held_at(&self, current: u64) -> u64 {
        let n = self.n();
        let newest = self.newest();
        if current >= newest + n {
            return 0;
        }
        // buckets newest-n+1 ..= current-n have left; bucket j - n has the
        // slot of j (counted directly: j - n is below zero in the first n
        // buckets since the epoch, which a clock or AT before 2004 reaches)
        let gone: u64 = (newest + 1..=current).map(|j| self.count(j)).sum();
        self.sum() - gone
    }

    /// Moves the ring so that `current` is the newest bucket.
    fn advance(&mut self, current: u64) {
        let n = self.n();
        let newest = self.newest();
        if current >= newest + n {
            self.clear();
            self.block.set(SUM, 0);
        } else {
            let mut sum = self.sum();
            for j in newest + 1..=current {
                let slot = (j % n) as usize;
                sum -= self.get(slot);
                self.put(slot, 0);
            }
            self.block.set(SUM, sum);
        }
        self.block.set(NEWEST, newest.max(current));
    }

    /// The same units in the ring of other parameters, at bucket time `now`.
    fn converted(&self, params: &HashWindowParams, now: Micros) -> HashWindowState {
        let mut new = HashWindow::idle(params, now);
        let n_new = new.n();
        let current = new.newest();
        let oldest_live = (current + 1).saturating_sub(n_new);
        for j in (self.newest() + 1).saturating_sub(self.n())..=self.newest() {
            let units = self.count(j);
            if units == 0 {
                continue;
            }
            let last_ms = (j + 1) * self.bucket_ms() - 1;
            let target = last_ms / params.bucket_ms;
            if target < oldest_live {
                continue;
            }
            if target > new.newest() {
                new.advance(target);
            }
            new.add((target % n_new) as usize, units);
            new.block.set(SUM, new.sum() + units);
        }
        new
    }

    /// Checks the invariants a loaded state must hold.
    pub(crate) fn is_valid(&self) -> bool {
        let n = self.n();
        // The ring has one bucket more than the window (`ring_len`): the
        // window, `(n - 1) * bucket_ms`, is what the parser bounds.
        n >= 1
            && (1..=super::MAX_PARAM).contains(&self.bucket_ms())
            && (n - 1)
                .checked_mul(self.bucket_ms())
                .is_some_and(|w| w <= super::MAX_PARAM)
            && self
                .newest()
                .checked_mul(self.bucket_ms())
                .is_some_and(|ms| ms <= super::MAX_STATE_MS)
            && self.values().try_fold(0u64, |a, c| a.checked_add(c)) == Some(self.sum())
            // a forced call may leave up to twice the limit counted
            && self.sum() <= 2 * super::MAX_PARAM
    }
}

/// `limit window_ms bucket_ms`.
impl Parameters for HashWindowParams {
    const INTEGERS: &'static [IntegerParam] = &[
        IntegerParam::positive("limit"),
        IntegerParam::positive("window_ms"),
        IntegerParam::positive("bucket_ms"),
    ];
    fn from_integers(values: &[u64]) -> Result<Self, ParamError> {
        HashWindowParams::new(values[0], values[1], values[2])
    }
    fn to_integers(&self, out: &mut impl FnMut(u64)) {
        out(self.limit);
        out(self.window_ms);
        out(self.bucket_ms);
    }
}

/// `bucket_ms, newest, sum`, the number of buckets in the ring, then their
/// counts.
impl StateFields for HashWindowState {
    fn to_fields(&self, out: &mut impl FnMut(u64)) {
        out(self.bucket_ms());
        out(self.newest());
        out(self.sum());
        out(self.n());
        for count in self.values() {
            out(count);
        }
    }

    /// Its block: the header and the counts at their width.
    fn heap_bytes(&self) -> usize {
        self.block.bytes()
    }

    fn from_fields(next: &mut impl FnMut() -> Option<u64>) -> Option<Self> {
        let bucket_ms = next()?;
        let newest = next()?;
        let sum = next()?;
        let len = next()?;
        // A ring holds one bucket more than its window.
        if len > MAX_BUCKETS + 1 {
            return None;
        }
        let mut counts = Vec::new();
        for _ in 0..len {
            counts.push(next()?);
        }
        // The narrowest width that holds them all.
        let width = width_for(counts.iter().copied().max().unwrap_or(0));
        let state = HashWindowState::from_values(bucket_ms, newest, sum, &counts, width)?;
        state.is_valid().then_some(state)
    }

    const COMPACT: bool = true;

    /// `bucket_ms, newest, sum`, the number of buckets, the width of a
    /// counter in bytes (2, 4 or 8), then the counters as one byte string,
    /// little-endian at that width (the string's length is checked against
    /// the two).
    fn to_compact(&self, out: &mut impl FnMut(u64), bytes: &mut impl FnMut(&[u8])) {
        out(self.bucket_ms());
        out(self.newest());
        out(self.sum());
        out(self.n());
        out(self.counter_width() as u64);
        bytes(&self.to_le_bytes());
    }

    fn from_compact(
        next: &mut impl FnMut() -> Option<u64>,
        bytes: &mut impl FnMut() -> Option<Vec<u8>>,
    ) -> Option<Self> {
        let bucket_ms = next()?;
        let newest = next()?;
        let sum = next()?;
        let len = next()?;
        let width = next()?;
        // A ring holds one bucket more than its window.
        if len > MAX_BUCKETS + 1 || !matches!(width, 2 | 4 | 8) {
            return None;
        }
        let state = HashWindowState::from_le_bytes(
            bucket_ms,
            newest,
            sum,
            &bytes()?,
            len as usize,
            width as usize,
        )?;
        state.is_valid().then_some(state)
    }
}

impl Algorithm for HashWindow {
    type Params = HashWindowParams;
    type State = HashWindowState;

    fn idle(params: &HashWindowParams, now: Micros) -> HashWindowState {
        HashWindowState::zeroed(
            params.bucket_ms,
            now.as_ms_floor() / params.bucket_ms,
            params.ring_len() as usize,
            2,
        )
    }

    fn apply(
        state: &mut HashWindowState,
        params: &HashWindowParams,
        cost: u64,
        now: Micros,
    ) -> Decision {
        if !state.same_layout(params) {
            let mut converted = state.converted(params, now);
            let decision = Self::apply(&mut converted, params, cost, now);
            if decision.allowed && cost > 0 {
                *state = converted;
            }
            return decision;
        }
        let (decision, current) = evaluate(state, params, cost, now);
        if decision.allowed && cost > 0 {
            let n = state.n();
            state.advance(current);
            state.add((current % n) as usize, cost);
            state.block.set(SUM, state.sum() + cost);
        }
        decision
    }

    fn decide(
        state: &HashWindowState,
        params: &HashWindowParams,
        cost: u64,
        now: Micros,
    ) -> Decision {
        if !state.same_layout(params) {
            return evaluate(&state.converted(params, now), params, cost, now).0;
        }
        evaluate(state, params, cost, now).0
    }

    fn force(
        state: &mut HashWindowState,
        params: &HashWindowParams,
        cost: u64,
        now: Micros,
    ) -> (Decision, bool) {
        if !state.same_layout(params) {
            let mut converted = state.converted(params, now);
            let (decision, changed) = Self::force(&mut converted, params, cost, now);
            if changed {
                *state = converted;
            }
            return (decision, changed);
        }
        let (decision, current) = evaluate(state, params, cost, now);
        if cost == 0 {
            return (decision, false);
        }
        let held = state.held_at(current);
        // At most a limit's worth of debt beyond empty.
        let take = if decision.allowed {
            cost
        } else {
            cost.min(params.limit.saturating_mul(2).saturating_sub(held))
        };
        if take == 0 {
            return (decision, false);
        }
        state.advance(current);
        let n = state.n();
        state.add((current % n) as usize, take);
        state.block.set(SUM, state.sum() + take);
        (decision, true)
    }

    fn refund(
        state: &mut HashWindowState,
        params: &HashWindowParams,
        units: u64,
        now: Micros,
    ) -> bool {
        if !state.same_layout(params) {
            let mut converted = state.converted(params, now);
            let changed = Self::refund(&mut converted, params, units, now);
            if changed {
                *state = converted;
            }
            return changed;
        }
        let bucket_us = params.bucket_ms * 1000;
        let current = (now.as_us() / bucket_us).max(state.newest());
        let mut left = units.min(state.held_at(current));
        if left == 0 {
            return false;
        }
        state.advance(current);
        // The current bucket first, then back in time.
        let n = state.n();
        for bucket in ((current + 1).saturating_sub(n)..=current).rev() {
            let slot = (bucket % n) as usize;
            let back = left.min(state.get(slot));
            state.sub(slot, back);
            state.block.set(SUM, state.sum() - back);
            left -= back;
            if left == 0 {
                break;
            }
        }
        true
    }

    fn idle_at_ms(state: &HashWindowState, _params: &HashWindowParams) -> u64 {
        (state.newest() + state.n()) * state.bucket_ms()
    }
}

/// The guarantee the contract checks (`crate::contract`).
impl crate::contract::Guarantee for HashWindow {
    fn limit(params: &HashWindowParams) -> u64 {
        params.limit()
    }
    fn check_admissions(p: &HashWindowParams, admitted: &[(u64, u64)]) {
        crate::contract::check_window_bound(p.limit(), p.window_ms(), admitted);
    }
}

#[cfg(test)]
mod tests {
    use super::super::testkit::{apply_checked, remaining_after_change};
    use super::super::{Request, MAX_PARAM};
    use super::*;
    use proptest::prelude::*;

    // A multiple of every bucket used below.
    const T0_MS: u64 = 1_700_000_000_000 - 1_700_000_000_000 % 3_600_000;

    fn params(limit: u64, window_ms: u64, bucket_ms: u64) -> HashWindowParams {
        HashWindowParams::new(limit, window_ms, bucket_ms).expect("valid parameters")
    }
    fn at(ms: u64) -> Micros {
        Micros::from_ms(T0_MS + ms)
    }
    fn hit(s: &mut HashWindowState, p: &HashWindowParams, cost: u64, now: Micros) -> Decision {
        apply_checked::<HashWindow>(s, p, cost, now)
    }

    #[test]
    fn parameters_are_checked_in_argument_order() {
        let range = |arg| ParamError::Range {
            arg,
            min: 1,
            max: MAX_PARAM,
        };
        assert_eq!(HashWindowParams::new(0, 0, 0), Err(range("limit")));
        assert_eq!(HashWindowParams::new(10, 0, 0), Err(range("window_ms")));
        assert_eq!(HashWindowParams::new(10, 1000, 0), Err(range("bucket_ms")));
        let p = params(10, 60_000, 1000);
        assert_eq!(
            (p.limit(), p.window_ms(), p.bucket_ms()),
            (10, 60_000, 1000)
        );
        assert_eq!(p.buckets(), 60);
    }

    #[test]
    fn buckets_divide_the_window_into_at_most_max_buckets() {
        assert_eq!(
            HashWindowParams::new(10, 1000, 300),
            Err(ParamError::BucketDoesNotDivide)
        );
        assert!(HashWindowParams::new(10, MAX_BUCKETS, 1).is_ok());
        assert_eq!(
            HashWindowParams::new(10, MAX_BUCKETS + 1, 1),
            Err(ParamError::Range {
                arg: "window_ms / bucket_ms",
                min: 1,
                max: MAX_BUCKETS
            })
        );
        // divisibility is checked first
        assert_eq!(
            HashWindowParams::new(10, 2_000_001, 2),
            Err(ParamError::BucketDoesNotDivide)
        );
    }

    #[test]
    fn sixty_one_second_buckets() {
        let p = params(10, 60_000, 1000);
        let mut s = HashWindow::idle(&p, at(0));
        assert!(hit(&mut s, &p, 6, at(500)).allowed);
        assert!(hit(&mut s, &p, 4, at(30_500)).allowed);
        let d = hit(&mut s, &p, 1, at(59_999));
        assert!(!d.allowed);
        // bucket 0 leaves the window at 61 s: the window (0.5 s, 60.5 s]
        // still reaches into it
        assert_eq!((d.wait, d.reset_ms), (Wait::Ms(1001), 31_001));
        assert!(!hit(&mut s, &p, 1, at(60_999)).allowed);
        let d = hit(&mut s, &p, 6, at(61_000));
        assert_eq!((d.allowed, d.remaining), (true, 0));
        let d = hit(&mut s, &p, 1, at(61_000));
        assert_eq!(d.wait, Wait::Ms(30_000));
    }

    #[test]
    fn a_long_idle_empties_the_ring() {
        let p = params(3, 1000, 100);
        let mut s = HashWindow::idle(&p, at(0));
        hit(&mut s, &p, 3, at(0));
        let d = hit(&mut s, &p, 3, at(5000));
        assert!(d.allowed);
        assert_eq!(s.sum(), 3);
    }

    #[test]
    fn a_backwards_clock_never_frees_units() {
        let p = params(2, 1000, 100);
        let mut s = HashWindow::idle(&p, at(5000));
        hit(&mut s, &p, 2, at(5050));
        assert!(!hit(&mut s, &p, 1, at(3000)).allowed);
        assert!(!hit(&mut s, &p, 1, at(6099)).allowed);
        assert!(hit(&mut s, &p, 1, at(6100)).allowed);
    }

    #[test]
    fn new_bucket_sizes_keep_the_units() {
        let a = params(10, 60_000, 1000);
        let b = params(10, 60_000, 10_000);
        let mut s = HashWindow::idle(&a, at(0));
        hit(&mut s, &a, 7, at(12_300));
        // the 7 units now sit in the 10 s bucket [10 s, 20 s), which
        // leaves the 60 s window at 80 s
        let d = hit(&mut s, &b, 4, at(12_400));
        assert!(!d.allowed);
        assert_eq!(d.remaining, 3);
        assert_eq!(d.wait, Wait::Ms(80_000 - 12_400));
        // shrinking the window to 1 s: the units may date from 12.999 s, so
        // they sit in the 100 ms bucket [12.9 s, 13 s), which leaves at 14 s
        let c = params(10, 1000, 100);
        assert!(!hit(&mut s, &c, 10, at(13_999)).allowed);
        assert!(hit(&mut s, &c, 10, at(14_000)).allowed);
    }

    /// The SPEC's reading of a parameter change: the buckets are kept, so a
    /// raised limit is room at once (10 held of 10, raised to 100: 90 left,
    /// and 90 more are admitted).
    #[test]
    fn a_raised_limit_adds_room_at_once() {
        let left = remaining_after_change::<HashWindow>(
            &params(10, 60_000, 1000),
            &params(100, 60_000, 1000),
            10,
            at(30_500),
        );
        assert_eq!(left, 90);
    }

    /// 10 held of 100, lowered to 20: 10 left, not 20.
    #[test]
    fn a_lowered_limit_applies_at_once() {
        let left = remaining_after_change::<HashWindow>(
            &params(100, 60_000, 1000),
            &params(20, 60_000, 1000),
            10,
            at(30_500),
        );
        assert_eq!(left, 10);
    }

    /// Found by fuzzing: in the first `n` buckets since the epoch (a clock
    /// or `AT` before `window_ms` after 1970), moving the ring forward read
    /// the wrong slots, freeing units still in the window; and a denial's
    /// wait started its search before bucket 0 (an overflow).
    #[test]
    fn a_window_reaching_back_past_the_epoch_keeps_its_units() {
        let p = params(90, 1000, 10);
        let mut s = HashWindow::idle(&p, Micros::from_us(10_000));
        assert!(hit(&mut s, &p, 2, Micros::from_us(10_000)).allowed);
        let d = hit(&mut s, &p, 32, Micros::from_us(250_000));
        assert_eq!((d.allowed, d.remaining), (true, 56));
        let d = hit(&mut s, &p, 57, Micros::from_us(250_000));
        assert!(!d.allowed);
        // the 2 units of bucket 1 leave the window at 1020 ms
        assert_eq!(d.wait, Wait::Ms(1020 - 250));
        assert!(hit(&mut s, &p, 57, Micros::from_us(1_020_000)).allowed);
    }

    #[test]
    fn huge_parameters_do_not_overflow() {
        let p = params(MAX_PARAM, 1 << 40, 1 << 40);
        let mut s = HashWindow::idle(&p, at(0));
        assert!(hit(&mut s, &p, MAX_PARAM, at(0)).allowed);
        // the unit's bucket leaves the window one bucket after it ends
        let bucket_end = (T0_MS / (1 << 40) + 1) * (1 << 40);
        let d = hit(&mut s, &p, 1, at(0));
        assert_eq!(d.wait, Wait::Ms(bucket_end + (1 << 40) - T0_MS));
    }

    /// The same ring with every counter at 8 bytes: the u64 ring every
    /// build before compact counters kept, the model of the widths' tests.
    fn at_u64(s: &HashWindowState) -> HashWindowState {
        s.with_width(8)
    }

    fn widest_count(s: &HashWindowState) -> u64 {
        s.values().max().unwrap_or(0)
    }

    /// Encoding 2's form: the same counters, at the same width, byte for
    /// byte.
    fn compact_round_trip(s: &HashWindowState) {
        let mut fields = Vec::new();
        let mut string = Vec::new();
        s.to_compact(&mut |f| fields.push(f), &mut |b| string = b.to_vec());
        assert_eq!(fields[4] as usize, s.counter_width());
        assert_eq!(string.len(), s.counter_bytes());
        let mut next = fields.iter().copied();
        let mut strings = Some(string).into_iter();
        let back =
            HashWindowState::from_compact(&mut || next.next(), &mut || strings.next()).unwrap();
        assert_eq!(back, *s);
        assert_eq!(back.counter_width(), s.counter_width());
    }

    #[test]
    fn counters_widen_as_a_whole_and_never_narrow_on_calls() {
        let p = params(MAX_PARAM, 6000, 1000);
        let mut s = HashWindow::idle(&p, at(0));
        assert_eq!((s.counter_width(), s.counter_bytes()), (2, 7 * 2));
        assert!(hit(&mut s, &p, 65_535, at(0)).allowed);
        assert_eq!(s.counter_width(), 2);
        assert!(hit(&mut s, &p, 1, at(0)).allowed);
        assert_eq!((s.counter_width(), s.counter_bytes()), (4, 7 * 4));
        assert!(hit(&mut s, &p, 1 << 32, at(1000)).allowed);
        assert_eq!(s.counter_width(), 8);
        // the big counts leave the window: the width stays
        assert!(hit(&mut s, &p, 1, at(60_000)).allowed);
        assert_eq!((s.sum(), s.counter_width()), (1, 8));
        compact_round_trip(&s);
        // encoding 1's loader and a layout conversion start narrow again
        let mut fields = Vec::new();
        s.to_fields(&mut |f| fields.push(f));
        let mut next = fields.into_iter();
        let loaded = HashWindowState::from_fields(&mut || next.next()).unwrap();
        assert_eq!((loaded.counter_width(), &loaded), (2, &s));
        let q = params(p.limit(), 6000, 2000);
        assert!(hit(&mut s, &q, 1, at(60_000)).allowed);
        assert_eq!(s.counter_width(), 2);
    }

    /// The SPEC's 60-bucket window with limit 1000: 61 counters of 2 bytes,
    /// in one block with the 32-byte header (word 0 and three words).
    #[test]
    fn a_sixty_bucket_window_keeps_two_bytes_a_bucket() {
        let p = params(1000, 60_000, 1000);
        let mut s = HashWindow::idle(&p, at(0));
        for i in 0..60 {
            assert!(hit(&mut s, &p, 16, at(i * 1000)).allowed);
        }
        assert_eq!(s.counter_bytes(), 122);
        assert_eq!(s.heap_bytes(), 32 + 128);
    }

    #[test]
    fn compact_forms_that_do_not_add_up_are_refused() {
        let load = |fields: &[u64], string: &[u8]| {
            let mut next = fields.iter().copied();
            let mut strings = Some(string.to_vec()).into_iter();
            HashWindowState::from_compact(&mut || next.next(), &mut || strings.next())
        };
        assert!(load(&[1000, 5, 3, 2, 2], &[1, 0, 2, 0]).is_some());
        assert!(load(&[1000, 5, 3, 2, 4], &[1, 0, 0, 0, 2, 0, 0, 0]).is_some());
        // a string too short or too long for len * width
        assert!(load(&[1000, 5, 3, 2, 2], &[1, 0, 2]).is_none());
        assert!(load(&[1000, 5, 3, 2, 2], &[1, 0, 2, 0, 0]).is_none());
        // widths other than 2, 4, 8; a sum the counters do not add up to
        for width in [0, 1, 3, 16, u64::MAX] {
            assert!(load(&[1000, 5, 3, 2, width], &[1, 0, 2, 0]).is_none());
        }
        assert!(load(&[1000, 5, 4, 2, 2], &[1, 0, 2, 0]).is_none());
        // a hostile length is refused before the string is read
        assert!(load(&[1000, 5, 0, u64::MAX, 8], &[]).is_none());
        assert!(load(&[1000, 5, 0, MAX_BUCKETS + 2, 2], &[]).is_none());
        // a missing string
        let mut next = [1000, 5, 0, 1, 2].into_iter();
        assert!(HashWindowState::from_compact(&mut || next.next(), &mut || None).is_none());
    }

    proptest! {
        /// Reference: recompute every bucket's sum from a log of admissions.
        #[test]
        fn agrees_with_recomputed_sums(
            limit in 1u64..20,
            (bucket_ms, n) in (1u64..300, 1u64..12),
            steps in prop::collection::vec((0u64..200_000, 0u64..5), 1..300),
        ) {
            let p = params(limit, bucket_ms * n, bucket_ms);
            let mut now = at(0).as_us() + 3;
            let mut s = HashWindow::idle(&p, Micros::from_us(now));
            let mut log: Vec<(u64, u64)> = Vec::new(); // (bucket, cost)
            for (dt, cost) in steps {
                now += dt;
                let current = now / 1000 / bucket_ms;
                // a unit counts while the window (t - W, t] reaches its bucket
                let held = |cur: u64| -> u64 {
                    log.iter().filter(|e| e.0 + n >= cur).map(|e| e.1).sum()
                };
                let used = held(current);
                let d = hit(&mut s, &p, cost, Micros::from_us(now));
                prop_assert_eq!(d.allowed, cost == 0 || used + cost <= limit);
                prop_assert_eq!(d.remaining, limit.saturating_sub(used) - if d.allowed { cost } else { 0 });
                if d.allowed && cost > 0 {
                    log.push((current, cost));
                } else if !d.allowed && cost <= limit {
                    let Wait::Ms(w) = d.wait else { panic!("finite wait expected") };
                    let later = (now + w * 1000) / 1000 / bucket_ms;
                    prop_assert!(held(later) + cost <= limit);
                    if w > 0 {
                        let earlier = (now + w * 1000 - 1000) / 1000 / bucket_ms;
                        prop_assert!(held(earlier) + cost > limit);
                    }
                }
                prop_assert!(s.is_valid());
            }
        }

        /// At the instant of any change (limit, window, buckets or all), what
        /// is left is the new limit minus the units held, at least 0: the
        /// units move to the new bucket holding their old bucket's end,
        /// which is not yet out of the new window.
        #[test]
        fn a_change_keeps_what_is_held(
            a in (1u64..MAX_PARAM, 1u64..1_000_000, 1u64..50),
            b in (1u64..MAX_PARAM, 1u64..1_000_000, 1u64..50),
            used in any::<u64>(),
            dt in 0u64..100_000_000_000,
        ) {
            let pa = params(a.0, a.1 * a.2, a.1);
            let pb = params(b.0, b.1 * b.2, b.1);
            let used = used % (pa.limit + 1);
            let now = at(0).saturating_add_us(dt);
            let left = remaining_after_change::<HashWindow>(&pa, &pb, used, now);
            prop_assert_eq!(left, pb.limit.saturating_sub(used));
        }

        /// Compact counters against the u64 model, on one layout: the same
        /// decisions and counts, and the width is the narrowest that held
        /// every count so far (widened as counts grew, never narrowed), for
        /// costs near 65535 and 2^32, forced calls and refunds.
        #[test]
        fn compact_counters_agree_with_u64_counters(
            limit in prop_oneof![60_000u64..70_000, 4_294_960_000u64..4_294_975_000, 1..MAX_PARAM],
            (bucket_ms, n) in (1u64..300, 1u64..8),
            steps in prop::collection::vec((0u64..400_000, 0u8..4, 0u64..1100, 0u64..3), 1..120),
        ) {
            let p = params(limit, bucket_ms * n, bucket_ms);
            let mut now = at(0).as_us() + 3;
            let mut s = HashWindow::idle(&p, Micros::from_us(now));
            let mut model = at_u64(&s);
            let mut widest = 2;
            for (dt, kind, share, delta) in steps {
                now += dt;
                // a share of the limit, give or take a unit: near the edges
                let units = (limit / 1000 * share + delta).saturating_sub(1);
                let request = match kind {
                    0 | 1 => Request::Cost(units),
                    2 => Request::Force(units),
                    _ => Request::Refund(units),
                };
                let t = Micros::from_us(now);
                let got = crate::run::<HashWindow>(&mut s, &p, request, t);
                let want = crate::run::<HashWindow>(&mut model, &p, request, t);
                prop_assert_eq!(got, want);
                prop_assert_eq!(&s, &model);
                prop_assert_eq!(model.counter_width(), 8);
                widest = widest.max(width_for(widest_count(&model)));
                prop_assert_eq!(s.counter_width(), widest);
                prop_assert_eq!(s.counter_bytes(), s.len() * widest);
                prop_assert_eq!(s.heap_bytes(), 8 * (4 + s.counter_bytes().div_ceil(8)));
                prop_assert!(s.is_valid());
                compact_round_trip(&s);
            }
        }

        /// The same across parameter changes (a lowered limit, other
        /// buckets): a conversion may start narrower, but a ring is never
        /// too narrow for its counts.
        #[test]
        fn compact_counters_agree_across_changes(
            layouts in prop::collection::vec(
                (prop_oneof![60_000u64..70_000, 4_294_960_000u64..4_294_975_000, 1..MAX_PARAM],
                 1u64..300, 1u64..8),
                1..4,
            ),
            steps in prop::collection::vec(
                (0u64..400_000, 0u8..4, 0u64..1100, 0u64..3, 0usize..4), 1..120),
        ) {
            let layouts: Vec<HashWindowParams> =
                layouts.iter().map(|&(l, b, n)| params(l, b * n, b)).collect();
            let mut now = at(0).as_us() + 3;
            let mut s = HashWindow::idle(&layouts[0], Micros::from_us(now));
            let mut model = at_u64(&s);
            for (dt, kind, share, delta, which) in steps {
                now += dt;
                let p = &layouts[which % layouts.len()];
                let units = (p.limit() / 1000 * share + delta).saturating_sub(1);
                let request = match kind {
                    0 | 1 => Request::Cost(units),
                    2 => Request::Force(units),
                    _ => Request::Refund(units),
                };
                let t = Micros::from_us(now);
                let got = crate::run::<HashWindow>(&mut s, p, request, t);
                let want = crate::run::<HashWindow>(&mut model, p, request, t);
                prop_assert_eq!(got, want);
                prop_assert_eq!(&s, &model);
                prop_assert!(s.counter_width() >= width_for(widest_count(&s)));
                prop_assert!(s.is_valid());
                compact_round_trip(&s);
                // a conversion rebuilt the model's ring: back to 8 bytes
                model = at_u64(&model);
            }
        }

        #[test]
        fn parameter_changes_never_lose_recent_units(
            a in (1u64..50, 1u64..10),
            b in (1u64..50, 1u64..10),
            used in 1u64..20,
            dt in 0u64..2_000_000,
        ) {
            let pa = params(100, a.0 * a.1, a.0);
            let pb = params(100, b.0 * b.1, b.0);
            let mut s = HashWindow::idle(&pa, at(0));
            hit(&mut s, &pa, used, at(0));
            let now = at(0).saturating_add_us(dt);
            let d = hit(&mut s, &pb, 0, now);
            // the units were admitted in the old bucket holding T0: under the
            // new layout they must still count while the new bucket holding
            // that bucket's last millisecond is live
            let last_ms = (T0_MS / a.0 + 1) * a.0 - 1;
            let target = last_ms / b.0;
            let current = (now.as_us() / 1000 / b.0).max(target);
            if target + b.1 >= current {
                prop_assert_eq!(d.remaining, 100 - used);
            }
        }
    }
}

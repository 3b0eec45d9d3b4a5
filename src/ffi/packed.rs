//! How a token bucket's (and a leaky bucket's) state sits in its key: in
//! the key's value pointer itself when it fits, else in a 16-byte block,
//! else in the 32 bytes of the whole state.
//!
//! The state is four integers (`TokenBucketState`): the theoretical arrival
//! time in whole microseconds (`tat_us`) and in ticks below one
//! (`tat_frac < refill_count`), and the refill rate the TAT is expressed in
//! (`refill_count` per `refill_ms`), which a call under other parameters
//! needs to carry what was consumed over. Kept as they are, they take a
//! 32-byte block beside the server's own 32 bytes of wrappers: 165 bytes a
//! key, against 118 for the smallest key with a TTL (`SET k 12345678 PX`).
//!
//! A server has few distinct rates (one per limit its application defines),
//! so a rate is interned: a process-wide table gives each distinct
//! `(refill_count, refill_ms)` a small number, the first time a key stores
//! it. The forms, told apart by the two low bits of the pointer (a block is
//! aligned on 8 bytes at least, so those bits are 0 in its address):
//!
//! | form | low bits | holds | when |
//! |---|---|---|---|
//! | in the pointer | `..1` | rate number (12 bits), `tat_us` - 2020-01-01 (51 bits) | `refill_count` = 1 (so `tat_frac` = 0), one of the first 4,096 rates, a TAT from 2020 to 2091 |
//! | compact block | `.00` | `tat_us`, `tat_frac` (32 bits), rate number (32 bits): 16 bytes | `tat_frac` < 2^32, the rate interned |
//! | whole block | `.10` | the state as it is: 32 bytes | everything else (a rate table full, a TAT before 2020) |
//!
//! The table holds at most [`MAX_RATES`] rates (16 bytes each), never
//! forgets one (a key may still name it) and lives in the process only:
//! RDB, `DUMP`, the AOF and replicas get the state's four integers as
//! before (the types' encoding 1 is unchanged), so numbers never leave the
//! process, and a replica or a restarted server numbers rates as it meets
//! them. A forked child (`BGSAVE`) reads the table as it was at the fork,
//! which is all its keys name.
//!
//! Commands see only the state (`Repr::with_mut` unpacks it on the stack and
//! packs it back): the algorithms do not know the packing exists.
//!
//! The fixed window and the calendar quota keep an instant and a count
//! (`CounterRepr`): in the pointer while the count is below 4,096 and the
//! instant between 2020 and 2091 (12 and 51 bits), else in a box of their 16
//! bytes.

use std::collections::HashMap;
use std::os::raw::c_void;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Mutex;

use super::datatype::{with_mut_stored, BlockSize, Boxed, Repr};
use super::thin::ThinRepr;
use crate::limiter::fixed_window::FixedWindowState;
use crate::limiter::leaky_bucket::LeakyBucketState;
use crate::limiter::quota::QuotaState;
use crate::limiter::token_bucket::TokenBucketState;
use crate::limiter::StateFields;

/// Most rates the process numbers; a key of any other rate keeps its whole
/// state in a block of 32 bytes.
pub const MAX_RATES: usize = 1 << 16;

/// Rates numbered below this fit in the pointer form.
const WORD_RATES: u32 = 1 << 12;

/// 2020-01-01T00:00:00Z in Unix microseconds: the origin of the TAT in the
/// pointer form.
const WORD_EPOCH_US: u64 = 1_577_836_800_000_000;

/// Bits of the TAT in the pointer form: 2^51 us, 71 years from 2020.
const WORD_TAT_BITS: u32 = 51;

const TAG_WORD: usize = 0b01;
const TAG_WHOLE: usize = 0b10;
const TAG_MASK: usize = 0b11;

const _: () = assert!(
    usize::BITS == 64,
    "the pointer form packs 64 bits into a value pointer"
);

/// The process's numbered rates: `RATES[n]` is rate `n`; `INDEX` finds the
/// number of a rate (under its lock, taken only when a key stores a rate
/// other than the one it held, and not even then when it is the rate the
/// last such key stored).
struct Rates {
    len: AtomicUsize,
    count: [AtomicU64; MAX_RATES],
    ms: [AtomicU64; MAX_RATES],
}

static RATES: Rates = Rates {
    len: AtomicUsize::new(0),
    count: [const { AtomicU64::new(0) }; MAX_RATES],
    ms: [const { AtomicU64::new(0) }; MAX_RATES],
};

static INDEX: Mutex<Option<HashMap<(u64, u64), u32>>> = Mutex::new(None);

thread_local! {
    /// The rate most recently numbered on this thread, and its number.
    static LAST: std::cell::Cell<(u64, u64, u32)> = const { std::cell::Cell::new((0, 0, 0)) };
}

/// Rate `n`: `(refill_count, refill_ms)`.
#[inline(always)]
fn rate(n: u32) -> (u64, u64) {
    let n = n as usize;
    debug_assert!(n < RATES.len.load(Ordering::Acquire));
    (
        RATES.count[n].load(Ordering::Acquire),
        RATES.ms[n].load(Ordering::Acquire),
    )
}

/// The number of rate `(count, ms)`, numbering it if it is new; `None`
/// once the table is full.
#[inline]
fn number(count: u64, ms: u64) -> Option<u32> {
    let (last_count, last_ms, last) = LAST.with(|l| l.get());
    if (last_count, last_ms) == (count, ms) && count != 0 {
        return Some(last);
    }
    let n = number_slow(count, ms)?;
    LAST.with(|l| l.set((count, ms, n)));
    Some(n)
}

#[cold]
fn number_slow(count: u64, ms: u64) -> Option<u32> {
    let mut index = INDEX
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    let index = index.get_or_insert_with(HashMap::new);
    if let Some(&n) = index.get(&(count, ms)) {
        return Some(n);
    }
    let n = RATES.len.load(Ordering::Relaxed);
    if n >= MAX_RATES {
        return None;
    }
    RATES.count[n].store(count, Ordering::Release);
    RATES.ms[n].store(ms, Ordering::Release);
    RATES.len.store(n + 1, Ordering::Release);
    index.insert((count, ms), n as u32);
    Some(n as u32)
}

/// Rates numbered so far (`INFO ratelimit`'s `bucket_rates`).
pub fn rates() -> usize {
    RATES.len.load(Ordering::Relaxed)
}

/// A GCRA state's four integers: `tat_us, tat_frac, refill_count,
/// refill_ms`, as `StateFields` lists them.
pub trait Gcra: StateFields + Clone + 'static {
    fn to_parts(&self) -> [u64; 4];
    fn from_parts(parts: [u64; 4]) -> Option<Self>;
}

macro_rules! gcra {
    ($($state:ty),+) => {
        $(impl Gcra for $state {
            #[inline(always)]
            fn to_parts(&self) -> [u64; 4] {
                <$state>::to_parts(self)
            }
            #[inline(always)]
            fn from_parts(parts: [u64; 4]) -> Option<Self> {
                <$state>::from_parts(parts)
            }
        })+
    };
}

gcra!(TokenBucketState, LeakyBucketState);

#[inline(always)]
fn parts<S: Gcra>(state: &S) -> [u64; 4] {
    state.to_parts()
}

#[inline(always)]
fn from_parts<S: Gcra>(parts: [u64; 4]) -> S {
    // Only ever parts of a valid state, packed and unpacked exactly.
    match S::from_parts(parts) {
        Some(state) => state,
        None => unreachable!("a packed bucket state unpacks to a valid state"),
    }
}

/// The 16-byte form.
#[derive(Clone, Copy)]
#[repr(C, align(8))]
struct Compact {
    tat_us: u64,
    tat_frac: u32,
    rate: u32,
}

/// The form `parts` packs into, with the rate's number if it has one
/// (`known`: the number of the rate the state held before, if it is the
/// same rate).
enum Form {
    Word(usize),
    Compact(Compact),
    Whole,
}

#[inline(always)]
fn form_of(parts: [u64; 4], known: Option<(u64, u64, u32)>) -> Form {
    let [tat_us, tat_frac, count, ms] = parts;
    let n = match known {
        Some((c, m, n)) if (c, m) == (count, ms) => Some(n),
        _ => number(count, ms),
    };
    let Some(n) = n else {
        return Form::Whole;
    };
    if count == 1 && n < WORD_RATES {
        if let Some(offset) = tat_us.checked_sub(WORD_EPOCH_US) {
            if offset < 1 << WORD_TAT_BITS {
                return Form::Word(((offset as usize) << 13) | ((n as usize) << 1) | TAG_WORD);
            }
        }
    }
    match u32::try_from(tat_frac) {
        Ok(tat_frac) => Form::Compact(Compact {
            tat_us,
            tat_frac,
            rate: n,
        }),
        Err(_) => Form::Whole,
    }
}

/// What a value pointer of the bucket holds, and the rate's number.
enum Held {
    Word([u64; 4], u32),
    Compact(*mut Compact),
    Whole(*mut c_void),
}

#[inline(always)]
fn held(ptr: *const c_void) -> Held {
    let bits = ptr as usize;
    if bits & TAG_WORD != 0 {
        let n = ((bits >> 1) & (WORD_RATES as usize - 1)) as u32;
        let tat_us = WORD_EPOCH_US + (bits >> 13) as u64;
        let (count, ms) = rate(n);
        Held::Word([tat_us, 0, count, ms], n)
    } else if bits & TAG_MASK == TAG_WHOLE {
        Held::Whole((bits & !TAG_MASK) as *mut c_void)
    } else {
        Held::Compact(bits as *mut Compact)
    }
}

#[inline(always)]
fn unpack_compact(c: &Compact) -> [u64; 4] {
    let (count, ms) = rate(c.rate);
    [c.tat_us, c.tat_frac as u64, count, ms]
}

/// A new pointer for `state` in `form`.
#[inline(always)]
fn place<S: Gcra>(state: S, form: Form) -> *mut c_void {
    match form {
        Form::Word(bits) => bits as *mut c_void,
        Form::Compact(c) => Box::into_raw(Box::new(c)).cast(),
        Form::Whole => {
            let bits = Box::into_raw(Box::new(state)) as usize;
            (bits | TAG_WHOLE) as *mut c_void
        }
    }
}

/// The representation of a GCRA state (token and leaky buckets).
pub struct BucketRepr;

// SAFETY: a pointer form always has its low bit set (never null), a block is
// a box (never null); each function tells the forms apart by the low bits,
// which `place` sets, and frees a block once: `free`, or `with_mut` when it
// replaces it.
unsafe impl<S: Gcra> Repr<S> for BucketRepr {
    #[inline(always)]
    fn into_ptr(value: S) -> *mut c_void {
        let form = form_of(parts(&value), None);
        place(value, form)
    }

    #[inline(always)]
    unsafe fn with_mut<R>(
        ptr: *mut c_void,
        f: impl FnOnce(&mut S) -> R,
    ) -> (R, Option<*mut c_void>) {
        match held(ptr) {
            Held::Word(before, n) => {
                let mut state = from_parts::<S>(before);
                let result = f(&mut state);
                let after = parts(&state);
                if after == before {
                    return (result, None);
                }
                let form = form_of(after, Some((before[2], before[3], n)));
                (result, Some(place(state, form)))
            }
            Held::Compact(block) => {
                // SAFETY: a live compact block (the caller's contract).
                let compact = unsafe { &mut *block };
                let before = unpack_compact(compact);
                let mut state = from_parts::<S>(before);
                let result = f(&mut state);
                let after = parts(&state);
                if after == before {
                    return (result, None);
                }
                match form_of(after, Some((before[2], before[3], compact.rate))) {
                    Form::Compact(c) => {
                        *compact = c;
                        (result, None)
                    }
                    form => {
                        // SAFETY: the block, replaced by the new pointer.
                        drop(unsafe { Box::from_raw(block) });
                        (result, Some(place(state, form)))
                    }
                }
            }
            // A whole state stays whole (a full table, an odd TAT: rare).
            // SAFETY: a live `Box<S>` lent to no one else.
            Held::Whole(block) => (f(unsafe { &mut *block.cast::<S>() }), None),
        }
    }

    #[inline(always)]
    unsafe fn with_ref<R>(ptr: *const c_void, f: impl FnOnce(&S) -> R) -> R {
        match held(ptr) {
            Held::Word(parts, _) => f(&from_parts(parts)),
            // SAFETY: a live compact block.
            Held::Compact(block) => f(&from_parts(unpack_compact(unsafe { &*block }))),
            // SAFETY: a live `Box<S>`.
            Held::Whole(block) => f(unsafe { &*block.cast::<S>() }),
        }
    }

    unsafe fn free(ptr: *mut c_void) {
        match held(ptr) {
            Held::Word(..) => {}
            // SAFETY: a live block, given up.
            Held::Compact(block) => drop(unsafe { Box::from_raw(block) }),
            // SAFETY: a live `Box<S>`, given up.
            Held::Whole(block) => drop(unsafe { Box::from_raw(block.cast::<S>()) }),
        }
    }

    unsafe fn allocated(ptr: *const c_void, size_of: Option<BlockSize>) -> usize {
        let (block, size) = match held(ptr) {
            Held::Word(..) => return 0,
            Held::Compact(block) => (block.cast::<c_void>(), std::mem::size_of::<Compact>()),
            Held::Whole(block) => (block, std::mem::size_of::<S>()),
        };
        match size_of {
            // SAFETY: a block of the server's allocator.
            Some(size_of) => unsafe { size_of(block) },
            None => size,
        }
    }
}

/// A state of an instant and a count (fixed window: the last counted
/// call; calendar quota: the end of its period), as `StateFields` lists
/// them.
pub trait Counter: StateFields + Clone + 'static {
    fn to_parts(&self) -> [u64; 2];
    fn from_parts(parts: [u64; 2]) -> Option<Self>;
}

macro_rules! counter {
    ($($state:ty),+) => {
        $(impl Counter for $state {
            #[inline(always)]
            fn to_parts(&self) -> [u64; 2] {
                <$state>::to_parts(self)
            }
            #[inline(always)]
            fn from_parts(parts: [u64; 2]) -> Option<Self> {
                <$state>::from_parts(parts)
            }
        })+
    };
}

counter!(FixedWindowState, QuotaState);

/// Bits of the count in the pointer form of a counter.
const COUNT_BITS: u32 = 12;

/// The pointer form of a counter: its count (12 bits) and its instant
/// since 2020 (51 bits), if both fit.
#[inline(always)]
fn counter_word([at_us, count]: [u64; 2]) -> Option<usize> {
    let offset = at_us.checked_sub(WORD_EPOCH_US)?;
    (offset < 1 << WORD_TAT_BITS && count < 1 << COUNT_BITS)
        .then_some(((offset as usize) << (COUNT_BITS + 1)) | ((count as usize) << 1) | TAG_WORD)
}

#[inline(always)]
fn counter_parts(bits: usize) -> [u64; 2] {
    [
        WORD_EPOCH_US + (bits >> (COUNT_BITS + 1)) as u64,
        ((bits >> 1) & ((1 << COUNT_BITS) - 1)) as u64,
    ]
}

#[inline(always)]
fn counter_from_parts<S: Counter>(parts: [u64; 2]) -> S {
    match S::from_parts(parts) {
        Some(state) => state,
        None => unreachable!("a packed counter unpacks to a valid state"),
    }
}

/// The representation of a counter (fixed window, calendar quota): in the
/// value pointer while its count is below 4,096 and its instant between
/// 2020 and 2091, else in a box of its 16 bytes (where it then stays: a
/// window's count starts again at 0 at each window, and a key of a limit
/// that high would move at every window).
pub struct CounterRepr;

// SAFETY: the pointer form has its low bit set (never null); a box is
// aligned on 8 bytes, so its low bit is 0, and it is freed once: by `free`,
// or by `with_mut` when it replaces it (never: a box stays a box).
unsafe impl<S: Counter> Repr<S> for CounterRepr {
    #[inline(always)]
    fn into_ptr(value: S) -> *mut c_void {
        match counter_word(value.to_parts()) {
            Some(bits) => bits as *mut c_void,
            None => Box::into_raw(Box::new(value)).cast(),
        }
    }

    #[inline(always)]
    unsafe fn with_mut<R>(
        ptr: *mut c_void,
        f: impl FnOnce(&mut S) -> R,
    ) -> (R, Option<*mut c_void>) {
        let bits = ptr as usize;
        if bits & TAG_WORD == 0 {
            // SAFETY: a live `Box<S>` lent to no one else.
            return (f(unsafe { &mut *ptr.cast::<S>() }), None);
        }
        let mut state = counter_from_parts::<S>(counter_parts(bits));
        let result = f(&mut state);
        let after = state.to_parts();
        match counter_word(after) {
            Some(new) if new == bits => (result, None),
            Some(new) => (result, Some(new as *mut c_void)),
            None => (result, Some(Box::into_raw(Box::new(state)).cast())),
        }
    }

    #[inline(always)]
    unsafe fn with_ref<R>(ptr: *const c_void, f: impl FnOnce(&S) -> R) -> R {
        let bits = ptr as usize;
        if bits & TAG_WORD == 0 {
            // SAFETY: a live `Box<S>`.
            return f(unsafe { &*ptr.cast::<S>() });
        }
        f(&counter_from_parts(counter_parts(bits)))
    }

    unsafe fn free(ptr: *mut c_void) {
        if (ptr as usize) & TAG_WORD == 0 {
            // SAFETY: a live `Box<S>`, given up.
            drop(unsafe { Box::from_raw(ptr.cast::<S>()) });
        }
    }

    unsafe fn allocated(ptr: *const c_void, size_of: Option<BlockSize>) -> usize {
        if (ptr as usize) & TAG_WORD != 0 {
            return 0;
        }
        match size_of {
            // SAFETY: a block of the server's allocator.
            Some(size_of) => unsafe { size_of(ptr.cast_mut()) },
            None => std::mem::size_of::<S>(),
        }
    }
}

/// How each algorithm's state sits in its key: the token and leaky
/// buckets, the fixed window and the quota packed (this file: in the value
/// pointer itself when the state fits), the sliding log and the hash window
/// in one block behind a thin pointer (`thin.rs`), the concurrency limiter
/// in a box.
pub trait Packing: Sized {
    type Repr: Repr<Self>;
}

macro_rules! packing {
    ($($state:ty => $repr:ty),+ $(,)?) => {
        $(impl Packing for $state {
            type Repr = $repr;
        })+
    };
}

packing! {
    crate::limiter::token_bucket::TokenBucketState => BucketRepr,
    crate::limiter::leaky_bucket::LeakyBucketState => BucketRepr,
    crate::limiter::fixed_window::FixedWindowState => CounterRepr,
    crate::limiter::sliding_log::SlidingLogState => ThinRepr,
    crate::limiter::hash_window::HashWindowState => ThinRepr,
    crate::limiter::concurrency::ConcurrencyState => Boxed,
    crate::limiter::quota::QuotaState => CounterRepr,
}

/// A state held as a key holds it: behind the value pointer of its
/// representation ([`Packing`]), owned, and freed on drop. The in-memory key
/// space of the unit tests and the fuzz targets (`crate::commands::memory`)
/// keeps its states in these, so they run every packing as the server does.
#[cfg_attr(not(test), allow(dead_code))] // the module itself holds keys
pub struct Stored<S: Packing + 'static> {
    ptr: *mut c_void,
    _state: std::marker::PhantomData<S>,
}

#[cfg_attr(not(test), allow(dead_code))]
impl<S: Packing + 'static> Stored<S> {
    /// `value`, given to its representation.
    pub fn new(value: S) -> Self {
        Stored {
            ptr: S::Repr::into_ptr(value),
            _state: std::marker::PhantomData,
        }
    }

    /// Runs `f` on the state, lent mutably, as `Key::with_value` does (a
    /// panic in `f` is resumed once the value's new pointer is kept).
    pub fn with_mut<R>(&mut self, f: impl FnOnce(&mut S) -> R) -> R {
        let ptr = &mut self.ptr;
        // SAFETY: the live pointer this value owns, lent to no one else
        // (`&mut self`).
        unsafe { with_mut_stored::<S, S::Repr, R>(*ptr, f, |moved| *ptr = moved) }
    }

    /// Runs `f` on the state.
    pub fn with_ref<R>(&self, f: impl FnOnce(&S) -> R) -> R {
        // SAFETY: the live pointer this value owns, not lent mutably (`&self`).
        unsafe { S::Repr::with_ref(self.ptr, f) }
    }

    /// Bytes of the state outside the server's wrappers, as `MEMORY USAGE`
    /// counts them without the server's allocator (`heap_bytes`, the
    /// state's own count of what it owns beyond its size).
    pub fn memory(&self, heap_bytes: impl FnOnce(&S) -> usize) -> usize {
        // SAFETY: the live pointer this value owns.
        unsafe { S::Repr::memory(self.ptr, None, heap_bytes) }
    }
}

impl<S: Packing + 'static> Drop for Stored<S> {
    fn drop(&mut self) {
        // SAFETY: the live pointer this value owns, given up once.
        unsafe { S::Repr::free(self.ptr) }
    }
}

impl<S: Packing + std::fmt::Debug + 'static> std::fmt::Debug for Stored<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.with_ref(|state| state.fmt(f))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn state(tat_us: u64, tat_frac: u64, count: u64, ms: u64) -> TokenBucketState {
        let mut fields = [tat_us, tat_frac, count, ms].into_iter();
        TokenBucketState::from_fields(&mut || fields.next()).expect("a valid state")
    }

    /// The form a pointer has: 0 pointer, 1 compact, 2 whole.
    fn form(ptr: *const c_void) -> u8 {
        match held(ptr) {
            Held::Word(..) => 0,
            Held::Compact(_) => 1,
            Held::Whole(_) => 2,
        }
    }

    fn round_trip(s: TokenBucketState) -> (TokenBucketState, u8) {
        let ptr = <BucketRepr as Repr<TokenBucketState>>::into_ptr(s);
        // SAFETY: the pointer just made, freed once.
        unsafe {
            let back = <BucketRepr as Repr<TokenBucketState>>::with_ref(ptr, |s| *s);
            let f = form(ptr);
            <BucketRepr as Repr<TokenBucketState>>::free(ptr);
            (back, f)
        }
    }

    const NOW: u64 = 1_764_600_000_000_000; // 2025-12-01

    /// A stored state's memory is what its packing allocates: nothing for
    /// a bucket in the pointer, the one block of a sliding log.
    #[test]
    fn stored_states_count_what_their_packing_allocates() {
        use crate::limiter::sliding_log::{SlidingLogParams, SlidingLogState};
        use crate::limiter::{Algorithm, Micros, SlidingLog, StateFields};
        let bucket = Stored::new(state(NOW + 12_345, 0, 1, 60_000));
        assert_eq!(bucket.memory(TokenBucketState::heap_bytes), 0);
        let p = SlidingLogParams::new(10, 1000).unwrap();
        let mut log = Stored::new(SlidingLog::idle(&p, Micros::from_us(NOW)));
        assert_eq!(log.memory(SlidingLogState::heap_bytes), 48);
        for ms in 0..4 {
            let d = log.with_mut(|s| SlidingLog::apply(s, &p, 1, Micros::from_us(NOW + ms * 1000)));
            assert!(d.allowed);
        }
        // grown from 6 words to 8 (3 entries), then 16 (11 entries)
        assert_eq!(log.memory(SlidingLogState::heap_bytes), 128);
    }

    #[test]
    fn a_bucket_of_one_token_per_period_fits_in_the_pointer() {
        let s = state(NOW + 12_345, 0, 1, 60_000);
        assert_eq!(round_trip(s), (s, 0));
    }

    #[test]
    fn a_fractional_tat_takes_the_16_byte_block() {
        let s = state(NOW, 2, 3, 1000);
        assert_eq!(round_trip(s), (s, 1));
        let s = state(NOW, u32::MAX as u64, u32::MAX as u64 + 1, 1);
        assert_eq!(round_trip(s), (s, 1));
    }

    #[test]
    fn what_fits_nowhere_else_is_kept_whole() {
        let s = state(NOW, u32::MAX as u64 + 1, u32::MAX as u64 + 2, 1);
        assert_eq!(round_trip(s), (s, 2));
    }

    #[test]
    fn a_tat_outside_the_pointer_forms_span_takes_a_block() {
        for tat in [
            0,
            WORD_EPOCH_US - 1,
            WORD_EPOCH_US + (1 << WORD_TAT_BITS),
            u64::MAX,
        ] {
            let s = state(tat, 0, 1, 1000);
            assert_eq!(round_trip(s), (s, 1), "tat {tat}");
        }
        let s = state(WORD_EPOCH_US, 0, 1, 1000);
        assert_eq!(round_trip(s), (s, 0));
        let s = state(WORD_EPOCH_US + (1 << WORD_TAT_BITS) - 1, 0, 1, 1000);
        assert_eq!(round_trip(s), (s, 0));
    }

    /// Runs `f` on the value behind `ptr` as a key does, storing the new
    /// pointer when it moved.
    fn mutate(ptr: &mut *mut c_void, f: impl FnOnce(&mut TokenBucketState)) {
        // SAFETY: a live pointer of this representation.
        let ((), moved) = unsafe { <BucketRepr as Repr<TokenBucketState>>::with_mut(*ptr, f) };
        if let Some(moved) = moved {
            *ptr = moved;
        }
    }

    proptest! {
        /// Any valid state comes back as it went in, whatever its form, and
        /// a state changed in place (as a call changes it) moves between
        /// forms without losing anything.
        #[test]
        fn every_state_round_trips_and_moves_between_forms(
            states in prop::collection::vec(
                (
                    prop_oneof![Just(0u64), 0..u64::MAX, NOW..NOW + (1 << 40)],
                    prop_oneof![Just(1u64), 1..100u64, 1..crate::limiter::MAX_PARAM],
                    prop_oneof![Just(60_000u64), 1..crate::limiter::MAX_PARAM],
                    any::<u64>(),
                ),
                1..20,
            ),
        ) {
            let make = |(tat, count, ms, frac): (u64, u64, u64, u64)| state(tat, frac % count, count, ms);
            let first = make(states[0]);
            let mut ptr = <BucketRepr as Repr<TokenBucketState>>::into_ptr(first);
            let mut expected = first;
            for &next in &states[1..] {
                let next = make(next);
                // SAFETY: a live pointer.
                let seen = unsafe { <BucketRepr as Repr<TokenBucketState>>::with_ref(ptr, |s| *s) };
                prop_assert_eq!(seen, expected);
                mutate(&mut ptr, |s| *s = next);
                expected = next;
            }
            // SAFETY: a live pointer.
            let seen = unsafe { <BucketRepr as Repr<TokenBucketState>>::with_ref(ptr, |s| *s) };
            prop_assert_eq!(seen, expected);
            // SAFETY: the live pointer, freed once.
            unsafe { <BucketRepr as Repr<TokenBucketState>>::free(ptr) };
        }
    }

    fn window(last_us: u64, count: u64) -> FixedWindowState {
        FixedWindowState::from_parts([last_us, count]).expect("a valid state")
    }

    #[test]
    fn a_counter_fits_in_the_pointer_below_4096_and_takes_a_box_above() {
        type W = FixedWindowState;
        for (state, in_word) in [
            (window(NOW, 0), true),
            (window(NOW, 4095), true),
            (window(NOW, 4096), false),
            (window(WORD_EPOCH_US - 1, 1), false),
            (window(WORD_EPOCH_US + (1 << WORD_TAT_BITS), 1), false),
            (window(WORD_EPOCH_US + (1 << WORD_TAT_BITS) - 1, 4095), true),
        ] {
            let mut ptr = <CounterRepr as Repr<W>>::into_ptr(state);
            assert_eq!((ptr as usize) & TAG_WORD != 0, in_word, "{state:?}");
            // SAFETY: the pointer just made.
            let back = unsafe { <CounterRepr as Repr<W>>::with_ref(ptr, |s| *s) };
            assert_eq!(back, state);
            // A count that grows past 4,095 moves the state into a box.
            // SAFETY: a live pointer.
            let ((), moved) = unsafe {
                <CounterRepr as Repr<W>>::with_mut(ptr, |s| {
                    *s = window(s.to_parts()[0], 5000);
                })
            };
            if let Some(moved) = moved {
                ptr = moved;
            }
            assert_eq!((ptr as usize) & TAG_WORD, 0, "boxed: {state:?}");
            // SAFETY: a live pointer.
            let back = unsafe { <CounterRepr as Repr<W>>::with_ref(ptr, |s| *s) };
            assert_eq!(back, window(state.to_parts()[0], 5000));
            // SAFETY: the live pointer, freed once.
            unsafe { <CounterRepr as Repr<W>>::free(ptr) };
        }
    }

    proptest! {
        /// Any valid counter comes back as it went in, through any sequence
        /// of changes.
        #[test]
        fn every_counter_round_trips(
            steps in prop::collection::vec(
                (prop_oneof![Just(NOW), 0..crate::limiter::MAX_PARAM * 1000, NOW..NOW + (1 << 40)], prop_oneof![0..5000u64, 0..2 * crate::limiter::MAX_PARAM]),
                1..20,
            ),
        ) {
            type W = FixedWindowState;
            let first = window(steps[0].0, steps[0].1);
            let mut ptr = <CounterRepr as Repr<W>>::into_ptr(first);
            let mut expected = first;
            for &(at, count) in &steps[1..] {
                let next = window(at, count);
                // SAFETY: a live pointer.
                let seen = unsafe { <CounterRepr as Repr<W>>::with_ref(ptr, |s| *s) };
                prop_assert_eq!(seen, expected);
                // SAFETY: a live pointer.
                let ((), moved) = unsafe { <CounterRepr as Repr<W>>::with_mut(ptr, |s| *s = next) };
                if let Some(moved) = moved {
                    ptr = moved;
                }
                expected = next;
            }
            // SAFETY: a live pointer.
            let seen = unsafe { <CounterRepr as Repr<W>>::with_ref(ptr, |s| *s) };
            prop_assert_eq!(seen, expected);
            // SAFETY: the live pointer, freed once.
            unsafe { <CounterRepr as Repr<W>>::free(ptr) };
        }
    }

    #[test]
    fn a_state_left_unchanged_keeps_its_pointer() {
        let s = state(NOW, 1, 3, 1000);
        let mut ptr = <BucketRepr as Repr<TokenBucketState>>::into_ptr(s);
        let before = ptr;
        mutate(&mut ptr, |_| {});
        assert_eq!(ptr, before);
        // A compact block is rewritten in place.
        mutate(&mut ptr, |s| *s = state(NOW + 5, 2, 3, 1000));
        assert_eq!(ptr, before);
        // SAFETY: the live pointer, freed once.
        unsafe { <BucketRepr as Repr<TokenBucketState>>::free(ptr) };
    }
}

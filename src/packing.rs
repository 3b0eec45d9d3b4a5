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
//! This file is the safe part: the forms, the rate table and the bit layouts,
//! pure arithmetic on integers. The loans of the value pointer itself (a box
//! made, lent and freed) are `crate::ffi`'s (`src/ffi/packed.rs`), which
//! decodes a pointer into a form with these functions.
//!
//! The fixed window and the calendar quota keep an instant and a count
//! (`CounterRepr`): in the pointer while the count is below 4,096 and the
//! instant between 2020 and 2091 (12 and 51 bits), else in a box of their 16
//! bytes.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Mutex;

use crate::limiter::fixed_window::FixedWindowState;
use crate::limiter::leaky_bucket::LeakyBucketState;
use crate::limiter::quota::QuotaState;
use crate::limiter::token_bucket::TokenBucketState;
use crate::limiter::StateFields;

/// Most rates the process numbers; a key of any other rate keeps its whole
/// state in a block of 32 bytes.
pub const MAX_RATES: usize = 1 << 16;

/// Rates numbered below this fit in the pointer form.
pub const WORD_RATES: u32 = 1 << 12;

/// 2020-01-01T00:00:00Z in Unix microseconds: the origin of the TAT in the
/// pointer form.
pub const WORD_EPOCH_US: u64 = 1_577_836_800_000_000;

/// Bits of the TAT in the pointer form: 2^51 us, 71 years from 2020.
pub const WORD_TAT_BITS: u32 = 51;

pub const TAG_WORD: usize = 0b01;
pub const TAG_WHOLE: usize = 0b10;
pub const TAG_MASK: usize = 0b11;

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
pub fn rate(n: u32) -> (u64, u64) {
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
pub fn number(count: u64, ms: u64) -> Option<u32> {
    let (last_count, last_ms, last) = LAST.with(|l| l.get());
    if (last_count, last_ms) == (count, ms) && count != 0 {
        return Some(last);
    }
    let n = number_slow(count, ms)?;
    LAST.with(|l| l.set((count, ms, n)));
    Some(n)
}

#[cold]
pub fn number_slow(count: u64, ms: u64) -> Option<u32> {
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
pub fn parts<S: Gcra>(state: &S) -> [u64; 4] {
    state.to_parts()
}

#[inline(always)]
pub fn from_parts<S: Gcra>(parts: [u64; 4]) -> S {
    // Only ever parts of a valid state, packed and unpacked exactly.
    match S::from_parts(parts) {
        Some(state) => state,
        None => unreachable!("a packed bucket state unpacks to a valid state"),
    }
}

/// The 16-byte form.
#[derive(Clone, Copy)]
#[repr(C, align(8))]
pub struct Compact {
    pub tat_us: u64,
    pub tat_frac: u32,
    pub rate: u32,
}

/// The form `parts` packs into, with the rate's number if it has one
/// (`known`: the number of the rate the state held before, if it is the
/// same rate).
pub enum Form {
    Word(usize),
    Compact(Compact),
    Whole,
}

#[inline(always)]
pub fn form_of(parts: [u64; 4], known: Option<(u64, u64, u32)>) -> Form {
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

#[inline(always)]
pub fn unpack_compact(c: &Compact) -> [u64; 4] {
    let (count, ms) = rate(c.rate);
    [c.tat_us, c.tat_frac as u64, count, ms]
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
pub const COUNT_BITS: u32 = 12;

/// The pointer form of a counter: its count (12 bits) and its instant
/// since 2020 (51 bits), if both fit.
#[inline(always)]
pub fn counter_word([at_us, count]: [u64; 2]) -> Option<usize> {
    let offset = at_us.checked_sub(WORD_EPOCH_US)?;
    (offset < 1 << WORD_TAT_BITS && count < 1 << COUNT_BITS)
        .then_some(((offset as usize) << (COUNT_BITS + 1)) | ((count as usize) << 1) | TAG_WORD)
}

#[inline(always)]
pub fn counter_parts(bits: usize) -> [u64; 2] {
    [
        WORD_EPOCH_US + (bits >> (COUNT_BITS + 1)) as u64,
        ((bits >> 1) & ((1 << COUNT_BITS) - 1)) as u64,
    ]
}

#[inline(always)]
pub fn counter_from_parts<S: Counter>(parts: [u64; 2]) -> S {
    match S::from_parts(parts) {
        Some(state) => state,
        None => unreachable!("a packed counter unpacks to a valid state"),
    }
}

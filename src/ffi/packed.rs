//! The value pointer's loans for the packed states: a token or leaky
//! bucket's, a fixed window's and a quota's state in the key's value pointer
//! itself when it fits, else in a block. The forms, the rate table and the
//! bit layouts are `crate::packing` (safe arithmetic); this file makes,
//! lends and frees what a pointer holds. Which representation each state
//! has is said by its row in the table of algorithms (`src/algorithms.rs`).

use std::os::raw::c_void;

use super::datatype::{with_mut_stored, BlockSize, Repr};
use crate::packing::{
    counter_from_parts, counter_parts, counter_word, form_of, from_parts, parts, rate,
    unpack_compact, Compact, Counter, Form, Gcra, TAG_MASK, TAG_WHOLE, TAG_WORD, WORD_EPOCH_US,
    WORD_RATES,
};

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

/// A state held as a key holds it: behind the value pointer of its
/// representation `R` (the one its algorithm's row names), owned, and freed
/// on drop. The in-memory key
/// space of the unit tests and the fuzz targets (`crate::commands::memory`)
/// keeps its states in these, so they run every packing as the server does.
#[cfg_attr(not(test), allow(dead_code))] // the module itself holds keys
pub struct Stored<S: 'static, R: Repr<S>> {
    ptr: *mut c_void,
    _state: std::marker::PhantomData<(S, R)>,
}

#[cfg_attr(not(test), allow(dead_code))]
impl<S: 'static, R: Repr<S>> Stored<S, R> {
    /// `value`, given to its representation.
    pub fn new(value: S) -> Self {
        Stored {
            ptr: R::into_ptr(value),
            _state: std::marker::PhantomData,
        }
    }

    /// Runs `f` on the state, lent mutably, as `Key::with_value` does (a
    /// panic in `f` is resumed once the value's new pointer is kept).
    pub fn with_mut<T>(&mut self, f: impl FnOnce(&mut S) -> T) -> T {
        let ptr = &mut self.ptr;
        // SAFETY: the live pointer this value owns, lent to no one else
        // (`&mut self`).
        unsafe { with_mut_stored::<S, R, T>(*ptr, f, |moved| *ptr = moved) }
    }

    /// Runs `f` on the state.
    pub fn with_ref<T>(&self, f: impl FnOnce(&S) -> T) -> T {
        // SAFETY: the live pointer this value owns, not lent mutably (`&self`).
        unsafe { R::with_ref(self.ptr, f) }
    }

    /// Bytes of the state outside the server's wrappers, as `MEMORY USAGE`
    /// counts them without the server's allocator (`heap_bytes`, the
    /// state's own count of what it owns beyond its size).
    pub fn memory(&self, heap_bytes: impl FnOnce(&S) -> usize) -> usize {
        // SAFETY: the live pointer this value owns.
        unsafe { R::memory(self.ptr, None, heap_bytes) }
    }
}

impl<S: 'static, R: Repr<S>> Drop for Stored<S, R> {
    fn drop(&mut self) {
        // SAFETY: the live pointer this value owns, given up once.
        unsafe { R::free(self.ptr) }
    }
}

impl<S: std::fmt::Debug + 'static, R: Repr<S>> std::fmt::Debug for Stored<S, R> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.with_ref(|state| state.fmt(f))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limiter::fixed_window::FixedWindowState;
    use crate::limiter::token_bucket::TokenBucketState;
    use crate::limiter::StateFields;
    use crate::packing::*;
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
        let bucket = Stored::<_, BucketRepr>::new(state(NOW + 12_345, 0, 1, 60_000));
        assert_eq!(bucket.memory(TokenBucketState::heap_bytes), 0);
        let p = SlidingLogParams::new(10, 1000).unwrap();
        let mut log = Stored::<_, super::super::thin::ThinRepr>::new(SlidingLog::idle(
            &p,
            Micros::from_us(NOW),
        ));
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

//! How a sliding log's and a hash window's state sits in its key: the key's
//! value pointer is the address of the state's one block of words
//! ([`Block`]: a header and the entries or counters after it), a thin
//! pointer, where a box of the state would point at a header that points at
//! a buffer. A call over a large keyspace then misses the cache once, not
//! twice (`docs/benchmarks.md`).
//!
//! The low half of the block's word 0 is its length in words, written by
//! the core's `Block` alone, so the pointer and that word rebuild the
//! `Box<[u64]>` exactly as it was allocated. Commands see only the state: `with_mut`
//! rebuilds it on the stack around the block and gives back the block's new
//! address when a call moved it (a ring grown, shrunk or widened).
//!
//! RDB, `DUMP`, the AOF and replicas are untouched: they get the state's
//! fields, as they did when the state was boxed.

use std::mem::ManuallyDrop;
use std::os::raw::c_void;

use super::datatype::{BlockSize, Repr};
use crate::limiter::block::{Block, InBlock, LENGTH};

/// A state in one block behind a thin pointer.
pub struct ThinRepr;

/// The block's words, rebuilt from its address.
///
/// # Safety
/// `ptr` is a live value pointer made by [`ThinRepr`]: the first word of a
/// `Box<[u64]>` whose word 0 holds its length ([`LENGTH`]), lent to no one
/// else meanwhile.
#[inline(always)]
unsafe fn rebuild(ptr: *const c_void) -> ManuallyDrop<Box<[u64]>> {
    let first = ptr.cast::<u64>().cast_mut();
    // SAFETY: word 0 of a live block (the caller's contract) holds its
    // length.
    let len = (unsafe { *first } & LENGTH) as usize;
    // SAFETY: the block was a `Box<[u64]>` of `len` words at `first`, given
    // up by `into_ptr` or `with_mut`; `ManuallyDrop` keeps it from being
    // freed twice.
    ManuallyDrop::new(unsafe { Box::from_raw(std::ptr::slice_from_raw_parts_mut(first, len)) })
}

/// The state around a block rebuilt from its address.
#[inline(always)]
fn state<S: InBlock>(words: ManuallyDrop<Box<[u64]>>) -> ManuallyDrop<S> {
    match Block::from_boxed(ManuallyDrop::into_inner(words)) {
        Some(block) => ManuallyDrop::new(S::from_block(block)),
        // Word 0 holds the length it was read as: the block matches.
        None => unreachable!("a thin value pointer's block holds its length"),
    }
}

/// The address of a state's block, given up to the caller.
#[inline(always)]
fn address<S: InBlock>(state: S) -> *mut c_void {
    Box::into_raw(state.into_block().into_boxed())
        .cast::<u64>()
        .cast()
}

// SAFETY: a block is never empty (word 0 holds its length), so its address is
// a real allocation, never null; each function takes an address `into_ptr`
// or `with_mut` gave, whose block it rebuilds exactly (`rebuild`); the block
// a call moved away from is freed by the state's own reallocation, and the
// new address returned to be stored in its place.
unsafe impl<S: InBlock + 'static> Repr<S> for ThinRepr {
    #[inline(always)]
    fn into_ptr(value: S) -> *mut c_void {
        address(value)
    }

    #[inline(always)]
    unsafe fn with_mut<R>(
        ptr: *mut c_void,
        f: impl FnOnce(&mut S) -> R,
    ) -> (R, Option<*mut c_void>) {
        // SAFETY: a live value pointer of this representation (the caller's
        // contract), lent to no one else while `f` runs.
        let mut value = state::<S>(unsafe { rebuild(ptr) });
        let result = f(&mut value);
        let now = address(ManuallyDrop::into_inner(value));
        (result, (now != ptr).then_some(now))
    }

    #[inline(always)]
    unsafe fn with_ref<R>(ptr: *const c_void, f: impl FnOnce(&S) -> R) -> R {
        // SAFETY: a live value pointer, not lent mutably meanwhile; the
        // state is only read, and `ManuallyDrop` keeps the block allocated.
        let value = state::<S>(unsafe { rebuild(ptr) });
        f(&value)
    }

    unsafe fn free(ptr: *mut c_void) {
        // SAFETY: a live value pointer, given up: its block is freed once.
        drop(ManuallyDrop::into_inner(unsafe { rebuild(ptr) }));
    }

    unsafe fn allocated(ptr: *const c_void, size_of: Option<BlockSize>) -> usize {
        match size_of {
            // SAFETY: a block of the server's allocator.
            Some(size_of) => unsafe { size_of(ptr.cast_mut()) },
            None => {
                // SAFETY: a live value pointer: word 0 holds the block's length.
                let word = unsafe { *ptr.cast::<u64>() };
                (word & LENGTH) as usize * std::mem::size_of::<u64>()
            }
        }
    }

    /// The block is all the state owns: its allocation, as the allocator
    /// sized it.
    unsafe fn memory(
        ptr: *const c_void,
        size_of: Option<BlockSize>,
        _heap_bytes: impl FnOnce(&S) -> usize,
    ) -> usize {
        // SAFETY: a live value pointer (the caller's contract).
        unsafe { <Self as Repr<S>>::allocated(ptr, size_of) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limiter::hash_window::{HashWindowParams, HashWindowState};
    use crate::limiter::sliding_log::{SlidingLogParams, SlidingLogState};
    use crate::limiter::{Algorithm, HashWindow, Micros, SlidingLog};

    const NOW: Micros = Micros::from_us(1_764_600_000_000_000);

    /// A log whose block grows, wraps and shrinks behind one pointer, call
    /// after call, stays the state a box would have kept; the pointer moves
    /// only when the block does, and is freed once.
    #[test]
    fn a_log_keeps_its_state_behind_a_moving_pointer() {
        let p = SlidingLogParams::new(100_000, 1000).unwrap();
        let mut boxed = SlidingLog::idle(&p, NOW);
        let mut ptr = <ThinRepr as Repr<SlidingLogState>>::into_ptr(boxed.clone());
        let mut moves = 0;
        for i in 0..3000u64 {
            // a burst of distinct milliseconds, then a trickle: grow, shrink
            let now = NOW.saturating_add_us(if i < 2000 { i * 1000 } else { i * 100_000 });
            let want = SlidingLog::apply(&mut boxed, &p, 1 + i % 3, now);
            // SAFETY: the live pointer, lent to no one else.
            let (got, moved) = unsafe {
                <ThinRepr as Repr<SlidingLogState>>::with_mut(ptr, |s| {
                    SlidingLog::apply(s, &p, 1 + i % 3, now)
                })
            };
            assert_eq!(got, want);
            if let Some(moved) = moved {
                ptr = moved;
                moves += 1;
            }
            // SAFETY: the live pointer.
            let same =
                unsafe { <ThinRepr as Repr<SlidingLogState>>::with_ref(ptr, |s| *s == boxed) };
            assert!(same, "call {i}");
        }
        assert!(moves >= 10, "{moves} moves");
        // SAFETY: the live pointer; the block's length in word 0.
        unsafe {
            let bytes = <ThinRepr as Repr<SlidingLogState>>::memory(ptr, None, |_| 0);
            assert_eq!(bytes, boxed.clone().into_block().bytes());
            <ThinRepr as Repr<SlidingLogState>>::free(ptr);
        }
    }

    /// A hash window's counters widen (the block moves) behind the pointer.
    #[test]
    fn a_ring_widens_behind_its_pointer() {
        let p = HashWindowParams::new(1 << 40, 6000, 1000).unwrap();
        let ring = HashWindow::idle(&p, NOW);
        let ptr = <ThinRepr as Repr<HashWindowState>>::into_ptr(ring);
        // SAFETY: the live pointer, lent to no one else, then freed once.
        unsafe {
            let (d, moved) = <ThinRepr as Repr<HashWindowState>>::with_mut(ptr, |s| {
                HashWindow::apply(s, &p, 1 << 33, NOW)
            });
            assert!(d.allowed);
            let ptr = moved.expect("widened to 8 bytes a counter: a new block");
            let width = <ThinRepr as Repr<HashWindowState>>::with_ref(ptr, |s| s.counter_width());
            assert_eq!(width, 8);
            let (_, moved) = <ThinRepr as Repr<HashWindowState>>::with_mut(ptr, |s| {
                HashWindow::apply(s, &p, 1, NOW)
            });
            assert_eq!(moved, None, "a call in place keeps its block");
            <ThinRepr as Repr<HashWindowState>>::free(ptr);
        }
    }
}

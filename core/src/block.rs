//! One allocation for a state of variable size: a header and a body of
//! 64-bit words in a single `Box<[u64]>`.
//!
//! The sliding log (its header and its ring of entries) and the hash window
//! (its header and its counters) each keep their whole state in one
//! [`Block`]. A call then reads one block, where two allocations (a header
//! pointing at a buffer) cost a second cache miss on every call over a large
//! keyspace.
//!
//! The low 32 bits of word 0 are the block's own length in words, and
//! nothing in this crate writes them but [`Block`]'s constructors: the
//! crate reads and writes only the words after it, and the high 32 bits of
//! word 0 are the state's own (its tag). So a host may keep
//! a block behind a thin pointer (its first word's address, the module's
//! value pointer: `src/ffi/thin.rs`) and rebuild the `Box<[u64]>` from that
//! pointer and word 0 ([`Block::into_boxed`], [`Block::from_boxed`]).

/// Words of state in one allocation, with its length in the low half of
/// word 0 (see the module documentation).
#[derive(Clone, Debug)]
pub struct Block(Box<[u64]>);

impl Block {
    /// A block of `words` zeroed words after word 0 (fewer than 2^32 in
    /// all), its tag 0.
    pub(crate) fn zeroed(words: usize) -> Block {
        let mut all = vec![0; words + 1].into_boxed_slice();
        assert!(
            all.len() <= LENGTH as usize,
            "a block of 2^32 words or more"
        );
        all[0] = all.len() as u64;
        Block(all)
    }

    /// The high 32 bits of word 0: the state's own.
    #[inline(always)]
    pub(crate) fn tag(&self) -> u32 {
        (self.0[0] >> 32) as u32
    }

    /// Sets the high 32 bits of word 0, its length kept.
    #[inline(always)]
    pub(crate) fn set_tag(&mut self, tag: u32) {
        self.0[0] = u64::from(tag) << 32 | self.0[0] & LENGTH;
    }

    /// The words after word 0.
    #[inline(always)]
    pub(crate) fn words(&self) -> &[u64] {
        &self.0[1..]
    }

    /// The words after word 0, to change.
    #[inline(always)]
    pub(crate) fn words_mut(&mut self) -> &mut [u64] {
        &mut self.0[1..]
    }

    /// Word `i` after word 0.
    #[inline(always)]
    pub(crate) fn get(&self, i: usize) -> u64 {
        self.0[1 + i]
    }

    /// Sets word `i` after word 0.
    #[inline(always)]
    pub(crate) fn set(&mut self, i: usize, value: u64) {
        self.0[1 + i] = value;
    }

    /// Bytes of the allocation (as the state's own size does not count it).
    pub fn bytes(&self) -> usize {
        self.0.len() * std::mem::size_of::<u64>()
    }

    /// The allocation, the low half of word 0 being its length in words.
    #[inline(always)]
    pub fn into_boxed(self) -> Box<[u64]> {
        self.0
    }

    /// A block from an allocation that [`Block::into_boxed`] gave; `None`
    /// when the low half of word 0 is not its length.
    #[inline(always)]
    pub fn from_boxed(all: Box<[u64]>) -> Option<Block> {
        let length = all.first().map(|&w| w & LENGTH);
        (length == Some(all.len() as u64)).then_some(Block(all))
    }
}

/// The bits of word 0 that hold a block's length in words.
pub const LENGTH: u64 = 0xffff_ffff;

/// A state kept whole in one [`Block`]: what a host may keep behind a thin
/// pointer.
pub trait InBlock: Sized {
    /// The state's block.
    fn into_block(self) -> Block;
    /// The state that [`InBlock::into_block`] gave this block. A block of
    /// another state is not undefined behaviour, but the state's calls may
    /// then answer nonsense or panic.
    fn from_block(block: Block) -> Self;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn word_zero_is_the_length_and_out_of_reach() {
        let mut b = Block::zeroed(3);
        assert_eq!((b.words(), b.tag()), (&[0, 0, 0][..], 0));
        b.words_mut()[0] = 7;
        b.set_tag(u32::MAX);
        assert_eq!(b.bytes(), 32);
        let all = b.clone().into_boxed();
        assert_eq!(&all[..], &[0xffff_ffff_0000_0004, 7, 0, 0]);
        let back = Block::from_boxed(all).expect("its own block");
        assert_eq!((back.words(), back.tag()), (&[7, 0, 0][..], u32::MAX));
        assert!(Block::from_boxed(vec![3, 0].into_boxed_slice()).is_none());
        assert!(Block::from_boxed(Vec::new().into_boxed_slice()).is_none());
    }
}

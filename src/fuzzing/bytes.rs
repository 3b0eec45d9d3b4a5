//! The fuzz inputs' byte decoder: small and edge values are one byte away.

use super::T0_US;
use crate::datatype::{Decoder, Encoder};

/// Values one tag byte away: the edges of every bound in the module.
const SPECIAL: [u64; 32] = [
    u64::MAX,
    u64::MAX - 1,
    i64::MAX as u64,
    1 << 63,
    (1 << 62) + 1,
    1 << 62,
    (1 << 61) + 1,
    (1 << 52) + 1,
    1 << 52,
    (1 << 52) - 1,
    1 << 50,
    (1 << 50) + 1,
    (1 << 40) + 1,
    1 << 40,
    (1 << 40) - 1,
    (1 << 24) + 1,
    1 << 24,
    (1 << 24) - 1,
    u32::MAX as u64,
    1_000_001,
    1_000_000,
    100_000,
    3600,
    3601,
    1000,
    999,
    64,
    T0_US,
    T0_US / 1000,
    T0_US / 1000 / 1000,
    60_000,
    86_400_000,
];

/// Reads fuzz bytes as a stream of `u64` (the RDB loaders' view) and byte
/// strings. A tag byte picks the form of each value:
///
/// - `0x00..=0x3f`: the value itself, 0 to 63;
/// - `0x40..=0x7f`: one of [`SPECIAL`];
/// - `0x80..=0xbf`: the next 8 bytes, little-endian;
/// - `0xc0..=0xff`: the next `(tag & 7) + 1` bytes, little-endian.
///
/// Running out of bytes is what a truncated RDB is: `None`.
pub struct Bytes<'a> {
    data: &'a [u8],
}

impl<'a> Bytes<'a> {
    pub fn new(data: &'a [u8]) -> Self {
        Bytes { data }
    }

    fn raw(&mut self, len: usize) -> Option<&'a [u8]> {
        if self.data.len() < len {
            self.data = &[];
            return None;
        }
        let (head, tail) = self.data.split_at(len);
        self.data = tail;
        Some(head)
    }

    fn little_endian(&mut self, len: usize) -> Option<u64> {
        let bytes = self.raw(len)?;
        Some(
            bytes
                .iter()
                .rev()
                .fold(0u64, |v, &b| (v << 8) | u64::from(b)),
        )
    }

    /// A byte string: a length (a value as above), then that many bytes.
    pub fn bytes(&mut self) -> Option<Vec<u8>> {
        let len = self.take()?;
        let len = usize::try_from(len).ok()?;
        self.raw(len).map(<[u8]>::to_vec)
    }
}

impl Decoder for Bytes<'_> {
    fn take(&mut self) -> Option<u64> {
        let tag = self.raw(1)?[0];
        match tag {
            0x00..=0x3f => Some(u64::from(tag)),
            0x40..=0x7f => Some(SPECIAL[usize::from(tag & 0x3f) % SPECIAL.len()]),
            0x80..=0xbf => self.little_endian(8),
            _ => self.little_endian(usize::from(tag & 7) + 1),
        }
    }
    /// A byte string, as [`Bytes::bytes`] reads it (encoding 2's counters).
    fn take_bytes(&mut self) -> Option<Vec<u8>> {
        self.bytes()
    }
}

/// Writes `value` in the form [`Bytes`] reads, as short as it goes (for
/// seeds and regression tests).
pub fn put_value(out: &mut Vec<u8>, value: u64) {
    if value < 0x40 {
        out.push(value as u8);
    } else if let Some(i) = SPECIAL.iter().position(|&s| s == value) {
        out.push(0x40 | i as u8);
    } else {
        let len = (8 - value.leading_zeros() as usize / 8).max(1);
        out.push(0xc0 | (len as u8 - 1));
        out.extend_from_slice(&value.to_le_bytes()[..len]);
    }
}

/// Writes a byte string in the form [`Bytes::bytes`] reads.
pub fn put_bytes(out: &mut Vec<u8>, bytes: &[u8]) {
    put_value(out, bytes.len() as u64);
    out.extend_from_slice(bytes);
}

pub(super) struct Fields(pub(super) Vec<u64>);

impl Encoder for Fields {
    fn put(&mut self, value: u64) {
        self.0.push(value);
    }
}

pub(super) struct Replay<'a>(pub(super) std::slice::Iter<'a, u64>);

impl Decoder for Replay<'_> {
    fn take(&mut self) -> Option<u64> {
        self.0.next().copied()
    }
}

/// A sink of encoding 2: the fields, then the byte string.
#[derive(Default)]
pub(super) struct Compact(pub(super) Vec<u64>, pub(super) Option<Vec<u8>>);

impl Encoder for Compact {
    fn put(&mut self, value: u64) {
        self.0.push(value);
    }
    fn encoding(&self) -> i32 {
        2
    }
    fn put_bytes(&mut self, bytes: &[u8]) {
        self.1 = Some(bytes.to_vec());
    }
}

/// Reads a [`Compact`]'s fields, then its byte string.
pub(super) struct ReplayCompact<'a>(
    pub(super) std::slice::Iter<'a, u64>,
    pub(super) Option<Vec<u8>>,
);

impl Decoder for ReplayCompact<'_> {
    fn take(&mut self) -> Option<u64> {
        self.0.next().copied()
    }
    fn take_bytes(&mut self) -> Option<Vec<u8>> {
        self.1.take()
    }
}

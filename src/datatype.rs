//! The native data types: one Redis module type per algorithm, and the
//! callbacks Redis calls on them (RDB load/save, AOF rewrite, digest, memory,
//! copy, free).
//!
//! Every type has its own encoding version (its row's `encoding` in the table
//! of algorithms, no shared default), which Redis stores with each value: bumping
//! one type's encoding never changes what another type writes or accepts.
//! Each loader keeps a branch for every version its type ever wrote, and reads
//! all of them whatever the type writes. Encoding 1 of every state is its
//! list of unsigned integers as the core crate gives it (`StateFields`),
//! written with `RedisModule_SaveUnsigned` (RDB) and as decimal arguments of
//! `RL.SETSTATE` (AOF rewrite). Encoding 2, the hash window's only
//! (`rl-hashwn`), is its compact form: the header fields as unsigned
//! integers (`bucket_ms`, `newest`, `sum`, the number of buckets, and the
//! width of a counter in bytes, 2, 4 or 8), then the counters as one byte
//! string (`RedisModule_SaveStringBuffer`), little-endian at that width; the
//! other types have only encoding 1. `ratelimit.write-encoding 1` pins
//! every type to encoding 1 (what release 0.1.0 reads): the version each type
//! is registered with, and so writes, is the lower of its newest and the
//! config's, fixed at load. The AOF rewrite writes encoding 1 whatever the
//! config; `RL.SETSTATE` reads both (encoding 2's byte string is one
//! argument). Loading validates every invariant the algorithms rely on (the
//! core's `from_fields` and `from_compact`) and refuses anything else: a
//! short, corrupt or hostile payload is an error, never a crash and never a
//! state the algorithms could overflow on.
//!
//! How a state sits in memory is another matter, which no encoding sees:
//! the token and leaky buckets pack theirs into the key's value pointer
//! when it fits (the representation its row names, `Listed::Repr`: `src/ffi/packed.rs`), and every
//! callback here gets the state unpacked.
//!
//! The policies' aux data rides on the token bucket type, whose encoding
//! version Redis hands to `aux_load`; that number says nothing about the aux
//! data, which carries its own version inside its payload (`crate::policy`).

use crate::algorithms::{for_each_algorithm, Listed};
use crate::ffi::{AuxData, Digest, Load, RdbIo, Rewrite, TypeMethods};

use crate::limiter::StateFields;
use crate::policy;

/// Where a state's fields are written: RDB, AOF arguments, digest, tests.
pub trait Encoder {
    fn put(&mut self, value: u64);
    /// The newest encoding this sink takes: 1 (fields only) unless it says
    /// otherwise; the RDB takes what `ratelimit.write-encoding` allows.
    fn encoding(&self) -> i32 {
        1
    }
    /// A byte string, only in a sink whose [`Encoder::encoding`] is above 1.
    fn put_bytes(&mut self, bytes: &[u8]) {
        let _ = bytes;
        unreachable!("a sink of encoding 1 takes no byte string");
    }
}

/// Where a state's fields are read from; `None` when the input is exhausted
/// or broken.
pub trait Decoder {
    fn take(&mut self) -> Option<u64>;
    /// A byte string; `None` where the input holds none.
    fn take_bytes(&mut self) -> Option<Vec<u8>> {
        None
    }
}

/// A limiter state kept in its own module type, in the encoding its row
/// gives (the table of algorithms: its type name and encoding version, its
/// own, never another type's).
///
/// One impl serves every state: encoding 1 is the state's fields as the
/// core crate lists them ([`StateFields`]), encoding 2 its compact form
/// where it has one (`StateFields::COMPACT`: the hash window). The next
/// type to change its form bumps its row's encoding, and the loaders of the
/// encodings it must keep reading stay.
pub trait NativeState: Clone + Sized + 'static {
    /// Its newest encoding (its row's, which a test checks).
    const NEWEST: i32;
    /// Writes the state in its newest encoding the sink takes
    /// ([`Encoder::encoding`]).
    fn encode(&self, out: &mut impl Encoder);
    /// Reads a state written with `encoding`; `None` if it is not valid.
    fn decode(input: &mut impl Decoder, encoding: i32) -> Option<Self>;
}

impl<S: StateFields + Clone + 'static> NativeState for S {
    const NEWEST: i32 = if S::COMPACT { 2 } else { 1 };

    fn encode(&self, out: &mut impl Encoder) {
        if Self::NEWEST >= 2 && out.encoding() >= 2 {
            let mut string = Vec::new();
            self.to_compact(&mut |field| out.put(field), &mut |bytes| {
                string.extend_from_slice(bytes)
            });
            out.put_bytes(&string);
        } else {
            self.to_fields(&mut |field| out.put(field));
        }
    }

    fn decode(input: &mut impl Decoder, encoding: i32) -> Option<Self> {
        match encoding {
            1 => S::from_fields(&mut || input.take()),
            2 if S::COMPACT => {
                let input = std::cell::RefCell::new(input);
                S::from_compact(&mut || input.borrow_mut().take(), &mut || {
                    input.borrow_mut().take_bytes()
                })
            }
            _ => None,
        }
    }
}

/// The encoding the type of `L` is registered with, and so writes: its
/// row's (its state's newest), or 1 under `ratelimit.write-encoding 1`.
pub fn write_encoding<L: Listed>() -> i32 {
    L::newest_encoding().min(crate::config::write_encoding())
}

/// Decodes a state from decimal arguments (the AOF form, `RL.SETSTATE`).
pub fn decode_args<S: NativeState>(fields: &[&[u8]], encoding: i32) -> Option<S> {
    struct Args<'a, 'b>(std::slice::Iter<'a, &'b [u8]>);
    impl Decoder for Args<'_, '_> {
        fn take(&mut self) -> Option<u64> {
            let field = self.0.next()?;
            crate::args::parse_int(field, "field", 0, u64::MAX).ok()
        }
        /// One argument, as it is.
        fn take_bytes(&mut self) -> Option<Vec<u8>> {
            self.0.next().map(|field| field.to_vec())
        }
    }
    let mut input = Args(fields.iter());
    let state = S::decode(&mut input, encoding)?;
    input.0.next().is_none().then_some(state)
}

/// Registers the native type of every algorithm of the table; the first
/// also carries the node's policies as RDB aux data (one type does; which
/// one does not matter, but it must stay the same from release to release:
/// the token bucket's).
pub fn register(load: &Load) -> Result<(), &'static str> {
    for_each_algorithm!(L => {
        let crate::algorithms::KeyFormat::Native { type_name, .. } = L::ROW.key;
        let encoding = write_encoding::<L>();
        if L::INDEX == 0 {
            load.register_type_with_aux::<L, Policies>(L::data_type(), type_name, encoding)?;
        } else {
            load.register_type::<L>(L::data_type(), type_name, encoding)?;
        }
    });
    Ok(())
}

impl Encoder for RdbIo {
    fn put(&mut self, value: u64) {
        self.save_unsigned(value);
    }
    /// What the types were registered with: `ratelimit.write-encoding`.
    fn encoding(&self) -> i32 {
        crate::config::write_encoding()
    }
    fn put_bytes(&mut self, bytes: &[u8]) {
        self.save_bytes(bytes);
    }
}

impl Decoder for RdbIo {
    fn take(&mut self) -> Option<u64> {
        self.load_unsigned()
    }
    fn take_bytes(&mut self) -> Option<Vec<u8>> {
        self.load_bytes()
    }
}

/// The native type of each algorithm: its state, in its row's encoding.
impl<L: Listed> TypeMethods for L {
    type Value = L::State;
    type Repr = L::Repr;

    fn load(rdb: &mut RdbIo, encoding: i32) -> Option<L::State> {
        L::State::decode(rdb, encoding)
    }

    fn save(state: &L::State, rdb: &mut RdbIo) {
        state.encode(rdb);
    }

    /// `RL.SETSTATE key <ALGORITHM> <encoding> <fields...>`.
    fn rewrite(state: &L::State, aof: &mut Rewrite) {
        struct Fields(Vec<String>);
        impl Encoder for Fields {
            fn put(&mut self, value: u64) {
                self.0.push(value.to_string());
            }
        }
        let mut fields = Fields(Vec::new());
        state.encode(&mut fields);
        let encoding = L::encoding().to_string();
        let mut args: Vec<&[u8]> = vec![L::WORD.to_bytes(), encoding.as_bytes()];
        args.extend(fields.0.iter().map(|f| f.as_bytes()));
        aof.emit(c"RL.SETSTATE", &args);
    }

    fn digest(state: &L::State, digest: &mut Digest) {
        struct Fields<'a>(&'a mut Digest);
        impl Encoder for Fields<'_> {
            fn put(&mut self, value: u64) {
                self.0.add_integer(value as i64);
            }
        }
        state.encode(&mut Fields(digest));
    }

    /// The core's count of the state's heap bytes.
    fn heap_bytes(state: &L::State) -> usize {
        state.heap_bytes()
    }
}

/// The node's policies, saved before the keys of an RDB (or AOF preamble).
struct Policies;

impl AuxData for Policies {
    fn save(rdb: &mut RdbIo) {
        policy::encode(&mut |field| match field {
            policy::Field::Unsigned(v) => rdb.save_unsigned(v),
            policy::Field::Bytes(b) => rdb.save_bytes(b),
        })
    }

    /// Replaces the node's policies with the RDB's. The payload carries its
    /// own version (`policy::decode` reads it).
    fn load(rdb: &mut RdbIo) -> bool {
        let rdb = std::cell::RefCell::new(rdb);
        let decoded = policy::decode(&mut || rdb.borrow_mut().load_unsigned(), &mut || {
            rdb.borrow_mut().load_bytes()
        });
        match decoded {
            Some(rules) => {
                policy::clear();
                for (name, rule) in rules {
                    policy::set(&name, rule);
                }
                true
            }
            None => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limiter::fixed_window::FixedWindowState;
    use crate::limiter::hash_window::HashWindowState;
    use crate::limiter::leaky_bucket::LeakyBucketState;
    use crate::limiter::sliding_log::SlidingLogState;
    use crate::limiter::token_bucket::TokenBucketState;

    struct Fields(Vec<u64>);
    impl Encoder for Fields {
        fn put(&mut self, value: u64) {
            self.0.push(value);
        }
    }
    impl<I: Iterator<Item = u64>> Decoder for I {
        fn take(&mut self) -> Option<u64> {
            self.next()
        }
    }

    /// A sink of encoding 2: fields, then a byte string.
    #[derive(Default)]
    struct Compact(Vec<u64>, Option<Vec<u8>>);
    impl Encoder for Compact {
        fn put(&mut self, value: u64) {
            assert!(self.1.is_none(), "a field after the byte string");
            self.0.push(value);
        }
        fn encoding(&self) -> i32 {
            2
        }
        fn put_bytes(&mut self, bytes: &[u8]) {
            assert!(self.1.replace(bytes.to_vec()).is_none());
        }
    }
    /// Reads the fields, then the byte string.
    struct Replay<'a>(std::slice::Iter<'a, u64>, Option<Vec<u8>>);
    impl Decoder for Replay<'_> {
        fn take(&mut self) -> Option<u64> {
            self.0.next().copied()
        }
        fn take_bytes(&mut self) -> Option<Vec<u8>> {
            self.1.take()
        }
    }

    /// The newest encoding its row gives the type of `S`, which is the
    /// state's own.
    fn newest<S: NativeState>() -> i32 {
        use std::any::TypeId;
        for_each_algorithm!(L => {
            if TypeId::of::<<L as crate::limiter::Algorithm>::State>() == TypeId::of::<S>() {
                assert_eq!(L::newest_encoding(), S::NEWEST);
                return L::newest_encoding();
            }
        });
        panic!("{} is in no row", std::any::type_name::<S>())
    }

    #[test]
    fn rows_give_their_states_newest_encoding() {
        for_each_algorithm!(L => {
            assert_eq!(L::newest_encoding(), <<L as crate::limiter::Algorithm>::State as NativeState>::NEWEST, "{:?}", L::ROW.command);
            // the AOF form stays encoding 1, which every release reads
            assert_eq!(L::encoding(), 1);
        });
        assert_eq!(newest::<HashWindowState>(), 2);
        assert_eq!(newest::<TokenBucketState>(), 1);
    }

    fn round_trip<S: NativeState + PartialEq + std::fmt::Debug>(state: S) {
        let newest = newest::<S>();
        let mut out = Fields(Vec::new());
        state.encode(&mut out);
        let decoded = S::decode(&mut out.0.clone().into_iter(), 1);
        assert_eq!(decoded.as_ref(), Some(&state));
        // every truncation is refused
        for len in 0..out.0.len() {
            assert!(S::decode(&mut out.0[..len].iter().copied(), 1).is_none());
        }
        // an unknown encoding is refused
        for unknown in [0, newest + 1] {
            assert!(S::decode(&mut out.0.clone().into_iter(), unknown).is_none());
        }
        let text: Vec<String> = out.0.iter().map(u64::to_string).collect();
        let args: Vec<&[u8]> = text.iter().map(|s| s.as_bytes()).collect();
        assert_eq!(decode_args::<S>(&args, 1).as_ref(), Some(&state));
        let mut longer = args.clone();
        longer.push(b"0");
        assert!(decode_args::<S>(&longer, 1).is_none());
        // encoding 2, where the type has it; elsewhere a sink of encoding 2
        // gets encoding 1, and encoding 2 is refused
        let mut compact = Compact::default();
        state.encode(&mut compact);
        let Compact(fields, string) = compact;
        let replay = |len: usize, string: Option<Vec<u8>>| {
            S::decode(&mut Replay(fields[..len].iter(), string), 2)
        };
        if newest < 2 {
            assert_eq!((&fields, &string), (&out.0, &None));
            assert!(replay(fields.len(), None).is_none());
            return;
        }
        let string = string.expect("encoding 2 ends with a byte string");
        assert_eq!(
            replay(fields.len(), Some(string.clone())).as_ref(),
            Some(&state)
        );
        // re-encoded byte for byte
        let mut again = Compact::default();
        replay(fields.len(), Some(string.clone()))
            .unwrap()
            .encode(&mut again);
        assert_eq!((&again.0, again.1.as_ref()), (&fields, Some(&string)));
        for len in 0..fields.len() {
            assert!(replay(len, Some(string.clone())).is_none());
        }
        assert!(replay(fields.len(), None).is_none());
        for cut in 0..string.len() {
            assert!(replay(fields.len(), Some(string[..cut].to_vec())).is_none());
        }
        assert!(S::decode(&mut Replay(fields.iter(), Some(string.clone())), 3).is_none());
        // RL.SETSTATE's form of encoding 2: the fields, then the raw bytes
        let text: Vec<String> = fields.iter().map(u64::to_string).collect();
        let mut args: Vec<&[u8]> = text.iter().map(|s| s.as_bytes()).collect();
        args.push(&string);
        assert_eq!(decode_args::<S>(&args, 2).as_ref(), Some(&state));
        args.push(b"0");
        assert!(decode_args::<S>(&args, 2).is_none());
    }

    /// A state from its encoding-1 fields.
    fn state<S: NativeState>(fields: &[u64]) -> S {
        S::decode(&mut fields.iter().copied(), 1).expect("valid fields")
    }

    /// Encoding 1 of each type, as every build so far wrote it (the fields of
    /// the `DUMP` payloads in `tests/fixtures/encoding-v1/`): each type's
    /// loader keeps reading it, whatever version it or another type writes
    /// later, and writes it back field for field (the core crate's own tests
    /// pin what each field means).
    #[test]
    fn encoding_1_of_every_type_loads() {
        fn loads_back<S: NativeState>(fields: &[u64]) {
            let mut out = Fields(Vec::new());
            state::<S>(fields).encode(&mut out);
            assert_eq!(out.0, fields, "{}", std::any::type_name::<S>());
        }
        let long = 1 << 40;
        let bucket = [0x0012_198e_408e_4030, 0, 1, long];
        loads_back::<TokenBucketState>(&bucket);
        loads_back::<LeakyBucketState>(&bucket);
        loads_back::<FixedWindowState>(&[0x0006_618e_408e_d5c4, 3]);
        let entries = [1, 0x1200_0002, 0x2300_0003, 0x2a00_0005];
        loads_back::<SlidingLogState>(&[&[0x01a2_30b4_5dcd, 5, 5, 4][..], &entries].concat());
        loads_back::<HashWindowState>(&[long, 1, 5, 2, 0, 5]);
    }

    #[test]
    fn states_round_trip_and_refuse_short_input() {
        round_trip(state::<TokenBucketState>(&[
            1_700_000_000_000_123,
            2,
            3,
            1000,
        ]));
        round_trip(state::<FixedWindowState>(&[1_700_000_040_000_123, 7]));
    }

    #[test]
    fn variable_size_states_round_trip() {
        use crate::limiter::{Algorithm, HashWindow, Micros, SlidingLog};
        let now = Micros::from_us(1_700_000_000_123_456);
        let p = crate::limiter::sliding_log::SlidingLogParams::new(100, 1000).unwrap();
        let mut log = SlidingLog::idle(&p, now);
        for i in 0..5 {
            SlidingLog::apply(&mut log, &p, 1 + i % 2, now.saturating_add_us(i * 700));
        }
        round_trip(log);
        let p = crate::limiter::hash_window::HashWindowParams::new(100, 6000, 1000).unwrap();
        let mut ring = HashWindow::idle(&p, now);
        for i in 0..5 {
            HashWindow::apply(&mut ring, &p, 2, now.saturating_add_us(i * 900_000));
        }
        round_trip(ring);
        round_trip(state::<LeakyBucketState>(&[5, 0, 1, 1]));
    }

    /// Found by fuzzing: a sliding log or hash window admitted at the
    /// latest `AT` (2^62 us) was refused by its own loader, so an RDB the
    /// server wrote could not be loaded back.
    #[test]
    fn states_built_at_the_latest_time_load_back() {
        use crate::limiter::{Algorithm, HashWindow, Micros, SlidingLog, MAX_TIME_US};
        let latest = Micros::from_us(MAX_TIME_US);
        let p = crate::limiter::sliding_log::SlidingLogParams::new(3, 1 << 40).unwrap();
        let mut log = SlidingLog::idle(&p, latest);
        assert!(SlidingLog::apply(&mut log, &p, 1, latest).allowed);
        round_trip(log);
        let p = crate::limiter::hash_window::HashWindowParams::new(10, 6000, 1000).unwrap();
        let mut ring = HashWindow::idle(&p, latest);
        assert!(HashWindow::apply(&mut ring, &p, 1, latest).allowed);
        round_trip(ring);
    }

    /// Found by fuzzing: the ring of a hash window has one bucket more than
    /// its window, and the loader bounded the ring as if it were the
    /// window: a window of 2^40 ms in one bucket, or of 1,000,000 buckets
    /// (the config's maximum), could be saved but not loaded back.
    #[test]
    fn the_largest_hash_windows_load_back() {
        use crate::limiter::hash_window::HashWindowParams;
        use crate::limiter::{Algorithm, HashWindow, Micros, MAX_PARAM};
        let now = Micros::from_us(1_700_000_000_123_456);
        for (window_ms, bucket_ms) in [
            (MAX_PARAM, MAX_PARAM),
            (914_103_784_660, 914_103_784_660),
            (crate::limiter::hash_window::MAX_BUCKETS, 1),
        ] {
            let p = HashWindowParams::new(10, window_ms, bucket_ms).unwrap();
            let mut ring = HashWindow::idle(&p, now);
            assert!(HashWindow::apply(&mut ring, &p, 1, now).allowed);
            let mut out = Fields(Vec::new());
            ring.encode(&mut out);
            let decoded = HashWindowState::decode(&mut out.0.into_iter(), 1);
            assert_eq!(decoded.as_ref(), Some(&ring), "{window_ms} / {bucket_ms}");
            // and in encoding 2: 2 bytes a bucket
            let mut compact = Compact::default();
            ring.encode(&mut compact);
            let string = compact.1.expect("a byte string");
            assert_eq!(string.len() as u64, 2 * (window_ms / bucket_ms + 1));
            let decoded = HashWindowState::decode(&mut Replay(compact.0.iter(), Some(string)), 2);
            assert_eq!(decoded.as_ref(), Some(&ring), "{window_ms} / {bucket_ms}");
        }
    }

    #[test]
    fn hostile_lengths_are_refused_without_allocating() {
        let huge = vec![0, 0, 0, u64::MAX];
        assert!(SlidingLogState::decode(&mut huge.clone().into_iter(), 1).is_none());
        assert!(HashWindowState::decode(&mut huge.into_iter(), 1).is_none());
        // a length the payload does not hold
        let short = vec![1000, 5, 0, 1000, 0, 0];
        assert!(HashWindowState::decode(&mut short.into_iter(), 1).is_none());
    }

    #[test]
    fn invalid_states_are_refused() {
        let bad_tb = [
            vec![1, 5, 5, 1000],          // frac >= refill_count
            vec![1, 0, 0, 1000],          // zero rate
            vec![1, 0, 1, 0],             // zero period
            vec![1, 0, 1, (1 << 40) + 1], // period above 2^40
        ];
        for fields in bad_tb {
            assert!(TokenBucketState::decode(&mut fields.into_iter(), 1).is_none());
        }
        let bad_fw = [
            vec![0, (1 << 41) + 1], // count above twice 2^40 (the most a forced call leaves)
            vec![u64::MAX - 999, 1], // time too far
        ];
        for fields in bad_fw {
            assert!(FixedWindowState::decode(&mut fields.into_iter(), 1).is_none());
        }
    }
}

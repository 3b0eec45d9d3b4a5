//! The native data types: one Redis module type per algorithm, and the
//! callbacks Redis calls on them (RDB load/save, AOF rewrite, digest, memory,
//! copy, free).
//!
//! Every type has its own encoding version (`NativeState::ENCODING`, given by
//! each type, no shared default), which Redis stores with each value: bumping
//! one type's encoding never changes what another type writes or accepts.
//! Each loader keeps a branch for every version its type ever wrote (only 1
//! so far). Encoding 1 of every state is its list of unsigned integers as
//! the core crate gives it (`StateFields`), written with
//! `RedisModule_SaveUnsigned` (RDB) and as decimal arguments of
//! `RL.SETSTATE` (AOF rewrite). Loading validates every invariant the
//! algorithms rely on (the core's `from_fields`) and refuses anything else: a
//! short, corrupt or hostile payload is an error, never a crash and never a
//! state the algorithms could overflow on.
//!
//! The policies' aux data rides on the token bucket type, whose encoding
//! version Redis hands to `aux_load`; that number says nothing about the aux
//! data, which carries its own version inside its payload (`crate::policy`).

use std::ffi::CStr;
use std::os::raw::{c_int, c_void};
use std::ptr;
use std::sync::atomic::{AtomicPtr, Ordering};

use redis_module::raw;

use crate::api;
use crate::guard;
use crate::limiter::fixed_window::FixedWindowState;
use crate::limiter::hash_window::HashWindowState;
use crate::limiter::leaky_bucket::LeakyBucketState;
use crate::limiter::sliding_log::SlidingLogState;
use crate::limiter::token_bucket::TokenBucketState;
use crate::limiter::StateFields;

/// Where a state's fields are written: RDB, AOF arguments, digest, tests.
pub trait Encoder {
    fn put(&mut self, value: u64);
}

/// Where a state's fields are read from; `None` when the input is exhausted
/// or broken.
pub trait Decoder {
    fn take(&mut self) -> Option<u64>;
}

/// A limiter state kept in its own module type.
pub trait NativeState: Clone + Sized + 'static {
    /// The module type name, exactly 9 characters (what `TYPE key` shows).
    const TYPE_NAME: &'static CStr;
    /// The algorithm's name in `RL.SETSTATE`.
    const ALGORITHM: &'static str;
    /// The encoding version this type writes: its own, never another
    /// type's (no default, so a new type must choose).
    const ENCODING: c_int;

    /// The registered module type (null before the module is loaded).
    fn registered() -> &'static AtomicPtr<raw::RedisModuleType>;
    fn encode(&self, out: &mut impl Encoder);
    /// Reads a state written with `encoding`; `None` if it is not valid.
    fn decode(input: &mut impl Decoder, encoding: c_int) -> Option<Self>;
    /// Bytes the state owns outside its own allocation (for `MEMORY USAGE`).
    fn heap_bytes(&self) -> usize {
        0
    }
}

static TOKEN_BUCKET_TYPE: AtomicPtr<raw::RedisModuleType> = AtomicPtr::new(ptr::null_mut());
static FIXED_WINDOW_TYPE: AtomicPtr<raw::RedisModuleType> = AtomicPtr::new(ptr::null_mut());
static LEAKY_BUCKET_TYPE: AtomicPtr<raw::RedisModuleType> = AtomicPtr::new(ptr::null_mut());
static SLIDING_LOG_TYPE: AtomicPtr<raw::RedisModuleType> = AtomicPtr::new(ptr::null_mut());
static HASH_WINDOW_TYPE: AtomicPtr<raw::RedisModuleType> = AtomicPtr::new(ptr::null_mut());

/// Encoding 1 of every type: the state's fields, as the core crate lists
/// them ([`StateFields`]).
fn put_v1(state: &impl StateFields, out: &mut impl Encoder) {
    state.to_fields(&mut |field| out.put(field));
}

/// Reads encoding 1: the fields, validated by the core crate.
fn take_v1<S: StateFields>(input: &mut impl Decoder) -> Option<S> {
    S::from_fields(&mut || input.take())
}

impl NativeState for TokenBucketState {
    const TYPE_NAME: &'static CStr = c"rl-tokbkt";
    const ALGORITHM: &'static str = "TOKENBUCKET";
    const ENCODING: c_int = 1;

    fn registered() -> &'static AtomicPtr<raw::RedisModuleType> {
        &TOKEN_BUCKET_TYPE
    }
    fn encode(&self, out: &mut impl Encoder) {
        put_v1(self, out);
    }
    fn decode(input: &mut impl Decoder, encoding: c_int) -> Option<Self> {
        match encoding {
            1 => take_v1(input),
            _ => None,
        }
    }
}

impl NativeState for FixedWindowState {
    const TYPE_NAME: &'static CStr = c"rl-fixwin";
    const ALGORITHM: &'static str = "FIXEDWINDOW";
    const ENCODING: c_int = 1;

    fn registered() -> &'static AtomicPtr<raw::RedisModuleType> {
        &FIXED_WINDOW_TYPE
    }
    fn encode(&self, out: &mut impl Encoder) {
        put_v1(self, out);
    }
    fn decode(input: &mut impl Decoder, encoding: c_int) -> Option<Self> {
        match encoding {
            1 => take_v1(input),
            _ => None,
        }
    }
}

impl NativeState for LeakyBucketState {
    const TYPE_NAME: &'static CStr = c"rl-leakbk";
    const ALGORITHM: &'static str = "LEAKYBUCKET";
    const ENCODING: c_int = 1;

    fn registered() -> &'static AtomicPtr<raw::RedisModuleType> {
        &LEAKY_BUCKET_TYPE
    }
    fn encode(&self, out: &mut impl Encoder) {
        put_v1(self, out);
    }
    fn decode(input: &mut impl Decoder, encoding: c_int) -> Option<Self> {
        match encoding {
            1 => take_v1(input),
            _ => None,
        }
    }
}

impl NativeState for SlidingLogState {
    const TYPE_NAME: &'static CStr = c"rl-slilog";
    const ALGORITHM: &'static str = "SLIDING";
    const ENCODING: c_int = 1;

    fn registered() -> &'static AtomicPtr<raw::RedisModuleType> {
        &SLIDING_LOG_TYPE
    }
    fn encode(&self, out: &mut impl Encoder) {
        put_v1(self, out);
    }
    fn decode(input: &mut impl Decoder, encoding: c_int) -> Option<Self> {
        match encoding {
            1 => take_v1(input),
            _ => None,
        }
    }
    fn heap_bytes(&self) -> usize {
        SlidingLogState::heap_bytes(self)
    }
}

impl NativeState for HashWindowState {
    const TYPE_NAME: &'static CStr = c"rl-hashwn";
    const ALGORITHM: &'static str = "HASHWINDOW";
    const ENCODING: c_int = 1;

    fn registered() -> &'static AtomicPtr<raw::RedisModuleType> {
        &HASH_WINDOW_TYPE
    }
    fn encode(&self, out: &mut impl Encoder) {
        put_v1(self, out);
    }
    fn decode(input: &mut impl Decoder, encoding: c_int) -> Option<Self> {
        match encoding {
            1 => take_v1(input),
            _ => None,
        }
    }
    fn heap_bytes(&self) -> usize {
        HashWindowState::heap_bytes(self)
    }
}

/// Decodes a state from decimal arguments (the AOF form, `RL.SETSTATE`).
pub fn decode_args<S: NativeState>(fields: &[&[u8]], encoding: c_int) -> Option<S> {
    struct Args<'a, 'b>(std::slice::Iter<'a, &'b [u8]>);
    impl Decoder for Args<'_, '_> {
        fn take(&mut self) -> Option<u64> {
            let field = self.0.next()?;
            crate::args::parse_int(field, "field", 0, u64::MAX).ok()
        }
    }
    let mut input = Args(fields.iter());
    let state = S::decode(&mut input, encoding)?;
    input.0.next().is_none().then_some(state)
}

/// Registers the module type of `S` with the server.
///
/// # Safety
/// `ctx` must be the context passed to `RedisModule_OnLoad`.
/// With `policies`, the type also carries the node's policies as RDB aux
/// data (one type does; which one does not matter).
pub unsafe fn register<S: NativeState>(
    ctx: *mut raw::RedisModuleCtx,
    policies: bool,
) -> Result<(), &'static CStr> {
    let mut methods = raw::RedisModuleTypeMethods {
        // Version 3 carries the copy callback (Redis 6.2+); no later field is used.
        version: 3,
        rdb_load: Some(rdb_load::<S>),
        rdb_save: Some(rdb_save::<S>),
        aof_rewrite: Some(aof_rewrite::<S>),
        mem_usage: Some(mem_usage::<S>),
        digest: Some(digest::<S>),
        free: Some(free::<S>),
        aux_load: if policies {
            Some(aux_load_policies)
        } else {
            None
        },
        aux_save: if policies {
            Some(aux_save_policies)
        } else {
            None
        },
        aux_save_triggers: if policies {
            raw::REDISMODULE_AUX_BEFORE_RDB as c_int
        } else {
            0
        },
        free_effort: None,
        unlink: None,
        copy: Some(copy::<S>),
        defrag: None,
        mem_usage2: None,
        free_effort2: None,
        unlink2: None,
        copy2: None,
        aux_save2: None,
    };
    let created =
        api!(RedisModule_CreateDataType)(ctx, S::TYPE_NAME.as_ptr(), S::ENCODING, &mut methods);
    if created.is_null() {
        return Err(c"could not create a data type");
    }
    S::registered().store(created, Ordering::Relaxed);
    Ok(())
}

/// Moves a new state to the heap, as the module value of a key.
pub fn into_value<S: NativeState>(state: S) -> *mut c_void {
    Box::into_raw(Box::new(state)).cast()
}

struct RdbIo(*mut raw::RedisModuleIO);

impl Encoder for RdbIo {
    fn put(&mut self, value: u64) {
        unsafe { api!(RedisModule_SaveUnsigned)(self.0, value) };
    }
}

impl Decoder for RdbIo {
    fn take(&mut self) -> Option<u64> {
        let value = unsafe { api!(RedisModule_LoadUnsigned)(self.0) };
        let failed = unsafe { api!(RedisModule_IsIOError)(self.0) } != 0;
        (!failed).then_some(value)
    }
}

unsafe extern "C" fn rdb_load<S: NativeState>(
    rdb: *mut raw::RedisModuleIO,
    encver: c_int,
) -> *mut c_void {
    guard::callback(ptr::null_mut(), || {
        match S::decode(&mut RdbIo(rdb), encver) {
            Some(state) => into_value(state),
            None => ptr::null_mut(),
        }
    })
}

unsafe extern "C" fn rdb_save<S: NativeState>(rdb: *mut raw::RedisModuleIO, value: *mut c_void) {
    guard::callback((), || {
        unsafe { &*value.cast::<S>() }.encode(&mut RdbIo(rdb))
    })
}

unsafe extern "C" fn aof_rewrite<S: NativeState>(
    aof: *mut raw::RedisModuleIO,
    key: *mut raw::RedisModuleString,
    value: *mut c_void,
) {
    guard::callback((), || {
        struct Fields(Vec<*mut raw::RedisModuleString>);
        impl Encoder for Fields {
            fn put(&mut self, value: u64) {
                let text = value.to_string();
                let s = unsafe {
                    api!(RedisModule_CreateString)(
                        ptr::null_mut(),
                        text.as_ptr().cast(),
                        text.len(),
                    )
                };
                self.0.push(s);
            }
        }
        let mut fields = Fields(Vec::new());
        unsafe { &*value.cast::<S>() }.encode(&mut fields);
        let algorithm = std::ffi::CString::new(S::ALGORITHM).expect("no NUL in a name");
        unsafe {
            api!(RedisModule_EmitAOF)(
                aof,
                c"RL.SETSTATE".as_ptr(),
                c"sclv".as_ptr(),
                key,
                algorithm.as_ptr(),
                S::ENCODING as std::os::raw::c_longlong,
                fields.0.as_ptr(),
                fields.0.len(),
            );
            for s in fields.0 {
                api!(RedisModule_FreeString)(ptr::null_mut(), s);
            }
        }
    })
}

/// Saves the node's policies before the keys of an RDB (or AOF preamble).
unsafe extern "C" fn aux_save_policies(rdb: *mut raw::RedisModuleIO, _when: c_int) {
    guard::callback((), || {
        crate::policy::encode(&mut |field| match field {
            crate::policy::Field::Unsigned(v) => unsafe { api!(RedisModule_SaveUnsigned)(rdb, v) },
            crate::policy::Field::Bytes(b) => unsafe {
                api!(RedisModule_SaveStringBuffer)(rdb, b.as_ptr().cast(), b.len())
            },
        })
    })
}

/// Loads the policies saved by [`aux_save_policies`], replacing the node's.
/// `_encver` is the token bucket's encoding version, not the aux data's:
/// the payload carries its own (`policy::decode` reads it).
unsafe extern "C" fn aux_load_policies(
    rdb: *mut raw::RedisModuleIO,
    _encver: c_int,
    _when: c_int,
) -> c_int {
    let failed = raw::REDISMODULE_ERR as c_int;
    guard::callback(failed, || {
        let broken = || unsafe { api!(RedisModule_IsIOError)(rdb) } != 0;
        let mut unsigned = || {
            let v = unsafe { api!(RedisModule_LoadUnsigned)(rdb) };
            (!broken()).then_some(v)
        };
        let mut bytes = || {
            let mut len = 0usize;
            let buf = unsafe { api!(RedisModule_LoadStringBuffer)(rdb, &mut len) };
            if buf.is_null() || broken() {
                return None;
            }
            let out = unsafe { std::slice::from_raw_parts(buf.cast::<u8>(), len) }.to_vec();
            unsafe { api!(RedisModule_Free)(buf.cast()) };
            Some(out)
        };
        match crate::policy::decode(&mut unsigned, &mut bytes) {
            Some(rules) => {
                crate::policy::clear();
                for (name, rule) in rules {
                    crate::policy::set(&name, rule);
                }
                raw::REDISMODULE_OK as c_int
            }
            None => failed,
        }
    })
}

/// Size of the `robj` and `moduleValue` Redis allocates around every module
/// value; counted so that `MEMORY USAGE` tells the whole cost of a key.
const REDIS_WRAPPERS: usize = 16 + 16;

unsafe extern "C" fn mem_usage<S: NativeState>(value: *const c_void) -> usize {
    guard::callback(std::mem::size_of::<S>() + REDIS_WRAPPERS, || {
        let allocated = match unsafe { raw::RedisModule_MallocSize } {
            Some(size_of) => unsafe { size_of(value as *mut c_void) },
            None => std::mem::size_of::<S>(),
        };
        allocated + unsafe { &*value.cast::<S>() }.heap_bytes() + REDIS_WRAPPERS
    })
}

unsafe extern "C" fn digest<S: NativeState>(md: *mut raw::RedisModuleDigest, value: *mut c_void) {
    struct Digest(*mut raw::RedisModuleDigest);
    impl Encoder for Digest {
        fn put(&mut self, value: u64) {
            unsafe { api!(RedisModule_DigestAddLongLong)(self.0, value as i64) };
        }
    }
    guard::callback((), || {
        unsafe { &*value.cast::<S>() }.encode(&mut Digest(md));
        unsafe { api!(RedisModule_DigestEndSequence)(md) };
    })
}

unsafe extern "C" fn free<S: NativeState>(value: *mut c_void) {
    guard::callback((), || drop(unsafe { Box::from_raw(value.cast::<S>()) }))
}

unsafe extern "C" fn copy<S: NativeState>(
    _from: *mut raw::RedisModuleString,
    _to: *mut raw::RedisModuleString,
    value: *const c_void,
) -> *mut c_void {
    guard::callback(ptr::null_mut(), || {
        into_value(unsafe { &*value.cast::<S>() }.clone())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

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

    fn round_trip<S: NativeState + PartialEq + std::fmt::Debug>(state: S) {
        let mut out = Fields(Vec::new());
        state.encode(&mut out);
        let decoded = S::decode(&mut out.0.clone().into_iter(), S::ENCODING);
        assert_eq!(decoded.as_ref(), Some(&state));
        // every truncation is refused
        for len in 0..out.0.len() {
            assert!(S::decode(&mut out.0[..len].iter().copied(), S::ENCODING).is_none());
        }
        // an unknown encoding is refused
        for unknown in [0, S::ENCODING + 1] {
            assert!(S::decode(&mut out.0.clone().into_iter(), unknown).is_none());
        }
        let text: Vec<String> = out.0.iter().map(u64::to_string).collect();
        let args: Vec<&[u8]> = text.iter().map(|s| s.as_bytes()).collect();
        assert_eq!(decode_args::<S>(&args, S::ENCODING).as_ref(), Some(&state));
        let mut longer = args.clone();
        longer.push(b"0");
        assert!(decode_args::<S>(&longer, S::ENCODING).is_none());
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
            assert_eq!(out.0, fields, "{}", S::ALGORITHM);
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

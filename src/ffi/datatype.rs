//! Native module types: the callbacks the server calls on their values (RDB
//! load and save, AOF rewrite, digest, memory, copy, free) and on the RDB's
//! aux data, each a trampoline into a safe [`TypeMethods`] or [`AuxData`];
//! and the streams those see: [`RdbIo`], [`Rewrite`], [`Digest`].

use std::ffi::CStr;
use std::marker::PhantomData;
use std::os::raw::{c_int, c_void};
use std::ptr;
use std::sync::atomic::{AtomicPtr, Ordering};

use redis_module::raw;

use super::argv::RString;
use super::guard;
use super::register::Load;
use super::string::Owned;

/// What a native type does with its values: the safe side of its callbacks.
pub trait TypeMethods: 'static {
    /// What a key of this type holds.
    type Value: Clone + 'static;
    /// How a value sits in the key's value pointer: in a box ([`Boxed`]),
    /// or packed by a layout of its own.
    type Repr: Repr<Self::Value>;
    /// Reads a value written with `encoding`; `None` refuses the payload
    /// (the server then fails the load, or `RESTORE` answers an error).
    fn load(rdb: &mut RdbIo, encoding: i32) -> Option<Self::Value>;
    fn save(value: &Self::Value, rdb: &mut RdbIo);
    /// Writes the commands that rebuild `value` (an AOF rewrite).
    fn rewrite(value: &Self::Value, aof: &mut Rewrite);
    fn digest(value: &Self::Value, digest: &mut Digest);
    /// Bytes the value owns outside its own allocation (`MEMORY USAGE`).
    fn heap_bytes(value: &Self::Value) -> usize;
}

/// Data the RDB carries beside the keys, on one type (saved before them).
pub trait AuxData {
    fn save(rdb: &mut RdbIo);
    /// Reads what `save` wrote; `false` fails the load.
    fn load(rdb: &mut RdbIo) -> bool;
}

/// How values of type `V` sit in a key's value pointer: the server stores
/// that pointer, never reads through it, and hands it back only to the
/// type's callbacks and to [`Key::with_value`](super::Key::with_value).
///
/// # Safety
/// [`Repr::into_ptr`] never returns null (the server takes a null value for
/// a failed load), and the other functions accept every pointer
/// `into_ptr` or `with_mut` made, and only those: whatever `into_ptr`
/// allocated is freed once, by `free` or by the `with_mut` that replaced it.
pub unsafe trait Repr<V>: 'static {
    /// Gives `value` to the server as a value pointer.
    fn into_ptr(value: V) -> *mut c_void;
    /// Runs `f` on the value behind `ptr`, lent mutably; and, if the value
    /// now needs another pointer (its packing changed, or its block moved),
    /// that pointer, which the caller must store in place of `ptr` (already
    /// freed).
    ///
    /// # Safety
    /// `ptr` is a live value pointer of this representation, lent to no one
    /// else while `f` runs; and `f` does not unwind (a value may have moved
    /// before a panic, and only the pointer returned here knows where: the
    /// caller catches a panic inside `f`, stores the pointer, then resumes
    /// it).
    unsafe fn with_mut<R>(
        ptr: *mut c_void,
        f: impl FnOnce(&mut V) -> R,
    ) -> (R, Option<*mut c_void>);
    /// Runs `f` on the value behind `ptr`.
    ///
    /// # Safety
    /// As [`Repr::with_mut`], not lent mutably meanwhile.
    unsafe fn with_ref<R>(ptr: *const c_void, f: impl FnOnce(&V) -> R) -> R;
    /// Frees the value behind `ptr`.
    ///
    /// # Safety
    /// A live value pointer, given up by the server.
    unsafe fn free(ptr: *mut c_void);
    /// Bytes allocated for the pointer itself (0 for a value packed into
    /// it), as `size_of` tells the server's allocator's block sizes; not
    /// what the value owns beyond that ([`TypeMethods::heap_bytes`]).
    ///
    /// # Safety
    /// A live value pointer.
    unsafe fn allocated(ptr: *const c_void, size_of: Option<BlockSize>) -> usize;
    /// Bytes of the value behind `ptr` (`MEMORY USAGE`, without the
    /// server's wrappers): what is allocated for the pointer, and what the
    /// value owns beyond it (`heap_bytes`).
    ///
    /// # Safety
    /// A live value pointer.
    unsafe fn memory(
        ptr: *const c_void,
        size_of: Option<BlockSize>,
        heap_bytes: impl FnOnce(&V) -> usize,
    ) -> usize {
        // SAFETY: a live value pointer (the caller's contract).
        unsafe { Self::allocated(ptr, size_of) + Self::with_ref(ptr, heap_bytes) }
    }
}

/// [`Repr::with_mut`] for an `f` that may panic: the panic is caught inside
/// the call, the value's new pointer (if it moved) handed to `store`, and
/// only then the panic resumed, so that whoever holds the pointer never
/// keeps a freed one.
///
/// # Safety
/// As [`Repr::with_mut`], but for the unwinding of `f`.
#[inline(always)]
pub(super) unsafe fn with_mut_stored<V, P: Repr<V>, R>(
    ptr: *mut c_void,
    f: impl FnOnce(&mut V) -> R,
    store: impl FnOnce(*mut c_void),
) -> R {
    // SAFETY: the caller's contract; `f` cannot unwind out of `with_mut`.
    let (result, moved) = unsafe {
        P::with_mut(ptr, |value| {
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| f(value)))
        })
    };
    if let Some(moved) = moved {
        store(moved);
    }
    result.unwrap_or_else(|panic| std::panic::resume_unwind(panic))
}

/// The server allocator's size of a block (`RedisModule_MallocSize`).
pub type BlockSize = unsafe extern "C" fn(*mut c_void) -> usize;

/// A value in a box of its own: the pointer is a `Box<V>`.
pub struct Boxed;

// SAFETY: a box is never null; each function takes the box `into_ptr` made.
unsafe impl<V: 'static> Repr<V> for Boxed {
    #[inline(always)]
    fn into_ptr(value: V) -> *mut c_void {
        Box::into_raw(Box::new(value)).cast()
    }
    #[inline(always)]
    unsafe fn with_mut<R>(
        ptr: *mut c_void,
        f: impl FnOnce(&mut V) -> R,
    ) -> (R, Option<*mut c_void>) {
        // SAFETY: a live `Box<V>` lent to no one else (the caller's contract).
        (f(unsafe { &mut *ptr.cast::<V>() }), None)
    }
    #[inline(always)]
    unsafe fn with_ref<R>(ptr: *const c_void, f: impl FnOnce(&V) -> R) -> R {
        // SAFETY: a live `Box<V>`.
        f(unsafe { &*ptr.cast::<V>() })
    }
    unsafe fn free(ptr: *mut c_void) {
        // SAFETY: a live `Box<V>`, given up.
        drop(unsafe { Box::from_raw(ptr.cast::<V>()) });
    }
    unsafe fn allocated(ptr: *const c_void, size_of: Option<BlockSize>) -> usize {
        match size_of {
            // SAFETY: a block of the server's allocator.
            Some(size_of) => unsafe { size_of(ptr.cast_mut()) },
            None => std::mem::size_of::<V>(),
        }
    }
}

/// A native type once registered, for [`Key::with_value`](super::Key::with_value).
///
/// Sound because the server hands the module values only through the
/// callbacks `T` registered with this very type: a key whose type is this one
/// holds a value pointer of `T::Repr` that [`Key::set_value`](super::Key::set_value),
/// `rdb_load::<T>`, `copy::<T>` or a `with_mut` of `T::Repr` made, and
/// nothing else.
pub struct DataType<T> {
    ptr: AtomicPtr<raw::RedisModuleType>,
    _values: PhantomData<fn() -> T>,
}

impl<T> DataType<T> {
    pub const fn new() -> Self {
        DataType {
            ptr: AtomicPtr::new(ptr::null_mut()),
            _values: PhantomData,
        }
    }

    /// The server's type (null before registration).
    #[inline]
    pub(super) fn as_ptr(&self) -> *mut raw::RedisModuleType {
        self.ptr.load(Ordering::Relaxed)
    }
}

impl<T> Default for DataType<T> {
    fn default() -> Self {
        Self::new()
    }
}

/// Size of the `robj` and `moduleValue` the server allocates around every
/// module value; counted so that `MEMORY USAGE` tells the whole cost of a key.
const SERVER_WRAPPERS: usize = 16 + 16;

impl Load<'_> {
    /// Registers native type `T` as `kind`, named `name` (9 characters, what
    /// `TYPE key` shows), writing `encoding`.
    pub fn register_type<T: TypeMethods>(
        &self,
        kind: &'static DataType<T>,
        name: &CStr,
        encoding: i32,
    ) -> Result<(), &'static str> {
        self.create_type::<T>(kind, name, encoding, None)
    }

    /// [`Load::register_type`], the type also carrying aux data `A`.
    pub fn register_type_with_aux<T: TypeMethods, A: AuxData>(
        &self,
        kind: &'static DataType<T>,
        name: &CStr,
        encoding: i32,
    ) -> Result<(), &'static str> {
        self.create_type::<T>(kind, name, encoding, Some((aux_save::<A>, aux_load::<A>)))
    }

    fn create_type<T: TypeMethods>(
        &self,
        kind: &'static DataType<T>,
        name: &CStr,
        encoding: i32,
        aux: Option<(AuxSaveFn, AuxLoadFn)>,
    ) -> Result<(), &'static str> {
        let mut methods = raw::RedisModuleTypeMethods {
            // Version 3 carries the copy callback (Redis 6.2+); no later field is used.
            version: 3,
            rdb_load: Some(rdb_load::<T>),
            rdb_save: Some(rdb_save::<T>),
            aof_rewrite: Some(aof_rewrite::<T>),
            mem_usage: Some(mem_usage::<T>),
            digest: Some(digest::<T>),
            free: Some(free::<T>),
            aux_load: aux.map(|(_, load)| load),
            aux_save: aux.map(|(save, _)| save),
            aux_save_triggers: if aux.is_some() {
                raw::REDISMODULE_AUX_BEFORE_RDB as c_int
            } else {
                0
            },
            free_effort: None,
            unlink: None,
            copy: Some(copy::<T>),
            defrag: None,
            mem_usage2: None,
            free_effort2: None,
            unlink2: None,
            copy2: None,
            aux_save2: None,
        };
        // SAFETY: the load context; the server copies the methods and the
        // name.
        let created = unsafe {
            api!(RedisModule_CreateDataType)(
                self.ctx().as_ptr(),
                name.as_ptr(),
                encoding,
                &mut methods,
            )
        };
        if created.is_null() {
            return Err("could not create a data type");
        }
        kind.ptr.store(created, Ordering::Relaxed);
        Ok(())
    }
}

type AuxSaveFn = unsafe extern "C" fn(*mut raw::RedisModuleIO, c_int);
type AuxLoadFn = unsafe extern "C" fn(*mut raw::RedisModuleIO, c_int, c_int) -> c_int;

/// An RDB being written or read (also a `DUMP`/`RESTORE` payload).
pub struct RdbIo {
    io: *mut raw::RedisModuleIO,
}

impl RdbIo {
    pub fn save_unsigned(&mut self, value: u64) {
        // SAFETY: the live stream the server passed to this callback.
        unsafe { api!(RedisModule_SaveUnsigned)(self.io, value) };
    }

    pub fn save_bytes(&mut self, bytes: &[u8]) {
        // SAFETY: a live stream and `bytes.len()` readable bytes.
        unsafe { api!(RedisModule_SaveStringBuffer)(self.io, bytes.as_ptr().cast(), bytes.len()) };
    }

    /// The next unsigned integer, or `None` if the stream is broken or short.
    pub fn load_unsigned(&mut self) -> Option<u64> {
        // SAFETY: a live stream; the module set HANDLE_IO_ERRORS, so a
        // failed read returns and is told by `IsIOError`.
        let value = unsafe { api!(RedisModule_LoadUnsigned)(self.io) };
        (!self.failed()).then_some(value)
    }

    /// The next byte string, or `None` if the stream is broken or short.
    pub fn load_bytes(&mut self) -> Option<Vec<u8>> {
        let mut len = 0usize;
        // SAFETY: a live stream, as in `load_unsigned`.
        let buf = unsafe { api!(RedisModule_LoadStringBuffer)(self.io, &mut len) };
        if buf.is_null() {
            return None;
        }
        // SAFETY: the server's buffer of `len` bytes, copied, then freed
        // once with the server's allocator, which made it.
        let out = unsafe {
            let out = std::slice::from_raw_parts(buf.cast::<u8>(), len).to_vec();
            api!(RedisModule_Free)(buf.cast());
            out
        };
        (!self.failed()).then_some(out)
    }

    fn failed(&self) -> bool {
        // SAFETY: a live stream.
        unsafe { api!(RedisModule_IsIOError)(self.io) != 0 }
    }
}

/// An AOF rewrite: the commands that rebuild one key.
pub struct Rewrite<'a> {
    io: *mut raw::RedisModuleIO,
    key: &'a RString,
}

impl Rewrite<'_> {
    /// Writes `command key args...`.
    pub fn emit(&mut self, command: &CStr, args: &[&[u8]]) {
        let strings: Vec<Owned> = args.iter().map(|a| Owned::from_bytes(a)).collect();
        let pointers: Vec<*mut raw::RedisModuleString> =
            strings.iter().map(Owned::as_ptr).collect();
        // SAFETY: the live stream of this callback, the live key name, and
        // `pointers.len()` live strings ("v"), freed after the server wrote
        // them.
        unsafe {
            api!(RedisModule_EmitAOF)(
                self.io,
                command.as_ptr(),
                c"sv".as_ptr(),
                self.key.as_ptr(),
                pointers.as_ptr(),
                pointers.len(),
            )
        };
    }
}

/// A `DEBUG DIGEST` being computed.
pub struct Digest {
    md: *mut raw::RedisModuleDigest,
}

impl Digest {
    pub fn add_integer(&mut self, value: i64) {
        // SAFETY: the live digest of this callback.
        unsafe { api!(RedisModule_DigestAddLongLong)(self.md, value) };
    }
}

/// # Safety (of every callback below)
/// The server calls them with the live stream, digest or key name of the
/// call, and a `value` of the type they were registered for: a value
/// pointer of `T::Repr` (see [`DataType`]).
unsafe extern "C" fn rdb_load<T: TypeMethods>(
    rdb: *mut raw::RedisModuleIO,
    encver: c_int,
) -> *mut c_void {
    guard::callback(ptr::null_mut(), || {
        match T::load(&mut RdbIo { io: rdb }, encver) {
            Some(value) => T::Repr::into_ptr(value),
            None => ptr::null_mut(),
        }
    })
}

unsafe extern "C" fn rdb_save<T: TypeMethods>(rdb: *mut raw::RedisModuleIO, value: *mut c_void) {
    guard::callback((), || {
        // SAFETY: a value of type `T` (see above).
        unsafe { T::Repr::with_ref(value, |value| T::save(value, &mut RdbIo { io: rdb })) };
    })
}

unsafe extern "C" fn aof_rewrite<T: TypeMethods>(
    aof: *mut raw::RedisModuleIO,
    key: *mut raw::RedisModuleString,
    value: *mut c_void,
) {
    guard::callback((), || {
        // SAFETY: the live name of the key.
        let key = unsafe { RString::from_ptr(key) };
        // SAFETY: a value of type `T`.
        unsafe {
            T::Repr::with_ref(value, |value| {
                T::rewrite(value, &mut Rewrite { io: aof, key })
            })
        };
    })
}

unsafe extern "C" fn mem_usage<T: TypeMethods>(value: *const c_void) -> usize {
    guard::callback(std::mem::size_of::<T::Value>() + SERVER_WRAPPERS, || {
        // SAFETY: a plain read of a function pointer set at load (absent on
        // old servers).
        let size_of = unsafe { raw::RedisModule_MallocSize };
        // SAFETY: a value of type `T`, allocated (if at all) by the server's
        // allocator.
        unsafe { T::Repr::memory(value, size_of, T::heap_bytes) + SERVER_WRAPPERS }
    })
}

unsafe extern "C" fn digest<T: TypeMethods>(md: *mut raw::RedisModuleDigest, value: *mut c_void) {
    guard::callback((), || {
        // SAFETY: a value of type `T`.
        unsafe { T::Repr::with_ref(value, |value| T::digest(value, &mut Digest { md })) };
        // SAFETY: the live digest of this call.
        unsafe { api!(RedisModule_DigestEndSequence)(md) };
    })
}

unsafe extern "C" fn free<T: TypeMethods>(value: *mut c_void) {
    guard::callback((), || {
        // SAFETY: a value of type `T`, which the server gives up here.
        unsafe { T::Repr::free(value) };
    })
}

unsafe extern "C" fn copy<T: TypeMethods>(
    _from: *mut raw::RedisModuleString,
    _to: *mut raw::RedisModuleString,
    value: *const c_void,
) -> *mut c_void {
    guard::callback(ptr::null_mut(), || {
        // SAFETY: a value of type `T`.
        unsafe { T::Repr::with_ref(value, |value| T::Repr::into_ptr(value.clone())) }
    })
}

unsafe extern "C" fn aux_save<A: AuxData>(rdb: *mut raw::RedisModuleIO, _when: c_int) {
    guard::callback((), || A::save(&mut RdbIo { io: rdb }))
}

/// `_encver` is the encoding version of the type carrying the aux data, which
/// says nothing of the aux data: it carries its own inside its payload.
unsafe extern "C" fn aux_load<A: AuxData>(
    rdb: *mut raw::RedisModuleIO,
    _encver: c_int,
    _when: c_int,
) -> c_int {
    let failed = raw::REDISMODULE_ERR as c_int;
    guard::callback(failed, || {
        if A::load(&mut RdbIo { io: rdb }) {
            raw::REDISMODULE_OK as c_int
        } else {
            failed
        }
    })
}

//! `floor`: the minimal module command on a limiter's key path, for the
//! benchmark only (`make bench` loads it beside the module).
//!
//! - `FLOOR.HIT key ttl_ms`: opens the key for writing, creates or mutates
//!   in place an 8-byte native value (a boxed counter), sets the key's expiry
//!   to `ttl_ms` from now, signals the write, and replies five integers.
//!   What any limiter command must do at least, and nothing else.
//! - `FLOOR.PTR key ttl_ms`: the same, with the 8 bytes carried in the value
//!   pointer itself (no allocation for the value): the smallest module key
//!   with a TTL, for the memory table.
//!
//! No replication, no keyspace events, no argument checks beyond what keeps
//! the server safe: it is a yardstick, not a product.

#![allow(clippy::missing_safety_doc)]

use std::os::raw::{c_int, c_void};
use std::ptr;
use std::sync::atomic::{AtomicPtr, Ordering};

use redis_module::raw;

static BOXED: AtomicPtr<raw::RedisModuleType> = AtomicPtr::new(ptr::null_mut());
static INLINE: AtomicPtr<raw::RedisModuleType> = AtomicPtr::new(ptr::null_mut());

const OK: c_int = raw::REDISMODULE_OK as c_int;
const ERR: c_int = raw::REDISMODULE_ERR as c_int;

macro_rules! api {
    ($name:ident) => {{
        #[allow(unused_unsafe)]
        // SAFETY: a read of a function pointer the server set at load.
        let function = unsafe { raw::$name };
        function.expect(stringify!($name))
    }};
}

unsafe extern "C" fn free_boxed(value: *mut c_void) {
    drop(unsafe { Box::from_raw(value.cast::<u64>()) });
}
unsafe extern "C" fn free_inline(_value: *mut c_void) {}
unsafe extern "C" fn save_boxed(io: *mut raw::RedisModuleIO, value: *mut c_void) {
    unsafe { api!(RedisModule_SaveUnsigned)(io, *value.cast::<u64>()) };
}
unsafe extern "C" fn load_boxed(io: *mut raw::RedisModuleIO, _encver: c_int) -> *mut c_void {
    let v = unsafe { api!(RedisModule_LoadUnsigned)(io) };
    Box::into_raw(Box::new(v)).cast()
}
unsafe extern "C" fn save_inline(io: *mut raw::RedisModuleIO, value: *mut c_void) {
    unsafe { api!(RedisModule_SaveUnsigned)(io, value as usize as u64) };
}
unsafe extern "C" fn load_inline(io: *mut raw::RedisModuleIO, _encver: c_int) -> *mut c_void {
    let v = unsafe { api!(RedisModule_LoadUnsigned)(io) };
    v.max(1) as usize as *mut c_void
}

/// The command body shared by both forms; `inline` picks the value kind.
unsafe fn hit(
    ctx: *mut raw::RedisModuleCtx,
    argv: *mut *mut raw::RedisModuleString,
    argc: c_int,
    inline: bool,
) -> c_int {
    if argc != 3 {
        return unsafe { api!(RedisModule_WrongArity)(ctx) };
    }
    let (key_name, ttl) = unsafe { (*argv.add(1), *argv.add(2)) };
    let mut ttl_ms: i64 = 0;
    if unsafe { api!(RedisModule_StringToLongLong)(ttl, &mut ttl_ms) } != OK || ttl_ms <= 0 {
        return unsafe { api!(RedisModule_ReplyWithError)(ctx, c"ERR bad ttl_ms".as_ptr()) };
    }
    let kind = if inline { &INLINE } else { &BOXED }.load(Ordering::Relaxed);
    let mode = (raw::REDISMODULE_READ | raw::REDISMODULE_WRITE) as c_int;
    let key =
        unsafe { api!(RedisModule_OpenKey)(ctx, key_name, mode) }.cast::<raw::RedisModuleKey>();
    let count = unsafe {
        match api!(RedisModule_KeyType)(key) as isize {
            t if t == raw::REDISMODULE_KEYTYPE_EMPTY => {
                let value: *mut c_void = if inline {
                    std::ptr::dangling_mut::<c_void>()
                } else {
                    Box::into_raw(Box::new(1u64)).cast()
                };
                api!(RedisModule_ModuleTypeSetValue)(key, kind, value);
                1
            }
            t if t == raw::REDISMODULE_KEYTYPE_MODULE
                && api!(RedisModule_ModuleTypeGetType)(key) == kind =>
            {
                let value = api!(RedisModule_ModuleTypeGetValue)(key);
                if inline {
                    let next = value as usize as u64 + 1;
                    api!(RedisModule_ModuleTypeReplaceValue)(
                        key,
                        kind,
                        next as usize as *mut c_void,
                        ptr::null_mut(),
                    );
                    next
                } else {
                    let counter = &mut *value.cast::<u64>();
                    *counter += 1;
                    *counter
                }
            }
            _ => {
                api!(RedisModule_CloseKey)(key);
                return api!(RedisModule_ReplyWithError)(ctx, c"WRONGTYPE".as_ptr());
            }
        }
    };
    unsafe {
        api!(RedisModule_SetExpire)(key, ttl_ms);
        api!(RedisModule_SignalModifiedKey)(ctx, key_name);
        api!(RedisModule_CloseKey)(key);
        api!(RedisModule_ReplyWithArray)(ctx, 5);
        for v in [1, 100, 100 - (count % 100) as i64, 0, ttl_ms] {
            api!(RedisModule_ReplyWithLongLong)(ctx, v);
        }
    }
    OK
}

unsafe extern "C" fn floor_hit(
    ctx: *mut raw::RedisModuleCtx,
    argv: *mut *mut raw::RedisModuleString,
    argc: c_int,
) -> c_int {
    unsafe { hit(ctx, argv, argc, false) }
}

unsafe extern "C" fn floor_ptr(
    ctx: *mut raw::RedisModuleCtx,
    argv: *mut *mut raw::RedisModuleString,
    argc: c_int,
) -> c_int {
    unsafe { hit(ctx, argv, argc, true) }
}

/// The module's entry point.
#[no_mangle]
pub unsafe extern "C" fn RedisModule_OnLoad(
    ctx: *mut raw::RedisModuleCtx,
    _argv: *mut *mut raw::RedisModuleString,
    _argc: c_int,
) -> c_int {
    let init = unsafe {
        raw::Export_RedisModule_Init(
            ctx,
            c"floor".as_ptr(),
            1,
            raw::REDISMODULE_APIVER_1 as c_int,
        )
    };
    if init != OK {
        return ERR;
    }
    for (name, store, load, save, free) in [
        (
            c"floor-box",
            &BOXED,
            load_boxed as _,
            save_boxed as _,
            free_boxed as _,
        ),
        (
            c"floor-ptr",
            &INLINE,
            load_inline as _,
            save_inline as _,
            free_inline as _,
        ),
    ] {
        let mut methods = raw::RedisModuleTypeMethods {
            version: 1,
            rdb_load: Some(load),
            rdb_save: Some(save),
            aof_rewrite: None,
            mem_usage: None,
            digest: None,
            free: Some(free),
            aux_load: None,
            aux_save: None,
            aux_save_triggers: 0,
            free_effort: None,
            unlink: None,
            copy: None,
            defrag: None,
            mem_usage2: None,
            free_effort2: None,
            unlink2: None,
            copy2: None,
            aux_save2: None,
        };
        let created =
            unsafe { api!(RedisModule_CreateDataType)(ctx, name.as_ptr(), 1, &mut methods) };
        if created.is_null() {
            return ERR;
        }
        store.store(created, Ordering::Relaxed);
    }
    let commands: [(&std::ffi::CStr, raw::RedisModuleCmdFunc); 2] = [
        (c"FLOOR.HIT", Some(floor_hit)),
        (c"FLOOR.PTR", Some(floor_ptr)),
    ];
    for (name, f) in commands {
        let flags = c"write fast";
        if unsafe {
            api!(RedisModule_CreateCommand)(ctx, name.as_ptr(), f, flags.as_ptr(), 1, 1, 1)
        } != OK
        {
            return ERR;
        }
    }
    OK
}

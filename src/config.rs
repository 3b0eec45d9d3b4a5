//! Module configs: `ratelimit.*`, readable and settable with `CONFIG GET/SET`,
//! in redis.conf or on the command line (`--ratelimit.sliding-max-limit 5000`),
//! and as load arguments (`loadmodule /path/lib.so sliding-max-limit 5000`;
//! a value in redis.conf or on the command line wins over a load argument).
//!
//! They bound what clients may ask of one key. A replicated or AOF call is
//! never refused by them: the master already accepted it.

use std::ffi::CStr;
use std::os::raw::{c_char, c_int, c_longlong, c_void};
use std::sync::atomic::{AtomicU64, Ordering};

use redis_module::raw;

use crate::limiter::sliding_log;

/// Largest `limit` of `RL.SLIDING` (each held unit costs up to 8 bytes).
pub static SLIDING_MAX_LIMIT: AtomicU64 = AtomicU64::new(100_000);
/// Largest `window_ms / bucket_ms` of `RL.HASHWINDOW` (8 bytes per bucket).
pub static HASHWINDOW_MAX_BUCKETS: AtomicU64 = AtomicU64::new(3600);

/// Size of the deny log (`RL.LOG`); 0 turns it off.
pub static LOG_MAX_LEN: AtomicU64 = AtomicU64::new(128);

/// One numeric config.
pub struct Numeric {
    /// Name without the `ratelimit.` prefix.
    pub name: &'static CStr,
    pub value: &'static AtomicU64,
    pub min: u64,
    pub max: u64,
}

/// Every config the module registers.
pub const NUMERIC: [Numeric; 3] = [
    Numeric {
        name: c"sliding-max-limit",
        value: &SLIDING_MAX_LIMIT,
        min: 1,
        max: sliding_log::MAX_LIMIT,
    },
    Numeric {
        name: c"hashwindow-max-buckets",
        value: &HASHWINDOW_MAX_BUCKETS,
        min: 1,
        max: 1_000_000,
    },
    Numeric {
        name: c"log-max-len",
        value: &LOG_MAX_LEN,
        min: 0,
        max: 1_000_000,
    },
];

/// Current value of a config.
pub fn get(value: &AtomicU64) -> u64 {
    value.load(Ordering::Relaxed)
}

/// Applies `name value` pairs given as load arguments (before registration,
/// so they become the defaults). Nothing is applied if any pair is wrong.
pub fn apply_load_arguments(args: &[&[u8]]) -> Result<(), String> {
    for (value, parsed) in parse_load_arguments(args)? {
        value.store(parsed, Ordering::Relaxed);
    }
    Ok(())
}

/// Checks load arguments and says which config takes which value, without
/// changing anything (pure, so that it can be tested and fuzzed alone).
pub fn parse_load_arguments(args: &[&[u8]]) -> Result<Vec<(&'static AtomicU64, u64)>, String> {
    if !args.len().is_multiple_of(2) {
        return Err("load arguments come in pairs: <config> <value>".into());
    }
    let mut parsed = Vec::with_capacity(args.len() / 2);
    for pair in args.chunks(2) {
        let name = pair[0].strip_prefix(b"ratelimit.").unwrap_or(pair[0]);
        let config = NUMERIC
            .iter()
            .find(|c| c.name.to_bytes().eq_ignore_ascii_case(name))
            .ok_or_else(|| format!("unknown config '{}'", crate::error::Error::quote(pair[0])))?;
        let value =
            crate::args::parse_int(pair[1], "value", config.min, config.max).map_err(|e| {
                format!(
                    "ratelimit.{}: {}",
                    config.name.to_string_lossy(),
                    e.message()
                )
            })?;
        parsed.push((config.value, value));
    }
    Ok(parsed)
}

/// Registers the configs with the server and loads their values from the
/// server's configuration.
///
/// # Safety
/// `ctx` must be the context passed to `RedisModule_OnLoad`.
pub unsafe fn register(ctx: *mut raw::RedisModuleCtx) -> Result<(), &'static CStr> {
    let (Some(register), Some(load)) =
        (unsafe { raw::RedisModule_RegisterNumericConfig }, unsafe {
            raw::RedisModule_LoadConfigs
        })
    else {
        // Servers before 7.0: the bounds keep their defaults.
        return Ok(());
    };
    for config in &NUMERIC {
        let status = unsafe {
            register(
                ctx,
                config.name.as_ptr(),
                get(config.value) as c_longlong,
                raw::REDISMODULE_CONFIG_DEFAULT,
                config.min as c_longlong,
                config.max as c_longlong,
                Some(get_numeric),
                Some(set_numeric),
                None,
                config.value as *const AtomicU64 as *mut c_void,
            )
        };
        if status != raw::REDISMODULE_OK as c_int {
            return Err(c"could not register a config");
        }
    }
    if unsafe { load(ctx) } != raw::REDISMODULE_OK as c_int {
        return Err(c"could not load the configs");
    }
    Ok(())
}

unsafe extern "C" fn get_numeric(_name: *const c_char, privdata: *mut c_void) -> c_longlong {
    crate::guard::callback(0, || {
        get(unsafe { &*(privdata as *const AtomicU64) }) as c_longlong
    })
}

unsafe extern "C" fn set_numeric(
    _name: *const c_char,
    value: c_longlong,
    privdata: *mut c_void,
    _err: *mut *mut raw::RedisModuleString,
) -> c_int {
    // Redis has checked the range given at registration.
    crate::guard::callback(raw::REDISMODULE_ERR as c_int, || {
        let config = unsafe { &*(privdata as *const AtomicU64) };
        config.store(value as u64, Ordering::Relaxed);
        if std::ptr::eq(config, &LOG_MAX_LEN) {
            crate::deny_log::trim(value as usize);
        }
        raw::REDISMODULE_OK as c_int
    })
}

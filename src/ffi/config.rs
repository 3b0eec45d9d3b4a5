//! Module configs (`CONFIG GET/SET <module>.<name>`).

use std::ffi::CStr;
use std::os::raw::{c_char, c_int, c_longlong, c_uint, c_void};
use std::sync::atomic::{AtomicU64, Ordering};

use redis_module::raw;

use super::guard;
use super::register::Load;

/// One numeric config: its name (without the module's prefix), where its
/// value lives, its range, and what else changes with it.
pub struct NumericConfig {
    pub name: &'static CStr,
    pub value: &'static AtomicU64,
    pub min: u64,
    pub max: u64,
    /// Called after each change, with the new value.
    pub changed: Option<fn(u64)>,
    /// Set only at startup (load arguments, redis.conf, the command line):
    /// `CONFIG SET` refuses it, `CONFIG GET` shows it.
    pub immutable: bool,
}

impl Load<'_> {
    /// Registers `configs` and loads their values from the server's
    /// configuration. Servers before 7.0 have no module configs: the values
    /// stay as they are.
    pub fn register_configs(
        &self,
        configs: &'static [&'static NumericConfig],
    ) -> Result<(), &'static str> {
        // SAFETY: plain reads of function pointers set at load (absent before 7.0).
        let (Some(register), Some(load)) =
            (unsafe { raw::RedisModule_RegisterNumericConfig }, unsafe {
                raw::RedisModule_LoadConfigs
            })
        else {
            return Ok(());
        };
        for &config in configs {
            // SAFETY: the load context, a NUL-terminated name, callbacks that
            // live as long as the module, and a `privdata` that is a
            // `&'static NumericConfig`, as the callbacks read it.
            let status = unsafe {
                register(
                    self.ctx().as_ptr(),
                    config.name.as_ptr(),
                    config.value.load(Ordering::Relaxed) as c_longlong,
                    if config.immutable {
                        raw::REDISMODULE_CONFIG_IMMUTABLE
                    } else {
                        raw::REDISMODULE_CONFIG_DEFAULT
                    } as c_uint,
                    config.min as c_longlong,
                    config.max as c_longlong,
                    Some(get_numeric),
                    Some(set_numeric),
                    None,
                    (config as *const NumericConfig).cast_mut().cast::<c_void>(),
                )
            };
            if status != raw::REDISMODULE_OK as c_int {
                return Err("could not register a config");
            }
        }
        // SAFETY: the load context.
        if unsafe { load(self.ctx().as_ptr()) } != raw::REDISMODULE_OK as c_int {
            return Err("could not load the configs");
        }
        Ok(())
    }
}

unsafe extern "C" fn get_numeric(_name: *const c_char, privdata: *mut c_void) -> c_longlong {
    // SAFETY: the `&'static NumericConfig` given at registration.
    let config = unsafe { &*privdata.cast::<NumericConfig>() };
    guard::callback(0, || config.value.load(Ordering::Relaxed) as c_longlong)
}

unsafe extern "C" fn set_numeric(
    _name: *const c_char,
    value: c_longlong,
    privdata: *mut c_void,
    _err: *mut *mut raw::RedisModuleString,
) -> c_int {
    // SAFETY: the `&'static NumericConfig` given at registration.
    let config = unsafe { &*privdata.cast::<NumericConfig>() };
    // The server has checked the range given at registration.
    guard::callback(raw::REDISMODULE_ERR as c_int, || {
        config.value.store(value as u64, Ordering::Relaxed);
        if let Some(changed) = config.changed {
            changed(value as u64);
        }
        raw::REDISMODULE_OK as c_int
    })
}

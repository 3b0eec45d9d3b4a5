//! The module's `INFO` section.

use std::ffi::CString;
use std::os::raw::c_int;

use redis_module::raw;

use super::entry::function;
use super::guard;
use super::register::Load;

/// The section being written, for the function [`Load::register_info`] took.
pub struct InfoContext {
    ctx: *mut raw::RedisModuleInfoCtx,
}

impl InfoContext {
    /// Starts the module's section (`# ratelimit`); the fields follow.
    pub fn section(&mut self) {
        // SAFETY: the live info context; an empty name is the module's own
        // section.
        unsafe { api!(RedisModule_InfoAddSection)(self.ctx, c"".as_ptr()) };
    }

    /// A field `<module>_<name>:<value>`, or `<name>=<value>` inside a dict.
    pub fn field(&mut self, name: &str, value: u64) {
        let name = c_name(name);
        // SAFETY: the live info context and a NUL-terminated name, copied.
        unsafe { api!(RedisModule_InfoAddFieldULongLong)(self.ctx, name.as_ptr(), value) };
    }

    /// Starts a line `<module>_<name>:k=v,...` made of the next fields.
    pub fn begin_dict(&mut self, name: &str) {
        let name = c_name(name);
        // SAFETY: as in `field`.
        unsafe { api!(RedisModule_InfoBeginDictField)(self.ctx, name.as_ptr()) };
    }

    pub fn end_dict(&mut self) {
        // SAFETY: the live info context, inside a dict field.
        unsafe { api!(RedisModule_InfoEndDictField)(self.ctx) };
    }
}

/// `name` without NUL bytes, NUL-terminated.
fn c_name(name: &str) -> CString {
    CString::new(name.replace('\0', "")).unwrap_or_default()
}

impl Load<'_> {
    /// Makes `write` the writer of the module's `INFO` section.
    pub fn register_info<F>(&self, write: F) -> Result<(), &'static str>
    where
        F: Fn(&mut InfoContext) + Copy + 'static,
    {
        let _ = write;
        // SAFETY: the load context and a callback that lives as long as the
        // module.
        let status = unsafe {
            api!(RedisModule_RegisterInfoFunc)(self.ctx().as_ptr(), Some(info_trampoline::<F>))
        };
        if status != raw::REDISMODULE_OK as c_int {
            return Err("could not register the INFO section");
        }
        Ok(())
    }
}

unsafe extern "C" fn info_trampoline<F>(ctx: *mut raw::RedisModuleInfoCtx, _for_crash_report: c_int)
where
    F: Fn(&mut InfoContext) + Copy + 'static,
{
    let write = function::<F>();
    guard::callback((), || write(&mut InfoContext { ctx }));
}

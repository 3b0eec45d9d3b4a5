//! Server events the module follows.

use std::os::raw::{c_int, c_void};

use redis_module::raw;

use super::context::Context;
use super::entry::function;
use super::guard;
use super::register::Load;

/// A server event, as the module tells them apart.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ServerEvent {
    /// A child process was forked (a full sync, an AOF rewrite, `BGSAVE`).
    Fork,
    /// The server became a master or a replica.
    RoleChanged,
    /// A replica connected or went away.
    ReplicaChanged,
    /// Data is being loaded; `starts` when a load (RDB, AOF or from the
    /// master) begins.
    Loading { starts: bool },
}

impl Load<'_> {
    /// Makes `handle` the handler of every [`ServerEvent`]; whether the
    /// server accepted every subscription.
    pub fn subscribe<F>(&self, handle: F) -> bool
    where
        F: Fn(&Context, ServerEvent) + Copy + 'static,
    {
        let _ = handle;
        let events = [
            raw::REDISMODULE_EVENT_FORK_CHILD,
            raw::REDISMODULE_EVENT_REPLICATION_ROLE_CHANGED,
            raw::REDISMODULE_EVENT_REPLICA_CHANGE,
            raw::REDISMODULE_EVENT_LOADING,
        ];
        let mut subscribed = true;
        for id in events {
            let event = raw::RedisModuleEvent { id, dataver: 1 };
            // SAFETY: the load context and a callback that lives as long as
            // the module.
            let status = unsafe {
                api!(RedisModule_SubscribeToServerEvent)(
                    self.ctx().as_ptr(),
                    event,
                    Some(event_trampoline::<F>),
                )
            };
            subscribed &= status == raw::REDISMODULE_OK as c_int;
        }
        subscribed
    }
}

unsafe extern "C" fn event_trampoline<F>(
    ctx: *mut raw::RedisModuleCtx,
    event: raw::RedisModuleEvent,
    subevent: u64,
    _data: *mut c_void,
) where
    F: Fn(&Context, ServerEvent) + Copy + 'static,
{
    guard::callback((), || {
        let loading_starts = [
            raw::REDISMODULE_SUBEVENT_LOADING_RDB_START,
            raw::REDISMODULE_SUBEVENT_LOADING_AOF_START,
            raw::REDISMODULE_SUBEVENT_LOADING_REPL_START,
        ];
        let event = match event.id {
            raw::REDISMODULE_EVENT_FORK_CHILD => ServerEvent::Fork,
            raw::REDISMODULE_EVENT_REPLICATION_ROLE_CHANGED => ServerEvent::RoleChanged,
            raw::REDISMODULE_EVENT_REPLICA_CHANGE => ServerEvent::ReplicaChanged,
            raw::REDISMODULE_EVENT_LOADING => ServerEvent::Loading {
                starts: loading_starts.contains(&subevent),
            },
            _ => return,
        };
        // SAFETY: the server calls an event handler with its live context,
        // for the duration of this call.
        let ctx = unsafe { Context::from_ptr(ctx) };
        function::<F>()(&ctx, event);
    })
}

//! The commands and options beside the five limiters: `RL.ALL`, policies,
//! refunds and forced calls, notifications, `INFO` and the deny log, module
//! configs, what the server reports about the commands, encodings already
//! written, allocations on the hot path, transactions and scripts, and
//! `maxmemory`.

mod allocations;
mod blocking;
mod commands_meta;
mod encodings;
mod module_config;
mod notifications;
mod observability;
mod out_of_memory;
mod policies;
mod protection;
mod refund_force;
mod rl_all;
mod throttle;
mod transactions;
mod upto;

//! The integration tests: one test binary (`cargo test --release --test
//! integration`) that starts real `redis-server` and `valkey-server`
//! processes with the module loaded. Folders by concern (see
//! `tests/README.md`):
//!
//! - `contract`: what every limiter command promises, checked for all of
//!   them from one table of algorithms (`harness/contract.rs`);
//! - `algorithms`: what only one algorithm promises;
//! - `features`: the commands and options beside the limiters;
//! - `operations`: clusters, faults, crashes, load and expiry at scale.
//!
//! `harness` starts the servers and talks to them.

mod algorithms;
mod contract;
mod features;
mod harness;
mod operations;

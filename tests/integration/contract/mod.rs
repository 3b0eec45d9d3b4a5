//! What every limiter command promises, written once and checked for each of
//! the seven algorithms of the table in `harness/contract.rs` (which a test
//! there keeps equal to the core's list); a promise that cannot be checked
//! for one of them within a test is skipped by what its row says.

mod decisions;
mod errors;
mod file;
mod persistence;
mod replication;

//! What every limiter command promises, written once and checked for each
//! algorithm of the table in `harness/contract.rs`.

mod decisions;
mod errors;
mod file;
mod persistence;
mod replication;

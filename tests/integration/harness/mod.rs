//! The harness the integration tests share:
//!
//! - `server`: the server processes, their ports, replicas, and comparing a
//!   replica with its master;
//! - `client`: connections, commands and replies, `INFO` readings;
//! - `traffic`: mixed limiter traffic for load and fault tests;
//! - `cluster`: a real Redis Cluster of such servers;
//! - `contract`: the seven limiter commands as data, for the contract tests;
//! - `payload`: `DUMP` payloads taken apart and sealed again.
//!
//! Synchronisation is always by polling a condition with a deadline, never by
//! sleeping for a fixed time.

pub mod cluster;
pub mod contract;
pub mod payload;

mod client;
mod server;
mod traffic;

pub use client::*;
pub use server::*;
pub use traffic::*;

use std::fmt;
use std::thread::sleep;
use std::time::{Duration, Instant};

/// Polls `condition` every few milliseconds until it holds; panics naming
/// `what` if it does not within `timeout`.
pub fn poll_until(what: &str, timeout: Duration, mut condition: impl FnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    loop {
        if condition() {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "timed out after {timeout:?} waiting for: {what}"
        );
        sleep(Duration::from_millis(5));
    }
}

/// Polls `read` every few milliseconds until `done` holds for what it read,
/// and returns that; panics naming `what` and the last value read if that
/// does not happen within `timeout`.
pub fn poll_for<T: fmt::Debug>(
    what: &str,
    timeout: Duration,
    mut read: impl FnMut() -> T,
    done: impl Fn(&T) -> bool,
) -> T {
    let deadline = Instant::now() + timeout;
    loop {
        let value = read();
        if done(&value) {
            return value;
        }
        assert!(
            Instant::now() < deadline,
            "timed out after {timeout:?} waiting for: {what} (last read: {value:?})"
        );
        sleep(Duration::from_millis(5));
    }
}

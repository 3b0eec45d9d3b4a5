//! Counters for `INFO ratelimit`: calls, admissions, denials and peeks per
//! algorithm (kept by the table of algorithms), for `RL.ALL` as a whole
//! (here), and per policy (in `policy.rs`). `info.rs` writes them out.
//!
//! Every counter is written only by the server's main thread, so a bump is a
//! plain load and store, not a locked read-modify-write.

use std::sync::atomic::{AtomicU64, Ordering};

use crate::limiter::Decision;

/// One monotonically growing count.
#[derive(Default)]
pub struct Counter(AtomicU64);

impl Counter {
    pub const fn new() -> Self {
        Counter(AtomicU64::new(0))
    }
    pub fn bump(&self) {
        self.0
            .store(self.0.load(Ordering::Relaxed) + 1, Ordering::Relaxed);
    }
    pub fn get(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

/// What happened to the calls of one algorithm or policy:
/// `calls = admitted + denied + peeks`.
#[derive(Default)]
pub struct Outcomes {
    pub calls: Counter,
    /// Admitted with a cost (units taken).
    pub admitted: Counter,
    pub denied: Counter,
    /// `COST 0` calls.
    pub peeks: Counter,
}

impl Outcomes {
    pub const fn new() -> Self {
        Outcomes {
            calls: Counter::new(),
            admitted: Counter::new(),
            denied: Counter::new(),
            peeks: Counter::new(),
        }
    }

    pub fn record(&self, decision: &Decision, cost: u64) {
        self.record_outcome(decision.allowed, cost);
    }

    /// [`Outcomes::record`] of a call that was `allowed` or not.
    pub fn record_outcome(&self, allowed: bool, cost: u64) {
        self.calls.bump();
        if cost == 0 {
            self.peeks.bump();
        } else if allowed {
            self.admitted.bump();
        } else {
            self.denied.bump();
        }
    }
}

/// `CL.THROTTLE` and `RL.THROTTLE` calls (`quantity 0` counts as a peek).
pub static THROTTLE: Outcomes = Outcomes::new();

/// `RL.ALL` calls as a whole (each limiter in them also counts for its
/// algorithm).
pub static ALL: Outcomes = Outcomes::new();

/// `UPTO n` calls, module-wide (each also counts as a call of its algorithm,
/// its policy or `RL.ALL`): how many, the units they were granted, and how
/// many got fewer than they asked for (the limiter was nearly drained).
pub struct Grants {
    pub calls: Counter,
    pub units: Counter,
    pub partial: Counter,
}

impl Grants {
    /// One `UPTO most` call that took `granted` units (0: denied).
    pub fn record(&self, most: u64, granted: u64) {
        self.calls.bump();
        if granted > 0 {
            self.units
                .0
                .store(self.units.get().saturating_add(granted), Ordering::Relaxed);
            if granted < most {
                self.partial.bump();
            }
        }
    }
}

/// Every `UPTO` call.
pub static UPTO: Grants = Grants {
    calls: Counter::new(),
    units: Counter::new(),
    partial: Counter::new(),
};

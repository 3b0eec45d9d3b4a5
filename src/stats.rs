//! Counters for `INFO ratelimit`: calls, admissions, denials and peeks per
//! algorithm, for `RL.ALL` as a whole, and (in `policy.rs`) per policy.
//!
//! Every counter is written only by the server's main thread, so a bump is a
//! plain load and store, not a locked read-modify-write.

use std::sync::atomic::{AtomicU64, Ordering};

use crate::algorithms::{for_each_algorithm, Listed, COUNT};
use crate::ffi::InfoContext;
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
        self.calls.bump();
        if cost == 0 {
            self.peeks.bump();
        } else if decision.allowed {
            self.admitted.bump();
        } else {
            self.denied.bump();
        }
    }
}

/// Per algorithm, by row of the table of algorithms (`Listed::stats`).
pub static ALGORITHMS: [Outcomes; COUNT] = [const { Outcomes::new() }; COUNT];

/// `RL.ALL` calls as a whole (each limiter in them also counts for its
/// algorithm).
pub static ALL: Outcomes = Outcomes::new();

/// Writes the `ratelimit` section of INFO.
pub fn info(info: &mut InfoContext) {
    info.section();
    let mut outcomes = |prefix: &str, o: &Outcomes| {
        info.field(&format!("{prefix}_calls"), o.calls.get());
        info.field(&format!("{prefix}_admitted"), o.admitted.get());
        info.field(&format!("{prefix}_denied"), o.denied.get());
        info.field(&format!("{prefix}_peeks"), o.peeks.get());
    };
    for_each_algorithm!(L => outcomes(&L::INFO_NAME.to_string_lossy(), L::stats()));
    outcomes("all", &ALL);
    let policies = crate::policy::list();
    info.field("policies", policies.len() as u64);
    // One line per policy, as the server writes a dict field:
    // `ratelimit_policy_<escaped>:calls=N,admitted=N,...`.
    let mut dict = String::new();
    for (name, _, stats) in &policies {
        dict.clear();
        dict.push_str("policy_");
        crate::policy::info_escaped(name, &mut dict);
        info.begin_dict(&dict);
        let o = &stats.outcomes;
        info.field("calls", o.calls.get());
        info.field("admitted", o.admitted.get());
        info.field("denied", o.denied.get());
        info.field("shadow_denied", stats.shadow_denied.get());
        info.field("peeks", o.peeks.get());
        info.end_dict();
    }
    info.field("deny_log_len", crate::deny_log::len() as u64);
    info.field(
        "deny_log_max_len",
        crate::config::get(&crate::config::LOG_MAX_LEN),
    );
    info.field("propagation_pinned", crate::replicate::pinned() as u64);
    info.field("module_allocations", crate::ffi::allocations());
}

//! Counters for `INFO ratelimit`: calls, admissions, denials and peeks per
//! algorithm, for `RL.ALL` as a whole, and (in `policy.rs`) per policy.
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

/// Per algorithm, in the order of [`ALGORITHM_NAMES`].
pub static ALGORITHMS: [Outcomes; 5] = [
    Outcomes::new(),
    Outcomes::new(),
    Outcomes::new(),
    Outcomes::new(),
    Outcomes::new(),
];

/// INFO field prefixes of the algorithms.
pub const ALGORITHM_NAMES: [&str; 5] = [
    "tokenbucket",
    "fixedwindow",
    "leakybucket",
    "sliding",
    "hashwindow",
];

/// `RL.ALL` calls as a whole (each limiter in them also counts for its
/// algorithm).
pub static ALL: Outcomes = Outcomes::new();

/// Writes the `ratelimit` section of INFO.
///
/// # Safety
/// Called by Redis with a valid info context.
pub unsafe extern "C" fn info(
    ctx: *mut redis_module::raw::RedisModuleInfoCtx,
    _for_crash_report: std::os::raw::c_int,
) {
    use crate::api;
    crate::guard::callback((), || {
        let field = |name: &str, value: u64| {
            let mut name = name.as_bytes().to_vec();
            name.push(0);
            unsafe { api!(RedisModule_InfoAddFieldULongLong)(ctx, name.as_ptr().cast(), value) };
        };
        unsafe { api!(RedisModule_InfoAddSection)(ctx, c"".as_ptr()) };
        let outcomes = |prefix: &str, o: &Outcomes| {
            field(&format!("{prefix}_calls"), o.calls.get());
            field(&format!("{prefix}_admitted"), o.admitted.get());
            field(&format!("{prefix}_denied"), o.denied.get());
            field(&format!("{prefix}_peeks"), o.peeks.get());
        };
        for (name, o) in ALGORITHM_NAMES.iter().zip(&ALGORITHMS) {
            outcomes(name, o);
        }
        outcomes("all", &ALL);
        let policies = crate::policy::list();
        field("policies", policies.len() as u64);
        // One line per policy, as the server writes a dict field:
        // `ratelimit_policy_<escaped>:calls=N,admitted=N,...`.
        let mut dict = String::new();
        for (name, _, stats) in &policies {
            dict.clear();
            dict.push_str("policy_");
            crate::policy::info_escaped(name, &mut dict);
            dict.push('\0');
            // SAFETY: `ctx` is the info context Redis passed; `dict` ends in
            // NUL and the server copies it before this returns.
            unsafe { api!(RedisModule_InfoBeginDictField)(ctx, dict.as_ptr().cast()) };
            let o = &stats.outcomes;
            field("calls", o.calls.get());
            field("admitted", o.admitted.get());
            field("denied", o.denied.get());
            field("shadow_denied", stats.shadow_denied.get());
            field("peeks", o.peeks.get());
            unsafe { api!(RedisModule_InfoEndDictField)(ctx) };
        }
        field("deny_log_len", crate::deny_log::len() as u64);
        field(
            "deny_log_max_len",
            crate::config::get(&crate::config::LOG_MAX_LEN),
        );
        field("propagation_pinned", crate::replicate::pinned() as u64);
        field("module_allocations", crate::alloc::allocations());
    })
}

//! The `INFO ratelimit` section: the counters of every algorithm, of
//! `RL.ALL` and of every policy, the deny log's size and bound, the
//! propagation mode and the module's allocations. It reads the modules
//! that keep them, so it sits above them all.

use crate::algorithms::{for_each_algorithm, Listed};
use crate::blocking;
use crate::config;
use crate::deny_log;
use crate::ffi::{self, InfoContext};
use crate::policy;
use crate::replicate;
use crate::stats::{self, Outcomes};

/// Writes the `ratelimit` section of INFO.
pub fn section(info: &mut InfoContext) {
    info.section();
    let mut outcomes = |prefix: &str, o: &Outcomes| {
        info.field(&format!("{prefix}_calls"), o.calls.get());
        info.field(&format!("{prefix}_admitted"), o.admitted.get());
        info.field(&format!("{prefix}_denied"), o.denied.get());
        info.field(&format!("{prefix}_peeks"), o.peeks.get());
    };
    for_each_algorithm!(L => outcomes(&L::INFO_NAME.to_string_lossy(), L::stats()));
    outcomes("throttle", &stats::THROTTLE);
    outcomes("all", &stats::ALL);
    let policies = policy::list();
    info.field("policies", policies.len() as u64);
    // One line per policy, as the server writes a dict field:
    // `ratelimit_policy_<escaped>:calls=N,admitted=N,...`.
    let mut dict = String::new();
    let now_ms = crate::clock::now().as_ms_floor();
    for (name, rule, counts) in &policies {
        dict.clear();
        dict.push_str("policy_");
        policy::info_escaped(name, &mut dict);
        info.begin_dict(&dict);
        let o = &counts.outcomes;
        info.field("calls", o.calls.get());
        info.field("admitted", o.admitted.get());
        info.field("denied", o.denied.get());
        info.field("shadow_denied", counts.shadow_denied.get());
        info.field("peeks", o.peeks.get());
        // As RL.POLICY STATS shows them: windows that ended are ended.
        let view = policy::lock(&counts.protection).view(&rule.protect, now_ms);
        let (scale, stage) = (view.scale, view.stage);
        info.field("scale", scale);
        info.field("stage", u64::from(stage));
        info.end_dict();
    }
    let grants = &crate::stats::UPTO;
    info.field("upto_calls", grants.calls.get());
    info.field("upto_granted_units", grants.units.get());
    info.field("upto_partial", grants.partial.get());
    info.field("blocked_now", blocking::now_blocked());
    info.field("blocked_total", blocking::TOTAL.get());
    info.field("blocked_admitted", blocking::ADMITTED.get());
    info.field("blocked_timed_out", blocking::TIMED_OUT.get());
    info.field("deny_log_len", deny_log::len() as u64);
    info.field("deny_log_max_len", config::get(&deny_log::MAX_LEN));
    info.field("propagation_pinned", replicate::pinned() as u64);
    info.field("module_allocations", ffi::allocations());
    info.field("bucket_rates", crate::packing::rates() as u64);
}

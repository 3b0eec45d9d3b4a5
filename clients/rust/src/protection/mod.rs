//! The protection loop on the application's side (SPEC "The protection
//! loop"): outcome counts sent to every master in the background, each
//! policy's stage and scale read from every master, and the circuit
//! breakers that a policy at stage 2 opens.
//!
//! - this file: [`Protection`], its builder, its two background tasks;
//! - `breaker.rs`: [`CircuitBreaker`], the kit's own breaker.
//!
//! Nothing here is on a request's path: [`Protection::record`] adds to two
//! atomic counters, [`Protection::stage`] reads atomics.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Mutex, RwLock, Weak};
use std::time::{Duration, Instant};

use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::client::{Client, PolicyStats};
use crate::Error;

mod breaker;

pub use breaker::{BreakerError, BreakerState, CircuitBreaker, CircuitBreakerConfig};

/// How often the counted outcomes are sent (`RL.OUTCOME`), by default: the
/// contract's `protection.kits.report_interval_ms`.
pub const DEFAULT_REPORT_INTERVAL: Duration = Duration::from_millis(1000);
/// How often each policy's stage and scale are read (`RL.POLICY STATS`),
/// by default: `protection.kits.stage_poll_ms`.
pub const DEFAULT_STAGE_POLL: Duration = Duration::from_millis(1000);
/// How long a stage read stays good without another successful read, by
/// default (then the stage is 0): `protection.kits.stage_hold_ms`.
pub const DEFAULT_STAGE_HOLD: Duration = Duration::from_millis(5000);

/// What one policy's loop holds in process.
struct PolicyState {
    ok: AtomicU64,
    errors: AtomicU64,
    /// Calls the kit denied without asking the server (deny cache, local
    /// level), sent as `DENIED n`.
    denied: AtomicU64,
    /// The highest stage of the last successful read (of every master).
    stage: AtomicU8,
    /// The lowest scale of the last successful read; 100 before any.
    scale: AtomicU8,
    /// When that read was, in ms since the loop started, plus one (0: never).
    read_at: AtomicU64,
}

impl PolicyState {
    fn new() -> Self {
        PolicyState {
            ok: AtomicU64::new(0),
            errors: AtomicU64::new(0),
            denied: AtomicU64::new(0),
            stage: AtomicU8::new(0),
            scale: AtomicU8::new(100),
            read_at: AtomicU64::new(0),
        }
    }
}

/// A breaker that follows the stage of some policies.
struct Bound {
    breaker: CircuitBreaker,
    policies: Vec<String>,
    /// Whether the loop forced it open (it releases only what it forced).
    forced: AtomicBool,
}

/// Counters of the loop itself.
#[derive(Default)]
struct Counters {
    reports_sent: AtomicU64,
    reports_failed: AtomicU64,
    outcomes_sent: AtomicU64,
    outcomes_lost: AtomicU64,
    denied_sent: AtomicU64,
    denied_lost: AtomicU64,
    reads_ok: AtomicU64,
    reads_failed: AtomicU64,
}

/// A reading of the loop's counters.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ProtectionStats {
    /// `RL.OUTCOME` reports answered (one per policy per interval).
    pub reports_sent: u64,
    /// Reports that failed (their counts are lost, never retried).
    pub reports_failed: u64,
    /// Outcomes those answered reports carried.
    pub outcomes_sent: u64,
    /// Outcomes lost with failed reports.
    pub outcomes_lost: u64,
    /// Outcomes counted and not sent yet (at most one interval's worth).
    pub outcomes_pending: u64,
    /// Local denials (deny cache, local level) that answered reports
    /// carried as `DENIED n`.
    pub denied_sent: u64,
    /// Local denials lost with failed reports.
    pub denied_lost: u64,
    /// Local denials counted and not sent yet.
    pub denied_pending: u64,
    /// Successful reads of a policy's stage.
    pub reads_ok: u64,
    /// Failed reads.
    pub reads_failed: u64,
}

pub(crate) struct Shared {
    client: Client,
    report_interval: Duration,
    stage_poll: Duration,
    stage_hold: Duration,
    started: Instant,
    policies: RwLock<HashMap<String, Arc<PolicyState>>>,
    breakers: RwLock<HashMap<String, Bound>>,
    counters: Counters,
}

/// Stops the tasks when the last [`Protection`] clone goes.
struct Tasks {
    shared: Arc<Shared>,
    stop: watch::Sender<bool>,
    handles: Mutex<Vec<JoinHandle<()>>>,
}

impl Drop for Tasks {
    fn drop(&mut self) {
        for handle in self
            .handles
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .drain(..)
        {
            handle.abort();
        }
        // The application may keep a breaker longer than the loop.
        self.shared.release_forced();
    }
}

/// The protection loop of the policies an application watches: it counts
/// the outcome of the requests they admitted ([`Protection::record`], or
/// the layer with [`crate::RateLimitLayerBuilder::protection`]), sends the
/// counts to every master every report interval (`RL.OUTCOME`), reads each
/// policy's stage and scale from every master every stage poll (`RL.POLICY
/// STATS`: the highest stage and the lowest scale win), and opens the
/// [`CircuitBreaker`]s bound to a policy while it is at stage 2. Cheap to
/// clone: clones share the loop. Needs a tokio runtime; the tasks stop on
/// [`Protection::close`] or when the last clone is dropped.
#[derive(Clone)]
pub struct Protection {
    shared: Arc<Shared>,
    tasks: Arc<Tasks>,
}

/// Builds a [`Protection`].
pub struct ProtectionBuilder {
    client: Client,
    policies: Vec<String>,
    report_interval: Duration,
    stage_poll: Duration,
    stage_hold: Duration,
}

impl ProtectionBuilder {
    /// Watches the policy `name` (the layer adds its own policy rules).
    pub fn policy(mut self, name: impl Into<String>) -> Self {
        self.policies.push(name.into());
        self
    }
    /// How often the outcomes are sent ([`DEFAULT_REPORT_INTERVAL`], 1 s).
    /// The server sees one `RL.OUTCOME` per policy per interval per
    /// instance, whatever the request rate.
    pub fn report_interval(mut self, every: Duration) -> Self {
        self.report_interval = every.max(Duration::from_millis(1));
        self
    }
    /// How often the stages are read ([`DEFAULT_STAGE_POLL`], 1 s).
    pub fn stage_poll(mut self, every: Duration) -> Self {
        self.stage_poll = every.max(Duration::from_millis(1));
        self
    }
    /// How long a stage read stays good without another successful read
    /// ([`DEFAULT_STAGE_HOLD`], 5 s); then the stage is 0 and the limiter's
    /// own fallback decides.
    pub fn stage_hold(mut self, hold: Duration) -> Self {
        self.stage_hold = hold;
        self
    }

    /// The loop, its two tasks started (on the current tokio runtime).
    ///
    /// Refuses a `stage_hold` no longer than `stage_poll` (naming
    /// `stage_hold`, as every kit does): each stage read would be dropped
    /// before the next came, and the loop would never act on a stage.
    pub fn start(self) -> Result<Protection, Error> {
        if self.stage_hold <= self.stage_poll {
            return Err(Error::BadArgument {
                rule: "Protection".to_string(),
                arg: "stage_hold".to_string(),
                reason: format!(
                    "{:?} must be longer than stage_poll ({:?})",
                    self.stage_hold, self.stage_poll
                ),
            });
        }
        let (stop, stopped) = watch::channel(false);
        let shared = Arc::new(Shared {
            client: self.client,
            report_interval: self.report_interval,
            stage_poll: self.stage_poll,
            stage_hold: self.stage_hold,
            started: Instant::now(),
            policies: RwLock::new(HashMap::new()),
            breakers: RwLock::new(HashMap::new()),
            counters: Counters::default(),
        });
        for name in &self.policies {
            shared.state(name);
        }
        let report = tokio::spawn(report_loop(shared.clone(), stopped.clone()));
        let poll = tokio::spawn(poll_loop(shared.clone(), stopped));
        Ok(Protection {
            shared: shared.clone(),
            tasks: Arc::new(Tasks {
                shared: shared.clone(),
                stop,
                handles: Mutex::new(vec![report, poll]),
            }),
        })
    }
}

impl Protection {
    /// A builder over `client` (standalone: its server; cluster: every
    /// master; Sentinel: the master it names), with the defaults.
    pub fn builder(client: Client) -> ProtectionBuilder {
        ProtectionBuilder {
            client,
            policies: Vec::new(),
            report_interval: DEFAULT_REPORT_INTERVAL,
            stage_poll: DEFAULT_STAGE_POLL,
            stage_hold: DEFAULT_STAGE_HOLD,
        }
    }

    /// Counts one finished request that `policy` admitted: an error or not.
    /// Two atomic additions; the count leaves with the next report.
    pub fn record(&self, policy: &str, error: bool) {
        let state = self.shared.state(policy);
        let counter = if error { &state.errors } else { &state.ok };
        counter.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts one call of `policy` that the kit denied without asking the
    /// server (answered from its deny cache, or by the local level of a
    /// global rule): it leaves with the next report as `DENIED n`, so that
    /// the server's stages see the flood the deny cache hides. The
    /// [`crate::Limiter`] given this loop ([`crate::LimiterBuilder::protection`])
    /// calls it; a non-core route's degrade at stage >= 1 is no denial.
    pub fn record_denied(&self, policy: &str) {
        self.shared
            .state(policy)
            .denied
            .fetch_add(1, Ordering::Relaxed);
    }

    /// Watches `policy` (its stage is read from the next poll on).
    pub fn watch(&self, policy: &str) {
        self.shared.state(policy);
    }

    /// The policies watched.
    pub fn policies(&self) -> Vec<String> {
        let mut names: Vec<String> = self.shared.read_policies().keys().cloned().collect();
        names.sort_unstable();
        names
    }

    /// `policy`'s stage (0 normal, 1 degrade, 2 break): the highest of
    /// every master at the last successful read, or 0 when there was none
    /// within the stage hold.
    pub fn stage(&self, policy: &str) -> u8 {
        match self.shared.read_policies().get(policy) {
            Some(state) => self.shared.held_stage(state),
            None => 0,
        }
    }

    /// The highest stage of the policies watched.
    pub fn max_stage(&self) -> u8 {
        let policies = self.shared.read_policies();
        policies
            .values()
            .map(|s| self.shared.held_stage(s))
            .max()
            .unwrap_or(0)
    }

    /// `policy`'s scale (1 to 100): the lowest of every master at the last
    /// successful read (kept while Redis does not answer: the server keeps
    /// it too), 100 before any.
    pub fn scale(&self, policy: &str) -> u8 {
        self.shared
            .read_policies()
            .get(policy)
            .map_or(100, |s| s.scale.load(Ordering::Relaxed))
    }

    /// The breaker named `name`, bound to `policy`: forced open while the
    /// policy is at stage 2, released when it falls below (made closed with
    /// the default config if it is new; several policies may share one, and
    /// then any of them at stage 2 opens it).
    pub fn breaker(&self, name: &str, policy: &str) -> CircuitBreaker {
        self.bind(CircuitBreaker::new(name), policy)
    }

    /// Binds the application's `breaker` to `policy`'s stage (or, if a
    /// breaker of that name is bound already, that one to `policy` too).
    pub fn bind(&self, breaker: CircuitBreaker, policy: &str) -> CircuitBreaker {
        self.watch(policy);
        let mut breakers = self
            .shared
            .breakers
            .write()
            .unwrap_or_else(|e| e.into_inner());
        let bound = breakers
            .entry(breaker.name().to_string())
            .or_insert_with(|| Bound {
                breaker,
                policies: Vec::new(),
                forced: AtomicBool::new(false),
            });
        if !bound.policies.iter().any(|p| p == policy) {
            bound.policies.push(policy.to_string());
        }
        bound.breaker.clone()
    }

    /// The breaker named `name`, if one is bound.
    pub fn find_breaker(&self, name: &str) -> Option<CircuitBreaker> {
        self.shared
            .breakers
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(name)
            .map(|b| b.breaker.clone())
    }

    /// A reading of the loop's counters.
    pub fn stats(&self) -> ProtectionStats {
        let c = &self.shared.counters;
        let policies = self.shared.read_policies();
        let pending = policies
            .values()
            .map(|s| s.ok.load(Ordering::Relaxed) + s.errors.load(Ordering::Relaxed))
            .sum();
        let denied_pending = policies
            .values()
            .map(|s| s.denied.load(Ordering::Relaxed))
            .sum();
        ProtectionStats {
            reports_sent: c.reports_sent.load(Ordering::Relaxed),
            reports_failed: c.reports_failed.load(Ordering::Relaxed),
            outcomes_sent: c.outcomes_sent.load(Ordering::Relaxed),
            outcomes_lost: c.outcomes_lost.load(Ordering::Relaxed),
            outcomes_pending: pending,
            denied_sent: c.denied_sent.load(Ordering::Relaxed),
            denied_lost: c.denied_lost.load(Ordering::Relaxed),
            denied_pending,
            reads_ok: c.reads_ok.load(Ordering::Relaxed),
            reads_failed: c.reads_failed.load(Ordering::Relaxed),
        }
    }

    /// Stops the tasks, after sending the counts not sent yet once (best
    /// effort). Other clones see a loop that no longer reads nor sends.
    pub async fn close(&self) {
        let _ = self.tasks.stop.send(true);
        let handles: Vec<JoinHandle<()>> = self
            .tasks
            .handles
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .drain(..)
            .collect();
        for handle in handles {
            let _ = handle.await;
        }
        // No poll will release them now: the breakers this loop forced
        // open close with it.
        self.shared.release_forced();
    }
}

/// A protection loop as the metrics' collector holds it: without keeping
/// it alive.
pub(crate) struct WeakProtection(Weak<Shared>);

impl WeakProtection {
    pub(crate) fn alive(&self) -> bool {
        self.0.strong_count() > 0
    }
    pub(crate) fn same(&self, other: &WeakProtection) -> bool {
        Weak::ptr_eq(&self.0, &other.0)
    }
    pub(crate) fn upgrade(&self) -> Option<Arc<Shared>> {
        self.0.upgrade()
    }
}

impl Protection {
    pub(crate) fn downgrade(&self) -> WeakProtection {
        WeakProtection(Arc::downgrade(&self.shared))
    }
}

impl Shared {
    /// Each watched policy's scale and held stage, for a scrape.
    pub(crate) fn readings(&self) -> Vec<(String, u8, u8)> {
        self.read_policies()
            .iter()
            .map(|(name, s)| {
                (
                    name.clone(),
                    s.scale.load(Ordering::Relaxed),
                    self.held_stage(s),
                )
            })
            .collect()
    }

    /// Each bound breaker's name and whether it refuses calls now.
    pub(crate) fn breaker_states(&self) -> Vec<(String, bool)> {
        self.breakers
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .map(|(name, b)| (name.clone(), b.breaker.state() != BreakerState::Closed))
            .collect()
    }

    fn read_policies(&self) -> std::sync::RwLockReadGuard<'_, HashMap<String, Arc<PolicyState>>> {
        self.policies.read().unwrap_or_else(|e| e.into_inner())
    }

    /// The policy's state, added on first use.
    fn state(&self, policy: &str) -> Arc<PolicyState> {
        if let Some(state) = self.read_policies().get(policy) {
            return state.clone();
        }
        self.policies
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .entry(policy.to_string())
            .or_insert_with(|| Arc::new(PolicyState::new()))
            .clone()
    }

    fn now_ms(&self) -> u64 {
        self.started.elapsed().as_millis() as u64
    }

    fn held_stage(&self, state: &PolicyState) -> u8 {
        held(
            state.stage.load(Ordering::Relaxed),
            state.read_at.load(Ordering::Relaxed),
            self.now_ms(),
            self.stage_hold,
        )
    }

    /// Keeps what every master answered: the highest stage, the lowest scale.
    fn keep(&self, state: &PolicyState, masters: &[PolicyStats]) {
        let Some(stage) = masters.iter().map(|m| m.stage).max() else {
            return;
        };
        let scale = masters.iter().map(|m| m.scale).min().unwrap_or(100);
        state.stage.store(stage, Ordering::Relaxed);
        state.scale.store(scale, Ordering::Relaxed);
        state.read_at.store(self.now_ms() + 1, Ordering::Relaxed);
    }

    /// Sends each policy's counts once and forgets them, answered or not.
    async fn report(&self) {
        let policies: Vec<(String, Arc<PolicyState>)> = self
            .read_policies()
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        let c = &self.counters;
        for (name, state) in policies {
            let ok = state.ok.swap(0, Ordering::Relaxed);
            let errors = state.errors.swap(0, Ordering::Relaxed);
            let denied = state.denied.swap(0, Ordering::Relaxed);
            if ok == 0 && errors == 0 && denied == 0 {
                continue;
            }
            match self.client.outcome_denied(&name, ok, errors, denied).await {
                Ok(masters) => {
                    c.reports_sent.fetch_add(1, Ordering::Relaxed);
                    c.outcomes_sent.fetch_add(ok + errors, Ordering::Relaxed);
                    c.denied_sent.fetch_add(denied, Ordering::Relaxed);
                    self.keep(&state, &masters);
                }
                Err(e) => {
                    c.reports_failed.fetch_add(1, Ordering::Relaxed);
                    c.outcomes_lost.fetch_add(ok + errors, Ordering::Relaxed);
                    c.denied_lost.fetch_add(denied, Ordering::Relaxed);
                    tracing::debug!(policy = %name, error = %e, "redis-ratelimit: outcome report lost");
                }
            }
        }
    }

    /// Reads each policy's stage and scale, then moves the bound breakers.
    async fn poll(&self) {
        let policies: Vec<(String, Arc<PolicyState>)> = self
            .read_policies()
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        let c = &self.counters;
        for (name, state) in policies {
            match self.client.policy_stats(&name).await {
                Ok(masters) => {
                    c.reads_ok.fetch_add(1, Ordering::Relaxed);
                    self.keep(&state, &masters);
                }
                Err(e) => {
                    c.reads_failed.fetch_add(1, Ordering::Relaxed);
                    tracing::debug!(policy = %name, error = %e, "redis-ratelimit: stage not read");
                }
            }
        }
        self.move_breakers();
    }

    /// Releases every breaker this loop forced open.
    fn release_forced(&self) {
        let breakers = self.breakers.read().unwrap_or_else(|e| e.into_inner());
        for bound in breakers.values() {
            if bound.forced.swap(false, Ordering::Relaxed) {
                bound.breaker.release();
            }
        }
    }

    fn move_breakers(&self) {
        let breakers = self.breakers.read().unwrap_or_else(|e| e.into_inner());
        let policies = self.read_policies();
        for bound in breakers.values() {
            let stage = bound
                .policies
                .iter()
                .filter_map(|p| policies.get(p))
                .map(|s| self.held_stage(s))
                .max()
                .unwrap_or(0);
            if stage >= 2 {
                if !bound.forced.swap(true, Ordering::Relaxed) {
                    bound.breaker.force_open();
                    tracing::warn!(
                        breaker = bound.breaker.name(),
                        "redis-ratelimit: stage 2, breaker forced open"
                    );
                }
            } else if bound.forced.swap(false, Ordering::Relaxed) {
                bound.breaker.release();
                tracing::info!(
                    breaker = bound.breaker.name(),
                    stage,
                    "redis-ratelimit: breaker released"
                );
            }
        }
    }
}

/// The stage a read gives at `now_ms`: itself within `hold` of the read
/// (`read_at` is the read's time plus one; 0 means none), else 0.
fn held(stage: u8, read_at: u64, now_ms: u64, hold: Duration) -> u8 {
    if read_at == 0 || now_ms.saturating_sub(read_at - 1) > hold.as_millis() as u64 {
        0
    } else {
        stage
    }
}

async fn report_loop(shared: Arc<Shared>, mut stopped: watch::Receiver<bool>) {
    let mut tick = tokio::time::interval(shared.report_interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tick.tick().await;
    loop {
        tokio::select! {
            _ = tick.tick() => shared.report().await,
            _ = stopped.changed() => break,
        }
    }
    // The last counts, once.
    shared.report().await;
}

async fn poll_loop(shared: Arc<Shared>, mut stopped: watch::Receiver<bool>) {
    let mut tick = tokio::time::interval(shared.stage_poll);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = tick.tick() => shared.poll().await,
            _ = stopped.changed() => break,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stage_holds_for_the_hold_then_falls_to_zero() {
        let hold = Duration::from_millis(5000);
        assert_eq!(held(2, 0, 10, hold), 0, "never read");
        assert_eq!(held(2, 1001, 1000, hold), 2, "just read");
        assert_eq!(held(2, 1001, 6000, hold), 2, "read 5 s ago: held");
        assert_eq!(held(2, 1001, 6001, hold), 0, "read longer ago: 0");
        assert_eq!(held(1, 1, 0, Duration::ZERO), 1);
    }
}

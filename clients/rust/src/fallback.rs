//! What decides when Redis cannot: the fallback mode, the circuit breaker
//! that spares a dead Redis a deadline per request, and the counters of
//! every path.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// What decides a request when Redis errors, misses its deadline, or the
/// breaker is open.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FallbackMode {
    /// Admit: availability over protection (the limiter guards a cost, not
    /// a safety property). No bound on what is admitted while it decides.
    FailOpen,
    /// Deny (`Retry-After` of the breaker's open time): protection over
    /// availability (login attempts, paid APIs). Admits nothing beyond what
    /// Redis admitted.
    FailClosed,
    /// Every rule in process against this instance's account at its share
    /// of the limit, `s = ceil(limit / instances * 1.1)`: the middle ground,
    /// and the default. The account is charged with every unit Redis
    /// admitted for this instance and every unit of a call whose answer was
    /// lost, so the fallback admits only what Redis cannot already have
    /// counted for this instance: one instance admits at most `limit` per
    /// window of a key, N instances at most `limit + (N - 1) * s` (see
    /// docs/clients.md, "Deadline, fallback and the over-admission bound").
    LocalOnly,
}

/// When the breaker opens and how long it stays open before a probe.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BreakerConfig {
    /// Consecutive failures (timeouts, lost connections) that open it.
    pub failures: u32,
    /// How long it stays open before one `PING` probes Redis.
    pub open_for: Duration,
}

impl Default for BreakerConfig {
    fn default() -> Self {
        BreakerConfig {
            failures: 5,
            open_for: Duration::from_secs(1),
        }
    }
}

#[derive(Debug)]
enum State {
    Closed { failures: u32 },
    Open { until: Instant },
    HalfOpen,
}

/// What the breaker lets a request do ([`RedisBreaker::gate`](crate::RedisBreaker::gate)).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Gate {
    /// Call Redis.
    Call,
    /// Open: the fallback decides, no call.
    Skip,
    /// Open for long enough: this request starts the probe (and the
    /// fallback decides it).
    Probe,
}

/// The circuit breaker of the calls to Redis, exported as
/// [`RedisBreaker`](crate::RedisBreaker) for a service that decides its
/// own fallback (the [`crate::Limiter`] keeps one of its own).
///
/// Closed, it lets every call through and counts consecutive failures;
/// [`BreakerConfig::failures`] of them open it. Open, it answers
/// [`Gate::Skip`] (no call: Redis is spared a deadline per request) until
/// [`BreakerConfig::open_for`] has passed; then one caller gets
/// [`Gate::Probe`] and sends a probe (a `PING`), the others still
/// [`Gate::Skip`] until the probe's outcome is reported with
/// [`Breaker::probe_succeeded`] (closed) or [`Breaker::failure`] (open for
/// another `open_for`). Safe to share between threads.
pub struct Breaker {
    config: BreakerConfig,
    state: Mutex<State>,
}

impl Breaker {
    /// A closed breaker.
    pub fn new(config: BreakerConfig) -> Self {
        Breaker {
            config,
            state: Mutex::new(State::Closed { failures: 0 }),
        }
    }

    /// Whether to call Redis now. [`Gate::Probe`] is given once per open
    /// period: its caller must report the probe's outcome.
    pub fn gate(&self) -> Gate {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        match *state {
            State::Closed { .. } => Gate::Call,
            State::Open { until } if Instant::now() >= until => {
                *state = State::HalfOpen;
                Gate::Probe
            }
            State::Open { .. } | State::HalfOpen => Gate::Skip,
        }
    }

    /// A call answered: the count of consecutive failures starts again. A
    /// call that was sent before the breaker opened and answers late does
    /// not close it: only the probe does.
    pub fn success(&self) {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        if let State::Closed { .. } = *state {
            *state = State::Closed { failures: 0 };
        }
    }

    /// The probe answered: closed.
    pub fn probe_succeeded(&self) {
        *self.state.lock().unwrap_or_else(|e| e.into_inner()) = State::Closed { failures: 0 };
    }

    /// Redis failed (a timeout, a lost connection, a failed probe); true
    /// when this failure opened the breaker (a failed probe reopens it and
    /// answers false).
    pub fn failure(&self) -> bool {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let open = State::Open {
            until: Instant::now() + self.config.open_for,
        };
        match *state {
            State::Closed { failures } if failures + 1 >= self.config.failures => {
                *state = open;
                true
            }
            State::Closed { failures } => {
                *state = State::Closed {
                    failures: failures + 1,
                };
                false
            }
            State::HalfOpen => {
                *state = open;
                false
            }
            State::Open { .. } => false,
        }
    }

    /// Open or probing: not closed.
    pub fn is_open(&self) -> bool {
        !matches!(
            *self.state.lock().unwrap_or_else(|e| e.into_inner()),
            State::Closed { .. }
        )
    }

    /// How long it stays open before a probe.
    pub fn open_for(&self) -> Duration {
        self.config.open_for
    }
}

macro_rules! stats {
    ($($(#[$doc:meta])* $name:ident),* $(,)?) => {
        /// Counters of every path a decision can take, for the application
        /// to read (and export): [`crate::Limiter::stats`].
        #[derive(Default)]
        pub(crate) struct Stats { $(pub(crate) $name: AtomicU64,)* }

        /// A reading of the counters.
        #[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
        pub struct StatsSnapshot { $($(#[$doc])* pub $name: u64,)* }

        impl Stats {
            pub(crate) fn snapshot(&self) -> StatsSnapshot {
                StatsSnapshot { $($name: self.$name.load(Ordering::Relaxed),)* }
            }
        }

        impl StatsSnapshot {
            /// `name value` pairs, in declaration order (for an exporter).
            pub fn pairs(&self) -> Vec<(&'static str, u64)> {
                vec![$((stringify!($name), self.$name),)*]
            }
        }
    };
}

stats! {
    /// Limiter calls sent to Redis (probes excluded).
    redis_calls,
    /// Of those, answered admitted.
    redis_admitted,
    /// Of those, answered denied.
    redis_denied,
    /// Of those, answered with a server error (e.g. `WRONGTYPE`).
    redis_errors,
    /// Of those, not answered within the deadline.
    redis_timeouts,
    /// Of those, failed on the connection.
    redis_unavailable,
    /// Requests denied by the local level, without a round trip.
    local_denied,
    /// Requests denied by the deny cache, without a round trip.
    deny_cache_hits,
    /// Requests the fallback admitted.
    fallback_admitted,
    /// Units owed sent to Redis (`COST n FORCE`): what the fallback had
    /// admitted for a key without a call, sent before its next call.
    owed_sent,
    /// Requests the fallback denied.
    fallback_denied,
    /// Requests decided by the fallback because the breaker was open (no call).
    breaker_skipped,
    /// Times the breaker opened.
    breaker_opened,
    /// Probes sent while it was open.
    probes,
    /// Probes answered (the breaker closed).
    probes_ok,
    /// Batched rules: requests admitted from units held in process, without
    /// a round trip.
    grant_admitted,
    /// Batched rules: requests denied in process (before the rule's next
    /// ask, or a shared grant ran out), without a round trip.
    grant_denied,
    /// Batched rules: `UPTO` calls sent (also counted in `redis_calls`).
    grant_asks,
    /// Batched rules: units the server granted.
    grant_units,
    /// Batched rules: `REFUND` calls sent for units held too long or at
    /// close (fire-and-forget; not in `redis_calls`).
    grant_refunds,
    /// Batched rules: units given back by those calls.
    grant_refunded_units,
    /// Striped rules: requests that the own stripe denied and the next one
    /// was asked.
    stripe_spills,
    /// Requests without a key (the closure answered `None`).
    key_missing,
    /// Requests whose key closure panicked.
    key_panics,
}

impl Stats {
    pub(crate) fn add(counter: &AtomicU64) {
        counter.fetch_add(1, Ordering::Relaxed);
    }
}

//! [`CircuitBreaker`]: the kit's own breaker for the application's
//! downstream calls, which the protection loop opens while a policy is at
//! stage 2 (break).

use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// What a [`CircuitBreaker`] is doing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BreakerState {
    /// Calls go through.
    Closed,
    /// Too many consecutive failures: calls are refused until its open time
    /// has passed, then one goes through to try.
    Open,
    /// Opened by hand or by the protection loop (a policy at stage 2):
    /// calls are refused until [`CircuitBreaker::release`].
    ForcedOpen,
}

impl BreakerState {
    /// `closed`, `open` or `forced_open`.
    pub fn as_str(self) -> &'static str {
        match self {
            BreakerState::Closed => "closed",
            BreakerState::Open => "open",
            BreakerState::ForcedOpen => "forced_open",
        }
    }
}

/// When a [`CircuitBreaker`] opens on its own, and for how long.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CircuitBreakerConfig {
    /// Consecutive failures of [`CircuitBreaker::call`] (or
    /// [`CircuitBreaker::record`]) that open it (0: never on its own).
    pub failures: u32,
    /// How long it stays open before the next call is let through to try.
    pub open_for: Duration,
}

impl Default for CircuitBreakerConfig {
    fn default() -> Self {
        CircuitBreakerConfig {
            failures: 5,
            open_for: Duration::from_secs(5),
        }
    }
}

/// What [`CircuitBreaker::call`] answers when it does not call.
#[derive(Debug, PartialEq, Eq)]
pub enum BreakerError<E> {
    /// The breaker is open (or forced open): nothing was called.
    Open(BreakerState),
    /// The call ran and failed (counted as a failure).
    Failed(E),
}

impl<E: std::fmt::Display> std::fmt::Display for BreakerError<E> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            BreakerError::Open(state) => write!(f, "circuit breaker {}", state.as_str()),
            BreakerError::Failed(e) => write!(f, "{e}"),
        }
    }
}

impl<E: std::fmt::Debug + std::fmt::Display> std::error::Error for BreakerError<E> {}

#[derive(Clone, Copy, Debug)]
enum State {
    Closed { failures: u32 },
    Open { until: Instant },
    ForcedOpen,
}

struct Inner {
    name: String,
    config: CircuitBreakerConfig,
    state: Mutex<State>,
}

/// A small circuit breaker around the application's downstream calls:
/// closed, open (after consecutive failures, for a while) or forced open
/// (by hand, or by a [`crate::Protection`] while a policy that names it is
/// at stage 2). Cheap to clone: clones are the same breaker.
#[derive(Clone)]
pub struct CircuitBreaker {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for CircuitBreaker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CircuitBreaker")
            .field("name", &self.inner.name)
            .field("state", &self.state())
            .finish()
    }
}

impl CircuitBreaker {
    /// A closed breaker named `name`, with the default config (open after 5
    /// consecutive failures, for 5 s).
    pub fn new(name: impl Into<String>) -> CircuitBreaker {
        CircuitBreaker::with_config(name, CircuitBreakerConfig::default())
    }

    /// A closed breaker with `config`.
    pub fn with_config(name: impl Into<String>, config: CircuitBreakerConfig) -> CircuitBreaker {
        CircuitBreaker {
            inner: Arc::new(Inner {
                name: name.into(),
                config,
                state: Mutex::new(State::Closed { failures: 0 }),
            }),
        }
    }

    /// Its name.
    pub fn name(&self) -> &str {
        &self.inner.name
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.inner.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// What it is doing now.
    pub fn state(&self) -> BreakerState {
        match *self.lock() {
            State::Closed { .. } => BreakerState::Closed,
            State::Open { until } if Instant::now() >= until => BreakerState::Closed,
            State::Open { .. } => BreakerState::Open,
            State::ForcedOpen => BreakerState::ForcedOpen,
        }
    }

    /// Whether a call may go through now. Once an open breaker's time has
    /// passed, calls go through again, and one more failure opens it again.
    pub fn allow(&self) -> bool {
        let mut state = self.lock();
        match *state {
            State::Closed { .. } => true,
            State::Open { until } if Instant::now() >= until => {
                *state = State::Closed {
                    failures: self.inner.config.failures.saturating_sub(1),
                };
                true
            }
            State::Open { .. } | State::ForcedOpen => false,
        }
    }

    /// Counts a call's result: a success starts the count of consecutive
    /// failures again; a failure may open the breaker.
    pub fn record(&self, success: bool) {
        let mut state = self.lock();
        if let State::Closed { failures } = *state {
            let failures = if success { 0 } else { failures + 1 };
            let threshold = self.inner.config.failures;
            *state = if threshold > 0 && failures >= threshold {
                State::Open {
                    until: Instant::now() + self.inner.config.open_for,
                }
            } else {
                State::Closed { failures }
            };
        }
    }

    /// Runs `call` if the breaker allows it, and counts its result.
    pub async fn call<T, E, F>(&self, call: F) -> Result<T, BreakerError<E>>
    where
        F: Future<Output = Result<T, E>>,
    {
        if !self.allow() {
            return Err(BreakerError::Open(self.state()));
        }
        match call.await {
            Ok(v) => {
                self.record(true);
                Ok(v)
            }
            Err(e) => {
                self.record(false);
                Err(BreakerError::Failed(e))
            }
        }
    }

    /// Opens it until [`CircuitBreaker::release`], whatever the calls do.
    pub fn force_open(&self) {
        *self.lock() = State::ForcedOpen;
    }

    /// Closes a forced-open breaker (an open one stays open for its time).
    pub fn release(&self) {
        let mut state = self.lock();
        if let State::ForcedOpen = *state {
            *state = State::Closed { failures: 0 };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn consecutive_failures_open_it_and_a_success_resets_the_count() {
        let b = CircuitBreaker::with_config(
            "down",
            CircuitBreakerConfig {
                failures: 3,
                open_for: Duration::from_secs(60),
            },
        );
        b.record(false);
        b.record(false);
        b.record(true);
        b.record(false);
        b.record(false);
        assert_eq!(b.state(), BreakerState::Closed);
        b.record(false);
        assert_eq!(b.state(), BreakerState::Open);
        assert!(!b.allow());
    }

    #[test]
    fn an_open_breaker_lets_a_call_try_after_its_time_and_one_failure_reopens_it() {
        let b = CircuitBreaker::with_config(
            "down",
            CircuitBreakerConfig {
                failures: 2,
                open_for: Duration::from_millis(0),
            },
        );
        b.record(false);
        b.record(false);
        assert!(b.allow(), "its open time has passed");
        b.record(false);
        assert!(matches!(*b.lock(), State::Open { .. }));
    }

    #[test]
    fn forced_open_refuses_until_released() {
        let b = CircuitBreaker::new("down");
        b.force_open();
        assert_eq!(b.state(), BreakerState::ForcedOpen);
        assert!(!b.allow());
        b.record(true);
        assert_eq!(b.state(), BreakerState::ForcedOpen, "calls do not close it");
        b.release();
        assert_eq!(b.state(), BreakerState::Closed);
        assert!(b.allow());
    }

    #[tokio::test]
    async fn call_runs_only_when_allowed_and_counts_the_result() {
        let b = CircuitBreaker::with_config(
            "down",
            CircuitBreakerConfig {
                failures: 1,
                open_for: Duration::from_secs(60),
            },
        );
        let ok: Result<u8, BreakerError<&str>> = b.call(async { Ok::<u8, &str>(1) }).await;
        assert_eq!(ok, Ok(1));
        let failed = b.call(async { Err::<u8, &str>("boom") }).await;
        assert_eq!(failed, Err(BreakerError::Failed("boom")));
        let refused = b.call(async { Ok::<u8, &str>(1) }).await;
        assert_eq!(refused, Err(BreakerError::Open(BreakerState::Open)));
    }
}

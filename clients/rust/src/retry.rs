//! For callers of rate-limited services: retries with exponential backoff
//! (1, 2, 4 s), up to +0.5 s of jitter, at most 3 retries, never earlier
//! than the server's `Retry-After`, within a cap on the total time.

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// The schedule of retries.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RetryPolicy {
    /// The wait before retry n (the last one repeats): 1, 2, 4 s.
    pub backoff: Vec<Duration>,
    /// The most jitter added to each wait (0.5 s).
    pub jitter: Duration,
    /// The most retries after the first attempt (3).
    pub max_retries: u32,
    /// No retry starts later than this after the first attempt (30 s).
    pub max_total: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            backoff: vec![
                Duration::from_secs(1),
                Duration::from_secs(2),
                Duration::from_secs(4),
            ],
            jitter: Duration::from_millis(500),
            max_retries: 3,
            max_total: Duration::from_secs(30),
        }
    }
}

/// What one attempt gave.
pub enum Attempt<T> {
    /// Done (success or an error not worth retrying).
    Done(T),
    /// Rate limited (429, `RESOURCE_EXHAUSTED`), with the server's
    /// `Retry-After` if it sent one.
    Limited(T, Option<Duration>),
}

impl RetryPolicy {
    /// The wait before retry `retry` (0-based), given the jitter drawn in
    /// `0..=1` as `jitter_unit` and the server's `Retry-After`.
    pub fn delay(&self, retry: u32, jitter_unit: f64, retry_after: Option<Duration>) -> Duration {
        let base = self
            .backoff
            .get(retry as usize)
            .or(self.backoff.last())
            .copied()
            .unwrap_or_default();
        let wait = base + self.jitter.mul_f64(jitter_unit.clamp(0.0, 1.0));
        wait.max(retry_after.unwrap_or_default())
    }

    /// Runs `attempt` (given the attempt's number, from 0) until it is done,
    /// retries are used up, or the next retry would start after
    /// `max_total`; answers the last result.
    pub async fn run<T, F, Fut>(&self, mut attempt: F) -> T
    where
        F: FnMut(u32) -> Fut,
        Fut: Future<Output = Attempt<T>>,
    {
        let start = Instant::now();
        let mut n = 0;
        loop {
            match attempt(n).await {
                Attempt::Done(t) => return t,
                Attempt::Limited(t, retry_after) => {
                    if n >= self.max_retries {
                        return t;
                    }
                    let wait = self.delay(n, jitter_unit(), retry_after);
                    if start.elapsed() + wait > self.max_total {
                        return t;
                    }
                    tokio::time::sleep(wait).await;
                    n += 1;
                }
            }
        }
    }
}

/// `Retry-After` as delay-seconds (an HTTP date is not handled: the kit's
/// servers send seconds).
pub fn retry_after(headers: &http::HeaderMap) -> Option<Duration> {
    let value = headers.get(http::header::RETRY_AFTER)?.to_str().ok()?;
    value.trim().parse::<u64>().ok().map(Duration::from_secs)
}

/// A uniform draw in `0..1` (xorshift over the clock: jitter needs spread,
/// not secrecy).
fn jitter_unit() -> f64 {
    static SEED: AtomicU64 = AtomicU64::new(0);
    let clock = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_nanos() as u64;
    let mut x = clock ^ SEED.fetch_add(0x9E37_79B9_7F4A_7C15, Ordering::Relaxed) | 1;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    (x >> 11) as f64 / (1u64 << 53) as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_is_one_two_four_seconds_plus_at_most_half_a_second() {
        let p = RetryPolicy::default();
        assert_eq!(p.delay(0, 0.0, None), Duration::from_secs(1));
        assert_eq!(p.delay(1, 0.0, None), Duration::from_secs(2));
        assert_eq!(p.delay(2, 1.0, None), Duration::from_millis(4500));
        for _ in 0..1000 {
            let u = jitter_unit();
            assert!((0.0..1.0).contains(&u));
        }
    }

    #[test]
    fn a_retry_never_starts_before_retry_after() {
        let p = RetryPolicy::default();
        assert_eq!(
            p.delay(0, 0.5, Some(Duration::from_secs(7))),
            Duration::from_secs(7)
        );
        assert_eq!(
            p.delay(2, 0.0, Some(Duration::from_secs(1))),
            Duration::from_secs(4)
        );
    }

    #[tokio::test(start_paused = true)]
    async fn at_most_three_retries_then_the_last_answer() {
        let p = RetryPolicy::default();
        let mut calls = 0;
        let last = p
            .run(|n| {
                calls += 1;
                async move { Attempt::Limited(n, None) }
            })
            .await;
        assert_eq!((calls, last), (4, 3));
    }

    #[tokio::test(start_paused = true)]
    async fn the_total_cap_stops_retries_early() {
        let p = RetryPolicy {
            max_total: Duration::from_secs(2),
            ..RetryPolicy::default()
        };
        let mut calls = 0;
        p.run(|_| {
            calls += 1;
            async { Attempt::Limited((), None) }
        })
        .await;
        assert_eq!(
            calls, 2,
            "1 s + jitter fits the 2 s cap, 2 s more would not"
        );
        let stopped = p
            .run(|_| async { Attempt::Limited((), Some(Duration::from_secs(60))) })
            .await;
        assert_eq!(stopped, ());
    }
}

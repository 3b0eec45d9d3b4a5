//! A concurrency lease held for the length of some work: released when its
//! guard is dropped (or by [`LeaseGuard::release`]), and renewed in the
//! background while it is held, so that long work keeps its unit and a
//! crashed process frees it after `lease_ms`.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::task::JoinHandle;

use crate::client::Client;
use crate::decision::Decision;
use crate::rule::Spec;
use crate::Error;

/// The deadline of a renewal or a release: neither is on a request's path,
/// and a lost one is covered by the lease's expiry.
pub(crate) const UPKEEP_DEADLINE: Duration = Duration::from_secs(1);

/// Where the guard learns the `lease_ms` it renews with.
pub(crate) enum LeaseMs {
    /// Given with the call.
    Known(u64),
    /// The policy's, read in the background (`RL.POLICY GET`) before the
    /// first renewal.
    Policy(String),
}

/// A lease of `RL.CONCURRENCY` (or of `RL.HIT` on a `CONCURRENCY`
/// policy), held until the guard is dropped.
///
/// - Dropping it releases the lease: `RL.RELEASE` is sent from a task
///   spawned on the tokio runtime, so drop never blocks. Outside a runtime
///   nothing can be sent, and the lease ends by itself after `lease_ms`.
/// - While it is held, a background task renews it every `lease_ms / 3`
///   (`RL.RENEW`), so work longer than `lease_ms` keeps its unit; if a
///   renewal finds the lease gone (it had expired), [`LeaseGuard::lost`]
///   turns true and renewals stop.
/// - [`LeaseGuard::release`] releases at once and says whether the lease
///   was still held.
#[must_use = "dropping the guard releases the lease at once"]
pub struct LeaseGuard {
    client: Client,
    key: String,
    id: Option<u64>,
    decision: Decision,
    lost: Arc<AtomicBool>,
    renewer: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for LeaseGuard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LeaseGuard")
            .field("key", &self.key)
            .field("id", &self.id)
            .field("lost", &self.lost())
            .finish()
    }
}

impl LeaseGuard {
    /// Holds the lease of an admitted `decision` on `key`; renews it in the
    /// background. A decision without a lease (an `OFF` policy, `COST 0`,
    /// a policy of another algorithm) gives a guard that holds nothing.
    pub(crate) fn start(client: Client, key: &str, decision: Decision, lease_ms: LeaseMs) -> Self {
        let lost = Arc::new(AtomicBool::new(false));
        let renewer = decision.lease.map(|id| {
            let (client, key, lost) = (client.clone(), key.to_string(), lost.clone());
            tokio::spawn(renew_while_held(client, key, id, lease_ms, lost))
        });
        LeaseGuard {
            client,
            key: key.to_string(),
            id: decision.lease,
            decision,
            lost,
            renewer,
        }
    }

    /// The lease's id (`None`: the guard holds nothing, e.g. an `OFF`
    /// policy admitted the request without a lease).
    pub fn id(&self) -> Option<u64> {
        self.id
    }

    /// The limiter key the lease is on.
    pub fn key(&self) -> &str {
        &self.key
    }

    /// The admission that granted the lease (`remaining` units free then).
    pub fn decision(&self) -> &Decision {
        &self.decision
    }

    /// Whether a renewal found the lease already ended (it expired, say
    /// after the process was paused longer than `lease_ms`): the unit may
    /// now be someone else's.
    pub fn lost(&self) -> bool {
        self.lost.load(Ordering::Relaxed)
    }

    /// Releases the lease now: whether it was still held (`RL.RELEASE`'s
    /// 1). Not retried: a release that fails is covered by the expiry.
    pub async fn release(mut self) -> Result<bool, Error> {
        self.stop_renewing();
        match self.id.take() {
            Some(id) => {
                self.client
                    .with_deadline(UPKEEP_DEADLINE)
                    .release(&self.key, id)
                    .await
            }
            None => Ok(false),
        }
    }

    fn stop_renewing(&mut self) {
        if let Some(task) = self.renewer.take() {
            task.abort();
        }
    }
}

impl Drop for LeaseGuard {
    fn drop(&mut self) {
        self.stop_renewing();
        let Some(id) = self.id.take() else { return };
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            tracing::debug!(key = %self.key, id, "redis-ratelimit: lease dropped outside a runtime; it ends after lease_ms");
            return;
        };
        let client = self.client.with_deadline(UPKEEP_DEADLINE);
        let key = std::mem::take(&mut self.key);
        runtime.spawn(async move {
            if let Err(e) = client.release(&key, id).await {
                tracing::warn!(error = %e, key = %key, id, "redis-ratelimit: release failed; the lease ends after lease_ms");
            }
        });
    }
}

async fn renew_while_held(
    client: Client,
    key: String,
    id: u64,
    lease_ms: LeaseMs,
    lost: Arc<AtomicBool>,
) {
    let lease_ms = match lease_ms {
        LeaseMs::Known(ms) => ms,
        LeaseMs::Policy(name) => match client.policy_get(&name).await {
            Ok(Some(info)) => match info.spec {
                Some(Spec::Concurrency(p)) => p.lease_ms(),
                _ => return,
            },
            Ok(None) => return,
            Err(e) => {
                tracing::warn!(error = %e, policy = %name, "redis-ratelimit: cannot read the policy's lease_ms; the lease is not renewed");
                return;
            }
        },
    };
    let every = Duration::from_millis((lease_ms / 3).max(1));
    let renewer = client.with_deadline(every.max(client.deadline()).min(UPKEEP_DEADLINE));
    let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        match renewer.renew(&key, id, lease_ms).await {
            Ok(true) => {}
            Ok(false) => {
                lost.store(true, Ordering::Relaxed);
                tracing::warn!(key = %key, id, "redis-ratelimit: the lease had ended before its renewal");
                return;
            }
            Err(e) => {
                tracing::warn!(error = %e, key = %key, id, "redis-ratelimit: renewal failed; trying again in lease_ms / 3")
            }
        }
    }
}

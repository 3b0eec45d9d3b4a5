//! The Rust client kit of redis-ratelimit: what an application needs around
//! the `RL.*` commands.
//!
//! - [`Client`]: typed calls of every command (standalone, Sentinel,
//!   Cluster), one round trip each to the node that owns the key, within a
//!   deadline, never retried; `MODULE LIST` checked at start-up.
//! - Waiting and holding: [`Client::acquire`] waits for admission with
//!   `BLOCK` on a connection of its own; [`Client::lease`] holds an
//!   `RL.CONCURRENCY` lease in a [`LeaseGuard`] that releases on drop and
//!   renews in the background.
//! - [`Limiter`]: a local deny cache, an optional in-process level for the
//!   rules marked global, and a [`FallbackMode`] with a circuit breaker when
//!   Redis cannot answer; counters of every path ([`StatsSnapshot`]).
//! - [`RateLimitLayer`]: a tower layer for axum, hyper and tonic: 429 (or
//!   gRPC `RESOURCE_EXHAUSTED`) with `Retry-After`, `RateLimit-Policy` and
//!   `RateLimit`, and a problem+json body; it can also cap the requests in
//!   flight per key ([`RateLimitLayerBuilder::concurrency`]).
//! - Calendar quotas: [`Client::quota`] (`RL.QUOTA`, a [`Period`] and an
//!   optional [`Zone`]) and [`Rule::quota`] / [`Rule::quota_in`], a rule like
//!   the others (policies, `RL.ALL`, the local level, the layer, whose
//!   `RateLimit-Policy` gives a quota `w` = the period's nominal seconds).
//! - [`RetryPolicy`]: backoff for callers of rate-limited services.
//! - The protection loop: [`Protection`] sends the outcomes of the requests
//!   a policy admitted (`RL.OUTCOME`) and reads its stage and scale from
//!   every master in the background; the layer degrades non-core routes at
//!   stage 1 ([`RateLimitLayerBuilder::core`],
//!   [`RateLimitLayerBuilder::degrade`]) and a policy at stage 2 forces its
//!   [`CircuitBreaker`] open ([`Rule::breaker`]).
//! - Observability: [`Metrics`] (`ratelimit_*` in a `prometheus-client`
//!   registry, served by [`Metrics::render`]) and [`DenyEvents`] (every
//!   denial as a JSON line, shipped in batches to a [`Sink`]: a file, an
//!   Elasticsearch `_bulk` endpoint, a callback), both given to
//!   [`LimiterBuilder::metrics`] and [`LimiterBuilder::deny_events`].
//!
//! ```no_run
//! use redis_ratelimit_client::{Client, Limiter, Rule, RateLimitLayer};
//! # async fn demo() -> Result<(), redis_ratelimit_client::Error> {
//! let client = Client::standalone("redis://127.0.0.1:6379/").await?;
//! let limiter = Limiter::builder(client).instances(3).build();
//! let layer = RateLimitLayer::builder(limiter)
//!     .key(|req| req.headers.get("x-user").and_then(|v| v.to_str().ok()).map(String::from))
//!     .rule(Rule::sliding(5, 1000).name("per-user").key_prefix("rl:user:"))
//!     .rule(Rule::token_bucket(15_000, 15_000, 1000).name("global").fixed_key("rl:global").global())
//!     .build()
//!     .await?;
//! # let _ = layer; Ok(()) }
//! ```

#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod acquire;
mod client;
#[cfg(test)]
mod contract;
mod decision;
mod deny_cache;
mod error;
mod fallback;
mod grants;
mod layer;
mod lease;
mod limiter;
mod local;
mod observability;
#[cfg(test)]
mod observability_contract;
mod protection;
mod retry;
mod rule;

/// Deprecated: [`Request`] (kept for one release; see CHANGELOG.md).
#[allow(deprecated)]
pub use client::Units;
pub use client::{
    Adapt, Client, LogEntry, PolicyInfo, PolicyMode, PolicyProtection, PolicyStats, WindowCounts,
    DEFAULT_DEADLINE, MAX_UPTO, MIN_MODULE_VERSION,
};
pub use decision::{Decision, Path};
pub use error::Error;
pub use fallback::{Breaker as RedisBreaker, BreakerConfig, FallbackMode, Gate, StatsSnapshot};
pub use grants::key_slot;
pub use layer::{
    DegradeReason, Finished, HeldBody, MissingKey, RateLimit, RateLimitBody, RateLimitLayer,
    RateLimitLayerBuilder, RequestParts, QUOTA_EXCEEDED,
};
pub use lease::LeaseGuard;
pub use limiter::{CheckedRule, Limiter, LimiterBuilder, RuleSet};
/// The deny events' defaults (the contract's): `CAPACITY`, `FLUSH_EVENTS`,
/// `FLUSH_INTERVAL`, `SINK_TIMEOUT`, `BULK_INDEX`.
pub use observability::events_defaults as deny_events_defaults;
pub use observability::{
    render as render_metrics, DenyEvent, DenyEvents, DenyEventsBuilder, DenyEventsStats, Metrics,
    Outcome, Sink, LEVELS, METRICS, OPENMETRICS_CONTENT_TYPE, OUTCOMES, REDIS_SECONDS_BUCKETS,
    TEXT_CONTENT_TYPE,
};
/// The registry type [`Metrics::register`] takes: `prometheus-client`'s.
pub use prometheus_client::registry::Registry;
pub use protection::{
    BreakerError, BreakerState, CircuitBreaker, CircuitBreakerConfig, Protection,
    ProtectionBuilder, ProtectionStats, DEFAULT_REPORT_INTERVAL, DEFAULT_STAGE_HOLD,
    DEFAULT_STAGE_POLL,
};
pub use redis_ratelimit_core::{Period, Request};
pub use retry::{retry_after, Attempt, RetryPolicy};
pub use rule::{
    parse_period, period_nominal_s, period_word, Batch, KeyShape, Rule, RuleKind, Share, Spec,
    Zone, MAX_STRIPES,
};

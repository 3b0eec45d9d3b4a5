//! The tower layer: a key from a closure, the rules of a [`RuleSet`], an
//! optional cap on the requests in flight per key (a lease held from the
//! request's start to its response body's end), and the HTTP (or gRPC)
//! answer: 429 with `Retry-After`, the IETF `RateLimit-Policy` and
//! `RateLimit` fields (also on admitted responses), `X-RateLimit-*` on
//! request, and a problem+json body.
//!
//! One concept per file, as tower-http's `limit/`:
//! - this file: the layer, what the key closure sees, and what its
//!   services share;
//! - `builder.rs`: [`RateLimitLayerBuilder`], which checks the rules;
//! - `service.rs`: the service [`RateLimit`] and its response body;
//! - `headers.rs`: the header fields and the problem+json bodies.

use std::sync::Arc;

use http::{HeaderMap, HeaderValue};
use tower_layer::Layer;

use crate::limiter::{Cap, Limiter, RuleSet};

mod builder;
mod headers;
mod service;

pub use builder::RateLimitLayerBuilder;
pub use headers::QUOTA_EXCEEDED;
// The contract test checks the fields and bodies against the vectors.
#[cfg(test)]
pub(crate) use headers::{denial_body, policy_item, ratelimit_item};
pub use service::{HeldBody, RateLimit, RateLimitBody};

/// What the key closure sees of a request.
pub struct RequestParts<'a> {
    /// The method.
    pub method: &'a http::Method,
    /// The URI.
    pub uri: &'a http::Uri,
    /// The headers.
    pub headers: &'a HeaderMap,
    /// The extensions (axum's `ConnectInfo`, an authenticated user...).
    pub extensions: &'a http::Extensions,
}

type KeyFn = dyn Fn(&RequestParts<'_>) -> Option<String> + Send + Sync;

/// What happens to a request whose key closure answers `None`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MissingKey {
    /// 400 with a problem+json body (the default): a request that cannot be
    /// attributed is refused rather than let through unlimited.
    Reject,
    /// Passed to the service unlimited, without rate-limit headers.
    Allow,
}

/// What the services of a layer share.
struct Shared {
    limiter: Limiter,
    rules: Option<RuleSet>,
    cap: Option<Cap>,
    key: Arc<KeyFn>,
    policy: HeaderValue,
    x_headers: bool,
    grpc: bool,
    missing_key: MissingKey,
}

/// A tower [`Layer`] that rate-limits every request of the service it wraps.
#[derive(Clone)]
pub struct RateLimitLayer {
    shared: Arc<Shared>,
}

impl RateLimitLayer {
    /// A builder over `limiter`.
    pub fn builder(limiter: Limiter) -> RateLimitLayerBuilder {
        RateLimitLayerBuilder::new(limiter)
    }

    /// The limiter (for its counters).
    pub fn limiter(&self) -> &Limiter {
        &self.shared.limiter
    }
}

impl<S> Layer<S> for RateLimitLayer {
    type Service = RateLimit<S>;
    fn layer(&self, inner: S) -> RateLimit<S> {
        RateLimit {
            inner,
            shared: self.shared.clone(),
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_local_share_is_a_tenth_more_than_an_even_split_rounded_up() {
        use crate::rule::Share;
        assert_eq!(Share::Instances(20).of(15_000), 825, "seed 000's rule");
        assert_eq!(Share::Instances(3).of(100), 37);
        assert_eq!(Share::Instances(2).of(10), 6);
        assert_eq!(Share::Instances(1000).of(5), 1, "at least 1");
        assert_eq!(Share::Instances(1).of(50), 50, "never more than the whole");
        assert_eq!(Share::Ratio(0.25).of(10), 3);
    }
}

//! The tower layer: a key from a closure, the rules of a [`RuleSet`], an
//! optional cap on the requests in flight per key (a lease held from the
//! request's start to its response body's end), and the HTTP (or gRPC)
//! answer: 429 with `Retry-After`, the IETF `RateLimit-Policy` and
//! `RateLimit` fields (also on admitted responses), `X-RateLimit-*` on
//! request, and a problem+json body. With a [`crate::Protection`], the
//! protection loop per route: outcomes counted for the policies that
//! admitted, non-core routes degraded at stage 1, a degrade handler instead
//! of the 429.
//!
//! One concept per file, as tower-http's `limit/`:
//! - this file: the layer, what the key closure sees, and what its
//!   services share;
//! - `builder.rs`: [`RateLimitLayerBuilder`], which checks the rules;
//! - `service.rs`: the service [`RateLimit`] and its response body;
//! - `headers.rs`: the header fields and the problem+json bodies.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Response, StatusCode};
use tower_layer::Layer;

use crate::limiter::{Cap, Limiter, RuleSet};
use crate::protection::Protection;

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

/// The default client address of a deny event: a `SocketAddr` or an
/// `IpAddr` the server put in the request's extensions (axum's
/// `ConnectInfo` needs [`RateLimitLayerBuilder::client_ip`]).
pub(crate) fn peer_ip(req: &RequestParts<'_>) -> Option<String> {
    if let Some(addr) = req.extensions.get::<std::net::SocketAddr>() {
        return Some(addr.ip().to_string());
    }
    req.extensions
        .get::<std::net::IpAddr>()
        .map(|ip| ip.to_string())
}

/// Why a route answers with its degrade handler.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DegradeReason {
    /// A non-core route while a policy of its rules is at this stage (1 or
    /// more): no call to Redis was made.
    Stage(u8),
    /// The limiter denied the request (instead of the 429).
    Denied,
}

/// How a request the limiter admitted finished: what the error predicate
/// ([`RateLimitLayerBuilder::error_when`]) sees.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Finished {
    /// The service answered with this status.
    Status(StatusCode),
    /// The service returned an error.
    Failed,
    /// The service did not answer within
    /// [`RateLimitLayerBuilder::handler_timeout`] (the layer answers 504).
    TimedOut,
}

impl Finished {
    /// The default predicate: a 5xx answer, a service error or a timeout.
    pub fn is_error(&self) -> bool {
        match self {
            Finished::Status(s) => s.is_server_error(),
            Finished::Failed | Finished::TimedOut => true,
        }
    }
}

type DegradeFn = dyn Fn(&RequestParts<'_>, DegradeReason) -> Response<Bytes> + Send + Sync;
type ErrorFn = dyn Fn(&Finished) -> bool + Send + Sync;

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
    /// The client's address for the deny events.
    client_ip: Arc<KeyFn>,
    policy: HeaderValue,
    x_headers: bool,
    grpc: bool,
    missing_key: MissingKey,
    /// The protection loop, its policy rules, and the route's options.
    protection: Option<Protection>,
    policies: Vec<String>,
    core: bool,
    degrade: Option<Arc<DegradeFn>>,
    error_when: Arc<ErrorFn>,
    handler_timeout: Option<Duration>,
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

    /// The protection loop, if the layer has one.
    pub fn protection(&self) -> Option<&Protection> {
        self.shared.protection.as_ref()
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

//! The service [`RateLimit`]: the key, the rate rules, the concurrency
//! cap, then the wrapped service; and its response body, which holds the
//! request's lease until it ends.

use std::future::Future;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body::{Body, Frame, SizeHint};
use http_body_util::{Either, Full};
use pin_project_lite::pin_project;
use tower_service::Service;

use super::headers::problem;
use super::{MissingKey, RequestParts, Shared};
use crate::decision::Decision;
use crate::fallback::Stats;
use crate::lease::LeaseGuard;
use crate::limiter::Hold;

/// The service [`RateLimitLayer`](super::RateLimitLayer) builds.
#[derive(Clone)]
pub struct RateLimit<S> {
    pub(super) inner: S,
    pub(super) shared: Arc<Shared>,
}

/// The response body: the service's (holding the request's lease, if the
/// layer caps concurrency, until it ends), or the kit's own for a denial.
pub type RateLimitBody<B> = Either<HeldBody<B>, Full<Bytes>>;

pin_project! {
    /// The service's response body, holding the request's lease until the
    /// body ends (its last frame, an error, or the body dropped).
    pub struct HeldBody<B> {
        #[pin]
        inner: B,
        lease: Option<LeaseGuard>,
    }
}

impl<B> HeldBody<B> {
    pub(super) fn new(inner: B, lease: Option<LeaseGuard>) -> Self {
        HeldBody { inner, lease }
    }

    /// The body without its lease (which is released now).
    pub fn into_inner(self) -> B {
        self.inner
    }
}

impl<B: Body> Body for HeldBody<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        let this = self.project();
        let frame = this.inner.poll_frame(cx);
        if matches!(frame, Poll::Ready(None) | Poll::Ready(Some(Err(_)))) {
            // The response is done: the unit is free for the next request.
            this.lease.take();
        }
        frame
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

impl<S, B, ResBody> Service<Request<B>> for RateLimit<S>
where
    S: Service<Request<B>, Response = Response<ResBody>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    B: Send + 'static,
{
    type Response = Response<RateLimitBody<ResBody>>;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<B>) -> Self::Future {
        let shared = self.shared.clone();
        // The clone that was made ready is the one to call.
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let parts = RequestParts {
            method: req.method(),
            uri: req.uri(),
            headers: req.headers(),
            extensions: req.extensions(),
        };
        let key = catch_unwind(AssertUnwindSafe(|| (shared.key)(&parts)));
        Box::pin(async move {
            let stats = &shared.limiter;
            let identity = match key {
                Err(_) => {
                    Stats::add(&stats.raw_stats().key_panics);
                    tracing::error!("redis-ratelimit: the key closure panicked; answering 500");
                    return Ok(problem(
                        StatusCode::INTERNAL_SERVER_ERROR,
                        "about:blank",
                        "Rate-limit key unavailable",
                        "the rate-limit key of this request could not be computed",
                        None,
                    ));
                }
                Ok(None) => {
                    Stats::add(&stats.raw_stats().key_missing);
                    match shared.missing_key {
                        MissingKey::Allow => {
                            return inner
                                .call(req)
                                .await
                                .map(|r| r.map(|b| Either::Left(HeldBody::new(b, None))))
                        }
                        MissingKey::Reject => {
                            return Ok(problem(
                                StatusCode::BAD_REQUEST,
                                "about:blank",
                                "Rate-limit key missing",
                                "this request carries no rate-limit key",
                                None,
                            ))
                        }
                    }
                }
                Ok(Some(identity)) => identity,
            };
            let rate = match &shared.rules {
                Some(set) => {
                    let d = shared.limiter.check(set, &identity, 1).await;
                    if !d.allowed {
                        let name = shared.rule_name(&d);
                        return Ok(shared.denial(name, &d));
                    }
                    Some(d)
                }
                None => None,
            };
            // Held by this future until the response is built, then by its
            // body: a request that fails or is dropped releases it too.
            let (lease, held) = match &shared.cap {
                Some(cap) => match shared.limiter.hold(cap, &identity).await {
                    Hold::Held(guard) => {
                        let d = guard.decision().clone();
                        (Some(guard), Some(d))
                    }
                    Hold::Unheld(d) => (None, Some(d)),
                    Hold::Denied(d) => return Ok(shared.denial(cap.rule.rule_name(), &d)),
                },
                None => (None, None),
            };
            let mut response = inner.call(req).await?;
            let mut items = Vec::new();
            if let Some(d) = &rate {
                items.push((shared.rule_name(d), d));
            }
            if let (Some(cap), Some(d)) = (&shared.cap, &held) {
                items.push((cap.rule.rule_name(), d));
            }
            shared.add_headers(response.headers_mut(), &items);
            Ok(response.map(|b| Either::Left(HeldBody::new(b, lease))))
        })
    }
}

impl Shared {
    /// The rate rule the reply's fields describe: the one that denied, or
    /// for an admission the first whose limit is the reply's (the most
    /// restrictive).
    pub(super) fn rule_name(&self, d: &Decision) -> &str {
        let Some(set) = &self.rules else { return "" };
        let rules = set.rules();
        let i = match d.denied_by.filter(|&i| i < rules.len()) {
            Some(i) => i,
            None => rules
                .iter()
                .position(|r| r.spec.map(|s| s.limit()) == Some(d.limit))
                .unwrap_or(0),
        };
        rules[i].rule.rule_name()
    }
}

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
use super::{DegradeReason, Finished, MissingKey, RequestParts, Shared};
use crate::decision::Decision;
use crate::fallback::Stats;
use crate::lease::LeaseGuard;
use crate::limiter::Hold;
use crate::observability::Origin;

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
        // A non-core route at stage 1 or more: no call to Redis.
        if let Some(stage) = shared.degraded_stage() {
            let answer = shared
                .degrade
                .as_ref()
                .map(|handler| handler(&parts, DegradeReason::Stage(stage)));
            return Box::pin(async move {
                Ok(match answer {
                    Some(answer) => answer.map(|b| Either::Right(Full::new(b))),
                    None => shared.stage_denial(stage),
                })
            });
        }
        let key = catch_unwind(AssertUnwindSafe(|| (shared.key)(&parts)));
        // What the request's deny events carry, when the limiter ships them.
        let origin = shared.limiter.ships_events().then(|| Origin {
            client_ip: catch_unwind(AssertUnwindSafe(|| (shared.client_ip)(&parts)))
                .ok()
                .flatten()
                .map(|ip| Origin::cut(&ip)),
            // The header's bytes are shared, not copied: a string only on a denial.
            user_agent: parts.headers.get(http::header::USER_AGENT).cloned(),
        });
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
                    let d = shared
                        .limiter
                        .check_from(set, &identity, 1, origin.as_ref())
                        .await;
                    if !d.allowed {
                        shared.record_local_denial(&d);
                        if let Some(answer) = shared.degrade_denied(&req) {
                            return Ok(answer);
                        }
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
                Some(cap) => match shared.limiter.hold(cap, &identity, origin.as_ref()).await {
                    Hold::Held(guard) => {
                        let d = guard.decision().clone();
                        (Some(guard), Some(d))
                    }
                    Hold::Unheld(d) => (None, Some(d)),
                    Hold::Denied(d) => {
                        if let Some(answer) = shared.degrade_denied(&req) {
                            return Ok(answer);
                        }
                        return Ok(shared.denial(cap.rule.rule_name(), &d));
                    }
                },
                None => (None, None),
            };
            // Dropped before the handler finishes (an outer timeout, the
            // connection gone): the admitted request counts as timed out.
            let mut unfinished = Unfinished(Some(shared.clone()));
            let finished = match shared.handler_timeout {
                Some(timeout) => tokio::time::timeout(timeout, inner.call(req)).await.ok(),
                None => Some(inner.call(req).await),
            };
            unfinished.0 = None;
            shared.record(&finished);
            let mut response = match finished {
                Some(result) => result?,
                None => {
                    return Ok(problem(
                        StatusCode::GATEWAY_TIMEOUT,
                        "about:blank",
                        "Handler timeout",
                        "the service did not answer in time",
                        None,
                    ))
                }
            };
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

/// Counts an admitted request as timed out if its future is dropped
/// before the handler finished.
struct Unfinished(Option<Arc<Shared>>);

impl Drop for Unfinished {
    fn drop(&mut self) {
        if let Some(shared) = self.0.take() {
            shared.record_finished(&Finished::TimedOut);
        }
    }
}

impl Shared {
    /// The stage a non-core route degrades at: its policies' highest (or,
    /// without policy rules, the protection's), when 1 or more.
    fn degraded_stage(&self) -> Option<u8> {
        if self.core {
            return None;
        }
        let protection = self.protection.as_ref()?;
        let stage = if self.policies.is_empty() {
            protection.max_stage()
        } else {
            self.policies
                .iter()
                .map(|p| protection.stage(p))
                .max()
                .unwrap_or(0)
        };
        (stage >= 1).then_some(stage)
    }

    /// The degrade handler's answer to a denial, if the route has one.
    fn degrade_denied<B, T>(&self, req: &Request<B>) -> Option<Response<RateLimitBody<T>>> {
        let handler = self.degrade.as_ref()?;
        let parts = RequestParts {
            method: req.method(),
            uri: req.uri(),
            headers: req.headers(),
            extensions: req.extensions(),
        };
        Some(handler(&parts, DegradeReason::Denied).map(|b| Either::Right(Full::new(b))))
    }

    /// A non-core route's 429 at stage 1 or more, without a degrade
    /// handler: the usual fields, as if its first rule denied for a second.
    fn stage_denial<T>(&self, stage: u8) -> Response<RateLimitBody<T>> {
        let first = self.rules.as_ref().and_then(|set| set.rules().first());
        let name = first.map_or("", |r| r.rule.rule_name());
        let limit = first.and_then(|r| r.spec).map_or(0, |s| s.limit());
        let d = Decision::from_fields(false, limit, 0, 1000, 1000, crate::decision::Path::Local);
        tracing::debug!(
            stage,
            rule = name,
            "redis-ratelimit: non-core route degraded"
        );
        self.denial(name, &d)
    }

    /// A policy rule's denial answered without a call to the server (deny
    /// cache, local level), counted for the layer's protection loop when
    /// its limiter does not count it already (one given the loop with
    /// [`crate::LimiterBuilder::protection`] does).
    fn record_local_denial(&self, d: &Decision) {
        if !matches!(
            d.path,
            crate::decision::Path::DenyCache | crate::decision::Path::Local
        ) || self.limiter.counts_local_denials()
        {
            return;
        }
        let (Some(protection), Some(set), Some(i)) = (&self.protection, &self.rules, d.denied_by)
        else {
            return;
        };
        if let Some(crate::rule::RuleKind::Policy(name)) = set.rules().get(i).map(|r| &r.kind) {
            protection.record_denied(name);
        }
    }

    /// Counts the outcome of an admitted request for each policy rule.
    fn record<T, E>(&self, finished: &Option<Result<Response<T>, E>>) {
        if self.protection.is_none() || self.policies.is_empty() {
            return;
        }
        let finished = match finished {
            None => Finished::TimedOut,
            Some(Err(_)) => Finished::Failed,
            Some(Ok(r)) => Finished::Status(r.status()),
        };
        self.record_finished(&finished);
    }

    /// Counts one admitted request's outcome for each policy rule.
    fn record_finished(&self, finished: &Finished) {
        let Some(protection) = &self.protection else {
            return;
        };
        let error = (self.error_when)(finished);
        for policy in &self.policies {
            protection.record(policy, error);
        }
    }

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

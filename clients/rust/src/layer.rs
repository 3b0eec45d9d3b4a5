//! The tower layer: a key from a closure, the rules of a [`RuleSet`], an
//! optional cap on the requests in flight per key (a lease held from the
//! request's start to its response body's end), and the HTTP (or gRPC)
//! answer: 429 with `Retry-After`, the IETF `RateLimit-Policy` and
//! `RateLimit` fields (also on admitted responses), `X-RateLimit-*` on
//! request, and a problem+json body.

use std::future::Future;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Request, Response, StatusCode};
use http_body::{Body, Frame, SizeHint};
use http_body_util::{Either, Full};
use pin_project_lite::pin_project;
use tower_layer::Layer;
use tower_service::Service;

use crate::decision::Decision;
use crate::fallback::Stats;
use crate::lease::LeaseGuard;
use crate::limiter::{Cap, Hold, Limiter, RuleSet};
use crate::rule::{Rule, Spec};
use crate::Error;

/// The problem type of a denial.
pub const QUOTA_EXCEEDED: &str = "https://iana.org/assignments/http-problem-types#quota-exceeded";

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

/// Builds a [`RateLimitLayer`].
pub struct RateLimitLayerBuilder {
    limiter: Limiter,
    rules: Vec<Rule>,
    concurrency: Option<Rule>,
    key: Option<Arc<KeyFn>>,
    x_headers: bool,
    grpc: bool,
    missing_key: MissingKey,
}

impl RateLimitLayerBuilder {
    /// The request's identity (peer IP, a header, a user); each rule's key
    /// is built from it ([`Rule::key_prefix`]). A panic in the closure
    /// answers 500 with a problem body and counts in `key_panics`.
    pub fn key<F>(mut self, key: F) -> Self
    where
        F: Fn(&RequestParts<'_>) -> Option<String> + Send + Sync + 'static,
    {
        self.key = Some(Arc::new(key));
        self
    }
    /// Adds a rule; several are checked together in one `RL.ALL`.
    pub fn rule(mut self, rule: Rule) -> Self {
        self.rules.push(rule);
        self
    }
    /// Caps the requests in flight per key: `rule` is
    /// [`Rule::concurrency`] (or [`Rule::policy`] naming a `CONCURRENCY`
    /// policy). Each request the rate rules admit then takes a lease of one
    /// unit when it starts, and gives it back when its response body ends,
    /// or when the request fails or is dropped (a client gone); a lease is
    /// renewed while the request runs. A full cap answers 429 like a rate
    /// denial; its `RateLimit-Policy` item has no `w`. When Redis cannot
    /// answer, a fail-closed fallback denies and the others admit.
    pub fn concurrency(mut self, rule: Rule) -> Self {
        self.concurrency = Some(rule);
        self
    }
    /// Adds `X-RateLimit-Limit`, `-Remaining` and `-Reset`.
    pub fn x_ratelimit_headers(mut self, on: bool) -> Self {
        self.x_headers = on;
        self
    }
    /// Answers denials as gRPC `RESOURCE_EXHAUSTED` (status 8, in a
    /// trailers-only response with the same fields as metadata) instead of
    /// HTTP 429: for tonic servers.
    pub fn grpc(mut self, on: bool) -> Self {
        self.grpc = on;
        self
    }
    /// What a request without a key gets.
    pub fn on_missing_key(mut self, what: MissingKey) -> Self {
        self.missing_key = what;
        self
    }

    /// Checks every rule (a bad parameter is an error naming it, here and
    /// not at the first request) and reads the policies from the server.
    pub async fn build(self) -> Result<RateLimitLayer, Error> {
        let rules = if self.rules.is_empty() && self.concurrency.is_some() {
            None
        } else {
            Some(self.limiter.rule_set(self.rules).await?)
        };
        let cap = match self.concurrency {
            Some(rule) => Some(self.limiter.cap(rule).await?),
            None => None,
        };
        let key = self
            .key
            .ok_or_else(|| Error::bad("-", "key", "the layer needs a key closure"))?;
        let mut items: Vec<String> = rules
            .iter()
            .flat_map(|set| set.rules())
            .map(|r| match r.spec {
                Some(s) => policy_item(r.rule.rule_name(), &s),
                None => format!("\"{}\"", r.rule.rule_name()),
            })
            .collect();
        if let Some(cap) = &cap {
            items.push(policy_item(
                cap.rule.rule_name(),
                &Spec::Concurrency(cap.params),
            ));
        }
        let policy = items.join(", ");
        let policy = HeaderValue::from_str(&policy)
            .map_err(|_| Error::bad("-", "name", "rule names must be visible ASCII"))?;
        Ok(RateLimitLayer {
            shared: Arc::new(Shared {
                limiter: self.limiter,
                rules,
                cap,
                key,
                policy,
                x_headers: self.x_headers,
                grpc: self.grpc,
                missing_key: self.missing_key,
            }),
        })
    }
}

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
        RateLimitLayerBuilder {
            limiter,
            rules: Vec::new(),
            concurrency: None,
            key: None,
            x_headers: false,
            grpc: false,
            missing_key: MissingKey::Reject,
        }
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

/// The service [`RateLimitLayer`] builds.
#[derive(Clone)]
pub struct RateLimit<S> {
    inner: S,
    shared: Arc<Shared>,
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
    fn new(inner: B, lease: Option<LeaseGuard>) -> Self {
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
    fn rule_name(&self, d: &Decision) -> &str {
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

    /// The fields of a response: `RateLimit` has an item per decision (the
    /// rate rules' one, then the concurrency cap's); `X-RateLimit-*` and
    /// `Retry-After` come from the first.
    fn add_headers(&self, headers: &mut HeaderMap, items: &[(&str, &Decision)]) {
        headers.insert("ratelimit-policy", self.policy.clone());
        let Some((_, d)) = items.first() else { return };
        let field = items
            .iter()
            .map(|(name, d)| ratelimit_item(name, d))
            .collect::<Vec<_>>()
            .join(", ");
        if let Ok(v) = HeaderValue::from_str(&field) {
            headers.insert("ratelimit", v);
        }
        let reset_s = d.reset_ms().div_ceil(1000);
        if self.x_headers {
            headers.insert("x-ratelimit-limit", HeaderValue::from(d.limit));
            headers.insert("x-ratelimit-remaining", HeaderValue::from(d.remaining));
            headers.insert("x-ratelimit-reset", HeaderValue::from(reset_s));
        }
        if !d.allowed {
            if let Some(s) = d.retry_after_s() {
                headers.insert(http::header::RETRY_AFTER, HeaderValue::from(s));
            }
        }
    }

    fn denial<B>(&self, rule: &str, d: &Decision) -> Response<RateLimitBody<B>> {
        let mut response = if self.grpc {
            let mut r = Response::new(Either::Right(Full::new(Bytes::new())));
            let h = r.headers_mut();
            h.insert(
                http::header::CONTENT_TYPE,
                HeaderValue::from_static("application/grpc"),
            );
            h.insert("grpc-status", HeaderValue::from_static("8"));
            h.insert(
                "grpc-message",
                HeaderValue::from_static("rate%20limit%20exceeded"),
            );
            if let Ok(v) = HeaderValue::from_str(rule) {
                h.insert("violated-policies", v);
            }
            r
        } else {
            problem_response(StatusCode::TOO_MANY_REQUESTS, denial_body(rule, d))
        };
        self.add_headers(response.headers_mut(), &[(rule, d)]);
        response
    }
}

/// A `RateLimit-Policy` item: `"name";q=<limit>;w=<window s>`, without `w`
/// for concurrency.
pub(crate) fn policy_item(name: &str, spec: &Spec) -> String {
    match spec.window_s() {
        Some(w) => format!("\"{name}\";q={};w={w}", spec.limit()),
        None => format!("\"{name}\";q={}", spec.limit()),
    }
}

/// The `RateLimit` item of a reply: `"name";r=<remaining>;t=<ceil(reset_ms / 1000)>`.
pub(crate) fn ratelimit_item(name: &str, d: &Decision) -> String {
    format!(
        "\"{name}\";r={};t={}",
        d.remaining,
        d.reset_ms().div_ceil(1000)
    )
}

/// The problem+json body of a denial by `rule` (RFC 9457, with the
/// `violated-policies` member of the rate-limit fields draft).
pub(crate) fn denial_body(rule: &str, d: &Decision) -> String {
    let detail = match d.retry_after_s() {
        Some(s) => format!("rate limit {rule:?} exceeded; retry after {s} s"),
        None => format!("rate limit {rule:?} exceeded; this request can never pass"),
    };
    problem_body(
        StatusCode::TOO_MANY_REQUESTS,
        QUOTA_EXCEEDED,
        "Request cannot be satisfied as assigned quota has been exceeded",
        &detail,
        Some(rule),
    )
}

fn problem_body(
    status: StatusCode,
    kind: &str,
    title: &str,
    detail: &str,
    violated: Option<&str>,
) -> String {
    let mut body = serde_json::json!({
        "type": kind,
        "title": title,
        "status": status.as_u16(),
        "detail": detail,
    });
    if let Some(v) = violated {
        body["violated-policies"] = serde_json::json!([v]);
    }
    body.to_string()
}

fn problem<B>(
    status: StatusCode,
    kind: &str,
    title: &str,
    detail: &str,
    violated: Option<&str>,
) -> Response<RateLimitBody<B>> {
    problem_response(status, problem_body(status, kind, title, detail, violated))
}

fn problem_response<B>(status: StatusCode, body: String) -> Response<RateLimitBody<B>> {
    let mut r = Response::new(Either::Right(Full::new(Bytes::from(body))));
    *r.status_mut() = status;
    r.headers_mut().insert(
        http::header::CONTENT_TYPE,
        HeaderValue::from_static("application/problem+json"),
    );
    r
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decision::Path;

    fn denial(wait_ms: i64, reset_ms: u64) -> Decision {
        Decision::from_fields(false, 10, 0, wait_ms, reset_ms, Path::Redis)
    }

    #[test]
    fn retry_after_is_wait_ms_in_seconds_rounded_up() {
        for (wait_ms, seconds) in [
            (1, 1),
            (999, 1),
            (1000, 1),
            (1001, 2),
            (60_000, 60),
            (60_001, 61),
        ] {
            assert_eq!(
                denial(wait_ms, 0).retry_after_s(),
                Some(seconds),
                "wait_ms {wait_ms}"
            );
        }
        assert_eq!(denial(-1, 0).retry_after_s(), None, "never: no Retry-After");
    }

    #[test]
    fn the_ratelimit_item_rounds_reset_ms_up_to_seconds() {
        assert_eq!(ratelimit_item("u", &denial(1, 1)), "\"u\";r=0;t=1");
        assert_eq!(ratelimit_item("u", &denial(1, 1000)), "\"u\";r=0;t=1");
        assert_eq!(ratelimit_item("u", &denial(1, 1001)), "\"u\";r=0;t=2");
        assert_eq!(ratelimit_item("u", &denial(1, 0)), "\"u\";r=0;t=0");
    }

    #[test]
    fn the_policy_window_of_a_bucket_is_the_time_to_refill_it() {
        let spec = |a: &str, p: &[u64]| Spec::parse("r", a, p).unwrap();
        assert_eq!(spec("TOKENBUCKET", &[5, 1, 1000]).window_s(), Some(5));
        assert_eq!(
            spec("TOKENBUCKET", &[15_000, 15_000, 1000]).window_s(),
            Some(1)
        );
        assert_eq!(
            spec("TOKENBUCKET", &[10, 3, 1000]).window_s(),
            Some(4),
            "3.34 s rounds up"
        );
        assert_eq!(spec("LEAKYBUCKET", &[2, 1, 10_000]).window_s(), Some(20));
        assert_eq!(spec("SLIDING", &[5, 1500]).window_s(), Some(2));
        assert_eq!(spec("FIXEDWINDOW", &[5, 1000]).window_s(), Some(1));
        assert_eq!(spec("HASHWINDOW", &[5, 60_000, 1000]).window_s(), Some(60));
    }

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

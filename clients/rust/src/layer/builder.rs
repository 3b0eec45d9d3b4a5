//! [`RateLimitLayerBuilder`]: the key closure, the rules, the options, and
//! the checks made once, when the layer is built.

use std::sync::Arc;

use http::HeaderValue;

use super::headers::policy_item;
use super::{KeyFn, MissingKey, RateLimitLayer, RequestParts, Shared};
use crate::limiter::Limiter;
use crate::rule::{Rule, Spec};
use crate::Error;

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
    /// The builder of [`RateLimitLayer::builder`]: no rules, no key, 429
    /// without `X-RateLimit-*`, a request without a key refused.
    pub(super) fn new(limiter: Limiter) -> Self {
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

//! [`RateLimitLayerBuilder`]: the key closure, the rules, the options, and
//! the checks made once, when the layer is built.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderValue, Response};

use super::headers::policy_item;
use super::{
    DegradeFn, DegradeReason, ErrorFn, Finished, KeyFn, MissingKey, RateLimitLayer, RequestParts,
    Shared,
};
use crate::limiter::Limiter;
use crate::protection::Protection;
use crate::rule::{Rule, RuleKind, Spec};
use crate::Error;

/// Builds a [`RateLimitLayer`].
pub struct RateLimitLayerBuilder {
    limiter: Limiter,
    rules: Vec<Rule>,
    concurrency: Option<Rule>,
    key: Option<Arc<KeyFn>>,
    client_ip: Arc<KeyFn>,
    x_headers: bool,
    grpc: bool,
    missing_key: MissingKey,
    protection: Option<Protection>,
    core: bool,
    degrade: Option<Arc<DegradeFn>>,
    error_when: Arc<ErrorFn>,
    handler_timeout: Option<Duration>,
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
            client_ip: Arc::new(super::peer_ip),
            x_headers: false,
            grpc: false,
            missing_key: MissingKey::Reject,
            protection: None,
            core: true,
            degrade: None,
            error_when: Arc::new(Finished::is_error),
            handler_timeout: None,
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
    /// The client's address in the deny events of this layer's denials
    /// (with the request's `User-Agent`). By default, a `SocketAddr` or
    /// `IpAddr` in the request's extensions; give axum's `ConnectInfo`, or
    /// a trusted proxy's `X-Forwarded-For`, here.
    pub fn client_ip<F>(mut self, client_ip: F) -> Self
    where
        F: Fn(&RequestParts<'_>) -> Option<String> + Send + Sync + 'static,
    {
        self.client_ip = Arc::new(client_ip);
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

    /// The protection loop this route takes part in: the outcome of each
    /// request its policy rules admitted is counted there (only rules given
    /// by policy name report), its policies are watched, and the breakers
    /// its rules name ([`Rule::breaker`]) follow their stage.
    pub fn protection(mut self, protection: Protection) -> Self {
        self.protection = Some(protection);
        self
    }
    /// Whether the route is core (the default). A non-core route, while a
    /// policy of its rules (or, without policy rules, any policy of the
    /// protection) is at stage 1 or more, answers with its degrade handler
    /// without a call to Redis, or 429 when it has none.
    pub fn core(mut self, core: bool) -> Self {
        self.core = core;
        self
    }
    /// The route's degrade handler (a cached or default answer): it answers
    /// a denial instead of the 429, and a non-core route at stage 1 or more.
    /// Sentinel's `blockHandler`, Resilience4j's `fallbackMethod`.
    pub fn degrade<F>(mut self, handler: F) -> Self
    where
        F: Fn(&RequestParts<'_>, DegradeReason) -> Response<Bytes> + Send + Sync + 'static,
    {
        self.degrade = Some(Arc::new(handler));
        self
    }
    /// What counts as an error among the requests the policies admitted
    /// (by default [`Finished::is_error`]: a 5xx answer, a service error,
    /// a timeout).
    pub fn error_when<F>(mut self, predicate: F) -> Self
    where
        F: Fn(&Finished) -> bool + Send + Sync + 'static,
    {
        self.error_when = Arc::new(predicate);
        self
    }
    /// A request the service has not answered within `timeout` is answered
    /// 504 by the layer and counted as [`Finished::TimedOut`] (none by
    /// default: a timeout layer inside this one answers with its own status).
    pub fn handler_timeout(mut self, timeout: Duration) -> Self {
        self.handler_timeout = Some(timeout);
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
        let policy_names = |rule: &Rule| match rule.check() {
            Ok(RuleKind::Policy(name)) => Some(name.clone()),
            _ => None,
        };
        let mut policies: Vec<String> = rules
            .iter()
            .flat_map(|set| set.rules())
            .filter_map(|r| policy_names(&r.rule))
            .collect();
        policies.extend(cap.iter().filter_map(|c| policy_names(&c.rule)));
        policies.sort_unstable();
        policies.dedup();
        let breakers = rules
            .iter()
            .flat_map(|set| set.rules())
            .map(|r| &r.rule)
            .chain(cap.iter().map(|c| &c.rule))
            .filter_map(|r| Some((r.breaker_name()?, policy_names(r)?)));
        match &self.protection {
            Some(protection) => {
                if let Some(metrics) = self.limiter.metrics() {
                    metrics.watch_protection(protection);
                }
                for name in &policies {
                    protection.watch(name);
                }
                for (breaker, policy) in breakers {
                    match protection.find_breaker(breaker) {
                        Some(b) => protection.bind(b, &policy),
                        None => protection.breaker(breaker, &policy),
                    };
                }
            }
            None => {
                if let Some((breaker, _)) = breakers.into_iter().next() {
                    return Err(Error::bad(
                        "-",
                        "breaker",
                        format!("rule breaker {breaker:?} needs the layer's protection loop (RateLimitLayerBuilder::protection)"),
                    ));
                }
                if !self.core {
                    return Err(Error::bad(
                        "-",
                        "core",
                        "a non-core route degrades on a policy's stage: give the layer a protection loop (RateLimitLayerBuilder::protection)",
                    ));
                }
            }
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
                client_ip: self.client_ip,
                policy,
                x_headers: self.x_headers,
                grpc: self.grpc,
                missing_key: self.missing_key,
                protection: self.protection,
                policies,
                core: self.core,
                degrade: self.degrade,
                error_when: self.error_when,
                handler_timeout: self.handler_timeout,
            }),
        })
    }
}

//! The two-level limiter: deny cache, then the local level (global rules),
//! then one round trip to Redis within a deadline, and the fallback with
//! its circuit breaker when Redis cannot answer.

use std::future::Future;
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant, SystemTime};

use redis_ratelimit_core::{ConcurrencyParams, Decision as CoreDecision, Request, Wait};

use crate::client::{hit_cmd, limiter_cmd, Client};
use crate::decision::{Decision, Path};
use crate::deny_cache::DenyCache;
use crate::fallback::{Breaker, BreakerConfig, FallbackMode, Gate, Stats, StatsSnapshot};
use crate::lease::{LeaseGuard, LeaseMs};
use crate::local::LocalLimiters;
use crate::observability::{
    level_of, DenyEvent, DenyEvents, Metrics, Origin, Outcome, RuleMetrics, LEVELS,
};
use crate::protection::Protection;
use crate::rule::{Rule, RuleKind, Share, Spec, ZoneKind};
use crate::Error;

/// Builds a [`Limiter`]; every setting has a default.
pub struct LimiterBuilder {
    client: Client,
    local_level: bool,
    share: Share,
    deny_cache: bool,
    deny_max: Duration,
    deny_cap: usize,
    local_cap: usize,
    fallback: FallbackMode,
    breaker: BreakerConfig,
    protection: Option<Protection>,
    metrics: Option<Metrics>,
    events: Option<DenyEvents>,
}

impl LimiterBuilder {
    /// Turns the local level on or off (on by default; it only acts on
    /// rules marked [`Rule::global`]).
    pub fn local_level(mut self, on: bool) -> Self {
        self.local_level = on;
        self
    }
    /// The number of instances sharing each global limit: each takes
    /// `ceil(total / instances * 1.1)`, at least 1, locally (default 1).
    pub fn instances(mut self, instances: u64) -> Self {
        self.share = Share::Instances(instances.max(1));
        self
    }
    /// Another share of each global limit: `ceil(total * ratio)`, at least 1.
    pub fn share(mut self, share: Share) -> Self {
        self.share = share;
        self
    }
    /// Turns the deny cache on or off (on by default).
    pub fn deny_cache(mut self, on: bool) -> Self {
        self.deny_cache = on;
        self
    }
    /// The longest a denial is cached (1 s by default), so that a raised
    /// limit or the kill switch reaches users within it.
    pub fn deny_cache_max(mut self, max: Duration) -> Self {
        self.deny_max = max;
        self
    }
    /// The most denials cached at once (10,000 by default).
    pub fn deny_cache_capacity(mut self, cap: usize) -> Self {
        self.deny_cap = cap;
        self
    }
    /// The most in-process limiters held (100,000 by default).
    pub fn local_capacity(mut self, cap: usize) -> Self {
        self.local_cap = cap;
        self
    }
    /// What decides when Redis cannot ([`FallbackMode::LocalOnly`] by default).
    pub fn fallback(mut self, mode: FallbackMode) -> Self {
        self.fallback = mode;
        self
    }
    /// When the breaker opens and for how long.
    pub fn breaker(mut self, breaker: BreakerConfig) -> Self {
        self.breaker = breaker;
        self
    }
    /// The protection loop whose scales the local-only fallback follows:
    /// a policy rule's account then runs at the policy's scale as last read
    /// (the instance's share of the scaled limit), as the server runs it.
    pub fn protection(mut self, protection: Protection) -> Self {
        self.protection = Some(protection);
        self
    }
    /// Reports to `metrics` (off by default): `ratelimit_decisions_total`
    /// of every rule, level and outcome, `ratelimit_redis_seconds` of every
    /// limiter round trip, `ratelimit_remaining_ratio`, and, read at each
    /// scrape, `ratelimit_breaker_open{breaker="redis"}`, the protection
    /// loop's scales, stages and breakers, and the deny events' counters.
    pub fn metrics(mut self, metrics: Metrics) -> Self {
        self.metrics = Some(metrics);
        self
    }
    /// Records every denial, at every level, in `events` (off by default).
    pub fn deny_events(mut self, events: DenyEvents) -> Self {
        self.events = Some(events);
        self
    }
    /// The deadline of one call ([`crate::DEFAULT_DEADLINE`], 100 ms, by
    /// default). A call that misses it may still be applied: its units are
    /// charged to the instance's account, and the fallback decides the
    /// request.
    pub fn deadline(mut self, deadline: Duration) -> Self {
        self.client = self.client.with_deadline(deadline);
        self
    }

    /// The limiter.
    pub fn build(self) -> Limiter {
        let breaker = Arc::new(Breaker::new(self.breaker));
        let breaker_open: Option<Arc<dyn Fn() -> bool + Send + Sync>> =
            self.metrics.as_ref().map(|metrics| {
                let breaker = breaker.clone();
                let open: Arc<dyn Fn() -> bool + Send + Sync> = Arc::new(move || breaker.is_open());
                metrics
                    .watch_limiter(Arc::downgrade(&open) as Weak<dyn Fn() -> bool + Send + Sync>);
                if let Some(protection) = &self.protection {
                    metrics.watch_protection(protection);
                }
                if let Some(events) = &self.events {
                    metrics.watch_deny_events(events);
                }
                open
            });
        Limiter {
            inner: Arc::new(Inner {
                client: self.client,
                local_level: self.local_level,
                share: self.share,
                deny_cache: self
                    .deny_cache
                    .then(|| DenyCache::new(self.deny_max, self.deny_cap)),
                local: LocalLimiters::new(self.local_cap),
                accounts: LocalLimiters::new(self.local_cap),
                fallback: self.fallback,
                breaker,
                stats: Stats::default(),
                protection: self.protection,
                observed: self.metrics.is_some() || self.events.is_some(),
                metrics: self.metrics,
                events: self.events,
                _breaker_open: breaker_open,
            }),
        }
    }
}

struct Inner {
    client: Client,
    local_level: bool,
    share: Share,
    deny_cache: Option<DenyCache>,
    /// The local level of the global rules: also their accounts.
    local: LocalLimiters,
    /// The instance's accounts of the other rules, at its share: charged
    /// with every unit Redis admitted for this instance and every unit of a
    /// call whose answer was lost, so that the local-only fallback admits
    /// only what Redis cannot already have counted for this instance.
    accounts: LocalLimiters,
    fallback: FallbackMode,
    breaker: Arc<Breaker>,
    stats: Stats,
    protection: Option<Protection>,
    /// Metrics or deny events are on.
    observed: bool,
    metrics: Option<Metrics>,
    events: Option<DenyEvents>,
    /// What the metrics' collector reads of the breaker (it holds it weakly).
    _breaker_open: Option<Arc<dyn Fn() -> bool + Send + Sync>>,
}

/// Rate limiting over a [`Client`]: two levels, a deny cache and a
/// fallback. Cheap to clone.
#[derive(Clone)]
pub struct Limiter {
    inner: Arc<Inner>,
}

/// One checked rule of a [`RuleSet`].
#[derive(Clone, Debug)]
pub struct CheckedRule {
    /// The rule as given.
    pub rule: Rule,
    /// What the server applies.
    pub kind: RuleKind,
    /// The algorithm and parameters (for a policy: as the server had it when
    /// the set was built; `None` if unknown).
    pub spec: Option<Spec>,
    /// The local level's share, for a global rule when the level is on.
    local: Option<Spec>,
    /// The local-only fallback's share.
    fallback: Option<Spec>,
    /// Identifies the rule in the deny cache and the local maps.
    signature: String,
    /// The `rule` of its metrics and deny events: a policy rule's policy
    /// name, else the rule's name.
    label: Arc<str>,
    /// Its series, when the limiter has metrics.
    metrics: Option<Arc<RuleMetrics>>,
}

/// Rules checked together, all or nothing (several go through `RL.ALL`).
#[derive(Clone, Debug)]
pub struct RuleSet {
    rules: Vec<CheckedRule>,
}

impl RuleSet {
    /// The checked rules, in order.
    pub fn rules(&self) -> &[CheckedRule] {
        &self.rules
    }
}

/// A checked concurrency cap: a `CONCURRENCY` rule, inline or a policy.
#[derive(Clone, Debug)]
pub(crate) struct Cap {
    pub(crate) rule: Rule,
    pub(crate) kind: RuleKind,
    pub(crate) params: ConcurrencyParams,
    label: Arc<str>,
    metrics: Option<Arc<RuleMetrics>>,
}

/// What [`Limiter::hold`] answers.
pub(crate) enum Hold {
    /// Redis granted a lease (or, on an `OFF` policy, admitted without one).
    Held(LeaseGuard),
    /// The fallback admitted, without a lease.
    Unheld(Decision),
    /// Denied, by Redis or by a fail-closed fallback.
    Denied(Decision),
}

impl Limiter {
    /// A limiter over `client`, with the defaults.
    pub fn builder(client: Client) -> LimiterBuilder {
        LimiterBuilder {
            client,
            local_level: true,
            share: Share::Instances(1),
            deny_cache: true,
            deny_max: Duration::from_secs(1),
            deny_cap: 10_000,
            local_cap: 100_000,
            fallback: FallbackMode::LocalOnly,
            breaker: BreakerConfig::default(),
            protection: None,
            metrics: None,
            events: None,
        }
    }

    /// The client underneath.
    pub fn client(&self) -> &Client {
        &self.inner.client
    }

    /// A reading of the counters of every path.
    pub fn stats(&self) -> StatsSnapshot {
        self.inner.stats.snapshot()
    }

    pub(crate) fn raw_stats(&self) -> &Stats {
        &self.inner.stats
    }

    /// Whether the breaker is open (or half-open, probing).
    pub fn breaker_open(&self) -> bool {
        self.inner.breaker.is_open()
    }

    /// Checks `rules` (every parameter, before anything is sent) and reads
    /// the policies' rules from the server, for the headers' windows and
    /// the local-only fallback. A bad rule is an error naming its parameter;
    /// so is a policy the server does not have.
    pub async fn rule_set(&self, rules: Vec<Rule>) -> Result<RuleSet, Error> {
        if rules.is_empty() {
            return Err(Error::bad("-", "rules", "at least one rule"));
        }
        if rules.len() > 1 && self.inner.client.is_cluster() {
            let first = rules[0].hash_tag();
            if let Some(r) = rules
                .iter()
                .find(|r| r.hash_tag().is_none() || r.hash_tag() != first)
            {
                return Err(Error::bad(
                    &r.name,
                    "key",
                    "in a cluster, the keys of several rules (one RL.ALL) need one hash tag, \
                     such as {api}:user: and {api}:global",
                ));
            }
        }
        let several = rules.len() > 1;
        let mut checked = Vec::with_capacity(rules.len());
        for rule in rules {
            let kind = rule.check()?.clone();
            let (spec, signature) = match &kind {
                RuleKind::Inline(spec) => (
                    Some(*spec),
                    format!("{} {:?}", spec.algorithm(), spec.params()),
                ),
                RuleKind::Policy(name) => {
                    let info = self.inner.client.policy_get(name).await?;
                    let Some(info) = info else {
                        return Err(Error::bad(
                            &rule.name,
                            "policy",
                            format!("no policy {name:?} on the server (RL.POLICY SET it first)"),
                        ));
                    };
                    (info.spec, format!("POLICY {name}"))
                }
            };
            if let (true, RuleKind::Inline(spec)) = (several, &kind) {
                crate::client::utc_only(&rule.name, spec, "RL.ALL (several rules in one set)")?;
            }
            if spec.is_some_and(|s| s.is_concurrency()) {
                return Err(Error::bad(
                    &rule.name,
                    "algorithm",
                    "a CONCURRENCY rule holds a lease for the length of the work: give it to \
                     RateLimitLayerBuilder::concurrency, or use Client::lease",
                ));
            }
            let local = match spec {
                Some(s) if rule.global && self.inner.local_level => {
                    Some(s.local_share(&rule.name, self.inner.share)?)
                }
                _ => None,
            };
            let fallback = match spec {
                // A quota in a named zone has no local period: the local-only
                // fallback skips it, as it skips a policy it cannot read.
                Some(Spec::Quota(_, zone)) if zone.kind() == ZoneKind::Named => None,
                Some(s) => Some(s.local_share(&rule.name, self.inner.share)?),
                None => None,
            };
            let label = label_of(&rule, &kind);
            let metrics = self.rule_metrics(&label);
            checked.push(CheckedRule {
                rule,
                kind,
                spec,
                local,
                fallback,
                signature,
                label,
                metrics,
            });
        }
        Ok(RuleSet { rules: checked })
    }

    /// Decides one request of `cost` units for `identity` under every rule
    /// of `set`. Never fails: where Redis cannot answer, the fallback
    /// decides, and [`Decision::path`] says which path did.
    pub async fn check(&self, set: &RuleSet, identity: &str, cost: u64) -> Decision {
        self.check_from(set, identity, cost, None).await
    }

    /// [`Limiter::check`] for a request from `origin` (its deny events carry
    /// the client's address and `User-Agent`).
    pub(crate) async fn check_from(
        &self,
        set: &RuleSet,
        identity: &str,
        cost: u64,
        origin: Option<&Origin>,
    ) -> Decision {
        let keys: Vec<String> = set.rules.iter().map(|r| r.rule.key_for(identity)).collect();
        let d = self.decide(set, &keys, cost).await;
        if self.inner.observed {
            self.observe(set, keys, &d, origin);
        }
        d
    }

    /// Whether denials are recorded as deny events (the layer then finds
    /// the request's origin).
    pub(crate) fn ships_events(&self) -> bool {
        self.inner.events.is_some()
    }

    /// The metrics the limiter reports to, if any.
    pub(crate) fn metrics(&self) -> Option<&Metrics> {
        self.inner.metrics.as_ref()
    }

    fn rule_metrics(&self, label: &str) -> Option<Arc<RuleMetrics>> {
        self.inner.metrics.as_ref().map(|m| Arc::new(m.rule(label)))
    }

    /// Counts a set's decision: admitted for every rule of the set, or
    /// denied for the rule that denied (and its deny event); the remaining
    /// ratio of the rule the fields describe, when Redis or the local level
    /// decided.
    fn observe(&self, set: &RuleSet, mut keys: Vec<String>, d: &Decision, origin: Option<&Origin>) {
        let level = level_of(d.path);
        let rules = &set.rules;
        let described = d
            .denied_by
            .filter(|&i| i < rules.len())
            .or_else(|| {
                rules
                    .iter()
                    .position(|r| r.spec.map(|s| s.limit()) == Some(d.limit))
            })
            .unwrap_or(0);
        if d.allowed {
            for m in rules.iter().filter_map(|r| r.metrics.as_ref()) {
                m.decided(level, 0);
            }
        } else {
            let r = &rules[described];
            if let Some(m) = &r.metrics {
                m.decided(level, 1);
            }
            // The key moves into the event: no copy on a denial.
            let key = std::mem::take(&mut keys[described]);
            self.deny_event(&r.label, key, level, d, origin);
        }
        if matches!(d.path, Path::Redis | Path::Local) {
            if let Some(m) = &rules[described].metrics {
                m.remaining(d.remaining, d.limit);
            }
        }
    }

    /// Counts a concurrency cap's decision, as [`Limiter::observe`] does.
    fn observe_cap(&self, cap: &Cap, identity: &str, d: &Decision, origin: Option<&Origin>) {
        let level = level_of(d.path);
        if let Some(m) = &cap.metrics {
            m.decided(level, usize::from(!d.allowed));
            if d.path == Path::Redis {
                m.remaining(d.remaining, d.limit);
            }
        }
        if !d.allowed {
            let key = cap.rule.key_for(identity);
            self.deny_event(&cap.label, key, level, d, origin);
        }
    }

    fn deny_event(
        &self,
        rule: &Arc<str>,
        key: String,
        level: usize,
        d: &Decision,
        origin: Option<&Origin>,
    ) {
        let Some(events) = &self.inner.events else {
            return;
        };
        events.record(DenyEvent {
            timestamp: SystemTime::now(),
            key,
            rule: rule.clone(),
            level: LEVELS[level],
            outcome: Outcome::Denied,
            limit: d.limit,
            remaining: d.remaining,
            retry_after_ms: d.wait_ms,
            client_ip: origin.and_then(|o| o.client_ip.clone()),
            user_agent: origin.and_then(Origin::user_agent),
        });
    }

    /// A limiter command's round trip, timed for `ratelimit_redis_seconds`
    /// when the limiter has metrics (a call that never reached the server,
    /// its connection refused, is no round trip).
    async fn timed<T>(&self, call: impl Future<Output = Result<T, Error>>) -> Result<T, Error> {
        let Some(metrics) = &self.inner.metrics else {
            return call.await;
        };
        let started = Instant::now();
        let result = call.await;
        if !matches!(result, Err(Error::Connection(_))) {
            metrics.observe_redis(started.elapsed().as_secs_f64());
        }
        result
    }

    async fn decide(&self, set: &RuleSet, keys: &[String], cost: u64) -> Decision {
        let inner = &*self.inner;
        let cache_key = |i: usize| format!("{}\0{}", set.rules[i].signature, keys[i]);
        // An `RL.ALL` denial waits for the slowest limiter that denied, which
        // need not be the one it names: it is cached for this very set of
        // rules and keys, never for one rule alone (another set with that
        // rule would be denied past the rule's own wait).
        let set_key = || {
            (0..set.rules.len())
                .map(cache_key)
                .collect::<Vec<_>>()
                .join("\u{1}")
        };

        if let Some(cache) = &inner.deny_cache {
            for i in 0..set.rules.len() {
                if let Some(mut d) = cache.get(&cache_key(i)) {
                    d.denied_by = Some(i);
                    Stats::add(&inner.stats.deny_cache_hits);
                    self.denied_locally(set, Some(i));
                    return d;
                }
            }
            if set.rules.len() > 1 {
                if let Some(d) = cache.get(&set_key()) {
                    Stats::add(&inner.stats.deny_cache_hits);
                    self.denied_locally(set, d.denied_by);
                    return d;
                }
            }
        }

        // The local level of the global rules: their accounts, taken before
        // the call.
        let locals: Vec<(usize, (String, Spec))> = set
            .rules
            .iter()
            .enumerate()
            .filter_map(|(i, r)| {
                r.local
                    .map(|s| (i, (format!("{}\0{}", r.signature, keys[i]), s)))
            })
            .collect();
        let local_limits: Vec<(String, Spec)> = locals.iter().map(|(_, l)| l.clone()).collect();
        let mut taken = Vec::new();
        if !local_limits.is_empty() {
            match inner.local.take_all(&local_limits, cost) {
                Ok(decisions) => taken = decisions,
                Err((pos, d)) => {
                    let i = locals[pos].0;
                    Stats::add(&inner.stats.local_denied);
                    tracing::debug!(rule = %set.rules[i].rule.name, key = %keys[i], "denied by the local level");
                    let total = set.rules[i].spec.map_or(d.limit, |s| s.limit());
                    let mut out = core_decision(d, Path::Local);
                    out.limit = total;
                    out.remaining = 0;
                    out.denied_by = Some(i);
                    self.denied_locally(set, Some(i));
                    return out;
                }
            }
        }
        let taken: Vec<(usize, CoreDecision)> = locals.iter().map(|(i, _)| *i).zip(taken).collect();
        // The other rules' accounts, keyed once per decision: only the
        // local-only fallback keeps them.
        let accounts = if inner.fallback == FallbackMode::LocalOnly {
            self.accounts(set, keys, &locals)
        } else {
            Accounts::default()
        };

        let gate = inner.breaker.gate();
        let answer = match gate {
            Gate::Call => {
                self.settle(set, keys, &locals, &local_limits, &accounts)
                    .await;
                Stats::add(&inner.stats.redis_calls);
                let result = self.timed(self.call_redis(set, keys, cost)).await;
                match result {
                    Ok(d) => {
                        inner.breaker.success();
                        Answer::Redis(d)
                    }
                    Err(e) => {
                        match &e {
                            Error::Timeout(_) => Stats::add(&inner.stats.redis_timeouts),
                            Error::Connection(_) => Stats::add(&inner.stats.redis_unavailable),
                            _ => Stats::add(&inner.stats.redis_errors),
                        }
                        if e.is_unavailable() && inner.breaker.failure() {
                            Stats::add(&inner.stats.breaker_opened);
                            tracing::warn!(error = %e, "redis-ratelimit: circuit breaker open, fallback {:?} decides", inner.fallback);
                        } else {
                            tracing::warn!(error = %e, "redis-ratelimit: Redis failed, fallback {:?} decides", inner.fallback);
                        }
                        if e.may_have_applied() {
                            Answer::Lost
                        } else {
                            Answer::NotApplied
                        }
                    }
                }
            }
            Gate::Skip => {
                Stats::add(&inner.stats.breaker_skipped);
                Answer::NotApplied
            }
            Gate::Probe => {
                Stats::add(&inner.stats.breaker_skipped);
                self.probe();
                Answer::NotApplied
            }
        };

        match answer {
            Answer::Redis(mut d) => {
                if d.allowed {
                    Stats::add(&inner.stats.redis_admitted);
                    if inner.fallback == FallbackMode::LocalOnly {
                        inner.accounts.charge_all(&accounts.limits, cost);
                    }
                } else {
                    Stats::add(&inner.stats.redis_denied);
                    inner.local.refund_all(&local_limits, cost);
                    let i = d.denied_by.unwrap_or(0);
                    if set.rules.len() == 1 {
                        d.denied_by = Some(0);
                    }
                    if let Some(cache) = &inner.deny_cache {
                        let key = if set.rules.len() == 1 {
                            cache_key(i)
                        } else {
                            set_key()
                        };
                        cache.put(key, &d);
                    }
                }
                d
            }
            Answer::Lost | Answer::NotApplied => {
                let lost = matches!(answer, Answer::Lost);
                let d = self.fallback(set, cost, &local_limits, &accounts, &taken, lost);
                if d.allowed {
                    Stats::add(&inner.stats.fallback_admitted);
                } else {
                    Stats::add(&inner.stats.fallback_denied);
                    // A call that may have been applied keeps its units on
                    // the local level: Redis may have counted them.
                    if !lost {
                        inner.local.refund_all(&local_limits, cost);
                    }
                }
                d
            }
        }
    }

    /// Whether this limiter counts its local denials for a protection loop.
    pub(crate) fn counts_local_denials(&self) -> bool {
        self.inner.protection.is_some()
    }

    /// A denial answered without a call to the server (deny cache, local
    /// level): counted for the protection loop when the rule that denied
    /// is a policy's, so that its stages see the calls the server did not.
    fn denied_locally(&self, set: &RuleSet, denied_by: Option<usize>) {
        let (Some(protection), Some(i)) = (&self.inner.protection, denied_by) else {
            return;
        };
        if let Some(RuleKind::Policy(name)) = set.rules.get(i).map(|r| &r.kind) {
            protection.record_denied(name);
        }
    }

    /// Sends Redis the units the fallback admitted for these keys while no
    /// call was sent (the breaker open, an error reply), as `COST n FORCE`,
    /// before the request's own call: so Redis counts them, and one
    /// instance stays within `max(limit, s)` when Redis answers again in the
    /// same window. Sent once, never retried (a lost one may have been
    /// applied; an account is already charged with them either way).
    async fn settle(
        &self,
        set: &RuleSet,
        keys: &[String],
        locals: &[(usize, (String, Spec))],
        local_limits: &[(String, Spec)],
        accounts: &Accounts,
    ) {
        let inner = &*self.inner;
        if inner.fallback != FallbackMode::LocalOnly {
            return;
        }
        let owed = locals
            .iter()
            .map(|(i, _)| *i)
            .zip(inner.local.take_owed(local_limits))
            .chain(
                accounts
                    .rules
                    .iter()
                    .copied()
                    .zip(inner.accounts.take_owed(&accounts.limits)),
            );
        for (i, units) in owed.filter(|&(_, units)| units > 0) {
            let units = Request::Force(units);
            Stats::add(&inner.stats.owed_sent);
            let sent = match &set.rules[i].kind {
                RuleKind::Inline(spec) => {
                    self.timed(inner.client.apply(&keys[i], spec, units)).await
                }
                RuleKind::Policy(name) => self.timed(inner.client.hit(name, &keys[i], units)).await,
            };
            if let Err(e) = sent {
                tracing::debug!(error = %e, key = %keys[i], "redis-ratelimit: units owed not settled");
            }
        }
    }

    /// The instance's accounts of the rules that have no local level: at
    /// the instance's share, keyed like the local level.
    fn accounts(
        &self,
        set: &RuleSet,
        keys: &[String],
        locals: &[(usize, (String, Spec))],
    ) -> Accounts {
        let (rules, limits) = set
            .rules
            .iter()
            .enumerate()
            .filter(|(i, _)| !locals.iter().any(|(j, _)| j == i))
            .filter_map(|(i, r)| {
                self.scaled_fallback(r)
                    .map(|s| (i, (format!("{}\0{}", r.signature, keys[i]), s)))
            })
            .unzip();
        Accounts { rules, limits }
    }

    /// A rule's local-only account: a policy's at the scale the protection
    /// loop last read.
    fn scaled_fallback(&self, rule: &CheckedRule) -> Option<Spec> {
        // A rule without an account (a quota in a named zone) has none scaled.
        let unscaled = rule.fallback?;
        let (Some(protection), RuleKind::Policy(name), Some(spec)) =
            (&self.inner.protection, &rule.kind, rule.spec)
        else {
            return Some(unscaled);
        };
        match protection.scale(name) {
            100.. => Some(unscaled),
            scale => spec
                .scaled(scale)
                .local_share(&rule.rule.name, self.inner.share)
                .ok()
                .or(Some(unscaled)),
        }
    }

    async fn call_redis(
        &self,
        set: &RuleSet,
        keys: &[String],
        cost: u64,
    ) -> Result<Decision, Error> {
        let client = &self.inner.client;
        if set.rules.len() == 1 {
            let units = Request::Cost(cost);
            return match &set.rules[0].kind {
                RuleKind::Inline(spec) => client.apply(&keys[0], spec, units).await,
                RuleKind::Policy(name) => client.hit(name, &keys[0], units).await,
            };
        }
        let limits: Vec<(&str, &RuleKind)> = set
            .rules
            .iter()
            .zip(keys)
            .map(|(r, k)| (k.as_str(), &r.kind))
            .collect();
        client.all(&limits, cost).await
    }

    /// Checks a concurrency cap: an inline `CONCURRENCY` rule, or a policy
    /// that the server has as `CONCURRENCY`.
    pub(crate) async fn cap(&self, rule: Rule) -> Result<Cap, Error> {
        let kind = rule.check()?.clone();
        let spec = match &kind {
            RuleKind::Inline(spec) => Some(*spec),
            RuleKind::Policy(name) => match self.inner.client.policy_get(name).await? {
                Some(info) => info.spec,
                None => {
                    return Err(Error::bad(
                        &rule.name,
                        "policy",
                        format!("no policy {name:?} on the server (RL.POLICY SET it first)"),
                    ))
                }
            },
        };
        let Some(Spec::Concurrency(params)) = spec else {
            return Err(Error::bad(
                &rule.name,
                "algorithm",
                "a concurrency cap needs a CONCURRENCY rule (Rule::concurrency, or a policy \
                 set as CONCURRENCY limit lease_ms)",
            ));
        };
        if rule.global {
            return Err(Error::bad(
                &rule.name,
                "global",
                "a concurrency cap is held in Redis alone: it has no local level",
            ));
        }
        let label = label_of(&rule, &kind);
        let metrics = self.rule_metrics(&label);
        Ok(Cap {
            rule,
            kind,
            params,
            label,
            metrics,
        })
    }

    /// Takes a lease of one unit of `cap` for `identity`, within the
    /// deadline, through the breaker. When Redis cannot answer, the
    /// fallback decides without a lease (fail closed denies; the others
    /// admit, since a lease cannot be shared between instances).
    pub(crate) async fn hold(&self, cap: &Cap, identity: &str, origin: Option<&Origin>) -> Hold {
        let hold = self.hold_unobserved(cap, identity).await;
        if self.inner.observed {
            let d = match &hold {
                Hold::Held(guard) => guard.decision(),
                Hold::Unheld(d) | Hold::Denied(d) => d,
            };
            self.observe_cap(cap, identity, d, origin);
        }
        hold
    }

    async fn hold_unobserved(&self, cap: &Cap, identity: &str) -> Hold {
        let inner = &*self.inner;
        let key = cap.rule.key_for(identity);
        let lease_ms = LeaseMs::Known(cap.params.lease_ms());
        let gate = inner.breaker.gate();
        match gate {
            Gate::Call => {
                Stats::add(&inner.stats.redis_calls);
                let cmd = match &cap.kind {
                    RuleKind::Inline(spec) => limiter_cmd(&key, spec, Request::Cost(1)),
                    RuleKind::Policy(name) => hit_cmd(name, &key, Request::Cost(1)),
                };
                let result = match cmd {
                    Ok(cmd) => {
                        self.timed(inner.client.hold(cmd, &key, lease_ms, None))
                            .await
                    }
                    Err(e) => Err(e),
                };
                match result {
                    Ok(guard) => {
                        inner.breaker.success();
                        Stats::add(&inner.stats.redis_admitted);
                        return Hold::Held(guard);
                    }
                    Err(Error::Denied(d)) => {
                        inner.breaker.success();
                        Stats::add(&inner.stats.redis_denied);
                        return Hold::Denied(*d);
                    }
                    Err(e) => {
                        match &e {
                            Error::Timeout(_) => Stats::add(&inner.stats.redis_timeouts),
                            Error::Connection(_) => Stats::add(&inner.stats.redis_unavailable),
                            _ => Stats::add(&inner.stats.redis_errors),
                        }
                        if e.is_unavailable() && inner.breaker.failure() {
                            Stats::add(&inner.stats.breaker_opened);
                        }
                        tracing::warn!(error = %e, "redis-ratelimit: Redis failed on a lease, fallback {:?} decides", inner.fallback);
                    }
                }
            }
            Gate::Skip => Stats::add(&inner.stats.breaker_skipped),
            Gate::Probe => {
                Stats::add(&inner.stats.breaker_skipped);
                self.probe();
            }
        }
        let limit = cap.params.limit();
        match inner.fallback {
            FallbackMode::FailClosed => {
                Stats::add(&inner.stats.fallback_denied);
                let wait = inner.breaker.open_for().as_millis().max(1) as i64;
                Hold::Denied(Decision::from_fields(
                    false,
                    limit,
                    0,
                    wait,
                    wait as u64,
                    Path::Fallback,
                ))
            }
            FallbackMode::FailOpen | FallbackMode::LocalOnly => {
                Stats::add(&inner.stats.fallback_admitted);
                Hold::Unheld(Decision::from_fields(
                    true,
                    limit,
                    limit,
                    0,
                    0,
                    Path::Fallback,
                ))
            }
        }
    }

    /// One `PING` in the background; the breaker closes when it answers.
    fn probe(&self) {
        let limiter = self.clone();
        Stats::add(&limiter.inner.stats.probes);
        tokio::spawn(async move {
            let inner = &limiter.inner;
            match inner.client.ping().await {
                Ok(()) => {
                    Stats::add(&inner.stats.probes_ok);
                    inner.breaker.probe_succeeded();
                    tracing::info!("redis-ratelimit: Redis answers again, circuit breaker closed");
                }
                Err(e) => {
                    inner.breaker.failure();
                    tracing::debug!(error = %e, "redis-ratelimit: probe failed, breaker stays open");
                }
            }
        });
    }

    /// Decides a request that Redis did not answer. `lost`: the call was
    /// sent and may have been applied, so whatever the fallback decides,
    /// its units stay charged to the instance's accounts.
    fn fallback(
        &self,
        set: &RuleSet,
        cost: u64,
        local_limits: &[(String, Spec)],
        accounts: &Accounts,
        taken: &[(usize, CoreDecision)],
        lost: bool,
    ) -> Decision {
        let inner = &*self.inner;
        let limit = set.rules[0].spec.map_or(0, |s| s.limit());
        match inner.fallback {
            FallbackMode::FailOpen => {
                Decision::from_fields(true, limit, limit, 0, 0, Path::Fallback)
            }
            FallbackMode::FailClosed => {
                let wait = inner.breaker.open_for().as_millis().max(1) as i64;
                let mut d =
                    Decision::from_fields(false, limit, 0, wait, wait as u64, Path::Fallback);
                d.denied_by = Some(0);
                d
            }
            FallbackMode::LocalOnly => {
                // Global rules were taken by the local level already; the
                // others are taken from their accounts here.
                match inner.accounts.take_all(&accounts.limits, cost) {
                    Ok(decisions) => {
                        if !lost {
                            // Redis never saw this request: owed to it.
                            inner.local.owe_all(local_limits, cost);
                            inner.accounts.owe_all(&accounts.limits, cost);
                        }
                        let admitted = accounts.rules.iter().copied().zip(decisions);
                        // The fields of the account that admitted with the
                        // least left, as RL.ALL answers the most restrictive.
                        let tightest = taken
                            .iter()
                            .copied()
                            .chain(admitted)
                            .min_by_key(|(_, d)| d.remaining);
                        match tightest {
                            Some((i, d)) => {
                                let mut out = core_decision(d, Path::Fallback);
                                out.limit = set.rules[i].spec.map_or(d.limit, |s| s.limit());
                                out
                            }
                            // No rule the kit can count in process (a policy
                            // it could not read): nothing to report but the
                            // admission.
                            None => Decision::from_fields(true, limit, limit, 0, 0, Path::Fallback),
                        }
                    }
                    Err((pos, d)) => {
                        if lost {
                            inner.accounts.charge_all(&accounts.limits, cost);
                        }
                        let i = accounts.rules[pos];
                        let mut out = core_decision(d, Path::Fallback);
                        out.limit = set.rules[i].spec.map_or(d.limit, |s| s.limit());
                        out.remaining = 0;
                        out.denied_by = Some(i);
                        out
                    }
                }
            }
        }
    }
}

/// The accounts of one decision's rules that have no local level: which
/// rule each is (its position in the set), and its key and spec at the
/// instance's share, as the account maps take them.
#[derive(Default)]
struct Accounts {
    rules: Vec<usize>,
    limits: Vec<(String, Spec)>,
}

/// What became of the call to Redis.
enum Answer {
    /// Redis answered.
    Redis(Decision),
    /// The call was sent and may have been applied: a timeout, a lost
    /// connection.
    Lost,
    /// Nothing was applied: the breaker is open, or an error reply.
    NotApplied,
}

/// The `rule` label of a rule: a policy rule's policy name, else the
/// rule's name.
fn label_of(rule: &Rule, kind: &RuleKind) -> Arc<str> {
    match kind {
        RuleKind::Policy(name) => Arc::from(name.as_str()),
        RuleKind::Inline(_) => Arc::from(rule.rule_name()),
    }
}

fn core_decision(d: redis_ratelimit_core::Decision, path: Path) -> Decision {
    let wait = match d.wait {
        Wait::Ms(ms) => ms as i64,
        Wait::Never => -1,
    };
    Decision::from_fields(d.allowed, d.limit, d.remaining, wait, d.reset_ms, path)
}

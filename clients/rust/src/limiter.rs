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
use crate::grants::{pick_tags, GrantKey, GrantKeys, Step, Stripes};
use crate::lease::{LeaseGuard, LeaseMs};
use crate::local::LocalLimiters;
use crate::observability::{
    level_of, DenyEvent, DenyEvents, Metrics, Origin, Outcome, RuleMetrics, LEVELS,
};
use crate::protection::Protection;
use crate::rule::{Batch, Rule, RuleKind, Share, Spec, ZoneKind};
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
                grants: GrantKeys::default(),
                stripe_seed: random_u64(),
                epoch: Instant::now(),
                refunder: std::sync::atomic::AtomicBool::new(false),
                tick_ms: std::sync::atomic::AtomicU64::new(u64::MAX),
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
    /// The batched keys' grants.
    grants: GrantKeys,
    /// Chosen at random once per limiter: its own stripe of every striped
    /// rule is this modulo the rule's stripes.
    stripe_seed: u64,
    /// The origin of the instance's clock (the batches' rate counters).
    epoch: Instant,
    /// Whether the task that refunds units held too long runs.
    refunder: std::sync::atomic::AtomicBool,
    /// How often it looks: a quarter of the smallest `hold_ms`.
    tick_ms: std::sync::atomic::AtomicU64,
}

impl Drop for Inner {
    /// Held units go back when the last clone of the limiter goes (in the
    /// background, when a runtime is there to send them);
    /// [`Limiter::close`] sends them and waits.
    fn drop(&mut self) {
        let held: Vec<(Arc<GrantKey>, u64)> = self
            .grants
            .all()
            .into_iter()
            .map(|k| {
                let n = k.take_for_refund(Instant::now(), true);
                (k, n)
            })
            .filter(|(_, n)| *n > 0)
            .collect();
        if held.is_empty() {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let client = self.client.clone();
        runtime.spawn(async move {
            for (k, n) in held {
                let _ = client.apply(&k.key, &k.spec, Request::Refund(n)).await;
            }
        });
    }
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
    /// A batched or striped rule's grants.
    grant: Option<Arc<GrantRule>>,
}

/// What a batched or striped rule decides with.
pub(crate) struct GrantRule {
    /// The rule's whole spec.
    spec: Spec,
    batch: Option<Batch>,
    stripes: Option<Stripes>,
}

impl std::fmt::Debug for GrantRule {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GrantRule")
            .field("spec", &self.spec)
            .field("batch", &self.batch)
            .field("stripes", &self.stripes.as_ref().map(|s| s.specs.len()))
            .finish()
    }
}

impl CheckedRule {
    /// The keys a decision of this rule may touch for `key`: the key
    /// itself, or its stripes' keys (own first).
    pub fn keys_for(&self, key: &str) -> Vec<String> {
        match self.grant.as_ref().and_then(|g| g.stripes.as_ref()) {
            Some(st) => (0..st.specs.len())
                .map(|i| st.key((st.own + i) % st.specs.len(), key))
                .collect(),
            None => vec![key.to_string()],
        }
    }

    /// This instance's own stripe of a striped rule.
    pub fn own_stripe(&self) -> Option<usize> {
        self.grant
            .as_ref()
            .and_then(|g| g.stripes.as_ref())
            .map(|st| st.own)
    }

    /// The stripes' specs of a striped rule, in stripe order.
    pub fn stripe_specs(&self) -> Vec<Spec> {
        self.grant
            .as_ref()
            .and_then(|g| g.stripes.as_ref())
            .map(|st| st.specs.clone())
            .unwrap_or_default()
    }

    /// The stripes' tags of a striped rule, in stripe order.
    pub fn stripe_tags(&self) -> Vec<String> {
        self.grant
            .as_ref()
            .and_then(|g| g.stripes.as_ref())
            .map(|st| st.tags.read().unwrap_or_else(|e| e.into_inner()).clone())
            .unwrap_or_default()
    }
}

/// What undoes a grant rule's admission when another rule of the set
/// denies the request.
enum Undo {
    Nothing,
    /// Units taken from a batch: back to it.
    Held(Arc<GrantKey>),
    /// Units a stripe's own call took: a `REFUND`.
    Refund(String, Spec),
}

/// Rules checked together, all or nothing (several go through `RL.ALL`).
#[derive(Clone, Debug)]
pub struct RuleSet {
    rules: Vec<CheckedRule>,
    /// With batched or striped rules: the other rules, decided together
    /// after them, and their positions in `rules`.
    rest: Option<(Box<RuleSet>, Vec<usize>)>,
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
        let plain: Vec<&Rule> = rules
            .iter()
            .filter(|r| r.batch.is_none() && r.stripes == 1)
            .collect();
        if plain.len() > 1 && self.inner.client.is_cluster() {
            let first = plain[0].hash_tag();
            if let Some(r) = plain
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
            let grant = self.grant_rule(&rule, spec).await?;
            let local = match spec {
                _ if grant.is_some() => None,
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
                grant,
            });
        }
        let rest = if checked.iter().any(|r| r.grant.is_some()) {
            let (idx, rules): (Vec<usize>, Vec<CheckedRule>) = checked
                .iter()
                .enumerate()
                .filter(|(_, r)| r.grant.is_none())
                .map(|(i, r)| (i, r.clone()))
                .unzip();
            (!rules.is_empty()).then(|| (Box::new(RuleSet { rules, rest: None }), idx))
        } else {
            None
        };
        Ok(RuleSet {
            rules: checked,
            rest,
        })
    }

    /// A batched or striped rule's grants: the stripes' specs and tags
    /// (from the slot map), this instance's own stripe; the refunder.
    async fn grant_rule(
        &self,
        rule: &Rule,
        spec: Option<Spec>,
    ) -> Result<Option<Arc<GrantRule>>, Error> {
        let Some(spec) = spec.filter(|_| rule.batch.is_some() || rule.stripes > 1) else {
            return Ok(None);
        };
        let stripes = if rule.stripes > 1 {
            let n = rule.stripes;
            let specs = (0..n)
                .map(|i| spec.stripe(&rule.name, n, i))
                .collect::<Result<Vec<_>, _>>()?;
            let masters = self.inner.client.masters().await?;
            let tags = pick_tags(&masters, n as usize);
            let own = (self.inner.stripe_seed % n) as usize;
            Some(Stripes {
                specs,
                own,
                tags: std::sync::RwLock::new(tags),
                masters: std::sync::Mutex::new(masters),
            })
        } else {
            None
        };
        if let Some(batch) = rule.batch {
            self.start_refunder(batch.hold_ms);
        }
        Ok(Some(Arc::new(GrantRule {
            spec,
            batch: rule.batch,
            stripes,
        })))
    }

    /// The task that gives back units held longer than their `hold_ms`,
    /// looking every quarter of the smallest `hold_ms` (at least 1 ms); it
    /// ends with the limiter.
    fn start_refunder(&self, hold_ms: u64) {
        use std::sync::atomic::Ordering;
        let inner = &self.inner;
        inner
            .tick_ms
            .fetch_min((hold_ms / 4).max(1), Ordering::Relaxed);
        if inner.refunder.swap(true, Ordering::Relaxed) {
            return;
        }
        let weak = Arc::downgrade(&self.inner);
        tokio::spawn(async move {
            loop {
                let tick = match weak.upgrade() {
                    Some(inner) => inner.tick_ms.load(Ordering::Relaxed),
                    None => return,
                };
                tokio::time::sleep(Duration::from_millis(tick)).await;
                let Some(inner) = weak.upgrade() else {
                    return;
                };
                let limiter = Limiter { inner };
                let now = Instant::now();
                for k in limiter.inner.grants.all() {
                    let n = k.take_for_refund(now, false);
                    if n > 0 {
                        limiter.refund(k, n);
                    }
                }
            }
        });
    }

    /// Gives `n` units of `k` back to the server: one `REFUND`, in the
    /// background, never retried.
    fn refund(&self, k: Arc<GrantKey>, n: u64) {
        let limiter = self.clone();
        Stats::add(&self.inner.stats.grant_refunds);
        self.inner
            .stats
            .grant_refunded_units
            .fetch_add(n, std::sync::atomic::Ordering::Relaxed);
        tokio::spawn(async move {
            let sent = limiter
                .inner
                .client
                .apply(&k.key, &k.spec, Request::Refund(n))
                .await;
            if let Err(e) = sent {
                tracing::debug!(error = %e, key = %k.key, units = n, "redis-ratelimit: held units not refunded");
            }
        });
    }

    /// Gives every unit the batched rules hold back to the server, and
    /// waits for the `REFUND`s (each within the client's deadline); an
    /// `UPTO` in flight is waited for first, so its units go back too. Call it
    /// at shutdown; the limiter stays usable (it takes new grants).
    pub async fn close(&self) {
        for k in self.inner.grants.all() {
            // An ask in flight ends first (within the client's deadline), so
            // the units it brings go back too.
            let _flight = k.flight.lock().await;
            let n = k.take_for_refund(Instant::now(), true);
            if n == 0 {
                continue;
            }
            Stats::add(&self.inner.stats.grant_refunds);
            self.inner
                .stats
                .grant_refunded_units
                .fetch_add(n, std::sync::atomic::Ordering::Relaxed);
            if let Err(e) = self
                .inner
                .client
                .apply(&k.key, &k.spec, Request::Refund(n))
                .await
            {
                tracing::debug!(error = %e, key = %k.key, units = n, "redis-ratelimit: held units not refunded at close");
            }
        }
    }

    /// The units the batched rules hold now, in every key.
    pub fn held_units(&self) -> u64 {
        self.inner.grants.all().iter().map(|k| k.held()).sum()
    }

    /// Re-reads the slot map and re-picks the tags of `set`'s striped rules
    /// when it changed (the kit does it when a stripe's call meets a
    /// `MOVED`); whether any tag moved.
    pub async fn repick_stripes(&self, set: &RuleSet) -> Result<bool, Error> {
        let masters = self.inner.client.masters().await?;
        let mut moved = false;
        for r in &set.rules {
            if let Some(st) = r.grant.as_ref().and_then(|g| g.stripes.as_ref()) {
                moved |= st.repick(masters.clone());
            }
        }
        Ok(moved)
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
        if !set.rules.iter().any(|r| r.grant.is_some()) {
            return self.decide_plain(set, keys, cost).await;
        }
        // The grant rules first (mostly in process), then the others in
        // one call; a later denial gives back what the earlier ones took.
        let mut undo = Vec::new();
        let mut last = None;
        for (i, r) in set.rules.iter().enumerate() {
            let Some(g) = &r.grant else { continue };
            let (mut d, u) = self.decide_grant(r, g, &keys[i], cost).await;
            if !d.allowed {
                self.undo(undo, cost);
                d.denied_by = Some(i);
                return d;
            }
            undo.push(u);
            last = Some(d);
        }
        if let Some((rest, idx)) = &set.rest {
            let rest_keys: Vec<String> = idx.iter().map(|&i| keys[i].clone()).collect();
            let mut d = Box::pin(self.decide_plain(rest, &rest_keys, cost)).await;
            if !d.allowed {
                self.undo(undo, cost);
                d.denied_by = d.denied_by.and_then(|j| idx.get(j).copied());
            }
            return d;
        }
        last.unwrap_or_else(|| Decision::from_fields(true, 0, 0, 0, 0, Path::Grant))
    }

    fn undo(&self, undo: Vec<Undo>, cost: u64) {
        for u in undo {
            match u {
                Undo::Nothing => {}
                Undo::Held(k) => k.put_back(cost),
                Undo::Refund(key, spec) => {
                    let client = self.inner.client.clone();
                    tokio::spawn(async move {
                        let _ = client.apply(&key, &spec, Request::Refund(cost)).await;
                    });
                }
            }
        }
    }

    /// A batched or striped rule's decision: its own stripe, then the next
    /// one on a denial (a striped rule); each by its batch, or by a call.
    async fn decide_grant(
        &self,
        r: &CheckedRule,
        g: &Arc<GrantRule>,
        key: &str,
        cost: u64,
    ) -> (Decision, Undo) {
        let Some(st) = &g.stripes else {
            return self
                .decide_key(r, g, key, key.to_string(), g.spec, cost)
                .await;
        };
        let [own, next] = st.order();
        let (mut first, u) = self
            .decide_key(r, g, key, st.key(own, key), st.specs[own], cost)
            .await;
        first.limit = g.spec.limit();
        if first.allowed || first.path == Path::Fallback {
            return (first, u);
        }
        Stats::add(&self.inner.stats.stripe_spills);
        let (mut second, u) = self
            .decide_key(r, g, key, st.key(next, key), st.specs[next], cost)
            .await;
        second.limit = g.spec.limit();
        if second.allowed || second.path == Path::Fallback {
            return (second, u);
        }
        // Both denied: the own stripe's fields, with the shorter wait.
        let wait = match (first.wait_ms, second.wait_ms) {
            (a, b) if a < 0 => b,
            (a, b) if b < 0 => a,
            (a, b) => a.min(b),
        };
        let mut d = Decision::from_fields(
            false,
            first.limit,
            first.remaining,
            wait,
            first.reset_ms(),
            first.path,
        );
        d.granted = first.granted;
        (d, Undo::Nothing)
    }

    /// One key of a grant rule (the rule's, or a stripe's): from its batch,
    /// or by one `COST` call; the fallback when Redis cannot answer.
    async fn decide_key(
        &self,
        r: &CheckedRule,
        g: &Arc<GrantRule>,
        rule_key: &str,
        key: String,
        spec: Spec,
        cost: u64,
    ) -> (Decision, Undo) {
        let inner = &*self.inner;
        let Some(batch) = g.batch else {
            let result = self
                .gated(inner.client.apply(&key, &spec, Request::Cost(cost)))
                .await;
            return match result {
                Ok(d) => {
                    if d.allowed {
                        Stats::add(&inner.stats.redis_admitted);
                        (d, Undo::Refund(key, spec))
                    } else {
                        Stats::add(&inner.stats.redis_denied);
                        (d, Undo::Nothing)
                    }
                }
                Err((lost, moved)) => {
                    if moved {
                        self.repick_later(g);
                    }
                    (self.fallback_one(r, g, rule_key, cost, lost), Undo::Nothing)
                }
            };
        };
        let k = inner
            .grants
            .get(&r.signature, &key, spec, batch, inner.epoch);
        let (step, stale) = k.first_look(inner.epoch, Instant::now(), cost);
        if stale > 0 {
            self.refund(k.clone(), stale);
        }
        let seen = match step {
            Step::Done(d) => return self.in_process(d, k),
            Step::Ask { seen, .. } => seen,
        };
        let flight = k.clone();
        let _flight = flight.flight.lock().await;
        let n = match k.after_wait(Instant::now(), cost, seen) {
            Step::Done(d) => return self.in_process(d, k),
            Step::Ask { n, .. } => n,
        };
        let asked_at = Instant::now();
        Stats::add(&inner.stats.grant_asks);
        match self
            .gated(inner.client.apply(&key, &spec, Request::UpTo(n)))
            .await
        {
            Ok(reply) => {
                let units = reply.granted.unwrap_or(0);
                inner
                    .stats
                    .grant_units
                    .fetch_add(units, std::sync::atomic::Ordering::Relaxed);
                let (d, back) = k.granted(asked_at, Instant::now(), n, cost, &reply);
                if back > 0 {
                    self.refund(k.clone(), back);
                }
                if d.allowed {
                    Stats::add(&inner.stats.redis_admitted);
                    (d, Undo::Held(k))
                } else {
                    Stats::add(&inner.stats.redis_denied);
                    (d, Undo::Nothing)
                }
            }
            Err((lost, moved)) => {
                if moved {
                    self.repick_later(g);
                }
                (self.fallback_one(r, g, rule_key, cost, lost), Undo::Nothing)
            }
        }
    }

    /// Re-reads the slot map in the background and re-picks a striped
    /// rule's tags when it changed (after a `MOVED` on one of its stripes).
    fn repick_later(&self, g: &Arc<GrantRule>) {
        if g.stripes.is_none() {
            return;
        }
        let (limiter, g) = (self.clone(), g.clone());
        tokio::spawn(async move {
            if let (Ok(masters), Some(st)) = (limiter.inner.client.masters().await, &g.stripes) {
                if st.repick(masters) {
                    tracing::info!("redis-ratelimit: the slot map changed, stripes re-picked");
                }
            }
        });
    }

    /// A batched decision made in process (level `grant`).
    fn in_process(&self, d: Decision, k: Arc<GrantKey>) -> (Decision, Undo) {
        if d.allowed {
            Stats::add(&self.inner.stats.grant_admitted);
            (d, Undo::Held(k))
        } else {
            Stats::add(&self.inner.stats.grant_denied);
            (d, Undo::Nothing)
        }
    }

    /// One limiter call through the breaker, timed and counted: the reply,
    /// or whether the call may have been applied.
    async fn gated(
        &self,
        call: impl Future<Output = Result<Decision, Error>>,
    ) -> Result<Decision, (bool, bool)> {
        let inner = &*self.inner;
        match inner.breaker.gate() {
            Gate::Call => {
                Stats::add(&inner.stats.redis_calls);
                match self.timed(call).await {
                    Ok(d) => {
                        inner.breaker.success();
                        Ok(d)
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
                        tracing::warn!(error = %e, "redis-ratelimit: Redis failed on a grant, fallback {:?} decides", inner.fallback);
                        let moved = matches!(&e, Error::Connection(m)
                            if m.starts_with("MOVED") || m.starts_with("ASK") || m.starts_with("CLUSTERDOWN"));
                        Err((e.may_have_applied(), moved))
                    }
                }
            }
            Gate::Skip => {
                Stats::add(&inner.stats.breaker_skipped);
                Err((false, false))
            }
            Gate::Probe => {
                Stats::add(&inner.stats.breaker_skipped);
                self.probe();
                Err((false, false))
            }
        }
    }

    /// The fallback's decision for one grant rule (its instance's share,
    /// for the local-only fallback).
    fn fallback_one(
        &self,
        r: &CheckedRule,
        g: &GrantRule,
        key: &str,
        cost: u64,
        lost: bool,
    ) -> Decision {
        let inner = &*self.inner;
        let limit = g.spec.limit();
        let d = match (inner.fallback, r.fallback) {
            (FallbackMode::FailClosed, _) => {
                let wait = inner.breaker.open_for().as_millis().max(1) as i64;
                Decision::from_fields(false, limit, 0, wait, wait as u64, Path::Fallback)
            }
            (FallbackMode::LocalOnly, Some(share)) => {
                let account = [(format!("{}\0{key}", r.signature), share)];
                match inner.accounts.take_all(&account, cost) {
                    Ok(mut ds) => {
                        let mut out = core_decision(ds.remove(0), Path::Fallback);
                        out.limit = limit;
                        out
                    }
                    Err((_, d)) => {
                        if lost {
                            inner.accounts.charge_all(&account, cost);
                        }
                        let mut out = core_decision(d, Path::Fallback);
                        out.limit = limit;
                        out.remaining = 0;
                        out
                    }
                }
            }
            _ => Decision::from_fields(true, limit, limit, 0, 0, Path::Fallback),
        };
        if d.allowed {
            Stats::add(&inner.stats.fallback_admitted);
        } else {
            Stats::add(&inner.stats.fallback_denied);
        }
        d
    }

    async fn decide_plain(&self, set: &RuleSet, keys: &[String], cost: u64) -> Decision {
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

/// A random number, without a dependency: the standard library's randomly
/// seeded hasher.
fn random_u64() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos()),
    );
    h.finish()
}

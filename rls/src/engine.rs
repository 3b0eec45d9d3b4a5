//! The decisions: a RateLimitRequest's descriptors matched against the
//! configuration, their limits sent to the module in as few `RL.ALL ...
//! EACH` calls as the keys' slots allow, and the reply Envoy reads.
//!
//! What a request costs Redis: nothing for unmatched and unlimited
//! descriptors, nothing when the deny cache or a limit of 0 denies it; else
//! one `RL.ALL` per group of limits sharing a slot and a hit count (one
//! group for a whole request on a single server or Sentinel, or with
//! `RLS_HASH_TAG=domain`), all groups sent at once. A denied request takes
//! nothing: the groups that admitted are refunded.
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use redis_ratelimit_client::{
    key_slot, Client, Decision, Error as KitError, Gate, RedisBreaker, Request, RuleKind, Spec,
};
use redis_ratelimit_core::{
    FixedWindowParams, HashWindowParams, SlidingLogParams, TokenBucketParams,
};
use tonic::Status;

use crate::config::{Algorithm, Config, Limit, Matched, Unit};
use crate::deny_cache::DenyCache;
use crate::keys;
use crate::metrics::Metrics;
use crate::proto::rate_limit_response::{rate_limit, Code, DescriptorStatus, RateLimit};
use crate::proto::{HeaderValue, RateLimitRequest, RateLimitResponse};
use crate::settings::{HashTag, HeaderNames};

/// The most keys one `RL.ALL` carries.
pub const MAX_GROUP_KEYS: usize = 16;

/// The key [`probe_each`] asks about: every key the engine writes ends
/// with an algorithm's tag and a period (`fw60`, `fw60.1`), this one does
/// not, so it names no limiter of any domain.
pub fn probe_key(cache_key_prefix: &str) -> String {
    format!("{cache_key_prefix}redis-ratelimit-rls_probe_each")
}

/// Checks at start-up that the server answers `RL.ALL ... EACH`, which every
/// request needs: a module older than that passes `MODULE LIST`'s check,
/// then would refuse every call. `COST 0` takes nothing and creates no key.
pub async fn probe_each(client: &Client, cache_key_prefix: &str) -> Result<(), String> {
    let key = probe_key(cache_key_prefix);
    let spec = FixedWindowParams::new(1, 1000)
        .map(Spec::FixedWindow)
        .map_err(|e| e.to_string())?;
    let kind = RuleKind::Inline(spec);
    match client
        .all_each(&[(key.as_str(), &kind)], Request::Cost(0))
        .await
    {
        Ok(_) => Ok(()),
        Err(KitError::Server(msg)) => {
            let version = match client.check_module().await {
                Ok(v) => format!("version {v}"),
                Err(e) => format!("of unknown version ({e})"),
            };
            Err(format!(
                "the ratelimit module ({version}) does not answer RL.ALL ... EACH, which \
                 redis-ratelimit-rls needs for every request: rebuild or upgrade the module \
                 and restart the server (it answered: {msg})"
            ))
        }
        Err(e) => Err(format!("RL.ALL ... EACH probe failed: {e}")),
    }
}

/// The engine's settings (from [`crate::settings::Settings`]).
#[derive(Clone, Debug)]
pub struct EngineOptions {
    pub cache_key_prefix: String,
    pub hash_tag: HashTag,
    pub near_limit_ratio: f32,
    /// `SHADOW_MODE`: the overall code is OK whatever the descriptors say.
    pub shadow_mode: bool,
    /// `QUOTA_MODE`: every descriptor in quota mode.
    pub quota_mode: bool,
    pub headers: Option<HeaderNames>,
}

/// Decides requests against Redis; shared by every call.
pub struct Engine {
    client: Client,
    cluster: bool,
    breaker: RedisBreaker,
    /// Whether the breaker was open when last seen (for the metric and the
    /// log line of each transition).
    breaker_open: AtomicBool,
    metrics: Metrics,
    deny_cache: Option<DenyCache>,
    opts: EngineOptions,
}

/// How one descriptor of a request is decided.
enum Plan {
    /// No limit applies (unmatched, or replaced by another's `replaces`):
    /// OK without a current limit.
    Unmatched,
    /// `unlimited: true`: OK, limit_remaining u32::MAX.
    Unlimited,
    Enforced(Enforced),
}

struct Enforced {
    matched: Matched,
    hits: u64,
    shadow: bool,
    quota: bool,
    /// Slots `first..first + matched.limits.len()` of the request's.
    first: usize,
    /// Denied here without Redis: by the deny cache (true) or by a limit
    /// that cannot hold the hits, 0 included (false), and which of its
    /// limits denied.
    local: Option<(bool, usize)>,
}

impl Enforced {
    /// Shadow and quota descriptors never deny the request.
    fn denies_request(&self) -> bool {
        !(self.shadow || self.quota)
    }
}

/// Reopens the breaker when a probe is dropped before its answer.
struct ProbeGuard<'a> {
    breaker: &'a RedisBreaker,
    armed: bool,
}

impl Drop for ProbeGuard<'_> {
    fn drop(&mut self) {
        if self.armed {
            self.breaker.failure();
        }
    }
}

/// One limit of one descriptor.
struct Slot {
    key: String,
    kind: Option<RuleKind>,
    decision: Option<Decision>,
    /// Its group's call admitted and took the units (and they were not
    /// refunded since).
    taken: bool,
}

/// Limits sent in one `RL.ALL`.
struct Group {
    slot: u16,
    hits: u64,
    /// A shadow or quota descriptor's group (its own), or `None` for the
    /// groups whose denial denies the request.
    owner: Option<usize>,
    members: Vec<usize>,
}

impl Engine {
    pub fn new(
        client: Client,
        breaker: RedisBreaker,
        metrics: Metrics,
        deny_cache_bytes: u64,
        opts: EngineOptions,
    ) -> Engine {
        Engine {
            cluster: client.is_cluster(),
            client,
            breaker,
            breaker_open: AtomicBool::new(false),
            metrics,
            deny_cache: (deny_cache_bytes > 0).then(|| DenyCache::new(deny_cache_bytes)),
            opts,
        }
    }

    /// The metrics the engine counts in.
    pub fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    /// Decides one request with `config`.
    pub async fn decide(
        &self,
        config: &Config,
        req: &RateLimitRequest,
    ) -> Result<RateLimitResponse, Status> {
        let result = self.decide_inner(config, req).await;
        self.metrics.call(match &result {
            Ok(r) if r.overall_code == Code::OverLimit as i32 => "over_limit",
            Ok(_) => "ok",
            Err(_) => "error",
        });
        result
    }

    async fn decide_inner(
        &self,
        config: &Config,
        req: &RateLimitRequest,
    ) -> Result<RateLimitResponse, Status> {
        if req.domain.is_empty() {
            self.metrics.service_error();
            return Err(Status::unknown("rate limit domain must not be empty"));
        }
        if req.descriptors.is_empty() {
            self.metrics.service_error();
            return Err(Status::unknown(
                "rate limit descriptor list must not be empty",
            ));
        }
        let domain = req.domain.as_str();
        let default_hits = u64::from(req.hits_addend.max(1));

        // Match every descriptor, then drop the replaced ones.
        let mut plans = Vec::with_capacity(req.descriptors.len());
        let mut replaced: Vec<String> = Vec::new();
        let mut entries: Vec<(&str, &str)> = Vec::with_capacity(8);
        for (i, d) in req.descriptors.iter().enumerate() {
            entries.clear();
            entries.extend(d.entries.iter().map(|e| (e.key.as_str(), e.value.as_str())));
            let matched = match &d.limit {
                Some(o) if config.has_domain(domain) => {
                    let unit = Unit::from_proto(o.unit).ok_or_else(|| {
                        Status::unknown(format!(
                            "descriptor {i}: the limit override's unit {} is not a unit",
                            o.unit
                        ))
                    })?;
                    Some(Config::override_limit(
                        domain,
                        &entries,
                        unit,
                        o.requests_per_unit,
                    ))
                }
                Some(_) => None,
                None => config.get_limit(domain, &entries),
            };
            let Some(matched) = matched else {
                plans.push(Plan::Unmatched);
                continue;
            };
            // The reference collects `replaces` of every matched limit,
            // unlimited ones included.
            replaced.extend(matched.replaces.iter().cloned());
            if matched.unlimited {
                plans.push(Plan::Unlimited);
                continue;
            }
            let hits = d.hits_addend.unwrap_or(default_hits);
            let shadow = matched.shadow_mode;
            let quota = matched.quota_mode || self.opts.quota_mode;
            plans.push(Plan::Enforced(Enforced {
                matched,
                hits,
                shadow,
                quota,
                first: 0,
                local: None,
            }));
        }
        if !replaced.is_empty() {
            for plan in plans.iter_mut() {
                if let Plan::Enforced(e) = plan {
                    if e.matched
                        .name
                        .as_ref()
                        .is_some_and(|n| replaced.iter().any(|r| r == n))
                    {
                        tracing::debug!(name = ?e.matched.name, "limit replaced");
                        *plan = Plan::Unmatched;
                    }
                }
            }
        }

        // Keys, specs, and what is decided here.
        let now = Instant::now();
        let mut slots: Vec<Slot> = Vec::with_capacity(
            plans
                .iter()
                .map(|p| match p {
                    Plan::Enforced(e) => e.matched.limits.len(),
                    _ => 0,
                })
                .sum(),
        );
        let mut base = String::with_capacity(64);
        for (i, plan) in plans.iter_mut().enumerate() {
            let Plan::Enforced(e) = plan else { continue };
            let d = &req.descriptors[i];
            entries.clear();
            entries.extend(d.entries.iter().map(|x| (x.key.as_str(), x.value.as_str())));
            keys::descriptor_base(
                &mut base,
                &self.opts.cache_key_prefix,
                self.opts.hash_tag,
                domain,
                &entries,
                e.matched.share_values.as_deref(),
            );
            e.first = slots.len();
            for (j, limit) in e.matched.limits.iter().enumerate() {
                let key = keys::limit_key(&base, &e.matched.limits, j);
                let kind = if limit.requests_per_unit == 0 {
                    None
                } else {
                    Some(RuleKind::Inline(spec_of(limit).map_err(|m| {
                        Status::internal(format!("{}: {m}", e.matched.stats_key))
                    })?))
                };
                // A limit of 0, or hits past what the limit can ever hold
                // (which also keeps absurd costs off the wire): denied here.
                if e.hits > capacity(limit) && e.local.is_none() {
                    e.local = Some((false, j));
                }
                if let Some(cache) = &self.deny_cache {
                    if e.local.is_none() && cache.denies(&key, e.hits, now) {
                        e.local = Some((true, j));
                    }
                }
                slots.push(Slot {
                    key,
                    kind,
                    decision: None,
                    taken: false,
                });
            }
        }

        // A request an enforcing descriptor denies here goes nowhere: what
        // Redis would admit for the others would be refunded at once.
        let denied_locally = plans
            .iter()
            .any(|p| matches!(p, Plan::Enforced(e) if e.local.is_some() && e.denies_request()));

        let mut groups: Vec<Group> = Vec::with_capacity(1);
        if !denied_locally {
            for (i, plan) in plans.iter().enumerate() {
                let Plan::Enforced(e) = plan else { continue };
                if e.local.is_some() {
                    continue;
                }
                let owner = (!e.denies_request()).then_some(i);
                for s in e.first..e.first + e.matched.limits.len() {
                    if slots[s].kind.is_none() {
                        continue;
                    }
                    let slot = if self.cluster {
                        key_slot(&slots[s].key)
                    } else {
                        0
                    };
                    place(&mut groups, &slots, s, slot, e.hits, owner);
                }
            }
        }

        if !groups.is_empty() {
            self.gate().await?;
            self.run_groups(&groups, &mut slots).await?;
        }

        // Statuses.
        let denied_by_redis = groups.iter().any(|g| {
            g.owner.is_none()
                && g.members
                    .iter()
                    .any(|&m| slots[m].decision.as_ref().is_some_and(|d| !d.allowed))
        });
        if denied_by_redis {
            self.refund(&groups, &mut slots).await;
        }
        self.remember_denials(&plans, &slots, now);

        let now_s = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        let mut response = RateLimitResponse {
            overall_code: Code::Ok as i32,
            statuses: Vec::with_capacity(plans.len()),
            ..Default::default()
        };
        let mut over = false;
        // The descriptor Envoy's headers describe: the reference's choice.
        let mut header_from: Option<(u32, Limit, u64)> = None;
        let mut min_remaining = u32::MAX;
        for plan in &plans {
            let status = match plan {
                Plan::Unmatched => DescriptorStatus {
                    code: Code::Ok as i32,
                    ..Default::default()
                },
                Plan::Unlimited => DescriptorStatus {
                    code: Code::Ok as i32,
                    limit_remaining: u32::MAX,
                    ..Default::default()
                },
                Plan::Enforced(e) => {
                    let r = self.status(domain, e, &slots, now_s, denied_locally);
                    if self.opts.headers.is_some() && r.remaining < min_remaining {
                        min_remaining = r.remaining;
                        header_from = Some((r.remaining, r.limit, r.reset_s));
                    }
                    if r.over_limit && e.denies_request() {
                        over = true;
                        min_remaining = 0;
                        header_from = Some((0, r.limit, r.reset_s));
                    }
                    r.status
                }
            };
            response.statuses.push(status);
        }
        if over {
            if self.opts.shadow_mode {
                tracing::debug!(domain, "over limit, answered OK: SHADOW_MODE");
                self.metrics.global_shadow_mode();
            } else {
                response.overall_code = Code::OverLimit as i32;
            }
        }
        if let (Some(names), Some((remaining, limit, reset_s))) = (&self.opts.headers, header_from)
        {
            response.response_headers_to_add = vec![
                header(&names.limit, limit.requests_per_unit.to_string()),
                header(&names.remaining, remaining.to_string()),
                header(&names.reset, reset_s.to_string()),
            ];
        }
        Ok(response)
    }

    /// The breaker's word on calling Redis now.
    async fn gate(&self) -> Result<(), Status> {
        match self.breaker.gate() {
            Gate::Call => Ok(()),
            Gate::Skip => Err(Status::unavailable(
                "redis-ratelimit-rls: Redis is unavailable (circuit breaker open)",
            )),
            Gate::Probe => {
                // The breaker is half-open until the probe's answer; a call
                // dropped while it waits (Envoy's timeout cancels the RPC)
                // would leave it so, every later call skipped for good: the
                // guard reopens it then, for another period.
                let mut guard = ProbeGuard {
                    breaker: &self.breaker,
                    armed: true,
                };
                let started = Instant::now();
                let answer = self.client.ping().await;
                guard.armed = false;
                match answer {
                    Ok(()) => {
                        self.metrics
                            .redis_call(started.elapsed().as_secs_f64(), true);
                        self.breaker.probe_succeeded();
                        self.note_breaker(false);
                        Ok(())
                    }
                    Err(e) => {
                        self.metrics
                            .redis_call(started.elapsed().as_secs_f64(), false);
                        self.metrics.redis_error();
                        self.breaker.failure();
                        tracing::warn!(error = %e, "Redis probe failed; the breaker stays open");
                        Err(Status::unavailable(format!(
                            "redis-ratelimit-rls: Redis is unavailable: {e}"
                        )))
                    }
                }
            }
        }
    }

    fn note_breaker(&self, open: bool) {
        if self.breaker_open.swap(open, Ordering::Relaxed) != open {
            self.metrics.breaker_open(open);
            if open {
                tracing::warn!(
                    "Redis circuit breaker open: calls answer UNAVAILABLE until a probe succeeds"
                );
            } else {
                tracing::info!("Redis circuit breaker closed");
            }
        }
    }

    /// Sends every group at once; each member's decision lands in its slot.
    async fn run_groups(&self, groups: &[Group], slots: &mut [Slot]) -> Result<(), Status> {
        // One group (a single server, Sentinel, a domain's hash tag): the
        // call is awaited as it is, without join_all's boxing and vectors.
        if let [g] = groups {
            let (elapsed, result) = self.call_group(g, slots).await;
            return match self.note_call(g, elapsed, result) {
                Ok((call, each)) => {
                    for (&m, d) in g.members.iter().zip(each) {
                        slots[m].decision = Some(d);
                        slots[m].taken = call.allowed;
                    }
                    Ok(())
                }
                Err(e) => Err(self.failed(e)),
            };
        }
        let slots_ref = &*slots;
        let calls = groups.iter().map(|g| self.call_group(g, slots_ref));
        let results = futures_util::future::join_all(calls).await;
        let mut failure: Option<KitError> = None;
        let mut decided: Vec<(usize, Decision, bool)> = Vec::with_capacity(slots.len());
        for (g, (elapsed, result)) in groups.iter().zip(results) {
            match self.note_call(g, elapsed, result) {
                Ok((call, each)) => decided.extend(
                    g.members
                        .iter()
                        .zip(each)
                        .map(|(&m, d)| (m, d, call.allowed)),
                ),
                Err(e) => {
                    failure.get_or_insert(e);
                }
            }
        }
        if let Some(e) = failure {
            return Err(self.failed(e));
        }
        for (m, d, taken) in decided {
            slots[m].decision = Some(d);
            slots[m].taken = taken;
        }
        Ok(())
    }

    /// One group's `RL.ALL ... EACH` and how long it took.
    async fn call_group(
        &self,
        g: &Group,
        slots: &[Slot],
    ) -> (
        std::time::Duration,
        Result<(Decision, Vec<Decision>), KitError>,
    ) {
        let mut limits: Vec<(&str, &RuleKind)> = Vec::with_capacity(g.members.len());
        limits.extend(
            g.members
                .iter()
                .filter_map(|&m| Some((slots[m].key.as_str(), slots[m].kind.as_ref()?))),
        );
        let started = Instant::now();
        let result = self.client.all_each(&limits, Request::Cost(g.hits)).await;
        (started.elapsed(), result)
    }

    /// Counts one group's call and tells the breaker.
    fn note_call(
        &self,
        g: &Group,
        elapsed: std::time::Duration,
        result: Result<(Decision, Vec<Decision>), KitError>,
    ) -> Result<(Decision, Vec<Decision>), KitError> {
        self.metrics
            .redis_call(elapsed.as_secs_f64(), result.is_ok());
        match &result {
            Ok(_) => self.breaker.success(),
            Err(e) => {
                if e.is_unavailable() && self.breaker.failure() {
                    self.note_breaker(true);
                }
                tracing::warn!(error = %e, keys = g.members.len(), "RL.ALL failed");
            }
        }
        result
    }

    /// A request's failed call: counted once, answered UNAVAILABLE.
    fn failed(&self, e: KitError) -> Status {
        self.metrics.redis_error();
        Status::unavailable(format!("redis-ratelimit-rls: Redis call failed: {e}"))
    }

    /// Gives back what the admitting groups took: the request was denied.
    async fn refund(&self, groups: &[Group], slots: &mut [Slot]) {
        let mut todo: Vec<(usize, u64)> = Vec::new();
        for g in groups {
            let admitted = g.members.iter().all(|&m| slots[m].taken);
            if admitted && g.hits > 0 {
                todo.extend(g.members.iter().map(|&m| (m, g.hits)));
            }
        }
        if todo.is_empty() {
            return;
        }
        let slots_ref = &*slots;
        let calls = todo.iter().map(|&(m, hits)| async move {
            let s = &slots_ref[m];
            let Some(RuleKind::Inline(spec)) = &s.kind else {
                return Ok(());
            };
            let started = Instant::now();
            let r = self
                .client
                .apply(&s.key, spec, Request::Refund(hits))
                .await
                .map(drop);
            self.metrics
                .redis_call(started.elapsed().as_secs_f64(), r.is_ok());
            r
        });
        let results = futures_util::future::join_all(calls).await;
        for (&(m, _), r) in todo.iter().zip(results) {
            match r {
                Ok(()) => slots[m].taken = false,
                Err(e) => {
                    tracing::warn!(error = %e, key = %slots[m].key, "refund failed");
                }
            }
        }
    }

    fn remember_denials(&self, plans: &[Plan], slots: &[Slot], now: Instant) {
        let Some(cache) = &self.deny_cache else {
            return;
        };
        for plan in plans {
            let Plan::Enforced(e) = plan else { continue };
            if e.hits == 0 || e.local.is_some() {
                continue;
            }
            for s in &slots[e.first..e.first + e.matched.limits.len()] {
                if let Some(d) = &s.decision {
                    if !d.allowed && d.wait_ms > 0 {
                        cache.remember(&s.key, d.remaining, d.retry_after, now);
                    }
                }
            }
        }
    }

    /// One enforced descriptor's status, counted in its metrics.
    fn status(
        &self,
        domain: &str,
        e: &Enforced,
        slots: &[Slot],
        now_s: u64,
        denied_locally: bool,
    ) -> StatusOf {
        let stats = self.metrics.descriptor(domain, &e.matched.stats_key);
        stats.total_hits(e.hits);
        let limits = &e.matched.limits;
        let own = &slots[e.first..e.first + limits.len()];
        let name = e.matched.name.clone().unwrap_or_default();

        if let Some((by_cache, j)) = e.local {
            // Decided here, by the cache or a limit too small for the hits.
            let limit = limits[j];
            stats.over_limit(e.hits);
            if by_cache {
                stats.over_limit_with_local_cache(e.hits);
            }
            tracing::debug!(domain, key = %own[j].key, local_cache = by_cache, "over limit");
            return self.finish(e, limit, name, 0, true, reset_local(&limit, now_s), &stats);
        }

        // Not consulted (another descriptor was denied here): answered OK
        // with its limit, nothing known of what is left.
        if denied_locally || own.iter().all(|s| s.decision.is_none()) {
            let limit = limits[0];
            return StatusOf {
                status: DescriptorStatus {
                    code: Code::Ok as i32,
                    current_limit: Some(rate_limit_of(&limit, name)),
                    limit_remaining: 0,
                    duration_until_reset: None,
                    quota: None,
                },
                over_limit: false,
                remaining: u32::MAX,
                limit,
                reset_s: reset_local(&limit, now_s),
            };
        }

        // The limit that decides the status: the first that denied, else
        // the one with the fewest units left.
        let mut pick: Option<(usize, u64)> = None;
        for (j, s) in own.iter().enumerate() {
            let Some(d) = &s.decision else { continue };
            if !d.allowed {
                pick = Some((j, 0));
                break;
            }
            let left = remaining_of(d, s.taken, e.hits);
            if pick.is_none_or(|(_, fewest)| left < fewest) {
                pick = Some((j, left));
            }
        }
        // Some limit was sent: the all-unsent case returned above.
        let (pick, _) = pick.unwrap_or((0, 0));
        let limit = limits[pick];
        let Some(d) = own[pick].decision.as_ref() else {
            return self.finish(e, limit, name, 0, false, reset_local(&limit, now_s), &stats);
        };
        let threshold = d.limit;
        let near = near_threshold(threshold, self.opts.near_limit_ratio);
        // A fixed window's reset is its window's end on the server's clock;
        // a window nothing was counted in has none: the reference's on ours.
        let reset_s = if matches!(limit.algorithm, Algorithm::FixedWindow) && d.reset_ms() == 0 {
            reset_local(&limit, now_s)
        } else {
            d.reset_ms().div_ceil(1000)
        };
        let c = counts(d.allowed, threshold, d.remaining, e.hits, near, e.shadow);
        stats.within_limit(c.within);
        stats.near_limit(c.near);
        stats.over_limit(c.over);
        stats.shadow_mode(c.shadow);
        if d.allowed {
            let left = remaining_of(d, own[pick].taken, e.hits);
            self.finish(e, limit, name, left, false, reset_s, &stats)
        } else {
            tracing::debug!(domain, key = %own[pick].key, hits = e.hits, "over limit");
            self.finish(e, limit, name, 0, true, reset_s, &stats)
        }
    }

    /// The status of an enforced descriptor from its deciding limit.
    #[allow(clippy::too_many_arguments)]
    fn finish(
        &self,
        e: &Enforced,
        limit: Limit,
        name: String,
        remaining: u64,
        over_limit: bool,
        reset_s: u64,
        stats: &crate::metrics::DescriptorStats,
    ) -> StatusOf {
        let remaining = u32::try_from(remaining).unwrap_or(u32::MAX);
        let mut status = DescriptorStatus {
            code: if over_limit {
                Code::OverLimit
            } else {
                Code::Ok
            } as i32,
            current_limit: Some(rate_limit_of(&limit, name)),
            limit_remaining: remaining,
            duration_until_reset: Some(prost_types::Duration {
                seconds: reset_s as i64,
                nanos: 0,
            }),
            quota: None,
        };
        if over_limit && e.shadow {
            status.code = Code::Ok as i32;
            // Decided here (the deny cache, or more hits than the limit
            // holds): every hit over, as over_limit counted them.
            if e.local.is_some() {
                stats.shadow_mode(e.hits);
            }
        } else if over_limit && e.quota {
            // The reference's quota mode: OK, its limit and what is left,
            // no reset.
            status.code = Code::Ok as i32;
            status.duration_until_reset = None;
        }
        StatusOf {
            status,
            over_limit,
            remaining,
            limit,
            reset_s,
        }
    }
}

/// What [`Engine::status`] gives back: the status and what the headers
/// need.
struct StatusOf {
    status: DescriptorStatus,
    over_limit: bool,
    remaining: u32,
    limit: Limit,
    reset_s: u64,
}

/// Places slot `s` in a group of the same slot, hits and owner that has
/// room and does not hold the same key (twice the same key in one call
/// would count once), else in a new group.
fn place(
    groups: &mut Vec<Group>,
    slots: &[Slot],
    s: usize,
    slot: u16,
    hits: u64,
    owner: Option<usize>,
) {
    let key = slots[s].key.as_str();
    let found = groups.iter_mut().find(|g| {
        g.slot == slot
            && g.hits == hits
            && g.owner == owner
            && g.members.len() < MAX_GROUP_KEYS
            && !g.members.iter().any(|&m| slots[m].key == key)
    });
    match found {
        Some(g) => g.members.push(s),
        None => groups.push(Group {
            slot,
            hits,
            owner,
            members: {
                // A group fills to MAX_GROUP_KEYS at most: no regrowth.
                let mut m = Vec::with_capacity(MAX_GROUP_KEYS);
                m.push(s);
                m
            },
        }),
    }
}

/// The units a limiter has left: as the reply says when its units were
/// taken (or it denied); an admitting limiter whose units were not taken
/// (its call denied by another limiter) or were refunded has the request's
/// units back.
fn remaining_of(d: &Decision, taken: bool, hits: u64) -> u64 {
    if d.allowed && !taken {
        d.remaining.saturating_add(hits).min(d.limit)
    } else {
        d.remaining
    }
}

/// What one descriptor's decision adds to its counters.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Counts {
    pub within: u64,
    pub near: u64,
    pub over: u64,
    pub shadow: u64,
}

/// The reference's arithmetic (base_limiter.go): with `before` and `after`
/// the units used before and after this request's `hits`, an admitted
/// request is within the limit and near it for the part past `near`; a
/// denied one is over for the part past the limit, and near for the part
/// between `near` and the limit. A denial here took nothing: `remaining`
/// is what was left, so `before = limit - remaining`. Shadow counts what
/// over counts.
pub fn counts(
    allowed: bool,
    limit: u64,
    remaining: u64,
    hits: u64,
    near: u64,
    shadow: bool,
) -> Counts {
    let mut c = Counts::default();
    if allowed {
        let after = limit.saturating_sub(remaining);
        let before = after.saturating_sub(hits);
        c.within = hits;
        if after > near {
            c.near = if before >= near { hits } else { after - near };
        }
    } else {
        let before = limit.saturating_sub(remaining);
        let after = before.saturating_add(hits);
        if before >= limit {
            c.over = hits;
        } else {
            c.over = after - limit;
            c.near = limit - near.max(before);
        }
        if shadow {
            c.shadow = c.over;
        }
    }
    c
}

/// The reference's near-limit threshold: floor(limit * ratio) in f32, at
/// most the limit (f32 rounds 4294967295 up to 4294967296, and a threshold
/// past the limit would make [`counts`]' near part negative).
pub fn near_threshold(limit: u64, ratio: f32) -> u64 {
    ((limit as f32 * ratio).floor() as u64).min(limit)
}

/// The reference's reset: `period - now % period`, on this host's clock.
pub fn reset_local(limit: &Limit, now_s: u64) -> u64 {
    let period = (limit.period_ms() / 1000).max(1);
    period - now_s % period
}

fn rate_limit_of(limit: &Limit, name: String) -> RateLimit {
    RateLimit {
        name,
        requests_per_unit: limit.requests_per_unit,
        unit: rate_limit::Unit::try_from(limit.unit.to_proto()).unwrap_or(rate_limit::Unit::Unknown)
            as i32,
    }
}

fn header(key: &str, value: String) -> HeaderValue {
    HeaderValue {
        key: key.to_string(),
        value,
        raw_value: Vec::new(),
    }
}

/// The most units a limit can admit at once: its count, or a token
/// bucket's burst (0 for a limit of 0, which admits nothing).
pub fn capacity(limit: &Limit) -> u64 {
    match limit.algorithm {
        _ if limit.requests_per_unit == 0 => 0,
        Algorithm::TokenBucket { burst } => burst,
        _ => u64::from(limit.requests_per_unit),
    }
}

/// The module's spec of a limit (a limit of 0 has none: nothing to ask).
pub fn spec_of(limit: &Limit) -> Result<Spec, String> {
    let n = u64::from(limit.requests_per_unit);
    let period_ms = limit.period_ms();
    let spec = match limit.algorithm {
        Algorithm::FixedWindow => FixedWindowParams::new(n, period_ms).map(Spec::FixedWindow),
        Algorithm::SlidingWindow => SlidingLogParams::new(n, period_ms).map(Spec::Sliding),
        Algorithm::TokenBucket { burst } => {
            TokenBucketParams::new(burst, n, period_ms).map(Spec::TokenBucket)
        }
        Algorithm::HashWindow { buckets } => {
            HashWindowParams::new(n, period_ms, period_ms / buckets.max(1)).map(Spec::HashWindow)
        }
    };
    spec.map_err(|e| format!("{} limit of {n}: {e}", limit.algorithm.name()))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A redis-server of its own on a free loopback port with `module`
    /// loaded, stopped on drop.
    struct RedisServer {
        child: std::process::Child,
        url: String,
    }

    impl RedisServer {
        fn start(module: &std::path::Path) -> RedisServer {
            assert!(module.exists(), "no module at {}", module.display());
            let port = std::net::TcpListener::bind("127.0.0.1:0")
                .unwrap()
                .local_addr()
                .unwrap()
                .port();
            let child = std::process::Command::new("redis-server")
                .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
                .arg("--loadmodule")
                .arg(module)
                .args(["--save", "", "--appendonly", "no"])
                .stdout(std::process::Stdio::null())
                .spawn()
                .expect("redis-server on PATH");
            RedisServer {
                child,
                url: format!("redis://127.0.0.1:{port}"),
            }
        }

        /// Connects once the server accepts (polled; it was just started).
        async fn client(&self) -> Client {
            let mut last = None;
            for _ in 0..200 {
                match Client::standalone(&self.url).await {
                    Ok(c) => return c,
                    Err(e) => last = Some(e),
                }
                tokio::time::sleep(std::time::Duration::from_millis(25)).await;
            }
            panic!("{}: {:?}", self.url, last);
        }
    }

    impl Drop for RedisServer {
        fn drop(&mut self) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }

    /// The module with `RL.ALL ... EACH`: `RL_MODULE` (`make test` sets
    /// it), else the workspace's release build.
    fn module() -> std::path::PathBuf {
        match std::env::var_os("RL_MODULE").filter(|m| !m.is_empty()) {
            Some(m) => m.into(),
            None => std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("../target/release/libredis_ratelimit.so"),
        }
    }

    #[tokio::test]
    async fn the_probe_passes_on_a_module_with_each_and_creates_nothing() {
        let server = RedisServer::start(&module());
        let client = server.client().await;
        probe_each(&client, "pfx:").await.unwrap();
        let raw = redis::Client::open(server.url.as_str()).unwrap();
        let mut conn = raw.get_multiplexed_async_connection().await.unwrap();
        let n: i64 = redis::cmd("DBSIZE").query_async(&mut conn).await.unwrap();
        assert_eq!(n, 0, "COST 0 created a key");
    }

    /// `RL_MODULE_WITHOUT_EACH`: a build of the module from before `EACH`
    /// (the one start-up must refuse); the test says so and passes without
    /// it, as no such build can be made from this tree.
    #[tokio::test]
    async fn the_probe_refuses_a_module_without_each_naming_its_version() {
        let Some(old) = std::env::var_os("RL_MODULE_WITHOUT_EACH").filter(|m| !m.is_empty()) else {
            eprintln!("RL_MODULE_WITHOUT_EACH unset: nothing to check");
            return;
        };
        let server = RedisServer::start(std::path::Path::new(&old));
        let client = server.client().await;
        let err = probe_each(&client, "").await.unwrap_err();
        assert!(err.contains("RL.ALL ... EACH"), "{err}");
        assert!(err.contains("version "), "{err}");
        assert!(err.contains("upgrade"), "{err}");
    }

    /// An engine on `server` with `yaml` as the configuration.
    async fn engine_on(server: &RedisServer, yaml: &str) -> (Engine, Config) {
        let config = Config::load(&[("t.yaml".into(), yaml.to_string())], false).unwrap();
        let engine = Engine::new(
            server.client().await,
            RedisBreaker::new(redis_ratelimit_client::BreakerConfig {
                failures: 5,
                open_for: std::time::Duration::from_secs(1),
            }),
            Metrics::new(),
            0,
            EngineOptions {
                cache_key_prefix: String::new(),
                hash_tag: HashTag::None,
                near_limit_ratio: 0.8,
                shadow_mode: false,
                quota_mode: false,
                headers: None,
            },
        );
        (engine, config)
    }

    fn request(domain: &str, entries: &[&[(&str, &str)]], hits: u32) -> RateLimitRequest {
        use crate::proto::{rate_limit_descriptor::Entry, RateLimitDescriptor};
        RateLimitRequest {
            domain: domain.into(),
            descriptors: entries
                .iter()
                .map(|d| RateLimitDescriptor {
                    entries: d
                        .iter()
                        .map(|(k, v)| Entry {
                            key: (*k).into(),
                            value: (*v).into(),
                        })
                        .collect(),
                    ..Default::default()
                })
                .collect(),
            hits_addend: hits,
        }
    }

    /// The value of the first metric line that starts with `name{` and
    /// holds `label`.
    fn metric(engine: &Engine, name: &str, label: &str) -> Option<u64> {
        let (_, text) = engine.metrics().render(None);
        text.lines()
            .find(|l| l.starts_with(&format!("{name}{{")) && l.contains(label))
            .and_then(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .map(|v| v as u64)
    }

    #[tokio::test]
    async fn a_shadow_limit_too_small_for_the_hits_counts_them_as_shadow() {
        let server = RedisServer::start(&module());
        let (engine, config) = engine_on(
            &server,
            "domain: d\ndescriptors:\n  - key: k\n    shadow_mode: true\n    \
             rate_limit: {unit: minute, requests_per_unit: 2}\n",
        )
        .await;
        let reply = engine
            .decide(&config, &request("d", &[&[("k", "v")]], 5))
            .await
            .unwrap();
        assert_eq!(reply.overall_code, Code::Ok as i32, "shadow never denies");
        let over = metric(&engine, "ratelimit_service_rate_limit_over_limit", "d");
        let shadow = metric(&engine, "ratelimit_service_rate_limit_shadow_mode", "d");
        assert_eq!(over, Some(5));
        assert_eq!(shadow, over, "shadow_mode counts what over_limit counts");
    }

    #[tokio::test]
    async fn a_probe_dropped_before_its_answer_leaves_the_breaker_probing() {
        let server = RedisServer::start(&module());
        let (mut engine, _) = engine_on(&server, "domain: d\n").await;
        // Open at once, probing at once; PING may wait long.
        engine.breaker = RedisBreaker::new(redis_ratelimit_client::BreakerConfig {
            failures: 1,
            open_for: std::time::Duration::ZERO,
        });
        engine.client = engine
            .client
            .with_deadline(std::time::Duration::from_secs(30));
        assert!(engine.breaker.failure(), "opened");
        let raw = redis::Client::open(server.url.as_str()).unwrap();
        let mut conn = raw.get_multiplexed_async_connection().await.unwrap();
        let _: () = redis::cmd("CLIENT")
            .arg("PAUSE")
            .arg("3000")
            .arg("ALL")
            .query_async(&mut conn)
            .await
            .unwrap();
        // The call is cancelled while its PING waits (as Envoy's timeout
        // cancels a gRPC call).
        let dropped =
            tokio::time::timeout(std::time::Duration::from_millis(50), engine.gate()).await;
        assert!(dropped.is_err(), "the PING answered during CLIENT PAUSE");
        assert!(
            matches!(engine.breaker.gate(), Gate::Probe),
            "the breaker is stuck half-open: every call would be skipped"
        );
    }

    #[test]
    fn near_counts_never_underflow_at_u32_max() {
        let limit = u64::from(u32::MAX);
        let near = near_threshold(limit, 1.0);
        assert!(near <= limit, "{near}");
        // Denied with 1 left and 5 hits: 4 over, nothing near (the
        // threshold is the limit).
        assert_eq!(
            counts(false, limit, 1, 5, near, false),
            Counts {
                over: 4,
                near: 0,
                ..Default::default()
            }
        );
    }

    #[test]
    fn the_probe_key_is_no_limiters_key() {
        let k = probe_key("p:");
        assert!(k.starts_with("p:"));
        // Every limiter key ends with a tag: letters then digits (and
        // maybe ".n"); the probe's ends with a letter.
        assert!(k.ends_with(|c: char| c.is_ascii_alphabetic()));
    }

    fn slot(key: &str) -> Slot {
        Slot {
            key: key.to_string(),
            kind: None,
            decision: None,
            taken: false,
        }
    }

    fn limit(rpu: u32, unit: Unit, algorithm: Algorithm) -> Limit {
        Limit {
            unit,
            requests_per_unit: rpu,
            unit_multiplier: 1,
            algorithm,
        }
    }

    fn decision(allowed: bool, limit: u64, remaining: u64) -> Decision {
        Decision {
            allowed,
            limit,
            remaining,
            wait_ms: 0,
            retry_after: std::time::Duration::ZERO,
            reset_after: std::time::Duration::from_millis(1500),
            denied_by: None,
            lease: None,
            granted: None,
            path: redis_ratelimit_client::Path::Redis,
        }
    }

    #[test]
    fn one_group_per_slot_hits_and_owner() {
        let slots: Vec<Slot> = ["a", "b", "c", "d", "e"].iter().map(|k| slot(k)).collect();
        let mut groups = Vec::new();
        place(&mut groups, &slots, 0, 0, 1, None);
        place(&mut groups, &slots, 1, 0, 1, None);
        place(&mut groups, &slots, 2, 0, 2, None); // other hits
        place(&mut groups, &slots, 3, 7, 1, None); // other slot
        place(&mut groups, &slots, 4, 0, 1, Some(3)); // a shadow descriptor's own
        let shape: Vec<(u16, u64, Option<usize>, Vec<usize>)> = groups
            .iter()
            .map(|g| (g.slot, g.hits, g.owner, g.members.clone()))
            .collect();
        assert_eq!(
            shape,
            [
                (0, 1, None, vec![0, 1]),
                (0, 2, None, vec![2]),
                (7, 1, None, vec![3]),
                (0, 1, Some(3), vec![4]),
            ]
        );
    }

    #[test]
    fn groups_hold_at_most_16_keys_and_never_one_key_twice() {
        let slots: Vec<Slot> = (0..20)
            .map(|i| slot(&format!("k{}", if i == 1 { 0 } else { i })))
            .collect();
        let mut groups = Vec::new();
        for s in 0..slots.len() {
            place(&mut groups, &slots, s, 0, 1, None);
        }
        assert!(groups.iter().all(|g| g.members.len() <= MAX_GROUP_KEYS));
        assert_eq!(groups.iter().map(|g| g.members.len()).sum::<usize>(), 20);
        for g in &groups {
            let mut keys: Vec<&str> = g.members.iter().map(|&m| slots[m].key.as_str()).collect();
            keys.sort();
            keys.dedup();
            assert_eq!(keys.len(), g.members.len(), "a key twice in one call");
        }
        assert_eq!(groups[0].members.len(), 16);
        assert!(!groups[0].members.contains(&1), "k0's second slot waits");
    }

    #[test]
    fn counts_follow_the_references_arithmetic() {
        let c = |allowed, remaining, hits, shadow| counts(allowed, 10, remaining, hits, 8, shadow);
        // Admitted, used 5 of 10: within only.
        assert_eq!(
            c(true, 5, 1, false),
            Counts {
                within: 1,
                ..Default::default()
            }
        );
        // Admitted to 9 used with 3 hits (6 -> 9): 1 near (past 8).
        assert_eq!(
            c(true, 1, 3, false),
            Counts {
                within: 3,
                near: 1,
                ..Default::default()
            }
        );
        // Admitted from 8 to 10: both hits near.
        assert_eq!(
            c(true, 0, 2, false),
            Counts {
                within: 2,
                near: 2,
                ..Default::default()
            }
        );
        // Denied at 10 used: every hit over.
        assert_eq!(
            c(false, 0, 2, true),
            Counts {
                over: 2,
                shadow: 2,
                ..Default::default()
            }
        );
        // Denied at 9 used with 3 hits (9 -> 12): 2 over, 1 near (9..10).
        assert_eq!(
            c(false, 1, 3, false),
            Counts {
                over: 2,
                near: 1,
                ..Default::default()
            }
        );
        // Denied at 5 used with 10 hits: 5 over, 2 near (8..10).
        assert_eq!(
            c(false, 5, 10, false),
            Counts {
                over: 5,
                near: 2,
                ..Default::default()
            }
        );
        // A check (0 hits) counts nothing but within's 0.
        assert_eq!(c(true, 0, 0, false), Counts::default());
    }

    #[test]
    fn capacity_is_the_count_or_the_burst() {
        assert_eq!(
            capacity(&limit(10, Unit::Second, Algorithm::FixedWindow)),
            10
        );
        assert_eq!(
            capacity(&limit(
                10,
                Unit::Second,
                Algorithm::TokenBucket { burst: 30 }
            )),
            30
        );
        assert_eq!(
            capacity(&limit(
                0,
                Unit::Second,
                Algorithm::TokenBucket { burst: 30 }
            )),
            0
        );
    }

    #[test]
    fn near_threshold_is_the_references() {
        assert_eq!(near_threshold(10, 0.8), 8);
        assert_eq!(near_threshold(3, 0.8), 2);
        assert_eq!(near_threshold(100, 0.0), 0);
        assert_eq!(near_threshold(7, 1.0), 7);
    }

    #[test]
    fn the_local_reset_is_period_minus_now_mod_period() {
        let minute = limit(10, Unit::Minute, Algorithm::FixedWindow);
        assert_eq!(reset_local(&minute, 120), 60);
        assert_eq!(reset_local(&minute, 121), 59);
        let mut five = minute;
        five.unit_multiplier = 5;
        assert_eq!(reset_local(&five, 301), 299);
    }

    #[test]
    fn specs_of_each_algorithm() {
        assert_eq!(
            spec_of(&limit(10, Unit::Minute, Algorithm::FixedWindow))
                .unwrap()
                .params(),
            [10, 60_000]
        );
        assert_eq!(
            spec_of(&limit(10, Unit::Second, Algorithm::SlidingWindow))
                .unwrap()
                .params(),
            [10, 1000]
        );
        assert_eq!(
            spec_of(&limit(10, Unit::Hour, Algorithm::TokenBucket { burst: 25 }))
                .unwrap()
                .params(),
            [25, 10, 3_600_000]
        );
        assert_eq!(
            spec_of(&limit(
                10,
                Unit::Minute,
                Algorithm::HashWindow { buckets: 6 }
            ))
            .unwrap()
            .params(),
            [10, 60_000, 10_000]
        );
        let err = spec_of(&limit(u32::MAX, Unit::Second, Algorithm::SlidingWindow)).unwrap_err();
        assert!(err.contains("sliding_window"), "{err}");
    }

    #[test]
    fn remaining_gives_back_what_was_not_taken() {
        let admitted = decision(true, 10, 4);
        assert_eq!(remaining_of(&admitted, true, 3), 4, "taken: as replied");
        assert_eq!(
            remaining_of(&admitted, false, 3),
            7,
            "not taken: units back"
        );
        assert_eq!(
            remaining_of(&decision(true, 10, 9), false, 3),
            10,
            "at most the limit"
        );
        assert_eq!(
            remaining_of(&decision(false, 10, 1), false, 3),
            1,
            "a denial took nothing"
        );
    }

    #[test]
    fn rate_limits_carry_the_proto_unit_and_name() {
        let r = rate_limit_of(&limit(5, Unit::Week, Algorithm::FixedWindow), "n".into());
        assert_eq!(r.unit, rate_limit::Unit::Week as i32);
        assert_eq!(r.requests_per_unit, 5);
        assert_eq!(r.name, "n");
    }
}

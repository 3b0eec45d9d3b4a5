export { Client } from './client.js';
export type { ModuleInfo, PolicyOptions, AdaptOptions, LogEntry, ClientOptions } from './client.js';
export { Decision } from './decision.js';
export type { Path } from './decision.js';
export { Limiter, RuleSet } from './limiter.js';
export type { LimiterRule, LimiterOptions, CheckedRule, RequestContext } from './limiter.js';
export type { FallbackMode, BreakerOptions, StatName, StatsSnapshot } from './fallback.js';
export { STAT_NAMES } from './fallback.js';
export type { Share } from './local.js';
export { RLError, InvalidArgumentError, ModuleMissingError, ProtocolError, TimeoutError, RLDeniedError, RLConnectionError } from './errors.js';
export { Lease } from './lease.js';
export type { LeaseRule, LeaseOptions } from './lease.js';
export { Request } from './rules.js';
export type { Spec, SpecOrPolicy, AcquireOptions, ConcurrencyParams, QuotaParams, Period } from './rules.js';
export { PERIOD_SECONDS } from './rules.js';
export { toTransport, fromSendCommand, keySlot } from './transport.js';
export type { Transport, SendCommandFn, SendCommandClusterFn, RedisLike } from './transport.js';
export { RLStore, RLStore as default } from './express.js';
export type { RLStoreOptions, RLStoreOptions as Options, ClientRateLimitInfo, ExpressRateLimitOptions, RedisReply, SendCommandClusterDetails } from './express.js';
export { RateLimiterRL, RateLimiterRes } from './flexible.js';
export type { RateLimiterRLOptions, InsuranceLimiter, RateLimiterResConstructor } from './flexible.js';
export { concurrencyLimit } from './concurrency.js';
export type { ConcurrencyLimitOptions } from './concurrency.js';
export { Protection, CircuitBreaker, CircuitOpenError, PROTECTION_DEFAULTS } from './protection.js';
export type { ProtectionOptions, ProtectionStats, CircuitBreakerOptions, CircuitState } from './protection.js';
export { parseStats, STATS_FIELDS, WINDOW_FIELDS } from './policyStats.js';
export type { PolicyStats, WindowCounts, Stage } from './policyStats.js';
export { rateLimitMiddleware, outcomeErrors, defaultIsError } from './middleware.js';
export type { RateLimitMiddlewareOptions, RequestOutcome, DegradeInfo } from './middleware.js';
export { RateLimitMetrics, METRICS, LEVELS, OUTCOMES, REDIS_SECONDS_BUCKETS, REDIS_BREAKER } from './metrics.js';
export type { Level, Outcome, PromRegistry, MetricsOption } from './metrics.js';
export { batchSize, pickTags, stripeSpecs, shareOfStripe, SlotMap, Stripes, GRANT_DEFAULTS, MAX_STRIPES } from './grants.js';
export type { GrantConfig } from './grants.js';
export { DenyEvents, DENY_EVENT_FIELDS, DENY_EVENT_DEFAULTS, MAX_HEADER_BYTES } from './denyEvents.js';
export type { DenyEvent, DenyEventInput, DenyEventsOptions, DenyEventsStats } from './denyEvents.js';

// The former names, kept for one release (CHANGELOG.md). Each is the same
// class or type as its new name, so `instanceof` holds either way.
import { Client, type ClientOptions } from './client.js';
/** @deprecated use `Client` (the same class). */
export const RL = Client;
/** @deprecated use `Client` (the same class). */
export type RL = Client;
/** @deprecated use `ClientOptions` (the same type). */
export type RLOptions = ClientOptions;
export { RLArgumentError, RLModuleNotLoadedError, RLProtocolError, RLDeadlineError } from './errors.js';
/**
 * @deprecated use `Spec` (the same type). This kit has no named rule with a
 * key scope (what the Rust and Java kits call `Rule`).
 */
export type { Rule, CallOptions } from './rules.js';

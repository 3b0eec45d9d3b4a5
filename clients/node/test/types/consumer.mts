// What a TypeScript user writes, checked by `npm run typecheck` against the
// built .d.ts: RLStore where express-rate-limit (v8 and v7) wants a Store,
// RateLimiterRL where rate-limiter-flexible's users hold a limiter.
import { rateLimit, type Store } from 'express-rate-limit';
import { rateLimit as rateLimit7, type Store as Store7 } from 'erl7';
import { createClient } from 'redis';
import { Redis } from 'ioredis';
import { BurstyRateLimiter, RateLimiterMemory, RateLimiterUnion, RateLimiterQueue, type RateLimiterLike, type RateLimiterRes as FlexRes } from 'rate-limiter-flexible';
import express, { type Request, type Response } from 'express';
import { Decision, Lease, PERIOD_SECONDS, Client, RLDeniedError, RLStore, RateLimiterRL, RateLimiterRes, concurrencyLimit } from 'redis-ratelimit';
import { InvalidArgumentError, ModuleMissingError, Request as RLRequest, RL, RLArgumentError, RLModuleNotLoadedError, TimeoutError, RLDeadlineError } from 'redis-ratelimit';
import type { ClientOptions, Period, QuotaParams, RLOptions, Rule, Spec, SpecOrPolicy } from 'redis-ratelimit';

const client = createClient();
const redis = new Redis();

const store: Store = new RLStore({ sendCommand: (...args: string[]) => client.sendCommand(args) });
const store7: Store7 = new RLStore({ sendCommand: (command: string, ...args: string[]) => redis.call(command, ...args) as Promise<unknown> });
rateLimit({ windowMs: 60_000, limit: 100, store });
rateLimit7({ windowMs: 60_000, limit: 100, store: store7 });

const limiter = new RateLimiterRL({ storeClient: redis, points: 5, duration: 1, insuranceLimiter: new RateLimiterMemory({ points: 1, duration: 1 }) });
// Where rate-limiter-flexible takes one of its limiters.
const like: RateLimiterLike = limiter;
export const bursty = new BurstyRateLimiter(limiter, new RateLimiterMemory({ points: 10, duration: 1 }));
export const union = new RateLimiterUnion(like, new RateLimiterMemory({ points: 10, duration: 1 }));
export const queue = new RateLimiterQueue(limiter);
export async function flexible(): Promise<FlexRes> {
  const r: FlexRes = await bursty.consume('k');
  const mine: RateLimiterRes = await limiter.consume('k');
  if (mine instanceof RateLimiterRes) return r;
  return new RateLimiterRes(1, 2, 3, false);
}

export async function use(): Promise<number> {
  const d: Decision = await new Client(client).sliding('k', { limit: 5, windowMs: 1000 });
  const r: RateLimiterRes = await limiter.consume('k');
  const f: Pick<FlexRes, 'msBeforeNext' | 'remainingPoints' | 'consumedPoints' | 'isFirstInDuration'> = r;
  return d.remaining + f.msBeforeNext;
}

// Calendar quotas: the period as a literal, the zone optional; a rule wherever rules go.
export async function quotas(): Promise<number> {
  const rl = new Client(client);
  const period: Period = 'month';
  const q: QuotaParams = { limit: 1000, period, zone: 'America/New_York' };
  const d: Decision = await rl.quota('tenant:acme', q);
  const rule: Spec = { algorithm: 'quota', limit: 100, period: 'day' };
  await rl.policySet('exports', rule);
  await rl.policySet('exports-ny', { algorithm: 'quota', limit: 100, period: 'day', zone: 'America/New_York' }, { mode: 'SHADOW', rollout: 10 });
  const zone: string | number | undefined = (await rl.policyGet('exports-ny'))?.['zone'];
  await rl.all([{ key: '{t}:a', rule }, { key: '{t}:b', rule: { policy: 'exports' } }, { key: '{t}:c', rule: { policy: 'exports-ny' } }]);
  void zone;
  await rl.acquire('tenant:acme', { algorithm: 'quota', limit: 5, period: 'week', zone: '+05:30' }, { timeoutMs: 100 });
  rateLimit({ windowMs: PERIOD_SECONDS.day * 1000, limit: 100, store: new RLStore({ client, window: 'day', zone: 'Europe/Paris' }) });
  return d.resetMs;
}

// Leases and acquire, and the concurrency cap in an Express app.
export async function leases(): Promise<number> {
  const rl = new Client(client, { maxIdleConnections: 2 });
  const waited: Decision = await rl.acquire('k', { algorithm: 'tokenbucket', capacity: 5, refillCount: 5, refillMs: 1000 }, { timeoutMs: 2000 });
  const d = await rl.concurrency('jobs', { limit: 4, leaseMs: 30_000 });
  if (d.lease !== null) await rl.release('jobs', d.lease);
  const lease: Lease = await rl.lease('jobs', { limit: 4, leaseMs: 30_000 }, { timeoutMs: 5000, autoRenew: true });
  const renewed: boolean = await lease.renew();
  await lease[Symbol.asyncDispose]();
  const n: number = await rl.withLease('jobs', { policy: 'jobs', leaseMs: 30_000 }, async (l) => (l.signal.aborted ? 0 : l.id));
  try {
    await rl.lease('jobs', { limit: 1, leaseMs: 1000 });
  } catch (e) {
    if (e instanceof RLDeniedError) return e.decision.retryAfterMs;
  }
  return waited.remaining + n + (renewed ? 1 : 0);
}

const app = express();
app.use(concurrencyLimit({ client: redis, limit: 2, leaseMs: 60_000 }));
app.use(concurrencyLimit<Request, Response>({ client, limit: 2, leaseMs: 60_000, keyGenerator: (req) => req.get('x-user') }));
app.get('/', concurrencyLimit({ client, policy: 'p', timeoutMs: 1000 }), (_req, res) => {
  res.send('ok');
});

// The shared names, and the former ones (deprecated, the same classes and types).
export async function names(): Promise<number> {
  const options: ClientOptions = { maxIdleConnections: 1 };
  const rl = new Client(client, options);
  const d = await rl.tokenBucket('k', { capacity: 5, refillCount: 1, refillMs: 1000 }, RLRequest.force(2));
  await rl.hit('p', 'k', RLRequest.refund(1));
  await rl.sliding('k', { limit: 5, windowMs: 1000 }, { cost: 2, force: true });
  const request: RLRequest = RLRequest.cost(0);
  // @ts-expect-error: a request is a cost, a forced cost or a refund, never a forced refund.
  const forcedRefund: RLRequest = { kind: 'refund', n: 1, force: true };
  void forcedRefund;
  await rl.fixedWindow('k', { limit: 5, windowMs: 1000 }, request);
  const old: RL = new RL(client);
  const same: Client = old;
  const oldOptions: RLOptions = options;
  const oldRule: Rule = { algorithm: 'sliding', limit: 1, windowMs: 1000 };
  const spec: Spec = oldRule;
  const either: SpecOrPolicy[] = [spec, { policy: 'p' }];
  void [same, oldOptions, either];
  try {
    await rl.checkModule();
  } catch (e) {
    if (e instanceof RLArgumentError) return e.argument.length;
    if (e instanceof InvalidArgumentError) return e.argument.length;
    if (e instanceof RLModuleNotLoadedError || e instanceof ModuleMissingError) return 0;
    if (e instanceof RLDeadlineError || e instanceof TimeoutError) return 1;
  }
  return d.remaining;
}

// The Limiter: rules, options, the decision's path, the counters.
import { Limiter, RuleSet, STAT_NAMES, type LimiterOptions, type LimiterRule, type FallbackMode, type Path, type StatsSnapshot } from 'redis-ratelimit';
export async function twoLevels(): Promise<[boolean, Path, number, StatsSnapshot]> {
  const mode: FallbackMode = 'localOnly';
  const options: LimiterOptions = { instances: 4, fallback: mode, deadlineMs: 100, breaker: { failures: 5, openForMs: 1000 }, denyCacheMaxMs: 1000 };
  const lim = new Limiter(new Client(client), options);
  const rules: LimiterRule[] = [
    { name: 'user', spec: { algorithm: 'sliding', limit: 100, windowMs: 60_000 } },
    { key: 'rl:api', global: true, spec: { algorithm: 'tokenbucket', capacity: 1000, refillCount: 1000, refillMs: 1000 } },
    { policy: 'POST:/orders' },
  ];
  const set: RuleSet = await lim.ruleSet(rules);
  const d: Decision = await lim.check(set, 'alice', 2);
  const first: string = STAT_NAMES[0];
  const pairs: Array<[string, number]> = lim.statsPairs();
  void first;
  void pairs;
  void new Limiter(redis, { share: { ratio: 0.25 }, localLevel: false, denyCache: false });
  return [d.allowed, d.path, d.deniedBy ?? -1, lim.stats()];
}
export const breakers = [new RLStore({ client: redis, breaker: { failures: 3 } }), new RateLimiterRL({ storeClient: redis, breaker: false })];
// The protection loop: a Protection, its breaker, the express middleware.
import {
  Protection,
  PROTECTION_DEFAULTS,
  CircuitBreaker,
  outcomeErrors,
  rateLimitMiddleware,
  type CircuitState,
  type DegradeInfo,
  type PolicyStats,
  type ProtectionOptions,
  type RequestOutcome,
  type Stage,
} from 'redis-ratelimit';
export async function loop(): Promise<[Stage, number, CircuitState, PolicyStats]> {
  const rl = new Client(client);
  await rl.policySet('api', { algorithm: 'tokenbucket', capacity: 100, refillCount: 100, refillMs: 1000 }, {
    adapt: { errors: 5, factor: 80, min: 50, recover: 5, minCalls: 100 },
    stages: { degrade: 30, break: 50 },
    windowMs: 10_000,
  });
  const options: ProtectionOptions = { reportIntervalMs: PROTECTION_DEFAULTS.reportIntervalMs, breakers: { backend: ['api'] } };
  const protection = new Protection([rl, redis], ['api'], options);
  const breaker: CircuitBreaker = protection.breaker('backend');
  const n: number = await breaker.call(async () => 1);
  protection.record('api', n !== 1);
  protection.recordDenied('api', 2);
  const pending: { ok: number; errors: number; denied: number } = protection.pending('api');
  const lost: number = protection.counters().deniedLost + pending.denied;
  const app = express();
  const limiter = new Limiter(rl, { protection, denyCache: lost >= 0 });
  app.get(
    '/search',
    rateLimitMiddleware({
      limiter,
      rules: [{ policy: 'api' }],
      protection,
      core: false,
      breaker: 'backend',
      degrade: (_req, res, _next, info: DegradeInfo) => void res.end(String(info.stage)),
      isError: (o: RequestOutcome) => o.status >= 500 || o.timedOut,
    }),
  );
  app.use(outcomeErrors());
  const stats: PolicyStats = await rl.policyStats('api');
  await protection.close();
  return [protection.stage('api'), protection.scale('api'), breaker.state, stats];
}
// Metrics and deny events: a prom-client Registry (or true) where the kit takes `metrics`.
import { Registry, register as promRegister } from 'prom-client';
import {
  DenyEvents,
  DENY_EVENT_DEFAULTS,
  DENY_EVENT_FIELDS,
  LEVELS,
  METRICS,
  OUTCOMES,
  RateLimitMetrics,
  REDIS_SECONDS_BUCKETS,
  type DenyEvent,
  type DenyEventsOptions,
  type DenyEventsStats,
  type Level,
  type MetricsOption,
  type Outcome,
  type PromRegistry,
  type RequestContext,
} from 'redis-ratelimit';
export async function observability(): Promise<DenyEventsStats> {
  const registry = new Registry();
  const asKit: PromRegistry = registry;
  const option: MetricsOption = asKit;
  const metrics: RateLimitMetrics = RateLimitMetrics.of(promRegister);
  const seen: DenyEvent[] = [];
  const options: DenyEventsOptions = { callback: (batch: DenyEvent[]) => void seen.push(...batch), capacity: DENY_EVENT_DEFAULTS.capacity, metrics: registry };
  const events = new DenyEvents(options);
  new DenyEvents({ bulkUrl: new URL('http://127.0.0.1:9200'), bulkIndex: 'ratelimit-deny' });
  new DenyEvents({ file: '/tmp/deny.jsonl', metrics: true });
  const limiter = new Limiter(new Client(client), { metrics: option, denyEvents: events });
  const set = await limiter.ruleSet([{ name: 'api', spec: { algorithm: 'sliding', limit: 10, windowMs: 1000 } }]);
  const context: RequestContext = { clientIp: '10.0.0.1', userAgent: 'curl' };
  await limiter.check(set, 'alice', 1, context);
  const level: Level = LEVELS[0] ?? 'redis';
  const outcome: Outcome = OUTCOMES[0] ?? 'admitted';
  metrics.decision('api', level, outcome);
  void [METRICS[0].name, REDIS_SECONDS_BUCKETS[0], DENY_EVENT_FIELDS[0], limiter.metrics, limiter.denyEvents];
  void new Protection(redis, ['api'], { metrics: registry });
  void new RLStore({ client, metrics: true, denyEvents: events, name: 'web' });
  void new RateLimiterRL({ storeClient: redis, metrics: registry, denyEvents: events, name: 'login' });
  const text: string = await registry.metrics();
  void text;
  await events.close();
  return events.stats();
}

// Issue 27: UPTO, batched and striped rules.
import { SlotMap, pickTags, batchSize, GRANT_DEFAULTS, type GrantConfig } from 'redis-ratelimit';
export async function grants(): Promise<[number | null, Path, boolean]> {
  const rl = new Client(client);
  const d = await rl.fixedWindow('k', { limit: 5, windowMs: 1000 }, RLRequest.upto(3));
  const all = await rl.all([{ key: 'k', rule: { algorithm: 'sliding', limit: 5, windowMs: 1000 } }], { upto: 2 });
  await rl.acquire('k', { policy: 'p' }, { timeoutMs: 10, upto: 2 });
  const lim = new Limiter(rl);
  const set = await lim.ruleSet([
    { key: 'rl:api', global: true, batched: true, holdMs: 50, maxSharePct: 10, striped: 3, spec: { algorithm: 'tokenbucket', capacity: 1000, refillCount: 1000, refillMs: 1000 } },
  ]);
  const g: Decision = await lim.check(set, 'x');
  const grant: Path = 'grant';
  const config: GrantConfig = GRANT_DEFAULTS;
  const tags: string[] = pickTags(SlotMap.standalone(), 3);
  void [config, tags, batchSize(1, 50, 100, 10), grant];
  const moved: boolean = await lim.refreshStripes();
  await lim.close();
  return [d.granted ?? all.granted, g.path, moved];
}

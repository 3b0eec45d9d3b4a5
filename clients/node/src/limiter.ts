/**
 * The two-level limiter: the deny cache, then the local level (global
 * rules), then one round trip to Redis within a deadline, and the fallback
 * with its circuit breaker when Redis cannot answer (as the Rust kit's
 * limiter.rs and the Java kit's `Limiter`).
 */
import { beforeDeadline } from './account.js';
import type { Answer } from './algorithms.js';
import { Client } from './client.js';
import { Decision, type Path } from './decision.js';
import { DenyCache } from './denyCache.js';
import { checkInteger, checkString, describe, InvalidArgumentError, isServerReply, RLConnectionError, RLError, TimeoutError } from './errors.js';
import { Breaker, checkFallbackMode, startProbe, Stats, type BreakerOptions, type FallbackMode, type StatName, type StatsSnapshot } from './fallback.js';
import { checkShare, localSpec, LocalLimiters, scaled, type LocalSpec, type Share } from './local.js';
import { Request, ruleArgs, type Period, type Spec, type SpecOrPolicy } from './rules.js';
import type { Protection } from './protection.js';
import { isDenyEvents, type DenyEvents } from './denyEvents.js';
import { REDIS_BREAKER, resolveMetrics, type Level, type MetricsOption, type RateLimitMetrics } from './metrics.js';
import type { RedisLike } from './transport.js';
import { batchSize, checkShareable, checkStriped, grantConfig, GrantState, limitOfSpec, SlotMap, Stripes, stripeSpecs, type GrantConfig } from './grants.js';

/**
 * One limit of a `Limiter`: what the server applies (an inline `spec`, or a
 * `policy` kept in the server by name), the limiter key, its name (for
 * headers and logs), and whether it is global. What the Rust and Java kits
 * call `Rule` (in this kit `Rule` is, for one more release, the deprecated
 * name of `Spec`).
 */
export interface LimiterRule {
  /** An algorithm and its parameters, sent with every call. */
  spec?: Spec;
  /** Or the policy of that name (`RL.POLICY SET`), applied with `RL.HIT`. */
  policy?: string;
  /** The name in logs and headers (default: the algorithm in lower case, or the policy's name). */
  name?: string;
  /** The key is this prefix followed by the request's identity (default `rl:<name>:`). */
  keyPrefix?: string;
  /** Or this one key for every request (a global limit). */
  key?: string;
  /**
   * With the local level on, each instance first takes its share of the
   * limit in process; what the share denies never reaches Redis. Inline
   * rules only (not a quota in a named zone).
   */
  global?: boolean;
  /**
   * A global inline rule (token bucket, fixed window, sliding, hash window,
   * quota) whose units the instance takes from the server in batches
   * (`UPTO b`, b about `holdMs` worth of the instance's rate) and spends in
   * process: never above the limit; at most `instances x b` units held
   * unused, each for at most `holdMs` (then given back with `REFUND`, and
   * at `close()`). Decides one unit at a time (cost 1); alone in its set.
   */
  batched?: boolean;
  /** A batched rule's longest hold of unused units, in ms (1 to 60,000; default 50). */
  holdMs?: number;
  /** A batched rule's largest batch, in percent of its limit (1 to 100; default 10). */
  maxSharePct?: number;
  /**
   * A global inline rule kept in N keys (2 to 64; 1 is not striped) whose
   * hash tags fall on different masters, each with `limit / N` (the
   * remainder to the first ones); the instance uses its own stripe and, on a
   * denial, the next one. Alone in its set; may be batched too.
   */
  striped?: number;
}

/** `new Limiter(client, options)`; every option has a default. */
export interface LimiterOptions {
  /** The local level of global rules (default true). */
  localLevel?: boolean;
  /** Instances sharing each limit: each takes `ceil(total / instances x 1.1)` locally and in the fallback (default 1). */
  instances?: number;
  /** Or another share: `{ ratio: r }` takes `ceil(total x r)`. */
  share?: Share;
  /** The deny cache (default true). */
  denyCache?: boolean;
  /** The longest a denial is cached, in ms (default 1,000), so that a raised limit reaches users within it. */
  denyCacheMaxMs?: number;
  /** The most denials cached at once (default 10,000). */
  denyCacheCapacity?: number;
  /** The most in-process limiters held, each map (default 100,000). */
  localCapacity?: number;
  /** What decides when Redis cannot (default `'localOnly'`). */
  fallback?: FallbackMode;
  /** When the breaker opens and for how long. */
  breaker?: BreakerOptions;
  /**
   * The deadline of one call in ms (default 100). A call that misses it may
   * still be applied: its units are charged to the instance's account, and
   * the fallback decides the request.
   */
  deadlineMs?: number;
  /**
   * The protection loop: the denials of policy rules this limiter answers
   * without asking the server (deny cache hits) are counted
   * there (`recordDenied`) and reach the server with the outcome reports,
   * so that a policy's stages see the whole flood.
   */
  protection?: Protection;
  /**
   * Prometheus metrics (prom-client, an optional peer): `true` for
   * prom-client's global `register`, or a `Registry`. Counts every decision
   * by rule, level and outcome, times every limiter round trip, and keeps
   * each rule's remaining ratio and the breaker's state (README, "Metrics
   * and deny events"). Off by default.
   */
  metrics?: MetricsOption;
  /** Every denial, at every level, recorded as a deny event (`new DenyEvents({ ... })`). */
  denyEvents?: DenyEvents;
}

/** What the HTTP layer knows of a request, for its deny event. */
export interface RequestContext {
  clientIp?: string | undefined;
  userAgent?: string | undefined;
}

/** The metrics' and deny events' level of each path a decision takes. */
export const LEVEL_OF: Record<Path, Level> = { redis: 'redis', local: 'local', denyCache: 'deny_cache', grant: 'grant', fallback: 'fallback' };

/** One checked rule of a `RuleSet`. */
export interface CheckedRule {
  readonly name: string;
  /** What the server applies: the spec, or `{ policy }`. */
  readonly kind: SpecOrPolicy;
  /** The algorithm and parameters (for a policy: as the server had it when the set was built; null if unknown). */
  readonly spec: Spec | null;
  readonly global: boolean;
  /** The limiter key of `identity`. */
  keyFor(identity: string): string;
  /** The local level's share, for a global rule when the level is on. */
  readonly local: LocalSpec | null;
  /** The local-only fallback's share. */
  readonly fallback: LocalSpec | null;
  /** Identifies the rule in the deny cache and the local maps. */
  readonly signature: string;
  /** A batched rule's options (`batched: true`), else null. */
  readonly grants?: GrantConfig | null;
  /** A striped rule's stripes (`striped: N`), else null. */
  readonly stripes?: Stripes | null;
}

/** Rules checked together, all or nothing (several go through `RL.ALL`). Built by `Limiter.ruleSet`. */
export class RuleSet {
  constructor(readonly rules: readonly CheckedRule[]) {}
}

type Limits = Array<readonly [string, LocalSpec]>;

const MAX_COST = 1n << 40n;

/** What became of the call to Redis. */
type Outcome = { kind: 'redis'; d: Decision } | { kind: 'lost' } | { kind: 'notApplied' };

/** Where a batched or striped rule's decision goes on the server: a key (a stripe's), its spec, and its grant state's name. */
interface Target {
  readonly key: string;
  readonly spec: Spec;
  readonly stateKey: string;
}

/**
 * Rate limiting over a `Client`, in two levels, with a deny cache and a
 * fallback:
 *
 * 1. the deny cache: a key Redis denied is denied in process until its
 *    wait ends (at most `denyCacheMaxMs`), without a round trip (several
 *    rules: the set RL.ALL denied, its wait being the largest of the set's);
 *    with the `protection` option, a policy rule's denials answered there
 *    are counted for the loop's stages (`RL.OUTCOME ... DENIED n`);
 * 2. the local level: a global rule's share of its limit is taken in
 *    process first (the core's algorithms, src/algorithms.ts); what the
 *    share denies never reaches Redis;
 * 3. one call to Redis within `deadlineMs` (several rules: one `RL.ALL`);
 * 4. when Redis errors, misses the deadline or the breaker is open, the
 *    fallback decides (`'failOpen'`, `'failClosed'`, `'localOnly'`). Units
 *    the local-only fallback admitted without a call are owed to Redis and
 *    sent as `COST n FORCE` before the key's next call.
 *
 * ```ts
 * const limiter = new Limiter(createClient(), { instances: 4 })
 * const rules = await limiter.ruleSet([{ spec: { algorithm: 'sliding', limit: 100, windowMs: 60_000 }, name: 'api' }])
 * const d = await limiter.check(rules, userId)
 * if (!d.allowed) res.set('Retry-After', String(d.retryAfterS))
 * ```
 */
export class Limiter {
  readonly client: Client;
  readonly fallbackMode: FallbackMode;
  readonly deadlineMs: number;
  /** Where the denials of policy rules answered in process are counted (the `protection` option). */
  readonly protection: Protection | undefined;
  private readonly localLevel: boolean;
  private readonly share: Share;
  private readonly denyCache: DenyCache | null;
  /** The local level of the global rules: also their accounts. */
  private readonly local: LocalLimiters;
  /**
   * The instance's accounts of the other rules, at its share: charged with
   * every unit Redis admitted for this instance and every unit of a call
   * whose answer was lost, so that the local-only fallback admits only
   * what Redis cannot already have counted for this instance.
   */
  private readonly accounts: LocalLimiters;
  private readonly breaker: Breaker;
  private readonly counters = new Stats();
  /** The metrics, when on. */
  readonly metrics: RateLimitMetrics | undefined;
  /** The deny events' shipper, when given. */
  readonly denyEvents: DenyEvents | undefined;
  /** Batched rules' held units and rate, per (rule, key). */
  private readonly grantStates = new Map<string, GrantState>();
  private readonly grantCap: number;
  /** Every striped rule built, for a re-pick of their tags when the slot map changes. */
  private readonly stripeSets = new Set<Stripes>();
  /** This instance's stripe of every striped rule: this number mod N, drawn once. */
  private readonly stripeSeed = Math.floor(Math.random() * 2 ** 31);
  private refreshing: Promise<boolean> | null = null;
  private unwatch: (() => void) | undefined;

  constructor(client: Client | RedisLike, options: LimiterOptions = {}) {
    if (options === null || typeof options !== 'object') {
      throw new InvalidArgumentError('options', `Limiter options must be an object, got ${describe(options)}`);
    }
    this.client = client instanceof Client ? client : new Client(client);
    const flag = (name: keyof LimiterOptions, dflt: boolean): boolean => {
      const v = options[name];
      if (v === undefined) return dflt;
      if (typeof v !== 'boolean') throw new InvalidArgumentError(name, `${name} must be true or false, got ${describe(v)}`);
      return v;
    };
    this.localLevel = flag('localLevel', true);
    if (options.share !== undefined && options.instances !== undefined) {
      throw new InvalidArgumentError('share', 'give instances or share, not both');
    }
    this.share = options.share !== undefined ? checkShare(options.share) : { instances: checkInteger('instances', options.instances ?? 1, 1) };
    const denyMax = checkInteger('denyCacheMaxMs', options.denyCacheMaxMs ?? 1000, 0);
    const denyCap = checkInteger('denyCacheCapacity', options.denyCacheCapacity ?? 10_000, 1);
    this.denyCache = flag('denyCache', true) && denyMax > 0 ? new DenyCache(denyMax, denyCap) : null;
    const cap = checkInteger('localCapacity', options.localCapacity ?? 100_000, 1);
    this.local = new LocalLimiters(cap);
    this.accounts = new LocalLimiters(cap);
    this.grantCap = cap;
    this.fallbackMode = checkFallbackMode(options.fallback ?? 'localOnly');
    this.breaker = new Breaker(options.breaker ?? {});
    this.deadlineMs = checkInteger('deadlineMs', options.deadlineMs ?? 100, 1);
    const protection = options.protection;
    if (protection !== undefined && (protection === null || typeof protection !== 'object' || typeof (protection as Protection).recordDenied !== 'function')) {
      throw new InvalidArgumentError('protection', `protection must be a Protection, got ${describe(protection)}`);
    }
    this.protection = protection;
    this.metrics = resolveMetrics(options.metrics);
    if (options.denyEvents !== undefined && !isDenyEvents(options.denyEvents)) {
      throw new InvalidArgumentError('denyEvents', `denyEvents must be a DenyEvents, got ${describe(options.denyEvents)}`);
    }
    this.denyEvents = options.denyEvents;
    this.metrics?.watchBreaker(REDIS_BREAKER, this.breaker, (b) => b.isOpen);
  }

  /** A reading of the counters of every path, under the Rust kit's names (`redis_calls`, `deny_cache_hits`...). */
  stats(): StatsSnapshot {
    return this.counters.snapshot();
  }

  /** The counters as `[name, value]` pairs, in the Rust kit's order (for an exporter). */
  statsPairs(): Array<[StatName, number]> {
    return this.counters.pairs();
  }

  /** Whether the breaker is open (or half-open, probing). */
  get breakerOpen(): boolean {
    return this.breaker.isOpen;
  }

  /**
   * Checks `rules` (every parameter, before anything is sent) and reads the
   * policies' rules from the server, for the local-only fallback. A bad
   * rule is an `InvalidArgumentError` naming its parameter; so is a policy
   * the server does not have.
   */
  async ruleSet(rules: readonly LimiterRule[]): Promise<RuleSet> {
    if (!Array.isArray(rules) || rules.length === 0) {
      throw new InvalidArgumentError('rules', `rules must be a non-empty array of rules, got ${describe(rules)}`);
    }
    const several = rules.length > 1;
    const checked: CheckedRule[] = [];
    for (const rule of rules) checked.push(await this.checkRule(rule, several));
    if (several) {
      const shared = checked.find((r) => r.grants || r.stripes);
      if (shared !== undefined) {
        throw new InvalidArgumentError(shared.grants ? 'batched' : 'striped', `a ${shared.grants ? 'batched' : 'striped'} rule (${shared.name}) goes alone in its rule set: check it with its own set`);
      }
    }
    return new RuleSet(checked);
  }

  private async checkRule(rule: LimiterRule, several: boolean): Promise<CheckedRule> {
    if (rule === null || typeof rule !== 'object') {
      throw new InvalidArgumentError('rule', `a rule is { spec } or { policy }, with name, keyPrefix or key, global; got ${describe(rule)}`);
    }
    const hasSpec = rule.spec !== undefined;
    const hasPolicy = rule.policy !== undefined;
    if (hasSpec === hasPolicy) {
      throw new InvalidArgumentError(hasSpec ? 'policy' : 'spec', 'a rule has either a spec or a policy');
    }
    if (rule.keyPrefix !== undefined && rule.key !== undefined) {
      throw new InvalidArgumentError('key', 'a rule has either a keyPrefix or a key');
    }
    const global = rule.global ?? false;
    if (typeof global !== 'boolean') throw new InvalidArgumentError('global', `global must be true or false, got ${describe(global)}`);
    let spec: Spec | null;
    let kind: SpecOrPolicy;
    let signature: string;
    let name: string;
    if (hasSpec) {
      const [word, args] = ruleArgs(rule.spec as Spec, 'spec');
      spec = rule.spec as Spec;
      kind = spec;
      signature = `${word} ${args.join(' ')}`;
      name = rule.name ?? word.toLowerCase();
      if (word === 'CONCURRENCY') {
        throw new InvalidArgumentError('algorithm', 'a CONCURRENCY rule holds a lease for the length of the work: use concurrencyLimit, or Client.lease');
      }
      if (several && args.includes('TZ')) {
        throw new InvalidArgumentError('zone', "several rules go in one RL.ALL, whose inline quotas count in UTC only: make the zoned quota a policy (client.policySet, then { policy })");
      }
    } else {
      const policy = checkString('policy', rule.policy);
      if (global) throw new InvalidArgumentError('global', 'only inline rules can be global (a policy is kept in the server)');
      const info = await this.client.policyGet(policy);
      if (info === null) throw new InvalidArgumentError('policy', `no policy ${JSON.stringify(policy)} on the server (RL.POLICY SET it first)`);
      spec = specOfPolicy(info);
      if (spec?.algorithm === 'concurrency') {
        throw new InvalidArgumentError('algorithm', `the policy ${JSON.stringify(policy)} is a CONCURRENCY rule, which holds a lease for the length of the work: use concurrencyLimit, or Client.lease`);
      }
      kind = { policy };
      signature = `POLICY ${policy}`;
      name = rule.name ?? policy;
    }
    checkString('name', name);
    const prefix = rule.key === undefined ? checkString('keyPrefix', rule.keyPrefix ?? `rl:${name}:`) : undefined;
    const fixed = rule.key === undefined ? undefined : checkString('key', rule.key);
    const inProcess = spec === null ? null : localSpec(spec);
    if (global && inProcess === null) {
      throw new InvalidArgumentError('global', 'a quota in a named time zone cannot be global: the local level reads no time-zone database (use UTC or a fixed offset)');
    }
    const share = inProcess === null ? null : scaled(inProcess, this.share);
    const { grants, stripes } = await this.sharedOptions(rule, spec !== null && hasSpec ? spec : null, global);
    return {
      name,
      kind,
      spec,
      global,
      keyFor: (identity) => (fixed !== undefined ? fixed : `${prefix}${identity}`),
      local: global && this.localLevel ? share : null,
      fallback: share,
      signature,
      grants,
      stripes,
    };
  }

  /** `batched`, `holdMs`, `maxSharePct` and `striped`, checked; a striped rule's tags read from the slot map. */
  private async sharedOptions(rule: LimiterRule, spec: Spec | null, global: boolean): Promise<{ grants: GrantConfig | null; stripes: Stripes | null }> {
    const batched = rule.batched ?? false;
    if (typeof batched !== 'boolean') throw new InvalidArgumentError('batched', `batched must be true or false, got ${describe(batched)}`);
    const n = checkStriped(rule.striped ?? 1);
    if (!batched) {
      if (rule.holdMs !== undefined) throw new InvalidArgumentError('holdMs', 'holdMs is an option of a batched rule (batched: true)');
      if (rule.maxSharePct !== undefined) throw new InvalidArgumentError('maxSharePct', 'maxSharePct is an option of a batched rule (batched: true)');
    }
    const grants = batched ? grantConfig(rule.holdMs, rule.maxSharePct) : null;
    if (!batched && n === 1) return { grants, stripes: null };
    const option = batched ? 'batched' : 'striped';
    if (spec === null) throw new InvalidArgumentError(option, `${option} is an option of an inline rule ({ spec }), not of a policy`);
    if (!global) throw new InvalidArgumentError(option, `${option} is an option of a global rule (global: true): one limit shared by every instance`);
    if (batched) checkShareable('batched', spec);
    if (n === 1) return { grants, stripes: null };
    const specs = stripeSpecs(spec, n);
    const stripes = new Stripes(specs, await this.readSlotMap());
    this.stripeSets.add(stripes);
    this.watchTopology();
    return { grants, stripes };
  }

  /** The slot map, from `CLUSTER SLOTS` on any node; a standalone server (cluster support disabled) is one master. */
  private async readSlotMap(): Promise<SlotMap> {
    let reply: unknown;
    try {
      reply = await this.client.send(undefined, ['CLUSTER', 'SLOTS']);
    } catch (err) {
      if (/cluster support disabled|unknown command|only.*cluster mode|not.*cluster/i.test((err as Error)?.message ?? '')) return SlotMap.standalone();
      throw err;
    }
    return SlotMap.fromClusterSlots(reply);
  }

  /** An ioredis cluster says when it refreshed its slot map: the stripes are re-picked then. */
  private watchTopology(): void {
    if (this.unwatch !== undefined) return;
    const c = this.client.redisClient as { isCluster?: unknown; on?: unknown; off?: unknown } | null;
    if (c === null || typeof c !== 'object' || c.isCluster !== true || typeof c.on !== 'function' || typeof c.off !== 'function') {
      this.unwatch = () => {};
      return;
    }
    const on = c.on as (e: string, f: () => void) => void;
    const off = c.off as (e: string, f: () => void) => void;
    const listener = () => void this.refreshStripes().catch(() => {});
    on.call(c, 'refresh', listener);
    this.unwatch = () => off.call(c, 'refresh', listener);
  }

  /**
   * Reads the slot map again and re-picks the tags of every striped rule
   * whose masters changed (only a stripe whose master now holds more
   * than `ceil(N / M)` stripes moves, to the master with the fewest). The kit does it by itself on a MOVED reply
   * and on an ioredis cluster's topology refresh; call it after a
   * resharding a node-redis cluster followed by itself. Whether a tag moved.
   * Units consumed under the old keys are not seen by the new ones: a
   * re-pick can over-admit once by what the moved stripes had consumed.
   */
  refreshStripes(): Promise<boolean> {
    if (this.refreshing !== null) return this.refreshing;
    const p = this.readSlotMap()
      .then((map) => {
        let moved = false;
        for (const s of this.stripeSets) moved = s.repick(map) || moved;
        return moved;
      })
      .finally(() => {
        this.refreshing = null;
      });
    this.refreshing = p;
    return p;
  }

  /**
   * Gives back, with `REFUND`, every unit the batched rules hold (within
   * the deadline; the units of an ask in flight too, once it answers within
   * the deadline), and stops watching the cluster's topology. The limiter
   * still decides afterwards (a batched rule takes new batches); call it at
   * shutdown.
   */
  async close(): Promise<void> {
    this.unwatch?.();
    this.unwatch = undefined;
    // The units of an ask in flight go back too: wait for its answer (within the deadline).
    const flying = [...this.grantStates.values()].flatMap((st) => (st.inflight === null ? [] : [st.inflight]));
    if (flying.length > 0) await beforeDeadline(Promise.allSettled(flying), this.deadlineMs).catch(() => {});
    const refunds: Array<Promise<unknown>> = [];
    for (const st of this.grantStates.values()) {
      if (st.held > 0) refunds.push(beforeDeadline(this.refundHeld(st), this.deadlineMs).catch(() => {}));
      clearTimeout(st.timer);
      st.timer = undefined;
      st.nextAskAt = 0;
    }
    await Promise.all(refunds);
  }

  /**
   * Decides one request of `cost` units (default 1) for `identity` under
   * every rule of `set`. Never rejects for Redis: where Redis cannot
   * answer, the fallback decides, and `decision.path` says which path did.
   * Rejects only on bad arguments.
   */
  check(set: RuleSet, identity: string, cost = 1, context?: RequestContext): Promise<Decision> {
    if (context !== undefined && (context === null || typeof context !== 'object')) {
      return Promise.reject(new InvalidArgumentError('context', `context must be { clientIp, userAgent }, got ${describe(context)}`));
    }
    if (context !== undefined) {
      // Checked before the decision: a deny event refusing them afterwards would reject a request already counted.
      for (const f of ['clientIp', 'userAgent'] as const) {
        const v = context[f];
        if (v !== undefined && typeof v !== 'string') return Promise.reject(new InvalidArgumentError(f, `${f} must be a string, got ${describe(v)}`));
      }
    }
    return this.decide(set, identity, cost, context);
  }

  /**
   * Counts the decision in the metrics (`ratelimit_decisions_total`: an
   * admission once per rule of the set, a denial once, for the rule that
   * denied; `ratelimit_remaining_ratio` of a rule whose numbers the
   * decision carries) and records a denial as a deny event.
   */
  private done(rules: readonly CheckedRule[], keys: string[], d: Decision, context: RequestContext | undefined): Decision {
    // Without metrics or deny events, nothing is added to the decision's path.
    if (this.metrics !== undefined || this.denyEvents !== undefined) this.observe(rules, keys, d, context);
    return d;
  }

  private observe(rules: readonly CheckedRule[], keys: string[], d: Decision, context: RequestContext | undefined): void {
    const level = LEVEL_OF[d.path];
    const m = this.metrics;
    if (d.allowed) {
      if (m === undefined) return;
      for (const r of rules) m.decision(r.name, level, 'admitted');
      // RL.ALL's admission carries the most restrictive rule's numbers, not saying which: only a single rule's ratio is known.
      if (rules.length === 1 && (level === 'redis' || level === 'local')) m.remainingRatio((rules[0] as CheckedRule).name, d.remaining, d.limit);
      return;
    }
    const at = d.deniedBy ?? 0;
    const rule = rules[at] as CheckedRule;
    if (m !== undefined) {
      m.decision(rule.name, level, 'denied');
      if (level === 'redis' || level === 'local') m.remainingRatio(rule.name, d.remaining, d.limit);
    }
    this.denyEvents?.record({
      key: keys[at] as string,
      rule: rule.name,
      level,
      outcome: 'denied',
      limit: d.limit,
      remaining: d.remaining,
      retryAfterMs: d.waitMs,
      clientIp: context?.clientIp,
      userAgent: context?.userAgent,
    });
  }

  private async decide(set: RuleSet, identity: string, cost: number, context: RequestContext | undefined): Promise<Decision> {
    if (!(set instanceof RuleSet)) throw new InvalidArgumentError('set', `set must be a RuleSet (limiter.ruleSet(rules)), got ${describe(set)}`);
    checkString('identity', identity);
    const units = BigInt(checkInteger('cost', cost, 0));
    const rules = set.rules;
    const keys = rules.map((r) => r.keyFor(identity));
    const cacheKey = (i: number) => `${(rules[i] as CheckedRule).signature}\0${keys[i]}`;
    const only = rules[0] as CheckedRule;
    if (rules.length === 1 && (only.grants || only.stripes)) return this.decideShared(only, keys[0] as string, units, cost, context);
    // An RL.ALL denial's wait is the largest of the set's, not that of the
    // rule it names (the first that denied): it is cached for the set.
    const setKey = () => rules.map((_, i) => cacheKey(i)).join('\x01');

    if (this.denyCache !== null) {
      for (let i = 0; i < rules.length; i++) {
        const d = this.denyCache.get(cacheKey(i));
        if (d !== undefined) {
          this.counters.add('deny_cache_hits');
          this.deniedLocally(rules[i] as CheckedRule);
          return this.done(rules, keys, withFields(d, { deniedBy: i }), context);
        }
      }
      if (rules.length > 1) {
        const d = this.denyCache.get(setKey());
        if (d !== undefined) {
          this.counters.add('deny_cache_hits');
          this.deniedLocally(rules[d.deniedBy ?? 0] as CheckedRule);
          return this.done(rules, keys, d, context);
        }
      }
    }

    // The local level of the global rules: their accounts, taken before the call.
    const localIdx: number[] = [];
    const localLimits: Limits = [];
    rules.forEach((r, i) => {
      if (r.local !== null) {
        localIdx.push(i);
        localLimits.push([cacheKey(i), r.local]);
      }
    });
    let taken: Array<[number, Answer]> = [];
    if (localLimits.length > 0) {
      const t = this.local.takeAll(localLimits, units);
      if (!t.ok) {
        const i = localIdx[t.pos] as number;
        this.counters.add('local_denied');
        this.deniedLocally(rules[i] as CheckedRule);
        return this.done(rules, keys, fromAnswer(t.answer, 'local', limitOf(rules[i] as CheckedRule, t.answer), { remaining: 0, deniedBy: i }), context);
      }
      taken = t.answers.map((a, n) => [localIdx[n] as number, a]);
    }
    // The other rules' accounts: only the local-only fallback keeps them.
    const accountIdx: number[] = [];
    const accountLimits: Limits = [];
    if (this.fallbackMode === 'localOnly') {
      rules.forEach((r, i) => {
        if (r.local === null && r.fallback !== null) {
          accountIdx.push(i);
          accountLimits.push([cacheKey(i), r.fallback]);
        }
      });
    }

    let outcome: Outcome;
    const gate = this.breaker.gate();
    if (gate === 'call') {
      await this.settle(rules, keys, localIdx, localLimits, accountIdx, accountLimits);
      this.counters.add('redis_calls');
      // The round trip, timed when metrics are on: answered, or past the deadline.
      const t0 = this.metrics === undefined ? 0 : performance.now();
      try {
        const d = await beforeDeadline(this.callRedis(rules, keys, cost), this.deadlineMs);
        this.metrics?.redisSeconds((performance.now() - t0) / 1000);
        this.breaker.success();
        outcome = { kind: 'redis', d };
      } catch (err) {
        const failure = classify(err);
        // A call that failed on the connection had no round trip.
        if (failure !== 'unavailable') this.metrics?.redisSeconds((performance.now() - t0) / 1000);
        this.counters.add(failure === 'timeout' ? 'redis_timeouts' : failure === 'unavailable' ? 'redis_unavailable' : 'redis_errors');
        if (failure !== 'error' && this.breaker.failure()) {
          this.counters.add('breaker_opened');
          process.emitWarning(`redis-ratelimit: circuit breaker open, fallback ${this.fallbackMode} decides (${(err as Error)?.message})`, { code: 'RL_BREAKER_OPEN' });
        }
        outcome = failure === 'error' ? { kind: 'notApplied' } : { kind: 'lost' };
      }
    } else {
      this.counters.add('breaker_skipped');
      if (gate === 'probe') this.probe();
      outcome = { kind: 'notApplied' };
    }

    if (outcome.kind === 'redis') {
      let d = outcome.d;
      if (d.allowed) {
        this.counters.add('redis_admitted');
        if (this.fallbackMode === 'localOnly') this.accounts.chargeAll(accountLimits, units);
      } else {
        this.counters.add('redis_denied');
        this.local.refundAll(localLimits, units);
        const i = d.deniedBy ?? 0;
        d = withFields(d, { deniedBy: i });
        this.denyCache?.put(rules.length === 1 ? cacheKey(0) : setKey(), d);
      }
      return this.done(rules, keys, d, context);
    }
    const lost = outcome.kind === 'lost';
    const d = this.fallback(rules, units, localLimits, accountIdx, accountLimits, taken, lost);
    if (d.allowed) this.counters.add('fallback_admitted');
    else {
      this.counters.add('fallback_denied');
      // A call that may have been applied keeps its units on the local
      // level: Redis may have counted them.
      if (!lost) this.local.refundAll(localLimits, units);
    }
    return this.done(rules, keys, d, context);
  }

  /**
   * A batched or striped rule's decision: the local level, then (batched)
   * the units held or the local denial until the next ask, or the round
   * trips to the own stripe and on a denial the next one; the fallback as
   * any rule's when Redis cannot answer (held units still spent first).
   */
  private async decideShared(rule: CheckedRule, key: string, units: bigint, cost: number, context: RequestContext | undefined): Promise<Decision> {
    const rules = [rule];
    const keys = [key];
    const cacheKey = `${rule.signature}\0${key}`;
    const grants = rule.grants ?? null;
    if (grants !== null && units !== 1n) {
      throw new InvalidArgumentError('cost', `a batched rule decides one unit at a time: cost must be 1, got ${cost}`);
    }
    // A batched rule's own local denial (until its next ask) stands for the deny cache.
    if (grants === null && this.denyCache !== null) {
      const d = this.denyCache.get(cacheKey);
      if (d !== undefined) {
        this.counters.add('deny_cache_hits');
        return this.done(rules, keys, withFields(d, { deniedBy: 0 }), context);
      }
    }
    const localLimits: Limits = rule.local !== null ? [[cacheKey, rule.local]] : [];
    let taken: Array<[number, Answer]> = [];
    if (localLimits.length > 0) {
      const t = this.local.takeAll(localLimits, units);
      if (!t.ok) {
        this.counters.add('local_denied');
        return this.done(rules, keys, fromAnswer(t.answer, 'local', limitOf(rule, t.answer), { remaining: 0, deniedBy: 0 }), context);
      }
      taken = [[0, t.answers[0] as Answer]];
    }
    const accountIdx: number[] = [];
    const accountLimits: Limits = [];
    if (this.fallbackMode === 'localOnly' && rule.local === null && rule.fallback !== null) {
      accountIdx.push(0);
      accountLimits.push([cacheKey, rule.fallback]);
    }
    const targets = this.targetsOf(rule, key);

    let outcome: Outcome;
    const gate = this.breaker.gate();
    if (gate === 'call') {
      await this.settleShared(targets[0] as Target, localLimits, accountLimits);
      try {
        const d = await beforeDeadline(this.sharedCall(grants, targets, cost), this.deadlineMs);
        // Held units answer without Redis: only an answer from it closes the breaker's count.
        if (d.path === 'redis') this.breaker.success();
        outcome = { kind: 'redis', d };
      } catch (err) {
        const failure = classify(err);
        this.counters.add(failure === 'timeout' ? 'redis_timeouts' : failure === 'unavailable' ? 'redis_unavailable' : 'redis_errors');
        if (failure !== 'error' && this.breaker.failure()) {
          this.counters.add('breaker_opened');
          process.emitWarning(`redis-ratelimit: circuit breaker open, fallback ${this.fallbackMode} decides (${(err as Error)?.message})`, { code: 'RL_BREAKER_OPEN' });
        }
        outcome = failure === 'error' ? { kind: 'notApplied' } : { kind: 'lost' };
      }
    } else {
      this.counters.add('breaker_skipped');
      if (gate === 'probe') this.probe();
      // Units already taken from the server are spent first.
      const d = grants === null ? null : this.fromHeld(targets);
      outcome = d === null ? { kind: 'notApplied' } : { kind: 'redis', d };
    }

    if (outcome.kind === 'redis') {
      let d = outcome.d;
      if (d.allowed) {
        if (d.path === 'redis') this.counters.add('redis_admitted');
        if (this.fallbackMode === 'localOnly') this.accounts.chargeAll(accountLimits, units);
      } else {
        if (d.path === 'redis') this.counters.add('redis_denied');
        this.local.refundAll(localLimits, units);
        d = withFields(d, { deniedBy: 0 });
        if (grants === null) this.denyCache?.put(cacheKey, d);
      }
      return this.done(rules, keys, d, context);
    }
    const lost = outcome.kind === 'lost';
    const d = this.fallback(rules, units, localLimits, accountIdx, accountLimits, taken, lost);
    if (d.allowed) this.counters.add('fallback_admitted');
    else {
      this.counters.add('fallback_denied');
      if (!lost) this.local.refundAll(localLimits, units);
    }
    return this.done(rules, keys, d, context);
  }

  /** Where a batched or striped rule decides: its key, or its own stripe then the next one. */
  private targetsOf(rule: CheckedRule, key: string): Target[] {
    const spec = rule.spec as Spec;
    const stripes = rule.stripes ?? null;
    if (stripes === null) return [{ key, spec, stateKey: `${rule.signature}\0${key}` }];
    const own = this.stripeSeed % stripes.n;
    return [own, (own + 1) % stripes.n].map((i) => {
      const k = stripes.key(i, key);
      return { key: k, spec: stripes.specs[i] as Spec, stateKey: `${rule.signature}\0${k}` };
    });
  }

  /** The owed units of the local-only fallback, sent to the own stripe (or the key) as `COST n FORCE`. */
  private async settleShared(target: Target, localLimits: Limits, accountLimits: Limits): Promise<void> {
    if (this.fallbackMode !== 'localOnly') return;
    const owed = [...this.local.takeOwed(localLimits), ...this.accounts.takeOwed(accountLimits)].reduce((a, b) => a + b, 0n);
    if (owed === 0n) return;
    this.counters.add('owed_sent');
    const request = Request.force(Number(owed < MAX_COST ? owed : MAX_COST));
    await this.timed(beforeDeadline(this.client.limit(target.key, target.spec, request), this.deadlineMs)).catch(() => {
      // not settled: Redis is failing again, and the request's own call will say so
    });
  }

  /** The own target, then on a denial the next stripe; denied when both deny (the own stripe's fields, the shorter wait). */
  private async sharedCall(grants: GrantConfig | null, targets: Target[], cost: number): Promise<Decision> {
    const first = await this.onTarget(grants, targets[0] as Target, cost);
    if (first.allowed || targets.length === 1) return first;
    const second = await this.onTarget(grants, targets[1] as Target, cost);
    if (second.allowed) return second;
    const a = first.waitMs;
    const b = second.waitMs;
    const wait = a < 0 ? b : b < 0 ? a : Math.min(a, b);
    const path = first.path === 'grant' && second.path === 'grant' ? 'grant' : 'redis';
    return new Decision(false, first.limit, first.remaining, wait, first.resetMs, 0, null, path);
  }

  private onTarget(grants: GrantConfig | null, t: Target, cost: number): Promise<Decision> {
    if (grants !== null) return this.grantDecide(grants, t);
    this.counters.add('redis_calls');
    return this.sent(this.client.limit(t.key, t.spec, Request.cost(cost)));
  }

  /** A call to a batched or striped key, timed; a MOVED reply re-picks the stripes (in the background). */
  private sent(call: Promise<Decision>): Promise<Decision> {
    return this.timed(call).catch((err: unknown) => {
      if (/^MOVED\b|\bMOVED \d+/.test((err as Error)?.message ?? '')) void this.refreshStripes().catch(() => {});
      throw err;
    });
  }

  private grantState(t: Target): GrantState {
    let st = this.grantStates.get(t.stateKey);
    if (st === undefined) {
      if (this.grantStates.size >= this.grantCap) {
        const now = performance.now();
        for (const [k, v] of this.grantStates) if (v.idle(now)) this.grantStates.delete(k);
      }
      st = new GrantState(t.key, t.spec);
      this.grantStates.set(t.stateKey, st);
    }
    return st;
  }

  /** A batched key's decision: from the units held, a local denial until the next ask, the ask in flight shared, or a new ask of `UPTO b`. */
  private async grantDecide(g: GrantConfig, t: Target): Promise<Decision> {
    const st = this.grantState(t);
    const now = performance.now();
    const rate = st.count(now);
    if (st.held > 0 && now - st.grantedAt >= g.holdMs) void this.refundHeld(st);
    if (st.held > 0) return this.takeHeld(st);
    if (now < st.nextAskAt) return this.grantDenial(st, now);
    if (st.inflight !== null) {
      // One call in flight per (rule, key): wait for its grant and share it, in arrival order.
      await st.inflight;
      if (st.held > 0) return this.takeHeld(st);
      return this.grantDenial(st, performance.now());
    }
    const b = batchSize(rate, g.holdMs, limitOfSpec(st.spec), g.maxSharePct);
    this.counters.add('redis_calls');
    const ask = this.sent(this.client.limit(st.key, st.spec, Request.upto(b))).then((d) => {
      const granted = d.granted ?? 0;
      st.last = d;
      if (granted >= 1) {
        // This request takes one; the rest is held for the next ones.
        st.held += granted - 1;
        st.grantedAt = performance.now();
        if (granted < b) st.nextAskAt = now + g.holdMs;
        if (st.held > 0) this.armRefund(st, g);
      } else {
        st.nextAskAt = d.waitMs < 0 ? Number.POSITIVE_INFINITY : now + Math.max(d.waitMs, b > 1 ? g.holdMs : 0);
      }
      return d;
    });
    st.inflight = ask;
    const clear = () => {
      if (st.inflight === ask) st.inflight = null;
    };
    ask.then(clear, clear);
    const d = await ask;
    return new Decision(d.allowed, d.limit, d.remaining, d.waitMs, d.resetMs, null, null, 'redis');
  }

  /** Held units of the batched rules' targets, spent while Redis is away; null when none is held. */
  private fromHeld(targets: Target[]): Decision | null {
    for (const t of targets) {
      const st = this.grantStates.get(t.stateKey);
      if (st !== undefined && st.held > 0) {
        st.count(performance.now());
        return this.takeHeld(st);
      }
    }
    return null;
  }

  private takeHeld(st: GrantState): Decision {
    st.held -= 1;
    if (st.held === 0) {
      clearTimeout(st.timer);
      st.timer = undefined;
    }
    return new Decision(true, limitOfSpec(st.spec), st.held, 0, st.last?.resetMs ?? 0, null, null, 'grant');
  }

  /** Denied without a call: the instance may not ask again yet (or the grant it waited for ran out). */
  private grantDenial(st: GrantState, now: number): Decision {
    const last = st.last;
    const never = last !== null && !last.allowed && last.waitMs < 0;
    const wait = never ? -1 : Math.max(1, Math.ceil(st.nextAskAt - now));
    return new Decision(false, limitOfSpec(st.spec), 0, wait, last?.resetMs ?? 0, null, null, 'grant');
  }

  /** Units held past holdMs go back: the timer of the last grant. */
  private armRefund(st: GrantState, g: GrantConfig): void {
    clearTimeout(st.timer);
    st.timer = setTimeout(() => {
      st.timer = undefined;
      if (st.held > 0) void this.refundHeld(st);
    }, g.holdMs);
    st.timer.unref?.();
  }

  /** `REFUND held`: one call, never retried (a lost one only under-admits). */
  private refundHeld(st: GrantState): Promise<unknown> {
    const n = st.held;
    st.held = 0;
    clearTimeout(st.timer);
    st.timer = undefined;
    if (n === 0) return Promise.resolve();
    return this.client.limit(st.key, st.spec, Request.refund(n)).catch(() => {});
  }

  /** A denial of `rule` answered without asking the server: a policy's is counted by the protection loop. */
  private deniedLocally(rule: CheckedRule): void {
    if (this.protection !== undefined && 'policy' in rule.kind) this.protection.recordDenied(rule.kind.policy);
  }

  /**
   * Sends Redis the units the fallback admitted for these keys while no
   * call was sent (the breaker open, an error reply), as `COST n FORCE`,
   * before the request's own call, so that Redis counts them. Sent once,
   * never retried (a lost one may have been applied; the account is
   * charged with them either way).
   */
  private async settle(rules: readonly CheckedRule[], keys: string[], localIdx: number[], localLimits: Limits, accountIdx: number[], accountLimits: Limits): Promise<void> {
    if (this.fallbackMode !== 'localOnly') return;
    const owed: Array<[number, bigint]> = [];
    this.local.takeOwed(localLimits).forEach((u, n) => owed.push([localIdx[n] as number, u]));
    this.accounts.takeOwed(accountLimits).forEach((u, n) => owed.push([accountIdx[n] as number, u]));
    for (const [i, units] of owed) {
      if (units === 0n) continue;
      this.counters.add('owed_sent');
      const rule = rules[i] as CheckedRule;
      // At most 2^40 in one call (the bound of COST): more would be a debt beyond any limit anyway.
      const request = Request.force(Number(units < MAX_COST ? units : MAX_COST));
      const key = keys[i] as string;
      const sent = 'policy' in rule.kind ? this.client.hit(rule.kind.policy, key, request) : this.client.limit(key, rule.kind, request);
      await this.timed(beforeDeadline(sent, this.deadlineMs)).catch(() => {
        // not settled: Redis is failing again, and the request's own call will say so
      });
    }
  }

  /**
   * `call`, its round trip observed in `ratelimit_redis_seconds` when
   * metrics are on: answered (admitted, denied, an error reply) or past the
   * deadline; a call that failed on the connection had no round trip.
   */
  private timed<T>(call: Promise<T>): Promise<T> {
    const m = this.metrics;
    if (m === undefined) return call;
    const t0 = performance.now();
    const seen = () => m.redisSeconds((performance.now() - t0) / 1000);
    return call.then(
      (v) => {
        seen();
        return v;
      },
      (err: unknown) => {
        if (classify(err) !== 'unavailable') seen();
        throw err;
      },
    );
  }

  private callRedis(rules: readonly CheckedRule[], keys: string[], cost: number): Promise<Decision> {
    if (rules.length === 1) {
      const rule = rules[0] as CheckedRule;
      const key = keys[0] as string;
      const request = Request.cost(cost);
      return 'policy' in rule.kind ? this.client.hit(rule.kind.policy, key, request) : this.client.limit(key, rule.kind, request);
    }
    return this.client.all(
      rules.map((r, i) => ({ key: keys[i] as string, rule: r.kind })),
      { cost },
    );
  }

  /** One `PING` in the background; the breaker closes when it answers. */
  private probe(): void {
    this.counters.add('probes');
    void startProbe(this.breaker, () => this.client.send(undefined, ['PING']), this.deadlineMs).then((closed) => {
      if (closed) {
        this.counters.add('probes_ok');
      }
    });
  }

  /**
   * Decides a request that Redis did not answer. `lost`: the call was sent
   * and may have been applied, so whatever the fallback decides, its units
   * stay charged to the instance's accounts.
   */
  private fallback(rules: readonly CheckedRule[], units: bigint, localLimits: Limits, accountIdx: number[], accountLimits: Limits, taken: Array<[number, Answer]>, lost: boolean): Decision {
    const first = rules[0] as CheckedRule;
    const limit = first.spec === null ? 0 : specLimit(first.spec);
    switch (this.fallbackMode) {
      case 'failOpen':
        return new Decision(true, limit, limit, 0, 0, null, null, 'fallback');
      case 'failClosed': {
        const wait = Math.max(this.breaker.openForMs, 1);
        return new Decision(false, limit, 0, wait, wait, 0, null, 'fallback');
      }
      case 'localOnly': {
        // Global rules were taken by the local level already; the others
        // are taken from their accounts here.
        const t = this.accounts.takeAll(accountLimits, units);
        if (t.ok) {
          if (!lost) {
            // Redis never saw this request: owed to it.
            this.local.oweAll(localLimits, units);
            this.accounts.oweAll(accountLimits, units);
          }
          // The fields of the account that admitted with the least left,
          // as RL.ALL answers the most restrictive.
          let tightest: [number, Answer] | undefined;
          for (const pair of [...taken, ...t.answers.map((a, n): [number, Answer] => [accountIdx[n] as number, a])]) {
            if (tightest === undefined || pair[1].remaining < tightest[1].remaining) tightest = pair;
          }
          if (tightest === undefined) {
            // No rule the kit can count in process (a policy it could not read).
            return new Decision(true, limit, limit, 0, 0, null, null, 'fallback');
          }
          const [i, a] = tightest;
          return fromAnswer(a, 'fallback', limitOf(rules[i] as CheckedRule, a), {});
        }
        if (lost) this.accounts.chargeAll(accountLimits, units);
        const i = accountIdx[t.pos] as number;
        return fromAnswer(t.answer, 'fallback', limitOf(rules[i] as CheckedRule, t.answer), { remaining: 0, deniedBy: i });
      }
    }
  }
}

/** Why a call failed: no answer within the deadline, the connection, or an error reply (nothing applied). */
function classify(err: unknown): 'timeout' | 'unavailable' | 'error' {
  if (err instanceof TimeoutError) return 'timeout';
  if (err instanceof RLConnectionError) return 'unavailable';
  if (err instanceof RLError || isServerReply(err)) return 'error';
  // The clients' own: a socket closed, a connection refused, a command timeout.
  return 'unavailable';
}

/** A spec's limit: its capacity or units per window. */
function specLimit(spec: Spec): number {
  return 'capacity' in spec ? spec.capacity : spec.limit;
}

function limitOf(rule: CheckedRule, a: Answer): number {
  return rule.spec === null ? Number(a.limit) : specLimit(rule.spec);
}

function fromAnswer(a: Answer, path: Path, limit: number, over: { remaining?: number; deniedBy?: number }): Decision {
  return new Decision(a.allowed, limit, over.remaining ?? Number(a.remaining), Number(a.waitMs), Number(a.resetMs), over.deniedBy ?? null, null, path);
}

function withFields(d: Decision, over: { deniedBy: number }): Decision {
  return new Decision(d.allowed, d.limit, d.remaining, d.waitMs, d.resetMs, over.deniedBy, d.lease, d.path);
}

const NAMES: Record<string, string[]> = {
  TOKENBUCKET: ['capacity', 'refillCount', 'refillMs'],
  LEAKYBUCKET: ['capacity', 'leakCount', 'leakMs'],
  SLIDING: ['limit', 'windowMs'],
  HASHWINDOW: ['limit', 'windowMs', 'bucketMs'],
  FIXEDWINDOW: ['limit', 'windowMs'],
  CONCURRENCY: ['limit', 'leaseMs'],
};

/** The spec of what `RL.POLICY GET` answered, or null when it cannot be read. */
export function specOfPolicy(info: Record<string, unknown>): Spec | null {
  const word = String(info['algorithm'] ?? '').toUpperCase();
  const params = info['params'];
  if (!Array.isArray(params)) return null;
  let spec: Record<string, unknown>;
  if (word === 'QUOTA') {
    spec = { algorithm: 'quota', limit: Number(params[0]), period: String(params[1]).toLowerCase() as Period };
    const zone = info['zone'] === undefined ? 'UTC' : String(info['zone']);
    if (!/^utc$/i.test(zone)) spec['zone'] = zone;
  } else {
    const names = NAMES[word];
    if (names === undefined || names.length !== params.length) return null;
    spec = { algorithm: word.toLowerCase() };
    names.forEach((n, i) => (spec[n] = Number(params[i])));
  }
  try {
    ruleArgs(spec as unknown as Spec);
    return spec as unknown as Spec;
  } catch {
    return null;
  }
}

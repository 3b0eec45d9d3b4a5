/**
 * The kit's Prometheus metrics (SPEC "Observability in every kit", the
 * contract's `observability.metrics`), in prom-client, an optional peer
 * loaded only when metrics are asked for: the same names, types, labels and
 * buckets as every kit.
 */
import { describe, InvalidArgumentError } from './errors.js';
import { requirePeer } from './peer.js';

/** The level that took a decision (the contract's `observability.levels`). */
export type Level = 'local' | 'redis' | 'deny_cache' | 'grant' | 'fallback';
/** A decision's outcome (the contract's `observability.outcomes`). */
export type Outcome = 'admitted' | 'denied' | 'shadow_denied';

export const LEVELS: readonly Level[] = Object.freeze(['local', 'redis', 'deny_cache', 'grant', 'fallback']);
export const OUTCOMES: readonly Outcome[] = Object.freeze(['admitted', 'denied', 'shadow_denied']);

/** `ratelimit_redis_seconds`'s buckets (the contract's `redis_seconds_buckets`). */
export const REDIS_SECONDS_BUCKETS: readonly number[] = Object.freeze([0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0]);

/** Each metric as a scrape shows it: name, type, labels and help (the contract's `observability.metrics`). */
export const METRICS = Object.freeze([
  { name: 'ratelimit_decisions_total', type: 'counter', labels: ['rule', 'level', 'outcome'], help: 'Decisions taken, by rule, by the level that took them and by outcome' },
  { name: 'ratelimit_redis_seconds', type: 'histogram', labels: [], help: 'Round trips of limiter commands to Redis, in seconds' },
  { name: 'ratelimit_remaining_ratio', type: 'gauge', labels: ['rule'], help: "remaining / limit of the rule's last decision taken by Redis or the local level (0: at the limit)" },
  { name: 'ratelimit_breaker_open', type: 'gauge', labels: ['breaker'], help: '1 while the breaker is open (Redis skipped, or a protected stage broken), else 0' },
  { name: 'ratelimit_scale', type: 'gauge', labels: ['rule'], help: "The protection loop's scale of the rule's policy, in percent" },
  { name: 'ratelimit_stage', type: 'gauge', labels: ['rule'], help: "The protection loop's stage of the rule's policy: 0 normal, 1 degrade, 2 break" },
  { name: 'ratelimit_deny_events_dropped_total', type: 'counter', labels: [], help: 'Deny events lost: the oldest dropped from a full buffer, and every event of a batch its sink refused' },
  { name: 'ratelimit_deny_events_shipped_total', type: 'counter', labels: [], help: 'Deny events a sink accepted' },
  { name: 'ratelimit_deny_events_sink_errors_total', type: 'counter', labels: [], help: 'Flushes a sink refused or failed (an error, a timeout, an HTTP status other than 2xx, a _bulk reply with errors)' },
] as const);

/** The `breaker` label of a `Limiter`'s own breaker (the one that skips Redis). */
export const REDIS_BREAKER = 'redis';

/**
 * What this kit needs of a prom-client `Registry` (any version from 13 on):
 * written structurally, so that the kit's types do not need prom-client.
 */
export interface PromRegistry {
  registerMetric(metric: never): void;
  getSingleMetric(name: string): unknown;
  metrics(): Promise<string> | string;
  readonly contentType: string;
}

/** Where the `metrics` option of a `Limiter`, a `Protection`, `DenyEvents` or the middleware sends its metrics. */
export type MetricsOption = boolean | PromRegistry | RateLimitMetrics;

interface Counter {
  inc(labels: Record<string, string>, value?: number): void;
  inc(value?: number): void;
}
interface Gauge {
  set(labels: Record<string, string>, value: number): void;
}
interface Histogram {
  observe(value: number): void;
}
interface PromClient {
  register: PromRegistry;
  Counter: new (config: object) => Counter;
  Gauge: new (config: object) => Gauge;
  Histogram: new (config: object) => Histogram;
}

let prom: PromClient | undefined;

function promClient(): PromClient {
  if (prom === undefined) {
    const m = requirePeer('prom-client') as Partial<PromClient> | undefined;
    if (m === undefined || typeof m.Counter !== 'function' || typeof m.Gauge !== 'function' || typeof m.Histogram !== 'function' || m.register === undefined) {
      throw new InvalidArgumentError('metrics', 'metrics need prom-client (an optional peer dependency of redis-ratelimit): npm install prom-client');
    }
    prom = m as PromClient;
  }
  return prom;
}

/**
 * Where a registry keeps its set: a property under a global symbol, so that
 * the ESM and CommonJS builds of this package, loaded side by side (each its
 * own class), find the one set of a registry instead of registering the
 * metrics twice. Versioned by the set's methods: bump on a change to them.
 */
const SET_KEY = Symbol.for('redis-ratelimit.metrics.v1');

/** A breaker the scrape reads: weakly held, gone with its owner. */
interface WatchedBreaker {
  readonly ref: WeakRef<object>;
  readonly isOpen: (owner: object) => boolean;
}

const LEVEL_INDEX: Record<Level, number> = { local: 0, redis: 1, deny_cache: 2, grant: 3, fallback: 4 };
const OUTCOME_INDEX: Record<Outcome, number> = { admitted: 0, denied: 1, shadow_denied: 2 };
const CELLS = LEVELS.length * OUTCOMES.length;

/**
 * The metrics of one prom-client registry: one set per registry, shared by
 * every `Limiter`, `Protection` and `DenyEvents` given it (a metric the
 * registry already has under the same name is reused). Get it with
 * `RateLimitMetrics.of(registry)` (prom-client's global `register` by
 * default), or pass `metrics: registry` (or `true`) to the kit's classes.
 */
export class RateLimitMetrics {
  readonly registry: PromRegistry;
  private readonly decisions: Counter;
  private readonly redis: Histogram;
  private readonly remaining: Gauge;
  private readonly breakers: Gauge;
  private readonly scales: Gauge;
  private readonly stages: Gauge;
  private readonly dropped: Counter;
  private readonly shipped: Counter;
  private readonly sinkErrors: Counter;
  /**
   * The hot path's counts, per rule: [level x outcome] (a Map lookup and an
   * increment per decision, no label hashing), handed to prom-client at
   * each scrape (its metrics' collect()).
   */
  private readonly counts = new Map<string, number[]>();
  private readonly published = new Map<string, number[]>();
  /** Each rule's last remaining ratio, set at each scrape. */
  private readonly ratios = new Map<string, number>();

  /** The one set of metrics of `registry` (default: prom-client's global `register`). */
  static of(registry?: PromRegistry): RateLimitMetrics {
    const reg = registry ?? promClient().register;
    if (reg === null || typeof reg !== 'object' || typeof reg.registerMetric !== 'function' || typeof reg.getSingleMetric !== 'function') {
      throw new InvalidArgumentError('metrics', `metrics must be true, a prom-client Registry or RateLimitMetrics, got ${describe(registry)}`);
    }
    const held = (reg as unknown as Record<symbol, RateLimitMetrics | undefined>)[SET_KEY];
    if (held !== undefined) return held;
    const m = new RateLimitMetrics(reg);
    Object.defineProperty(reg, SET_KEY, { value: m, enumerable: false, configurable: true, writable: false });
    return m;
  }

  private constructor(registry: PromRegistry) {
    this.registry = registry;
    const p = promClient();
    const make = <T>(i: number, Kind: new (config: object) => T, extra: object = {}): T => {
      const spec = METRICS[i] as (typeof METRICS)[number];
      if (registry.getSingleMetric(spec.name) !== undefined) {
        throw new InvalidArgumentError('metrics', `the registry has a metric ${spec.name} already (registered by another copy of redis-ratelimit?): give each its own Registry`);
      }
      return new Kind({ name: spec.name, help: spec.help, labelNames: [...spec.labels], registers: [registry], ...extra });
    };
    this.decisions = make(0, p.Counter, { collect: () => this.publishDecisions() });
    this.redis = make(1, p.Histogram, { buckets: [...REDIS_SECONDS_BUCKETS] });
    this.remaining = make(2, p.Gauge, { collect: () => this.publishRatios() });
    this.breakers = make(3, p.Gauge, { collect: () => this.publishBreakers() });
    this.scales = make(4, p.Gauge);
    this.stages = make(5, p.Gauge);
    this.dropped = make(6, p.Counter, { collect: () => this.publishDropped() });
    this.shipped = make(7, p.Counter);
    this.sinkErrors = make(8, p.Counter);
  }

  /** One decision of `rule` taken at `level`. */
  decision(rule: string, level: Level, outcome: Outcome): void {
    let c = this.counts.get(rule);
    if (c === undefined) {
      c = new Array<number>(CELLS).fill(0);
      this.counts.set(rule, c);
      this.published.set(rule, new Array<number>(CELLS).fill(0));
    }
    (c[LEVEL_INDEX[level] * OUTCOMES.length + OUTCOME_INDEX[outcome]] as number)++;
  }

  /** What was counted since the last scrape, into the counter. */
  private publishDecisions(): void {
    for (const [rule, c] of this.counts) {
      const pub = this.published.get(rule) as number[];
      for (let i = 0; i < CELLS; i++) {
        const delta = (c[i] as number) - (pub[i] as number);
        if (delta > 0) {
          this.decisions.inc({ rule, level: LEVELS[Math.floor(i / OUTCOMES.length)] as string, outcome: OUTCOMES[i % OUTCOMES.length] as string }, delta);
          pub[i] = c[i] as number;
        }
      }
    }
  }

  private publishRatios(): void {
    for (const [rule, r] of this.ratios) this.remaining.set({ rule }, r);
  }

  /** One round trip of a limiter command, in seconds. */
  redisSeconds(seconds: number): void {
    this.redis.observe(seconds);
  }

  /** `remaining / limit` of `rule`'s last decision by Redis or the local level. */
  remainingRatio(rule: string, remaining: number, limit: number): void {
    if (limit > 0) this.ratios.set(rule, Math.min(Math.max(remaining / limit, 0), 1));
  }

  /**
   * `ratelimit_breaker_open{breaker}`: 1 while any breaker of that name is
   * open, read at each scrape. Each `Limiter`, store and `Protection`
   * breaker is watched here (`watchBreaker`), held weakly; several of one
   * name on one registry (two limiters' `redis`) do not overwrite each other.
   */
  private readonly watched = new Map<string, WatchedBreaker[]>();
  /** States set with `breakerOpen`, per name (a breaker the kit does not hold). */
  private readonly pushed = new Map<string, boolean>();

  /** Reports `breaker` open or closed (OR'd with the breakers of that name watched). */
  breakerOpen(breaker: string, open: boolean): void {
    this.pushed.set(breaker, open);
  }

  /**
   * Reads `isOpen(owner)` at each scrape, as long as `owner` lives: the
   * gauge of `breaker` is 1 while any of its breakers is open.
   */
  watchBreaker<T extends object>(breaker: string, owner: T, isOpen: (owner: T) => boolean): void {
    let list = this.watched.get(breaker);
    if (list === undefined) {
      list = [];
      this.watched.set(breaker, list);
    }
    if (list.some((w) => w.ref.deref() === owner)) return;
    list.push({ ref: new WeakRef(owner), isOpen: isOpen as (owner: object) => boolean });
  }

  private publishBreakers(): void {
    const names = new Set([...this.watched.keys(), ...this.pushed.keys()]);
    for (const breaker of names) {
      let open = this.pushed.get(breaker) === true;
      const list = this.watched.get(breaker);
      if (list !== undefined) {
        let live = 0;
        for (const w of list) {
          const owner = w.ref.deref();
          if (owner === undefined) continue;
          list[live++] = w;
          // A throwing reader would fail the application's whole scrape.
          try {
            if (!open && w.isOpen(owner)) open = true;
          } catch {
            // counted as closed
          }
        }
        list.length = live;
      }
      this.breakers.set({ breaker }, open ? 1 : 0);
    }
  }

  scale(rule: string, percent: number): void {
    this.scales.set({ rule }, percent);
  }

  stage(rule: string, stage: number): void {
    this.stages.set({ rule }, stage);
  }

  eventsDropped(n: number): void {
    // A flood drops one per denial: counted here, handed over at the scrape.
    this.droppedSince += n;
  }

  private droppedSince = 0;

  private publishDropped(): void {
    if (this.droppedSince > 0) this.dropped.inc(this.droppedSince);
    this.droppedSince = 0;
  }

  eventsShipped(n: number): void {
    if (n > 0) this.shipped.inc(n);
  }

  sinkError(): void {
    this.sinkErrors.inc();
  }
}

/** The `metrics` option: undefined when off (false or not given). */
export function resolveMetrics(option: unknown): RateLimitMetrics | undefined {
  if (option === undefined || option === false) return undefined;
  if (option instanceof RateLimitMetrics) return option;
  // The other build's (ESM and CommonJS loaded side by side): its registry's set.
  const other = option as { decision?: unknown; registry?: unknown };
  if (option !== null && typeof option === 'object' && typeof other.decision === 'function' && other.registry !== undefined) return option as RateLimitMetrics;
  if (option === true) return RateLimitMetrics.of();
  if (option === null || typeof option !== 'object') {
    throw new InvalidArgumentError('metrics', `metrics must be true, a prom-client Registry or RateLimitMetrics, got ${describe(option)}`);
  }
  return RateLimitMetrics.of(option as PromRegistry);
}

/**
 * What decides when Redis cannot: the fallback mode, the circuit breaker
 * that spares a dead Redis a deadline per request, and the counters of
 * every path (as the Rust kit's fallback.rs).
 */
import { checkInteger, describe, InvalidArgumentError } from './errors.js';

/**
 * What decides a request when Redis errors, misses its deadline, or the
 * breaker is open:
 * - `'failOpen'`: admit (availability over protection; no bound on what is
 *   admitted meanwhile);
 * - `'failClosed'`: deny, `waitMs` the breaker's open time (protection over
 *   availability: login attempts, paid APIs);
 * - `'localOnly'` (the default): every rule in process against this
 *   instance's account at its share of the limit, `ceil(limit / instances
 *   x 1.1)`. The account is charged with every unit Redis admitted for this
 *   instance and every unit of a call whose answer was lost, so one
 *   instance admits at most `max(limit, share)` per window of a key, N
 *   instances at most `limit + (N - 1) x share`.
 */
export type FallbackMode = 'failOpen' | 'failClosed' | 'localOnly';

export const FALLBACK_MODES: readonly FallbackMode[] = Object.freeze(['failOpen', 'failClosed', 'localOnly']);

export function checkFallbackMode(mode: unknown): FallbackMode {
  if (typeof mode !== 'string' || !(FALLBACK_MODES as readonly string[]).includes(mode)) {
    throw new InvalidArgumentError('fallback', `fallback must be 'failOpen', 'failClosed' or 'localOnly', got ${describe(mode)}`);
  }
  return mode as FallbackMode;
}

/** When the breaker opens, and how long it stays open before one probe. */
export interface BreakerOptions {
  /** Consecutive failures (timeouts, lost connections) that open it (default 5). */
  failures?: number;
  /** How long it stays open before one `PING` probes Redis, in ms (default 1,000). */
  openForMs?: number;
}

/** What the breaker lets a request do: call Redis, skip it (open), or skip it and start the probe. */
export type Gate = 'call' | 'skip' | 'probe';

type BreakerState = { kind: 'closed'; failures: number } | { kind: 'open'; until: number } | { kind: 'halfOpen' };

/**
 * Closed, it counts consecutive failures and opens at `failures`; open, the
 * fallback decides without a call; after `openForMs` the next request
 * starts one probe (half-open); the probe's answer closes it, its failure
 * opens it again. A call sent before it opened that answers late does not
 * close it: only the probe does.
 */
export class Breaker {
  readonly failures: number;
  readonly openForMs: number;
  private state: BreakerState = { kind: 'closed', failures: 0 };

  constructor(options: BreakerOptions = {}) {
    if (options === null || typeof options !== 'object') {
      throw new InvalidArgumentError('breaker', `breaker must be { failures, openForMs }, got ${describe(options)}`);
    }
    this.failures = checkInteger('failures', options.failures ?? 5, 1);
    this.openForMs = checkInteger('openForMs', options.openForMs ?? 1000, 1);
  }

  gate(now = performance.now()): Gate {
    const s = this.state;
    if (s.kind === 'closed') return 'call';
    if (s.kind === 'open' && now >= s.until) {
      this.state = { kind: 'halfOpen' };
      return 'probe';
    }
    return 'skip';
  }

  /** A call answered: the count of consecutive failures starts again. */
  success(): void {
    if (this.state.kind === 'closed') this.state = { kind: 'closed', failures: 0 };
  }

  /** The probe answered: closed. */
  probeSucceeded(): void {
    this.state = { kind: 'closed', failures: 0 };
  }

  /** Redis failed; true when this failure opened the breaker. */
  failure(now = performance.now()): boolean {
    const s = this.state;
    const open: BreakerState = { kind: 'open', until: now + this.openForMs };
    if (s.kind === 'closed') {
      if (s.failures + 1 >= this.failures) {
        this.state = open;
        return true;
      }
      this.state = { kind: 'closed', failures: s.failures + 1 };
      return false;
    }
    if (s.kind === 'halfOpen') this.state = open;
    return false;
  }

  /** Open, or half-open (probing). */
  get isOpen(): boolean {
    return this.state.kind !== 'closed';
  }
}

/**
 * The counters of every path a decision can take, under the Rust kit's
 * names (`StatsSnapshot::pairs`), in its order.
 */
export const STAT_NAMES = Object.freeze([
  /** Limiter calls sent to Redis (probes excluded). */
  'redis_calls',
  /** Of those, answered admitted. */
  'redis_admitted',
  /** Of those, answered denied. */
  'redis_denied',
  /** Of those, answered with a server error (e.g. `WRONGTYPE`). */
  'redis_errors',
  /** Of those, not answered within the deadline. */
  'redis_timeouts',
  /** Of those, failed on the connection. */
  'redis_unavailable',
  /** Requests denied by the local level, without a round trip. */
  'local_denied',
  /** Requests denied by the deny cache, without a round trip. */
  'deny_cache_hits',
  /** Requests the fallback admitted. */
  'fallback_admitted',
  /** Owed units sent to Redis (`COST n FORCE`): what the fallback admitted for a key without a call, sent before its next call. */
  'owed_sent',
  /** Requests the fallback denied. */
  'fallback_denied',
  /** Requests decided by the fallback because the breaker was open (no call). */
  'breaker_skipped',
  /** Times the breaker opened. */
  'breaker_opened',
  /** Probes sent while it was open. */
  'probes',
  /** Probes answered (the breaker closed). */
  'probes_ok',
  /** Requests without a key. */
  'key_missing',
  /** Requests whose key function threw. */
  'key_panics',
] as const);

export type StatName = (typeof STAT_NAMES)[number];

/** A reading of the counters: each name to its count. */
export type StatsSnapshot = Readonly<Record<StatName, number>>;

export class Stats {
  private readonly counts = new Map<StatName, number>(STAT_NAMES.map((n) => [n, 0]));

  add(name: StatName, n = 1): void {
    this.counts.set(name, (this.counts.get(name) ?? 0) + n);
  }

  snapshot(): StatsSnapshot {
    return Object.freeze(Object.fromEntries(STAT_NAMES.map((n) => [n, this.counts.get(n) ?? 0]))) as StatsSnapshot;
  }

  /** `[name, value]` pairs in the Rust kit's order (for an exporter). */
  pairs(): Array<[StatName, number]> {
    return STAT_NAMES.map((n) => [n, this.counts.get(n) ?? 0]);
  }
}

/**
 * Starts the breaker's probe: one call (a `PING`) in the background within
 * `deadlineMs`; its answer closes the breaker, its failure opens it again.
 * Resolves true when it closed it.
 */
export function startProbe(breaker: Breaker, ping: () => Promise<unknown>, deadlineMs: number): Promise<boolean> {
  let timer: ReturnType<typeof setTimeout> | undefined;
  const late = new Promise<never>((_, reject) => {
    timer = setTimeout(() => reject(new Error(`no answer within ${deadlineMs} ms`)), deadlineMs);
  });
  const call = ping();
  call.catch(() => {});
  return Promise.race([call, late])
    .then(
      () => {
        breaker.probeSucceeded();
        return true;
      },
      () => {
        breaker.failure();
        return false;
      },
    )
    .finally(() => clearTimeout(timer));
}

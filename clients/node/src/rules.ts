import { checkInteger, checkString, InvalidArgumentError, describe } from './errors.js';

/**
 * An algorithm and its parameters: what the Rust and Java kits call `Spec`,
 * spelled in JavaScript's case; durations are milliseconds.
 */
export type Spec =
  | { algorithm: 'tokenbucket'; capacity: number; refillCount: number; refillMs: number }
  | { algorithm: 'leakybucket'; capacity: number; leakCount: number; leakMs: number }
  | { algorithm: 'sliding'; limit: number; windowMs: number }
  | { algorithm: 'hashwindow'; limit: number; windowMs: number; bucketMs: number }
  | { algorithm: 'fixedwindow'; limit: number; windowMs: number }
  | { algorithm: 'concurrency'; limit: number; leaseMs: number }
  | ({ algorithm: 'quota' } & QuotaParams);

/** A calendar quota's period: a day, an ISO week (from Monday), a month, a year. */
export type Period = 'day' | 'week' | 'month' | 'year';

/**
 * `RL.QUOTA`'s parameters: at most `limit` units per calendar `period` in
 * `zone`: `'UTC'` (the default), a fixed offset (`'+05:30'`, -18:00 to +18:00) or
 * an IANA name (`'America/New_York'`). A quota in another zone than UTC goes
 * in its own call or in a policy (`rl.policySet`, sent with `TZ zone`, which
 * `rl.hit` and `rl.all`'s `{ policy }` count in); an inline rule of `rl.all`
 * counts in UTC only.
 */
export interface QuotaParams {
  limit: number;
  period: Period;
  zone?: string;
}

/** The nominal length of a period in seconds (a month 30 days, a year 365): what `RateLimit-Policy`'s `w` says of a quota. */
export const PERIOD_SECONDS: Readonly<Record<Period, number>> = Object.freeze({ day: 86_400, week: 604_800, month: 2_592_000, year: 31_536_000 });

const ZONE_HELP = 'zone must be UTC, a fixed offset such as +05:30, or a time zone name such as America/New_York';

/** The period word the server takes (`DAY`...), checked; any case is accepted. */
export function checkPeriod(period: unknown, where = 'period'): string {
  const p = typeof period === 'string' ? period.toLowerCase() : undefined;
  if (p === undefined || !Object.prototype.hasOwnProperty.call(PERIOD_SECONDS, p)) {
    throw new InvalidArgumentError(where, `${where} must be 'day', 'week', 'month' or 'year', got ${describe(period)}`);
  }
  return p.toUpperCase();
}

/**
 * A zone, checked for its form: `undefined` for UTC (`'UTC'`, `'Z'` in any
 * case, or none), else the zone as given. Whether the server's database
 * knows a name is for the server to say (`InvalidArgumentError` naming TZ).
 */
export function checkZone(zone: unknown, where = 'zone'): string | undefined {
  if (zone === undefined || zone === null) return undefined;
  if (typeof zone !== 'string') throw new InvalidArgumentError(where, `${ZONE_HELP}, got ${describe(zone)}`);
  if (/^(utc|z)$/i.test(zone)) return undefined;
  const offset = /^[+-](\d{2}):(\d{2})$/.exec(zone);
  if (offset) {
    if (Number(offset[2]) > 59 || Number(offset[1]) * 60 + Number(offset[2]) > 18 * 60) throw new InvalidArgumentError(where, `${ZONE_HELP}, got ${JSON.stringify(zone)}`);
    return zone;
  }
  if (zone.length > 64 || zone.includes('..') || !/^[A-Za-z][A-Za-z0-9_+-]*(\/[A-Za-z0-9_+-]+)*$/.test(zone)) {
    throw new InvalidArgumentError(where, `${ZONE_HELP}, got ${JSON.stringify(zone)}`);
  }
  return zone;
}

/** `RL.CONCURRENCY`'s parameters: at most `limit` units held, each lease for `leaseMs` unless renewed. */
export interface ConcurrencyParams {
  limit: number;
  leaseMs: number;
}

/** A spec, or a policy kept in the server by name (`acquire`, `RL.ALL`). */
export type SpecOrPolicy = Spec | { policy: string };

/**
 * @deprecated use `Spec` (the same type). The kit has no named rule with a
 * key scope, which the Rust and Java kits call `Rule`; this name is kept for
 * one release.
 */
export type Rule = Spec;

/**
 * What a call asks of the limiter: take `n` units (`COST n`; 0 inspects
 * without consuming), take them even when denied, leaving the limiter in debt
 * (`COST n FORCE`), or give `n` back (`REFUND n`). One of the three, so a
 * forced refund cannot be written; build one with `Request.cost(n)`,
 * `Request.force(n)`, `Request.refund(n)` (checked there, naming `cost` or
 * `refund`).
 */
export type Request =
  | { readonly kind: 'cost'; readonly n: number }
  | { readonly kind: 'force'; readonly n: number }
  | { readonly kind: 'refund'; readonly n: number }
  | { readonly kind: 'upto'; readonly n: number };

export const Request = Object.freeze({
  /** `COST n`: take `n` units if the limiter admits them (0 inspects). */
  cost: (n: number): Request => Object.freeze({ kind: 'cost' as const, n: checkInteger('cost', n, 0) }),
  /** `COST n FORCE`: take `n` units even when denied. */
  force: (n: number): Request => Object.freeze({ kind: 'force' as const, n: checkInteger('cost', n, 0) }),
  /** `REFUND n`: give back up to `n` units. */
  refund: (n: number): Request => Object.freeze({ kind: 'refund' as const, n: checkInteger('refund', n, 0) }),
  /**
   * `UPTO n` (1 to 2^40): take as many units as the limiter admits now, at
   * most `n`, at least 1; the decision's `granted` says how many (0 on a
   * denial, which is the denial `COST 1` gets). Not an option of the leaky
   * bucket nor of the concurrency limiter (refused naming `UPTO`).
   */
  upto: (n: number): Request => Object.freeze({ kind: 'upto' as const, n: checkInteger('UPTO', n, 1, MAX_PARAM) }),
});

/** Whether `opts` is `Request.upto(n)`: its reply carries `granted`. */
export function isUpto(opts: unknown): boolean {
  return opts !== null && typeof opts === 'object' && (opts as { kind?: unknown }).kind === 'upto';
}

/** The algorithms that take no `UPTO`, refused before anything is sent with the server's words. */
export function checkUptoAlgorithm(word: string): void {
  if (word === 'LEAKYBUCKET' || word === 'CONCURRENCY') {
    throw new InvalidArgumentError('UPTO', `UPTO is not an option of RL.${word}`);
  }
}

/**
 * @deprecated pass a `Request` (`Request.cost(n)`, `Request.force(n)`,
 * `Request.refund(n)`) instead; these options stay for one release.
 */
export interface CallOptions {
  /** Units this request takes (default 1; 0 inspects without consuming). */
  cost?: number;
  /** With `cost`: consume even when denied, leaving the limiter in debt. */
  force?: boolean;
  /** Gives back this many units instead of taking any. */
  refund?: number;
}

/** The bound of every parameter, 2^40, as the server's. */
export const MAX_PARAM = 2 ** 40;
/** The most a limiter may take to get back to idle, 2^50 ms, as the server's. */
export const MAX_SPAN_MS = 2 ** 50;
/** The limit of a sliding log or a concurrency limiter, which keep an entry per unit: 2^24 - 1. */
export const MAX_HELD = 2 ** 24 - 1;
/** The most buckets a hash window has (`windowMs / bucketMs`). */
export const MAX_BUCKETS = 1_000_000;

/**
 * Refuses a bucket that would take more than `MAX_SPAN_MS` to get back to
 * idle (`capacity * ms / count`, exactly), naming `span`.
 */
function checkSpan(capacity: number, count: number, ms: number, what: string): void {
  if (BigInt(capacity) * BigInt(ms) > BigInt(MAX_SPAN_MS) * BigInt(count)) {
    throw new InvalidArgumentError('span', `the span of this rule, ${what}, is too long: a limiter may take at most ${MAX_SPAN_MS} ms to get back to idle`);
  }
}

/**
 * The command name and parameters of a rule (without the key), checked as
 * the server checks them: each parameter an integer from 1 to 2^40 (a sliding
 * log's and a concurrency limiter's `limit` to 2^24 - 1); a hash window's
 * `bucketMs` dividing `windowMs` into at most a million buckets; a bucket
 * back to idle within 2^50 ms (refused naming `span`).
 */
export function ruleArgs(rule: Spec, where = 'rule'): [string, string[]] {
  if (rule === null || typeof rule !== 'object') {
    throw new InvalidArgumentError(where, `${where} must be an object with an algorithm, got ${describe(rule)}`);
  }
  const r = rule as unknown as Record<string, unknown>;
  const n = (name: string, max = MAX_PARAM) => checkInteger(name, r[name], 1, max);
  switch (rule.algorithm) {
    case 'tokenbucket': {
      const [capacity, count, ms] = [n('capacity'), n('refillCount'), n('refillMs')];
      checkSpan(capacity, count, ms, 'capacity * refillMs / refillCount (the time to fill the bucket)');
      return ['TOKENBUCKET', [capacity, count, ms].map(String)];
    }
    case 'leakybucket': {
      const [capacity, count, ms] = [n('capacity'), n('leakCount'), n('leakMs')];
      checkSpan(capacity, count, ms, 'capacity * leakMs / leakCount (the time to drain a full queue)');
      return ['LEAKYBUCKET', [capacity, count, ms].map(String)];
    }
    case 'sliding':
      return ['SLIDING', [n('limit', MAX_HELD), n('windowMs')].map(String)];
    case 'hashwindow': {
      const [limit, windowMs, bucketMs] = [n('limit'), n('windowMs'), n('bucketMs')];
      if (windowMs % bucketMs !== 0) {
        throw new InvalidArgumentError('bucketMs', `bucketMs must divide windowMs, got windowMs ${windowMs} and bucketMs ${bucketMs}`);
      }
      if (windowMs / bucketMs > MAX_BUCKETS) {
        throw new InvalidArgumentError(
          'windowMs / bucketMs',
          `windowMs / bucketMs must be an integer from 1 to ${MAX_BUCKETS}, got ${windowMs / bucketMs}`,
        );
      }
      return ['HASHWINDOW', [limit, windowMs, bucketMs].map(String)];
    }
    case 'fixedwindow':
      return ['FIXEDWINDOW', [n('limit'), n('windowMs')].map(String)];
    case 'concurrency':
      return ['CONCURRENCY', [n('limit', MAX_HELD), n('leaseMs')].map(String)];
    case 'quota': {
      const limit = String(n('limit'));
      const period = checkPeriod(rule.period);
      const zone = checkZone(rule.zone);
      return ['QUOTA', zone === undefined ? [limit, period] : [limit, period, 'TZ', zone]];
    }
    default:
      throw new InvalidArgumentError(
        'algorithm',
        `algorithm must be tokenbucket, leakybucket, sliding, hashwindow, fixedwindow, concurrency or quota, got ${describe(
          (rule as { algorithm?: unknown }).algorithm,
        )}`,
      );
  }
}

/** `Request.cost(cost)`, or none when `cost` is not given (the server's default, 1). */
export function costRequest(cost: number | undefined): Request | undefined {
  return cost === undefined ? undefined : Request.cost(cost);
}

/** A request (or the deprecated options of a call), checked, as arguments. */
export function optionArgs(opts: Request | CallOptions = {}): string[] {
  const out: string[] = [];
  if (opts !== null && typeof opts === 'object' && 'kind' in opts) {
    switch (opts.kind) {
      case 'cost':
        return ['COST', String(checkInteger('cost', opts.n, 0))];
      case 'force':
        return ['COST', String(checkInteger('cost', opts.n, 0)), 'FORCE'];
      case 'refund':
        return ['REFUND', String(checkInteger('refund', opts.n, 0))];
      case 'upto':
        return ['UPTO', String(checkInteger('UPTO', opts.n, 1, MAX_PARAM))];
      default:
        throw new InvalidArgumentError('request', `a request is Request.cost(n), Request.force(n), Request.refund(n) or Request.upto(n), got kind ${describe((opts as { kind: unknown }).kind)}`);
    }
  }
  if (opts === null || typeof opts !== 'object') {
    throw new InvalidArgumentError('request', `a request is Request.cost(n), Request.force(n) or Request.refund(n), got ${describe(opts)}`);
  }
  if (opts.refund !== undefined) {
    if (opts.cost !== undefined) throw new InvalidArgumentError('refund', 'refund and cost cannot be given together');
    if (opts.force) throw new InvalidArgumentError('force', 'force goes with cost, not with refund');
    out.push('REFUND', String(checkInteger('refund', opts.refund, 0)));
  } else if (opts.cost !== undefined || opts.force) {
    out.push('COST', String(checkInteger('cost', opts.cost ?? 1, 0)));
    if (opts.force) out.push('FORCE');
  }
  return out;
}

/** `acquire`'s options: a call's cost, and how long the server may hold it. */
export interface AcquireOptions {
  /**
   * How long the server may hold the request before answering the denial
   * (`BLOCK timeout_ms`); 0 waits without a limit.
   */
  timeoutMs: number;
  /** Units this request takes (default 1). */
  cost?: number;
  /**
   * Instead of `cost`: `UPTO n`, as many units as admitted at most `n`,
   * waiting for the first one; the decision's `granted` says how many.
   */
  upto?: number;
  /**
   * Calls the wait off: its connection is closed, so the server forgets the
   * request and nothing is consumed, and the promise rejects with the
   * signal's reason. (After an admission it comes too late: a leaky
   * bucket's wait then still resolves.)
   */
  signal?: AbortSignal;
}

/** The `BLOCK` argument of `timeoutMs`, checked. */
export function blockArgs(timeoutMs: unknown): string[] {
  return ['BLOCK', String(checkInteger('timeoutMs', timeoutMs, 0))];
}

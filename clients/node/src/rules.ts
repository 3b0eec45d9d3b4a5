import { checkInteger, checkString, RLArgumentError, describe } from './errors.js';

/**
 * A limiter rule: an algorithm and its parameters, or a policy kept in the
 * server. The same rules as the Rust kit's `Rule`, spelled in JavaScript's
 * case; durations are milliseconds.
 */
export type Rule =
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
 * `zone`: `'UTC'` (the default), a fixed offset (`'+05:30'`, up to 25:59) or
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
    throw new RLArgumentError(where, `${where} must be 'day', 'week', 'month' or 'year', got ${describe(period)}`);
  }
  return p.toUpperCase();
}

/**
 * A zone, checked for its form: `undefined` for UTC (`'UTC'`, `'Z'` in any
 * case, or none), else the zone as given. Whether the server's database
 * knows a name is for the server to say (`RLArgumentError` naming TZ).
 */
export function checkZone(zone: unknown, where = 'zone'): string | undefined {
  if (zone === undefined || zone === null) return undefined;
  if (typeof zone !== 'string') throw new RLArgumentError(where, `${ZONE_HELP}, got ${describe(zone)}`);
  if (/^(utc|z)$/i.test(zone)) return undefined;
  const offset = /^[+-](\d{2}):(\d{2})$/.exec(zone);
  if (offset) {
    if (Number(offset[1]) > 25 || Number(offset[2]) > 59) throw new RLArgumentError(where, `${ZONE_HELP}, got ${JSON.stringify(zone)}`);
    return zone;
  }
  if (zone.length > 64 || zone.includes('..') || !/^[A-Za-z][A-Za-z0-9_+-]*(\/[A-Za-z0-9_+-]+)*$/.test(zone)) {
    throw new RLArgumentError(where, `${ZONE_HELP}, got ${JSON.stringify(zone)}`);
  }
  return zone;
}

/** `RL.CONCURRENCY`'s parameters: at most `limit` units held, each lease for `leaseMs` unless renewed. */
export interface ConcurrencyParams {
  limit: number;
  leaseMs: number;
}

/** A rule, or a policy by name (for `RL.ALL`). */
export type Spec = Rule | { policy: string };

/** What a call takes besides its rule. */
export interface CallOptions {
  /** Units this request takes (default 1; 0 inspects without consuming). */
  cost?: number;
  /** With `cost`: consume even when denied, leaving the limiter in debt. */
  force?: boolean;
  /** Gives back this many units instead of taking any. */
  refund?: number;
}

/** The command name and parameters of a rule (without the key). */
export function ruleArgs(rule: Rule, where = 'rule'): [string, string[]] {
  if (rule === null || typeof rule !== 'object') {
    throw new RLArgumentError(where, `${where} must be an object with an algorithm, got ${describe(rule)}`);
  }
  const i = (name: string, min = 1) => String(checkInteger(name, (rule as unknown as Record<string, unknown>)[name], min));
  switch (rule.algorithm) {
    case 'tokenbucket':
      return ['TOKENBUCKET', [i('capacity'), i('refillCount'), i('refillMs')]];
    case 'leakybucket':
      return ['LEAKYBUCKET', [i('capacity'), i('leakCount'), i('leakMs')]];
    case 'sliding':
      return ['SLIDING', [i('limit'), i('windowMs')]];
    case 'hashwindow':
      return ['HASHWINDOW', [i('limit'), i('windowMs'), i('bucketMs')]];
    case 'fixedwindow':
      return ['FIXEDWINDOW', [i('limit'), i('windowMs')]];
    case 'concurrency':
      return ['CONCURRENCY', [i('limit'), i('leaseMs')]];
    case 'quota': {
      const limit = i('limit');
      const period = checkPeriod(rule.period);
      const zone = checkZone(rule.zone);
      return ['QUOTA', zone === undefined ? [limit, period] : [limit, period, 'TZ', zone]];
    }
    default:
      throw new RLArgumentError(
        'algorithm',
        `algorithm must be tokenbucket, leakybucket, sliding, hashwindow, fixedwindow, concurrency or quota, got ${describe(
          (rule as { algorithm?: unknown }).algorithm,
        )}`,
      );
  }
}

/** The options of a call, checked, as arguments. */
export function optionArgs(opts: CallOptions = {}): string[] {
  const out: string[] = [];
  if (opts.refund !== undefined) {
    if (opts.cost !== undefined) throw new RLArgumentError('refund', 'refund and cost cannot be given together');
    if (opts.force) throw new RLArgumentError('force', 'force goes with cost, not with refund');
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

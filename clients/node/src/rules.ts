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
  | { algorithm: 'concurrency'; limit: number; leaseMs: number };

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
    default:
      throw new RLArgumentError(
        'algorithm',
        `algorithm must be tokenbucket, leakybucket, sliding, hashwindow, fixedwindow or concurrency, got ${describe(
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

import type { Decision } from './decision.js';
import { PERIOD_SECONDS, ruleArgs, type Period, type Spec } from './rules.js';

/**
 * The HTTP answer of a limiter's decision, as every kit writes it (the
 * contract's header vectors, clients/contract/contract.json): the
 * `RateLimit-Policy` and `RateLimit` items of the IETF rate-limit fields
 * draft, `Retry-After`, and the problem+json body (RFC 9457) of a denial.
 */

/** The problem type of a denial. */
export const QUOTA_EXCEEDED = 'https://iana.org/assignments/http-problem-types#quota-exceeded';

/** The title of a denial's problem. */
export const QUOTA_EXCEEDED_TITLE = 'Request cannot be satisfied as assigned quota has been exceeded';

/**
 * The `w` of `RateLimit-Policy`, in seconds, rounded up: the window for the
 * windows, the time to refill an empty bucket (`capacity * ms / count`) for
 * the buckets, the period's nominal length for a quota (`PERIOD_SECONDS`);
 * null for concurrency, which has no window.
 */
export function policyWindowS(rule: Spec): number | null {
  ruleArgs(rule);
  let ms: bigint;
  switch (rule.algorithm) {
    case 'tokenbucket':
      ms = ceilDiv(BigInt(rule.capacity) * BigInt(rule.refillMs), BigInt(rule.refillCount));
      break;
    case 'leakybucket':
      ms = ceilDiv(BigInt(rule.capacity) * BigInt(rule.leakMs), BigInt(rule.leakCount));
      break;
    case 'sliding':
    case 'hashwindow':
    case 'fixedwindow':
      ms = BigInt(rule.windowMs);
      break;
    case 'quota':
      return PERIOD_SECONDS[rule.period.toLowerCase() as Period];
    case 'concurrency':
      return null;
  }
  return Number(ceilDiv(ms, 1000n));
}

/** A `RateLimit-Policy` item: `"name";q=<limit>;w=<window s>`, without `w` for concurrency. */
export function policyItem(name: string, rule: Spec): string {
  const w = policyWindowS(rule);
  const q = 'capacity' in rule ? rule.capacity : rule.limit;
  return w === null ? `"${name}";q=${q}` : `"${name}";q=${q};w=${w}`;
}

/** The `RateLimit` item of a decision: `"name";r=<remaining>;t=<ceil(resetMs / 1000)>`. */
export function rateLimitItem(name: string, d: Decision): string {
  return `"${name}";r=${d.remaining};t=${Math.ceil(d.resetMs / 1000)}`;
}

/** `Retry-After` in seconds: `ceil(waitMs / 1000)` for a denial; null when admitted or when it never can pass. */
export function retryAfterS(d: Decision): number | null {
  return d.allowed ? null : d.retryAfterS;
}

/**
 * The problem+json body of a denial by the rule `name`, its members in the
 * contract's order (`detail`, `status`, `title`, `type`,
 * `violated-policies`).
 */
export function denialBody(name: string, d: Decision): string {
  const retry = d.retryAfterS;
  const detail = `rate limit ${JSON.stringify(name)} exceeded; ${retry === null ? 'this request can never pass' : `retry after ${retry} s`}`;
  return JSON.stringify({ detail, status: 429, title: QUOTA_EXCEEDED_TITLE, type: QUOTA_EXCEEDED, 'violated-policies': [name] });
}

function ceilDiv(a: bigint, b: bigint): bigint {
  return (a + b - 1n) / b;
}

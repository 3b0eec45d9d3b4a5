/**
 * In-process limiters with the core's algorithms (src/algorithms.ts): the
 * `Limiter`'s local level in front of Redis, and the instance's accounts
 * that its local-only fallback decides against (as the Rust kit's local.rs
 * and the Java kit's `LocalLimiters`). Bounded: past the cap, the limiters
 * back to idle go, then those nearest to idle, a tenth of the cap at a
 * time, so that a full map does not sweep itself at every new key.
 */
import { BY_WORD, decide, run, utcPeriodEnd as utcEnd, type AlgoRequest, type Algorithm, type AlgorithmWord, type Answer, type State } from './algorithms.js';
import { checkInteger, describe, InvalidArgumentError } from './errors.js';
import { ruleArgs, type Spec } from './rules.js';

/**
 * How much of a global limit one instance takes locally: `{ instances: n }`
 * takes `ceil(total / n x 1.1)`, `{ ratio: r }` takes `ceil(total x r)`;
 * either at least 1 and at most the total.
 */
export type Share = { readonly instances: number } | { readonly ratio: number };

export function checkShare(share: unknown): Share {
  if (share !== null && typeof share === 'object') {
    const s = share as Record<string, unknown>;
    if ('instances' in s && !('ratio' in s)) return { instances: checkInteger('instances', s['instances'], 1) };
    if ('ratio' in s && !('instances' in s)) {
      const r = s['ratio'];
      if (typeof r === 'number' && Number.isFinite(r) && r > 0 && r <= 1) return { ratio: r };
      throw new InvalidArgumentError('ratio', `ratio must be a number above 0 and at most 1, got ${describe(r)}`);
    }
  }
  throw new InvalidArgumentError('share', `share must be { instances: n } or { ratio: r }, got ${describe(share)}`);
}

/** This instance's part of `total` (an integer count). */
export function shareOf(share: Share, total: bigint): bigint {
  let part: bigint;
  if ('instances' in share) {
    const n = BigInt(share.instances) * 10n;
    part = (total * 11n + n - 1n) / n;
  } else {
    // A ratio is a float: taken exactly as its decimal up to 1e-9, rounded up.
    const scaled = BigInt(Math.ceil(share.ratio * 1e9));
    part = (total * scaled + 999_999_999n) / 1_000_000_000n;
  }
  return part < 1n ? 1n : part > total ? (total < 1n ? 1n : total) : part;
}

/**
 * A rule the kit can decide in process: the algorithm word, its parameters
 * (a quota's `[limit, period index]`) and, for a quota, the zone's fixed
 * offset in seconds (0 for UTC).
 */
export interface LocalSpec {
  readonly word: AlgorithmWord;
  readonly params: readonly bigint[];
  readonly offsetS: number;
}

const PERIOD_INDEX: Record<string, bigint> = { DAY: 0n, WEEK: 1n, MONTH: 2n, YEAR: 3n };

/**
 * The in-process form of `spec` (checked), or null where there is none: a
 * concurrency rule (a lease is held in Redis alone), or a quota in a named
 * time zone. Named zones (`America/New_York`) are not read in process: the
 * period's end there needs the zone's rules at that instant, and
 * `Intl.DateTimeFormat` reads Node's own ICU database, which need not be the
 * version the server's is; a quota in a named zone has no local level and
 * the local-only fallback skips it, as in the Rust kit.
 */
export function localSpec(spec: Spec): LocalSpec | null {
  const [word, args] = ruleArgs(spec);
  if (word === 'CONCURRENCY') return null;
  if (word === 'QUOTA') {
    const zone = args[3];
    let offsetS = 0;
    if (zone !== undefined) {
      const m = /^([+-])(\d{2}):(\d{2})$/.exec(zone);
      if (!m) return null;
      offsetS = (m[1] === '-' ? -1 : 1) * (Number(m[2]) * 3600 + Number(m[3]) * 60);
    }
    return { word, params: [BigInt(args[0] as string), PERIOD_INDEX[args[1] as string] as bigint], offsetS };
  }
  return { word: word as AlgorithmWord, params: args.map(BigInt), offsetS: 0 };
}

/** `spec` at this instance's share: a bucket's capacity and refill count scaled alike (its refill period stays), a window's limit. */
export function scaled(spec: LocalSpec, share: Share): LocalSpec {
  const s = (n: bigint) => shareOf(share, n);
  const p = spec.params as bigint[];
  switch (spec.word) {
    case 'TOKENBUCKET':
    case 'LEAKYBUCKET':
      return { ...spec, params: [s(p[0] as bigint), s(p[1] as bigint), p[2] as bigint] };
    default:
      return { ...spec, params: [s(p[0] as bigint), ...p.slice(1)] };
  }
}

/** The parameters the algorithm runs with at `nowUs`: a quota's with the end of its period in its offset (0: in UTC). */
function paramsAt(spec: LocalSpec, nowUs: bigint): readonly bigint[] {
  if (spec.word !== 'QUOTA') return spec.params;
  if (spec.offsetS === 0) return [...spec.params, 0n];
  const off = BigInt(spec.offsetS) * 1_000_000n;
  const end = utcEnd(spec.params[1] as bigint, nowUs + off) - off;
  return [...spec.params, end];
}

/** The wall clock in Unix microseconds. */
export function nowUs(): bigint {
  return BigInt(Math.round((performance.timeOrigin + performance.now()) * 1000));
}

interface Entry {
  algo: Algorithm;
  state: State;
  /** The spec it was last run with (to read, at eviction, when it is back to idle). */
  spec: LocalSpec;
  /** Units the fallback admitted from this account without a call to Redis: Redis never counted them. */
  owed: bigint;
}

/** A bounded map of in-process limiters, keyed by rule and limiter key. */
export class LocalLimiters {
  private readonly map = new Map<string, Entry>();
  readonly capacity: number;
  /** Entries that owe units, so that a call need not look when none do. */
  private owing = 0;

  constructor(capacity: number) {
    this.capacity = Math.max(capacity, 1);
  }

  get size(): number {
    return this.map.size;
  }

  private entry(key: string, spec: LocalSpec, now: bigint, create: boolean): Entry | undefined {
    const algo = BY_WORD[spec.word] as Algorithm;
    let e = this.map.get(key);
    if (e !== undefined && e.algo === algo) {
      e.spec = spec;
      return e;
    }
    if (!create) return undefined;
    if (e !== undefined && e.owed > 0n) this.owing -= 1;
    e = { algo, state: algo.idle(paramsAt(spec, now), now), spec, owed: 0n };
    this.map.set(key, e);
    return e;
  }

  /**
   * Past the cap, drops the limiters back to idle (nothing is lost with
   * them), then, down to the cap less a tenth, those nearest to idle (as
   * the Rust kit's `evict`): never the oldest for being old, which would
   * hand an emptied account a fresh share. Their debts are forgotten: the
   * bound on memory comes first.
   */
  private bound(adding: number, now: bigint): void {
    if (this.map.size + adding <= this.capacity) return;
    const keep = Math.max(this.capacity - Math.ceil(this.capacity / 10) - adding, 0);
    const byIdle: Array<[bigint, string]> = [];
    for (const [k, e] of this.map) {
      // A COST 0 (what the core's `run` does with it): reset_ms is the time until idle.
      const resetMs = e.algo.apply(e.state, paramsAt(e.spec, now), 0n, now).resetMs;
      if (resetMs <= 0n) this.drop(k, e);
      else byIdle.push([resetMs, k]);
    }
    if (this.map.size <= keep) return;
    byIdle.sort((a, b) => (a[0] < b[0] ? -1 : a[0] > b[0] ? 1 : 0));
    for (const [, k] of byIdle) {
      if (this.map.size <= keep) break;
      this.drop(k, this.map.get(k) as Entry);
    }
  }

  private drop(key: string, e: Entry): void {
    if (e.owed > 0n) this.owing -= 1;
    this.map.delete(key);
  }

  /** One request on one limiter, as the core's `run` answers it. */
  run(key: string, spec: LocalSpec, request: AlgoRequest, now = nowUs()): Answer {
    if (!this.map.has(key)) this.bound(1, now);
    const e = this.entry(key, spec, now, true) as Entry;
    return run(e.algo, e.state, paramsAt(spec, now), request, now)[0];
  }

  /**
   * All or nothing over `limits`: if every one admits `cost`, takes it from
   * each and answers their decisions, in order; otherwise takes nothing
   * and answers the position and decision of the first that denied.
   */
  takeAll(limits: ReadonlyArray<readonly [string, LocalSpec]>, cost: bigint, now = nowUs()): { ok: true; answers: Answer[] } | { ok: false; pos: number; answer: Answer } {
    const request: AlgoRequest = { kind: 'cost', n: cost };
    for (let i = 0; i < limits.length; i++) {
      const [key, spec] = limits[i] as readonly [string, LocalSpec];
      const e = this.entry(key, spec, now, false);
      const algo = BY_WORD[spec.word] as Algorithm;
      const params = paramsAt(spec, now);
      const [d] = e === undefined ? decide(algo, algo.idle(params, now), params, request, now) : decide(e.algo, e.state, params, request, now);
      if (!d.allowed) return { ok: false, pos: i, answer: d };
    }
    return { ok: true, answers: this.applyAll(limits, request, now) };
  }

  /**
   * Charges `cost` to every one of `limits`, admitted or not (`COST n
   * FORCE`: at most a limit of debt beyond empty): units Redis admitted
   * for this instance, or may have (a call whose answer was lost).
   */
  chargeAll(limits: ReadonlyArray<readonly [string, LocalSpec]>, cost: bigint, now = nowUs()): void {
    if (limits.length === 0 || cost === 0n) return;
    this.applyAll(limits, { kind: 'force', n: cost }, now);
  }

  /** Gives back what `takeAll` took (Redis denied the request). */
  refundAll(limits: ReadonlyArray<readonly [string, LocalSpec]>, cost: bigint, now = nowUs()): void {
    for (const [key, spec] of limits) {
      const e = this.entry(key, spec, now, false);
      if (e !== undefined) run(e.algo, e.state, paramsAt(spec, now), { kind: 'refund', n: cost }, now);
    }
  }

  private applyAll(limits: ReadonlyArray<readonly [string, LocalSpec]>, request: AlgoRequest, now: bigint): Answer[] {
    this.bound(limits.length, now);
    return limits.map(([key, spec]) => {
      const e = this.entry(key, spec, now, true) as Entry;
      return run(e.algo, e.state, paramsAt(spec, now), request, now)[0];
    });
  }

  /** Records that the fallback admitted `cost` from each of `limits` (just taken) without a call to Redis. */
  oweAll(limits: ReadonlyArray<readonly [string, LocalSpec]>, cost: bigint): void {
    if (cost === 0n) return;
    for (const [key] of limits) {
      const e = this.map.get(key);
      if (e === undefined) continue;
      if (e.owed === 0n) this.owing += 1;
      e.owed += cost;
    }
  }

  /** The units each of `limits` owes Redis, which the caller now sends; the debts are cleared. */
  takeOwed(limits: ReadonlyArray<readonly [string, LocalSpec]>): bigint[] {
    if (this.owing === 0) return limits.map(() => 0n);
    return limits.map(([key]) => {
      const e = this.map.get(key);
      if (e === undefined || e.owed === 0n) return 0n;
      const owed = e.owed;
      e.owed = 0n;
      this.owing -= 1;
      return owed;
    });
  }
}

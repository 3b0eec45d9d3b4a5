/**
 * The core's rate-limiting algorithms (core/src/*.rs), in process and in
 * exact integer arithmetic: the `Limiter`'s local level and its local-only
 * fallback run them. The same functions as the Rust kit's local level (the
 * core itself), the Java kit's `CoreAlgorithms` and the Python kit's
 * `algorithms.py`.
 *
 * Every quantity is a `bigint`: instants are Unix microseconds (beyond 2^53
 * in ticks of a bucket's rate), parameters go up to 2^40 and products up to
 * 2^80. No floating point is used anywhere, so the answers are the core's
 * exactly (the contract's golden sequences check it:
 * test/contract.test.mjs). Parameters are arrays of integers in command
 * order, assumed valid (`ruleArgs` checks them); a quota's are
 * `[limit, period index, endUs]`, `endUs` being the end of the call's
 * period in its zone (0, or any instant not after the call: the UTC
 * period's end).
 *
 * Each algorithm has four functions on a mutable state:
 * - `idle(params, nowUs)`: the state of a limiter that has seen no traffic;
 * - `apply(state, params, cost, nowUs)`: decides `COST cost`, changing the
 *   state only when it admits with `cost > 0`;
 * - `force(state, params, cost, nowUs)`: `COST cost FORCE` (at most a limit
 *   of debt beyond empty): what `apply` would have answered, and whether
 *   the state changed;
 * - `refund(state, params, units, nowUs)`: `REFUND units`, whether the
 *   state changed.
 *
 * `run` is the core's `run`; `decide` answers the same on a copy. A change
 * of parameters between calls on one state carries what was consumed
 * over, as in the core. Concurrency is not here: a lease is held in Redis
 * alone (as in the Java and Python kits; the `Limiter` refuses it).
 */

/** `waitMs` of a request that can never be admitted. */
export const NEVER = -1n;
export const MAX_PARAM = 1n << 40n;
export const MAX_SPAN_MS = 1n << 50n;
export const MAX_TIME_US = 1n << 62n;
/** The sliding log's largest limit (a running count of 24 bits). */
export const MAX_SLIDING_LIMIT = (1n << 24n) - 1n;

/** A decision: the five integers of the module's reply. */
export interface Answer {
  readonly allowed: boolean;
  readonly limit: bigint;
  readonly remaining: bigint;
  /** Milliseconds, rounded up; -1 (`NEVER`) when the request can never pass. */
  readonly waitMs: bigint;
  readonly resetMs: bigint;
}

/** `COST n`, `COST n FORCE`, `REFUND n` or `UPTO n`, as the core's `Request`. */
export interface AlgoRequest {
  readonly kind: 'cost' | 'force' | 'refund' | 'upto';
  readonly n: bigint;
}

/** A state that can be copied (for `decide`, which changes nothing). */
export interface State {
  clone(): State;
}

export interface Algorithm<S extends State = State> {
  readonly word: AlgorithmWord;
  idle(params: readonly bigint[], nowUs: bigint): S;
  apply(state: S, params: readonly bigint[], cost: bigint, nowUs: bigint): Answer;
  force(state: S, params: readonly bigint[], cost: bigint, nowUs: bigint): [Answer, boolean];
  refund(state: S, params: readonly bigint[], units: bigint, nowUs: bigint): boolean;
}

export type AlgorithmWord = 'TOKENBUCKET' | 'LEAKYBUCKET' | 'FIXEDWINDOW' | 'SLIDING' | 'HASHWINDOW' | 'QUOTA';

const answer = (allowed: boolean, limit: bigint, remaining: bigint, waitMs: bigint, resetMs: bigint): Answer => ({ allowed, limit, remaining, waitMs, resetMs });

/** Floor division (as the core's on non-negative values, and Python's `//`). */
export function floorDiv(a: bigint, b: bigint): bigint {
  const q = a / b;
  return a % b !== 0n && a < 0n !== b < 0n ? q - 1n : q;
}
function floorMod(a: bigint, b: bigint): bigint {
  return a - floorDiv(a, b) * b;
}
export function ceilDiv(a: bigint, b: bigint): bigint {
  return -floorDiv(-a, b);
}
const max = (a: bigint, b: bigint): bigint => (a > b ? a : b);
const min = (a: bigint, b: bigint): bigint => (a < b ? a : b);

/**
 * The core's `run`: `cost` applies; `force` answers what `cost` would have,
 * admitted; `refund` answers as a `COST 0` after it. The answer, and
 * whether the state changed.
 */
export function run<S extends State>(algo: Algorithm<S>, state: S, params: readonly bigint[], request: AlgoRequest, nowUs: bigint): [Answer, boolean] {
  const n = request.n;
  switch (request.kind) {
    case 'cost': {
      const d = algo.apply(state, params, n, nowUs);
      return [d, d.allowed && n > 0n];
    }
    case 'force': {
      const [d, changed] = algo.force(state, params, n, nowUs);
      return [{ ...d, allowed: true }, changed];
    }
    case 'refund': {
      const changed = algo.refund(state, params, n, nowUs);
      return [decide(algo, state, params, { kind: 'cost', n: 0n }, nowUs)[0], changed];
    }
    case 'upto':
      return run(algo, state, params, { kind: 'cost', n: fits(algo, state, params, n, nowUs) || 1n }, nowUs);
  }
}

/**
 * `UPTO most`: the most units, at most `most`, that `COST` admits now (0
 * when not even 1 does; `UPTO` then runs as `COST 1`, its denial). Admission
 * is monotone in the cost, so a binary search over copies finds it.
 */
export function fits<S extends State>(algo: Algorithm<S>, state: S, params: readonly bigint[], most: bigint, nowUs: bigint): bigint {
  const admits = (k: bigint) => algo.apply(state.clone() as S, params, k, nowUs).allowed;
  if (most < 1n || !admits(1n)) return 0n;
  let lo = 1n;
  let hi = most;
  while (lo < hi) {
    const mid = (lo + hi + 1n) / 2n;
    if (admits(mid)) lo = mid;
    else hi = mid - 1n;
  }
  return lo;
}

/** What `run` would answer, changing nothing. */
export function decide<S extends State>(algo: Algorithm<S>, state: S, params: readonly bigint[], request: AlgoRequest, nowUs: bigint): [Answer, boolean] {
  return run(algo, state.clone() as S, params, request, nowUs);
}

// -- token bucket and leaky bucket: GCRA in ticks ---------------------------

/** The TAT (whole microseconds and ticks of `1 / refillCount` us) and the rate it is kept at. */
export class GcraState implements State {
  constructor(
    public tatUs: bigint,
    public tatFrac: bigint,
    public refillCount: bigint,
    public refillMs: bigint,
  ) {}

  clone(): GcraState {
    return new GcraState(this.tatUs, this.tatFrac, this.refillCount, this.refillMs);
  }

  tatTicks(): bigint {
    return this.tatUs * this.refillCount + this.tatFrac;
  }

  ownDeficit(nowUs: bigint): bigint {
    return max(this.tatTicks() - nowUs * this.refillCount, 0n);
  }

  /** Time still to refill, in ticks of the parameters' rate (another rate's deficit converted, its fractional token rounded up). */
  deficit(rc: bigint, rms: bigint, nowUs: bigint): bigint {
    const old = this.ownDeficit(nowUs);
    const oldPeriod = this.refillMs * 1000n;
    const newPeriod = rms * 1000n;
    let d: bigint;
    if (oldPeriod === newPeriod) d = old;
    else {
      const whole = floorDiv(old, oldPeriod);
      const frac = old - whole * oldPeriod;
      d = whole * newPeriod + ceilDiv(frac * newPeriod, oldPeriod);
    }
    return min(d, MAX_SPAN_MS * rc * 1000n);
  }

  setTat(rc: bigint, rms: bigint, tatTicks: bigint): void {
    this.tatUs = floorDiv(tatTicks, rc);
    this.tatFrac = tatTicks - this.tatUs * rc;
    this.refillCount = rc;
    this.refillMs = rms;
  }
}

/** One GCRA step: the decision, and the ticks ahead of the request. */
function gcra(state: GcraState, params: readonly bigint[], cost: bigint, nowUs: bigint): [Answer, bigint] {
  const [capacity, rc, rms] = params as [bigint, bigint, bigint];
  const period = rms * 1000n;
  const tau = capacity * period;
  const ticksPerMs = rc * 1000n;
  const deficit = state.deficit(rc, rms, nowUs);
  const need = cost * period;

  if (cost > 0n && deficit + need <= tau) {
    const after = deficit + need;
    state.setTat(rc, rms, nowUs * rc + after);
    return [answer(true, capacity, floorDiv(tau - after, period), 0n, ceilDiv(after, ticksPerMs)), deficit];
  }
  let shortMs: bigint;
  let resetMs: bigint;
  if (state.refillCount === rc && state.refillMs === rms) {
    shortMs = ceilDiv(max(deficit + need - tau, 0n), ticksPerMs);
    resetMs = ceilDiv(deficit, ticksPerMs);
  } else {
    // A state kept at another rate keeps draining at it until an admission.
    const own = state.ownDeficit(nowUs);
    const ownPerMs = state.refillCount * 1000n;
    const fits = max(capacity - cost, 0n) * (state.refillMs * 1000n);
    shortMs = min(ceilDiv(max(own - fits, 0n), ownPerMs), MAX_SPAN_MS);
    resetMs = min(ceilDiv(own, ownPerMs), MAX_SPAN_MS);
  }
  const wait = cost === 0n ? 0n : need > tau ? NEVER : shortMs;
  const remaining = floorDiv(max(tau - deficit, 0n), period);
  return [answer(cost === 0n, capacity, remaining, wait, resetMs), deficit];
}

function gcraForce(state: GcraState, params: readonly bigint[], cost: bigint, nowUs: bigint): [Answer, bigint, boolean] {
  const [d, ahead] = gcra(state, params, cost, nowUs);
  if (d.allowed || cost === 0n) return [d, ahead, d.allowed && cost > 0n];
  const [capacity, rc, rms] = params as [bigint, bigint, bigint];
  const deficit = state.deficit(rc, rms, nowUs);
  const debtCap = min(capacity * rms * 1000n * 2n, MAX_SPAN_MS * rc * 1000n);
  const after = min(deficit + cost * rms * 1000n, debtCap);
  if (after <= deficit) return [d, ahead, false];
  state.setTat(rc, rms, nowUs * rc + after);
  return [d, ahead, true];
}

function gcraRefund(state: GcraState, params: readonly bigint[], units: bigint, nowUs: bigint): boolean {
  const [, rc, rms] = params as [bigint, bigint, bigint];
  const deficit = state.deficit(rc, rms, nowUs);
  if (deficit === 0n || units === 0n) return false;
  const after = max(deficit - units * rms * 1000n, 0n);
  state.setTat(rc, rms, nowUs * rc + after);
  return true;
}

const gcraIdle = (params: readonly bigint[], nowUs: bigint): GcraState => new GcraState(nowUs, 0n, params[1] as bigint, params[2] as bigint);

/** `[capacity, refillCount, refillMs]`: GCRA, exact (token_bucket.rs). */
export const TokenBucket: Algorithm<GcraState> = {
  word: 'TOKENBUCKET',
  idle: gcraIdle,
  apply: (state, params, cost, nowUs) => gcra(state, params, cost, nowUs)[0],
  force: (state, params, cost, nowUs) => {
    const [d, , changed] = gcraForce(state, params, cost, nowUs);
    return [d, changed];
  },
  refund: gcraRefund,
};

/** An admitted request of the queue learns when its turn comes. */
function shaped(d: Answer, ahead: bigint, params: readonly bigint[]): Answer {
  return d.allowed ? { ...d, waitMs: ceilDiv(ahead, (params[1] as bigint) * 1000n) } : d;
}

/** `[capacity, leakCount, leakMs]`: the GCRA as a shaping queue (leaky_bucket.rs). */
export const LeakyBucket: Algorithm<GcraState> = {
  word: 'LEAKYBUCKET',
  idle: gcraIdle,
  apply: (state, params, cost, nowUs) => {
    const [d, ahead] = gcra(state, params, cost, nowUs);
    return shaped(d, ahead, params);
  },
  force: (state, params, cost, nowUs) => {
    const [d, ahead, changed] = gcraForce(state, params, cost, nowUs);
    return [shaped(d, ahead, params), changed];
  },
  refund: gcraRefund,
};

// -- fixed window and quota: a count in a window -----------------------------

/** A count and its window: the last admitted instant (fixed window) or the period's end (quota), in microseconds. */
export class CountState implements State {
  constructor(
    public atUs: bigint,
    public count: bigint,
  ) {}

  clone(): CountState {
    return new CountState(this.atUs, this.count);
  }
}

function windowEndUs(windowMs: bigint, tUs: bigint): bigint {
  const windowUs = windowMs * 1000n;
  return tUs - floorMod(tUs, windowUs) + windowUs;
}

/** A count in a window or a period: where the count stands now (its mark and count). */
type Current = (state: CountState, params: readonly bigint[], nowUs: bigint) => [bigint, bigint];

/**
 * `COST n FORCE` on a count in a window or a period, the same for both (as
 * in the core): answered as unforced, at most a limit of debt.
 */
function forceCount(algo: Algorithm<CountState>, current: Current, state: CountState, params: readonly bigint[], cost: bigint, nowUs: bigint): [Answer, boolean] {
  const d = algo.apply(state, params, cost, nowUs);
  if (d.allowed || cost === 0n) return [d, d.allowed && cost > 0n];
  const [mark, count] = current(state, params, nowUs);
  const forced = min(count + cost, 2n * (params[0] as bigint));
  if (forced <= count) return [d, false];
  state.atUs = mark;
  state.count = forced;
  return [d, true];
}

const fixedCurrent: Current = (state, params, nowUs) => {
  const nowEff = max(nowUs, state.atUs);
  const windowMs = params[1] as bigint;
  const same = windowEndUs(windowMs, state.atUs) === windowEndUs(windowMs, nowEff);
  return [nowEff, same ? state.count : 0n];
};

/** `[limit, windowMs]`: windows aligned on the epoch (fixed_window.rs); the state's `atUs` is the last admitted request's instant. */
export const FixedWindow: Algorithm<CountState> = {
  word: 'FIXEDWINDOW',
  idle: (_params, nowUs) => new CountState(nowUs, 0n),
  apply(state, params, cost, nowUs) {
    const [limit, windowMs] = params as [bigint, bigint];
    const [nowEff, count] = fixedCurrent(state, params, nowUs);
    const endUs = windowEndUs(windowMs, nowEff);
    const toEndMs = ceilDiv(endUs - min(nowUs, endUs), 1000n);
    const remaining = max(limit - count, 0n);
    if (cost > 0n && cost <= remaining) {
      state.atUs = nowEff;
      state.count = count + cost;
      return answer(true, limit, remaining - cost, 0n, toEndMs);
    }
    const wait = cost === 0n ? 0n : cost > limit ? NEVER : toEndMs;
    return answer(cost === 0n, limit, remaining, wait, count === 0n ? 0n : toEndMs);
  },
  force: (state, params, cost, nowUs) => forceCount(FixedWindow, fixedCurrent, state, params, cost, nowUs),
  refund(state, params, units, nowUs) {
    const [, count] = fixedCurrent(state, params, nowUs);
    const back = min(units, count);
    if (back === 0n) return false;
    state.count = count - back;
    return true;
  },
};

const DAY_US = 86_400_000_000n;

function civilFromDays(days: bigint): [bigint, bigint, bigint] {
  const z = days + 719_468n;
  const era = floorDiv(z, 146_097n);
  const doe = z - era * 146_097n;
  const yoe = floorDiv(doe - floorDiv(doe, 1460n) + floorDiv(doe, 36_524n) - floorDiv(doe, 146_096n), 365n);
  const doy = doe - (365n * yoe + floorDiv(yoe, 4n) - floorDiv(yoe, 100n));
  const mp = floorDiv(5n * doy + 2n, 153n);
  const d = doy - floorDiv(153n * mp + 2n, 5n) + 1n;
  const m = mp < 10n ? mp + 3n : mp - 9n;
  return [yoe + era * 400n + (m <= 2n ? 1n : 0n), m, d];
}

function daysFromCivil(year: bigint, m: bigint, d: bigint): bigint {
  const y = m <= 2n ? year - 1n : year;
  const era = floorDiv(y, 400n);
  const yoe = y - era * 400n;
  const mp = m > 2n ? m - 3n : m + 9n;
  const doy = floorDiv(153n * mp + 2n, 5n) + d - 1n;
  const doe = yoe * 365n + floorDiv(yoe, 4n) - floorDiv(yoe, 100n) + doy;
  return max(era * 146_097n + doe - 719_468n, 0n);
}

/**
 * The end (Unix us) of the period (0 DAY, 1 WEEK from Monday, 2 MONTH,
 * 3 YEAR) that contains `nowUs` in UTC, at most `MAX_TIME_US` (quota.rs).
 */
export function utcPeriodEnd(period: bigint, nowUs: bigint): bigint {
  const day = floorDiv(nowUs, DAY_US);
  let next: bigint;
  if (period === 0n) next = day + 1n;
  else if (period === 1n) next = day + 7n - floorMod(day + 3n, 7n); // 1970-01-01 was a Thursday
  else if (period === 2n) {
    const [y, m] = civilFromDays(day);
    next = m === 12n ? daysFromCivil(y + 1n, 1n, 1n) : daysFromCivil(y, m + 1n, 1n);
  } else {
    const [y] = civilFromDays(day);
    next = daysFromCivil(y + 1n, 1n, 1n);
  }
  return min(next * DAY_US, MAX_TIME_US);
}

const quotaCurrent: Current = (state, params, nowUs) => {
  if (nowUs < state.atUs) return [state.atUs, state.count];
  const endGiven = min(params[2] as bigint, MAX_TIME_US);
  const end = endGiven > nowUs ? endGiven : utcPeriodEnd(params[1] as bigint, nowUs);
  return [max(end, nowUs + 1n), 0n];
};

/** `[limit, period, endUs]`: a count per calendar period (quota.rs); the state's `atUs` is the end of the period it counts in. */
export const Quota: Algorithm<CountState> = {
  word: 'QUOTA',
  idle: () => new CountState(0n, 0n),
  apply(state, params, cost, nowUs) {
    const limit = params[0] as bigint;
    const [endUs, count] = quotaCurrent(state, params, nowUs);
    const toEndMs = ceilDiv(endUs - min(nowUs, endUs), 1000n);
    const remaining = max(limit - count, 0n);
    if (cost > 0n && cost <= remaining) {
      state.atUs = endUs;
      state.count = count + cost;
      return answer(true, limit, remaining - cost, 0n, toEndMs);
    }
    const wait = cost === 0n ? 0n : cost > limit ? NEVER : max(toEndMs, 1n);
    return answer(cost === 0n, limit, remaining, wait, count === 0n ? 0n : toEndMs);
  },
  force: (state, params, cost, nowUs) => forceCount(Quota, quotaCurrent, state, params, cost, nowUs),
  refund(state, params, units, nowUs) {
    const [endUs, count] = quotaCurrent(state, params, nowUs);
    const back = min(units, count);
    if (back === 0n) return false;
    state.atUs = endUs;
    state.count = count - back;
    return true;
  },
};

// -- sliding log ----------------------------------------------------------------

/**
 * The sliding log: one entry per millisecond that admitted something,
 * oldest first, as its millisecond and the running count of units admitted
 * through it (`base`: the running count before the oldest).
 */
export class LogState implements State {
  ms: bigint[] = [];
  running: bigint[] = [];
  base = 0n;

  clone(): LogState {
    const other = new LogState();
    other.ms = [...this.ms];
    other.running = [...this.running];
    other.base = this.base;
    return other;
  }

  held(): bigint {
    return this.running.length > 0 ? (this.running[this.running.length - 1] as bigint) - this.base : 0n;
  }

  unitsThrough(i: number): bigint {
    return (this.running[i] as bigint) - this.base;
  }

  /** The oldest entry still in the window: `(ms + windowMs) * 1000 > now`. */
  firstLive(windowMs: bigint, nowUs: bigint): number {
    let lo = 0;
    let hi = this.ms.length;
    while (lo < hi) {
      const mid = (lo + hi) >>> 1;
      if (((this.ms[mid] as bigint) + windowMs) * 1000n > nowUs) hi = mid;
      else lo = mid + 1;
    }
    return lo;
  }

  liveUnits(first: number): bigint {
    return this.held() - (first > 0 ? this.unitsThrough(first - 1) : 0n);
  }

  stamp(nowUs: bigint): bigint {
    return max(ceilDiv(nowUs, 1000n), this.ms.length > 0 ? (this.ms[this.ms.length - 1] as bigint) : 0n);
  }

  expire(first: number): void {
    if (first > 0) {
      this.base = this.running[first - 1] as bigint;
      this.ms.splice(0, first);
      this.running.splice(0, first);
    }
  }

  push(ms: bigint, cost: bigint): void {
    const last = this.ms.length - 1;
    if (last >= 0 && this.ms[last] === ms) this.running[last] = (this.running[last] as bigint) + cost;
    else {
      this.running.push((last >= 0 ? (this.running[last] as bigint) : this.base) + cost);
      this.ms.push(ms);
    }
  }

  popNewest(units: bigint): void {
    while (units > 0n && this.ms.length > 0) {
      const last = this.running.length - 1;
      const below = last >= 1 ? (this.running[last - 1] as bigint) : this.base;
      const inLast = (this.running[last] as bigint) - below;
      const back = min(units, inLast);
      units -= back;
      if (back === inLast) {
        this.ms.pop();
        this.running.pop();
      } else {
        this.running[last] = (this.running[last] as bigint) - back;
      }
    }
  }
}

function slidingEvaluate(state: LogState, params: readonly bigint[], cost: bigint, nowUs: bigint): [Answer, number] {
  const [limit, windowMs] = params as [bigint, bigint];
  const nowMsCeil = ceilDiv(nowUs, 1000n);
  const leavesAfter = (ms: bigint) => ceilDiv(max((ms + windowMs) * 1000n - nowUs, 0n), 1000n);
  const resetAfter = (ms: bigint) => (ms === nowMsCeil ? windowMs : leavesAfter(ms));

  const first = state.firstLive(windowMs, nowUs);
  const before = first > 0 ? state.unitsThrough(first - 1) : 0n;
  const held = state.held() - before;
  const remaining = max(limit - held, 0n);
  if (cost > 0n && cost <= remaining) {
    return [answer(true, limit, remaining - cost, 0n, resetAfter(state.stamp(nowUs))), first];
  }
  let resetMs = state.ms.length > 0 && held > 0n ? resetAfter(state.ms[state.ms.length - 1] as bigint) : 0n;
  let wait: bigint;
  if (cost === 0n) wait = 0n;
  else if (cost > limit) wait = NEVER;
  else {
    const excess = held + cost - limit;
    let lo = first;
    let hi = state.ms.length;
    while (lo < hi) {
      const mid = (lo + hi) >>> 1;
      if (state.unitsThrough(mid) - before >= excess) hi = mid;
      else lo = mid + 1;
    }
    wait = leavesAfter(state.ms[lo] as bigint);
    resetMs = max(resetMs, wait);
  }
  return [answer(cost === 0n, limit, remaining, wait, resetMs), first];
}

/** `[limit, windowMs]`: the exact sliding log (sliding_log.rs). */
export const SlidingLog: Algorithm<LogState> = {
  word: 'SLIDING',
  idle: () => new LogState(),
  apply(state, params, cost, nowUs) {
    const [d, first] = slidingEvaluate(state, params, cost, nowUs);
    if (d.allowed && cost > 0n) {
      state.expire(first);
      state.push(state.stamp(nowUs), cost);
    }
    return d;
  },
  force(state, params, cost, nowUs) {
    const [d, first] = slidingEvaluate(state, params, cost, nowUs);
    if (d.allowed || cost === 0n) {
      const changed = d.allowed && cost > 0n;
      if (changed) {
        state.expire(first);
        state.push(state.stamp(nowUs), cost);
      }
      return [d, changed];
    }
    const held = state.liveUnits(first);
    const cap = min(2n * (params[0] as bigint), MAX_SLIDING_LIMIT);
    const take = min(cost, max(cap - held, 0n));
    if (take === 0n) return [d, false];
    state.expire(first);
    state.push(state.stamp(nowUs), take);
    return [d, true];
  },
  refund(state, params, units, nowUs) {
    const first = state.firstLive(params[1] as bigint, nowUs);
    const back = min(units, state.liveUnits(first));
    if (back === 0n) return false;
    state.expire(first);
    state.popNewest(back);
    return true;
  },
};

// -- hash window ------------------------------------------------------------------

/**
 * The hash window's ring of `n` counters (one more than a window's
 * buckets), kept sparse: `counts` maps a slot (`bucket % n`) to its count,
 * a missing slot holding 0; `newest` is the newest bucket's index (Unix ms
 * / bucketMs) and `total` the units in the ring.
 */
export class RingState implements State {
  total = 0n;
  counts = new Map<bigint, bigint>();

  constructor(
    public bucketMs: bigint,
    public n: bigint,
    public newest: bigint,
  ) {}

  clone(): RingState {
    const other = new RingState(this.bucketMs, this.n, this.newest);
    other.total = this.total;
    other.counts = new Map(this.counts);
    return other;
  }

  get(slot: bigint): bigint {
    return this.counts.get(slot) ?? 0n;
  }

  put(slot: bigint, value: bigint): void {
    if (value !== 0n) this.counts.set(slot, value);
    else this.counts.delete(slot);
  }

  count(bucket: bigint): bigint {
    return this.get(floorMod(bucket, this.n));
  }

  /** Units of the buckets still in the window when `current` is the newest. */
  heldAt(current: bigint): bigint {
    if (current >= this.newest + this.n || this.counts.size === 0) return 0n;
    let gone = 0n;
    for (let j = this.newest + 1n; j <= current; j++) gone += this.count(j);
    return this.total - gone;
  }

  advance(current: bigint): void {
    if (current >= this.newest + this.n) {
      this.counts.clear();
      this.total = 0n;
    } else if (this.counts.size > 0) {
      for (let j = this.newest + 1n; j <= current; j++) {
        const slot = floorMod(j, this.n);
        this.total -= this.get(slot);
        this.put(slot, 0n);
      }
    }
    this.newest = max(this.newest, current);
  }

  add(slot: bigint, units: bigint): void {
    this.put(slot, this.get(slot) + units);
    this.total += units;
  }

  adopt(other: RingState): void {
    this.bucketMs = other.bucketMs;
    this.n = other.n;
    this.newest = other.newest;
    this.total = other.total;
    this.counts = other.counts;
  }
}

const ringIdle = (params: readonly bigint[], nowUs: bigint): RingState => {
  const [, windowMs, bucketMs] = params as [bigint, bigint, bigint];
  return new RingState(bucketMs, windowMs / bucketMs + 1n, floorDiv(floorDiv(nowUs, 1000n), bucketMs));
};

function sameLayout(state: RingState, params: readonly bigint[]): boolean {
  const [, windowMs, bucketMs] = params as [bigint, bigint, bigint];
  return state.bucketMs === bucketMs && state.n === windowMs / bucketMs + 1n;
}

/** The same units in the ring of other parameters: each old bucket's units in the new bucket holding its last millisecond, if still live. */
function converted(state: RingState, params: readonly bigint[], nowUs: bigint): RingState {
  const fresh = ringIdle(params, nowUs);
  const bucketMs = params[2] as bigint;
  const oldestLive = max(fresh.newest + 1n - fresh.n, 0n);
  for (let j = max(state.newest + 1n - state.n, 0n); j <= state.newest; j++) {
    const units = state.count(j);
    if (units === 0n) continue;
    const target = floorDiv((j + 1n) * state.bucketMs - 1n, bucketMs);
    if (target < oldestLive) continue;
    if (target > fresh.newest) fresh.advance(target);
    fresh.add(floorMod(target, fresh.n), units);
  }
  return fresh;
}

function ringEvaluate(state: RingState, params: readonly bigint[], cost: bigint, nowUs: bigint): [Answer, bigint] {
  const [limit, , bucketMs] = params as [bigint, bigint, bigint];
  const n = state.n;
  const bucketUs = bucketMs * 1000n;
  const current = max(floorDiv(nowUs, bucketUs), state.newest);
  const held = state.heldAt(current);
  const leavesAfter = (bucket: bigint) => ceilDiv(max((bucket + n) * bucketUs - nowUs, 0n), 1000n);

  const remaining = max(limit - held, 0n);
  if (cost > 0n && cost <= remaining) {
    return [answer(true, limit, remaining - cost, 0n, leavesAfter(current)), current];
  }
  let wait: bigint;
  if (cost === 0n) wait = 0n;
  else if (cost > limit) wait = NEVER;
  else {
    const excess = held + cost - limit;
    let freed = 0n;
    let bucket = max(current + 1n - n, 0n);
    for (;;) {
      if (bucket <= state.newest) freed += state.count(bucket);
      if (freed >= excess || bucket > state.newest) break;
      bucket += 1n;
    }
    wait = leavesAfter(bucket);
  }
  const resetMs = held === 0n ? 0n : leavesAfter(state.newest);
  return [answer(cost === 0n, limit, remaining, wait, resetMs), current];
}

function ringTake(state: RingState, current: bigint, units: bigint): void {
  state.advance(current);
  state.add(floorMod(current, state.n), units);
}

/** `[limit, windowMs, bucketMs]`: the sliding window in buckets (hash_window.rs), with its conversion of a ring of other parameters. */
export const HashWindow: Algorithm<RingState> = {
  word: 'HASHWINDOW',
  idle: ringIdle,
  apply(state, params, cost, nowUs) {
    if (!sameLayout(state, params)) {
      const other = converted(state, params, nowUs);
      const d = HashWindow.apply(other, params, cost, nowUs);
      if (d.allowed && cost > 0n) state.adopt(other);
      return d;
    }
    const [d, current] = ringEvaluate(state, params, cost, nowUs);
    if (d.allowed && cost > 0n) ringTake(state, current, cost);
    return d;
  },
  force(state, params, cost, nowUs) {
    if (!sameLayout(state, params)) {
      const other = converted(state, params, nowUs);
      const [d, changed] = HashWindow.force(other, params, cost, nowUs);
      if (changed) state.adopt(other);
      return [d, changed];
    }
    const [d, current] = ringEvaluate(state, params, cost, nowUs);
    if (cost === 0n) return [d, false];
    const held = state.heldAt(current);
    const take = d.allowed ? cost : min(cost, max(2n * (params[0] as bigint) - held, 0n));
    if (take === 0n) return [d, false];
    ringTake(state, current, take);
    return [d, true];
  },
  refund(state, params, units, nowUs) {
    if (!sameLayout(state, params)) {
      const other = converted(state, params, nowUs);
      const changed = HashWindow.refund(other, params, units, nowUs);
      if (changed) state.adopt(other);
      return changed;
    }
    const current = max(floorDiv(nowUs, (params[2] as bigint) * 1000n), state.newest);
    let left = min(units, state.heldAt(current));
    if (left === 0n) return false;
    state.advance(current);
    const n = state.n;
    const oldest = max(current + 1n - n, 0n);
    for (let bucket = current; bucket >= oldest; bucket--) {
      const slot = floorMod(bucket, n);
      const back = min(left, state.get(slot));
      state.put(slot, state.get(slot) - back);
      state.total -= back;
      left -= back;
      if (left === 0n) break;
    }
    return true;
  },
};

/** The algorithms by their command word. */
export const BY_WORD: Readonly<Record<AlgorithmWord, Algorithm<GcraState> | Algorithm<CountState> | Algorithm<LogState> | Algorithm<RingState>>> = Object.freeze({
  TOKENBUCKET: TokenBucket,
  LEAKYBUCKET: LeakyBucket,
  FIXEDWINDOW: FixedWindow,
  SLIDING: SlidingLog,
  HASHWINDOW: HashWindow,
  QUOTA: Quota,
});

import { checkInteger, isServerReply, RLConnectionError, TimeoutError, RLError } from './errors.js';

/**
 * The instance's share of a limit shared by `instances` processes:
 * ceil(limit / instances x 1.1), at least 1, as in every kit.
 */
export function shareOf(limit: number, instances: number): number {
  return Math.max(1, Math.ceil((limit * 11) / (instances * 10)));
}

/**
 * What this process may have had counted in Redis, per key, over the last
 * window: every unit Redis admitted for it, and every unit of a call whose
 * answer was lost (a deadline missed, a connection dropped after sending),
 * charged whether or not Redis took it. The fallback admits only what the
 * account still has below the share, so it never adds to what Redis may
 * already have counted: one instance admits at most max(limit, share) per
 * window per key, N instances at most limit + (N - 1) x share, and all of
 * them in the fallback at most N x share.
 *
 * A sliding window in memory: entries (the millisecond charged, units) per
 * key, coalesced per millisecond, dropped a window after their charge; keys
 * with nothing left are swept at most once a window, so memory is bounded by
 * the keys charged within the last window.
 */
export class LocalAccount {
  readonly share: number;
  readonly windowMs: number;
  /** key -> [ms, units, ms, units, ...] in time order. */
  private readonly keys = new Map<string, number[]>();
  private lastSweep = 0;

  constructor(share: number, windowMs: number) {
    this.share = checkInteger('share', share, 1);
    this.windowMs = checkInteger('windowMs', windowMs, 1);
  }

  /** Units held for `key` now. */
  held(key: string, now = Date.now()): number {
    const e = this.live(key, now);
    let sum = 0;
    for (let i = 1; i < e.length; i += 2) sum += e[i] as number;
    return sum;
  }

  /** Charges `units` to `key`, forced: Redis admitted them, or may have. */
  charge(key: string, units: number, now = Date.now()): void {
    if (units <= 0) return;
    this.sweep(now);
    let e = this.keys.get(key);
    if (!e) {
      e = [];
      this.keys.set(key, e);
    }
    if (e.length > 0 && e[e.length - 2] === now) e[e.length - 1] = (e[e.length - 1] as number) + units;
    else e.push(now, units);
  }

  /**
   * The fallback's decision: whether the account has room for `units`.
   * `lost` (the call's answer was lost, so Redis may have counted it):
   * the units are charged either way, forced. Otherwise (an error reply:
   * Redis applied nothing) only when they are admitted.
   */
  take(key: string, units: number, lost: boolean, now = Date.now()): boolean {
    const room = this.held(key, now) + units <= this.share;
    if (room || lost) this.charge(key, units, now);
    return room;
  }

  /** What the account still has for `key` (its share less what it holds). */
  remaining(key: string, now = Date.now()): number {
    return Math.max(this.share - this.held(key, now), 0);
  }

  /** ms until `units` more would fit below the share (0: they fit now). */
  msUntilRoom(key: string, units: number, now = Date.now()): number {
    const e = this.live(key, now);
    let over = this.held(key, now) + units - this.share;
    if (over <= 0) return 0;
    for (let i = 0; i < e.length; i += 2) {
      over -= e[i + 1] as number;
      if (over <= 0) return (e[i] as number) + this.windowMs - now;
    }
    return this.windowMs;
  }

  private live(key: string, now: number): number[] {
    const e = this.keys.get(key);
    if (!e) return [];
    let drop = 0;
    while (drop < e.length && (e[drop] as number) + this.windowMs <= now) drop += 2;
    if (drop > 0) e.splice(0, drop);
    if (e.length === 0) this.keys.delete(key);
    return e;
  }

  private sweep(now: number): void {
    if (now - this.lastSweep < this.windowMs) return;
    this.lastSweep = now;
    for (const key of [...this.keys.keys()]) this.live(key, now);
  }
}

/**
 * Units the fallback admitted without a call (the breaker open, an error
 * reply): Redis never counted them. The adapters send them as `COST n
 * FORCE` before the key's next call, as the `Limiter` sends its owed
 * units, so that when Redis answers again within the window it counts
 * them and one instance still admits at most max(limit, share). Units owed
 * a window ago or more no longer count there: they are dropped, and keys
 * are swept at most once a window, so memory is bounded by the keys owing
 * within the last window. What one call sends is at most `cap` (the share:
 * the fallback admits no more within a window).
 */
export class Owed {
  readonly windowMs: number;
  readonly cap: number;
  /** key -> [units, ms of the last unit owed]. */
  private readonly keys = new Map<string, [number, number]>();
  private lastSweep = 0;

  constructor(windowMs: number, cap: number) {
    this.windowMs = checkInteger('windowMs', windowMs, 1);
    this.cap = Math.min(checkInteger('cap', cap, 1, Number.MAX_SAFE_INTEGER), 2 ** 40);
  }

  /** `units` admitted for `key` without a call. */
  add(key: string, units: number, now = Date.now()): void {
    if (units <= 0) return;
    this.sweep(now);
    const e = this.keys.get(key);
    if (e) {
      e[0] += units;
      e[1] = now;
    } else this.keys.set(key, [units, now]);
  }

  /** What `key` owes (0: nothing, or only units a window old), now cleared: the caller sends it. */
  take(key: string, now = Date.now()): number {
    if (this.keys.size === 0) return 0;
    const e = this.keys.get(key);
    if (!e) return 0;
    this.keys.delete(key);
    return e[1] + this.windowMs > now ? Math.min(e[0], this.cap) : 0;
  }

  get size(): number {
    return this.keys.size;
  }

  private sweep(now: number): void {
    if (now - this.lastSweep < this.windowMs) return;
    this.lastSweep = now;
    for (const [k, e] of this.keys) if (e[1] + this.windowMs <= now) this.keys.delete(k);
  }
}

/**
 * Rejects `TimeoutError` when `op` has not settled within `ms`. `op` goes
 * on: Redis may still count it, which is why the fallback charges it.
 */
export function beforeDeadline<T>(op: Promise<T>, ms: number): Promise<T> {
  let timer: NodeJS.Timeout | undefined;
  const late = new Promise<never>((_, reject) => {
    timer = setTimeout(() => reject(new TimeoutError(`no answer from Redis within ${ms} ms`)), ms);
  });
  op.catch(() => {}); // settled after the deadline: nobody waits for it any more
  return Promise.race([op, late]).finally(() => clearTimeout(timer));
}

/**
 * Whether the answer to a call that failed with `err` was lost (a deadline
 * missed, a connection dropped), so that Redis may have counted it; an
 * error reply means Redis applied nothing.
 */
export function answerLost(err: unknown): boolean {
  return !isServerReply(err);
}

/**
 * Redis failed or did not answer in time (the fallback's case), as opposed
 * to bad input, a server without the module, or a refused configuration,
 * which the fallback must not hide.
 */
export function isOutage(err: unknown): boolean {
  return !(err instanceof RLError) || err instanceof TimeoutError || err instanceof RLConnectionError;
}

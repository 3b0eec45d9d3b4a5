import { RL } from './client.js';
import type { Decision } from './decision.js';
import { toInt } from './decision.js';
import { checkInteger, describe, RLArgumentError, RLError } from './errors.js';
import type { RedisLike } from './transport.js';

/**
 * rate-limiter-flexible's result: the same fields, getters and JSON, so code
 * that reads `msBeforeNext` or `remainingPoints` needs no change.
 */
export class RateLimiterRes {
  remainingPoints: number;
  msBeforeNext: number;
  consumedPoints: number;
  isFirstInDuration: boolean;

  constructor(remainingPoints = 0, msBeforeNext = 0, consumedPoints = 0, isFirstInDuration = false) {
    this.remainingPoints = remainingPoints;
    this.msBeforeNext = msBeforeNext;
    this.consumedPoints = consumedPoints;
    this.isFirstInDuration = Boolean(isFirstInDuration);
  }

  toJSON() {
    return {
      remainingPoints: this.remainingPoints,
      msBeforeNext: this.msBeforeNext,
      consumedPoints: this.consumedPoints,
      isFirstInDuration: this.isFirstInDuration,
    };
  }

  toString(): string {
    return JSON.stringify(this.toJSON());
  }
}

/** What an insurance limiter must offer: rate-limiter-flexible's methods (a `RateLimiterMemory`, say). */
export interface InsuranceLimiter {
  consume(key: string | number, points?: number, options?: object): Promise<unknown>;
  get(key: string | number, options?: object): Promise<unknown>;
  delete(key: string | number, options?: object): Promise<unknown>;
  penalty(key: string | number, points?: number, options?: object): Promise<unknown>;
  reward(key: string | number, points?: number, options?: object): Promise<unknown>;
  block(key: string | number, secDuration: number, options?: object): Promise<unknown>;
  blockDuration?: number;
}

/** `RateLimiterRedis`'s options, as far as they carry over. */
export interface RateLimiterRLOptions {
  /** A node-redis or ioredis client or cluster. */
  storeClient: RedisLike;
  /** Points per `duration` (default 4). */
  points?: number;
  /** Seconds (default 1). */
  duration?: number;
  /** Default `rlflx`. */
  keyPrefix?: string;
  /** Seconds to block a key once it goes over `points` (default 0: no block). */
  blockDuration?: number;
  /** Block in memory, without a round trip, once this many points are consumed. */
  inMemoryBlockOnConsumed?: number;
  /** Seconds of that in-memory block (default: the rest of the window). */
  inMemoryBlockDuration?: number;
  /** Decides instead of Redis when Redis fails. */
  insuranceLimiter?: InsuranceLimiter;
  /** `sliding` (default): `RL.SLIDING`, exact. `fixed`: `RL.FIXEDWINDOW`, windows aligned to the epoch. */
  window?: 'sliding' | 'fixed';
  /** Not supported (refused when true): delays belong to the caller; the leaky bucket (`RL.LEAKYBUCKET`) shapes in the server. */
  execEvenly?: boolean;
}

type Key = string | number;

/**
 * A drop-in for rate-limiter-flexible's `RateLimiterRedis` on the module:
 * the same options, methods, promise behaviour (resolve a `RateLimiterRes`
 * when allowed, reject one when limited, reject an `Error` when Redis fails
 * and there is no `insuranceLimiter`) and fields. `reward` is `REFUND`,
 * `penalty` is `COST n FORCE`, and a block is a plain key with a TTL, read in
 * the same round trip as the limiter. docs/clients.md lists where results
 * differ from `RateLimiterRedis`.
 */
export class RateLimiterRL {
  readonly points: number;
  readonly duration: number;
  readonly keyPrefix: string;
  readonly blockDuration: number;
  readonly inMemoryBlockOnConsumed: number;
  readonly inMemoryBlockDuration: number;
  readonly insuranceLimiter: InsuranceLimiter | undefined;
  private readonly rl: RL;
  private readonly window: 'sliding' | 'fixed';
  /** rlKey -> unix ms until which it is blocked in memory. */
  private readonly memoryBlocks = new Map<string, number>();

  constructor(opts: RateLimiterRLOptions) {
    if (opts === null || typeof opts !== 'object') {
      throw new RLArgumentError('options', `RateLimiterRL options must be an object, got ${describe(opts)}`);
    }
    if (opts.storeClient === undefined || opts.storeClient === null) {
      throw new RLArgumentError('storeClient', 'storeClient is not set: pass a node-redis or ioredis client');
    }
    this.points = checkInteger('points', opts.points ?? 4, 1);
    const duration = opts.duration ?? 1;
    if (duration === 0) {
      throw new RLArgumentError('duration', 'duration 0 (points that never expire) is not supported: the module limits per window');
    }
    this.duration = checkInteger('duration', duration, 1, 2 ** 40 / 1000);
    if (opts.keyPrefix !== undefined && typeof opts.keyPrefix !== 'string') {
      throw new RLArgumentError('keyPrefix', `keyPrefix must be a string, got ${describe(opts.keyPrefix)}`);
    }
    this.keyPrefix = opts.keyPrefix ?? 'rlflx';
    this.blockDuration = checkInteger('blockDuration', opts.blockDuration ?? 0, 0);
    this.inMemoryBlockOnConsumed = checkInteger('inMemoryBlockOnConsumed', opts.inMemoryBlockOnConsumed ?? 0, 0);
    if (this.inMemoryBlockOnConsumed > 0 && this.inMemoryBlockOnConsumed < this.points) {
      throw new RLArgumentError('inMemoryBlockOnConsumed', 'inMemoryBlockOnConsumed must be at least points');
    }
    this.inMemoryBlockDuration = checkInteger('inMemoryBlockDuration', opts.inMemoryBlockDuration ?? 0, 0);
    if (this.inMemoryBlockDuration > 0 && this.inMemoryBlockOnConsumed === 0) {
      throw new RLArgumentError('inMemoryBlockDuration', 'inMemoryBlockDuration needs inMemoryBlockOnConsumed');
    }
    const window = opts.window ?? 'sliding';
    if (window !== 'sliding' && window !== 'fixed') {
      throw new RLArgumentError('window', `window must be 'sliding' or 'fixed', got ${describe(window)}`);
    }
    this.window = window;
    if (opts.execEvenly) {
      throw new RLArgumentError('execEvenly', 'execEvenly is not supported by RateLimiterRL; RL.LEAKYBUCKET spaces actions evenly in the server');
    }
    if (opts.insuranceLimiter !== undefined) {
      const ins = opts.insuranceLimiter as unknown as Record<string, unknown>;
      if (!ins || typeof ins['consume'] !== 'function') {
        throw new RLArgumentError('insuranceLimiter', 'insuranceLimiter must be a rate limiter (RateLimiterMemory, say)');
      }
      opts.insuranceLimiter.blockDuration = this.blockDuration;
    }
    this.insuranceLimiter = opts.insuranceLimiter;
    this.rl = new RL(opts.storeClient);
  }

  /**
   * `MODULE LIST` on every master: rejects `RLModuleNotLoadedError` when the
   * module is missing. Call it at start-up to fail there rather than on the
   * first request.
   */
  async checkModule(): Promise<void> {
    await this.rl.checkModule();
  }

  get msDuration(): number {
    return this.duration * 1000;
  }
  get msBlockDuration(): number {
    return this.blockDuration * 1000;
  }

  /** `keyPrefix:key`, as rate-limiter-flexible. */
  getKey(key: Key): string {
    return this.keyPrefix.length > 0 ? `${this.keyPrefix}:${key}` : String(key);
  }
  parseKey(rlKey: string): string {
    return this.keyPrefix.length > 0 ? rlKey.substring(this.keyPrefix.length + 1) : rlKey;
  }

  /** Resolves when allowed, rejects a `RateLimiterRes` when limited. */
  consume(key: Key, pointsToConsume = 1, options: object = {}): Promise<RateLimiterRes> {
    const cost = checkPoints('pointsToConsume', pointsToConsume);
    return this.insured('consume', [key, pointsToConsume, options], () => this.doConsume(key, cost));
  }

  /** Takes points even over the limit (`COST n FORCE`); resolves. */
  penalty(key: Key, points = 1, options: object = {}): Promise<RateLimiterRes> {
    const cost = checkPoints('points', points);
    return this.insured('penalty', [key, points, options], async () => {
      const d = await this.limiter(key, { cost, force: true });
      // FORCE answers as the call without it would have: remaining after
      // taking the units if they fitted, else before (the rest is debt,
      // at most `points` beyond empty).
      if (d.waitMs === 0) return this.resFrom(d, cost, d.limit - d.remaining);
      const consumed = Math.min(d.limit - d.remaining + cost, 2 * d.limit);
      return new RateLimiterRes(0, d.resetMs, consumed, false);
    });
  }

  /** Gives points back (`REFUND n`), never above a fresh key's; resolves. */
  reward(key: Key, points = 1, options: object = {}): Promise<RateLimiterRes> {
    const n = checkPoints('points', points);
    return this.insured('reward', [key, points, options], async () => {
      const d = await this.limiter(key, { refund: n });
      return this.resFrom(d, -n, d.limit - d.remaining);
    });
  }

  /** The key's state without consuming (`COST 0`), or null for a fresh key. */
  get(key: Key, options: object = {}): Promise<RateLimiterRes | null> {
    return this.insured('get', [key, options], async () => {
      const [blockMs, d] = await Promise.all([this.blockTtl(key), this.limiter(key, { cost: 0 })]);
      if (blockMs > 0 || blockMs === -1) return new RateLimiterRes(0, blockMs, this.points + 1, false);
      const used = d.limit - d.remaining;
      if (used <= 0) return null;
      return this.resFrom(d, 0, used);
    });
  }

  /** Deletes the limiter and its block; resolves true when something was there. */
  delete(key: Key, options: object = {}): Promise<boolean> {
    return this.insured('delete', [key, options], async () => {
      const rlKey = this.getKey(key);
      this.memoryBlocks.delete(rlKey);
      const [a, b] = await Promise.all([this.rl.send(this.limiterKey(key), ['DEL', this.limiterKey(key)]), this.rl.send(this.blockKey(key), ['DEL', this.blockKey(key)])]);
      return toInt(a) + toInt(b) > 0;
    });
  }

  /** Blocks the key for `secDuration` seconds (0: until deleted). */
  block(key: Key, secDuration: number, options: object = {}): Promise<RateLimiterRes> {
    const s = checkInteger('secDuration', secDuration, 0);
    return this.insured('block', [key, secDuration, options], () => this.setBlock(key, s * 1000));
  }

  /** What the in-memory block still holds for `rlKey` (ms), 0 if none. */
  getInMemoryBlockMsBeforeExpire(rlKey: string): number {
    const until = this.memoryBlocks.get(rlKey);
    if (until === undefined) return 0;
    const left = until - Date.now();
    if (left <= 0) {
      this.memoryBlocks.delete(rlKey);
      return 0;
    }
    return left;
  }

  deleteInMemoryBlockedAll(): void {
    this.memoryBlocks.clear();
  }

  private async doConsume(key: Key, cost: number): Promise<RateLimiterRes> {
    const rlKey = this.getKey(key);
    const inMemory = this.getInMemoryBlockMsBeforeExpire(rlKey);
    if (inMemory > 0) throw new RateLimiterRes(0, inMemory);
    // The block key and the limiter in one round trip (two commands in flight).
    const [blockMs, d] = await Promise.all([this.blockTtl(key), this.limiter(key, { cost })]);
    if (blockMs > 0 || blockMs === -1) {
      // Blocked: what the limiter just took goes back.
      if (d.allowed && cost > 0) await this.limiter(key, { refund: cost });
      throw new RateLimiterRes(0, blockMs, this.points + 1 + cost, false);
    }
    const consumed = d.allowed ? d.limit - d.remaining : d.limit - d.remaining + cost;
    const res = this.resFrom(d, cost, consumed);
    const memAt = this.inMemoryBlockOnConsumed;
    if (memAt > 0 && this.inMemoryBlockDuration === 0 && consumed >= memAt) {
      this.memoryBlocks.set(rlKey, Date.now() + res.msBeforeNext);
      if (!d.allowed) throw res;
      return res;
    }
    if (!d.allowed) {
      if (this.blockDuration > 0) {
        await this.setBlock(key, this.msBlockDuration);
        res.msBeforeNext = this.msBlockDuration;
      }
      if (memAt > 0 && consumed >= memAt) {
        this.memoryBlocks.set(rlKey, Date.now() + this.inMemoryBlockDuration * 1000);
        res.msBeforeNext = this.inMemoryBlockDuration * 1000;
      }
      throw res;
    }
    return res;
  }

  private resFrom(d: Decision, changed: number, consumed: number): RateLimiterRes {
    // A cost above `points` never passes (wait_ms -1): like RateLimiterRedis,
    // say the window, after which it is refused again.
    const ms = d.allowed ? d.resetMs : d.waitMs >= 0 ? d.waitMs : d.resetMs > 0 ? d.resetMs : this.msDuration;
    return new RateLimiterRes(d.allowed ? d.remaining : 0, ms, consumed, consumed === changed && changed > 0);
  }

  private async setBlock(key: Key, ms: number): Promise<RateLimiterRes> {
    const bk = this.blockKey(key);
    const lk = this.limiterKey(key);
    // The block replaces the count, as in RateLimiterRedis: the key is fresh after it.
    await Promise.all([this.rl.send(bk, ms > 0 ? ['SET', bk, '1', 'PX', String(ms)] : ['SET', bk, '1']), this.rl.send(lk, ['DEL', lk])]);
    return new RateLimiterRes(0, ms > 0 ? ms : -1, this.points + 1);
  }

  /** ms left on the key's block: >0, -1 for a block without expiry, 0 (or -2) for none. */
  private async blockTtl(key: Key): Promise<number> {
    const bk = this.blockKey(key);
    const t = toInt(await this.rl.send(bk, ['PTTL', bk]));
    return t === -2 ? 0 : t;
  }

  private limiter(key: Key, opts: { cost?: number; refund?: number; force?: boolean }): Promise<Decision> {
    const k = this.limiterKey(key);
    const p = { limit: this.points, windowMs: this.msDuration };
    return this.window === 'sliding' ? this.rl.sliding(k, p, opts) : this.rl.fixedWindow(k, p, opts);
  }

  /**
   * `<keyPrefix>:<key>:rl` (and `:rl:block`): never the string key that
   * RateLimiterRedis left under `<keyPrefix>:<key>`, which would be a
   * `WRONGTYPE` for the module during a switch.
   */
  limiterKey(key: Key): string {
    return `${this.getKey(key)}:rl`;
  }
  blockKey(key: Key): string {
    return `${this.getKey(key)}:rl:block`;
  }

  /**
   * Runs `op`; when Redis fails (not when limited, not on bad input) the
   * insurance limiter decides, as in rate-limiter-flexible.
   */
  private async insured<T>(name: keyof InsuranceLimiter, params: unknown[], op: () => Promise<T>): Promise<T> {
    try {
      return await op();
    } catch (err) {
      // Limited, bad input, or a server without the module: not a Redis failure.
      if (err instanceof RateLimiterRes || err instanceof RLError || !this.insuranceLimiter) throw err;
      const fn = this.insuranceLimiter[name] as (...a: unknown[]) => Promise<T>;
      return fn.apply(this.insuranceLimiter, params);
    }
  }
}

function checkPoints(argument: string, points: unknown): number {
  if (typeof points === 'string' && /^[0-9]+$/.test(points)) points = Number(points);
  return checkInteger(argument, points, 0);
}

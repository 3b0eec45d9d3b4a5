import { Client } from './client.js';
import type { Decision } from './decision.js';
import { toInt } from './decision.js';
import { answerLost, beforeDeadline, isOutage as isFailure, LocalAccount, Owed, shareOf } from './account.js';
import { Breaker, startProbe, type BreakerOptions } from './fallback.js';
import { checkInteger, describe, InvalidArgumentError, RLError } from './errors.js';
import { flexiblePeer } from './peer.js';
import { Request } from './rules.js';
import type { RedisLike } from './transport.js';
import { isDenyEvents, type DenyEvents } from './denyEvents.js';
import { REDIS_BREAKER, resolveMetrics, type Level, type MetricsOption, type RateLimitMetrics } from './metrics.js';

/** The level a consume's decision took (set along its path). */
interface Track {
  level: Level;
}

/** rate-limiter-flexible's result: its fields, getters and JSON. */
export interface RateLimiterRes {
  remainingPoints: number;
  msBeforeNext: number;
  consumedPoints: number;
  isFirstInDuration: boolean;
  toJSON(): { remainingPoints: number; msBeforeNext: number; consumedPoints: number; isFirstInDuration: boolean };
  toString(): string;
}

/** `new RateLimiterRes(remainingPoints, msBeforeNext, consumedPoints, isFirstInDuration)`. */
export interface RateLimiterResConstructor {
  new (remainingPoints?: number, msBeforeNext?: number, consumedPoints?: number, isFirstInDuration?: boolean): RateLimiterRes;
  readonly prototype: RateLimiterRes;
}

/** Stands in for rate-limiter-flexible's class when the application does not have the package. */
class KitRateLimiterRes implements RateLimiterRes {
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

/**
 * rate-limiter-flexible's own `RateLimiterRes` class when the application
 * has the package (so its `BurstyRateLimiter`, `RateLimiterUnion` and
 * `instanceof` checks recognise a limit), else a class with the same fields,
 * getters and JSON.
 */
export const RateLimiterRes: RateLimiterResConstructor = (flexiblePeer?.RateLimiterRes as RateLimiterResConstructor | undefined) ?? KitRateLimiterRes;

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
  /**
   * Decides instead of Redis when Redis fails or misses `deadlineMs`, but
   * only within this instance's account: see `instances`.
   */
  insuranceLimiter?: InsuranceLimiter;
  /**
   * With an `insuranceLimiter`: the processes sharing these keys (default
   * 1). Each keeps an account per key at its share, ceil(points / instances
   * x 1.1): every point Redis admitted for it and every point of a call whose
   * answer was lost is charged to it, and the insurance limiter is asked only
   * while the account has room, so it never adds to what Redis may already
   * have counted.
   */
  instances?: number;
  /**
   * With an `insuranceLimiter`: ms to wait for Redis before the insurance
   * decides (default 100). The call goes on in Redis and may be counted
   * there, so its points are charged to the account. Without an insurance
   * limiter there is nothing else to decide, and the client's own timeouts
   * apply.
   */
  deadlineMs?: number;
  /**
   * With an `insuranceLimiter`: the `Limiter`'s circuit breaker on
   * `consume` (rate-limiter-flexible has none). After `failures`
   * consecutive timeouts or lost connections (default 5) the account and
   * the insurance limiter decide without a call for `openForMs` (default
   * 1,000), then one `PING` probes Redis and closes it. `false` turns it off.
   */
  breaker?: BreakerOptions | false;
  /** `sliding` (default): `RL.SLIDING`, exact. `fixed`: `RL.FIXEDWINDOW`, windows aligned to the epoch. */
  window?: 'sliding' | 'fixed';
  /** Not supported (refused when true): delays belong to the caller; the leaky bucket (`RL.LEAKYBUCKET`) shapes in the server. */
  execEvenly?: boolean;
  /**
   * Prometheus metrics (prom-client, an optional peer): `true` for its
   * global `register`, or a `Registry`. Each `consume` counted in
   * `ratelimit_decisions_total{rule=name}`: level `redis`, `deny_cache` (an
   * in-memory block, no round trip), `fallback` (the insurance limiter and
   * its account); round trips timed, the remaining ratio and the breaker
   * (`breaker="redis"`) kept (README, "Metrics and deny events").
   */
  metrics?: MetricsOption;
  /** Every denied consume as a deny event. */
  denyEvents?: DenyEvents;
  /** The `rule` label and the deny events' rule (default: `keyPrefix`, or `rlflx`). */
  name?: string;
}

type Key = string | number;

/**
 * A drop-in for rate-limiter-flexible's `RateLimiterRedis` on the module:
 * the same options, methods, promise behaviour (resolve a `RateLimiterRes`
 * when allowed, reject one when limited, reject an `Error` when Redis fails
 * and there is no `insuranceLimiter`; never a synchronous throw) and fields.
 * `reward` is `REFUND`, `penalty` is `COST n FORCE`, and a block is a plain
 * key with a TTL, read only when blocks are in use (`blockDuration`, or
 * `block()` called on this limiter). With rate-limiter-flexible installed
 * it is one of its `RateLimiterCompatibleAbstract`s and its results are its
 * `RateLimiterRes`. docs/clients.md lists where results differ from
 * `RateLimiterRedis`.
 */
export class RateLimiterRL {
  readonly points: number;
  readonly duration: number;
  readonly keyPrefix: string;
  readonly blockDuration: number;
  /** rate-limiter-flexible's field; always false (the option is refused). */
  readonly execEvenly = false;
  readonly inMemoryBlockOnConsumed: number;
  readonly inMemoryBlockDuration: number;
  readonly insuranceLimiter: InsuranceLimiter | undefined;
  readonly instances: number;
  readonly deadlineMs: number;
  private readonly rl: Client;
  private readonly window: 'sliding' | 'fixed';
  /** rlKey -> unix ms until which it is blocked in memory. */
  private readonly memoryBlocks = new Map<string, number>();
  /** Set once this limiter wrote a block: consume then reads block keys too. */
  private blocksWritten = false;
  /** With an insurance limiter: what Redis may have counted for this instance. */
  private readonly account: LocalAccount | undefined;
  /** What the fallback admitted without a call, sent before the key's next consume. */
  private readonly owed: Owed | undefined;
  /** With an insurance limiter (and `breaker` not false): spares a dead Redis a deadline per consume. */
  readonly breaker: Breaker | undefined;
  readonly metrics: RateLimitMetrics | undefined;
  readonly denyEvents: DenyEvents | undefined;
  /** The `rule` of its metrics and deny events. */
  readonly name: string;

  constructor(opts: RateLimiterRLOptions) {
    if (opts === null || typeof opts !== 'object') {
      throw new InvalidArgumentError('options', `RateLimiterRL options must be an object, got ${describe(opts)}`);
    }
    if (opts.storeClient === undefined || opts.storeClient === null) {
      throw new InvalidArgumentError('storeClient', 'storeClient is not set: pass a node-redis or ioredis client');
    }
    this.points = checkInteger('points', opts.points ?? 4, 1);
    const duration = opts.duration ?? 1;
    if (duration === 0) {
      throw new InvalidArgumentError('duration', 'duration 0 (points that never expire) is not supported: the module limits per window');
    }
    this.duration = checkInteger('duration', duration, 1, 2 ** 40 / 1000);
    if (opts.keyPrefix !== undefined && typeof opts.keyPrefix !== 'string') {
      throw new InvalidArgumentError('keyPrefix', `keyPrefix must be a string, got ${describe(opts.keyPrefix)}`);
    }
    this.keyPrefix = opts.keyPrefix ?? 'rlflx';
    this.blockDuration = checkInteger('blockDuration', opts.blockDuration ?? 0, 0);
    this.inMemoryBlockOnConsumed = checkInteger('inMemoryBlockOnConsumed', opts.inMemoryBlockOnConsumed ?? 0, 0);
    if (this.inMemoryBlockOnConsumed > 0 && this.inMemoryBlockOnConsumed < this.points) {
      throw new InvalidArgumentError('inMemoryBlockOnConsumed', 'inMemoryBlockOnConsumed must be at least points');
    }
    this.inMemoryBlockDuration = checkInteger('inMemoryBlockDuration', opts.inMemoryBlockDuration ?? 0, 0);
    if (this.inMemoryBlockDuration > 0 && this.inMemoryBlockOnConsumed === 0) {
      throw new InvalidArgumentError('inMemoryBlockDuration', 'inMemoryBlockDuration needs inMemoryBlockOnConsumed');
    }
    const window = opts.window ?? 'sliding';
    if (window !== 'sliding' && window !== 'fixed') {
      throw new InvalidArgumentError('window', `window must be 'sliding' or 'fixed', got ${describe(window)}`);
    }
    this.window = window;
    if (opts.execEvenly) {
      throw new InvalidArgumentError('execEvenly', 'execEvenly is not supported by RateLimiterRL; RL.LEAKYBUCKET spaces actions evenly in the server');
    }
    this.instances = checkInteger('instances', opts.instances ?? 1, 1);
    this.deadlineMs = checkInteger('deadlineMs', opts.deadlineMs ?? 100, 1);
    if (opts.insuranceLimiter !== undefined) {
      const ins = opts.insuranceLimiter as unknown as Record<string, unknown>;
      if (!ins || typeof ins['consume'] !== 'function') {
        throw new InvalidArgumentError('insuranceLimiter', 'insuranceLimiter must be a rate limiter (RateLimiterMemory, say)');
      }
      opts.insuranceLimiter.blockDuration = this.blockDuration;
      this.account = new LocalAccount(shareOf(this.points, this.instances), this.msDuration);
      this.owed = new Owed(this.msDuration, this.account.share);
    }
    if (opts.breaker !== undefined && opts.breaker !== false && (opts.breaker === null || typeof opts.breaker !== 'object')) {
      throw new InvalidArgumentError('breaker', `breaker must be { failures, openForMs } or false, got ${describe(opts.breaker)}`);
    }
    const breaker = opts.breaker === false ? undefined : new Breaker(opts.breaker ?? {});
    this.breaker = this.account !== undefined ? breaker : undefined;
    this.insuranceLimiter = opts.insuranceLimiter;
    this.metrics = resolveMetrics(opts.metrics);
    if (opts.denyEvents !== undefined && !isDenyEvents(opts.denyEvents)) {
      throw new InvalidArgumentError('denyEvents', `denyEvents must be a DenyEvents, got ${describe(opts.denyEvents)}`);
    }
    this.denyEvents = opts.denyEvents;
    if (opts.name !== undefined && (typeof opts.name !== 'string' || opts.name.length === 0)) {
      throw new InvalidArgumentError('name', `name must be a non-empty string, got ${describe(opts.name)}`);
    }
    this.name = opts.name ?? (this.keyPrefix.length > 0 ? this.keyPrefix : 'rlflx');
    if (this.breaker !== undefined) this.metrics?.watchBreaker(REDIS_BREAKER, this.breaker, (b) => b.isOpen);
    this.rl = new Client(opts.storeClient);
  }

  /**
   * Waits until the client is connected (at most `timeoutMs`, default
   * 10,000), then `MODULE LIST` on every master: rejects
   * `ModuleMissingError` when the module is missing and
   * `RLConnectionError` when Redis cannot be reached. Call it at start-up to
   * fail there rather than on the first request.
   */
  async checkModule(opts?: { timeoutMs?: number }): Promise<void> {
    await this.rl.checkModule(opts);
  }

  get msDuration(): number {
    return this.duration * 1000;
  }
  get msBlockDuration(): number {
    return this.blockDuration * 1000;
  }
  /** This instance's share of `points` (its account's size with an insurance limiter). */
  get share(): number {
    return shareOf(this.points, this.instances);
  }

  /** `keyPrefix:key`, as rate-limiter-flexible. */
  getKey(key: Key): string {
    return this.keyPrefix.length > 0 ? `${this.keyPrefix}:${key}` : String(key);
  }
  parseKey(rlKey: string): string {
    return this.keyPrefix.length > 0 ? rlKey.substring(this.keyPrefix.length + 1) : rlKey;
  }

  /** Resolves when allowed, rejects a `RateLimiterRes` when limited. */
  async consume(key: Key, pointsToConsume = 1, options: object = {}): Promise<RateLimiterRes> {
    if (this.metrics === undefined && this.denyEvents === undefined) return this.consumeAt(key, pointsToConsume, options, undefined);
    const track: Track = { level: 'redis' };
    try {
      const res = await this.consumeAt(key, pointsToConsume, options, track);
      this.observe(key, track.level, res, false);
      return res;
    } catch (err) {
      if (err instanceof RateLimiterRes) this.observe(key, track.level, err, true);
      throw err;
    }
  }

  private observe(key: Key, level: Level, res: RateLimiterRes, denied: boolean): void {
    this.metrics?.decision(this.name, level, denied ? 'denied' : 'admitted');
    if (level === 'redis') this.metrics?.remainingRatio(this.name, res.remainingPoints, this.points);
    if (denied) {
      this.denyEvents?.record({ key: this.getKey(key), rule: this.name, level, limit: this.points, remaining: res.remainingPoints, retryAfterMs: res.msBeforeNext });
    }
  }

  private async consumeAt(key: Key, pointsToConsume: number, options: object, track: Track | undefined): Promise<RateLimiterRes> {
    const cost = checkPoints('pointsToConsume', pointsToConsume);
    if (!this.account) return this.doConsume(key, cost, track);
    const m = this.metrics;
    const gate = this.breaker?.gate() ?? 'call';
    if (gate !== 'call') {
      // Open: the account and the insurance limiter decide without a call.
      if (gate === 'probe') {
        void startProbe(this.breaker as Breaker, () => this.rl.send(undefined, ['PING']), this.deadlineMs);
      }
      return this.fallbackConsume(key, cost, pointsToConsume, options, false, track);
    }
    await this.settle(key);
    let res: RateLimiterRes;
    try {
      res = await beforeDeadline(this.doConsume(key, cost, track), this.deadlineMs);
    } catch (err) {
      if (!isOutage(err)) {
        // A denial is an answer.
        if (err instanceof RateLimiterRes) this.breaker?.success();
        throw err;
      }
      const lost = answerLost(err);
      if (lost) this.breaker?.failure();
      return this.fallbackConsume(key, cost, pointsToConsume, options, lost, track);
    }
    this.breaker?.success();
    this.account.charge(this.getKey(key), cost);
    return res;
  }

  /** Takes points even over the limit (`COST n FORCE`); resolves. */
  async penalty(key: Key, points = 1, options: object = {}): Promise<RateLimiterRes> {
    const cost = checkPoints('points', points);
    const res = await this.insured('penalty', [key, points, options], async () => {
      const d = await this.limiter(key, Request.force(cost));
      // FORCE answers as the call without it would have: remaining after
      // taking the units if they fitted, else before (the rest is debt,
      // at most `points` beyond empty).
      if (d.waitMs === 0) return this.resFrom(d, cost, d.limit - d.remaining);
      const consumed = Math.min(d.limit - d.remaining + cost, 2 * d.limit);
      return new RateLimiterRes(0, d.resetMs, consumed, false);
    });
    this.account?.charge(this.getKey(key), cost);
    return res;
  }

  /** Gives points back (`REFUND n`), never above a fresh key's; resolves. */
  async reward(key: Key, points = 1, options: object = {}): Promise<RateLimiterRes> {
    const n = checkPoints('points', points);
    return this.insured('reward', [key, points, options], async () => {
      const d = await this.limiter(key, Request.refund(n));
      return this.resFrom(d, -n, d.limit - d.remaining);
    });
  }

  /**
   * The key's state without consuming, or null for a fresh key. A key in
   * debt (after `penalty`) reports all its points, as `penalty` did: the
   * peek (`COST 0`) is sent with a limit of twice `points`, which the debt
   * never exceeds, so that `remaining` counts below empty too.
   */
  async get(key: Key, options: object = {}): Promise<RateLimiterRes | null> {
    return this.insured('get', [key, options], async () => {
      const [blockMs, d] = await Promise.all([this.blockTtl(key), this.peek(key)]);
      if (blockMs > 0 || blockMs === -1) return new RateLimiterRes(0, blockMs, this.points + 1, false);
      const used = d.limit - d.remaining;
      if (used <= 0) return null;
      return new RateLimiterRes(Math.max(this.points - used, 0), d.resetMs, used, false);
    });
  }

  /** Deletes the limiter and its block; resolves true when something was there. */
  async delete(key: Key, options: object = {}): Promise<boolean> {
    return this.insured('delete', [key, options], async () => {
      const rlKey = this.getKey(key);
      this.memoryBlocks.delete(rlKey);
      const [a, b] = await Promise.all([this.rl.send(this.limiterKey(key), ['DEL', this.limiterKey(key)]), this.rl.send(this.blockKey(key), ['DEL', this.blockKey(key)])]);
      return toInt(a) + toInt(b) > 0;
    });
  }

  /**
   * Blocks the key for `secDuration` seconds (0: until deleted). From then
   * on this limiter reads block keys on every consume; other limiters read
   * them when they have a `blockDuration` or wrote a block themselves.
   */
  async block(key: Key, secDuration: number, options: object = {}): Promise<RateLimiterRes> {
    const s = checkInteger('secDuration', secDuration, 0);
    return this.insured('block', [key, secDuration, options], () => this.setBlock(key, s * 1000));
  }

  /**
   * rate-limiter-flexible's `set` (the count of a key, for `secDuration`):
   * not supported, rejects an `RLError`. The module's count is made by
   * `consume` and `penalty`, and given back by `reward` and `delete`.
   */
  async set(_key: Key, _points: number, _secDuration: number, _options: object = {}): Promise<RateLimiterRes> {
    throw new RLError('RateLimiterRL does not support set(): the module counts what consume and penalty take; use penalty, reward or delete');
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

  private async doConsume(key: Key, cost: number, track?: Track): Promise<RateLimiterRes> {
    const rlKey = this.getKey(key);
    const inMemory = this.getInMemoryBlockMsBeforeExpire(rlKey);
    if (inMemory > 0) {
      if (track) track.level = 'deny_cache';
      throw new RateLimiterRes(0, inMemory);
    }
    // One command per decision; the block key only where blocks are in use
    // (then both in one round trip).
    const blocks = this.blockDuration > 0 || this.blocksWritten;
    const m = this.metrics;
    const t0 = m === undefined ? 0 : performance.now();
    const [blockMs, d] = blocks ? await Promise.all([this.blockTtl(key), this.limiter(key, Request.cost(cost))]) : [0, await this.limiter(key, Request.cost(cost))];
    m?.redisSeconds((performance.now() - t0) / 1000);
    if (blockMs > 0 || blockMs === -1) {
      // Blocked: what the limiter just took goes back.
      if (d.allowed && cost > 0) await this.limiter(key, Request.refund(cost));
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

  /**
   * Redis failed or missed the deadline: a call whose answer was lost may
   * have been counted there, so its points are charged to the account
   * either way, and the insurance limiter decides only if the account had
   * room for them.
   */
  private async fallbackConsume(key: Key, cost: number, pointsToConsume: unknown, options: object, lost: boolean, track?: Track): Promise<RateLimiterRes> {
    if (track) track.level = 'fallback';
    const account = this.account as LocalAccount;
    const rlKey = this.getKey(key);
    if (!account.take(rlKey, cost, lost)) {
      throw new RateLimiterRes(0, account.msUntilRoom(rlKey, cost), account.held(rlKey), false);
    }
    const ins = this.insuranceLimiter as InsuranceLimiter;
    const res = await (ins.consume(key, pointsToConsume as number, options) as Promise<RateLimiterRes>);
    // Not sent (the breaker open, an error reply): owed to Redis.
    if (!lost) this.owed?.add(rlKey, cost);
    return res;
  }

  /**
   * Sends the points the fallback admitted for `key` without a call, as
   * `COST n FORCE`, before its next consume. Sent once, never retried: a
   * lost one may have been applied.
   */
  private async settle(key: Key): Promise<void> {
    const units = this.owed?.take(this.getKey(key)) ?? 0;
    if (units === 0) return;
    await beforeDeadline(this.limiter(key, Request.force(units)), this.deadlineMs).catch(() => {
      // not settled: Redis is failing again, and the consume's own call will say so
    });
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
    this.blocksWritten = true;
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

  /**
   * The key's state, debt included: a peek with twice the limit, which the
   * debt never exceeds (the server's `FORCE` bound), so `limit - remaining`
   * counts below empty; where the server refuses that limit
   * (`ratelimit.sliding-max-limit`), a peek with `points`.
   */
  private async peek(key: Key): Promise<Decision> {
    try {
      return await this.limiter(key, Request.cost(0), 2 * this.points);
    } catch (err) {
      if (!(err instanceof InvalidArgumentError && err.argument === 'limit')) throw err;
      return this.limiter(key, Request.cost(0));
    }
  }

  private limiter(key: Key, opts: Request, limit = this.points): Promise<Decision> {
    const k = this.limiterKey(key);
    const p = { limit, windowMs: this.msDuration };
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
      if (!this.insuranceLimiter || !isOutage(err)) throw err;
      const fn = this.insuranceLimiter[name] as (...a: unknown[]) => Promise<T>;
      return fn.apply(this.insuranceLimiter, params);
    }
  }
}

// With rate-limiter-flexible installed, RateLimiterRL is one of its
// compatible limiters: RateLimiterUnion, RLWrapperTimeouts and insured
// limiters check `instanceof RateLimiterCompatibleAbstract`. Its getters
// (which throw) are shadowed by RateLimiterRL's own fields and methods.
if (flexiblePeer) Object.setPrototypeOf(RateLimiterRL.prototype, flexiblePeer.RateLimiterCompatibleAbstract.prototype);

/** Redis failed or did not answer in time: not a limit, not bad input, not a server without the module. */
function isOutage(err: unknown): boolean {
  return !(err instanceof RateLimiterRes) && isFailure(err);
}

function checkPoints(argument: string, points: unknown): number {
  if (typeof points === 'string' && /^[0-9]+$/.test(points)) points = Number(points);
  return checkInteger(argument, points, 0);
}

import { answerLost, beforeDeadline, isOutage, LocalAccount, Owed, shareOf } from './account.js';
import { Breaker, startProbe, type BreakerOptions } from './fallback.js';
import { Client } from './client.js';
import type { Decision } from './decision.js';
import { checkInteger, checkString, describe, InvalidArgumentError, RLError, ModuleMissingError, TimeoutError } from './errors.js';
import { checkPeriod, checkZone, PERIOD_SECONDS, Request, type Period } from './rules.js';
import { fromSendCommand, toTransport, type RedisLike, type SendCommandClusterFn, type SendCommandFn } from './transport.js';
import { isDenyEvents, type DenyEvents } from './denyEvents.js';
import { REDIS_BREAKER, resolveMetrics, type Level, type MetricsOption, type RateLimitMetrics } from './metrics.js';

/** What express-rate-limit's `increment` and `get` return. */
export interface ClientRateLimitInfo {
  totalHits: number;
  resetTime: Date | undefined;
}

/** What rate-limit-redis says a Redis reply may be. */
export type RedisReply = boolean | number | string | Array<boolean | number | string>;

/** rate-limit-redis's argument of `sendCommandCluster`. */
export interface SendCommandClusterDetails {
  key?: string;
  isReadOnly: boolean;
  command: string[];
}

/** The part of express-rate-limit's options (v7, v8) that `init` reads. */
export interface ExpressRateLimitOptions {
  windowMs: number;
  /** When true, a Redis failure is decided by the store's local account instead of reaching express-rate-limit. */
  passOnStoreError?: boolean;
  limit?: number | ((...args: never[]) => unknown);
  /** v6/v7's name for `limit`. */
  max?: number | ((...args: never[]) => unknown);
  skipFailedRequests?: boolean;
}

/** `RLStore`'s options: rate-limit-redis's, plus what the module adds. */
export interface RLStoreOptions {
  /** As rate-limit-redis: `(...args) => client.sendCommand(args)` (node-redis) or `client.call(...args)` (ioredis). */
  sendCommand?: SendCommandFn;
  /** As rate-limit-redis, for a cluster: `({ key, isReadOnly, command }) => cluster.sendCommand(key, isReadOnly, command)`. */
  sendCommandCluster?: SendCommandClusterFn;
  /** Instead of `sendCommand`: a node-redis or ioredis client or cluster. */
  client?: RedisLike;
  /** Prepended to every key (default `rl:`, as rate-limit-redis). */
  prefix?: string;
  /**
   * `sliding` (default): the exact sliding log, `RL.SLIDING`. `fixed`:
   * `RL.FIXEDWINDOW`, windows aligned to the epoch. `day`, `week`, `month`,
   * `year`: a calendar quota, `RL.QUOTA` (`limit` per period in `zone`);
   * give express-rate-limit the period's nominal `windowMs` (86_400_000 for
   * a day) so its `RateLimit-Policy` says `w` = the nominal seconds.
   */
  window?: 'sliding' | 'fixed' | Period;
  /** With a calendar `window`: its zone, `UTC` (default), a fixed offset (`+05:30`) or an IANA name. */
  zone?: string;
  /**
   * The limit, when express-rate-limit's `limit` is a function: that function
   * runs after `increment`, so its value cannot reach the server in time.
   */
  limit?: number;
  /** rate-limit-redis's option; accepted for the rename, not needed: the module keeps the expiry right itself. */
  resetExpiryOnChange?: boolean;
  /**
   * With express-rate-limit's `passOnStoreError`: the app instances sharing
   * these counts (default 1). Each keeps an account per key at its share,
   * ceil(limit / instances x 1.1); see `init`.
   */
  instances?: number;
  /** With `passOnStoreError`: ms to wait for Redis before the account decides (default 100). */
  deadlineMs?: number;
  /**
   * With `passOnStoreError`: the `Limiter`'s circuit breaker (express-rate-limit
   * has none). After `failures` consecutive timeouts or lost connections
   * (default 5) the account decides without a call for `openForMs` (default
   * 1,000), then one `PING` probes Redis and closes it. `false` turns it off.
   */
  breaker?: BreakerOptions | false;
  /**
   * Prometheus metrics (prom-client, an optional peer): `true` for its
   * global `register`, or a `Registry`. Each `increment` counted in
   * `ratelimit_decisions_total{rule=name}` (level `redis`, or `fallback`
   * with `passOnStoreError`), its round trip timed, the remaining ratio and
   * the breaker (`breaker="redis"`) kept (README, "Metrics and deny events").
   */
  metrics?: MetricsOption;
  /** Every denial as a deny event (key, rule, level; no client_ip: a store sees only the key). */
  denyEvents?: DenyEvents;
  /** The `rule` label and the deny events' rule (default `express-rate-limit`). */
  name?: string;
}

/** `ratelimit.sliding-max-limit`'s own bound: no server takes a sliding limit above it. */
const SLIDING_LIMIT_BOUND = 16_777_215;

/**
 * An express-rate-limit (v7, v8) store whose counts come from the module:
 * `limit` per `windowMs` on an exact sliding window (or a fixed one), one
 * round trip per request, no Lua. Takes rate-limit-redis's options, so
 * switching from `RedisStore` is a rename.
 *
 * With `skipFailedRequests`, express-rate-limit also "decrements" the 429s
 * it answered itself. A denial consumed nothing, so the store remembers the
 * denials it answered per key (until their reset time, after which
 * express-rate-limit skips the decrement) and lets such a decrement refund
 * nothing; any other decrement gives the unit back with `REFUND 1`.
 */
export class RLStore {
  /** Keys in Redis are `<prefix><key>:rl` (see `keyFor`). */
  prefix: string;
  /** The counts are shared by every instance. */
  readonly localKeys = false;
  /** The limit and window, from `init`. */
  limit = 0;
  windowMs = 0;

  private readonly rl: Client;
  private readonly window: 'sliding' | 'fixed' | Period;
  private readonly zone: string | undefined;
  private readonly limitOption: number | undefined;
  private readonly instances: number;
  private readonly deadlineMs: number;
  /** With `passOnStoreError`: what Redis may have counted for this instance. */
  private account: LocalAccount | undefined;
  /** What the fallback admitted without a call, sent before the key's next call. */
  private owed: Owed | undefined;
  private readonly breakerOptions: BreakerOptions | false;
  /** With `passOnStoreError` (and `breaker` not false): spares a dead Redis a deadline per request. */
  breaker: Breaker | undefined;
  private configError: Error | undefined = new RLError('RLStore: init() was not called; pass the store to rateLimit({ store })');
  private trackDenials = false;
  /** key -> reset times (ms) of the denials this store answered and not yet seen decremented. */
  private readonly denials = new Map<string, number[]>();
  private lastSweep = 0;
  /** The metrics, when on. */
  readonly metrics: RateLimitMetrics | undefined;
  readonly denyEvents: DenyEvents | undefined;
  /** The `rule` of its metrics and deny events. */
  readonly name: string;

  constructor(options: RLStoreOptions = {}) {
    if (options === null || typeof options !== 'object') {
      throw new InvalidArgumentError('options', `RLStore options must be an object, got ${describe(options)}`);
    }
    const { sendCommand, sendCommandCluster, client } = options;
    if (sendCommand !== undefined && typeof sendCommand !== 'function') {
      throw new InvalidArgumentError('sendCommand', `sendCommand must be a function, got ${describe(sendCommand)}`);
    }
    if (sendCommandCluster !== undefined && typeof sendCommandCluster !== 'function') {
      throw new InvalidArgumentError('sendCommandCluster', `sendCommandCluster must be a function, got ${describe(sendCommandCluster)}`);
    }
    // As rate-limit-redis, the functions are called with `this` bound to the store.
    if (sendCommandCluster) {
      const cluster = sendCommandCluster.bind(this);
      const viaAny = sendCommand?.bind(this) ?? ((...command: string[]) => cluster({ key: '', isReadOnly: false, command }));
      this.rl = new Client(fromSendCommand(viaAny, cluster));
    } else if (sendCommand) {
      this.rl = new Client(fromSendCommand(sendCommand.bind(this)));
    } else if (client !== undefined) {
      this.rl = new Client(toTransport(client));
    } else {
      throw new InvalidArgumentError('sendCommand', 'RLStore needs sendCommand (as rate-limit-redis), sendCommandCluster or client');
    }
    if (options.prefix !== undefined && typeof options.prefix !== 'string') {
      throw new InvalidArgumentError('prefix', `prefix must be a string, got ${describe(options.prefix)}`);
    }
    this.prefix = options.prefix ?? 'rl:';
    const window = options.window ?? 'sliding';
    if (window !== 'sliding' && window !== 'fixed') {
      try {
        checkPeriod(window, 'window');
      } catch {
        throw new InvalidArgumentError('window', `window must be 'sliding', 'fixed', 'day', 'week', 'month' or 'year', got ${describe(window)}`);
      }
    }
    this.window = window === 'sliding' || window === 'fixed' ? window : ((window as string).toLowerCase() as Period);
    if (options.zone !== undefined && (this.window === 'sliding' || this.window === 'fixed')) {
      throw new InvalidArgumentError('zone', `zone goes with a calendar window ('day', 'week', 'month', 'year'), not '${this.window}'`);
    }
    this.zone = checkZone(options.zone);
    this.limitOption = options.limit === undefined ? undefined : checkInteger('limit', options.limit, 1);
    this.instances = checkInteger('instances', options.instances ?? 1, 1);
    this.deadlineMs = checkInteger('deadlineMs', options.deadlineMs ?? 100, 1);
    this.breakerOptions = options.breaker === false ? false : options.breaker === undefined ? {} : options.breaker;
    if (this.breakerOptions !== false) new Breaker(this.breakerOptions); // checked now, naming the bad option
    this.metrics = resolveMetrics(options.metrics);
    if (options.denyEvents !== undefined && !isDenyEvents(options.denyEvents)) {
      throw new InvalidArgumentError('denyEvents', `denyEvents must be a DenyEvents, got ${describe(options.denyEvents)}`);
    }
    this.denyEvents = options.denyEvents;
    this.name = checkString('name', options.name ?? 'express-rate-limit');
  }

  /** Settles when the checks that `init` starts are done; never rejects. */
  ready: Promise<void> = Promise.resolve();

  /**
   * Called by express-rate-limit with its options. Bad options throw at
   * once. It then checks in the background, once connected, that the
   * server has the module (`MODULE LIST`) and takes the limit and window (a
   * `COST 0` call, which creates nothing): a server without the module, or
   * a limit above `ratelimit.sliding-max-limit`, is reported at start-up as
   * a process warning (code `RL_MODULE_NOT_LOADED`, `RL_STORE_REFUSED`;
   * express-rate-limit 7 would crash on a rejected promise from `init`),
   * and every request then fails with that error.
   *
   * With `passOnStoreError`, express-rate-limit would let every request
   * through when Redis fails, including those Redis counted before its
   * answer was lost. The store then answers those itself, from an account
   * per key at its share (every unit Redis admitted for this instance and
   * every unit whose answer was lost is charged to it, forced): admitted
   * while the account has room, else a 429; Redis failures no longer reach
   * express-rate-limit, and waiting for Redis stops at `deadlineMs`.
   */
  init(options: ExpressRateLimitOptions): void {
    this.configure(options);
    this.account = options.passOnStoreError === true && this.limit > 0 ? new LocalAccount(shareOf(this.limit, this.instances), this.windowMs) : undefined;
    this.owed = this.account !== undefined ? new Owed(this.windowMs, this.account.share) : undefined;
    this.breaker = this.account !== undefined && this.breakerOptions !== false ? new Breaker(this.breakerOptions) : undefined;
    if (this.breaker !== undefined) this.metrics?.watchBreaker(REDIS_BREAKER, this.breaker, (b) => b.isOpen);
    this.ready = this.checkModule()
      .then(() => this.checkLimits())
      .catch((err: Error) => {
        process.emitWarning(err.message, { code: err instanceof ModuleMissingError ? 'RL_MODULE_NOT_LOADED' : 'RL_STORE_REFUSED' });
      });
  }

  /**
   * Rejects with `ModuleMissingError` when `MODULE LIST` answers without
   * the module; a `MODULE LIST` that cannot run (an ACL, Redis not up yet)
   * decides nothing: the commands themselves will say.
   */
  async checkModule(): Promise<void> {
    try {
      await this.rl.checkModule();
    } catch (err) {
      if (err instanceof ModuleMissingError && !(err.cause instanceof Error)) {
        this.configError = err;
        throw err;
      }
    }
  }

  /**
   * A `COST 0` call with the limit and window (it creates nothing): rejects
   * with the server's `InvalidArgumentError` (a limit above
   * `ratelimit.sliding-max-limit`, naming it) and keeps it for every
   * request; any other failure decides nothing.
   */
  private async checkLimits(): Promise<void> {
    if (this.limit === 0 || this.configError) return;
    try {
      await this.call('\u0000init-check', Request.cost(0));
    } catch (err) {
      if (err instanceof InvalidArgumentError) {
        this.configError = new InvalidArgumentError(err.argument, `RLStore: the server refuses this store's ${err.argument}: ${err.message}`, { cause: err });
        throw this.configError;
      }
    }
  }

  private configure(options: ExpressRateLimitOptions): void {
    try {
      this.windowMs = checkInteger('windowMs', options.windowMs, 1);
      const limit = options.limit ?? options.max ?? 5;
      if (typeof limit === 'function') {
        if (this.limitOption === undefined) {
          throw new InvalidArgumentError(
            'limit',
            'RLStore: a function-valued limit runs after the count is taken, so the server cannot apply it; ' +
              'give the number to the store instead: new RLStore({ ..., limit: 100 })',
          );
        }
        this.limit = this.limitOption;
      } else {
        this.limit = checkInteger('limit', limit, 0);
      }
      if (this.window === 'sliding' && this.limit > SLIDING_LIMIT_BOUND) {
        throw new InvalidArgumentError(
          'limit',
          `RLStore: limit ${this.limit} is above what RL.SLIDING can take (ratelimit.sliding-max-limit, at most ${SLIDING_LIMIT_BOUND}; 100000 by default): ` +
            "lower it, or count with window: 'fixed'",
        );
      }
      this.trackDenials = options.skipFailedRequests === true;
      if (this.window !== 'sliding' && this.window !== 'fixed' && this.windowMs !== PERIOD_SECONDS[this.window] * 1000) {
        process.emitWarning(
          `RLStore: a '${this.window}' quota counts calendar periods; windowMs ${this.windowMs} only feeds express-rate-limit's ` +
            `headers: give windowMs: ${PERIOD_SECONDS[this.window] * 1000} so RateLimit-Policy says w=${PERIOD_SECONDS[this.window]}`,
          { code: 'RL_QUOTA_WINDOW' },
        );
      }
      this.configError = undefined;
    } catch (err) {
      this.configError = err as Error;
      throw err;
    }
  }

  /** The Redis key of a client key. */
  keyFor(key: string): string {
    return `${this.prefix}${key}:rl`;
  }

  async increment(key: string): Promise<ClientRateLimitInfo> {
    if (this.configError) throw this.configError;
    const now = Date.now();
    if (this.limit === 0) return { totalHits: 1, resetTime: new Date(now + this.windowMs) };
    const [info, level] = await this.decide(key, now);
    if (this.metrics !== undefined || this.denyEvents !== undefined) this.observe(key, info, level, now);
    return info;
  }

  private observe(key: string, info: ClientRateLimitInfo, level: Level, now: number): void {
    const denied = info.totalHits > this.limit;
    this.metrics?.decision(this.name, level, denied ? 'denied' : 'admitted');
    if (level === 'redis') this.metrics?.remainingRatio(this.name, Math.max(this.limit - info.totalHits, 0), this.limit);
    if (denied) {
      this.denyEvents?.record({
        key: this.keyFor(key),
        rule: this.name,
        level,
        limit: this.limit,
        remaining: 0,
        retryAfterMs: Math.max((info.resetTime?.getTime() ?? now) - now, 0),
      });
    }
  }

  /** The decision, and the level that took it. */
  private async decide(key: string, now: number): Promise<[ClientRateLimitInfo, Level]> {
    let d: Decision;
    const m = this.metrics;
    const t0 = m === undefined ? 0 : performance.now();
    if (this.account) {
      const gate = this.breaker?.gate() ?? 'call';
      if (gate !== 'call') {
        // Open: the account decides without a call (nothing sent, nothing lost).
        if (gate === 'probe') {
          void startProbe(this.breaker as Breaker, () => this.rl.send(undefined, ['PING']), this.deadlineMs);
        }
        return [this.fallback(key, now, false), 'fallback'];
      }
      await this.settle(key);
      const t1 = m === undefined ? 0 : performance.now();
      try {
        d = await beforeDeadline(this.call(key), this.deadlineMs);
      } catch (err) {
        if (!isOutage(err)) throw err;
        const lost = answerLost(err);
        if (err instanceof TimeoutError) m?.redisSeconds((performance.now() - t1) / 1000);
        if (lost) this.breaker?.failure();
        return [this.fallback(key, now, lost), 'fallback'];
      }
      m?.redisSeconds((performance.now() - t1) / 1000);
      this.breaker?.success();
      if (d.allowed) this.account.charge(key, 1);
    } else {
      d = await this.call(key);
      m?.redisSeconds((performance.now() - t0) / 1000);
    }
    return [this.answer(key, d, now), 'redis'];
  }

  /** What express-rate-limit gets of Redis's decision. */
  private answer(key: string, d: Decision, now: number): ClientRateLimitInfo {
    if (d.allowed) return { totalHits: d.limit - d.remaining, resetTime: new Date(now + d.resetMs) };
    // A denial: one more than the limit, so express-rate-limit answers 429;
    // reset when the same request would pass (Retry-After and draft-8's t).
    const resetTime = now + (d.waitMs >= 0 ? d.waitMs : d.resetMs);
    if (this.trackDenials) this.rememberDenial(key, resetTime, now);
    return { totalHits: d.limit + 1, resetTime: new Date(resetTime) };
  }

  /**
   * Redis failed or missed the deadline (with `passOnStoreError`): a unit
   * whose answer was lost may have been counted there, so it is charged to
   * the account either way, and the request is admitted only if the
   * account had room for it. An admission's fields are the account's: its
   * remaining (with the limit, so `totalHits` is the limit less it) and its
   * reset.
   */
  private fallback(key: string, now: number, lost: boolean): ClientRateLimitInfo {
    const account = this.account as LocalAccount;
    if (account.take(key, 1, lost, now)) {
      // Not sent (the breaker open, an error reply): owed to Redis.
      if (!lost) this.owed?.add(key, 1, now);
      return { totalHits: Math.max(this.limit - account.remaining(key, now), 1), resetTime: new Date(now + this.windowMs) };
    }
    const resetTime = now + account.msUntilRoom(key, 1, now);
    if (this.trackDenials) this.rememberDenial(key, resetTime, now);
    return { totalHits: this.limit + 1, resetTime: new Date(resetTime) };
  }

  /**
   * Sends the units the fallback admitted for `key` without a call, as
   * `COST n FORCE`, before its next call. Sent once, never retried: a lost
   * one may have been applied.
   */
  private async settle(key: string): Promise<void> {
    const units = this.owed?.take(key) ?? 0;
    if (units === 0) return;
    await beforeDeadline(this.call(key, Request.force(units)), this.deadlineMs).catch(() => {
      // not settled: Redis is failing again, and the request's own call will say so
    });
  }

  /** Gives back a unit, unless this is the decrement of a 429 this store answered. */
  async decrement(key: string): Promise<void> {
    if (this.configError) throw this.configError;
    if (this.limit === 0) return;
    if (this.takeDenial(key, Date.now())) return;
    await this.call(key, Request.refund(1));
  }

  async resetKey(key: string): Promise<void> {
    this.denials.delete(key);
    const k = this.keyFor(key);
    await this.rl.send(k, ['DEL', k]);
  }

  /** The current count, without taking anything (`COST 0`); undefined for an idle key. */
  async get(key: string): Promise<ClientRateLimitInfo | undefined> {
    if (this.configError) throw this.configError;
    if (this.limit === 0) return undefined;
    const now = Date.now();
    const d = await this.call(key, Request.cost(0));
    const used = d.limit - d.remaining;
    if (used <= 0) return undefined;
    return { totalHits: used, resetTime: new Date(now + d.resetMs) };
  }

  private call(key: string, opts?: Request): Promise<Decision> {
    const p = { limit: this.limit, windowMs: this.windowMs };
    const k = this.keyFor(key);
    if (this.window === 'sliding') return this.rl.sliding(k, p, opts);
    if (this.window === 'fixed') return this.rl.fixedWindow(k, p, opts);
    return this.rl.quota(k, { limit: this.limit, period: this.window, ...(this.zone === undefined ? {} : { zone: this.zone }) }, opts);
  }

  private rememberDenial(key: string, resetTime: number, now: number): void {
    const list = this.denials.get(key);
    if (list) list.push(resetTime);
    else this.denials.set(key, [resetTime]);
    // Entries whose reset passed will never be decremented: drop them, at
    // most once a second, so memory stays bounded by recent denials.
    if (now - this.lastSweep >= 1000) {
      this.lastSweep = now;
      for (const [k, l] of this.denials) {
        const live = l.filter((t) => t > now);
        if (live.length === 0) this.denials.delete(k);
        else if (live.length !== l.length) this.denials.set(k, live);
      }
    }
  }

  private takeDenial(key: string, now: number): boolean {
    const list = this.denials.get(key);
    if (!list) return false;
    while (list.length > 0 && (list[0] as number) <= now) list.shift();
    const taken = list.shift() !== undefined;
    if (list.length === 0) this.denials.delete(key);
    return taken;
  }
}

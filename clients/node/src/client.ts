import { Decision, toInt } from './decision.js';
import { checkInteger, checkString, describe, fromServerError, isServerReply, InvalidArgumentError, RLConnectionError, RLDeniedError, RLError, ModuleMissingError } from './errors.js';
import { Lease, type LeaseOptions, type LeaseRule } from './lease.js';
import { parseStats, type PolicyStats } from './policyStats.js';
import { ConnectionPool } from './pool.js';
import { blockArgs, checkUptoAlgorithm, costRequest, isUpto, optionArgs, Request as Req, ruleArgs, type AcquireOptions, type CallOptions, type ConcurrencyParams, type QuotaParams, type Request, type Spec, type SpecOrPolicy } from './rules.js';
import { dedicatedConnector, ownConnection, toTransport, whenReady, type ConnectionFactory, type RedisLike, type Transport } from './transport.js';

interface Events {
  once?: (event: string, fn: () => void) => unknown;
  off?: (event: string, fn: () => void) => unknown;
}

/** `new Client(client, options)`: how `acquire` gets connections of its own. */
export interface ClientOptions {
  /**
   * Opens a connected node-redis or ioredis client for `acquire` (and
   * leases that wait). By default the kit duplicates the client it was given
   * (`client.duplicate()`, same settings); a `sendCommand` function or a
   * `Transport` cannot be duplicated, so acquire needs this with them.
   */
  connect?: () => RedisLike | Promise<RedisLike>;
  /** Acquire connections kept open between acquires (default 4). */
  maxIdleConnections?: number;
  /** An idle acquire connection is closed after this many ms (default 30,000). */
  idleConnectionMs?: number;
}

/** `RL.POLICY SET`'s options. */
export interface PolicyOptions {
  mode?: 'ENFORCE' | 'SHADOW' | 'OFF';
  /** 0 to 100: the share of keys enforced, the rest in shadow. */
  rollout?: number;
  /**
   * `ADAPT ERRORS pct ...`: when a window with at least `minCalls` outcomes
   * has more than `errors` % errors, the scale becomes max(min, scale x
   * factor / 100); at most `errors / 2` %, it climbs by `recover`. `'off'`
   * stops adapting and keeps the scale. Unset: the server's defaults
   * (the contract's `protection.defaults`).
   */
  adapt?: AdaptOptions | 'off';
  /** `STAGES degrade break`: a window's deny % above `degrade` is stage 1, above `break` stage 2. */
  stages?: { degrade: number; break: number };
  /** `WINDOW ms`: the policy's window, shared by ADAPT and STAGES (default 10,000). */
  windowMs?: number;
}

/** `ADAPT ERRORS`'s parameters (`RL.POLICY SET`). */
export interface AdaptOptions {
  /** 0 to 100: the error percentage above which the scale drops. */
  errors: number;
  /** 1 to 100 (default 80): the scale is multiplied by factor / 100. */
  factor?: number;
  /** 1 to 100 (default 50): the lowest scale. */
  min?: number;
  /** 0 to 100 (default 5): added to the scale after a healthy window. */
  recover?: number;
  /** The window, as `PolicyOptions.windowMs`. */
  windowMs?: number;
  /** Windows with fewer outcomes change nothing (default 100). */
  minCalls?: number;
}

/** One entry of `RL.LOG GET`. */
export interface LogEntry {
  id: number;
  unixMs: number;
  key: string;
  source: string;
  cost: number;
  waitMs: number;
}

/** What `MODULE LIST` says of the module. */
export interface ModuleInfo {
  name: string;
  version: number;
}

/**
 * Typed calls for every command of the module, on node-redis or ioredis,
 * standalone or cluster. Each call is one round trip to the node that owns
 * its key; arguments are checked before anything is sent.
 *
 * ```ts
 * const rl = new Client(createClient())
 * await rl.checkModule()
 * const d = await rl.sliding('user:42', { limit: 100, windowMs: 60_000 })
 * if (!d.allowed) res.set('Retry-After', String(d.retryAfterS))
 * ```
 */
export class Client {
  readonly transport: Transport;
  private readonly openConnection: ConnectionFactory | undefined;
  private readonly maxIdle: number;
  private readonly idleMs: number;
  private connections: ConnectionPool | undefined;
  /** The application's client, whose `end` closes the acquire connections. */
  private readonly events: Events | undefined;
  private readonly onClientEnd = () => this.close();
  /** What the application gave, for `checkModule`'s wait for readiness. */
  private readonly client: RedisLike;

  constructor(client: RedisLike, options: ClientOptions = {}) {
    this.transport = toTransport(client);
    this.client = client;
    if (options === null || typeof options !== 'object') {
      throw new InvalidArgumentError('options', `Client options must be an object, got ${describe(options)}`);
    }
    const { connect } = options;
    if (connect !== undefined && typeof connect !== 'function') {
      throw new InvalidArgumentError('connect', `connect must be a function returning a connected client, got ${describe(connect)}`);
    }
    this.maxIdle = checkInteger('maxIdleConnections', options.maxIdleConnections ?? 4, 0);
    this.idleMs = checkInteger('idleConnectionMs', options.idleConnectionMs ?? 30_000, 1);
    this.openConnection = connect ? async () => ownConnection(await connect()) : dedicatedConnector(client);
    if (!connect) this.events = client as Events;
  }

  /** The node-redis or ioredis client (or function, or transport) this was made with. */
  get redisClient(): RedisLike {
    return this.client;
  }

  /** Closes the connections of `acquire`; acquires still waiting reject. The client given stays open. */
  close(): void {
    this.connections?.close();
    this.connections = undefined;
    if (typeof this.events?.off === 'function') this.events.off('end', this.onClientEnd);
  }

  /**
   * Waits until the client is ready (at most `timeoutMs`, default 10,000),
   * then checks `MODULE LIST` on every master for the module; throws
   * `ModuleMissingError` naming what is missing, or `RLConnectionError`
   * when Redis cannot be reached (the client closed, never connected, not
   * ready in time, or the connection lost).
   */
  async checkModule(opts: { timeoutMs?: number } = {}): Promise<ModuleInfo> {
    const timeoutMs = checkInteger('timeoutMs', opts?.timeoutMs ?? 10_000, 0);
    try {
      await whenReady(this.client, timeoutMs);
    } catch (err) {
      throw new RLConnectionError(`cannot check for the ratelimit module: ${(err as Error).message}`, { cause: err });
    }
    let replies: unknown[];
    try {
      replies = await this.transport.eachMaster(['MODULE', 'LIST']);
    } catch (err) {
      if (!isServerReply(err)) {
        throw new RLConnectionError(`cannot check for the ratelimit module: MODULE LIST got no answer (${(err as Error).message})`, { cause: err });
      }
      throw new ModuleMissingError(
        `cannot check for the ratelimit module: MODULE LIST failed (${(err as Error).message})`,
        { cause: err },
      );
    }
    let found: ModuleInfo | undefined;
    for (const reply of replies) {
      const mod = parseModuleList(reply).find((m) => m.name === 'ratelimit');
      if (!mod) {
        throw new ModuleMissingError(
          'the ratelimit module is not loaded on this server (MODULE LIST does not show it); ' +
            'start redis-server with --loadmodule /path/to/libredis_ratelimit.so',
        );
      }
      found = mod;
    }
    return found as ModuleInfo;
  }

  /**
   * Any limiter rule on `key`. With `Request.upto(n)` the decision's
   * `granted` is the units taken (not on a leaky bucket nor a concurrency
   * rule: refused naming `UPTO` before anything is sent).
   */
  async limit(key: string, rule: Spec, opts?: Request | CallOptions): Promise<Decision> {
    checkString('key', key);
    const [name, params] = ruleArgs(rule);
    const upto = isUpto(opts);
    if (upto) checkUptoAlgorithm(name);
    const args = [`RL.${name}`, key, ...params, ...optionArgs(opts)];
    return this.decide(key, args, name === 'CONCURRENCY' ? 'lease' : 'none', upto);
  }

  tokenBucket(key: string, p: { capacity: number; refillCount: number; refillMs: number }, opts?: Request | CallOptions) {
    return this.limit(key, { algorithm: 'tokenbucket', ...p }, opts);
  }
  leakyBucket(key: string, p: { capacity: number; leakCount: number; leakMs: number }, opts?: Request | CallOptions) {
    return this.limit(key, { algorithm: 'leakybucket', ...p }, opts);
  }
  sliding(key: string, p: { limit: number; windowMs: number }, opts?: Request | CallOptions) {
    return this.limit(key, { algorithm: 'sliding', ...p }, opts);
  }
  hashWindow(key: string, p: { limit: number; windowMs: number; bucketMs: number }, opts?: Request | CallOptions) {
    return this.limit(key, { algorithm: 'hashwindow', ...p }, opts);
  }
  fixedWindow(key: string, p: { limit: number; windowMs: number }, opts?: Request | CallOptions) {
    return this.limit(key, { algorithm: 'fixedwindow', ...p }, opts);
  }
  /**
   * `RL.CONCURRENCY`: a lease on one of `limit` units (or `cost` of them)
   * for `leaseMs`; `decision.lease` is its id (null when denied). End it with
   * `release`, keep it with `renew`; `lease()` and `withLease()` do both.
   */
  concurrency(key: string, p: ConcurrencyParams, opts?: Request | CallOptions) {
    return this.limit(key, { algorithm: 'concurrency', ...p }, opts);
  }
  /**
   * `RL.QUOTA`: at most `limit` units per calendar `period` (`'day'`,
   * `'week'` from Monday, `'month'`, `'year'`) in `zone` (default UTC).
   * `resetMs` is the time until the period ends; a denial's `waitMs` the
   * time until the next one starts.
   */
  quota(key: string, p: QuotaParams, opts?: Request | CallOptions) {
    return this.limit(key, { algorithm: 'quota', ...p }, opts);
  }
  /**
   * `RL.HIT name key`: the policy `name` applied to the limiter in `key`.
   * `Request.upto(n)` on a leaky bucket or concurrency policy is the
   * server's error naming `UPTO`.
   */
  async hit(policy: string, key: string, opts?: Request | CallOptions): Promise<Decision> {
    checkPolicyName(policy);
    checkString('key', key);
    return this.decide(key, ['RL.HIT', policy, key, ...optionArgs(opts)], 'lease', isUpto(opts));
  }

  /** `RL.RELEASE`: ends the lease; false when it had already ended (released, or expired). */
  async release(key: string, lease: number): Promise<boolean> {
    checkString('key', key);
    const args = ['RL.RELEASE', key, String(checkLeaseId(lease))];
    return this.send(key, args).then((r) => toInt(r) === 1);
  }

  /** `RL.RENEW`: the lease lasts `leaseMs` from now; false when it had already ended. */
  async renew(key: string, lease: number, leaseMs: number): Promise<boolean> {
    checkString('key', key);
    const args = ['RL.RENEW', key, String(checkLeaseId(lease)), String(checkInteger('leaseMs', leaseMs, 1))];
    return this.send(key, args).then((r) => toInt(r) === 1);
  }

  /**
   * Waits in the server (`BLOCK`) until the rule admits, at most
   * `timeoutMs` (0: no limit), on a connection of its own, so the client's
   * other commands go on meanwhile. Resolves when the caller may act: for an
   * admitted leaky bucket, after its `waitMs`. A denial (the timeout passed,
   * or the request can never wait its way in) resolves a denied `Decision`,
   * as the other calls. Never retried; past the timeout plus
   * max(1 s, 10 %) without a reply it rejects with `TimeoutError`.
   *
   * `rule` is any rule, a concurrency rule (`decision.lease` is the lease:
   * `lease()` makes it a handle), or `{ policy }` for `RL.HIT`.
   */
  async acquire(key: string, rule: SpecOrPolicy, opts: AcquireOptions): Promise<Decision> {
    checkString('key', key);
    const timeoutMs = acquireTimeout(opts);
    const request = amountRequest(opts);
    const upto = isUpto(request);
    const cost = optionArgs(request);
    if (rule && typeof rule === 'object' && 'policy' in rule) {
      return this.held(key, ['RL.HIT', checkPolicyName(rule.policy), key, ...cost, ...blockArgs(timeoutMs)], 'lease', timeoutMs, opts.signal, upto);
    }
    const [name, params] = ruleArgs(rule);
    if (upto) checkUptoAlgorithm(name);
    const args = [`RL.${name}`, key, ...params, ...cost, ...blockArgs(timeoutMs)];
    return this.held(key, args, name === 'CONCURRENCY' ? 'lease' : 'none', timeoutMs, opts.signal, upto);
  }

  /** `RL.ALL ... BLOCK`: `acquire` for several limiters, admitted when all of them admit at once. */
  async acquireAll(limits: ReadonlyArray<{ key: string; rule: SpecOrPolicy }>, opts: AcquireOptions): Promise<Decision> {
    const timeoutMs = acquireTimeout(opts);
    const request = amountRequest(opts);
    const args = [...allArgs(limits, isUpto(request)), ...optionArgs(request), ...blockArgs(timeoutMs)];
    return this.held(args[2] as string, args, 'deniedBy', timeoutMs, opts.signal, isUpto(request));
  }

  /**
   * A lease on `key` as a handle: `release()` it when done (or
   * `await using`, where the runtime has `Symbol.asyncDispose`), `renew()` it
   * for long work, or `autoRenew` in the background. Rejects with
   * `RLDeniedError` (its `decision` says when to retry) when denied; with
   * `timeoutMs` it first waits for a free unit, as `acquire`.
   * `rule` is `{ limit, leaseMs }`, or `{ policy, leaseMs? }` for a
   * CONCURRENCY policy (`leaseMs` is what `renew` extends it by).
   */
  async lease(key: string, rule: LeaseRule, opts: LeaseOptions = {}): Promise<Lease> {
    checkString('key', key);
    if (rule === null || typeof rule !== 'object') {
      throw new InvalidArgumentError('rule', `rule must be { limit, leaseMs } or { policy }, got ${describe(rule)}`);
    }
    if (opts === null || typeof opts !== 'object') {
      throw new InvalidArgumentError('options', `lease options must be an object, got ${describe(opts)}`);
    }
    const spec: SpecOrPolicy = 'policy' in rule ? { policy: rule.policy } : { algorithm: 'concurrency', limit: rule.limit, leaseMs: rule.leaseMs };
    const leaseMs = rule.leaseMs === undefined ? undefined : checkInteger('leaseMs', rule.leaseMs, 1);
    if (opts.autoRenew && leaseMs === undefined) {
      throw new InvalidArgumentError('leaseMs', 'autoRenew needs the leaseMs to renew by: give { policy, leaseMs }');
    }
    const decided =
      opts.timeoutMs === undefined
        ? 'policy' in spec
          ? this.hit(spec.policy, key, costRequest(opts.cost))
          : this.limit(key, spec, costRequest(opts.cost))
        : this.acquire(key, spec, { timeoutMs: opts.timeoutMs, cost: opts.cost, signal: opts.signal });
    return decided.then((d) => {
      if (!d.allowed) {
        const why = d.never ? 'its cost is above the limit' : `retry in ${d.retryAfterMs} ms`;
        throw new RLDeniedError(`no lease on ${key}: ${d.limit - d.remaining} of ${d.limit} units held (${why})`, d);
      }
      // Admitted without a lease: a policy in SHADOW or OFF mode (or not a
      // CONCURRENCY one). The work goes ahead; there is nothing to give back.
      return new Lease(this, key, d.lease ?? 0, d, leaseMs, opts.autoRenew === true && d.lease !== null);
    });
  }

  /**
   * Runs `fn` holding a lease on `key` and releases it when `fn` settles,
   * whether it resolved or threw. Rejects with `RLDeniedError` without
   * running `fn` when no lease is granted. Options as `lease()`.
   */
  async withLease<T>(key: string, rule: LeaseRule, fn: (lease: Lease) => T | Promise<T>, opts: LeaseOptions = {}): Promise<T> {
    if (typeof fn !== 'function') throw new InvalidArgumentError('fn', `fn must be a function, got ${describe(fn)}`);
    const lease = await this.lease(key, rule, opts);
    let failed = false;
    try {
      return await fn(lease);
    } catch (err) {
      failed = true;
      throw err;
    } finally {
      await lease.release().catch((err: Error) => {
        // The work is done; a lease that could not be released expires by itself.
        if (!failed) process.emitWarning(`could not release the lease on ${key}: ${err.message}`, { code: 'RL_RELEASE_FAILED' });
      });
    }
  }

  /**
   * `RL.ALL`: every limiter admits, or nothing changes anywhere. `deniedBy`
   * is the 0-based index of the first that denied. In a cluster the keys
   * must share a slot (a hash tag such as `{order:create}`).
   */
  async all(limits: ReadonlyArray<{ key: string; rule: SpecOrPolicy }>, opts?: { cost?: number; upto?: number }): Promise<Decision> {
    if (opts !== undefined && (opts === null || typeof opts !== 'object')) {
      throw new InvalidArgumentError('options', `RL.ALL's options are { cost } or { upto }, got ${describe(opts)}`);
    }
    const request = amountRequest(opts ?? {});
    const upto = isUpto(request);
    const args = [...allArgs(limits, upto), ...optionArgs(request)];
    return this.decide(args[2] as string, args, 'deniedBy', upto);
  }

  /**
   * `RL.POLICY SET` on every master (policies are node state). A quota in
   * another zone than UTC is sent with its zone (`QUOTA 1000 DAY TZ
   * America/New_York`): `rl.hit` and `rl.all` with `{ policy }` then count
   * in that zone.
   */
  async policySet(name: string, rule: Spec, opts: PolicyOptions = {}): Promise<void> {
    checkPolicyName(name);
    const [alg, params] = ruleArgs(rule);
    const args = ['RL.POLICY', 'SET', name, alg, ...params];
    if (opts.mode !== undefined) {
      if (!['ENFORCE', 'SHADOW', 'OFF'].includes(opts.mode)) throw new InvalidArgumentError('mode', `mode must be ENFORCE, SHADOW or OFF, got ${String(opts.mode)}`);
      args.push('MODE', opts.mode);
    }
    if (opts.rollout !== undefined) args.push('ROLLOUT', String(checkInteger('rollout', opts.rollout, 0, 100)));
    args.push(...loopArgs(opts));
    await this.everyMaster(args);
  }

  /** `RL.POLICY STATS name`, from any node (each master has its own window counts: see `Protection`). */
  async policyStats(name: string): Promise<PolicyStats> {
    checkPolicyName(name);
    return parseStats(await this.send(undefined, ['RL.POLICY', 'STATS', name]));
  }

  /** `RL.POLICY SCALE name pct` on every master: the operator's hand on the scale (1 to 100). */
  async policyScale(name: string, pct: number): Promise<void> {
    checkPolicyName(name);
    await this.everyMaster(['RL.POLICY', 'SCALE', name, String(checkInteger('pct', pct, 1, 100))]);
  }

  /**
   * `RL.OUTCOME name ok errors [DENIED denied]` on one node (the
   * `Protection` sends it to every master, in the background): adds
   * finished requests the policy admitted to its current window, and
   * `denied` calls the kit denied without asking the server (its deny
   * cache) as calls and denials of it (`DENIED` sent only when above 0).
   */
  async outcome(name: string, ok: number, errors: number, denied = 0): Promise<PolicyStats> {
    checkPolicyName(name);
    const args = ['RL.OUTCOME', name, String(checkInteger('ok', ok, 0)), String(checkInteger('errors', errors, 0))];
    if (checkInteger('denied', denied, 0) > 0) args.push('DENIED', String(denied));
    return parseStats(await this.send(undefined, args));
  }

  /**
   * `RL.POLICY GET`: the rule and its counters as an object, or null: `name`,
   * `algorithm`, `params` (a quota's `[limit, 'DAY']`), `mode`, `rollout`,
   * for a quota `zone` (`'UTC'`, `'+05:30'`, `'America/New_York'`), then
   * `calls`, `admitted`, `denied`, `shadow_denied`, then the protection
   * loop's `adapt` (`[errors, factor, min, recover, minCalls]`), `stages`
   * (`[degrade, break]`) and `window_ms` when set, and always `scale` and
   * `stage` (read by name: the contract's `protection.get_fields`).
   */
  async policyGet(name: string): Promise<Record<string, string | number> | null> {
    checkPolicyName(name);
    const r = await this.send(undefined, ['RL.POLICY', 'GET', name]);
    if (r === null || r === undefined) return null;
    return pairs(r);
  }

  /** `RL.POLICY DEL` on every master: true when it existed on any. */
  async policyDel(name: string): Promise<boolean> {
    checkPolicyName(name);
    const r = await this.everyMaster(['RL.POLICY', 'DEL', name]);
    return r.some((x) => toInt(x) === 1);
  }

  /** `RL.POLICY LIST`: the names, sorted. */
  async policyList(): Promise<string[]> {
    const r = await this.send(undefined, ['RL.POLICY', 'LIST']);
    return Array.isArray(r) ? r.map(String) : [];
  }

  /** `RL.LOG GET`: the most recent denials, newest first. */
  async logGet(count?: number): Promise<LogEntry[]> {
    const args = ['RL.LOG', 'GET'];
    if (count !== undefined) args.push(String(checkInteger('count', count, 0)));
    const r = await this.send(undefined, args);
    if (!Array.isArray(r)) return [];
    return r.map((e: unknown[]) => ({ id: toInt(e[0]), unixMs: toInt(e[1]), key: String(e[2]), source: String(e[3]), cost: toInt(e[4]), waitMs: toInt(e[5]) }));
  }

  async logLen(): Promise<number> {
    return toInt(await this.send(undefined, ['RL.LOG', 'LEN']));
  }

  async logReset(): Promise<void> {
    await this.send(undefined, ['RL.LOG', 'RESET']);
  }

  /** Sends a limiter command and parses its decision (`upto`: the command has `UPTO n`, its reply `granted`). */
  async decide(key: string, args: string[], sixth: 'deniedBy' | 'lease' | 'none', upto = false): Promise<Decision> {
    return Decision.fromReply(await this.send(key, args), sixth, upto);
  }

  /** Sends one command to the owner of `key`, mapping server errors. */
  async send(key: string | undefined, args: string[]): Promise<unknown> {
    try {
      return await this.transport.call(key, args);
    } catch (err) {
      throw fromServerError(err, args[0] as string);
    }
  }

  /** Sends a command the server may hold on a connection of its own, within its timeout plus a margin. */
  private async held(key: string, args: string[], sixth: 'deniedBy' | 'lease' | 'none', timeoutMs: number, signal: AbortSignal | undefined, upto = false): Promise<Decision> {
    const command = args[0] as string;
    const deadlineMs = timeoutMs === 0 ? null : timeoutMs + Math.max(1000, Math.ceil(timeoutMs / 10));
    let reply: unknown;
    try {
      reply = await this.pool().run((t) => t.call(key, args), deadlineMs, command, signal);
    } catch (err) {
      if (err instanceof RLError || (signal?.aborted && err === signal.reason)) throw err;
      throw fromServerError(err, command);
    }
    const d = Decision.fromReply(reply, sixth, upto);
    // An admitted leaky bucket's units leave evenly spaced: act after waitMs.
    if (d.allowed && d.waitMs > 0) await new Promise((r) => setTimeout(r, d.waitMs));
    return d;
  }

  private pool(): ConnectionPool {
    if (!this.openConnection) {
      throw new RLError(
        'acquire needs connections of its own (a held reply would stall every command on a shared one), and this client cannot be ' +
          'duplicated: pass a node-redis or ioredis client, or new Client(client, { connect: () => a connected client })',
      );
    }
    if (!this.connections) {
      this.connections = new ConnectionPool(this.openConnection, this.maxIdle, this.idleMs);
      // The acquire connections go when the application's client does.
      if (typeof this.events?.once === 'function') this.events.once('end', this.onClientEnd);
    }
    return this.connections;
  }

  private async everyMaster(args: string[]): Promise<unknown[]> {
    try {
      return await this.transport.eachMaster(args);
    } catch (err) {
      throw fromServerError(err, `${args[0]} ${args[1]}`);
    }
  }
}

/** `{ cost }` or `{ upto }` (not both, naming `UPTO`) as a request; none when neither is given. */
function amountRequest(opts: { cost?: number | undefined; upto?: number | undefined }): Request | undefined {
  if (opts.upto === undefined) return costRequest(opts.cost);
  if (opts.cost !== undefined) throw new InvalidArgumentError('UPTO', 'UPTO cannot be given with COST: give upto or cost');
  return Req.upto(opts.upto);
}

/**
 * `RL.ALL numkeys key... spec...`, checked; a concurrency rule is refused
 * (leases do not combine), and with `upto` a leaky bucket (naming `UPTO`).
 */
function allArgs(limits: ReadonlyArray<{ key: string; rule: SpecOrPolicy }>, upto = false): string[] {
  if (!Array.isArray(limits) || limits.length === 0) {
    throw new InvalidArgumentError('limits', 'RL.ALL needs at least one { key, rule }');
  }
  const keys = limits.map((l, n) => checkString(`limits[${n}].key`, l?.key));
  const specs: string[] = [];
  limits.forEach((l, n) => {
    if (l.rule && 'policy' in l.rule) specs.push('POLICY', checkPolicyName(l.rule.policy));
    else {
      const [name, params] = ruleArgs(l.rule, `limits[${n}].rule`);
      if (name === 'CONCURRENCY') {
        throw new InvalidArgumentError(`limits[${n}].rule`, `limits[${n}].rule: RL.ALL cannot take a concurrency rule (a lease is released on its own key)`);
      }
      if (upto && name === 'LEAKYBUCKET') {
        throw new InvalidArgumentError('UPTO', `UPTO is not an option of RL.ALL with a ${name} limiter (spec ${n + 1})`);
      }
      if (params.includes('TZ')) {
        throw new InvalidArgumentError(
          `limits[${n}].rule.zone`,
          `limits[${n}].rule: RL.ALL's inline quotas count in UTC only, got zone ${JSON.stringify((l.rule as QuotaParams).zone)}: ` +
            'make it a policy (rl.policySet, then { policy } counts in its zone) or decide it with its own rl.quota call',
        );
      }
      specs.push(name, ...params);
    }
  });
  return ['RL.ALL', String(keys.length), ...keys, ...specs];
}

function acquireTimeout(opts: AcquireOptions): number {
  if (opts === null || typeof opts !== 'object') {
    throw new InvalidArgumentError('timeoutMs', `acquire needs { timeoutMs } (0 waits without a limit), got ${describe(opts)}`);
  }
  if (opts.signal !== undefined && !(opts.signal instanceof AbortSignal)) {
    throw new InvalidArgumentError('signal', `signal must be an AbortSignal, got ${describe(opts.signal)}`);
  }
  return checkInteger('timeoutMs', opts.timeoutMs, 0);
}

function checkLeaseId(lease: unknown): number {
  if (typeof lease !== 'number' || !Number.isSafeInteger(lease) || lease < 1) {
    throw new InvalidArgumentError('lease', `lease must be a lease id (a positive integer, decision.lease), got ${describe(lease)}`);
  }
  return lease;
}

/** `ADAPT ...`, `STAGES ...` and `WINDOW ...` of `RL.POLICY SET`, checked against the contract's ranges. */
function loopArgs(opts: PolicyOptions): string[] {
  const args: string[] = [];
  const { adapt, stages } = opts;
  if (adapt === 'off') args.push('ADAPT', 'OFF');
  else if (adapt !== undefined) {
    if (adapt === null || typeof adapt !== 'object') {
      throw new InvalidArgumentError('adapt', `adapt must be { errors, factor?, min?, recover?, windowMs?, minCalls? } or 'off', got ${describe(adapt)}`);
    }
    args.push('ADAPT', 'ERRORS', String(checkInteger('adapt.errors', adapt.errors, 0, 100)));
    if (adapt.factor !== undefined) args.push('FACTOR', String(checkInteger('adapt.factor', adapt.factor, 1, 100)));
    if (adapt.min !== undefined) args.push('MIN', String(checkInteger('adapt.min', adapt.min, 1, 100)));
    if (adapt.recover !== undefined) args.push('RECOVER', String(checkInteger('adapt.recover', adapt.recover, 0, 100)));
    if (adapt.windowMs !== undefined) args.push('WINDOW', String(checkInteger('adapt.windowMs', adapt.windowMs, 1, 86_400_000)));
    if (adapt.minCalls !== undefined) args.push('MINCALLS', String(checkInteger('adapt.minCalls', adapt.minCalls, 0)));
  }
  if (stages !== undefined) {
    if (stages === null || typeof stages !== 'object') {
      throw new InvalidArgumentError('stages', `stages must be { degrade, break } (percentages), got ${describe(stages)}`);
    }
    const degrade = checkInteger('stages.degrade', stages.degrade, 0, 100);
    const brk = checkInteger('stages.break', stages.break, degrade, 100);
    args.push('STAGES', String(degrade), String(brk));
  }
  if (opts.windowMs !== undefined) {
    if (adapt !== undefined && adapt !== 'off' && adapt.windowMs !== undefined) {
      throw new InvalidArgumentError('windowMs', 'give the window once: windowMs or adapt.windowMs');
    }
    args.push('WINDOW', String(checkInteger('windowMs', opts.windowMs, 1, 86_400_000)));
  }
  return args;
}

function checkPolicyName(name: unknown): string {
  if (typeof name !== 'string' || !/^[!-~]{1,256}$/.test(name)) {
    throw new InvalidArgumentError('policy', `a policy name is 1 to 256 printable ASCII bytes without spaces, got ${JSON.stringify(name)}`);
  }
  return name;
}

function pairs(r: unknown): Record<string, string | number> {
  const out: Record<string, string | number> = {};
  if (r instanceof Map) {
    for (const [k, v] of r) out[String(k)] = v as string | number;
  } else if (Array.isArray(r)) {
    for (let n = 0; n + 1 < r.length; n += 2) out[String(r[n])] = r[n + 1] as string | number;
  } else if (typeof r === 'object' && r !== null) {
    Object.assign(out, r);
  }
  return out;
}

/** `MODULE LIST` in RESP2 (arrays of pairs) or RESP3 (maps). */
function parseModuleList(reply: unknown): ModuleInfo[] {
  if (!Array.isArray(reply)) return [];
  return reply.map((entry) => {
    const p = pairs(entry);
    return { name: String(p['name'] ?? ''), version: Number(p['ver'] ?? 0) };
  });
}

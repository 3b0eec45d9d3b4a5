import { Decision, toInt } from './decision.js';
import { checkInteger, checkString, fromServerError, RLArgumentError, RLModuleNotLoadedError, RLProtocolError } from './errors.js';
import { optionArgs, ruleArgs, type CallOptions, type Rule, type Spec } from './rules.js';
import { toTransport, type RedisLike, type Transport } from './transport.js';

/** `RL.POLICY SET`'s options. */
export interface PolicyOptions {
  mode?: 'ENFORCE' | 'SHADOW' | 'OFF';
  /** 0 to 100: the share of keys enforced, the rest in shadow. */
  rollout?: number;
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
 * const rl = new RL(createClient())
 * await rl.checkModule()
 * const d = await rl.sliding('user:42', { limit: 100, windowMs: 60_000 })
 * if (!d.allowed) res.set('Retry-After', String(d.retryAfterS))
 * ```
 */
export class RL {
  readonly transport: Transport;

  constructor(client: RedisLike) {
    this.transport = toTransport(client);
  }

  /**
   * Checks `MODULE LIST` on every master for the module; throws
   * `RLModuleNotLoadedError` naming what is missing.
   */
  async checkModule(): Promise<ModuleInfo> {
    let replies: unknown[];
    try {
      replies = await this.transport.eachMaster(['MODULE', 'LIST']);
    } catch (err) {
      throw new RLModuleNotLoadedError(
        `cannot check for the ratelimit module: MODULE LIST failed (${(err as Error).message})`,
        { cause: err },
      );
    }
    let found: ModuleInfo | undefined;
    for (const reply of replies) {
      const mod = parseModuleList(reply).find((m) => m.name === 'ratelimit');
      if (!mod) {
        throw new RLModuleNotLoadedError(
          'the ratelimit module is not loaded on this server (MODULE LIST does not show it); ' +
            'start redis-server with --loadmodule /path/to/libredis_ratelimit.so',
        );
      }
      found = mod;
    }
    return found as ModuleInfo;
  }

  /** Any limiter rule on `key`. */
  limit(key: string, rule: Rule, opts?: CallOptions): Promise<Decision> {
    checkString('key', key);
    const [name, params] = ruleArgs(rule);
    const args = [`RL.${name}`, key, ...params, ...optionArgs(opts)];
    return this.decide(key, args, 'none');
  }

  tokenBucket(key: string, p: { capacity: number; refillCount: number; refillMs: number }, opts?: CallOptions) {
    return this.limit(key, { algorithm: 'tokenbucket', ...p }, opts);
  }
  leakyBucket(key: string, p: { capacity: number; leakCount: number; leakMs: number }, opts?: CallOptions) {
    return this.limit(key, { algorithm: 'leakybucket', ...p }, opts);
  }
  sliding(key: string, p: { limit: number; windowMs: number }, opts?: CallOptions) {
    return this.limit(key, { algorithm: 'sliding', ...p }, opts);
  }
  hashWindow(key: string, p: { limit: number; windowMs: number; bucketMs: number }, opts?: CallOptions) {
    return this.limit(key, { algorithm: 'hashwindow', ...p }, opts);
  }
  fixedWindow(key: string, p: { limit: number; windowMs: number }, opts?: CallOptions) {
    return this.limit(key, { algorithm: 'fixedwindow', ...p }, opts);
  }
  /** `RL.HIT name key`: the policy `name` applied to the limiter in `key`. */
  hit(policy: string, key: string, opts?: CallOptions): Promise<Decision> {
    checkPolicyName(policy);
    checkString('key', key);
    return this.decide(key, ['RL.HIT', policy, key, ...optionArgs(opts)], 'none');
  }

  /**
   * `RL.ALL`: every limiter admits, or nothing changes anywhere. `deniedBy`
   * is the 0-based index of the first that denied. In a cluster the keys
   * must share a slot (a hash tag such as `{order:create}`).
   */
  all(limits: ReadonlyArray<{ key: string; rule: Spec }>, opts?: Pick<CallOptions, 'cost'>): Promise<Decision> {
    if (!Array.isArray(limits) || limits.length === 0) {
      throw new RLArgumentError('limits', 'RL.ALL needs at least one { key, rule }');
    }
    const keys = limits.map((l, n) => checkString(`limits[${n}].key`, l?.key));
    const specs: string[] = [];
    limits.forEach((l, n) => {
      if (l.rule && 'policy' in l.rule) specs.push('POLICY', checkPolicyName(l.rule.policy));
      else {
        const [name, params] = ruleArgs(l.rule, `limits[${n}].rule`);
        specs.push(name, ...params);
      }
    });
    const args = ['RL.ALL', String(keys.length), ...keys, ...specs, ...optionArgs(opts)];
    return this.decide(keys[0] as string, args, 'deniedBy');
  }

  /** `RL.POLICY SET` on every master (policies are node state). */
  async policySet(name: string, rule: Rule, opts: PolicyOptions = {}): Promise<void> {
    checkPolicyName(name);
    const [alg, params] = ruleArgs(rule);
    const args = ['RL.POLICY', 'SET', name, alg, ...params];
    if (opts.mode !== undefined) {
      if (!['ENFORCE', 'SHADOW', 'OFF'].includes(opts.mode)) throw new RLArgumentError('mode', `mode must be ENFORCE, SHADOW or OFF, got ${String(opts.mode)}`);
      args.push('MODE', opts.mode);
    }
    if (opts.rollout !== undefined) args.push('ROLLOUT', String(checkInteger('rollout', opts.rollout, 0, 100)));
    await this.everyMaster(args);
  }

  /** `RL.POLICY GET`: the rule and its counters as an object, or null. */
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

  /** Sends a limiter command and parses its decision. */
  async decide(key: string, args: string[], sixth: 'deniedBy' | 'none'): Promise<Decision> {
    return Decision.fromReply(await this.send(key, args), sixth);
  }

  /** Sends one command to the owner of `key`, mapping server errors. */
  async send(key: string | undefined, args: string[]): Promise<unknown> {
    try {
      return await this.transport.call(key, args);
    } catch (err) {
      throw fromServerError(err, args[0] as string);
    }
  }

  private async everyMaster(args: string[]): Promise<unknown[]> {
    try {
      return await this.transport.eachMaster(args);
    } catch (err) {
      throw fromServerError(err, `${args[0]} ${args[1]}`);
    }
  }
}

function checkPolicyName(name: unknown): string {
  if (typeof name !== 'string' || !/^[!-~]{1,256}$/.test(name)) {
    throw new RLArgumentError('policy', `a policy name is 1 to 256 printable ASCII bytes without spaces, got ${JSON.stringify(name)}`);
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

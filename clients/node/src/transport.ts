/**
 * The one place that knows the Redis clients: node-redis (v4, v5) and ioredis
 * (v5, v6), standalone and cluster, or any function shaped like
 * rate-limit-redis's `sendCommand`. Everything else sends through `call`.
 *
 * In a cluster every command goes straight to the master of its key's slot,
 * in one round trip: the module's commands are unknown to the clients' own
 * key tables (ioredis would send them to a random node and follow a
 * `MOVED`), so the routing key is given here: argv[1] for limiter commands,
 * argv[2] for `RL.HIT`, the first key after numkeys for `RL.ALL`.
 */

/** rate-limit-redis's `sendCommand`: the command and its arguments as strings. */
export type SendCommandFn = (...args: string[]) => Promise<unknown>;

/** rate-limit-redis's `sendCommandCluster`. */
export type SendCommandClusterFn = (details: {
  key: string;
  isReadOnly: boolean;
  command: string[];
}) => Promise<unknown>;

/** How this kit talks to Redis. */
export interface Transport {
  /** Sends `args` (command first) to the node owning `key` (any node when undefined). */
  call(key: string | undefined, args: string[], readOnly?: boolean): Promise<unknown>;
  /** Every master (a single entry when standalone), for `MODULE LIST` and `RL.POLICY SET`. */
  eachMaster(args: string[]): Promise<unknown[]>;
  /**
   * Every master, each reply or failure on its own (the protection loop
   * reads the masters that answer). Optional: without it, `eachMaster`'s
   * one outcome stands for every master.
   */
  eachMasterSettled?(args: string[]): Promise<Array<PromiseSettledResult<unknown>>>;
}

/** `args` on every master of `t`, each reply or failure on its own. */
export async function eachMasterSettled(t: Transport, args: string[]): Promise<Array<PromiseSettledResult<unknown>>> {
  if (t.eachMasterSettled) return t.eachMasterSettled(args);
  try {
    return (await t.eachMaster(args)).map((value) => ({ status: 'fulfilled', value }));
  } catch (reason) {
    return [{ status: 'rejected', reason }];
  }
}

/** Runs one call per master, settled one by one. */
function settled(calls: Array<() => Promise<unknown>>): Promise<Array<PromiseSettledResult<unknown>>> {
  return Promise.allSettled(calls.map((f) => Promise.resolve().then(f)));
}

/** A node-redis, ioredis client or cluster, a `sendCommand` function, or a ready `Transport`. */
export type RedisLike = unknown;

type AnyFn = (...a: unknown[]) => Promise<unknown>;
interface Dict {
  [k: string]: unknown;
}

function isFn(x: unknown): x is AnyFn {
  return typeof x === 'function';
}

/** Wraps what the user gave into a `Transport`. */
export function toTransport(client: RedisLike): Transport {
  if (client === null || client === undefined) {
    throw new TypeError('a Redis client is required (node-redis or ioredis, standalone or cluster)');
  }
  if (isFn(client)) return fromSendCommand(client as SendCommandFn);
  const c = client as Dict;
  if (isFn(c['call']) && isFn(c['eachMaster'])) return client as Transport;
  // ioredis: `call` and `status`; its Cluster says `isCluster`.
  if (isFn(c['call']) && typeof c['status'] === 'string') {
    return c['isCluster'] === true ? ioredisCluster(c) : ioredisStandalone(c);
  }
  if (isFn(c['sendCommand'])) {
    return isFn(c['getSlotRandomNode']) ? nodeRedisCluster(c) : nodeRedisStandalone(c);
  }
  throw new TypeError(
    'unsupported Redis client: pass a node-redis client or cluster (createClient/createCluster), ' +
      'an ioredis Redis or Cluster, or a sendCommand function',
  );
}

/** rate-limit-redis's `sendCommand` (standalone) or `sendCommandCluster`. */
export function fromSendCommand(send: SendCommandFn, sendCluster?: SendCommandClusterFn): Transport {
  return {
    call(key, args, readOnly = false) {
      if (sendCluster && key !== undefined) return sendCluster({ key, isReadOnly: readOnly, command: args });
      return send(...args);
    },
    async eachMaster(args) {
      return [await send(...args)];
    },
  };
}

function ioredisStandalone(c: Dict): Transport {
  const call = c['call'] as AnyFn;
  return {
    call: (_key, args) => call.apply(c, args),
    async eachMaster(args) {
      return [await call.apply(c, args)];
    },
  };
}

type CommandCtor = new (name: string, args: string[], options: Dict) => Dict & { promise: Promise<unknown> };

function ioredisCluster(c: Dict): Transport {
  const send = c['sendCommand'] as (cmd: unknown) => unknown;
  const nodes = c['nodes'] as (role?: string) => Dict[];
  // ioredis's Command class, of the very ioredis (v5 or v6) the application
  // uses: learnt from the first command ioredis builds itself. A command
  // whose slot is set before sending goes to that slot's master.
  let Command: CommandCtor | undefined;
  let learning = true;
  const learn = (key: string | undefined, args: string[]): Promise<unknown> => {
    const own = Object.prototype.hasOwnProperty.call(c, 'sendCommand');
    const restore = () => {
      if (own) c['sendCommand'] = send;
      else delete c['sendCommand'];
    };
    c['sendCommand'] = (cmd: Dict, ...rest: unknown[]) => {
      restore();
      Command = cmd.constructor as CommandCtor;
      if (key !== undefined) cmd['slot'] = keySlot(key);
      return (send as (...a: unknown[]) => unknown).call(c, cmd, ...rest);
    };
    try {
      const [name, ...rest] = args as [string, ...string[]];
      const p = (c['call'] as AnyFn).call(c, name, ...rest);
      return p;
    } finally {
      restore();
    }
  };
  return {
    async call(key, args) {
      if (!Command && learning) {
        // Sent by ioredis itself either way, so never twice. With
        // auto-pipelining it is queued instead: this one may take a MOVED,
        // the next ones use the Command class of the ioredis we import.
        learning = false;
        return learn(key, args);
      }
      if (!Command) {
        const mod = (await import('ioredis')) as unknown as Dict & { default?: Dict };
        Command = (mod['Command'] ?? mod.default?.['Command']) as CommandCtor;
      }
      const [name, ...rest] = args as [string, ...string[]];
      const cmd = new Command(name, rest, { replyEncoding: 'utf8' });
      if (key !== undefined) cmd['slot'] = keySlot(key);
      send.call(c, cmd);
      return cmd.promise;
    },
    eachMaster(args) {
      return Promise.all(nodes.call(c, 'master').map((n) => (n['call'] as AnyFn).apply(n, args)));
    },
    eachMasterSettled(args) {
      return settled(nodes.call(c, 'master').map((n) => () => (n['call'] as AnyFn).apply(n, args)));
    },
  };
}

function nodeRedisStandalone(c: Dict): Transport {
  const send = c['sendCommand'] as AnyFn;
  return {
    call: (_key, args) => send.call(c, args),
    async eachMaster(args) {
      return [await send.call(c, args)];
    },
  };
}

function nodeRedisCluster(c: Dict): Transport {
  const send = c['sendCommand'] as AnyFn;
  const perMaster = async (args: string[]): Promise<Array<Promise<unknown>>> => {
    const masters = (isFn(c['getMasters']) ? await (c['getMasters'] as AnyFn).call(c) : c['masters']) as Dict[];
    const nodeClient = c['nodeClient'] as ((m: Dict) => unknown) | undefined;
    if (!Array.isArray(masters) || !nodeClient) return [send.call(c, undefined, false, args)];
    return masters.map(async (m) => {
      const client = (await nodeClient.call(c, m)) as Dict;
      return (client['sendCommand'] as AnyFn).call(client, args);
    });
  };
  return {
    call: (key, args, readOnly = false) => send.call(c, key, readOnly, args),
    async eachMaster(args) {
      return Promise.all(await perMaster(args));
    },
    async eachMasterSettled(args) {
      return settled((await perMaster(args).catch((err: unknown) => [Promise.reject(err)])).map((p) => () => p));
    },
  };
}

/** The cluster slot of a key: CRC16 (XMODEM) of its hash tag or whole name, mod 16384. */
export function keySlot(key: string): number {
  let bytes = Buffer.from(key);
  const open = bytes.indexOf(0x7b); // {
  if (open >= 0) {
    const close = bytes.indexOf(0x7d, open + 1); // }
    if (close > open + 1) bytes = bytes.subarray(open + 1, close);
  }
  let crc = 0;
  for (const b of bytes) {
    crc ^= b << 8;
    for (let i = 0; i < 8; i++) crc = crc & 0x8000 ? ((crc << 1) ^ 0x1021) & 0xffff : (crc << 1) & 0xffff;
  }
  return crc % 16384;
}

/**
 * A connection of its own, for commands that the server may hold (`BLOCK`):
 * on the application's multiplexed client a held reply would stall every
 * command queued behind it.
 */
export interface DedicatedConnection {
  transport: Transport;
  /** Still usable for the next command. */
  healthy(): boolean;
  /** Closes at once; a command still waiting on it is rejected. */
  close(): void;
}

/** What opens dedicated connections (see `ClientOptions.connect`). */
export type ConnectionFactory = () => Promise<DedicatedConnection>;

/**
 * Opens connections like `client`'s, from its own settings (`duplicate()`),
 * with what a held command needs: no command timeout of the client's (the
 * kit sets the deadline), and no resending of a command whose connection
 * dropped (a limiter write is never retried). Undefined for a client that
 * cannot be duplicated (a `sendCommand` function, a `Transport`).
 */
export function dedicatedConnector(client: RedisLike): ConnectionFactory | undefined {
  if (client === null || typeof client !== 'object') return undefined;
  const c = client as Dict;
  if (!isFn(c['duplicate'])) return undefined;
  if (isFn(c['call']) && typeof c['status'] === 'string') {
    const held = { commandTimeout: undefined, autoResendUnfulfilledCommands: false, lazyConnect: true };
    if (c['isCluster'] === true) {
      const options = (c['options'] ?? {}) as Dict;
      const redisOptions = { ...((options['redisOptions'] ?? {}) as Dict), ...held };
      return () => connectOrClose((c['duplicate'] as (n: unknown[], o: Dict) => Dict).call(c, [], { redisOptions, lazyConnect: true }));
    }
    return () => connectOrClose((c['duplicate'] as (o: Dict) => Dict).call(c, held));
  }
  if (isFn(c['sendCommand'])) {
    const cluster = isFn(c['getSlotRandomNode']);
    return async () => {
      const options = (c['options'] ?? {}) as Dict;
      // A standalone client that lost its connection rejects what waited on
      // it and is not reused; reconnecting is for the next acquire to do.
      const overrides = cluster ? undefined : { socket: { ...((options['socket'] ?? {}) as Dict), reconnectStrategy: false } };
      const d = (c['duplicate'] as (o?: Dict) => Dict).call(c, overrides);
      return connectOrClose(d);
    };
  }
  return undefined;
}

/** Connects a duplicate; one that cannot connect is closed, not left reconnecting. */
async function connectOrClose(d: Dict): Promise<DedicatedConnection> {
  // Errors reach the command that waits on the connection; unheard, an
  // 'error' event would crash the process (node-redis) or be logged (ioredis).
  (d['on'] as (e: string, f: () => void) => void).call(d, 'error', () => {});
  const conn = ownConnection(d);
  try {
    await (d['connect'] as AnyFn).call(d);
  } catch (err) {
    conn.close();
    throw err;
  }
  return conn;
}

/**
 * A client the application opened for acquire (`ClientOptions.connect`), as a
 * dedicated connection: node-redis or ioredis, connected.
 */
export function ownConnection(client: RedisLike): DedicatedConnection {
  const d = client as Dict;
  return {
    transport: toTransport(client),
    healthy: () => (typeof d['status'] === 'string' ? d['status'] === 'ready' : d['isReady'] !== false),
    close: () => {
      const close = [d['destroy'], d['disconnect'], d['quit']].find(isFn);
      try {
        (close?.call(d) as Promise<unknown> | undefined)?.catch?.(() => {});
      } catch {
        // already closed
      }
    },
  };
}

/**
 * Settles when `client` can take commands: at once when it is ready (or is a
 * `sendCommand` function or a `Transport`, which say nothing of it); after
 * its `ready` event while it connects, at most `timeoutMs`. Rejects with a
 * message (for `RLConnectionError`) when it is closed, was never connected,
 * or is still not ready by then. An ioredis client made with `lazyConnect`
 * and not yet connected is connected, as its first command would.
 */
export async function whenReady(client: RedisLike, timeoutMs: number): Promise<void> {
  if (client === null || typeof client !== 'object') return;
  const c = client as Dict;
  let name: string;
  if (typeof c['status'] === 'string' && isFn(c['call'])) {
    name = c['isCluster'] === true ? 'the ioredis cluster' : 'the ioredis client';
    const status = c['status'];
    if (status === 'ready') return;
    if (status === 'end') throw new Error(`${name} is closed (status end)`);
    if (status === 'wait' && isFn(c['connect'])) (c['connect'] as AnyFn).call(c).catch(() => {});
  } else if (isFn(c['sendCommand']) && typeof c['isOpen'] === 'boolean') {
    name = isFn(c['getSlotRandomNode']) ? 'the node-redis cluster' : 'the node-redis client';
    if (!c['isOpen']) throw new Error(`${name} is not connected: await client.connect() first`);
    // A cluster is open once its connect() resolved; a client says isReady.
    if (c['isReady'] !== false) return;
  } else {
    return;
  }
  const on = c['on'] as ((e: string, f: (...a: unknown[]) => void) => void) | undefined;
  const off = (c['off'] ?? c['removeListener']) as ((e: string, f: (...a: unknown[]) => void) => void) | undefined;
  if (!isFn(on) || !isFn(off)) return;
  let lastError: unknown;
  await new Promise<void>((resolve, reject) => {
    const done = (err?: Error) => {
      clearTimeout(timer);
      off.call(c, 'ready', onReady);
      off.call(c, 'end', onEnd);
      off.call(c, 'error', onError);
      if (err) reject(err);
      else resolve();
    };
    const onReady = () => done();
    const onEnd = () => done(new Error(`${name} closed before it was ready${lastError instanceof Error ? ` (${lastError.message})` : ''}`));
    const onError = (err: unknown) => {
      lastError = err;
    };
    const timer = setTimeout(
      () => done(new Error(`${name} was not ready within ${timeoutMs} ms${lastError instanceof Error ? ` (${lastError.message})` : ''}`)),
      timeoutMs,
    );
    on.call(c, 'ready', onReady);
    on.call(c, 'end', onEnd);
    on.call(c, 'error', onError);
  });
}

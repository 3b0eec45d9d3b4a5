// RateLimiterRL against rate-limiter-flexible's own RateLimiterRedis: the same
// call sequences, one on a plain redis-server, one on a server with the
// module, compared point by point; then what only RateLimiterRL has to show.
import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';
import http from 'node:http';
import {
  BurstyRateLimiter,
  RateLimiterCompatibleAbstract,
  RateLimiterMemory,
  RateLimiterQueue,
  RateLimiterRedis,
  RateLimiterRes as FlexRes,
  RateLimiterUnion,
} from 'rate-limiter-flexible';
import { createClient } from 'redis';
import { Redis } from 'ioredis';
import { RateLimiterRL, RateLimiterRes, InvalidArgumentError, RLConnectionError, RLError, ModuleMissingError } from 'redis-ratelimit';
import { clusterKinds, sleep, startCluster, startServer } from './servers.mjs';

let withModule;
let plain;
before(async () => {
  [withModule, plain] = await Promise.all([startServer(), startServer({ module: false })]);
});
after(async () => {
  await Promise.all([withModule?.stop(), plain?.stop()]);
});

const clients = {
  ioredis: {
    async make(port, extra = {}) {
      const c = new Redis({ port, host: '127.0.0.1', lazyConnect: true, ...extra });
      c.on('error', () => {});
      await c.connect();
      return c;
    },
    close: (c) => c.disconnect(),
    flexOptions: {},
  },
  'node-redis': {
    async make(port) {
      const c = createClient({ url: `redis://127.0.0.1:${port}` });
      c.on('error', () => {});
      await c.connect();
      return c;
    },
    close: (c) => c.destroy(),
    flexOptions: { useRedisPackage: true },
  },
};

/** How a call ended: resolved or rejected, and with what. */
async function outcome(promise) {
  try {
    const v = await promise;
    return { how: 'resolved', ...shape(v) };
  } catch (e) {
    if (e instanceof Error) return { how: 'error', message: e.message };
    return { how: 'rejected', ...shape(e) };
  }
}
function shape(v) {
  if (v === null || typeof v !== 'object') return { value: v };
  assert.ok(v instanceof FlexRes || v instanceof RateLimiterRes, 'a RateLimiterRes');
  const { remainingPoints, msBeforeNext, consumedPoints, isFirstInDuration } = v;
  return { remainingPoints, msBeforeNext, consumedPoints, isFirstInDuration };
}

/**
 * Runs `steps` (each (limiter, key) => promise, or a number: ms to sleep) on
 * both limiters and compares every result; msBeforeNext within `slackMs`
 * (the two servers' clocks and the sliding log's 1 ms of rounding up), plus
 * the time the steps took.
 * The one difference by design, listed in docs/clients.md: a denied consume
 * takes nothing in the module, while RateLimiterRedis's counter also counts
 * it; at the steps in `deniedCounted`, where RateLimiterRedis's count holds
 * points it denied (or refused during a block), RateLimiterRL's
 * consumedPoints is lower; every other field is the same.
 */
async function compare(kind, options, steps, { slackMs = 40, deniedCounted = [] } = {}) {
  const c = clients[kind];
  const [mc, pc] = await Promise.all([c.make(withModule.port), c.make(plain.port)]);
  try {
    const key = `k${Math.random().toString(36).slice(2)}`;
    const ours = new RateLimiterRL({ storeClient: mc, ...options });
    const theirs = new RateLimiterRedis({ storeClient: pc, ...c.flexOptions, ...options });
    let n = 0;
    // Where the two windows start apart (a fixed window from the first
    // consume, a sliding one per point), they differ by the time the steps
    // themselves took: on a loaded host, more than slackMs.
    let busyMs = 0;
    for (const step of steps) {
      if (typeof step === 'number') {
        await sleep(step);
        continue;
      }
      n++;
      const t0 = Date.now();
      const [a, b] = await Promise.all([outcome(step(theirs, key)), outcome(step(ours, key))]);
      busyMs += Date.now() - t0;
      const where = `step ${n}: RateLimiterRedis ${JSON.stringify(a)}, RateLimiterRL ${JSON.stringify(b)}, steps took ${busyMs} ms`;
      assert.equal(b.how, a.how, where);
      if (typeof a.msBeforeNext === 'number') {
        assert.ok(Math.abs(a.msBeforeNext - b.msBeforeNext) <= slackMs + busyMs, where);
        delete a.msBeforeNext;
        delete b.msBeforeNext;
      }
      if (deniedCounted.includes(n)) {
        assert.ok(b.consumedPoints < a.consumedPoints, where);
        delete a.consumedPoints;
        delete b.consumedPoints;
      }
      assert.deepEqual(b, a, where);
    }
  } finally {
    c.close(mc);
    c.close(pc);
  }
}

const consume = (n) => (l, k) => l.consume(k, n);
const get = (l, k) => l.get(k);

for (const kind of Object.keys(clients)) {
  describe(`RateLimiterRL and RateLimiterRedis on ${kind}: the same outcomes`, () => {
    const opts = { points: 3, duration: 5 };
    test('consume within and over points', () => compare(kind, opts, [consume(1), consume(1), consume(1), consume(1)]));
    test('consume with a cost above points', () => compare(kind, opts, [consume(4)]));
    test('consume several points at once, then over', () => compare(kind, opts, [consume(2), consume(2)]));
    test('get of a fresh and of a used key', () => compare(kind, opts, [get, consume(2), get]));
    test('delete', () => compare(kind, opts, [consume(3), (l, k) => l.delete(k), (l, k) => l.delete(k), get, consume(1)]));
    test('reward', () => compare(kind, opts, [consume(3), (l, k) => l.reward(k, 2), consume(2), consume(1)]));
    test('penalty, within the limit and beyond it', () =>
      compare(kind, opts, [(l, k) => l.penalty(k, 1), consume(1), (l, k) => l.penalty(k, 2), consume(1)], { deniedCounted: [4] }));
    test('block, then consume while blocked', () =>
      compare(kind, opts, [(l, k) => l.block(k, 2), consume(1), 300, consume(1)], { deniedCounted: [3] }));
    test('blockDuration: over points blocks for blockDuration, then the key is fresh', () =>
      compare(kind, { points: 2, duration: 1, blockDuration: 2 }, [consume(1), consume(1), consume(1), 1200, consume(1), 1000, consume(1)]));
    test('keyPrefix, and an empty one', async () => {
      await compare(kind, { ...opts, keyPrefix: 'login' }, [consume(3), consume(1), get], { deniedCounted: [3] });
      await compare(kind, { ...opts, keyPrefix: '' }, [consume(2), get]);
    });
    test('msBeforeNext after a denial counts down from the first consume', () =>
      compare(kind, opts, [consume(3), 1000, consume(1), 500, consume(1)], { deniedCounted: [3] }));
    test('inMemoryBlockOnConsumed: blocked in memory without a round trip', () =>
      compare(kind, { ...opts, inMemoryBlockOnConsumed: 4, inMemoryBlockDuration: 2 }, [consume(3), consume(1), consume(1), get], { deniedCounted: [4] }));
  });
}

describe('RateLimiterRL', () => {
  let io;
  before(async () => {
    io = await clients.ioredis.make(withModule.port);
  });
  after(() => io.disconnect());

  test('keyPrefix: keys live under it, and two prefixes do not share points', async () => {
    const a = new RateLimiterRL({ storeClient: io, points: 1, duration: 5, keyPrefix: 'login' });
    const b = new RateLimiterRL({ storeClient: io, points: 1, duration: 5, keyPrefix: 'signup' });
    await a.consume('u');
    await b.consume('u');
    await assert.rejects(a.consume('u'), RateLimiterRes);
    assert.equal(a.getKey('u'), 'login:u');
    assert.deepEqual((await io.keys('login:u*')).sort(), ['login:u:rl']);
  });

  test('the in-memory block answers without Redis', async () => {
    const l = new RateLimiterRL({ storeClient: io, points: 1, duration: 5, inMemoryBlockOnConsumed: 2, inMemoryBlockDuration: 5 });
    await l.consume('mem');
    await assert.rejects(l.consume('mem'));
    const before = await io.info('commandstats');
    const res = await l.consume('mem').catch((r) => r);
    assert.ok(res instanceof RateLimiterRes && res.msBeforeNext > 4000);
    assert.equal(await io.info('commandstats').then((s) => s.match(/cmdstat_RL.SLIDING:calls=(\d+)/i)?.[1]), before.match(/cmdstat_RL.SLIDING:calls=(\d+)/i)?.[1]);
  });

  test('reward is REFUND: never above a fresh key (RateLimiterRedis would give points + 1)', async () => {
    const l = new RateLimiterRL({ storeClient: io, points: 3, duration: 5 });
    const r = await l.reward('fresh', 1);
    assert.equal(r.remainingPoints, 3);
    for (let i = 0; i < 3; i++) await l.consume('fresh');
    await assert.rejects(l.consume('fresh'), RateLimiterRes);
  });

  test('block(key, 0) holds until delete: consume and get say msBeforeNext -1', async () => {
    const l = new RateLimiterRL({ storeClient: io, points: 2, duration: 5 });
    assert.equal((await l.block('forever', 0)).msBeforeNext, -1);
    assert.equal((await l.consume('forever').catch((r) => r)).msBeforeNext, -1);
    assert.equal((await l.get('forever')).msBeforeNext, -1);
    assert.equal(await l.delete('forever'), true);
    assert.equal((await l.consume('forever')).remainingPoints, 1);
  });

  test('a denial takes nothing: get after denials shows what was admitted', async () => {
    const l = new RateLimiterRL({ storeClient: io, points: 2, duration: 5 });
    await l.consume('den', 2);
    for (let i = 0; i < 3; i++) await assert.rejects(l.consume('den'));
    assert.equal((await l.get('den')).consumedPoints, 2);
  });

  test('bad input is a clear error and writes nothing', async () => {
    await io.flushall();
    const bad = [
      [() => new RateLimiterRL({ storeClient: io, points: -1 }), 'points'],
      [() => new RateLimiterRL({ storeClient: io, points: '5' }), 'points'],
      [() => new RateLimiterRL({ storeClient: io, duration: 1.5 }), 'duration'],
      [() => new RateLimiterRL({ storeClient: io, duration: 0 }), 'duration'],
      [() => new RateLimiterRL({ storeClient: io, keyPrefix: 7 }), 'keyPrefix'],
      [() => new RateLimiterRL({ storeClient: io, blockDuration: -2 }), 'blockDuration'],
      [() => new RateLimiterRL({ points: 5 }), 'storeClient'],
      [() => new RateLimiterRL({ storeClient: io, insuranceLimiter: {} }), 'insuranceLimiter'],
      [() => new RateLimiterRL({ storeClient: io, execEvenly: true }), 'execEvenly'],
    ];
    for (const [make, argument] of bad) assert.throws(make, (e) => e instanceof InvalidArgumentError && e.argument === argument, argument);
    const l = new RateLimiterRL({ storeClient: io, points: 5 });
    const calls = [
      [() => l.consume('u', -1), 'pointsToConsume'],
      [() => l.consume('u', 1.5), 'pointsToConsume'],
      [() => l.penalty('u', -3), 'points'],
      [() => l.reward('u', 'x'), 'points'],
      [() => l.block('u', -1), 'secDuration'],
    ];
    for (const [call, argument] of calls) {
      // A rejected promise, never a synchronous throw: `.then().catch()` handles it.
      let p;
      assert.doesNotThrow(() => {
        p = call();
      }, argument);
      await assert.rejects(p, (e) => e instanceof InvalidArgumentError && e.argument === argument, argument);
    }
    assert.equal(await io.dbsize(), 0);
  });

  test('a server without the module: a clear error, even with an insurance limiter', async () => {
    const pc = await clients.ioredis.make(plain.port);
    try {
      const l = new RateLimiterRL({ storeClient: pc, points: 5, insuranceLimiter: new RateLimiterMemory({ points: 5, duration: 1 }) });
      await assert.rejects(l.checkModule(), (e) => e instanceof ModuleMissingError && /MODULE LIST/.test(e.message));
      await assert.rejects(l.consume('u'), (e) => e instanceof ModuleMissingError && /not loaded/.test(e.message));
      assert.equal(await pc.exists('rlflx:u:rl', 'rlflx:u:rl:block'), 0);
    } finally {
      pc.disconnect();
    }
  });

  test('Redis killed mid-run: the insurance limiter decides, as with RateLimiterRedis', async () => {
    const [mod, pl] = await Promise.all([startServer(), startServer({ module: false })]);
    const opts = { enableOfflineQueue: false, maxRetriesPerRequest: 0, retryStrategy: () => null };
    const [mc, pc] = await Promise.all([clients.ioredis.make(mod.port, opts), clients.ioredis.make(pl.port, opts)]);
    const insured = (Cls, storeClient) => new Cls({ storeClient, points: 2, duration: 5, insuranceLimiter: new RateLimiterMemory({ points: 1, duration: 5 }) });
    const ours = insured(RateLimiterRL, mc);
    const theirs = insured(RateLimiterRedis, pc);
    const bare = new RateLimiterRL({ storeClient: mc, points: 2, duration: 5 });
    try {
      for (const l of [ours, theirs]) {
        assert.equal((await l.consume('u')).remainingPoints, 1);
      }
      await Promise.all([mod.kill(), pl.kill()]);
      await sleep(100);
      for (const l of [ours, theirs]) {
        // The memory limiter's own count: 1 point, so one passes and the next is limited.
        assert.equal((await l.consume('u')).remainingPoints, 0);
        const denied = await l.consume('u').catch((e) => e);
        assert.ok(denied instanceof FlexRes, 'limited by the insurance limiter');
      }
      await assert.rejects(bare.consume('u'), (e) => e instanceof Error && !(e instanceof RateLimiterRes));
    } finally {
      mc.disconnect();
      pc.disconnect();
    }
  });

  test('on a cluster, with both clients', async () => {
    const cl = await startCluster();
    try {
      for (const kind of await clusterKinds()) {
        const c = await kind.make(cl.ports);
        try {
          const l = new RateLimiterRL({ storeClient: c, points: 2, duration: 5, blockDuration: 5 });
          for (let i = 0; i < 10; i++) {
            const key = `${kind.name}:${i}`;
            assert.equal((await l.consume(key)).remainingPoints, 1);
            assert.equal((await l.consume(key)).remainingPoints, 0);
            const r = await l.consume(key).catch((e) => e);
            assert.ok(r instanceof RateLimiterRes && r.msBeforeNext === 5000, kind.name);
            assert.ok((await l.consume(key).catch((e) => e)).msBeforeNext > 4000);
            assert.equal(await l.delete(key), true);
          }
        } finally {
          kind.close(c);
        }
      }
    } finally {
      await cl.stop();
    }
  });
});

let serial = 0;
const uniq = (name) => `${name}:${process.pid}:${++serial}`;

describe('RateLimiterRL among rate-limiter-flexible’s own classes', () => {
  let io;
  before(async () => {
    io = await clients.ioredis.make(withModule.port);
  });
  after(() => io.disconnect());

  test('its results are rate-limiter-flexible’s RateLimiterRes, resolved and rejected', async () => {
    assert.equal(RateLimiterRes, FlexRes);
    const l = new RateLimiterRL({ storeClient: io, points: 1, duration: 5, keyPrefix: uniq('res') });
    const ok = await l.consume('u');
    assert.ok(ok instanceof FlexRes);
    const limited = await l.consume('u').catch((e) => e);
    assert.ok(limited instanceof FlexRes, 'the rejection is a RateLimiterRes');
    assert.ok((await l.get('u')) instanceof FlexRes);
    assert.ok((await l.penalty('u')) instanceof FlexRes);
    assert.ok((await l.reward('u')) instanceof FlexRes);
    assert.ok((await l.block('u', 1)) instanceof FlexRes);
  });

  test('BurstyRateLimiter serves from the burst limiter once RateLimiterRL is out of points', async () => {
    const bursty = new BurstyRateLimiter(
      new RateLimiterRL({ storeClient: io, points: 2, duration: 10, keyPrefix: uniq('bursty') }),
      new RateLimiterMemory({ points: 3, duration: 10, keyPrefix: uniq('burst') }),
    );
    const outcomes = [];
    for (let i = 0; i < 6; i++) outcomes.push(await bursty.consume('u').then(() => 'ok', (e) => (e instanceof FlexRes ? 'limited' : e)));
    assert.deepEqual(outcomes, ['ok', 'ok', 'ok', 'ok', 'ok', 'limited']);
  });

  test('RateLimiterUnion, RateLimiterQueue and instanceof take it as one of rate-limiter-flexible’s limiters', async () => {
    const ours = new RateLimiterRL({ storeClient: io, points: 2, duration: 10, keyPrefix: uniq('union') });
    assert.ok(ours instanceof RateLimiterCompatibleAbstract);
    assert.equal(ours.execEvenly, false);
    const union = new RateLimiterUnion(ours, new RateLimiterMemory({ points: 5, duration: 10, keyPrefix: 'mem' }));
    const first = await union.consume('u');
    assert.equal(first[ours.keyPrefix].remainingPoints, 1);
    await union.consume('u');
    const limited = await union.consume('u').catch((e) => e);
    assert.ok(limited[ours.keyPrefix] instanceof FlexRes, 'RateLimiterRL denied, named by its keyPrefix');
    const queue = new RateLimiterQueue(new RateLimiterRL({ storeClient: io, points: 2, duration: 10, keyPrefix: uniq('queue') }));
    assert.equal(await queue.removeTokens(1), 1);
    // rate-limiter-flexible's set() is not supported: a rejection, not a throw.
    await assert.rejects(ours.set('u', 1, 1), (e) => e instanceof RLError && /set\(\)/.test(e.message));
  });

  test('a bad argument in a plain node:http handler with .then().catch() is a 500, not an uncaught exception', async () => {
    const l = new RateLimiterRL({ storeClient: io, points: 5, duration: 5, keyPrefix: uniq('http') });
    const server = http.createServer((req, res) => {
      const points = Number(new URL(req.url, 'http://x').searchParams.get('points'));
      l.consume('u', points)
        .then(() => res.end('ok'))
        .catch((r) => {
          res.statusCode = r instanceof Error ? 500 : 429;
          res.end();
        });
    });
    await new Promise((r) => server.listen(0, '127.0.0.1', r));
    try {
      const url = `http://127.0.0.1:${server.address().port}`;
      assert.equal((await fetch(`${url}/?points=1`)).status, 200);
      assert.equal((await fetch(`${url}/?points=-1`)).status, 500);
      assert.equal((await fetch(`${url}/?points=9`)).status, 429);
    } finally {
      server.close();
    }
  });

  test('consume is one command per decision without blocks; with them the block is read in the same round trip', async () => {
    const calls = async () => {
      const stats = await io.info('commandstats');
      const n = (cmd) => Number(new RegExp(`cmdstat_${cmd}:calls=(\\d+)`, 'i').exec(stats)?.[1] ?? 0);
      return { sliding: n('RL.SLIDING'), pttl: n('pttl') };
    };
    const plain = new RateLimiterRL({ storeClient: io, points: 100, duration: 10, keyPrefix: uniq('one') });
    const before = await calls();
    for (let i = 0; i < 10; i++) await plain.consume('u');
    const afterPlain = await calls();
    assert.deepEqual([afterPlain.sliding - before.sliding, afterPlain.pttl - before.pttl], [10, 0]);
    // A limiter that blocks reads the block key; so does one after its own block().
    const blocking = new RateLimiterRL({ storeClient: io, points: 100, duration: 10, blockDuration: 5, keyPrefix: uniq('two') });
    for (let i = 0; i < 3; i++) await blocking.consume('u');
    const afterBlocking = await calls();
    assert.equal(afterBlocking.pttl - afterPlain.pttl, 3);
    await plain.block('banned', 5);
    const refused = await plain.consume('banned').catch((e) => e);
    assert.ok(refused instanceof FlexRes && refused.msBeforeNext > 4000, 'its own block holds');
  });

  test('get while in penalty debt reports what penalty reported', async () => {
    const l = new RateLimiterRL({ storeClient: io, points: 3, duration: 10, keyPrefix: uniq('debt') });
    await l.consume('u', 3);
    const p = await l.penalty('u', 2);
    assert.equal(p.consumedPoints, 5);
    const g = await l.get('u');
    assert.deepEqual([g.consumedPoints, g.remainingPoints], [5, 0]);
    assert.ok(g.msBeforeNext > 9000);
    // The peek changed nothing: the debt still denies, and the key is the same.
    await assert.rejects(l.consume('u'), FlexRes);
    assert.equal((await l.get('u')).consumedPoints, 5);
    const fixed = new RateLimiterRL({ storeClient: io, points: 3, duration: 3600, window: 'fixed', keyPrefix: uniq('debt-fixed') });
    await fixed.penalty('u', 5);
    assert.equal((await fixed.get('u')).consumedPoints, 5);
  });
});

describe('checkModule before the client is ready', () => {
  test('ioredis with the kit’s example settings (enableOfflineQueue: false), just created: waits and finds the module', async () => {
    const c = new Redis({ port: withModule.port, host: '127.0.0.1', enableOfflineQueue: false });
    c.on('error', () => {});
    try {
      await new RateLimiterRL({ storeClient: c, points: 5 }).checkModule();
    } finally {
      c.disconnect();
    }
  });

  test('ioredis with lazyConnect, never connected: connected and checked', async () => {
    const c = new Redis({ port: withModule.port, host: '127.0.0.1', enableOfflineQueue: false, lazyConnect: true });
    c.on('error', () => {});
    try {
      await new RateLimiterRL({ storeClient: c, points: 5 }).checkModule();
    } finally {
      c.disconnect();
    }
  });

  test('node-redis connecting: waits for ready; never connected: a connection error that says so', async () => {
    const c = createClient({ url: withModule.url, disableOfflineQueue: true });
    c.on('error', () => {});
    const connecting = c.connect();
    try {
      await new RateLimiterRL({ storeClient: c, points: 5 }).checkModule();
    } finally {
      await connecting;
      c.destroy();
    }
    const idle = createClient({ url: withModule.url });
    await assert.rejects(new RateLimiterRL({ storeClient: idle, points: 5 }).checkModule(), (e) => e instanceof RLConnectionError && /connect\(\)/.test(e.message));
  });

  test('Redis unreachable: a connection error, not "module not loaded"', async () => {
    const gone = await startServer({ module: false });
    await gone.stop();
    const c = new Redis({ port: gone.port, host: '127.0.0.1', enableOfflineQueue: false, retryStrategy: () => null });
    c.on('error', () => {});
    try {
      await assert.rejects(new RateLimiterRL({ storeClient: c, points: 5 }).checkModule(), (e) => e instanceof RLConnectionError && !(e instanceof ModuleMissingError));
    } finally {
      c.disconnect();
    }
  });
});

// RLStore in real Express apps (express-rate-limit v7 and v8) over real HTTP,
// against redis-server with the module.
import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';
import express from 'express';
import { rateLimit as rateLimit8 } from 'express-rate-limit';
import { rateLimit as rateLimit7 } from 'erl7';
import { createClient, createCluster } from 'redis';
import { Cluster, Redis } from 'ioredis';
import RLStoreDefault, { Client, InvalidArgumentError, ModuleMissingError, RLStore } from 'redis-ratelimit';
import { sleep, startCluster, startServer, STILL_MS } from './servers.mjs';

let server;
let client;
let rl;
before(async () => {
  server = await startServer();
  client = createClient({ url: server.url });
  client.on('error', () => {});
  await client.connect();
  rl = new Client(client);
});
after(async () => {
  client?.destroy();
  await server?.stop();
});

/** An Express app limited by `limiter`, with /ok (200) and /fail (500); returns its base URL and a close(). */
async function app(limiter) {
  const a = express();
  a.use(limiter);
  a.get('/ok', (_req, res) => res.send('ok'));
  a.get('/fail', (_req, res) => res.status(500).send('failed'));
  a.use((err, _req, res, _next) => res.status(500).send(`error: ${err.message}`));
  const http = await new Promise((resolve) => {
    const s = a.listen(0, '127.0.0.1', () => resolve(s));
  });
  return { url: `http://127.0.0.1:${http.address().port}`, close: () => new Promise((r) => http.close(r)) };
}

const byKey = (req) => req.get('x-user') ?? 'anon';
const get = (url, user) => fetch(url, { headers: { 'x-user': user } });

/** A store as rate-limit-redis users write it: only the class name changes. */
const storeOn = (c, extra = {}) => new RLStore({ sendCommand: (...args) => c.sendCommand(args), ...extra });

for (const [version, rateLimit] of [['v8', rateLimit8], ['v7', rateLimit7]]) {
  describe(`express-rate-limit ${version}`, () => {
    test('exactly `limit` admitted per window, concurrent requests over 3 app instances sharing one Redis', async () => {
      const limit = 20;
      const apps = [];
      const clients = [];
      for (let i = 0; i < 3; i++) {
        const c = createClient({ url: server.url });
        c.on('error', () => {});
        await c.connect();
        clients.push(c);
        apps.push(await app(rateLimit({ windowMs: 2000, limit, keyGenerator: byKey, store: storeOn(c) })));
      }
      try {
        const user = `crowd-${version}`;
        // Two windows: 90 concurrent requests in each, exactly `limit` admitted in each.
        for (let window = 0; window < 2; window++) {
          const replies = await Promise.all(Array.from({ length: 90 }, (_, i) => get(`${apps[i % 3].url}/ok`, user)));
          const codes = replies.map((r) => r.status);
          assert.equal(codes.filter((s) => s === 200).length, limit, `window ${window}`);
          assert.equal(codes.filter((s) => s === 429).length, 90 - limit, `window ${window}`);
          assert.equal((await rl.sliding(`rl:${user}:rl`, { limit, windowMs: 2000 }, { cost: 0 })).remaining, 0);
          await sleep(2100);
        }
      } finally {
        await Promise.all(apps.map((a) => a.close()));
        clients.forEach((c) => c.destroy());
      }
    });

    test("draft-8 headers carry the module's remaining and reset; Retry-After its wait_ms", async () => {
      const a = await app(rateLimit({ windowMs: 10_000, limit: 3, keyGenerator: byKey, standardHeaders: 'draft-8', legacyHeaders: false, store: storeOn(client) }));
      try {
        const user = `headers-${version}`;
        for (let i = 1; i <= 3; i++) {
          const r = await get(`${a.url}/ok`, user);
          assert.equal(r.status, 200);
          // r is the module's remaining; t its reset_ms in seconds, rounded
          // up: the log lets an entry leave 1 ms late, never early, so a
          // fresh entry's 10,001 ms reads t=11 within its first millisecond.
          const module = await rl.sliding(`rl:${user}:rl`, { limit: 3, windowMs: 10_000 }, { cost: 0 });
          assert.equal(module.remaining, 3 - i);
          assert.match(r.headers.get('ratelimit'), new RegExp(`^"3-in-10sec"; r=${3 - i}; t=(10|11)$`));
          assert.match(r.headers.get('ratelimit-policy'), /^"3-in-10sec"; q=3; w=10; pk=:/);
        }
        await sleep(2100);
        const denied = await get(`${a.url}/ok`, user);
        assert.equal(denied.status, 429);
        // The first unit leaves the sliding window 10 s after it came: about
        // 7.9 s from now (less if this machine is slow), not the 10 s of a
        // window that would restart.
        const retry = Number(denied.headers.get('retry-after'));
        assert.ok(retry === 8 || retry === 7, `Retry-After ${retry}`);
        assert.match(denied.headers.get('ratelimit'), new RegExp(`; r=0; t=${retry}$`));
      } finally {
        await a.close();
      }
    });

    test('skipFailedRequests gives failed requests their unit back (REFUND)', async () => {
      const a = await app(rateLimit({ windowMs: 60_000, limit: 3, keyGenerator: byKey, skipFailedRequests: true, store: storeOn(client) }));
      try {
        const user = `failing-${version}`;
        for (let i = 0; i < 6; i++) assert.equal((await get(`${a.url}/fail`, user)).status, 500);
        await sleep(50); // the decrements run after each response ends
        assert.equal((await rl.sliding(`rl:${user}:rl`, { limit: 3, windowMs: 60_000 }, { cost: 0 })).remaining, 3);
        for (let i = 0; i < 3; i++) assert.equal((await get(`${a.url}/ok`, user)).status, 200);
        assert.equal((await get(`${a.url}/ok`, user)).status, 429);
      } finally {
        await a.close();
      }
    });

    test('the decrement of a 429 the store answered refunds nothing: an alternating abuser stays limited', async () => {
      const a = await app(rateLimit({ windowMs: 60_000, limit: 2, keyGenerator: byKey, skipFailedRequests: true, store: storeOn(client) }));
      try {
        const user = `abuser-${version}`;
        assert.equal((await get(`${a.url}/ok`, user)).status, 200);
        assert.equal((await get(`${a.url}/ok`, user)).status, 200);
        // A store that refunded every decrement would let every other one through:
        // 429 (refund) -> 200 -> 429 (refund) -> 200 ...
        const codes = [];
        for (let i = 0; i < 10; i++) {
          codes.push((await get(`${a.url}/${i % 2 ? 'fail' : 'ok'}`, user)).status);
          await sleep(10);
        }
        assert.deepEqual(codes, Array(10).fill(429));
        assert.equal((await rl.sliding(`rl:${user}:rl`, { limit: 2, windowMs: 60_000 }, { cost: 0 })).remaining, 0);
        // A real failure after that still gets its unit back.
        await rl.sliding(`rl:${user}:rl`, { limit: 2, windowMs: 60_000 }, { refund: 2 });
        assert.equal((await get(`${a.url}/fail`, user)).status, 500);
        await sleep(50);
        assert.equal((await rl.sliding(`rl:${user}:rl`, { limit: 2, windowMs: 60_000 }, { cost: 0 })).remaining, 2);
      } finally {
        await a.close();
      }
    });
  });
}

describe('RLStore', () => {
  test('the store direct: increment, get, decrement, resetKey', async () => {
    const store = storeOn(client, { prefix: 'direct:' });
    store.init({ windowMs: 60_000, limit: 2 });
    assert.equal(store.localKeys, false);
    assert.equal(store.prefix, 'direct:');
    assert.equal(await store.get('u'), undefined);
    const first = await store.increment('u');
    assert.equal(first.totalHits, 1);
    assert.ok(first.resetTime instanceof Date && first.resetTime.getTime() > Date.now() + 59_000);
    assert.equal((await store.increment('u')).totalHits, 2);
    assert.equal((await store.increment('u')).totalHits, 3, 'a denial reports limit + 1');
    assert.equal((await store.get('u')).totalHits, 2);
    await store.decrement('u');
    assert.equal((await store.get('u')).totalHits, 1);
    await store.resetKey('u');
    assert.equal(await store.get('u'), undefined);
  });

  test('a fixed window on request (RL.FIXEDWINDOW)', async () => {
    const store = storeOn(client, { window: 'fixed', prefix: 'fixed:' });
    store.init({ windowMs: STILL_MS, limit: 1 });
    assert.equal((await store.increment('u')).totalHits, 1);
    assert.equal((await store.increment('u')).totalHits, 2);
    // The key is the fixed window's: the sliding log refuses it.
    await assert.rejects(rl.sliding('fixed:u:rl', { limit: 1, windowMs: 60_000 }), /WRONGTYPE/);
  });

  test('ioredis through sendCommand, and a client given directly', async () => {
    const io = new Redis({ port: server.port, host: '127.0.0.1' });
    try {
      for (const store of [new RLStore({ sendCommand: (cmd, ...args) => io.call(cmd, ...args), prefix: 'io1:' }), new RLStore({ client: io, prefix: 'io2:' })]) {
        store.init({ windowMs: 60_000, limit: 1 });
        assert.equal((await store.increment('u')).totalHits, 1);
        assert.equal((await store.increment('u')).totalHits, 2);
      }
    } finally {
      io.disconnect();
    }
  });

  test('a function-valued limit is refused unless the store has its own limit', async () => {
    const store = storeOn(client);
    assert.throws(() => store.init({ windowMs: 1000, limit: () => 5 }), (e) => e instanceof InvalidArgumentError && e.argument === 'limit' && /function-valued/.test(e.message));
    await assert.rejects(store.increment('fn'), (e) => e instanceof InvalidArgumentError && e.argument === 'limit');
    const own = storeOn(client, { limit: 1, prefix: 'own:' });
    own.init({ windowMs: 60_000, limit: () => 1 });
    assert.equal((await own.increment('fn')).totalHits, 1);
    assert.equal((await own.increment('fn')).totalHits, 2);
  });

  test('a server without the module: init warns at start-up, and every request fails saying so', async () => {
    const plain = await startServer({ module: false });
    const c = createClient({ url: plain.url });
    c.on('error', () => {});
    await c.connect();
    const warnings = [];
    const onWarning = (w) => warnings.push(w);
    process.on('warning', onWarning);
    try {
      const store = storeOn(c);
      store.init({ windowMs: 60_000, limit: 5 });
      await store.ready;
      await new Promise((r) => setImmediate(r));
      assert.ok(warnings.some((w) => w.code === 'RL_MODULE_NOT_LOADED' && /not loaded/.test(w.message)));
      await assert.rejects(store.increment('u'), (e) => e instanceof ModuleMissingError && /--loadmodule/.test(e.message));
      assert.equal(await c.dbSize(), 0);
    } finally {
      process.off('warning', onWarning);
      c.destroy();
      await plain.stop();
    }
  });

  test('a rename of rate-limit-redis: sendCommand and sendCommandCluster are called with this bound to the store; a default export', async () => {
    assert.equal(RLStoreDefault, RLStore);
    const seen = [];
    const store = new RLStore({
      sendCommand: function (...args) {
        seen.push(this);
        return client.sendCommand(args);
      },
      prefix: 'bound:',
    });
    store.init({ windowMs: 60_000, limit: 2 });
    assert.equal((await store.increment('u')).totalHits, 1);
    const clustered = new RLStore({
      sendCommandCluster: function ({ command }) {
        seen.push(this);
        return client.sendCommand(command);
      },
      prefix: 'bound-cluster:',
    });
    clustered.init({ windowMs: 60_000, limit: 2 });
    assert.equal((await clustered.increment('u')).totalHits, 1);
    await Promise.all([store.ready, clustered.ready]);
    assert.ok(seen.length >= 2);
    assert.ok(seen.every((t) => t === store || t === clustered));
    assert.ok(seen.includes(store) && seen.includes(clustered));
  });

  test('a limit above ratelimit.sliding-max-limit is refused at init, naming the bound', async () => {
    const warnings = [];
    const onWarning = (w) => warnings.push(w);
    process.on('warning', onWarning);
    try {
      const store = storeOn(client, { prefix: 'toolarge:' });
      store.init({ windowMs: 60_000, limit: 200_000 });
      await store.ready;
      await new Promise((r) => setImmediate(r));
      const w = warnings.find((x) => x.code === 'RL_STORE_REFUSED');
      assert.ok(w && /sliding-max-limit \(100000\)/.test(w.message), `warnings: ${warnings.map((x) => x.message)}`);
      await assert.rejects(store.increment('u'), (e) => e instanceof InvalidArgumentError && e.argument === 'limit' && /sliding-max-limit \(100000\)/.test(e.message));
      // Above any server's bound: refused at once.
      const huge = storeOn(client, { prefix: 'huge:' });
      assert.throws(() => huge.init({ windowMs: 60_000, limit: 20_000_000 }), (e) => e instanceof InvalidArgumentError && e.argument === 'limit' && /sliding-max-limit/.test(e.message));
      // A fixed window has no such bound.
      const fixed = storeOn(client, { prefix: 'largefixed:', window: 'fixed' });
      fixed.init({ windowMs: 60_000, limit: 200_000 });
      await fixed.ready;
      assert.equal((await fixed.increment('u')).totalHits, 1);
      assert.equal(await client.exists('toolarge:\u0000init-check:rl'), 0, 'the check creates nothing');
    } finally {
      process.off('warning', onWarning);
    }
  });

  test('bad options are clear errors and write nothing', async () => {
    assert.throws(() => new RLStore({ sendCommand: 'redis://x' }), (e) => e.argument === 'sendCommand');
    assert.throws(() => new RLStore({}), (e) => e.argument === 'sendCommand');
    assert.throws(() => storeOn(client, { prefix: 5 }), (e) => e.argument === 'prefix');
    assert.throws(() => storeOn(client, { window: 'moving' }), (e) => e.argument === 'window');
    assert.throws(() => storeOn(client, { limit: -3 }), (e) => e.argument === 'limit');
    const store = storeOn(client, { prefix: 'bad:' });
    assert.throws(() => store.init({ windowMs: -1, limit: 5 }), (e) => e.argument === 'windowMs');
    assert.throws(() => store.init({ windowMs: 1000, limit: -5 }), (e) => e.argument === 'limit');
    await assert.rejects(store.increment('u'), (e) => e.argument === 'limit');
    assert.equal(await client.exists('bad:u:rl'), 0);
  });

  test('a cluster through rate-limit-redis’s sendCommandCluster (node-redis) and an ioredis Cluster, one round trip, no MOVED', async () => {
    const cl = await startCluster();
    const cluster = createCluster({ rootNodes: cl.ports.map((p) => ({ url: `redis://127.0.0.1:${p}` })) });
    cluster.on('error', () => {});
    await cluster.connect();
    try {
      const store = new RLStore({
        sendCommandCluster: ({ key, isReadOnly, command }) => cluster.sendCommand(key, isReadOnly, command),
      });
      store.init({ windowMs: 60_000, limit: 2 });
      const moved = cl.errorstat('MOVED');
      for (let i = 0; i < 30; i++) {
        assert.equal((await store.increment(`user${i}`)).totalHits, 1);
        await store.decrement(`user${i}`);
        assert.equal(await store.get(`user${i}`), undefined);
      }
      assert.equal(cl.errorstat('MOVED'), moved);
      // ioredis's Cluster, given as the client.
      const io = new Cluster(cl.ports.map((port) => ({ host: '127.0.0.1', port })));
      await new Promise((resolve) => io.once('ready', resolve));
      try {
        const ioStore = new RLStore({ client: io, prefix: 'io:' });
        ioStore.init({ windowMs: 60_000, limit: 1 });
        for (let i = 0; i < 30; i++) {
          assert.equal((await ioStore.increment(`user${i}`)).totalHits, 1);
          assert.equal((await ioStore.increment(`user${i}`)).totalHits, 2);
        }
        assert.equal(cl.errorstat('MOVED'), moved);
      } finally {
        io.disconnect();
      }
    } finally {
      cluster.destroy();
      await cl.stop();
    }
  });

  test('passOnStoreError with Redis unreachable: admissions carry the account’s remaining, then 429 at the share', async () => {
    const closed = createClient({ url: server.url }); // never connected: every command fails at once
    const logger = { error() {}, warn() {}, info() {} };
    // A limit of 10 over 2 instances: a share of 6.
    const a = await app(
      rateLimit8({ windowMs: 60_000, limit: 10, keyGenerator: byKey, passOnStoreError: true, standardHeaders: 'draft-8', logger, validate: false, store: storeOn(closed, { instances: 2, prefix: 'share:' }) }),
    );
    try {
      const remaining = [];
      for (let i = 0; i < 7; i++) {
        const r = await get(`${a.url}/ok`, 'k');
        remaining.push(r.status === 200 ? Number(/r=(\d+)/.exec(r.headers.get('ratelimit'))[1]) : r.status);
      }
      assert.deepEqual(remaining, [5, 4, 3, 2, 1, 0, 429]);
    } finally {
      await a.close();
    }
  });

  test('Redis killed mid-run: with passOnStoreError the store’s account decides, without it requests fail', async () => {
    const doomed = await startServer();
    const c = createClient({ url: doomed.url, disableOfflineQueue: true, socket: { reconnectStrategy: false } });
    c.on('error', () => {});
    await c.connect();
    const logger = { error() {}, warn() {}, info() {} };
    const passing = await app(rateLimit8({ windowMs: 60_000, limit: 1, keyGenerator: byKey, passOnStoreError: true, store: storeOn(c, { prefix: 'p:' }), validate: false }));
    const failing = await app(rateLimit8({ windowMs: 60_000, limit: 1, keyGenerator: byKey, store: storeOn(c, { prefix: 'f:' }), validate: false }));
    const origError = console.error;
    try {
      assert.equal((await get(`${passing.url}/ok`, 'k')).status, 200);
      assert.equal((await get(`${passing.url}/ok`, 'k')).status, 429);
      await doomed.kill();
      await sleep(100);
      console.error = logger.error;
      // Redis admitted 1 for this instance; its share of a limit of 1 is
      // ceil(1 x 1.1) = 2: one more passes, then 429s, never a pass-through.
      assert.equal((await get(`${passing.url}/ok`, 'k')).status, 200);
      assert.equal((await get(`${passing.url}/ok`, 'k')).status, 429);
      assert.equal((await get(`${passing.url}/ok`, 'other')).status, 200, 'another key has its own account');
      assert.equal((await get(`${failing.url}/ok`, 'k')).status, 500);
    } finally {
      console.error = origError;
      await passing.close();
      await failing.close();
      try { c.destroy(); } catch {}
    }
  });
});

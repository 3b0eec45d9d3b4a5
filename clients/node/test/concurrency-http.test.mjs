// concurrencyLimit in a real Express app over real HTTP, against
// redis-server with the module: at most `limit` requests in flight per key,
// the rest 429 with the IETF fields, every lease released when its response
// ends, fails or is abandoned.
import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';
import express from 'express';
import { createClient } from 'redis';
import { Redis } from 'ioredis';
import { Client, InvalidArgumentError, concurrencyLimit } from 'redis-ratelimit';
import { sleep, startServer } from './servers.mjs';

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
  rl?.close();
  client?.destroy();
  await server?.stop();
});

/** An app whose /slow requests wait for `gate.open()`; returns { url, close, started, gate }. */
async function app(middleware) {
  let release;
  let opened = new Promise((r) => (release = r));
  const state = { started: 0, gate: { open: () => release() } };
  const a = express();
  a.use(middleware);
  a.get('/slow', async (_req, res) => {
    state.started++;
    await opened;
    res.send('done');
  });
  a.get('/fast', (_req, res) => res.send('ok'));
  a.get('/throws', () => {
    throw new Error('handler failed');
  });
  a.get('/hangs', () => {});
  a.use((err, _req, res, _next) => res.status(500).send(`error: ${err.message}`));
  const http = await new Promise((resolve) => {
    const s = a.listen(0, '127.0.0.1', () => resolve(s));
  });
  return {
    ...state,
    get started() {
      return state.started;
    },
    url: `http://127.0.0.1:${http.address().port}`,
    close: () => {
      http.closeAllConnections?.();
      return new Promise((r) => http.close(r));
    },
    reopenGate: () => {
      opened = new Promise((r) => (release = r));
    },
  };
}

const byUser = (req) => req.get('x-user');
const get = (url, user, init = {}) => fetch(url, { ...init, headers: { 'x-user': user } });

async function held(key, limit, leaseMs = 60_000) {
  const d = await rl.concurrency(key, { limit, leaseMs }, { cost: 0 });
  return d.limit - d.remaining;
}

async function until(cond, what, ms = 10_000) {
  const deadline = Date.now() + ms;
  while (!(await cond())) {
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await sleep(10);
  }
}

describe('concurrencyLimit', () => {
  test('of 8 concurrent slow requests, `limit` run and the rest get 429 with Retry-After and the IETF fields; all released after', async () => {
    const a = await app(concurrencyLimit({ client, limit: 3, leaseMs: 30_000, keyGenerator: byUser }));
    try {
      const slow = Array.from({ length: 8 }, () => get(`${a.url}/slow`, 'crowd'));
      // The denied ones answer while the admitted ones are still running.
      const settled = [];
      slow.forEach((p, i) => p.then((r) => settled.push([i, r])));
      await until(() => settled.length === 5, 'five 429s');
      assert.equal(a.started, 3);
      assert.equal(await held('rl:concurrency:crowd', 3), 3);
      for (const [, r] of settled) {
        assert.equal(r.status, 429);
        assert.equal(r.headers.get('content-type'), 'application/problem+json');
        const retry = Number(r.headers.get('retry-after'));
        assert.ok(retry >= 1 && retry <= 30, `Retry-After ${retry}`);
        // No w: a concurrency limit has no window.
        assert.equal(r.headers.get('ratelimit-policy'), '"concurrency";q=3');
        assert.match(r.headers.get('ratelimit'), /^"concurrency";r=0;t=([12]?\d|30)$/);
        const body = await r.json();
        assert.equal(body.type, 'https://iana.org/assignments/http-problem-types#quota-exceeded');
        assert.equal(body.status, 429);
        assert.deepEqual(body['violated-policies'], ['concurrency']);
      }
      a.gate.open();
      const admitted = (await Promise.all(slow)).filter((r) => r.status === 200);
      assert.equal(admitted.length, 3);
      assert.match(admitted[0].headers.get('ratelimit'), /^"concurrency";r=[0-2];t=30$/);
      assert.equal(admitted[0].headers.get('ratelimit-policy'), '"concurrency";q=3');
      await until(async () => (await held('rl:concurrency:crowd', 3)) === 0, 'every lease released');
      // Another key was never limited by this one.
      assert.equal((await get(`${a.url}/fast`, 'someone-else')).status, 200);
    } finally {
      await a.close();
    }
  });

  test('a handler that throws, and a client that goes away mid-request, release their leases', async () => {
    const a = await app(concurrencyLimit({ client, limit: 1, leaseMs: 30_000, keyGenerator: byUser, name: 'per-user', prefix: 'conc:' }));
    try {
      const failed = await get(`${a.url}/throws`, 'u');
      assert.equal(failed.status, 500);
      await until(async () => (await held('conc:u', 1)) === 0, 'the failed request’s lease released');

      const abort = new AbortController();
      const hanging = get(`${a.url}/hangs`, 'u', { signal: abort.signal }).catch((e) => e);
      await until(async () => (await held('conc:u', 1)) === 1, 'the hanging request’s lease');
      const denied = await get(`${a.url}/fast`, 'u');
      assert.equal(denied.status, 429);
      assert.equal(denied.headers.get('ratelimit-policy'), '"per-user";q=1');
      abort.abort();
      assert.equal((await hanging).name, 'AbortError');
      await until(async () => (await held('conc:u', 1)) === 0, 'the abandoned request’s lease released');
      assert.equal((await get(`${a.url}/fast`, 'u')).status, 200);
    } finally {
      await a.close();
    }
  });

  test('autoRenew keeps the slot of a request longer than leaseMs', async () => {
    const io = new Redis({ port: server.port });
    const a = await app(concurrencyLimit({ client: io, limit: 1, leaseMs: 500, autoRenew: true, keyGenerator: byUser, prefix: 'renew:' }));
    try {
      const first = get(`${a.url}/slow`, 'long');
      await until(() => a.started === 1, 'the long request to start');
      await sleep(1500);
      assert.equal((await get(`${a.url}/fast`, 'long')).status, 429, 'still held after three leaseMs');
      a.gate.open();
      assert.equal((await first).status, 200);
      await until(async () => (await held('renew:long', 1)) === 0, 'released');
    } finally {
      await a.close();
      io.disconnect();
    }
  });

  test('a CONCURRENCY policy; X-RateLimit-* on request; a missing key is a 400', async () => {
    await rl.policySet('http:conc', { algorithm: 'concurrency', limit: 2, leaseMs: 30_000 });
    const a = await app(concurrencyLimit({ client: rl, policy: 'http:conc', keyGenerator: byUser, xRateLimitHeaders: true }));
    try {
      const r = await get(`${a.url}/fast`, 'p');
      assert.equal(r.status, 200);
      assert.equal(r.headers.get('ratelimit-policy'), '"concurrency";q=2');
      assert.deepEqual(['x-ratelimit-limit', 'x-ratelimit-remaining', 'x-ratelimit-reset'].map((h) => r.headers.get(h)), ['2', '1', '30']);
      const missing = await fetch(`${a.url}/fast`);
      assert.equal(missing.status, 400);
      assert.equal(missing.headers.get('content-type'), 'application/problem+json');
    } finally {
      await a.close();
      await rl.policyDel('http:conc');
    }
  });

  test('Redis down: passOnStoreError lets requests through, without it they fail', async () => {
    const doomed = await startServer();
    const c = createClient({ url: doomed.url, disableOfflineQueue: true, socket: { reconnectStrategy: false } });
    c.on('error', () => {});
    await c.connect();
    const passing = await app(concurrencyLimit({ client: c, limit: 1, leaseMs: 1000, keyGenerator: byUser, passOnStoreError: true }));
    const failing = await app(concurrencyLimit({ client: c, limit: 1, leaseMs: 1000, keyGenerator: byUser }));
    try {
      assert.equal((await get(`${passing.url}/fast`, 'k')).status, 200);
      await doomed.kill();
      await until(() => !c.isReady, 'the client to see Redis gone');
      assert.equal((await get(`${passing.url}/fast`, 'k')).status, 200);
      assert.equal((await get(`${failing.url}/fast`, 'k')).status, 500);
    } finally {
      await passing.close();
      await failing.close();
      try {
        c.destroy();
      } catch {}
    }
  });

  test('bad options are clear errors', () => {
    const cases = [
      [{ client, leaseMs: 1000 }, 'limit'],
      [{ client, limit: 2 ** 24, leaseMs: 1000 }, 'limit'],
      [{ client, limit: 1 }, 'leaseMs'],
      [{ client, limit: 1, leaseMs: 1000, policy: 'p' }, 'limit'],
      [{ client, policy: 'p', autoRenew: true }, 'leaseMs'],
      [{ client, limit: 1, leaseMs: 1000, timeoutMs: -1 }, 'timeoutMs'],
      [{ client, limit: 1, leaseMs: 1000, name: 'a"b' }, 'name'],
      [{ client, limit: 1, leaseMs: 1000, keyGenerator: 'ip' }, 'keyGenerator'],
      [{ limit: 1, leaseMs: 1000 }, 'client'],
    ];
    for (const [options, argument] of cases) {
      assert.throws(() => concurrencyLimit(options), (e) => e instanceof InvalidArgumentError && e.argument === argument, argument);
    }
  });
});

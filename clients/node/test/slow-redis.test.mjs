// Redis made slow for short spells (CLIENT PAUSE) during a burst for one key:
// a call whose answer is lost (the kit's deadline, or the client's own
// commandTimeout) may still be counted by Redis, so the fallback must never
// admit on top of it. One instance admits at most max(limit, share) per
// window, share = ceil(limit / instances x 1.1): here 6 of a limit of 5.
import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';
import express from 'express';
import { rateLimit } from 'express-rate-limit';
import { Redis } from 'ioredis';
import { RateLimiterMemory } from 'rate-limiter-flexible';
import { Limiter, RateLimiterRL, RLStore } from 'redis-ratelimit';
import { startServer } from './servers.mjs';

const LIMIT = 5;
const SHARE = Math.ceil((LIMIT * 1.1) / 1);
// Long enough that nothing leaves the window during the test, wherever the clock is.
const WINDOW_S = 3600;
const SPELLS = 3;
const SPELL_MS = 300;

let server;
let admin;
before(async () => {
  server = await startServer();
  admin = new Redis({ port: server.port, host: '127.0.0.1' });
});
after(async () => {
  admin?.disconnect();
  await server?.stop();
});

/** A client as users configure ioredis against a slow Redis: a command timeout. */
function timedClient() {
  const c = new Redis({ port: server.port, host: '127.0.0.1', commandTimeout: 100 });
  c.on('error', () => {});
  return c;
}

/** Until a PING on `c` answers: every command it sent before has then been run. */
async function drained(c) {
  for (;;) {
    try {
      await c.ping();
      return;
    } catch {
      // still paused: the PING timed out
    }
  }
}

/**
 * The burst: per spell, two decisions with Redis healthy, then CLIENT PAUSE
 * and five more at once, which all miss the deadline while Redis holds (and
 * later runs) them. Returns how many were admitted.
 */
async function burst(decide, client) {
  let admitted = 0;
  const one = async () => {
    if (await decide()) admitted++;
  };
  for (let s = 0; s < SPELLS; s++) {
    await one();
    await one();
    await admin.call('CLIENT', 'PAUSE', String(SPELL_MS), 'ALL');
    await Promise.all(Array.from({ length: 5 }, one));
    await drained(client);
  }
  return admitted;
}

describe('Redis slow for short spells during a burst for one key', () => {
  test('the Limiter (local-only fallback) admits at most max(limit, share), and Redis counted them all', async (t) => {
    const c = new Redis({ port: server.port, host: '127.0.0.1' });
    try {
      const limiter = new Limiter(c, { deadlineMs: 100, denyCache: false });
      const rules = await limiter.ruleSet([{ spec: { algorithm: 'fixedwindow', limit: LIMIT, windowMs: WINDOW_S * 1000 }, key: `slow:${process.pid}:limiter` }]);
      const admitted = await burst(async () => (await limiter.check(rules, 'user')).allowed, c);
      const s = limiter.stats();
      t.diagnostic(`admitted ${admitted} of a limit of ${LIMIT} (${s.redis_admitted} by Redis, ${s.fallback_admitted} by the fallback, ${s.redis_timeouts} timeouts)`);
      // One instance: its share is the limit itself.
      assert.ok(admitted <= LIMIT, `admitted ${admitted} of a limit of ${LIMIT}`);
      assert.ok(s.redis_timeouts > 0, 'the spells made calls miss the deadline');
      const d = await limiter.client.fixedWindow(`slow:${process.pid}:limiter`, { limit: LIMIT, windowMs: WINDOW_S * 1000 }, { cost: 0 });
      assert.equal(d.remaining, 0);
    } finally {
      c.disconnect();
    }
  });

  test('RateLimiterRL with an insurance limiter admits at most max(limit, share)', async (t) => {
    const c = timedClient();
    try {
      const limiter = new RateLimiterRL({
        storeClient: c,
        points: LIMIT,
        duration: WINDOW_S,
        keyPrefix: `slow:${process.pid}:flex`,
        insuranceLimiter: new RateLimiterMemory({ points: LIMIT, duration: WINDOW_S }),
      });
      const admitted = await burst(
        () =>
          limiter.consume('user').then(
            () => true,
            (e) => {
              if (e instanceof Error) throw e;
              return false;
            },
          ),
        c,
      );
      t.diagnostic(`admitted ${admitted} of a limit of ${LIMIT}, share ${SHARE}`);
      assert.ok(admitted <= SHARE, `admitted ${admitted} of a limit of ${LIMIT}, share ${SHARE}`);
      assert.equal(limiter.share, SHARE);
      // Redis counted what it admitted, the lost calls included: full.
      const d = await limiter.get('user');
      assert.equal(d.remainingPoints, 0);
    } finally {
      c.disconnect();
    }
  });

  test('RateLimiterRL without an insurance limiter: a slow spell is only slow', async () => {
    const c = new Redis({ port: server.port, host: '127.0.0.1' });
    try {
      const limiter = new RateLimiterRL({ storeClient: c, points: LIMIT, duration: WINDOW_S, keyPrefix: `slow:${process.pid}:bare` });
      const admitted = await burst(() => limiter.consume('user').then(() => true, (e) => (e instanceof Error ? Promise.reject(e) : false)), c);
      assert.equal(admitted, LIMIT);
    } finally {
      c.disconnect();
    }
  });

  test('RLStore with passOnStoreError: express-rate-limit admits at most max(limit, share)', async (t) => {
    const c = timedClient();
    const app = express();
    app.use(
      rateLimit({
        windowMs: WINDOW_S * 1000,
        limit: LIMIT,
        keyGenerator: () => 'user',
        passOnStoreError: true,
        validate: false,
        store: new RLStore({ sendCommand: (command, ...args) => c.call(command, ...args), prefix: `slow:${process.pid}:store:` }),
      }),
    );
    app.get('/', (_req, res) => res.send('ok'));
    const listening = await new Promise((resolve) => {
      const s = app.listen(0, '127.0.0.1', () => resolve(s));
    });
    const origError = console.error;
    console.error = () => {}; // express-rate-limit logs each store error it passes
    try {
      const url = `http://127.0.0.1:${listening.address().port}/`;
      const admitted = await burst(async () => (await fetch(url)).status === 200, c);
      t.diagnostic(`admitted ${admitted} of a limit of ${LIMIT}, share ${SHARE}`);
      assert.ok(admitted <= SHARE, `admitted ${admitted} of a limit of ${LIMIT}, share ${SHARE}`);
    } finally {
      console.error = origError;
      listening.close();
      c.disconnect();
    }
  });
});

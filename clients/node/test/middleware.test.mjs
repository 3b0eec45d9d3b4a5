// rateLimitMiddleware in an Express app over real HTTP, against
// redis-server with the module: the answer (headers, 429 problem), the
// outcome of each admitted request (5xx, a thrown error, a timeout, a
// predicate of the application's), counted for policy rules only, and the
// options' checks.
import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';
import express from 'express';
import { createClient } from 'redis';
import { Client, InvalidArgumentError, Limiter, Protection, outcomeErrors, rateLimitMiddleware } from 'redis-ratelimit';
import { sleep, startServer, STILL_MS } from './servers.mjs';

let server;
let client;
let rl;
before(async () => {
  server = await startServer();
  client = await createClient({ url: server.url }).on('error', () => {}).connect();
  rl = new Client(client);
  await rl.policySet('mw', { algorithm: 'fixedwindow', limit: 1000, windowMs: STILL_MS }, { stages: { degrade: 30, break: 50 }, windowMs: 60_000 });
  await rl.policySet('tight', { algorithm: 'fixedwindow', limit: 1, windowMs: STILL_MS }, { stages: { degrade: 30, break: 50 }, windowMs: 60_000 });
});
after(async () => {
  client?.destroy();
  await server?.stop();
});

async function listen(app) {
  const http = await new Promise((resolve) => {
    const s = app.listen(0, '127.0.0.1', () => resolve(s));
  });
  return {
    url: `http://127.0.0.1:${http.address().port}`,
    close: () => {
      const closed = new Promise((r) => http.close(r));
      http.closeAllConnections();
      return closed;
    },
  };
}

describe('rateLimitMiddleware', () => {
  test('outcomes: ok, 5xx, thrown (sync and async), timeout, each counted once, for the policy rule only', async () => {
    const limiter = new Limiter(rl);
    const protection = new Protection(rl, [], { reportIntervalMs: 3_600_000, stagePollMs: 3_600_000, stageHoldMs: 7_200_000 });
    const limited = rateLimitMiddleware({
      limiter,
      rules: [{ policy: 'mw', key: 'rl:mw:all' }, { name: 'inline', spec: { algorithm: 'fixedwindow', limit: 1000, windowMs: STILL_MS } }],
      protection,
      timeoutMs: 150,
      keyGenerator: () => 'k',
    });
    const app = express();
    app.get('/ok', limited, (_req, res) => res.send('ok'));
    app.get('/404', limited, (_req, res) => res.status(404).send('no'));
    app.get('/500', limited, (_req, res) => res.status(503).send('down'));
    app.get('/throw', limited, () => {
      throw new Error('sync');
    });
    app.get('/reject', limited, async () => {
      throw new Error('async');
    });
    app.get('/slow', limited, async (_req, res) => {
      await sleep(400);
      res.send('late');
    });
    app.use(outcomeErrors());
    // The application answers thrown errors with a 4xx: still errors of the policy.
    app.use((err, _req, res, _next) => res.status(422).send(err.message));
    const s = await listen(app);
    try {
      const codes = [];
      for (const path of ['/ok', '/ok', '/404', '/500', '/throw', '/reject', '/slow']) {
        const r = await fetch(s.url + path);
        await r.text();
        codes.push(r.status);
      }
      assert.deepEqual(codes, [200, 200, 404, 503, 422, 422, 200]);
      assert.deepEqual(protection.pending('mw'), { ok: 3, errors: 4, denied: 0 });
      assert.deepEqual(protection.policies, ['mw'], 'the inline rule reports nothing');
      await protection.flush();
      const st = await rl.policyStats('mw');
      assert.deepEqual([st.current.ok, st.current.errors], [3, 4]);
    } finally {
      await s.close();
      await protection.close();
    }
  });

  test('a predicate of the application decides what an error is', async () => {
    const limiter = new Limiter(rl);
    const protection = new Protection(rl, [], { reportIntervalMs: 3_600_000, stagePollMs: 3_600_000, stageHoldMs: 7_200_000 });
    const limited = rateLimitMiddleware({
      limiter,
      rules: [{ policy: 'mw', key: 'rl:mw:pred' }],
      protection,
      isError: ({ status }) => status === 418 || status >= 500,
    });
    const app = express();
    app.get('/teapot', limited, (_req, res) => res.status(418).send('tea'));
    app.get('/ok', limited, (_req, res) => res.send('ok'));
    const s = await listen(app);
    try {
      for (const path of ['/teapot', '/ok', '/teapot']) await (await fetch(s.url + path)).text();
      assert.deepEqual(protection.pending('mw'), { ok: 1, errors: 2, denied: 0 });
    } finally {
      await s.close();
      await protection.close();
    }
  });

  test('the answer: IETF fields when admitted; a denial is a 429 problem with Retry-After, or the degrade handler, and counts no outcome', async () => {
    const limiter = new Limiter(rl, { denyCache: false });
    const protection = new Protection(rl, [], { reportIntervalMs: 3_600_000, stagePollMs: 3_600_000, stageHoldMs: 7_200_000 });
    const app = express();
    const rules = [{ policy: 'tight', name: 'tight' }];
    app.get('/plain', rateLimitMiddleware({ limiter, rules, protection, keyGenerator: () => 'plain' }), (_req, res) => res.send('ok'));
    app.get(
      '/degrade',
      rateLimitMiddleware({ limiter, rules, protection, keyGenerator: () => 'degrade', degrade: (_req, res, _next, info) => res.json({ reason: info.reason, allowed: info.decision.allowed }) }),
      (_req, res) => res.send('ok'),
    );
    const s = await listen(app);
    try {
      const first = await fetch(`${s.url}/plain`);
      assert.equal(first.status, 200);
      assert.equal(first.headers.get('ratelimit-policy'), `"tight";q=1;w=${Math.ceil(STILL_MS / 1000)}`);
      assert.match(first.headers.get('ratelimit'), /^"tight";r=0;t=\d+$/);
      await first.text();
      const denied = await fetch(`${s.url}/plain`);
      assert.equal(denied.status, 429);
      assert.equal(denied.headers.get('content-type'), 'application/problem+json');
      assert.ok(Number(denied.headers.get('retry-after')) > 0);
      assert.deepEqual((await denied.json())['violated-policies'], ['tight']);
      await (await fetch(`${s.url}/degrade`)).text();
      const degraded = await fetch(`${s.url}/degrade`);
      assert.equal(degraded.status, 200);
      assert.deepEqual(await degraded.json(), { reason: 'denied', allowed: false });
      assert.deepEqual(protection.pending('tight'), { ok: 2, errors: 0, denied: 0 }, 'the two admitted requests only: Redis answered the denials');
    } finally {
      await s.close();
      await protection.close();
    }
  });

  test('deny cache hits of a policy rule are counted as DENIED once: by the limiter given the protection, else by the middleware; inline rules and Redis denials not', async () => {
    const inline = { name: 'inline', spec: { algorithm: 'fixedwindow', limit: 1, windowMs: STILL_MS } };
    for (const byLimiter of [true, false]) {
      const policy = byLimiter ? 'dc1' : 'dc2';
      await rl.policySet(policy, { algorithm: 'fixedwindow', limit: 1, windowMs: STILL_MS }, { stages: { degrade: 30, break: 50 }, windowMs: 60_000 });
      const protection = new Protection(rl, [], { reportIntervalMs: 3_600_000, stagePollMs: 3_600_000, stageHoldMs: 7_200_000 });
      // A deadline no loaded host misses: every decision here is Redis's or the deny cache's.
      const limiter = new Limiter(rl, { deadlineMs: 5000, ...(byLimiter ? { protection } : {}) });
      const app = express();
      app.get('/p', rateLimitMiddleware({ limiter, rules: [{ policy }], protection, keyGenerator: () => 'k' }), (_req, res) => res.send('ok'));
      app.get('/i', rateLimitMiddleware({ limiter, rules: [inline], protection, keyGenerator: () => `k${byLimiter}` }), (_req, res) => res.send('ok'));
      const s = await listen(app);
      try {
        const codes = [];
        for (let i = 0; i < 5; i++) codes.push((await fetch(`${s.url}/p`)).status);
        for (let i = 0; i < 3; i++) codes.push((await fetch(`${s.url}/i`)).status);
        assert.deepEqual(codes, [200, 429, 429, 429, 429, 200, 429, 429]);
        const st = limiter.stats();
        assert.equal(st.redis_denied, 2, 'the first denial of each rule came from Redis');
        assert.equal(st.deny_cache_hits, 4);
        assert.deepEqual(protection.pending(policy), { ok: 1, errors: 0, denied: 3 }, `three deny cache hits counted once each (${byLimiter ? 'limiter' : 'middleware'})`);
        assert.deepEqual(protection.policies.sort(), [policy], 'the inline rule reports nothing');
        await protection.flush();
        const stats = await rl.policyStats(policy);
        assert.equal(stats.current.calls, 5, 'the server counts the 2 calls it saw and the 3 it did not');
        assert.equal(stats.current.denied, 4);
        assert.equal(stats.current.ok, 1);
      } finally {
        await s.close();
        await protection.close();
      }
    }
  });

  test('options are checked, naming the option', () => {
    const limiter = new Limiter(rl);
    const protection = new Protection(rl, [], { reportIntervalMs: 3_600_000, stagePollMs: 3_600_000, stageHoldMs: 7_200_000 });
    const rules = [{ policy: 'mw' }];
    const bad = [
      [{ rules }, 'limiter'],
      [{ limiter, rules: [] }, 'rules'],
      [{ limiter, rules, core: 'no', protection }, 'core'],
      [{ limiter, rules, core: false }, 'core'],
      [{ limiter, rules, breaker: 'b' }, 'breaker'],
      [{ limiter, rules, degrade: 'cached' }, 'degrade'],
      [{ limiter, rules, isError: true }, 'isError'],
      [{ limiter, rules, timeoutMs: 0 }, 'timeoutMs'],
      // Inline rules only: no policy has a stage to open the breaker or degrade the route.
      [{ limiter, rules: [{ spec: { algorithm: 'fixedwindow', limit: 5, windowMs: 1000 } }], protection, breaker: 'b' }, 'breaker'],
      [{ limiter, rules: [{ spec: { algorithm: 'fixedwindow', limit: 5, windowMs: 1000 } }], protection, core: false }, 'core'],
    ];
    for (const [options, argument] of bad) {
      assert.throws(() => rateLimitMiddleware(options), (e) => e instanceof InvalidArgumentError && e.argument === argument, argument);
    }
    return protection.close();
  });
});

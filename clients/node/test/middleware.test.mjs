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
    const protection = new Protection(rl, [], { reportIntervalMs: 3_600_000, stagePollMs: 3_600_000 });
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
      assert.deepEqual(protection.pending('mw'), { ok: 3, errors: 4 });
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
    const protection = new Protection(rl, [], { reportIntervalMs: 3_600_000, stagePollMs: 3_600_000 });
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
      assert.deepEqual(protection.pending('mw'), { ok: 1, errors: 2 });
    } finally {
      await s.close();
      await protection.close();
    }
  });

  test('the answer: IETF fields when admitted; a denial is a 429 problem with Retry-After, or the degrade handler, and counts no outcome', async () => {
    const limiter = new Limiter(rl, { denyCache: false });
    const protection = new Protection(rl, [], { reportIntervalMs: 3_600_000, stagePollMs: 3_600_000 });
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
      assert.deepEqual(protection.pending('tight'), { ok: 2, errors: 0 }, 'the two admitted requests only');
    } finally {
      await s.close();
      await protection.close();
    }
  });

  test('options are checked, naming the option', () => {
    const limiter = new Limiter(rl);
    const protection = new Protection(rl, [], { reportIntervalMs: 3_600_000, stagePollMs: 3_600_000 });
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
    ];
    for (const [options, argument] of bad) {
      assert.throws(() => rateLimitMiddleware(options), (e) => e instanceof InvalidArgumentError && e.argument === argument, argument);
    }
    return protection.close();
  });
});

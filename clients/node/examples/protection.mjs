// The protection loop in an Express service: the policy `api` adapts to the
// backend's errors (scale 100% -> 80% above 5% errors), degrades the non-core
// route at stage 1 (more than 30% of a window's requests denied) and opens
// the `backend` breaker at stage 2 (more than 50%), for every instance at
// once: the server decides, each instance reads the stage every second.
//
//   REDIS_URL=redis://127.0.0.1:6379 PORT=3003 FAIL_EVERY=10 node examples/protection.mjs
//   curl -s localhost:3003/api/items; curl -s localhost:3003/protection
//
// Routes:
// - GET  /api/items            core: the backend (fails every FAIL_EVERY-th call),
//                              through the `backend` breaker; its outcomes adapt the scale
// - GET  /api/recommendations  non-core: at stage 1+ the default answer, without Redis
// - GET  /api/feed             non-core without a degrade handler: a 429 at stage 1+, without Redis
// - GET  /api/report           core, on the policy `report`: a denial answers the cached report, not a 429
// - POST /admin/fail?every=n   the backend fails every n-th call from now on (0: never)
// - GET  /protection           this instance's stage, scale and breakers (also X-Protection-* headers)
// - GET  /metrics              Prometheus: decisions by rule, level and outcome, Redis round trips,
//                              remaining ratio, scale, stage, breakers, deny events (README, "Metrics and deny events")
//
// Deny events: DENY_EVENTS_FILE=/path/deny.jsonl, or DENY_EVENTS_URL=http://127.0.0.1:9200
// (an Elasticsearch _bulk endpoint), ships every denial in batches.
import express from 'express';
import { createClient } from 'redis';
import { pathToFileURL } from 'node:url';
import { Registry } from 'prom-client';
import { Client, DenyEvents, Limiter, Protection, outcomeErrors, rateLimitMiddleware } from 'redis-ratelimit';

/** The policies this service needs, set when missing (an operator may have tuned them). */
export const POLICIES = {
  api: {
    spec: { algorithm: 'tokenbucket', capacity: 200, refillCount: 200, refillMs: 1000 },
    options: { adapt: { errors: 5, factor: 80, min: 50, recover: 5, minCalls: 100 }, stages: { degrade: 30, break: 50 }, windowMs: 10_000 },
  },
  report: { spec: { algorithm: 'fixedwindow', limit: 2, windowMs: 60_000 }, options: {} },
};

/**
 * Starts one instance on `client` (node-redis or ioredis); resolves
 * { url, app, protection, limiter, registry, setFailEvery, close }.
 * `protection` passes the loop's timings (tests shorten them); `registry`
 * is the prom-client Registry /metrics serves (a new one by default);
 * `denyEvents`, a DenyEvents shipping every denial (closed by close()).
 */
export async function start({ client, port = 0, failEvery = 0, protection: timings = {}, setPolicies = true, name = 'instance', registry = new Registry(), denyEvents } = {}) {
  const rl = new Client(client);
  await rl.checkModule();
  if (setPolicies) {
    for (const [policy, { spec, options }] of Object.entries(POLICIES)) {
      if ((await rl.policyGet(policy)) === null) await rl.policySet(policy, spec, options);
    }
  }
  const protection = new Protection(rl, ['api', 'report'], { ...timings, metrics: registry });
  // The deny cache answers repeated denials in process; given the
  // protection, the limiter counts them and they reach the server with the
  // outcome reports (RL.OUTCOME ... DENIED n), so the stages see the flood.
  const limiter = new Limiter(rl, { instances: 2, protection, metrics: registry, denyEvents });
  const backend = protection.breaker('backend');
  let calls = 0;
  const fetchItems = async () => {
    calls++;
    if (failEvery > 0 && calls % failEvery === 0) throw new Error('backend failed');
    return { items: ['a', 'b', 'c'] };
  };
  const cachedItems = { items: ['a', 'b'], cached: true };

  const app = express();
  // Every answer says what this instance knows of the loop.
  app.use((_req, res, next) => {
    res.set('X-Protection-Stage', String(protection.stage('api')));
    res.set('X-Protection-Scale', String(protection.scale('api')));
    res.set('X-Protection-Breaker', backend.state);
    next();
  });
  app.get('/api/items', rateLimitMiddleware({ limiter, rules: [{ policy: 'api', key: 'rl:api:all' }], protection, breaker: 'backend' }), async (_req, res) => {
    if (!backend.allow()) {
      // Stage 2: the breaker is forced open; the backend is spared.
      res.json(cachedItems);
      return;
    }
    try {
      const items = await fetchItems();
      backend.success();
      res.json(items);
    } catch (err) {
      backend.failure();
      throw err; // a 500, counted as an error of `api`
    }
  });
  app.get(
    '/api/recommendations',
    rateLimitMiddleware({
      limiter,
      rules: [{ policy: 'api', key: 'rl:api:all' }],
      protection,
      core: false,
      degrade: (_req, res) => res.json({ recommendations: [], degraded: true }),
    }),
    (_req, res) => res.json({ recommendations: ['x', 'y'] }),
  );
  // Non-core without a degrade handler: a 429 at stage 1+, without Redis.
  app.get('/api/feed', rateLimitMiddleware({ limiter, rules: [{ policy: 'api', key: 'rl:api:all' }], protection, core: false }), (_req, res) =>
    res.json({ feed: ['p', 'q'] }),
  );
  app.get(
    '/api/report',
    rateLimitMiddleware({
      limiter,
      rules: [{ policy: 'report', key: 'rl:report:all' }],
      protection,
      degrade: (_req, res, _next, info) => res.set('X-Degraded', info.reason).json({ report: 'cached', cached: true }),
    }),
    (_req, res) => res.json({ report: 'fresh' }),
  );
  app.post('/admin/fail', (req, res) => {
    failEvery = Number(req.query.every ?? 0);
    calls = 0;
    res.json({ failEvery });
  });
  app.get('/protection', (_req, res) => res.json({ name, ...protection.snapshot(), loop: protection.counters(), limiter: limiter.stats() }));
  app.get('/metrics', async (_req, res) => {
    res.set('Content-Type', registry.contentType);
    res.send(await registry.metrics());
  });
  app.use(outcomeErrors());
  app.use((err, _req, res, _next) => res.status(500).json({ error: err.message }));

  const server = await new Promise((resolve) => {
    const s = app.listen(port, '127.0.0.1', () => resolve(s));
  });
  return {
    url: `http://127.0.0.1:${server.address().port}`,
    app,
    protection,
    limiter,
    registry,
    setFailEvery: (n) => {
      failEvery = n;
      calls = 0;
    },
    async close() {
      const closed = new Promise((r) => server.close(r));
      server.closeAllConnections?.();
      await closed;
      await protection.close();
      await denyEvents?.close();
      rl.close();
    },
  };
}

if (process.argv[1] && import.meta.url === pathToFileURL(process.argv[1]).href) {
  const client = await createClient({ url: process.env.REDIS_URL ?? 'redis://127.0.0.1:6379' }).connect();
  const sink = process.env.DENY_EVENTS_FILE ? { file: process.env.DENY_EVENTS_FILE } : process.env.DENY_EVENTS_URL ? { bulkUrl: process.env.DENY_EVENTS_URL } : undefined;
  const denyEvents = sink === undefined ? undefined : new DenyEvents({ ...sink, metrics: true });
  const { register } = await import('prom-client');
  const s = await start({ client, port: Number(process.env.PORT ?? 3003), failEvery: Number(process.env.FAIL_EVERY ?? 0), registry: register, denyEvents });
  process.once('SIGTERM', () => s.close().then(() => process.exit(0)));
  console.log(`listening on ${s.url}`);
}

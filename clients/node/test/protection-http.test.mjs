// The protection loop end to end: two instances of the example service
// (examples/protection.mjs), one on node-redis and one on ioredis, each with
// its own client, Limiter and Protection, over real HTTP, sharing one
// redis-server with the module (and a replica of it). Windows of 1 s, loop
// timings of 100 ms; every wait polls for its condition with a deadline.
import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';
import { createClient } from 'redis';
import { Redis } from 'ioredis';
import { Client } from 'redis-ratelimit';
import { start } from '../examples/protection.mjs';
import { sleep, startServer, STILL_MS } from './servers.mjs';

const TIMINGS = { reportIntervalMs: 100, stagePollMs: 100, stageHoldMs: 2000 };

async function until(check, what, ms = 10_000) {
  const deadline = Date.now() + ms;
  for (;;) {
    const v = await check();
    if (v) return v;
    if (Date.now() > deadline) assert.fail(`not within ${ms} ms: ${what}`);
    await sleep(25);
  }
}

const status = async (app) => (await fetch(`${app.url}/protection`)).json();

/** Sends requests to `path`, alternating between the apps, until stop(); `pace(n)` ms between them. */
function drive(apps, path, pace = () => 5) {
  let running = true;
  let sent = 0;
  const answers = {};
  const done = (async () => {
    while (running) {
      const app = apps[sent % apps.length];
      sent++;
      try {
        const r = await fetch(`${app.url}${path}`);
        await r.arrayBuffer();
        answers[r.status] = (answers[r.status] ?? 0) + 1;
      } catch {
        answers.failed = (answers.failed ?? 0) + 1;
      }
      await sleep(pace(sent));
    }
  })();
  return {
    answers,
    async stop() {
      running = false;
      await done;
    },
  };
}

/** Sends `n` requests to `path` on `app` right after each 1 s window starts (the server's windows are aligned to its clock, this machine's), until stop(). */
function burstPerWindow(app, path, n) {
  let running = true;
  const answers = {};
  const done = (async () => {
    while (running) {
      await sleep(1000 - (Date.now() % 1000) + 30);
      for (let i = 0; i < n && running; i++) {
        const r = await fetch(`${app.url}${path}`);
        await r.arrayBuffer();
        answers[r.status] = (answers[r.status] ?? 0) + 1;
      }
    }
  })();
  return {
    answers,
    setCount: (m) => (n = m),
    async stop() {
      running = false;
      await done;
    },
  };
}

describe('the protection loop over HTTP: two instances sharing one Redis', () => {
  let server;
  let replica;
  let admin;
  let adminClient;
  let replicaClient;
  let rc;
  let nodeRedis;
  let ioredis;
  let a;
  let b;

  before(async () => {
    server = await startServer();
    replica = await startServer({ extra: ['--replicaof', '127.0.0.1', String(server.port)] });
    adminClient = await createClient({ url: server.url }).on('error', () => {}).connect();
    admin = new Client(adminClient);
    rc = await createClient({ url: replica.url }).on('error', () => {}).connect();
    replicaClient = new Client(rc);
    await until(async () => /master_link_status:up/.test(await rc.sendCommand(['INFO', 'replication'])), 'the replica in sync');
    // The test's policies (the example sets its own only where none exists).
    await admin.policySet('api', { algorithm: 'tokenbucket', capacity: 100_000, refillCount: 100_000, refillMs: 1000 }, {
      adapt: { errors: 5, factor: 80, min: 80, recover: 10, minCalls: 20 },
      windowMs: 1000,
    });
    await admin.policySet('report', { algorithm: 'fixedwindow', limit: 2, windowMs: STILL_MS }, { stages: { degrade: 30, break: 50 }, windowMs: 1000 });
    nodeRedis = await createClient({ url: server.url }).on('error', () => {}).connect();
    ioredis = new Redis({ port: server.port, host: '127.0.0.1' });
    ioredis.on('error', () => {});
    a = await start({ client: nodeRedis, protection: TIMINGS, name: 'a' });
    b = await start({ client: ioredis, protection: TIMINGS, name: 'b' });
  });

  after(async () => {
    await a?.close();
    await b?.close();
    nodeRedis?.destroy();
    ioredis?.disconnect();
    adminClient?.destroy();
    rc?.destroy();
    await replica?.stop();
    await server?.stop();
  });

  test('adapt: 10% failures drop the scale to 80 on both instances and the replica; it climbs back when they stop', async () => {
    a.setFailEvery(10);
    b.setFailEvery(10);
    const began = Date.now();
    const traffic = drive([a, b], '/api/items');
    try {
      const seen = new Set();
      await until(async () => {
        const [sa, sb] = await Promise.all([status(a), status(b)]);
        seen.add(sa.policies.api.scale).add(sb.policies.api.scale);
        return sa.policies.api.scale === 80 && sb.policies.api.scale === 80;
      }, 'scale 80 on both instances');
      const took = Date.now() - began;
      // The first window may be a partial one below MINCALLS; the next is decisive.
      assert.ok(took < 4000, `scale 80 reached in ${took} ms`);
      assert.deepEqual([...seen].filter((s) => s !== 100 && s !== 80), [], 'only 100 and 80 seen');
      assert.ok(traffic.answers[500] > 0, 'the backend failed');
      await until(async () => (await replicaClient.policyStats('api')).scale === 80, 'the replica at scale 80');
      // Its limit follows: RL.HIT answers with the scaled capacity.
      assert.equal((await admin.hit('api', 'rl:api:probe', { cost: 0 })).limit, 80_000);

      a.setFailEvery(0);
      b.setFailEvery(0);
      await until(async () => {
        const [sa, sb] = await Promise.all([status(a), status(b)]);
        return sa.policies.api.scale === 100 && sb.policies.api.scale === 100;
      }, 'scale back to 100 on both (RECOVER 10 a window)');
      await until(async () => (await replicaClient.policyStats('api')).scale === 100, 'the replica back at 100');
    } finally {
      await traffic.stop();
    }
  });

  test('stages: a flood answered mostly from the deny cache moves the stage to 1 (non-core routes degrade without Redis), then 2 (the breaker opens); both recover one step a window', async () => {
    await admin.policySet('api', { algorithm: 'fixedwindow', limit: 10, windowMs: 1000 }, { adapt: 'off', stages: { degrade: 30, break: 50 }, windowMs: 1000 });
    // 16 a window, 10 admitted: 37.5% denied -> stage 1. Of the 6 denials,
    // Redis answers one, a's deny cache the other 5 (reported as DENIED 5):
    // without them, the server would see 1 of 11 denied and no stage.
    const flood = burstPerWindow(a, '/api/items', 16);
    try {
      await until(async () => (await status(b)).policies.api.stage === 1, 'stage 1 on b', 15_000);
      const cached = (await status(a)).limiter;
      assert.ok(cached.deny_cache_hits > 2 * cached.redis_denied, `the denials mostly from a's deny cache: ${JSON.stringify(cached)}`);
      const before = (await status(b)).limiter.redis_calls;
      const degraded = await fetch(`${b.url}/api/recommendations`);
      assert.equal(degraded.status, 200);
      assert.deepEqual(await degraded.json(), { recommendations: [], degraded: true });
      const feed = await fetch(`${b.url}/api/feed`);
      assert.equal(feed.status, 429, 'non-core without a degrade handler: 429');
      assert.equal(feed.headers.get('content-type'), 'application/problem+json');
      assert.ok(Number(feed.headers.get('retry-after')) >= 1);
      const s = await status(b);
      assert.equal(s.limiter.redis_calls, before, 'no Redis call for the degraded routes');
      assert.equal(s.breakers.backend, 'closed', 'stage 1 leaves the breaker closed');
      assert.equal((await fetch(`${a.url}/api/recommendations`)).status, 200);

      // 40 a window: 75% denied -> stage 2, the breaker named by /api/items opens on both.
      flood.setCount(40);
      await until(async () => {
        const [sa, sb] = await Promise.all([status(a), status(b)]);
        return sa.breakers.backend === 'forcedOpen' && sb.breakers.backend === 'forcedOpen' && sb.policies.api.stage === 2;
      }, 'stage 2 and the breaker open on both', 15_000);
      const { limiter: la, loop } = await status(a);
      assert.ok(la.deny_cache_hits > 2 * la.redis_denied, `the denials mostly from a's deny cache: ${JSON.stringify(la)}`);
      assert.equal(loop.deniedLost, 0, 'every local denial reached the server');
      const items = await fetch(`${b.url}/api/items`);
      if (items.status === 200) assert.equal((await items.json()).cached, true, 'the backend spared: the cached answer');
      assert.equal(items.headers.get('x-protection-breaker'), 'forcedOpen');
    } finally {
      await flood.stop();
    }
    // The flood stopped: 2 -> 1 -> 0, one step a window; the breaker closes below 2.
    const stages = [];
    const at = [];
    await until(async () => {
      const s = await status(b);
      const stage = s.policies.api.stage;
      if (stages.at(-1) !== stage) {
        stages.push(stage);
        at.push(Date.now());
      }
      if (stage < 2) assert.equal(s.breakers.backend, 'closed', `breaker at stage ${stage}`);
      return stage === 0;
    }, 'stage back to 0', 10_000);
    assert.deepEqual(stages, [2, 1, 0]);
    assert.ok(at[2] - at[1] >= 500, `stage 1 lasted ${at[2] - at[1]} ms: about a window`);
    assert.equal((await status(a)).breakers.backend, 'closed');
  });

  test('degrade on denial: a denied request on a route with a degrade handler gets its answer, not a 429', async () => {
    const answers = [];
    for (const app of [a, b, a, b]) {
      const r = await fetch(`${app.url}/api/report`);
      answers.push([r.status, (await r.json()).report, r.headers.get('x-degraded')]);
    }
    assert.deepEqual(answers, [
      [200, 'fresh', null],
      [200, 'fresh', null],
      [200, 'cached', 'denied'],
      [200, 'cached', 'denied'],
    ]);
  });

  test('Redis stopped: requests still answer, no report queue grows; restarted: reports resume', async () => {
    await admin.policySet('api', { algorithm: 'tokenbucket', capacity: 1000, refillCount: 1000, refillMs: 1000 }, { stages: { degrade: 30, break: 50 }, windowMs: 60_000 });
    await server.stop();
    const traffic = drive([a, b], '/api/items', () => 10);
    try {
      await sleep(1500);
      const [sa, sb] = await Promise.all([status(a), status(b)]);
      for (const s of [sa, sb]) assert.ok(s.loop.inFlight <= 2, `${s.name}: ${s.loop.inFlight} rounds in flight`);
      assert.ok(traffic.answers[200] > 20, `answered while Redis is down: ${JSON.stringify(traffic.answers)}`);
      assert.equal(traffic.answers[500] ?? 0, 0);
      assert.ok((sa.limiter.fallback_admitted ?? 0) + (sb.limiter.fallback_admitted ?? 0) > 0, 'the fallback decided');
      server = await startServer({ port: server.port });
      const freshClient = await createClient({ url: server.url }).on('error', () => {}).connect();
      const fresh = new Client(freshClient);
      await fresh.policySet('api', { algorithm: 'tokenbucket', capacity: 1000, refillCount: 1000, refillMs: 1000 }, { stages: { degrade: 30, break: 50 }, windowMs: 60_000 });
      await until(async () => (await fresh.policyStats('api')).current.ok > 10, 'outcomes reported again', 20_000);
      freshClient.destroy();
    } finally {
      await traffic.stop();
    }
  });
});

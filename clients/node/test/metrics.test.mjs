// Metrics (README "Metrics and deny events", the contract's
// observability.metrics) against redis-server with the module: each level
// and outcome a Limiter takes counted under its rule, Redis round trips
// timed, the breaker's gauge; the Protection's scale, stage and breaker
// gauges; and the example service (examples/protection.mjs) driven over real
// HTTP, its /metrics scraped over HTTP, checked by `promtool check metrics`,
// its decision counts equal to what the test drove, its deny events carrying
// client_ip and user_agent.
import assert from 'node:assert/strict';
import { execFileSync, spawnSync } from 'node:child_process';
import { existsSync } from 'node:fs';
import { createRequire } from 'node:module';
import { after, before, describe, test } from 'node:test';
import { Redis } from 'ioredis';
import { createClient } from 'redis';
import { Registry, register } from 'prom-client';
import { RateLimiterMemory } from 'rate-limiter-flexible';
import { Client, DenyEvents, InvalidArgumentError, Limiter, Protection, RateLimiterRL, RateLimitMetrics, RLStore, REDIS_BREAKER } from 'redis-ratelimit';
import { start } from '../examples/protection.mjs';
import { sleep, startServer, STILL_MS } from './servers.mjs';

const PROMTOOL = process.env.PROMTOOL || '/usr/bin/promtool';

async function until(cond, what, ms = 20_000) {
  const deadline = Date.now() + ms;
  for (;;) {
    const v = await cond();
    if (v) return v;
    if (Date.now() > deadline) assert.fail(`timed out waiting for ${what}`);
    await sleep(10);
  }
}

/** A scrape as a Map: `name{k="v",...}` (labels sorted) to its value; also the # TYPE lines. */
function parse(text) {
  const values = new Map();
  const types = new Map();
  for (const line of text.split('\n')) {
    if (line.startsWith('# TYPE ')) {
      const [, , name, type] = line.split(' ');
      types.set(name, type);
      continue;
    }
    if (line === '' || line.startsWith('#')) continue;
    const m = /^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)$/.exec(line);
    assert.ok(m, `not a sample line: ${line}`);
    const labels = m[2] ? [...m[2].matchAll(/([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"/g)].map((x) => `${x[1]}="${x[2]}"`).sort() : [];
    values.set(labels.length ? `${m[1]}{${labels.join(',')}}` : m[1], Number(m[3]));
  }
  return { values, types, get: (k) => values.get(k) ?? 0 };
}

const dec = (rule, level, outcome) => `ratelimit_decisions_total{level="${level}",outcome="${outcome}",rule="${rule}"}`;

/** Runs promtool check metrics on `text`; skips (saying why) without promtool. */
function promtool(t, text) {
  if (!existsSync(PROMTOOL)) {
    t.skip(`promtool not found at ${PROMTOOL} (Debian's prometheus package; scripts/setup.sh installs it)`);
    return;
  }
  const r = spawnSync(PROMTOOL, ['check', 'metrics'], { input: text });
  assert.equal(r.status, 0, `promtool check metrics failed:\n${r.stdout}${r.stderr}`);
}

let server;
let redis;
let rl;
before(async () => {
  server = await startServer();
  redis = new Redis({ port: server.port, host: '127.0.0.1' });
  rl = new Client(redis);
});
after(async () => {
  redis.disconnect();
  await server.stop();
});

describe('metrics', () => {
  test('the option: true is prom-client\'s global register, a Registry its own set (one per registry), anything else refused naming metrics', async () => {
    const reg = new Registry();
    const a = new Limiter(rl, { metrics: reg });
    const b = new Limiter(rl, { metrics: reg });
    assert.equal(a.metrics, b.metrics);
    assert.equal(a.metrics.registry, reg);
    assert.equal(new Limiter(rl, { metrics: true }).metrics, RateLimitMetrics.of(register));
    assert.equal(new Limiter(rl).metrics, undefined);
    assert.equal(new Limiter(rl, { metrics: false }).metrics, undefined);
    for (const bad of ['yes', 1, null, {}]) {
      assert.throws(() => new Limiter(rl, { metrics: bad }), (e) => e instanceof InvalidArgumentError && e.argument === 'metrics', String(bad));
      assert.throws(() => new Protection(rl, [], { metrics: bad }), (e) => e instanceof InvalidArgumentError && e.argument === 'metrics', String(bad));
    }
    await assert.rejects(new Limiter(rl, { metrics: reg }).check(undefined, 'a'), InvalidArgumentError);
    const set = await a.ruleSet([{ spec: { algorithm: 'sliding', limit: 1, windowMs: 1000 } }]);
    await assert.rejects(a.check(set, 'a', 1, 'ip'), (e) => e instanceof InvalidArgumentError && e.argument === 'context');
  });

  test('every level and outcome of the Limiter, under the rule\'s name; Redis round trips timed; remaining ratio', async () => {
    const reg = new Registry();
    const limiter = new Limiter(rl, { metrics: reg, instances: 10, deadlineMs: 5000 }); // a loaded machine's slow answer is still Redis's
    const user = await limiter.ruleSet([{ name: 'user', spec: { algorithm: 'fixedwindow', limit: 2, windowMs: STILL_MS } }]);
    // Global: each of 10 instances takes ceil(2 / 10 x 1.1) = 1 in process.
    const global = await limiter.ruleSet([{ name: 'site', key: 'rl:site', global: true, spec: { algorithm: 'fixedwindow', limit: 2, windowMs: STILL_MS } }]);
    const paths = [];
    for (let i = 0; i < 3; i++) paths.push((await limiter.check(user, 'ann')).path);
    paths.push((await limiter.check(user, 'ann')).path);
    paths.push((await limiter.check(global, 'x')).path);
    paths.push((await limiter.check(global, 'x')).path);
    assert.deepEqual(paths, ['redis', 'redis', 'redis', 'denyCache', 'redis', 'local']);
    let m = parse(await reg.metrics());
    assert.equal(m.get(dec('user', 'redis', 'admitted')), 2);
    assert.equal(m.get(dec('user', 'redis', 'denied')), 1);
    assert.equal(m.get(dec('user', 'deny_cache', 'denied')), 1);
    assert.equal(m.get(dec('site', 'redis', 'admitted')), 1);
    assert.equal(m.get(dec('site', 'local', 'denied')), 1);
    assert.equal([...m.values.keys()].filter((k) => k.startsWith('ratelimit_decisions_total')).length, 5);
    // Four calls answered by Redis, each a round trip.
    const s = limiter.stats();
    assert.equal(s.redis_calls, 4);
    assert.equal(m.get('ratelimit_redis_seconds_count'), 4);
    assert.ok(m.get('ratelimit_redis_seconds_sum') > 0);
    assert.equal(m.get('ratelimit_redis_seconds_bucket{le="+Inf"}'), 4);
    assert.equal(m.get('ratelimit_remaining_ratio{rule="user"}'), 0);
    assert.equal(m.get('ratelimit_remaining_ratio{rule="site"}'), 0);
    assert.equal(m.get(`ratelimit_breaker_open{breaker="${REDIS_BREAKER}"}`), 0);
    await limiter.check(user, 'bob');
    m = parse(await reg.metrics());
    assert.equal(m.get('ratelimit_remaining_ratio{rule="user"}'), 0.5);
    // A policy rule is counted under the policy's name (never a key).
    await rl.policySet('orders', { algorithm: 'tokenbucket', capacity: 5, refillCount: 1, refillMs: 60_000 });
    const orders = await limiter.ruleSet([{ policy: 'orders' }]);
    await limiter.check(orders, 'carl');
    m = parse(await reg.metrics());
    assert.equal(m.get(dec('orders', 'redis', 'admitted')), 1);
    assert.equal(m.get('ratelimit_remaining_ratio{rule="orders"}'), 0.8);
    // Several rules (RL.ALL): an admission counts for each rule, a denial for the rule that denied.
    const both = await limiter.ruleSet([
      { name: 'a', spec: { algorithm: 'fixedwindow', limit: 5, windowMs: STILL_MS }, keyPrefix: '{t}:a:' },
      { name: 'b', spec: { algorithm: 'fixedwindow', limit: 1, windowMs: STILL_MS }, keyPrefix: '{t}:b:' },
    ]);
    assert.equal((await limiter.check(both, 'd')).allowed, true);
    assert.equal((await limiter.check(both, 'd')).deniedBy, 1);
    m = parse(await reg.metrics());
    assert.equal(m.get(dec('a', 'redis', 'admitted')), 1);
    assert.equal(m.get(dec('b', 'redis', 'admitted')), 1);
    assert.equal(m.get(dec('b', 'redis', 'denied')), 1);
    assert.equal(m.get(dec('a', 'redis', 'denied')), 0);
  });

  test('the fallback\'s decisions, and the breaker\'s gauge while it is open', async () => {
    const dead = await startServer();
    const c = new Redis({ port: dead.port, host: '127.0.0.1', enableOfflineQueue: false, maxRetriesPerRequest: 0, lazyConnect: true });
    c.on('error', () => {});
    await c.connect();
    await dead.stop();
    await until(() => c.status !== 'ready', 'ioredis to see the server gone');
    const reg = new Registry();
    const rule = [{ name: 'pay', spec: { algorithm: 'fixedwindow', limit: 1, windowMs: STILL_MS } }];
    const closed = new Limiter(c, { metrics: reg, fallback: 'failClosed', breaker: { failures: 1, openForMs: 60_000 } });
    const open = new Limiter(c, { metrics: reg, fallback: 'failOpen' });
    const setC = await closed.ruleSet(rule);
    const setO = await open.ruleSet(rule);
    const d1 = await closed.check(setC, 'e');
    const d2 = await closed.check(setC, 'e');
    const d3 = await open.check(setO, 'e');
    assert.deepEqual([d1.path, d1.allowed, d2.path, d2.allowed, d3.path, d3.allowed], ['fallback', false, 'fallback', false, 'fallback', true]);
    const m = parse(await reg.metrics());
    assert.equal(m.get(dec('pay', 'fallback', 'denied')), 2);
    assert.equal(m.get(dec('pay', 'fallback', 'admitted')), 1);
    assert.equal(closed.stats().breaker_opened, 1);
    assert.equal(m.get('ratelimit_breaker_open{breaker="redis"}'), 1, 'the breaker opened at the first failure');
    // No round trip: a refused connection is not timed; the fallback sets no remaining ratio.
    assert.equal(m.get('ratelimit_redis_seconds_count'), 0);
    assert.equal(m.values.has('ratelimit_remaining_ratio{rule="pay"}'), false);
    c.disconnect();
  });

  test('the Protection\'s scale, stage and breaker gauges follow its reads', async () => {
    const reg = new Registry();
    await rl.policySet('staged', { algorithm: 'fixedwindow', limit: 1, windowMs: STILL_MS }, { stages: { degrade: 30, break: 50 }, windowMs: 300 });
    const p = new Protection(rl, ['staged'], { metrics: reg, reportIntervalMs: 50, stagePollMs: 50, stageHoldMs: 2000, breakers: { backend: ['staged'] } });
    try {
      await p.refresh();
      let m = parse(await reg.metrics());
      assert.equal(m.get('ratelimit_stage{rule="staged"}'), 0);
      assert.equal(m.get('ratelimit_scale{rule="staged"}'), 100);
      assert.equal(m.values.get('ratelimit_breaker_open{breaker="backend"}'), 0);
      // The scale set to 60 (which starts the windows again), then 1 admitted, 3 denied in a window: stage 2.
      await rl.policyScale('staged', 60);
      for (let i = 0; i < 4; i++) await rl.hit('staged', 'k');
      m = await until(async () => {
        const x = parse(await reg.metrics());
        return x.get('ratelimit_stage{rule="staged"}') === 2 && x.get('ratelimit_scale{rule="staged"}') === 60 ? x : undefined;
      }, 'stage 2 and scale 60 in the gauges');
      assert.equal(p.stage('staged'), 2);
      assert.equal(m.get('ratelimit_breaker_open{breaker="backend"}'), 1, 'stage 2 forced the breaker open');
      // A breaker of the application's, opening on its own failures.
      const own = p.breaker('db');
      for (let i = 0; i < own.failures; i++) own.failure();
      assert.equal(parse(await reg.metrics()).get('ratelimit_breaker_open{breaker="db"}'), 1);
      own.release();
      assert.equal(parse(await reg.metrics()).get('ratelimit_breaker_open{breaker="db"}'), 0);
    } finally {
      await p.close();
    }
    // close() releases the breaker it forced open: the gauge says so.
    assert.equal(parse(await reg.metrics()).get('ratelimit_breaker_open{breaker="backend"}'), 0);
  });

  test('the example service over HTTP: /metrics passes promtool, its counts are what the test drove, its deny events carry client_ip and user_agent', async (t) => {
    const client = await createClient({ url: server.url }).connect();
    const events = [];
    const denyEvents = new DenyEvents({ callback: (b) => void events.push(...b), flushIntervalMs: 50 });
    const registry = new Registry();
    const svc = await start({ client, registry, denyEvents, protection: { reportIntervalMs: 100, stagePollMs: 100, stageHoldMs: 1000 } });
    try {
      const get = (p) => fetch(svc.url + p, { headers: { 'User-Agent': 'metrics-test/1' } });
      // /api/report: 2 per window, then its degrade handler answers the cached report (X-Degraded: denied).
      let reportAdmitted = 0;
      let reportDenied = 0;
      for (let i = 0; i < 8; i++) {
        const res = await get('/api/report');
        assert.equal(res.status, 200);
        if (res.headers.get('x-degraded') === 'denied') reportDenied++;
        else reportAdmitted++;
        await res.arrayBuffer();
      }
      // /api/items: admitted (capacity 200).
      for (let i = 0; i < 5; i++) {
        const res = await get('/api/items');
        assert.equal(res.status, 200);
        await res.arrayBuffer();
      }
      assert.ok(reportAdmitted >= 2 && reportDenied >= 1, `${reportAdmitted} admitted, ${reportDenied} denied`);
      const scrape = await fetch(svc.url + '/metrics');
      assert.equal(scrape.status, 200);
      assert.match(scrape.headers.get('content-type'), /^text\/plain/);
      const text = await scrape.text();
      promtool(t, text);
      const m = parse(text);
      for (const [name, type] of [
        ['ratelimit_decisions_total', 'counter'],
        ['ratelimit_redis_seconds', 'histogram'],
        ['ratelimit_remaining_ratio', 'gauge'],
        ['ratelimit_breaker_open', 'gauge'],
        ['ratelimit_scale', 'gauge'],
        ['ratelimit_stage', 'gauge'],
      ]) {
        assert.equal(m.types.get(name), type, name);
      }
      // Per outcome, what the test saw; per level, what the limiter's own
      // counters say (on a loaded machine a call may miss its 100 ms
      // deadline, and the fallback decide).
      const s = svc.limiter.stats();
      const total = (rule, outcome) => ['redis', 'deny_cache', 'local', 'fallback'].reduce((n, level) => n + m.get(dec(rule, level, outcome)), 0);
      assert.equal(total('report', 'admitted'), reportAdmitted);
      assert.equal(total('report', 'denied'), reportDenied);
      assert.equal(total('api', 'admitted'), 5);
      assert.equal(total('api', 'denied'), 0);
      assert.equal(m.get(dec('report', 'redis', 'denied')), s.redis_denied);
      assert.equal(m.get(dec('report', 'deny_cache', 'denied')), s.deny_cache_hits);
      assert.equal(m.get(dec('report', 'redis', 'admitted')) + m.get(dec('api', 'redis', 'admitted')), s.redis_admitted);
      assert.equal(m.get(dec('report', 'fallback', 'admitted')) + m.get(dec('api', 'fallback', 'admitted')), s.fallback_admitted);
      assert.equal(m.get(dec('report', 'fallback', 'denied')), s.fallback_denied);
      assert.ok(s.redis_admitted >= 1 && s.redis_denied >= 1, JSON.stringify(s));
      // Every call answered or past its deadline is a round trip.
      assert.equal(m.get('ratelimit_redis_seconds_count'), s.redis_admitted + s.redis_denied + s.redis_errors + s.redis_timeouts);
      assert.equal(m.get('ratelimit_stage{rule="api"}'), 0);
      assert.equal(m.get('ratelimit_scale{rule="api"}'), 100);
      assert.equal(m.get('ratelimit_breaker_open{breaker="backend"}'), 0);
      assert.equal(m.get('ratelimit_breaker_open{breaker="redis"}'), 0);
      // Every denial as an event, from the HTTP layer.
      await until(() => events.length === reportDenied, `${reportDenied} deny events`);
      for (const e of events) {
        assert.equal(e.rule, 'report');
        assert.equal(e.key, 'rl:report:all');
        assert.match(e.client_ip, /127\.0\.0\.1/);
        assert.equal(e.user_agent, 'metrics-test/1');
        assert.deepEqual(Object.keys(e), ['timestamp', 'key', 'rule', 'level', 'outcome', 'limit', 'remaining', 'retry_after_ms', 'client_ip', 'user_agent']);
      }
    } finally {
      await svc.close();
      await client.quit();
    }
  });

  test('RateLimiterRL: Redis, an in-memory block (deny_cache, no round trip) and the insurance limiter (fallback), under its name; its denials as events', async () => {
    const reg = new Registry();
    const batches = [];
    const events = new DenyEvents({ callback: (b) => void batches.push(...b), background: false });
    const l = new RateLimiterRL({ storeClient: redis, keyPrefix: `otp${Date.now()}`, points: 2, duration: 60, inMemoryBlockOnConsumed: 2, metrics: reg, denyEvents: events });
    const outcomes = [];
    for (let i = 0; i < 4; i++) outcomes.push(await l.consume('u').then(() => 'ok', () => 'no'));
    assert.deepEqual(outcomes, ['ok', 'ok', 'no', 'no']);
    let m = parse(await reg.metrics());
    assert.equal(m.get(dec(l.name, 'redis', 'admitted')), 2);
    assert.equal(m.get(dec(l.name, 'deny_cache', 'denied')), 2);
    assert.equal(m.get('ratelimit_redis_seconds_count'), 2, 'an in-memory block makes no round trip');
    await events.flush();
    assert.deepEqual(batches.map((e) => [e.rule, e.level, e.key]), [[l.name, 'deny_cache', `${l.keyPrefix}:u`], [l.name, 'deny_cache', `${l.keyPrefix}:u`]]);
    await events.close();
    // Redis away: the insurance limiter decides (level fallback), the breaker opens.
    const dead = await startServer();
    const c = new Redis({ port: dead.port, host: '127.0.0.1', enableOfflineQueue: false, maxRetriesPerRequest: 0, lazyConnect: true });
    c.on('error', () => {});
    await c.connect();
    await dead.stop();
    await until(() => c.status !== 'ready', 'ioredis to see the server gone');
    const reg2 = new Registry();
    const insured = new RateLimiterRL({ storeClient: c, name: 'insured', points: 2, duration: 60, breaker: { failures: 1 }, insuranceLimiter: new RateLimiterMemory({ points: 1, duration: 60 }), metrics: reg2 });
    const got = [];
    for (let i = 0; i < 3; i++) got.push(await insured.consume('v').then(() => 'ok', () => 'no'));
    assert.deepEqual(got, ['ok', 'no', 'no']);
    m = parse(await reg2.metrics());
    assert.equal(m.get(dec('insured', 'fallback', 'admitted')), 1);
    assert.equal(m.get(dec('insured', 'fallback', 'denied')), 2);
    assert.equal(m.get('ratelimit_breaker_open{breaker="redis"}'), 1);
    c.disconnect();
  });

  test('RLStore: Redis\'s decisions, and with passOnStoreError the account\'s (fallback), under its name', async () => {
    const reg = new Registry();
    const store = new RLStore({ client: redis, prefix: `st${Date.now()}:`, name: 'web', metrics: reg });
    store.init({ windowMs: 60_000, limit: 2 });
    await store.ready;
    const hits = [];
    for (let i = 0; i < 3; i++) hits.push((await store.increment('ip')).totalHits);
    assert.deepEqual(hits, [1, 2, 3]);
    let m = parse(await reg.metrics());
    assert.equal(m.get(dec('web', 'redis', 'admitted')), 2);
    assert.equal(m.get(dec('web', 'redis', 'denied')), 1);
    assert.equal(m.get('ratelimit_redis_seconds_count'), 3);
    assert.equal(m.get('ratelimit_remaining_ratio{rule="web"}'), 0);
    assert.throws(() => new RLStore({ client: redis, name: '' }), (e) => e instanceof InvalidArgumentError && e.argument === 'name');
    assert.throws(() => new RLStore({ client: redis, metrics: 'x' }), (e) => e instanceof InvalidArgumentError && e.argument === 'metrics');
    assert.throws(() => new RateLimiterRL({ storeClient: redis, denyEvents: [] }), (e) => e instanceof InvalidArgumentError && e.argument === 'denyEvents');

    const dead = await startServer();
    const c = new Redis({ port: dead.port, host: '127.0.0.1', enableOfflineQueue: false, maxRetriesPerRequest: 0, lazyConnect: true });
    c.on('error', () => {});
    await c.connect();
    await dead.stop();
    await until(() => c.status !== 'ready', 'ioredis to see the server gone');
    const reg2 = new Registry();
    const fallback = new RLStore({ client: c, name: 'web', metrics: reg2 });
    fallback.init({ windowMs: 60_000, limit: 1, passOnStoreError: true });
    await fallback.ready;
    const got = [];
    for (let i = 0; i < 3; i++) got.push((await fallback.increment('ip')).totalHits);
    // The account holds ceil(1 x 1.1) = 2: two admitted, then a 429 (totalHits above the limit).
    assert.deepEqual(got.map((h) => h > 1), [false, false, true]);
    m = parse(await reg2.metrics());
    assert.equal(m.get(dec('web', 'fallback', 'admitted')), 2);
    assert.equal(m.get(dec('web', 'fallback', 'denied')), 1);
    c.disconnect();
  });

  test('promtool check metrics also passes on a scrape with every metric present', async (t) => {
    const reg = new Registry();
    const limiter = new Limiter(rl, { metrics: reg });
    const set = await limiter.ruleSet([{ name: 'x', spec: { algorithm: 'sliding', limit: 1, windowMs: 1000 } }]);
    await limiter.check(set, 'a');
    await limiter.check(set, 'a');
    const p = new Protection(rl, ['x'], { metrics: reg });
    const ev = new DenyEvents({ callback: () => {}, metrics: reg });
    await ev.close();
    await p.close();
    const text = await reg.metrics();
    for (const name of ['ratelimit_decisions_total', 'ratelimit_redis_seconds', 'ratelimit_remaining_ratio', 'ratelimit_breaker_open', 'ratelimit_scale', 'ratelimit_stage', 'ratelimit_deny_events_dropped_total', 'ratelimit_deny_events_shipped_total', 'ratelimit_deny_events_sink_errors_total']) {
      assert.match(text, new RegExp(`^# TYPE ${name} `, 'm'), name);
    }
    promtool(t, text);
    if (existsSync(PROMTOOL)) assert.equal(execFileSync(PROMTOOL, ['check', 'metrics'], { input: text }).toString(), '');
  });
});

describe('metrics: one registry shared', () => {
  test('two limiters on one registry: ratelimit_breaker_open{breaker="redis"} is 1 while any breaker is open (a limiter made later, or a healthy one, does not hide it)', async (t) => {
    const dead = await startServer();
    const c = new Redis({ port: dead.port, host: '127.0.0.1', enableOfflineQueue: false, maxRetriesPerRequest: 0, lazyConnect: true });
    c.on('error', () => {});
    await c.connect();
    await dead.stop();
    await until(() => c.status !== 'ready', 'ioredis to see the server gone');
    const reg = new Registry();
    t.after(() => c.disconnect());
    const rule = [{ name: 'pay', spec: { algorithm: 'fixedwindow', limit: 1, windowMs: STILL_MS } }];
    const broken = new Limiter(c, { metrics: reg, fallback: 'failOpen', breaker: { failures: 1, openForMs: 60_000 } });
    await broken.check(await broken.ruleSet(rule), 'e');
    assert.equal(broken.breakerOpen, true);
    assert.equal(parse(await reg.metrics()).get('ratelimit_breaker_open{breaker="redis"}'), 1);
    // Another limiter on the same registry, to a healthy server: made, then answering.
    const healthy = new Limiter(rl, { metrics: reg });
    assert.equal(parse(await reg.metrics()).get('ratelimit_breaker_open{breaker="redis"}'), 1, 'a limiter made later hid the open breaker');
    await healthy.check(await healthy.ruleSet(rule), 'f');
    assert.equal(healthy.breakerOpen, false);
    assert.equal(parse(await reg.metrics()).get('ratelimit_breaker_open{breaker="redis"}'), 1, 'a healthy limiter hid the open breaker');
    // Two Protections' breakers of one name: open while either is.
    const p1 = new Protection(rl, [], { metrics: reg });
    const p2 = new Protection(rl, [], { metrics: reg });
    try {
      const b1 = p1.breaker('db');
      for (let i = 0; i < b1.failures; i++) b1.failure();
      p2.breaker('db');
      assert.equal(parse(await reg.metrics()).get('ratelimit_breaker_open{breaker="db"}'), 1);
      b1.release();
      assert.equal(parse(await reg.metrics()).get('ratelimit_breaker_open{breaker="db"}'), 0);
    } finally {
      await p1.close();
      await p2.close();
    }
  });

  test('the ESM and CommonJS builds side by side on one registry (and on prom-client\'s global one): one set of metrics, both builds counted', async () => {
    const cjs = createRequire(import.meta.url)('redis-ratelimit');
    const esm = await import('redis-ratelimit');
    assert.notEqual(cjs.Limiter, esm.Limiter);
    const reg = new Registry();
    const rule = [{ name: 'both', spec: { algorithm: 'fixedwindow', limit: 100, windowMs: STILL_MS } }];
    const a = new esm.Limiter(rl, { metrics: reg });
    const b = new cjs.Limiter(new cjs.Client(redis), { metrics: reg });
    assert.equal(a.metrics, b.metrics);
    assert.equal(cjs.RateLimitMetrics.of(reg), esm.RateLimitMetrics.of(reg));
    await a.check(await a.ruleSet(rule), 'x');
    await b.check(await b.ruleSet(rule), 'x');
    const events = new cjs.DenyEvents({ callback: () => {}, metrics: reg });
    await events.close();
    assert.equal(parse(await reg.metrics()).get(dec('both', 'redis', 'admitted')), 2);
    // metrics: true in both builds: prom-client's global register, one set.
    assert.equal(new cjs.Limiter(new cjs.Client(redis), { metrics: true }).metrics, new esm.Limiter(rl, { metrics: true }).metrics);
  });
});

// Deny events (README "Metrics and deny events", the contract's
// observability.deny_events): a real _bulk HTTP endpoint written here (it
// parses the NDJSON and checks every action/event pair), a real file, a
// callback; dead sinks (a refused connection, a server that never answers,
// a 500, a reply with errors) cost counts, not requests; a full buffer with
// its flusher stopped drops exactly the oldest. Denials come from a Limiter
// against redis-server with the module.
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import http from 'node:http';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { after, before, describe, test } from 'node:test';
import { Redis } from 'ioredis';
import { Registry } from 'prom-client';
import { Client, DenyEvents, DENY_EVENT_DEFAULTS, DENY_EVENT_FIELDS, InvalidArgumentError, Limiter, MAX_HEADER_BYTES, rateLimitMiddleware } from 'redis-ratelimit';
import { sleep, startServer } from './servers.mjs';

const ACTION = '{"index":{"_index":"ratelimit-deny"}}';

/** Polls `cond` every 10 ms until it holds; fails after 20 s. */
async function until(cond, what) {
  const deadline = Date.now() + 20_000;
  while (!(await cond())) {
    if (Date.now() > deadline) assert.fail(`timed out waiting for ${what}`);
    await sleep(10);
  }
}

/** The field names of an event line, in order: the contract's, the optional ones only when present. */
function checkOrder(event) {
  const keys = Object.keys(event);
  const want = DENY_EVENT_FIELDS.filter((f) => f in event);
  assert.deepEqual(keys, want);
  for (const f of DENY_EVENT_FIELDS.slice(0, 8)) assert.ok(f in event, `${f} missing from ${JSON.stringify(event)}`);
  assert.match(event.timestamp, /^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$/);
}

/**
 * A _bulk endpoint: POST /_bulk with application/x-ndjson, an action line
 * then an event line per event; answers { errors: false, items }. `mode`:
 * 'ok', 'hang' (reads the body, never answers), 500, or 'errors'.
 */
async function bulkServer(mode = 'ok') {
  const batches = [];
  const problems = [];
  const hung = [];
  const server = http.createServer((req, res) => {
    let body = '';
    req.setEncoding('utf8');
    req.on('data', (c) => (body += c));
    req.on('end', () => {
      if (req.method !== 'POST' || req.url !== '/_bulk') problems.push(`${req.method} ${req.url}`);
      if (req.headers['content-type'] !== 'application/x-ndjson') problems.push(`content-type ${req.headers['content-type']}`);
      if (!body.endsWith('\n')) problems.push('no final newline');
      const lines = body.split('\n').slice(0, -1);
      if (lines.length % 2 !== 0) problems.push(`odd line count ${lines.length}`);
      const events = [];
      for (let i = 0; i < lines.length; i += 2) {
        if (lines[i] !== ACTION) problems.push(`action line ${lines[i]}`);
        events.push(JSON.parse(lines[i + 1]));
      }
      if (mode === 'hang') {
        hung.push({ req, res, events });
        return;
      }
      batches.push(events);
      if (mode === 500) return res.writeHead(500).end('{"error":"down"}');
      res.writeHead(200, { 'Content-Type': 'application/json' });
      res.end(JSON.stringify({ took: 1, errors: mode === 'errors', items: events.map(() => ({ index: { status: 201 } })) }));
    });
  });
  await new Promise((r) => server.listen(0, '127.0.0.1', r));
  return {
    url: `http://127.0.0.1:${server.address().port}`,
    batches,
    problems,
    hung,
    events: () => batches.flat(),
    close: () => {
      for (const h of hung) h.res.destroy();
      server.closeAllConnections?.();
      return new Promise((r) => server.close(r));
    },
  };
}

/** A loopback port nothing listens on. */
function closedPort() {
  return new Promise((resolve) => {
    const s = net.createServer();
    s.listen(0, '127.0.0.1', () => {
      const { port } = s.address();
      s.close(() => resolve(port));
    });
  });
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

/** A limiter admitting 1 per minute per identity, every later request denied (by Redis, then its deny cache). */
async function denyingLimiter(denyEvents, options = {}) {
  const limiter = new Limiter(rl, { denyEvents, deadlineMs: 5000, ...options });
  const set = await limiter.ruleSet([{ name: 'login', spec: { algorithm: 'fixedwindow', limit: 1, windowMs: 2 ** 40 }, keyPrefix: `rl:ev:${Math.random()}:` }]);
  return { limiter, set };
}

describe('deny events', () => {
  test('defaults are the contract\'s', () => {
    assert.deepEqual({ ...DENY_EVENT_DEFAULTS }, { capacity: 10_000, flushEvents: 1000, flushIntervalMs: 5000, timeoutMs: 2000, bulkIndex: 'ratelimit-deny' });
    const events = new DenyEvents({ callback: () => {} });
    assert.equal(events.capacity, 10_000);
    assert.equal(events.flushEvents, 1000);
    assert.equal(events.flushIntervalMs, 5000);
    assert.equal(events.timeoutMs, 2000);
    assert.equal(events.bulkIndex, 'ratelimit-deny');
    return events.close();
  });

  test('bad options are refused, naming the option', () => {
    const bad = [
      [{}, 'sink'],
      [{ file: '/tmp/x', callback: () => {} }, 'callback'],
      [{ file: '' }, 'file'],
      [{ bulkUrl: 'ftp://x' }, 'bulkUrl'],
      [{ bulkUrl: 'not a url' }, 'bulkUrl'],
      [{ callback: 3 }, 'callback'],
      [{ callback: () => {}, capacity: 0 }, 'capacity'],
      [{ callback: () => {}, capacity: 10, flushEvents: 11 }, 'flushEvents'],
      [{ callback: () => {}, flushIntervalMs: 0 }, 'flushIntervalMs'],
      [{ callback: () => {}, timeoutMs: 1.5 }, 'timeoutMs'],
      [{ callback: () => {}, bulkIndex: '' }, 'bulkIndex'],
      [{ callback: () => {}, background: 'no' }, 'background'],
      [{ callback: () => {}, metrics: 'yes' }, 'metrics'],
    ];
    for (const [options, name] of bad) {
      assert.throws(() => new DenyEvents(options), (e) => e instanceof InvalidArgumentError && e.argument === name, JSON.stringify(options));
    }
    assert.throws(() => new DenyEvents(null), (e) => e instanceof InvalidArgumentError && e.argument === 'options');
    assert.throws(() => new Limiter(rl, { denyEvents: {} }), (e) => e instanceof InvalidArgumentError && e.argument === 'denyEvents');
  });

  test('a flood to a real _bulk endpoint: every denial arrives, in batches of at most 1,000, shipped as soon as 1,000 wait', async () => {
    const bulk = await bulkServer();
    const registry = new Registry();
    const events = new DenyEvents({ bulkUrl: bulk.url, metrics: registry });
    const { limiter, set } = await denyingLimiter(events);
    const N = 5000;
    let denied = 0;
    for (let i = 0; i < N; i++) {
      const d = await limiter.check(set, `u${i % 10}`);
      if (!d.allowed) denied++;
    }
    assert.equal(denied, N - 10);
    // The flush interval is 5 s; full batches leave as soon as 1,000 wait.
    await until(() => bulk.events().length >= 4000, 'four full batches before the interval');
    await events.close();
    assert.deepEqual(bulk.problems, []);
    const got = bulk.events();
    assert.equal(got.length, denied);
    assert.ok(bulk.batches.every((b) => b.length >= 1 && b.length <= 1000), bulk.batches.map((b) => b.length).join(','));
    for (const e of got) {
      checkOrder(e);
      assert.equal(e.rule, 'login');
      assert.equal(e.outcome, 'denied');
      assert.ok(e.level === 'redis' || e.level === 'deny_cache', e.level);
      assert.equal(e.limit, 1);
      assert.equal(e.remaining, 0);
      assert.ok(e.retry_after_ms > 0);
      assert.ok(!('client_ip' in e) && !('user_agent' in e), 'no HTTP here: the optional fields are left out');
    }
    // Every identity's denials, and the first of each from Redis.
    assert.equal(new Set(got.map((e) => e.key)).size, 10);
    assert.equal(got.filter((e) => e.level === 'redis').length >= 10, true);
    assert.deepEqual(events.stats(), { pending: 0, shipped: denied, dropped: 0, sinkErrors: 0, batches: bulk.batches.length });
    const text = await registry.metrics();
    assert.match(text, new RegExp(`^ratelimit_deny_events_shipped_total ${denied}$`, 'm'));
    assert.match(text, /^ratelimit_deny_events_dropped_total 0$/m);
    assert.match(text, /^ratelimit_deny_events_sink_errors_total 0$/m);
    await bulk.close();
  });

  test('a file sink appends JSON lines, in order; close() ships what is left', async () => {
    const dir = mkdtempSync(path.join(os.tmpdir(), 'rl-events-'));
    try {
      const file = path.join(dir, 'deny.jsonl');
      const events = new DenyEvents({ file });
      const { limiter, set } = await denyingLimiter(events);
      await limiter.check(set, 'alice');
      for (let i = 0; i < 3; i++) await limiter.check(set, 'alice', 1, { clientIp: '10.0.0.7', userAgent: 'curl/8.0' });
      await limiter.check(set, 'alice', 1, { clientIp: '10.0.0.8' });
      assert.equal(events.stats().pending, 4);
      await events.close();
      const lines = readFileSync(file, 'utf8').split('\n');
      assert.equal(lines.pop(), '');
      const got = lines.map((l) => JSON.parse(l));
      assert.equal(got.length, 4);
      got.forEach(checkOrder);
      assert.deepEqual(
        got.map((e) => [e.level, e.client_ip, e.user_agent]),
        [
          ['redis', '10.0.0.7', 'curl/8.0'],
          ['deny_cache', '10.0.0.7', 'curl/8.0'],
          ['deny_cache', '10.0.0.7', 'curl/8.0'],
          ['deny_cache', '10.0.0.8', undefined],
        ],
      );
      assert.ok(got.every((e) => e.key.endsWith('alice')));
      // Recorded after close: dropped, counted.
      await limiter.check(set, 'alice');
      assert.equal(events.stats().dropped, 1);
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });

  test('huge headers over real HTTP: user_agent cut to at most 512 UTF-8 bytes at a character boundary, a prefix of the original', async () => {
    const batches = [];
    const shipped = new DenyEvents({ callback: (b) => void batches.push(...b), background: false });
    const { limiter, set } = await denyingLimiter(shipped);
    const limit = rateLimitMiddleware({ limiter, rules: set, keyGenerator: () => 'huge' });
    // Node's default header bound is 16 KiB: raised so the 20,000 bytes reach the middleware.
    const app = http.createServer({ maxHeaderSize: 64 * 1024 }, (req, res) => limit(req, res, () => res.end('ok')));
    await new Promise((r) => app.listen(0, '127.0.0.1', r));
    // 10,000 "é": 20,000 bytes in UTF-8 (Node's HTTP client sends each as one Latin-1 byte; its server reads them back as "é").
    const ua = 'é'.repeat(10_000);
    assert.equal(Buffer.byteLength(ua, 'utf8'), 20_000);
    try {
      const get = () =>
        new Promise((resolve, reject) => {
          const req = http.request({ host: '127.0.0.1', port: app.address().port, path: '/', headers: { 'User-Agent': ua }, agent: false }, (res) => {
            res.resume();
            res.on('end', () => resolve(res.statusCode));
          });
          req.on('error', reject);
          req.end();
        });
      assert.deepEqual([await get(), await get()], [200, 429]);
      await shipped.flush();
      assert.equal(batches.length, 1);
      const e = batches[0];
      assert.match(e.client_ip, /127\.0\.0\.1/);
      const bytes = Buffer.from(e.user_agent, 'utf8');
      assert.ok(bytes.length <= MAX_HEADER_BYTES && bytes.length > MAX_HEADER_BYTES - 2, `${bytes.length} bytes`);
      assert.ok(ua.startsWith(e.user_agent), 'a prefix of the original');
      assert.equal(new TextDecoder('utf-8', { fatal: true }).decode(bytes), e.user_agent, 'valid UTF-8');
    } finally {
      await shipped.close();
      await new Promise((r) => app.close(r));
    }
  });

  test('a caller\'s own context is cut too: 4-byte characters never split, a short value kept whole', async () => {
    const batches = [];
    const events = new DenyEvents({ callback: (b) => void batches.push(...b), background: false });
    const { limiter, set } = await denyingLimiter(events);
    await limiter.check(set, 'bob');
    // 😀 is 4 bytes: 128 fit in 512. 'ab' + 😀: 2 + 4k bytes, so 127 fit (510 bytes), the 128th would pass 512.
    await limiter.check(set, 'bob', 1, { clientIp: '😀'.repeat(1000), userAgent: 'ab' + '😀'.repeat(1000) });
    await limiter.check(set, 'bob', 1, { clientIp: 'x'.repeat(512), userAgent: 'y'.repeat(513) });
    await events.flush();
    const [a, b] = batches;
    assert.equal(a.client_ip, '😀'.repeat(128));
    assert.equal(a.user_agent, 'ab' + '😀'.repeat(127));
    assert.equal(b.client_ip, 'x'.repeat(512));
    assert.equal(b.user_agent, 'y'.repeat(512));
    await events.close();
  });

  test('a callback gets each batch on the flusher, never on the request', async () => {
    const batches = [];
    const events = new DenyEvents({ callback: (b) => void batches.push(b), flushEvents: 10, capacity: 100 });
    const { limiter, set } = await denyingLimiter(events, { denyCache: false });
    await limiter.check(set, 'bob');
    for (let i = 0; i < 10; i++) await limiter.check(set, 'bob');
    // The 10th denial woke the flusher: it runs after this turn of the event loop.
    assert.equal(batches.length, 0);
    await until(() => batches.length === 1, 'the first batch');
    assert.equal(batches[0].length, 10);
    assert.ok(batches[0].every((e) => e.level === 'redis' && e.rule === 'login'));
    await limiter.check(set, 'bob');
    await events.flush();
    assert.deepEqual(batches.map((b) => b.length), [10, 1]);
    await events.close();
  });

  test('a refused connection, a 500 and a reply with errors: each batch dropped and counted, never retried', async () => {
    for (const make of [async () => ({ url: `http://127.0.0.1:${await closedPort()}`, close: async () => {}, batches: [] }), () => bulkServer(500), () => bulkServer('errors')]) {
      const sink = await make();
      const registry = new Registry();
      const events = new DenyEvents({ bulkUrl: sink.url, metrics: registry, flushEvents: 5, capacity: 50 });
      const { limiter, set } = await denyingLimiter(events);
      for (let i = 0; i < 6; i++) await limiter.check(set, 'carol');
      await until(() => events.stats().sinkErrors === 1, `a sink error (${sink.url})`);
      await events.close();
      assert.deepEqual(events.stats(), { pending: 0, shipped: 0, dropped: 5, sinkErrors: 1, batches: 0 });
      // Never retried: the endpoint saw the batch once.
      assert.ok(sink.batches.length <= 1);
      const text = await registry.metrics();
      assert.match(text, /^ratelimit_deny_events_dropped_total 5$/m);
      assert.match(text, /^ratelimit_deny_events_sink_errors_total 1$/m);
      await sink.close();
    }
  });

  test('a sink that never answers: requests complete while it hangs; its batch is dropped at the timeout', async () => {
    const bulk = await bulkServer('hang');
    const events = new DenyEvents({ bulkUrl: bulk.url, flushEvents: 5, capacity: 1000, timeoutMs: 60_000 });
    const { limiter, set } = await denyingLimiter(events);
    for (let i = 0; i < 6; i++) await limiter.check(set, 'dave');
    await until(() => bulk.hung.length === 1, 'the sink to hold a batch');
    // The sink holds the flusher: requests go on, their denials wait in the buffer.
    const ds = await Promise.all(Array.from({ length: 200 }, () => limiter.check(set, 'dave')));
    assert.ok(ds.every((d) => !d.allowed));
    assert.equal(bulk.hung[0].res.writableEnded, false, 'the sink is still hanging');
    assert.equal(events.stats().pending, 200);
    assert.equal(events.stats().sinkErrors, 0);
    // The endpoint goes away: the held batch fails (counted), close() tries the rest once.
    await bulk.close();
    await events.close();
    assert.equal(events.stats().sinkErrors >= 1, true);
    assert.equal(events.stats().dropped, 205);
    assert.equal(events.stats().shipped, 0);

    // The timeout: a batch the sink does not answer within it is dropped and counted.
    const slow = await bulkServer('hang');
    const timed = new DenyEvents({ bulkUrl: slow.url, flushEvents: 5, capacity: 1000, timeoutMs: 100 });
    const l2 = await denyingLimiter(timed);
    for (let i = 0; i < 6; i++) await l2.limiter.check(l2.set, 'erin');
    await until(() => timed.stats().sinkErrors === 1, 'the timed-out batch');
    assert.equal(timed.stats().dropped, 5);
    assert.equal(timed.stats().shipped, 0);
    await timed.close();
    await slow.close();
  });

  test('a full buffer with the flusher stopped drops exactly the oldest', async () => {
    const registry = new Registry();
    const batches = [];
    const events = new DenyEvents({ callback: (b) => void batches.push(b), capacity: 100, flushEvents: 100, background: false, metrics: registry });
    const sent = 250;
    for (let i = 0; i < sent; i++) events.record({ key: `k${i}`, rule: 'r', level: 'redis', limit: 1, remaining: 0, retryAfterMs: 5 });
    assert.deepEqual(events.stats(), { pending: 100, shipped: 0, dropped: sent - 100, sinkErrors: 0, batches: 0 });
    assert.equal(batches.length, 0, 'no flusher: nothing shipped');
    await events.flush();
    assert.equal(batches.length, 1);
    assert.deepEqual(
      batches[0].map((e) => e.key),
      Array.from({ length: 100 }, (_, i) => `k${i + 150}`),
    );
    assert.match(await registry.metrics(), /^ratelimit_deny_events_dropped_total 150$/m);
    assert.match(await registry.metrics(), /^ratelimit_deny_events_shipped_total 100$/m);
    await events.close();
  });
});

describe('deny events: closing, bad events, bad replies', () => {
  const ev = (key) => ({ key, rule: 'r', level: 'redis', limit: 1, remaining: 0, retryAfterMs: 5 });

  test('close() twice: the second resolves when the first is done, not before', async () => {
    let release;
    const gate = new Promise((r) => (release = r));
    const shipped = [];
    const events = new DenyEvents({ background: false, callback: async (b) => {
      await gate;
      shipped.push(...b);
    } });
    for (let i = 0; i < 3; i++) events.record(ev(`k${i}`));
    const first = events.close();
    const second = events.close();
    setImmediate(release);
    await second;
    assert.equal(shipped.length, 3, 'the second close() resolved before the events were shipped');
    assert.deepEqual(events.stats(), { pending: 0, shipped: 3, dropped: 0, sinkErrors: 0, batches: 1 });
    await first;
  });

  test('close() bounds a flush already under way by its one deadline: a hanging sink is not given every batch, one timeout each', async () => {
    let calls = 0;
    const events = new DenyEvents({ background: false, flushEvents: 1, capacity: 100, timeoutMs: 200, callback: () => {
      calls++;
      return new Promise(() => {});
    } });
    for (let i = 0; i < 10; i++) events.record(ev(`k${i}`));
    const flushing = events.flush();
    assert.equal(calls, 1, 'the flush is under way');
    await events.close();
    assert.ok(calls <= 2, `close() waited for ${calls} batches of the flush under way, ${calls} x timeoutMs`);
    assert.deepEqual(events.stats(), { pending: 0, shipped: 0, dropped: 10, sinkErrors: calls, batches: 0 });
    await flushing;
  });

  test('await close() in a process with nothing else to do: it finishes (a hanging sink dropped at the timeout), the process does not exit under it', () => {
    const script = `
      import { DenyEvents } from 'redis-ratelimit';
      const events = new DenyEvents({ timeoutMs: 100, callback: () => new Promise(() => {}) });
      events.record({ key: 'k', rule: 'r', level: 'redis', limit: 1, remaining: 0, retryAfterMs: 5 });
      await events.close();
      console.log(JSON.stringify(events.stats()));
      const flushed = new DenyEvents({ timeoutMs: 100, background: false, callback: () => new Promise(() => {}) });
      flushed.record({ key: 'k', rule: 'r', level: 'redis', limit: 1, remaining: 0, retryAfterMs: 5 });
      await flushed.flush();
      console.log(JSON.stringify(flushed.stats()));
    `;
    const r = spawnSync(process.execPath, ['--input-type=module', '-e', script], { cwd: path.dirname(path.dirname(new URL(import.meta.url).pathname)), encoding: 'utf8' });
    assert.equal(r.status, 0, `exit ${r.status}: ${r.stderr}`);
    assert.deepEqual(r.stdout.trim().split('\n').map((l) => JSON.parse(l)), [
      { pending: 0, shipped: 0, dropped: 1, sinkErrors: 1, batches: 0 },
      { pending: 0, shipped: 0, dropped: 1, sinkErrors: 1, batches: 0 },
    ]);
  });

  test('record() refuses a bad event naming the field (it would have cost its whole batch on the flusher)', async () => {
    const batches = [];
    const events = new DenyEvents({ background: false, callback: (b) => void batches.push(b) });
    const bad = [
      [null, 'event'],
      ['x', 'event'],
      [{ ...ev('k'), key: 5n }, 'key'],
      [{ ...ev('k'), key: undefined }, 'key'],
      [{ ...ev('k'), rule: {} }, 'rule'],
      [{ ...ev('k'), level: 'disk' }, 'level'],
      [{ ...ev('k'), outcome: 'maybe' }, 'outcome'],
      [{ ...ev('k'), limit: 1n }, 'limit'],
      [{ ...ev('k'), remaining: '0' }, 'remaining'],
      [{ ...ev('k'), retryAfterMs: Number.NaN }, 'retryAfterMs'],
      [{ ...ev('k'), clientIp: 7 }, 'clientIp'],
      [{ ...ev('k'), userAgent: ['a'] }, 'userAgent'],
    ];
    events.record(ev('good1'));
    for (const [e, arg] of bad) {
      assert.throws(() => events.record(e), (err) => err instanceof InvalidArgumentError && err.argument === arg, `${arg}: ${String(e)}`);
    }
    events.record(ev('good2'));
    // The limiter checks a request's context before deciding (nothing counted for a refused request).
    const { limiter, set } = await denyingLimiter(events);
    for (const [ctx, arg] of [[{ clientIp: 7 }, 'clientIp'], [{ userAgent: ['a'] }, 'userAgent']]) {
      await assert.rejects(limiter.check(set, 'gil', 1, ctx), (err) => err instanceof InvalidArgumentError && err.argument === arg);
    }
    assert.equal(limiter.stats().redis_calls, 0);
    await events.close();
    assert.deepEqual(batches.flat().map((e) => e.key), ['good1', 'good2']);
    assert.deepEqual(events.stats(), { pending: 0, shipped: 2, dropped: 0, sinkErrors: 0, batches: 1 });
  });

  test('_bulk replies that are no acceptance: 200 with a body that is not JSON, JSON without errors:false, a redirect: each batch failed and counted', async () => {
    const replies = [
      [200, 'not json'],
      [200, '{"took":1}'],
      [200, 'null'],
      [201, '{"errors":"false"}'],
      [302, '{"errors":false}'],
    ];
    let n = 0;
    const server = http.createServer((req, res) => {
      req.resume();
      req.on('end', () => {
        const [status, body] = replies[n++];
        res.writeHead(status, { 'Content-Type': 'application/json', Location: '/elsewhere' }).end(body);
      });
    });
    await new Promise((r) => server.listen(0, '127.0.0.1', r));
    const events = new DenyEvents({ bulkUrl: `http://127.0.0.1:${server.address().port}`, background: false, flushEvents: 1, capacity: 10 });
    for (let i = 0; i < replies.length; i++) events.record(ev(`k${i}`));
    await events.flush();
    assert.equal(n, replies.length);
    assert.deepEqual(events.stats(), { pending: 0, shipped: 0, dropped: replies.length, sinkErrors: replies.length, batches: 0 });
    await events.close();
    await new Promise((r) => server.close(r));
  });

  test('a _bulk reply without end: the reply is read up to a bound, then the batch fails (the kit does not buffer it all)', async () => {
    let written = 0;
    let closed;
    const gone = new Promise((r) => (closed = r));
    const chunk = Buffer.alloc(1 << 20, 0x20);
    const limit = 256 << 20;
    const server = http.createServer((req, res) => {
      req.resume();
      req.on('end', () => {
        res.writeHead(200, { 'Content-Type': 'application/json' });
        res.write('{"errors":false,"items":[');
        res.on('close', () => closed());
        const pump = () => {
          while (written < limit && !res.destroyed) {
            written += chunk.length;
            if (!res.write(chunk)) return res.once('drain', pump);
          }
          if (!res.destroyed) res.end(']}');
        };
        pump();
      });
    });
    await new Promise((r) => server.listen(0, '127.0.0.1', r));
    const events = new DenyEvents({ bulkUrl: `http://127.0.0.1:${server.address().port}`, background: false, timeoutMs: 60_000 });
    events.record(ev('k'));
    await events.flush();
    await gone;
    assert.deepEqual(events.stats(), { pending: 0, shipped: 0, dropped: 1, sinkErrors: 1, batches: 0 });
    assert.ok(written < 128 << 20, `the kit read ${written >> 20} MiB of the reply`);
    await events.close();
    server.closeAllConnections();
    await new Promise((r) => server.close(r));
  });
});

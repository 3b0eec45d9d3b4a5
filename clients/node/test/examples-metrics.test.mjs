// The HTTP examples serve /metrics: examples/express.mjs (express-rate-limit
// on RLStore) and examples/plain-node.mjs (RateLimiterRL), each started as
// its own process against redis-server with the module, driven over real
// HTTP, scraped over HTTP, the scrape checked by `promtool check metrics`
// and its decision counts equal to the 200s and 429s the test saw; the
// express example's deny events land in a real file, shipped at shutdown.
import assert from 'node:assert/strict';
import { spawn, spawnSync } from 'node:child_process';
import { existsSync, mkdtempSync, readFileSync, rmSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { after, before, describe, test } from 'node:test';
import { startServer } from './servers.mjs';

const PROMTOOL = process.env.PROMTOOL || '/usr/bin/promtool';
const ROOT = new URL('..', import.meta.url).pathname;

/** Starts `node examples/<file>` with `env`; resolves { url, proc, stop() } once it says where it listens. */
function example(file, env) {
  const proc = spawn(process.execPath, [`examples/${file}`], { cwd: ROOT, env: { ...process.env, PORT: '0', ...env }, stdio: ['ignore', 'pipe', 'pipe'] });
  let out = '';
  let err = '';
  proc.stderr.on('data', (d) => (err += d));
  const exited = new Promise((r) => proc.once('exit', r));
  return new Promise((resolve, reject) => {
    proc.stdout.on('data', (d) => {
      out += d;
      const m = /listening on (\d+)/.exec(out);
      if (m) resolve({ url: `http://127.0.0.1:${m[1]}`, proc, exited, stop: () => (proc.exitCode === null && proc.kill('SIGTERM'), exited) });
    });
    proc.once('exit', (code) => reject(new Error(`${file} exited (${code}) before listening: ${err}`)));
  });
}

function sample(text, line) {
  const m = new RegExp(`^${line.replace(/[{}()|[\]\\.+*?^$]/g, '\\$&')} (\\S+)$`, 'm').exec(text);
  return m ? Number(m[1]) : 0;
}

function promtool(t, text) {
  if (!existsSync(PROMTOOL)) return t.skip(`promtool not found at ${PROMTOOL} (Debian's prometheus package; scripts/setup.sh installs it)`);
  const r = spawnSync(PROMTOOL, ['check', 'metrics'], { input: text });
  assert.equal(r.status, 0, `promtool check metrics failed:\n${r.stdout}${r.stderr}`);
}

let server;
before(async () => {
  server = await startServer();
});
after(async () => {
  await server.stop();
});

describe('the HTTP examples serve /metrics', () => {
  test('examples/express.mjs: RLStore\'s decisions, round trips and deny events', async (t) => {
    const dir = mkdtempSync(path.join(os.tmpdir(), 'rl-example-'));
    const file = path.join(dir, 'deny.jsonl');
    const svc = await example('express.mjs', { REDIS_URL: server.url, LIMIT: '3', DENY_EVENTS_FILE: file });
    try {
      const codes = [];
      for (let i = 0; i < 7; i++) {
        const res = await fetch(svc.url + '/');
        codes.push(res.status);
        await res.arrayBuffer();
      }
      assert.deepEqual(codes, [200, 200, 200, 429, 429, 429, 429]);
      const scrape = await fetch(svc.url + '/metrics');
      assert.equal(scrape.status, 200);
      const text = await scrape.text();
      promtool(t, text);
      assert.equal(sample(text, 'ratelimit_decisions_total{rule="api",level="redis",outcome="admitted"}'), 3);
      assert.equal(sample(text, 'ratelimit_decisions_total{rule="api",level="redis",outcome="denied"}'), 4);
      assert.equal(sample(text, 'ratelimit_redis_seconds_count'), 7);
      assert.equal(sample(text, 'ratelimit_remaining_ratio{rule="api"}'), 0);
      // Shutdown ships the buffered denials.
      await svc.stop();
      const events = readFileSync(file, 'utf8').trim().split('\n').map((l) => JSON.parse(l));
      assert.equal(events.length, 4);
      for (const e of events) {
        assert.deepEqual(Object.keys(e), ['timestamp', 'key', 'rule', 'level', 'outcome', 'limit', 'remaining', 'retry_after_ms']);
        assert.deepEqual([e.rule, e.level, e.outcome, e.limit, e.remaining], ['api', 'redis', 'denied', 3, 0]);
        assert.ok(e.retry_after_ms > 0);
      }
    } finally {
      await svc.stop();
      rmSync(dir, { recursive: true, force: true });
    }
  });

  test('examples/plain-node.mjs: RateLimiterRL\'s decisions by level', async (t) => {
    const svc = await example('plain-node.mjs', { REDIS_PORT: String(server.port) });
    try {
      const codes = [];
      for (let i = 0; i < 7; i++) {
        const res = await fetch(svc.url + '/login');
        codes.push(res.status);
        await res.arrayBuffer();
      }
      assert.deepEqual(codes, [200, 200, 200, 200, 200, 429, 429]);
      const text = await (await fetch(svc.url + '/metrics')).text();
      promtool(t, text);
      assert.equal(sample(text, 'ratelimit_decisions_total{rule="login",level="redis",outcome="admitted"}'), 5);
      assert.equal(sample(text, 'ratelimit_decisions_total{rule="login",level="redis",outcome="denied"}'), 2);
      assert.equal(sample(text, 'ratelimit_breaker_open{breaker="redis"}'), 0);
      assert.ok(sample(text, 'ratelimit_redis_seconds_count') >= 7);
    } finally {
      await svc.stop();
    }
  });
});

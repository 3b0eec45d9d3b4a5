// The package as users load it: ESM import, CommonJS require, and types for both.
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { copyFileSync, cpSync, existsSync, mkdirSync, mkdtempSync, rmSync } from 'node:fs';
import { createRequire } from 'node:module';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { test } from 'node:test';
import * as esm from 'redis-ratelimit';

const require = createRequire(import.meta.url);

test('ESM and CommonJS export the same names', () => {
  const cjs = require('redis-ratelimit');
  assert.deepEqual(Object.keys(cjs).sort(), Object.keys(esm).sort());
  for (const name of ['Client', 'Decision', 'RLStore', 'RateLimiterRL', 'RateLimiterRes', 'InvalidArgumentError', 'ModuleMissingError']) {
    assert.equal(typeof cjs[name], 'function', name);
  }
});

test('.d.ts ship beside both builds', () => {
  for (const f of ['../dist/esm/index.d.ts', '../dist/cjs/index.d.ts', '../dist/cjs/package.json']) {
    assert.ok(existsSync(new URL(f, import.meta.url)), f);
  }
});

test('keySlot agrees with Redis Cluster (CRC16, hash tags)', () => {
  assert.equal(esm.keySlot('foo'), 12182);
  assert.equal(esm.keySlot('{user1000}.following'), esm.keySlot('{user1000}.followers'));
  assert.equal(esm.keySlot('123456789'), 0x31c3 % 16384);
});

test('with rate-limiter-flexible installed both builds answer its RateLimiterRes and extend its RateLimiterCompatibleAbstract; without it, their own', () => {
  const cjs = require('redis-ratelimit');
  const flex = require('rate-limiter-flexible');
  for (const build of [cjs, esm]) {
    assert.equal(build.RateLimiterRes, flex.RateLimiterRes);
    assert.equal(Object.getPrototypeOf(build.RateLimiterRL.prototype), flex.RateLimiterCompatibleAbstract.prototype);
  }
  assert.equal(cjs.default, cjs.RLStore);
  // The package alone, where rate-limiter-flexible cannot be found.
  const dir = mkdtempSync(join(tmpdir(), 'rl-no-flexible-'));
  try {
    const pkg = join(dir, 'node_modules', 'redis-ratelimit');
    mkdirSync(pkg, { recursive: true });
    cpSync(new URL('../dist', import.meta.url), join(pkg, 'dist'), { recursive: true });
    copyFileSync(new URL('../package.json', import.meta.url), join(pkg, 'package.json'));
    const check = `
      const r = new RateLimiterRes(1, 2, 3, true);
      if (JSON.stringify(r) !== '{"remainingPoints":1,"msBeforeNext":2,"consumedPoints":3,"isFirstInDuration":true}') throw new Error(String(r));
      if (Object.getPrototypeOf(RateLimiterRL.prototype) !== Object.prototype) throw new Error('extends something');
      console.log('own');`;
    const esmOut = execFileSync(process.execPath, ['--input-type=module', '-e', `import { RateLimiterRes, RateLimiterRL } from 'redis-ratelimit';${check}`], { cwd: dir });
    const cjsOut = execFileSync(process.execPath, ['-e', `const { RateLimiterRes, RateLimiterRL } = require('redis-ratelimit');${check}`], { cwd: dir });
    assert.equal(`${esmOut}${cjsOut}`, 'own\nown\n');
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});

test('without prom-client (an optional peer) the package loads and runs; asking for metrics says to install it, naming metrics', () => {
  const dir = mkdtempSync(join(tmpdir(), 'rl-no-prom-'));
  try {
    const pkg = join(dir, 'node_modules', 'redis-ratelimit');
    mkdirSync(pkg, { recursive: true });
    cpSync(new URL('../dist', import.meta.url), join(pkg, 'dist'), { recursive: true });
    copyFileSync(new URL('../package.json', import.meta.url), join(pkg, 'package.json'));
    const check = `
      const events = new DenyEvents({ callback: () => {}, background: false });
      events.record({ key: 'k', rule: 'r', level: 'redis', limit: 1, remaining: 0, retryAfterMs: 1 });
      if (events.stats().pending !== 1) throw new Error('not recorded');
      for (const ask of [() => RateLimitMetrics.of(), () => new DenyEvents({ callback: () => {}, metrics: true })]) {
        try { ask(); throw new Error('no error'); } catch (e) {
          if (!(e instanceof InvalidArgumentError) || e.argument !== 'metrics' || !e.message.includes('npm install prom-client')) throw e;
        }
      }
      console.log('ok');`;
    const esmOut = execFileSync(process.execPath, ['--input-type=module', '-e', `import { DenyEvents, InvalidArgumentError, RateLimitMetrics } from 'redis-ratelimit';${check}`], { cwd: dir });
    const cjsOut = execFileSync(process.execPath, ['-e', `const { DenyEvents, InvalidArgumentError, RateLimitMetrics } = require('redis-ratelimit');${check}`], { cwd: dir });
    assert.equal(`${esmOut}${cjsOut}`, 'ok\nok\n');
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});

test('the ESM and CommonJS builds side by side: one build\'s DenyEvents and metrics are taken by the other\'s classes', async () => {
  const cjs = require('redis-ratelimit');
  const { Registry } = await import('prom-client');
  const events = new esm.DenyEvents({ callback: () => {}, background: false });
  const metrics = esm.RateLimitMetrics.of(new Registry());
  const store = new cjs.RLStore({ sendCommand: async () => 1, denyEvents: events, metrics });
  assert.equal(store.denyEvents, events);
  assert.equal(store.metrics, metrics);
  const limiter = new cjs.Limiter({ sendCommand: async () => 1 }, { denyEvents: events, metrics });
  assert.equal(limiter.denyEvents, events);
  assert.throws(() => new cjs.Limiter({ sendCommand: async () => 1 }, { denyEvents: { record: 1 } }), (e) => e instanceof cjs.InvalidArgumentError && e.argument === 'denyEvents');
  await events.close();
});

// The package as users load it: ESM import, CommonJS require, and types for both.
import assert from 'node:assert/strict';
import { existsSync } from 'node:fs';
import { createRequire } from 'node:module';
import { test } from 'node:test';
import * as esm from 'redis-ratelimit';

const require = createRequire(import.meta.url);

test('ESM and CommonJS export the same names', () => {
  const cjs = require('redis-ratelimit');
  assert.deepEqual(Object.keys(cjs).sort(), Object.keys(esm).sort());
  for (const name of ['RL', 'Decision', 'RLStore', 'RateLimiterRL', 'RateLimiterRes', 'RLArgumentError', 'RLModuleNotLoadedError']) {
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

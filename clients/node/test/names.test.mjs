// The names every kit shares (Client, Spec, Request, ModuleMissingError...),
// and the former names, kept for one release as the same classes.
import assert from 'node:assert/strict';
import { createRequire } from 'node:module';
import { after, before, describe, test } from 'node:test';
import * as kit from 'redis-ratelimit';
import { Client, InvalidArgumentError, ModuleMissingError, ProtocolError, Request, RLError, TimeoutError } from 'redis-ratelimit';
import { RL, RLArgumentError, RLDeadlineError, RLModuleNotLoadedError, RLProtocolError } from 'redis-ratelimit';
import { clientKinds, startServer } from './servers.mjs';

const require = createRequire(import.meta.url);
const [kind] = await clientKinds();

const RENAMED = {
  RL: 'Client',
  RLArgumentError: 'InvalidArgumentError',
  RLModuleNotLoadedError: 'ModuleMissingError',
  RLProtocolError: 'ProtocolError',
  RLDeadlineError: 'TimeoutError',
};

test('every former name is the same class as its new name, in both builds', () => {
  const cjs = require('redis-ratelimit');
  for (const build of [kit, cjs]) {
    for (const [old, now] of Object.entries(RENAMED)) {
      assert.equal(typeof build[now], 'function', now);
      assert.equal(build[old], build[now], `${old} is ${now}`);
    }
    assert.equal(typeof build.Request.cost, 'function');
  }
});

test('an error built under either name is an instance of both, named by its new name', () => {
  const a = new RLArgumentError('capacity', 'bad');
  assert.ok(a instanceof InvalidArgumentError && a instanceof RLArgumentError && a instanceof RLError);
  assert.equal(a.argument, 'capacity');
  assert.equal(a.name, 'InvalidArgumentError');
  for (const [Old, New, name] of [
    [RLModuleNotLoadedError, ModuleMissingError, 'ModuleMissingError'],
    [RLProtocolError, ProtocolError, 'ProtocolError'],
    [RLDeadlineError, TimeoutError, 'TimeoutError'],
  ]) {
    const e = new New('x');
    assert.ok(e instanceof Old && e instanceof New && e instanceof RLError, name);
    assert.equal(e.name, name);
    assert.ok(new Old('y') instanceof New, name);
  }
});

test('Request builds cost, forced cost or refund, checked, naming the parameter', () => {
  assert.deepEqual(Request.cost(2), { kind: 'cost', n: 2 });
  assert.deepEqual(Request.force(3), { kind: 'force', n: 3 });
  assert.deepEqual(Request.refund(0), { kind: 'refund', n: 0 });
  assert.ok(Object.isFrozen(Request.refund(1)) && Object.isFrozen(Request));
  for (const [make, argument] of [
    [() => Request.cost(-1), 'cost'],
    [() => Request.force(1.5), 'cost'],
    [() => Request.refund('1'), 'refund'],
    [() => Request.cost(2 ** 40 + 1), 'cost'],
  ]) {
    assert.throws(make, (e) => e instanceof InvalidArgumentError && e.argument === argument);
  }
});

let server;
let plain;
before(async () => {
  [server, plain] = await Promise.all([startServer(), startServer({ module: false })]);
});
after(async () => {
  await Promise.all([server?.stop(), plain?.stop()]);
});

describe(`the new names against a server (${kind.name})`, () => {
  let client;
  let rl;
  before(async () => {
    client = await kind.make(server.port);
    rl = new Client(client);
  });
  after(() => kind.close(client));

  test('a Request and the former options send the same command and get the same decisions', async () => {
    const spec = { capacity: 3, refillCount: 1, refillMs: 1_000_000 };
    const steps = [
      [Request.cost(3), { cost: 3 }],
      [Request.force(2), { cost: 2, force: true }],
      [Request.cost(0), { cost: 0 }],
      [Request.refund(2), { refund: 2 }],
      [Request.refund(1), { refund: 1 }],
    ];
    const seen = [];
    for (const [request, options] of steps) {
      const a = await rl.tokenBucket('names:request', spec, request);
      const b = await rl.tokenBucket('names:options', spec, options);
      assert.deepEqual([a.allowed, a.remaining, a.limit], [b.allowed, b.remaining, b.limit], JSON.stringify(request));
      seen.push([a.allowed, a.remaining]);
    }
    // Three taken; two forced into debt; a peek; the debt refunded (still
    // none left); one unit back.
    assert.deepEqual(seen, [[true, 0], [true, 0], [true, 0], [true, 0], [true, 1]]);
  });

  test('RL.HIT takes a Request; a request of no known kind is refused naming request', async () => {
    await rl.policySet('names:p', { algorithm: 'fixedwindow', limit: 5, windowMs: 60_000 });
    try {
      assert.equal((await rl.hit('names:p', 'names:hit', Request.cost(4))).remaining, 1);
      assert.equal((await rl.hit('names:p', 'names:hit', Request.refund(2))).remaining, 3);
    } finally {
      await rl.policyDel('names:p');
    }
    await assert.rejects(rl.sliding('names:k', { limit: 1, windowMs: 1000 }, { kind: 'forcedrefund', n: 1 }), (e) => e instanceof InvalidArgumentError && e.argument === 'request');
    await assert.rejects(rl.sliding('names:k', { limit: 1, windowMs: 1000 }, { refund: 1, force: true }), (e) => e instanceof RLArgumentError && e.argument === 'force');
  });

  test('the former client name still builds a client: the same class', async () => {
    const old = new RL(client);
    assert.ok(old instanceof Client);
    assert.equal((await old.checkModule()).name, 'ratelimit');
  });

  test('a server without the module: ModuleMissingError, also an RLModuleNotLoadedError', async () => {
    const c = await kind.make(plain.port);
    try {
      await assert.rejects(new Client(c).checkModule(), (e) => e instanceof ModuleMissingError && e instanceof RLModuleNotLoadedError && e.name === 'ModuleMissingError');
      await assert.rejects(new RL(c).sliding('k', { limit: 1, windowMs: 1000 }), (e) => e instanceof RLModuleNotLoadedError);
    } finally {
      kind.close(c);
    }
  });
});

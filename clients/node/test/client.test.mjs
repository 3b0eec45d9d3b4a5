// Typed calls on every client, standalone and cluster, against real servers.
import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';
import { Decision, Client, InvalidArgumentError, ModuleMissingError } from 'redis-ratelimit';
import { clientKinds, clusterKinds, rejectsAtOnce, startCluster, startServer, STILL_MS } from './servers.mjs';

let server;
let plain;
let cluster;
before(async () => {
  [server, plain, cluster] = await Promise.all([startServer(), startServer({ module: false }), startCluster()]);
});
after(async () => {
  await Promise.all([server?.stop(), plain?.stop(), cluster?.stop()]);
});

for (const kind of await clientKinds()) {
  describe(`typed calls on ${kind.name}`, () => {
    let client;
    let rl;
    const k = (name) => `${kind.name}:${name}`;
    // Commands of the contract that this build of the module may not have yet.
    before(async () => {
      client = await kind.make(server.port);
      rl = new Client(client);
    });
    after(() => kind.close(client));

    test('checkModule finds the module in MODULE LIST', async () => {
      const info = await rl.checkModule();
      assert.equal(info.name, 'ratelimit');
      assert.ok(info.version > 0);
    });

    test('sliding: limit admitted, then a denial with wait_ms', async () => {
      for (let i = 0; i < 3; i++) {
        const d = await rl.sliding(k('s'), { limit: 3, windowMs: 10_000 });
        assert.ok(d instanceof Decision);
        assert.deepEqual([d.allowed, d.limit, d.remaining, d.waitMs], [true, 3, 2 - i, 0]);
      }
      const d = await rl.sliding(k('s'), { limit: 3, windowMs: 10_000 });
      assert.equal(d.allowed, false);
      // The log lets an entry leave up to 1 ms late, never early: 10,001 at most.
      assert.ok(d.waitMs > 9000 && d.waitMs <= 10_001, `wait_ms ${d.waitMs}`);
      assert.equal(d.retryAfterS, Math.ceil(d.waitMs / 1000));
      assert.equal(d.never, false);
    });

    test('a cost above the limit can never pass: wait_ms -1', async () => {
      const d = await rl.tokenBucket(k('tb'), { capacity: 5, refillCount: 1, refillMs: 1000 }, { cost: 6 });
      assert.equal(d.allowed, false);
      assert.equal(d.waitMs, -1);
      assert.equal(d.never, true);
      assert.equal(d.retryAfterS, null);
    });

    test('every algorithm answers five fields', async () => {
      const calls = [
        rl.tokenBucket(k('a1'), { capacity: 5, refillCount: 5, refillMs: 1000 }),
        rl.leakyBucket(k('a2'), { capacity: 5, leakCount: 1, leakMs: 100 }),
        rl.hashWindow(k('a3'), { limit: 5, windowMs: 60_000, bucketMs: 1000 }),
        rl.fixedWindow(k('a4'), { limit: 5, windowMs: 60_000 }),
      ];
      for (const d of await Promise.all(calls)) {
        assert.deepEqual([d.allowed, d.limit, d.remaining], [true, 5, 4]);
        assert.ok(d.resetMs > 0);
      }
    });

    test('COST 0 inspects, REFUND gives back, FORCE goes into debt', async () => {
      const p = { limit: 5, windowMs: 60_000 };
      await rl.sliding(k('r'), p, { cost: 3 });
      assert.equal((await rl.sliding(k('r'), p, { cost: 0 })).remaining, 2);
      assert.equal((await rl.sliding(k('r'), p, { refund: 2 })).remaining, 4);
      const forced = await rl.sliding(k('r'), p, { cost: 5, force: true });
      assert.equal(forced.allowed, true);
      assert.equal((await rl.sliding(k('r'), p, { cost: 1 })).allowed, false);
    });

    test('policies: SET, HIT, GET, LIST, DEL', async () => {
      const name = `POST:/api/${kind.name.replace(/ /g, '_')}`;
      await rl.policySet(name, { algorithm: 'fixedwindow', limit: 2, windowMs: STILL_MS });
      assert.equal((await rl.hit(name, k('h'))).remaining, 1);
      assert.equal((await rl.hit(name, k('h'))).remaining, 0);
      assert.equal((await rl.hit(name, k('h'))).allowed, false);
      const got = await rl.policyGet(name);
      assert.ok(got && Object.keys(got).length > 0);
      assert.ok((await rl.policyList()).includes(name));
      assert.equal(await rl.policyDel(name), true);
      assert.equal(await rl.policyGet(name), null);
    });

    test('RL.ALL: all or nothing, deniedBy is the 0-based index', async () => {
      const limits = [
        { key: k('all:a'), rule: { algorithm: 'fixedwindow', limit: 10, windowMs: STILL_MS } },
        { key: k('all:b'), rule: { algorithm: 'tokenbucket', capacity: 1, refillCount: 1, refillMs: 60_000 } },
      ];
      const ok = await rl.all(limits);
      assert.deepEqual([ok.allowed, ok.deniedBy], [true, null]);
      const no = await rl.all(limits);
      assert.deepEqual([no.allowed, no.deniedBy], [false, 1]);
      assert.equal((await rl.fixedWindow(k('all:a'), { limit: 10, windowMs: STILL_MS }, { cost: 0 })).remaining, 9);
    });

    test('RL.LOG records denials', async () => {
      await rl.logReset();
      await rl.fixedWindow(k('log'), { limit: 1, windowMs: STILL_MS });
      await rl.fixedWindow(k('log'), { limit: 1, windowMs: STILL_MS });
      assert.ok((await rl.logLen()) >= 1);
      const [e] = await rl.logGet(1);
      assert.equal(e.key, k('log'));
    });

    test('bad input names the argument and writes nothing', async () => {
      const key = k('bad');
      const cases = [
        [() => rl.sliding(key, { limit: -1, windowMs: 1000 }), 'limit'],
        [() => rl.sliding(key, { limit: 5, windowMs: '1000' }), 'windowMs'],
        [() => rl.sliding(key, { limit: 5, windowMs: 1.5 }), 'windowMs'],
        [() => rl.tokenBucket(key, { capacity: 5, refillCount: 0, refillMs: 10 }), 'refillCount'],
        [() => rl.sliding(key, { limit: 5, windowMs: 1000 }, { cost: -2 }), 'cost'],
        [() => rl.sliding(key, { limit: 5, windowMs: 1000 }, { cost: 1, refund: 1 }), 'refund'],
        [() => rl.sliding('', { limit: 5, windowMs: 1000 }), 'key'],
        [() => rl.limit(key, { algorithm: 'gcra', limit: 1 }), 'algorithm'],
        [() => rl.hit('has space', key), 'policy'],
        // The contract's rules the kit checks before sending (contract.test.mjs has them all).
        [() => rl.hashWindow(key, { limit: 5, windowMs: 100, bucketMs: 7 }), 'bucketMs'],
        [() => rl.concurrency(key, { limit: 2 ** 24, leaseMs: 1000 }), 'limit'],
        [() => rl.tokenBucket(key, { capacity: 2 ** 30, refillCount: 1, refillMs: 2 ** 21 }), 'span'],
      ];
      for (const [call, argument] of cases) {
        await rejectsAtOnce(call, (e) => e instanceof InvalidArgumentError && e.argument === argument && e.message.includes(argument), argument);
      }
      // The server's own check (sliding-max-limit) comes back as an InvalidArgumentError too.
      await assert.rejects(rl.sliding(key, { limit: 100_001, windowMs: 1000 }), (e) => e instanceof InvalidArgumentError && e.argument === 'limit' && /sliding-max-limit/.test(e.message));
      assert.equal(await rl.send(key, ['EXISTS', key]), 0);
    });
  });
}

describe('a server without the module', () => {
  for (const name of ['node-redis v5', 'ioredis']) {
    test(`${name}: checkModule and every call say the module is not loaded`, async () => {
      const kind = (await clientKinds()).find((c) => c.name === name);
      const client = await kind.make(plain.port);
      try {
        const rl = new Client(client);
        await assert.rejects(rl.checkModule(), (e) => e instanceof ModuleMissingError && /not loaded/.test(e.message));
        await assert.rejects(rl.sliding('k', { limit: 1, windowMs: 1000 }), (e) => e instanceof ModuleMissingError && /--loadmodule/.test(e.message));
        assert.equal(await rl.send('k', ['EXISTS', 'k']), 0);
      } finally {
        kind.close(client);
      }
    });
  }
});

for (const kind of await clusterKinds()) {
  describe(`cluster on ${kind.name}`, () => {
    let client;
    let rl;
    before(async () => {
      client = await kind.make(cluster.ports);
      rl = new Client(client);
    });
    after(() => kind.close(client));

    test('checkModule on every master', async () => {
      assert.equal((await rl.checkModule()).name, 'ratelimit');
    });

    test('limiter calls, RL.HIT and RL.ALL reach the key’s owner without a MOVED', async () => {
      await rl.policySet('cluster:p', { algorithm: 'sliding', limit: 2, windowMs: 60_000 });
      const movedBefore = cluster.errorstat('MOVED');
      for (let i = 0; i < 40; i++) {
        const key = `${kind.name}:user:${i}`;
        assert.equal((await rl.sliding(key, { limit: 2, windowMs: 60_000 })).remaining, 1);
        assert.equal((await rl.hit('cluster:p', `${key}:hit`)).remaining, 1);
        const all = await rl.all([
          { key: `{${key}}:a`, rule: { algorithm: 'fixedwindow', limit: 3, windowMs: 60_000 } },
          { key: `{${key}}:b`, rule: { policy: 'cluster:p' } },
        ]);
        assert.deepEqual([all.allowed, all.remaining], [true, 1]);
      }
      assert.equal(cluster.errorstat('MOVED'), movedBefore);
      assert.equal(await rl.policyDel('cluster:p'), true);
    });
  });
}

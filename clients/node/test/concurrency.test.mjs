// RL.CONCURRENCY, RL.RELEASE and RL.RENEW as typed calls, and leases as
// handles (lease, withLease), on every client, standalone and cluster,
// against real servers.
import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';
import { Decision, Lease, Client, InvalidArgumentError, RLDeniedError, ModuleMissingError } from 'redis-ratelimit';
import { clientKinds, clusterKinds, rejectsAtOnce, sleep, startCluster, startServer } from './servers.mjs';

let server;
let cluster;
before(async () => {
  [server, cluster] = await Promise.all([startServer(), startCluster()]);
});
after(async () => {
  await Promise.all([server?.stop(), cluster?.stop()]);
});

/** Units held right now: the limit minus what a `COST 0` call sees remaining. */
async function held(rl, key, limit, leaseMs = 60_000) {
  const d = await rl.concurrency(key, { limit, leaseMs }, { cost: 0 });
  return d.limit - d.remaining;
}

/** Polls `cond` every 10 ms until it holds, failing after `ms`. */
async function until(cond, what, ms = 10_000) {
  const deadline = Date.now() + ms;
  while (!(await cond())) {
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await sleep(10);
  }
}

for (const kind of await clientKinds()) {
  describe(`concurrency calls on ${kind.name}`, () => {
    let client;
    let rl;
    const k = (name) => `${kind.name}:${name}`;
    before(async () => {
      client = await kind.make(server.port);
      rl = new Client(client);
    });
    after(() => {
      rl.close();
      kind.close(client);
    });

    test('concurrency grants leases up to the limit, then denies with the wait until one expires', async () => {
      const p = { limit: 2, leaseMs: 10_000 };
      const a = await rl.concurrency(k('c'), p);
      const b = await rl.concurrency(k('c'), p);
      for (const [d, remaining] of [[a, 1], [b, 0]]) {
        assert.ok(d instanceof Decision);
        assert.deepEqual([d.allowed, d.limit, d.remaining, d.waitMs], [true, 2, remaining, 0]);
        assert.ok(Number.isSafeInteger(d.lease) && d.lease > 0, `lease ${d.lease}`);
      }
      assert.notEqual(a.lease, b.lease);
      const no = await rl.concurrency(k('c'), p);
      assert.deepEqual([no.allowed, no.remaining, no.lease], [false, 0, null]);
      assert.ok(no.waitMs > 0 && no.waitMs <= 10_000, `wait_ms ${no.waitMs}`);
      assert.ok(no.resetMs > 0 && no.resetMs <= 10_000, `reset_ms ${no.resetMs}`);
      // The same through the generic call, and a cost above the limit that never passes.
      assert.equal((await rl.limit(k('c'), { algorithm: 'concurrency', ...p })).allowed, false);
      assert.equal((await rl.concurrency(k('c2'), p, { cost: 3 })).never, true);
    });

    test('release frees a unit once (true, then false); renew answers whether the lease was still held', async () => {
      const p = { limit: 1, leaseMs: 10_000 };
      const d = await rl.concurrency(k('r'), p);
      assert.equal(await rl.renew(k('r'), d.lease, 20_000), true);
      assert.equal(await rl.release(k('r'), d.lease), true);
      assert.equal(await rl.release(k('r'), d.lease), false);
      assert.equal(await rl.renew(k('r'), d.lease, 20_000), false);
      assert.equal(await held(rl, k('r'), 1), 0);
      assert.equal(await rl.release(k('no-such-key'), 12345), false);
    });

    test('RL.HIT on a CONCURRENCY policy grants a lease', async () => {
      const name = `conc:${kind.name.replace(/ /g, '_')}`;
      await rl.policySet(name, { algorithm: 'concurrency', limit: 1, leaseMs: 10_000 });
      try {
        const d = await rl.hit(name, k('h'));
        assert.equal(d.allowed, true);
        assert.ok(d.lease > 0);
        assert.equal((await rl.hit(name, k('h'))).allowed, false);
        assert.equal(await rl.release(k('h'), d.lease), true);
        assert.equal((await rl.hit(name, k('h'))).allowed, true);
        // A policy of another algorithm answers five fields: no lease.
        assert.equal((await rl.sliding(k('s'), { limit: 1, windowMs: 1000 })).lease, null);
      } finally {
        await rl.policyDel(name);
      }
    });

    test('bad input names the argument and writes nothing', async () => {
      const key = k('bad');
      const p = { limit: 1, leaseMs: 1000 };
      const cases = [
        [() => rl.concurrency(key, { limit: 0, leaseMs: 1000 }), 'limit'],
        [() => rl.concurrency(key, { limit: 1, leaseMs: '1000' }), 'leaseMs'],
        [() => rl.concurrency(key, { limit: 1 }), 'leaseMs'],
        [() => rl.concurrency('', p), 'key'],
        [() => rl.release(key, 'abc'), 'lease'],
        [() => rl.release(key, 0), 'lease'],
        [() => rl.release(key, 1.5), 'lease'],
        [() => rl.renew(key, 5, 0), 'leaseMs'],
        [() => rl.renew(key, -5, 10), 'lease'],
        [() => rl.all([{ key, rule: { algorithm: 'concurrency', ...p } }]), 'limits[0].rule'],
        [() => rl.lease(key, { limit: 1, leaseMs: -1 }), 'leaseMs'],
        [() => rl.lease(key, { policy: 'p' }, { autoRenew: true }), 'leaseMs'],
        [() => rl.lease(key, p, { cost: -1 }), 'cost'],
        [() => rl.acquire(key, { algorithm: 'concurrency', ...p }, { timeoutMs: -1 }), 'timeoutMs'],
        [() => rl.acquire(key, { algorithm: 'concurrency', ...p }), 'timeoutMs'],
      ];
      for (const [call, argument] of cases) {
        await rejectsAtOnce(call, (e) => e instanceof InvalidArgumentError && e.argument === argument && e.message.includes(argument), argument);
      }
      await assert.rejects(rl.withLease(key, p, 'not a function'), (e) => e instanceof InvalidArgumentError && e.argument === 'fn');
      assert.equal(await rl.send(key, ['EXISTS', key]), 0);
    });
  });
}

for (const name of ['node-redis v5', 'ioredis']) {
  describe(`leases on ${name}`, () => {
    let kind;
    let client;
    let rl;
    const k = (key) => `lease:${name}:${key}`;
    before(async () => {
      kind = (await clientKinds()).find((c) => c.name === name);
      client = await kind.make(server.port);
      rl = new Client(client);
    });
    after(() => {
      rl.close();
      kind.close(client);
    });

    test('never more than `limit` leases held by 50 concurrent workers, and all of them back at the end', async () => {
      const limit = 5;
      const rule = { limit, leaseMs: 10_000 };
      let inFlight = 0;
      let most = 0;
      let done = 0;
      let denied = 0;
      const worker = async () => {
        for (let got = 0; got < 3; ) {
          try {
            await rl.withLease(k('crowd'), rule, async () => {
              inFlight++;
              most = Math.max(most, inFlight);
              await sleep(Math.random() * 5);
              inFlight--;
            });
            got++;
            done++;
          } catch (e) {
            if (!(e instanceof RLDeniedError)) throw e;
            denied++;
            await sleep(1 + Math.random() * 3);
          }
        }
      };
      await Promise.all(Array.from({ length: 50 }, worker));
      assert.equal(done, 150);
      assert.ok(most <= limit, `${most} held at once`);
      assert.ok(denied > 0, 'the limit was reached');
      assert.equal(await held(rl, k('crowd'), limit), 0);
    });

    test('a lease handle: release() frees it for the next acquirer, and answers the same when called again', async () => {
      const rule = { limit: 1, leaseMs: 10_000 };
      const lease = await rl.lease(k('h'), rule);
      assert.ok(lease instanceof Lease);
      assert.equal(lease.key, k('h'));
      assert.equal(lease.id, lease.decision.lease);
      await assert.rejects(rl.lease(k('h'), rule), (e) => e instanceof RLDeniedError && e.decision.allowed === false && e.decision.retryAfterS > 0);
      assert.equal(await lease.release(), true);
      assert.equal(lease.released, true);
      assert.equal(await lease.release(), true);
      const next = await rl.lease(k('h'), rule);
      // Symbol.asyncDispose, as `await using` calls it.
      await next[Symbol.asyncDispose]();
      assert.equal(await held(rl, k('h'), 1), 0);
    });

    test('withLease releases when its function throws, and passes its result through', async () => {
      const rule = { limit: 1, leaseMs: 10_000 };
      await assert.rejects(
        rl.withLease(k('w'), rule, async () => {
          assert.equal(await held(rl, k('w'), 1), 1);
          throw new Error('the work failed');
        }),
        /the work failed/,
      );
      assert.equal(await held(rl, k('w'), 1), 0);
      assert.equal(await rl.withLease(k('w'), rule, (lease) => lease.key), k('w'));
      assert.equal(await held(rl, k('w'), 1), 0);
    });

    test('renew keeps a lease past its leaseMs; without renewal it expires by itself', async () => {
      const rule = { limit: 1, leaseMs: 1500 };
      const lease = await rl.lease(k('renew'), rule);
      const granted = Date.now();
      await sleep(700);
      assert.equal(await lease.renew(), true);
      await sleep(1000);
      assert.ok(Date.now() - granted > 1500);
      assert.equal(await held(rl, k('renew'), 1), 1, 'held past the first leaseMs');
      // Not renewed again: it ends leaseMs after the renewal, and renew then says so.
      await until(async () => (await held(rl, k('renew'), 1)) === 0, 'the lease to expire');
      assert.equal(lease.signal.aborted, false);
      assert.equal(await lease.renew(), false);
      assert.equal(lease.signal.aborted, true);
      assert.match(lease.signal.reason.message, /has ended/);
    });

    test('autoRenew keeps the lease for work three times longer than leaseMs', async () => {
      const lease = await rl.lease(k('auto'), { limit: 1, leaseMs: 500 }, { autoRenew: true });
      await sleep(1500);
      assert.equal(await held(rl, k('auto'), 1), 1);
      assert.equal(lease.signal.aborted, false);
      assert.equal(await lease.release(), true);
      assert.equal(await held(rl, k('auto'), 1), 0);
    });

    test('a lease on a CONCURRENCY policy, renewed by the leaseMs given', async () => {
      const policy = `lease-policy:${name.replace(/ /g, '_')}`;
      await rl.policySet(policy, { algorithm: 'concurrency', limit: 1, leaseMs: 5000 });
      try {
        const lease = await rl.lease(k('p'), { policy, leaseMs: 5000 });
        assert.equal(await lease.renew(), true);
        await assert.rejects(rl.lease(k('p'), { policy }), RLDeniedError);
        assert.equal(await lease.release(), true);
        const bare = await rl.lease(k('p'), { policy });
        await assert.rejects(bare.renew(), (e) => e instanceof InvalidArgumentError && e.argument === 'leaseMs');
        assert.equal(await bare.renew(5000), true);
        // In SHADOW mode an over-the-limit call is admitted without a lease: nothing to give back.
        await rl.policySet(policy, { algorithm: 'concurrency', limit: 1, leaseMs: 5000 }, { mode: 'SHADOW' });
        const shadow = await rl.lease(k('p'), { policy, leaseMs: 5000 }, { autoRenew: true });
        assert.equal(shadow.id, 0);
        assert.equal(await shadow.renew(), false);
        assert.equal(shadow.signal.aborted, false);
        assert.equal(await shadow.release(), false);
        assert.equal(await bare.release(), true);
      } finally {
        await rl.policyDel(policy);
      }
    });
  });
}

describe('acquire connections', () => {
  for (const name of ['node-redis v5', 'ioredis']) {
    test(`${name}: Redis gone, acquire rejects with the client’s error and leaves no connection trying`, async () => {
      const doomed = await startServer();
      const kind = (await clientKinds()).find((c) => c.name === name);
      const client = await kind.make(doomed.port);
      const rl = new Client(client);
      try {
        await doomed.kill();
        await assert.rejects(rl.acquire('gone', { algorithm: 'concurrency', limit: 1, leaseMs: 1000 }, { timeoutMs: 100 }), (e) => e instanceof Error);
      } finally {
        rl.close();
        kind.close(client);
      }
    });
  }

  test('a sendCommand function cannot be duplicated: acquire says what to give instead', async () => {
    const client = await (await clientKinds())[0].make(server.port);
    try {
      const rl = new Client((...args) => client.sendCommand(args));
      await assert.rejects(rl.acquire('k', { algorithm: 'sliding', limit: 1, windowMs: 1000 }, { timeoutMs: 10 }), /connections of its own.*connect/);
      const own = new Client((...args) => client.sendCommand(args), { connect: () => (async () => { const c = client.duplicate(); await c.connect(); return c; })() });
      try {
        const d = await own.acquire('k', { algorithm: 'sliding', limit: 1, windowMs: 1000 }, { timeoutMs: 100 });
        assert.equal(d.allowed, true);
      } catch (e) {
        // Sent on the connection given, to a module build without BLOCK.
        assert.ok(e instanceof ModuleMissingError && /predates BLOCK/.test(e.message), e.message);
      } finally {
        own.close();
      }
    } finally {
      client.destroy();
    }
  });
});

for (const kind of (await clusterKinds()).filter((c) => c.name === 'node-redis v5 cluster' || c.name === 'ioredis cluster')) {
  describe(`leases on ${kind.name}`, () => {
    test('concurrency, renew and release reach the key’s owner without a MOVED', async () => {
      const client = await kind.make(cluster.ports);
      const rl = new Client(client);
      try {
        const moved = cluster.errorstat('MOVED');
        for (let i = 0; i < 20; i++) {
          const key = `${kind.name}:conc:${i}`;
          await rl.withLease(key, { limit: 1, leaseMs: 10_000 }, async (lease) => {
            assert.equal(await lease.renew(), true);
            assert.equal((await rl.concurrency(key, { limit: 1, leaseMs: 10_000 })).allowed, false);
          });
          assert.equal(await held(rl, key, 1), 0);
        }
        assert.equal(cluster.errorstat('MOVED'), moved);
      } finally {
        rl.close();
        kind.close(client);
      }
    });
  });
}

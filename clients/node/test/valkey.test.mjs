// The kit on Valkey (VALKEY_SERVER, as `make test` sets it from
// scripts/valkey-path.sh): typed calls, RLStore and RateLimiterRL, on both
// clients. Skipped when no valkey-server is given.
import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';
import { Client, Limiter, Request, RLDeniedError, ModuleMissingError, RLStore, RateLimiterRL, RateLimiterRes } from 'redis-ratelimit';
import { clientKinds, startServer } from './servers.mjs';

const VALKEY = process.env.VALKEY_SERVER;

describe('on Valkey', { skip: VALKEY ? false : 'VALKEY_SERVER is not set' }, () => {
  let server;
  before(async () => {
    server = await startServer({ binary: VALKEY });
  });
  after(() => server?.stop());

  for (const kind of [0, 2]) {
    test(`typed calls, RLStore and RateLimiterRL (client ${kind})`, async () => {
      const k = (await clientKinds())[kind];
      const c = await k.make(server.port);
      try {
        const rl = new Client(c);
        assert.equal((await rl.checkModule()).name, 'ratelimit');
        const d = await rl.tokenBucket(`${k.name}:tb`, { capacity: 2, refillCount: 1, refillMs: 60_000 });
        assert.deepEqual([d.allowed, d.limit, d.remaining], [true, 2, 1]);

        const store = new RLStore({ client: c, prefix: `${k.name}:` });
        store.init({ windowMs: 60_000, limit: 1 });
        assert.equal((await store.increment('u')).totalHits, 1);
        assert.equal((await store.increment('u')).totalHits, 2);

        const limiter = new RateLimiterRL({ storeClient: c, points: 1, duration: 5, keyPrefix: `flex:${k.name}` });
        assert.equal((await limiter.consume('u')).remainingPoints, 0);
        await assert.rejects(limiter.consume('u'), RateLimiterRes);
      } finally {
        k.close(c);
      }
    });

    test(`UPTO, a batched and a striped rule (client ${kind})`, async () => {
      const k = (await clientKinds())[kind];
      const c = await k.make(server.port);
      try {
        const rl = new Client(c);
        const spec = { algorithm: 'fixedwindow', limit: 6, windowMs: 2 ** 40 };
        const d = await rl.limit(`${k.name}:upto`, spec, Request.upto(4));
        assert.deepEqual([d.allowed, d.granted, d.remaining], [true, 4, 2]);
        const limiter = new Limiter(rl, { localLevel: false, fallback: 'failClosed', deadlineMs: 10_000 });
        for (const [name, options] of [['batched', { batched: true }], ['striped', { striped: 3 }]]) {
          const key = `${k.name}:${name}`;
          const set = await limiter.ruleSet([{ spec, global: true, key, ...options }]);
          let admitted = 0;
          for (let i = 0; i < 12; i++) if ((await limiter.check(set, 'x')).allowed) admitted++;
          // striped: one instance uses two of the three stripes of 2
          assert.equal(admitted, name === 'batched' ? 6 : 4, name);
        }
        await limiter.close();
      } finally {
        k.close(c);
      }
    });

    test(`leases and acquire (client ${kind})`, async () => {
      const k = (await clientKinds())[kind];
      const c = await k.make(server.port);
      const rl = new Client(c);
      try {
        const rule = { limit: 1, leaseMs: 5000 };
        const lease = await rl.lease(`${k.name}:lease`, rule);
        await assert.rejects(rl.lease(`${k.name}:lease`, rule), RLDeniedError);
        assert.equal(await lease.renew(), true);
        assert.equal(await lease.release(), true);
        assert.equal(await rl.withLease(`${k.name}:lease`, rule, (l) => l.id > 0), true);
        let acquired;
        try {
          acquired = await rl.acquire(`${k.name}:acq`, { algorithm: 'concurrency', ...rule }, { timeoutMs: 1000 });
        } catch (e) {
          // A module build without BLOCK: acquire says so.
          assert.ok(e instanceof ModuleMissingError && /predates BLOCK/.test(e.message), e.message);
          return;
        }
        assert.equal(acquired.allowed, true);
        assert.equal(await rl.release(`${k.name}:acq`, acquired.lease), true);
      } finally {
        rl.close();
        k.close(c);
      }
    });
  }
});

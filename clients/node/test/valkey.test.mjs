// The kit on Valkey (VALKEY_SERVER, as `make test` sets it from
// scripts/valkey-path.sh): typed calls, RLStore and RateLimiterRL, on both
// clients. Skipped when no valkey-server is given.
import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';
import { RL, RLStore, RateLimiterRL, RateLimiterRes } from 'redis-ratelimit';
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
        const rl = new RL(c);
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
  }
});

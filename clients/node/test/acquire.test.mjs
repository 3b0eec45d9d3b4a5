// acquire: waiting in the server (BLOCK) on connections of their own, on
// every client, standalone and cluster, against real servers. Skipped, with
// the reason, on a module build without BLOCK.
import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';
import express from 'express';
import { Client, TimeoutError, RLDeniedError, concurrencyLimit } from 'redis-ratelimit';
import { clientKinds, clusterKinds, sleep, startCluster, startServer, STILL_MS } from './servers.mjs';

/** Whether the module under test takes BLOCK (a module built before it refuses the option). */
async function moduleHasBlock() {
  const s = await startServer();
  const kind = (await clientKinds())[0];
  const c = await kind.make(s.port);
  try {
    await c.sendCommand(['RL.TOKENBUCKET', 'probe', '1', '1', '1', 'COST', '0', 'BLOCK', '1']);
    return true;
  } catch (e) {
    if (/unknown option 'BLOCK'/i.test(e.message)) return false;
    throw e;
  } finally {
    kind.close(c);
    await s.stop();
  }
}

const skip = (await moduleHasBlock()) ? false : 'this build of the module has no BLOCK (RL_MODULE predates it)';

/** Polls `cond` every 10 ms until it holds, failing after `ms`. */
async function until(cond, what, ms = 10_000) {
  const deadline = Date.now() + ms;
  while (!(await cond())) {
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await sleep(10);
  }
}

/** `ratelimit_blocked_now` of INFO ratelimit, summed over `rls` (one per node). */
async function blockedNow(...rls) {
  let n = 0;
  for (const rl of rls) {
    const info = String(await rl.send(undefined, ['INFO', 'ratelimit']));
    n += Number(/ratelimit_blocked_now:(\d+)/.exec(info)?.[1] ?? 0);
  }
  return n;
}

/** Tracks whether a promise has settled yet. */
function track(p) {
  const t = { settled: false, value: undefined };
  t.promise = p.then((v) => {
    t.settled = true;
    t.value = v;
    return v;
  });
  return t;
}

describe('acquire', { skip }, () => {
  let server;
  let cluster;
  before(async () => {
    [server, cluster] = await Promise.all([startServer(), startCluster()]);
  });
  after(async () => {
    await Promise.all([server?.stop(), cluster?.stop()]);
  });

  for (const kindName of ['node-redis v5', 'node-redis v4', 'ioredis', 'ioredis v6']) {
    describe(`on ${kindName}`, () => {
      let kind;
      let client;
      let rl;
      const k = (name) => `acq:${kindName}:${name}`;
      before(async () => {
        kind = (await clientKinds()).find((c) => c.name === kindName);
        client = await kind.make(server.port);
        rl = new Client(client);
      });
      after(() => {
        rl.close();
        kind.close(client);
      });

      test('blocks while the unit is held, and the client’s other calls answer meanwhile; a release admits it at once', async () => {
        const rule = { algorithm: 'concurrency', limit: 1, leaseMs: 8000 };
        const holder = await rl.concurrency(k('c'), rule);
        const started = Date.now();
        const waiting = track(rl.acquire(k('c'), rule, { timeoutMs: 20_000 }));
        await until(async () => (await blockedNow(rl)) === 1, 'the acquire to block in the server');
        // The shared client is not stalled by the held reply.
        const other = await rl.sliding(k('other'), { limit: 5, windowMs: 1000 });
        assert.equal(other.allowed, true);
        assert.equal(waiting.settled, false, 'the acquire is still waiting');
        assert.equal(await rl.release(k('c'), holder.lease), true);
        const d = await waiting.promise;
        assert.deepEqual([d.allowed, d.remaining], [true, 0]);
        assert.ok(d.lease > 0 && d.lease !== holder.lease);
        // Woken by the release, long before the holder's lease would have expired.
        assert.ok(Date.now() - started < 6000, `${Date.now() - started} ms`);
        assert.equal(await rl.release(k('c'), d.lease), true);
      });

      test('a timeout answers the denial at about timeoutMs; a wait above it is denied at once', async () => {
        const rule = { algorithm: 'concurrency', limit: 1, leaseMs: 1000 };
        const holder = await rl.concurrency(k('t'), rule);
        const started = Date.now();
        const waiting = rl.acquire(k('t'), rule, { timeoutMs: 1500 });
        await until(async () => (await blockedNow(rl)) === 1, 'the acquire to block');
        // The holder renews: the unit it waited for will not come in time.
        assert.equal(await rl.renew(k('t'), holder.lease, 30_000), true);
        const d = await waiting;
        const took = Date.now() - started;
        assert.equal(d.allowed, false);
        assert.equal(d.lease, null);
        assert.ok(took >= 1400 && took < 5000, `${took} ms`);
        // A lease 30 s away still waits for a release, up to its timeout.
        const waited = Date.now();
        const late = await rl.acquire(k('t'), rule, { timeoutMs: 500 });
        assert.equal(late.allowed, false);
        assert.ok(Date.now() - waited >= 450, `${Date.now() - waited} ms`);
        await rl.release(k('t'), holder.lease);
        // A bucket 30 s from its next token, 1 s allowed: the denial comes at
        // once, with its wait.
        const bucket = { algorithm: 'tokenbucket', capacity: 1, refillCount: 1, refillMs: 30_000 };
        assert.equal((await rl.limit(k('tb'), bucket)).allowed, true);
        const quick = Date.now();
        const no = await rl.acquire(k('tb'), bucket, { timeoutMs: 1000 });
        assert.equal(no.allowed, false);
        assert.ok(no.waitMs > 1000);
        assert.ok(Date.now() - quick < 1000, `${Date.now() - quick} ms`);
      });

      test('an admitted leaky bucket resolves after its wait_ms', async () => {
        const rule = { algorithm: 'leakybucket', capacity: 5, leakCount: 1, leakMs: 300 };
        assert.equal((await rl.limit(k('leaky'), rule)).waitMs, 0);
        const started = Date.now();
        const d = await rl.acquire(k('leaky'), rule, { timeoutMs: 5000 });
        assert.equal(d.allowed, true);
        assert.ok(d.waitMs > 200 && d.waitMs <= 300, `wait_ms ${d.waitMs}`);
        assert.ok(Date.now() - started >= d.waitMs - 2, `resolved after ${Date.now() - started} ms, wait_ms ${d.waitMs}`);
      });

      test('RL.HIT policies and RL.ALL wait too', async () => {
        const policy = `acq:${kindName.replace(/ /g, '_')}`;
        await rl.policySet(policy, { algorithm: 'tokenbucket', capacity: 1, refillCount: 1, refillMs: 400 });
        try {
          assert.equal((await rl.hit(policy, k('hit'))).allowed, true);
          assert.equal((await rl.hit(policy, k('hit'))).allowed, false);
          const d = await rl.acquire(k('hit'), { policy }, { timeoutMs: 5000 });
          assert.equal(d.allowed, true);
          const limits = [
            { key: `{${k('all')}}:a`, rule: { policy } },
            { key: `{${k('all')}}:b`, rule: { algorithm: 'fixedwindow', limit: 10, windowMs: STILL_MS } },
          ];
          assert.equal((await rl.all(limits)).allowed, true);
          assert.equal((await rl.all(limits)).deniedBy, 0);
          const both = await rl.acquireAll(limits, { timeoutMs: 5000 });
          assert.deepEqual([both.allowed, both.deniedBy], [true, null]);
          assert.equal((await rl.fixedWindow(`{${k('all')}}:b`, { limit: 10, windowMs: STILL_MS }, { cost: 0 })).remaining, 8);
        } finally {
          await rl.policyDel(policy);
        }
      });

      test('leases that wait: never more than `limit` held among 20 waiting workers, each served', async () => {
        // The last of them may wait (counted by the leases' expiry) 6 leaseMs: within timeoutMs.
        const rule = { limit: 3, leaseMs: 2000 };
        let inFlight = 0;
        let most = 0;
        const results = await Promise.all(
          Array.from({ length: 20 }, () =>
            rl.withLease(
              k('crowd'),
              rule,
              async () => {
                inFlight++;
                most = Math.max(most, inFlight);
                await sleep(10);
                inFlight--;
                return 'done';
              },
              { timeoutMs: 30_000 },
            ),
          ),
        );
        assert.equal(results.filter((r) => r === 'done').length, 20);
        assert.ok(most <= 3, `${most} held at once`);
        assert.ok(most >= 2, `${most} held at once: they waited in turn`);
        const now = await rl.concurrency(k('crowd'), { ...rule }, { cost: 0 });
        assert.equal(now.remaining, 3);
        // A lease that cannot come in time is a denial.
        const hog = await rl.lease(k('crowd'), rule, { cost: 3 });
        await assert.rejects(rl.lease(k('crowd'), rule, { timeoutMs: 200 }), RLDeniedError);
        await hog.release();
      });
    });
  }

  test('no reply within timeoutMs + 1 s: TimeoutError, and the connection is dropped, not reused', async () => {
    const kind = (await clientKinds()).find((c) => c.name === 'ioredis');
    const client = await kind.make(server.port);
    const rl = new Client(client);
    const rule = { algorithm: 'tokenbucket', capacity: 1, refillCount: 1, refillMs: 1000 };
    try {
      // An acquire connection opened (and idle) before the server stops answering.
      assert.equal((await rl.acquire('deadline', rule, { timeoutMs: 100 })).allowed, true);
      await rl.send(undefined, ['CLIENT', 'PAUSE', '3000', 'ALL']);
      const started = Date.now();
      await assert.rejects(rl.acquire('deadline', rule, { timeoutMs: 100 }), TimeoutError);
      const took = Date.now() - started;
      assert.ok(took >= 1000 && took < 3000, `${took} ms`);
      await rl.send(undefined, ['CLIENT', 'UNPAUSE']);
      // The next acquire runs on a fresh connection and is answered.
      const d = await rl.acquire('deadline', rule, { timeoutMs: 2000 });
      assert.equal(d.allowed, true);
    } finally {
      rl.close();
      kind.close(client);
    }
  });

  test('an aborted acquire closes its connection: the server forgets the request, nothing is consumed', async () => {
    const kind = (await clientKinds()).find((c) => c.name === 'node-redis v5');
    const client = await kind.make(server.port);
    const rl = new Client(client);
    const rule = { algorithm: 'concurrency', limit: 1, leaseMs: 5000 };
    try {
      const holder = await rl.concurrency('aborted', rule);
      const stop = new AbortController();
      const waiting = rl.acquire('aborted', rule, { timeoutMs: 10_000, signal: stop.signal });
      await until(async () => (await blockedNow(rl)) === 1, 'the acquire to block');
      stop.abort(new Error('called off'));
      await assert.rejects(waiting, /called off/);
      await until(async () => (await blockedNow(rl)) === 0, 'the server to forget it');
      await rl.release('aborted', holder.lease);
      assert.equal((await rl.concurrency('aborted', rule, { cost: 0 })).remaining, 1);
      await assert.rejects(rl.acquire('aborted', rule, { timeoutMs: 10, signal: AbortSignal.abort(new Error('already')) }), /already/);
    } finally {
      rl.close();
      kind.close(client);
    }
  });

  test('concurrencyLimit with timeoutMs queues requests in the server instead of answering 429', async () => {
    const kind = (await clientKinds()).find((c) => c.name === 'node-redis v5');
    const client = await kind.make(server.port);
    let open;
    const gate = new Promise((r) => (open = r));
    let started = 0;
    const a = express();
    // The server denies at once a wait above timeoutMs, counting the leases
    // of the waiters ahead until they expire: the fourth waits for three leaseMs.
    a.use(concurrencyLimit({ client, limit: 1, leaseMs: 5000, timeoutMs: 20_000, keyGenerator: () => 'queued', prefix: 'q:' }));
    a.get('/', async (_req, res) => {
      started++;
      await gate;
      res.send('ok');
    });
    const http = await new Promise((resolve) => {
      const s = a.listen(0, '127.0.0.1', () => resolve(s));
    });
    const rl = new Client(client);
    try {
      const url = `http://127.0.0.1:${http.address().port}/`;
      const replies = [fetch(url), fetch(url), fetch(url)];
      await until(async () => started === 1 && (await blockedNow(rl)) === 2, 'one running, two waiting');
      // A client that gives up while waiting: its wait is called off in the server.
      const leaving = new AbortController();
      const gaveUp = fetch(url, { signal: leaving.signal }).catch((e) => e);
      await until(async () => (await blockedNow(rl)) === 3, 'three waiting');
      leaving.abort();
      assert.equal((await gaveUp).name, 'AbortError');
      await until(async () => (await blockedNow(rl)) === 2, 'the wait called off');
      open();
      const codes = (await Promise.all(replies)).map((r) => r.status);
      assert.deepEqual(codes, [200, 200, 200]);
      assert.equal(started, 3);
      await until(async () => (await rl.concurrency('q:queued', { limit: 1, leaseMs: 5000 }, { cost: 0 })).remaining === 1, 'every lease released');
    } finally {
      http.closeAllConnections?.();
      await new Promise((r) => http.close(r));
      kind.close(client);
    }
  });

  for (const kindName of ['node-redis v5 cluster', 'ioredis cluster']) {
    test(`on ${kindName}: waits at the key’s owner, without a MOVED, and a release wakes it`, async () => {
      const kind = (await clusterKinds()).find((c) => c.name === kindName);
      const client = await kind.make(cluster.ports);
      const rl = new Client(client);
      const nodes = [];
      try {
        const { createClient } = await import('redis');
        for (const port of cluster.ports) nodes.push(await createClient({ url: `redis://127.0.0.1:${port}` }).connect());
        const nodeRls = nodes.map((n) => new Client(n));
        const moved = cluster.errorstat('MOVED');
        for (let i = 0; i < 2; i++) {
          const key = `${kindName}:acq:${i}`;
          const rule = { algorithm: 'concurrency', limit: 1, leaseMs: 5000 };
          const holder = await rl.concurrency(key, rule);
          const waiting = track(rl.acquire(key, rule, { timeoutMs: 20_000 }));
          await until(async () => (await blockedNow(...nodeRls)) === 1, 'the acquire to block');
          assert.equal((await rl.sliding(`${key}:other`, { limit: 1, windowMs: 1000 })).allowed, true);
          assert.equal(waiting.settled, false);
          await rl.release(key, holder.lease);
          const d = await waiting.promise;
          assert.equal(d.allowed, true);
          await rl.release(key, d.lease);
        }
        assert.equal(cluster.errorstat('MOVED'), moved);
      } finally {
        nodes.forEach((n) => n.destroy());
        rl.close();
        kind.close(client);
      }
    });
  }
});

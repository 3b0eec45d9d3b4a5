// The adapters' circuit breaker (the Limiter's, where the peer has none):
// RLStore with passOnStoreError and RateLimiterRL with an insurance limiter,
// against a real server paused with SIGSTOP. After `failures` calls miss the
// deadline no command is sent while it is open; the account decides; after
// SIGCONT a PING probe closes it and calls go to Redis again. Conditions
// are polled, never slept for.
import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';
import { Redis } from 'ioredis';
import { RateLimiterMemory } from 'rate-limiter-flexible';
import { InvalidArgumentError, RateLimiterRL, RLStore } from 'redis-ratelimit';
import { sleep, startServer } from './servers.mjs';

let server;
let c;
before(async () => {
  server = await startServer();
  c = new Redis({ port: server.port, host: '127.0.0.1' });
  c.on('error', () => {});
});
after(async () => {
  if (server?.proc.exitCode === null) server.proc.kill('SIGCONT');
  c?.disconnect();
  await server?.stop();
});

async function until(cond, what, ms = 10_000) {
  const end = Date.now() + ms;
  while (!(await cond())) {
    if (Date.now() > end) assert.fail(`never: ${what}`);
    await sleep(10);
  }
}

describe('RLStore with passOnStoreError', () => {
  test('the breaker opens after 2 lost calls, sends nothing while open, and a probe closes it', async () => {
    const sent = [];
    const store = new RLStore({
      sendCommand: (...args) => {
        sent.push(args[0]);
        return c.call(...args);
      },
      prefix: `brk:${process.pid}:`,
      deadlineMs: 50,
      breaker: { failures: 2, openForMs: 1000 },
    });
    store.init({ windowMs: 3_600_000, limit: 10, passOnStoreError: true });
    await store.ready;
    assert.equal((await store.increment('u')).totalHits, 1);
    server.proc.kill('SIGSTOP');
    try {
      for (let i = 0; i < 2; i++) assert.ok((await store.increment('u')).totalHits <= 10);
      assert.equal(store.breaker.isOpen, true);
      const before = sent.length;
      for (let i = 0; i < 3; i++) assert.ok((await store.increment('u')).totalHits <= 10, 'the account admits');
      assert.equal(sent.length, before, 'no command while open');
      // Account: 1 + 2 lost + 3 = 6 of the share 11; then it would deny past 11.
    } finally {
      server.proc.kill('SIGCONT');
    }
    await until(async () => {
      await store.increment('v');
      return !store.breaker.isOpen;
    }, 'the probe closes the breaker');
    assert.ok(sent.includes('PING'));
    const n = sent.length;
    await store.increment('w');
    assert.equal(sent.length, n + 1, 'calls go to Redis again');
  });

  test('what the account admitted while the breaker was open reaches Redis as COST n FORCE: at most max(limit, share) in the window', async () => {
    const store = new RLStore({
      sendCommand: (...args) => c.call(...args),
      prefix: `owed:${process.pid}:`,
      deadlineMs: 50,
      breaker: { failures: 1, openForMs: 200 },
    });
    store.init({ windowMs: 3_600_000, limit: 5, passOnStoreError: true });
    await store.ready;
    let admitted = 0;
    const count = async () => {
      if ((await store.increment('u')).totalHits <= 5) admitted++;
    };
    server.proc.kill('SIGSTOP');
    try {
      // Lost (Redis holds the call, and will count it): the breaker opens.
      await count();
      assert.equal(store.breaker.isOpen, true);
      // Open: the account admits the rest of its share (6) without a call.
      for (let i = 0; i < 8; i++) await count();
      assert.equal(admitted, 6);
    } finally {
      server.proc.kill('SIGCONT');
    }
    await until(async () => {
      await store.increment('v');
      return !store.breaker.isOpen;
    }, 'the probe closes the breaker');
    // Redis counts the 5 admitted without a call before the next call: no more in this window.
    for (let i = 0; i < 8; i++) await count();
    assert.equal(admitted, 6, 'max(limit, share)');
  });

  test('breaker: false turns it off; a bad breaker is refused naming its option', () => {
    const store = new RLStore({ sendCommand: (...a) => c.call(...a), breaker: false });
    store.init({ windowMs: 1000, limit: 1, passOnStoreError: true });
    assert.equal(store.breaker, undefined);
    assert.throws(() => new RLStore({ sendCommand: (...a) => c.call(...a), breaker: { failures: 0 } }), (e) => e instanceof InvalidArgumentError && e.argument === 'failures');
    assert.throws(() => new RLStore({ sendCommand: (...a) => c.call(...a), breaker: null }), (e) => e instanceof InvalidArgumentError && e.argument === 'breaker');
  });
});

describe('RateLimiterRL with an insurance limiter', () => {
  test('the breaker opens after 2 lost consumes, the insurance decides without a call while open, and a probe closes it', async () => {
    const counting = new Redis({ port: server.port, host: '127.0.0.1' });
    counting.on('error', () => {});
    const sent = [];
    const call = counting.call.bind(counting);
    counting.call = (...args) => {
      sent.push(String(args[0]));
      return call(...args);
    };
    try {
      const limiter = new RateLimiterRL({
        storeClient: counting,
        points: 10,
        duration: 3600,
        keyPrefix: `brk:${process.pid}:flex`,
        deadlineMs: 50,
        breaker: { failures: 2, openForMs: 1000 },
        insuranceLimiter: new RateLimiterMemory({ points: 10, duration: 3600 }),
      });
      await limiter.consume('u');
      server.proc.kill('SIGSTOP');
      try {
        for (let i = 0; i < 2; i++) await limiter.consume('u');
        assert.equal(limiter.breaker.isOpen, true);
        const before = sent.length;
        for (let i = 0; i < 3; i++) await limiter.consume('u');
        assert.equal(sent.length, before, 'no command while open');
      } finally {
        server.proc.kill('SIGCONT');
      }
      await until(async () => {
        // A denial (a RateLimiterRes) is an answer too: only the breaker matters here.
        await limiter.consume('v').catch((e) => {
          if (e instanceof Error) throw e;
        });
        return !limiter.breaker.isOpen;
      }, 'the probe closes the breaker');
      assert.ok(sent.includes('PING'));
      const n = sent.length;
      await limiter.consume('w');
      assert.ok(sent.length > n, 'calls go to Redis again');
      // Without an insurance limiter there is nothing to fall back on: no breaker.
      assert.equal(new RateLimiterRL({ storeClient: counting, points: 1 }).breaker, undefined);
    } finally {
      counting.disconnect();
    }
  });

  test('what the insurance admitted while the breaker was open reaches Redis as COST n FORCE: at most max(limit, share) in the window', async () => {
    const limiter = new RateLimiterRL({
      storeClient: c,
      points: 5,
      duration: 3600,
      keyPrefix: `owed:${process.pid}:flex`,
      deadlineMs: 50,
      breaker: { failures: 1, openForMs: 200 },
      insuranceLimiter: new RateLimiterMemory({ points: 100, duration: 3600 }),
    });
    let admitted = 0;
    // A denial (a RateLimiterRes) is not an Error.
    const limited = (e) => {
      if (e instanceof Error) throw e;
    };
    const count = () => limiter.consume('u').then(() => admitted++, limited);
    server.proc.kill('SIGSTOP');
    try {
      // Lost (Redis holds the call, and will count it): the breaker opens.
      await count();
      assert.equal(limiter.breaker.isOpen, true);
      // Open: the account admits the rest of its share (6) without a call.
      for (let i = 0; i < 8; i++) await count();
      assert.equal(admitted, 6);
    } finally {
      server.proc.kill('SIGCONT');
    }
    await until(async () => {
      await limiter.consume('v').catch(limited);
      return !limiter.breaker.isOpen;
    }, 'the probe closes the breaker');
    // Redis counts the 5 admitted without a call before the next call: no more in this window.
    for (let i = 0; i < 8; i++) await count();
    assert.equal(admitted, 6, 'max(limit, share)');
  });
});

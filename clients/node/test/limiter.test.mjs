// The Limiter against real servers: the Redis path, the deny cache, the
// local level of global rules, RL.ALL and policies; then Redis paused
// (SIGSTOP) and killed for the fallback modes, the circuit breaker and its
// probe, and the owed units sent as COST n FORCE once Redis answers again.
// Nothing sleeps to assert: conditions are polled.
import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';
import { Redis } from 'ioredis';
import { Client, InvalidArgumentError, Limiter, Request, STAT_NAMES } from 'redis-ratelimit';
import { rejectsAtOnce, sleep, startServer, STILL_MS } from './servers.mjs';

let server;
let redis;
let client;
let n = 0;
/** A fresh identity, so that tests share no limiter. */
const id = (what) => `${what}:${process.pid}:${++n}`;

before(async () => {
  server = await startServer();
  redis = new Redis({ port: server.port, host: '127.0.0.1' });
  redis.on('error', () => {});
  client = new Client(redis);
});
after(async () => {
  redis?.disconnect();
  await server?.stop();
});

const fixed = (limit) => ({ algorithm: 'fixedwindow', limit, windowMs: STILL_MS });

/** Polls `cond` until it holds (at most `ms`). */
async function until(cond, what, ms = 10_000) {
  const end = Date.now() + ms;
  while (!(await cond())) {
    if (Date.now() > end) assert.fail(`never: ${what}`);
    await sleep(10);
  }
}

describe('Redis answers', () => {
  test('admits to the limit, denies after, and the deny cache answers the next denial in process', async () => {
    const limiter = new Limiter(client);
    const rules = await limiter.ruleSet([{ spec: fixed(2), name: 'api' }]);
    const who = id('u');
    const a = await limiter.check(rules, who);
    assert.deepEqual([a.allowed, a.limit, a.remaining, a.path], [true, 2, 1, 'redis']);
    assert.equal((await limiter.check(rules, who)).remaining, 0);
    const no = await limiter.check(rules, who);
    assert.deepEqual([no.allowed, no.path, no.deniedBy], [false, 'redis', 0]);
    assert.ok(no.waitMs > 0);
    const cached = await limiter.check(rules, who);
    assert.deepEqual([cached.allowed, cached.path, cached.deniedBy], [false, 'denyCache', 0]);
    assert.ok(cached.waitMs >= 1 && cached.waitMs <= no.waitMs);
    const s = limiter.stats();
    assert.deepEqual([s.redis_calls, s.redis_admitted, s.redis_denied, s.deny_cache_hits], [3, 2, 1, 1]);
    // The key is rl:<name>:<identity>: Redis holds the two units.
    assert.equal((await client.fixedWindow(`rl:api:${who}`, { limit: 2, windowMs: STILL_MS }, Request.cost(0))).remaining, 0);
    // Another identity is another key.
    assert.equal((await limiter.check(rules, id('other'))).allowed, true);
  });

  test('a cached denial lasts min(wait, denyCacheMaxMs), then Redis is asked again', async () => {
    const limiter = new Limiter(client, { denyCacheMaxMs: 50 });
    const rules = await limiter.ruleSet([{ spec: fixed(1) }]);
    const who = id('short');
    await limiter.check(rules, who);
    assert.equal((await limiter.check(rules, who)).path, 'redis');
    assert.equal((await limiter.check(rules, who)).path, 'denyCache');
    await until(async () => (await limiter.check(rules, who)).path === 'redis', 'the cached denial expires');
  });

  test('the local level: a global rule takes its share in process, and what the share denies never reaches Redis', async () => {
    // A limit of 10 over 4 instances: a share of ceil(10 x 1.1 / 4) = 3.
    const limiter = new Limiter(client, { instances: 4, denyCache: false });
    const key = `global:${id('g')}`;
    const rules = await limiter.ruleSet([{ spec: fixed(10), key, global: true }]);
    for (let i = 0; i < 3; i++) assert.equal((await limiter.check(rules, 'anyone')).path, 'redis');
    const local = await limiter.check(rules, 'anyone');
    assert.deepEqual([local.allowed, local.path, local.limit, local.remaining, local.deniedBy], [false, 'local', 10, 0, 0]);
    assert.ok(local.waitMs > 0);
    const s = limiter.stats();
    assert.deepEqual([s.redis_calls, s.local_denied], [3, 1]);
    assert.equal((await client.fixedWindow(key, { limit: 10, windowMs: STILL_MS }, Request.cost(0))).remaining, 7);
  });

  test('the local level gives its units back when Redis denies', async () => {
    const limiter = new Limiter(client, { instances: 1, denyCache: false });
    const key = `global:${id('back')}`;
    await client.fixedWindow(key, fixed(3), Request.force(3)); // another instance took them all
    const rules = await limiter.ruleSet([{ spec: fixed(3), key, global: true }]);
    for (let i = 0; i < 5; i++) {
      const d = await limiter.check(rules, 'x');
      assert.deepEqual([d.allowed, d.path], [false, 'redis'], `call ${i}: the share is refunded each time, so Redis says`);
    }
  });

  test('several rules go in one RL.ALL: deniedBy is the rule that denied', async () => {
    const limiter = new Limiter(client);
    const who = id('all');
    const rules = await limiter.ruleSet([
      { spec: fixed(10), name: 'wide' },
      { spec: { algorithm: 'sliding', limit: 1, windowMs: 60_000 }, name: 'narrow' },
    ]);
    assert.equal((await limiter.check(rules, who)).allowed, true);
    const no = await limiter.check(rules, who);
    assert.deepEqual([no.allowed, no.deniedBy, no.path], [false, 1, 'redis']);
    const cached = await limiter.check(rules, who);
    assert.deepEqual([cached.path, cached.deniedBy], ['denyCache', 1]);
    // All or nothing: the wide rule holds one unit.
    assert.equal((await client.fixedWindow(`rl:wide:${who}`, fixed(10), Request.cost(0))).remaining, 9);
  });

  test("an RL.ALL denial is cached for its set only: its wait is the largest of the set's, not the rule's that denied first", async () => {
    const limiter = new Limiter(client, { denyCacheMaxMs: 3_600_000 });
    const who = id('allwait');
    // `quick` refills in 50 ms, `slow` in STILL_MS; in this order, RL.ALL's
    // denial names quick (the first that denied) with slow's wait.
    const quick = { spec: { algorithm: 'tokenbucket', capacity: 1, refillCount: 1, refillMs: 50 }, key: `rl:quick:${who}` };
    const slow = { spec: { algorithm: 'tokenbucket', capacity: 1, refillCount: 1, refillMs: STILL_MS }, key: `rl:slow:${who}` };
    const both = await limiter.ruleSet([quick, slow]);
    assert.equal((await limiter.check(both, who)).allowed, true);
    const no = await limiter.check(both, who);
    assert.deepEqual([no.allowed, no.deniedBy, no.path], [false, 0, 'redis']);
    assert.ok(no.waitMs > 3_600_000, `${no.waitMs}`);
    assert.equal((await limiter.check(both, who)).path, 'denyCache', 'the same set: denied in process');
    await until(async () => (await client.tokenBucket(quick.key, quick.spec, Request.cost(0))).remaining === 1, 'quick refills');
    // quick alone passes in Redis now: its key is not held for slow's wait.
    const alone = await limiter.check(await limiter.ruleSet([quick]), who);
    assert.deepEqual([alone.allowed, alone.path], [true, 'redis']);
  });

  test('a policy rule goes through RL.HIT; an unknown policy is refused naming policy', async () => {
    const name = `lim:${id('p')}`;
    await client.policySet(name, { algorithm: 'tokenbucket', capacity: 2, refillCount: 1, refillMs: 60_000 });
    const limiter = new Limiter(client);
    const rules = await limiter.ruleSet([{ policy: name }]);
    assert.deepEqual(rules.rules[0].spec, { algorithm: 'tokenbucket', capacity: 2, refillCount: 1, refillMs: 60_000 });
    const who = id('u');
    assert.equal((await limiter.check(rules, who, 2)).remaining, 0);
    const no = await limiter.check(rules, who);
    assert.deepEqual([no.allowed, no.path], [false, 'redis']);
    await assert.rejects(limiter.ruleSet([{ policy: `${name}:none` }]), (e) => e instanceof InvalidArgumentError && e.argument === 'policy');
    await client.policyDel(name);
  });

  test('bad arguments are refused naming them, before anything is sent', async () => {
    const limiter = new Limiter(client);
    const bad = async (rules, argument) =>
      assert.rejects(limiter.ruleSet(rules), (e) => e instanceof InvalidArgumentError && e.argument === argument, JSON.stringify(rules));
    await bad([], 'rules');
    await bad([{}], 'spec');
    await bad([{ spec: fixed(1), policy: 'p' }], 'policy');
    await bad([{ spec: { algorithm: 'fixedwindow', limit: 0, windowMs: 1 } }], 'limit');
    await bad([{ spec: { algorithm: 'concurrency', limit: 1, leaseMs: 1000 } }], 'algorithm');
    await bad([{ spec: fixed(1), key: 'k', keyPrefix: 'p' }], 'key');
    await bad([{ spec: fixed(1), global: 'yes' }], 'global');
    await bad([{ spec: { algorithm: 'quota', limit: 1, period: 'day', zone: 'Europe/Paris' }, global: true }], 'global');
    await bad([{ spec: fixed(1) }, { spec: { algorithm: 'quota', limit: 1, period: 'day', zone: '+01:00' } }], 'zone');
    const rules = await limiter.ruleSet([{ spec: fixed(1) }]);
    await rejectsAtOnce(() => limiter.check(rules, ''), (e) => e instanceof InvalidArgumentError && e.argument === 'identity');
    await rejectsAtOnce(() => limiter.check(rules, 'x', -1), (e) => e instanceof InvalidArgumentError && e.argument === 'cost');
    await rejectsAtOnce(() => limiter.check([{ spec: fixed(1) }], 'x'), (e) => e instanceof InvalidArgumentError && e.argument === 'set');
    for (const [options, argument] of [
      [{ fallback: 'maybe' }, 'fallback'],
      [{ deadlineMs: 0 }, 'deadlineMs'],
      [{ instances: 0 }, 'instances'],
      [{ share: { ratio: 2 } }, 'ratio'],
      [{ instances: 2, share: { ratio: 0.5 } }, 'share'],
      [{ breaker: { failures: 0 } }, 'failures'],
      [{ breaker: { openForMs: -1 } }, 'openForMs'],
      [{ denyCache: 1 }, 'denyCache'],
    ]) {
      assert.throws(() => new Limiter(client, options), (e) => e instanceof InvalidArgumentError && e.argument === argument, JSON.stringify(options));
    }
    assert.equal(limiter.stats().redis_calls, 0);
  });

  test("stats: every counter of the Rust kit's StatsSnapshot, in its order", () => {
    const limiter = new Limiter(client);
    assert.deepEqual(
      limiter.statsPairs().map(([k]) => k),
      ['redis_calls', 'redis_admitted', 'redis_denied', 'redis_errors', 'redis_timeouts', 'redis_unavailable', 'local_denied', 'deny_cache_hits', 'fallback_admitted', 'owed_sent', 'fallback_denied', 'breaker_skipped', 'breaker_opened', 'probes', 'probes_ok', 'key_missing', 'key_panics'],
    );
    assert.deepEqual(Object.keys(limiter.stats()), [...STAT_NAMES]);
    assert.ok(Object.values(limiter.stats()).every((v) => v === 0));
  });

  test('an error reply is decided by the fallback without opening the breaker', async () => {
    const limiter = new Limiter(client, { breaker: { failures: 1 }, fallback: 'failClosed' });
    const key = `wrongtype:${id('w')}`;
    await redis.set(key, 'a string');
    const rules = await limiter.ruleSet([{ spec: fixed(5), key }]);
    const d = await limiter.check(rules, 'x');
    assert.deepEqual([d.allowed, d.path], [false, 'fallback']);
    assert.equal(limiter.stats().redis_errors, 1);
    assert.equal(limiter.breakerOpen, false);
  });
});

describe('Redis paused (SIGSTOP)', () => {
  let paused;
  let c;
  before(async () => {
    paused = await startServer();
    c = new Redis({ port: paused.port, host: '127.0.0.1' });
    c.on('error', () => {});
  });
  after(async () => {
    if (paused?.proc.exitCode === null) paused.proc.kill('SIGCONT');
    c?.disconnect();
    await paused?.stop();
  });

  test('local only: the account at the share, the breaker opens, the probe closes it, and the owed units reach Redis as COST n FORCE', async () => {
    const limiter = new Limiter(c, { fallback: 'localOnly', deadlineMs: 100, breaker: { failures: 2, openForMs: 300 }, denyCache: false });
    const key = `paused:${id('k')}`;
    const rules = await limiter.ruleSet([{ spec: fixed(5), key }]);
    assert.equal((await limiter.check(rules, 'x')).path, 'redis');
    paused.proc.kill('SIGSTOP');
    try {
      // Two calls miss the deadline (Redis holds them, and will run them):
      // lost, charged to the account, and the breaker opens on the second.
      for (let i = 0; i < 2; i++) {
        const d = await limiter.check(rules, 'x');
        assert.deepEqual([d.allowed, d.path], [true, 'fallback']);
      }
      assert.equal(limiter.breakerOpen, true);
      assert.deepEqual([limiter.stats().redis_timeouts, limiter.stats().breaker_opened], [2, 1]);
      // Open: no call; the account admits what is left of the share (2),
      // owed to Redis, then denies.
      const skipped = [];
      for (let i = 0; i < 3; i++) skipped.push(await limiter.check(rules, 'x'));
      assert.deepEqual(skipped.map((d) => [d.allowed, d.path]), [[true, 'fallback'], [true, 'fallback'], [false, 'fallback']]);
      assert.equal(skipped[2].deniedBy, 0);
      assert.equal(skipped[2].limit, 5);
      assert.equal(limiter.stats().redis_calls, 3, 'no call while open');
    } finally {
      paused.proc.kill('SIGCONT');
    }
    // The next request past openForMs starts the probe; its PING closes the breaker.
    await until(async () => {
      await limiter.check(rules, 'x');
      return !limiter.breakerOpen;
    }, 'the probe closes the breaker');
    assert.ok(limiter.stats().probes >= 1);
    assert.equal(limiter.stats().probes_ok, 1);
    // The next call first sends the 2 owed units: Redis now holds 1 + 2 lost + 2 owed = 5.
    const d = await limiter.check(rules, 'x');
    assert.deepEqual([d.allowed, d.path, d.remaining], [false, 'redis', 0]);
    assert.equal(limiter.stats().owed_sent, 1);
    const held = await new Client(c).fixedWindow(key, fixed(5), Request.cost(0));
    assert.equal(held.remaining, 0);
    // This instance admitted 5 in all: the limit, no more.
    const s = limiter.stats();
    assert.equal(s.redis_admitted + s.fallback_admitted, 5);
  });

  test('fail closed denies and fail open admits while Redis does not answer', async () => {
    const closed = new Limiter(c, { fallback: 'failClosed', deadlineMs: 50, breaker: { failures: 1, openForMs: 60_000 } });
    const open = new Limiter(c, { fallback: 'failOpen', deadlineMs: 50, breaker: { failures: 1, openForMs: 60_000 } });
    const rc = await closed.ruleSet([{ spec: fixed(1), key: `closed:${id('c')}` }]);
    const ro = await open.ruleSet([{ spec: fixed(1), key: `open:${id('o')}` }]);
    paused.proc.kill('SIGSTOP');
    try {
      const no = await closed.check(rc, 'x');
      assert.deepEqual([no.allowed, no.path, no.waitMs, no.deniedBy], [false, 'fallback', 60_000, 0]);
      const yes = await open.check(ro, 'x');
      assert.deepEqual([yes.allowed, yes.path], [true, 'fallback']);
      // Open now: decided at once, without a call.
      for (let i = 0; i < 3; i++) {
        assert.equal((await closed.check(rc, 'x')).allowed, false);
        assert.equal((await open.check(ro, 'x')).allowed, true);
      }
      assert.deepEqual([closed.stats().redis_calls, closed.stats().breaker_skipped, closed.stats().fallback_denied], [1, 3, 4]);
      assert.deepEqual([open.stats().redis_calls, open.stats().breaker_skipped, open.stats().fallback_admitted], [1, 3, 4]);
    } finally {
      paused.proc.kill('SIGCONT');
    }
  });

  test('a global rule on the local level, Redis paused: the share admitted once, whatever the path', async () => {
    const limiter = new Limiter(c, { instances: 2, deadlineMs: 50, breaker: { failures: 1, openForMs: 60_000 }, denyCache: false });
    // A limit of 10 over 2 instances: a share of 6.
    const rules = await limiter.ruleSet([{ spec: fixed(10), key: `gpaused:${id('g')}`, global: true }]);
    assert.equal((await limiter.check(rules, 'x')).path, 'redis');
    paused.proc.kill('SIGSTOP');
    const paths = [];
    try {
      for (let i = 0; i < 8; i++) {
        const d = await limiter.check(rules, 'x');
        paths.push(`${d.allowed ? 'yes' : 'no'} ${d.path}`);
      }
    } finally {
      paused.proc.kill('SIGCONT');
    }
    assert.deepEqual(paths, [...Array(5).fill('yes fallback'), 'no local', 'no local', 'no local']);
  });
});

describe('Redis killed', () => {
  test('a dead server: the fallback decides, the breaker opens, nothing waits past the deadline', async () => {
    const doomed = await startServer();
    let killed = false;
    const c = new Redis({ port: doomed.port, host: '127.0.0.1', maxRetriesPerRequest: 1 });
    c.on('error', () => {});
    try {
      const limiter = new Limiter(c, { fallback: 'localOnly', deadlineMs: 100, breaker: { failures: 2, openForMs: 60_000 } });
      const rules = await limiter.ruleSet([{ spec: fixed(3) }]);
      assert.equal((await limiter.check(rules, 'x')).path, 'redis');
      killed = true;
      await doomed.kill(); // SIGKILL, and its directory removed
      const paths = [];
      for (let i = 0; i < 4; i++) {
        const d = await limiter.check(rules, 'x');
        paths.push(`${d.allowed ? 'yes' : 'no'} ${d.path}`);
      }
      // Lost calls are charged: 1 admitted by Redis, then the share's 2, then denied.
      assert.deepEqual(paths, ['yes fallback', 'yes fallback', 'no fallback', 'no fallback']);
      const s = limiter.stats();
      assert.equal(s.redis_timeouts + s.redis_unavailable, 2);
      assert.equal(s.breaker_opened, 1);
      assert.equal(s.breaker_skipped, 2);
      assert.equal(limiter.breakerOpen, true);
    } finally {
      c.disconnect();
      if (!killed) await doomed.stop();
    }
  });
});

describe('bounds on memory', () => {
  test('past localCapacity, a key its account has emptied is not the one dropped: the fallback never admits it a second share', async () => {
    const doomed = await startServer();
    const c = new Redis({ port: doomed.port, host: '127.0.0.1', maxRetriesPerRequest: 1 });
    c.on('error', () => {});
    try {
      const limiter = new Limiter(c, { fallback: 'localOnly', deadlineMs: 100, localCapacity: 10, denyCache: false, breaker: { failures: 1, openForMs: 60_000 } });
      // A bucket of 3 that refills one unit in STILL_MS: an emptied account stays empty.
      const rules = await limiter.ruleSet([{ spec: { algorithm: 'tokenbucket', capacity: 3, refillCount: 1, refillMs: STILL_MS } }]);
      await doomed.kill();
      const hot = [];
      for (let i = 0; i < 4; i++) hot.push((await limiter.check(rules, 'hot')).allowed);
      assert.deepEqual(hot, [true, true, true, false], 'the share of 3, then denied');
      assert.equal(limiter.breakerOpen, true);
      // Other identities fill the map past its capacity, each one unit from idle.
      for (let i = 0; i < 30; i++) assert.equal((await limiter.check(rules, `other${i}`)).allowed, true);
      const again = await limiter.check(rules, 'hot');
      assert.deepEqual([again.allowed, again.path], [false, 'fallback'], 'the emptied account was kept: no second share');
    } finally {
      c.disconnect();
    }
  });
  test('the deny cache holds at most its capacity, the newest kept', async () => {
    const { DenyCache } = await import('../dist/esm/denyCache.js');
    const { Decision } = await import('redis-ratelimit');
    const cache = new DenyCache(1000, 100);
    for (let i = 0; i < 10_000; i++) cache.put(`k${i}`, new Decision(false, 5, 0, 1000 + i, 60_000), 0);
    assert.equal(cache.size, 100);
    assert.equal(cache.get('k9999', 1).path, 'denyCache');
    assert.equal(cache.get('k9999', 1).waitMs, 1000 + 9999 - 1);
    // Neither an admission nor a denial that can never pass is cached.
    cache.put('never', new Decision(false, 5, 0, -1, 0), 0);
    cache.put('ok', new Decision(true, 5, 4, 0, 0), 0);
    assert.equal(cache.get('never', 1), undefined);
    assert.equal(cache.get('ok', 1), undefined);
  });
  test('the local limiters hold at most their capacity', async () => {
    const { LocalLimiters, localSpec } = await import('../dist/esm/local.js');
    const local = new LocalLimiters(1000);
    const spec = localSpec(fixed(5));
    for (let i = 0; i < 20_000; i++) local.run(`k${i}`, spec, { kind: 'cost', n: 1n });
    assert.ok(local.size <= 1000, `${local.size}`);
    assert.equal(local.run('k19999', spec, { kind: 'cost', n: 0n }).remaining, 4n, 'the newest stays');
  });
});

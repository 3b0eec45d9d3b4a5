// Issue 27 (the contract's grants): typed UPTO on the five algorithms, RL.HIT
// and RL.ALL; batched global rules (UPTO batches spent in process, REFUND at
// close and after holdMs); striped rules on a real 3-master cluster (each
// stripe on its own master, the sum never above the limit, spill-over to the
// next stripe), and the pure pieces (batch size, shares, tags).
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { after, before, describe, test } from 'node:test';
import { Redis, Cluster } from 'ioredis';
import { createClient, createCluster } from 'redis';
import { Registry } from 'prom-client';
import { batchSize, Client, GRANT_DEFAULTS, InvalidArgumentError, keySlot, Limiter, pickTags, Request, SlotMap, stripeSpecs } from 'redis-ratelimit';
import { clientKinds, clusterKinds, sleep, startCluster, startServer, STILL_MS } from './servers.mjs';

let server;
let cluster;
before(async () => {
  [server, cluster] = await Promise.all([startServer(), startCluster()]);
});
after(async () => {
  await Promise.all([server?.stop(), cluster?.stop()]);
});

let seq = 0;
const fresh = (what) => `grants:${what}:${process.pid}:${++seq}`;

async function until(cond, what, ms = 20_000) {
  const deadline = Date.now() + ms;
  for (;;) {
    const v = await cond();
    if (v) return v;
    if (Date.now() > deadline) assert.fail(`timed out waiting for ${what}`);
    await sleep(10);
  }
}

const cli = (port, ...args) => execFileSync('redis-cli', ['-p', String(port), ...args]).toString().trim();
/** The server's clock, in microseconds (TIME). */
const serverUs = (port) => {
  const [s, us] = cli(port, 'TIME').split('\n');
  return BigInt(s) * 1_000_000n + BigInt(us);
};
/** `calls=` of a command in INFO commandstats (0 before its first call). */
function calls(port, command) {
  // module commands are listed in capitals (cmdstat_RL.TOKENBUCKET)
  const m = new RegExp(`cmdstat_${command.replace('.', '\\.')}:calls=(\\d+)`, 'i').exec(cli(port, 'INFO', 'commandstats'));
  return m ? Number(m[1]) : 0;
}
const argError = (name) => (e) => e instanceof InvalidArgumentError && e.argument === name;

async function nodeRedis(port) {
  const c = createClient({ url: `redis://127.0.0.1:${port}` });
  c.on('error', () => {});
  await c.connect();
  return c;
}

describe('pure pieces', () => {
  test('batch size: ceil(rate x holdMs / 1000), at least 1, at most max(1, limit x pct / 100)', () => {
    assert.equal(batchSize(0, 50, 1000, 10), 1);
    assert.equal(batchSize(1, 50, 1000, 10), 1);
    assert.equal(batchSize(20, 50, 1000, 10), 1);
    assert.equal(batchSize(21, 50, 1000, 10), 2);
    assert.equal(batchSize(1000, 50, 1000, 10), 50);
    assert.equal(batchSize(100_000, 50, 1000, 10), 100);
    assert.equal(batchSize(100_000, 50, 5, 10), 1, 'a limit whose share is below 1 still asks 1');
    assert.equal(batchSize(999, 1000, 2 ** 40, 100), 999);
    assert.deepEqual(GRANT_DEFAULTS, { holdMs: 50, maxSharePct: 10 });
  });

  test('stripe shares: limit / N, the remainder to the first; both token bucket parameters; durations kept', () => {
    const tb = stripeSpecs({ algorithm: 'tokenbucket', capacity: 10, refillCount: 5, refillMs: 1000 }, 3);
    assert.deepEqual(tb.map((s) => [s.capacity, s.refillCount, s.refillMs]), [[4, 2, 1000], [3, 2, 1000], [3, 1, 1000]]);
    const hw = stripeSpecs({ algorithm: 'hashwindow', limit: 100, windowMs: 60_000, bucketMs: 1000 }, 7);
    assert.deepEqual(hw.map((s) => s.limit), [15, 15, 14, 14, 14, 14, 14]);
    assert.ok(hw.every((s) => s.windowMs === 60_000 && s.bucketMs === 1000));
    const q = stripeSpecs({ algorithm: 'quota', limit: 5, period: 'day', zone: '+05:30' }, 2);
    assert.deepEqual(q, [{ algorithm: 'quota', limit: 3, period: 'day', zone: '+05:30' }, { algorithm: 'quota', limit: 2, period: 'day', zone: '+05:30' }]);
    assert.throws(() => stripeSpecs({ algorithm: 'tokenbucket', capacity: 10, refillCount: 2, refillMs: 1000 }, 3), argError('striped'), 'refillCount 2 over 3');
    assert.throws(() => stripeSpecs({ algorithm: 'fixedwindow', limit: 2, windowMs: 1000 }, 3), argError('striped'));
    assert.throws(() => stripeSpecs({ algorithm: 'leakybucket', capacity: 10, leakCount: 5, leakMs: 1000 }, 2), argError('striped'));
  });

  test('tags: standalone rl0, rl1, rl2; three masters, each stripe on master i mod 3; a re-pick moves only a stripe beyond its master\'s fair share', () => {
    assert.deepEqual(pickTags(SlotMap.standalone(), 3), ['rl0', 'rl1', 'rl2']);
    const reply = [
      [0, 5460, ['127.0.0.1', 7000, 'a']],
      [10923, 16383, ['127.0.0.1', 7002, 'c']],
      [5461, 10922, ['127.0.0.1', 7001, 'b']],
    ];
    const map = SlotMap.fromClusterSlots(reply);
    assert.deepEqual(map.masters, ['a', 'b', 'c'], 'ordered by the lowest slot each owns');
    const tags = pickTags(map, 5);
    const owner = (t) => map.ownerOf(keySlot(t));
    assert.deepEqual(tags.map(owner), [0, 1, 2, 0, 1]);
    assert.equal(new Set(tags).size, 5);
    tags.forEach((t, i) => {
      // the first such tag: no smaller counter on that master is free
      const k = Number(t.slice(2));
      for (let j = 0; j < k; j++) {
        const other = `rl${j}`;
        if (owner(other) === owner(t)) assert.ok(tags.slice(0, i).includes(other), `${other} is on the same master and free before ${t}`);
      }
    });
    // Master b's slots go to c: c holds 3 stripes, no more than ceil(5 / 2): nothing moves.
    const merged = SlotMap.fromClusterSlots([
      [0, 5460, ['127.0.0.1', 7000, 'a']],
      [5461, 16383, ['127.0.0.1', 7002, 'c']],
    ]);
    assert.deepEqual(pickTags(merged, 5, tags), tags);
    // Stripe 1's slot goes to a, which then holds two of three: stripe 1 alone moves, to b (the least loaded).
    const three = pickTags(map, 3);
    const slot = keySlot(three[1]);
    const moved = SlotMap.fromClusterSlots([
      [0, 5460, ['127.0.0.1', 7000, 'a']],
      [slot, slot, ['127.0.0.1', 7000, 'a']],
      [5461, slot - 1, ['127.0.0.1', 7001, 'b']],
      [slot + 1, 10922, ['127.0.0.1', 7001, 'b']],
      [10923, 16383, ['127.0.0.1', 7002, 'c']],
    ]);
    const again = pickTags(moved, 3, three);
    assert.equal(again[0], three[0]);
    assert.equal(again[2], three[2]);
    assert.notEqual(again[1], three[1]);
    assert.deepEqual(again.map((t) => moved.ownerOf(keySlot(t))), [0, 1, 2]);
    assert.deepEqual(pickTags(map, 5, tags), tags, 'the same map keeps every tag');
  });
});

describe('typed UPTO', () => {
  let c;
  let rl;
  before(async () => {
    c = await nodeRedis(server.port);
    rl = new Client(c);
  });
  after(() => c?.destroy());

  // each spec, and its command and parameters as sent
  const specs = {
    tokenbucket: [{ algorithm: 'tokenbucket', capacity: 5, refillCount: 1, refillMs: STILL_MS / 1024 }, ['RL.TOKENBUCKET', '5', '1', String(STILL_MS / 1024)]],
    fixedwindow: [{ algorithm: 'fixedwindow', limit: 5, windowMs: STILL_MS }, ['RL.FIXEDWINDOW', '5', String(STILL_MS)]],
    sliding: [{ algorithm: 'sliding', limit: 5, windowMs: 3_600_000 }, ['RL.SLIDING', '5', '3600000']],
    hashwindow: [{ algorithm: 'hashwindow', limit: 5, windowMs: 3_600_000, bucketMs: 60_000 }, ['RL.HASHWINDOW', '5', '3600000', '60000']],
    quota: [{ algorithm: 'quota', limit: 5, period: 'year' }, ['RL.QUOTA', '5', 'YEAR']],
  };
  for (const [name, [spec, [command, ...params]]] of Object.entries(specs)) {
    test(`${name}: takes all that fits, at most n; then nothing, denied as COST 1; granted is the sixth field`, async () => {
      const key = fresh(name);
      const a = await rl.limit(key, spec, Request.upto(3));
      assert.deepEqual([a.allowed, a.granted, a.remaining, a.limit], [true, 3, 2, 5]);
      const b = await rl.limit(key, spec, Request.upto(3));
      assert.deepEqual([b.allowed, b.granted, b.remaining], [true, 2, 0]);
      const c1 = await rl.limit(key, spec, Request.cost(1));
      const d = await rl.limit(key, spec, Request.upto(4));
      assert.deepEqual([d.allowed, d.granted, d.remaining], [false, 0, 0]);
      assert.equal(c1.granted, null, 'a call without UPTO has no granted');
      assert.ok(d.waitMs > 0 && Math.abs(d.waitMs - c1.waitMs) <= 1000, `UPTO's denial waits as COST 1's (${d.waitMs} vs ${c1.waitMs})`);
      const raw = await c.sendCommand([command, key, ...params, 'UPTO', '1']);
      assert.equal(raw.length, 6, 'the reply has six fields');
      assert.equal(Number(raw[5]), 0);
    });
  }

  test('RL.HIT on a policy and RL.ALL take UPTO; RL.ALL answers granted as its seventh field', async () => {
    await rl.policySet('grants-fw', { algorithm: 'fixedwindow', limit: 4, windowMs: STILL_MS });
    const key = fresh('hit');
    const h = await rl.hit('grants-fw', key, Request.upto(10));
    assert.deepEqual([h.allowed, h.granted, h.remaining, h.lease], [true, 4, 0, null]);
    const k1 = fresh('all');
    const k2 = `${k1}:b`;
    const limits = [
      { key: k1, rule: { algorithm: 'fixedwindow', limit: 10, windowMs: STILL_MS } },
      { key: k2, rule: { algorithm: 'tokenbucket', capacity: 3, refillCount: 1, refillMs: STILL_MS / 1024 } },
    ];
    const all = await rl.all(limits, { upto: 5 });
    assert.deepEqual([all.allowed, all.granted, all.deniedBy], [true, 3, null]);
    const denied = await rl.all(limits, { upto: 5 });
    assert.deepEqual([denied.allowed, denied.granted, denied.deniedBy], [false, 0, 1]);
    const raw = await c.sendCommand(['RL.ALL', '1', k1, 'FIXEDWINDOW', '10', String(STILL_MS), 'UPTO', '2']);
    assert.equal(raw.length, 7);
    assert.equal(Number(raw[6]), 2);
  });

  test('a policy that is off answers allowed with granted n; a shadowed denial allowed with granted 0', async () => {
    await rl.policySet('grants-off', { algorithm: 'fixedwindow', limit: 2, windowMs: STILL_MS }, { mode: 'OFF' });
    const off = await rl.hit('grants-off', fresh('off'), Request.upto(9));
    assert.deepEqual([off.allowed, off.granted], [true, 9]);
    await rl.policySet('grants-shadow', { algorithm: 'fixedwindow', limit: 2, windowMs: STILL_MS }, { mode: 'SHADOW' });
    const key = fresh('shadow');
    const first = await rl.hit('grants-shadow', key, Request.upto(9));
    const second = await rl.hit('grants-shadow', key, Request.upto(9));
    assert.deepEqual([first.allowed, first.granted, second.allowed, second.granted], [true, 2, true, 0]);
  });

  test('errors name UPTO: out of range, with cost, on a leaky bucket or concurrency rule (client side), on a leaky policy (the server)', async () => {
    for (const bad of [0, -1, 2 ** 40 + 1, 1.5, '3']) assert.throws(() => Request.upto(bad), argError('UPTO'), String(bad));
    await assert.rejects(rl.all([{ key: fresh('x'), rule: { algorithm: 'fixedwindow', limit: 1, windowMs: 1000 } }], { cost: 1, upto: 1 }), argError('UPTO'));
    const before = calls(server.port, 'rl.leakybucket');
    await assert.rejects(rl.leakyBucket(fresh('lb'), { capacity: 5, leakCount: 1, leakMs: 100 }, Request.upto(2)), (e) => argError('UPTO')(e) && /not an option of RL\.LEAKYBUCKET/.test(e.message));
    await assert.rejects(rl.concurrency(fresh('cc'), { limit: 5, leaseMs: 1000 }, Request.upto(2)), (e) => argError('UPTO')(e) && /RL\.CONCURRENCY/.test(e.message));
    await assert.rejects(rl.all([{ key: fresh('lb'), rule: { algorithm: 'leakybucket', capacity: 5, leakCount: 1, leakMs: 100 } }], { upto: 2 }), argError('UPTO'));
    assert.equal(calls(server.port, 'rl.leakybucket'), before, 'refused before anything was sent');
    await rl.policySet('grants-lb', { algorithm: 'leakybucket', capacity: 5, leakCount: 1, leakMs: 100 });
    await assert.rejects(rl.hit('grants-lb', fresh('lbp'), Request.upto(2)), (e) => argError('UPTO')(e) && /LEAKYBUCKET/.test(e.message));
  });

  test('every client, standalone and cluster: UPTO through the typed calls and RL.ALL', async () => {
    const spec = { algorithm: 'hashwindow', limit: 4, windowMs: 3_600_000, bucketMs: 60_000 };
    for (const [kinds, where] of [
      [await clientKinds(), server.port],
      [await clusterKinds(), cluster.ports],
    ]) {
      for (const kind of kinds) {
        const client = await kind.make(where);
        try {
          const each = new Client(client);
          const key = fresh(`kind-${kind.name}`);
          const a = await each.limit(key, spec, Request.upto(3));
          const b = await each.all([{ key, rule: spec }], { upto: 3 });
          const none = await each.limit(key, spec, Request.upto(3));
          assert.deepEqual([a.granted, b.granted, b.remaining, none.allowed, none.granted], [3, 1, 0, false, 0], kind.name);
        } finally {
          await kind.close(client);
        }
      }
    }
  });

  test("the local algorithms' UPTO (src/algorithms.ts) take what the server takes", async () => {
    const { BY_WORD, run } = await import('../dist/esm/algorithms.js');
    const { ruleArgs } = await import('../dist/esm/rules.js');
    for (const [name, [spec, [command]]] of Object.entries(specs)) {
      if (name === 'quota') continue; // the local quota runs with its period's end: covered by the contract's sequences
      const key = fresh(`local-${name}`);
      const [word, params] = ruleArgs(spec);
      const algo = BY_WORD[word];
      const p = params.map(BigInt);
      const now = BigInt(Date.now()) * 1000n;
      const state = algo.idle(p, now);
      for (const n of [3, 3, 1, 7]) {
        const server = await rl.limit(key, spec, Request.upto(n));
        const [local] = run(algo, state, p, { kind: 'upto', n: BigInt(n) }, now);
        assert.deepEqual([local.allowed, Number(local.remaining)], [server.allowed, server.remaining], `${command} UPTO ${n}`);
      }
    }
  });

  test('acquire with upto waits for the first unit and says what it took', async () => {
    const key = fresh('acq');
    const spec = { algorithm: 'fixedwindow', limit: 3, windowMs: STILL_MS };
    const d = await rl.acquire(key, spec, { timeoutMs: 100, upto: 5 });
    assert.deepEqual([d.allowed, d.granted], [true, 3]);
    const none = await rl.acquire(key, spec, { timeoutMs: 10, upto: 5 });
    assert.deepEqual([none.allowed, none.granted], [false, 0]);
    rl.close();
  });
});

/** Reads a rule's remaining on the server without taking anything (COST 0). */
const remainingOf = async (rl, key, spec) => (await rl.limit(key, spec, Request.cost(0))).remaining;

describe('batched rules', () => {
  let c;
  let rl;
  before(async () => {
    c = await nodeRedis(server.port);
    rl = new Client(c);
  });
  after(() => c?.destroy());

  test('refused where they do not apply, naming the option', async () => {
    const limiter = new Limiter(rl);
    const tb = { algorithm: 'tokenbucket', capacity: 100, refillCount: 10, refillMs: 1000 };
    await assert.rejects(limiter.ruleSet([{ spec: tb, batched: true }]), argError('batched'), 'not global');
    await assert.rejects(limiter.ruleSet([{ spec: { algorithm: 'leakybucket', capacity: 5, leakCount: 1, leakMs: 10 }, global: true, batched: true }]), argError('batched'));
    await assert.rejects(limiter.ruleSet([{ spec: tb, global: true, batched: 'yes' }]), argError('batched'));
    await assert.rejects(limiter.ruleSet([{ spec: tb, global: true, holdMs: 10 }]), argError('holdMs'), 'holdMs without batched');
    await assert.rejects(limiter.ruleSet([{ spec: tb, global: true, batched: true, holdMs: 0 }]), argError('holdMs'));
    await assert.rejects(limiter.ruleSet([{ spec: tb, global: true, batched: true, holdMs: 60_001 }]), argError('holdMs'));
    await assert.rejects(limiter.ruleSet([{ spec: tb, global: true, batched: true, maxSharePct: 101 }]), argError('maxSharePct'));
    await assert.rejects(limiter.ruleSet([{ spec: tb, global: true, striped: 65 }]), argError('striped'));
    await assert.rejects(limiter.ruleSet([{ spec: tb, global: true, striped: 0 }]), argError('striped'));
    await assert.rejects(limiter.ruleSet([{ spec: { ...tb, refillCount: 2 }, global: true, striped: 3 }]), argError('striped'), 'a share of 0');
    await assert.rejects(limiter.ruleSet([{ spec: tb, global: true, batched: true, name: 'g' }, { spec: tb, name: 'u' }]), argError('batched'), 'not alone');
    const set = await limiter.ruleSet([{ spec: tb, global: true, batched: true, key: fresh('cost') }]);
    await assert.rejects(limiter.check(set, 'x', 2), argError('cost'));
  });

  test('many concurrent callers: never above capacity + refill over the elapsed time, far fewer calls than decisions, held units back at close', async () => {
    const key = fresh('burst');
    const spec = { algorithm: 'tokenbucket', capacity: 50, refillCount: 10, refillMs: 1000 };
    const reg = new Registry();
    // failClosed and a long deadline: a slow shared machine must not turn a late reply into a fallback admission
    const limiter = new Limiter(rl, { metrics: reg, localLevel: false, fallback: 'failClosed', deadlineMs: 10_000 });
    const set = await limiter.ruleSet([{ spec, global: true, batched: true, key, name: 'burst' }]);
    const calls0 = calls(server.port, 'rl.tokenbucket');
    const t0 = serverUs(server.port);
    let admitted = 0;
    let decisions = 0;
    for (let round = 0; round < 40; round++) {
      const ds = await Promise.all(Array.from({ length: 25 }, () => limiter.check(set, 'any')));
      decisions += ds.length;
      admitted += ds.filter((d) => d.allowed).length;
      for (const d of ds) assert.ok(['redis', 'grant'].includes(d.path), d.path);
    }
    const t1 = serverUs(server.port);
    const refill = Number(((t1 - t0) * 10n) / 1_000_000n) + 1;
    assert.ok(admitted <= 50 + refill, `admitted ${admitted} <= 50 + ${refill}`);
    assert.ok(admitted >= 50 - 5, `admitted ${admitted}: at most a batch (5) under the capacity`);
    const sent = calls(server.port, 'rl.tokenbucket') - calls0;
    assert.ok(sent > 0 && sent * 5 <= decisions, `${sent} calls for ${decisions} decisions`);
    assert.equal(sent, limiter.stats().redis_calls, "the kit's own count of its calls");
    const counts = (await reg.getSingleMetric('ratelimit_decisions_total').get()).values;
    const at = (level, outcome) => counts.filter((v) => v.labels.level === level && v.labels.outcome === outcome).reduce((a, v) => a + v.value, 0);
    assert.ok(at('grant', 'admitted') > 0, 'admissions from held units count at level grant');
    assert.ok(at('grant', 'denied') > 0, 'local grant denials count at level grant');
    assert.equal(at('grant', 'admitted') + at('redis', 'admitted'), admitted);
    await limiter.close();
  });

  test('units held go back at close, and after holdMs of idleness', async () => {
    // A bucket that does not refill within the test: what the server has is what was taken.
    const spec = { algorithm: 'tokenbucket', capacity: 100, refillCount: 1, refillMs: 2 ** 40 };
    for (const [holdMs, how] of [
      [60_000, 'close'],
      [200, 'idle'],
    ]) {
      const key = fresh(`hold-${how}`);
      const limiter = new Limiter(rl, { localLevel: false, fallback: 'failClosed', deadlineMs: 10_000 });
      const set = await limiter.ruleSet([{ spec, global: true, batched: true, key, holdMs }]);
      let admitted = 0;
      // until the instance holds units beyond what it admitted (the batch grows with the rate)
      for (let i = 0; i < 60 && (admitted === 0 || (await remainingOf(rl, key, spec)) === 100 - admitted); i++) {
        assert.equal((await limiter.check(set, 'x')).allowed, true);
        admitted++;
      }
      assert.ok((await remainingOf(rl, key, spec)) < 100 - admitted, `${how}: the instance holds units beyond what it admitted`);
      if (how === 'close') await limiter.close();
      await until(async () => (await remainingOf(rl, key, spec)) === 100 - admitted, `${how}: the held units back on the server`);
      // and it still decides afterwards
      assert.equal((await limiter.check(set, 'x')).allowed, true);
      await limiter.close();
    }
  });

  test('a denial is answered locally until the next ask', async () => {
    const key = fresh('deny');
    const spec = { algorithm: 'fixedwindow', limit: 3, windowMs: STILL_MS };
    const limiter = new Limiter(rl, { localLevel: false, fallback: 'failClosed', deadlineMs: 10_000 });
    const set = await limiter.ruleSet([{ spec, global: true, batched: true, key }]);
    const ds = [];
    for (let i = 0; i < 10; i++) ds.push(await limiter.check(set, 'x'));
    assert.equal(ds.filter((d) => d.allowed).length, 3);
    const denied = ds.filter((d) => !d.allowed);
    assert.equal(denied.filter((d) => d.path === 'redis').length, 1, 'one denial from the server');
    assert.ok(denied.filter((d) => d.path === 'grant').length >= 6, 'the others in process');
    assert.ok(denied.every((d) => d.waitMs > 0));
    await limiter.close();
  });

  test('when Redis is away, held units are spent first, then the fallback decides', async () => {
    const own = await startServer();
    const c2 = await nodeRedis(own.port);
    const rl2 = new Client(c2);
    const spec = { algorithm: 'tokenbucket', capacity: 1000, refillCount: 1, refillMs: 2 ** 40 };
    const limiter = new Limiter(rl2, { localLevel: false, fallback: 'failClosed', deadlineMs: 200, breaker: { failures: 1 } });
    const set = await limiter.ruleSet([{ spec, global: true, batched: true, key: fresh('away'), holdMs: 60_000 }]);
    for (let i = 0; i < 30; i++) await limiter.check(set, 'x');
    const held = 1000 - 30 - (await remainingOf(rl2, set.rules[0].keyFor('x'), spec));
    assert.ok(held > 0, 'holds units');
    await own.stop();
    const ds = [];
    for (let i = 0; i < held + 3; i++) ds.push(await limiter.check(set, 'x'));
    assert.deepEqual(ds.slice(0, held).map((d) => [d.allowed, d.path]), Array(held).fill([true, 'grant']));
    assert.ok(ds.slice(held).every((d) => !d.allowed && d.path === 'fallback'), 'then failClosed');
    c2.destroy();
    await limiter.close();
  });
});

/** The cluster's slot map, as a node's CLUSTER SLOTS says. */
async function serverSlotMap(port) {
  const c = await nodeRedis(port);
  try {
    return SlotMap.fromClusterSlots(await c.sendCommand(['CLUSTER', 'SLOTS']));
  } finally {
    c.destroy();
  }
}

describe('striped rules on a 3-master cluster', () => {
  const kinds = [
    {
      name: 'node-redis',
      make: async (ports) => {
        const c = createCluster({ rootNodes: ports.map((p) => ({ url: `redis://127.0.0.1:${p}` })) });
        c.on('error', () => {});
        await c.connect();
        return c;
      },
      close: (c) => c.destroy(),
    },
    {
      name: 'ioredis',
      make: async (ports) => {
        const c = new Cluster(ports.map((p) => ({ host: '127.0.0.1', port: p })));
        c.on('error', () => {});
        await new Promise((resolve, reject) => {
          c.once('ready', resolve);
          c.once('error', reject);
        });
        return c;
      },
      close: (c) => c.disconnect(),
    },
  ];
  for (const kind of kinds) {
    test(`${kind.name}: each stripe on its own master; own stripe then the next; the sum never above the limit`, async () => {
      const c = await kind.make(cluster.ports);
      const rl = new Client(c);
      const key = fresh(`stripes-${kind.name}`);
      const spec = { algorithm: 'fixedwindow', limit: 30, windowMs: STILL_MS };
      const limiter = new Limiter(rl, { localLevel: false, denyCache: false, fallback: 'failClosed', deadlineMs: 10_000 });
      const set = await limiter.ruleSet([{ spec, global: true, striped: 3, key }]);
      const stripes = set.rules[0].stripes;
      const keys = [0, 1, 2].map((i) => stripes.key(i, key));
      // each stripe key's slot, as the server computes it, on a different master
      const slots = keys.map((k) => Number(cli(cluster.ports[0], 'CLUSTER', 'KEYSLOT', k)));
      assert.deepEqual(slots, keys.map((k) => keySlot(k)), 'the kit CRC16 is the server slot');
      const map = await serverSlotMap(cluster.ports[0]);
      const owners = slots.map((s) => map.ownerOf(s));
      assert.deepEqual(owners, [0, 1, 2], 'stripe i on master i (masters ordered by their lowest slot)');
      assert.deepEqual(stripes.tags, pickTags(SlotMap.fromClusterSlots([
        [0, 5460, ['h', 1, 'a']],
        [5461, 10922, ['h', 2, 'b']],
        [10923, 16383, ['h', 3, 'c']],
      ]), 3), 'the tags of the 0-5460 / 5461-10922 / 10923-16383 vector');
      const share = (i) => stripes.specs[i];
      const left = async () => Promise.all([0, 1, 2].map((i) => remainingOf(rl, keys[i], share(i))));

      assert.equal((await limiter.check(set, 'x')).allowed, true);
      const own = (await left()).findIndex((r) => r === 9);
      assert.ok(own >= 0, 'one stripe took the first unit');
      let admitted = 1;
      for (let i = 0; i < 59; i++) if ((await limiter.check(set, 'x')).allowed) admitted++;
      assert.equal(admitted, 20, 'own stripe (10) then the next (10), then both deny');
      const after = await left();
      assert.equal(after[own], 0);
      assert.equal(after[(own + 1) % 3], 0, 'spill-over to the next stripe');
      assert.equal(after[(own + 2) % 3], 10, 'never a third stripe');

      // More instances, 2x the limit in all: the sum stays within the limit.
      const others = [0, 1, 2].map(() => new Limiter(rl, { localLevel: false, fallback: 'failClosed', deadlineMs: 10_000 }));
      for (const l of others) {
        const s = await l.ruleSet([{ spec, global: true, striped: 3, key }]);
        for (let i = 0; i < 14; i++) if ((await l.check(s, 'x')).allowed) admitted++;
      }
      assert.ok(admitted <= 30, `admitted ${admitted} of 30`);
      assert.equal(admitted, 30 - (await left()).reduce((a, b) => a + b, 0), 'every admission counted on a stripe');
      assert.equal(await limiter.refreshStripes(), false, 'the slot map did not change');
      await limiter.close();
      kind.close(c);
    });
  }

  test('batched and striped: batches per stripe key, all back at close, never above the limit', async () => {
    const c = await kinds[1].make(cluster.ports);
    const rl = new Client(c);
    const key = fresh('both');
    const spec = { algorithm: 'tokenbucket', capacity: 300, refillCount: 3, refillMs: 2 ** 40 };
    const limiters = [0, 1].map(() => new Limiter(rl, { localLevel: false, fallback: 'failClosed', deadlineMs: 10_000 }));
    let admitted = 0;
    let stripes;
    for (const l of limiters) {
      const set = await l.ruleSet([{ spec, global: true, striped: 3, batched: true, holdMs: 60_000, maxSharePct: 50, key }]);
      stripes = set.rules[0].stripes;
      for (let round = 0; round < 20; round++) {
        const ds = await Promise.all(Array.from({ length: 20 }, () => l.check(set, 'x')));
        admitted += ds.filter((d) => d.allowed).length;
        assert.ok(ds.every((d) => d.path !== 'fallback'));
      }
    }
    assert.ok(admitted <= 300, `admitted ${admitted}`);
    const left = async () => (await Promise.all([0, 1, 2].map((i) => remainingOf(rl, stripes.key(i, key), stripes.specs[i])))).reduce((a, b) => a + b, 0);
    assert.ok((await left()) <= 300 - admitted);
    await Promise.all(limiters.map((l) => l.close()));
    await until(async () => (await left()) === 300 - admitted, 'every held unit back on its stripe');
    c.disconnect();
  });
});

describe('re-pick when the slot map changes (last on the cluster: it moves a slot)', () => {
  test('ioredis: a MOVED refreshes the slot map, and only the stripe whose master now holds two moves', async () => {
    const c = new Cluster(cluster.ports.map((p) => ({ host: '127.0.0.1', port: p })));
    c.on('error', () => {});
    await new Promise((resolve) => c.once('ready', resolve));
    const limiter = new Limiter(new Client(c), { localLevel: false, fallback: 'failClosed', deadlineMs: 10_000 });
    const key = fresh('repick');
    const set = await limiter.ruleSet([{ spec: { algorithm: 'fixedwindow', limit: 30, windowMs: STILL_MS }, global: true, striped: 3, key }]);
    const stripes = set.rules[0].stripes;
    const before = [...stripes.tags];
    // Stripe 1's slot (no key in it yet) goes from the second master to the first.
    const slot = keySlot(before[1]);
    // The tests above wrote keys there (the same tags): a slot moves empty.
    for (const p of cluster.ports) {
      const keys = cli(p, 'CLUSTER', 'GETKEYSINSLOT', String(slot), '1000').split('\n').filter((k) => k !== '');
      if (keys.length > 0) cli(p, 'DEL', ...keys);
    }
    const first = (await serverSlotMap(cluster.ports[0])).masters[0];
    for (const p of cluster.ports) assert.equal(cli(p, 'CLUSTER', 'SETSLOT', String(slot), 'NODE', first), 'OK');
    await until(async () => (await serverSlotMap(cluster.ports[1])).ownerOf(slot) === 0, 'every node sees the slot moved');
    // A command to the old owner is answered MOVED; ioredis refreshes its map and says so.
    await c.get(`{${before[1]}}probe`).catch(() => {});
    await until(() => stripes.tags[1] !== before[1], 'the stripes re-picked');
    assert.equal(stripes.tags[0], before[0]);
    assert.equal(stripes.tags[2], before[2]);
    const map = await serverSlotMap(cluster.ports[0]);
    assert.deepEqual(stripes.tags.map((t) => map.ownerOf(Number(cli(cluster.ports[0], 'CLUSTER', 'KEYSLOT', t)))), [0, 1, 2], 'one stripe per master again');
    assert.equal((await limiter.check(set, 'x')).allowed, true);
    assert.equal(await limiter.refreshStripes(), false, 'nothing more to move');
    await limiter.close();
    c.disconnect();
  });
});

test('standalone stripes are rl0, rl1, rl2 on the one server', async () => {
  const c = new Redis({ port: server.port, host: '127.0.0.1' });
  const limiter = new Limiter(new Client(c), { localLevel: false });
  const key = fresh('standalone');
  const set = await limiter.ruleSet([{ spec: { algorithm: 'sliding', limit: 7, windowMs: 60_000 }, global: true, striped: 3, key }]);
  assert.deepEqual(set.rules[0].stripes.tags, ['rl0', 'rl1', 'rl2']);
  assert.deepEqual(set.rules[0].stripes.specs.map((s) => s.limit), [3, 2, 2]);
  assert.equal((await limiter.check(set, 'x')).allowed, true);
  const n = [0, 1, 2].map((i) => Number(cli(server.port, 'EXISTS', `{rl${i}}${key}`))).reduce((a, b) => a + b, 0);
  assert.equal(n, 1, 'one stripe key written');
  c.disconnect();
});

test('close() while an ask is in flight gives back the units it brings', async () => {
  const c = await nodeRedis(server.port);
  const rl = new Client(c);
  const key = fresh('close-flight');
  // A bucket that does not refill within the test; holdMs a minute: the first ask takes 60 (a minute of 1/s).
  const spec = { algorithm: 'tokenbucket', capacity: 1000, refillCount: 1, refillMs: 2 ** 40 };
  const limiter = new Limiter(rl, { localLevel: false, fallback: 'failClosed', deadlineMs: 5_000 });
  const set = await limiter.ruleSet([{ spec, global: true, batched: true, key, holdMs: 60_000, maxSharePct: 100 }]);
  // The server holds writes for a while: the ask is in flight when close() comes.
  cli(server.port, 'CLIENT', 'PAUSE', '500', 'WRITE');
  const pending = limiter.check(set, 'x');
  await until(() => [...limiter.grantStates.values()].some((st) => st.inflight !== null), 'the ask in flight');
  await limiter.close();
  assert.equal((await pending).allowed, true);
  // The 59 units the ask brought go back at close, not holdMs (a minute) later.
  await until(async () => (await remainingOf(rl, key, spec)) === 999, 'the units of the ask in flight back at close', 5_000);
  await limiter.close();
  await c.destroy();
});

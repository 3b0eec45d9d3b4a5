// The protection loop's kit side without HTTP: Protection's counters and
// reports, the stage hold, the highest stage and lowest scale across
// masters (two standalone servers, and a cluster's masters on node-redis and
// ioredis), Redis stopping and coming back, the CircuitBreaker, and the
// STATS parser.
import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';
import { createClient, createCluster } from 'redis';
import { Cluster, Redis } from 'ioredis';
import { CircuitBreaker, CircuitOpenError, Client, InvalidArgumentError, parseStats, Protection, PROTECTION_DEFAULTS, ProtocolError } from 'redis-ratelimit';
import { sleep, startCluster, startServer } from './servers.mjs';

/** Polls `check` until it returns a truthy value, at most `ms`; returns it, or fails with `what`. */
async function until(check, what, ms = 8000) {
  const deadline = Date.now() + ms;
  for (;;) {
    const v = await check();
    if (v) return v;
    if (Date.now() > deadline) assert.fail(`not within ${ms} ms: ${what}`);
    await sleep(20);
  }
}

const windowOf = (o = {}) => ['calls', o.calls ?? 0, 'admitted', 0, 'denied', 0, 'ok', o.ok ?? 0, 'errors', o.errors ?? 0, 'deny_permille', 0, 'error_permille', 0];
const statsReply = ({ scale = 100, stage = 0 } = {}) => ['scale', scale, 'stage', stage, 'window_ms', 1000, 'window_end_ms', 1, 'current', windowOf(), 'last', windowOf(), 'adapting', 1];

/** A Transport of one master answering as `answer(args)` says (a value, or a thrown error), recording what was sent. */
function fakeMaster(answer) {
  const sent = [];
  const reply = async (args) => {
    sent.push(args);
    return answer(args);
  };
  return { sent, transport: { call: (_key, args) => reply(args), eachMaster: async (args) => [await reply(args)] } };
}

describe('Protection, unit', () => {
  test('defaults are the contract\'s kits timings', () => {
    assert.deepEqual({ ...PROTECTION_DEFAULTS }, { reportIntervalMs: 1000, stagePollMs: 1000, stageHoldMs: 5000 });
    const m = fakeMaster(() => statsReply());
    const p = new Protection(m.transport, ['a']);
    assert.deepEqual([p.reportIntervalMs, p.stagePollMs, p.stageHoldMs], [1000, 1000, 5000]);
    return p.close();
  });

  test('record counts in memory; a report sends RL.OUTCOME once per policy with counts, then forgets them', async () => {
    const m = fakeMaster((args) => (args[0] === 'RL.OUTCOME' ? statsReply() : statsReply()));
    const p = new Protection(m.transport, ['a', 'b', 'idle'], { reportIntervalMs: 60_000, stagePollMs: 60_000, stageHoldMs: 120_000 });
    for (let i = 0; i < 7; i++) p.record('a', false);
    p.record('a', true);
    p.record('b', true);
    p.record('new', false); // watched on first use
    assert.deepEqual(p.pending('a'), { ok: 7, errors: 1, denied: 0 });
    assert.equal(m.sent.filter((a) => a[0] === 'RL.OUTCOME').length, 0, 'nothing is sent on record');
    await p.flush();
    const outcomes = m.sent.filter((a) => a[0] === 'RL.OUTCOME').sort();
    assert.deepEqual(outcomes, [
      ['RL.OUTCOME', 'a', '7', '1'],
      ['RL.OUTCOME', 'b', '0', '1'],
      ['RL.OUTCOME', 'new', '1', '0'],
    ]);
    assert.deepEqual(p.pending('a'), { ok: 0, errors: 0, denied: 0 });
    await p.flush();
    assert.equal(m.sent.filter((a) => a[0] === 'RL.OUTCOME').length, 3, 'no counts, no report');
    assert.equal(p.counters().reportsSent, 3);
    await p.close();
  });

  test('a failed report loses its counts: never sent again', async () => {
    let up = false;
    const m = fakeMaster((args) => {
      if (!up) throw new Error('connection refused');
      return statsReply();
    });
    const p = new Protection(m.transport, ['a'], { reportIntervalMs: 60_000, stagePollMs: 60_000, stageHoldMs: 120_000 });
    p.record('a', true);
    p.record('a', false);
    await p.flush();
    assert.equal(p.counters().outcomesLost, 2);
    assert.equal(p.counters().reportsFailed, 1);
    up = true;
    p.record('a', false);
    await p.flush();
    const outcomes = m.sent.filter((a) => a[0] === 'RL.OUTCOME');
    assert.deepEqual(outcomes.at(-1), ['RL.OUTCOME', 'a', '1', '0'], 'only the new count');
    await p.close();
  });

  test('a report waiting for Redis makes the next wait: one round in flight at most; what a skipped tick held is lost, not sent late in one lump', async () => {
    let release;
    const hang = new Promise((r) => (release = r));
    const m = fakeMaster(async (args) => {
      if (args[0] === 'RL.OUTCOME') await hang;
      return statsReply();
    });
    const p = new Protection(m.transport, ['a'], { reportIntervalMs: 10, stagePollMs: 60_000, stageHoldMs: 120_000 });
    p.record('a', false);
    await until(() => m.sent.some((a) => a[0] === 'RL.OUTCOME'), 'the first report');
    for (let i = 0; i < 50; i++) {
      p.record('a', true);
      p.recordDenied('a');
      await sleep(2);
    }
    await sleep(50);
    assert.equal(m.sent.filter((a) => a[0] === 'RL.OUTCOME').length, 1, 'no second send while the first waits');
    // Each tick the round was still waiting dropped what it held: no count
    // piles up over an outage to land in one later window.
    assert.deepEqual(p.pending('a'), { ok: 0, errors: 0, denied: 0 }, 'nothing recorded before the last tick is held');
    assert.equal(p.counters().outcomesLost, 50);
    assert.equal(p.counters().deniedLost, 50);
    release();
    await until(() => p.counters().reportsSent === 1, 'the first round settled');
    p.record('a', true);
    p.recordDenied('a', 2);
    await until(() => m.sent.filter((a) => a[0] === 'RL.OUTCOME').length === 2, 'the next report once the first settled');
    assert.deepEqual(m.sent.filter((a) => a[0] === 'RL.OUTCOME')[1], ['RL.OUTCOME', 'a', '0', '1', 'DENIED', '2'], 'only what came after the last skipped tick');
    await p.close();
  });

  test('recordDenied: sent as DENIED n with the outcomes, the plain form without, and lost with a failed send', async () => {
    let up = true;
    const m = fakeMaster((args) => {
      if (!up) throw new Error('connection refused');
      return statsReply();
    });
    const p = new Protection(m.transport, ['a', 'b', 'c'], { reportIntervalMs: 60_000, stagePollMs: 60_000, stageHoldMs: 120_000 });
    p.record('a', false);
    p.recordDenied('b', 3);
    p.recordDenied('b');
    p.record('c', true);
    p.recordDenied('c', 0);
    p.recordDenied('new'); // watched on first use
    assert.deepEqual(p.pending('b'), { ok: 0, errors: 0, denied: 4 });
    assert.equal(m.sent.filter((a) => a[0] === 'RL.OUTCOME').length, 0, 'nothing is sent on recordDenied');
    await p.flush();
    assert.deepEqual(m.sent.filter((a) => a[0] === 'RL.OUTCOME').sort(), [
      ['RL.OUTCOME', 'a', '1', '0'],
      ['RL.OUTCOME', 'b', '0', '0', 'DENIED', '4'],
      ['RL.OUTCOME', 'c', '0', '1'],
      ['RL.OUTCOME', 'new', '0', '0', 'DENIED', '1'],
    ]);
    assert.deepEqual(p.pending('b'), { ok: 0, errors: 0, denied: 0 });
    up = false;
    p.recordDenied('b', 5);
    p.record('b', false);
    await p.flush();
    assert.equal(p.counters().deniedLost, 5);
    assert.equal(p.counters().outcomesLost, 1);
    up = true;
    p.recordDenied('b');
    await p.flush();
    assert.deepEqual(m.sent.filter((a) => a[0] === 'RL.OUTCOME').at(-1), ['RL.OUTCOME', 'b', '0', '0', 'DENIED', '1'], 'the lost counts are not sent again');
    assert.throws(() => p.recordDenied('b', -1), (e) => e instanceof InvalidArgumentError && e.argument === 'n');
    assert.throws(() => p.recordDenied('b', 1.5), (e) => e instanceof InvalidArgumentError && e.argument === 'n');
    await p.close();
  });

  test('close releases the breakers it forced open: the loop that would release them stops', async () => {
    const m = fakeMaster(() => statsReply({ stage: 2 }));
    const p = new Protection(m.transport, ['a'], { stagePollMs: 20, breakers: { downstream: ['a'] } });
    await until(() => p.breaker('downstream').state === 'forcedOpen', 'stage 2 opens the breaker');
    await p.close();
    assert.equal(p.breaker('downstream').state, 'closed', 'no poll will ever release it after close');
    await sleep(60);
    assert.equal(p.breaker('downstream').state, 'closed', 'a poll settling after close does not force it open again');
  });

  test('stage hold: the last stage read is kept for stageHoldMs without an answer, then 0; the breaker follows', async () => {
    let stage = 2;
    let up = true;
    const m = fakeMaster(() => {
      if (!up) throw new Error('connection lost');
      return statsReply({ stage, scale: 70 });
    });
    const p = new Protection(m.transport, ['a'], { stagePollMs: 20, stageHoldMs: 400, breakers: { downstream: ['a'] } });
    await until(() => p.stage('a') === 2, 'stage 2 read');
    assert.equal(p.scale('a'), 70);
    assert.equal(p.breaker('downstream').state, 'forcedOpen');
    up = false;
    const lost = performance.now();
    await until(() => p.stage('a') === 0, 'stage back to 0 after the hold', 3000);
    const held = performance.now() - lost;
    assert.ok(held >= 350, `stage 2 was held ${held} ms, at least the hold`);
    assert.equal(p.scale('a'), 100, 'a stale scale is not kept either');
    await until(() => p.breaker('downstream').state === 'closed', 'the breaker released');
    up = true;
    stage = 1;
    await until(() => p.stage('a') === 1, 'read again');
    assert.equal(p.breaker('downstream').state, 'closed', 'stage 1 does not open it');
    await p.close();
  });

  test('highest stage and lowest scale win across masters; a master that fails does not hide the others', async () => {
    const m1 = fakeMaster(() => statsReply({ stage: 1, scale: 90 }));
    const m2 = fakeMaster(() => statsReply({ stage: 2, scale: 100 }));
    const m3 = fakeMaster(() => {
      throw new Error('down');
    });
    const p = new Protection([m1.transport, m2.transport, m3.transport], ['a'], { stagePollMs: 20 });
    await until(() => p.stage('a') === 2, 'stage 2 from the second master');
    assert.equal(p.scale('a'), 90);
    assert.equal(p.stats('a').length, 2);
    assert.ok(p.counters().pollsFailed >= 1);
    await p.close();
  });

  test('a master that hangs does not hide the others: their stages are read, their reports sent, and the hung one gets no queue', async () => {
    const live = fakeMaster(() => statsReply({ stage: 2, scale: 70 }));
    const hung = fakeMaster(() => new Promise(() => {}));
    const p = new Protection([live.transport, hung.transport], ['a'], { reportIntervalMs: 20, stagePollMs: 20, stageHoldMs: 200, breakers: { downstream: ['a'] } });
    try {
      await until(() => p.stage('a') === 2, 'stage 2 from the live master');
      assert.equal(p.scale('a'), 70);
      for (let i = 0; i < 5; i++) {
        p.record('a', false);
        p.recordDenied('a');
        await until(() => live.sent.filter((x) => x[0] === 'RL.OUTCOME').length > i, `report ${i + 1} on the live master`);
      }
      await sleep(300); // past the hold: the live master keeps answering
      assert.equal(p.stage('a'), 2, 'the live master\'s stage, read every poll');
      assert.equal(p.breaker('downstream').state, 'forcedOpen');
      assert.equal(hung.sent.filter((x) => x[0] === 'RL.OUTCOME').length, 1, 'one report waits on the hung master, no more');
      assert.equal(hung.sent.filter((x) => x[0] === 'RL.POLICY').length, 1, 'one stage read waits on the hung master, no more');
      assert.ok(p.counters().inFlight <= 2, `in flight: ${p.counters().inFlight}`);
      p.record('a', true);
      const reports = live.sent.filter((x) => x[0] === 'RL.OUTCOME').length;
      // close's timers are unref'd and the hung master holds no socket: keep the test's loop alive meanwhile.
      const alive = setInterval(() => {}, 1000);
      await p.close();
      clearInterval(alive);
      assert.deepEqual(live.sent.filter((x) => x[0] === 'RL.OUTCOME').slice(reports).at(-1), ['RL.OUTCOME', 'a', '0', '1'], 'close sends the last counts to the live master');
    } finally {
      await p.close();
    }
  });

  test('options are checked, naming the option', () => {
    const m = fakeMaster(() => statsReply());
    assert.throws(() => new Protection(m.transport, ['a'], { stagePollMs: 0 }), (e) => e instanceof InvalidArgumentError && e.argument === 'stagePollMs');
    assert.throws(() => new Protection(m.transport, ['a'], { stagePollMs: 5000 }), (e) => e instanceof InvalidArgumentError && e.argument === 'stageHoldMs');
    assert.throws(() => new Protection(m.transport, ['a'], { stagePollMs: 100, stageHoldMs: 100 }), (e) => e instanceof InvalidArgumentError && e.argument === 'stageHoldMs');
    assert.throws(() => new Protection(m.transport, ['a'], { reportIntervalMs: 'x' }), (e) => e instanceof InvalidArgumentError && e.argument === 'reportIntervalMs');
    assert.throws(() => new Protection(m.transport, [''], {}), (e) => e instanceof InvalidArgumentError && e.argument === 'policy');
    assert.throws(() => new Protection([], ['a']), (e) => e instanceof InvalidArgumentError && e.argument === 'client');
  });
});

describe('CircuitBreaker', () => {
  test('opens after consecutive failures, lets one trial through after openForMs, closes on its success', async () => {
    const b = new CircuitBreaker('db', { failures: 3, openForMs: 100 });
    assert.equal(b.state, 'closed');
    b.failure();
    b.failure();
    b.success();
    b.failure();
    b.failure();
    assert.equal(b.state, 'closed', 'a success starts the count again');
    b.failure();
    assert.equal(b.state, 'open');
    await assert.rejects(
      b.call(() => 'never'),
      (e) => e instanceof CircuitOpenError && e.breaker === 'db' && e.state === 'open',
    );
    await sleep(120);
    assert.equal(b.allow(), true, 'the trial');
    assert.equal(b.allow(), false, 'one trial at a time');
    b.failure();
    assert.equal(b.state, 'open', 'a failed trial opens it again');
    await sleep(120);
    assert.equal(await b.call(() => 42), 42);
    assert.equal(b.state, 'closed');
  });

  test('a call that started before the breaker opened does not close it when it succeeds late', async () => {
    const b = new CircuitBreaker('db', { failures: 2, openForMs: 60_000 });
    let finish;
    const slow = b.call(() => new Promise((r) => (finish = r)));
    b.failure();
    b.failure();
    assert.equal(b.state, 'open');
    finish('late');
    assert.equal(await slow, 'late');
    assert.equal(b.state, 'open', 'only the trial call closes an open breaker');
    assert.equal(b.allow(), false);
  });

  test('forced open refuses every call until released, whatever the calls say', async () => {
    const b = new CircuitBreaker('db');
    b.forceOpen();
    assert.equal(b.state, 'forcedOpen');
    b.success();
    assert.equal(b.state, 'forcedOpen');
    assert.equal(b.allow(), false);
    await assert.rejects(b.call(() => 1), (e) => e instanceof CircuitOpenError && e.state === 'forcedOpen');
    b.release();
    assert.equal(b.state, 'closed');
    assert.equal(await b.call(async () => 'ok'), 'ok');
    await assert.rejects(b.call(() => Promise.reject(new Error('boom'))), /boom/);
  });
});

describe('parseStats', () => {
  test('takes exactly the fields, in order, RESP2 or RESP3', () => {
    const s = parseStats(['scale', 80, 'stage', 1, 'window_ms', 1000, 'window_end_ms', 5, 'current', windowOf({ ok: 3, errors: 1 }), 'last', windowOf({ calls: 9 }), 'adapting', 1]);
    assert.equal(s.scale, 80);
    assert.equal(s.stage, 1);
    assert.equal(s.current.ok, 3);
    assert.equal(s.last.calls, 9);
    assert.equal(s.adapting, true);
    const asMap = new Map([...Array(7).keys()].map((i) => [statsReply()[2 * i], statsReply()[2 * i + 1]]));
    assert.equal(parseStats(asMap).scale, 100);
    assert.throws(() => parseStats(statsReply().slice(0, -2)), ProtocolError);
    assert.throws(() => parseStats(['stage', 0, 'scale', 100, ...statsReply().slice(4)]), ProtocolError);
    assert.throws(() => parseStats(statsReply({ stage: 3 })), ProtocolError);
  });
});

describe('Protection on real servers', () => {
  let a;
  let b;
  let ca;
  let cb;
  before(async () => {
    a = await startServer();
    b = await startServer();
    ca = await createClient({ url: a.url }).on('error', () => {}).connect();
    cb = new Redis({ port: b.port, host: '127.0.0.1' });
    cb.on('error', () => {});
  });
  after(async () => {
    ca?.destroy();
    cb?.disconnect();
    await a?.stop();
    await b?.stop();
  });

  test('two standalone servers are two masters: reports reach both, the highest stage and lowest scale win', async () => {
    const spec = { algorithm: 'fixedwindow', limit: 1, windowMs: 2 ** 40 };
    for (const c of [ca, cb]) await new Client(c).policySet('two', spec, { stages: { degrade: 30, break: 50 }, windowMs: 300 });
    const p = new Protection([ca, cb], ['two'], { reportIntervalMs: 50, stagePollMs: 50 });
    p.record('two', false);
    p.record('two', false);
    p.record('two', true);
    await until(async () => {
      const [sa, sb] = await Promise.all([new Client(ca).policyStats('two'), new Client(cb).policyStats('two')]);
      const seen = (s) => s.current.ok + s.last.ok === 2 && s.current.errors + s.last.errors === 1;
      return seen(sa) && seen(sb);
    }, 'the outcomes on both masters');
    // B alone floods: 1 admitted, 3 denied in a window -> stage 2 there; A stays at 0.
    const rb = new Client(cb);
    for (let i = 0; i < 4; i++) await rb.hit('two', 'k');
    await new Client(ca).policyScale('two', 60);
    await until(() => p.stage('two') === 2 && p.scale('two') === 60, 'stage 2 (from B) and scale 60 (from A)');
    const stages = p.stats('two').map((s) => s.stage).sort();
    assert.equal(stages.at(-1), 2);
    await p.close();
  });

  test('Redis stopped: record stays in memory, at most one round in flight; restarted: reports resume', async () => {
    const s = await startServer();
    const c = await createClient({ url: s.url }).on('error', () => {}).connect();
    const spec = { algorithm: 'tokenbucket', capacity: 100, refillCount: 100, refillMs: 1000 };
    await new Client(c).policySet('down', spec, { stages: { degrade: 30, break: 50 }, windowMs: 60_000 });
    const p = new Protection(c, ['down'], { reportIntervalMs: 30, stagePollMs: 30, stageHoldMs: 300 });
    try {
      p.record('down', false);
      await until(async () => (await new Client(c).policyStats('down')).current.ok === 1, 'first report');
      await s.stop();
      for (let i = 0; i < 40; i++) {
        p.record('down', i % 2 === 0);
        await sleep(10);
        assert.ok(p.counters().inFlight <= 2, `rounds in flight: ${p.counters().inFlight}`);
      }
      const restarted = await startServer({ port: s.port });
      try {
        await until(() => c.isReady, 'node-redis reconnected', 10_000);
        await new Client(c).policySet('down', spec, { stages: { degrade: 30, break: 50 }, windowMs: 60_000 });
        const sent = p.counters().reportsSent;
        p.record('down', true);
        await until(async () => p.counters().reportsSent > sent && (await new Client(c).policyStats('down')).current.errors >= 1, 'reports resumed', 10_000);
      } finally {
        await restarted.stop();
      }
    } finally {
      await p.close();
      c.destroy();
    }
  });
});

describe('Protection on a cluster: every master', () => {
  let cluster;
  before(async () => {
    cluster = await startCluster();
  });
  after(async () => {
    await cluster?.stop();
  });

  for (const [name, make, close] of [
    ['node-redis', async (ports) => createCluster({ rootNodes: ports.map((p) => ({ url: `redis://127.0.0.1:${p}` })) }).on('error', () => {}).connect(), (c) => c.destroy()],
    [
      'ioredis',
      async (ports) => {
        const c = new Cluster(ports.map((p) => ({ host: '127.0.0.1', port: p })));
        c.on('error', () => {});
        await new Promise((resolve, reject) => c.once('ready', resolve).once('error', reject));
        return c;
      },
      (c) => c.disconnect(),
    ],
  ]) {
    test(`${name}: RL.OUTCOME reaches each master, RL.POLICY STATS is read from each`, async () => {
      const c = await make(cluster.ports);
      const policy = `cl-${name}`;
      try {
        await new Client(c).policySet(policy, { algorithm: 'tokenbucket', capacity: 10, refillCount: 10, refillMs: 1000 }, { stages: { degrade: 30, break: 50 }, windowMs: 60_000 });
        const p = new Protection(c, [policy], { reportIntervalMs: 30, stagePollMs: 30 });
        for (let i = 0; i < 5; i++) p.record(policy, i === 0);
        await until(() => p.stats(policy).length === 3 && p.stats(policy).every((s) => s.current.ok === 4 && s.current.errors === 1), 'the counts on all three masters');
        await p.close();
      } finally {
        close(c);
      }
    });
  }
});

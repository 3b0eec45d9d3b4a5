// RL.QUOTA: calendar quotas as typed calls, rules for policies, RL.ALL and acquire,
// and RLStore's calendar windows, against real servers (standalone and cluster).
import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';
import express from 'express';
import { rateLimit } from 'express-rate-limit';
import { createClient } from 'redis';
import { PERIOD_SECONDS, Client, InvalidArgumentError, RLStore } from 'redis-ratelimit';
import { clientKinds, clusterKinds, rejectsAtOnce, startCluster, startServer } from './servers.mjs';

let server;
let cluster;
before(async () => {
  [server, cluster] = await Promise.all([startServer(), startCluster()]);
});
after(async () => {
  await Promise.all([server?.stop(), cluster?.stop()]);
});

const DAY = 86_400_000;

/** The end (epoch ms) of the period holding `now` at a fixed UTC offset of `offsetMin` minutes. */
function periodEnd(now, period, offsetMin = 0) {
  const local = new Date(now + offsetMin * 60_000);
  const [y, m, d] = [local.getUTCFullYear(), local.getUTCMonth(), local.getUTCDate()];
  let end;
  if (period === 'day') end = Date.UTC(y, m, d + 1);
  else if (period === 'week') end = Date.UTC(y, m, d + 7 - ((local.getUTCDay() + 6) % 7));
  else if (period === 'month') end = Date.UTC(y, m + 1, 1);
  else end = Date.UTC(y + 1, 0, 1);
  return end - offsetMin * 60_000;
}

/** A zone's offset from UTC now, in minutes, as Intl knows it. */
function offsetOf(zone, now) {
  const name = new Intl.DateTimeFormat('en-US', { timeZone: zone, timeZoneName: 'longOffset' })
    .formatToParts(new Date(now))
    .find((p) => p.type === 'timeZoneName').value;
  const m = /GMT([+-])(\d{2}):(\d{2})/.exec(name);
  return m ? (m[1] === '-' ? -1 : 1) * (Number(m[2]) * 60 + Number(m[3])) : 0;
}

/** A zone's offset in minutes at `now`: UTC, a fixed offset (`+05:30`) or an IANA name. */
function offsetMin(zone, now) {
  if (zone === undefined || /^utc$/i.test(zone)) return 0;
  if (/^[+-]/.test(zone)) return (zone[0] === '-' ? -1 : 1) * (Number(zone.slice(1, 3)) * 60 + Number(zone.slice(4)));
  return offsetOf(zone, now);
}

/**
 * Runs `body`; if it failed while one of the periods it counts in (pairs of
 * a period and a zone) ended during the run, runs it once more, on its fresh
 * keys: a quota read across calls must not depend on where the wall clock
 * is, and no second period ends within one test's run.
 */
async function inOnePeriod(periods, body) {
  const ends = () => periods.map(([period, zone]) => periodEnd(Date.now(), period, offsetMin(zone, Date.now()))).join();
  const before = ends();
  try {
    return await body();
  } catch (err) {
    if (ends() === before) throw err;
    return body();
  }
}

const EVERY_PERIOD = ['day', 'week', 'month', 'year'].flatMap((p) => [undefined, '+05:30', '-09:00', 'America/New_York', 'Asia/Kolkata'].map((z) => [p, z]));

const near = (actual, expected, what, slack = 5000) =>
  assert.ok(Math.abs(actual - expected) <= slack, `${what}: ${actual} ms, expected about ${expected} ms`);

for (const kind of await clientKinds()) {
  describe(`RL.QUOTA on ${kind.name}`, () => {
    let client;
    let rl;
    const k = (name) => `q:${kind.name}:${name}:${Math.random()}`;
    before(async () => {
      client = await kind.make(server.port);
      rl = new Client(client);
    });
    after(() => {
      rl.close();
      kind.close(client);
    });

    test('a daily quota admits its limit, then denies until the next UTC day', () =>
      inOnePeriod([['day']], async () => {
        const key = k('day');
        for (let i = 0; i < 3; i++) {
          const d = await rl.quota(key, { limit: 3, period: 'day' });
          assert.deepEqual([d.allowed, d.limit, d.remaining], [true, 3, 2 - i]);
          near(d.resetMs, periodEnd(Date.now(), 'day') - Date.now(), 'reset_ms: the end of the day');
        }
        const no = await rl.quota(key, { limit: 3, period: 'day' });
        assert.equal(no.allowed, false);
        near(no.waitMs, periodEnd(Date.now(), 'day') - Date.now(), 'wait_ms: the next day');
        assert.equal(no.retryAfterS, Math.ceil(no.waitMs / 1000));
        assert.equal((await rl.quota(key, { limit: 3, period: 'day' }, { cost: 4 })).never, true);
        assert.equal((await rl.quota(key, { limit: 3, period: 'day', zone: 'UTC' }, { refund: 1 })).remaining, 1);
        assert.equal((await rl.limit(key, { algorithm: 'quota', limit: 3, period: 'day' })).allowed, true);
        assert.equal((await rl.quota(key, { limit: 3, period: 'day' }, { cost: 0 })).remaining, 0);
      }),
    );

    test('every period ends where the calendar ends it, in UTC, fixed offsets and IANA zones', () =>
      inOnePeriod(EVERY_PERIOD, async () => {
        for (const period of ['day', 'week', 'month', 'year']) {
          for (const zone of [undefined, '+05:30', '-09:00', 'America/New_York', 'Asia/Kolkata']) {
            const now = Date.now();
            const offset =
              zone === undefined ? 0 : /^[+-]/.test(zone) ? (zone[0] === '-' ? -1 : 1) * (Number(zone.slice(1, 3)) * 60 + Number(zone.slice(4))) : offsetOf(zone, now);
            const d = await rl.quota(k('p'), { limit: 10, period, ...(zone ? { zone } : {}) });
            assert.equal(d.allowed, true);
            // A daylight-saving change before the period ends moves it by an hour.
            near(d.resetMs, periodEnd(now, period, offset) - now, `${period} in ${zone ?? 'UTC'}`, zone?.includes('/') ? 3_600_000 + 5000 : 5000);
          }
        }
      }),
    );

    test('bad arguments name the argument before anything is sent; an unknown zone is the server’s TZ error', async () => {
      const key = k('bad');
      const cases = [
        [() => rl.quota(key, { limit: 0, period: 'day' }), 'limit'],
        [() => rl.quota(key, { limit: 1.5, period: 'day' }), 'limit'],
        [() => rl.quota(key, { limit: 5, period: 'fortnight' }), 'period'],
        [() => rl.quota(key, { limit: 5 }), 'period'],
        [() => rl.quota(key, { limit: 5, period: 'day', zone: 'Mars Olympus' }), 'zone'],
        [() => rl.quota(key, { limit: 5, period: 'day', zone: '+26:00' }), 'zone'],
        [() => rl.quota(key, { limit: 5, period: 'day', zone: '+8' }), 'zone'],
        [() => rl.quota(key, { limit: 5, period: 'day', zone: '../etc/passwd' }), 'zone'],
        [() => rl.quota(key, { limit: 5, period: 'day', zone: 'EST5EDT,M3.2.0,M11.1.0' }), 'zone'],
        [() => rl.quota(key, { limit: 5, period: 'day', zone: 5 }), 'zone'],
        [() => rl.quota(key, { limit: 5, period: 'day' }, { cost: -1 }), 'cost'],
      ];
      for (const [call, argument] of cases) {
        await rejectsAtOnce(call, (e) => e instanceof InvalidArgumentError && e.argument === argument, argument);
      }
      assert.equal((await rl.quota(key, { limit: 5, period: 'DAY' })).allowed, true, 'any case');
      await assert.rejects(rl.quota(key, { limit: 5, period: 'day', zone: 'Mars/Olympus' }),
        (e) => e instanceof InvalidArgumentError && e.argument === 'TZ' && /TZ must be UTC/.test(e.message));
    });

    test('a quota policy is hit and read back', () =>
      inOnePeriod([['month']], async () => {
        const name = `quota:${kind.name.replace(/ /g, '_')}`;
        await rl.policySet(name, { algorithm: 'quota', limit: 2, period: 'month' });
        const got = await rl.policyGet(name);
        assert.equal(String(got.algorithm).toUpperCase(), 'QUOTA');
        assert.deepEqual(got.params.map(String), ['2', 'MONTH']);
        assert.equal(String(got.zone), 'UTC');
        const key = k('hit');
        assert.equal((await rl.hit(name, key)).remaining, 1);
        assert.equal((await rl.hit(name, key)).remaining, 0);
        const no = await rl.hit(name, key);
        assert.equal(no.allowed, false);
        near(no.waitMs, periodEnd(Date.now(), 'month') - Date.now(), 'until the next month');
        assert.equal(await rl.policyDel(name), true);
      }),
    );

    test('a zoned quota policy is read back with its zone and counts in it through RL.HIT and RL.ALL', () =>
      inOnePeriod([['day', 'America/New_York'], ['day'], ['week', '+05:30']], async () => {
        const name = `quota-ny:${kind.name.replace(/ /g, '_')}`;
        const zone = 'America/New_York';
        await rl.policySet(name, { algorithm: 'quota', limit: 2, period: 'day', zone });
        const got = await rl.policyGet(name);
        assert.deepEqual(got.params.map(String), ['2', 'DAY']);
        assert.equal(String(got.zone), zone);
        assert.equal(String(got.mode).toUpperCase(), 'ENFORCE');
        const nyEnd = () => periodEnd(Date.now(), 'day', offsetOf(zone, Date.now())) - Date.now();
        const key = k('ny');
        const first = await rl.hit(name, key);
        assert.equal(first.allowed, true);
        near(first.resetMs, nyEnd(), 'RL.HIT counts the New York day');
        assert.equal((await rl.hit(name, key)).allowed, true);
        const no = await rl.hit(name, key);
        assert.equal(no.allowed, false);
        near(no.waitMs, nyEnd(), 'until midnight in New York');

        // RL.ALL with { policy } counts in its zone, beside an inline UTC quota.
        const limits = [
          { key: k('ny:all:a'), rule: { algorithm: 'quota', limit: 10, period: 'day' } },
          { key: k('ny:all:b'), rule: { policy: name } },
        ];
        assert.equal((await rl.all(limits)).allowed, true);
        assert.equal((await rl.all(limits)).allowed, true);
        const denied = await rl.all(limits);
        assert.deepEqual([denied.allowed, denied.deniedBy], [false, 1]);
        near(denied.waitMs, nyEnd(), 'RL.ALL waits for the New York day');
        assert.equal((await rl.quota(limits[0].key, { limit: 10, period: 'day' }, { cost: 0 })).remaining, 8, 'the denial changed nothing');

        // The mode and roll-out go with the zone; a fixed offset; UTC is sent without TZ.
        await rl.policySet(name, { algorithm: 'quota', limit: 5, period: 'week', zone: '+05:30' }, { mode: 'SHADOW', rollout: 40 });
        const shadow = await rl.policyGet(name);
        assert.deepEqual([String(shadow.zone), String(shadow.mode).toUpperCase(), Number(shadow.rollout)], ['+05:30', 'SHADOW', 40]);
        near((await rl.hit(name, k('ist'))).resetMs, periodEnd(Date.now(), 'week', 330) - Date.now(), 'the week in +05:30');
        await rl.policySet(name, { algorithm: 'quota', limit: 5, period: 'week', zone: 'utc' });
        assert.equal(String((await rl.policyGet(name)).zone), 'UTC');
        assert.equal(await rl.policyDel(name), true);
      }),
    );

    test('RL.ALL and acquire take quotas', () =>
      inOnePeriod([['year'], ['day', 'Europe/Paris']], async () => {
        const limits = [
          { key: k('all:a'), rule: { algorithm: 'sliding', limit: 10, windowMs: 60_000 } },
          { key: k('all:b'), rule: { algorithm: 'quota', limit: 1, period: 'year' } },
        ];
        assert.equal((await rl.all(limits)).allowed, true);
        const no = await rl.all(limits);
        assert.deepEqual([no.allowed, no.deniedBy], [false, 1]);
        await rejectsAtOnce(() => rl.all([limits[0], { key: k('all:c'), rule: { algorithm: 'quota', limit: 1, period: 'day', zone: 'Europe/Paris' } }]),
          (e) => e instanceof InvalidArgumentError && e.argument === 'limits[1].rule.zone');
        const key = k('acq');
        const rule = { algorithm: 'quota', limit: 1, period: 'day', zone: 'Europe/Paris' };
        assert.equal((await rl.acquire(key, rule, { timeoutMs: 200 })).allowed, true);
        const started = Date.now();
        const denied = await rl.acquire(key, rule, { timeoutMs: 200 });
        assert.equal(denied.allowed, false);
        assert.ok(Date.now() - started < 2000, 'answered at the timeout, not the next day');
      }),
    );
  });
}

for (const kind of await clusterKinds()) {
  describe(`RL.QUOTA on ${kind.name}`, () => {
    test('calls go to the key’s owner; a quota policy is on every master', () =>
      inOnePeriod([['week', '+09:00'], ['day'], ['day', 'Asia/Tokyo']], async () => {
        const client = await kind.make(cluster.ports);
        const rl = new Client(client);
        try {
          for (let i = 0; i < 20; i++) {
            assert.equal((await rl.quota(`q:cl:${kind.name}:${i}:${Math.random()}`, { limit: 1, period: 'week', zone: '+09:00' })).allowed, true);
          }
          const name = `quota:cl:${kind.name.replace(/ /g, '_')}`;
          await rl.policySet(name, { algorithm: 'quota', limit: 1, period: 'day' });
          for (let i = 0; i < 20; i++) assert.equal((await rl.hit(name, `q:clh:${kind.name}:${i}:${Math.random()}`)).allowed, true);
          const tag = `{q:${Math.random()}}`;
          const d = await rl.all([
            { key: `${tag}:a`, rule: { algorithm: 'quota', limit: 1, period: 'day' } },
            { key: `${tag}:b`, rule: { policy: name } },
          ]);
          assert.equal(d.allowed, true);
          await rl.policyDel(name);

          // A zoned quota policy is on every master, with its zone: every key counts the Tokyo day.
          const tokyo = `quota-tokyo:cl:${kind.name.replace(/ /g, '_')}`;
          await rl.policySet(tokyo, { algorithm: 'quota', limit: 1, period: 'day', zone: 'Asia/Tokyo' });
          const tokyoEnd = () => periodEnd(Date.now(), 'day', 540) - Date.now();
          for (let i = 0; i < 20; i++) {
            const hit = await rl.hit(tokyo, `q:clt:${kind.name}:${i}:${Math.random()}`);
            assert.equal(hit.allowed, true);
            near(hit.resetMs, tokyoEnd(), 'the Tokyo day on every master');
          }
          const ttag = `{qt:${Math.random()}}`;
          const both = [{ key: `${ttag}:a`, rule: { algorithm: 'sliding', limit: 10, windowMs: 60_000 } }, { key: `${ttag}:b`, rule: { policy: tokyo } }];
          assert.equal((await rl.all(both)).allowed, true);
          const no = await rl.all(both);
          assert.deepEqual([no.allowed, no.deniedBy], [false, 1]);
          near(no.waitMs, tokyoEnd(), 'RL.ALL waits for the Tokyo day');
          await rl.policyDel(tokyo);
        } finally {
          rl.close();
          kind.close(client);
        }
      }),
    );
  });
}

describe('RLStore with a calendar window', () => {
  let client;
  before(async () => {
    client = createClient({ url: server.url });
    client.on('error', () => {});
    await client.connect();
  });
  after(() => client?.destroy());

  async function app(limiter) {
    const a = express();
    a.use(limiter);
    a.get('/ok', (_req, res) => res.send('ok'));
    const http = await new Promise((resolve) => {
      const s = a.listen(0, '127.0.0.1', () => resolve(s));
    });
    return { url: `http://127.0.0.1:${http.address().port}`, close: () => new Promise((r) => http.close(r)) };
  }

  test("window: 'day' counts the UTC day; draft-8 headers say w=86400 and Retry-After the next day", () =>
    inOnePeriod([['day']], async () => {
      const store = new RLStore({ sendCommand: (...args) => client.sendCommand(args), prefix: `rlq:${Math.random()}:`, window: 'day' });
      const a = await app(rateLimit({ windowMs: PERIOD_SECONDS.day * 1000, limit: 2, standardHeaders: 'draft-8', legacyHeaders: false, store }));
      try {
        for (let i = 0; i < 2; i++) {
          const r = await fetch(`${a.url}/ok`);
          assert.equal(r.status, 200);
          assert.match(r.headers.get('ratelimit-policy'), /; q=2; w=86400/);
          const t = Number(/t=(\d+)/.exec(r.headers.get('ratelimit'))[1]);
          near(t * 1000, periodEnd(Date.now(), 'day') - Date.now(), 'reset: the end of the day', 6000);
        }
        const denied = await fetch(`${a.url}/ok`);
        assert.equal(denied.status, 429);
        near(Number(denied.headers.get('retry-after')) * 1000, periodEnd(Date.now(), 'day') - Date.now(), 'Retry-After: the next day', 6000);
      } finally {
        await a.close();
      }
    }),
  );

  test("window: 'month' with a zone, and bad windows or zones name the option", () =>
    inOnePeriod([['month', '+14:00']], async () => {
      const store = new RLStore({ sendCommand: (...args) => client.sendCommand(args), prefix: `rlq:${Math.random()}:`, window: 'month', zone: '+14:00' });
      const a = await app(rateLimit({ windowMs: PERIOD_SECONDS.month * 1000, limit: 1, store }));
      try {
        assert.equal((await fetch(`${a.url}/ok`)).status, 200);
        assert.equal((await fetch(`${a.url}/ok`)).status, 429);
      } finally {
        await a.close();
      }
      const send = (...args) => client.sendCommand(args);
      assert.throws(() => new RLStore({ sendCommand: send, window: 'fortnight' }), (e) => e instanceof InvalidArgumentError && e.argument === 'window');
      assert.throws(() => new RLStore({ sendCommand: send, window: 'sliding', zone: '+01:00' }), (e) => e instanceof InvalidArgumentError && e.argument === 'zone');
      assert.throws(() => new RLStore({ sendCommand: send, window: 'day', zone: 'Mars Olympus' }), (e) => e instanceof InvalidArgumentError && e.argument === 'zone');
      assert.equal(DAY, PERIOD_SECONDS.day * 1000);
      const warned = new Promise((resolve) => process.once('warning', resolve));
      rateLimit({ windowMs: 60_000, limit: 1, store: new RLStore({ sendCommand: send, window: 'week' }) });
      const w = await warned;
      assert.equal(w.code, 'RL_QUOTA_WINDOW');
      assert.match(w.message, /windowMs: 604800000/);
    }),
  );
});

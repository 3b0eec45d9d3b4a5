// The Node kit against the contract every kit is tested against
// (clients/contract/contract.json, written by the core crate and the Rust
// kit; format in clients/contract/README.md): each algorithm's validation
// cases against the kit's own rule check (accepted or refused, naming the
// same parameter), the zones against its zone check, and the header vectors
// against its RateLimit-Policy, RateLimit, Retry-After and problem+json body,
// byte for byte; and the observability section: the metrics' names, types,
// help, labels and buckets as a prom-client scrape shows them, the levels and
// outcomes, the deny events' fields, order and defaults. No server: nothing
// here is sent anywhere.
//
// The golden decision sequences are not run: the Node kit has no in-process
// algorithms (no local level, no local-only fallback at a share) to run them on.
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import http from 'node:http';
import { after, describe, test } from 'node:test';
import { Client, Decision, InvalidArgumentError, ProtocolError, Protection, PROTECTION_DEFAULTS, Request, STATS_FIELDS, WINDOW_FIELDS, concurrencyLimit, defaultIsError, parseStats } from 'redis-ratelimit';
import { blockArgs, checkZone, optionArgs, ruleArgs } from '../dist/esm/rules.js';
import { BY_WORD, fits, run } from '../dist/esm/algorithms.js';
import { batchSize, checkShareable, checkStriped, grantConfig, GRANT_DEFAULTS, MAX_STRIPES, pickTags, shareOfStripe, SlotMap, stripeSpecs } from '../dist/esm/grants.js';
import { keySlot } from '../dist/esm/transport.js';
import { LocalLimiters, localSpec } from '../dist/esm/local.js';
import { denialBody, policyItem, policyWindowS, rateLimitItem, retryAfterS } from '../dist/esm/headers.js';

const contract = JSON.parse(readFileSync(new URL('../../contract/contract.json', import.meta.url), 'utf8'));

/** The contract's parameter names (`refill_ms`) in the kit's spelling (`refillMs`); `span` and `window_ms / bucket_ms` alike. */
const camel = (name) => name.replace(/_([a-z])/g, (_, c) => c.toUpperCase());

const algorithms = new Map(contract.algorithms.map((a) => [a.word, a]));

/** The kit's rule for an algorithm word and the contract's integers (a period by its index). */
function ruleOf(word, params) {
  const a = algorithms.get(word);
  assert.ok(a, `no algorithm ${word} in the contract`);
  assert.equal(params.length, a.params.length, `${word}: ${JSON.stringify(params)}`);
  const rule = { algorithm: word.toLowerCase() };
  a.params.forEach((p, i) => {
    const v = params[i];
    // A keyword parameter (a quota's period) is a word in the kit; an index
    // past the words has none, and goes as the number.
    rule[camel(p.name)] = p.keywords.length > 0 ? (p.keywords[v]?.toLowerCase() ?? v) : v;
  });
  return rule;
}

test('version 1, and the bounds the kit checks against', () => {
  assert.equal(contract.version, 1);
  assert.equal(contract.max_param, 2 ** 40);
  assert.equal(contract.max_span_ms, 2 ** 50);
  assert.deepEqual(contract.decision_fields, ['allowed', 'limit', 'remaining', 'wait_ms', 'reset_ms']);
  assert.deepEqual(
    [...algorithms.keys()].sort(),
    ['CONCURRENCY', 'FIXEDWINDOW', 'HASHWINDOW', 'LEAKYBUCKET', 'QUOTA', 'SLIDING', 'TOKENBUCKET'],
  );
});

describe('validation: the kit accepts the ok cases and refuses the others, naming the same parameter', () => {
  for (const a of contract.algorithms) {
    test(a.word, () => {
      assert.ok(a.validation.length > 0);
      const wrong = [];
      for (const v of a.validation) {
        const rule = ruleOf(a.word, v.params);
        let got;
        try {
          const [word, args] = ruleArgs(rule);
          assert.equal(word, a.word);
          got = { ok: true, args };
        } catch (err) {
          if (!(err instanceof InvalidArgumentError)) throw err;
          got = { ok: false, names: err.argument, message: err.message };
        }
        const want = v.ok ? 'accepted' : `refused naming ${camel(v.names)}`;
        if (got.ok !== v.ok || (!v.ok && got.names !== camel(v.names))) {
          wrong.push(`${JSON.stringify(v.params)}: want ${want}, got ${got.ok ? 'accepted' : `refused naming ${got.names} (${got.message})`}`);
        } else if (v.ok) {
          // What is sent: the integers as given, a period as its word.
          const sent = a.params.map((p, i) => (p.keywords.length > 0 ? p.keywords[v.params[i]] : String(v.params[i])));
          assert.deepEqual(got.args, sent);
        }
      }
      assert.deepEqual(wrong, [], `${a.word}: ${wrong.length} of ${a.validation.length} cases differ`);
    });
  }
});

describe('zones', () => {
  const quota = (zone) => ({ algorithm: 'quota', limit: 10, period: 'day', zone });
  test('accepted: by checkZone and in a quota rule', () => {
    assert.ok(contract.zones.accepted.length > 0);
    const wrong = [];
    for (const z of contract.zones.accepted) {
      try {
        const checked = checkZone(z);
        // UTC goes without TZ; anything else as given.
        assert.equal(checked, /^(utc|z)$/i.test(z) ? undefined : z, JSON.stringify(z));
        const [, args] = ruleArgs(quota(z));
        assert.deepEqual(args, checked === undefined ? ['10', 'DAY'] : ['10', 'DAY', 'TZ', z]);
      } catch (err) {
        if (!(err instanceof InvalidArgumentError)) throw err;
        wrong.push(`${JSON.stringify(z)}: refused (${err.message})`);
      }
    }
    assert.deepEqual(wrong, []);
  });
  test('refused on syntax, naming zone', () => {
    assert.ok(contract.zones.refused.length > 0);
    const wrong = [];
    for (const z of contract.zones.refused) {
      for (const check of [() => checkZone(z), () => ruleArgs(quota(z))]) {
        try {
          check();
          wrong.push(`${JSON.stringify(z)}: accepted`);
        } catch (err) {
          if (!(err instanceof InvalidArgumentError)) throw err;
          if (err.argument !== 'zone') wrong.push(`${JSON.stringify(z)}: refused naming ${err.argument}`);
        }
      }
    }
    assert.deepEqual(wrong, []);
  });
  test('refused by the server only: the kit lets the server say', () => {
    for (const z of contract.zones.refused_by_server_only) {
      assert.equal(checkZone(z), z);
    }
  });
});

test("periods: the kit's words and nominal lengths", async () => {
  const { PERIOD_SECONDS } = await import('redis-ratelimit');
  assert.deepEqual(
    contract.periods.map((p) => [p.word, p.index, p.nominal_s]),
    Object.entries(PERIOD_SECONDS).map(([word, s], i) => [word.toUpperCase(), i, s]),
  );
  assert.deepEqual(algorithms.get('QUOTA').params[1].keywords, contract.periods.map((p) => p.word));
});

test('policy_window: the w of RateLimit-Policy', () => {
  assert.ok(contract.policy_window.length > 0);
  const wrong = [];
  for (const p of contract.policy_window) {
    const w = policyWindowS(ruleOf(p.algorithm, p.params));
    if (w !== p.w) wrong.push(`${p.algorithm} ${JSON.stringify(p.params)}: want ${p.w}, got ${w}`);
  }
  assert.deepEqual(wrong, []);
});

describe('headers: RateLimit-Policy, RateLimit, Retry-After and the problem body, byte for byte', () => {
  contract.headers.forEach((h, n) => {
    test(`${n}: ${h.algorithm} ${JSON.stringify(h.params)} ${JSON.stringify(h.decision)}`, () => {
      const [allowed, limit, remaining, waitMs, resetMs] = h.decision;
      assert.ok(allowed === 0 || allowed === 1);
      const d = new Decision(allowed === 1, limit, remaining, waitMs, resetMs);
      assert.equal(policyItem(h.rule, ruleOf(h.algorithm, h.params)), h.ratelimit_policy);
      assert.equal(rateLimitItem(h.rule, d), h.ratelimit);
      assert.equal(retryAfterS(d), h.retry_after);
      assert.equal(d.allowed ? null : denialBody(h.rule, d), h.body);
    });
  });
});

// concurrencyLimit, the kit's HTTP layer, answers a concurrency denial with
// the contract's fields and body: a server stand-in answers the vector's
// decision to RL.CONCURRENCY.
describe('concurrencyLimit answers the CONCURRENCY vector', () => {
  const vectors = contract.headers.filter((h) => h.algorithm === 'CONCURRENCY');
  let server;
  let reply;
  const sent = [];
  after(() => server?.close());
  test('at least one vector', () => assert.ok(vectors.length > 0));
  for (const h of vectors) {
    test(`${h.rule} ${JSON.stringify(h.params)} ${JSON.stringify(h.decision)}`, async () => {
      const [limit, leaseMs] = h.params;
      const mw = concurrencyLimit({
        client: async (...args) => {
          sent.push(args);
          return reply;
        },
        name: h.rule,
        limit,
        leaseMs,
        keyGenerator: () => 'k',
      });
      server?.close();
      server = http.createServer((req, res) => mw(req, res, () => res.end('admitted')));
      await new Promise((r) => server.listen(0, '127.0.0.1', r));
      const url = `http://127.0.0.1:${server.address().port}/`;
      reply = h.decision.length === 5 && h.decision[0] === 1 ? [...h.decision, 1] : h.decision;
      sent.length = 0;
      const r = await fetch(url);
      assert.deepEqual(sent, [['RL.CONCURRENCY', `rl:${h.rule}:k`, String(limit), String(leaseMs)]]);
      assert.equal(r.headers.get('ratelimit-policy'), h.ratelimit_policy);
      assert.equal(r.headers.get('ratelimit'), h.ratelimit);
      assert.equal(r.headers.get('retry-after'), h.retry_after === null ? null : String(h.retry_after));
      const body = await r.text();
      if (h.body === null) {
        assert.equal(r.status, 200);
      } else {
        assert.equal(r.status, 429);
        assert.equal(r.headers.get('content-type'), 'application/problem+json');
        assert.equal(body, h.body);
      }
    });
  }
});

// Every golden sequence, from idle at its first step's instant, each step
// twice: through the core's `run` in process (a quota's period in UTC, its
// end 0), and through the path the Limiter's local level and local-only
// fallback take (`LocalLimiters.run` on the kit's spec, at a share equal
// to the limit).
describe('golden decision sequences: every decision exactly the core\'s', () => {
  const total = { steps: 0, wrong: 0 };
  for (const a of contract.algorithms) {
    if (a.golden.length === 0) continue;
    test(a.word, () => {
      const algo = BY_WORD[a.word];
      assert.ok(algo, `no in-process algorithm for ${a.word}`);
      const wrong = [];
      a.golden.forEach((g, n) => {
        assert.ok(g.steps.length > 0);
        let state;
        const local = new LocalLimiters(4);
        g.steps.forEach((step, i) => {
          const params = step.params.map(BigInt);
          if (a.word === 'QUOTA') params.push(0n);
          const now = BigInt(step.at_us);
          state ??= algo.idle(params, now);
          const [[kind, units]] = Object.entries(step.request);
          const [d] = run(algo, state, params, { kind, n: BigInt(units) }, now);
          const viaLocal = local.run('golden\0k', localSpec(ruleOf(a.word, step.params)), { kind, n: BigInt(units) }, now);
          for (const [path, x] of [['run', d], ['LocalLimiters', viaLocal]]) {
            const got = [x.allowed ? 1 : 0, Number(x.limit), Number(x.remaining), Number(x.waitMs), Number(x.resetMs)];
            total.steps += 1;
            if (JSON.stringify(got) !== JSON.stringify(step.decision)) {
              total.wrong += 1;
              wrong.push(`sequence ${n} step ${i} ${JSON.stringify(step)} through ${path}: got ${JSON.stringify(got)}`);
            }
          }
        });
      });
      assert.deepEqual(wrong.slice(0, 10), [], `${a.word}: ${wrong.length} decisions differ`);
    });
  }
  test('all 1,152 decisions were run, each both ways', () => {
    const expected = contract.algorithms.reduce((n, a) => n + a.golden.reduce((m, g) => m + g.steps.length, 0), 0);
    assert.ok(expected > 0);
    assert.equal(total.steps, 2 * expected);
    assert.equal(total.wrong, 0);
  });
});

// The options: each request case built with the kit's tagged Request
// (Request.cost, .force, .refund), accepted or refused as the contract
// says, naming the same option (the kit's names `cost` and `refund`,
// compared case-insensitively); each blocking timeout through `blockArgs`
// (acquire's `timeoutMs`: the one entry of the map from the contract's
// BLOCK to the kit's names); no request of any kind builds a refused word
// combination.
describe('options: requests, blocking timeouts and refused words', () => {
  const kitName = { COST: 'cost', REFUND: 'refund', BLOCK: 'timeoutMs', UPTO: 'UPTO' };
  test('words: COST, FORCE, REFUND, BLOCK with the bounds the kit checks', () => {
    assert.deepEqual(contract.options.words.map((w) => w.word), ['COST', 'FORCE', 'REFUND', 'BLOCK']);
    for (const w of contract.options.words.filter((w) => !w.flag)) {
      assert.equal(w.min, 0);
      assert.equal(w.max, 2 ** 40);
    }
  });
  test('requests', () => {
    assert.ok(contract.options.requests.length > 0);
    const wrong = [];
    for (const c of contract.options.requests) {
      const [[kind, n]] = Object.entries(c.request);
      let got;
      try {
        got = { ok: true, args: optionArgs(Request[kind](n)) };
      } catch (err) {
        if (!(err instanceof InvalidArgumentError)) throw err;
        got = { ok: false, names: err.argument };
      }
      if (got.ok !== c.ok) wrong.push(`${JSON.stringify(c.request)}: want ${c.ok ? 'accepted' : 'refused'}, got ${JSON.stringify(got)}`);
      else if (got.ok && JSON.stringify(got.args) !== JSON.stringify(c.args)) wrong.push(`${JSON.stringify(c.request)}: sends ${JSON.stringify(got.args)}, want ${JSON.stringify(c.args)}`);
      else if (!got.ok && got.names !== kitName[c.names]) wrong.push(`${JSON.stringify(c.request)}: refused naming ${got.names}, want ${c.names}`);
    }
    assert.deepEqual(wrong, []);
  });
  test('blocks', () => {
    assert.ok(contract.options.blocks.length > 0);
    const wrong = [];
    for (const b of contract.options.blocks) {
      let got;
      try {
        got = { ok: true, args: blockArgs(b.block_ms) };
      } catch (err) {
        if (!(err instanceof InvalidArgumentError)) throw err;
        got = { ok: false, names: err.argument };
      }
      if (got.ok !== b.ok) wrong.push(`${b.block_ms}: want ${b.ok ? 'accepted' : 'refused'}, got ${JSON.stringify(got)}`);
      else if (got.ok && JSON.stringify(got.args) !== JSON.stringify(b.args)) wrong.push(`${b.block_ms}: sends ${JSON.stringify(got.args)}`);
      else if (!got.ok && got.names !== kitName[b.names]) wrong.push(`${b.block_ms}: refused naming ${got.names}, want ${b.names}`);
    }
    assert.deepEqual(wrong, []);
  });
  test('refused words: no tagged request builds them', () => {
    assert.ok(contract.options.refused_words.length > 0);
    const built = new Set();
    for (const kind of ['cost', 'force', 'refund']) {
      for (const n of [0, 1, 2, 2 ** 40]) built.add(JSON.stringify(optionArgs(Request[kind](n))));
    }
    for (const n of [1, 2, 2 ** 40]) built.add(JSON.stringify(optionArgs(Request.upto(n))));
    for (const r of contract.options.refused_words) assert.ok(!built.has(JSON.stringify(r.args)), JSON.stringify(r.args));
    // Nor the deprecated options object: REFUND with FORCE or COST is refused, naming it.
    assert.throws(() => optionArgs({ refund: 1, force: true }), (e) => e instanceof InvalidArgumentError && e.argument === 'force');
    assert.throws(() => optionArgs({ refund: 1, cost: 1 }), (e) => e instanceof InvalidArgumentError && e.argument === 'refund');
  });
});

// The replies: each command's fields, in order, through the kit's parser
// (`Decision.fromReply`, with the sixth field the kit's calls give it: the
// lease of RL.CONCURRENCY, denied_by of RL.ALL, 1-based on the wire and
// 0-based in the kit); a reply of another width is refused (the lease stays
// optional: RL.HIT answers as its policy's algorithm, five fields or six).
describe('replies: Decision.fromReply takes exactly the fields, in order', () => {
  const sixth = { 'RL.CONCURRENCY': 'lease', 'RL.ALL': 'deniedBy' };
  const read = {
    allowed: (d) => (d.allowed ? 1 : 0),
    limit: (d) => d.limit,
    remaining: (d) => d.remaining,
    wait_ms: (d) => d.waitMs,
    reset_ms: (d) => d.resetMs,
    lease: (d) => d.lease,
    denied_by: (d) => (d.deniedBy === null ? 0 : d.deniedBy + 1),
  };
  test('every limiter command is there', () => {
    assert.deepEqual(
      contract.replies.map((r) => r.command).sort(),
      [...[...algorithms.keys()].map((w) => `RL.${w}`), 'RL.ALL', 'RL.HIT'].sort(),
    );
  });
  for (const r of contract.replies) {
    test(r.command, () => {
      if (!Array.isArray(r.fields)) {
        // RL.HIT answers as its policy's algorithm: the kit parses it with a lease field allowed.
        assert.equal(r.command, 'RL.HIT');
        return;
      }
      assert.deepEqual(r.fields.slice(0, 5), contract.decision_fields);
      const reply = r.fields.map((f, i) => (f === 'allowed' ? 1 : 10 + i));
      const d = Decision.fromReply(reply, sixth[r.command] ?? 'none');
      r.fields.forEach((f, i) => {
        assert.ok(read[f], `a field the kit does not know: ${f}`);
        assert.equal(read[f](d), reply[i], `${r.command} field ${i} (${f})`);
      });
      assert.throws(() => Decision.fromReply(reply.slice(0, 4), sixth[r.command] ?? 'none'), ProtocolError);
      if (r.command !== 'RL.CONCURRENCY') {
        const other = r.fields.length === 5 ? [...reply, 1] : reply.slice(0, 5);
        assert.throws(() => Decision.fromReply(other, sixth[r.command] ?? 'none'), ProtocolError, `${r.command}: ${other.length} fields`);
      }
    });
  }
});

describe('protection: the loop\'s defaults, STATS fields, argument ranges and GET fields', () => {
  const pr = contract.protection;
  /** A Client over a fake master that records what it is sent and answers `reply(args)`. */
  const recording = (reply = () => 'OK') => {
    const sent = [];
    const transport = {
      call: async (_key, args) => (sent.push(args), reply(args)),
      eachMaster: async (args) => (sent.push(args), [reply(args)]),
    };
    return { sent, client: new Client(transport), transport };
  };

  test('the kit\'s loop timings are the contract\'s kits defaults, and a Protection takes them', async () => {
    assert.deepEqual(
      { ...PROTECTION_DEFAULTS },
      { reportIntervalMs: pr.kits.report_interval_ms, stagePollMs: pr.kits.stage_poll_ms, stageHoldMs: pr.kits.stage_hold_ms },
    );
    const { transport } = recording(() => {
      throw new Error('no server');
    });
    const p = new Protection(transport, ['x']);
    assert.deepEqual([p.reportIntervalMs, p.stagePollMs, p.stageHoldMs], [pr.kits.report_interval_ms, pr.kits.stage_poll_ms, pr.kits.stage_hold_ms]);
    assert.equal(pr.kits.stage_of_many_masters, 'the highest');
    await p.close();
  });

  test('the default error predicate is the contract\'s: a 5xx, an exception, a timeout', () => {
    assert.match(pr.kits.error, /5xx/);
    assert.equal(defaultIsError({ status: 500, error: undefined, timedOut: false }), true);
    assert.equal(defaultIsError({ status: 599, error: undefined, timedOut: false }), true);
    assert.equal(defaultIsError({ status: 499, error: undefined, timedOut: false }), false);
    assert.equal(defaultIsError({ status: 200, error: new Error('x'), timedOut: false }), true);
    assert.equal(defaultIsError({ status: 200, error: undefined, timedOut: true }), true);
  });

  test('parseStats takes exactly stats_fields and window_fields, in order', () => {
    assert.deepEqual([...STATS_FIELDS], pr.stats_fields);
    assert.deepEqual([...WINDOW_FIELDS], pr.window_fields);
    const win = (base) => pr.window_fields.flatMap((f, i) => [f, base + i]);
    const values = { scale: 80, stage: 2, window_ms: 1000, window_end_ms: 123, current: win(10), last: win(20), adapting: 1 };
    const reply = pr.stats_fields.flatMap((f) => [f, values[f]]);
    const s = parseStats(reply);
    assert.deepEqual([s.scale, s.stage, s.windowMs, s.windowEndMs, s.adapting], [80, 2, 1000, 123, true]);
    assert.deepEqual(Object.values(s.current), pr.window_fields.map((_, i) => 10 + i));
    assert.deepEqual(Object.values(s.last), pr.window_fields.map((_, i) => 20 + i));
    assert.throws(() => parseStats(reply.slice(0, -2)), ProtocolError, 'a field fewer');
    assert.throws(() => parseStats([...reply, 'more', 1]), ProtocolError, 'a field more');
    assert.throws(() => parseStats([...reply.slice(2, 4), ...reply.slice(0, 2), ...reply.slice(4)]), ProtocolError, 'out of order');
    const shortWindow = pr.stats_fields.flatMap((f) => [f, f === 'current' ? win(10).slice(0, -2) : values[f]]);
    assert.throws(() => parseStats(shortWindow), ProtocolError, 'a window field fewer');
    for (const { stage } of pr.stages) assert.equal(parseStats(pr.stats_fields.flatMap((f) => [f, f === 'stage' ? stage : values[f]])).stage, stage);
    assert.throws(() => parseStats(pr.stats_fields.flatMap((f) => [f, f === 'stage' ? pr.stages.length : values[f]])), ProtocolError);
  });

  // Each contract argument as the kit takes it: the option, the word the server gets.
  const spec = { algorithm: 'tokenbucket', capacity: 10, refillCount: 10, refillMs: 1000 };
  const asKit = {
    ERRORS: { option: 'adapt.errors', send: (c, v) => c.policySet('p', spec, { adapt: { errors: v } }) },
    FACTOR: { option: 'adapt.factor', send: (c, v) => c.policySet('p', spec, { adapt: { errors: 5, factor: v } }) },
    MIN: { option: 'adapt.min', send: (c, v) => c.policySet('p', spec, { adapt: { errors: 5, min: v } }) },
    RECOVER: { option: 'adapt.recover', send: (c, v) => c.policySet('p', spec, { adapt: { errors: 5, recover: v } }) },
    MINCALLS: { option: 'adapt.minCalls', send: (c, v) => c.policySet('p', spec, { adapt: { errors: 5, minCalls: v } }) },
    WINDOW: { option: 'windowMs', send: (c, v) => c.policySet('p', spec, { windowMs: v }) },
    degrade_pct: { option: 'stages.degrade', send: (c, v) => c.policySet('p', spec, { stages: { degrade: v, break: 100 } }) },
    break_pct: { option: 'stages.break', send: (c, v) => c.policySet('p', spec, { stages: { degrade: 0, break: v } }) },
    pct: { option: 'pct', send: (c, v) => c.policyScale('p', v) },
    ok: { option: 'ok', send: (c, v) => c.outcome('p', v, 0) },
    errors: { option: 'errors', send: (c, v) => c.outcome('p', 0, v) },
    DENIED: { option: 'denied', send: (c, v) => c.outcome('p', 0, 0, v) },
  };
  test('every argument is known to the kit', () => {
    assert.deepEqual(pr.arguments.map((a) => a.name).sort(), Object.keys(asKit).sort());
  });
  const statsReply = pr.stats_fields.flatMap((f) => [f, f === 'current' || f === 'last' ? pr.window_fields.flatMap((w) => [w, 0]) : f === 'scale' ? 100 : 0]);
  test('RL.OUTCOME: DENIED n only when n > 0, as the contract\'s outcome says', async () => {
    assert.match(pr.outcome, /^RL\.OUTCOME name ok errors \[DENIED n\]/);
    const { sent, client } = recording(() => statsReply);
    await client.outcome('p', 2, 1, 0);
    await client.outcome('p', 2, 1, 3);
    assert.deepEqual(sent, [
      ['RL.OUTCOME', 'p', '2', '1'],
      ['RL.OUTCOME', 'p', '2', '1', 'DENIED', '3'],
    ]);
  });
  for (const arg of pr.arguments) {
    test(`${arg.name}: ${arg.min} to ${arg.max} accepted, outside refused naming ${asKit[arg.name].option}`, async () => {
      const { option, send } = asKit[arg.name];
      const max = typeof arg.max === 'number' ? arg.max : 100; // break_pct: degrade_pct (0 here) to 100
      for (const v of [arg.min, max]) {
        const { sent, client } = recording((args) => (args[0] === 'RL.OUTCOME' ? statsReply : 'OK'));
        await send(client, v);
        assert.ok(sent.at(-1).includes(String(v)), `${arg.name} ${v}: ${sent.at(-1).join(' ')}`);
      }
      for (const v of [arg.min - 1, max + 1]) {
        const { sent, client } = recording();
        await assert.rejects(send(client, v), (e) => e instanceof InvalidArgumentError && e.argument === option, `${arg.name} ${v}`);
        assert.equal(sent.length, 0, 'nothing sent');
      }
    });
  }

  test('policyGet reads RL.POLICY GET by name: always, then when_set, then the scale and stage', async () => {
    const names = [...pr.get_fields.always, ...pr.get_fields.when_set, ...pr.get_fields.then];
    const values = { name: 'p', algorithm: 'TOKENBUCKET', params: [10, 10, 1000], mode: 'ENFORCE', adapt: [5, 80, 50, 5, 100], stages: [30, 50], scale: 80, stage: 1 };
    const reply = names.flatMap((n) => [n, values[n] ?? 7]);
    const { client } = recording(() => reply);
    const got = await client.policyGet('p');
    assert.deepEqual(Object.keys(got), names);
    assert.equal(got.scale, 80);
    assert.equal(got.stage, 1);
    assert.deepEqual(got.adapt, [5, 80, 50, 5, 100]);
  });
});

describe('observability: metric names, types, labels and buckets; levels and outcomes; deny events\' fields and defaults', async () => {
  const ob = contract.observability;
  const { Registry } = await import('prom-client');
  const { RateLimitMetrics, METRICS, LEVELS, OUTCOMES, REDIS_SECONDS_BUCKETS, DenyEvents, DENY_EVENT_FIELDS, DENY_EVENT_DEFAULTS, MAX_HEADER_BYTES } = await import('redis-ratelimit');
  const { LEVEL_OF } = await import('../dist/esm/limiter.js');

  test('the kit\'s table of metrics is the contract\'s (name, type, labels, help)', () => {
    assert.deepEqual(
      METRICS.map((m) => ({ name: m.name, type: m.type, labels: [...m.labels], help: m.help })),
      ob.metrics.map((m) => ({ name: m.name, type: m.type, labels: m.labels, help: m.help })),
    );
  });

  test('a scrape shows each metric under its name, type, help and labels; the histogram\'s buckets are the contract\'s', async () => {
    const reg = new Registry();
    const m = RateLimitMetrics.of(reg);
    m.decision('r', 'redis', 'admitted');
    m.redisSeconds(0.001);
    m.remainingRatio('r', 1, 2);
    m.breakerOpen('b', true);
    m.scale('r', 80);
    m.stage('r', 1);
    m.eventsDropped(1);
    m.eventsShipped(1);
    m.sinkError();
    const text = await reg.metrics();
    const labelsOf = new Map();
    for (const line of text.split('\n')) {
      const s = /^([a-z_]+)(?:\{(.*)\})? /.exec(line);
      if (!s) continue;
      const names = s[2] ? [...s[2].matchAll(/([a-z_]+)="/g)].map((x) => x[1]).filter((n) => n !== 'le') : [];
      labelsOf.set(s[1], names);
    }
    for (const want of ob.metrics) {
      assert.ok(text.includes(`# HELP ${want.name} ${want.help}\n`), `HELP of ${want.name}`);
      assert.ok(text.includes(`# TYPE ${want.name} ${want.type}\n`), `TYPE of ${want.name}`);
      const sample = want.type === 'histogram' ? `${want.name}_count` : want.name;
      assert.deepEqual(labelsOf.get(sample), want.labels, `labels of ${want.name}`);
    }
    const les = [...text.matchAll(/^ratelimit_redis_seconds_bucket\{le="([^"]+)"\}/gm)].map((x) => x[1]);
    assert.deepEqual(les, [...ob.redis_seconds_buckets.map(String), '+Inf']);
    assert.deepEqual([...REDIS_SECONDS_BUCKETS], ob.redis_seconds_buckets);
  });

  test('levels and outcomes are the contract\'s; every path a Limiter decision takes has its level', () => {
    assert.deepEqual([...LEVELS], ob.levels.map((l) => l.level));
    assert.deepEqual([...OUTCOMES], ob.outcomes);
    for (const path of ['redis', 'local', 'denyCache', 'grant', 'fallback']) assert.ok(LEVELS.includes(LEVEL_OF[path]), path);
    // every level of the contract is a path's (grant: a batched rule's held units and local denials)
    assert.deepEqual(Object.values(LEVEL_OF).sort(), [...LEVELS].sort());
  });

  test('deny events: the defaults, the bulk index, the fields in order (the optional ones left out when unknown), the timestamp\'s form', async () => {
    const d = ob.deny_events;
    assert.deepEqual(
      { capacity: DENY_EVENT_DEFAULTS.capacity, flushEvents: DENY_EVENT_DEFAULTS.flushEvents, flushIntervalMs: DENY_EVENT_DEFAULTS.flushIntervalMs, timeoutMs: DENY_EVENT_DEFAULTS.timeoutMs, bulkIndex: DENY_EVENT_DEFAULTS.bulkIndex },
      { capacity: d.buffer_events, flushEvents: d.flush_events, flushIntervalMs: d.flush_interval_ms, timeoutMs: d.sink_timeout_ms, bulkIndex: d.bulk_index },
    );
    assert.deepEqual([...DENY_EVENT_FIELDS], d.fields);
    assert.equal(MAX_HEADER_BYTES, d.max_header_bytes, 'client_ip and user_agent cut to the contract\'s max_header_bytes');
    const batches = [];
    const events = new DenyEvents({ callback: (b) => void batches.push(b), background: false });
    assert.equal(events.capacity, d.buffer_events);
    events.record({ key: 'k', rule: 'r', level: 'redis', limit: 5, remaining: 0, retryAfterMs: 1200, clientIp: '10.1.2.3', userAgent: 'ua' });
    events.record({ key: 'k', rule: 'r', level: 'deny_cache', limit: 5, remaining: 0, retryAfterMs: -1 });
    await events.flush();
    const [full, bare] = batches[0];
    assert.deepEqual(Object.keys(full), d.fields);
    assert.deepEqual(Object.keys(bare), d.fields.filter((f) => !d.optional.includes(f)));
    assert.equal(bare.retry_after_ms, -1, 'wait_ms -1: can never pass');
    assert.ok(ob.outcomes.includes(full.outcome));
    assert.match(full.timestamp, /^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$/);
    await events.close();
  });
});

// The grants section (issue 27): UPTO's requests, refusals and replies
// through the kit's builders and parser; the golden UPTO sequences through
// the in-process algorithms; the batched rules' options and batch vectors;
// the stripes' shares and tags.
describe('grants: UPTO, batched rules and stripes', () => {
  const g = contract.grants;
  const kitName = { UPTO: 'UPTO' };

  test('requests: Request.upto accepted or refused as the contract says, naming UPTO', () => {
    assert.ok(g.requests.length > 0);
    const wrong = [];
    for (const c of g.requests) {
      const n = c.request.upto;
      let got;
      try {
        got = { ok: true, args: optionArgs(Request.upto(n)) };
      } catch (err) {
        if (!(err instanceof InvalidArgumentError)) throw err;
        got = { ok: false, names: err.argument };
      }
      if (got.ok !== c.ok) wrong.push(`${n}: want ${c.ok ? 'accepted' : 'refused'}, got ${JSON.stringify(got)}`);
      else if (got.ok && JSON.stringify(got.args) !== JSON.stringify(c.args)) wrong.push(`${n}: sends ${JSON.stringify(got.args)}`);
      else if (!got.ok && got.names !== kitName[c.names]) wrong.push(`${n}: refused naming ${got.names}, want ${c.names}`);
    }
    assert.deepEqual(wrong, []);
  });

  test('refused words: no request builds them (UPTO is one request, never beside COST, FORCE or REFUND)', () => {
    const built = new Set();
    for (const kind of ['cost', 'force', 'refund']) for (const n of [0, 1, 2]) built.add(JSON.stringify(optionArgs(Request[kind](n))));
    for (const n of [1, 2, 2 ** 40]) built.add(JSON.stringify(optionArgs(Request.upto(n))));
    assert.ok(g.refused_words.length > 0);
    for (const r of g.refused_words) assert.ok(!built.has(JSON.stringify(r.args)), JSON.stringify(r.args));
  });

  test('refused commands: the kit refuses them before sending, in the server\'s words; the server\'s own (RL.HIT) name UPTO', async () => {
    const sent = [];
    // A transport that answers every command with the contract's message for RL.HIT, and records what was sent.
    const hitMessage = g.refused_commands.find((r) => r.command === 'RL.HIT').message;
    const transport = {
      async call(_key, args) {
        sent.push(args[0]);
        const err = new Error(hitMessage);
        throw Object.defineProperty(err, 'constructor', { value: { name: 'ReplyError' } });
      },
      async eachMaster() {
        return [];
      },
    };
    const rl = new Client(transport);
    const specOf = {
      LEAKYBUCKET: { algorithm: 'leakybucket', capacity: 5, leakCount: 1, leakMs: 1000 },
      CONCURRENCY: { algorithm: 'concurrency', limit: 5, leaseMs: 1000 },
    };
    for (const r of g.refused_commands) {
      const words = r.message.replace(/^ERR /, '');
      const check = (e) => e instanceof InvalidArgumentError && e.argument === 'UPTO' && e.message.includes(words);
      if (r.command === 'RL.HIT') {
        await assert.rejects(rl.hit('p', 'k', Request.upto(2)), check, r.command);
      } else if (r.command === 'RL.ALL') {
        const limits = Array.from({ length: r.spec }, (_, i) => ({ key: `k${i}`, rule: { algorithm: 'fixedwindow', limit: 5, windowMs: 1000 } }));
        limits[r.spec - 1] = { key: 'kx', rule: specOf[/with a (\w+) limiter/.exec(r.message)[1]] };
        await assert.rejects(rl.all(limits, { upto: 2 }), check, r.command);
      } else {
        await assert.rejects(rl.limit('k', specOf[r.command.slice(3)], Request.upto(2)), check, r.command);
      }
    }
    assert.deepEqual(sent, ['RL.HIT'], 'only RL.HIT (whose policy the kit does not know) was sent');
    assert.deepEqual(g.commands, ['RL.TOKENBUCKET', 'RL.FIXEDWINDOW', 'RL.SLIDING', 'RL.HASHWINDOW', 'RL.QUOTA', 'RL.HIT', 'RL.ALL']);
  });

  test('replies: the five fields then granted (RL.ALL: denied_by, then granted), parsed as such', () => {
    for (const r of g.replies) {
      const all = r.command === 'RL.ALL';
      const fields = Array.isArray(r.fields) ? r.fields : ['allowed', 'limit', 'remaining', 'wait_ms', 'reset_ms', 'granted'];
      assert.equal(fields[fields.length - 1], 'granted', r.command);
      const values = { allowed: 1, limit: 10, remaining: 3, wait_ms: 0, reset_ms: 700, denied_by: 0, granted: 7 };
      const d = Decision.fromReply(fields.map((f) => values[f]), all ? 'deniedBy' : 'lease', true);
      assert.deepEqual([d.allowed, d.limit, d.remaining, d.waitMs, d.resetMs, d.granted, d.deniedBy], [true, 10, 3, 0, 700, 7, null], r.command);
      assert.throws(() => Decision.fromReply(fields.slice(0, -1).map((f) => values[f]), all ? 'deniedBy' : 'lease', true), ProtocolError, `${r.command} without granted`);
    }
  });

  test('golden UPTO sequences: every decision and granted exactly the core\'s, in process', () => {
    assert.ok(g.golden.length > 0);
    const wrong = [];
    let steps = 0;
    for (const seq of g.golden) {
      const algo = BY_WORD[seq.word];
      const params = seq.params.map(BigInt);
      if (seq.word === 'QUOTA') params.push(0n);
      let state;
      const local = new LocalLimiters(4);
      seq.steps.forEach((step, i) => {
        const now = BigInt(step.at_us);
        state ??= algo.idle(params, now);
        const [[kind, units]] = Object.entries(step.request);
        const n = BigInt(units);
        const taken = kind === 'upto' ? fits(algo, state, params, n, now) : n;
        const [d] = run(algo, state, params, { kind, n }, now);
        const viaLocal = local.run('golden\0k', localSpec(ruleOf(seq.word, seq.params)), { kind, n }, now);
        const granted = d.allowed ? Number(taken) : 0;
        for (const [path, x] of [['run', d], ['LocalLimiters', viaLocal]]) {
          steps += 1;
          const got = [x.allowed ? 1 : 0, Number(x.limit), Number(x.remaining), Number(x.waitMs), Number(x.resetMs)];
          if (JSON.stringify(got) !== JSON.stringify(step.decision)) wrong.push(`${seq.word} step ${i} ${JSON.stringify(step)} through ${path}: got ${JSON.stringify(got)}`);
        }
        if (granted !== step.granted) wrong.push(`${seq.word} step ${i} ${JSON.stringify(step)}: granted ${granted}`);
      });
    }
    assert.deepEqual(wrong.slice(0, 10), [], `${wrong.length} differ`);
    assert.equal(steps, 2 * g.golden.reduce((a, s) => a + s.steps.length, 0));
  });

  test('batched: the algorithms, the options\' defaults and bounds, every batch vector', async () => {
    const b = g.batched;
    assert.deepEqual(GRANT_DEFAULTS, { holdMs: b.hold_ms.default, maxSharePct: b.max_share_pct.default });
    for (const [name, o] of [['holdMs', b.hold_ms], ['maxSharePct', b.max_share_pct]]) {
      const args = (v) => (name === 'holdMs' ? [v, undefined] : [undefined, v]);
      assert.doesNotThrow(() => grantConfig(...args(o.min)));
      assert.doesNotThrow(() => grantConfig(...args(o.max)));
      for (const bad of [o.min - 1, o.max + 1]) assert.throws(() => grantConfig(...args(bad)), (e) => e instanceof InvalidArgumentError && e.argument === name, `${name} ${bad}`);
    }
    for (const v of b.vectors) assert.equal(batchSize(v.rate_per_s, v.hold_ms, v.limit, v.max_share_pct), v.batch, JSON.stringify(v));
    const words = ['TOKENBUCKET', 'LEAKYBUCKET', 'FIXEDWINDOW', 'SLIDING', 'HASHWINDOW', 'CONCURRENCY', 'QUOTA'];
    for (const option of ['batched', 'striped']) {
      const takes = words.filter((w) => {
        try {
          checkShareable(option, ruleOf(w, algorithms.get(w).params.map((p) => (p.keywords.length > 0 ? 0 : 60_000))));
          return true;
        } catch (e) {
          assert.ok(e instanceof InvalidArgumentError && e.argument === option);
          return false;
        }
      });
      assert.deepEqual(takes, g[option === 'batched' ? 'batched' : 'stripes'].algorithms, option);
    }
  });

  test('stripes: n\'s bounds, every share vector, every tag vector (masters in any order) with its slots', () => {
    const s = g.stripes;
    assert.equal(MAX_STRIPES, s.n.max);
    assert.equal(checkStriped(s.n.max), s.n.max);
    assert.throws(() => checkStriped(s.n.max + 1), (e) => e instanceof InvalidArgumentError && e.argument === 'striped');
    for (const v of s.share_vectors) {
      assert.deepEqual(Array.from({ length: v.n }, (_, i) => shareOfStripe(v.total, i, v.n)), v.shares, JSON.stringify(v));
      const specs = stripeSpecs({ algorithm: 'fixedwindow', limit: v.total, windowMs: 1000 }, v.n);
      assert.deepEqual(specs.map((x) => x.limit), v.shares);
    }
    assert.throws(() => stripeSpecs({ algorithm: 'fixedwindow', limit: 2, windowMs: 1000 }, 3), (e) => e instanceof InvalidArgumentError && e.argument === 'striped');
    for (const v of s.tag_vectors) {
      // As CLUSTER SLOTS answers: one entry per range, each naming its master.
      const reply = v.masters.flatMap((ranges, m) => ranges.map(([lo, hi]) => [lo, hi, ['127.0.0.1', 7000 + m, `master${m}`]]));
      const map = v.masters.length === 1 && v.masters[0].length === 1 && v.masters[0][0][0] === 0 && v.masters[0][0][1] === 16383 ? SlotMap.standalone() : SlotMap.fromClusterSlots(reply);
      const tags = pickTags(map, v.n);
      assert.deepEqual(tags, v.tags, JSON.stringify(v.masters));
      assert.deepEqual(tags.map((t) => keySlot(t)), v.slots);
      assert.deepEqual(pickTags(SlotMap.fromClusterSlots(reply), v.n), v.tags, 'the same from the reply');
    }
  });
});

// The cost of observability: Limiter.check decisions per second with
// metrics (a prom-client Registry) and deny events (a DenyEvents appending
// to a file) on, against the same Limiter without them, side by side in
// interleaved rounds on one redis-server with the module. Two workloads:
// every call admitted by Redis (one round trip each), and a flood of denials
// answered in process by the deny cache (where the cost shows most: each
// is a counter, and an event in the buffer). Prints a Markdown table. A
// benchmark reports; it does not fail on its numbers.
//
//   RL_MODULE=/abs/libredis_ratelimit.so node bench/metrics.mjs
//
// Three limiters side by side: off, metrics only, metrics and deny events.
//
// Knobs: BENCH_NODE_SECONDS (per run, 3), BENCH_NODE_ROUNDS (3),
// BENCH_NODE_CALLERS (concurrent check loops, 64), BENCH_NODE_KEYS
// (distinct identities, 1000).
import { mkdtempSync, rmSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { Redis } from 'ioredis';
import { Registry } from 'prom-client';
import { Client, DenyEvents, Limiter } from 'redis-ratelimit';
import { startServer, STILL_MS } from '../test/servers.mjs';

const SECONDS = Number(process.env.BENCH_NODE_SECONDS ?? 3);
const ROUNDS = Number(process.env.BENCH_NODE_ROUNDS ?? 3);
const CALLERS = Number(process.env.BENCH_NODE_CALLERS ?? 64);
const KEYS = Number(process.env.BENCH_NODE_KEYS ?? 1000);

const server = await startServer();
const redis = new Redis({ port: server.port, host: '127.0.0.1' });
const client = new Client(redis);
const dir = mkdtempSync(path.join(os.tmpdir(), 'rl-bench-events-'));
const events = new DenyEvents({ file: path.join(dir, 'deny.jsonl'), metrics: new Registry() });

// A deadline long enough that a loaded machine's slow answer is still Redis's (not the fallback's).
const base = { deadlineMs: 2000 };
const limiters = {
  off: new Limiter(client, base),
  metrics: new Limiter(client, { ...base, metrics: new Registry() }),
  on: new Limiter(client, { ...base, metrics: new Registry(), denyEvents: events }),
};

const workloads = {
  'admitted by Redis (one round trip each)': { limit: 1_000_000_000, prefix: 'adm' },
  'denied by the deny cache (in process)': { limit: 1, prefix: 'den' },
};

/** CALLERS loops of check() for SECONDS; returns { decisions, denied }. */
async function load(limiter, set) {
  const deadline = Date.now() + SECONDS * 1000;
  let decisions = 0;
  let denied = 0;
  let n = 0;
  await Promise.all(
    Array.from({ length: CALLERS }, async () => {
      let i = 0;
      while (Date.now() < deadline) {
        const d = await limiter.check(set, `u${n++ % KEYS}`);
        decisions++;
        if (!d.allowed) denied++;
        // In-process answers never wait for I/O: let timers (the flusher) run, as a server's requests would.
        if (++i % 100 === 0) await new Promise((r) => setImmediate(r));
      }
    }),
  );
  return { decisions, denied };
}

/** Decisions not taken by the path measured (the fallback, when Redis missed the deadline). */
const strays = () => Object.values(limiters).reduce((n, l) => n + l.stats().fallback_admitted + l.stats().fallback_denied, 0);

const results = {};
const sets = {};
for (const [w, { limit, prefix }] of Object.entries(workloads)) {
  for (const [mode, limiter] of Object.entries(limiters)) {
    sets[`${w}/${mode}`] = await limiter.ruleSet([{ name: prefix, spec: { algorithm: 'fixedwindow', limit, windowMs: STILL_MS }, keyPrefix: `rl:${prefix}:${mode}:` }]);
    results[`${w}/${mode}`] = { decisions: 0, seconds: 0, denied: 0 };
  }
}
const limiterOf = (key) => limiters[key.split('/').at(-1)];
for (const [key, set] of Object.entries(sets)) await load(limiterOf(key), set); // warm-up
for (let round = 0; round < ROUNDS; round++) {
  for (const key of Object.keys(sets)) {
    const t0 = process.hrtime.bigint();
    const { decisions, denied } = await load(limiterOf(key), sets[key]);
    const r = results[key];
    r.seconds += Number(process.hrtime.bigint() - t0) / 1e9;
    r.decisions += decisions;
    r.denied += denied;
  }
}
await events.close();
const shipped = events.stats();
redis.disconnect();
await server.stop();
rmSync(dir, { recursive: true, force: true });

console.log(
  `Node Limiter.check with metrics (prom-client) and deny events (file sink) on vs off: ${ROUNDS} interleaved rounds x ${SECONDS} s per run, ` +
    `${CALLERS} concurrent callers on one ioredis client, ${KEYS} identities; limiter and callers in one Node process`,
);
console.log('');
console.log('| workload | decisions/s off | metrics on | / off | metrics + deny events on | / off |');
console.log('|---|---:|---:|---:|---:|---:|');
const rate = (k) => results[k].decisions / results[k].seconds;
for (const w of Object.keys(workloads)) {
  const off = rate(`${w}/off`);
  const m = rate(`${w}/metrics`);
  const on = rate(`${w}/on`);
  console.log(`| ${w} | ${off.toFixed(0)} | ${m.toFixed(0)} | ${(m / off).toFixed(2)}x | ${on.toFixed(0)} | ${(on / off).toFixed(2)}x |`);
}
console.log('');
console.log(`decided by the fallback (Redis past the deadline): ${strays()}`);
console.log(`deny events: ${shipped.shipped} shipped, ${shipped.dropped} dropped (a full buffer drops the oldest), ${shipped.sinkErrors} sink errors`);

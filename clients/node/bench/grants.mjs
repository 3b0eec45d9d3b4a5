// One global rule offered twice its limit, on a 3-master cluster of the
// suite's own (ioredis Cluster), through Limiters ("instances") in one
// process: plain (one round trip per decision), batched (UPTO batches spent
// in process), striped 3, and striped 3 + batched. For each: decisions per
// second, admitted per second against the limit, Redis calls per 1,000
// decisions, and each master's share of the calls (INFO commandstats). A
// benchmark reports; it does not fail on its numbers.
//
//   RL_MODULE=/abs/libredis_ratelimit.so node bench/grants.mjs
//
// Knobs: BENCH_NODE_SECONDS (per run, 3), BENCH_NODE_INSTANCES (Limiters, 4),
// BENCH_NODE_CALLERS (concurrent loops per instance, 16), BENCH_NODE_LIMIT
// (per second, 20000).
import { execFileSync } from 'node:child_process';
import { Cluster } from 'ioredis';
import { Client, Limiter } from 'redis-ratelimit';
import { startCluster } from '../test/servers.mjs';

const SECONDS = Number(process.env.BENCH_NODE_SECONDS ?? 3);
const INSTANCES = Number(process.env.BENCH_NODE_INSTANCES ?? 4);
const CALLERS = Number(process.env.BENCH_NODE_CALLERS ?? 16);
const LIMIT = Number(process.env.BENCH_NODE_LIMIT ?? 20_000);

const cluster = await startCluster();
const redis = new Cluster(cluster.ports.map((port) => ({ host: '127.0.0.1', port })));
await new Promise((resolve) => redis.once('ready', resolve));
const rl = new Client(redis);

/** Limiter calls (rl.*) served by each master so far. */
function callsPerMaster() {
  return cluster.ports.map((p) => {
    const out = execFileSync('redis-cli', ['-p', String(p), 'INFO', 'commandstats']).toString();
    let n = 0;
    for (const m of out.matchAll(/cmdstat_rl\.[a-z]+:calls=(\d+)/gi)) n += Number(m[1]);
    return n;
  });
}

const spec = { algorithm: 'tokenbucket', capacity: LIMIT, refillCount: LIMIT, refillMs: 1000 };
const variants = {
  plain: {},
  batched: { batched: true },
  'striped 3': { striped: 3 },
  'striped 3 + batched': { striped: 3, batched: true },
};

const rows = [];
let run = 0;
for (const [name, options] of Object.entries(variants)) {
  const key = `bench:grants:${process.pid}:${++run}`;
  const limiters = Array.from({ length: INSTANCES }, () => new Limiter(rl, { localLevel: false, denyCache: false, deadlineMs: 1000 }));
  const sets = await Promise.all(limiters.map((l) => l.ruleSet([{ name: 'bench', key, global: true, spec, ...options }])));
  const before = callsPerMaster();
  const t0 = performance.now();
  const deadline = t0 + SECONDS * 1000;
  let decisions = 0;
  let admitted = 0;
  await Promise.all(
    limiters.flatMap((l, i) =>
      Array.from({ length: CALLERS }, async () => {
        // Offer about twice the limit in all: a caller waits its turn so that the load stays bounded.
        const perCaller = (2 * LIMIT) / (INSTANCES * CALLERS);
        let next = performance.now();
        while (performance.now() < deadline) {
          const d = await l.check(sets[i], 'x');
          decisions++;
          if (d.allowed) admitted++;
          next += 1000 / perCaller;
          const lag = next - performance.now();
          if (lag > 0) await new Promise((r) => setTimeout(r, lag));
        }
      }),
    ),
  );
  const seconds = (performance.now() - t0) / 1000;
  await Promise.all(limiters.map((l) => l.close()));
  const calls = callsPerMaster().map((n, i) => n - (before[i] ?? 0));
  const total = calls.reduce((a, b) => a + b, 0);
  rows.push({
    name,
    decisionsPerS: Math.round(decisions / seconds),
    admittedPerS: Math.round(admitted / seconds),
    // the bucket starts full: capacity + refill over the run
    bound: Math.round((LIMIT + LIMIT * seconds) / seconds),
    callsPer1000: Math.round((total / decisions) * 1000 * 10) / 10,
    share: calls.map((n) => `${Math.round((n / Math.max(total, 1)) * 100)}%`).join(' / '),
  });
}

console.log(`\n${INSTANCES} instances x ${CALLERS} callers offering ~${2 * LIMIT}/s to one token bucket of ${LIMIT}/s, ${SECONDS} s each, 3-master cluster\n`);
console.log('| rule | decisions/s | admitted/s | bound/s | Redis calls / 1,000 decisions | calls per master |');
console.log('| --- | ---: | ---: | ---: | ---: | --- |');
for (const r of rows) console.log(`| ${r.name} | ${r.decisionsPerS} | ${r.admittedPerS} | ${r.bound} | ${r.callsPer1000} | ${r.share} |`);
redis.disconnect();
await cluster.stop();

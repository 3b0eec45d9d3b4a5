// rate-limiter-flexible's RateLimiterRedis (its Lua script) against
// RateLimiterRL (the module), side by side in one run: consume() decisions
// per second with CALLERS concurrent callers on one ioredis client, and the
// Redis server's commands and CPU per decision, in interleaved rounds on one
// redis-server with the module. Prints a Markdown table. A benchmark reports;
// it does not fail on its numbers.
//
//   RL_MODULE=/abs/libredis_ratelimit.so node bench/flexible.mjs
//
// Knobs: BENCH_NODE_SECONDS (per run, 3), BENCH_NODE_ROUNDS (3),
// BENCH_NODE_CALLERS (concurrent consume loops, 64), BENCH_NODE_KEYS
// (distinct keys, 1000).
import { execFileSync } from 'node:child_process';
import { Redis } from 'ioredis';
import { RateLimiterRedis } from 'rate-limiter-flexible';
import { RateLimiterRL } from 'redis-ratelimit';
import { startServer } from '../test/servers.mjs';

const SECONDS = Number(process.env.BENCH_NODE_SECONDS ?? 3);
const ROUNDS = Number(process.env.BENCH_NODE_ROUNDS ?? 3);
const CALLERS = Number(process.env.BENCH_NODE_CALLERS ?? 64);
const KEYS = Number(process.env.BENCH_NODE_KEYS ?? 1000);
// High enough that every consume is admitted: the cost of counting, not of denials.
const POINTS = 100_000;
const DURATION = 60;

const server = await startServer();
const redis = new Redis({ port: server.port, host: '127.0.0.1' });

const limiters = {
  'RateLimiterRedis (Lua)': new RateLimiterRedis({ storeClient: redis, points: POINTS, duration: DURATION, keyPrefix: 'flx' }),
  'RateLimiterRL (RL.SLIDING)': new RateLimiterRL({ storeClient: redis, points: POINTS, duration: DURATION, keyPrefix: 'rls' }),
  "RateLimiterRL window: 'fixed' (RL.FIXEDWINDOW)": new RateLimiterRL({ storeClient: redis, points: POINTS, duration: DURATION, keyPrefix: 'rlf', window: 'fixed' }),
};

function info() {
  const out = execFileSync('redis-cli', ['-p', String(server.port), 'INFO', 'all']).toString();
  const f = (name) => Number(new RegExp(`${name}:([0-9.]+)`).exec(out)?.[1] ?? 0);
  return { cpu: f('used_cpu_user') + f('used_cpu_sys'), commands: f('total_commands_processed') };
}

/** CALLERS loops of consume() for SECONDS; returns { ok, other }. */
async function load(limiter) {
  const deadline = Date.now() + SECONDS * 1000;
  let ok = 0;
  let other = 0;
  let n = 0;
  await Promise.all(
    Array.from({ length: CALLERS }, async () => {
      while (Date.now() < deadline) {
        try {
          await limiter.consume(`u${n++ % KEYS}`);
          ok++;
        } catch {
          other++;
        }
      }
    }),
  );
  return { ok, other };
}

const results = Object.fromEntries(Object.keys(limiters).map((k) => [k, { decisions: 0, seconds: 0, cpu: 0, commands: 0, other: 0 }]));
for (const l of Object.values(limiters)) await load(l); // warm-up, also loads the Lua script
for (let round = 0; round < ROUNDS; round++) {
  for (const [name, l] of Object.entries(limiters)) {
    await redis.flushall();
    const i0 = info();
    const t0 = process.hrtime.bigint();
    const { ok, other } = await load(l);
    const seconds = Number(process.hrtime.bigint() - t0) / 1e9;
    const i1 = info();
    const r = results[name];
    r.decisions += ok + other;
    r.other += other;
    r.seconds += seconds;
    r.cpu += i1.cpu - i0.cpu;
    r.commands += i1.commands - i0.commands - 1; // less the INFO itself
  }
}
redis.disconnect();
await server.stop();

const base = results['RateLimiterRedis (Lua)'];
const baseRate = base.decisions / base.seconds;
console.log(
  `Node limiters: consume() in ${ROUNDS} interleaved rounds x ${SECONDS} s per limiter, ${CALLERS} concurrent callers on one ioredis client, ` +
    `${KEYS} keys, every call admitted (${POINTS} points per ${DURATION} s); limiter and callers in one Node process`,
);
console.log('');
console.log('| limiter | decisions/s | vs RateLimiterRedis | Redis commands per decision | Redis CPU per decision (µs) | vs RateLimiterRedis | not admitted |');
console.log('|---|---:|---:|---:|---:|---:|---:|');
for (const [name, r] of Object.entries(results)) {
  const rate = r.decisions / r.seconds;
  const cpu = r.cpu / r.decisions;
  console.log(
    `| ${name} | ${rate.toFixed(0)} | ${(rate / baseRate).toFixed(2)}x | ${(r.commands / r.decisions).toFixed(2)} | ${(cpu * 1e6).toFixed(1)} | ${(cpu / (base.cpu / base.decisions)).toFixed(2)}x | ${r.other} |`,
  );
}

// express-rate-limit on rate-limit-redis's RedisStore (a Lua script) against
// RLStore (RL.SLIDING, and RL.FIXEDWINDOW), side by side in one run: requests
// per second through Express and the Redis server's CPU per request, in
// interleaved rounds on one redis-server with the module. Prints a Markdown
// table. A benchmark reports; it does not fail on its numbers.
//
//   RL_MODULE=/abs/libredis_ratelimit.so node bench/stores.mjs
//
// Knobs: BENCH_NODE_SECONDS (per run, 3), BENCH_NODE_ROUNDS (3),
// BENCH_NODE_CONNECTIONS (keep-alive HTTP connections, 32), BENCH_NODE_KEYS
// (distinct clients, 1000).
import http from 'node:http';
import { execFileSync } from 'node:child_process';
import express from 'express';
import { rateLimit } from 'express-rate-limit';
import { RedisStore } from 'rate-limit-redis';
import { createClient } from 'redis';
import { RLStore } from 'redis-ratelimit';
import { startServer } from '../test/servers.mjs';

const SECONDS = Number(process.env.BENCH_NODE_SECONDS ?? 3);
const ROUNDS = Number(process.env.BENCH_NODE_ROUNDS ?? 3);
const CONNECTIONS = Number(process.env.BENCH_NODE_CONNECTIONS ?? 32);
const KEYS = Number(process.env.BENCH_NODE_KEYS ?? 1000);
// High enough that every request is admitted: the cost of counting, not of 429s.
const LIMIT = 100_000;
const WINDOW_MS = 60_000;

const server = await startServer();
const client = createClient({ url: server.url });
await client.connect();
const sendCommand = (...args) => client.sendCommand(args);

const stores = {
  'rate-limit-redis (Lua)': () => new RedisStore({ sendCommand, prefix: 'rlr:' }),
  'RLStore (RL.SLIDING)': () => new RLStore({ sendCommand, prefix: 'rls:' }),
  "RLStore window: 'fixed' (RL.FIXEDWINDOW)": () => new RLStore({ sendCommand, prefix: 'rlf:', window: 'fixed' }),
};

async function app(store) {
  const a = express();
  a.use(rateLimit({ windowMs: WINDOW_MS, limit: LIMIT, store, keyGenerator: (req) => req.get('x-user'), standardHeaders: 'draft-8', legacyHeaders: false }));
  a.get('/', (_req, res) => res.send('ok'));
  const s = await new Promise((resolve) => {
    const srv = a.listen(0, '127.0.0.1', () => resolve(srv));
  });
  return s;
}

function redisCpu() {
  const info = execFileSync('redis-cli', ['-p', String(server.port), 'INFO', 'cpu']).toString();
  const f = (name) => Number(new RegExp(`${name}:([0-9.]+)`).exec(info)[1]);
  return f('used_cpu_user') + f('used_cpu_sys');
}

/** Drives `port` with CONNECTIONS keep-alive loops for SECONDS; returns { ok, other }. */
async function load(port) {
  const agent = new http.Agent({ keepAlive: true, maxSockets: CONNECTIONS });
  const deadline = Date.now() + SECONDS * 1000;
  let ok = 0;
  let other = 0;
  let n = 0;
  const one = () =>
    new Promise((resolve, reject) => {
      const req = http.get({ host: '127.0.0.1', port, path: '/', agent, headers: { 'x-user': `u${n++ % KEYS}` } }, (res) => {
        if (res.statusCode === 200) ok++;
        else other++;
        res.resume();
        res.on('end', resolve);
      });
      req.on('error', reject);
    });
  await Promise.all(
    Array.from({ length: CONNECTIONS }, async () => {
      while (Date.now() < deadline) await one();
    }),
  );
  agent.destroy();
  return { ok, other };
}

const results = Object.fromEntries(Object.keys(stores).map((k) => [k, { requests: 0, seconds: 0, cpu: 0, other: 0 }]));
const apps = {};
for (const [name, make] of Object.entries(stores)) apps[name] = await app(make());
for (const name of Object.keys(stores)) await load(apps[name].address().port); // warm-up, also loads the Lua script
for (let round = 0; round < ROUNDS; round++) {
  for (const name of Object.keys(stores)) {
    await client.flushAll();
    const cpu0 = redisCpu();
    const t0 = process.hrtime.bigint();
    const { ok, other } = await load(apps[name].address().port);
    const seconds = Number(process.hrtime.bigint() - t0) / 1e9;
    const r = results[name];
    r.requests += ok + other;
    r.other += other;
    r.seconds += seconds;
    r.cpu += redisCpu() - cpu0;
  }
}
for (const s of Object.values(apps)) s.close();
client.destroy();
await server.stop();

const base = results['rate-limit-redis (Lua)'];
const baseRps = base.requests / base.seconds;
const baseCpu = base.cpu / base.requests;
console.log(`Node stores: express-rate-limit ${ROUNDS} interleaved rounds x ${SECONDS} s per store, ${CONNECTIONS} keep-alive connections, ${KEYS} clients, every request admitted (limit ${LIMIT} per ${WINDOW_MS / 1000} s); app and load generator in one Node process`);
console.log('');
console.log('| store | requests/s through Express | vs rate-limit-redis | Redis CPU per request (µs) | vs rate-limit-redis | non-200 |');
console.log('|---|---:|---:|---:|---:|---:|');
for (const [name, r] of Object.entries(results)) {
  const rps = r.requests / r.seconds;
  const cpu = r.cpu / r.requests;
  console.log(`| ${name} | ${rps.toFixed(0)} | ${(rps / baseRps).toFixed(2)}x | ${(cpu * 1e6).toFixed(1)} | ${(cpu / baseCpu).toFixed(2)}x | ${r.other} |`);
}

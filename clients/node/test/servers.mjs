// Real servers for the tests: redis-server with the module (RL_MODULE) on a
// free loopback port, plain ones (for rate-limiter-flexible's own stores),
// and a 3-master cluster of the suite's own. Each is stopped by stop().
import assert from 'node:assert/strict';
import { spawn, execFileSync } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';

export const MODULE = process.env.RL_MODULE || '/tmp/rl-kits.so';
const SERVER = process.env.REDIS_SERVER || 'redis-server';

function freePort() {
  return new Promise((resolve, reject) => {
    const s = net.createServer();
    s.unref();
    s.on('error', reject);
    s.listen(0, '127.0.0.1', () => {
      const { port } = s.address();
      s.close(() => resolve(port));
    });
  });
}

/** A port p with p and p + 10000 (the cluster bus) both free. */
async function freeClusterPort() {
  for (;;) {
    const p = await freePort();
    if (p + 10000 > 65535) continue;
    const ok = await new Promise((resolve) => {
      const s = net.createServer();
      s.once('error', () => resolve(false));
      s.listen(p + 10000, '127.0.0.1', () => s.close(() => resolve(true)));
    });
    if (ok) return p;
  }
}

function ping(port) {
  return new Promise((resolve) => {
    const sock = net.connect(port, '127.0.0.1');
    sock.once('error', () => resolve(false));
    sock.once('data', (d) => {
      sock.destroy();
      resolve(d.toString().startsWith('+PONG'));
    });
    sock.write('PING\r\n');
  });
}

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

/**
 * A fixed window's length for tests that read a window across calls: windows
 * are aligned to the epoch, so a one-minute window turns over at every minute
 * boundary, which a test's wait may straddle. 2^40 ms windows (the module's
 * bound) turn over in 2004 and 2039 only.
 */
export const STILL_MS = 2 ** 40;

/**
 * Starts a server; { module: false } for a plain one. Returns
 * { port, url, stop(), kill() }.
 */
export async function startServer({ module = true, port, extra = [], binary = SERVER } = {}) {
  port ??= await freePort();
  const dir = mkdtempSync(path.join(os.tmpdir(), 'rl-node-'));
  const args = ['--port', String(port), '--bind', '127.0.0.1', '--save', '', '--appendonly', 'no', '--dir', dir, ...extra];
  if (module) args.push('--loadmodule', MODULE);
  const proc = spawn(binary, args, { stdio: ['ignore', 'ignore', 'pipe'] });
  let stderr = '';
  proc.stderr.on('data', (d) => (stderr += d));
  const deadline = Date.now() + 10_000;
  while (!(await ping(port))) {
    if (proc.exitCode !== null || Date.now() > deadline) {
      throw new Error(`${binary} did not start on ${port}: ${stderr}`);
    }
    await sleep(20);
  }
  const stop = async () => {
    if (proc.exitCode === null) {
      const exited = new Promise((r) => proc.once('exit', r));
      proc.kill('SIGKILL');
      await exited;
    }
    rmSync(dir, { recursive: true, force: true });
  };
  return { port, url: `redis://127.0.0.1:${port}`, proc, stop, kill: stop };
}

/** A cluster of 3 masters, no replicas, the module on each. */
export async function startCluster() {
  const nodes = [];
  for (let i = 0; i < 3; i++) {
    const port = await freeClusterPort();
    nodes.push(
      await startServer({
        port,
        extra: ['--cluster-enabled', 'yes', '--cluster-config-file', `nodes-${port}.conf`, '--cluster-node-timeout', '5000'],
      }),
    );
  }
  execFileSync('redis-cli', ['--cluster', 'create', ...nodes.map((n) => `127.0.0.1:${n.port}`), '--cluster-replicas', '0', '--cluster-yes'], {
    stdio: 'ignore',
  });
  const deadline = Date.now() + 20_000;
  for (const n of nodes) {
    for (;;) {
      const info = execFileSync('redis-cli', ['-p', String(n.port), 'CLUSTER', 'INFO']).toString();
      if (info.includes('cluster_state:ok')) break;
      if (Date.now() > deadline) throw new Error('cluster did not become ok');
      await sleep(50);
    }
  }
  return {
    nodes,
    ports: nodes.map((n) => n.port),
    /** Sum of an INFO errorstats counter (MOVED, ASK) over the nodes. */
    errorstat(name) {
      let sum = 0;
      for (const n of nodes) {
        const info = execFileSync('redis-cli', ['-p', String(n.port), 'INFO', 'errorstats']).toString();
        const m = new RegExp(`errorstat_${name}:count=(\\d+)`).exec(info);
        if (m) sum += Number(m[1]);
      }
      return sum;
    },
    async stop() {
      await Promise.all(nodes.map((n) => n.stop()));
    },
  };
}

/** The clients under test, each as { name, make(server), close(client) }. */
export async function clientKinds() {
  const { createClient } = await import('redis');
  const redis4 = await import('redis4');
  const redis6 = await import('redis6');
  const { Redis } = await import('ioredis');
  const io6 = await import('ioredis6');
  return [
    {
      name: 'node-redis v6',
      async make(port) {
        const c = redis6.createClient({ url: `redis://127.0.0.1:${port}` });
        c.on('error', () => {});
        await c.connect();
        return c;
      },
      close: (c) => c.destroy(),
    },
    {
      name: 'node-redis v5',
      async make(port) {
        const c = createClient({ url: `redis://127.0.0.1:${port}` });
        c.on('error', () => {});
        await c.connect();
        return c;
      },
      close: (c) => (c.destroy ? c.destroy() : c.disconnect()),
    },
    {
      name: 'node-redis v4',
      async make(port) {
        const c = redis4.createClient({ url: `redis://127.0.0.1:${port}` });
        c.on('error', () => {});
        await c.connect();
        return c;
      },
      close: (c) => c.disconnect(),
    },
    {
      name: 'ioredis',
      async make(port) {
        const c = new Redis({ port, host: '127.0.0.1', lazyConnect: true });
        c.on('error', () => {});
        await c.connect();
        return c;
      },
      close: (c) => c.disconnect(),
    },
    {
      name: 'ioredis v6',
      async make(port) {
        const c = new io6.Redis({ port, host: '127.0.0.1', lazyConnect: true });
        c.on('error', () => {});
        await c.connect();
        return c;
      },
      close: (c) => c.disconnect(),
    },
  ];
}

export async function clusterKinds() {
  const { createCluster } = await import('redis');
  const redis4 = await import('redis4');
  const redis6 = await import('redis6');
  const { Cluster } = await import('ioredis');
  const io6 = await import('ioredis6');
  return [
    {
      name: 'node-redis v6 cluster',
      async make(ports) {
        const c = redis6.createCluster({ rootNodes: ports.map((p) => ({ url: `redis://127.0.0.1:${p}` })) });
        c.on('error', () => {});
        await c.connect();
        return c;
      },
      close: (c) => c.destroy(),
    },
    {
      name: 'node-redis v5 cluster',
      async make(ports) {
        const c = createCluster({ rootNodes: ports.map((p) => ({ url: `redis://127.0.0.1:${p}` })) });
        c.on('error', () => {});
        await c.connect();
        return c;
      },
      close: (c) => (c.destroy ? c.destroy() : c.disconnect()),
    },
    {
      name: 'node-redis v4 cluster',
      async make(ports) {
        const c = redis4.createCluster({ rootNodes: ports.map((p) => ({ url: `redis://127.0.0.1:${p}` })) });
        c.on('error', () => {});
        await c.connect();
        return c;
      },
      close: (c) => c.disconnect(),
    },
    {
      name: 'ioredis v6 cluster',
      async make(ports) {
        const c = new io6.Cluster(ports.map((p) => ({ host: '127.0.0.1', port: p })));
        c.on('error', () => {});
        await new Promise((resolve, reject) => {
          c.once('ready', resolve);
          c.once('error', reject);
        });
        return c;
      },
      close: (c) => c.disconnect(),
    },
    {
      name: 'ioredis cluster',
      async make(ports) {
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
}

export { sleep };

/**
 * `call()` returns a promise that rejects as `check` says, and never throws
 * synchronously (a `.then().catch()` caller would miss the throw).
 */
export async function rejectsAtOnce(call, check, message) {
  let p;
  assert.doesNotThrow(() => {
    p = call();
  }, message);
  await assert.rejects(p, check, message);
}

// A plain node:http server with RateLimiterRL: 5 login attempts per 15 s per
// IP, then blocked for 60 s. From rate-limiter-flexible, only the class name
// changed.
//
//   REDIS_PORT=6379 node examples/plain-node.mjs
//   for i in 1 2 3 4 5 6 7; do curl -s -o /dev/null -w '%{http_code} ' localhost:3001/login; done
//   curl localhost:3001/metrics        # Prometheus (prom-client's global register)
import http from 'node:http';
import { Redis } from 'ioredis';
import { register } from 'prom-client';
import { RateLimiterMemory } from 'rate-limiter-flexible';
import { RateLimiterRL } from 'redis-ratelimit';

const redis = new Redis({ port: Number(process.env.REDIS_PORT ?? 6379), enableOfflineQueue: false });
const limiter = new RateLimiterRL({
  storeClient: redis,
  keyPrefix: 'login',
  points: 5,
  duration: 15,
  blockDuration: 60,
  // Redis down or slower than 100 ms: each instance limits on its own, never
  // beyond its share of what Redis may already have counted (instances: 3 -> 2).
  instances: 3,
  insuranceLimiter: new RateLimiterMemory({ points: 2, duration: 15 }),
  // ratelimit_decisions_total{rule="login",...}: Redis, in-memory blocks, the insurance limiter.
  metrics: true,
});

// Waits for the connection (the offline queue is off), then checks MODULE LIST.
await limiter.checkModule();

const server = http.createServer(async (req, res) => {
  if (req.url === '/metrics') {
    res.writeHead(200, { 'Content-Type': register.contentType }).end(await register.metrics());
    return;
  }
  try {
    const r = await limiter.consume(req.socket.remoteAddress ?? 'unknown');
    res.writeHead(200, { 'RateLimit-Remaining': String(r.remainingPoints) }).end('ok\n');
  } catch (r) {
    if (r instanceof Error) return res.writeHead(500).end('limiter failed\n');
    res.writeHead(429, { 'Retry-After': String(Math.ceil(r.msBeforeNext / 1000)) }).end('too many attempts\n');
  }
});
server.listen(Number(process.env.PORT ?? 3001), () => console.log(`listening on ${server.address().port}`));

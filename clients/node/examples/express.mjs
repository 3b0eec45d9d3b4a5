// express-rate-limit on RLStore: 100 requests per minute per client, on an
// exact sliding window kept by the module. From rate-limit-redis, only the
// import and the class name changed.
//
//   REDIS_URL=redis://127.0.0.1:6379 node examples/express.mjs
//   curl -i localhost:3000/
//   curl localhost:3000/metrics        # Prometheus (prom-client's global register)
//
// LIMIT (default 100) changes the limit; DENY_EVENTS_FILE=/path/deny.jsonl or
// DENY_EVENTS_URL=http://127.0.0.1:9200 (Elasticsearch _bulk) ships denials.
import express from 'express';
import { rateLimit } from 'express-rate-limit';
import { register } from 'prom-client';
import { createClient } from 'redis';
import { Client, DenyEvents, RLStore } from 'redis-ratelimit';

const client = createClient({ url: process.env.REDIS_URL ?? 'redis://127.0.0.1:6379' });
await client.connect();
await new Client(client).checkModule(); // fails at start-up, not per request, on a server without the module

const sink = process.env.DENY_EVENTS_FILE ? { file: process.env.DENY_EVENTS_FILE } : process.env.DENY_EVENTS_URL ? { bulkUrl: process.env.DENY_EVENTS_URL } : undefined;
const denyEvents = sink === undefined ? undefined : new DenyEvents({ ...sink, metrics: true });

const app = express();
// Before the limiter: a scrape is never limited.
app.get('/metrics', async (_req, res) => {
  res.set('Content-Type', register.contentType);
  res.send(await register.metrics());
});
app.use(
  rateLimit({
    windowMs: 60_000,
    limit: Number(process.env.LIMIT ?? 100),
    standardHeaders: 'draft-8',
    legacyHeaders: false,
    skipFailedRequests: true, // a 5xx gives its unit back (REFUND); a 429 does not
    // metrics: ratelimit_decisions_total{rule="api",...}, round trips, remaining ratio.
    store: new RLStore({ sendCommand: (...args) => client.sendCommand(args), name: 'api', metrics: true, denyEvents }),
  }),
);
app.get('/', (_req, res) => res.send('hello\n'));
const server = app.listen(Number(process.env.PORT ?? 3000), () => console.log(`listening on ${server.address().port}`));
process.once('SIGTERM', async () => {
  server.close();
  await denyEvents?.close(); // ships what is left
  await client.quit();
});

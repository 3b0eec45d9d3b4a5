// express-rate-limit on RLStore: 100 requests per minute per client, on an
// exact sliding window kept by the module. From rate-limit-redis, only the
// import and the class name changed.
//
//   REDIS_URL=redis://127.0.0.1:6379 node examples/express.mjs
//   curl -i localhost:3000/
import express from 'express';
import { rateLimit } from 'express-rate-limit';
import { createClient } from 'redis';
import { Client, RLStore } from 'redis-ratelimit';

const client = createClient({ url: process.env.REDIS_URL ?? 'redis://127.0.0.1:6379' });
await client.connect();
await new Client(client).checkModule(); // fails at start-up, not per request, on a server without the module

const app = express();
app.use(
  rateLimit({
    windowMs: 60_000,
    limit: 100,
    standardHeaders: 'draft-8',
    legacyHeaders: false,
    skipFailedRequests: true, // a 5xx gives its unit back (REFUND); a 429 does not
    store: new RLStore({ sendCommand: (...args) => client.sendCommand(args) }),
  }),
);
app.get('/', (_req, res) => res.send('hello\n'));
const server = app.listen(Number(process.env.PORT ?? 3000), () => console.log(`listening on ${server.address().port}`));

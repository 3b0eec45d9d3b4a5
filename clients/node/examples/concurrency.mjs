// Caps on work in flight: at most 2 report requests per user at once (the
// rest 429 at once), and at most 4 exports at once across every instance,
// waiting in the server (BLOCK) for a free slot up to 10 s.
//
//   REDIS_URL=redis://127.0.0.1:6379 node examples/concurrency.mjs
//   for i in 1 2 3; do curl -s -o /dev/null -w '%{http_code} ' -H 'x-user: ann' localhost:3002/report & done; wait
import express from 'express';
import { createClient } from 'redis';
import { Client, RLDeniedError, concurrencyLimit } from 'redis-ratelimit';

const client = await createClient({ url: process.env.REDIS_URL ?? 'redis://127.0.0.1:6379' }).connect();
const rl = new Client(client);
await rl.checkModule();

const app = express();
app.get(
  '/report',
  // A lease per request, released when the response finishes or the client leaves.
  concurrencyLimit({ client: rl, limit: 2, leaseMs: 30_000, keyGenerator: (req) => req.get('x-user') }),
  async (_req, res) => {
    await new Promise((r) => setTimeout(r, 2000)); // a slow report
    res.send('report\n');
  },
);
app.post('/export', async (_req, res) => {
  try {
    const rows = await rl.withLease(
      'exports',
      // A short lease, renewed in the background while the export runs: a
      // crashed instance frees its slot within 5 s, and a waiter may wait (the
      // server denies at once a wait, counted by the leases' expiry, above timeoutMs).
      { limit: 4, leaseMs: 5000 },
      async (lease) => {
        // lease.signal aborts if the lease was lost (a renewal came too late).
        await new Promise((r) => setTimeout(r, 1000));
        return lease.signal.aborted ? 0 : 1000;
      },
      { timeoutMs: 10_000, autoRenew: true },
    );
    res.send(`exported ${rows} rows\n`);
  } catch (err) {
    if (!(err instanceof RLDeniedError)) throw err;
    res.set('Retry-After', String(err.decision.retryAfterS ?? 60)).status(429).send('busy\n');
  }
});
const server = app.listen(Number(process.env.PORT ?? 3002), () => console.log(`listening on ${server.address().port}`));

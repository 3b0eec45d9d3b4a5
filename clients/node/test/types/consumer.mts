// What a TypeScript user writes, checked by `npm run typecheck` against the
// built .d.ts: RLStore where express-rate-limit (v8 and v7) wants a Store,
// RateLimiterRL where rate-limiter-flexible's users hold a limiter.
import { rateLimit, type Store } from 'express-rate-limit';
import { rateLimit as rateLimit7, type Store as Store7 } from 'erl7';
import { createClient } from 'redis';
import { Redis } from 'ioredis';
import { RateLimiterMemory, type RateLimiterRes as FlexRes } from 'rate-limiter-flexible';
import { Decision, RL, RLStore, RateLimiterRL, RateLimiterRes } from 'redis-ratelimit';

const client = createClient();
const redis = new Redis();

const store: Store = new RLStore({ sendCommand: (...args: string[]) => client.sendCommand(args) });
const store7: Store7 = new RLStore({ sendCommand: (command: string, ...args: string[]) => redis.call(command, ...args) as Promise<unknown> });
rateLimit({ windowMs: 60_000, limit: 100, store });
rateLimit7({ windowMs: 60_000, limit: 100, store: store7 });

const limiter = new RateLimiterRL({ storeClient: redis, points: 5, duration: 1, insuranceLimiter: new RateLimiterMemory({ points: 1, duration: 1 }) });
export async function use(): Promise<number> {
  const d: Decision = await new RL(client).sliding('k', { limit: 5, windowMs: 1000 });
  const r: RateLimiterRes = await limiter.consume('k');
  const f: Pick<FlexRes, 'msBeforeNext' | 'remainingPoints' | 'consumedPoints' | 'isFirstInDuration'> = r;
  return d.remaining + f.msBeforeNext;
}

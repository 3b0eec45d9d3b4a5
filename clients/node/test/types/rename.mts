// rate-limit-redis's own TypeScript examples (its readme), with only the
// import and the class name changed: RLStore is a rename of RedisStore.
import { rateLimit } from 'express-rate-limit';
import { RLStore, type RedisReply, type SendCommandClusterDetails } from 'redis-ratelimit';
import DefaultStore from 'redis-ratelimit';
import { createClient, createCluster } from 'redis';
// (the readme's `import RedisClient from 'ioredis'` is ioredis's CommonJS default, which NodeNext's ESM reads as the module)
import { Redis as RedisClient } from 'ioredis';

// node-redis
const client = createClient({});
export const nodeRedis = rateLimit({
  windowMs: 15 * 60 * 1000,
  max: 100,
  standardHeaders: true,
  legacyHeaders: false,
  store: new RLStore({
    sendCommand: (...args: string[]) => client.sendCommand(args),
  }),
});

// ioredis
const io = new RedisClient();
export const ioredis = rateLimit({
  windowMs: 15 * 60 * 1000,
  max: 100,
  standardHeaders: true,
  legacyHeaders: false,
  store: new RLStore({
    sendCommand: (command: string, ...args: string[]) => io.call(command, ...args) as Promise<RedisReply>,
  }),
});

// node-redis cluster
const cluster = createCluster({ rootNodes: [] });
export const clustered = rateLimit({
  store: new DefaultStore({
    sendCommandCluster: ({ key, isReadOnly, command }: SendCommandClusterDetails) => cluster.sendCommand(key, isReadOnly, command) as Promise<RedisReply>,
  }),
});

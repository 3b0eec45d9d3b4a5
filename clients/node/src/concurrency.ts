import type { IncomingMessage, ServerResponse } from 'node:http';
import { Client } from './client.js';
import type { Decision } from './decision.js';
import { checkInteger, checkString, describe, InvalidArgumentError, RLDeniedError } from './errors.js';
import { denialBody } from './headers.js';
import type { Lease } from './lease.js';
import { MAX_HELD } from './rules.js';
import type { RedisLike } from './transport.js';

/** `concurrencyLimit`'s options. */
export interface ConcurrencyLimitOptions<Req extends IncomingMessage = IncomingMessage, Res extends ServerResponse = ServerResponse> {
  /** A node-redis or ioredis client or cluster, or a `Client` (whose acquire connections are then shared). */
  client: RedisLike | Client;
  /** Requests in flight per key. With `policy`, the policy's limit applies instead. */
  limit?: number;
  /**
   * How long a lease lasts if its release never comes (a crashed process):
   * longer than the slowest request, or use `autoRenew`.
   */
  leaseMs?: number;
  /** A CONCURRENCY policy kept in the server (`RL.HIT`), instead of `limit` and `leaseMs`. */
  policy?: string;
  /** The request's key: a user, a tenant, an API key (default: the client's address, `req.ip` under Express). */
  keyGenerator?: (req: Req, res: Res) => string | undefined | Promise<string | undefined>;
  /** The name in `RateLimit-Policy` and `RateLimit` (default `concurrency`). */
  name?: string;
  /** Prepended to the key in Redis (default `rl:<name>:`). */
  prefix?: string;
  /**
   * Wait for a free slot in the server (`BLOCK`, on connections of their
   * own) up to this many ms before answering 429 (0: no limit). Default:
   * do not wait.
   */
  timeoutMs?: number;
  /** Renew each lease in the background while its request runs, so requests longer than `leaseMs` keep their slot. */
  autoRenew?: boolean;
  /** When Redis fails, let the request through unlimited (default false: the error goes to `next`, a 500). */
  passOnStoreError?: boolean;
  /** Also send `X-RateLimit-Limit`, `-Remaining` and `-Reset` (default false). */
  xRateLimitHeaders?: boolean;
  /** Answers a denial instead of the kit's 429 problem (after the headers are set). */
  handler?: (req: Req, res: Res, next: (err?: unknown) => void, decision: Decision) => void;
}

type Next = (err?: unknown) => void;

/**
 * Express (or plain `node:http`, connect) middleware that caps the requests
 * in flight per key: a lease (`RL.CONCURRENCY`) is taken when the request
 * starts and released when its response has finished or its connection has
 * closed, whichever comes first, also when the handler failed. Over the cap
 * it answers 429 with `Retry-After` and the IETF fields (`RateLimit-Policy`
 * without `w`: a concurrency limit has no window) and a problem body, as the
 * other kits' HTTP layers.
 *
 * ```ts
 * app.use('/reports', concurrencyLimit({ client, limit: 2, leaseMs: 60_000, keyGenerator: (req) => req.get('x-user') }))
 * ```
 */
export function concurrencyLimit<Req extends IncomingMessage = IncomingMessage, Res extends ServerResponse = ServerResponse>(
  options: ConcurrencyLimitOptions<Req, Res>,
): (req: Req, res: Res, next: Next) => void {
  if (options === null || typeof options !== 'object') {
    throw new InvalidArgumentError('options', `concurrencyLimit options must be an object, got ${describe(options)}`);
  }
  const name = options.name ?? 'concurrency';
  checkString('name', name);
  if (/["\\]/.test(name)) throw new InvalidArgumentError('name', `name goes in a quoted header field: no " or \\, got ${JSON.stringify(name)}`);
  const prefix = options.prefix ?? `rl:${name}:`;
  if (typeof prefix !== 'string') throw new InvalidArgumentError('prefix', `prefix must be a string, got ${describe(prefix)}`);
  const { keyGenerator, handler } = options;
  if (keyGenerator !== undefined && typeof keyGenerator !== 'function') {
    throw new InvalidArgumentError('keyGenerator', `keyGenerator must be a function, got ${describe(keyGenerator)}`);
  }
  if (handler !== undefined && typeof handler !== 'function') {
    throw new InvalidArgumentError('handler', `handler must be a function, got ${describe(handler)}`);
  }
  let rule: { limit: number; leaseMs: number } | { policy: string; leaseMs?: number };
  if (options.policy !== undefined) {
    if (options.limit !== undefined) throw new InvalidArgumentError('limit', 'give limit and leaseMs, or a policy, not both');
    rule = { policy: checkString('policy', options.policy) };
    if (options.leaseMs !== undefined) rule.leaseMs = checkInteger('leaseMs', options.leaseMs, 1);
  } else {
    rule = { limit: checkInteger('limit', options.limit, 1, MAX_HELD), leaseMs: checkInteger('leaseMs', options.leaseMs, 1) };
  }
  if (options.autoRenew && rule.leaseMs === undefined) {
    throw new InvalidArgumentError('leaseMs', 'autoRenew needs the leaseMs to renew by, also with a policy');
  }
  const timeoutMs = options.timeoutMs === undefined ? undefined : checkInteger('timeoutMs', options.timeoutMs, 0);
  if (options.client === undefined || options.client === null) {
    throw new InvalidArgumentError('client', 'concurrencyLimit needs a client: node-redis or ioredis, or a Client');
  }
  const rl = options.client instanceof Client ? options.client : new Client(options.client);
  const leaseOptions = { timeoutMs, autoRenew: options.autoRenew === true };
  const keyOf = keyGenerator ?? ((req: Req) => (req as { ip?: string }).ip ?? req.socket.remoteAddress);

  return (req, res, next) => {
    (async () => {
      let key: string | undefined;
      try {
        key = await keyOf(req, res);
      } catch (err) {
        next(err);
        return;
      }
      if (typeof key !== 'string' || key.length === 0) {
        problem(res, 400, 'Bad Request', 'the concurrency-limit key of this request could not be computed');
        return;
      }
      // A client that leaves while the lease is waited for calls the wait
      // off; one that leaves while it is taken gets it released at once.
      const gone = new AbortController();
      const onGone = () => gone.abort(new Error('the client went away'));
      res.once('close', onGone);
      let lease: Lease;
      try {
        lease = await rl.lease(prefix + key, rule, { ...leaseOptions, signal: gone.signal });
      } catch (err) {
        res.off('close', onGone);
        if (gone.signal.aborted) return;
        if (err instanceof RLDeniedError) {
          setFields(res, name, err.decision, options.xRateLimitHeaders === true);
          const retry = err.decision.retryAfterS;
          if (retry !== null) res.setHeader('Retry-After', String(retry));
          if (handler) handler(req, res, next, err.decision);
          else denial(res, name, err.decision);
        } else if (options.passOnStoreError && !(err instanceof InvalidArgumentError)) {
          next();
        } else {
          next(err);
        }
        return;
      }
      res.off('close', onGone);
      const release = () => {
        res.off('finish', release);
        res.off('close', release);
        // A lease Redis did not hear the release of expires by itself.
        lease.release().catch(() => {});
      };
      if (gone.signal.aborted || res.writableEnded || res.destroyed) {
        release();
        return;
      }
      res.on('finish', release);
      res.on('close', release);
      setFields(res, name, lease.decision, options.xRateLimitHeaders === true);
      next();
    })().catch(next);
  };
}

function setFields(res: ServerResponse, name: string, d: Decision, x: boolean): void {
  if (res.headersSent) return;
  const resetS = Math.ceil(d.resetMs / 1000);
  res.setHeader('RateLimit-Policy', `"${name}";q=${d.limit}`);
  res.setHeader('RateLimit', `"${name}";r=${d.remaining};t=${resetS}`);
  if (x) {
    res.setHeader('X-RateLimit-Limit', String(d.limit));
    res.setHeader('X-RateLimit-Remaining', String(d.remaining));
    res.setHeader('X-RateLimit-Reset', String(resetS));
  }
}

/** The 429 of a denial: the problem body every kit answers (`denialBody`). */
function denial(res: ServerResponse, name: string, d: Decision): void {
  if (res.headersSent) {
    res.end();
    return;
  }
  res.statusCode = 429;
  res.setHeader('Content-Type', 'application/problem+json');
  res.end(denialBody(name, d));
}

function problem(res: ServerResponse, status: number, title: string, detail: string): void {
  if (res.headersSent) {
    res.end();
    return;
  }
  res.statusCode = status;
  res.setHeader('Content-Type', 'application/problem+json');
  res.end(JSON.stringify({ title, status, detail }));
}

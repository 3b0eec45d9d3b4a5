import type { IncomingMessage, ServerResponse } from 'node:http';
import { Decision } from './decision.js';
import { checkInteger, checkString, describe, InvalidArgumentError } from './errors.js';
import { denialBody, policyItem, rateLimitItem } from './headers.js';
import { Limiter, RuleSet, type CheckedRule, type LimiterRule } from './limiter.js';
import type { Protection } from './protection.js';
import type { Stage } from './policyStats.js';

type Next = (err?: unknown) => void;

/** What the error predicate sees of a finished request. */
export interface RequestOutcome {
  /** The answer's status (what was set when the connection closed, if it closed first). */
  status: number;
  /** What the handler threw (as `next(err)`), seen by `outcomeErrors()`; undefined if nothing. */
  error: unknown;
  /** The handler had not answered within `timeoutMs`. */
  timedOut: boolean;
}

/** Why the degrade handler answers: the policy's stage (a non-core route), or a denial. */
export interface DegradeInfo {
  reason: 'stage' | 'denied';
  /** The denial (null at a stage: Redis was not called). */
  decision: Decision | null;
  /** The highest stage of the route's policies. */
  stage: Stage;
}

/** `rateLimitMiddleware`'s options: one route's (or one router's) limits. */
export interface RateLimitMiddlewareOptions<Req extends IncomingMessage = IncomingMessage, Res extends ServerResponse = ServerResponse> {
  /** Decides every request (deny cache, local level, fallback when Redis fails). */
  limiter: Limiter;
  /** The rules, checked together (`limiter.ruleSet(rules)`, made at the first request when given as a list). */
  rules: RuleSet | readonly LimiterRule[];
  /** The request's identity (default: the client's address, `req.ip` under Express). */
  keyGenerator?: (req: Req, res: Res) => string | undefined | Promise<string | undefined>;
  /**
   * The protection loop: outcomes of the requests the rules' policies
   * admitted, and their stages; also the denials of a policy rule answered
   * from the deny cache (`DENIED`), when the limiter has no protection of
   * its own to count them.
   */
  protection?: Protection;
  /**
   * A core route (default true) is always decided by the limiter. A
   * non-core one, while a policy of its rules is at stage 1 or more,
   * answers with `degrade` (or a 429 without it) and Redis is not called.
   */
  core?: boolean;
  /**
   * Answers instead of the 429: on a denial, and on a non-core route at
   * stage 1 or more (a cached or default answer; Sentinel's blockHandler,
   * Resilience4j's fallbackMethod). It may also call `next()` to let the
   * request through.
   */
  degrade?: (req: Req, res: Res, next: Next, info: DegradeInfo) => void | Promise<void>;
  /** A breaker of `protection` (`protection.breaker(name)`) forced open while a policy of these rules is at stage 2. */
  breaker?: string;
  /**
   * Whether a finished request counts as an error of its policies (default:
   * a 5xx answer, an error thrown by the handler, or no answer within
   * `timeoutMs`).
   */
  isError?: (outcome: RequestOutcome) => boolean;
  /** A handler that has not answered after this many ms counts as an error (default 30,000). */
  timeoutMs?: number;
  /** Units per request (default 1). */
  cost?: number;
}

/** The default error predicate: a 5xx answer, an exception, a timeout. */
export function defaultIsError(o: RequestOutcome): boolean {
  return o.status >= 500 || o.error !== undefined || o.timedOut;
}

const THROWN = Symbol.for('redis-ratelimit.thrown');

/**
 * An Express error middleware that lets `rateLimitMiddleware` see the
 * errors handlers throw (an error is then counted whatever status the
 * application's own error handler answers). Install it after the routes and
 * before your error handlers: `app.use(outcomeErrors())`.
 */
export function outcomeErrors(): (err: unknown, req: IncomingMessage, res: ServerResponse, next: Next) => void {
  return (err, _req, res, next) => {
    (res as unknown as Record<symbol, unknown>)[THROWN] = err ?? new Error('next(err) without an error');
    next(err);
  };
}

/**
 * Express (or connect, plain `node:http`) middleware deciding each request
 * with a `Limiter`: a 429 with `Retry-After`, the IETF fields and a problem
 * body on a denial (or the route's `degrade` handler), and with a
 * `Protection`, the loop: the outcome of every request its policy rules
 * admitted is recorded when the answer finishes, non-core routes degrade at
 * stage 1 without calling Redis, and the named breaker opens at stage 2.
 *
 * ```ts
 * const protection = new Protection(client, ['api'])
 * app.get('/search', rateLimitMiddleware({ limiter, rules: [{ policy: 'api' }], protection, core: false,
 *   degrade: (req, res) => res.json(cachedResults) }), search)
 * app.use(outcomeErrors())
 * ```
 */
export function rateLimitMiddleware<Req extends IncomingMessage = IncomingMessage, Res extends ServerResponse = ServerResponse>(
  options: RateLimitMiddlewareOptions<Req, Res>,
): (req: Req, res: Res, next: Next) => void {
  if (options === null || typeof options !== 'object') {
    throw new InvalidArgumentError('options', `rateLimitMiddleware options must be an object, got ${describe(options)}`);
  }
  const { limiter, keyGenerator, degrade, protection, isError = defaultIsError } = options;
  if (!(limiter instanceof Limiter)) throw new InvalidArgumentError('limiter', `limiter must be a Limiter, got ${describe(limiter)}`);
  for (const [name, f] of [['keyGenerator', keyGenerator], ['degrade', degrade], ['isError', isError]] as const) {
    if (f !== undefined && typeof f !== 'function') throw new InvalidArgumentError(name, `${name} must be a function, got ${describe(f)}`);
  }
  const core = options.core ?? true;
  if (typeof core !== 'boolean') throw new InvalidArgumentError('core', `core must be true or false, got ${describe(core)}`);
  const timeoutMs = checkInteger('timeoutMs', options.timeoutMs ?? 30_000, 1);
  const cost = checkInteger('cost', options.cost ?? 1, 0);
  const given = options.rules;
  let policies: string[];
  if (given instanceof RuleSet) {
    policies = given.rules.flatMap((r) => ('policy' in r.kind ? [r.kind.policy] : []));
  } else if (Array.isArray(given) && given.length > 0) {
    policies = given.flatMap((r: LimiterRule) => (r !== null && typeof r === 'object' && typeof r.policy === 'string' ? [r.policy] : []));
  } else {
    throw new InvalidArgumentError('rules', `rules must be a RuleSet or a non-empty list of rules, got ${describe(given)}`);
  }
  if (protection !== undefined) {
    for (const p of policies) protection.watch(p);
  }
  if (options.breaker !== undefined) {
    checkString('breaker', options.breaker);
    if (protection === undefined) throw new InvalidArgumentError('breaker', 'a breaker is opened by the protection loop: give protection too');
    if (policies.length === 0) throw new InvalidArgumentError('breaker', 'a breaker opens at a policy\'s stage 2: the rules name no policy ({ policy })');
    protection.linkBreaker(options.breaker, policies);
  }
  if (!core && protection === undefined) throw new InvalidArgumentError('core', 'a non-core route degrades on the protection loop\'s stage: give protection too');
  // Only policies have a stage: with inline rules only, the route would never degrade.
  if (!core && policies.length === 0) throw new InvalidArgumentError('core', 'a non-core route degrades at a policy\'s stage: the rules name no policy ({ policy })');

  let ruleSet: RuleSet | undefined = given instanceof RuleSet ? given : undefined;
  let building: Promise<RuleSet> | undefined;
  const rules = (): Promise<RuleSet> | RuleSet => {
    if (ruleSet) return ruleSet;
    building ??= limiter.ruleSet(given as readonly LimiterRule[]).then(
      (set) => (ruleSet = set),
      (err: unknown) => {
        building = undefined; // tried again by the next request
        throw err;
      },
    );
    return building;
  };
  const keyOf = keyGenerator ?? ((req: Req) => (req as { ip?: string }).ip ?? req.socket.remoteAddress);
  const stageNow = (): Stage => {
    let top: Stage = 0;
    if (protection) for (const p of policies) top = Math.max(top, protection.stage(p)) as Stage;
    return top;
  };

  return (req, res, next) => {
    (async () => {
      if (!core) {
        const stage = stageNow();
        if (stage >= 1) {
          // Degraded: answered without a call to Redis.
          const set = ruleSet;
          const rule = set?.rules[0];
          const name = rule?.name ?? policies[0] ?? 'ratelimit';
          const waitMs = (protection as Protection).stagePollMs;
          const d = new Decision(false, rule?.spec ? limitOf(rule) : 0, 0, waitMs, waitMs, 0, null, 'fallback');
          if (degrade) return degrade(req, res, next, { reason: 'stage', decision: null, stage });
          if (rule) setFields(res, rule, d);
          return deny(res, name, d);
        }
      }
      const key = await keyOf(req, res);
      if (typeof key !== 'string' || key.length === 0) {
        return problem(res, 400, 'Bad Request', 'the rate-limit key of this request could not be computed');
      }
      const set = await rules();
      // The deny event's client_ip and user_agent (only read when events are shipped).
      const context = limiter.denyEvents === undefined ? undefined : { clientIp: (req as { ip?: string }).ip ?? req.socket.remoteAddress, userAgent: req.headers['user-agent'] };
      const d = await limiter.check(set, key, cost, context);
      const rule = set.rules[d.deniedBy ?? 0] as CheckedRule;
      setFields(res, rule, d);
      if (!d.allowed) {
        // A denial the limiter answered from its deny cache is one the
        // server did not see: counted for the loop's stages (by the
        // limiter itself when it has a protection, else here).
        if (protection && limiter.protection === undefined && (d.path === 'denyCache' || d.path === 'local') && 'policy' in rule.kind) {
          protection.recordDenied(rule.kind.policy);
        }
        if (degrade) return degrade(req, res, next, { reason: 'denied', decision: d, stage: stageNow() });
        return deny(res, rule.name, d);
      }
      if (protection && policies.length > 0) watchOutcome(res, protection, policies, isError, timeoutMs);
      next();
    })().catch(next);
  };
}

/** Records the request's outcome for `policies` once: when it finishes, its connection closes, or `timeoutMs` passes. */
function watchOutcome(res: ServerResponse, protection: Protection, policies: string[], isError: (o: RequestOutcome) => boolean, timeoutMs: number): void {
  let done = false;
  const settle = (timedOut: boolean) => {
    if (done) return;
    done = true;
    clearTimeout(timer);
    res.off('finish', onFinish);
    res.off('close', onClose);
    let error: boolean;
    try {
      error = isError({ status: res.statusCode, error: (res as unknown as Record<symbol, unknown>)[THROWN], timedOut });
    } catch {
      error = true;
    }
    for (const p of policies) protection.record(p, error);
  };
  const onFinish = () => settle(false);
  const onClose = () => settle(false);
  const timer = setTimeout(() => settle(true), timeoutMs);
  timer.unref?.();
  res.once('finish', onFinish);
  res.once('close', onClose);
}

function limitOf(rule: CheckedRule): number {
  const spec = rule.spec;
  if (spec === null) return 0;
  return 'capacity' in spec ? spec.capacity : spec.limit;
}

function setFields(res: ServerResponse, rule: CheckedRule, d: Decision): void {
  if (res.headersSent) return;
  if (rule.spec !== null) res.setHeader('RateLimit-Policy', policyItem(rule.name, rule.spec));
  res.setHeader('RateLimit', rateLimitItem(rule.name, d));
}

function deny(res: ServerResponse, name: string, d: Decision): void {
  if (res.headersSent) {
    res.end();
    return;
  }
  res.statusCode = 429;
  if (d.retryAfterS !== null) res.setHeader('Retry-After', String(d.retryAfterS));
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

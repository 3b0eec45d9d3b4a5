/**
 * The one place that loads rate-limiter-flexible, an optional peer: when the
 * application has it, `RateLimiterRL` answers its very `RateLimiterRes`
 * class and extends its `RateLimiterCompatibleAbstract`, so its
 * `BurstyRateLimiter`, `RateLimiterUnion` and `instanceof` checks accept
 * them. Loaded synchronously, from this package's own location (as a peer
 * is resolved), so that the classes are there before any user code runs.
 */
import { createRequire } from 'node:module';

/** What this kit uses of rate-limiter-flexible. */
export interface FlexiblePeer {
  RateLimiterRes: new (remainingPoints?: number, msBeforeNext?: number, consumedPoints?: number, isFirstInDuration?: boolean) => object;
  RateLimiterCompatibleAbstract: new () => object;
}

/**
 * This file's path. CommonJS has `__filename`; an ES module has
 * `import.meta.url`, which a source compiled to both formats cannot name,
 * so V8's structured call sites (the API `callsites` uses) say it.
 */
function ownFile(): string | undefined {
  if (typeof __filename === 'string') return __filename;
  const prepare = Error.prepareStackTrace;
  const limit = Error.stackTraceLimit;
  try {
    Error.stackTraceLimit = 1;
    Error.prepareStackTrace = (_err, sites) => sites;
    const sites = new Error().stack as unknown as NodeJS.CallSite[] | undefined;
    return sites?.[0]?.getFileName() ?? undefined;
  } finally {
    Error.prepareStackTrace = prepare;
    Error.stackTraceLimit = limit;
  }
}

function load(): FlexiblePeer | undefined {
  const file = ownFile();
  if (file === undefined) return undefined;
  try {
    const m = createRequire(file)('rate-limiter-flexible') as Partial<FlexiblePeer>;
    if (typeof m.RateLimiterRes !== 'function' || typeof m.RateLimiterCompatibleAbstract !== 'function') return undefined;
    return m as FlexiblePeer;
  } catch (err) {
    // Not installed: the kit's own RateLimiterRes stands in. Anything else
    // (a broken install) is the application's to see.
    const e = err as NodeJS.ErrnoException;
    if (e.code === 'MODULE_NOT_FOUND' && e.message.includes("'rate-limiter-flexible'")) return undefined;
    throw err;
  }
}

/**
 * Another optional peer (prom-client), loaded when first asked for, from
 * this package's location: undefined when the application does not have it.
 */
export function requirePeer(name: string): unknown {
  const file = ownFile();
  if (file === undefined) return undefined;
  try {
    return createRequire(file)(name) as unknown;
  } catch (err) {
    const e = err as NodeJS.ErrnoException;
    if (e.code === 'MODULE_NOT_FOUND' && e.message.includes(`'${name}'`)) return undefined;
    throw err;
  }
}

/** rate-limiter-flexible's exports, or undefined when the application does not have it. */
export const flexiblePeer: FlexiblePeer | undefined = load();

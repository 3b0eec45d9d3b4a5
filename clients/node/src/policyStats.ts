import { ProtocolError } from './errors.js';

/**
 * The protection loop's reply (`RL.POLICY STATS name`, and `RL.OUTCOME`,
 * which answers the same): the contract's `protection.stats_fields` and
 * `window_fields`, in that order, as name and value pairs.
 */

/** The names of `RL.POLICY STATS`'s reply, in order (the contract's `stats_fields`). */
export const STATS_FIELDS = Object.freeze(['scale', 'stage', 'window_ms', 'window_end_ms', 'current', 'last', 'adapting'] as const);

/** The names of a window's counts, in order (the contract's `window_fields`). */
export const WINDOW_FIELDS = Object.freeze(['calls', 'admitted', 'denied', 'ok', 'errors', 'deny_permille', 'error_permille'] as const);

/** A policy's stage: 0 normal, 1 degrade (non-core routes answer their degrade handler), 2 break (named breakers open). */
export type Stage = 0 | 1 | 2;

/** The counts of one window of a policy. */
export interface WindowCounts {
  calls: number;
  admitted: number;
  denied: number;
  ok: number;
  errors: number;
  /** denied x 1000 / calls, rounded down (0 when nothing was counted). */
  denyPermille: number;
  /** errors x 1000 / (ok + errors), rounded down (0 when nothing was counted). */
  errorPermille: number;
}

/** `RL.POLICY STATS name`: the policy's loop as the server has it. */
export interface PolicyStats {
  /** 1 to 100: the percentage of its size and rate parameters the limiter runs with. */
  scale: number;
  stage: Stage;
  windowMs: number;
  /** When the current window ends, Unix ms, on the server's clock. */
  windowEndMs: number;
  current: WindowCounts;
  /** The last window that ended. */
  last: WindowCounts;
  /** `ADAPT ERRORS` is on. */
  adapting: boolean;
}

const WINDOW_KEYS: Record<(typeof WINDOW_FIELDS)[number], keyof WindowCounts> = {
  calls: 'calls',
  admitted: 'admitted',
  denied: 'denied',
  ok: 'ok',
  errors: 'errors',
  deny_permille: 'denyPermille',
  error_permille: 'errorPermille',
};

/**
 * Parses a STATS reply (RESP2 flat list, or a RESP3 map): exactly the
 * contract's fields, in its order; anything else is a `ProtocolError`.
 */
export function parseStats(reply: unknown): PolicyStats {
  const top = named(reply, STATS_FIELDS, 'RL.POLICY STATS');
  const stage = int(top.get('stage'), 'stage');
  if (stage !== 0 && stage !== 1 && stage !== 2) throw new ProtocolError(`RL.POLICY STATS: stage ${stage} is not 0, 1 or 2`);
  return {
    scale: int(top.get('scale'), 'scale'),
    stage,
    windowMs: int(top.get('window_ms'), 'window_ms'),
    windowEndMs: int(top.get('window_end_ms'), 'window_end_ms'),
    current: parseWindow(top.get('current'), 'current'),
    last: parseWindow(top.get('last'), 'last'),
    adapting: int(top.get('adapting'), 'adapting') === 1,
  };
}

function parseWindow(reply: unknown, which: string): WindowCounts {
  const fields = named(reply, WINDOW_FIELDS, `RL.POLICY STATS ${which}`);
  const out = {} as WindowCounts;
  for (const f of WINDOW_FIELDS) out[WINDOW_KEYS[f]] = int(fields.get(f), `${which}.${f}`);
  return out;
}

/** The pairs of `reply`, checked to be exactly `names` in order. */
function named(reply: unknown, names: readonly string[], what: string): Map<string, unknown> {
  let entries: Array<[string, unknown]>;
  if (reply instanceof Map) {
    entries = [...reply].map(([k, v]) => [String(k), v]);
  } else if (Array.isArray(reply) && reply.length % 2 === 0) {
    entries = [];
    for (let i = 0; i < reply.length; i += 2) entries.push([String(reply[i]), reply[i + 1]]);
  } else if (reply !== null && typeof reply === 'object' && !Array.isArray(reply)) {
    entries = Object.entries(reply);
  } else {
    throw new ProtocolError(`${what}: expected ${names.length} name/value pairs, got ${JSON.stringify(reply)}`);
  }
  const got = entries.map(([k]) => k);
  if (got.length !== names.length || got.some((k, i) => k !== names[i])) {
    throw new ProtocolError(`${what}: expected the fields ${names.join(', ')}, got ${got.join(', ')}`);
  }
  return new Map(entries);
}

function int(v: unknown, name: string): number {
  const n = typeof v === 'number' ? v : typeof v === 'bigint' ? Number(v) : typeof v === 'string' && /^-?\d+$/.test(v) ? Number(v) : NaN;
  if (!Number.isSafeInteger(n)) throw new ProtocolError(`RL.POLICY STATS: ${name} is not an integer: ${JSON.stringify(String(v))}`);
  return n;
}

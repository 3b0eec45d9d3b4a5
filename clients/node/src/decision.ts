import { ProtocolError } from './errors.js';

/**
 * Which path decided (the `Limiter`'s): Redis, the local level (a global
 * rule's share, in process), the deny cache, or the fallback (Redis failed,
 * missed its deadline, or the breaker is open). A typed call's decision is
 * always `'redis'`. `'grant'`: a batched rule's decision from the units
 * the instance holds (or its local denial until it may ask again), without
 * a round trip of its own. As the Rust kit's `Path`.
 */
export type Path = 'redis' | 'local' | 'denyCache' | 'grant' | 'fallback';

/**
 * What a limiter answered: the five integers of every limiter reply
 * (`[allowed, limit, remaining, wait_ms, reset_ms]`) and `denied_by` for
 * `RL.ALL`, or the `lease` of `RL.CONCURRENCY`. The same fields, under the
 * same names, as the Rust kit's `Decision`.
 */
export class Decision {
  constructor(
    /** Admitted (its units consumed) or denied (nothing changed). */
    readonly allowed: boolean,
    /** The limiter's capacity, or units per window. */
    readonly limit: number,
    /** Units left right after this call. */
    readonly remaining: number,
    /**
     * As the server sent it. Denied: ms until the same request would pass,
     * -1 when it never can. Admitted: 0, except for the leaky bucket's delay.
     */
    readonly waitMs: number,
    /** ms until the limiter is idle again (full bucket, empty window). */
    readonly resetMs: number,
    /** `RL.ALL`: the 0-based position of the first rule that denied, else null. */
    readonly deniedBy: number | null = null,
    /**
     * `RL.CONCURRENCY` (or `RL.HIT` on a concurrency policy): the id of the
     * lease granted, to give to `release` and `renew`; null when denied.
     */
    readonly lease: number | null = null,
    /** Which path decided: `'redis'` for a typed call; the `Limiter` says which of its paths. */
    readonly path: Path = 'redis',
    /**
     * A call with `Request.upto(n)` (`UPTO n`): the units taken, from 1 to
     * `n`, or 0 on a denial (the reply's sixth field, `RL.ALL`'s seventh).
     * `null` for a call without `UPTO`, whose units are its cost.
     */
    readonly granted: number | null = null,
  ) {}

  /** A denial that no wait can turn into an admission (cost above the limit). */
  get never(): boolean {
    return this.waitMs < 0;
  }

  /** `max(waitMs, 0)`. */
  get retryAfterMs(): number {
    return Math.max(this.waitMs, 0);
  }

  /** `Retry-After` in whole seconds, `ceil(waitMs / 1000)`; null when it never can pass. */
  get retryAfterS(): number | null {
    return this.waitMs < 0 ? null : Math.ceil(this.waitMs / 1000);
  }

  /**
   * Parses a limiter reply: 5 integers (`sixth` 'none': the rate limiters),
   * 6 (`'deniedBy'`: `RL.ALL`), or 5 or 6 (`'lease'`: `RL.CONCURRENCY`, and
   * `RL.HIT`, which answers as its policy's algorithm). Any other width is
   * a `ProtocolError` (the contract's `replies`). `upto`: the call had
   * `UPTO n`, whose reply has one more field, `granted` (6 integers, `RL.ALL`
   * 7).
   */
  static fromReply(reply: unknown, sixth: 'deniedBy' | 'lease' | 'none' = 'none', upto = false): Decision {
    if (upto) return Decision.fromUptoReply(reply, sixth === 'deniedBy');
    const widths = sixth === 'none' ? [5] : sixth === 'deniedBy' ? [6] : [5, 6];
    if (!Array.isArray(reply) || !widths.includes(reply.length)) {
      throw new ProtocolError(`expected a limiter reply of ${widths.join(' or ')} integers, got ${JSON.stringify(reply)}`);
    }
    const n = reply.map((v) => toInt(v));
    const [allowed, limit, remaining, waitMs, resetMs] = n as [number, number, number, number, number];
    let deniedBy: number | null = null;
    let lease: number | null = null;
    if (n.length === 6) {
      const x = n[5] as number;
      if (sixth === 'deniedBy') deniedBy = x > 0 ? x - 1 : null;
      if (sixth === 'lease' && x > 0) {
        // Lease ids are kept as numbers: exact below 2^53, which ids (of the
        // order of the server's clock in microseconds) stay under.
        if (!Number.isSafeInteger(x)) throw new ProtocolError(`lease id ${String(reply[5])} is beyond 2^53`);
        lease = x;
      }
    }
    return new Decision(allowed === 1, limit, remaining, waitMs, resetMs, deniedBy, lease);
  }

  private static fromUptoReply(reply: unknown, all: boolean): Decision {
    const width = all ? 7 : 6;
    if (!Array.isArray(reply) || reply.length !== width) {
      throw new ProtocolError(`expected a limiter reply to UPTO of ${width} integers, got ${JSON.stringify(reply)}`);
    }
    const n = reply.map((v) => toInt(v));
    const [allowed, limit, remaining, waitMs, resetMs] = n as [number, number, number, number, number];
    const deniedBy = all && (n[5] as number) > 0 ? (n[5] as number) - 1 : null;
    const granted = n[width - 1] as number;
    if (granted < 0) throw new ProtocolError(`granted ${granted} is below 0`);
    return new Decision(allowed === 1, limit, remaining, waitMs, resetMs, deniedBy, null, 'redis', granted);
  }
}

export function toInt(v: unknown): number {
  if (typeof v === 'number' && Number.isInteger(v)) return v;
  if (typeof v === 'bigint') return Number(v);
  if (typeof v === 'string' && /^-?\d+$/.test(v)) return Number(v);
  throw new ProtocolError(`expected an integer in the reply, got ${JSON.stringify(v)}`);
}

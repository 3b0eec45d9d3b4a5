/**
 * Issue 27's pieces of a global limit larger than one node (the contract's
 * `grants`, /tmp/prompts/grants.md): the batch size of a batched rule, the
 * per-(rule, key) state of its held units, and the stripes of a striped
 * rule (their shares, and their hash tags from the cluster's slot map).
 * Pure: the `Limiter` (src/limiter.ts) sends the calls.
 */
import type { Decision } from './decision.js';
import { checkInteger, describe, InvalidArgumentError } from './errors.js';
import { ruleArgs, type Spec } from './rules.js';
import { keySlot } from './transport.js';

/** A batched rule's defaults: units held at most 50 ms, a batch at most 10 % of the limit. */
export const GRANT_DEFAULTS = Object.freeze({ holdMs: 50, maxSharePct: 10 });
/** The most stripes a rule may have. */
export const MAX_STRIPES = 64;
const SLOTS = 16384;

/** A batched rule's options, checked. */
export interface GrantConfig {
  readonly holdMs: number;
  readonly maxSharePct: number;
}

/** The algorithms a batched or striped rule may have (they take `UPTO`; a leaky bucket and a concurrency rule do not). */
const SHAREABLE = new Set(['TOKENBUCKET', 'FIXEDWINDOW', 'SLIDING', 'HASHWINDOW', 'QUOTA']);

/** Refuses an algorithm that cannot be batched or striped, naming the option. */
export function checkShareable(option: 'batched' | 'striped', spec: Spec): void {
  const [word] = ruleArgs(spec, 'spec');
  if (!SHAREABLE.has(word)) {
    throw new InvalidArgumentError(option, `${option} is an option of a token bucket, fixed window, sliding, hash window or quota rule (they take UPTO), not of ${word}`);
  }
}

/** `holdMs` (1 to 60,000, default 50) and `maxSharePct` (1 to 100, default 10), checked. */
export function grantConfig(holdMs: unknown, maxSharePct: unknown): GrantConfig {
  return {
    holdMs: checkInteger('holdMs', holdMs ?? GRANT_DEFAULTS.holdMs, 1, 60_000),
    maxSharePct: checkInteger('maxSharePct', maxSharePct ?? GRANT_DEFAULTS.maxSharePct, 1, 100),
  };
}

/** A spec's limit: a bucket's capacity, a window's or a quota's limit. */
export function limitOfSpec(spec: Spec): number {
  return 'capacity' in spec ? spec.capacity : spec.limit;
}

/**
 * The units a batched rule asks for: `clamp(ceil(ratePerS x holdMs / 1000),
 * 1, max(1, limit x maxSharePct / 100))`, in integers.
 */
export function batchSize(ratePerS: number, holdMs: number, limit: number, maxSharePct: number): number {
  const want = Math.floor((ratePerS * holdMs + 999) / 1000);
  const cap = Math.max(1, Math.floor((limit * maxSharePct) / 100));
  return Math.min(Math.max(want, 1), cap);
}

/**
 * What one instance keeps of a batched rule on one key: the units it holds
 * (taken from the server with `UPTO`), when they were granted, its rate
 * counter, until when it denies without asking, and the one call in flight.
 * Instants are `performance.now()` milliseconds (monotonic).
 */
export class GrantState {
  held = 0;
  grantedAt = 0;
  nextAskAt = 0;
  /** The ask in flight: concurrent deciders wait for it rather than asking. */
  inflight: Promise<Decision> | null = null;
  /** The last reply (its reset_ms, and a waiter's denial fields). */
  last: Decision | null = null;
  /** The refund of units held past holdMs. */
  timer: ReturnType<typeof setTimeout> | undefined;
  private second = Number.NEGATIVE_INFINITY;
  private current = 0;
  private previous = 0;

  constructor(
    /** The key on the server (a stripe's for a striped rule). */
    readonly key: string,
    /** What the server applies there (a stripe's share for a striped rule). */
    readonly spec: Spec,
  ) {}

  /** Counts one decision at `now`; the rate: max(decisions in the previous whole second, decisions so far in this one). */
  count(now: number): number {
    const s = Math.floor(now / 1000);
    if (s !== this.second) {
      this.previous = s === this.second + 1 ? this.current : 0;
      this.current = 0;
      this.second = s;
    }
    this.current += 1;
    return Math.max(this.previous, this.current);
  }

  /** Nothing held, nothing in flight, no denial pending, no decision this second or the last: safe to forget. */
  idle(now: number): boolean {
    const s = Math.floor(now / 1000);
    return this.held === 0 && this.inflight === null && now >= this.nextAskAt && s > this.second + 1;
  }
}

/**
 * The masters of a slot map, ordered by the lowest slot each owns, and the
 * owner (an index into them) of every slot. Standalone or Sentinel: one
 * master owning every slot.
 */
export class SlotMap {
  constructor(
    readonly masters: readonly string[],
    private readonly owners: Int16Array | null,
  ) {}

  static standalone(): SlotMap {
    return new SlotMap(['standalone'], null);
  }

  /**
   * From `CLUSTER SLOTS`: `[[start, end, [host, port, id?], replicas...], ...]`.
   * A slot no master owns (a cluster being resharded) is owned by none (-1).
   */
  static fromClusterSlots(reply: unknown): SlotMap {
    if (!Array.isArray(reply)) throw new InvalidArgumentError('CLUSTER SLOTS', `CLUSTER SLOTS answered ${describe(reply)}, not a list of ranges`);
    const ranges: Array<[number, number, string]> = [];
    for (const r of reply) {
      if (!Array.isArray(r) || r.length < 3 || !Array.isArray(r[2])) continue;
      const start = Number(r[0]);
      const end = Number(r[1]);
      const node = r[2] as unknown[];
      const id = node.length >= 3 && node[2] !== null && node[2] !== '' ? String(node[2]) : `${String(node[0])}:${String(node[1])}`;
      if (Number.isInteger(start) && Number.isInteger(end) && start >= 0 && end < SLOTS && start <= end) ranges.push([start, end, id]);
    }
    if (ranges.length === 0) throw new InvalidArgumentError('CLUSTER SLOTS', 'the cluster owns no slot (CLUSTER SLOTS is empty)');
    const lowest = new Map<string, number>();
    for (const [start, , id] of ranges) lowest.set(id, Math.min(lowest.get(id) ?? SLOTS, start));
    const masters = [...lowest.keys()].sort((a, b) => (lowest.get(a) as number) - (lowest.get(b) as number));
    const index = new Map(masters.map((m, i) => [m, i]));
    const owners = new Int16Array(SLOTS).fill(-1);
    for (const [start, end, id] of ranges) owners.fill(index.get(id) as number, start, end + 1);
    return new SlotMap(masters, owners);
  }

  ownerOf(slot: number): number {
    return this.owners === null ? 0 : (this.owners[slot] as number);
  }

  /** Whether two maps place every slot alike (the same masters, in order). */
  same(other: SlotMap): boolean {
    if (this.masters.length !== other.masters.length || this.masters.some((m, i) => m !== other.masters[i])) return false;
    if (this.owners === null || other.owners === null) return this.owners === other.owners;
    for (let s = 0; s < SLOTS; s++) if (this.owners[s] !== other.owners[s]) return false;
    return true;
  }
}

/** The first tag "rl0", "rl1", ... whose slot master `m` owns and that is not in `used`; null when no tag up to a bound is (a master owning no slot). */
function nextTag(map: SlotMap, m: number, used: Set<string>): string | null {
  for (let k = 0; k < 10_000_000; k++) {
    const tag = `rl${k}`;
    if (!used.has(tag) && map.ownerOf(keySlot(tag)) === m) return tag;
  }
  return null;
}

/**
 * The hash tags of `n` stripes on `map`: stripe i on master i mod M, its tag
 * the first "rl<k>" in that master's slots not taken by an earlier stripe.
 * With `previous` tags (a re-pick after the slot map changed), as the Rust
 * kit's: a stripe keeps its tag while the master now owning it holds fewer
 * than its fair share (`ceil(n / M)`) of the stripes kept before it; the
 * others move, in order, to the master with the fewest stripes (the first in
 * slot order on a tie), with that master's first free tag.
 */
export function pickTags(map: SlotMap, n: number, previous?: readonly string[]): string[] {
  const masters = map.masters.length;
  const pick = (m: number, used: Set<string>): string => {
    const tag = nextTag(map, m, used);
    if (tag === null) throw new InvalidArgumentError('striped', `no hash tag falls in the slots of master ${map.masters[m]}`);
    used.add(tag);
    return tag;
  };
  if (previous === undefined || previous.length !== n) {
    const used = new Set<string>();
    return Array.from({ length: n }, (_, i) => pick(i % masters, used));
  }
  const fair = Math.ceil(n / masters);
  const load = new Array<number>(masters).fill(0);
  const kept = previous.map((tag) => {
    const owner = map.ownerOf(keySlot(tag));
    if (owner >= 0 && (load[owner] as number) < fair) {
      load[owner] = (load[owner] as number) + 1;
      return tag;
    }
    return null;
  });
  const used = new Set(kept.filter((t): t is string => t !== null));
  return kept.map((tag) => {
    if (tag !== null) return tag;
    let target = 0;
    for (let m = 1; m < masters; m++) if ((load[m] as number) < (load[target] as number)) target = m;
    load[target] = (load[target] as number) + 1;
    return pick(target, used);
  });
}

/** The share of stripe `i` of `n` in `total`: `total / n`, plus 1 for the first `total % n`. */
export function shareOfStripe(total: number, i: number, n: number): number {
  return Math.floor(total / n) + (i < total % n ? 1 : 0);
}

/**
 * The specs of `n` stripes of `spec`: every size and rate parameter split
 * (a token bucket's capacity and refill count, a window's or a quota's
 * limit), the durations kept. Refused naming `striped` when a share would be
 * below 1.
 */
export function stripeSpecs(spec: Spec, n: number): Spec[] {
  checkShareable('striped', spec);
  const split = (name: string, total: number): void => {
    if (Math.floor(total / n) < 1) {
      throw new InvalidArgumentError('striped', `striped ${n} leaves a stripe with no ${name}: ${name} ${total} splits into at most ${total} stripes (every share must be at least 1)`);
    }
  };
  if (spec.algorithm === 'tokenbucket') {
    split('capacity', spec.capacity);
    split('refillCount', spec.refillCount);
    return Array.from({ length: n }, (_, i) => ({ ...spec, capacity: shareOfStripe(spec.capacity, i, n), refillCount: shareOfStripe(spec.refillCount, i, n) }));
  }
  const limit = (spec as { limit: number }).limit;
  split('limit', limit);
  return Array.from({ length: n }, (_, i) => ({ ...spec, limit: shareOfStripe(limit, i, n) }) as Spec);
}

/** `striped` (1 to 64; 1 is not striped), checked. */
export function checkStriped(n: unknown): number {
  return checkInteger('striped', n, 1, MAX_STRIPES);
}

/**
 * A striped rule's stripes: their specs, and their tags on the slot map last
 * read (re-picked when it changes). Stripe i's key is `{tag_i}` followed by
 * the rule's key.
 */
export class Stripes {
  tags: string[];

  constructor(
    readonly specs: readonly Spec[],
    public map: SlotMap,
  ) {
    this.tags = pickTags(map, specs.length);
  }

  get n(): number {
    return this.specs.length;
  }

  key(i: number, key: string): string {
    return `{${this.tags[i] as string}}${key}`;
  }

  /** Re-picks the tags on a new slot map; whether any tag moved. */
  repick(map: SlotMap): boolean {
    if (map.same(this.map)) return false;
    const before = this.tags;
    this.tags = pickTags(map, this.n, before);
    this.map = map;
    return this.tags.some((t, i) => t !== before[i]);
  }
}

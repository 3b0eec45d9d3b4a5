/**
 * The deny cache: after a denial with `waitMs` w, the same rule and key deny
 * in process for `min(w, maxMs)`, with the reply's times counting down,
 * without a round trip. Bounded by a size cap (as the Rust kit's
 * deny_cache.rs).
 */
import { Decision } from './decision.js';

interface Entry {
  decision: Decision;
  at: number;
  until: number;
}

export class DenyCache {
  private readonly map = new Map<string, Entry>();
  readonly maxMs: number;
  readonly capacity: number;

  constructor(maxMs: number, capacity: number) {
    this.maxMs = maxMs;
    this.capacity = Math.max(capacity, 1);
  }

  /** The cached denial of `key`, its times counted down to `now` (ms, monotonic). */
  get(key: string, now = performance.now()): Decision | undefined {
    const e = this.map.get(key);
    if (e === undefined) return undefined;
    if (e.until <= now) {
      this.map.delete(key);
      return undefined;
    }
    const elapsed = Math.floor(now - e.at);
    const d = e.decision;
    // Never below 1 ms while the entry denies: a denial always says to wait.
    return new Decision(false, d.limit, d.remaining, Math.max(d.waitMs - elapsed, 1), Math.max(d.resetMs - elapsed, 0), d.deniedBy, null, 'denyCache');
  }

  /** Remembers a denial of `key` for `min(waitMs, maxMs)`; one that can never pass, or has no wait, is not cached. */
  put(key: string, d: Decision, now = performance.now()): void {
    if (d.allowed || d.waitMs <= 0) return;
    const ttl = Math.min(d.waitMs, this.maxMs);
    if (ttl <= 0) return;
    if (this.map.size >= this.capacity && !this.map.has(key)) {
      for (const [k, e] of this.map) if (e.until <= now) this.map.delete(k);
      if (this.map.size >= this.capacity) {
        let soonest: string | undefined;
        let until = Infinity;
        for (const [k, e] of this.map) {
          if (e.until < until) {
            until = e.until;
            soonest = k;
          }
        }
        if (soonest !== undefined) this.map.delete(soonest);
      }
    }
    this.map.set(key, { decision: d, at: now, until: now + ttl });
  }

  get size(): number {
    return this.map.size;
  }
}

import type { Client } from './client.js';
import type { Decision } from './decision.js';
import { InvalidArgumentError, RLError } from './errors.js';
import type { ConcurrencyParams } from './rules.js';

/** What a lease is taken on: `RL.CONCURRENCY`'s parameters, or a CONCURRENCY policy (`leaseMs`: what `renew` extends it by). */
export type LeaseRule = ConcurrencyParams | { policy: string; leaseMs?: number };

/** `lease()` and `withLease()`'s options. */
export interface LeaseOptions {
  /** Units the lease holds (default 1). */
  cost?: number;
  /**
   * Wait in the server (`BLOCK`, on acquire's own connection) up to this
   * many ms for a free unit (0: no limit). Without it a full limiter denies
   * at once.
   */
  timeoutMs?: number;
  /**
   * Renew the lease in the background every third of `leaseMs` until it is
   * released, for work that may outlast `leaseMs`. If a renewal finds the
   * lease gone, `signal` aborts.
   */
  autoRenew?: boolean;
  /** With `timeoutMs`: calls the wait off (see `AcquireOptions.signal`). */
  signal?: AbortSignal;
}

/**
 * A lease granted by `RL.CONCURRENCY`: one of the limiter's units (or
 * `cost` of them) held until `release()`, or until `leaseMs` after it was
 * granted or last renewed, so a holder that crashes frees it anyway.
 *
 * ```ts
 * const lease = await rl.lease('reports', { limit: 4, leaseMs: 30_000 })
 * try { await buildReport() } finally { await lease.release() }
 * ```
 */
export class Lease {
  /**
   * The lease id (`decision.lease`); 0 when admitted without a lease (a
   * policy in SHADOW or OFF mode): `release` and `renew` then send nothing.
   */
  readonly id: number;
  private readonly controller = new AbortController();
  private releasing: Promise<boolean> | undefined;
  private renewTimer: NodeJS.Timeout | undefined;
  private renewing = false;

  constructor(
    private readonly rl: Client,
    /** The limiter's key. */
    readonly key: string,
    id: number,
    /** The grant: `remaining` units, `resetMs` until every lease of the key has expired. */
    readonly decision: Decision,
    /** What `renew()` extends the lease by, when not given. */
    readonly leaseMs: number | undefined,
    autoRenew: boolean,
  ) {
    this.id = id;
    if (autoRenew && leaseMs !== undefined) {
      this.renewTimer = setInterval(() => void this.renewInBackground(leaseMs), Math.max(1, Math.floor(leaseMs / 3)));
      // The renewals alone do not keep the process running: the work does.
      this.renewTimer.unref();
    }
  }

  /** Aborted when the lease is known to be gone: a renewal answered that it had ended. */
  get signal(): AbortSignal {
    return this.controller.signal;
  }

  /** `release()` was called. */
  get released(): boolean {
    return this.releasing !== undefined;
  }

  /** The lease lasts `leaseMs` from now (`RL.RENEW`); false when it had already ended. */
  async renew(leaseMs: number | undefined = this.leaseMs): Promise<boolean> {
    if (leaseMs === undefined) {
      throw new InvalidArgumentError('leaseMs', 'renew(leaseMs): this lease came from a policy without leaseMs');
    }
    if (this.releasing || this.id === 0) return false;
    const alive = await this.rl.renew(this.key, this.id, leaseMs);
    if (!alive) this.lost();
    return alive;
  }

  /**
   * Ends the lease (`RL.RELEASE`): true when it was still held, false when
   * it had expired. Calling it again sends nothing and answers the same.
   */
  release(): Promise<boolean> {
    this.stopRenewing();
    this.releasing ??= this.id === 0 ? Promise.resolve(false) : this.rl.release(this.key, this.id);
    return this.releasing;
  }

  /** `await using lease = await rl.lease(...)` releases it at the end of the block. */
  async [Symbol.asyncDispose](): Promise<void> {
    await this.release();
  }

  private async renewInBackground(leaseMs: number): Promise<void> {
    if (this.renewing || this.releasing) return;
    this.renewing = true;
    try {
      await this.renew(leaseMs);
    } catch {
      // Redis did not answer: the next tick tries again, and the lease is
      // still held until leaseMs after the last renewal that did.
    } finally {
      this.renewing = false;
    }
  }

  private lost(): void {
    this.stopRenewing();
    if (!this.controller.signal.aborted) {
      this.controller.abort(new RLError(`the lease ${this.id} on ${this.key} has ended: it expired before it was renewed`));
    }
  }

  private stopRenewing(): void {
    if (this.renewTimer) clearInterval(this.renewTimer);
    this.renewTimer = undefined;
  }
}

/**
 * The kit's side of the protection loop (SPEC "The protection loop"): the
 * outcomes of the requests policies admitted go to every master in the
 * background (`RL.OUTCOME`), each policy's stage and scale come back from
 * every master (`RL.POLICY STATS`, the highest stage and the lowest scale
 * win), and the breakers named for a policy open while it is at stage 2.
 */
import { Client } from './client.js';
import { checkInteger, checkString, describe, InvalidArgumentError, RLError } from './errors.js';
import { parseStats, type PolicyStats, type Stage } from './policyStats.js';
import { eachMasterSettled, type RedisLike, type Transport } from './transport.js';
import { resolveMetrics, type MetricsOption, type RateLimitMetrics } from './metrics.js';

/** The loop's timings by default: the contract's `protection.kits`. */
export const PROTECTION_DEFAULTS = Object.freeze({
  /** Outcome counts go to every master this often. */
  reportIntervalMs: 1000,
  /** Every policy's stage and scale are read from every master this often. */
  stagePollMs: 1000,
  /** With no successful read for this long, a policy's stage is 0 again. */
  stageHoldMs: 5000,
});

/** `new Protection(client, policies, options)`. */
export interface ProtectionOptions {
  /** How often outcome counts are sent (default 1,000 ms). */
  reportIntervalMs?: number;
  /** How often stages and scales are read (default 1,000 ms). */
  stagePollMs?: number;
  /** The longest a stage read is kept without a newer one (default 5,000 ms): then stage 0. */
  stageHoldMs?: number;
  /** Breakers by name, each with the policies whose stage 2 opens it. */
  breakers?: Record<string, readonly string[]>;
  /** The breakers' own failure counting. */
  breakerOptions?: CircuitBreakerOptions;
  /**
   * Prometheus metrics (prom-client): `true` for its global `register`, or
   * a `Registry`. `ratelimit_scale{rule}` and `ratelimit_stage{rule}` of
   * every policy watched (after every stage read), and
   * `ratelimit_breaker_open{breaker}` of its breakers.
   */
  metrics?: MetricsOption;
}

/** What the loop did so far: for an exporter, and to see that nothing piles up. */
export interface ProtectionStats {
  /** `RL.OUTCOME` replies received (one per master per policy per report). */
  reportsSent: number;
  /** `RL.OUTCOME` calls that failed (per master); their counts are not sent again. */
  reportsFailed: number;
  /** Outcomes no master received. */
  outcomesLost: number;
  /** Local denials (`recordDenied`) no master received. */
  deniedLost: number;
  /** `RL.POLICY STATS` replies received. */
  pollsOk: number;
  /** `RL.POLICY STATS` calls that failed. */
  pollsFailed: number;
  /** Report or poll rounds still waiting for Redis (at most one of each per client given: a slow Redis gets no queue). */
  inFlight: number;
}

interface Counts {
  ok: number;
  errors: number;
  /** Calls the kit denied without asking the server (deny cache, local level): sent as `DENIED n`. */
  denied: number;
}

/** One counted report of a policy, on its way to every master. */
interface Entry {
  policy: string;
  ok: number;
  errors: number;
  denied: number;
  /** Clients whose masters have not answered yet. */
  waiting: number;
  /** Masters that took it. */
  received: number;
}

/**
 * One client given to the Protection (its masters): at most one report and
 * one stage read wait on it at a time, so that a client that hangs gets no
 * queue, and does not hold the reports and reads of the others.
 */
interface Lane {
  transport: Transport;
  reporting: Promise<void> | undefined;
  polling: Promise<void> | undefined;
  /** policy -> this client's masters' replies of its last poll one answered. */
  readings: Map<string, Reading>;
}

interface Reading {
  stage: Stage;
  scale: number;
  /** performance.now() of the last poll at least one master answered. */
  at: number;
  /** Every master's reply of that poll. */
  stats: PolicyStats[];
}

/**
 * Counts outcomes and reads stages for the policies it watches, on every
 * master of the clients given (a list of clients: each one's masters; two
 * standalone servers are two masters).
 *
 * - `record(policy, error)` counts in memory, never does I/O; every
 *   `reportIntervalMs` a background timer sends `RL.OUTCOME name ok errors`
 *   to every master for each policy with counts (`DENIED n` added for
 *   the calls the kit denied without asking, `recordDenied`), then forgets
 *   them. A failed send loses its counts; a client whose previous round
 *   still waits for Redis gets nothing that time (those counts are lost to
 *   it), so a dead Redis gets no queue of reports and a hung client does not
 *   hold the others.
 * - every `stagePollMs`, `RL.POLICY STATS name` on every master: `stage()`
 *   is the highest any answered, `scale()` the lowest. A client whose
 *   masters did not answer for `stageHoldMs` counts for nothing: with none,
 *   `stage()` is 0 and the limiter's own fallback decides.
 * - at stage 2 of one of its policies, a breaker (`breaker(name)`) is forced
 *   open, and released when the stage falls below 2.
 *
 * The timers are unref'd: they do not keep the process alive. `close()`
 * stops them and sends the last counts once.
 */
export class Protection {
  readonly reportIntervalMs: number;
  readonly stagePollMs: number;
  readonly stageHoldMs: number;
  private readonly lanes: Lane[];
  private readonly counts = new Map<string, Counts>();
  private readonly breakers = new Map<string, CircuitBreaker>();
  /** breaker name -> the policies whose stage 2 opens it. */
  private readonly links = new Map<string, Set<string>>();
  private readonly breakerOptions: CircuitBreakerOptions;
  private readonly reportTimer: ReturnType<typeof setInterval>;
  private readonly pollTimer: ReturnType<typeof setInterval>;
  private closed = false;
  /** The metrics, when on. */
  readonly metrics: RateLimitMetrics | undefined;
  private readonly tally: ProtectionStats = { reportsSent: 0, reportsFailed: 0, outcomesLost: 0, deniedLost: 0, pollsOk: 0, pollsFailed: 0, inFlight: 0 };

  constructor(client: Client | RedisLike | ReadonlyArray<Client | RedisLike>, policies: readonly string[] = [], options: ProtectionOptions = {}) {
    if (options === null || typeof options !== 'object') {
      throw new InvalidArgumentError('options', `Protection options must be an object, got ${describe(options)}`);
    }
    const clients = Array.isArray(client) ? client : [client];
    if (clients.length === 0) throw new InvalidArgumentError('client', 'Protection needs a client (or a list of them)');
    this.lanes = clients.map((c) => ({ transport: (c instanceof Client ? c : new Client(c)).transport, reporting: undefined, polling: undefined, readings: new Map() }));
    this.reportIntervalMs = checkInteger('reportIntervalMs', options.reportIntervalMs ?? PROTECTION_DEFAULTS.reportIntervalMs, 1);
    this.stagePollMs = checkInteger('stagePollMs', options.stagePollMs ?? PROTECTION_DEFAULTS.stagePollMs, 1);
    this.stageHoldMs = checkInteger('stageHoldMs', options.stageHoldMs ?? PROTECTION_DEFAULTS.stageHoldMs, 1);
    // As in every kit: a hold no longer than the poll would drop each stage
    // read before the next one comes, and the loop would never act.
    if (this.stageHoldMs <= this.stagePollMs) {
      throw new InvalidArgumentError('stageHoldMs', `stageHoldMs (${this.stageHoldMs}) must be longer than stagePollMs (${this.stagePollMs})`);
    }
    this.metrics = resolveMetrics(options.metrics);
    this.breakerOptions = options.breakerOptions ?? {};
    new CircuitBreaker('check', this.breakerOptions); // checked now, naming the bad option
    if (!Array.isArray(policies)) throw new InvalidArgumentError('policies', `policies must be an array of policy names, got ${describe(policies)}`);
    for (const p of policies) this.watch(p);
    if (options.breakers !== undefined) {
      if (options.breakers === null || typeof options.breakers !== 'object') {
        throw new InvalidArgumentError('breakers', `breakers must be { name: [policies] }, got ${describe(options.breakers)}`);
      }
      for (const [name, ps] of Object.entries(options.breakers)) this.linkBreaker(name, ps);
    }
    this.reportTimer = setInterval(() => void this.report(), this.reportIntervalMs);
    this.pollTimer = setInterval(() => void this.poll(), this.stagePollMs);
    this.reportTimer.unref?.();
    this.pollTimer.unref?.();
    void this.poll();
  }

  /** Watches `policy` too: its stage is read, its outcomes may be recorded. */
  watch(policy: string): void {
    checkString('policy', policy);
    if (!this.counts.has(policy)) {
      this.counts.set(policy, { ok: 0, errors: 0, denied: 0 });
      if (this.metrics !== undefined) {
        this.metrics.scale(policy, this.scale(policy));
        this.metrics.stage(policy, this.stage(policy));
      }
    }
  }

  /** The policies watched. */
  get policies(): string[] {
    return [...this.counts.keys()];
  }

  /** Counts one finished request that `policy` admitted: in memory, sent later. */
  record(policy: string, error: boolean): void {
    let c = this.counts.get(policy);
    if (c === undefined) {
      this.watch(policy);
      c = this.counts.get(policy) as Counts;
    }
    if (error) c.errors++;
    else c.ok++;
  }

  /**
   * Counts `n` calls of `policy` that the kit denied without asking the
   * server (a deny cache hit, a local level's denial): in memory, sent with
   * the next report as `RL.OUTCOME name ok errors DENIED n`, so that the
   * server's window counts them as calls and denials (the stages see a
   * flood the deny cache answers). The `Limiter` given this `Protection`
   * (or the middleware) calls it; the non-core routes' degrade at stage 1+
   * is no limiter decision and is not counted.
   */
  recordDenied(policy: string, n = 1): void {
    checkInteger('n', n, 0);
    let c = this.counts.get(policy);
    if (c === undefined) {
      this.watch(policy);
      c = this.counts.get(policy) as Counts;
    }
    c.denied += n;
  }

  /** Outcomes and local denials recorded and not yet sent, per policy. */
  pending(policy: string): { ok: number; errors: number; denied: number } {
    const c = this.counts.get(policy);
    return { ok: c?.ok ?? 0, errors: c?.errors ?? 0, denied: c?.denied ?? 0 };
  }

  /** The policy's stage: the highest any master said at its last poll; a client whose masters did not answer for `stageHoldMs` says 0. */
  stage(policy: string, now = performance.now()): Stage {
    let top: Stage = 0;
    for (const lane of this.lanes) {
      const r = lane.readings.get(policy);
      if (r !== undefined && now - r.at <= this.stageHoldMs && r.stage > top) top = r.stage;
    }
    return top;
  }

  /** The policy's scale (1 to 100): the lowest any master said at its last poll; 100 when unknown or stale. */
  scale(policy: string, now = performance.now()): number {
    let low = 100;
    for (const lane of this.lanes) {
      const r = lane.readings.get(policy);
      if (r !== undefined && now - r.at <= this.stageHoldMs && r.scale < low) low = r.scale;
    }
    return low;
  }

  /** Every master's `RL.POLICY STATS` of the last poll that one of its client's masters answered (empty when none did). */
  stats(policy: string): PolicyStats[] {
    return this.lanes.flatMap((lane) => lane.readings.get(policy)?.stats ?? []);
  }

  /** The breaker `name` (made on first use), for the application's downstream calls. */
  breaker(name: string): CircuitBreaker {
    checkString('breaker', name);
    let b = this.breakers.get(name);
    if (b === undefined) {
      b = new CircuitBreaker(name, this.breakerOptions);
      const m = this.metrics;
      // Read at each scrape: open while any breaker of that name on the registry is.
      m?.watchBreaker(name, b, (x) => x.state !== 'closed');
      this.breakers.set(name, b);
    }
    return b;
  }

  /** Forces `breaker(name)` open while any of `policies` is at stage 2. */
  linkBreaker(name: string, policies: readonly string[]): CircuitBreaker {
    const b = this.breaker(name);
    if (!Array.isArray(policies)) throw new InvalidArgumentError('breakers', `breaker ${name}: policies must be an array of names, got ${describe(policies)}`);
    let set = this.links.get(name);
    if (set === undefined) {
      set = new Set();
      this.links.set(name, set);
    }
    for (const p of policies) {
      this.watch(p);
      set.add(p);
    }
    if (!this.closed) this.applyBreakers();
    return b;
  }

  /** What the loop did so far. */
  counters(): ProtectionStats {
    let inFlight = 0;
    for (const lane of this.lanes) inFlight += (lane.reporting ? 1 : 0) + (lane.polling ? 1 : 0);
    return { ...this.tally, inFlight };
  }

  /** Stage, scale and breakers as plain data (for a status endpoint). */
  snapshot(): { policies: Record<string, { stage: Stage; scale: number }>; breakers: Record<string, CircuitState> } {
    const now = performance.now();
    const policies: Record<string, { stage: Stage; scale: number }> = {};
    for (const p of this.counts.keys()) policies[p] = { stage: this.stage(p, now), scale: this.scale(p, now) };
    const breakers: Record<string, CircuitState> = {};
    for (const [n, b] of this.breakers) breakers[n] = b.state;
    return { policies, breakers };
  }

  /**
   * Sends the counts recorded so far, now, to every master (what the timer
   * does). Resolves when sent or failed; a round already under way is
   * waited for first, not doubled.
   */
  async flush(): Promise<void> {
    await Promise.all(this.lanes.map((lane) => lane.reporting));
    return this.report();
  }

  /** Reads every policy's stage now (what the timer does). */
  refresh(): Promise<void> {
    return this.poll();
  }

  /**
   * Stops the timers and sends the last counts once (best effort, waiting
   * at most `reportIntervalMs`). The breakers the loop forced open are
   * released (no poll would release them any more); the others keep their
   * state.
   */
  async close(): Promise<void> {
    if (this.closed) return;
    this.closed = true;
    clearInterval(this.reportTimer);
    clearInterval(this.pollTimer);
    for (const name of this.links.keys()) {
      const b = this.breakers.get(name) as CircuitBreaker;
      if (b.state === 'forcedOpen') b.release();
    }
    // Best effort, and bounded: a dead Redis does not hold the shutdown,
    // and a client still waiting for one does not keep the others from the
    // last counts (they are sent when its round settles or half the time is
    // up).
    const deadline = performance.now() + this.reportIntervalMs;
    await within(Promise.all(this.lanes.map((lane) => lane.reporting)), this.reportIntervalMs / 2);
    await within(this.report(), deadline - performance.now());
  }

  /**
   * Takes the counts and sends them to every client's masters. A client
   * whose previous report still waits for Redis (its connection queues
   * commands while it reconnects) gets nothing this time: a failed or late
   * send loses its counts, so a dead Redis gets no queue and an outage's
   * counts never land together in one later window.
   */
  private report(): Promise<void> {
    const entries: Entry[] = [];
    for (const [policy, c] of this.counts) {
      if (c.ok === 0 && c.errors === 0 && c.denied === 0) continue;
      entries.push({ policy, ok: c.ok, errors: c.errors, denied: c.denied, waiting: 0, received: 0 });
      c.ok = 0;
      c.errors = 0;
      c.denied = 0;
    }
    if (entries.length === 0) return Promise.resolve();
    const idle = this.lanes.filter((lane) => lane.reporting === undefined);
    this.tally.reportsFailed += entries.length * (this.lanes.length - idle.length);
    for (const e of entries) {
      e.waiting = idle.length;
      if (idle.length === 0) this.lost(e);
    }
    return Promise.all(
      idle.map((lane) => {
        const round = this.sendCounts(lane, entries).finally(() => {
          lane.reporting = undefined;
        });
        lane.reporting = round;
        return round;
      }),
    ).then(() => undefined);
  }

  private async sendCounts(lane: Lane, entries: Entry[]): Promise<void> {
    await Promise.all(
      entries.map(async (e) => {
        const args = ['RL.OUTCOME', e.policy, String(e.ok), String(e.errors)];
        // Without local denials, the plain three-argument form.
        if (e.denied > 0) args.push('DENIED', String(e.denied));
        const results = await eachMasterSettled(lane.transport, args);
        for (const r of results) {
          if (r.status === 'fulfilled') {
            e.received++;
            this.tally.reportsSent++;
          } else this.tally.reportsFailed++;
        }
        e.waiting--;
        if (e.waiting === 0 && e.received === 0) this.lost(e);
      }),
    );
  }

  private lost(e: Entry): void {
    this.tally.outcomesLost += e.ok + e.errors;
    this.tally.deniedLost += e.denied;
  }

  private poll(): Promise<void> {
    if (this.closed) return Promise.resolve();
    // The breakers follow the hold even while a poll waits for a dead Redis.
    this.applyBreakers();
    return Promise.all(
      this.lanes.map((lane) => {
        if (lane.polling) return lane.polling;
        const round = this.readStages(lane).finally(() => {
          lane.polling = undefined;
          if (!this.closed) this.applyBreakers();
        });
        lane.polling = round;
        return round;
      }),
    ).then(() => undefined);
  }

  private async readStages(lane: Lane): Promise<void> {
    await Promise.all(
      [...this.counts.keys()].map(async (policy) => {
        const results = await eachMasterSettled(lane.transport, ['RL.POLICY', 'STATS', policy]);
        const stats: PolicyStats[] = [];
        for (const r of results) {
          if (r.status === 'rejected') {
            this.tally.pollsFailed++;
            continue;
          }
          try {
            stats.push(parseStats(r.value));
            this.tally.pollsOk++;
          } catch {
            this.tally.pollsFailed++;
          }
        }
        if (stats.length === 0) return;
        const stage = Math.max(...stats.map((s) => s.stage)) as Stage;
        const scale = Math.min(...stats.map((s) => s.scale));
        lane.readings.set(policy, { stage, scale, at: performance.now(), stats });
      }),
    );
  }

  private applyBreakers(): void {
    const now = performance.now();
    if (this.metrics !== undefined) {
      for (const p of this.counts.keys()) {
        this.metrics.scale(p, this.scale(p, now));
        this.metrics.stage(p, this.stage(p, now));
      }
    }
    for (const [name, policies] of this.links) {
      const b = this.breakers.get(name) as CircuitBreaker;
      let top = 0;
      for (const p of policies) top = Math.max(top, this.stage(p, now));
      if (top >= 2) {
        if (b.state !== 'forcedOpen') b.forceOpen();
      } else if (b.state === 'forcedOpen') {
        b.release();
      }
    }
  }
}

/** Waits for `p`, at most `ms` (an unref'd timer). */
async function within(p: Promise<unknown>, ms: number): Promise<void> {
  let timer: ReturnType<typeof setTimeout> | undefined;
  const giveUp = new Promise<void>((resolve) => {
    timer = setTimeout(resolve, Math.max(0, ms));
    timer.unref?.();
  });
  await Promise.race([p, giveUp]);
  clearTimeout(timer);
}

/** A breaker's state: closed (calls go), open (after failures, for `openForMs`), forced open (stage 2, until released). */
export type CircuitState = 'closed' | 'open' | 'forcedOpen';

/** When a `CircuitBreaker` opens on its own. */
export interface CircuitBreakerOptions {
  /** Consecutive failures that open it (default 5). */
  failures?: number;
  /** How long it stays open before one trial call goes through (default 1,000 ms). */
  openForMs?: number;
}

/** `CircuitBreaker.call` refused: the breaker is open. */
export class CircuitOpenError extends RLError {
  constructor(
    readonly breaker: string,
    readonly state: CircuitState,
  ) {
    super(`circuit breaker ${JSON.stringify(breaker)} is ${state === 'forcedOpen' ? 'forced open (the policy is at stage 2)' : 'open'}`);
  }
}

/**
 * The kit's breaker for the application's downstream calls: `call(fn)` (or
 * `allow()`, then `success()`/`failure()`). It opens on its own after
 * `failures` consecutive failures, for `openForMs`, then lets one trial call
 * through (its success closes it, its failure opens it again); the
 * `Protection` forces it open at stage 2 (`forceOpen()`) and `release()`s it
 * when the stage falls.
 */
export class CircuitBreaker {
  readonly failures: number;
  readonly openForMs: number;
  private state_: CircuitState = 'closed';
  /** Called with the new state on every change (the `Protection`'s metrics). */
  onChange: ((state: CircuitState) => void) | undefined;

  private get current(): CircuitState {
    return this.state_;
  }

  private set current(state: CircuitState) {
    if (state === this.state_) return;
    this.state_ = state;
    this.onChange?.(state);
  }
  private consecutive = 0;
  private openUntil = 0;
  /** A trial call is out until this instant (performance.now()). */
  private trialUntil = 0;

  constructor(
    readonly name: string,
    options: CircuitBreakerOptions = {},
  ) {
    if (options === null || typeof options !== 'object') {
      throw new InvalidArgumentError('breakerOptions', `breaker options must be { failures, openForMs }, got ${describe(options)}`);
    }
    this.failures = checkInteger('failures', options.failures ?? 5, 1);
    this.openForMs = checkInteger('openForMs', options.openForMs ?? 1000, 1);
  }

  get state(): CircuitState {
    return this.current;
  }

  /** Whether a call may go now. Open past `openForMs`: one trial call at a time. */
  allow(now = performance.now()): boolean {
    if (this.current === 'closed') return true;
    if (this.current === 'forcedOpen' || now < this.openUntil || now < this.trialUntil) return false;
    this.trialUntil = now + this.openForMs;
    return true;
  }

  /** A call's success: closes the breaker, unless it is open and this is no trial (a call from before it opened). */
  success(): void {
    if (this.current === 'forcedOpen') return;
    if (this.current === 'open' && this.trialUntil === 0) return;
    this.current = 'closed';
    this.consecutive = 0;
    this.trialUntil = 0;
  }

  failure(now = performance.now()): void {
    if (this.current === 'forcedOpen') return;
    this.consecutive++;
    if (this.current === 'open' || this.consecutive >= this.failures) {
      this.current = 'open';
      this.openUntil = now + this.openForMs;
      this.trialUntil = 0;
    }
  }

  /** Runs `fn` if the breaker allows it, counting its outcome; rejects with `CircuitOpenError` without running it if not. */
  async call<T>(fn: () => T | Promise<T>): Promise<T> {
    if (!this.allow()) throw new CircuitOpenError(this.name, this.current);
    try {
      const v = await fn();
      this.success();
      return v;
    } catch (err) {
      this.failure();
      throw err;
    }
  }

  /** Open until `release()`, whatever the calls say. */
  forceOpen(): void {
    this.current = 'forcedOpen';
  }

  /** Closed, its failure count reset. */
  release(): void {
    this.current = 'closed';
    this.consecutive = 0;
    this.openUntil = 0;
    this.trialUntil = 0;
  }
}

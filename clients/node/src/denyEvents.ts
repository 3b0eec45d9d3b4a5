/**
 * Deny events (SPEC "Observability in every kit", the contract's
 * `observability.deny_events`): every denial as one JSON line with seed
 * 000's fields, through a bounded ring buffer that a background flusher
 * ships in batches to a file, an Elasticsearch `_bulk` endpoint or a
 * callback. A request only appends to the buffer; it never waits for a sink.
 */
import { appendFile } from 'node:fs/promises';
import { request as httpRequest } from 'node:http';
import { request as httpsRequest } from 'node:https';
import { checkInteger, checkString, describe, InvalidArgumentError } from './errors.js';
import { LEVELS, OUTCOMES, resolveMetrics, type Level, type MetricsOption, type Outcome, type RateLimitMetrics } from './metrics.js';

/** One denial as shipped: the fields in the contract's order; `client_ip` and `user_agent` only when known. */
export interface DenyEvent {
  /** RFC 3339 in UTC with milliseconds: `2026-12-02T10:00:00.123Z`. */
  timestamp: string;
  /** The limiter key. */
  key: string;
  /** The rule's name (a policy rule: the policy's name). */
  rule: string;
  level: Level;
  outcome: Outcome;
  limit: number;
  remaining: number;
  /** The decision's `waitMs`: -1 when the request can never pass. */
  retry_after_ms: number;
  /** At most `MAX_HEADER_BYTES` (512) bytes in UTF-8, cut at a character boundary. */
  client_ip?: string;
  /** At most `MAX_HEADER_BYTES` (512) bytes in UTF-8, cut at a character boundary. */
  user_agent?: string;
}

/** The fields, in order (the contract's `deny_events.fields`). */
export const DENY_EVENT_FIELDS = Object.freeze(['timestamp', 'key', 'rule', 'level', 'outcome', 'limit', 'remaining', 'retry_after_ms', 'client_ip', 'user_agent'] as const);

/** The defaults (the contract's `deny_events`). */
export const DENY_EVENT_DEFAULTS = Object.freeze({
  /** Events the buffer holds; beyond, the oldest are dropped (counted). */
  capacity: 10_000,
  /** A flush starts as soon as this many events wait, and ships at most this many per batch. */
  flushEvents: 1000,
  /** And at least this often. */
  flushIntervalMs: 5000,
  /** A sink that has not accepted a batch within this is failed: the batch is dropped (counted), never retried. */
  timeoutMs: 2000,
  /** The `_bulk` action's index. */
  bulkIndex: 'ratelimit-deny',
});

/**
 * The most UTF-8 bytes of an event's `client_ip` and `user_agent` (the
 * contract's `deny_events.max_header_bytes`): a longer one is cut at a
 * character boundary, so a flood of requests with huge headers cannot fill
 * the buffer.
 */
export const MAX_HEADER_BYTES = 512;

/**
 * `s` cut to at most `MAX_HEADER_BYTES` bytes in UTF-8, never splitting a
 * character (a surrogate pair is one 4-byte character; a lone surrogate
 * counts as the 3 bytes of its replacement). Walks at most 512 code units.
 */
export function cutHeader(s: string): string {
  // Every UTF-16 code unit is at most 3 bytes in UTF-8.
  if (s.length * 3 <= MAX_HEADER_BYTES) return s;
  let bytes = 0;
  let i = 0;
  while (i < s.length) {
    const c = s.charCodeAt(i);
    let n = 3;
    let w = 1;
    if (c < 0x80) n = 1;
    else if (c < 0x800) n = 2;
    else if (c >= 0xd800 && c <= 0xdbff && i + 1 < s.length) {
      const d = s.charCodeAt(i + 1);
      if (d >= 0xdc00 && d <= 0xdfff) {
        n = 4;
        w = 2;
      }
    }
    if (bytes + n > MAX_HEADER_BYTES) return s.slice(0, i);
    bytes += n;
    i += w;
  }
  return s;
}

/** `new DenyEvents(options)`: exactly one sink (`file`, `bulkUrl` or `callback`). */
export interface DenyEventsOptions {
  /** Append each batch to this file as JSON lines. */
  file?: string;
  /** POST each batch to `<bulkUrl>/_bulk` (Elasticsearch, OpenSearch): an action line then the event's line per event. */
  bulkUrl?: string | URL;
  /** The `_index` of the `_bulk` action lines (default `ratelimit-deny`). */
  bulkIndex?: string;
  /** Give each batch to this function, on the flusher (never on a request). A rejection (or a throw) fails the batch. */
  callback?: (batch: DenyEvent[]) => void | Promise<void>;
  /** Buffer size (default 10,000). */
  capacity?: number;
  /** Flush when this many wait, at most this many per batch (default 1,000). */
  flushEvents?: number;
  /** Flush at least this often (default 5,000 ms). */
  flushIntervalMs?: number;
  /** Sink timeout per batch (default 2,000 ms). */
  timeoutMs?: number;
  /** `ratelimit_deny_events_{dropped,shipped,sink_errors}_total` in this registry (`true`: prom-client's global one). */
  metrics?: MetricsOption;
  /**
   * The background flusher (default true). Without it, events wait in the
   * buffer for `flush()` or `close()`.
   */
  background?: boolean;
}

/** What the shipper did so far. */
export interface DenyEventsStats {
  /** Events waiting in the buffer. */
  pending: number;
  /** Events a sink accepted. */
  shipped: number;
  /** Events lost: dropped from a full buffer, in a failed batch, or recorded after `close()`. */
  dropped: number;
  /** Batches a sink refused or failed. */
  sinkErrors: number;
  /** Batches a sink accepted. */
  batches: number;
}

/** A denial as the limiter records it; the timestamp is taken at `record`. */
export interface DenyEventInput {
  key: string;
  rule: string;
  level: Level;
  outcome?: Outcome;
  limit: number;
  remaining: number;
  retryAfterMs: number;
  clientIp?: string | undefined;
  userAgent?: string | undefined;
}

type Sink = (batch: DenyEvent[], timeoutMs: number) => Promise<void>;

/**
 * The deny-event shipper: give it to a `Limiter` (`denyEvents` option) and
 * every denial it answers, at every level, is recorded; the middleware adds
 * the request's `client_ip` and `user_agent`.
 *
 * - `record` appends to a ring buffer of `capacity` events (a full one
 *   drops its oldest, counted in `dropped`) and never does I/O.
 * - A background flusher (timers unref'd: it does not keep the process
 *   alive) ships every `flushIntervalMs`, or as soon as `flushEvents` wait,
 *   in batches of at most `flushEvents`, one batch at a time.
 * - A batch the sink fails (an error, no answer within `timeoutMs`, a
 *   non-2xx status, a `_bulk` reply with `errors`) is dropped and counted
 *   (`dropped` += its events, `sinkErrors` += 1), never retried: a dead sink
 *   costs counts, not memory or latency.
 * - `close()` stops the flusher and ships what is left, within `timeoutMs`.
 *
 * ```ts
 * const events = new DenyEvents({ bulkUrl: 'http://127.0.0.1:9200', metrics: true })
 * const limiter = new Limiter(client, { metrics: true, denyEvents: events })
 * process.on('SIGTERM', () => events.close())
 * ```
 */
export class DenyEvents {
  readonly capacity: number;
  readonly flushEvents: number;
  readonly flushIntervalMs: number;
  readonly timeoutMs: number;
  readonly bulkIndex: string;
  private readonly sink: Sink;
  private readonly metrics: RateLimitMetrics | undefined;
  /**
   * The ring, in columns (no object per event kept: a flood's events would
   * outlive the young generation and tax the GC): slot i's fields.
   */
  private readonly at: Float64Array;
  private readonly keys: Array<string | undefined>;
  private readonly rules: Array<string | undefined>;
  private readonly levels: Array<Level | undefined>;
  private readonly outcomes: Array<Outcome | undefined>;
  private readonly limits: Float64Array;
  private readonly remainings: Float64Array;
  private readonly waits: Float64Array;
  private readonly ips: Array<string | undefined>;
  private readonly agents: Array<string | undefined>;
  private head = 0;
  private count = 0;
  private readonly timer: ReturnType<typeof setInterval> | undefined;
  private woken = false;
  private flushing: Promise<void> | undefined;
  private closed = false;
  /** close()'s promise: a second call waits for the first. */
  private closing: Promise<void> | undefined;
  /** close()'s one deadline (performance.now()), which a run under way keeps too. */
  private closeDeadline: number | undefined;
  /** The timeout of the batch under way: close() holds the process for it. */
  private sinkTimer: ReturnType<typeof setTimeout> | undefined;
  /** flush() calls waiting for a background run: its timeouts keep the process alive meanwhile. */
  private waiting = 0;
  private readonly tally = { shipped: 0, dropped: 0, sinkErrors: 0, batches: 0 };

  constructor(options: DenyEventsOptions) {
    if (options === null || typeof options !== 'object') {
      throw new InvalidArgumentError('options', `DenyEvents options must be an object with file, bulkUrl or callback, got ${describe(options)}`);
    }
    this.capacity = checkInteger('capacity', options.capacity ?? DENY_EVENT_DEFAULTS.capacity, 1);
    this.flushEvents = checkInteger('flushEvents', options.flushEvents ?? Math.min(DENY_EVENT_DEFAULTS.flushEvents, this.capacity), 1, this.capacity);
    this.flushIntervalMs = checkInteger('flushIntervalMs', options.flushIntervalMs ?? DENY_EVENT_DEFAULTS.flushIntervalMs, 1, 2 ** 31 - 1);
    this.timeoutMs = checkInteger('timeoutMs', options.timeoutMs ?? DENY_EVENT_DEFAULTS.timeoutMs, 1, 2 ** 31 - 1);
    this.bulkIndex = checkString('bulkIndex', options.bulkIndex ?? DENY_EVENT_DEFAULTS.bulkIndex);
    const background = options.background ?? true;
    if (typeof background !== 'boolean') throw new InvalidArgumentError('background', `background must be true or false, got ${describe(background)}`);
    const given = (['file', 'bulkUrl', 'callback'] as const).filter((k) => options[k] !== undefined);
    if (given.length !== 1) {
      throw new InvalidArgumentError(given[1] ?? 'sink', `DenyEvents needs exactly one sink: file, bulkUrl or callback${given.length > 1 ? ` (got ${given.join(' and ')})` : ''}`);
    }
    if (options.file !== undefined) this.sink = fileSink(checkString('file', options.file));
    else if (options.bulkUrl !== undefined) this.sink = bulkSink(checkUrl(options.bulkUrl), this.bulkIndex);
    else {
      const cb = options.callback;
      if (typeof cb !== 'function') throw new InvalidArgumentError('callback', `callback must be a function, got ${describe(cb)}`);
      this.sink = async (batch) => {
        await cb(batch);
      };
    }
    this.metrics = resolveMetrics(options.metrics);
    const n = this.capacity;
    this.at = new Float64Array(n);
    this.keys = new Array<string | undefined>(n).fill(undefined);
    this.rules = new Array<string | undefined>(n).fill(undefined);
    this.levels = new Array<Level | undefined>(n).fill(undefined);
    this.outcomes = new Array<Outcome | undefined>(n).fill(undefined);
    this.limits = new Float64Array(n);
    this.remainings = new Float64Array(n);
    this.waits = new Float64Array(n);
    this.ips = new Array<string | undefined>(n).fill(undefined);
    this.agents = new Array<string | undefined>(n).fill(undefined);
    if (background) {
      this.timer = setInterval(() => this.wake(true), this.flushIntervalMs);
      this.timer.unref?.();
    }
  }

  /**
   * Appends one denial (never blocks, never does I/O): a full buffer drops
   * its oldest event; after `close()` the event is dropped. Wakes the
   * flusher once `flushEvents` wait.
   */
  record(e: DenyEventInput): void {
    // Checked here, on the caller: a field JSON cannot hold would cost the whole batch on the flusher.
    checkEvent(e);
    if (this.closed) {
      this.drop(1);
      return;
    }
    let i: number;
    if (this.count === this.capacity) {
      // Full: the oldest goes.
      i = this.head;
      this.head = (this.head + 1) % this.capacity;
      this.drop(1);
    } else {
      i = (this.head + this.count) % this.capacity;
      this.count++;
    }
    this.at[i] = Date.now();
    this.keys[i] = e.key;
    this.rules[i] = e.rule;
    this.levels[i] = e.level;
    this.outcomes[i] = e.outcome ?? 'denied';
    this.limits[i] = e.limit;
    this.remainings[i] = e.remaining;
    this.waits[i] = e.retryAfterMs;
    // Cut here, for every path (the middleware's and a caller's own context).
    this.ips[i] = e.clientIp === undefined ? undefined : cutHeader(e.clientIp);
    this.agents[i] = e.userAgent === undefined ? undefined : cutHeader(e.userAgent);
    if (this.count >= this.flushEvents && this.timer !== undefined && !this.woken && this.flushing === undefined) {
      this.woken = true;
      // On the flusher, never on the request.
      setImmediate(() => {
        this.woken = false;
        this.wake(false);
      });
    }
  }

  /** What the shipper did so far. */
  stats(): DenyEventsStats {
    return { pending: this.count, ...this.tally };
  }

  /** Ships everything waiting now, batch by batch (what the timer does); resolves when done (failed batches counted). */
  async flush(): Promise<void> {
    if (this.flushing !== undefined) {
      this.waiting++;
      this.sinkTimer?.ref?.();
      try {
        while (this.flushing !== undefined) await this.flushing;
      } finally {
        this.waiting--;
      }
    }
    await this.run(true, true);
  }

  /**
   * Stops the flusher and ships what is left, within `timeoutMs` in all:
   * what is still waiting then is dropped (counted). Events recorded after
   * are dropped.
   */
  close(): Promise<void> {
    this.closing ??= this.shut();
    return this.closing;
  }

  private async shut(): Promise<void> {
    this.closed = true;
    if (this.timer !== undefined) clearInterval(this.timer);
    // One deadline for all that is left, the batch under way included.
    this.closeDeadline = performance.now() + this.timeoutMs;
    // A background batch under way: its timeout now keeps the process alive until close() resolves.
    this.sinkTimer?.ref?.();
    while (this.flushing !== undefined) await this.flushing;
    await this.run(true, true);
    if (this.count > 0) {
      const n = this.count;
      this.take(n);
      this.drop(n);
    }
  }

  private wake(all: boolean): void {
    if (this.flushing !== undefined) return;
    this.run(all, false).catch((err: unknown) => {
      process.emitWarning(`redis-ratelimit: the deny events' flusher failed: ${(err as Error)?.message ?? String(err)}`, { code: 'RL_DENY_EVENTS' });
    });
  }

  /**
   * Ships batches: all that wait (`all`), or while a full batch waits; one
   * run at a time, within close()'s deadline once it is called. `held`: an
   * explicit flush() or close(), whose timers keep the process alive until
   * it resolves (the background flusher's do not).
   */
  private run(all: boolean, held: boolean): Promise<void> {
    const p = (async () => {
      while (this.count > 0 && (all || this.count >= this.flushEvents)) {
        let timeout = this.timeoutMs;
        const deadline = this.closeDeadline;
        if (deadline !== undefined) {
          timeout = Math.min(timeout, Math.floor(deadline - performance.now()));
          if (timeout <= 0) return;
        }
        const batch = this.take(Math.min(this.count, this.flushEvents));
        try {
          await withTimeout(this.sink(batch, timeout), timeout, held || this.closed || this.waiting > 0, (t) => (this.sinkTimer = t));
          this.tally.shipped += batch.length;
          this.tally.batches++;
          this.metrics?.eventsShipped(batch.length);
        } catch {
          this.tally.sinkErrors++;
          this.metrics?.sinkError();
          this.drop(batch.length);
        }
      }
    })().finally(() => {
      if (this.flushing === p) this.flushing = undefined;
    });
    this.flushing = p;
    return p;
  }

  /** The `n` oldest events, out of the buffer: each as its JSON object, the fields in the contract's order, the optional ones only when known. */
  private take(n: number): DenyEvent[] {
    const out: DenyEvent[] = new Array<DenyEvent>(n);
    for (let k = 0; k < n; k++) {
      const i = this.head;
      const e: DenyEvent = {
        timestamp: new Date(this.at[i] as number).toISOString(),
        key: this.keys[i] as string,
        rule: this.rules[i] as string,
        level: this.levels[i] as Level,
        outcome: this.outcomes[i] as Outcome,
        limit: this.limits[i] as number,
        remaining: this.remainings[i] as number,
        retry_after_ms: this.waits[i] as number,
      };
      const ip = this.ips[i];
      const ua = this.agents[i];
      if (ip !== undefined && ip !== '') e.client_ip = ip;
      if (ua !== undefined && ua !== '') e.user_agent = ua;
      out[k] = e;
      this.keys[i] = this.rules[i] = this.ips[i] = this.agents[i] = undefined;
      this.head = (this.head + 1) % this.capacity;
    }
    this.count -= n;
    return out;
  }

  private drop(n: number): void {
    this.tally.dropped += n;
    this.metrics?.eventsDropped(n);
  }
}

function jsonLines(batch: DenyEvent[]): string {
  let s = '';
  for (const e of batch) s += JSON.stringify(e) + '\n';
  return s;
}

function fileSink(path: string): Sink {
  return (batch) => appendFile(path, jsonLines(batch));
}

function checkUrl(url: unknown): URL {
  let u: URL;
  try {
    u = new URL(String(url));
  } catch {
    throw new InvalidArgumentError('bulkUrl', `bulkUrl must be an http(s) URL, got ${describe(url)}`);
  }
  if (u.protocol !== 'http:' && u.protocol !== 'https:') throw new InvalidArgumentError('bulkUrl', `bulkUrl must be an http(s) URL, got ${describe(String(url))}`);
  return u;
}

/**
 * The longest `_bulk` reply read (Elasticsearch's for a batch of 1,000
 * failed items is well under 1 MiB): beyond, the batch fails.
 */
const MAX_BULK_REPLY = 32 * 1024 * 1024;

/** POST `<url>/_bulk`: per event the action line, then the event; accepted on a 2xx whose JSON body has `errors: false`. */
function bulkSink(base: URL, index: string): Sink {
  const target = new URL(base.href.replace(/\/*$/, '') + '/_bulk');
  const action = JSON.stringify({ index: { _index: index } }) + '\n';
  const send = target.protocol === 'https:' ? httpsRequest : httpRequest;
  return (batch, timeoutMs) =>
    new Promise<void>((resolve, reject) => {
      let body = '';
      for (const e of batch) body += action + JSON.stringify(e) + '\n';
      const payload = Buffer.from(body);
      const req = send(target, {
        method: 'POST',
        headers: { 'Content-Type': 'application/x-ndjson', 'Content-Length': payload.length },
        // No pooled socket: a dead or slow endpoint holds nothing after the timeout.
        agent: false,
      });
      const timer = setTimeout(() => req.destroy(new Error(`_bulk: no answer within ${timeoutMs} ms`)), timeoutMs);
      timer.unref?.();
      req.on('error', (err) => {
        clearTimeout(timer);
        reject(err);
      });
      req.on('response', (res) => {
        const chunks: Buffer[] = [];
        let size = 0;
        res.on('data', (c: Buffer) => {
          size += c.length;
          // A reply past the bound is no _bulk answer to this batch: not held in memory.
          if (size > MAX_BULK_REPLY) {
            clearTimeout(timer);
            req.destroy();
            reject(new Error(`_bulk: the reply is longer than ${MAX_BULK_REPLY} bytes`));
            return;
          }
          chunks.push(c);
        });
        res.on('error', (err) => {
          clearTimeout(timer);
          reject(err);
        });
        res.on('end', () => {
          clearTimeout(timer);
          const status = res.statusCode ?? 0;
          if (status < 200 || status >= 300) return reject(new Error(`_bulk: HTTP ${status}`));
          let reply: unknown;
          try {
            reply = JSON.parse(Buffer.concat(chunks).toString('utf8'));
          } catch {
            return reject(new Error('_bulk: the reply is not JSON'));
          }
          if (reply === null || typeof reply !== 'object' || (reply as { errors?: unknown }).errors !== false) {
            return reject(new Error('_bulk: the reply says errors'));
          }
          resolve();
        });
      });
      req.end(payload);
    });
}

/**
 * `p`, or a rejection after `ms`. The timer is unref'd on the background
 * flusher (it does not keep the process alive); `held` by an explicit
 * flush() or close(), it is not: a process awaiting close() with nothing
 * else to do would exit under it, its events neither shipped nor counted.
 */
function withTimeout(p: Promise<void>, ms: number, held: boolean, started: (timer: ReturnType<typeof setTimeout>) => void): Promise<void> {
  let timer: ReturnType<typeof setTimeout> | undefined;
  const late = new Promise<never>((_, reject) => {
    timer = setTimeout(() => reject(new Error(`the sink did not answer within ${ms} ms`)), ms);
    if (!held) timer.unref?.();
    started(timer);
  });
  p.catch(() => {});
  return Promise.race([p, late]).finally(() => clearTimeout(timer));
}

const LEVEL_SET: ReadonlySet<unknown> = new Set(LEVELS);
const OUTCOME_SET: ReadonlySet<unknown> = new Set(OUTCOMES);

/** A `record`ed event's fields, each refused naming it. */
function checkEvent(e: DenyEventInput): void {
  if (e === null || typeof e !== 'object') throw new InvalidArgumentError('event', `a deny event must be an object, got ${describe(e)}`);
  if (typeof e.key !== 'string') throw new InvalidArgumentError('key', `key must be a string, got ${describe(e.key)}`);
  if (typeof e.rule !== 'string') throw new InvalidArgumentError('rule', `rule must be a string, got ${describe(e.rule)}`);
  if (!LEVEL_SET.has(e.level)) throw new InvalidArgumentError('level', `level must be one of ${LEVELS.join(', ')}, got ${describe(e.level)}`);
  if (e.outcome !== undefined && !OUTCOME_SET.has(e.outcome)) throw new InvalidArgumentError('outcome', `outcome must be one of ${OUTCOMES.join(', ')}, got ${describe(e.outcome)}`);
  if (!Number.isFinite(e.limit)) throw new InvalidArgumentError('limit', `limit must be a finite number, got ${describe(e.limit)}`);
  if (!Number.isFinite(e.remaining)) throw new InvalidArgumentError('remaining', `remaining must be a finite number, got ${describe(e.remaining)}`);
  if (!Number.isFinite(e.retryAfterMs)) throw new InvalidArgumentError('retryAfterMs', `retryAfterMs must be a finite number, got ${describe(e.retryAfterMs)}`);
  if (e.clientIp !== undefined && typeof e.clientIp !== 'string') throw new InvalidArgumentError('clientIp', `clientIp must be a string, got ${describe(e.clientIp)}`);
  if (e.userAgent !== undefined && typeof e.userAgent !== 'string') throw new InvalidArgumentError('userAgent', `userAgent must be a string, got ${describe(e.userAgent)}`);
}

/**
 * A `DenyEvents` (by its methods: the ESM and CommonJS builds of this
 * package, loaded side by side, each have their own class).
 */
export function isDenyEvents(v: unknown): v is DenyEvents {
  return v instanceof DenyEvents || (v !== null && typeof v === 'object' && typeof (v as DenyEvents).record === 'function' && typeof (v as DenyEvents).close === 'function');
}

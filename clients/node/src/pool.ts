import { TimeoutError } from './errors.js';
import type { ConnectionFactory, DedicatedConnection, Transport } from './transport.js';

/**
 * Connections of acquire's own, opened lazily: one per acquire in flight (a
 * held reply occupies its connection), and up to `maxIdle` kept open between
 * acquires, each closed after `idleMs` without use. None is shared with the
 * application's client.
 */
export class ConnectionPool {
  private readonly idle: { conn: DedicatedConnection; timer: NodeJS.Timeout }[] = [];
  private readonly busy = new Set<DedicatedConnection>();
  private closed = false;

  constructor(
    private readonly open: ConnectionFactory,
    private readonly maxIdle: number,
    private readonly idleMs: number,
  ) {}

  /**
   * Runs `send` on a connection of its own. When no reply came within
   * `deadlineMs` (null: none), or `signal` aborts first, the connection is
   * closed, so the server forgets the request (consuming nothing), and the
   * promise rejects: with `TimeoutError`, or the signal's reason.
   */
  async run<T>(send: (t: Transport) => Promise<T>, deadlineMs: number | null, what: string, signal?: AbortSignal): Promise<T> {
    signal?.throwIfAborted();
    const conn = await this.take();
    let timer: NodeJS.Timeout | undefined;
    let onAbort: (() => void) | undefined;
    let abandoned = false;
    const stop = new Promise<never>((_, reject) => {
      if (deadlineMs !== null) {
        timer = setTimeout(() => {
          abandoned = true;
          reject(new TimeoutError(`${what}: no reply within ${deadlineMs} ms; the connection was closed and the request was not retried`));
        }, deadlineMs);
      }
      if (signal) {
        onAbort = () => {
          abandoned = true;
          reject(signal.reason);
        };
        if (signal.aborted) onAbort();
        else signal.addEventListener('abort', onAbort, { once: true });
      }
    });
    try {
      const value = await Promise.race([send(conn.transport), stop]);
      this.give(conn, true);
      return value;
    } catch (err) {
      // A server's error reply leaves the connection usable; a dropped one, or
      // one with a reply still to come, does not.
      this.give(conn, !abandoned && isReplyError(err));
      throw err;
    } finally {
      if (timer) clearTimeout(timer);
      if (onAbort) signal?.removeEventListener('abort', onAbort);
    }
  }

  /** Closes every connection; acquires still waiting reject. */
  close(): void {
    this.closed = true;
    for (const { conn, timer } of this.idle.splice(0)) {
      clearTimeout(timer);
      conn.close();
    }
    for (const conn of this.busy) conn.close();
    this.busy.clear();
  }

  private async take(): Promise<DedicatedConnection> {
    while (this.idle.length > 0) {
      const { conn, timer } = this.idle.pop() as { conn: DedicatedConnection; timer: NodeJS.Timeout };
      clearTimeout(timer);
      if (conn.healthy()) {
        this.busy.add(conn);
        return conn;
      }
      conn.close();
    }
    const conn = await this.open();
    if (this.closed) {
      conn.close();
      throw new Error('the Client was closed');
    }
    this.busy.add(conn);
    return conn;
  }

  private give(conn: DedicatedConnection, reusable: boolean): void {
    this.busy.delete(conn);
    if (this.closed || !reusable || !conn.healthy() || this.idle.length >= this.maxIdle) {
      conn.close();
      return;
    }
    const entry = {
      conn,
      timer: setTimeout(() => {
        const at = this.idle.indexOf(entry);
        if (at >= 0) this.idle.splice(at, 1);
        conn.close();
      }, this.idleMs),
    };
    // The timer alone does not keep the process running (the socket does,
    // until the pool is closed: RL.close(), or the application's client ends).
    entry.timer.unref();
    this.idle.push(entry);
  }
}

/** An error reply of the server (`ERR ...`, `WRONGTYPE ...`), as the clients reject with. */
function isReplyError(err: unknown): boolean {
  if (!(err instanceof Error)) return false;
  const name = err.name;
  return name === 'ReplyError' || name === 'ErrorReply' || /^[A-Z]+ /.test(err.message);
}

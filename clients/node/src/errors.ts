import type { Decision } from './decision.js';

/**
 * The errors this package throws. Every one is an `RLError`, so a caller can
 * tell the limiter's failures from its own; the subclasses say what went wrong.
 */

/** Any error of this package. */
export class RLError extends Error {
  constructor(message: string, options?: { cause?: unknown }) {
    super(message, options);
    this.name = new.target.name;
  }
}

/**
 * An argument the kit refused before sending anything (so nothing was
 * written), or one the server refused (`ERR ...`, which names it too).
 * `argument` is the option or parameter at fault.
 */
export class InvalidArgumentError extends RLError {
  readonly argument: string;
  constructor(argument: string, message: string, options?: { cause?: unknown }) {
    super(message, options);
    this.argument = argument;
  }
}

/**
 * The server has no `ratelimit` module: `MODULE LIST` does not show it, or a
 * command came back `unknown command`. A managed server that cannot load
 * modules cannot run this kit; failing loudly beats a breaker tripping on
 * every request.
 */
export class ModuleMissingError extends RLError {}

/**
 * Redis could not be reached: `checkModule` found the client closed, not
 * connected, or not ready within its timeout, or `MODULE LIST` was lost with
 * the connection. `cause` is the client's own error, when there is one.
 */
export class RLConnectionError extends RLError {}

/** The server answered something that is not a limiter reply. */
export class ProtocolError extends RLError {}

/**
 * A denial where the caller asked for a grant it cannot go on without: a
 * lease (`lease`, `withLease`) that was refused, or not granted before the
 * acquire's timeout. `decision` is the server's answer (`retryAfterS` for a
 * `Retry-After`).
 */
export class RLDeniedError extends RLError {
  readonly decision: Decision;
  constructor(message: string, decision: Decision) {
    super(message);
    this.decision = decision;
  }
}

/**
 * No reply within an acquire's deadline (its `BLOCK` timeout plus a margin):
 * the connection was closed, so the server forgets the request if it was still
 * waiting. It may have been admitted just before; the kit does not retry it
 * (a lease that was granted expires by itself).
 */
export class TimeoutError extends RLError {}

// The former names, kept for one release: the same class objects, so
// `err instanceof RLModuleNotLoadedError` holds for a `ModuleMissingError`
// and the reverse. (An error's `name` is the new class name.)

/** @deprecated use `InvalidArgumentError` (the same class). */
export const RLArgumentError = InvalidArgumentError;
/** @deprecated use `InvalidArgumentError` (the same class). */
export type RLArgumentError = InvalidArgumentError;
/** @deprecated use `ModuleMissingError` (the same class). */
export const RLModuleNotLoadedError = ModuleMissingError;
/** @deprecated use `ModuleMissingError` (the same class). */
export type RLModuleNotLoadedError = ModuleMissingError;
/** @deprecated use `ProtocolError` (the same class). */
export const RLProtocolError = ProtocolError;
/** @deprecated use `ProtocolError` (the same class). */
export type RLProtocolError = ProtocolError;
/** @deprecated use `TimeoutError` (the same class). */
export const RLDeadlineError = TimeoutError;
/** @deprecated use `TimeoutError` (the same class). */
export type RLDeadlineError = TimeoutError;

/** Checks that `value` is an integer in [min, max]; names `argument` if not. */
export function checkInteger(argument: string, value: unknown, min: number, max = 2 ** 40): number {
  if (typeof value !== 'number' || !Number.isInteger(value)) {
    throw new InvalidArgumentError(argument, `${argument} must be an integer, got ${describe(value)}`);
  }
  if (value < min) {
    throw new InvalidArgumentError(argument, `${argument} must be at least ${min}, got ${value}`);
  }
  if (value > max) {
    throw new InvalidArgumentError(argument, `${argument} must be at most ${max}, got ${value}`);
  }
  return value;
}

/** Checks that `value` is a non-empty string; names `argument` if not. */
export function checkString(argument: string, value: unknown): string {
  if (typeof value !== 'string' || value.length === 0) {
    throw new InvalidArgumentError(argument, `${argument} must be a non-empty string, got ${describe(value)}`);
  }
  return value;
}

export function describe(value: unknown): string {
  if (typeof value === 'string') return JSON.stringify(value);
  if (typeof value === 'function') return 'a function';
  if (value === null) return 'null';
  if (typeof value === 'object') return Array.isArray(value) ? 'an array' : 'an object';
  return String(value);
}

/**
 * Turns what a Redis client rejected with into this package's errors:
 * `unknown command 'RL.…'` means the module is not loaded, `ERR` replies
 * about arguments keep the server's wording.
 */
export function fromServerError(err: unknown, command: string): Error {
  if (!(err instanceof Error)) return new RLError(String(err));
  const msg = err.message;
  if (/unknown option 'BLOCK'/i.test(msg)) {
    return new ModuleMissingError(
      `${command}: this version of the ratelimit module predates BLOCK, which acquire needs (${msg})`,
      { cause: err },
    );
  }
  if (/unknown command/i.test(msg) && /RL\.|CL\./i.test(msg)) {
    return new ModuleMissingError(
      `${command} is unknown to this server: the ratelimit module is not loaded (load it with --loadmodule), ` +
        `or its version predates ${command} (${msg})`,
      { cause: err },
    );
  }
  if (msg.startsWith('ERR ')) {
    // The module's messages name the argument first (`ERR limit is above
    // ...`); Redis's own (`ERR wrong number of arguments ...`, `ERR syntax
    // error`) are about the command.
    const first = /^ERR ([A-Za-z_]+) (must|is|are|should|cannot|out)\b/.exec(msg)?.[1];
    const argument = first ?? command;
    return new InvalidArgumentError(argument, `${command}: ${msg}`, { cause: err });
  }
  return err;
}

/**
 * An error reply of the server (ioredis's `ReplyError`, node-redis's
 * `ErrorReply`: `ERR ...`, `NOPERM ...`), as opposed to a connection that
 * failed or a command that got no answer.
 */
export function isServerReply(err: unknown): boolean {
  if (!(err instanceof Error)) return false;
  const name = err.constructor?.name;
  return name === 'ReplyError' || name === 'ErrorReply' || name === 'SimpleError' || name === 'BlobError';
}

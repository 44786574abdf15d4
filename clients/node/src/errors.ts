/**
 * The errors the client throws. Every one is a {@link RinglockError}, with a
 * `kind` that names it without `instanceof` (handy in logs and across
 * process boundaries). Network trouble and anything a server may send end in
 * one of these, never in another error type (an aborted call rejects with
 * its AbortSignal's reason, as Node's own APIs do).
 */

/** What kind of failure an error is. */
export type ErrorKind =
  | "timeout"
  | "lost"
  | "connection"
  | "no_active"
  | "protocol"
  | "invalid_argument"
  | "not_allowed"
  | "wrong_kind"
  | "closed";

/** The base class of every error this package throws. */
export class RinglockError extends Error {
  readonly kind: ErrorKind;
  constructor(kind: ErrorKind, message: string) {
    super(message);
    this.kind = kind;
    this.name = new.target.name;
  }
}

/** The wait ran out and nothing was granted (nothing is held). */
export class LockTimeoutError extends RinglockError {
  /** The key, as given. */
  readonly key: string;
  /** The wait that ran out, ms (undefined: a try-lock). */
  readonly waitMs: number | undefined;
  constructor(key: string, waitMs: number | undefined) {
    super(
      "timeout",
      waitMs === undefined
        ? `the lock on ${key} is held by someone else`
        : `timed out after ${waitMs} ms waiting for the lock on ${key}`,
    );
    this.key = key;
    this.waitMs = waitMs;
  }
}

/**
 * A lock is no longer held: `refused` when a node answered that no grant of
 * the key carries the token (the lease ran out, it was released with the
 * token, or it did not survive a failover); otherwise no renewal was
 * confirmed before the lease could have run out (`lastError` says why).
 */
export class LockLostError extends RinglockError {
  readonly key: string;
  readonly token: bigint;
  readonly refused: boolean;
  readonly lastError: string | undefined;
  constructor(key: string, token: bigint, refused: boolean, lastError?: string) {
    let why: string;
    if (refused) {
      why = "the server no longer has the grant (lease ran out, released, or lost in a failover)";
    } else {
      why = "no renewal was confirmed before the lease could have run out";
      if (lastError !== undefined) why += ` (last error: ${lastError})`;
    }
    super("lost", `lock on ${key} (token ${token}) lost: ${why}`);
    this.key = key;
    this.token = token;
    this.refused = refused;
    this.lastError = lastError;
  }
}

/**
 * No connection could carry the request, or a node did not answer in time.
 * The message names the node and says what happened (refused, closed,
 * stopped answering probes, did not answer within a deadline, a TLS
 * failure).
 */
export class ConnectionError extends RinglockError {
  constructor(message: string) {
    super("connection", message);
  }
}

/**
 * The nodes kept answering that no node is active (`M key -`), or kept
 * redirecting, for longer than the no-active timeout (10 s by default).
 */
export class NoActiveNodeError extends RinglockError {
  constructor(message = "no active node in the cluster") {
    super("no_active", message);
  }
}

/**
 * A server sent `E <reason>`, a malformed or over-long line, or an answer
 * that matches no request. That connection is dropped.
 */
export class ProtocolError extends RinglockError {
  constructor(message: string) {
    super("protocol", message);
  }
}

/** Refused before anything was sent: a bad key, lease, wait, token or option. */
export class InvalidArgumentError extends RinglockError {
  constructor(message: string) {
    super("invalid_argument", message);
  }
}

/**
 * A server refused the request for this client's identity: an acquire of a
 * key outside the rules of its certificate's identity (the server's `E`
 * reason says "not allowed"). Not retried: it would be refused again.
 */
export class NotAllowedError extends RinglockError {
  constructor(message: string) {
    super("not_allowed", message);
  }
}

/**
 * The key is held or waited for as another kind, and nothing changed: a
 * shared acquire or a permit of a semaphore key (a permit: of another
 * limit), a permit of a key held or waited for as a lock (exclusive or
 * shared), an exclusive acquire of a semaphore key. Not retried: it would
 * be refused again while the key is that kind (a key with no holder and no
 * waiter is nobody's kind: the next acquire decides).
 */
export class WrongKindError extends RinglockError {
  /** The key, as given. */
  readonly key: string;
  /** The live semaphore's limit; 0: the key is a lock (exclusive or shared). */
  readonly limit: number;
  constructor(key: string, limit: number, message?: string) {
    super(
      "wrong_kind",
      message ??
        (limit === 0
          ? `${key} is a lock (exclusive or shared), not a semaphore`
          : `${key} is a semaphore of ${limit} permits`),
    );
    this.key = key;
    this.limit = limit;
  }
}

/** The error for an `E` line or a broken answer: `NotAllowedError` if the reason says "not allowed", else `ProtocolError`. */
export function brokenError(why: string): RinglockError {
  return /not allowed/i.test(why) ? new NotAllowedError(why) : new ProtocolError(why);
}

/** The client was closed (before or during the call). */
export class ClosedError extends RinglockError {
  constructor(message = "the client is closed") {
    super("closed", message);
  }
}

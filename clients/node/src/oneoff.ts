/** One-off requests to one node: `S`, `H`, `L` (on a connection of their own). */

import { DialError, open, readLines } from "./conn.js";
import { ConnectionError, InvalidArgumentError, ProtocolError } from "./errors.js";
import {
  checkKey,
  type Key,
  listLine,
  MAX_ANSWER_LINE,
  MAX_HEALTH_LINE,
  MalformedAnswer,
  parseAnswer,
  showLine,
  splitAddr,
} from "./proto.js";
import { type TlsOptions, type TlsSetup, tlsSetup } from "./tls.js";
import { reasonOf, showMs } from "./util.js";

/** A node's answer to `S`: its role, the active node it names (null: none known), the highest token it issued or saw. */
export interface NodeStatus {
  readonly role: "active" | "standby";
  readonly active: string | null;
  readonly token: bigint;
}

/** One lock of a node's table, as `L` lists it. */
export interface LockInfo {
  /** The key (its bytes as UTF-8). */
  readonly key: string;
  readonly keyBytes: Buffer;
  /** The holder's fencing token; 0n when nobody holds it. */
  readonly token: bigint;
  /** The holder's lease left, ms (0n without a holder). */
  readonly leaseMs: bigint;
  /** Acquires waiting for it on this node (counted up to 65536). */
  readonly waiters: bigint;
}

/** Options of the one-off requests. */
export interface OneOffOptions {
  /** For the whole exchange (dial and TLS handshake included). Default 3000. */
  readonly timeoutMs?: number;
  readonly tls?: TlsOptions;
  readonly signal?: AbortSignal;
}

function timeoutOf(o: OneOffOptions): number {
  const t = o.timeoutMs ?? 3000;
  if (typeof t !== "number" || !Number.isFinite(t) || t <= 0) {
    throw new InvalidArgumentError(`timeoutMs must be a positive number, not ${String(t)}`);
  }
  return Math.min(t, 2 ** 31 - 1);
}

async function exchange(
  addr: string,
  request: Buffer,
  maxLine: number,
  timeoutMs: number,
  tls: TlsSetup | undefined,
  signal: AbortSignal | undefined,
  onLine: (line: Buffer) => boolean,
): Promise<void> {
  splitAddr(addr);
  if (signal?.aborted) throw reasonOf(signal);
  const until = performance.now() + timeoutMs;
  let socket: Awaited<ReturnType<typeof open>> | undefined;
  const onAbort = (): void => {
    socket?.destroy();
  };
  signal?.addEventListener("abort", onAbort, { once: true });
  try {
    socket = await open(addr, tls, timeoutMs);
    if (signal?.aborted) throw reasonOf(signal);
    socket.write(request);
    await readLines(socket, addr, maxLine, until - performance.now(), () => `${addr}: no answer within ${showMs(timeoutMs)}`, onLine);
  } catch (e) {
    if (signal?.aborted) throw reasonOf(signal);
    if (e instanceof DialError) throw new ConnectionError(e.message);
    throw e;
  } finally {
    signal?.removeEventListener("abort", onAbort);
    socket?.destroy();
  }
}

function parsed(addr: string, line: Buffer): ReturnType<typeof parseAnswer> {
  try {
    return parseAnswer(line);
  } catch (e) {
    if (e instanceof MalformedAnswer) throw new ProtocolError(`${addr}: ${e.message}`);
    throw e;
  }
}

export async function nodeStatusVia(
  addr: string,
  timeoutMs: number,
  tls: TlsSetup | undefined,
  signal: AbortSignal | undefined,
): Promise<NodeStatus> {
  let status: NodeStatus | undefined;
  await exchange(addr, Buffer.from("S\n"), MAX_ANSWER_LINE, timeoutMs, tls, signal, (line) => {
    const ans = parsed(addr, line);
    if (ans.op === "S") {
      status = { role: ans.role, active: ans.addr, token: ans.token };
      return true;
    }
    if (ans.op === "E") throw new ProtocolError(`${addr} says: E ${ans.reason}`);
    throw new ProtocolError(`${addr} answered S with ${showLine(line)}`);
  });
  return status!;
}

/** Asks one node for its status (`S`) on a one-off connection. */
export function nodeStatus(addr: string, options: OneOffOptions = {}): Promise<NodeStatus> {
  return (async () =>
    nodeStatusVia(addr, timeoutOf(options), options.tls && tlsSetup(options.tls), options.signal))();
}

/**
 * Asks one node whether it knows of a problem in its cluster (`H`), on a
 * one-off connection: null when it knows of none (or predates `H`).
 */
export async function nodeProblem(addr: string, options: OneOffOptions = {}): Promise<string | null> {
  let problem: string | null = null;
  await exchange(
    addr,
    Buffer.from("H\n"),
    MAX_HEALTH_LINE,
    timeoutOf(options),
    options.tls && tlsSetup(options.tls),
    options.signal,
    (line) => {
      const ans = parsed(addr, line);
      if (ans.op === "H") {
        problem = ans.text === "ok" ? null : ans.text;
        return true;
      }
      if (ans.op === "E") return true;
      throw new ProtocolError(`${addr} answered H with ${showLine(line)}`);
    },
  );
  return problem;
}

/** Options of listLocks(). */
export interface ListLocksOptions extends OneOffOptions {
  /** Only keys that start with these bytes. */
  readonly prefix?: Key;
  /** Where to start: 0n (the default) for the first page, else the cursor the previous page gave. */
  readonly cursor?: bigint;
  /** The most locks this page lists: 1 to 1000. Default 1000. */
  readonly limit?: number;
}

/**
 * One page of one node's lock table (`L cursor limit [prefix]`, an
 * operator's request), on a one-off connection: the locks, and the cursor of
 * the next page (0n: the listing is complete). A node too old to know `L`
 * answers `E`: ProtocolError.
 */
export async function listLocks(
  addr: string,
  options: ListLocksOptions = {},
): Promise<{ locks: LockInfo[]; cursor: bigint }> {
  const limit = options.limit ?? 1000;
  if (!Number.isInteger(limit) || limit < 1 || limit > 1000) {
    throw new InvalidArgumentError(`limit must be an integer from 1 to 1000, not ${String(limit)}`);
  }
  const cursor = options.cursor ?? 0n;
  if (typeof cursor !== "bigint" || cursor < 0n || cursor >= 1n << 64n) {
    throw new InvalidArgumentError("cursor must be a bigint from 0 to 2^64 - 1");
  }
  const prefix = options.prefix === undefined ? null : checkKey(options.prefix);
  const locks: LockInfo[] = [];
  let next = 0n;
  await exchange(
    addr,
    listLine(cursor, limit, prefix),
    MAX_ANSWER_LINE,
    timeoutOf(options),
    options.tls && tlsSetup(options.tls),
    options.signal,
    (line) => {
      const ans = parsed(addr, line);
      if (ans.op === "K" && locks.length < limit) {
        locks.push({
          key: ans.key.toString("utf8"),
          keyBytes: Buffer.from(ans.key),
          token: ans.token,
          leaseMs: ans.leaseMs,
          waiters: ans.waiters,
        });
        return false;
      }
      if (ans.op === "L") {
        if (ans.cursor !== 0n && ans.cursor <= cursor) {
          throw new ProtocolError(`${addr} answered L with a cursor that does not grow (${ans.cursor} after ${cursor})`);
        }
        next = ans.cursor;
        return true;
      }
      if (ans.op === "E") throw new ProtocolError(`${addr} says: E ${ans.reason}`);
      throw new ProtocolError(`${addr} answered L with ${showLine(line)}`);
    },
  );
  return { locks, cursor: next };
}

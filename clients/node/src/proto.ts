/**
 * The wire format of the ringlock protocol (docs/protocol.md): request
 * lines, answer parsing, argument checks. Pure functions, no I/O.
 */

import { InvalidArgumentError } from "./errors.js";

export const MAX_KEY = 250;
/** 86400 s, the longest lease or wait. */
export const MAX_DURATION_MS = 86_400_000;
export const MAX_TOKEN = (1n << 64n) - 1n;
/**
 * The longest answer line read on a pooled connection, `\n` included. The
 * server's answers to the requests a pooled connection carries (A, R, N, S)
 * are at most 504 bytes (an `M` with a 250-byte key and address); `E` lines
 * a few hundred.
 */
export const MAX_ANSWER_LINE = 4096;
/** The longest `H` answer read (problems quote whole `--peers` lists). */
export const MAX_HEALTH_LINE = 64 * 1024;
/** The wait of a try-lock: the shortest the protocol allows (0 means no limit). */
export const TRY_WAIT_MS = 1;
/** The most permits a semaphore key may have (the limit of `C`). */
export const MAX_PERMITS = 65536;

/** A key: a string (sent as UTF-8) or bytes. */
export type Key = string | Uint8Array;

/** One parsed answer line. */
export type Answer =
  | { op: "A"; key: Buffer; token: bigint }
  | { op: "T"; key: Buffer }
  | { op: "M"; key: Buffer; addr: string | null }
  | { op: "R" | "N"; key: Buffer; held: boolean }
  /**
   * `G`/`C`: granted with `token`; `token` 0n: the wait ran out. `refused`:
   * null, or the key is of another kind: the live semaphore's limit (`G|C
   * key semaphore N`), 0 for a lock (`C key lock`); `token` is then 0n.
   */
  | { op: "G" | "C"; key: Buffer; token: bigint; refused: number | null }
  | { op: "S"; role: "active" | "standby"; addr: string | null; token: bigint }
  | { op: "H"; text: string }
  | { op: "K"; key: Buffer; token: bigint; leaseMs: bigint; waiters: bigint }
  | { op: "L"; cursor: bigint }
  | { op: "E"; reason: string };

/** A line that breaks the protocol (surfaced as ProtocolError). */
export class MalformedAnswer extends Error {}

export function isKeyByte(b: number): boolean {
  return (b >= 0x21 && b <= 0x7e) || b >= 0x80;
}

/** A key for messages: its bytes as UTF-8, invalid bytes replaced. */
export function showKey(key: Uint8Array): string {
  return Buffer.from(key.buffer, key.byteOffset, key.byteLength).toString("utf8");
}

/** The key as bytes (a string is UTF-8 encoded), or InvalidArgumentError. */
export function checkKey(key: unknown): Buffer {
  let raw: Buffer;
  if (typeof key === "string") {
    raw = Buffer.from(key, "utf8");
  } else if (key instanceof Uint8Array) {
    raw = Buffer.from(key);
  } else {
    throw new InvalidArgumentError(`a key is a string or a Uint8Array, not ${describe(key)}`);
  }
  if (raw.length === 0) throw new InvalidArgumentError("empty key");
  if (raw.length > MAX_KEY) {
    throw new InvalidArgumentError(`key too long (${raw.length} bytes, at most ${MAX_KEY})`);
  }
  for (const b of raw) {
    if (!isKeyByte(b)) {
      throw new InvalidArgumentError(
        `forbidden byte 0x${b.toString(16).padStart(2, "0")} in key (spaces, control bytes and 0x7f are not allowed)`,
      );
    }
  }
  return raw;
}

function describe(v: unknown): string {
  if (v === null) return "null";
  if (typeof v === "object") return v.constructor?.name ?? "object";
  return typeof v;
}

function checkMs(value: unknown, what: string): number {
  if (typeof value !== "number" || !Number.isFinite(value) || value < 0) {
    throw new InvalidArgumentError(`${what} must be a finite number of milliseconds >= 0, not ${String(value)}`);
  }
  return value;
}

/** A lease in whole milliseconds, rounded down: 1 ms to 86400 s. */
export function leaseMs(lease: unknown): number {
  const ms = Math.floor(checkMs(lease, "leaseMs"));
  if (ms < 1 || ms > MAX_DURATION_MS) {
    throw new InvalidArgumentError(`leaseMs must be from 1 to ${MAX_DURATION_MS}, not ${String(lease)}`);
  }
  return ms;
}

/**
 * A wait in whole milliseconds, rounded up; 0 for undefined or null (no
 * limit). A wait of zero is refused: on the wire it would mean "no limit",
 * which is not what `waitMs: 0` says. Leave it out for no limit, or use a
 * try-lock for one attempt.
 */
export function waitMs(wait: unknown): number {
  if (wait === undefined || wait === null) return 0;
  const v = checkMs(wait, "waitMs");
  if (v === 0) {
    throw new InvalidArgumentError(
      "waitMs: 0: leave waitMs out to wait without limit, or use tryLock()/tryAcquire() for one attempt",
    );
  }
  const ms = Math.max(1, Math.ceil(v));
  if (ms > MAX_DURATION_MS) {
    throw new InvalidArgumentError(`waitMs must be at most ${MAX_DURATION_MS}, not ${String(wait)}`);
  }
  return ms;
}

/** A token: a bigint (or a decimal string) from 1 to 2^64 - 1. */
export function checkToken(token: unknown): bigint {
  let t: bigint;
  if (typeof token === "bigint") {
    t = token;
  } else if (typeof token === "string" && /^[0-9]{1,20}$/.test(token)) {
    t = BigInt(token);
  } else {
    throw new InvalidArgumentError(`a token is a bigint (or a decimal string), not ${describe(token)}`);
  }
  if (t < 1n || t > MAX_TOKEN) {
    throw new InvalidArgumentError(`token must be from 1 to ${MAX_TOKEN}, not ${t}`);
  }
  return t;
}

/** Milliseconds in the protocol's seconds form (`30`, `1.5`, `0.001`). */
export function fmtMs(ms: number): string {
  const whole = Math.floor(ms / 1000);
  const frac = ms % 1000;
  if (frac === 0) return String(whole);
  return `${whole}.${String(frac).padStart(3, "0")}`.replace(/0+$/, "");
}

const SP = Buffer.from(" ");
const NL = Buffer.from("\n");

export function acquireLine(key: Buffer, lease: number, wait: number): Buffer {
  return Buffer.concat([Buffer.from("A "), key, Buffer.from(` ${fmtMs(lease)} ${fmtMs(wait)}\n`)]);
}

/** What an acquire asks for: the op of its request (and answer), and the limit of a `C`. */
export interface Kind {
  readonly op: "A" | "G" | "C";
  /** The semaphore's limit for `C`, else 0. */
  readonly limit: number;
}

export const EXCLUSIVE: Kind = { op: "A", limit: 0 };

/**
 * The kind an acquire's options ask for: exclusive (the default), shared
 * (`shared: true`) or one permit of a semaphore of `permits` (1 to 65536),
 * or InvalidArgumentError.
 */
export function checkKind(shared: unknown, permits: unknown): Kind {
  if (shared !== undefined && typeof shared !== "boolean") {
    throw new InvalidArgumentError(`shared is a boolean, not ${describe(shared)}`);
  }
  if (permits === undefined) return shared === true ? { op: "G", limit: 0 } : EXCLUSIVE;
  if (shared === true) {
    throw new InvalidArgumentError(
      "shared: true and permits ask for two kinds: a key is a read/write lock or a semaphore",
    );
  }
  if (typeof permits !== "number" || !Number.isInteger(permits) || permits < 1 || permits > MAX_PERMITS) {
    throw new InvalidArgumentError(`permits must be an integer from 1 to ${MAX_PERMITS}, not ${String(permits)}`);
  }
  return { op: "C", limit: permits };
}

/** The request line of an acquire of `kind`: `A`, `G` or `C`. */
export function acquireKindLine(kind: Kind, key: Buffer, lease: number, wait: number): Buffer {
  if (kind.op === "A") return acquireLine(key, lease, wait);
  // Our invariant (checkKind makes every Kind): never a line the server would refuse.
  const checked =
    kind.op === "G" ? kind.limit === 0 : Number.isInteger(kind.limit) && kind.limit >= 1 && kind.limit <= MAX_PERMITS;
  if (!checked) {
    throw new Error(`bug: an unchecked kind ${kind.op} ${kind.limit}`);
  }
  const head = kind.op === "G" ? Buffer.from("G ") : Buffer.from("C ");
  const limit = kind.op === "C" ? ` ${kind.limit}` : "";
  return Buffer.concat([head, key, Buffer.from(`${limit} ${fmtMs(lease)} ${fmtMs(wait)}\n`)]);
}

export function releaseLine(key: Buffer, token: bigint): Buffer {
  return Buffer.concat([Buffer.from("R "), key, SP, Buffer.from(token.toString()), NL]);
}

export function renewLine(key: Buffer, token: bigint, lease: number): Buffer {
  return Buffer.concat([Buffer.from("N "), key, Buffer.from(` ${token} ${fmtMs(lease)}\n`)]);
}

export function listLine(cursor: bigint, limit: number, prefix: Buffer | null): Buffer {
  const head = Buffer.from(`L ${cursor} ${limit}`);
  return prefix === null ? Buffer.concat([head, NL]) : Buffer.concat([head, SP, prefix, NL]);
}

/** A decimal u64 (leading zeros allowed), or null. */
export function parseU64(field: Buffer): bigint | null {
  if (field.length === 0 || field.length > 20) return null;
  for (const b of field) if (b < 0x30 || b > 0x39) return null;
  const n = BigInt(field.toString("latin1"));
  return n <= MAX_TOKEN ? n : null;
}

function printable(text: Buffer): string {
  let out = "";
  for (const b of text) {
    out += b >= 0x20 && b <= 0x7e ? String.fromCharCode(b) : `\\x${b.toString(16).padStart(2, "0")}`;
  }
  return out;
}

/** A line for an error message: printable, cut after 200 bytes. */
export function showLine(line: Buffer): string {
  const cut = line.length > 200;
  return JSON.stringify(printable(cut ? line.subarray(0, 200) : line)) + (cut ? "..." : "");
}

function addrField(field: Buffer, line: Buffer): string | null {
  if (field.length === 1 && field[0] === 0x2d) return null;
  // Addresses are dialled as host:port: keep them printable.
  for (const b of field) {
    if (b < 0x21 || b > 0x7e) throw new MalformedAnswer(`address with unprintable bytes in ${showLine(line)}`);
  }
  return field.toString("latin1");
}

const LOCK = Buffer.from("lock");
const SEMAPHORE = Buffer.from("semaphore");

/** Parses one answer line without its `\n`. Throws MalformedAnswer. */
export function parseAnswer(input: Buffer): Answer {
  const line = input.length > 0 && input[input.length - 1] === 0x0d ? input.subarray(0, -1) : input;
  if (line.length >= 2 && line[1] === 0x20 && (line[0] === 0x45 || line[0] === 0x48)) {
    const text = printable(line.subarray(2));
    return line[0] === 0x45 ? { op: "E", reason: text } : { op: "H", text };
  }
  const fields: Buffer[] = [];
  let start = 0;
  for (let i = 0; i <= line.length; i++) {
    if (i === line.length || line[i] === 0x20) {
      fields.push(line.subarray(start, i));
      if (fields.length > 5) break;
      start = i + 1;
    }
  }
  const bad = (): MalformedAnswer => new MalformedAnswer(`malformed answer ${showLine(line)}`);
  if (fields.length < 2 || fields.length > 5) throw bad();
  for (const f of fields) if (f.length === 0) throw bad();
  const op = fields[0]!.length === 1 ? String.fromCharCode(fields[0]![0]!) : "";
  const first = fields[1]!;
  const rest = fields.slice(2);
  const key = (): Buffer => {
    if (first.length > MAX_KEY) throw bad();
    for (const b of first) if (!isKeyByte(b)) throw bad();
    return first;
  };
  switch (op) {
    case "A": {
      if (rest.length !== 1) throw bad();
      const token = parseU64(rest[0]!);
      if (token === null || token === 0n) throw bad();
      return { op: "A", key: key(), token };
    }
    case "T":
      if (rest.length !== 0) throw bad();
      return { op: "T", key: key() };
    case "M":
      if (rest.length !== 1) throw bad();
      return { op: "M", key: key(), addr: addrField(rest[0]!, line) };
    case "R":
    case "N": {
      if (rest.length !== 1 || rest[0]!.length !== 1) throw bad();
      const flag = rest[0]![0];
      if (flag !== 0x30 && flag !== 0x31) throw bad();
      return { op, key: key(), held: flag === 0x31 };
    }
    case "G":
    case "C": {
      if (rest.length === 1) {
        if (op === "C" && rest[0]!.equals(LOCK)) return { op, key: key(), token: 0n, refused: 0 };
        const token = parseU64(rest[0]!);
        if (token === null) throw bad();
        return { op, key: key(), token, refused: null };
      }
      if (rest.length !== 2 || !rest[0]!.equals(SEMAPHORE)) throw bad();
      const limit = parseU64(rest[1]!);
      if (limit === null || limit < 1n || limit > BigInt(MAX_PERMITS)) throw bad();
      return { op, key: key(), token: 0n, refused: Number(limit) };
    }
    case "S": {
      if (rest.length !== 2) throw bad();
      const role = first.toString("latin1");
      if (role !== "active" && role !== "standby") throw bad();
      const token = parseU64(rest[1]!);
      if (token === null) throw bad();
      return { op: "S", role, addr: addrField(rest[0]!, line), token };
    }
    case "K": {
      if (rest.length !== 3) throw bad();
      const [token, lease, waiters] = rest.map(parseU64);
      if (token == null || lease == null || waiters == null) throw bad();
      return { op: "K", key: key(), token, leaseMs: lease, waiters };
    }
    case "L": {
      if (rest.length !== 0) throw bad();
      const cursor = parseU64(first);
      if (cursor === null) throw bad();
      return { op: "L", cursor };
    }
    default:
      throw bad();
  }
}

/**
 * A key as this server quotes it in an `E` reason (docs/protocol.md,
 * section 8): its first 40 bytes, printable ASCII as is but `"` and `\`,
 * anything else `\xNN`; `...` after a longer key.
 */
export function quotedLikeServer(key: Buffer): string {
  let out = "";
  for (const b of key.subarray(0, 40)) {
    const plain = b >= 0x20 && b <= 0x7e && b !== 0x22 && b !== 0x5c;
    out += plain ? String.fromCharCode(b) : `\\x${b.toString(16).padStart(2, "0")}`;
  }
  return key.length > 40 ? `${out}...` : out;
}

const SEMAPHORE_REFUSAL = /key "((?:[^"\\]|\\x[0-9a-f]{2}){1,40}(?:\.\.\.)?)" is a semaphore of ([0-9]{1,5}) permits: acquire it with C/;

/**
 * The refusal of an exclusive acquire of a semaphore key, in an `E`
 * reason (`key "X" is a semaphore of N permits: acquire it with C`): the
 * key as quoted and N, or null for any other reason.
 */
export function semaphoreRefusal(why: string): { quoted: string; limit: number } | null {
  const m = SEMAPHORE_REFUSAL.exec(why);
  if (m === null) return null;
  const limit = Number(m[2]);
  return { quoted: m[1]!, limit: limit >= 1 && limit <= MAX_PERMITS ? limit : 0 };
}

/**
 * Whether an `E` reason refuses every `G` and `C` of the node: a node with
 * peers (`shared locks and semaphores are not replicated yet: ...`), or a
 * node that predates them (`unknown op "G"`, `unknown op "C"`: this client
 * sends no other op such a node does not know).
 */
export function refusesSharedOps(why: string): boolean {
  return why.includes("shared locks and semaphores are not replicated yet") || /unknown op "[GC]"/.test(why);
}

/** `host:port` (`[v6]:port` too) into host and port, or InvalidArgumentError. */
export function splitAddr(addr: string): { host: string; port: number } {
  const i = addr.lastIndexOf(":");
  const portText = i < 0 ? "" : addr.slice(i + 1);
  let host = i < 0 ? "" : addr.slice(0, i);
  const port = /^[0-9]{1,5}$/.test(portText) ? Number(portText) : 0;
  if (host === "" || port < 1 || port > 65535) {
    throw new InvalidArgumentError(`bad address ${JSON.stringify(addr)}: expected host:port`);
  }
  if (host.startsWith("[") && host.endsWith("]")) host = host.slice(1, -1);
  return { host, port };
}

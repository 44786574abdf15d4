/**
 * One connection to one node: requests pending per key in send order, the
 * line reader and (op, key) matcher, the liveness watch, the local queue of
 * waiting acquires; and the dialer with its hello (`S`).
 */

import * as net from "node:net";
import type * as tls from "node:tls";

import { ProtocolError } from "./errors.js";
import { type Answer, MAX_ANSWER_LINE, MalformedAnswer, parseAnswer, showLine, splitAddr } from "./proto.js";
import { connectTls, explainTls, type TlsSetup } from "./tls.js";
import { now, reasonOf, showMs } from "./util.js";

/** Every deadline of a client, in milliseconds. */
export interface Timing {
  readonly connectTimeoutMs: number;
  readonly probeIntervalMs: number;
  readonly probeTimeoutMs: number;
  readonly acquireGraceMs: number;
  readonly requestTimeoutMs: number;
  readonly retryEveryMs: number;
  readonly retryForMs: number;
  readonly redialIntervalMs: number;
  readonly noActiveTimeoutMs: number;
}

/** The connection closed or died: the request may go on elsewhere. */
export class Lost {
  constructor(readonly why: string) {}
}

/** The connection broke the protocol (an `E`, a malformed line). */
export class Broken {
  constructor(readonly why: string) {}
}

export type Reply = Answer | Lost | Broken;

type Op = "A" | "G" | "C" | "R" | "N" | "S";

interface Pending {
  readonly op: Op;
  readonly probe: boolean;
  readonly permit: boolean;
  /** Who waits for the answer; null: nobody (a probe, or abandoned). */
  settle: ((r: Reply) => void) | null;
  abandoned: boolean;
}

/** What a connection needs of its client. */
export interface Owner {
  readonly timing: Timing;
  readonly maxWaiting: number;
  /** An acquire nobody waits for any more was granted: release it. */
  releaseAbandoned(key: Buffer, token: bigint): void;
}

type SlotWaiter = { resolve: (ok: boolean) => void; gone: boolean };

type Sock = net.Socket | tls.TLSSocket;

export class Conn {
  private readonly byKey = new Map<string, Pending[]>();
  private readonly status: Pending[] = [];
  outstanding = 0;
  private lastRx = now();
  private probeAt: number | null = null;
  private timer: NodeJS.Timeout | undefined;
  closed = false;
  private acqFree: number;
  private readonly acqWaiters: SlotWaiter[] = [];
  private partial: Buffer = Buffer.alloc(0);
  private corked = false;
  /** Resolves with why the connection ended. */
  readonly ended: Promise<string>;
  private resolveEnded!: (why: string) => void;

  constructor(
    private readonly owner: Owner,
    readonly addr: string,
    private readonly socket: Sock,
    leftover: Buffer,
  ) {
    this.acqFree = owner.maxWaiting;
    this.ended = new Promise((resolve) => {
      this.resolveEnded = resolve;
    });
    socket.on("data", (chunk: Buffer) => this.onData(chunk));
    socket.on("error", (e: Error) => this.end(`read from ${addr}: ${explainTls(e) ?? e.message}`, false));
    socket.on("end", () => this.end(`${addr} closed the connection${this.partial.length ? " mid-line" : ""}`, false));
    socket.on("close", () => this.end(`${addr} closed the connection`, false));
    if (leftover.length > 0) this.onData(leftover);
  }

  // -- local queueing of waiting acquires (at most maxWaiting per connection)

  tryTakeSlot(): boolean {
    if (!this.closed && this.acqFree > 0 && this.acqWaiters.length === 0) {
      this.acqFree -= 1;
      return true;
    }
    return false;
  }

  /**
   * Waits for room for one more acquire: "ok", "closed" (the connection
   * closed meanwhile) or "timeout" (after `withinMs`, if given). Rejects
   * with the signal's reason when it aborts.
   */
  takeSlot(signal: AbortSignal, withinMs?: number): Promise<"ok" | "closed" | "timeout"> {
    if (this.tryTakeSlot()) return Promise.resolve("ok");
    if (this.closed) return Promise.resolve("closed");
    return new Promise((resolve, reject) => {
      let timer: NodeJS.Timeout | undefined;
      const done = (): void => {
        waiter.gone = true;
        clearTimeout(timer);
        signal.removeEventListener("abort", onAbort);
      };
      const waiter: SlotWaiter = {
        gone: false,
        resolve: (ok) => {
          done();
          resolve(ok ? "ok" : "closed");
        },
      };
      const onAbort = (): void => {
        done();
        reject(reasonOf(signal));
      };
      if (withinMs !== undefined) {
        timer = setTimeout(() => {
          done();
          resolve("timeout");
        }, Math.max(0, Math.ceil(withinMs)));
      }
      signal.addEventListener("abort", onAbort, { once: true });
      this.acqWaiters.push(waiter);
    });
  }

  giveSlot(): void {
    while (this.acqWaiters.length > 0) {
      const w = this.acqWaiters.shift()!;
      if (!w.gone) {
        w.resolve(true);
        return;
      }
    }
    this.acqFree += 1;
  }

  // -- requests

  private submit(op: Op, mapKey: string, line: Buffer, req: Pending): boolean {
    if (this.closed || this.socket.destroyed) return false;
    if (op === "S") {
      this.status.push(req);
    } else {
      let q = this.byKey.get(mapKey);
      if (q === undefined) {
        q = [];
        this.byKey.set(mapKey, q);
      }
      q.push(req);
    }
    // Every request of this turn of the event loop goes out in one write.
    if (!this.corked) {
      this.corked = true;
      this.socket.cork();
      process.nextTick(() => {
        this.corked = false;
        this.socket.uncork();
      });
    }
    this.socket.write(line);
    if (!req.probe) {
      this.outstanding += 1;
      if (this.outstanding === 1) this.watch();
    }
    return true;
  }

  /**
   * Sends one request and resolves with its reply. `timeoutMs`: a Lost reply
   * after that long; `signal`: rejects with its reason. Either way the
   * request stays pending (its answer must still be matched) and nobody
   * waits for it: an acquire granted after that is released at once.
   */
  call(
    op: Op,
    key: Buffer | null,
    line: Buffer,
    opts: { permit?: boolean; signal?: AbortSignal; timeoutMs?: number } = {},
  ): Promise<Reply> {
    const permit = opts.permit === true;
    const signal = opts.signal;
    if (signal?.aborted) {
      if (permit) this.giveSlot();
      return Promise.reject(reasonOf(signal));
    }
    return new Promise<Reply>((resolve, reject) => {
      let timer: NodeJS.Timeout | undefined;
      const finish = (): void => {
        clearTimeout(timer);
        signal?.removeEventListener("abort", onAbort);
      };
      const req: Pending = {
        op,
        probe: false,
        permit,
        abandoned: false,
        settle: (r) => {
          finish();
          resolve(r);
        },
      };
      const abandon = (): void => {
        finish();
        req.settle = null;
        req.abandoned = true;
      };
      const onAbort = (): void => {
        abandon();
        reject(reasonOf(signal!));
      };
      if (!this.submit(op, key === null ? "" : key.toString("latin1"), line, req)) {
        if (permit) this.giveSlot();
        resolve(new Lost(`${this.addr}: the connection closed`));
        return;
      }
      if (opts.timeoutMs !== undefined) {
        const ms = opts.timeoutMs;
        timer = setTimeout(() => {
          abandon();
          resolve(new Lost(`${this.addr} did not answer within ${showMs(ms)}`));
        }, Math.max(0, Math.ceil(ms)));
      }
      signal?.addEventListener("abort", onAbort, { once: true });
    });
  }

  private take(mapKey: string, op: Op | null): Pending | undefined {
    const q = this.byKey.get(mapKey);
    if (q === undefined) return undefined;
    let req: Pending | undefined;
    if (op === null) {
      req = q.shift();
    } else {
      const i = q.findIndex((r) => r.op === op);
      if (i < 0) return undefined;
      req = q[i];
      q.splice(i, 1);
    }
    if (q.length === 0) this.byKey.delete(mapKey);
    return req;
  }

  private answer(req: Pending, reply: Answer): void {
    if (!req.probe) this.outstanding -= 1;
    if (req.permit) this.giveSlot();
    if (req.settle !== null) {
      req.settle(reply);
    } else if (req.abandoned && (reply.op === "A" || ((reply.op === "G" || reply.op === "C") && reply.token !== 0n))) {
      // Whoever asked is gone: do not leave the grant (exclusive, shared or
      // a permit) held until its lease runs out.
      this.owner.releaseAbandoned(reply.key, reply.token);
    }
  }

  /** Hands one answer line to the request it answers; throws Broken. */
  private dispatch(line: Buffer): void {
    this.lastRx = now();
    this.probeAt = null;
    let ans: Answer;
    try {
      ans = parseAnswer(line);
    } catch (e) {
      if (e instanceof MalformedAnswer) throw new Broken(`${this.addr}: ${e.message}`);
      throw e;
    }
    let req: Pending | undefined;
    switch (ans.op) {
      case "E":
        throw new Broken(`${this.addr} says: E ${ans.reason}`);
      case "A":
      case "T":
        req = this.take(ans.key.toString("latin1"), "A");
        break;
      case "M":
        req = this.take(ans.key.toString("latin1"), null);
        break;
      case "R":
      case "N":
      case "G":
      case "C":
        // G answers the oldest G of the key, C the oldest C (docs/protocol.md, section 6).
        req = this.take(ans.key.toString("latin1"), ans.op);
        break;
      case "S":
        req = this.status.shift();
        break;
      default:
        // H, K, L: never sent on a pooled connection.
        req = undefined;
    }
    if (req === undefined) throw new Broken(`${this.addr}: answer ${showLine(line)} matches no pending request`);
    this.answer(req, ans);
  }

  private onData(chunk: Buffer): void {
    if (this.closed) return;
    const buf = this.partial.length > 0 ? Buffer.concat([this.partial, chunk]) : chunk;
    let start = 0;
    for (;;) {
      const nl = buf.indexOf(0x0a, start);
      if (nl < 0) break;
      if (nl - start + 1 > MAX_ANSWER_LINE) {
        this.end(`answer line from ${this.addr} longer than ${MAX_ANSWER_LINE} bytes`, true);
        return;
      }
      const line = buf.subarray(start, nl);
      start = nl + 1;
      try {
        this.dispatch(line);
      } catch (e) {
        if (e instanceof Broken) {
          this.end(e.why, true);
        } else {
          // Defence in depth: a bug here must not kill the process.
          this.end(`${this.addr}: answer ${showLine(line)} could not be handled: ${String(e)}`, true);
        }
        return;
      }
      if (this.closed) return;
    }
    const rest = buf.subarray(start);
    if (rest.length >= MAX_ANSWER_LINE) {
      this.end(`answer line from ${this.addr} longer than ${MAX_ANSWER_LINE} bytes`, true);
      return;
    }
    this.partial = Buffer.from(rest);
  }

  // -- liveness

  private arm(ms: number): void {
    clearTimeout(this.timer);
    this.timer = setTimeout(() => this.watch(), Math.max(1, Math.ceil(ms)));
  }

  /**
   * A connection with requests outstanding that received nothing for the
   * probe interval sends `S`; nothing received within the probe timeout
   * after that and it is dead. Silence counts from the last answer, so a
   * request sent on a connection already that quiet goes out with a probe.
   */
  private watch(): void {
    if (this.closed) return;
    clearTimeout(this.timer);
    this.timer = undefined;
    const t = this.owner.timing;
    const at = now();
    if (this.probeAt !== null) {
      const deadAt = this.probeAt + t.probeTimeoutMs;
      if (at >= deadAt) {
        this.end(`${this.addr} stopped answering: no answer to a probe within ${showMs(t.probeTimeoutMs)}`, false);
        return;
      }
      this.arm(deadAt - at);
      return;
    }
    if (this.outstanding === 0) return;
    const probeAt = this.lastRx + t.probeIntervalMs;
    if (at >= probeAt) {
      this.probeAt = at;
      this.submit("S", "", Buffer.from("S\n"), {
        op: "S",
        probe: true,
        permit: false,
        settle: null,
        abandoned: false,
      });
      this.arm(t.probeTimeoutMs);
    } else {
      this.arm(probeAt - at);
    }
  }

  /** Ends the connection: out of the rotation, its pending requests told. */
  end(why: string, protocol: boolean): void {
    if (this.closed) return;
    this.closed = true;
    clearTimeout(this.timer);
    this.socket.destroy();
    const pending: Pending[] = [...this.status];
    for (const q of this.byKey.values()) pending.push(...q);
    this.status.length = 0;
    this.byKey.clear();
    this.outstanding = 0;
    const reply = protocol ? new Broken(why) : new Lost(why);
    for (const req of pending) {
      const settle = req.settle;
      req.settle = null;
      if (settle !== null) settle(reply);
    }
    while (this.acqWaiters.length > 0) {
      const w = this.acqWaiters.shift()!;
      if (!w.gone) w.resolve(false);
    }
    this.resolveEnded(why);
  }
}

/** A dial that failed: why, in words. */
export class DialError extends Error {}

/**
 * Opens a TCP (or TLS) connection to `addr` within `timeoutMs` (the TLS
 * handshake included); resolves with the connected socket.
 */
export function open(addr: string, tlsSetup: TlsSetup | undefined, timeoutMs: number): Promise<Sock> {
  const { host, port } = splitAddr(addr);
  return new Promise<Sock>((resolve, reject) => {
    const socket: Sock = tlsSetup === undefined ? net.connect({ host, port }) : connectTls(tlsSetup, host, port);
    socket.setNoDelay(true);
    const timer = setTimeout(() => {
      socket.destroy();
      reject(
        new DialError(
          tlsSetup === undefined
            ? `connect to ${addr}: timed out after ${showMs(timeoutMs)}`
            : `connect to ${addr}: no TCP connection and TLS handshake within ${showMs(timeoutMs)} (a stalled node, or a port that does not speak TLS?)`,
        ),
      );
    }, timeoutMs);
    const onError = (e: Error): void => {
      clearTimeout(timer);
      socket.destroy();
      reject(new DialError(`connect to ${addr}: ${explainTls(e) ?? e.message}`));
    };
    socket.once("error", onError);
    socket.once(tlsSetup === undefined ? "connect" : "secureConnect", () => {
      clearTimeout(timer);
      socket.removeListener("error", onError);
      // Whoever reads the socket listens for its errors too; this one only
      // keeps a stray error from being an unhandled 'error' event.
      socket.on("error", () => undefined);
      resolve(socket);
    });
  });
}

/**
 * Reads lines from `socket` and hands each (without `\n`) to `onLine` until
 * it returns true; lines longer than `maxLine` bytes, the end of the
 * stream, an error or `timeoutMs` reject. Resolves with the bytes read after
 * the last line handled.
 */
export function readLines(
  socket: Sock,
  addr: string,
  maxLine: number,
  timeoutMs: number,
  onTimeout: () => string,
  onLine: (line: Buffer) => boolean,
): Promise<Buffer> {
  return new Promise<Buffer>((resolve, reject) => {
    let buf: Buffer = Buffer.alloc(0);
    const cleanup = (): void => {
      clearTimeout(timer);
      socket.removeListener("data", onData);
      socket.removeListener("error", onError);
      socket.removeListener("end", onEnd);
      socket.removeListener("close", onEnd);
    };
    const fail = (e: Error): void => {
      cleanup();
      reject(e);
    };
    const onData = (chunk: Buffer): void => {
      buf = buf.length > 0 ? Buffer.concat([buf, chunk]) : chunk;
      for (;;) {
        const nl = buf.indexOf(0x0a);
        if (nl < 0) break;
        if (nl + 1 > maxLine) {
          fail(new ProtocolError(`answer line from ${addr} longer than ${maxLine} bytes`));
          return;
        }
        const line = buf.subarray(0, nl);
        buf = buf.subarray(nl + 1);
        let done: boolean;
        try {
          done = onLine(line);
        } catch (e) {
          fail(e as Error);
          return;
        }
        if (done) {
          cleanup();
          resolve(Buffer.from(buf));
          return;
        }
      }
      if (buf.length >= maxLine) fail(new ProtocolError(`answer line from ${addr} longer than ${maxLine} bytes`));
    };
    const onError = (e: Error): void => fail(new DialError(`read from ${addr}: ${explainTls(e) ?? e.message}`));
    const onEnd = (): void => fail(new DialError(`${addr} closed the connection`));
    const timer = setTimeout(() => fail(new DialError(onTimeout())), Math.max(0, timeoutMs));
    socket.on("data", onData);
    socket.on("error", onError);
    socket.on("end", onEnd);
    socket.on("close", onEnd);
  });
}

/**
 * Dials `addr` and checks that the node answers `S` within the probe
 * timeout: a node that accepts connections but is hung never gets a request.
 */
export async function dial(owner: Owner, addr: string, tlsSetup: TlsSetup | undefined): Promise<Conn> {
  const t = owner.timing;
  const socket = await open(addr, tlsSetup, t.connectTimeoutMs);
  let hello: Answer | undefined;
  let raw = Buffer.alloc(0);
  let leftover: Buffer;
  try {
    socket.write("S\n");
    leftover = await readLines(
      socket,
      addr,
      MAX_ANSWER_LINE,
      t.probeTimeoutMs,
      () => `${addr} accepted the connection but did not answer S within ${showMs(t.probeTimeoutMs)} (hung?)`,
      (line) => {
        raw = Buffer.from(line);
        try {
          hello = parseAnswer(line);
        } catch (e) {
          if (e instanceof MalformedAnswer) {
            throw new DialError(`${addr} answered S with ${showLine(line)}: not a ringlock node?`);
          }
          throw e;
        }
        return true;
      },
    );
  } catch (e) {
    socket.destroy();
    if (e instanceof ProtocolError) throw new DialError(`${addr} did not answer S properly: ${e.message}`);
    throw e;
  }
  if (hello?.op === "S") return new Conn(owner, addr, socket, leftover);
  socket.destroy();
  if (hello?.op === "E") throw new DialError(`${addr} refused the connection: E ${hello.reason}`);
  throw new DialError(`${addr} answered S with ${showLine(raw)}: not a ringlock node?`);
}

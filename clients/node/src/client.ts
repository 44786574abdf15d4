/**
 * The client: connection slots dialled and redialled in the background,
 * the rotation, acquires with failover, releases and renewals with retries
 * (docs/protocol.md, "12. The official clients"; the same as the Rust and
 * Python clients).
 */

import "./dispose.js";

import { setMaxListeners } from "node:events";

import { Broken, Conn, DialError, dial, Lost, type Owner, type Reply, type Timing } from "./conn.js";
import {
  brokenError,
  ClosedError,
  ConnectionError,
  InvalidArgumentError,
  LockTimeoutError,
  NoActiveNodeError,
  ProtocolError,
  type RinglockError,
  WrongKindError,
} from "./errors.js";
import { Grant } from "./grant.js";
import { Lock } from "./lock.js";
import { nodeStatusVia, type NodeStatus } from "./oneoff.js";
import {
  acquireKindLine,
  checkKey,
  checkKind,
  checkToken,
  type Key,
  type Kind,
  leaseMs as toLeaseMs,
  quotedLikeServer,
  releaseLine,
  renewLine,
  semaphoreRefusal,
  refusesSharedOps,
  showKey,
  splitAddr,
  TRY_WAIT_MS,
  waitMs as toWaitMs,
} from "./proto.js";
import { type TlsOptions, type TlsSetup, tlsSetup } from "./tls.js";
import { linked, now, reasonOf, showMs, sleep } from "./util.js";

/** A cluster has at most 16 nodes: addresses named by `M` answers beyond that many are not followed. */
const MAX_REDIRECT_ADDRS = 16;
/** After a dial that an `M` answer asked for failed, the next one for the same slot waits this long, doubling while they keep failing... */
export const KICK_BACKOFF_MIN_MS = 50;
/** ... up to this. A connection such a dial made that lasted less than this counts as failed. */
export const KICK_BACKOFF_MAX_MS = 1000;
/** The most acquires the protocol lets wait on one connection. */
export const MAX_WAITING_ACQUIRES = 4096;

/** Settings of a client; every one has the default shown. */
export interface ClientOptions {
  /** One dial (TLS handshake included); how long connect() waits for a first connection; how long a request waits for a live connection when none is up. Default 3000. */
  readonly connectTimeoutMs?: number;
  /** Silence on a connection with requests outstanding before it is probed with `S`. Default 500. */
  readonly probeIntervalMs?: number;
  /** How long a probe (or a new connection's first `S`) may go unanswered before the connection counts as dead. Default 500. */
  readonly probeTimeoutMs?: number;
  /** An acquire with a wait ends by its wait plus this, whatever the nodes do. Default 1000. */
  readonly acquireGraceMs?: number;
  /** One attempt of a release or renew; status() on a live connection; sync(). Default 2000. */
  readonly requestTimeoutMs?: number;
  /** How often a release or renew is retried on connection trouble. Default 200. */
  readonly retryEveryMs?: number;
  /** For how long a release or renew is retried. Default 5000. */
  readonly retryForMs?: number;
  /** How often a dropped or dead connection is dialled again. Default 3000. */
  readonly redialIntervalMs?: number;
  /** How long a request keeps following `M` answers or waiting through `M key -`. Default 10000. */
  readonly noActiveTimeoutMs?: number;
  /** Acquires waiting on one connection before more wait inside the client: 1 to 4096 (the default). */
  readonly maxWaitingAcquires?: number;
  /** Speak TLS to every node (absent: plain text). */
  readonly tls?: TlsOptions;
  /** Aborts connect() (not the client once connected). */
  readonly signal?: AbortSignal;
}

/** Options of a call that can wait. */
export interface CallOptions {
  /** Aborts the call: it rejects with the signal's reason. */
  readonly signal?: AbortSignal;
}

/**
 * What an acquire asks for: the key alone (the default: an exclusive lock,
 * `A`), beside other shared holders (`shared: true`: a read lock, `G`), or
 * one of at most `permits` permits of the key (a counting semaphore, `C`).
 * Every kind's grant has its own fencing token and lease, and is renewed
 * and released alike.
 */
export interface KindOptions {
  /**
   * Hold the key beside other shared holders, never beside an exclusive
   * one: a read lock. Fair: it waits behind a waiting exclusive acquire. No
   * upgrade: release it, then acquire exclusively. Default false.
   */
  readonly shared?: boolean;
  /**
   * Take one of at most this many permits of the key (1 to 65536): a
   * counting semaphore. The limit is fixed by the acquire that finds the
   * key with no holder and no waiter; another limit is refused
   * (WrongKindError) while the key is live. Not with `shared`.
   */
  readonly permits?: number;
}

/** Options of an acquire. */
export interface AcquireOptions extends CallOptions, KindOptions {
  /** The lease, ms (rounded down; 1 to 86400000). */
  readonly leaseMs: number;
  /** The most time to wait in the queue, ms (rounded up); absent: no limit. */
  readonly waitMs?: number;
}

/** Options of lock() and tryLock(). */
export interface LockOptions extends CallOptions, KindOptions {
  /** The lease, ms. Default 30000. */
  readonly leaseMs?: number;
  /** The most time to wait in the queue, ms; absent: no limit (lock() only). */
  readonly waitMs?: number;
  /** Renew the lease every third of it while the lock is held. Default true. */
  readonly renew?: boolean;
}

/** status() gives one per address: a status or the error. */
export interface AddrStatus {
  readonly addr: string;
  readonly status?: NodeStatus;
  readonly error?: RinglockError;
}

/**
 * One address's connection, dialled and redialled in the background, or at
 * once when an `M` answer names it (`dialNow`).
 */
class Slot {
  live: Conn | null = null;
  lastError: string | null = null;
  failures = 0;
  dialingSince: number | null = null;
  /** Dials started and ended so far (the one under way is `started`). */
  started = 0;
  ended = 0;
  /** A redirect asked for a dial not started yet. */
  kicked = false;
  /** Wakes the slot out of its wait for the next redial tick. */
  wake: (() => void) | null = null;
  /**
   * Redirect dials that failed in a row (a connection one made that lasted
   * less than KICK_BACKOFF_MAX_MS counts as failed; one that lasted longer
   * resets this), and when the last one ended.
   */
  kickFailures = 0;
  kickFailedAt: number | null = null;
  constructor(readonly addr: string) {}

  /** A connection that is up and not closed. */
  up(): boolean {
    return this.live !== null && !this.live.closed;
  }

  /**
   * An `M` named this slot's node and it has no connection: dial it now
   * rather than at the next redial tick. Gives the number of the dial that
   * decides (the one under way, or the next), or null if a redirect dial
   * failed too recently (the request backs off instead).
   */
  dialNow(): number | null {
    if (this.dialingSince !== null) return this.started;
    if (this.kicked) return this.started + 1;
    if (this.kickFailedAt !== null) {
      const gap = Math.min(KICK_BACKOFF_MIN_MS * 2 ** Math.min(this.kickFailures - 1, 8), KICK_BACKOFF_MAX_MS);
      if (now() < this.kickFailedAt + gap) return null;
    }
    this.kicked = true;
    this.wake?.();
    return this.started + 1;
  }

  /** A redirect dial failed (or its connection dropped too soon). */
  kickFailed(): void {
    this.kickFailures += 1;
    this.kickFailedAt = now();
  }

  /** Resolves when `dialNow` is called, after `ms`, or when `signal` aborts. */
  waitKick(ms: number, signal: AbortSignal): Promise<void> {
    return new Promise<void>((resolve) => {
      const done = (): void => {
        clearTimeout(timer);
        signal.removeEventListener("abort", done);
        if (this.wake === done) this.wake = null;
        resolve();
      };
      const timer = setTimeout(done, Math.max(0, Math.ceil(ms)));
      signal.addEventListener("abort", done, { once: true });
      this.wake = done;
    });
  }
}

type Doing = "connecting" | "queueing" | "asking" | "redirected";

interface AcqState {
  doing: Doing;
  asking: string;
  failure: RinglockError | null;
}

/** The deadline of an acquire ran out (internal abort reason). */
class Deadline {}

/** Bounds the time spent following `M` answers for one request. */
class Moves {
  private first: number | null = null;
  private readonly named: string[] = [];
  private backoff = 50;
  constructor(private readonly bound: number) {}

  /** Handles one `M`; true: the named node is up (see `Client._follow`). */
  async moved(client: Client, to: string | null, signal: AbortSignal): Promise<boolean> {
    this.first ??= now();
    const first = this.first;
    if (now() - first >= this.bound) {
      throw new NoActiveNodeError(
        `no active node: the cluster kept redirecting or answered 'no active node' for ${showMs(this.bound)}`,
      );
    }
    const news = to !== null && !this.named.includes(to) && this.named.length <= MAX_REDIRECT_ADDRS;
    if (news) {
      this.named.push(to);
    } else {
      await sleep(Math.min(this.backoff, Math.max(0, this.bound - (now() - first))), signal);
      this.backoff = Math.min(this.backoff * 2, 1000);
    }
    if (to === null) return false;
    const left = Math.max(0, this.bound - (now() - first));
    return client._follow(to, Math.min(left, client.timing.connectTimeoutMs), signal);
  }
}

function setting(options: ClientOptions, name: keyof Timing, dflt: number): number {
  const v = (options as Record<string, unknown>)[name];
  if (v === undefined) return dflt;
  if (typeof v !== "number" || !Number.isFinite(v) || v <= 0) {
    throw new InvalidArgumentError(`${name} must be a positive number of milliseconds, not ${String(v)}`);
  }
  // Timers take at most 2^31 - 1 ms.
  return Math.min(v, 2 ** 31 - 1);
}

function splitAddrs(addrs: string | Iterable<string>): string[] {
  const items = typeof addrs === "string" ? addrs.split(",") : [...addrs];
  const out: string[] = [];
  for (const item of items) {
    if (typeof item !== "string") throw new InvalidArgumentError(`an address is a string, not ${typeof item}`);
    const a = item.trim();
    if (a === "") continue;
    splitAddr(a);
    if (!out.includes(a)) out.push(a);
  }
  if (out.length === 0) throw new InvalidArgumentError("no server address given");
  return out;
}

/**
 * A client of a ringlock node or cluster. Make it with
 * `await Client.connect(addrs, options)`; close it with `await
 * client.close()` (or `await using client = ...`). One client serves a whole
 * process: every call pipelines on the same connections.
 */
export class Client implements Owner, AsyncDisposable {
  readonly timing: Timing;
  readonly maxWaiting: number;
  private readonly given: string[];
  private readonly tls: TlsSetup | undefined;
  private readonly slots: Slot[] = [];
  private rr = 0;
  private active: string | null = null;
  private changeWaiters = new Set<() => void>();
  private readonly closing = new AbortController();
  private readonly background = new Set<Promise<unknown>>();
  private closedFlag = false;

  private constructor(addrs: string[], options: ClientOptions) {
    this.given = addrs;
    this.timing = {
      connectTimeoutMs: setting(options, "connectTimeoutMs", 3000),
      probeIntervalMs: setting(options, "probeIntervalMs", 500),
      probeTimeoutMs: setting(options, "probeTimeoutMs", 500),
      acquireGraceMs: setting(options, "acquireGraceMs", 1000),
      requestTimeoutMs: setting(options, "requestTimeoutMs", 2000),
      retryEveryMs: setting(options, "retryEveryMs", 200),
      retryForMs: setting(options, "retryForMs", 5000),
      redialIntervalMs: setting(options, "redialIntervalMs", 3000),
      noActiveTimeoutMs: setting(options, "noActiveTimeoutMs", 10000),
    };
    const max = options.maxWaitingAcquires ?? MAX_WAITING_ACQUIRES;
    if (!Number.isInteger(max) || max < 1 || max > MAX_WAITING_ACQUIRES) {
      throw new InvalidArgumentError(`maxWaitingAcquires must be an integer from 1 to ${MAX_WAITING_ACQUIRES}`);
    }
    this.maxWaiting = max;
    this.tls = options.tls === undefined ? undefined : tlsSetup(options.tls);
    // Every call under way listens to it: many at once is the normal case.
    setMaxListeners(0, this.closing.signal);
  }

  /**
   * Starts the connections and resolves once one is up. `addrs`: the
   * cluster's `--peers` list (an array of `host:port`, or one
   * comma-separated string), spelled as the nodes spell it. Rejects with
   * ConnectionError if every address failed its first dial, or none
   * connected within the connect timeout (3 s).
   */
  static async connect(addrs: string | Iterable<string>, options: ClientOptions = {}): Promise<Client> {
    const client = new Client(splitAddrs(addrs), options);
    const list = client.given.length === 1 ? [client.given[0]!, client.given[0]!] : client.given;
    for (const addr of list) client.addSlot(addr);
    const until = now() + client.timing.connectTimeoutMs;
    try {
      for (;;) {
        if (client.connected() > 0) return client;
        if (client.slots.every((s) => s.failures > 0)) throw new ConnectionError(client.whyNoConnection());
        const left = until - now();
        if (left <= 0) {
          throw new ConnectionError(
            `no connection within ${showMs(client.timing.connectTimeoutMs)}: ${client.whyNoConnection()}`,
          );
        }
        await client.waitChange(left, options.signal);
      }
    } catch (e) {
      await client.close();
      throw e;
    }
  }

  /** Closes every connection; calls still waiting reject with ClosedError. Idempotent. */
  async close(): Promise<void> {
    if (this.closedFlag) return;
    this.closedFlag = true;
    this.closing.abort(new ClosedError());
    for (const slot of this.slots) slot.live?.end("the client was closed", false);
    this.bump();
    await Promise.allSettled([...this.background]);
  }

  /** `await using client = await Client.connect(...)` closes it at the end of the scope. */
  [Symbol.asyncDispose](): Promise<void> {
    return this.close();
  }

  /** Whether close() was called. */
  get closed(): boolean {
    return this.closedFlag;
  }

  // -- monitoring

  /** The addresses the client knows (given, then named by `M` answers). */
  addresses(): string[] {
    const out: string[] = [];
    for (const s of this.slots) if (!out.includes(s.addr)) out.push(s.addr);
    return out;
  }

  /** Connections up right now. */
  connected(): number {
    return this.slots.filter((s) => s.live !== null).length;
  }

  /** Connections the client keeps (up or being redialled). */
  connections(): number {
    return this.slots.length;
  }

  /** Requests written and not yet answered (probes not counted). */
  pendingRequests(): number {
    let n = 0;
    for (const s of this.slots) n += s.live?.outstanding ?? 0;
    return n;
  }

  // -- connections

  private bump(): void {
    const waiters = this.changeWaiters;
    this.changeWaiters = new Set();
    for (const w of waiters) w();
  }

  /** Resolves at the next change of the connections, or after `ms`; rejects on abort. */
  private waitChange(ms: number, signal?: AbortSignal): Promise<void> {
    return new Promise<void>((resolve, reject) => {
      if (signal?.aborted) {
        reject(reasonOf(signal));
        return;
      }
      const done = (): void => {
        clearTimeout(timer);
        this.changeWaiters.delete(wake);
        signal?.removeEventListener("abort", onAbort);
      };
      const wake = (): void => {
        done();
        resolve();
      };
      const onAbort = (): void => {
        done();
        reject(reasonOf(signal!));
      };
      const timer = setTimeout(wake, Math.max(0, Math.ceil(ms)));
      this.changeWaiters.add(wake);
      signal?.addEventListener("abort", onAbort, { once: true });
    });
  }

  private track<T>(p: Promise<T>): void {
    const q = p.then(
      () => undefined,
      () => undefined,
    );
    this.background.add(q);
    void q.then(() => this.background.delete(q));
  }

  private addSlot(addr: string): Slot {
    const slot = new Slot(addr);
    this.slots.push(slot);
    this.track(this.runSlot(slot));
    return slot;
  }

  private async runSlot(slot: Slot): Promise<void> {
    while (!this.closedFlag) {
      const dialedAt = now();
      slot.dialingSince = dialedAt;
      slot.started += 1;
      const kicked = slot.kicked;
      slot.kicked = false;
      try {
        const conn = await dial(this, slot.addr, this.tls);
        slot.dialingSince = null;
        slot.ended = slot.started;
        if (this.closedFlag) {
          conn.end("the client was closed", false);
          return;
        }
        slot.live = conn;
        this.bump();
        const upAt = now();
        const why = await conn.ended;
        slot.live = null;
        slot.lastError = why;
        if (now() - upAt >= KICK_BACKOFF_MAX_MS) {
          slot.kickFailures = 0;
          slot.kickFailedAt = null;
        } else if (kicked) {
          // A node that answers the hello and drops the connection does
          // not get a dial per M.
          slot.kickFailed();
        }
      } catch (e) {
        slot.dialingSince = null;
        slot.ended = slot.started;
        slot.lastError = e instanceof DialError || e instanceof Error ? e.message : String(e);
        slot.failures += 1;
        if (kicked) slot.kickFailed();
      }
      this.bump();
      // The next dial: at the redial tick, or at once if an M names this
      // node meanwhile.
      const redialAt = dialedAt + this.timing.redialIntervalMs;
      while (!slot.kicked && !this.closedFlag) {
        const left = redialAt - now();
        if (left <= 0) break;
        await slot.waitKick(left, this.closing.signal);
      }
    }
  }

  /**
   * A live connection: round robin over the preferred (active) node's
   * connections if it has any up, else over all. With `addr`, only that
   * address's.
   */
  private pick(addr: string | null): Conn | null {
    const n = this.slots.length;
    if (n === 0) return null;
    const start = this.rr;
    this.rr = (this.rr + 1) % 1_000_000_007;
    const want = addr ?? this.active;
    if (want !== null) {
      for (let i = 0; i < n; i++) {
        const s = this.slots[(start + i) % n]!;
        if (s.addr === want && s.live !== null && !s.live.closed) return s.live;
      }
      if (addr !== null) return null;
    }
    for (let i = 0; i < n; i++) {
      const s = this.slots[(start + i) % n]!;
      if (s.live !== null && !s.live.closed) return s.live;
    }
    return null;
  }

  private async waitLive(addr: string | null, within: number, signal: AbortSignal): Promise<Conn | null> {
    this.checkOpen();
    const until = now() + within;
    for (;;) {
      if (this.closedFlag) throw new ClosedError();
      const conn = this.pick(addr);
      if (conn !== null) return conn;
      const left = until - now();
      if (left <= 0) return null;
      await this.waitChange(left, signal);
    }
  }

  /**
   * Follows an `M` naming `addr`: makes it the preferred node and waits up
   * to `within` for a live connection to it. A node with no live
   * connection is dialled now (a new address gets a slot; a known one's
   * slot is woken out of its redial wait, see `Slot.dialNow`) and the
   * request waits for that dial, hello included. If it fails (or a
   * redirect dial failed too recently), the preference is dropped and the
   * request goes on by its own back-off.
   * @internal
   */
  async _follow(addr: string, within: number, signal: AbortSignal): Promise<boolean> {
    this.checkOpen();
    const mine = this.slots.filter((s) => s.addr === addr);
    if (mine.some((s) => s.up())) {
      this.active = addr;
      return true;
    }
    let slot: Slot;
    let n: number | null;
    if (mine.length === 0) {
      if (this.addresses().length - this.given.length >= MAX_REDIRECT_ADDRS) return false;
      try {
        splitAddr(addr);
      } catch {
        return false;
      }
      slot = this.addSlot(addr);
      n = 1;
    } else {
      slot = mine.find((s) => s.dialingSince !== null) ?? mine[0]!;
      n = slot.dialNow();
      if (n === null) return false;
    }
    this.active = addr;
    if ((await this.waitDial(slot, n, within, signal)) !== null) return true;
    if (this.active === addr) this.active = null;
    return false;
  }

  /**
   * Waits up to `within` for a live connection to `slot`'s address, or
   * until its dial number `n` ended without one.
   */
  private async waitDial(slot: Slot, n: number, within: number, signal: AbortSignal): Promise<Conn | null> {
    const until = now() + within;
    for (;;) {
      if (this.closedFlag) throw new ClosedError();
      const conn = this.pick(slot.addr);
      if (conn !== null) return conn;
      if (slot.ended >= n) return null;
      const left = until - now();
      if (left <= 0) return null;
      await this.waitChange(left, signal);
    }
  }

  /** The error of an acquire redirected to `addr` that could not reach it. */
  private unreached(addr: string): ConnectionError {
    const why = this.slots.find((s) => s.addr === addr && s.lastError !== null)?.lastError ?? `${addr}: not connected yet`;
    return new ConnectionError(`redirected to ${addr}, which could not be reached (${why})`);
  }

  private whyNoConnection(): string {
    const errors: string[] = [];
    for (const s of this.slots) {
      let why = s.lastError;
      if (why === null && s.dialingSince !== null) {
        const what = this.tls !== undefined ? "TCP connection and TLS handshake" : "TCP connection";
        why = `connect to ${s.addr}: ${what} not finished after ${showMs(now() - s.dialingSince)}`;
        if (this.tls !== undefined) why += " (a stalled node, or a port that does not speak TLS?)";
      }
      why ??= `${s.addr}: not connected yet`;
      if (!errors.includes(why)) errors.push(why);
    }
    return `no live connection (${errors.join("; ")})`;
  }

  private checkOpen(): void {
    if (this.closedFlag) throw new ClosedError();
  }

  /** An acquire nobody waits for any more was granted: release it (internal). */
  releaseAbandoned(key: Buffer, token: bigint): void {
    if (this.closedFlag) return;
    this.track(this.release(key, token));
  }

  /** Runs `p` in the background until the client closes. @internal */
  _background(p: Promise<unknown>): void {
    this.track(p);
  }

  /** A signal that aborts when the client closes. @internal */
  get _closing(): AbortSignal {
    return this.closing.signal;
  }

  // -- locks

  /**
   * Acquires `key` for `leaseMs`, waiting in the queue at most `waitMs`
   * (absent: no limit). Resolves with the Grant, or null if the wait ran out
   * (nothing is held). Does not renew.
   *
   * With a wait, the call ends by the wait plus the acquire grace (1 s)
   * whatever the nodes do. Aborting `signal` rejects with its reason; the
   * request stays queued on the server (waiting acquires belong to their
   * connection), and if it is granted later the client releases it at once.
   */
  acquire(key: Key, options: AcquireOptions): Promise<Grant | null> {
    return this.run(() => {
      const k = checkKey(key);
      const kind = checkKind(options.shared, options.permits);
      return this._acquire(k, toLeaseMs(options.leaseMs), toWaitMs(options.waitMs), options.signal, kind);
    });
  }

  /**
   * One attempt with the shortest wait the protocol allows (1 ms), like
   * `flock -n`: null if the key cannot be granted now (`shared` and
   * `permits` as for acquire).
   */
  tryAcquire(key: Key, options: Omit<AcquireOptions, "waitMs">): Promise<Grant | null> {
    return this.run(() => {
      const k = checkKey(key);
      const kind = checkKind(options.shared, options.permits);
      return this._acquire(k, toLeaseMs(options.leaseMs), TRY_WAIT_MS, options.signal, kind);
    });
  }

  /**
   * Acquires `key` and gives a Lock (renewed every third of its lease unless
   * `renew: false`); rejects with LockTimeoutError if the wait ran out. Use
   * it as `await using lock = await client.lock(key, {...})`: the lock is
   * released at the end of the scope.
   */
  lock(key: Key, options: LockOptions = {}): Promise<Lock> {
    return this.run(async () => {
      const k = checkKey(key);
      const lms = toLeaseMs(options.leaseMs ?? 30_000);
      const wms = toWaitMs(options.waitMs);
      const kind = checkKind(options.shared, options.permits);
      const grant = await this._acquire(k, lms, wms, options.signal, kind);
      if (grant === null) throw new LockTimeoutError(showKey(k), wms);
      return new Lock(this, grant, options.renew ?? true);
    });
  }

  /** One attempt (see tryAcquire): a Lock, or null if the lock is held by someone else. */
  tryLock(key: Key, options: Omit<LockOptions, "waitMs"> = {}): Promise<Lock | null> {
    return this.run(async () => {
      const k = checkKey(key);
      const lms = toLeaseMs(options.leaseMs ?? 30_000);
      const kind = checkKind(options.shared, options.permits);
      const grant = await this._acquire(k, lms, TRY_WAIT_MS, options.signal, kind);
      return grant === null ? null : new Lock(this, grant, options.renew ?? true);
    });
  }

  /** Argument errors reject rather than throw. */
  private async run<T>(f: () => Promise<T>): Promise<T> {
    return f();
  }

  private async _acquire(
    k: Buffer,
    lms: number,
    wms: number,
    userSignal: AbortSignal | undefined,
    kind: Kind,
  ): Promise<Grant | null> {
    this.checkOpen();
    const started = now();
    const state: AcqState = { doing: "connecting", asking: "", failure: null };
    const t = this.timing;
    const deadline = new Deadline();
    // A signal of its own only when something but the client's close can
    // end the call (the common case allocates nothing).
    const link = userSignal === undefined && wms === 0 ? null : linked([userSignal, this.closing.signal]);
    const timer =
      wms === 0 || link === null ? undefined : setTimeout(() => link.controller.abort(deadline), wms + t.acquireGraceMs);
    try {
      return await this.acquireLoop(k, kind, lms, wms, started, state, link?.controller.signal ?? this.closing.signal);
    } catch (e) {
      if (e !== deadline) throw e;
      const within = `${showMs(wms + t.acquireGraceMs)} (its wait, ${showMs(wms)}, plus ${showMs(t.acquireGraceMs)} of grace)`;
      switch (state.doing) {
        case "asking":
          throw new ConnectionError(`${state.asking} did not answer the acquire of ${showKey(k)} within ${within}`);
        case "connecting":
          throw new ConnectionError(`no connection within ${within}: ${this.whyNoConnection()}`);
        case "redirected":
          throw state.failure ?? new NoActiveNodeError();
        default:
          return null;
      }
    } finally {
      clearTimeout(timer);
      link?.dispose();
    }
  }

  private async acquireLoop(
    key: Buffer,
    kind: Kind,
    lms: number,
    wms: number,
    started: number,
    state: AcqState,
    signal: AbortSignal,
  ): Promise<Grant | null> {
    const t = this.timing;
    const ranOut = (): null => {
      if (state.failure !== null) throw state.failure;
      return null;
    };
    let failed = 0;
    let asked = false;
    const moves = new Moves(t.noActiveTimeoutMs);
    for (;;) {
      state.doing = "connecting";
      const conn = await this.waitLive(null, t.connectTimeoutMs, signal);
      if (conn === null) throw new ConnectionError(this.whyNoConnection());
      // Local queueing: wait for room on this connection (within the wait, if any).
      state.doing = "queueing";
      let got: "ok" | "closed" | "timeout";
      if (conn.tryTakeSlot()) {
        got = "ok";
      } else if (wms === 0) {
        got = await conn.takeSlot(signal);
      } else {
        const left = started + wms - now();
        if (left <= 0) return ranOut();
        got = await conn.takeSlot(signal, left);
      }
      if (got === "timeout") return ranOut();
      if (got === "closed") {
        failed += 1;
        const why = `${conn.addr}: the connection closed`;
        if (failed >= this.connections()) throw this.cutOff(failed, why);
        state.failure = new ConnectionError(why);
        continue;
      }
      let waitNow = 0;
      if (wms !== 0) {
        // The first attempt always goes out, with at least the shortest
        // wait (a try-lock's 1 ms is gone after one slow turn of the event
        // loop): only a node says that a wait ran out. A retry whose wait
        // ran out meanwhile ends with the last attempt's error.
        const elapsed = now() - started;
        if (asked && elapsed >= wms) {
          conn.giveSlot();
          return ranOut();
        }
        waitNow = Math.max(1, Math.ceil(wms - elapsed - 1e-6));
      }
      asked = true;
      const sent = now();
      state.doing = "asking";
      state.asking = conn.addr;
      const reply = await conn.call(kind.op, key, acquireKindLine(kind, key, lms, waitNow), { permit: true, signal });
      if (reply instanceof Lost || reply instanceof Broken) {
        if (reply instanceof Broken) {
          const refusal = acquireRefusal(reply.why, kind.op, key);
          if (refusal instanceof WrongKindError) throw refusal;
          if (refusal === null) throw brokenError(reply.why);
          // The node broke the connection over another request: this one
          // was withdrawn or never read (docs/protocol.md, section 8), so
          // it goes on like one whose connection was lost.
        }
        failed += 1;
        if (failed >= this.connections()) throw this.cutOff(failed, reply.why);
        state.failure = new ConnectionError(reply.why);
        continue;
      }
      switch (reply.op) {
        case "A":
        case "T":
          if (kind.op !== "A") break;
          return reply.op === "A" ? new Grant(key, reply.token, lms, sent + lms) : null;
        case "G":
        case "C":
          if (reply.op !== kind.op) break;
          if (reply.refused !== null) throw wrongKind(key, kind, reply.refused);
          return reply.token === 0n ? null : new Grant(key, reply.token, lms, sent + lms);
        case "M": {
          // No node said the wait ran out: if it runs out before another
          // node answers, the acquire ends with NoActiveNodeError (`M key -`,
          // or a named node that came up), or a ConnectionError naming a
          // named node that could not be reached.
          state.doing = "redirected";
          // A node that redirects decided nothing: the attempt at the node
          // it names goes out (with at least the shortest wait) even if the
          // wait ran out meanwhile, so a try-lock during a failover asks the
          // new active.
          asked = false;
          const to = reply.addr;
          state.failure = to === null ? new NoActiveNodeError() : this.unreached(to);
          if (await moves.moved(this, to, signal)) state.failure = new NoActiveNodeError();
          else if (to !== null) state.failure = this.unreached(to);
          continue;
        }
        default:
          break;
      }
      throw new ProtocolError(`${conn.addr}: unexpected answer to ${kind.op}: ${reply.op}`);
    }
  }

  private cutOff(failed: number, last: string): ConnectionError {
    return new ConnectionError(`no answer on ${failed} connection(s) in a row; the last: ${last}`);
  }

  /**
   * Releases the grant of `key` that carries `token`. True: it was held and
   * is released; false: no grant of `key` carries `token` (after a retried
   * attempt, false can also mean the first attempt had landed). Retried
   * every 200 ms for 5 s on connection trouble.
   */
  release(key: Key, token: bigint, options: CallOptions = {}): Promise<boolean> {
    return this.run(async () => {
      const k = checkKey(key);
      const tok = checkToken(token);
      return (await this._retrying("R", k, releaseLine(k, tok), now() + this.timing.retryForMs, options.signal)).held;
    });
  }

  /**
   * Renews the grant of `key` with `token`: it now expires `leaseMs` from
   * when the server reads this. False: no such grant. Retried like a release.
   */
  renew(key: Key, token: bigint, leaseMs: number, options: CallOptions = {}): Promise<boolean> {
    return this.run(async () => {
      const k = checkKey(key);
      const tok = checkToken(token);
      const lms = toLeaseMs(leaseMs);
      return (await this._retrying("N", k, renewLine(k, tok, lms), now() + this.timing.retryForMs, options.signal))
        .held;
    });
  }

  /**
   * A release or renew, retried every `retryEveryMs` until `until` when no
   * connection carries it, following `M`. Each attempt is bounded by the
   * request timeout. Gives the flag and when the attempt that got it was
   * sent.
   * @internal
   */
  async _retrying(
    op: "R" | "N",
    key: Buffer,
    line: Buffer,
    until: number,
    userSignal?: AbortSignal,
    trouble?: (why: string) => void,
  ): Promise<{ held: boolean; sent: number }> {
    this.checkOpen();
    const link = userSignal === undefined ? null : linked([userSignal, this.closing.signal]);
    const signal = link?.controller.signal ?? this.closing.signal;
    try {
      const t = this.timing;
      const what = op === "R" ? "release" : "renew";
      let last = "no attempt could be made";
      // The nodes M answers named for this request: a new one is tried at
      // once, a repeated one after the usual retry delay.
      const named: string[] = [];
      let noActive = false;
      const started = now();
      for (;;) {
        const at = now();
        if (at >= until) break;
        const conn = this.pick(null);
        if (conn !== null) {
          const bound = Math.min(t.requestTimeoutMs, until - at);
          const reply: Reply = await conn.call(op, key, line, { signal, timeoutMs: bound });
          noActive = false;
          if (reply instanceof Lost || reply instanceof Broken) {
            // A refusal of another acquire (of a semaphore key, or a G or C
            // the node refuses) that broke the connection: this request was
            // not read, so it goes on (docs/protocol.md, section 8).
            if (reply instanceof Broken && !refusedForAnother(reply.why)) throw brokenError(reply.why);
            last = reply.why;
          } else if (reply.op === op) {
            return { held: reply.held, sent: at };
          } else if (reply.op === "M") {
            if (reply.addr !== null) {
              const addr = reply.addr;
              last = `redirected to ${addr}`;
              const news = !named.includes(addr) && named.length <= MAX_REDIRECT_ADDRS;
              if (news) named.push(addr);
              const left = Math.max(0, until - now());
              if ((await this._follow(addr, Math.min(left, t.connectTimeoutMs), signal)) && news) continue;
            } else {
              last = "no active node";
              noActive = true;
            }
          } else {
            throw new ProtocolError(`${conn.addr}: unexpected answer to ${op}: ${reply.op}`);
          }
        } else {
          last = this.whyNoConnection();
        }
        trouble?.(last);
        if (now() + t.retryEveryMs > until) break;
        await sleep(t.retryEveryMs, signal);
      }
      if (noActive) throw new NoActiveNodeError(`${what}: no active node in the cluster`);
      throw new ConnectionError(`${what} gave up after ${showMs(now() - started)}: ${last}`);
    } finally {
      link?.dispose();
    }
  }

  // -- status

  /**
   * Asks every known address for its status (`S`), on its live connection
   * or a one-off one. Never rejects as a whole: each address gets a status
   * or an error.
   */
  async status(options: CallOptions = {}): Promise<AddrStatus[]> {
    this.checkOpen();
    return Promise.all(
      this.addresses().map(async (addr): Promise<AddrStatus> => {
        try {
          return { addr, status: await this.statusOf(addr, options.signal) };
        } catch (e) {
          if (e instanceof Error && "kind" in e) return { addr, error: e as RinglockError };
          throw e;
        }
      }),
    );
  }

  private async statusOf(addr: string, signal?: AbortSignal): Promise<NodeStatus> {
    const conn = this.pick(addr);
    if (conn !== null) {
      const limit = this.timing.requestTimeoutMs;
      const reply = await conn.call("S", null, Buffer.from("S\n"), {
        timeoutMs: limit,
        ...(signal !== undefined ? { signal } : {}),
      });
      if (reply instanceof Broken) throw brokenError(reply.why);
      if (reply instanceof Lost) {
        if (reply.why.includes("did not answer")) throw new ConnectionError(`${addr}: no answer to S within ${showMs(limit)}`);
      } else if (reply.op === "S") {
        return { role: reply.role, active: reply.addr, token: reply.token };
      }
    }
    return nodeStatusVia(addr, this.timing.connectTimeoutMs, this.tls, signal);
  }

  /**
   * A barrier: `S` on every live connection. When it resolves, every
   * request handed to a connection before the call has been read by its
   * server.
   */
  async sync(options: CallOptions = {}): Promise<void> {
    this.checkOpen();
    const conns = this.slots.flatMap((s) => (s.live !== null && !s.live.closed ? [s.live] : []));
    if (conns.length === 0) throw new ConnectionError(this.whyNoConnection());
    const limit = this.timing.requestTimeoutMs;
    const replies = await Promise.all(
      conns.map((c) =>
        c.call("S", null, Buffer.from("S\n"), {
          timeoutMs: limit,
          ...(options.signal !== undefined ? { signal: options.signal } : {}),
        }),
      ),
    );
    for (const r of replies) {
      if (r instanceof Broken) throw brokenError(r.why);
      if (r instanceof Lost) {
        throw new ConnectionError(
          r.why.includes("did not answer")
            ? `sync: a node did not answer S within ${showMs(limit)}`
            : `a connection dropped during sync: ${r.why}`,
        );
      }
    }
  }
}

/**
 * An `E` that refuses an acquire for what it asks (an exclusive acquire of
 * a semaphore key, a `G` or `C` to a node with peers or one that predates
 * them), which a release or renew pending on that connection never is.
 */
function refusedForAnother(why: string): boolean {
  return semaphoreRefusal(why) !== null || refusesSharedOps(why);
}

/**
 * A Broken reply whose `E` refuses an acquire for what it asks
 * (docs/protocol.md, sections 4 and 8): the WrongKindError when it refuses
 * this request (an `A` of a semaphore key), "other" when it is about
 * another request on the connection (this one was withdrawn or not read),
 * null for any other reason (a G or C the node refuses included).
 */
function acquireRefusal(why: string, op: Kind["op"], key: Buffer): WrongKindError | "other" | null {
  if (refusesSharedOps(why)) return op === "A" ? "other" : null;
  const r = semaphoreRefusal(why);
  if (r === null) return null;
  if (op !== "A" || r.quoted !== quotedLikeServer(key)) return "other";
  const k = showKey(key);
  const of = r.limit === 0 ? "semaphore" : `semaphore of ${r.limit} permits`;
  return new WrongKindError(
    k,
    r.limit,
    `an exclusive acquire of ${k} refused: it is a ${of} (acquire it with permits); nothing changed (${why})`,
  );
}

/** A `G` or `C` refused for the key's kind (`limit` 0: a lock). */
function wrongKind(key: Buffer, kind: Kind, limit: number): WrongKindError {
  const k = showKey(key);
  const asked = kind.op === "G" ? "a shared acquire" : `a permit (of ${kind.limit})`;
  const is = limit === 0 ? "held or waited for as a lock" : `a semaphore of ${limit} permits`;
  return new WrongKindError(k, limit, `${asked} of ${k} refused: it is ${is}; nothing changed`);
}

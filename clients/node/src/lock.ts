/** A lock held, renewed in the background, released at the end of its scope. */

import "./dispose.js";

import type { Client } from "./client.js";
import { ClosedError, LockLostError, RinglockError } from "./errors.js";
import { Grant } from "./grant.js";
import { leaseMs as toLeaseMs, renewLine, showKey } from "./proto.js";
import { linked, now, sleep } from "./util.js";

/** What the renewal shares with its Lock (it holds no reference to the Lock itself). */
class LockState {
  deadline: number;
  renewals = 0;
  failedAttempts = 0;
  lastError: string | undefined;
  lost: LockLostError | null = null;
  done = false;
  /** Aborted with the LockLostError when the lock is lost. */
  readonly lostController = new AbortController();
  /** Stops the renewal. */
  readonly stop = new AbortController();
  constructor(readonly grant: Grant) {
    this.deadline = grant.deadline;
  }

  finish(lost: LockLostError | null): void {
    if (this.done) return;
    this.done = true;
    this.stop.abort();
    if (lost !== null) {
      this.lost = lost;
      this.lostController.abort(lost);
    }
  }
}

const dropped = new FinalizationRegistry<{ client: WeakRef<Client>; state: LockState }>(({ client, state }) => {
  // A Lock garbage-collected unreleased: stop renewing, release in the background.
  if (state.done) return;
  state.finish(null);
  const c = client.deref();
  if (c !== undefined && !c.closed) c.releaseAbandoned(state.grant.keyBytes, state.grant.token);
});

/**
 * A lock held, as `client.lock()` and `client.tryLock()` give it.
 *
 * `token` is the fencing token. A renewed lock (the default) is renewed
 * every third of its lease; `signal` aborts (with a LockLostError as its
 * reason) if the lock is lost, so that work tied to it stops. A lock that
 * is not renewed aborts `signal` when its lease could have run out.
 * `release()`, or the end of an `await using` scope, releases it (once:
 * both are idempotent).
 */
export class Lock implements AsyncDisposable {
  private readonly state: LockState;
  private released = false;
  private releasing: Promise<boolean> | null = null;
  /** Whether the lease is renewed in the background. */
  readonly renewing: boolean;
  /** Aborts, with a LockLostError as its reason, when the lock is lost. */
  readonly signal: AbortSignal;

  /** Made by Client.lock() and Client.tryLock(); not meant to be called otherwise. */
  constructor(
    private readonly client: Client,
    grant: Grant,
    renew: boolean,
  ) {
    this.state = new LockState(grant);
    this.signal = this.state.lostController.signal;
    this.renewing = renew;
    if (renew) {
      client._background(renewLoop(client, this.state));
    } else {
      client._background(expireAtDeadline(client, this.state));
    }
    dropped.register(this, { client: new WeakRef(client), state: this.state }, this.state);
  }

  /** The key (its bytes as UTF-8). */
  get key(): string {
    return showKey(this.state.grant.keyBytes);
  }

  get keyBytes(): Buffer {
    return this.state.grant.keyBytes;
  }

  /** The fencing token: pass it with every write to the protected resource, which refuses tokens lower than the highest it has seen. */
  get token(): bigint {
    return this.state.grant.token;
  }

  /** The lease it was taken with, ms. */
  get leaseMs(): number {
    return this.state.grant.leaseMs;
  }

  /** When the lease runs out at the latest as far as the client can tell (`performance.now()` clock). */
  get deadline(): number {
    return this.state.deadline;
  }

  /** Renewals confirmed so far. */
  get renewals(): number {
    return this.state.renewals;
  }

  /** Renewal attempts that failed (and were retried). */
  get failedAttempts(): number {
    return this.state.failedAttempts;
  }

  /** Null while the lock is held (or after a release), else why it was lost. */
  get lost(): LockLostError | null {
    return this.state.lost;
  }

  /** Throws the LockLostError if the lock was lost. */
  throwIfLost(): void {
    if (this.state.lost !== null) throw this.state.lost;
  }

  /** Renews once now (with `leaseMs`, or the lease it was taken with). False: the lock is no longer held. */
  async renew(leaseMs?: number, options: { readonly signal?: AbortSignal } = {}): Promise<boolean> {
    const lms = toLeaseMs(leaseMs ?? this.leaseMs);
    const g = this.state.grant;
    const { held, sent } = await this.client._retrying(
      "N",
      g.keyBytes,
      renewLine(g.keyBytes, g.token, lms),
      now() + this.client.timing.retryForMs,
      options.signal,
    );
    if (held) this.state.deadline = Math.max(this.state.deadline, sent + lms);
    return held;
  }

  /**
   * Stops renewing and releases the lock (retried for 5 s). True: it was
   * held until now; false: it was already gone (lost, expired, or released
   * before: a second call does nothing and gives false).
   */
  release(): Promise<boolean> {
    if (this.released) return this.releasing ?? Promise.resolve(false);
    this.released = true;
    dropped.unregister(this.state);
    const lost = this.state.lost;
    this.state.finish(null);
    if (lost !== null) {
      this.releasing = Promise.resolve(false);
      return this.releasing;
    }
    const g = this.state.grant;
    const p = this.client.release(g.keyBytes, g.token);
    this.releasing = p.then(
      () => false,
      () => false,
    );
    return p;
  }

  /**
   * Stops renewing and keeps the lock held without releasing it (it ends by
   * an explicit client.release() or its lease). Gives its Grant.
   */
  detach(): Grant {
    this.released = true;
    dropped.unregister(this.state);
    this.state.finish(null);
    const g = this.state.grant;
    return new Grant(g.keyBytes, g.token, g.leaseMs, this.state.deadline);
  }

  /**
   * The end of an `await using` scope: release(). A lock that was lost or
   * already released resolves quietly; a release the cluster could not be
   * reached for rejects (ConnectionError, NoActiveNodeError). A closed
   * client leaves the lock to its lease.
   */
  async [Symbol.asyncDispose](): Promise<void> {
    if (this.released) {
      await this.releasing;
      return;
    }
    try {
      await this.release();
    } catch (e) {
      if (e instanceof ClosedError) return;
      throw e;
    }
  }
}

/** Without renewal: the lock counts as lost once its lease could have run out. */
async function expireAtDeadline(client: Client, state: LockState): Promise<void> {
  const link = linked([state.stop.signal, client._closing]);
  try {
    await sleep(state.deadline - now(), link.controller.signal);
  } catch {
    return;
  } finally {
    link.dispose();
  }
  const g = state.grant;
  state.finish(new LockLostError(showKey(g.keyBytes), g.token, false, "the lease ran out (the lock is not renewed)"));
}

/**
 * Renews a third of a lease after the last confirmed renewal was sent; the
 * lock is lost on `N key 0`, or when no renewal was confirmed before the
 * deadline (counted from when the last confirmed renewal was sent).
 */
async function renewLoop(client: Client, state: LockState): Promise<void> {
  const t = client.timing;
  const g = state.grant;
  const lease = g.leaseMs;
  const every = lease / 3;
  const line = renewLine(g.keyBytes, g.token, lease);
  // Stopped by a release, a detach, a loss, or the client closing.
  const stopLink = linked([state.stop.signal, client._closing]);
  const stop = stopLink.controller.signal;
  let first = true;
  try {
    for (;;) {
      await sleep(state.deadline - (lease - every) - now(), stop);
      // A grant that waited in the queue may come with its deadline already
      // past: its first renewal gets a request timeout (at most a third of
      // the lease) to be confirmed. A grant made at once keeps its deadline,
      // so a short lease is not given a full request timeout past it.
      const lossAt = first ? Math.max(state.deadline, now() + Math.min(t.requestTimeoutMs, every)) : state.deadline;
      first = false;
      let outcome: "renewed" | "refused" | "expired" | null = null;
      let sent = 0;
      const trouble = (why: string): void => {
        state.failedAttempts += 1;
        state.lastError = why;
      };
      while (outcome === null) {
        const at = now();
        if (at >= lossAt) {
          outcome = "expired";
          break;
        }
        const expired = new Error("expired");
        const link = linked([stop]);
        const timer = setTimeout(() => link.controller.abort(expired), lossAt - at);
        try {
          const r = await client._retrying("N", g.keyBytes, line, lossAt, link.controller.signal, trouble);
          sent = r.sent;
          outcome = r.held ? "renewed" : "refused";
        } catch (e) {
          if (e === expired) {
            outcome = "expired";
          } else if (stop.aborted || e instanceof ClosedError) {
            return;
          } else if (e instanceof RinglockError) {
            // A protocol error, or the retries gave up: try again (another
            // connection may do) until the deadline.
            trouble(e.message);
            await sleep(Math.min(t.retryEveryMs, Math.max(0, lossAt - now())), stop);
          } else {
            throw e;
          }
        } finally {
          clearTimeout(timer);
          link.dispose();
        }
      }
      if (outcome === "renewed") {
        state.deadline = Math.max(state.deadline, sent + lease);
        state.renewals += 1;
        state.lastError = undefined;
        continue;
      }
      const key = showKey(g.keyBytes);
      state.finish(
        outcome === "refused"
          ? new LockLostError(key, g.token, true)
          : new LockLostError(key, g.token, false, state.lastError ?? "the last attempt was not answered in time"),
      );
      return;
    }
  } catch {
    // Stopped (released, detached, or the client closed).
  } finally {
    stopLink.dispose();
  }
}

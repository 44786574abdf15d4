import { showKey } from "./proto.js";
import { now } from "./util.js";

/** A lock held without a Lock object: its key, fencing token, lease and deadline. */
export class Grant {
  constructor(
    /** The key's bytes. */
    readonly keyBytes: Buffer,
    /** The fencing token. */
    readonly token: bigint,
    /** The lease it was taken with, ms. */
    readonly leaseMs: number,
    /**
     * When the lease runs out at the latest as far as the client can tell,
     * on the `performance.now()` clock: when the acquire was sent, plus the
     * lease.
     */
    readonly deadline: number,
  ) {}

  /** The key (its bytes as UTF-8). */
  get key(): string {
    return showKey(this.keyBytes);
  }

  /** Milliseconds until the deadline (0 once past). */
  remainingMs(): number {
    return Math.max(0, this.deadline - now());
  }
}


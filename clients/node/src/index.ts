/**
 * The official Node.js client of ringlock.
 *
 * ```ts
 * import { Client } from "ringlock";
 * await using client = await Client.connect(["127.0.0.1:7171"]);
 * await using lock = await client.lock("reports/daily", { leaseMs: 30_000, waitMs: 5_000 });
 * await writeReport({ fence: lock.token, signal: lock.signal });
 * ```
 */

import "./dispose.js";

export {
  type AcquireOptions,
  type AddrStatus,
  type CallOptions,
  Client,
  type ClientOptions,
  type KindOptions,
  type LockOptions,
  MAX_WAITING_ACQUIRES,
} from "./client.js";
export type { Timing } from "./conn.js";
export {
  ClosedError,
  ConnectionError,
  type ErrorKind,
  InvalidArgumentError,
  LockLostError,
  LockTimeoutError,
  NoActiveNodeError,
  NotAllowedError,
  ProtocolError,
  RinglockError,
  WrongKindError,
} from "./errors.js";
export { Grant } from "./grant.js";
export { Lock } from "./lock.js";
export {
  listLocks,
  type ListLocksOptions,
  type LockInfo,
  nodeProblem,
  nodeStatus,
  type NodeStatus,
  type OneOffOptions,
} from "./oneoff.js";
export { type Key, MAX_PERMITS } from "./proto.js";
export { type Pem, type TlsFiles, tlsFromEnv, tlsFromFiles, type TlsOptions } from "./tls.js";

//! ringlock-core: the sans-I/O lock server.
//!
//! Everything here takes time as an argument and hands its output back as
//! values; nothing opens a socket, starts a thread, reads the clock or
//! takes a lock. The event loops of the `ringlock` package (io_uring and
//! epoll) and the simulator of its tests drive it alike.
//!
//! - [`access`]: client identities from certificates and the `--acl`
//!   rules (who may lock what).
//! - [`engine`]: the lock table, its timers and fencing tokens: takes
//!   `(now, connection, request)` and writes answers into the [`outbox`].
//! - [`cluster`]: peer links, their handshake and authentication, the role
//!   rule and replication.
//! - [`node`]: the engine and the cluster together, as the loops drive them.
//! - [`outbox`]: every connection's unsent output, written by the engine
//!   and the cluster, taken by the loops.
//! - [`session`] and [`lifecycle`]: one connection's protocol state and its
//!   life from accept to close (TLS records included).
//! - [`driver`]: the per-turn policy both event loops share (admission,
//!   accept retry, handshake and linger deadlines, batched reads, shutdown,
//!   the timeout).
//! - [`read_batch`]: when a busy link is read in batches instead of at
//!   every arrival (a standby's link from its active).
//! - [`stats`]: the counters the parts keep, and the snapshot the node
//!   hands out for the metrics listener.

#![forbid(unsafe_code)]

pub mod access;
pub mod cluster;
pub mod driver;
pub mod engine;
pub mod lifecycle;
pub mod node;
pub mod outbox;
pub mod read_batch;
pub mod session;
pub mod stats;

pub use ringlock_proto as proto;

//! Counters of what the node does, kept as plain integers in the memory of
//! the loop's thread (no atomics, no locks): the engine, the node and the
//! cluster each bump their own fields inline. A copy goes to the metrics
//! listener's thread at most every [`PUBLISH_EVERY_MS`]
//! (the `ringlock` package's metrics listener), never per request.

/// How often, at most, the loop publishes a copy of its counters.
pub const PUBLISH_EVERY_MS: u64 = 100;

use std::time::{Duration, Instant};

pub use crate::engine::stats::{EngineStats, LOG2_BUCKETS, Log2Histogram};

/// What the node counts around the engine.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct NodeStats {
    pub conns_opened: u64,
    pub conns_closed: u64,
    /// Accepted and closed at once: beyond `--max-conns` and the peers'
    /// reserve.
    pub conns_refused: u64,
    /// Accepted or dialed, and dropped at once: the socket could not be set
    /// up (an option, its registration with the kernel, TLS).
    pub conns_failed: u64,
    /// Requests that parsed but broke the connection (`E`: too many
    /// waiting, lock table full, tokens exhausted, peer-only connection).
    pub requests_refused: u64,
    /// Lines that did not parse (`E`), peer lines refused included.
    pub protocol_errors: u64,
    /// Reads of a busy link made in batches that found bytes: a standby
    /// reading its active's replication once per `--replication-batch-us`
    /// instead of at every write ([`crate::read_batch`]).
    pub batched_reads: u64,
    /// Loop turns, from waking up to waiting again, µs.
    pub turn_us: Log2Histogram,
}

/// What the cluster counts.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ClusterStats {
    /// Snapshots of the table sent to followers.
    pub snapshots_sent: u64,
    /// Times this node handed the active role to a peer.
    pub handoffs: u64,
    /// Times this node became active.
    pub became_active: u64,
    /// Times this node stepped down from active.
    pub stepped_down: u64,
}

/// What an active measures and counts of one follower's replication.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FollowerStats {
    /// Replication lag, µs: from the turn whose deltas a probe followed
    /// until the turn that read the follower's answer, which it sends once
    /// it has applied every line before the probe (so the way back is
    /// included). One probe at a time, at most every
    /// [`crate::cluster::PROBE_EVERY_MS`], and only after deltas.
    pub lag_us: Log2Histogram,
    /// Probes given up: unanswered within the peer timeout.
    pub probes_lost: u64,
    /// Replication events (grants, renewals, releases, expiries) written
    /// to its link as deltas, and their bytes; snapshots not included.
    pub events: u64,
    pub bytes: u64,
    /// Writes of deltas into its link's outgoing bytes: at most one per
    /// loop turn (the loop then hands them to the kernel with one send).
    pub writes: u64,
}

/// One follower of this active node, as published.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Follower {
    /// Its address in `--peers`.
    pub addr: String,
    /// Replication bytes queued for it, not yet handed to the kernel.
    pub queued_bytes: u64,
    pub stats: FollowerStats,
}

/// What the loop publishes: its counters and the gauges of the moment.
#[derive(Debug, Clone, Default)]
pub struct Snapshot {
    /// The loop has published at least once.
    pub published: bool,
    pub engine: EngineStats,
    pub node: NodeStats,
    pub cluster: ClusterStats,
    /// With peers; false for a cluster of one.
    pub clustered: bool,
    pub active: bool,
    /// Active, or a standby that follows an active and holds its complete
    /// snapshot (`/ready`).
    pub ready: bool,
    pub leaving: bool,
    /// When the loop handed this snapshot to the metrics listener (set by
    /// the loop as it does: the node reads no clock).
    pub published_at: Option<Instant>,
    /// With peers: a snapshot older than this means the loop has stopped
    /// turning (a clustered loop turns at least every heartbeat), and
    /// `/ready` says so whatever it holds.
    pub stale_after: Option<Duration>,
    pub highest_token: u64,
    pub locks: u64,
    pub waiters: u64,
    /// Shared grants and permits of semaphores held.
    pub shared_held: u64,
    pub permits_held: u64,
    pub peers_up: u64,
    /// Every peer that follows this active node over an authenticated link.
    pub followers: Vec<Follower>,
}

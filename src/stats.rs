//! Counters of what the node does, kept as plain integers in the memory of
//! the loop's thread (no atomics, no locks): the engine, the node and the
//! cluster each bump their own fields inline. A copy goes to the metrics
//! listener's thread at most every [`PUBLISH_EVERY_MS`]
//! ([`crate::metrics`]), never per request.

/// How often, at most, the loop publishes a copy of its counters.
pub const PUBLISH_EVERY_MS: u64 = 100;

pub use crate::engine::stats::{EngineStats, LOG2_BUCKETS, Log2Histogram};

/// What the node counts around the engine.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct NodeStats {
    pub conns_opened: u64,
    pub conns_closed: u64,
    /// Accepted and closed at once: beyond `--max-conns` and the peers'
    /// reserve.
    pub conns_refused: u64,
    /// Requests that parsed but broke the connection (`E`: too many
    /// waiting, lock table full, tokens exhausted, peer-only connection).
    pub requests_refused: u64,
    /// Lines that did not parse (`E`), peer lines refused included.
    pub protocol_errors: u64,
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

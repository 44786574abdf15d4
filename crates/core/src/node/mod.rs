//! A node: the engine plus, with peers, the cluster state machine, and the
//! [`Outbox`] of every connection's unsent output, which the node owns and
//! lends to both (the engine writes its answers there, the cluster its peer
//! lines). This is what the I/O loops drive; it is sans-I/O like its parts.
//!
//! Driving order, once per loop turn: [`Node::tick`]; then for each
//! connection's input [`crate::session::Session::feed`] (which calls
//! `Node::handle_request` and `Node::handle_peer_line`); then
//! [`Node::take_dirty`] and [`Node::output_mut`] to send; then
//! [`Node::take_doomed`] to close the connections the node gave up on;
//! then [`Node::take_dials`] to start dials; then sleep until
//! [`Node::next_deadline`].
//!
//! The loops ask [`Node::admit`] before taking a connection: peer links do
//! not count against `--max-conns`, so a node full of clients still takes
//! its peers' links (a connection taken beyond the limit must become an
//! authenticated peer link in time, and any client request on it is
//! refused).

mod addresses;
mod admission;
mod logs;
mod metrics;
#[cfg(test)]
mod tests;

pub use admission::Admission;

use std::net::SocketAddr;

use crate::cluster::{Cluster, ClusterConfig, PeerError, PeerId, Role, Unexpected, wire};
use crate::engine::{ConnId, Engine, Now, Refusal};
use crate::outbox::Outbox;
use crate::proto::Request;
use crate::stats::{NodeStats, Snapshot};

use logs::{LogLimiter, SUMMARY_EVERY_MS, Summary};
use metrics::Publish;

/// The target of this module's log lines: the name it had before the core
/// became a crate of its own, which `RUST_LOG` filters name.
const LOG_TARGET: &str = "ringlock::node";

/// The longest problem text an `H` answer carries (more is cut, with
/// `...`): the answer stays one short line for any client.
pub const MAX_PROBLEM_BYTES: usize = 400;

/// How the node was configured at start.
#[derive(Debug, Clone)]
pub struct NodeConfig {
    /// The address clients and peers know this node by.
    pub advertise: String,
    /// With other nodes: the cluster. `None`: a cluster of one.
    pub cluster: Option<ClusterConfig>,
    /// `--max-locks`: the most live locks the engine holds.
    pub max_locks: u32,
}

pub struct Node {
    engine: Engine,
    /// Every connection's unsent output, and which have some: the node's,
    /// lent to the engine for its answers and to the cluster for its peer
    /// lines ([`crate::outbox`]).
    outbox: Outbox,
    cluster: Option<Cluster>,
    /// Remote addresses of connections, when the loop told us (for logs).
    remotes: Vec<Option<SocketAddr>>,
    /// Connections taken beyond `--max-conns` for peers: each must be an
    /// authenticated peer link by its deadline.
    peer_only: Vec<(ConnId, u64)>,
    /// Client requests take [`Node::handle_checked`]: some connection is
    /// peer-only, or the node has client identities. A plain node's request
    /// path tests this one word ([`Node::update_checked_requests`]).
    checked_requests: bool,
    /// Connections to close, for the loop ([`Node::take_doomed`]).
    doomed: Vec<(ConnId, String)>,
    peer_log: LogLimiter,
    /// Failed accepts (out of descriptors, say), which clients can cause
    /// at the rate they connect.
    accept_log: LogLimiter,
    stats: NodeStats,
    /// With `--metrics-listen`: when the counters are published.
    publish: Option<Publish>,
    /// The snapshot taken for the metrics listener and not yet handed to
    /// the loop ([`Node::take_snapshot`]).
    snapshot: Option<Snapshot>,
    /// Refused connections and protocol errors, summed up in the log once
    /// per [`SUMMARY_EVERY_MS`] at most.
    summary: Summary,
    /// TLS failures of connections (handshakes, plain text on a TLS port).
    tls_log: LogLimiter,
    /// Refusals by identity: releases and renewals of another identity's
    /// grant, acquires outside the rules (with client certificates only).
    access_log: LogLimiter,
    /// When the lock table's walker runs next ([`Node::check_after_turn`]).
    #[cfg(debug_assertions)]
    next_table_check_ms: u64,
    /// A test's request to break an invariant once a connection has been
    /// opened ([`Node::break_invariant_after_first_connection`]).
    #[cfg(debug_assertions)]
    break_invariant: bool,
}

/// In debug builds the lock table's walker runs after a loop turn at most
/// once per `1 + entries / TABLE_CHECK_ENTRIES_PER_MS` ms, entries being
/// the locks, waiters and connection slots it visits: about 1% of a debug
/// build's time whatever the table's size, every millisecond for a small
/// table, every 16 s for a million locks.
pub const TABLE_CHECK_ENTRIES_PER_MS: usize = 64;

impl Node {
    pub fn new(now: Now, config: NodeConfig) -> Node {
        let mut engine = Engine::with_max_locks(now, &config.advertise, config.max_locks);
        let mut outbox = Outbox::new();
        let cluster = config
            .cluster
            .map(|cfg| Cluster::new(cfg, now, &mut engine, &mut outbox));
        Node {
            engine,
            outbox,
            cluster,
            remotes: Vec::new(),
            peer_only: Vec::new(),
            checked_requests: false,
            doomed: Vec::new(),
            peer_log: LogLimiter::default(),
            accept_log: LogLimiter::default(),
            stats: NodeStats::default(),
            publish: None,
            snapshot: None,
            summary: Summary {
                since_ms: now.ms,
                ..Summary::default()
            },
            tls_log: LogLimiter::default(),
            access_log: LogLimiter::default(),
            #[cfg(debug_assertions)]
            next_table_check_ms: 0,
            #[cfg(debug_assertions)]
            break_invariant: false,
        }
    }

    /// What the node has counted around the engine.
    pub fn stats(&self) -> &NodeStats {
        &self.stats
    }

    /// A loop turn took `turn` (from waking to waiting again).
    pub fn turn_ended(&mut self, turn: std::time::Duration) {
        self.stats.turn_us.record(turn.as_micros() as u64);
    }

    /// The cluster state machine, if this node has peers.
    pub fn cluster(&self) -> Option<&Cluster> {
        self.cluster.as_ref()
    }

    /// Runs the invariant walkers after a loop turn, in debug builds only
    /// (a release build does nothing here): the cluster's and the node's
    /// every turn (they are the size of the peer list), the lock table's as
    /// often as [`TABLE_CHECK_ENTRIES_PER_MS`] allows. A broken invariant
    /// panics with its message and stops the process.
    #[inline]
    pub fn check_after_turn(&mut self, now: Now) {
        #[cfg(debug_assertions)]
        self.check_sampled(now);
        #[cfg(not(debug_assertions))]
        let _ = now;
    }

    #[cfg(debug_assertions)]
    fn check_sampled(&mut self, now: Now) {
        if self.break_invariant && self.stats.conns_opened > 0 {
            self.break_invariant = false;
            self.engine.break_invariant();
        }
        if let Some(cluster) = &self.cluster {
            cluster.check_invariants(now, &self.engine);
        }
        self.check_peer_only();
        if now.ms >= self.next_table_check_ms {
            self.engine.check_invariants();
            check_outbox(&self.engine, &self.outbox);
            let entries = self.engine.walk_len();
            self.next_table_check_ms = now.ms + 1 + (entries / TABLE_CHECK_ENTRIES_PER_MS) as u64;
        }
    }

    /// For the test that proves the walkers run in a server process: once
    /// a connection has been opened, the lock table is corrupted (a free
    /// lock left in it), so that the next walk of the table panics. Debug
    /// builds only.
    #[cfg(debug_assertions)]
    #[doc(hidden)]
    pub fn break_invariant_after_first_connection(&mut self) {
        self.break_invariant = true;
    }

    fn check_peer_only(&self) {
        assert_eq!(
            self.checked_requests,
            !self.peer_only.is_empty() || self.engine.requires_identities(),
            "requests skip the checks they need"
        );
        for &(conn, _) in &self.peer_only {
            assert!(
                self.peer_only.iter().filter(|&&(c, _)| c == conn).count() == 1,
                "connection {conn} listed twice as peer-only"
            );
        }
    }

    /// Asserts the engine's and the cluster's invariants, all of them.
    pub fn check_invariants(&self, now: Now) {
        self.engine.check_invariants();
        check_outbox(&self.engine, &self.outbox);
        if let Some(cluster) = &self.cluster {
            cluster.check_invariants(now, &self.engine);
        }
        self.check_peer_only();
    }

    /// A configuration problem this node has now (a peer with another
    /// `--peers` list), if any.
    pub fn problem(&self, now: Now) -> Option<&str> {
        self.cluster.as_ref().and_then(|c| c.problem(now))
    }

    /// How long a peer link may leave data unacknowledged before it counts
    /// as failed: the peer timeout (a node without peers dials nothing).
    pub fn link_timeout(&self) -> std::time::Duration {
        let ms = self
            .cluster
            .as_ref()
            .map_or(500, |c| c.handshake_timeout_ms());
        std::time::Duration::from_millis(ms)
    }

    /// The TLS handshake of a peer link we dialed failed: counts like a
    /// wrong MAC from that peer ([`Cluster::dial_tls_failed`]).
    pub(crate) fn peer_tls_failed(&mut self, now: Now, conn: ConnId, why: &str) {
        if let Some(cluster) = &mut self.cluster {
            cluster.dial_tls_failed(now, conn, why, &mut self.engine, &mut self.outbox);
        }
    }

    /// Moves the connections the node gave up on (a peer handshake that did
    /// not finish, a follower that does not keep up, a peer-only connection
    /// that is not a peer) into `into`. Each has its `E` line at the end of
    /// its output: the loop closes it as one that broke the protocol.
    pub fn take_doomed(&mut self, now: Now, into: &mut Vec<ConnId>) {
        into.clear();
        if let Some(cluster) = &mut self.cluster {
            cluster.take_doomed(&mut self.doomed);
        }
        for (conn, reason) in std::mem::take(&mut self.doomed) {
            let remote = self.remote(conn);
            self.peer_log
                .log(now, "peer link errors", || format!("{remote}: {reason}"));
            into.push(conn);
        }
    }

    /// The engine, for inspection (tests, status).
    pub fn engine(&self) -> &Engine {
        &self.engine
    }

    /// This node's role.
    pub fn role(&self) -> Role {
        match &self.cluster {
            Some(c) => c.role(),
            None if self.engine.is_active() => Role::Active,
            None => Role::Standby { following: None },
        }
    }

    pub fn open(&mut self, conn: ConnId) {
        self.engine.open(conn, &mut self.outbox);
        self.stats.conns_opened += 1;
    }

    /// Forgets a connection (client or peer link).
    pub fn close(&mut self, now: Now, conn: ConnId) {
        self.engine.close(conn, &mut self.outbox);
        self.engine.settle(now, &mut self.outbox);
        self.stats.conns_closed += 1;
        if let Some(remote) = self.remotes.get_mut(conn.index()) {
            *remote = None;
        }
        if !self.peer_only.is_empty() {
            self.peer_only.retain(|&(c, _)| c != conn);
            self.update_checked_requests();
        }
        if let Some(cluster) = &mut self.cluster {
            cluster.on_close(now, conn, &mut self.engine, &mut self.outbox);
        }
    }

    pub fn tick(&mut self, now: Now) {
        self.summary.last_ms = now.ms;
        self.engine.tick(now, &mut self.outbox);
        if let Some(cluster) = &mut self.cluster {
            cluster.tick(now, &mut self.engine, &mut self.outbox);
            // What `H` answers until the next turn: one short line of
            // printable text whatever the problem says (addresses may hold
            // any byte a key may).
            let problem = cluster
                .problem(now)
                .map(|p| crate::proto::quoted(p.as_bytes(), MAX_PROBLEM_BYTES));
            self.engine
                .set_problem(problem.as_deref().map(str::as_bytes));
        }
        if !self.peer_only.is_empty() {
            self.expire_peer_only(now);
        }
        // A flood that stopped still gets its count logged.
        if self.peer_log.suppressed > 0 {
            self.peer_log.roll(now, "peer link errors");
        }
        if self.accept_log.suppressed > 0 {
            self.accept_log.roll(now, "failed accepts");
        }
        if self.access_log.suppressed > 0 {
            self.access_log.roll(now, "refusals by identity");
        }
        if now.ms >= self.summary.since_ms + SUMMARY_EVERY_MS {
            self.summarize(now);
        }
        if let Some(next_ms) = self.publish_owed()
            && now.ms >= next_ms
        {
            self.publish(now);
        }
    }

    /// A client request. On a connection taken beyond `--max-conns` it
    /// breaks the connection.
    pub(crate) fn handle_request(
        &mut self,
        now: Now,
        conn: ConnId,
        request: Request<'_>,
    ) -> Result<(), Refusal> {
        if self.checked_requests {
            return self.handle_checked(now, conn, request);
        }
        let result = self.engine.handle(now, conn, request, &mut self.outbox);
        if result.is_err() {
            self.stats.requests_refused += 1;
        }
        result
    }

    /// How long, at most, reads of `conn` may wait while it is busy (µs;
    /// 0: it is read as bytes arrive): a standby's link from the active it
    /// follows ([`Cluster::read_batch_us`], [`crate::read_batch`]).
    #[inline]
    pub fn read_batch_us(&self, conn: ConnId) -> u64 {
        self.cluster.as_ref().map_or(0, |c| c.read_batch_us(conn))
    }

    /// A read made in batches found bytes (counted for the metrics).
    #[inline]
    pub(crate) fn count_batched_read(&mut self) {
        self.stats.batched_reads += 1;
    }

    /// True if `conn` is a peer link (either way, authenticated or not): a
    /// line that starts with `E ` on it is the peer giving it up, not a
    /// client request.
    pub fn is_peer_link(&self, conn: ConnId) -> bool {
        self.cluster.as_ref().is_some_and(|c| c.is_peer_link(conn))
    }

    /// A peer line (`P ...`), or an `E` line on our link to a peer. `Err`
    /// breaks the connection with that reason (logged, rate-limited).
    pub(crate) fn handle_peer_line(
        &mut self,
        now: Now,
        conn: ConnId,
        line: &[u8],
    ) -> Result<(), PeerError> {
        let Some(cluster) = &mut self.cluster else {
            return Err(Unexpected::NotClustered.into());
        };
        let result = if line.starts_with(b"E ") {
            cluster.on_refusal(now, conn, line)
        } else {
            wire::parse(line).map_err(PeerError::from).and_then(|msg| {
                cluster.on_message(now, conn, msg, &mut self.engine, &mut self.outbox)
            })
        };
        if let Err(error) = &result {
            // Loud: between nodes this means a misconfigured cluster or a
            // stranger; rate-limited, so a flood cannot fill the log.
            let remote = self.remote(conn);
            self.peer_log.log(now, "peer link errors", || {
                format!("peer link with {remote} broken: {}", error.reason())
            });
        }
        result
    }

    /// A line on `conn` longer than any line may be: it broke the protocol
    /// before it could be read (`reason` says so). Counted like any
    /// protocol error; on a peer link also logged, rate-limited, as a peer
    /// line's error is, since the link's close alone would not say why.
    pub(crate) fn line_too_long(&mut self, now: Now, conn: ConnId, reason: &str) {
        self.protocol_error();
        if self.is_peer_link(conn) {
            let remote = self.remote(conn);
            self.peer_log.log(now, "peer link errors", || {
                format!("peer link with {remote} broken: {reason}")
            });
        }
    }

    /// Collects the connections with output: peer links first, then
    /// clients in the order they were answered; returns how many are
    /// links. With peers, this turn's replication is written first, so
    /// that it goes out in the same send. A loop writes the links before
    /// any client (of this list or of its own), so that no answer reaches
    /// the kernel before the replication of what it answers.
    pub fn take_dirty(&mut self, now: Now, into: &mut Vec<ConnId>) -> usize {
        if let Some(cluster) = &mut self.cluster {
            cluster.flush_replication(now, &mut self.engine, &mut self.outbox);
        }
        self.outbox.take_dirty(into)
    }

    /// The output waiting for `conn` ([`Outbox::output_mut`]): the loop
    /// takes what it sends from the front, or swaps the buffer out.
    pub fn output_mut(&mut self, conn: ConnId) -> &mut Vec<u8> {
        self.outbox.output_mut(conn)
    }

    /// Every connection's unsent output: how much waits for `conn`
    /// ([`Outbox::len`]), as [`crate::lifecycle::Lifecycle::wants_read`]
    /// asks.
    pub fn outbox(&self) -> &Outbox {
        &self.outbox
    }

    /// When the loop must turn again: the earliest timer of the engine,
    /// the cluster or a peer-only connection, or 0 (now) while answers
    /// wait that the loop has not collected ([`Node::take_dirty`]). Work
    /// done after the loop collected its turn's answers (input kept back by
    /// a pause, handled as the answers are sent; a link closed after the
    /// collection) can answer other connections; without this the loop
    /// would sleep and those answers would wait for an unrelated event, a
    /// grant perhaps until after its lease.
    pub fn next_deadline(&self) -> Option<u64> {
        if self.outbox.has_uncollected() {
            return Some(0);
        }
        let engine = self.engine.next_deadline();
        let cluster = self.cluster.as_ref().map(Cluster::next_deadline);
        // A summary is owed only when something was refused or broke.
        let summary = self
            .summary_owed()
            .then_some(self.summary.since_ms + SUMMARY_EVERY_MS);
        engine
            .into_iter()
            .chain(cluster)
            .chain(self.peer_only_deadline())
            .chain(summary)
            .chain(self.publish_owed())
            .min()
    }

    /// Peers to dial now, `(index, address)`.
    pub fn take_dials(&mut self, now: Now, into: &mut Vec<(PeerId, String)>) {
        if let Some(cluster) = &mut self.cluster {
            cluster.take_dials(now, into);
        }
    }

    pub fn dial_failed(&mut self, now: Now, peer: PeerId) {
        if let Some(cluster) = &mut self.cluster {
            cluster.dial_failed(peer, now);
        }
    }

    /// A dial to `peer` succeeded as connection `conn` (not yet opened).
    pub fn outbound_open(&mut self, now: Now, conn: ConnId, peer: PeerId) {
        self.engine.open(conn, &mut self.outbox);
        self.stats.conns_opened += 1;
        if let Some(cluster) = &mut self.cluster {
            cluster.outbound_open(now, conn, peer, &mut self.outbox);
        }
    }

    /// SIGINT/SIGTERM: an active node with a live peer hands over to it;
    /// then every waiting acquire is answered `M` naming the successor (`-`
    /// without one). Returns the successor's address, if any.
    pub fn leave(&mut self, now: Now) -> Option<String> {
        let successor = self.cluster.as_mut().and_then(|c| {
            let to = c.leave(now, &mut self.engine, &mut self.outbox)?;
            Some(c.peer_addr(to).to_string())
        });
        self.engine
            .step_down(successor.as_deref(), &mut self.outbox);
        if let Some(cluster) = &mut self.cluster {
            // The hand-off and the last deltas go out with this turn's sends.
            cluster.flush_replication(now, &mut self.engine, &mut self.outbox);
        }
        match &successor {
            Some(to) => {
                tracing::info!(target: LOG_TARGET, to = %to, "leaving: handed the active role to {to}")
            }
            None if self.cluster.is_some() => {
                tracing::info!(
                    target: LOG_TARGET, "leaving: this node steps down (it was not active, or no peer could take over)"
                )
            }
            None => {}
        }
        if self.publish.is_some() {
            // /ready says "shutting down" at once.
            self.publish(now);
        }
        successor
    }
}

/// Checks that the outbox and the engine agree on which connections are
/// open (both open and close them in [`Engine::open`] and [`Engine::close`]),
/// and that a closed connection keeps no output: the node's walkers, and
/// the engine's tests with their own outbox.
pub(crate) fn check_outbox(engine: &Engine, outbox: &Outbox) {
    outbox.check_invariants();
    for c in 0..engine.conn_slots().max(outbox.slots()) {
        let c = ConnId::from_index(c);
        assert_eq!(
            engine.is_open(c),
            outbox.is_open(c),
            "connection {c} and its output"
        );
    }
}

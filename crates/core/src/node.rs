//! A node: the engine plus, with peers, the cluster state machine. This is
//! what the I/O loops drive; it is sans-I/O like both of its parts.
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

use std::net::SocketAddr;

use crate::cluster::{Cluster, ClusterConfig, PeerError, Role, Unexpected, wire};
use crate::engine::{ConnId, Engine, Now, Refusal};
use crate::outbox::Outbox;
use crate::proto::Request;
use crate::stats::{Follower, NodeStats, PUBLISH_EVERY_MS, Snapshot};

/// The target of this module's log lines: the name it had before the core
/// became a crate of its own, which `RUST_LOG` filters name.
const LOG_TARGET: &str = "ringlock::node";

/// The longest problem text an `H` answer carries (more is cut, with
/// `...`): the answer stays one short line for any client.
pub const MAX_PROBLEM_BYTES: usize = 400;

/// What a loop does with a connection it just accepted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admission {
    /// Below `--max-conns`: a client (or a peer) like any other.
    Client,
    /// Beyond `--max-conns`, within the peers' reserve: it may only become
    /// a peer link ([`Node::open_peer_only`]).
    PeerOnly,
    /// Closed at once.
    Refuse,
}

/// At most [`LogLimiter::BURST`] lines per [`LogLimiter::WINDOW_MS`]; the
/// rest are counted and the count is logged when the window ends, so that a
/// flood of bad links cannot fill the log.
#[derive(Debug, Default)]
struct LogLimiter {
    window_start_ms: u64,
    logged: u32,
    suppressed: u64,
}

impl LogLimiter {
    const BURST: u32 = 5;
    const WINDOW_MS: u64 = 10_000;

    fn log(&mut self, now: Now, what: &str, line: impl FnOnce() -> String) {
        self.roll(now, what);
        if self.logged < Self::BURST {
            self.logged += 1;
            tracing::warn!(target: LOG_TARGET, "{}", line());
        } else {
            self.suppressed += 1;
        }
    }

    /// Ends the window if it is over, logging how many lines it held back.
    fn roll(&mut self, now: Now, what: &str) {
        if now.ms >= self.window_start_ms + Self::WINDOW_MS {
            if self.suppressed > 0 {
                tracing::warn!(
                    target: LOG_TARGET, "{} more {what} in the last {} s not shown",
                    self.suppressed,
                    Self::WINDOW_MS / 1000
                );
            }
            self.window_start_ms = now.ms;
            self.logged = 0;
            self.suppressed = 0;
        }
    }
}

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

/// How often, at most, refused connections and protocol errors are summed
/// up in the log.
pub(crate) const SUMMARY_EVERY_MS: u64 = 10_000;

#[derive(Debug, Default)]
struct Summary {
    /// When the current window started.
    since_ms: u64,
    /// The counts logged so far.
    refused: u64,
    refused_requests: u64,
    errors: u64,
    /// The last turn's time: what the summary owed at exit is dated by.
    last_ms: u64,
}

/// Publishing the counters to the metrics listener's thread.
struct Publish {
    next_ms: u64,
    /// [`Node::activity`] when last published: nothing to publish while it
    /// has not moved (a cluster publishes every time: its heartbeats wake
    /// the loop anyway, and its gauges move without requests).
    activity: u64,
    published: bool,
}

impl Node {
    pub fn new(now: Now, config: NodeConfig) -> Node {
        let mut engine = Engine::with_max_locks(now, &config.advertise, config.max_locks);
        let cluster = config
            .cluster
            .map(|cfg| Cluster::new(cfg, now, &mut engine));
        Node {
            engine,
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

    /// Publishes the counters from now on, at most every
    /// [`PUBLISH_EVERY_MS`] and only when something moved: a snapshot for
    /// the loop to hand to the metrics listener ([`Node::take_snapshot`]).
    pub fn publish_metrics(&mut self) {
        self.publish = Some(Publish {
            next_ms: 0,
            activity: 0,
            published: false,
        });
    }

    /// What the node has counted around the engine.
    pub fn stats(&self) -> &NodeStats {
        &self.stats
    }

    /// A loop turn took `turn` (from waking to waiting again).
    pub fn turn_ended(&mut self, turn: std::time::Duration) {
        self.stats.turn_us.record(turn.as_micros() as u64);
    }

    /// A sum that moves whenever a published number may have: requests,
    /// timers, connections.
    fn activity(&self) -> u64 {
        let e = self.engine.stats();
        let n = &self.stats;
        e.granted_now
            .wrapping_add(e.wait_ms.count())
            .wrapping_add(e.timed_out)
            .wrapping_add(e.redirected)
            .wrapping_add(e.withdrawn)
            .wrapping_add(e.hold.count())
            .wrapping_add(e.release_stale)
            .wrapping_add(e.renewed)
            .wrapping_add(e.renew_stale)
            .wrapping_add(e.release_not_holder)
            .wrapping_add(e.renew_not_holder)
            .wrapping_add(e.status)
            .wrapping_add(e.lease_expiries)
            .wrapping_add(n.conns_opened)
            .wrapping_add(n.conns_closed)
            .wrapping_add(n.conns_refused)
            .wrapping_add(n.conns_failed)
            .wrapping_add(n.requests_refused)
            .wrapping_add(n.protocol_errors)
    }

    /// Whether a publish is owed: something moved since the last one.
    fn publish_owed(&self) -> Option<u64> {
        let p = self.publish.as_ref()?;
        let owed = !p.published || self.cluster.is_some() || p.activity != self.activity();
        owed.then_some(p.next_ms)
    }

    /// The snapshot published since the last call, if any: the loop hands
    /// it to the metrics listener at the end of its turn.
    pub fn take_snapshot(&mut self) -> Option<Snapshot> {
        self.snapshot.take()
    }

    /// The numbers of the moment, as the metrics listener serves them.
    pub fn snapshot(&self) -> Snapshot {
        let engine = &self.engine;
        let cluster = self.cluster.as_ref();
        let followers = cluster
            .map(|c| {
                c.followers()
                    .map(|(addr, conn, stats)| Follower {
                        addr: addr.to_string(),
                        queued_bytes: engine.outbox().len(conn) as u64,
                        stats: *stats,
                    })
                    .collect()
            })
            .unwrap_or_default();
        let active = self.role() == Role::Active;
        Snapshot {
            published: true,
            engine: *engine.stats(),
            node: self.stats,
            cluster: cluster.map(|c| *c.stats()).unwrap_or_default(),
            clustered: cluster.is_some(),
            active,
            ready: match cluster {
                Some(c) => c.is_ready(),
                None => active,
            },
            leaving: cluster.is_some_and(|c| c.is_leaving()) || (cluster.is_none() && !active),
            published_at: None,
            // A clustered loop turns at least every heartbeat and publishes
            // every turn (at most every PUBLISH_EVERY_MS): silence past two
            // peer timeouts means it stopped, and its peers took over.
            stale_after: cluster.map(|c| {
                std::time::Duration::from_millis(2 * c.handshake_timeout_ms() + PUBLISH_EVERY_MS)
            }),
            highest_token: engine.highest_token(),
            locks: engine.lock_count() as u64,
            waiters: engine.waiter_count() as u64,
            shared_held: engine.shared_count() as u64,
            permits_held: engine.permit_count() as u64,
            peers_up: cluster.map_or(0, |c| c.peers_up() as u64),
            followers,
        }
    }

    fn publish(&mut self, now: Now) {
        let snapshot = self.snapshot();
        let activity = self.activity();
        if let Some(p) = &mut self.publish {
            self.snapshot = Some(snapshot);
            p.next_ms = now.ms + PUBLISH_EVERY_MS;
            p.activity = activity;
            p.published = true;
        }
    }

    /// Logs how many connections were refused and how many broke the
    /// protocol since the last summary, once per [`SUMMARY_EVERY_MS`] at
    /// most, and only if there were any.
    #[cold]
    fn summarize(&mut self, now: Now) {
        let s = &mut self.summary;
        let refused = self.stats.conns_refused.saturating_sub(s.refused);
        let refused_requests = self
            .stats
            .requests_refused
            .saturating_sub(s.refused_requests);
        let errors = self.stats.protocol_errors.saturating_sub(s.errors);
        let secs = now.ms.saturating_sub(s.since_ms).div_ceil(1000);
        if let Some(line) = summary_line(secs, refused, refused_requests, errors) {
            tracing::warn!(target: LOG_TARGET, "{line}");
        }
        s.since_ms = now.ms;
        s.refused = self.stats.conns_refused;
        s.refused_requests = self.stats.requests_refused;
        s.errors = self.stats.protocol_errors;
    }

    /// The loop failed to accept a connection (out of descriptors or
    /// memory): logged, rate-limited, since every client that connects
    /// meanwhile fails the same way.
    #[cold]
    pub fn accept_failed(&mut self, now: Now, error: &std::io::Error) {
        self.accept_log.log(now, "failed accepts", || {
            format!("accept: {error} (connections wait in the listen backlog; see ulimit -n and --max-conns)")
        });
    }

    /// What is owed to the summary (counts since the last one), at exit:
    /// errors just before a shutdown are summed up too.
    fn summary_owed(&self) -> bool {
        self.stats.conns_refused != self.summary.refused
            || self.stats.requests_refused != self.summary.refused_requests
            || self.stats.protocol_errors != self.summary.errors
    }

    /// A socket accepted or dialed could not be set up (an option, its
    /// registration with the kernel, TLS): the loop dropped it. Counted,
    /// and logged rate-limited, since a client may cause it at the rate it
    /// connects.
    #[cold]
    pub fn setup_failed(&mut self, now: Now, what: &str, error: &dyn std::fmt::Display) {
        self.stats.conns_failed += 1;
        self.accept_log.log(now, "failed accepts", || {
            format!("a new connection was dropped: {what}: {error}")
        });
    }

    /// A line that broke the protocol: counted (and summed up in the log).
    pub(crate) fn protocol_error(&mut self) {
        self.stats.protocol_errors += 1;
    }

    /// The TLS handshake of a peer link we dialed failed: counts like a
    /// wrong MAC from that peer ([`Cluster::dial_tls_failed`]).
    pub(crate) fn peer_tls_failed(&mut self, now: Now, conn: ConnId, why: &str) {
        if let Some(cluster) = &mut self.cluster {
            cluster.dial_tls_failed(now, conn, why, &mut self.engine);
        }
    }

    /// Logs why a TLS connection failed, with its remote address
    /// (rate-limited, so a flood of bad handshakes cannot fill the log).
    pub(crate) fn tls_log(&mut self, now: Now, conn: ConnId, why: impl FnOnce() -> String) {
        let remote = self.remote(conn);
        self.tls_log.log(now, "TLS failures", || {
            format!("TLS connection with {remote} closed: {}", why())
        });
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

    /// Whether to take a connection just accepted when `open_conns`
    /// connections (clients, peer links, closing ones) are open.
    pub fn admit(&mut self, open_conns: usize, max_conns: usize) -> Admission {
        let (links, reserve) = self
            .cluster
            .as_ref()
            .map_or((0, 0), |c| (c.link_count(), c.link_reserve()));
        if open_conns.saturating_sub(links) < max_conns {
            Admission::Client
        } else if open_conns < max_conns + reserve {
            Admission::PeerOnly
        } else {
            self.stats.conns_refused += 1;
            Admission::Refuse
        }
    }

    /// Opens a connection taken beyond `--max-conns` ([`Admission::PeerOnly`]):
    /// unless it is an authenticated peer link within a peer timeout, it is
    /// closed, and a client request on it is refused.
    pub fn open_peer_only(&mut self, now: Now, conn: ConnId) {
        self.engine.open(conn);
        self.stats.conns_opened += 1;
        let timeout = self
            .cluster
            .as_ref()
            .map_or(0, |c| c.handshake_timeout_ms());
        self.peer_only.push((conn, now.ms + timeout));
        self.update_checked_requests();
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

    /// Remembers where `conn` comes from, for the log lines about it and
    /// for the holder of its grants.
    pub fn set_remote(&mut self, conn: ConnId, remote: SocketAddr) {
        let i = conn as usize;
        if self.remotes.len() <= i {
            self.remotes.resize(i + 1, None);
        }
        self.remotes[i] = Some(remote);
        // What `W` and `Q` name as the holder of its grants.
        self.engine.set_remote(conn, remote);
    }

    fn remote(&self, conn: ConnId) -> String {
        match self.remotes.get(conn as usize).copied().flatten() {
            Some(addr) => addr.to_string(),
            None => format!("connection {conn}"),
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
        self.engine.open(conn);
        self.stats.conns_opened += 1;
    }

    /// Forgets a connection (client or peer link).
    pub fn close(&mut self, now: Now, conn: ConnId) {
        self.engine.close(conn);
        self.engine.settle(now);
        self.stats.conns_closed += 1;
        if let Some(remote) = self.remotes.get_mut(conn as usize) {
            *remote = None;
        }
        if !self.peer_only.is_empty() {
            self.peer_only.retain(|&(c, _)| c != conn);
            self.update_checked_requests();
        }
        if let Some(cluster) = &mut self.cluster {
            cluster.on_close(now, conn, &mut self.engine);
        }
    }

    pub fn tick(&mut self, now: Now) {
        self.summary.last_ms = now.ms;
        self.engine.tick(now);
        if let Some(cluster) = &mut self.cluster {
            cluster.tick(now, &mut self.engine);
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

    /// Peer-only connections past their deadline: kept if they became
    /// authenticated peer links, closed otherwise.
    fn expire_peer_only(&mut self, now: Now) {
        let cluster = self.cluster.as_ref();
        let mut expired = Vec::new();
        self.peer_only.retain(|&(conn, deadline_ms)| {
            if now.ms < deadline_ms {
                return true;
            }
            if !cluster.is_some_and(|c| c.is_authenticated_in(conn)) {
                expired.push(conn);
            }
            false
        });
        self.update_checked_requests();
        for conn in expired {
            let reason = "too many connections: a connection beyond --max-conns must be a peer";
            self.refuse_peer_only(conn, reason);
        }
    }

    fn refuse_peer_only(&mut self, conn: ConnId, reason: &str) {
        crate::proto::Answer::Error {
            reason: reason.as_bytes(),
        }
        .encode(self.engine.output_mut(conn));
        self.doomed.push((conn, reason.into()));
    }

    /// The earliest peer-only deadline.
    fn peer_only_deadline(&self) -> Option<u64> {
        self.peer_only.iter().map(|&(_, d)| d).min()
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
        let result = self.engine.handle(now, conn, request);
        if result.is_err() {
            self.stats.requests_refused += 1;
        }
        result
    }

    /// [`Node::handle_request`] while some connection is peer-only or on a
    /// node with client identities ([`Node::checked_requests`]).
    #[cold]
    #[inline(never)]
    fn handle_checked(
        &mut self,
        now: Now,
        conn: ConnId,
        request: Request<'_>,
    ) -> Result<(), Refusal> {
        if self.peer_only.iter().any(|&(c, _)| c == conn) {
            self.stats.requests_refused += 1;
            return Err(Refusal::TooManyConns);
        }
        if self.engine.requires_identities() {
            return self.handle_identified(now, conn, request);
        }
        let result = self.engine.handle(now, conn, request);
        if result.is_err() {
            self.stats.requests_refused += 1;
        }
        result
    }

    /// Whether requests need [`Node::handle_checked`]: kept current as
    /// peer-only connections come and go.
    fn update_checked_requests(&mut self) {
        self.checked_requests = !self.peer_only.is_empty() || self.engine.requires_identities();
    }

    /// [`Node::handle_request`] on a node with client identities: the same,
    /// and a refusal by identity is logged (rate-limited).
    fn handle_identified(
        &mut self,
        now: Now,
        conn: ConnId,
        request: Request<'_>,
    ) -> Result<(), Refusal> {
        let not_holder = |e: &crate::engine::stats::EngineStats| {
            e.release_not_holder.wrapping_add(e.renew_not_holder)
        };
        let before = not_holder(self.engine.stats());
        let result = self.engine.handle(now, conn, request);
        let refused_not_holder = not_holder(self.engine.stats()) != before;
        if refused_not_holder || result == Err(Refusal::NotAllowed) {
            let remote = self.remote(conn);
            let who = self.engine.identity_of(conn).map_or_else(
                || "(no identity)".to_string(),
                |id| format!("identity \"{}\"", crate::proto::Quoted(id)),
            );
            let what = match (&result, request.key()) {
                (Err(Refusal::NotAllowed), _) => self.engine.not_allowed_reason().to_string(),
                (Err(refusal), _) => refusal.to_string(),
                (Ok(()), Some(key)) => format!(
                    "{} of \"{}\" refused: the grant is another identity's",
                    if matches!(request, Request::Release { .. }) {
                        "release"
                    } else {
                        "renewal"
                    },
                    crate::proto::Quoted(key)
                ),
                (Ok(()), None) => "refused".to_string(),
            };
            self.access_log.log(now, "refusals by identity", || {
                format!("{who} at {remote}: {what}")
            });
        }
        if result.is_err() {
            self.stats.requests_refused += 1;
        }
        result
    }

    /// A node with client certificates (`--tls-client-ca`): grants are
    /// released and renewed by their holder's identity (or an admin) only,
    /// and each connection's identity is given by [`Node::set_access`].
    pub fn require_identities(&mut self) {
        self.engine.require_identities();
        self.update_checked_requests();
    }

    /// The words of an `E` line for `refusal` (the node's own for a refusal
    /// by identity, which names the identity and the key).
    pub(crate) fn refusal_reason(&self, refusal: Refusal) -> String {
        match refusal {
            Refusal::NotAllowed | Refusal::Semaphore => {
                self.engine.not_allowed_reason().to_string()
            }
            other => other.to_string(),
        }
    }

    /// Gives `conn` its identity and what the rules allow it (its TLS
    /// handshake just ended). A node with identities only.
    pub(crate) fn set_access(
        &mut self,
        conn: ConnId,
        access: std::sync::Arc<crate::access::Access>,
    ) {
        self.engine.set_access(conn, access);
    }

    /// Logs that a connection was refused for its certificate's identity
    /// (rate-limited).
    pub(crate) fn identity_refused(&mut self, now: Now, conn: ConnId, why: &str) {
        let remote = self.remote(conn);
        self.access_log.log(now, "refusals by identity", || {
            format!("connection with {remote} refused: {why}")
        });
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
            wire::parse(line)
                .map_err(PeerError::from)
                .and_then(|msg| cluster.on_message(now, conn, msg, &mut self.engine))
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

    /// Collects the connections with output: peer links first, then
    /// clients in the order they were answered; returns how many are
    /// links. With peers, this turn's replication is written first, so
    /// that it goes out in the same send. A loop writes the links before
    /// any client (of this list or of its own), so that no answer reaches
    /// the kernel before the replication of what it answers.
    pub fn take_dirty(&mut self, now: Now, into: &mut Vec<ConnId>) -> usize {
        if let Some(cluster) = &mut self.cluster {
            cluster.flush_replication(now, &mut self.engine);
        }
        self.engine.take_dirty(into)
    }

    pub fn output_mut(&mut self, conn: ConnId) -> &mut Vec<u8> {
        self.engine.output_mut(conn)
    }

    /// Every connection's unsent output: how much waits for `conn`
    /// ([`Outbox::len`]), as [`crate::lifecycle::Lifecycle::wants_read`]
    /// asks.
    pub fn outbox(&self) -> &Outbox {
        self.engine.outbox()
    }

    /// True if the loop sends this turn's output of `conn` with
    /// `MSG_MORE` (replication held back to coalesce: see
    /// [`Cluster::sends_more`]); false for every client connection.
    #[inline]
    pub fn sends_more(&self, conn: ConnId) -> bool {
        self.cluster.as_ref().is_some_and(|c| c.sends_more(conn))
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
        if self.engine.outbox().has_uncollected() {
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
    pub fn take_dials(&mut self, now: Now, into: &mut Vec<(usize, String)>) {
        if let Some(cluster) = &mut self.cluster {
            cluster.take_dials(now, into);
        }
    }

    pub fn dial_failed(&mut self, now: Now, peer: usize) {
        if let Some(cluster) = &mut self.cluster {
            cluster.dial_failed(peer, now);
        }
    }

    /// A dial to `peer` succeeded as connection `conn` (not yet opened).
    pub fn outbound_open(&mut self, now: Now, conn: ConnId, peer: usize) {
        self.engine.open(conn);
        self.stats.conns_opened += 1;
        if let Some(cluster) = &mut self.cluster {
            cluster.outbound_open(now, conn, peer, &mut self.engine);
        }
    }

    /// SIGINT/SIGTERM: an active node with a live peer hands over to it;
    /// then every waiting acquire is answered `M` naming the successor (`-`
    /// without one). Returns the successor's address, if any.
    pub fn leave(&mut self, now: Now) -> Option<String> {
        let successor = self.cluster.as_mut().and_then(|c| {
            let to = c.leave(now, &mut self.engine)?;
            Some(c.peer_addr(to).to_string())
        });
        self.engine.step_down(successor.as_deref());
        if let Some(cluster) = &mut self.cluster {
            // The hand-off and the last deltas go out with this turn's sends.
            cluster.flush_replication(now, &mut self.engine);
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

/// The loop drops the node when it stops: what was refused or broke since
/// the last summary (say in the shutdown's last seconds) is logged then,
/// not lost.
impl Drop for Node {
    fn drop(&mut self) {
        if self.summary_owed() {
            let now = Now {
                ms: self.summary.last_ms.max(self.summary.since_ms),
                us: self.summary.last_ms.max(self.summary.since_ms) * 1000,
                unix_ns: 0,
            };
            self.summarize(now);
        }
    }
}

/// The summary's line: each count that is not zero, once, in words
/// ("1 connection refused (--max-conns), 2 requests refused"); `None` when
/// every count is zero.
fn summary_line(secs: u64, refused: u64, refused_requests: u64, errors: u64) -> Option<String> {
    let plural = |n: u64, one: &str, many: &str| format!("{n} {}", if n == 1 { one } else { many });
    let parts: Vec<String> = [
        (refused > 0)
            .then(|| plural(refused, "connection", "connections") + " refused (--max-conns)"),
        (refused_requests > 0)
            .then(|| plural(refused_requests, "request", "requests") + " refused"),
        (errors > 0).then(|| {
            plural(errors, "connection", "connections") + " broke the protocol (answered E, closed)"
        }),
    ]
    .into_iter()
    .flatten()
    .collect();
    (!parts.is_empty()).then(|| {
        let s = if secs == 1 { "" } else { "s" };
        format!("in the last {secs} second{s}: {}", parts.join(", "))
    })
}

#[cfg(test)]
mod tests {
    use super::summary_line;

    #[test]
    fn the_summary_says_each_count_once_in_words() {
        assert_eq!(summary_line(10, 0, 0, 0), None);
        assert_eq!(
            summary_line(10, 0, 0, 1).as_deref(),
            Some("in the last 10 seconds: 1 connection broke the protocol (answered E, closed)")
        );
        assert_eq!(
            summary_line(1, 2, 1, 3).as_deref(),
            Some(
                "in the last 1 second: 2 connections refused (--max-conns), 1 request refused, \
                 3 connections broke the protocol (answered E, closed)"
            )
        );
    }
}

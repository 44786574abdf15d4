//! The cluster: priority-ordered active/standby nodes, sans-I/O.
//!
//! Every node runs the same rule over what it hears from its peers (see
//! docs/cluster.md for the whole story):
//!
//! - A peer is alive while its heartbeats keep coming (every
//!   `heartbeat_ms`, dead after `peer_timeout_ms` of silence, or at once when
//!   all its links to us close).
//! - A standby follows the highest-priority alive peer that claims to be
//!   active. With no active alive, the highest-priority alive node becomes
//!   active, but only after one `peer_timeout_ms` from its own start, so that
//!   a restarted node hears an existing active before it decides anything,
//!   and not while a live peer still follows an active (then only our path
//!   from that active is broken; our `M` answers name it).
//! - An active that hears an active that outranks it steps down (demotion
//!   after a split brain) and sends it every grant it holds to merge
//!   (`MERGE` ... `MERGED`, [`crate::engine::merge`]); one that sees a
//!   higher-priority peer following it with a complete snapshot hands the
//!   role over to it (failback). Of two
//!   actives, one that holds the cluster's state outranks one that does
//!   not (a node that started cut off from every peer and took the role
//!   with an empty table); between two alike, the higher priority wins. A
//!   standby follows the active that outranks the others.
//! - The active replicates every change of its table to the peers that
//!   follow it: a snapshot first on each link, then the deltas of each loop
//!   turn in one write.
//! - Every heartbeat carries the sender's highest token, and every node
//!   observes it: whoever becomes active issues tokens above everything it
//!   has heard of.
//!
//! Links are one-directional: each node dials every other node and only
//! sends its state on the connection it dialed, so "what I hear from p" and
//! "what I send to p" are separate connections with separate lives.
//!
//! Every link is authenticated before anything on it is believed or sent
//! ([`auth`]): until the dialer has checked the acceptor's `CHALLENGE` it
//! sends nothing but its `HELLO`; until the acceptor has checked the
//! dialer's `AUTH` it believes nothing the link says and sends nothing but
//! its `CHALLENGE`. A link whose handshake does not finish within
//! `peer_timeout_ms` is closed. An authenticated peer whose configuration
//! differs (another peer list, order or index) is a *conflict*: its link is
//! refused on both sides, it counts for nothing in role decisions, and while
//! the conflict lasts a node whose fingerprint is not the lowest of the two
//! does not serve, so two nodes with different lists are never both active.

pub mod auth;
mod error;
mod handshake;
mod invariants;
mod links;
mod messages;
mod out_link;
mod replication;
mod role;
pub mod wire;

pub use error::{PeerError, Unexpected};

use std::collections::HashMap;

use crate::engine::{ConnId, Engine, Now, ReplicationLog};
use crate::outbox::Outbox;
use crate::proto::Quoted;
use crate::stats::{ClusterStats, FollowerStats};
use auth::{Fingerprint, Identity, Nonce, Secret, Side, Transcript};
use out_link::OutLink;
use replication::OLD_VERSIONS;
use wire::PeerMsg;

/// The target of this module's log lines: the name it had before the core
/// became a crate of its own, which `RUST_LOG` filters name.
const LOG_TARGET: &str = "ringlock::cluster";

/// Unsent bytes on a link past which heartbeats are not queued on it.
pub const HEARTBEAT_BACKLOG_BYTES: usize = 64 * 1024;

/// Replication a follower may have unread beyond the last snapshot queued
/// for it. Past it the link is closed: the follower resyncs from a fresh
/// snapshot once it is redialled, and the active's memory stays bounded.
pub(crate) const REPLICATION_BACKLOG_BYTES: usize = 32 * 1024 * 1024;

/// Inbound handshakes in progress at once; one more `HELLO` is refused, so
/// strangers cannot make a node keep state for every connection.
pub(crate) const MAX_PENDING_HANDSHAKES: usize = 64;

/// Configuration conflicts remembered at once (the newest are kept).
const MAX_CONFLICTS: usize = 16;

/// How a planned hand-off's reason begins (`hand-off to X`): the log says
/// it at INFO, an unplanned step-down at WARN.
const HAND_OFF: &str = "hand-off to";

/// The default [`ClusterConfig::failback_delay_ms`]: more than the
/// official clients' background redial interval (3 s) plus their
/// handshake, so that they have a connection to a returning node before it
/// takes the role back.
pub const DEFAULT_FAILBACK_DELAY_MS: u64 = 5_000;

/// The largest [`ClusterConfig::failback_delay_ms`] (10 minutes).
pub const MAX_FAILBACK_DELAY_MS: u64 = 600_000;

/// How soon a failed dial is retried, at most (see [`Cluster::dial_retry_ms`]).
pub(crate) const DIAL_RETRY_MS: u64 = 100;

/// How often, at most, an active sends a follower a replication lag probe
/// (`P PROBE`): a hundred a second, one line each way, whatever the load.
pub const PROBE_EVERY_MS: u64 = 10;

/// Cluster settings; every node of a cluster gets the same `peers`.
#[derive(Debug, Clone)]
pub struct ClusterConfig {
    /// Every node's address in priority order, first highest.
    pub peers: Vec<String>,
    /// This node's index in `peers`.
    pub me: PeerId,
    pub heartbeat_ms: u64,
    pub peer_timeout_ms: u64,
    /// How long a returning higher-priority node must have been synced to
    /// this active, and linked without a break, before the active hands it
    /// the role back (0: at once). Long enough for clients to have a
    /// connection to it by then. Each active decides by its own setting:
    /// nodes may differ.
    pub failback_delay_ms: u64,
    /// Random per process start: lets peers tell a restart from a reconnect.
    pub incarnation: u64,
    /// The cluster's shared secret: every peer link proves it both ways.
    pub secret: Secret,
    /// How long, at most, a standby's reads of its active's link wait while
    /// the link is busy (µs; 0: every arrival is read at once): see
    /// [`crate::read_batch`]. At most [`MAX_READ_BATCH_US`], and at most a
    /// [`READ_BATCHES_PER_PEER_TIMEOUT`]th of the peer timeout.
    pub read_batch_us: u64,
}

/// The default and the longest [`ClusterConfig::read_batch_us`].
pub const DEFAULT_READ_BATCH_US: u64 = 500;
pub const MAX_READ_BATCH_US: u64 = 2_000;

/// A peer timeout is at least this many [`ClusterConfig::read_batch_us`]
/// long: a batched link's bytes never wait unread near as long as a peer
/// may be silent before it counts as dead.
pub const READ_BATCHES_PER_PEER_TIMEOUT: u64 = 50;

/// A node's index in the `--peers` list: its identity within the cluster
/// and its priority (0 is the highest).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct PeerId(pub usize);

impl PeerId {
    /// The ids of a cluster of `n` nodes, in priority order.
    pub fn all(n: usize) -> impl DoubleEndedIterator<Item = PeerId> + Clone {
        (0..n).map(PeerId)
    }
}

impl std::fmt::Display for PeerId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

/// What we know of each peer, by id.
impl std::ops::Index<PeerId> for Vec<Peer> {
    type Output = Peer;
    fn index(&self, id: PeerId) -> &Peer {
        &self[id.0]
    }
}

impl std::ops::IndexMut<PeerId> for Vec<Peer> {
    fn index_mut(&mut self, id: PeerId) -> &mut Peer {
        &mut self[id.0]
    }
}

/// A peer's address in `--peers`, by id.
impl std::ops::Index<PeerId> for Vec<String> {
    type Output = String;
    fn index(&self, id: PeerId) -> &String {
        &self[id.0]
    }
}

/// Each of `items` (one per peer) with its peer's id.
fn with_ids<T>(items: &[T]) -> impl DoubleEndedIterator<Item = (PeerId, &T)> {
    items.iter().enumerate().map(|(i, x)| (PeerId(i), x))
}

/// [`with_ids`], mutably.
fn with_ids_mut<T>(items: &mut [T]) -> impl DoubleEndedIterator<Item = (PeerId, &mut T)> {
    items.iter_mut().enumerate().map(|(i, x)| (PeerId(i), x))
}

/// This node's role.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    Active,
    /// Following the active `following` (None: no active known).
    Standby {
        following: Option<PeerId>,
    },
}

/// What this node knows of one peer.
/// How a peer that does not hear our link shows it, while we are active
/// ([`Cluster::redial_deaf_peers`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Deafness {
    /// It claims the role although we outrank it.
    Rival,
    /// A standby that follows no active.
    FollowsNobody,
}

#[derive(Debug, Default, Clone)]
struct Peer {
    /// Our link to it (we send on it).
    out: OutLink,
    /// The size of the last snapshot queued on our link: what it may have
    /// unread beyond [`REPLICATION_BACKLOG_BYTES`].
    snapshot_bytes: usize,
    /// Our link carries a snapshot from us (sent while we were active).
    snapshot_sent: bool,
    /// The peer protocol version our link speaks (its `HELLO`'s).
    out_version: u64,
    /// The version to dial it with (0: [`wire::VERSION`]): one less than
    /// a version it refused, raised again by its own authenticated `HELLO`
    /// with a newer one.
    dial_version: u64,
    /// Its authenticated links to us that are open.
    links_in: u32,
    incarnation: u64,
    /// When we last heard from it; None: dead.
    heard_ms: Option<u64>,
    /// From its last heartbeat.
    claims_active: bool,
    following: Option<PeerId>,
    synced: bool,
    /// Since when, while we are active, it has claimed the role though we
    /// outrank it, or followed no active (see
    /// [`Cluster::redial_deaf_peers`]).
    deaf_since: Option<(u64, Deafness)>,
    /// Since when it has been ready to take the role back from us (alive,
    /// following us, holding our snapshot on a link that has not broken
    /// since): see [`Cluster::evaluate_active`].
    ready_since: Option<u64>,
    /// Its link to us is between `MERGE` and `MERGED`: the `G` lines are
    /// grants to merge ([`crate::engine::merge`]).
    in_merge: bool,
    /// The limit of the last `P L` on its link, until a `P C` (a permit)
    /// takes it ([`wire`]).
    next_limit: Option<u32>,
    /// Our lag probe in flight on our link to it: its number and when it
    /// went (monotonic µs, [`Now::us`]).
    probe: Option<(u64, u64)>,
    /// Not before this (monotonic ms) does the next probe go to it.
    next_probe_ms: u64,
    /// What we measured and counted of its replication while active.
    replication: FollowerStats,
}

/// What an inbound link's `HELLO` claimed, kept until its `AUTH` proves it.
#[derive(Debug, Clone)]
struct Claim {
    version: u64,
    fingerprint: Fingerprint,
    from: PeerId,
    addr: Box<[u8]>,
    incarnation: u64,
    nonce: Nonce,
}

/// An inbound link that sent `HELLO` and was sent our `CHALLENGE`.
#[derive(Debug, Clone)]
struct Pending {
    claim: Claim,
    nonce: Nonce,
    deadline_ms: u64,
}

/// An authenticated peer whose configuration differs from ours.
#[derive(Debug, Clone)]
struct Conflict {
    fingerprint: Fingerprint,
    until_ms: u64,
    reason: String,
}

/// The cluster state machine of one node. It acts on the engine (roles,
/// replicated grants, tokens) and writes peer lines into the node's
/// [`Outbox`], which the node lends it beside the engine.
pub struct Cluster {
    cfg: ClusterConfig,
    /// Of our ordered peer list: what every peer's must equal.
    fingerprint: Fingerprint,
    /// Nonces handed out so far (each handshake takes a fresh one).
    nonces: u64,
    peers: Vec<Peer>,
    role: Role,
    /// This node holds the cluster's state (what heartbeats say in their
    /// last field). As a standby: a complete snapshot from `following` has
    /// arrived (kept when that active dies: the copy is still here). As an
    /// active: it took the role holding that state (a synced standby, a
    /// hand-off), or a follower has since synced to it. Only a node that
    /// took the role with no state anywhere in reach (a start cut off from
    /// every peer) is active without it, until its first follower syncs.
    synced: bool,
    started_ms: u64,
    /// As a standby that follows nobody: the active its live peers follow,
    /// which its `M` answers name (hearsay: a hint for clients, not a node
    /// it takes replication from).
    named: Option<PeerId>,
    /// When `tick` last ran.
    last_tick_ms: u64,
    next_heartbeat_ms: u64,
    /// Authenticated inbound links: connection → peer index.
    links_in: Vec<(ConnId, PeerId)>,
    /// Inbound links in their handshake.
    pending: HashMap<ConnId, Pending>,
    conflicts: Vec<Conflict>,
    /// Some link, either way, has authenticated since this process started:
    /// our secret is the cluster's.
    authenticated_any: bool,
    /// The last time a peer we dialed answered with a wrong MAC, and what
    /// we told the log: see [`Cluster::eligible`].
    auth_failure: Option<(u64, String)>,
    /// Authenticated links the peer gave up with an `E` line, not yet
    /// closed: their close is no sign of a crash.
    given_up: Vec<ConnId>,
    /// Authenticated inbound links of a peer that has since linked to us
    /// again: a peer dials anew only once its old link is closed at its
    /// end, so what these still carry (delivered late by TCP after a
    /// partition) is older than the new link's and is ignored until they
    /// close.
    superseded: Vec<ConnId>,
    /// Links to close (with the reason), for the loop: see
    /// [`Cluster::take_doomed`].
    doomed: Vec<(ConnId, String)>,
    /// Shutting down: no more role changes.
    leaving: bool,
    /// This node gave way to an active at a heal, or handed the role off,
    /// and no active's snapshot has replaced our table since: our grants go
    /// to `merge_owed` (the active we follow, or the node we handed off to;
    /// following nobody, the last one we did) on every link of ours to it
    /// that authenticates meanwhile, and to each new active we follow until
    /// one's snapshot comes
    /// ([`Cluster::send_owed_merge`], [`Cluster::follow`]).
    merge_owed: Option<PeerId>,
    /// The node this one handed the role to, until its first heartbeat
    /// that no longer says it follows us tells whether it took the role
    /// (it says active) or not (it follows another node, or none).
    handed_to: Option<PeerId>,
    /// The node owed our merge has not had it: we handed it the role with
    /// our state, and it did not take it. It gets the merge when it sends
    /// us its snapshot as an active, before that snapshot replaces our
    /// table ([`Cluster::send_owed_merge`]).
    merge_unsent: bool,
    /// Whether this node has known an active (been one, or followed one):
    /// taking the role after that is a failover, before it the cluster's
    /// first election (which the log tells apart by level).
    known_active: bool,
    scratch: Vec<u8>,
    /// Replication lines for followers on older peer protocol versions
    /// (one buffer each, newest first).
    scratch_old: [Vec<u8>; OLD_VERSIONS],
    /// The engine's replication events of the turn, swapped with its log by
    /// [`Cluster::flush_replication`] (both are reused).
    events: ReplicationLog,
    stats: ClusterStats,
    /// The number of the last lag probe sent (to any follower).
    probe_seq: u64,
}

impl Cluster {
    /// A node that starts as a standby knowing no active; the engine is told.
    pub fn new(cfg: ClusterConfig, now: Now, engine: &mut Engine, out: &mut Outbox) -> Cluster {
        assert!(cfg.me.0 < cfg.peers.len(), "this node is not in --peers");
        assert!(cfg.peers.len() <= wire::MAX_PEERS, "too many peers");
        assert!(cfg.heartbeat_ms > 0 && cfg.peer_timeout_ms > cfg.heartbeat_ms);
        assert!(cfg.failback_delay_ms <= MAX_FAILBACK_DELAY_MS);
        assert!(cfg.read_batch_us <= MAX_READ_BATCH_US);
        assert!(
            cfg.read_batch_us
                .saturating_mul(READ_BATCHES_PER_PEER_TIMEOUT)
                <= cfg.peer_timeout_ms.saturating_mul(1000),
            "batched reads as long as a peer timeout"
        );
        engine.enable_replication();
        engine.share_tokens(cfg.me.0, cfg.peers.len());
        engine.step_down(None, out);
        let peers = vec![Peer::default(); cfg.peers.len()];
        Cluster {
            fingerprint: auth::fingerprint(wire::FINGERPRINT_VERSION, &cfg.peers),
            nonces: 0,
            cfg,
            peers,
            role: Role::Standby { following: None },
            synced: false,
            started_ms: now.ms,
            named: None,
            last_tick_ms: now.ms,
            next_heartbeat_ms: now.ms,
            links_in: Vec::new(),
            pending: HashMap::new(),
            conflicts: Vec::new(),
            authenticated_any: false,
            auth_failure: None,
            given_up: Vec::new(),
            superseded: Vec::new(),
            doomed: Vec::new(),
            leaving: false,
            merge_owed: None,
            handed_to: None,
            merge_unsent: false,
            known_active: false,
            stats: ClusterStats::default(),
            scratch: Vec::new(),
            scratch_old: Default::default(),
            events: ReplicationLog::new(),
            probe_seq: 0,
        }
    }

    /// This node's peer-list fingerprint.
    pub fn fingerprint(&self) -> Fingerprint {
        self.fingerprint
    }

    /// Peer links open now (authenticated or in their handshake), both
    /// ways: what the loop does not count against `--max-conns`.
    pub(crate) fn link_count(&self) -> usize {
        self.links_in.len()
            + self.pending.len()
            + self.peers.iter().filter(|p| p.out.conn().is_some()).count()
    }

    /// How many connections beyond `--max-conns` are kept for peers: one
    /// inbound and one outbound link per peer, twice over for links being
    /// replaced, and the handshakes in progress.
    pub(crate) fn link_reserve(&self) -> usize {
        4 * (self.peers.len() - 1) + MAX_PENDING_HANDSHAKES
    }

    /// How soon a failed or closed link is dialed again: [`DIAL_RETRY_MS`],
    /// or a quarter of the peer timeout if that is shorter. A node that
    /// starts or resumes waits one peer timeout to hear who is active; with
    /// a peer timeout under the retry delay, a peer whose link to it had
    /// closed would redial only after that wait, and the node would take
    /// the role beside the active.
    pub(crate) fn dial_retry_ms(&self) -> u64 {
        DIAL_RETRY_MS.min(self.cfg.peer_timeout_ms / 4).max(1)
    }

    /// How long a peer link may take to authenticate.
    pub(crate) fn handshake_timeout_ms(&self) -> u64 {
        self.cfg.peer_timeout_ms
    }

    /// True if `conn` is an authenticated link from a peer.
    pub fn is_authenticated_in(&self, conn: ConnId) -> bool {
        self.links_in.iter().any(|&(c, _)| c == conn)
    }

    /// True if `conn` is an authenticated link from a peer that a newer one
    /// from the same peer superseded: its lines are ignored until it
    /// closes.
    pub fn is_superseded(&self, conn: ConnId) -> bool {
        self.superseded.contains(&conn)
    }

    /// True if `conn` is a peer link: ours, or one from a peer that sent
    /// `HELLO` (authenticated or not), or one given up this turn that the
    /// loop has not taken to close yet (a handshake expired at the tick
    /// that started the turn: the peer's own `E` giving it up may be read
    /// in the same turn, and is no client request to answer).
    pub fn is_peer_link(&self, conn: ConnId) -> bool {
        self.peers.iter().any(|p| p.out.conn() == Some(conn))
            || self.pending.contains_key(&conn)
            || self.links_in.iter().any(|&(c, _)| c == conn)
            || self.doomed.iter().any(|&(c, _)| c == conn)
    }

    /// Moves the links this node wants closed into `into`, each with an `E`
    /// line already at the end of its output; the loop closes them as it
    /// closes a connection that broke the protocol.
    pub fn take_doomed(&mut self, into: &mut Vec<(ConnId, String)>) {
        into.append(&mut self.doomed);
    }

    /// A configuration problem with a peer, while it lasts: for `status`.
    pub fn problem(&self, now: Now) -> Option<&str> {
        let conflict = self
            .conflicts
            .iter()
            .filter(|c| c.until_ms > now.ms)
            .max_by_key(|c| c.until_ms)
            .map(|c| c.reason.as_str());
        let auth = self
            .auth_failure
            .as_ref()
            .filter(|(until, _)| *until > now.ms)
            .map(|(_, why)| why.as_str());
        conflict.or(auth)
    }

    /// Whether this node may be active now. Not while an authenticated peer
    /// with another configuration, whose fingerprint is not above ours, has
    /// been heard of lately: then the other configuration may serve and
    /// this one must not. And not while this node has authenticated no
    /// peer since it started and a peer it dialed lately answered with a
    /// wrong MAC: then the likeliest cause is that *our* secret is not the
    /// cluster's, and our peers, which we cannot hear, may be serving. (A
    /// peer that does not answer at all, as in a partition, does not count:
    /// only a live process answering with the wrong secret does. The price:
    /// whoever can bind a dead peer's address can keep a node that has
    /// never met a peer since its start from serving.)
    fn eligible(&self, now: Now) -> bool {
        let conflict = self
            .conflicts
            .iter()
            .any(|c| c.until_ms > now.ms && c.fingerprint <= self.fingerprint);
        let secret_suspect = !self.authenticated_any
            && self
                .auth_failure
                .as_ref()
                .is_some_and(|(until, _)| *until > now.ms);
        !conflict && !secret_suspect
    }

    /// Closes `conn` with `reason` (an `E` line, then the loop closes it).
    fn doom(&mut self, conn: ConnId, reason: String, out: &mut Outbox) {
        let reason = shorten(reason);
        let mut line = Vec::with_capacity(reason.len() + 3);
        crate::proto::Answer::Error {
            reason: reason.as_bytes(),
        }
        .encode(&mut line);
        out.write_link(conn, &line);
        self.doomed.push((conn, reason));
    }

    pub fn role(&self) -> Role {
        self.role
    }

    /// True while this node hears a live peer claim the active role that
    /// is not the node it follows (as a standby) or itself (as an active),
    /// or has given way to an active whose snapshot (which comes after our
    /// merge) it has not received: the cluster has not settled on one
    /// active with one table yet, as this node sees it.
    pub fn settling(&self) -> bool {
        let followed = match self.role {
            Role::Active => None,
            Role::Standby { following } => following,
        };
        PeerId::all(self.peers.len())
            .any(|p| self.alive(p) && self.peers[p].claims_active && Some(p) != followed)
            || self.merge_owed.is_some()
    }

    /// What the cluster has counted.
    pub fn stats(&self) -> &ClusterStats {
        &self.stats
    }

    /// A standby that follows an active and holds its complete snapshot;
    /// an active that is not leaving. What `/ready` answers.
    pub(crate) fn is_ready(&self) -> bool {
        match self.role {
            Role::Active => !self.leaving,
            Role::Standby { following } => following.is_some() && self.synced && !self.leaving,
        }
    }

    /// Shutting down (SIGINT/SIGTERM): no more role changes.
    pub(crate) fn is_leaving(&self) -> bool {
        self.leaving
    }

    /// Peers heard from within the peer timeout.
    pub fn peers_up(&self) -> usize {
        PeerId::all(self.peers.len())
            .filter(|&p| self.alive(p))
            .count()
    }

    /// For each peer that follows this active node over an authenticated
    /// link: its address, our connection to it and its replication's
    /// figures.
    pub fn followers(&self) -> impl Iterator<Item = (&str, ConnId, &FollowerStats)> {
        let me = self.cfg.me;
        with_ids(&self.peers).filter_map(move |(i, p)| {
            let conn = p.out.ready_conn().filter(|_| p.following == Some(me))?;
            (self.role == Role::Active).then_some((
                self.cfg.peers[i].as_str(),
                conn,
                &p.replication,
            ))
        })
    }

    /// The first peer for which `f` holds.
    fn peer_by(&self, f: impl FnMut(&Peer) -> bool) -> Option<PeerId> {
        self.peers.iter().position(f).map(PeerId)
    }

    /// The address of peer `i` as listed in `--peers`.
    pub fn peer_addr(&self, i: PeerId) -> &str {
        &self.cfg.peers[i]
    }

    fn alive(&self, p: PeerId) -> bool {
        p != self.cfg.me && self.peers[p].heard_ms.is_some()
    }

    /// Handles one peer line received on `conn`. `Err` breaks the link
    /// with that reason.
    pub(crate) fn on_message(
        &mut self,
        now: Now,
        conn: ConnId,
        msg: PeerMsg<'_>,
        engine: &mut Engine,
        out: &mut Outbox,
    ) -> Result<(), PeerError> {
        // An authenticated link the peer dialed first: most lines come on
        // one (a follower's replication). No link is both ways
        // (`check_invariants`), so the order of the two looks is free.
        if let Some(&(_, from)) = self.links_in.iter().find(|&&(c, _)| c == conn) {
            if self.superseded.contains(&conn) {
                return Ok(()); // stale: the peer's newer link speaks for it
            }
            return self.on_peer_message(now, from, msg, engine, out);
        }
        if let Some(peer) = self.peer_by(|p| p.out.conn() == Some(conn)) {
            // Our own link: the peer only ever answers our HELLO.
            let link = self.peers[peer].out;
            return match msg {
                PeerMsg::Challenge {
                    fingerprint,
                    index,
                    addr,
                    nonce,
                    mac,
                } if matches!(link, OutLink::Handshaking { .. }) => {
                    let claimed = Identity {
                        fingerprint,
                        index: index.0 as u64,
                        addr,
                        nonce,
                    };
                    self.on_challenge(now, peer, conn, claimed, &mac, engine, out)
                }
                // An answer to a HELLO on a link given up (its close
                // follows): nothing it says is believed.
                PeerMsg::Challenge { .. } if matches!(link, OutLink::Closing { .. }) => Ok(()),
                _ => Err(Unexpected::OnDialedLink {
                    peer: self.cfg.peers[peer].clone(),
                }
                .into()),
            };
        }
        match msg {
            PeerMsg::Hello {
                version,
                fingerprint,
                from,
                addr,
                incarnation,
                nonce,
            } if !self.pending.contains_key(&conn) => {
                let claim = Claim {
                    version,
                    fingerprint,
                    from,
                    addr: addr.into(),
                    incarnation,
                    nonce,
                };
                self.on_hello(now, conn, claim, out)
            }
            PeerMsg::Auth { mac } => match self.pending.remove(&conn) {
                Some(pending) => self.on_auth(now, conn, pending, &mac, engine, out),
                None => Err(Unexpected::AuthBeforeHello.into()),
            },
            PeerMsg::Hello { .. } => Err(Unexpected::SecondHello.into()),
            _ if self.pending.contains_key(&conn) => Err(Unexpected::BeforeAuth.into()),
            _ => Err(Unexpected::BeforeHello.into()),
        }
    }

    /// An `E` line on a peer link: the other side gave the link up (it
    /// refused our handshake, timed out waiting for it, or found us silent).
    /// The link is closed with the reason. On an authenticated link, the
    /// peer has just proved it is alive: the close that follows is not a
    /// crash, so it does not make the peer dead at once (see
    /// [`Cluster::on_close`]); its heartbeats decide, as after any pause.
    /// The TLS handshake of a link we dialed failed (the peer's certificate
    /// is not the peer CA's, or it refused ours): like a wrong MAC, a live
    /// process at a peer's address that cannot prove itself, or cannot
    /// accept our proof. Our own certificates are then suspect, so a node
    /// that has met no peer since its start does not serve meanwhile (see
    /// [`Cluster::eligible`]).
    pub(crate) fn dial_tls_failed(
        &mut self,
        now: Now,
        conn: ConnId,
        why: &str,
        engine: &mut Engine,
        out: &mut Outbox,
    ) {
        let Some(peer) = self.peer_by(|p| p.out.conn() == Some(conn)) else {
            return;
        };
        let reason = format!(
            "peer TLS failed with {}: {why}; are --tls-cert and --tls-peer-ca right on every node?",
            self.cfg.peers[peer]
        );
        self.auth_failure = Some((now.ms + 2 * self.cfg.peer_timeout_ms, reason));
        self.evaluate(now, engine, out);
    }

    pub(crate) fn on_refusal(
        &mut self,
        now: Now,
        conn: ConnId,
        line: &[u8],
    ) -> Result<(), PeerError> {
        let shown = crate::proto::quoted(line.strip_prefix(b"E ").unwrap_or(line), 300);
        let dialed = self.peer_by(|p| p.out.ready_conn() == Some(conn));
        let inbound = self
            .links_in
            .iter()
            .find(|&&(c, _)| c == conn)
            .map(|&(_, p)| p);
        if let Some(peer) = dialed.or(inbound) {
            self.peers[peer].heard_ms = Some(now.ms);
            self.given_up.push(conn);
        }
        self.downgrade_if_refused(conn, line);
        let who = match self.peer_by(|p| p.out.conn() == Some(conn)) {
            Some(p) => self.cfg.peers[p].as_str(),
            None => "a peer",
        };
        Err(PeerError::GaveUp {
            who: who.to_string(),
            said: shown,
        })
    }

    /// A peer that refused our `HELLO`'s version (a node of an older
    /// release) is dialed with the version before from now on, down to
    /// [`wire::MIN_VERSION`]; its own `HELLO` sets the version again
    /// ([`Cluster::on_auth`]).
    fn downgrade_if_refused(&mut self, conn: ConnId, line: &[u8]) {
        let Some(i) = self.peer_by(|p| p.out.conn() == Some(conn) && !p.out.is_ready()) else {
            return;
        };
        let p = &mut self.peers[i];
        let refused = memchr::memmem::find(line, b"peer protocol version").is_some();
        if refused && p.out_version > wire::MIN_VERSION {
            p.dial_version = p.out_version - 1;
            let lacks = if p.dial_version < 3 {
                "holders are not replicated to it, and it cannot merge"
            } else if p.dial_version < wire::MERGE_VERSION {
                "the identities of holders are not replicated to it, and it cannot merge grants at a heal"
            } else if p.dial_version < wire::SHARED_VERSION {
                "shared grants and permits are not replicated to it: this node refuses G and C while it follows"
            } else {
                "its grants and releases go in decimal, which costs this node more to write"
            };
            tracing::info!(target: LOG_TARGET, peer = %self.cfg.peers[i], "{} refused peer protocol version {}: dialing it with {} (an older release; {lacks})", self.cfg.peers[i], p.out_version, p.dial_version);
        }
    }
}

/// The longest reason a peer link is closed with: its `E` line stays well
/// within a line's 512 bytes.
pub(crate) const MAX_REASON_BYTES: usize = 400;

/// `reason`, cut to [`MAX_REASON_BYTES`] (at a character boundary) with
/// `...`.
pub(crate) fn shorten(mut reason: String) -> String {
    if reason.len() > MAX_REASON_BYTES {
        let mut end = MAX_REASON_BYTES - 3;
        while !reason.is_char_boundary(end) {
            end -= 1;
        }
        reason.truncate(end);
        reason.push_str("...");
    }
    reason
}

#[cfg(test)]
mod tests;

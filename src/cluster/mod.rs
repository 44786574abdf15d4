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
//!   after a split brain); one that sees a higher-priority peer following it
//!   with a complete snapshot hands the role over to it (failback). Of two
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
pub mod wire;

use std::collections::HashMap;

use crate::engine::{ConnId, Engine, Now, ReplicationLog};
use crate::proto::Quoted;
use crate::stats::ClusterStats;
use auth::{Fingerprint, Identity, Nonce, Secret, Side, Transcript};
use wire::PeerMsg;

/// Unsent bytes on a link past which heartbeats are not queued on it.
pub const HEARTBEAT_BACKLOG_BYTES: usize = 64 * 1024;

/// Replication a follower may have unread beyond the last snapshot queued
/// for it. Past it the link is closed: the follower resyncs from a fresh
/// snapshot once it is redialled, and the active's memory stays bounded.
pub const REPLICATION_BACKLOG_BYTES: usize = 32 * 1024 * 1024;

/// Inbound handshakes in progress at once; one more `HELLO` is refused, so
/// strangers cannot make a node keep state for every connection.
pub const MAX_PENDING_HANDSHAKES: usize = 64;

/// Configuration conflicts remembered at once (the newest are kept).
const MAX_CONFLICTS: usize = 16;

/// How a planned hand-off's reason begins (`hand-off to X`): the log says
/// it at INFO, an unplanned step-down at WARN.
const HAND_OFF: &str = "hand-off to";

/// How soon a failed dial is retried.
pub const DIAL_RETRY_MS: u64 = 100;

/// Cluster settings; every node of a cluster gets the same `peers`.
#[derive(Debug, Clone)]
pub struct ClusterConfig {
    /// Every node's address in priority order, first highest.
    pub peers: Vec<String>,
    /// This node's index in `peers`.
    pub me: usize,
    pub heartbeat_ms: u64,
    pub peer_timeout_ms: u64,
    /// Random per process start: lets peers tell a restart from a reconnect.
    pub incarnation: u64,
    /// The cluster's shared secret: every peer link proves it both ways.
    pub secret: Secret,
}

/// This node's role.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    Active,
    /// Following the active `following` (None: no active known).
    Standby {
        following: Option<usize>,
    },
}

/// What this node knows of one peer.
#[derive(Debug, Default, Clone)]
struct Peer {
    /// Our link to it (we send on it), once dialed.
    out: Option<ConnId>,
    /// Our link has checked the peer's `CHALLENGE`: heartbeats and
    /// replication may go on it.
    out_authed: bool,
    /// Until then: the nonce of our `HELLO`, and when we give up waiting.
    out_nonce: Nonce,
    out_deadline_ms: u64,
    /// The size of the last snapshot queued on our link: what it may have
    /// unread beyond [`REPLICATION_BACKLOG_BYTES`].
    snapshot_bytes: usize,
    dialing: bool,
    next_dial_ms: u64,
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
    following: Option<usize>,
    synced: bool,
    /// Since when it has claimed the role while we are active and outrank
    /// it (see [`Cluster::redial_deaf_rivals`]).
    rival_since: Option<u64>,
}

/// What an inbound link's `HELLO` claimed, kept until its `AUTH` proves it.
#[derive(Debug, Clone)]
struct Claim {
    version: u64,
    fingerprint: Fingerprint,
    from: usize,
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
/// replicated grants, tokens) and writes peer lines into the engine's
/// per-connection output.
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
    named: Option<usize>,
    /// When `tick` last ran.
    last_tick_ms: u64,
    next_heartbeat_ms: u64,
    /// Authenticated inbound links: connection → peer index.
    links_in: Vec<(ConnId, usize)>,
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
    /// Whether this node has known an active (been one, or followed one):
    /// taking the role after that is a failover, before it the cluster's
    /// first election (which the log tells apart by level).
    known_active: bool,
    scratch: Vec<u8>,
    /// Replication lines for followers on the older peer protocol version.
    scratch_old: Vec<u8>,
    /// The engine's replication events of the turn, swapped with its log by
    /// [`Cluster::flush_replication`] (both are reused).
    events: ReplicationLog,
    stats: ClusterStats,
}

impl Cluster {
    /// A node that starts as a standby knowing no active; the engine is told.
    pub fn new(cfg: ClusterConfig, now: Now, engine: &mut Engine) -> Cluster {
        assert!(cfg.me < cfg.peers.len(), "this node is not in --peers");
        assert!(cfg.peers.len() <= wire::MAX_PEERS, "too many peers");
        assert!(cfg.heartbeat_ms > 0 && cfg.peer_timeout_ms > cfg.heartbeat_ms);
        engine.enable_replication();
        engine.step_down(None);
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
            known_active: false,
            stats: ClusterStats::default(),
            scratch: Vec::new(),
            scratch_old: Vec::new(),
            events: ReplicationLog::new(),
        }
    }

    /// This node's peer-list fingerprint.
    pub fn fingerprint(&self) -> Fingerprint {
        self.fingerprint
    }

    /// Peer links open now (authenticated or in their handshake), both
    /// ways: what the loop does not count against `--max-conns`.
    pub fn link_count(&self) -> usize {
        self.links_in.len()
            + self.pending.len()
            + self.peers.iter().filter(|p| p.out.is_some()).count()
    }

    /// How many connections beyond `--max-conns` are kept for peers: one
    /// inbound and one outbound link per peer, twice over for links being
    /// replaced, and the handshakes in progress.
    pub fn link_reserve(&self) -> usize {
        4 * (self.peers.len() - 1) + MAX_PENDING_HANDSHAKES
    }

    /// How long a peer link may take to authenticate.
    pub fn handshake_timeout_ms(&self) -> u64 {
        self.cfg.peer_timeout_ms
    }

    /// True if `conn` is an authenticated link from a peer.
    pub fn is_authenticated_in(&self, conn: ConnId) -> bool {
        self.links_in.iter().any(|&(c, _)| c == conn)
    }

    /// True if `conn` is a peer link: ours, or one from a peer that sent
    /// `HELLO` (authenticated or not).
    pub fn is_peer_link(&self, conn: ConnId) -> bool {
        self.peers.iter().any(|p| p.out == Some(conn))
            || self.pending.contains_key(&conn)
            || self.links_in.iter().any(|&(c, _)| c == conn)
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

    fn next_nonce(&mut self) -> Nonce {
        self.nonces += 1;
        self.cfg.secret.nonce(self.cfg.incarnation, self.nonces)
    }

    /// The transcript of a link dialed to us: what its `HELLO` claimed,
    /// and us with our nonce `nonce`.
    fn inbound_transcript<'a>(&'a self, claim: &'a Claim, nonce: Nonce) -> Transcript<'a> {
        Transcript {
            dialer: Identity {
                fingerprint: claim.fingerprint,
                index: claim.from as u64,
                addr: &claim.addr,
                nonce: claim.nonce,
            },
            dialer_incarnation: claim.incarnation,
            acceptor: self.my_identity(nonce),
        }
    }

    fn my_identity(&self, nonce: Nonce) -> Identity<'_> {
        Identity {
            fingerprint: self.fingerprint,
            index: self.cfg.me as u64,
            addr: self.cfg.peers[self.cfg.me].as_bytes(),
            nonce,
        }
    }

    /// Closes `conn` with `reason` (an `E` line, then the loop closes it).
    fn doom(&mut self, conn: ConnId, reason: String, engine: &mut Engine) {
        let reason = shorten(reason);
        let mut line = Vec::with_capacity(reason.len() + 3);
        crate::proto::Answer::Error {
            reason: reason.as_bytes(),
        }
        .encode(&mut line);
        engine.write_to(conn, &line);
        self.doomed.push((conn, reason));
    }

    /// What differs between our configuration and what an authenticated
    /// peer says of itself (`None`: nothing).
    fn difference(&self, fingerprint: Fingerprint, index: usize, addr: &[u8]) -> Option<String> {
        let n = self.peers.len();
        let shown = Quoted(addr);
        let ours = crate::proto::quoted(self.cfg.peers.join(",").as_bytes(), 160);
        if index >= n {
            return Some(format!(
                "{shown} says it is node {index} of its --peers, but this node's list has {n} \
                 nodes ({ours}): --peers must be the same list on every node"
            ));
        }
        if addr != self.cfg.peers[index].as_bytes() {
            let here = match self.cfg.peers.iter().position(|p| p.as_bytes() == addr) {
                Some(i) => format!("node {i}"),
                None => "not in the list".into(),
            };
            return Some(format!(
                "{shown} is node {index} of its --peers but {here} of this node's ({ours}): \
                 --peers must be the same list, in the same order, on every node"
            ));
        }
        if index == self.cfg.me {
            return Some(format!(
                "{shown} says it is node {index} of --peers, which is this node: \
                 two nodes with the same --advertise?"
            ));
        }
        if fingerprint != self.fingerprint {
            return Some(format!(
                "{shown} has another --peers list than this node's ({ours}; fingerprint \
                 {:016x}, its {fingerprint:016x}): --peers must be the same list, in the same \
                 order, on every node",
                self.fingerprint
            ));
        }
        None
    }

    /// Records a conflict with an authenticated peer and re-decides the
    /// role at once (this node may have to stop serving).
    fn conflict(&mut self, now: Now, fingerprint: Fingerprint, reason: &str, engine: &mut Engine) {
        let until_ms = now.ms + 2 * self.cfg.peer_timeout_ms;
        self.conflicts
            .retain(|c| c.until_ms > now.ms && c.reason != reason);
        if self.conflicts.len() == MAX_CONFLICTS {
            self.conflicts.remove(0);
        }
        self.conflicts.push(Conflict {
            fingerprint,
            until_ms,
            reason: reason.to_string(),
        });
        self.evaluate(now, engine);
    }

    pub fn role(&self) -> Role {
        self.role
    }

    /// What the cluster has counted.
    pub fn stats(&self) -> &ClusterStats {
        &self.stats
    }

    /// A standby that follows an active and holds its complete snapshot;
    /// an active that is not leaving. What `/ready` answers.
    pub fn is_ready(&self) -> bool {
        match self.role {
            Role::Active => !self.leaving,
            Role::Standby { following } => following.is_some() && self.synced && !self.leaving,
        }
    }

    /// Shutting down (SIGINT/SIGTERM): no more role changes.
    pub fn is_leaving(&self) -> bool {
        self.leaving
    }

    /// Peers heard from within the peer timeout.
    pub fn peers_up(&self) -> usize {
        (0..self.peers.len()).filter(|&p| self.alive(p)).count()
    }

    /// For each peer that follows this active node over an authenticated
    /// link: its address and our connection to it.
    pub fn followers(&self) -> impl Iterator<Item = (&str, ConnId)> {
        let me = self.cfg.me;
        self.peers.iter().enumerate().filter_map(move |(i, p)| {
            let conn = p.out.filter(|_| p.out_authed && p.following == Some(me))?;
            (self.role == Role::Active).then_some((self.cfg.peers[i].as_str(), conn))
        })
    }

    /// The address of peer `i` as listed in `--peers`.
    pub fn peer_addr(&self, i: usize) -> &str {
        &self.cfg.peers[i]
    }

    fn alive(&self, p: usize) -> bool {
        p != self.cfg.me && self.peers[p].heard_ms.is_some()
    }

    /// The earliest time `tick` has work: the next heartbeat, dial or
    /// liveness deadline.
    pub fn next_deadline(&self) -> u64 {
        let mut next = self.next_heartbeat_ms;
        for (i, p) in self.peers.iter().enumerate() {
            if i == self.cfg.me {
                continue;
            }
            if p.out.is_none() && !p.dialing {
                next = next.min(p.next_dial_ms);
            }
            if let Some(heard) = p.heard_ms {
                next = next.min(heard + self.cfg.peer_timeout_ms);
            }
            if p.out.is_some() && !p.out_authed {
                next = next.min(p.out_deadline_ms);
            }
        }
        for pending in self.pending.values() {
            next = next.min(pending.deadline_ms);
        }
        let conflict_ends = self.conflicts.iter().map(|c| c.until_ms);
        let auth_failure_ends = self.auth_failure.iter().map(|(until, _)| *until);
        for until in conflict_ends.chain(auth_failure_ends) {
            if until > self.last_tick_ms {
                next = next.min(until);
            }
        }
        // The start-up grace, until a tick has seen it end (not after: a
        // deadline in the past would spin the loop).
        let grace = self.started_ms + self.cfg.peer_timeout_ms;
        if matches!(self.role, Role::Standby { following: None }) && self.last_tick_ms < grace {
            next = next.min(grace);
        }
        next
    }

    /// Peers to dial now: `(index, address)`. Each is dialing until
    /// [`Cluster::outbound_open`] or [`Cluster::dial_failed`].
    pub fn take_dials(&mut self, now: Now, into: &mut Vec<(usize, String)>) {
        for (i, p) in self.peers.iter_mut().enumerate() {
            if i != self.cfg.me && p.out.is_none() && !p.dialing && now.ms >= p.next_dial_ms {
                p.dialing = true;
                into.push((i, self.cfg.peers[i].clone()));
            }
        }
    }

    pub fn dial_failed(&mut self, peer: usize, now: Now) {
        let p = &mut self.peers[peer];
        p.dialing = false;
        p.next_dial_ms = now.ms + DIAL_RETRY_MS;
    }

    /// Our dial to `peer` succeeded as connection `conn` (opened in the
    /// engine already): introduce ourselves with a fresh nonce. Nothing else
    /// goes on the link until the peer's `CHALLENGE` proves it.
    pub fn outbound_open(&mut self, now: Now, conn: ConnId, peer: usize, engine: &mut Engine) {
        debug_assert!(self.peers[peer].out.is_none());
        let nonce = self.next_nonce();
        let p = &mut self.peers[peer];
        p.out = Some(conn);
        p.out_authed = false;
        p.out_nonce = nonce;
        p.out_deadline_ms = now.ms + self.cfg.peer_timeout_ms;
        p.dialing = false;
        p.snapshot_sent = false;
        p.out_version = match p.dial_version {
            0 => wire::VERSION,
            v => v,
        };
        let version = p.out_version;
        self.scratch.clear();
        wire::encode(
            &mut self.scratch,
            &PeerMsg::Hello {
                version,
                fingerprint: self.fingerprint,
                from: self.cfg.me,
                addr: self.cfg.peers[self.cfg.me].as_bytes(),
                incarnation: self.cfg.incarnation,
                nonce,
            },
        );
        engine.write_to(conn, &self.scratch);
    }

    /// A connection closed: if it was a peer link, forget it. A peer whose
    /// links both ways are all closed is dead at once (a crashed process
    /// closes all its sockets); one broken link alone is not a crash, and
    /// leaves liveness to the heartbeats. A closed link of ours is dialed
    /// again.
    pub fn on_close(&mut self, now: Now, conn: ConnId, engine: &mut Engine) {
        let mut touched = None;
        // Only the close of an authenticated link is news: our dial to a
        // peer's address may meet anything listening there (the peer is
        // down and something else has its port), at every retry.
        let mut authed = false;
        if let Some(i) = self.peers.iter().position(|p| p.out == Some(conn)) {
            let p = &mut self.peers[i];
            authed = p.out_authed;
            p.out = None;
            p.out_authed = false;
            p.snapshot_sent = false;
            p.next_dial_ms = now.ms + DIAL_RETRY_MS;
            touched = Some(i);
        }
        self.pending.remove(&conn);
        if let Some(i) = self.links_in.iter().position(|&(c, _)| c == conn) {
            let (_, peer) = self.links_in.swap_remove(i);
            self.peers[peer].links_in -= 1;
            touched = Some(peer);
            authed = true;
        }
        // Dead at once only when every link, both ways, is gone (a crashed
        // process's sockets all close); one broken link is not a crash, and
        // neither is a link the peer gave up with an `E` line.
        self.superseded.retain(|&c| c != conn);
        let given_up = self.given_up.iter().position(|&c| c == conn);
        if let Some(k) = given_up {
            self.given_up.swap_remove(k);
        }
        if let Some(i) = touched.filter(|_| authed) {
            let why = if given_up.is_some() {
                "the peer gave it up"
            } else {
                "closed"
            };
            tracing::info!(peer = %self.cfg.peers[i], "a link with {} is down: {why}", self.cfg.peers[i]);
        }
        if let Some(i) = touched.filter(|_| given_up.is_none()) {
            let p = &mut self.peers[i];
            if p.links_in == 0 && p.out.is_none() && p.heard_ms.is_some() {
                p.heard_ms = None;
                p.claims_active = false;
                tracing::warn!(peer = %self.cfg.peers[i], "peer {} is down: all its links closed", self.cfg.peers[i]);
                self.evaluate(now, engine);
            }
        }
    }

    /// Handles one peer line received on `conn`. `Err` breaks the link
    /// with that reason.
    pub fn on_message(
        &mut self,
        now: Now,
        conn: ConnId,
        msg: PeerMsg<'_>,
        engine: &mut Engine,
    ) -> Result<(), String> {
        if let Some(peer) = self.peers.iter().position(|p| p.out == Some(conn)) {
            // Our own link: the peer only ever answers our HELLO.
            return match msg {
                PeerMsg::Challenge {
                    fingerprint,
                    index,
                    addr,
                    nonce,
                    mac,
                } if !self.peers[peer].out_authed => {
                    let claimed = Identity {
                        fingerprint,
                        index: index as u64,
                        addr,
                        nonce,
                    };
                    self.on_challenge(now, peer, conn, claimed, &mac, engine)
                }
                _ => Err(format!(
                    "unexpected peer line from {} on the link this node dialed",
                    self.cfg.peers[peer]
                )),
            };
        }
        if let Some(&(_, from)) = self.links_in.iter().find(|&&(c, _)| c == conn) {
            if self.superseded.contains(&conn) {
                return Ok(()); // stale: the peer's newer link speaks for it
            }
            return self.on_peer_message(now, from, msg, engine);
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
                self.on_hello(now, conn, claim, engine)
            }
            PeerMsg::Auth { mac } => match self.pending.remove(&conn) {
                Some(pending) => self.on_auth(now, conn, pending, &mac, engine),
                None => Err("peer AUTH before HELLO".into()),
            },
            PeerMsg::Hello { .. } => Err("second HELLO on one link".into()),
            _ if self.pending.contains_key(&conn) => Err("peer message before AUTH".into()),
            _ => Err("peer message before HELLO".into()),
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
    pub fn dial_tls_failed(&mut self, now: Now, conn: ConnId, why: &str, engine: &mut Engine) {
        let Some(peer) = self.peers.iter().position(|p| p.out == Some(conn)) else {
            return;
        };
        let reason = format!(
            "peer TLS failed with {}: {why}; are --tls-cert and --tls-peer-ca right on every node?",
            self.cfg.peers[peer]
        );
        self.auth_failure = Some((now.ms + 2 * self.cfg.peer_timeout_ms, reason));
        self.evaluate(now, engine);
    }

    pub fn on_refusal(&mut self, now: Now, conn: ConnId, line: &[u8]) -> Result<(), String> {
        let shown = crate::proto::quoted(line.strip_prefix(b"E ").unwrap_or(line), 300);
        let out = self
            .peers
            .iter()
            .position(|p| p.out == Some(conn) && p.out_authed);
        let inbound = self
            .links_in
            .iter()
            .find(|&&(c, _)| c == conn)
            .map(|&(_, p)| p);
        if let Some(peer) = out.or(inbound) {
            self.peers[peer].heard_ms = Some(now.ms);
            self.given_up.push(conn);
        }
        self.downgrade_if_refused(conn, line);
        let who = match self.peers.iter().position(|p| p.out == Some(conn)) {
            Some(p) => self.cfg.peers[p].as_str(),
            None => "a peer",
        };
        Err(format!("{who} gave the link up: {shown}"))
    }

    /// A peer that refused our `HELLO`'s version (a node of an older
    /// release) is dialed with the version before from now on, down to
    /// [`wire::MIN_VERSION`]; its own `HELLO` sets the version again
    /// ([`Cluster::on_auth`]).
    fn downgrade_if_refused(&mut self, conn: ConnId, line: &[u8]) {
        let Some(i) = self
            .peers
            .iter()
            .position(|p| p.out == Some(conn) && !p.out_authed)
        else {
            return;
        };
        let p = &mut self.peers[i];
        let refused = memchr::memmem::find(line, b"peer protocol version").is_some();
        if refused && p.out_version > wire::MIN_VERSION {
            p.dial_version = p.out_version - 1;
            tracing::info!(peer = %self.cfg.peers[i], "{} refused peer protocol version {}: dialing it with {} (an older release; holders are not replicated to it)", self.cfg.peers[i], p.out_version, p.dial_version);
        }
    }

    /// A stranger or a peer dialed us and said who it is: answer with our
    /// identity, a fresh nonce and our MAC over both (proving that we hold
    /// the secret), and believe nothing of it until its `AUTH`.
    fn on_hello(
        &mut self,
        now: Now,
        conn: ConnId,
        claim: Claim,
        engine: &mut Engine,
    ) -> Result<(), String> {
        if self.pending.len() >= MAX_PENDING_HANDSHAKES {
            // Full: the oldest handshake gives way. A real peer answers in
            // one round trip, so strangers who hold every slot cannot keep
            // one out unless they open more than the table within it.
            let oldest = self
                .pending
                .iter()
                .min_by_key(|&(&c, p)| (p.deadline_ms, c))
                .map(|(&c, _)| c);
            if let Some(oldest) = oldest {
                self.pending.remove(&oldest);
                let reason = format!(
                    "more than {MAX_PENDING_HANDSHAKES} peer handshakes in progress; the oldest \
                     gives way"
                );
                self.doom(oldest, reason, engine);
            }
        }
        let nonce = self.next_nonce();
        let transcript = self.inbound_transcript(&claim, nonce);
        let mac = self.cfg.secret.sign(Side::Acceptor, &transcript);
        self.scratch.clear();
        wire::encode(
            &mut self.scratch,
            &PeerMsg::Challenge {
                fingerprint: self.fingerprint,
                index: self.cfg.me,
                addr: self.cfg.peers[self.cfg.me].as_bytes(),
                nonce,
                mac,
            },
        );
        engine.write_to(conn, &self.scratch);
        self.pending.insert(
            conn,
            Pending {
                claim,
                nonce,
                deadline_ms: now.ms + self.cfg.peer_timeout_ms,
            },
        );
        Ok(())
    }

    /// The dialer proved it holds the secret: if its configuration is ours,
    /// the link is a peer's.
    fn on_auth(
        &mut self,
        now: Now,
        conn: ConnId,
        pending: Pending,
        mac: &auth::MacBytes,
        engine: &mut Engine,
    ) -> Result<(), String> {
        let claim = &pending.claim;
        let transcript = self.inbound_transcript(claim, pending.nonce);
        if !self.cfg.secret.verify(Side::Dialer, &transcript, mac) {
            return Err(format!(
                "peer authentication failed (a link claiming to be {}): wrong MAC; is \
                 --cluster-secret-file the same on every node?",
                Quoted(&claim.addr)
            ));
        }
        if let Some(reason) = self.difference(claim.fingerprint, claim.from, &claim.addr) {
            self.conflict(now, claim.fingerprint, &reason, engine);
            return Err(reason);
        }
        let from = claim.from;
        self.authenticated_any = true;
        let older: Vec<ConnId> = self
            .links_in
            .iter()
            .filter(|&&(c, p)| p == from && !self.superseded.contains(&c))
            .map(|&(c, _)| c)
            .collect();
        for old in older {
            self.superseded.push(old);
            let reason = format!(
                "{} linked to this node again: its older link is closed",
                self.cfg.peers[from]
            );
            self.doom(old, reason, engine);
        }
        self.links_in.push((conn, from));
        let p = &mut self.peers[from];
        p.links_in += 1;
        // A `HELLO` says what its link speaks, not all its sender speaks
        // (a node of this release dials 2 after a refusal by the release
        // before): it only raises the version we dial with; a refusal
        // lowers it ([`Cluster::downgrade_if_refused`]). Lowered on a
        // `HELLO 2` too, two nodes of this release could both stay at 2.
        let dialing = match p.dial_version {
            0 => wire::VERSION,
            v => v,
        };
        if claim.version > dialing {
            p.dial_version = claim.version;
        }
        let stale = p.out.filter(|_| p.out_version < claim.version);
        if p.incarnation != claim.incarnation {
            // A new process: what we knew of the old one is void. Only an
            // authenticated link gets here, so no stranger can reset a live
            // peer's state.
            p.incarnation = claim.incarnation;
            p.claims_active = false;
            p.following = None;
            p.synced = false;
            p.snapshot_sent = false;
        }
        if let Some(out) = stale {
            // It speaks a newer version than our link to it: dial again,
            // so that it gets the grants' holders too.
            let p = &mut self.peers[from];
            p.out_authed = false;
            p.snapshot_sent = false;
            let reason = format!(
                "{} speaks peer protocol version {}: this link is dialed again with it",
                self.cfg.peers[from], claim.version
            );
            self.doom(out, reason, engine);
        }
        if self.peers[from].heard_ms.is_none() {
            tracing::info!(peer = %self.cfg.peers[from], "peer {} is up: its link to this node authenticated", self.cfg.peers[from]);
        } else {
            tracing::info!(peer = %self.cfg.peers[from], "link from {} up (authenticated)", self.cfg.peers[from]);
        }
        self.peers[from].heard_ms = Some(now.ms);
        self.evaluate(now, engine);
        Ok(())
    }

    /// The peer we dialed answered our `HELLO`: check its MAC, prove
    /// ourselves with `AUTH`, and start sending if its configuration is ours.
    fn on_challenge(
        &mut self,
        now: Now,
        peer: usize,
        conn: ConnId,
        claimed: Identity<'_>,
        mac: &auth::MacBytes,
        engine: &mut Engine,
    ) -> Result<(), String> {
        let transcript = Transcript {
            dialer: self.my_identity(self.peers[peer].out_nonce),
            dialer_incarnation: self.cfg.incarnation,
            acceptor: claimed,
        };
        if !self.cfg.secret.verify(Side::Acceptor, &transcript, mac) {
            let reason = format!(
                "peer authentication failed: {} answered with a wrong MAC; is \
                 --cluster-secret-file the same on every node?",
                self.cfg.peers[peer]
            );
            self.auth_failure = Some((now.ms + 2 * self.cfg.peer_timeout_ms, reason.clone()));
            self.evaluate(now, engine);
            return Err(reason);
        }
        // It holds the secret. But is it the node we dialed? A node that
        // answers with another address is not (a relay, or something else
        // listening there): no AUTH for it, which could be relayed on to
        // that node as ours, and no conflict either, which would let
        // whoever holds a dead node's address stop us serving.
        if claimed.addr != self.cfg.peers[peer].as_bytes() {
            return Err(format!(
                "{} answered as {}: not the node this node dialed; is something else \
                 listening at that address?",
                self.cfg.peers[peer],
                Quoted(claimed.addr)
            ));
        }
        // It is: prove that we hold the secret too, so that it learns of a
        // conflict as surely as we do.
        let mac = self.cfg.secret.sign(Side::Dialer, &transcript);
        self.scratch.clear();
        wire::encode(&mut self.scratch, &PeerMsg::Auth { mac });
        engine.write_to(conn, &self.scratch);
        let index = usize::try_from(claimed.index).unwrap_or(usize::MAX);
        if let Some(reason) = self.difference(claimed.fingerprint, index, claimed.addr) {
            self.conflict(now, claimed.fingerprint, &reason, engine);
            return Err(reason);
        }
        self.peers[peer].out_authed = true;
        self.authenticated_any = true;
        tracing::info!(peer = %self.cfg.peers[peer], "link to {} up (authenticated)", self.cfg.peers[peer]);
        // Our state, at once: the peer learns our role and token now.
        self.scratch.clear();
        self.encode_heartbeat(engine);
        engine.write_to(conn, &self.scratch);
        Ok(())
    }

    /// A message on an authenticated link from peer `from`.
    fn on_peer_message(
        &mut self,
        now: Now,
        from: usize,
        msg: PeerMsg<'_>,
        engine: &mut Engine,
    ) -> Result<(), String> {
        if self.peers[from].heard_ms.is_none() {
            tracing::info!(peer = %self.cfg.peers[from], "peer {} is up: heard from it again", self.cfg.peers[from]);
        }
        self.peers[from].heard_ms = Some(now.ms);
        let following_sender = self.role
            == Role::Standby {
                following: Some(from),
            };
        match msg {
            PeerMsg::Hello { .. } | PeerMsg::Challenge { .. } | PeerMsg::Auth { .. } => {
                return Err("handshake message on an authenticated link".into());
            }
            PeerMsg::Heartbeat {
                active,
                following,
                highest,
                synced,
            } => {
                if following.is_some_and(|f| f >= self.peers.len()) {
                    return Err(format!(
                        "heartbeat follows node {following:?}, beyond --peers"
                    ));
                }
                engine.observe_token(highest);
                let p = &mut self.peers[from];
                if p.following != following {
                    p.snapshot_sent = false;
                }
                p.claims_active = active;
                p.following = following;
                p.synced = synced;
            }
            PeerMsg::Snapshot { highest } if following_sender => {
                engine.observe_token(highest);
                engine.clear_grants();
                self.synced = false;
            }
            PeerMsg::Grant {
                key,
                token,
                remaining_ms,
                holder,
            } => {
                engine.observe_token(token);
                if following_sender {
                    engine
                        .apply_grant(now, key, token, remaining_ms, holder)
                        .map_err(|refusal| refusal.to_string())?;
                }
            }
            PeerMsg::Release { key, token } if following_sender => engine.apply_release(key, token),
            PeerMsg::Synced if following_sender => {
                if !self.synced {
                    tracing::info!(active = %self.cfg.peers[from], "holds a full snapshot of the active {}", self.cfg.peers[from]);
                }
                self.synced = true;
            }
            PeerMsg::Handoff { highest } if following_sender => {
                engine.observe_token(highest);
                // The sender gave the role up and follows us now, without
                // our snapshot: what its last heartbeat said is stale.
                let p = &mut self.peers[from];
                p.claims_active = false;
                p.following = Some(self.cfg.me);
                p.synced = false;
                if !self.leaving {
                    let reason = format!("{} handed the active role over", self.cfg.peers[from]);
                    self.become_active(engine, &reason, true);
                }
            }
            PeerMsg::Handoff { highest } => {
                // From a node we do not follow: we do not have its state
                // (its snapshot was not replication to us), so taking the
                // role could grant a lock it granted. It is leaving all the
                // same: the normal rule picks the next active.
                engine.observe_token(highest);
                self.peers[from].claims_active = false;
            }
            // Replication from a node we do not follow (any more): ignored.
            PeerMsg::Snapshot { .. } | PeerMsg::Release { .. } | PeerMsg::Synced => {}
        }
        self.evaluate(now, engine);
        Ok(())
    }

    /// Liveness, role decisions and heartbeats due at `now`.
    pub fn tick(&mut self, now: Now, engine: &mut Engine) {
        // The loop ticks at least once per heartbeat (`next_deadline`). A
        // longer gap means this process did not run (SIGSTOP, a VM or swap
        // stall): its peers' silence is its own, and what they sent waits
        // unread in its sockets (io_uring may post it a turn or two later).
        // Judged now, every peer would be dead and a standby would make
        // itself active and serve the requests queued meanwhile before it
        // read a single heartbeat. Give every live peer (and the start-up
        // grace) a new timeout instead.
        let stall = self.cfg.heartbeat_ms + (self.cfg.peer_timeout_ms - self.cfg.heartbeat_ms) / 2;
        if now.ms.saturating_sub(self.last_tick_ms) > stall {
            for p in &mut self.peers {
                if p.heard_ms.is_some() {
                    p.heard_ms = Some(now.ms);
                }
            }
            if self.last_tick_ms < self.started_ms + self.cfg.peer_timeout_ms {
                // Stalled in the start-up grace: it starts over.
                self.started_ms = now.ms;
            }
            // So do handshakes in progress: the peer's answer may be
            // waiting unread, and closing the link now would refuse it as
            // a line out of place.
            let until = now.ms + self.cfg.peer_timeout_ms;
            for pending in self.pending.values_mut() {
                pending.deadline_ms = pending.deadline_ms.max(until);
            }
            for p in &mut self.peers {
                if p.out.is_some() && !p.out_authed {
                    // (u64::MAX, a link already given up, stays.)
                    p.out_deadline_ms = p.out_deadline_ms.max(until);
                }
            }
        }
        self.last_tick_ms = now.ms;
        for i in 0..self.peers.len() {
            let p = &mut self.peers[i];
            if p.heard_ms
                .is_some_and(|h| now.ms >= h + self.cfg.peer_timeout_ms)
            {
                p.heard_ms = None;
                p.claims_active = false;
                self.drop_silent_links(i, engine);
            }
        }
        self.expire_handshakes(now, engine);
        self.redial_deaf_rivals(now, engine);
        self.conflicts.retain(|c| c.until_ms > now.ms);
        self.evaluate(now, engine);
        if now.ms >= self.next_heartbeat_ms {
            self.next_heartbeat_ms = now.ms + self.cfg.heartbeat_ms;
            self.scratch.clear();
            self.encode_heartbeat(engine);
            for i in 0..self.peers.len() {
                // A peer that stopped reading (hung) gets no more heartbeats
                // once a backlog builds: they would only pile up in memory.
                if let Some(conn) = self.peers[i].out
                    && self.peers[i].out_authed
                    && engine.output_mut(conn).len() < HEARTBEAT_BACKLOG_BYTES
                {
                    engine.write_to(conn, &self.scratch);
                }
            }
        }
    }

    /// Sends this turn's replication: a snapshot to each follower whose link
    /// has none yet, the turn's deltas to the others. Called once per loop
    /// turn, before the answers are collected.
    pub fn flush_replication(&mut self, now: Now, engine: &mut Engine) {
        engine.take_replication(&mut self.events);
        if self.role != Role::Active {
            return;
        }
        let me = self.cfg.me;
        // Per peer protocol version (the newest, the one before).
        let mut snapshots: [Option<Vec<u8>>; 2] = [None, None];
        // The events' peer lines, written once for every follower that
        // takes them: into `scratch` for the newest version, `scratch_old`
        // for the one before.
        let mut deltas_encoded = [false; 2];
        for i in 0..self.peers.len() {
            let p = &self.peers[i];
            let Some(conn) = p.out else { continue };
            if i == me || !p.out_authed || p.heard_ms.is_none() || p.following != Some(me) {
                continue;
            }
            let version = p.out_version;
            let v = usize::from(version < wire::VERSION);
            if p.snapshot_sent {
                if !self.events.is_empty() {
                    let scratch = if v == 0 {
                        &mut self.scratch
                    } else {
                        &mut self.scratch_old
                    };
                    if !deltas_encoded[v] {
                        scratch.clear();
                        for event in self.events.iter() {
                            wire::encode_replication(scratch, event, version);
                        }
                        deltas_encoded[v] = true;
                    }
                    engine.write_to(conn, scratch);
                }
            } else {
                let body =
                    snapshots[v].get_or_insert_with(|| encode_snapshot(now, engine, version));
                self.stats.snapshots_sent += 1;
                engine.write_to(conn, body);
                let p = &mut self.peers[i];
                p.snapshot_sent = true;
                p.snapshot_bytes = body.len();
            }
            let p = &mut self.peers[i];
            let unsent = engine.output_mut(conn).len();
            if unsent > REPLICATION_BACKLOG_BYTES + p.snapshot_bytes {
                // It does not keep up: stop queueing for it. It resyncs from
                // a snapshot on the next link.
                p.out_authed = false;
                p.snapshot_sent = false;
                let reason = format!(
                    "follower {} has {unsent} bytes of replication unread; closing the link \
                     (it resyncs from a snapshot)",
                    self.cfg.peers[i]
                );
                self.doom(conn, reason, engine);
            }
        }
    }

    /// Peer `i` went silent for a whole peer timeout: its links, both ways,
    /// are closed and ours is dialed afresh. TCP would otherwise sit in its
    /// retransmission back-off (0.2 s, 0.6 s, 1.4 s, ... 25 s) after a
    /// partition heals, and each side would hear the other only when its
    /// next retransmission happened to come: two actives for about as long
    /// as the partition lasted. A new connection is tried every
    /// [`DIAL_RETRY_MS`] plus the dial timeout, whatever the partition's
    /// length.
    fn drop_silent_links(&mut self, i: usize, engine: &mut Engine) {
        let silent = format!(
            "{} silent for {} ms: closing its links, dialing afresh",
            self.cfg.peers[i], self.cfg.peer_timeout_ms
        );
        tracing::warn!(peer = %self.cfg.peers[i], "peer {} is down: {silent}", self.cfg.peers[i]);
        let p = &mut self.peers[i];
        if let Some(conn) = p.out {
            // Nothing more goes on it; `on_close` forgets it.
            p.out_authed = false;
            p.snapshot_sent = false;
            p.out_deadline_ms = u64::MAX;
            self.doom(conn, silent.clone(), engine);
        }
        let inbound: Vec<ConnId> = self
            .links_in
            .iter()
            .filter(|&&(_, peer)| peer == i)
            .map(|&(c, _)| c)
            .collect();
        for conn in inbound {
            self.doom(conn, silent.clone(), engine);
        }
    }

    /// Another active that we outrank steps down within a delivery of our
    /// heartbeat. One that still claims the role half a peer timeout after
    /// we first heard it does not hear us: our link to it is dead at its
    /// end (it closed it while the network was down, and the close waits
    /// in TCP's back-off) while its new link to us works. Waiting for TCP
    /// would keep two actives for as long as that back-off; our link is
    /// closed and dialed afresh instead.
    fn redial_deaf_rivals(&mut self, now: Now, engine: &mut Engine) {
        let active = self.role == Role::Active;
        for i in 0..self.peers.len() {
            let rival = active && self.alive(i) && self.peers[i].claims_active && !self.outranks(i);
            if !rival {
                self.peers[i].rival_since = None;
                continue;
            }
            let since = *self.peers[i].rival_since.get_or_insert(now.ms);
            let p = &mut self.peers[i];
            if now.ms < since + self.cfg.peer_timeout_ms / 2 || !p.out_authed {
                continue;
            }
            let Some(conn) = p.out else { continue };
            p.rival_since = Some(now.ms);
            p.out_authed = false;
            p.snapshot_sent = false;
            p.out_deadline_ms = u64::MAX;
            let reason = format!(
                "{} has claimed the active role for {} ms although this node, active, outranks \
                 it: it does not hear this link; closing it, dialing afresh",
                self.cfg.peers[i],
                now.ms - since
            );
            self.doom(conn, reason, engine);
        }
    }

    /// Closes the links whose handshake did not finish in time.
    fn expire_handshakes(&mut self, now: Now, engine: &mut Engine) {
        let mut expired: Vec<ConnId> = self
            .pending
            .iter()
            .filter(|(_, p)| now.ms >= p.deadline_ms)
            .map(|(&conn, _)| conn)
            .collect();
        expired.sort_unstable();
        for conn in expired {
            self.pending.remove(&conn);
            let reason = format!(
                "peer handshake not finished within {} ms",
                self.cfg.peer_timeout_ms
            );
            self.doom(conn, reason, engine);
        }
        for i in 0..self.peers.len() {
            let p = &mut self.peers[i];
            if let Some(conn) = p.out
                && !p.out_authed
                && now.ms >= p.out_deadline_ms
            {
                p.out_deadline_ms = u64::MAX; // doomed once
                let reason = format!(
                    "{} did not answer this node's HELLO within {} ms",
                    self.cfg.peers[i], self.cfg.peer_timeout_ms
                );
                self.doom(conn, reason, engine);
            }
        }
    }

    /// SIGINT/SIGTERM: an active node hands over to the highest-priority
    /// alive peer it has a link to. Returns that peer, if any. Either way no
    /// role changes happen after this.
    pub fn leave(&mut self, now: Now, engine: &mut Engine) -> Option<usize> {
        self.leaving = true;
        if self.role != Role::Active {
            return None;
        }
        // A follower with the whole state first; any linked follower
        // otherwise (it gets a snapshot before HANDOFF). A peer that does
        // not follow us would ignore that snapshot (it is not replication
        // from its active) and take over with whatever state it had: no
        // hand-off then, the peers fail over as if we had crashed.
        let me = self.cfg.me;
        let linked = |p: usize| {
            self.alive(p)
                && self.peers[p].out.is_some()
                && self.peers[p].out_authed
                && self.peers[p].following == Some(me)
        };
        let synced = |p: usize| {
            let peer = &self.peers[p];
            linked(p) && peer.synced && peer.snapshot_sent
        };
        let n = self.peers.len();
        let successor = (0..n)
            .find(|&p| synced(p))
            .or_else(|| (0..n).find(|&p| linked(p)));
        let Some(successor) = successor else {
            // Nobody to hand over to: this node stops serving all the same
            // (the caller steps the engine down), and the peers fail over
            // as after a crash.
            self.role = Role::Standby { following: None };
            self.stats.stepped_down += 1;
            tracing::warn!(
                role = "standby",
                "role: active -> standby (leaving, and no live peer follows this node to hand \
                 over to: the peers fail over as after a crash)"
            );
            return None;
        };
        self.hand_off(now, successor, engine);
        Some(successor)
    }

    /// The role rule (module docs), applied to what we know now.
    #[expect(clippy::too_many_lines)]
    fn evaluate(&mut self, now: Now, engine: &mut Engine) {
        if self.leaving {
            return;
        }
        let me = self.cfg.me;
        let n = self.peers.len();
        let active_peer = self.best_active_peer();
        let eligible = self.eligible(now);
        match self.role {
            Role::Active if !eligible => {
                // A peer with another configuration may be active: of two
                // configurations only the lower fingerprint serves.
                let why = self.problem(now).unwrap_or("not eligible").to_string();
                self.follow(active_peer, engine, &why);
            }
            Role::Active => {
                if !self.synced
                    && (0..n).any(|p| {
                        let peer = &self.peers[p];
                        self.alive(p)
                            && peer.following == Some(me)
                            && peer.synced
                            && peer.snapshot_sent
                    })
                {
                    // A follower holds our snapshot: our table is the
                    // cluster's state now.
                    self.synced = true;
                    self.next_heartbeat_ms = 0;
                }
                if let Some(better) = active_peer.filter(|&p| self.outranks(p)) {
                    // Two actives: the outranked one steps down.
                    let why = if self.peers[better].synced && !self.synced {
                        format!(
                            "two actives: {} holds the cluster's state",
                            self.cfg.peers[better]
                        )
                    } else {
                        format!(
                            "two actives: {} has the higher priority",
                            self.cfg.peers[better]
                        )
                    };
                    self.follow(Some(better), engine, &why);
                    return;
                }
                let first_alive = (0..me).find(|&p| self.alive(p));
                if let Some(p) = first_alive {
                    let peer = &self.peers[p];
                    if peer.following == Some(me) && peer.synced && peer.snapshot_sent {
                        tracing::info!(
                            to = %self.cfg.peers[p],
                            "handing the active role back to {}: it has the higher priority and \
                             holds a full snapshot",
                            self.cfg.peers[p]
                        );
                        self.hand_off(now, p, engine);
                    }
                }
            }
            Role::Standby { following } => match active_peer {
                Some(a) if following != Some(a) => {
                    let why = format!("{} is active", self.cfg.peers[a]);
                    self.follow(Some(a), engine, &why);
                }
                Some(_) => {}
                None => {
                    // Keep following a higher-priority node that is alive
                    // but not active yet (a hand-off on its way to it): it
                    // decides before we may.
                    if let Some(f) = following.filter(|&f| !self.alive(f) || f > me) {
                        let why = if self.alive(f) {
                            format!("{} is no longer active", self.cfg.peers[f])
                        } else {
                            format!("{} is down", self.cfg.peers[f])
                        };
                        self.follow(None, engine, &why);
                    }
                    let grace_over = now.ms >= self.started_ms + self.cfg.peer_timeout_ms;
                    // A node without state (started, never synced, follows
                    // nobody) must not take over, and drop every grant,
                    // while a node that has the state is alive: it waits,
                    // and the others do not wait for it.
                    let empty = |p: &Peer| !p.synced && p.following.is_none() && !p.claims_active;
                    let me_empty = !self.synced && following.is_none();
                    let any_state =
                        !me_empty || (0..n).any(|p| self.alive(p) && !empty(&self.peers[p]));
                    let blocks = |p: usize| self.alive(p) && (!any_state || !empty(&self.peers[p]));
                    let higher_alive = (0..me).any(blocks);
                    // A live peer still follows an active we do not hear:
                    // that active is alive and serving, and only our path
                    // from it is broken (its packets to us are lost, or a
                    // fault cut us from it alone). Taking over would make
                    // two actives for as long as the fault lasts; we wait,
                    // and name it to clients. Should it be gone, that peer
                    // stops following it within its own timeout.
                    let active_elsewhere = self.hearsay_active().is_some();
                    if eligible
                        && grace_over
                        && (!me_empty || !any_state)
                        && !higher_alive
                        && !active_elsewhere
                    {
                        self.become_active(
                            engine,
                            "no node is active and no node of higher priority is up",
                            false,
                        );
                    } else if self.role == (Role::Standby { following: None }) {
                        self.name_hearsay_active(engine);
                    }
                }
            },
        }
    }

    /// Of two actives, peer `p` (alive, active) and this node: whether `p`
    /// is the one to stay. One that holds the cluster's state (`synced`)
    /// outranks one that does not; between two alike, the higher priority
    /// (lower index). Both sides of a heal decide the same way from each
    /// other's heartbeats; a stale heartbeat can only understate a peer's
    /// state (an active gains it, never loses it), so two actives may
    /// both stay for a heartbeat, never both step down.
    fn outranks(&self, p: usize) -> bool {
        let theirs = self.peers[p].synced;
        theirs && !self.synced || (theirs == self.synced && p < self.cfg.me)
    }

    /// The alive peer claiming the role that outranks every other such
    /// peer (the same order as [`Cluster::outranks`]).
    fn best_active_peer(&self) -> Option<usize> {
        (0..self.peers.len())
            .filter(|&p| self.alive(p) && self.peers[p].claims_active)
            .min_by_key(|&p| (!self.peers[p].synced, p))
    }

    /// A standby that hears no active (say the active's packets to it are
    /// lost) while its live peers follow one names that one in its `M`
    /// answers: clients that asked it go there rather than wait and retry
    /// here (`M key -`) for as long as the fault lasts. It does not follow
    /// it: it has no link from it to take replication on.
    fn name_hearsay_active(&mut self, engine: &mut Engine) {
        let named = self.hearsay_active();
        if named != self.named {
            self.named = named;
            engine.step_down(named.map(|a| self.cfg.peers[a].as_str()));
        }
    }

    /// The active a live peer follows that we do not hear ourselves (the
    /// highest-priority one, should they differ). A node we hear is left
    /// out: were it active we would follow it, and a peer that still
    /// follows it while it is not (it stepped down, or a hand-off is on its
    /// way) says nothing of an active elsewhere.
    fn hearsay_active(&self) -> Option<usize> {
        let me = self.cfg.me;
        (0..self.peers.len())
            .filter(|&p| self.alive(p))
            .filter_map(|p| self.peers[p].following)
            .filter(|&a| a != me && !self.alive(a))
            .min()
    }

    fn follow(&mut self, active: Option<usize>, engine: &mut Engine, why: &str) {
        self.named = None;
        let before = self.role;
        self.role = Role::Standby { following: active };
        let following = active.map_or("-", |a| self.cfg.peers[a].as_str());
        if active.is_some() {
            self.known_active = true;
        }
        if before == Role::Active && why.starts_with(HAND_OFF) {
            // Planned: leaving, or handing the role back to a higher
            // priority that holds our snapshot.
            self.stats.stepped_down += 1;
            tracing::info!(
                role = "standby",
                following,
                "role: active -> standby, following {following} ({why})"
            );
        } else if before == Role::Active {
            // Two actives, or a configuration that may not serve.
            self.stats.stepped_down += 1;
            tracing::warn!(
                role = "standby",
                following,
                "role: active -> standby, following {following} ({why})"
            );
        } else if before != self.role {
            tracing::info!(
                role = "standby",
                following,
                "role: standby, now following {following} ({why})"
            );
        }
        // Tell the peers at once (next turn), not at the next heartbeat.
        self.next_heartbeat_ms = 0;
        // Synced to a new active only once its snapshot is in; following
        // nobody, the copy of the last active's state is kept (and
        // heartbeats say so).
        if active.is_some() {
            self.synced = false;
        }
        engine.step_down(active.map(|a| self.cfg.peers[a].as_str()));
    }

    /// Takes the role. `planned`: handed over by the active; otherwise
    /// by the role rule, which is a failover (WARN) once this node has
    /// known an active, and the cluster's first election (INFO) before.
    fn become_active(&mut self, engine: &mut Engine, why: &str, planned: bool) {
        self.named = None;
        if self.role != Role::Active {
            self.stats.became_active += 1;
            if planned || !self.known_active {
                tracing::info!(role = "active", "role: standby -> active ({why})");
            } else {
                tracing::warn!(role = "active", "role: standby -> active ({why})");
            }
        }
        self.known_active = true;
        self.role = Role::Active;
        // Tell the peers at once (next turn), not at the next heartbeat:
        // until then they answer clients `M key -`.
        self.next_heartbeat_ms = 0;
        // `synced` stays what it was: whether the table we serve from is
        // the cluster's state (see the field).
        for p in &mut self.peers {
            p.snapshot_sent = false;
        }
        engine.become_active();
    }

    /// Hands the role to `to`: this turn's deltas first, then our waiters
    /// are answered `M to`, then `HANDOFF` on the same link, so that `to`
    /// has everything before it starts serving.
    fn hand_off(&mut self, now: Now, to: usize, engine: &mut Engine) {
        self.flush_replication(now, engine);
        let Some(conn) = self.peers[to].out.filter(|_| self.peers[to].out_authed) else {
            return;
        };
        if !self.peers[to].snapshot_sent {
            // It has not got our state on this link yet: send it first, so
            // that it has everything before HANDOFF.
            let snapshot = encode_snapshot(now, engine, self.peers[to].out_version);
            engine.write_to(conn, &snapshot);
            self.stats.snapshots_sent += 1;
            self.peers[to].snapshot_sent = true;
        }
        let why = format!("{HAND_OFF} {}", self.cfg.peers[to]);
        self.stats.handoffs += 1;
        self.follow(Some(to), engine, &why);
        self.scratch.clear();
        let highest = engine.highest_token();
        wire::encode(&mut self.scratch, &PeerMsg::Handoff { highest });
        engine.write_to(conn, &self.scratch);
    }

    fn encode_heartbeat(&mut self, engine: &Engine) {
        let (active, following) = match self.role {
            Role::Active => (true, None),
            Role::Standby { following } => (false, following),
        };
        wire::encode(
            &mut self.scratch,
            &PeerMsg::Heartbeat {
                active,
                following,
                highest: engine.highest_token(),
                synced: self.synced,
            },
        );
    }
}

impl Cluster {
    /// Asserts the state machine's invariants (tests, fuzzing, simulation).
    pub fn check_invariants(&self, now: Now, engine: &Engine) {
        let me = self.cfg.me;
        let n = self.peers.len();
        assert_eq!(
            self.role == Role::Active,
            engine.is_active(),
            "the engine serves exactly when the node is active"
        );
        if let Role::Standby { following: Some(f) } = self.role {
            assert!(f < n && f != me, "follows a real other node");
        }
        if self.role == Role::Active && !self.leaving {
            assert!(
                self.eligible(now),
                "active despite a configuration conflict"
            );
        }
        let mine = &self.peers[me];
        assert!(mine.out.is_none() && mine.links_in == 0 && mine.heard_ms.is_none());
        for (i, p) in self.peers.iter().enumerate() {
            let links = self.links_in.iter().filter(|&&(_, peer)| peer == i).count();
            assert_eq!(p.links_in as usize, links, "link count of peer {i}");
            assert!(
                !p.out_authed || p.out.is_some(),
                "authenticated link without a link"
            );
            assert!(
                !p.snapshot_sent || p.out_authed,
                "snapshot on an unauthenticated link"
            );
            assert!(
                !p.claims_active || p.heard_ms.is_some(),
                "a dead peer claims the role"
            );
            assert!(p.following.is_none_or(|f| f < n));
            assert!(!(p.dialing && p.out.is_some()), "dialing a linked peer");
        }
        assert!(self.pending.len() <= MAX_PENDING_HANDSHAKES);
        assert!(self.conflicts.len() <= MAX_CONFLICTS);
        for &(conn, peer) in &self.links_in {
            assert!(peer < n && peer != me);
            assert!(
                !self.pending.contains_key(&conn),
                "link both pending and authenticated"
            );
            assert!(
                self.peers.iter().all(|p| p.out != Some(conn)),
                "link both ways"
            );
        }
        for conn in self.pending.keys() {
            assert!(self.peers.iter().all(|p| p.out != Some(*conn)));
        }
        for &conn in &self.superseded {
            assert!(
                self.is_authenticated_in(conn),
                "a superseded link is an authenticated inbound one, until it closes"
            );
        }
        for &conn in &self.given_up {
            assert!(
                self.is_peer_link(conn) && !self.pending.contains_key(&conn),
                "a given-up link is an authenticated one, until it closes"
            );
        }
    }
}

/// The longest reason a peer link is closed with: its `E` line stays well
/// within a line's 512 bytes.
pub const MAX_REASON_BYTES: usize = 400;

/// `reason`, cut to [`MAX_REASON_BYTES`] (at a character boundary) with
/// `...`.
pub fn shorten(mut reason: String) -> String {
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

/// A whole snapshot of the engine's grants: `SNAP`, one `G` per grant,
/// `SYNCED`.
fn encode_snapshot(now: Now, engine: &Engine, version: u64) -> Vec<u8> {
    let mut out = Vec::new();
    let highest = engine.highest_token();
    wire::encode(&mut out, &PeerMsg::Snapshot { highest });
    for grant in engine.snapshot(now) {
        wire::encode_replication(&mut out, grant, version);
    }
    wire::encode(&mut out, &PeerMsg::Synced);
    out
}

#[cfg(test)]
mod tests;

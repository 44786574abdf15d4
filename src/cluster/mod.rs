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
//!   a restarted node hears an existing active before it decides anything.
//! - An active that hears a higher-priority active steps down (demotion
//!   after a split brain); one that sees a higher-priority peer following it
//!   with a complete snapshot hands the role over to it (failback).
//! - The active replicates every change of its table to the peers that
//!   follow it: a snapshot first on each link, then the deltas of each loop
//!   turn in one write.
//! - Every heartbeat carries the sender's highest token, and every node
//!   observes it: whoever becomes active issues tokens above everything it
//!   has heard of.
//!
//! Links are one-directional: each node dials every other node and only
//! sends on the connection it dialed, so "what I hear from p" and "what I
//! send to p" are separate connections with separate lives.

pub mod wire;

use crate::engine::{ConnId, Engine, Now};
use wire::PeerMsg;

/// Unsent bytes on a link past which heartbeats are not queued on it.
const HEARTBEAT_BACKLOG_BYTES: usize = 64 * 1024;

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
    dialing: bool,
    next_dial_ms: u64,
    /// Our link carries a snapshot from us (sent while we were active).
    snapshot_sent: bool,
    /// Its links to us that are open.
    links_in: u32,
    incarnation: u64,
    /// When we last heard from it; None: dead.
    heard_ms: Option<u64>,
    /// From its last heartbeat.
    claims_active: bool,
    following: Option<usize>,
    synced: bool,
}

/// The cluster state machine of one node. It acts on the engine (roles,
/// replicated grants, tokens) and writes peer lines into the engine's
/// per-connection output.
pub struct Cluster {
    cfg: ClusterConfig,
    peers: Vec<Peer>,
    role: Role,
    /// As a standby: a complete snapshot from `following` has arrived.
    synced: bool,
    started_ms: u64,
    /// When `tick` last ran.
    last_tick_ms: u64,
    next_heartbeat_ms: u64,
    /// Inbound links: connection → peer index.
    links_in: Vec<(ConnId, usize)>,
    /// Shutting down: no more role changes.
    leaving: bool,
    scratch: Vec<u8>,
}

impl Cluster {
    /// A node that starts as a standby knowing no active; the engine is told.
    pub fn new(cfg: ClusterConfig, now: Now, engine: &mut Engine) -> Cluster {
        assert!(cfg.me < cfg.peers.len(), "this node is not in --peers");
        assert!(cfg.heartbeat_ms > 0 && cfg.peer_timeout_ms > cfg.heartbeat_ms);
        engine.enable_replication();
        engine.step_down(None);
        let peers = vec![Peer::default(); cfg.peers.len()];
        Cluster {
            cfg,
            peers,
            role: Role::Standby { following: None },
            synced: false,
            started_ms: now.ms,
            last_tick_ms: now.ms,
            next_heartbeat_ms: now.ms,
            links_in: Vec::new(),
            leaving: false,
            scratch: Vec::new(),
        }
    }

    pub fn role(&self) -> Role {
        self.role
    }

    pub fn me(&self) -> usize {
        self.cfg.me
    }

    /// The address of peer `i` as listed in `--peers`.
    pub fn peer_addr(&self, i: usize) -> &str {
        &self.cfg.peers[i]
    }

    /// True if `conn` is a link to or from a peer.
    pub fn is_peer_conn(&self, conn: ConnId) -> bool {
        self.links_in.iter().any(|&(c, _)| c == conn)
            || self.peers.iter().any(|p| p.out == Some(conn))
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
    /// engine already): introduce ourselves and send a heartbeat.
    pub fn outbound_open(&mut self, conn: ConnId, peer: usize, engine: &mut Engine) {
        let p = &mut self.peers[peer];
        debug_assert!(p.out.is_none());
        p.out = Some(conn);
        p.dialing = false;
        p.snapshot_sent = false;
        self.scratch.clear();
        let addr = self.cfg.peers[self.cfg.me].as_bytes();
        wire::encode(
            &mut self.scratch,
            &PeerMsg::Hello {
                from: self.cfg.me,
                addr,
                incarnation: self.cfg.incarnation,
            },
        );
        self.encode_heartbeat(engine);
        engine.write_to(conn, &self.scratch);
    }

    /// A connection closed: if it was a peer link, forget it. A peer whose
    /// links both ways are all closed is dead at once (a crashed process
    /// closes all its sockets); one broken link alone is not a crash, and
    /// leaves liveness to the heartbeats. A closed link of ours is dialed
    /// again.
    pub fn on_close(&mut self, now: Now, conn: ConnId, engine: &mut Engine) {
        let mut touched = None;
        if let Some(i) = self.peers.iter().position(|p| p.out == Some(conn)) {
            let p = &mut self.peers[i];
            p.out = None;
            p.snapshot_sent = false;
            p.next_dial_ms = now.ms + DIAL_RETRY_MS;
            touched = Some(i);
        }
        if let Some(i) = self.links_in.iter().position(|&(c, _)| c == conn) {
            let (_, peer) = self.links_in.swap_remove(i);
            self.peers[peer].links_in -= 1;
            touched = Some(peer);
        }
        // Dead at once only when every link, both ways, is gone (a crashed
        // process's sockets all close); one broken link is not a crash.
        if let Some(i) = touched {
            let p = &mut self.peers[i];
            if p.links_in == 0 && p.out.is_none() && p.heard_ms.is_some() {
                p.heard_ms = None;
                p.claims_active = false;
                self.evaluate(now, engine);
            }
        }
    }

    /// Handles one peer line received on `conn`.
    pub fn on_message(
        &mut self,
        now: Now,
        conn: ConnId,
        msg: PeerMsg<'_>,
        engine: &mut Engine,
    ) -> Result<(), String> {
        if let PeerMsg::Hello {
            from,
            addr,
            incarnation,
        } = msg
        {
            return self.on_hello(now, conn, from, addr, incarnation);
        }
        let Some(&(_, from)) = self.links_in.iter().find(|&&(c, _)| c == conn) else {
            return Err("peer message before HELLO".into());
        };
        self.peers[from].heard_ms = Some(now.ms);
        let following_sender = self.role
            == Role::Standby {
                following: Some(from),
            };
        match msg {
            PeerMsg::Hello { .. } => unreachable!(),
            PeerMsg::Heartbeat {
                active,
                following,
                highest,
                synced,
            } => {
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
            } => {
                engine.observe_token(token);
                if following_sender {
                    engine
                        .apply_grant(now, key, token, remaining_ms)
                        .map_err(|refusal| refusal.to_string())?;
                }
            }
            PeerMsg::Release { key, token } if following_sender => engine.apply_release(key, token),
            PeerMsg::Synced if following_sender => self.synced = true,
            PeerMsg::Handoff { highest } if following_sender => {
                engine.observe_token(highest);
                // The sender gave the role up and follows us now, without
                // our snapshot: what its last heartbeat said is stale.
                let p = &mut self.peers[from];
                p.claims_active = false;
                p.following = Some(self.cfg.me);
                p.synced = false;
                if !self.leaving {
                    self.become_active(engine);
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

    fn on_hello(
        &mut self,
        now: Now,
        conn: ConnId,
        from: usize,
        addr: &[u8],
        incarnation: u64,
    ) -> Result<(), String> {
        if from >= self.peers.len() || from == self.cfg.me {
            return Err(format!("HELLO from unknown peer index {from}"));
        }
        if addr != self.cfg.peers[from].as_bytes() {
            return Err(format!(
                "HELLO from \"{}\" as peer {from}, which is {} here: are --peers the same on every node?",
                String::from_utf8_lossy(addr),
                self.cfg.peers[from]
            ));
        }
        if self.links_in.iter().any(|&(c, _)| c == conn) {
            return Err("second HELLO on one link".into());
        }
        self.links_in.push((conn, from));
        let p = &mut self.peers[from];
        p.links_in += 1;
        if p.incarnation != incarnation {
            // A new process: what we knew of the old one is void.
            p.incarnation = incarnation;
            p.claims_active = false;
            p.following = None;
            p.synced = false;
            p.snapshot_sent = false;
        }
        p.heard_ms = Some(now.ms);
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
        }
        self.last_tick_ms = now.ms;
        for p in &mut self.peers {
            if p.heard_ms
                .is_some_and(|h| now.ms >= h + self.cfg.peer_timeout_ms)
            {
                p.heard_ms = None;
                p.claims_active = false;
            }
        }
        self.evaluate(now, engine);
        if now.ms >= self.next_heartbeat_ms {
            self.next_heartbeat_ms = now.ms + self.cfg.heartbeat_ms;
            self.scratch.clear();
            self.encode_heartbeat(engine);
            for i in 0..self.peers.len() {
                // A peer that stopped reading (hung) gets no more heartbeats
                // once a backlog builds: they would only pile up in memory.
                if let Some(conn) = self.peers[i].out
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
        engine.take_replication(&mut self.scratch);
        if self.role != Role::Active {
            return;
        }
        let me = self.cfg.me;
        let mut snapshot: Option<Vec<u8>> = None;
        for i in 0..self.peers.len() {
            let p = &self.peers[i];
            let Some(conn) = p.out else { continue };
            if i == me || p.heard_ms.is_none() || p.following != Some(me) {
                continue;
            }
            if p.snapshot_sent {
                if !self.scratch.is_empty() {
                    engine.write_to(conn, &self.scratch);
                }
                continue;
            }
            let body = snapshot.get_or_insert_with(|| encode_snapshot(now, engine));
            engine.write_to(conn, body);
            self.peers[i].snapshot_sent = true;
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
            self.alive(p) && self.peers[p].out.is_some() && self.peers[p].following == Some(me)
        };
        let synced = |p: usize| {
            let peer = &self.peers[p];
            linked(p) && peer.synced && peer.snapshot_sent
        };
        let n = self.peers.len();
        let successor = (0..n)
            .find(|&p| synced(p))
            .or_else(|| (0..n).find(|&p| linked(p)))?;
        self.hand_off(now, successor, engine);
        Some(successor)
    }

    /// The role rule (module docs), applied to what we know now.
    fn evaluate(&mut self, now: Now, engine: &mut Engine) {
        if self.leaving {
            return;
        }
        let me = self.cfg.me;
        let n = self.peers.len();
        let active_peer = (0..n).find(|&p| self.alive(p) && self.peers[p].claims_active);
        match self.role {
            Role::Active => {
                if let Some(higher) = active_peer.filter(|&p| p < me) {
                    // Two actives: the lower priority steps down.
                    self.follow(Some(higher), engine);
                    return;
                }
                let first_alive = (0..me).find(|&p| self.alive(p));
                if let Some(p) = first_alive {
                    let peer = &self.peers[p];
                    if peer.following == Some(me) && peer.synced && peer.snapshot_sent {
                        self.hand_off(now, p, engine);
                    }
                }
            }
            Role::Standby { following } => match active_peer {
                Some(a) if following != Some(a) => self.follow(Some(a), engine),
                Some(_) => {}
                None => {
                    // Keep following a higher-priority node that is alive
                    // but not active yet (a hand-off on its way to it): it
                    // decides before we may.
                    if following.is_some_and(|f| !self.alive(f) || f > me) {
                        self.follow(None, engine);
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
                    if grace_over && (!me_empty || !any_state) && !higher_alive {
                        self.become_active(engine);
                    }
                }
            },
        }
    }

    fn follow(&mut self, active: Option<usize>, engine: &mut Engine) {
        self.role = Role::Standby { following: active };
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

    fn become_active(&mut self, engine: &mut Engine) {
        self.role = Role::Active;
        // Tell the peers at once (next turn), not at the next heartbeat:
        // until then they answer clients `M key -`.
        self.next_heartbeat_ms = 0;
        self.synced = false;
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
        let Some(conn) = self.peers[to].out else {
            return;
        };
        if !self.peers[to].snapshot_sent {
            // It has not got our state on this link yet: send it first, so
            // that it has everything before HANDOFF.
            let snapshot = encode_snapshot(now, engine);
            engine.write_to(conn, &snapshot);
            self.peers[to].snapshot_sent = true;
        }
        self.follow(Some(to), engine);
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

/// A whole snapshot of the engine's grants: `SNAP`, one `G` per grant,
/// `SYNCED`.
fn encode_snapshot(now: Now, engine: &Engine) -> Vec<u8> {
    let mut out = Vec::new();
    let highest = engine.highest_token();
    wire::encode(&mut out, &PeerMsg::Snapshot { highest });
    engine.snapshot(now, &mut out);
    wire::encode(&mut out, &PeerMsg::Synced);
    out
}

#[cfg(test)]
mod tests;

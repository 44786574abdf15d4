//! Links and liveness: dialing peers and redialing them, the links'
//! handshake deadlines, a peer heard or gone silent, and what the loop
//! must wake up for.

use super::*;

impl Cluster {
    /// The earliest time `tick` has work: the next heartbeat, dial or
    /// liveness deadline.
    pub fn next_deadline(&self) -> u64 {
        let mut next = self.next_heartbeat_ms;
        for (i, p) in with_ids(&self.peers) {
            if i == self.cfg.me {
                continue;
            }
            if let Some(dial) = p.out.next_dial_ms() {
                next = next.min(dial);
            }
            if let Some(heard) = p.heard_ms {
                next = next.min(heard + self.cfg.peer_timeout_ms);
            }
            if let Some(deadline) = p.out.handshake_deadline_ms() {
                next = next.min(deadline);
            }
        }
        if self.role == Role::Active {
            for p in &self.peers {
                if let Some(since) = p.ready_since {
                    let due = since.saturating_add(self.cfg.failback_delay_ms);
                    if due > self.last_tick_ms {
                        next = next.min(due);
                    }
                }
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

    /// How long, at most, reads of `conn` wait while it is busy (µs; 0: it
    /// is read as bytes arrive): [`ClusterConfig::read_batch_us`] for our
    /// standby's authenticated link from the active it follows, 0 for
    /// every other connection.
    #[inline]
    pub fn read_batch_us(&self, conn: ConnId) -> u64 {
        let Role::Standby {
            following: Some(active),
        } = self.role
        else {
            return 0;
        };
        if self.links_in.contains(&(conn, active)) {
            self.cfg.read_batch_us
        } else {
            0
        }
    }

    /// Peers to dial now: `(index, address)`. Each is dialing until
    /// [`Cluster::outbound_open`] or [`Cluster::dial_failed`].
    pub fn take_dials(&mut self, now: Now, into: &mut Vec<(PeerId, String)>) {
        for (i, p) in with_ids_mut(&mut self.peers) {
            if i != self.cfg.me && p.out.start_dial(now.ms) {
                into.push((i, self.cfg.peers[i].clone()));
            }
        }
    }

    pub fn dial_failed(&mut self, peer: PeerId, now: Now) {
        let retry = self.dial_retry_ms();
        self.peers[peer].out.dial_failed(now.ms + retry);
    }

    /// Our dial to `peer` succeeded as connection `conn` (opened in the
    /// engine already): introduce ourselves with a fresh nonce. Nothing else
    /// goes on the link until the peer's `CHALLENGE` proves it.
    pub fn outbound_open(&mut self, now: Now, conn: ConnId, peer: PeerId, out: &mut Outbox) {
        let nonce = self.next_nonce();
        let p = &mut self.peers[peer];
        p.out.opened(conn, nonce, now.ms + self.cfg.peer_timeout_ms);
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
        out.write_link(conn, &self.scratch);
    }

    /// A connection closed: if it was a peer link, forget it. A peer whose
    /// links both ways are all closed is dead at once (a crashed process
    /// closes all its sockets); one broken link alone is not a crash, and
    /// leaves liveness to the heartbeats. A closed link of ours is dialed
    /// again.
    pub(crate) fn on_close(
        &mut self,
        now: Now,
        conn: ConnId,
        engine: &mut Engine,
        out: &mut Outbox,
    ) {
        let mut touched = None;
        // Only the close of an authenticated link is news: our dial to a
        // peer's address may meet anything listening there (the peer is
        // down and something else has its port), at every retry.
        let mut authed = false;
        if let Some(i) = self.peer_by(|p| p.out.conn() == Some(conn)) {
            let retry = self.dial_retry_ms();
            let p = &mut self.peers[i];
            authed = p.out.closed(now.ms + retry);
            p.snapshot_sent = false;
            p.ready_since = None;
            touched = Some(i);
        }
        self.pending.remove(&conn);
        if let Some(i) = self.links_in.iter().position(|&(c, _)| c == conn) {
            let (_, peer) = self.links_in.swap_remove(i);
            self.peers[peer].links_in -= 1;
            if self.peers[peer].links_in == 0 {
                // A merge cut off with its link.
                self.peers[peer].in_merge = false;
                self.peers[peer].next_limit = None;
            }
            self.peers[peer].ready_since = None;
            touched = Some(peer);
            authed = true;
        }
        // Dead at once only when every link, both ways, is gone (a crashed
        // process's sockets all close); one broken link is not a crash, and
        // neither is a link the peer gave up with an `E` line.
        self.superseded.retain(|&c| c != conn);
        // A link doomed and then closed before the loop took it: the loop
        // may give its id to a new connection, which is no doomed link.
        self.doomed.retain(|&(c, _)| c != conn);
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
            tracing::info!(target: LOG_TARGET, peer = %self.cfg.peers[i], "a link with {} is down: {why}", self.cfg.peers[i]);
        }
        if let Some(i) = touched.filter(|_| given_up.is_none()) {
            let p = &mut self.peers[i];
            if p.links_in == 0 && p.out.conn().is_none() && p.heard_ms.is_some() {
                p.heard_ms = None;
                p.claims_active = false;
                tracing::warn!(target: LOG_TARGET, peer = %self.cfg.peers[i], "peer {} is down: all its links closed", self.cfg.peers[i]);
                self.evaluate(now, engine, out);
            }
        }
    }

    /// Liveness, role decisions and heartbeats due at `now`.
    pub fn tick(&mut self, now: Now, engine: &mut Engine, out: &mut Outbox) {
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
                // (A link already given up has none, and keeps none.)
                p.out.extend_deadline(until);
            }
            self.redial_after_stall(now, out);
            self.step_down_after_stall(now, engine, out);
        }
        self.last_tick_ms = now.ms;
        for i in PeerId::all(self.peers.len()) {
            let p = &mut self.peers[i];
            if p.heard_ms
                .is_some_and(|h| now.ms >= h + self.cfg.peer_timeout_ms)
            {
                p.heard_ms = None;
                p.claims_active = false;
                self.drop_silent_links(i, out);
            }
        }
        self.expire_handshakes(now, out);
        self.redial_deaf_peers(now, out);
        self.conflicts.retain(|c| c.until_ms > now.ms);
        self.evaluate(now, engine, out);
        if now.ms >= self.next_heartbeat_ms {
            self.next_heartbeat_ms = now.ms + self.cfg.heartbeat_ms;
            self.scratch.clear();
            self.encode_heartbeat(engine);
            for i in PeerId::all(self.peers.len()) {
                // A peer that stopped reading (hung) gets no more heartbeats
                // once a backlog builds: they would only pile up in memory.
                if let Some(conn) = self.peers[i].out.ready_conn()
                    && out.len(conn) < HEARTBEAT_BACKLOG_BYTES
                {
                    out.write_link(conn, &self.scratch);
                }
            }
        }
    }

    /// Whether a gap of `gap_ms` without a tick may have made our peers
    /// count us dead: our last heartbeat went out up to one heartbeat
    /// before our last turn.
    fn peers_may_count_us_dead(&self, gap_ms: u64) -> bool {
        gap_ms + self.cfg.heartbeat_ms >= self.cfg.peer_timeout_ms
    }

    /// A node that did not run for long enough that its peers may have
    /// counted it dead: they closed their links with it, both ways
    /// ([`Cluster::drop_silent_links`]), and dialed it afresh. Its own
    /// links to them are dead at their end, but the close reaches it only
    /// when TCP's back-off retransmits into it, which may take seconds.
    /// Meanwhile it would hear them on their new links while they hear
    /// nothing of it: an active it becomes again would not be followed,
    /// and two actives would each stay in the role. Its links are closed
    /// and dialed afresh at once; at worst (the peers kept them) that is
    /// one reconnection each.
    fn redial_after_stall(&mut self, now: Now, out: &mut Outbox) {
        let gap = now.ms.saturating_sub(self.last_tick_ms);
        if !self.peers_may_count_us_dead(gap) {
            return;
        }
        for i in PeerId::all(self.peers.len()) {
            let p = &mut self.peers[i];
            if !p.out.is_ready() {
                // A handshake in progress has had its deadline extended:
                // the peer's answer may be waiting unread.
                continue;
            }
            let Some(conn) = p.out.give_up() else {
                continue;
            };
            p.snapshot_sent = false;
            p.ready_since = None;
            let reason = format!(
                "this process did not run for {gap} ms: {} may have closed this link; \
                 dialing afresh",
                self.cfg.peers[i]
            );
            self.doom(conn, reason, out);
        }
    }

    /// An active that did not run for long enough that its peers may have
    /// counted it dead (its last heartbeat went out up to one heartbeat
    /// before its last turn) may have been replaced: another node may have
    /// taken the role and granted keys meanwhile. Serving on, it would
    /// grant those keys again, and at the meeting of the two actives its
    /// higher priority would make the other drop what it granted. It steps
    /// down before it reads a single request (the loops tick first), and
    /// waits one peer timeout, as at its start, to hear who is active: it
    /// follows that node and takes its snapshot (and gets the role back by
    /// the delayed failback if it has the higher priority); if nobody took
    /// over, it takes the role again with its table.
    fn step_down_after_stall(&mut self, now: Now, engine: &mut Engine, out: &mut Outbox) {
        let gap = now.ms.saturating_sub(self.last_tick_ms);
        let may_be_replaced = self.peers_may_count_us_dead(gap);
        if self.role != Role::Active || self.leaving || self.peers.len() < 2 || !may_be_replaced {
            return;
        }
        // Whoever is active now is unknown until its heartbeat is read: what
        // we knew of each peer's role is from before the stall.
        for p in &mut self.peers {
            p.claims_active = false;
            p.following = None;
        }
        self.started_ms = now.ms;
        let why = format!("this process did not run for {gap} ms: a peer may have taken over");
        self.follow(now, None, engine, out, &why);
        debug_assert!(!engine.is_active());
    }

    /// Peer `i` went silent for a whole peer timeout: its links, both ways,
    /// are closed and ours is dialed afresh. TCP would otherwise sit in its
    /// retransmission back-off (0.2 s, 0.6 s, 1.4 s, ... 25 s) after a
    /// partition heals, and each side would hear the other only when its
    /// next retransmission happened to come: two actives for about as long
    /// as the partition lasted. A new connection is tried every
    /// [`Cluster::dial_retry_ms`] plus the dial timeout, whatever the partition's
    /// length.
    pub(super) fn drop_silent_links(&mut self, i: PeerId, out: &mut Outbox) {
        let silent = format!(
            "{} silent for {} ms: closing its links, dialing afresh",
            self.cfg.peers[i], self.cfg.peer_timeout_ms
        );
        tracing::warn!(target: LOG_TARGET, peer = %self.cfg.peers[i], "peer {} is down: {silent}", self.cfg.peers[i]);
        let p = &mut self.peers[i];
        if let Some(conn) = p.out.give_up() {
            // Nothing more goes on it; `on_close` forgets it.
            p.snapshot_sent = false;
            self.doom(conn, silent.clone(), out);
        }
        let inbound: Vec<ConnId> = self
            .links_in
            .iter()
            .filter(|&&(_, peer)| peer == i)
            .map(|&(c, _)| c)
            .collect();
        for conn in inbound {
            self.doom(conn, silent.clone(), out);
        }
    }

    /// A peer that hears our heartbeats answers them within a delivery:
    /// another active that we outrank steps down, a standby that follows
    /// nobody follows us. One that still claims the role, or still follows
    /// nobody, half a peer timeout after we (active) first heard it so does
    /// not hear us: our link to it is dead at its end while its link to us
    /// works. It closed ours while the network was down, or its process
    /// crashed across a partition and came back, and the close reaches us
    /// only with TCP's next retransmission into it, up to seconds later.
    /// Waiting for TCP would keep two actives for as long (the deaf
    /// standby takes the role after its start-up wait); our link is closed
    /// and dialed afresh instead. (A standby that follows another active
    /// is left alone: that active is ours to meet, and a one-way partition
    /// would otherwise have us redial in a loop.)
    pub(super) fn redial_deaf_peers(&mut self, now: Now, out: &mut Outbox) {
        let active = self.role == Role::Active;
        for i in PeerId::all(self.peers.len()) {
            let p = &self.peers[i];
            // What it said within the last two heartbeats: a peer gone
            // silent is not deaf, and is dropped for its silence.
            let fresh = p
                .heard_ms
                .is_some_and(|h| now.ms <= h + 2 * self.cfg.heartbeat_ms);
            let deaf = if !active || !fresh {
                None
            } else if p.claims_active && !self.outranks(i) {
                Some(Deafness::Rival)
            } else if !p.claims_active && p.following.is_none() {
                Some(Deafness::FollowsNobody)
            } else {
                None
            };
            let Some(how) = deaf else {
                self.peers[i].deaf_since = None;
                continue;
            };
            let since = match self.peers[i].deaf_since {
                Some((since, was)) if was == how => since,
                _ => now.ms,
            };
            let p = &mut self.peers[i];
            p.deaf_since = Some((since, how));
            if now.ms < since + self.cfg.peer_timeout_ms / 2 || !p.out.is_ready() {
                continue;
            }
            let Some(conn) = p.out.give_up() else {
                continue;
            };
            let what = match how {
                Deafness::Rival => "has claimed the active role",
                Deafness::FollowsNobody => "has followed no active",
            };
            p.deaf_since = Some((now.ms, how));
            p.snapshot_sent = false;
            p.ready_since = None;
            let reason = format!(
                "{} {what} for {} ms although this node is active: it does not hear this link; \
                 closing it, dialing afresh",
                self.cfg.peers[i],
                now.ms - since
            );
            self.doom(conn, reason, out);
        }
    }

    /// Closes the links whose handshake did not finish in time.
    pub(super) fn expire_handshakes(&mut self, now: Now, out: &mut Outbox) {
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
            self.doom(conn, reason, out);
        }
        for i in PeerId::all(self.peers.len()) {
            let p = &mut self.peers[i];
            if let Some(conn) = p.out.expire(now.ms) {
                let reason = format!(
                    "{} did not answer this node's HELLO within {} ms",
                    self.cfg.peers[i], self.cfg.peer_timeout_ms
                );
                self.doom(conn, reason, out);
            }
        }
    }
}

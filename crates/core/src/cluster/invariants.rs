//! The cluster state machine's invariants, asserted by tests, the
//! simulator, the fuzzer, and after every loop turn of a debug build.

use super::*;

impl Cluster {
    /// Asserts the state machine's invariants (tests, fuzzing, simulation).
    /// The lag probes of each link.
    fn check_replication_state(&self, now: Now) {
        for (i, p) in with_ids(&self.peers) {
            if let Some((seq, sent_us)) = p.probe {
                assert!(seq <= self.probe_seq && seq > 0, "probe {seq} never sent");
                assert!(sent_us <= now.us, "probe sent in the future");
                assert!(i != self.cfg.me, "probed ourselves");
            }
        }
    }

    /// Our link to each peer.
    fn check_out_links(&self, now: Now) {
        for (i, p) in with_ids(&self.peers) {
            assert!(
                !p.snapshot_sent || p.out.is_ready(),
                "snapshot on an unauthenticated link"
            );
            if let Some(deadline) = p.out.handshake_deadline_ms() {
                assert!(
                    deadline <= now.ms + self.cfg.peer_timeout_ms,
                    "a handshake of peer {i} waits beyond a peer timeout"
                );
            }
            if let Some(conn) = p.out.conn() {
                assert!(
                    self.peers
                        .iter()
                        .filter(|q| q.out.conn() == Some(conn))
                        .count()
                        == 1,
                    "connection {conn} is our link to two peers"
                );
            }
        }
    }

    /// A merge is owed only by a standby, to the active it follows (it
    /// gave way to an active, or handed the role on, and has not had an
    /// active's snapshot since), or following nobody, to the next active
    /// it follows.
    fn check_merge_owed(&self) {
        assert!(
            self.handed_to.is_none() || self.handed_to == self.merge_owed,
            "a hand-off awaited without the merge it may owe"
        );
        assert!(
            !self.merge_unsent || self.merge_owed.is_some(),
            "a merge unsent but not owed"
        );
        if let Some(to) = self.merge_owed {
            assert!(
                to.0 < self.peers.len() && to != self.cfg.me,
                "a merge owed to a real other node"
            );
            assert!(
                matches!(self.role, Role::Standby { following: f } if f.is_none_or(|f| f == to)),
                "a merge owed to a node this one does not follow"
            );
        }
    }

    pub fn check_invariants(&self, now: Now, engine: &Engine) {
        let me = self.cfg.me;
        let n = self.peers.len();
        assert_eq!(
            self.role == Role::Active,
            engine.is_active(),
            "the engine serves exactly when the node is active"
        );
        if let Role::Standby { following: Some(f) } = self.role {
            assert!(f.0 < n && f != me, "follows a real other node");
        }
        if self.role == Role::Active && !self.leaving {
            assert!(
                self.eligible(now),
                "active despite a configuration conflict"
            );
        }
        let mine = &self.peers[me];
        assert!(
            matches!(mine.out, OutLink::Idle { .. })
                && mine.links_in == 0
                && mine.heard_ms.is_none(),
            "this node links to itself"
        );
        self.check_replication_state(now);
        self.check_out_links(now);
        for (i, p) in with_ids(&self.peers) {
            let links = self.links_in.iter().filter(|&&(_, peer)| peer == i).count();
            assert_eq!(p.links_in as usize, links, "link count of peer {i}");
            assert!(
                !p.claims_active || p.heard_ms.is_some(),
                "a dead peer claims the role"
            );
            assert!(p.following.is_none_or(|f| f.0 < n));
            assert!(
                !p.in_merge || p.links_in > 0,
                "a merge open from peer {i} with no link from it"
            );
        }
        self.check_merge_owed();
        assert!(self.pending.len() <= MAX_PENDING_HANDSHAKES);
        assert!(self.conflicts.len() <= MAX_CONFLICTS);
        for &(conn, peer) in &self.links_in {
            assert!(peer.0 < n && peer != me);
            assert!(
                !self.pending.contains_key(&conn),
                "link both pending and authenticated"
            );
            assert!(
                self.peers.iter().all(|p| p.out.conn() != Some(conn)),
                "link both ways"
            );
        }
        for conn in self.pending.keys() {
            assert!(self.peers.iter().all(|p| p.out.conn() != Some(*conn)));
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

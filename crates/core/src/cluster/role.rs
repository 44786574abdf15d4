//! The role rule: which node is active, from what this node knows of its
//! peers (the module documentation of [`super`] states it), and the moves
//! between roles: follow, become active, hand the role off, leave.

use super::replication::encode_snapshot;
use super::*;

impl Cluster {
    /// SIGINT/SIGTERM: an active node hands over to the highest-priority
    /// alive peer it has a link to. Returns that peer, if any. Either way no
    /// role changes happen after this.
    pub fn leave(&mut self, now: Now, engine: &mut Engine, out: &mut Outbox) -> Option<PeerId> {
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
        let linked = |p: PeerId| {
            self.alive(p) && self.peers[p].out.is_ready() && self.peers[p].following == Some(me)
        };
        let synced = |p: PeerId| {
            let peer = &self.peers[p];
            linked(p) && peer.synced && peer.snapshot_sent
        };
        let n = self.peers.len();
        let successor = PeerId::all(n)
            .find(|&p| synced(p))
            .or_else(|| PeerId::all(n).find(|&p| linked(p)));
        let Some(successor) = successor else {
            // Nobody to hand over to: this node stops serving all the same
            // (the caller steps the engine down), and the peers fail over
            // as after a crash.
            self.role = Role::Standby { following: None };
            self.stats.stepped_down += 1;
            tracing::warn!(
                target: LOG_TARGET, role = "standby",
                "role: active -> standby (leaving, and no live peer follows this node to hand \
                 over to: the peers fail over as after a crash)"
            );
            return None;
        };
        self.hand_over_role(now, successor, engine, out);
        Some(successor)
    }

    /// The role rule (module docs), applied to what we know now.
    pub(super) fn evaluate(&mut self, now: Now, engine: &mut Engine, out: &mut Outbox) {
        if self.leaving {
            return;
        }
        let me = self.cfg.me;
        // Before: the engine serves exactly when the node is active.
        assert_eq!(self.role == Role::Active, engine.is_active());
        let active_peer = self.best_active_peer();
        let eligible = self.eligible(now);
        assert!(active_peer.is_none_or(|p| p != me && self.alive(p)));
        match self.role {
            Role::Active if !eligible => {
                // A peer with another configuration may be active: of two
                // configurations only the lower fingerprint serves.
                let why = self.problem(now).unwrap_or("not eligible").to_string();
                self.follow(now, active_peer, engine, out, &why);
            }
            Role::Active => self.evaluate_active(now, active_peer, engine, out),
            Role::Standby { following } => {
                self.evaluate_standby(now, following, active_peer, eligible, engine, out);
            }
        }
        // After: still in step with the engine; active only when eligible
        // and outranked by no live active peer; following another node.
        assert_eq!(
            self.role == Role::Active,
            engine.is_active(),
            "the role rule left the engine out of step with the role"
        );
        match self.role {
            Role::Active => {
                assert!(eligible, "the role rule kept an ineligible node active");
                assert!(
                    self.best_active_peer().is_none_or(|p| !self.outranks(p)),
                    "the role rule kept this node active beside an active that outranks it"
                );
            }
            Role::Standby { following } => {
                assert!(following.is_none_or(|f| f != me && f.0 < self.peers.len()));
            }
        }
    }

    /// The role rule for an active node that may stay active: it marks its
    /// table synced once a follower holds it, steps down for an active that
    /// outranks it, and hands the role back to a higher-priority follower
    /// that holds its snapshot.
    pub(super) fn evaluate_active(
        &mut self,
        now: Now,
        active_peer: Option<PeerId>,
        engine: &mut Engine,
        out: &mut Outbox,
    ) {
        debug_assert_eq!(self.role, Role::Active);
        let me = self.cfg.me;
        let n = self.peers.len();
        if !self.synced
            && PeerId::all(n).any(|p| {
                let peer = &self.peers[p];
                self.alive(p) && peer.following == Some(me) && peer.synced && peer.snapshot_sent
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
            // What we granted goes to the one that stays, before our
            // heartbeat says we follow it (same link, in order).
            self.merge_owed = Some(better);
            self.send_owed_merge(now, engine, out);
            self.follow(now, Some(better), engine, out, &why);
            return;
        }
        // Failback: to the first live node of higher priority, once it has
        // held our snapshot, on a link that has not broken since, for the
        // failback delay (so that clients have a connection to it by
        // then). Any break starts the delay again.
        let first_alive = PeerId::all(me.0).find(|&p| self.alive(p));
        for p in PeerId::all(n) {
            let peer = &self.peers[p];
            let ready = Some(p) == first_alive
                && peer.following == Some(me)
                && peer.synced
                && peer.snapshot_sent
                && peer.out.is_ready();
            if !ready {
                self.peers[p].ready_since = None;
            } else if peer.ready_since.is_none() {
                self.peers[p].ready_since = Some(now.ms);
            }
        }
        let due = first_alive.filter(|&p| {
            self.peers[p]
                .ready_since
                .is_some_and(|since| now.ms >= since.saturating_add(self.cfg.failback_delay_ms))
        });
        if let Some(p) = due {
            tracing::info!(
                target: LOG_TARGET, to = %self.cfg.peers[p],
                "handing the active role back to {}: it has the higher priority and has \
                 held a full snapshot for {} ms",
                self.cfg.peers[p],
                self.cfg.failback_delay_ms
            );
            self.hand_over_role(now, p, engine, out);
        }
    }

    /// The role rule for a standby: follow the best live active; without
    /// one, stop following a node that is gone or outranked, and take the
    /// role when nothing of higher priority (or with the state) is up.
    pub(super) fn evaluate_standby(
        &mut self,
        now: Now,
        following: Option<PeerId>,
        active_peer: Option<PeerId>,
        eligible: bool,
        engine: &mut Engine,
        out: &mut Outbox,
    ) {
        debug_assert_eq!(self.role, Role::Standby { following });
        let me = self.cfg.me;
        let n = self.peers.len();
        match active_peer {
            Some(a) if following != Some(a) => {
                let why = format!("{} is active", self.cfg.peers[a]);
                self.follow(now, Some(a), engine, out, &why);
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
                    self.follow(now, None, engine, out, &why);
                }
                let grace_over = now.ms >= self.started_ms + self.cfg.peer_timeout_ms;
                // A node without state (started, never synced, follows
                // nobody) must not take over, and drop every grant,
                // while a node that has the state is alive: it waits,
                // and the others do not wait for it.
                let empty = |p: &Peer| !p.synced && p.following.is_none() && !p.claims_active;
                let me_empty = !self.synced && following.is_none();
                let any_state =
                    !me_empty || PeerId::all(n).any(|p| self.alive(p) && !empty(&self.peers[p]));
                let blocks = |p: PeerId| self.alive(p) && (!any_state || !empty(&self.peers[p]));
                let higher_alive = PeerId::all(me.0).any(blocks);
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
                    self.name_hearsay_active(engine, out);
                }
            }
        }
    }

    /// Of two actives, peer `p` (alive, active) and this node: whether `p`
    /// is the one to stay. One that holds the cluster's state (`synced`)
    /// outranks one that does not; between two alike, the higher priority
    /// (lower index). Both sides of a heal decide the same way from each
    /// other's heartbeats; a stale heartbeat can only understate a peer's
    /// state (an active gains it, never loses it), so two actives may
    /// both stay for a heartbeat, never both step down.
    pub(super) fn outranks(&self, p: PeerId) -> bool {
        let theirs = self.peers[p].synced;
        theirs && !self.synced || (theirs == self.synced && p < self.cfg.me)
    }

    /// The alive peer claiming the role that outranks every other such
    /// peer (the same order as [`Cluster::outranks`]).
    pub(super) fn best_active_peer(&self) -> Option<PeerId> {
        PeerId::all(self.peers.len())
            .filter(|&p| self.alive(p) && self.peers[p].claims_active)
            .min_by_key(|&p| (!self.peers[p].synced, p))
    }

    /// A standby that hears no active (say the active's packets to it are
    /// lost) while its live peers follow one names that one in its `M`
    /// answers: clients that asked it go there rather than wait and retry
    /// here (`M key -`) for as long as the fault lasts. It does not follow
    /// it: it has no link from it to take replication on.
    pub(super) fn name_hearsay_active(&mut self, engine: &mut Engine, out: &mut Outbox) {
        let named = self.hearsay_active();
        if named != self.named {
            self.named = named;
            engine.step_down(named.map(|a| self.cfg.peers[a].as_str()), out);
        }
    }

    /// The active a live peer follows that we do not hear ourselves (the
    /// highest-priority one, should they differ). A node we hear is left
    /// out: were it active we would follow it, and a peer that still
    /// follows it while it is not (it stepped down, or a hand-off is on its
    /// way) says nothing of an active elsewhere.
    pub(super) fn hearsay_active(&self) -> Option<PeerId> {
        let me = self.cfg.me;
        PeerId::all(self.peers.len())
            .filter(|&p| self.alive(p))
            .filter_map(|p| self.peers[p].following)
            .filter(|&a| a != me && !self.alive(a))
            .min()
    }

    /// Sends the active we owe a merge ([`Cluster::merge_owed`]: the one we
    /// gave way to, or the one we follow since) every grant we hold,
    /// between `MERGE` and `MERGED`, once our link to it is authenticated
    /// and speaks version 4 (an older node cannot merge: our grants are
    /// lost to it, as before). It is owed until the snapshot of the node we
    /// follow arrives (which it sends once it has read our heartbeat,
    /// behind the merge on the same link): a new link sends it again, so
    /// does following another active, and the other side takes a grant it
    /// already has as known. See docs/cluster.md, "Which active stays".
    pub(super) fn send_owed_merge(&mut self, now: Now, engine: &mut Engine, out: &mut Outbox) {
        let Some(to) = self.merge_owed else { return };
        let p = &self.peers[to];
        let Some(conn) = p.out.ready_conn() else {
            return;
        };
        if p.out_version < wire::MERGE_VERSION {
            let version = p.out_version;
            self.owe_no_merge();
            tracing::warn!(target: LOG_TARGET, peer = %self.cfg.peers[to], "gave way to {}, which speaks peer protocol version {} and cannot merge: the grants this node made alone are lost", self.cfg.peers[to], version);
            return;
        }
        let mut lines = Vec::new();
        wire::encode(
            &mut lines,
            &PeerMsg::Merge {
                highest: engine.highest_token(),
            },
        );
        let version = p.out_version;
        let mut count = 0usize;
        let grants = engine.snapshot(now).chain(engine.believed(now));
        for grant in grants.chain(engine.member_snapshot(now)) {
            wire::encode_replication(&mut lines, grant, version);
            count += 1;
        }
        wire::encode(&mut lines, &PeerMsg::Merged);
        out.write_link(conn, &lines);
        self.merge_unsent = false;
        tracing::warn!(target: LOG_TARGET, peer = %self.cfg.peers[to], "sent {count} grants to {} to merge (it stays active)", self.cfg.peers[to]);
    }

    /// Our table is the cluster's state (an active's snapshot replaced
    /// it, or we are the active): no merge is owed to anyone.
    pub(super) fn owe_no_merge(&mut self) {
        self.merge_owed = None;
        self.handed_to = None;
        self.merge_unsent = false;
    }

    /// Follows `active` (or nobody). A merge still owed
    /// ([`Cluster::merge_owed`]) stays owed: to the new active, which is
    /// sent it at once, or, following nobody, to whichever active comes
    /// next.
    pub(super) fn follow(
        &mut self,
        now: Now,
        active: Option<PeerId>,
        engine: &mut Engine,
        out: &mut Outbox,
        why: &str,
    ) {
        assert!(
            active.is_none_or(|a| a != self.cfg.me && a.0 < self.peers.len()),
            "follows a real other node"
        );
        self.named = None;
        let before = self.role;
        self.role = Role::Standby { following: active };
        let following = active.map_or("-", |a| self.cfg.peers[a].as_str());
        if active.is_some() {
            self.known_active = true;
        }
        // The active we gave way to may be no longer the one to follow
        // before it took our merge (it handed the role on, stepped down or
        // went away; it drops a merge it reads as a standby), or after it
        // did and before its snapshot came: either way, what we granted
        // alone may be nowhere else yet, and it is still in our table
        // (only a snapshot from the node we follow clears it). So the
        // merge stays owed until an active's snapshot arrives, and goes
        // again to each new active we follow (one that has it already
        // takes it as known).
        let resend = self.merge_owed.is_some()
            && active.is_some()
            && before != Role::Active
            && before != (Role::Standby { following: active });
        if resend {
            self.merge_owed = active;
        }
        if self.handed_to != active {
            // Following another node: whether the one we handed the role
            // to took it no longer matters (the merge goes to this one).
            self.handed_to = None;
        }
        if before == Role::Active && why.starts_with(HAND_OFF) {
            // Planned: leaving, or handing the role back to a higher
            // priority that holds our snapshot.
            self.stats.stepped_down += 1;
            tracing::info!(
                target: LOG_TARGET, role = "standby",
                following,
                "role: active -> standby, following {following} ({why})"
            );
        } else if before == Role::Active {
            // Two actives, or a configuration that may not serve.
            self.stats.stepped_down += 1;
            tracing::warn!(
                target: LOG_TARGET, role = "standby",
                following,
                "role: active -> standby, following {following} ({why})"
            );
        } else if before != self.role {
            tracing::info!(
                target: LOG_TARGET, role = "standby",
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
        engine.step_down(active.map(|a| self.cfg.peers[a].as_str()), out);
        if resend {
            self.send_owed_merge(now, engine, out);
        }
        debug_assert!(!engine.is_active());
        debug_assert_eq!(self.role, Role::Standby { following: active });
    }

    /// Takes the role. `planned`: handed over by the active; otherwise
    /// by the role rule, which is a failover (WARN) once this node has
    /// known an active, and the cluster's first election (INFO) before.
    pub(super) fn become_active(&mut self, engine: &mut Engine, why: &str, planned: bool) {
        assert!(!self.leaving, "a leaving node takes the role");
        self.named = None;
        if self.role != Role::Active {
            self.stats.became_active += 1;
            if planned || !self.known_active {
                tracing::info!(target: LOG_TARGET, role = "active", "role: standby -> active ({why})");
            } else {
                tracing::warn!(target: LOG_TARGET, role = "active", "role: standby -> active ({why})");
            }
        }
        self.known_active = true;
        self.owe_no_merge();
        self.role = Role::Active;
        // Tell the peers at once (next turn), not at the next heartbeat:
        // until then they answer clients `M key -`.
        self.next_heartbeat_ms = 0;
        // `synced` stays what it was: whether the table we serve from is
        // the cluster's state (see the field).
        for p in &mut self.peers {
            p.snapshot_sent = false;
            p.ready_since = None;
        }
        engine.become_active();
        debug_assert!(engine.is_active());
        debug_assert!(self.peers.iter().all(|p| !p.snapshot_sent));
    }

    /// Hands the role to `to`: this turn's deltas first, then our waiters
    /// are answered `M to`, then `HANDOFF` on the same link, so that `to`
    /// has everything before it starts serving.
    pub(super) fn hand_over_role(
        &mut self,
        now: Now,
        to: PeerId,
        engine: &mut Engine,
        out: &mut Outbox,
    ) {
        assert_eq!(
            self.role,
            Role::Active,
            "only the active hands the role off"
        );
        assert!(to != self.cfg.me && to.0 < self.peers.len());
        self.flush_replication(now, engine, out);
        let Some(conn) = self.peers[to].out.ready_conn() else {
            return;
        };
        if !self.peers[to].snapshot_sent {
            // It has not got our state on this link yet: send it first, so
            // that it has everything before HANDOFF.
            let snapshot = encode_snapshot(now, engine, self.peers[to].out_version);
            out.write_link(conn, &snapshot);
            self.stats.snapshots_sent += 1;
            self.peers[to].snapshot_sent = true;
        }
        let why = format!("{HAND_OFF} {}", self.cfg.peers[to]);
        self.stats.handoffs += 1;
        self.follow(now, Some(to), engine, out, &why);
        // `to` has our state, but may not take the role: a heal can show
        // it another active to follow first, and it ignores a HANDOFF from
        // a node it no longer follows (whose state its table may no longer
        // hold). Until an active's snapshot replaces our table, we owe our
        // grants to the next active we follow, as after giving way at a
        // heal ([`Cluster::follow`] sends them); and to `to` itself if its
        // heartbeats show it did not take the role ([`Cluster::handed_to`]).
        self.merge_owed = Some(to);
        self.handed_to = Some(to);
        self.merge_unsent = false;
        self.scratch.clear();
        let highest = engine.highest_token();
        wire::encode(&mut self.scratch, &PeerMsg::Handoff { highest });
        out.write_link(conn, &self.scratch);
        // After: this node follows `to` and no longer serves, and `to` has
        // our whole state on the link before the HANDOFF.
        assert_eq!(
            self.role,
            Role::Standby {
                following: Some(to)
            }
        );
        assert!(!engine.is_active() && self.peers[to].snapshot_sent);
    }
}

//! What the lines of an authenticated peer link do: heartbeats, the
//! replication of the active this node follows, merges, hand-offs and lag
//! probes.

use super::{Cluster, LOG_TARGET, PeerError, PeerId, Role, Unexpected};
use crate::cluster::wire::PeerMsg;
use crate::engine::{Engine, Now};
use crate::outbox::Outbox;

impl Cluster {
    /// A message on an authenticated link from peer `from`.
    pub(super) fn on_peer_message(
        &mut self,
        now: Now,
        from: PeerId,
        msg: PeerMsg<'_>,
        engine: &mut Engine,
        out: &mut Outbox,
    ) -> Result<(), PeerError> {
        let was_alive = self.peers[from].heard_ms.is_some();
        if !was_alive {
            tracing::info!(target: LOG_TARGET, peer = %self.cfg.peers[from], "peer {} is up: heard from it again", self.cfg.peers[from]);
        }
        self.peers[from].heard_ms = Some(now.ms);
        // A grant or a release changes the tables, never an input of the
        // role rule (who is alive, who claims the role or follows whom,
        // who is synced); the rule runs on every turn's tick and after
        // every other line. Most lines a follower reads are these.
        let rule_inputs_unchanged = was_alive && changes_tables_only(&msg);
        let following_sender = self.role
            == Role::Standby {
                following: Some(from),
            };
        match msg {
            PeerMsg::Hello { .. } | PeerMsg::Challenge { .. } | PeerMsg::Auth { .. } => {
                return Err(Unexpected::HandshakeOnAuthenticatedLink.into());
            }
            PeerMsg::Heartbeat { .. } => self.on_heartbeat(from, msg, engine)?,
            PeerMsg::Snapshot { highest } if following_sender => {
                if self.merge_unsent && self.merge_owed == Some(from) {
                    // It did not take the role we handed it, so its table
                    // may lack our grants: they go first, on this link.
                    self.send_owed_merge(now, engine, out);
                }
                engine.observe_token(highest);
                engine.clear_grants();
                self.synced = false;
                // Its state replaces ours: nothing is owed to it any more.
                // (Had it not taken a role we handed it, its heartbeat
                // saying so would have come first.)
                self.owe_no_merge();
            }
            PeerMsg::Grant { .. } | PeerMsg::Merge { .. } | PeerMsg::Merged => {
                self.on_grant_or_merge(now, from, following_sender, msg, engine, out)?;
            }
            PeerMsg::Limit { limit } => self.peers[from].next_limit = Some(limit),
            PeerMsg::Member { .. } => {
                self.on_member(now, from, following_sender, msg, engine, out)?
            }
            PeerMsg::Release { key, token } if following_sender => {
                engine.apply_release(now, key, token, out);
            }
            PeerMsg::Probe { seq } if following_sender => self.answer_probe(from, seq, out),
            PeerMsg::Probed { seq } => self.probe_answered(now, from, seq),
            PeerMsg::Synced if following_sender => {
                if !self.synced {
                    tracing::info!(target: LOG_TARGET, active = %self.cfg.peers[from], "holds a full snapshot of the active {}", self.cfg.peers[from]);
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
            PeerMsg::Snapshot { .. }
            | PeerMsg::Release { .. }
            | PeerMsg::Synced
            | PeerMsg::Probe { .. } => {}
        }
        if !rule_inputs_unchanged {
            self.evaluate(now, engine, out);
        }
        Ok(())
    }

    /// `S` or `C` from peer `from`: replication from the node we follow,
    /// or, between `MERGE` and `MERGED`, a member to merge, as
    /// [`Cluster::on_grant_or_merge`] takes a `G`. A `C` is a permit of
    /// the semaphore of the limit of the last `P L` (which it takes); a `C`
    /// with none, or an `S` after a `P L`, breaks the link.
    #[cold]
    #[inline(never)]
    fn on_member(
        &mut self,
        now: Now,
        from: PeerId,
        following_sender: bool,
        msg: PeerMsg<'_>,
        engine: &mut Engine,
        out: &mut Outbox,
    ) -> Result<(), PeerError> {
        let PeerMsg::Member {
            key,
            token,
            remaining_ms,
            holder,
            permit,
        } = msg
        else {
            debug_assert!(false, "not a member line");
            return Ok(());
        };
        let limit = match (self.peers[from].next_limit.take(), permit) {
            (Some(limit), true) => limit,
            (None, false) => 0,
            (None, true) => return Err(Unexpected::PermitWithoutLimit.into()),
            (Some(_), false) => return Err(Unexpected::LimitWithoutPermit.into()),
        };
        engine.observe_token(token);
        if self.peers[from].in_merge {
            if self.role == Role::Active || following_sender {
                engine.merge_member(now, key, token, remaining_ms, limit, holder, out)?;
            }
        } else if following_sender {
            engine.apply_member(now, key, token, remaining_ms, limit, holder)?;
        }
        Ok(())
    }

    /// A heartbeat from peer `from`: what it claims, whom it follows.
    fn on_heartbeat(
        &mut self,
        from: PeerId,
        msg: PeerMsg<'_>,
        engine: &mut Engine,
    ) -> Result<(), PeerError> {
        let PeerMsg::Heartbeat {
            active,
            following,
            highest,
            synced,
        } = msg
        else {
            debug_assert!(false, "not a heartbeat: {msg:?}");
            return Ok(());
        };
        if following.is_some_and(|f| f.0 >= self.peers.len()) {
            return Err(Unexpected::FollowsBeyondPeers { following }.into());
        }
        engine.observe_token(highest);
        if self.handed_to == Some(from) && following != Some(self.cfg.me) {
            // Its first word since it read our HANDOFF (links keep order).
            self.handed_to = None;
            if !active {
                self.merge_unsent = true;
                tracing::warn!(
                    target: LOG_TARGET, peer = %self.cfg.peers[from],
                    "{} did not take the active role handed to it: the grants this node \
                     made go to the next active as a merge",
                    self.cfg.peers[from]
                );
            }
        }
        let p = &mut self.peers[from];
        if p.following != following {
            p.snapshot_sent = false;
        }
        p.claims_active = active;
        p.following = following;
        p.synced = synced;
        Ok(())
    }

    /// `G`, `MERGE` and `MERGED` from peer `from`. A `G` outside a merge is
    /// replication, taken from the node we follow; between `MERGE` and
    /// `MERGED` it is a grant to merge ([`crate::engine::merge`]): from a
    /// peer that gave way to us while we are active, or, from our active, a
    /// grant it keeps beside a key's grant.
    fn on_grant_or_merge(
        &mut self,
        now: Now,
        from: PeerId,
        following_sender: bool,
        msg: PeerMsg<'_>,
        engine: &mut Engine,
        out: &mut Outbox,
    ) -> Result<(), PeerError> {
        match msg {
            PeerMsg::Grant {
                key,
                token,
                remaining_ms,
                holder,
            } => {
                engine.observe_token(token);
                if self.peers[from].in_merge {
                    if self.role == Role::Active || following_sender {
                        engine.merge_grant(now, key, token, remaining_ms, holder, out)?;
                    }
                } else if following_sender {
                    engine.apply_grant(now, key, token, remaining_ms, holder)?;
                }
            }
            PeerMsg::Merge { highest } => {
                if self.peers[from].in_merge {
                    return Err(Unexpected::NestedMerge.into());
                }
                engine.observe_token(highest);
                self.peers[from].in_merge = true;
                if self.role == Role::Active && !following_sender {
                    tracing::warn!(target: LOG_TARGET, peer = %self.cfg.peers[from], "merging the grants of {}, which gave way to this node", self.cfg.peers[from]);
                }
            }
            PeerMsg::Merged => {
                if !self.peers[from].in_merge {
                    return Err(Unexpected::MergedWithoutMerge.into());
                }
                self.peers[from].in_merge = false;
            }
            _ => debug_assert!(false, "not a grant or merge line"),
        }
        Ok(())
    }
}

/// A grant, a release, a shared grant or permit (or its limit), a lag
/// probe or its answer: a line that changes no input of the role rule.
fn changes_tables_only(msg: &PeerMsg<'_>) -> bool {
    matches!(
        msg,
        PeerMsg::Grant { .. }
            | PeerMsg::Release { .. }
            | PeerMsg::Limit { .. }
            | PeerMsg::Member { .. }
            | PeerMsg::Probe { .. }
            | PeerMsg::Probed { .. }
    )
}

//! Replication and heartbeats: the active's snapshot and deltas to each
//! follower, and the heartbeat every node sends.

use super::*;

/// Peer protocol versions older than [`wire::VERSION`] that a link may
/// speak.
pub(super) const OLD_VERSIONS: usize = (wire::VERSION - wire::MIN_VERSION) as usize;

impl Cluster {
    /// Sends this turn's replication: a snapshot to each follower whose link
    /// has none yet, the turn's deltas to the others. Called once per loop
    /// turn, before the answers are collected.
    pub(crate) fn flush_replication(&mut self, now: Now, engine: &mut Engine, out: &mut Outbox) {
        engine.take_replication(&mut self.events);
        if self.role != Role::Active {
            return;
        }
        debug_assert!(engine.is_active(), "the active's engine serves");
        let me = self.cfg.me;
        // Per peer protocol version (the newest, then each older one).
        let mut snapshots: [Option<Vec<u8>>; 1 + OLD_VERSIONS] = Default::default();
        // The events' peer lines, written once for every follower that
        // takes them: into `scratch` for the newest version, `scratch_old`
        // for the older ones.
        let mut deltas_encoded = [false; 1 + OLD_VERSIONS];
        // A follower that cannot learn shared grants and permits.
        let mut too_old = false;
        for i in PeerId::all(self.peers.len()) {
            let p = &self.peers[i];
            let follows = i != me && p.heard_ms.is_some() && p.following == Some(me);
            let Some(conn) = p.out.ready_conn().filter(|_| follows) else {
                continue;
            };
            let version = p.out_version;
            too_old |= version < wire::SHARED_VERSION;
            debug_assert!((wire::MIN_VERSION..=wire::VERSION).contains(&version));
            let v = usize::try_from(wire::VERSION.saturating_sub(version))
                .unwrap_or(OLD_VERSIONS)
                .min(OLD_VERSIONS);
            // The turn's events are lines of the newest version only if no
            // follower with our snapshot spoke an older one when the turn
            // began; one that does is resynced.
            if p.snapshot_sent && v > 0 && self.events.lines().is_some() {
                debug_assert!(false, "an older follower's deltas recorded as newest lines");
                self.peers[i].snapshot_sent = false;
            }
            if self.peers[i].snapshot_sent {
                if !self.events.is_empty() {
                    self.send_deltas(now, i, conn, &mut deltas_encoded, out);
                }
            } else {
                if version < wire::SHARED_VERSION && engine.member_count() > 0 {
                    tracing::warn!(target: LOG_TARGET, peer = %self.cfg.peers[i], "follower {} speaks peer protocol version {version}: it cannot learn the {} shared grants and permits held here, and this node refuses G and C while it follows", self.cfg.peers[i], engine.member_count());
                }
                let body =
                    snapshots[v].get_or_insert_with(|| encode_snapshot(now, engine, version));
                self.stats.snapshots_sent += 1;
                out.write_link(conn, body);
                let p = &mut self.peers[i];
                p.snapshot_sent = true;
                p.snapshot_bytes = body.len();
                // A probe on an earlier link is answered on none.
                p.probe = None;
            }
            let p = &mut self.peers[i];
            let unsent = out.len(conn);
            if unsent > REPLICATION_BACKLOG_BYTES + p.snapshot_bytes {
                // It does not keep up: stop queueing for it. It resyncs from
                // a snapshot on the next link.
                p.out.give_up();
                p.snapshot_sent = false;
                let reason = format!(
                    "follower {} has {unsent} bytes of replication unread; closing the link \
                     (it resyncs from a snapshot)",
                    self.cfg.peers[i]
                );
                self.doom(conn, reason, out);
            }
        }
        engine.set_follower_too_old(too_old);
        // Next turn's events go to the followers with our snapshot (those
        // without get one): as lines, if every one of them speaks the
        // newest version.
        let newest = self
            .peers
            .iter()
            .all(|p| !p.snapshot_sent || p.out_version == wire::VERSION);
        engine.set_replication_encoder(newest.then_some(wire::NEWEST));
        // After: every live follower on an authenticated link has our
        // snapshot queued (and this turn's deltas after it), or its link
        // is being closed.
        debug_assert!(with_ids(&self.peers).all(|(i, p)| {
            i == me
                || !p.out.is_ready()
                || p.heard_ms.is_none()
                || p.following != Some(me)
                || p.snapshot_sent
        }));
    }

    /// Writes the turn's events to follower `i`'s link `conn`: the log's
    /// lines if it holds them, else the events encoded for the link's
    /// version (once per version and turn: `encoded`).
    fn send_deltas(
        &mut self,
        now: Now,
        i: PeerId,
        conn: ConnId,
        encoded: &mut [bool; 1 + OLD_VERSIONS],
        out: &mut Outbox,
    ) {
        let version = self.peers[i].out_version;
        let v = usize::try_from(wire::VERSION.saturating_sub(version))
            .unwrap_or(OLD_VERSIONS)
            .min(OLD_VERSIONS);
        let bytes: &[u8] = match (self.events.lines(), v.checked_sub(1)) {
            (Some(lines), _) => lines,
            (None, old) => {
                let scratch = match old {
                    None => &mut self.scratch,
                    Some(old) => &mut self.scratch_old[old],
                };
                if !encoded[v] {
                    scratch.clear();
                    for event in self.events.iter() {
                        wire::encode_replication(scratch, event, version);
                    }
                    encoded[v] = true;
                }
                scratch
            }
        };
        out.write_link(conn, bytes);
        let written = bytes.len() as u64;
        let p = &mut self.peers[i];
        p.replication.events += self.events.len() as u64;
        p.replication.bytes += written;
        p.replication.writes += 1;
        self.probe(now, i, conn, out);
    }

    /// Sends follower `i` a lag probe behind the deltas just written to
    /// its link `conn`, unless one is in flight or the last went less than
    /// [`PROBE_EVERY_MS`] ago, or its link speaks a version before
    /// [`wire::PROBE_VERSION`]. A probe unanswered within the peer timeout
    /// is given up (counted), so that a lost answer stops no measurement.
    fn probe(&mut self, now: Now, i: PeerId, conn: ConnId, out: &mut Outbox) {
        let timeout_ms = self.cfg.peer_timeout_ms;
        let p = &mut self.peers[i];
        if p.out_version < wire::PROBE_VERSION || now.ms < p.next_probe_ms {
            return;
        }
        if let Some((_, sent_us)) = p.probe {
            if now.us.saturating_sub(sent_us) < timeout_ms.saturating_mul(1000) {
                return;
            }
            p.replication.probes_lost += 1;
        }
        self.probe_seq = self.probe_seq.wrapping_add(1);
        let seq = self.probe_seq;
        p.probe = Some((seq, now.us));
        p.next_probe_ms = now.ms + PROBE_EVERY_MS;
        let mut line = Vec::with_capacity(32);
        wire::encode(&mut line, &PeerMsg::Probe { seq });
        out.write_link(conn, &line);
    }

    /// The active we follow probes our lag: every line before `seq` is
    /// applied, so we answer on our own link to it (a link before
    /// [`wire::PROBE_VERSION`], or none: no answer, and the active gives
    /// the probe up).
    pub(super) fn answer_probe(&mut self, from: PeerId, seq: u64, out: &mut Outbox) {
        let p = &self.peers[from];
        let Some(conn) = p
            .out
            .ready_conn()
            .filter(|_| p.out_version >= wire::PROBE_VERSION)
        else {
            return;
        };
        let mut line = Vec::with_capacity(32);
        wire::encode(&mut line, &PeerMsg::Probed { seq });
        out.write_link(conn, &line);
    }

    /// Follower `from` answered probe `seq`: its lag is the time since the
    /// probe went. An answer to any other probe (given up, or from an
    /// earlier link) is ignored.
    pub(super) fn probe_answered(&mut self, now: Now, from: PeerId, seq: u64) {
        let p = &mut self.peers[from];
        if let Some((_, sent_us)) = p.probe.filter(|&(sent, _)| sent == seq) {
            p.replication.lag_us.record(now.us.saturating_sub(sent_us));
            p.probe = None;
        }
    }

    pub(super) fn encode_heartbeat(&mut self, engine: &Engine) {
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
/// one `S` (or `L` and `C`) per shared grant (or permit) from version 5
/// on, the believed grants between `MERGE` and `MERGED`, `SYNCED`.
pub(super) fn encode_snapshot(now: Now, engine: &Engine, version: u64) -> Vec<u8> {
    let mut out = Vec::new();
    let highest = engine.highest_token();
    wire::encode(&mut out, &PeerMsg::Snapshot { highest });
    for grant in engine.snapshot(now).chain(engine.member_snapshot(now)) {
        wire::encode_replication(&mut out, grant, version);
    }
    if version >= wire::MERGE_VERSION && engine.believed_count() > 0 {
        // The grants kept beside a key's grant after a merge.
        wire::encode(&mut out, &PeerMsg::Merge { highest });
        for grant in engine.believed(now) {
            wire::encode_replication(&mut out, grant, version);
        }
        wire::encode(&mut out, &PeerMsg::Merged);
    }
    wire::encode(&mut out, &PeerMsg::Synced);
    out
}

//! The peer handshake: `HELLO`, `CHALLENGE`, `AUTH` (the MACs are
//! [`super::auth`]'s), and what an authenticated peer's configuration must
//! agree on with ours.

use super::*;

impl Cluster {
    pub(super) fn next_nonce(&mut self) -> Nonce {
        self.nonces += 1;
        self.cfg.secret.nonce(self.cfg.incarnation, self.nonces)
    }

    /// The transcript of a link dialed to us: what its `HELLO` claimed,
    /// and us with our nonce `nonce`.
    pub(super) fn inbound_transcript<'a>(
        &'a self,
        claim: &'a Claim,
        nonce: Nonce,
    ) -> Transcript<'a> {
        Transcript {
            dialer: Identity {
                fingerprint: claim.fingerprint,
                index: claim.from.0 as u64,
                addr: &claim.addr,
                nonce: claim.nonce,
            },
            dialer_incarnation: claim.incarnation,
            acceptor: self.my_identity(nonce),
        }
    }

    pub(super) fn my_identity(&self, nonce: Nonce) -> Identity<'_> {
        Identity {
            fingerprint: self.fingerprint,
            index: self.cfg.me.0 as u64,
            addr: self.cfg.peers[self.cfg.me].as_bytes(),
            nonce,
        }
    }

    /// What differs between our configuration and what an authenticated
    /// peer says of itself (`None`: nothing).
    pub(super) fn difference(
        &self,
        fingerprint: Fingerprint,
        index: PeerId,
        addr: &[u8],
    ) -> Option<String> {
        let n = self.peers.len();
        let shown = Quoted(addr);
        let ours = crate::proto::quoted(self.cfg.peers.join(",").as_bytes(), 160);
        if index.0 >= n {
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
    pub(super) fn conflict(
        &mut self,
        now: Now,
        fingerprint: Fingerprint,
        reason: &str,
        engine: &mut Engine,
        out: &mut Outbox,
    ) {
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
        self.evaluate(now, engine, out);
    }

    /// A stranger or a peer dialed us and said who it is: answer with our
    /// identity, a fresh nonce and our MAC over both (proving that we hold
    /// the secret), and believe nothing of it until its `AUTH`.
    pub(super) fn on_hello(
        &mut self,
        now: Now,
        conn: ConnId,
        claim: Claim,
        out: &mut Outbox,
    ) -> Result<(), PeerError> {
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
                self.doom(oldest, reason, out);
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
        out.write_link(conn, &self.scratch);
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
    pub(super) fn on_auth(
        &mut self,
        now: Now,
        conn: ConnId,
        pending: Pending,
        mac: &auth::MacBytes,
        engine: &mut Engine,
        out: &mut Outbox,
    ) -> Result<(), PeerError> {
        let claim = &pending.claim;
        let transcript = self.inbound_transcript(claim, pending.nonce);
        if !self.cfg.secret.verify(Side::Dialer, &transcript, mac) {
            return Err(PeerError::Authentication(format!(
                "peer authentication failed (a link claiming to be {}): wrong MAC; is \
                 --cluster-secret-file the same on every node?",
                Quoted(&claim.addr)
            )));
        }
        if let Some(reason) = self.difference(claim.fingerprint, claim.from, &claim.addr) {
            self.conflict(now, claim.fingerprint, &reason, engine, out);
            return Err(PeerError::Authentication(reason));
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
            self.doom(old, reason, out);
        }
        self.links_in.push((conn, from));
        let p = &mut self.peers[from];
        p.links_in += 1;
        // A merge cut off with its old link is not continued on this one.
        p.in_merge = false;
        p.next_limit = None;
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
        let stale = p.out.conn().is_some() && p.out_version < claim.version;
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
        // It speaks a newer version than our link to it: dial again, so
        // that it gets the grants' holders too.
        if stale && let Some(dialed) = self.peers[from].out.give_up() {
            self.peers[from].snapshot_sent = false;
            let reason = format!(
                "{} speaks peer protocol version {}: this link is dialed again with it",
                self.cfg.peers[from], claim.version
            );
            self.doom(dialed, reason, out);
        }
        if self.peers[from].heard_ms.is_none() {
            tracing::info!(target: LOG_TARGET, peer = %self.cfg.peers[from], "peer {} is up: its link to this node authenticated", self.cfg.peers[from]);
        } else {
            tracing::info!(target: LOG_TARGET, peer = %self.cfg.peers[from], "link from {} up (authenticated)", self.cfg.peers[from]);
        }
        self.peers[from].heard_ms = Some(now.ms);
        self.evaluate(now, engine, out);
        Ok(())
    }

    /// The peer we dialed answered our `HELLO`: check its MAC, prove
    /// ourselves with `AUTH`, and start sending if its configuration is ours.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn on_challenge(
        &mut self,
        now: Now,
        peer: PeerId,
        conn: ConnId,
        claimed: Identity<'_>,
        mac: &auth::MacBytes,
        engine: &mut Engine,
        out: &mut Outbox,
    ) -> Result<(), PeerError> {
        let Some(nonce) = self.peers[peer].out.handshake_nonce() else {
            debug_assert!(false, "a CHALLENGE outside our handshake");
            return Err(Unexpected::OnDialedLink {
                peer: self.cfg.peers[peer].clone(),
            }
            .into());
        };
        let transcript = Transcript {
            dialer: self.my_identity(nonce),
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
            self.evaluate(now, engine, out);
            return Err(PeerError::Authentication(reason));
        }
        // It holds the secret. But is it the node we dialed? A node that
        // answers with another address is not (a relay, or something else
        // listening there): no AUTH for it, which could be relayed on to
        // that node as ours, and no conflict either, which would let
        // whoever holds a dead node's address stop us serving.
        if claimed.addr != self.cfg.peers[peer].as_bytes() {
            return Err(PeerError::Authentication(format!(
                "{} answered as {}: not the node this node dialed; is something else \
                 listening at that address?",
                self.cfg.peers[peer],
                Quoted(claimed.addr)
            )));
        }
        // It is: prove that we hold the secret too, so that it learns of a
        // conflict as surely as we do.
        let mac = self.cfg.secret.sign(Side::Dialer, &transcript);
        self.scratch.clear();
        wire::encode(&mut self.scratch, &PeerMsg::Auth { mac });
        out.write_link(conn, &self.scratch);
        let index = PeerId(usize::try_from(claimed.index).unwrap_or(usize::MAX));
        if let Some(reason) = self.difference(claimed.fingerprint, index, claimed.addr) {
            self.conflict(now, claimed.fingerprint, &reason, engine, out);
            return Err(PeerError::Authentication(reason));
        }
        self.peers[peer].out.authenticated();
        self.authenticated_any = true;
        tracing::info!(target: LOG_TARGET, peer = %self.cfg.peers[peer], "link to {} up (authenticated)", self.cfg.peers[peer]);
        if self.merge_owed == Some(peer) {
            // The grants we owe it go before our heartbeat says we follow it.
            self.send_owed_merge(now, engine, out);
        }
        // Our state, at once: the peer learns our role and token now.
        self.scratch.clear();
        self.encode_heartbeat(engine);
        out.write_link(conn, &self.scratch);
        Ok(())
    }
}

//! What a connection may do: one taken beyond `--max-conns` may only
//! become a peer link, and on a node with client identities a request is
//! what its identity allows.

use super::Node;
use crate::engine::{ConnId, Now, Refusal};
use crate::proto::Request;

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

/// The deadline of a peer-only connection refused and being closed: it
/// never comes, and the connection is refused all it asks until it closes.
const REFUSED: u64 = u64::MAX;

impl Node {
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
        self.engine.open(conn, &mut self.outbox);
        self.stats.conns_opened += 1;
        let timeout = self
            .cluster
            .as_ref()
            .map_or(0, |c| c.handshake_timeout_ms());
        self.peer_only.push((conn, now.ms + timeout));
        self.update_checked_requests();
    }

    /// Peer-only connections past their deadline: kept if they became
    /// authenticated peer links, closed otherwise. One being closed stays
    /// listed, with the deadline [`REFUSED`], until [`Node::close`]: a
    /// request read from it before the loop closes it (in the turn that
    /// refused it, say) is refused too, never served.
    pub(super) fn expire_peer_only(&mut self, now: Now) {
        let cluster = self.cluster.as_ref();
        let mut expired = Vec::new();
        self.peer_only.retain_mut(|(conn, deadline_ms)| {
            if now.ms < *deadline_ms {
                return true;
            }
            if cluster.is_some_and(|c| c.is_authenticated_in(*conn)) {
                return false;
            }
            expired.push(*conn);
            *deadline_ms = REFUSED;
            true
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
        .encode(self.outbox.output_mut(conn));
        self.doomed.push((conn, reason.into()));
    }

    /// The earliest peer-only deadline (of a connection not refused yet).
    pub(super) fn peer_only_deadline(&self) -> Option<u64> {
        self.peer_only
            .iter()
            .map(|&(_, d)| d)
            .filter(|&d| d != REFUSED)
            .min()
    }

    /// [`Node::handle_request`] while some connection is peer-only or on a
    /// node with client identities ([`Node::checked_requests`]).
    #[cold]
    #[inline(never)]
    pub(super) fn handle_checked(
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
        let result = self.engine.handle(now, conn, request, &mut self.outbox);
        if result.is_err() {
            self.stats.requests_refused += 1;
        }
        result
    }

    /// Whether requests need [`Node::handle_checked`]: kept current as
    /// peer-only connections come and go.
    pub(super) fn update_checked_requests(&mut self) {
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
        let result = self.engine.handle(now, conn, request, &mut self.outbox);
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
}

//! Our link to one peer (the one we send on), as a state: no link, a dial
//! under way, a handshake, an authenticated link, or a link given up and
//! waiting for its close. Each transition is a method that checks (in
//! debug builds) the state it starts from.

use super::auth::Nonce;
use crate::engine::ConnId;

/// Our link to a peer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum OutLink {
    /// No link and no dial under way: the next dial is due at
    /// `next_dial_ms`.
    Idle { next_dial_ms: u64 },
    /// Handed to the loop to dial ([`super::Cluster::take_dials`]), until
    /// [`super::Cluster::outbound_open`] or [`super::Cluster::dial_failed`].
    Dialing,
    /// Open, our `HELLO` (with `nonce`) sent: nothing else goes on it until
    /// the peer's `CHALLENGE` proves it, and it is given up at
    /// `deadline_ms` if that does not come.
    Handshaking {
        conn: ConnId,
        nonce: Nonce,
        deadline_ms: u64,
    },
    /// The peer's `CHALLENGE` checked: heartbeats and replication go on it.
    Ready { conn: ConnId },
    /// Given up (its `E` line queued): nothing more goes on it and nothing
    /// it says is believed, until it closes.
    Closing { conn: ConnId },
}

impl Default for OutLink {
    fn default() -> OutLink {
        OutLink::Idle { next_dial_ms: 0 }
    }
}

impl OutLink {
    /// The link's connection, in any state that has one.
    pub(super) fn conn(self) -> Option<ConnId> {
        match self {
            OutLink::Handshaking { conn, .. }
            | OutLink::Ready { conn }
            | OutLink::Closing { conn } => Some(conn),
            OutLink::Idle { .. } | OutLink::Dialing => None,
        }
    }

    /// The connection of an authenticated link: what may carry our state.
    pub(super) fn ready_conn(self) -> Option<ConnId> {
        match self {
            OutLink::Ready { conn } => Some(conn),
            _ => None,
        }
    }

    pub(super) fn is_ready(self) -> bool {
        matches!(self, OutLink::Ready { .. })
    }

    /// When a dial is due, with no link and none under way.
    pub(super) fn next_dial_ms(self) -> Option<u64> {
        match self {
            OutLink::Idle { next_dial_ms } => Some(next_dial_ms),
            _ => None,
        }
    }

    /// The deadline of a handshake in progress.
    pub(super) fn handshake_deadline_ms(self) -> Option<u64> {
        match self {
            OutLink::Handshaking { deadline_ms, .. } => Some(deadline_ms),
            _ => None,
        }
    }

    /// The nonce of our `HELLO`, while its handshake is in progress.
    pub(super) fn handshake_nonce(self) -> Option<Nonce> {
        match self {
            OutLink::Handshaking { nonce, .. } => Some(nonce),
            _ => None,
        }
    }

    /// Idle with its dial due at `now_ms`: dialing now. Returns whether it
    /// was.
    pub(super) fn start_dial(&mut self, now_ms: u64) -> bool {
        let due = self.next_dial_ms().is_some_and(|next| now_ms >= next);
        if due {
            *self = OutLink::Dialing;
        }
        due
    }

    /// The dial failed: the next one is due at `next_dial_ms`. (A link is
    /// kept: the loop reports only the dials it was given.)
    pub(super) fn dial_failed(&mut self, next_dial_ms: u64) {
        debug_assert!(
            *self == OutLink::Dialing,
            "a failed dial not dialing: {self:?}"
        );
        if self.conn().is_none() {
            *self = OutLink::Idle { next_dial_ms };
        }
    }

    /// The dial succeeded as `conn`, and our `HELLO` with `nonce` goes on
    /// it.
    pub(super) fn opened(&mut self, conn: ConnId, nonce: Nonce, deadline_ms: u64) {
        debug_assert!(self.conn().is_none(), "opened while linked: {self:?}");
        *self = OutLink::Handshaking {
            conn,
            nonce,
            deadline_ms,
        };
    }

    /// The peer's `CHALLENGE` checked.
    pub(super) fn authenticated(&mut self) {
        let OutLink::Handshaking { conn, .. } = *self else {
            debug_assert!(false, "authenticated outside a handshake: {self:?}");
            return;
        };
        *self = OutLink::Ready { conn };
    }

    /// This node gives the link up: its connection, unless it has none or
    /// was given up already.
    pub(super) fn give_up(&mut self) -> Option<ConnId> {
        match *self {
            OutLink::Handshaking { conn, .. } | OutLink::Ready { conn } => {
                *self = OutLink::Closing { conn };
                Some(conn)
            }
            OutLink::Idle { .. } | OutLink::Dialing | OutLink::Closing { .. } => None,
        }
    }

    /// A handshake past its deadline at `now_ms` is given up: its
    /// connection.
    pub(super) fn expire(&mut self, now_ms: u64) -> Option<ConnId> {
        match self.handshake_deadline_ms() {
            Some(deadline_ms) if now_ms >= deadline_ms => self.give_up(),
            _ => None,
        }
    }

    /// A handshake in progress waits until `until_ms` at least (this
    /// process stalled: the peer's answer may be waiting unread).
    pub(super) fn extend_deadline(&mut self, until_ms: u64) {
        if let OutLink::Handshaking { deadline_ms, .. } = self {
            *deadline_ms = (*deadline_ms).max(until_ms);
        }
    }

    /// The link's connection closed: the next dial is due at
    /// `next_dial_ms`. Returns whether it was authenticated.
    pub(super) fn closed(&mut self, next_dial_ms: u64) -> bool {
        debug_assert!(self.conn().is_some(), "closed without a link: {self:?}");
        let was_ready = self.is_ready();
        *self = OutLink::Idle { next_dial_ms };
        was_ready
    }
}

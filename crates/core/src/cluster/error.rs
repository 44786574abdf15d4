//! Why a peer line breaks its link: one type from the peer-line parser up
//! through every handler of the cluster and the node, turned into text
//! only where it leaves (the `E` line, the log).

use std::fmt;

use super::PeerId;
use super::wire::WireError;
use crate::engine::GrantRefusal;

/// Why a peer line broke its link. Its text is the reason the `E` line
/// gives and the log shows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PeerError {
    /// The line does not parse.
    Wire(WireError),
    /// A well-formed message the link's state does not allow.
    Unexpected(Unexpected),
    /// The handshake failed: a wrong MAC, not the node dialed, or a
    /// configuration that differs from ours (the text says which, and what
    /// to check).
    Authentication(String),
    /// A replicated grant the engine refused.
    GrantRefused(GrantRefusal),
    /// The other side gave the link up with an `E` line.
    GaveUp {
        /// The peer's address, or "a peer" for a link not (yet) known as one.
        who: String,
        /// Its reason, as shown (quoted, bounded).
        said: String,
    },
}

/// A message out of place.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Unexpected {
    /// A peer line to a node started without `--peers`.
    NotClustered,
    /// Anything but the first `CHALLENGE` on a link this node dialed to
    /// the peer at address `peer`.
    OnDialedLink {
        peer: String,
    },
    AuthBeforeHello,
    SecondHello,
    BeforeAuth,
    BeforeHello,
    /// `HELLO`, `CHALLENGE` or `AUTH` once the link is authenticated.
    HandshakeOnAuthenticatedLink,
    /// A heartbeat naming as the node it follows an index beyond `--peers`.
    FollowsBeyondPeers {
        following: Option<PeerId>,
    },
    /// `MERGE` inside a merge.
    NestedMerge,
    /// `MERGED` with no merge open.
    MergedWithoutMerge,
    /// `P C` without a `P L` before it.
    PermitWithoutLimit,
    /// `P S` after a `P L` that no `P C` took.
    LimitWithoutPermit,
}

impl From<WireError> for PeerError {
    fn from(e: WireError) -> PeerError {
        PeerError::Wire(e)
    }
}

impl From<Unexpected> for PeerError {
    fn from(e: Unexpected) -> PeerError {
        PeerError::Unexpected(e)
    }
}

impl From<GrantRefusal> for PeerError {
    fn from(e: GrantRefusal) -> PeerError {
        PeerError::GrantRefused(e)
    }
}

impl PeerError {
    /// The reason as the `E` line and the log give it, shortened to
    /// [`super::MAX_REASON_BYTES`].
    pub(crate) fn reason(&self) -> String {
        super::shorten(self.to_string())
    }
}

impl fmt::Display for PeerError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PeerError::Wire(e) => e.fmt(f),
            PeerError::Unexpected(e) => e.fmt(f),
            PeerError::Authentication(why) => f.write_str(why),
            PeerError::GrantRefused(refusal) => refusal.fmt(f),
            PeerError::GaveUp { who, said } => write!(f, "{who} gave the link up: {said}"),
        }
    }
}

impl fmt::Display for Unexpected {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Unexpected::NotClustered => {
                f.write_str("peer message to a node started without --peers")
            }
            Unexpected::OnDialedLink { peer } => write!(
                f,
                "unexpected peer line from {peer} on the link this node dialed"
            ),
            Unexpected::AuthBeforeHello => f.write_str("peer AUTH before HELLO"),
            Unexpected::SecondHello => f.write_str("second HELLO on one link"),
            Unexpected::BeforeAuth => f.write_str("peer message before AUTH"),
            Unexpected::BeforeHello => f.write_str("peer message before HELLO"),
            Unexpected::HandshakeOnAuthenticatedLink => {
                f.write_str("handshake message on an authenticated link")
            }
            Unexpected::FollowsBeyondPeers { following } => {
                let following = following.map(|p| p.0);
                write!(f, "heartbeat follows node {following:?}, beyond --peers")
            }
            Unexpected::NestedMerge => f.write_str("peer MERGE inside a merge"),
            Unexpected::MergedWithoutMerge => f.write_str("peer MERGED without a MERGE"),
            Unexpected::PermitWithoutLimit => f.write_str("peer C (a permit) without its L line"),
            Unexpected::LimitWithoutPermit => {
                f.write_str("peer S (a shared grant) after an L line (a limit) no C took")
            }
        }
    }
}

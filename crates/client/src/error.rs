//! The client's typed errors.

use std::fmt;

/// Everything that can go wrong in a client call.
///
/// Network trouble never panics: it is one of these values.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Error {
    /// The wait ran out and nothing was granted (only from
    /// [`Client::lock`](super::Client::lock); [`Client::acquire`](super::Client::acquire)
    /// reports it as [`Acquired::TimedOut`](super::Acquired::TimedOut) instead).
    Timeout,
    /// No connection could carry the request, or a node did not answer in
    /// time: every connection tried dropped or went silent (no answer to a
    /// liveness probe) before answering, none was up, an acquire's wait
    /// plus grace ran out with a node still silent, or a release/renew found
    /// none within its retry window. The text names the node and says which.
    Connection(String),
    /// The nodes kept answering `M key -` (no active node known) for longer
    /// than the client's bound (`ClientBuilder::no_active_timeout`), or kept
    /// redirecting between each other, or an acquire's wait ran out while
    /// no node was active.
    NoActiveNode,
    /// The server sent `E <reason>` or a line that breaks the protocol. For
    /// the official client this means a bug on one side.
    Protocol(String),
    /// The call was refused before anything was sent: a bad key, a lease or
    /// wait out of range, token 0, an empty address list.
    InvalidArgument(String),
    /// A node refused the request for this client's identity: an acquire of
    /// a key outside the rules of its certificate's identity, or a
    /// certificate that names no usable identity (the node's `E` reason
    /// says "not allowed"; the text holds it). Not retried: it would be
    /// refused again.
    NotAllowed(String),
    /// The key is of another kind than the acquire asked for: a semaphore
    /// (of another limit) for a shared acquire or a permit, a lock for a
    /// permit. Nothing changed; the text says what the key is. Not
    /// retried.
    WrongKind(String),
}

impl Error {
    /// True for [`Error::Timeout`].
    pub fn is_timeout(&self) -> bool {
        matches!(self, Error::Timeout)
    }

    /// True for [`Error::Connection`] and [`Error::NoActiveNode`]: the cluster
    /// could not be reached, trying again later may work.
    pub fn is_connection(&self) -> bool {
        matches!(self, Error::Connection(_) | Error::NoActiveNode)
    }

    /// True for [`Error::Protocol`].
    pub fn is_protocol(&self) -> bool {
        matches!(self, Error::Protocol(_))
    }

    /// True for [`Error::NotAllowed`].
    pub fn is_not_allowed(&self) -> bool {
        matches!(self, Error::NotAllowed(_))
    }

    /// The error for an `E` line (or a broken answer) a node sent: a
    /// refusal by identity if its reason says "not allowed", else a
    /// protocol error.
    pub(crate) fn from_refusal(why: String) -> Error {
        if why.to_ascii_lowercase().contains("not allowed") {
            Error::NotAllowed(why)
        } else {
            Error::Protocol(why)
        }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Timeout => f.write_str("timed out waiting for the lock"),
            Error::Connection(why) => write!(f, "connection error: {why}"),
            Error::NoActiveNode => f.write_str("no active node in the cluster"),
            Error::Protocol(why) => write!(f, "protocol error: {why}"),
            Error::InvalidArgument(why) => write!(f, "invalid argument: {why}"),
            Error::NotAllowed(why) => write!(f, "not allowed: {why}"),
            Error::WrongKind(why) => write!(f, "refused: {why}"),
        }
    }
}

impl std::error::Error for Error {}

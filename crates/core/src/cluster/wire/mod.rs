//! The peer protocol: lines that start with `P `, on the same port as
//! clients (a client line never starts with `P`).
//!
//! Each node dials every other node and sends its state only on the
//! connection it dialed. A link is authenticated first (see [`super::auth`]):
//! the dialer's `HELLO`, the acceptor's `CHALLENGE` (the only line an
//! acceptor ever sends on a link, besides an `E` line that refuses it), the
//! dialer's `AUTH`; then the dialer's heartbeats and replication. See
//! docs/cluster.md.
//!
//! ```text
//! P HELLO <version> <fingerprint> <from-index> <from-addr> <incarnation> <nonce>
//! P CHALLENGE <fingerprint> <index> <addr> <nonce> <mac>
//! P AUTH <mac>
//! P HB <A|S> <active-index|-> <highest-token> <0|1>   heartbeat: role, the
//!                                                     node it follows, its
//!                                                     token, synced to it
//! P SNAP <highest-token>                              snapshot begins
//! P G <key> <token> <remaining-ms> <addr> <owner> <identity>
//!                                                     grant (or renewal);
//!                                                     version 3: no
//!                                                     identity; version 2:
//!                                                     no holder
//! P X <key> <token>                                   release or expiry
//! P SYNCED                                            snapshot complete
//! P HANDOFF <highest-token>                           you are active now
//! P MERGE <highest-token>                             version 4: the `G`
//! P MERGED                                            lines between are
//!                                                     grants to merge
//! P S <key> <token> <remaining-ms> <addr> <owner> <identity>
//!                                                     version 5: a shared
//!                                                     grant (or renewal)
//! P L <limit>                                         version 5: the next
//! P C <key> <token> <remaining-ms> <addr> <owner> <identity>
//!                                                     `C` is a permit of a
//!                                                     semaphore of <limit>
//! P PROBE <n>                                         version 5: answer
//!                                                     when everything
//!                                                     before is applied
//! P PROBED <n>                                        the answer, on the
//!                                                     follower's own link
//! P g <key> <token> <remaining-ms> <addr> <owner> [<identity>]
//! P x <key> <token>                                   version 6: `G` and
//!                                                     `X`, the numbers in
//!                                                     lowercase hex
//! ```
//!
//! A shared grant or permit ends with the `P X` of its token, as an
//! exclusive grant does. `P S` and `P C` always carry the three holder
//! fields (`-` for what is not known); the limit has a line of its own so
//! that no line is longer than a `P G` ([`LONGEST_GRANT_LINE`]).
//!
//! A node speaks versions [`MIN_VERSION`] to [`VERSION`]: the dialer says
//! in its `HELLO` which one the link speaks (see [`super::Cluster`] for how
//! it picks); a version 3 link carries a grant's holder (address and owner
//! label), a version 4 link its identity too (from its client certificate,
//! `-` for none) and a heal's merge, a version 5 link shared grants and
//! permits ([`SHARED_VERSION`]), a version 6 link its grants and releases
//! as `P g` and `P x` ([`HEX_VERSION`]). A node reads `P g` and `P x` on a
//! link of any version; it sends them only on a version 6 link.
//!
//! Every field is bounded: indexes below [`MAX_PEERS`], addresses as keys
//! (1 to 250 printable bytes), tokens at most [`MAX_TOKEN`], a remaining
//! lease at most [`MAX_REMAINING_MS`] (in hex: 1 to 16 lowercase digits,
//! no leading zero), a limit 1 to [`MAX_PERMITS`], fingerprints, nonces and MACs exactly
//! their length in lowercase hex. Anything else is a protocol error that
//! breaks the link.

mod encode;
mod fast;
mod hex;
mod parse;

pub use encode::encode;
pub(crate) use encode::{NEWEST, encode_replication};

use super::PeerId;
use super::auth::{Fingerprint, MacBytes, Nonce};
use crate::access::MAX_IDENTITY;
use crate::proto::{Holder, MAX_HOLDER_ADDR, MAX_KEY, MAX_LINE, MAX_OWNER};

/// The longest `P G` line, with its `\n` (a token has at most 19 digits, a
/// remaining lease 8): the session reads no longer peer line, so the
/// identity's bound is what the other fields leave of the 512 bytes.
pub const LONGEST_GRANT_LINE: usize = b"P G ".len()
    + MAX_KEY
    + b" 9223372036854775807 86400000 ".len()
    + MAX_HOLDER_ADDR
    + b" ".len()
    + MAX_OWNER
    + b" ".len()
    + MAX_IDENTITY
    + b"\n".len();

const _: () = assert!(LONGEST_GRANT_LINE <= MAX_LINE);

/// The newest peer protocol version, which this node dials with.
pub const VERSION: u64 = 6;

/// The first version whose grants and releases are `P g` and `P x`: the
/// fields of `P G` and `P X`, the token and remaining lease in hex
/// (written without a division: the active's cost per replicated change).
pub const HEX_VERSION: u64 = 6;

/// The first version that carries shared grants and permits (`P S`,
/// `P L`, `P C`). An active refuses `G` and `C` while a follower's link
/// speaks an older one (docs/cluster.md, "Guarantees").
pub const SHARED_VERSION: u64 = 5;

/// The first version that carries `PROBE` and `PROBED`: replication lag
/// measured on the active (see [`super::replication`]).
pub const PROBE_VERSION: u64 = 5;

/// The first version that carries `MERGE` ... `MERGED`.
pub const MERGE_VERSION: u64 = 4;

/// The first version whose `P G` carries the holder's identity.
pub const IDENTITY_VERSION: u64 = 4;

/// The oldest version this node still speaks: a link from (or to) a node
/// of the release before (`P G` without the holder).
pub const MIN_VERSION: u64 = 2;

/// The version the configuration fingerprint is taken over. It stays 2 so
/// that nodes speaking 2 and 3 have the same fingerprint for one `--peers`
/// list (a mixed cluster during an upgrade is one cluster).
pub const FINGERPRINT_VERSION: u64 = 2;

/// The most nodes a cluster may have (indexes are below this).
pub const MAX_PEERS: usize = 16;

/// The longest remaining lease a replicated grant may carry: the longest
/// lease a client may ask for (86,400 s).
pub const MAX_REMAINING_MS: u64 = 86_400_000;

/// One peer message, borrowing from the line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PeerMsg<'a> {
    Hello {
        /// The version this link speaks, [`MIN_VERSION`] to [`VERSION`].
        version: u64,
        fingerprint: Fingerprint,
        from: PeerId,
        addr: &'a [u8],
        incarnation: u64,
        nonce: Nonce,
    },
    Challenge {
        fingerprint: Fingerprint,
        index: PeerId,
        addr: &'a [u8],
        nonce: Nonce,
        mac: MacBytes,
    },
    Auth {
        mac: MacBytes,
    },
    Heartbeat {
        active: bool,
        following: Option<PeerId>,
        highest: u64,
        synced: bool,
    },
    Snapshot {
        highest: u64,
    },
    Grant {
        key: &'a [u8],
        token: u64,
        remaining_ms: u64,
        /// Version 3 (the identity: version 4); all `None` on a version 2
        /// link.
        holder: Holder<'a>,
    },
    Release {
        key: &'a [u8],
        token: u64,
    },
    Synced,
    Handoff {
        highest: u64,
    },
    /// The `G` lines up to [`PeerMsg::Merged`] are grants to merge, not to
    /// replicate: see [`crate::engine::merge`].
    Merge {
        highest: u64,
    },
    Merged,
    /// `P L`: the next [`PeerMsg::Member`] is a permit of a semaphore of
    /// `limit` (1 to [`MAX_PERMITS`]).
    Limit {
        limit: u32,
    },
    /// `P S` (a shared grant) or `P C` (a permit, after its `P L`).
    Member {
        key: &'a [u8],
        token: u64,
        remaining_ms: u64,
        holder: Holder<'a>,
        permit: bool,
    },
    /// From the active: answer with [`PeerMsg::Probed`] once every line
    /// before this one is applied.
    Probe {
        seq: u64,
    },
    /// A follower's answer to the active's [`PeerMsg::Probe`] `seq`, on
    /// the follower's own link to it.
    Probed {
        seq: u64,
    },
}

/// Why a peer line did not parse.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WireError {
    /// A line of the wrong shape or a field out of its bound: what was
    /// wrong, and the line as received (quoted: printable, bounded).
    Bad { what: &'static str, line: String },
    /// A `HELLO` of a peer protocol version other than [`VERSION`] (the
    /// version field, quoted).
    Version { got: String },
}

impl std::fmt::Display for WireError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            WireError::Bad { what, line } => write!(f, "bad peer line ({what}): \"{line}\""),
            WireError::Version { got } => write!(
                f,
                "peer protocol version \"{got}\" unsupported (this node speaks \
                 {MIN_VERSION} to {VERSION}): run releases at most one peer protocol \
                 version apart (docs/operations.md, upgrades)"
            ),
        }
    }
}

/// Parses a peer line (without its `\n`). Every field is checked against
/// its bound (module docs); the error says which field was wrong. A
/// well-formed `P g` or `P x` line, most of what a follower reads, is taken
/// by a fast path of its own (`fast.rs`), which accepts exactly what the
/// general parser does; every other line, and every malformed one, goes to
/// the general parser.
#[inline]
pub fn parse(line: &[u8]) -> Result<PeerMsg<'_>, WireError> {
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    fast::parse_replication(line, parse::parse)
}

/// [`parse`] without its fast path: the same result for every line (the
/// tests and the fuzz harness compare the two).
pub fn parse_general(line: &[u8]) -> Result<PeerMsg<'_>, WireError> {
    parse::parse(line.strip_suffix(b"\r").unwrap_or(line))
}

/// True if `line` (without `\n`) is a peer line rather than a client one.
pub fn is_peer_line(line: &[u8]) -> bool {
    line.starts_with(b"P ")
}

#[cfg(test)]
mod tests;

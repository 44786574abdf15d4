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
//! P PROBE <n>                                         version 5: answer
//!                                                     when everything
//!                                                     before is applied
//! P PROBED <n>                                        the answer, on the
//!                                                     follower's own link
//! ```
//!
//! A node speaks versions [`MIN_VERSION`] to [`VERSION`]: the dialer says
//! in its `HELLO` which one the link speaks (see [`super::Cluster`] for how
//! it picks); a version 3 link carries a grant's holder (address and owner
//! label), a version 4 link its identity too (from its client certificate,
//! `-` for none) and a heal's merge.
//!
//! Every field is bounded: indexes below [`MAX_PEERS`], addresses as keys
//! (1 to 250 printable bytes), tokens at most [`MAX_TOKEN`], a remaining
//! lease at most [`MAX_REMAINING_MS`], fingerprints, nonces and MACs exactly
//! their length in lowercase hex. Anything else is a protocol error that
//! breaks the link.

use super::auth::{self, Fingerprint, MAC_LEN, MacBytes, NONCE_LEN, Nonce};
use crate::access::{MAX_IDENTITY, is_valid_identity};
use crate::engine::Replication;
use crate::engine::token::MAX_TOKEN;
use crate::proto::{
    Holder, MAX_HOLDER_ADDR, MAX_KEY, MAX_LINE, MAX_OWNER, Quoted, is_valid_key, is_valid_owner,
    parse_u64, write_u64,
};

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
pub const VERSION: u64 = 5;

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
        from: usize,
        addr: &'a [u8],
        incarnation: u64,
        nonce: Nonce,
    },
    Challenge {
        fingerprint: Fingerprint,
        index: usize,
        addr: &'a [u8],
        nonce: Nonce,
        mac: MacBytes,
    },
    Auth {
        mac: MacBytes,
    },
    Heartbeat {
        active: bool,
        following: Option<usize>,
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

/// True if `line` (without `\n`) is a peer line rather than a client one.
pub fn is_peer_line(line: &[u8]) -> bool {
    line.starts_with(b"P ")
}

/// Parses a peer line (without its `\n`). Every field is checked against
/// its bound (module docs); the error says which field was wrong.
#[expect(clippy::too_many_lines)]
pub fn parse(line: &[u8]) -> Result<PeerMsg<'_>, WireError> {
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    let bad = |what: &'static str| WireError::Bad {
        what,
        line: Quoted(line).to_string(),
    };
    let mut fields = crate::proto::split_spaces(line);
    if fields.next() != Some(b"P") {
        return Err(bad("not a peer line"));
    }
    let kind = fields.next().ok_or_else(|| bad("no message kind"))?;
    // At most 6 fields follow the kind in any message: a 7th is an error,
    // so nothing here grows with the input.
    let mut f: [&[u8]; 7] = [b""; 7];
    let mut count = 0;
    for field in fields {
        if count == f.len() {
            return Err(bad("too many fields"));
        }
        f[count] = field;
        count += 1;
    }
    let want = |n: usize| {
        if count == n {
            Ok(())
        } else {
            Err(bad("wrong number of fields"))
        }
    };
    let token = |v: &[u8]| {
        parse_u64(v)
            .filter(|&t| t <= MAX_TOKEN)
            .ok_or_else(|| bad("token out of range"))
    };
    let index = |v: &[u8]| {
        parse_u64(v)
            .filter(|&i| i < MAX_PEERS as u64)
            .map(|i| i as usize)
            .ok_or_else(|| bad("peer index out of range"))
    };
    let key = |v: &'_ [u8]| {
        if is_valid_key(v) {
            Ok(())
        } else {
            Err(bad("bad key or address"))
        }
    };
    let fingerprint = |v: &[u8]| {
        auth::unhex::<8>(v)
            .map(u64::from_be_bytes)
            .ok_or_else(|| bad("bad fingerprint"))
    };
    let nonce = |v: &[u8]| auth::unhex::<NONCE_LEN>(v).ok_or_else(|| bad("bad nonce"));
    let mac = |v: &[u8]| auth::unhex::<MAC_LEN>(v).ok_or_else(|| bad("bad MAC"));
    let flag = |v: &[u8]| match v {
        b"0" => Ok(false),
        b"1" => Ok(true),
        _ => Err(bad("flag not 0 or 1")),
    };
    let msg = match kind {
        b"HELLO" => {
            let version = parse_u64(f[0]).filter(|v| (MIN_VERSION..=VERSION).contains(v));
            let Some(version) = version.filter(|_| count > 0) else {
                return Err(WireError::Version {
                    got: Quoted(f[0]).to_string(),
                });
            };
            want(6)?;
            key(f[3])?;
            PeerMsg::Hello {
                version,
                fingerprint: fingerprint(f[1])?,
                from: index(f[2])?,
                addr: f[3],
                incarnation: parse_u64(f[4]).ok_or_else(|| bad("bad incarnation"))?,
                nonce: nonce(f[5])?,
            }
        }
        b"CHALLENGE" => {
            want(5)?;
            key(f[2])?;
            PeerMsg::Challenge {
                fingerprint: fingerprint(f[0])?,
                index: index(f[1])?,
                addr: f[2],
                nonce: nonce(f[3])?,
                mac: mac(f[4])?,
            }
        }
        b"AUTH" => {
            want(1)?;
            PeerMsg::Auth { mac: mac(f[0])? }
        }
        b"HB" => {
            want(4)?;
            PeerMsg::Heartbeat {
                active: match f[0] {
                    b"A" => true,
                    b"S" => false,
                    _ => return Err(bad("role not A or S")),
                },
                following: if f[1] == b"-" {
                    None
                } else {
                    Some(index(f[1])?)
                },
                highest: token(f[2])?,
                synced: flag(f[3])?,
            }
        }
        b"SNAP" => {
            want(1)?;
            PeerMsg::Snapshot {
                highest: token(f[0])?,
            }
        }
        b"G" => {
            if count != 5 && count != 6 {
                want(3)?;
            }
            key(f[0])?;
            let holder = if count >= 5 {
                Holder {
                    addr: Some(f[3]).filter(|&a| a != b"-"),
                    owner: Some(f[4]).filter(|&o| o != b"-"),
                    identity: Some(f[5]).filter(|&i| count == 6 && i != b"-"),
                }
            } else {
                Holder::default()
            };
            if holder.identity.is_some_and(|i| !is_valid_identity(i)) {
                return Err(bad("bad identity"));
            }
            if holder
                .addr
                .is_some_and(|a| a.len() > MAX_HOLDER_ADDR || !is_valid_key(a))
            {
                return Err(bad("bad holder address"));
            }
            if holder.owner.is_some_and(|o| !is_valid_owner(o)) {
                return Err(bad("bad owner"));
            }
            PeerMsg::Grant {
                key: f[0],
                token: token(f[1])?,
                remaining_ms: parse_u64(f[2])
                    .filter(|&ms| ms <= MAX_REMAINING_MS)
                    .ok_or_else(|| bad("remaining lease out of range"))?,
                holder,
            }
        }
        b"X" => {
            want(2)?;
            key(f[0])?;
            PeerMsg::Release {
                key: f[0],
                token: token(f[1])?,
            }
        }
        b"SYNCED" => {
            want(0)?;
            PeerMsg::Synced
        }
        b"HANDOFF" => {
            want(1)?;
            PeerMsg::Handoff {
                highest: token(f[0])?,
            }
        }
        b"MERGE" => {
            want(1)?;
            PeerMsg::Merge {
                highest: token(f[0])?,
            }
        }
        b"MERGED" => {
            want(0)?;
            PeerMsg::Merged
        }
        b"PROBE" | b"PROBED" => {
            want(1)?;
            let seq = parse_u64(f[0]).ok_or_else(|| bad("bad probe number"))?;
            if kind == b"PROBE" {
                PeerMsg::Probe { seq }
            } else {
                PeerMsg::Probed { seq }
            }
        }
        _ => return Err(bad("unknown message kind")),
    };
    Ok(msg)
}

/// Appends `msg` as a line.
#[expect(clippy::too_many_lines)]
pub fn encode(out: &mut Vec<u8>, msg: &PeerMsg<'_>) {
    match *msg {
        PeerMsg::Hello {
            version,
            fingerprint,
            from,
            addr,
            incarnation,
            nonce,
        } => {
            out.extend_from_slice(b"P HELLO ");
            write_u64(out, version);
            out.push(b' ');
            out.extend_from_slice(auth::hex(&fingerprint.to_be_bytes()).as_bytes());
            out.push(b' ');
            write_u64(out, from as u64);
            out.push(b' ');
            out.extend_from_slice(addr);
            out.push(b' ');
            write_u64(out, incarnation);
            out.push(b' ');
            out.extend_from_slice(auth::hex(&nonce).as_bytes());
        }
        PeerMsg::Challenge {
            fingerprint,
            index,
            addr,
            nonce,
            mac,
        } => {
            out.extend_from_slice(b"P CHALLENGE ");
            out.extend_from_slice(auth::hex(&fingerprint.to_be_bytes()).as_bytes());
            out.push(b' ');
            write_u64(out, index as u64);
            out.push(b' ');
            out.extend_from_slice(addr);
            out.push(b' ');
            out.extend_from_slice(auth::hex(&nonce).as_bytes());
            out.push(b' ');
            out.extend_from_slice(auth::hex(&mac).as_bytes());
        }
        PeerMsg::Auth { mac } => {
            out.extend_from_slice(b"P AUTH ");
            out.extend_from_slice(auth::hex(&mac).as_bytes());
        }
        PeerMsg::Heartbeat {
            active,
            following,
            highest,
            synced,
        } => {
            out.extend_from_slice(if active { b"P HB A " } else { b"P HB S " });
            match following {
                Some(i) => write_u64(out, i as u64),
                None => out.push(b'-'),
            }
            out.push(b' ');
            write_u64(out, highest);
            out.extend_from_slice(if synced { b" 1" } else { b" 0" });
        }
        PeerMsg::Snapshot { highest } => {
            out.extend_from_slice(b"P SNAP ");
            write_u64(out, highest);
        }
        PeerMsg::Grant {
            key,
            token,
            remaining_ms,
            holder,
        } => {
            let holder = (holder != Holder::default()).then_some(holder);
            encode_grant(out, key, token, remaining_ms, holder, true);
            return;
        }
        PeerMsg::Release { key, token } => {
            encode_release(out, key, token);
            return;
        }
        PeerMsg::Synced => out.extend_from_slice(b"P SYNCED"),
        PeerMsg::Handoff { highest } => {
            out.extend_from_slice(b"P HANDOFF ");
            write_u64(out, highest);
        }
        PeerMsg::Merge { highest } => {
            out.extend_from_slice(b"P MERGE ");
            write_u64(out, highest);
        }
        PeerMsg::Merged => out.extend_from_slice(b"P MERGED"),
        PeerMsg::Probe { seq } => {
            out.extend_from_slice(b"P PROBE ");
            write_u64(out, seq);
        }
        PeerMsg::Probed { seq } => {
            out.extend_from_slice(b"P PROBED ");
            write_u64(out, seq);
        }
    }
    out.push(b'\n');
}

/// Appends the peer line of an engine's replication event for a link of
/// peer protocol `version`: `P G` for [`Replication::Granted`] (with the
/// holder from version 3 on), `P X` for [`Replication::Released`], and for
/// [`Replication::Believed`] its `P G` between `P MERGE` and `P MERGED`
/// (version 4 on; nothing before: an older node knows no believed grants).
/// The engine records events; this is the only place they become lines.
#[inline(always)]
pub(crate) fn encode_replication(out: &mut Vec<u8>, event: Replication<'_>, version: u64) {
    match event {
        Replication::Granted {
            key,
            token,
            remaining_ms,
            holder,
        } => {
            // Version 3 has the holder without its identity, 2 neither.
            let holder = (version >= 3).then_some(holder);
            let identity = version >= IDENTITY_VERSION;
            encode_grant(out, key, token, remaining_ms, holder, identity);
        }
        Replication::Released { key, token } => encode_release(out, key, token),
        Replication::Believed {
            key,
            token,
            remaining_ms,
            holder,
        } if version >= MERGE_VERSION => {
            encode(out, &PeerMsg::Merge { highest: token });
            encode_grant(out, key, token, remaining_ms, Some(holder), true);
            encode(out, &PeerMsg::Merged);
        }
        Replication::Believed { .. } => {}
    }
}

/// Appends `P G <key> <token> <remaining_ms>`, then ` <addr> <owner>` with a
/// holder (`-` for what it does not know), ` <identity>` if the holder has
/// one and `identity` (a link of [`IDENTITY_VERSION`] on), and `\n`. The
/// version 3 form (no identity) is what a version 4 node reads as "no
/// identity" too.
pub(crate) fn encode_grant(
    out: &mut Vec<u8>,
    key: &[u8],
    token: u64,
    remaining_ms: u64,
    holder: Option<Holder<'_>>,
    identity: bool,
) {
    out.extend_from_slice(b"P G ");
    out.extend_from_slice(key);
    out.push(b' ');
    write_u64(out, token);
    out.push(b' ');
    write_u64(out, remaining_ms);
    if let Some(holder) = holder {
        out.push(b' ');
        out.extend_from_slice(holder.addr.unwrap_or(b"-"));
        out.push(b' ');
        out.extend_from_slice(holder.owner.unwrap_or(b"-"));
        if let Some(identity) = holder.identity.filter(|_| identity) {
            debug_assert!(is_valid_identity(identity));
            out.push(b' ');
            out.extend_from_slice(identity);
        }
    }
    out.push(b'\n');
}

/// Appends `P X <key> <token>\n`.
pub(crate) fn encode_release(out: &mut Vec<u8>, key: &[u8], token: u64) {
    out.extend_from_slice(b"P X ");
    out.extend_from_slice(key);
    out.push(b' ');
    write_u64(out, token);
    out.push(b'\n');
}

#[cfg(test)]
mod tests {
    use super::*;

    fn all_kinds() -> Vec<PeerMsg<'static>> {
        vec![
            PeerMsg::Hello {
                version: VERSION,
                fingerprint: 0x0123_4567_89ab_cdef,
                from: 2,
                addr: b"127.0.0.1:7173",
                incarnation: u64::MAX,
                nonce: [0xa5; NONCE_LEN],
            },
            PeerMsg::Challenge {
                fingerprint: 0,
                index: MAX_PEERS - 1,
                addr: b"db1.example:7171",
                nonce: [0; NONCE_LEN],
                mac: [0xff; MAC_LEN],
            },
            PeerMsg::Auth { mac: [7; MAC_LEN] },
            PeerMsg::Heartbeat {
                active: true,
                following: None,
                highest: MAX_TOKEN,
                synced: false,
            },
            PeerMsg::Heartbeat {
                active: false,
                following: Some(0),
                highest: 5,
                synced: true,
            },
            PeerMsg::Snapshot { highest: 7 },
            PeerMsg::Grant {
                key: b"k\xff",
                token: 3,
                remaining_ms: MAX_REMAINING_MS,
                holder: Holder::default(),
            },
            PeerMsg::Grant {
                key: b"k",
                token: 3,
                remaining_ms: 1,
                holder: Holder {
                    addr: Some(b"[::1]:40000"),
                    owner: Some(b"host-a/job-42"),
                    identity: None,
                },
            },
            PeerMsg::Grant {
                key: b"k",
                token: 3,
                remaining_ms: 1,
                holder: Holder {
                    addr: None,
                    owner: Some(b"o"),
                    identity: None,
                },
            },
            PeerMsg::Grant {
                key: b"k",
                token: 3,
                remaining_ms: 1,
                holder: Holder {
                    addr: None,
                    owner: None,
                    identity: Some(b"spiffe://x/alice"),
                },
            },
            PeerMsg::Release {
                key: b"k",
                token: 3,
            },
            PeerMsg::Synced,
            PeerMsg::Handoff { highest: 11 },
            PeerMsg::Merge { highest: 12 },
            PeerMsg::Merged,
            PeerMsg::Probe { seq: 0 },
            PeerMsg::Probed { seq: u64::MAX },
        ]
    }

    #[test]
    fn every_message_round_trips() {
        for msg in all_kinds() {
            let mut out = Vec::new();
            encode(&mut out, &msg);
            assert_eq!(out.last(), Some(&b'\n'));
            let line = &out[..out.len() - 1];
            assert!(is_peer_line(line));
            assert!(line.len() < crate::proto::MAX_LINE, "{}", line.len());
            assert_eq!(parse(line), Ok(msg));
        }
    }

    #[test]
    fn replication_events_become_grant_and_release_lines() {
        let events = [
            Replication::Granted {
                key: b"k\xff",
                token: 3,
                remaining_ms: MAX_REMAINING_MS,
                holder: Holder {
                    addr: Some(b"127.0.0.1:5"),
                    owner: None,
                    identity: Some(b"alice"),
                },
            },
            Replication::Released {
                key: b"k",
                token: MAX_TOKEN,
            },
        ];
        let mut old = Vec::new();
        for event in events {
            encode_replication(&mut old, event, 2);
        }
        assert_eq!(old, b"P G k\xff 3 86400000\nP X k 9223372036854775807\n");
        let mut v3 = Vec::new();
        encode_replication(&mut v3, events[0], 3);
        assert_eq!(v3, b"P G k\xff 3 86400000 127.0.0.1:5 -\n");
        let mut out = Vec::new();
        for event in events {
            encode_replication(&mut out, event, VERSION);
        }
        assert_eq!(
            out,
            b"P G k\xff 3 86400000 127.0.0.1:5 - alice\nP X k 9223372036854775807\n"
        );
        let mut lines = out.split(|&b| b == b'\n');
        assert_eq!(
            lines.next().map(parse),
            Some(Ok(PeerMsg::Grant {
                key: b"k\xff",
                token: 3,
                remaining_ms: MAX_REMAINING_MS,
                holder: Holder {
                    addr: Some(b"127.0.0.1:5"),
                    owner: None,
                    identity: Some(b"alice"),
                },
            }))
        );
        assert_eq!(
            lines.next().map(parse),
            Some(Ok(PeerMsg::Release {
                key: b"k",
                token: MAX_TOKEN
            }))
        );
    }

    #[test]
    fn malformed_peer_lines_are_errors() {
        let nonce = "ab".repeat(NONCE_LEN);
        let mac = "cd".repeat(MAC_LEN);
        let lines = [
            "P".to_string(),
            "P HB A - 1".into(),
            "P HB Q - 1 0".into(),
            "P HB S 0 1 2".into(),
            "P HB S 16 1 1".into(),
            "P HB S 0 9223372036854775808 1".into(),
            "P HB S 0 18446744073709551615 1".into(),
            "P HB S 0 1 1 extra".into(),
            "P HB S 0 1 1 a b c d e f g h i j".into(),
            "P SNAP 18446744073709551615".into(),
            "P HANDOFF 18446744073709551615".into(),
            "P G k 1".into(),
            "P G k 1 1 -".into(),
            "P G k 1 1 - - x y".into(),
            "P G k 1 1 - - *".into(),
            "P G k 1 1 - - a\x01".into(),
            format!("P G k 1 1 - - {}", "i".repeat(MAX_IDENTITY + 1)),
            "P G k 1 1 a\x01b -".into(),
            "P G k 1 1 - caf\u{e9}".into(),
            format!("P G k 1 1 {} -", "a".repeat(65)),
            "P G k 1 1 - o\x7f".into(),
            "P G k 1 86400001".into(),
            "P G k 9223372036854775808 5".into(),
            "P G bad\x01key 1 1".into(),
            "P X k 18446744073709551615".into(),
            "P HELLO 1 0 a 1".into(),
            format!("P HELLO 2 0123456789abcdef 0 a:1 1 {}", &nonce[1..]),
            format!("P HELLO 2 0123456789ABCDEF 0 a:1 1 {nonce}"),
            format!("P HELLO 2 0123456789abcdef 16 a:1 1 {nonce}"),
            format!("P HELLO 2 0123456789abcdef 99999999999999999999 a:1 1 {nonce}"),
            format!("P HELLO 2 0123456789abcdef 0 a:1 x {nonce}"),
            format!("P CHALLENGE 0123456789abcdef 0 a:1 {nonce} {}", &mac[2..]),
            format!("P AUTH {mac}0"),
            "P AUTH".into(),
            "P MERGE".into(),
            "P MERGE 9223372036854775808".into(),
            "P MERGE 1 2".into(),
            "P MERGED 1".into(),
            "P PROBE".into(),
            "P PROBE x".into(),
            "P PROBE 18446744073709551616".into(),
            "P PROBED 1 2".into(),
            "P PROBED -1".into(),
            "P NOPE".into(),
            "A k 1 0".into(),
        ];
        for line in lines {
            assert!(parse(line.as_bytes()).is_err(), "{line}");
        }
    }

    #[test]
    fn error_reasons_are_printable_and_short() {
        let mut line = b"P G \x01\x7f\xff\r".to_vec();
        line.extend(std::iter::repeat_n(b'k', 400));
        let err = parse(&line).unwrap_err().to_string();
        assert!(err.bytes().all(|b| (0x20..0x7f).contains(&b)), "{err}");
        assert!(err.len() < 120, "{err}");
        assert!(err.contains("\\x01\\x7f\\xff"), "{err}");
    }

    #[test]
    fn a_wrong_version_says_so() {
        let err = parse(b"P HELLO 1 0 127.0.0.1:7171 5")
            .unwrap_err()
            .to_string();
        assert!(err.contains("version \"1\" unsupported"), "{err}");
        let err = parse(b"P HELLO 6 0 127.0.0.1:7171 5")
            .unwrap_err()
            .to_string();
        // What an older node says of a newer one: the dialer reads this
        // (`Cluster::downgrade_if_refused`).
        assert!(
            err.contains("peer protocol version \"6\" unsupported"),
            "{err}"
        );
    }

    #[test]
    fn both_versions_are_spoken() {
        let nonce = "ab".repeat(NONCE_LEN);
        for version in MIN_VERSION..=VERSION {
            let line = format!("P HELLO {version} 0123456789abcdef 0 a:1 1 {nonce}");
            match parse(line.as_bytes()) {
                Ok(PeerMsg::Hello { version: v, .. }) => assert_eq!(v, version),
                other => panic!("{line}: {other:?}"),
            }
        }
    }

    #[test]
    fn lines_cut_or_mangled_anywhere_never_panic() {
        // Every prefix and every single-byte change of every message kind.
        for msg in all_kinds() {
            let mut out = Vec::new();
            encode(&mut out, &msg);
            out.pop();
            for cut in 0..=out.len() {
                let _ = parse(&out[..cut]);
            }
            for i in 0..out.len() {
                for b in [b' ', b'0', b'9', b'a', b'-', 0, 0xff] {
                    let mut changed = out.clone();
                    changed[i] = b;
                    let _ = parse(&changed);
                }
            }
        }
    }
}

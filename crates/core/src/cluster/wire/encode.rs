//! Encoding peer messages and the engine's replication events as lines.

use super::hex::write_hex;
use super::{HEX_VERSION, IDENTITY_VERSION, MERGE_VERSION, PeerMsg, SHARED_VERSION, VERSION};
use crate::access::is_valid_identity;
use crate::cluster::auth;
use crate::engine::{LineEncoder, Replication};
use crate::proto::{Holder, MAX_DURATION_MS, write_u64};

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
            write_u64(out, from.0 as u64);
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
            write_u64(out, index.0 as u64);
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
                Some(i) => write_u64(out, i.0 as u64),
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
        PeerMsg::Limit { limit } => {
            out.extend_from_slice(b"P L ");
            write_u64(out, u64::from(limit));
        }
        PeerMsg::Member {
            key,
            token,
            remaining_ms,
            holder,
            permit,
        } => {
            encode_member(out, permit, key, token, remaining_ms, holder);
            return;
        }
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
/// (version 4 on; nothing before: an older node knows no believed grants),
/// `P S` or `P L` and `P C` for [`Replication::Member`] (version 5 on).
/// From [`HEX_VERSION`] on a grant is `P g` and a release `P x`: the same
/// fields, the token and remaining lease in hex. The engine records
/// events; this is the only place they become lines.
#[inline(always)]
pub(crate) fn encode_replication(out: &mut Vec<u8>, event: Replication<'_>, version: u64) {
    match event {
        Replication::Granted {
            key,
            token,
            remaining_ms,
            holder,
        } if version >= HEX_VERSION => encode_grant_hex(out, key, token, remaining_ms, holder),
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
        Replication::Released { key, token } if version >= HEX_VERSION => {
            encode_release_hex(out, key, token);
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
        Replication::Member {
            key,
            token,
            remaining_ms,
            holder,
            limit,
        } if version >= SHARED_VERSION => {
            if limit > 0 {
                encode(out, &PeerMsg::Limit { limit });
            }
            encode_member(out, limit > 0, key, token, remaining_ms, holder);
        }
        // An older node knows no members: the active refuses `G` and `C`
        // while one follows it.
        Replication::Member { .. } => {}
    }
}

/// [`encode_replication`] at [`VERSION`]: what the active's engine records
/// a turn's events as while every follower speaks it. A grant and a
/// release go to their encoders directly, as [`encode_replication`] would
/// send them at [`VERSION`] (the assertion below makes a new version
/// revisit this).
pub(crate) const NEWEST: LineEncoder = LineEncoder {
    grant: encode_grant_hex,
    release: encode_release_hex,
    any: |out, event| encode_replication(out, event, VERSION),
};
const _: () = assert!(VERSION == HEX_VERSION, "NEWEST writes P g and P x");

/// The remaining lease a grant's line carries: at most the longest lease,
/// the bound every follower (of every version) accepts. A grant of the
/// longest lease has 1 ms more on the active, whose deadline rounds up
/// (the clock reads a floor); the follower's copy ends that 1 ms sooner,
/// never later than the active's.
#[inline(always)]
fn within_bound(remaining_ms: u64) -> u64 {
    remaining_ms.min(MAX_DURATION_MS)
}

/// Appends `P S` (or `P C` for a `permit`) `<key> <token> <remaining_ms>
/// <addr> <owner> <identity>\n`, `-` for a holder field not known.
pub(crate) fn encode_member(
    out: &mut Vec<u8>,
    permit: bool,
    key: &[u8],
    token: u64,
    remaining_ms: u64,
    holder: Holder<'_>,
) {
    out.extend_from_slice(if permit { b"P C " } else { b"P S " });
    out.extend_from_slice(key);
    out.push(b' ');
    write_u64(out, token);
    out.push(b' ');
    write_u64(out, within_bound(remaining_ms));
    for field in [holder.addr, holder.owner, holder.identity] {
        out.push(b' ');
        out.extend_from_slice(field.unwrap_or(b"-"));
    }
    out.push(b'\n');
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
    write_u64(out, within_bound(remaining_ms));
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

/// Appends `P g <key> <token> <remaining_ms> <addr> <owner>`, ` <identity>`
/// if the holder has one, and `\n`: a `P G` of version 4 with the token
/// and the remaining lease in hex ([`HEX_VERSION`]), `-` for a holder field
/// not known.
pub(crate) fn encode_grant_hex(
    out: &mut Vec<u8>,
    key: &[u8],
    token: u64,
    remaining_ms: u64,
    holder: Holder<'_>,
) {
    out.extend_from_slice(b"P g ");
    out.extend_from_slice(key);
    out.push(b' ');
    write_hex(out, token);
    out.push(b' ');
    write_hex(out, within_bound(remaining_ms));
    out.push(b' ');
    append(out, holder.addr);
    out.push(b' ');
    append(out, holder.owner);
    if let Some(identity) = holder.identity {
        debug_assert!(is_valid_identity(identity));
        out.push(b' ');
        out.extend_from_slice(identity);
    }
    out.push(b'\n');
}

/// Appends `P x <key> <token>\n`, the token in hex ([`HEX_VERSION`]).
pub(crate) fn encode_release_hex(out: &mut Vec<u8>, key: &[u8], token: u64) {
    out.extend_from_slice(b"P x ");
    out.extend_from_slice(key);
    out.push(b' ');
    write_hex(out, token);
    out.push(b'\n');
}

/// Appends a holder field, `-` for none: a push, not a call to `memcpy`,
/// for `-` (most grants have no owner label).
#[inline(always)]
fn append(out: &mut Vec<u8>, field: Option<&[u8]>) {
    match field {
        Some(bytes) => out.extend_from_slice(bytes),
        None => out.push(b'-'),
    }
}

//! Parsing a peer line: every field checked against its bound.

use super::hex::parse_hex;
use super::{MAX_PEERS, MAX_REMAINING_MS, MIN_VERSION, PeerId, PeerMsg, VERSION, WireError};
use crate::access::is_valid_identity;
use crate::cluster::auth::{self, Fingerprint, MAC_LEN, NONCE_LEN};
use crate::engine::token::MAX_TOKEN;
use crate::proto::{
    Holder, MAX_HOLDER_ADDR, MAX_PERMITS, Quoted, is_valid_key, is_valid_owner, parse_u64,
};

/// Parses a peer line without its `\n` and `\r` ([`super::parse()`] strips
/// them): the general parser, of every kind of line. Every field is checked
/// against its bound (module docs); the error says which field was wrong.
#[expect(clippy::too_many_lines)]
#[inline(never)]
pub(super) fn parse(line: &[u8]) -> Result<PeerMsg<'_>, WireError> {
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
            .map(|i| PeerId(i as usize))
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
            .map(Fingerprint::from_be_bytes)
            .ok_or_else(|| bad("bad fingerprint"))
    };
    let nonce = |v: &[u8]| auth::unhex::<NONCE_LEN>(v).ok_or_else(|| bad("bad nonce"));
    let mac = |v: &[u8]| auth::unhex::<MAC_LEN>(v).ok_or_else(|| bad("bad MAC"));
    let holder_ok = |holder: &Holder<'_>| {
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
        Ok(())
    };
    let remaining = |v: &[u8]| {
        parse_u64(v)
            .filter(|&ms| ms <= MAX_REMAINING_MS)
            .ok_or_else(|| bad("remaining lease out of range"))
    };
    let flag = |v: &[u8]| match v {
        b"0" => Ok(false),
        b"1" => Ok(true),
        _ => Err(bad("flag not 0 or 1")),
    };
    let msg = match kind {
        // The lines of a version 6 link's replication first: they compare
        // no other kinds.
        b"g" => {
            if count != 6 {
                want(5)?;
            }
            key(f[0])?;
            let holder = Holder {
                addr: Some(f[3]).filter(|&a| a != b"-"),
                owner: Some(f[4]).filter(|&o| o != b"-"),
                identity: Some(f[5]).filter(|&i| count == 6 && i != b"-"),
            };
            holder_ok(&holder)?;
            PeerMsg::Grant {
                key: f[0],
                token: parse_hex(f[1])
                    .filter(|&t| t <= MAX_TOKEN)
                    .ok_or_else(|| bad("token out of range"))?,
                remaining_ms: parse_hex(f[2])
                    .filter(|&ms| ms <= MAX_REMAINING_MS)
                    .ok_or_else(|| bad("remaining lease out of range"))?,
                holder,
            }
        }
        b"x" => {
            want(2)?;
            key(f[0])?;
            PeerMsg::Release {
                key: f[0],
                token: parse_hex(f[1])
                    .filter(|&t| t <= MAX_TOKEN)
                    .ok_or_else(|| bad("token out of range"))?,
            }
        }
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
        // The rarer lines last: a `P G` or `P X` compares no more kinds.
        b"S" | b"C" => {
            want(6)?;
            key(f[0])?;
            let holder = Holder {
                addr: Some(f[3]).filter(|&a| a != b"-"),
                owner: Some(f[4]).filter(|&o| o != b"-"),
                identity: Some(f[5]).filter(|&i| i != b"-"),
            };
            holder_ok(&holder)?;
            PeerMsg::Member {
                key: f[0],
                token: token(f[1])?,
                remaining_ms: remaining(f[2])?,
                holder,
                permit: kind == b"C",
            }
        }
        b"L" => {
            want(1)?;
            let limit = parse_u64(f[0])
                .filter(|l| (1..=u64::from(MAX_PERMITS)).contains(l))
                .ok_or_else(|| bad("semaphore limit out of range"))?;
            PeerMsg::Limit {
                limit: u32::try_from(limit).map_err(|_| bad("semaphore limit out of range"))?,
            }
        }
        _ => return Err(bad("unknown message kind")),
    };
    Ok(msg)
}

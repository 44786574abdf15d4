//! The peer protocol: lines that start with `P `, on the same port as
//! clients (a client line never starts with `P`).
//!
//! Each node dials every other node and only sends on the connection it
//! dialed; the first line names the sender. See docs/cluster.md.
//!
//! ```text
//! P HELLO 1 <from-index> <from-addr> <incarnation>   first line of a link
//! P HB <A|S> <active-index|-> <highest-token> <0|1>   heartbeat: role, the
//!                                                     node it follows, its
//!                                                     token, synced to it
//! P SNAP <highest-token>                              snapshot begins
//! P G <key> <token> <remaining-ms>                    grant (or renewal)
//! P X <key> <token>                                   release or expiry
//! P SYNCED                                            snapshot complete
//! P HANDOFF <highest-token>                           you are active now
//! ```

use crate::proto::{is_valid_key, parse_u64, write_u64};

/// The peer protocol's version, sent in `HELLO`.
pub const VERSION: u64 = 1;

/// One peer message, borrowing from the line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PeerMsg<'a> {
    Hello {
        from: usize,
        addr: &'a [u8],
        incarnation: u64,
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
    },
    Release {
        key: &'a [u8],
        token: u64,
    },
    Synced,
    Handoff {
        highest: u64,
    },
}

/// True if `line` (without `\n`) is a peer line rather than a client one.
pub fn is_peer_line(line: &[u8]) -> bool {
    line.starts_with(b"P ")
}

/// Parses a peer line (without its `\n`).
pub fn parse(line: &[u8]) -> Result<PeerMsg<'_>, String> {
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    let bad = || format!("bad peer line \"{}\"", String::from_utf8_lossy(line));
    let mut fields = line.split(|&b| b == b' ');
    if fields.next() != Some(b"P") {
        return Err(bad());
    }
    let kind = fields.next().ok_or_else(bad)?;
    let f: Vec<&[u8]> = fields.collect();
    let num = |i: usize| f.get(i).and_then(|v| parse_u64(v)).ok_or_else(bad);
    let key = |i: usize| {
        f.get(i)
            .copied()
            .filter(|k| is_valid_key(k))
            .ok_or_else(bad)
    };
    let want = |n: usize| if f.len() == n { Ok(()) } else { Err(bad()) };
    let msg = match kind {
        b"HELLO" => {
            want(4)?;
            if num(0)? != VERSION {
                return Err(format!("peer protocol version {} unsupported", num(0)?));
            }
            PeerMsg::Hello {
                from: num(1)? as usize,
                addr: f[2],
                incarnation: num(3)?,
            }
        }
        b"HB" => {
            want(4)?;
            PeerMsg::Heartbeat {
                active: match f[0] {
                    b"A" => true,
                    b"S" => false,
                    _ => return Err(bad()),
                },
                following: if f[1] == b"-" {
                    None
                } else {
                    Some(num(1)? as usize)
                },
                highest: num(2)?,
                synced: num(3)? == 1,
            }
        }
        b"SNAP" => {
            want(1)?;
            PeerMsg::Snapshot { highest: num(0)? }
        }
        b"G" => {
            want(3)?;
            PeerMsg::Grant {
                key: key(0)?,
                token: num(1)?,
                remaining_ms: num(2)?,
            }
        }
        b"X" => {
            want(2)?;
            PeerMsg::Release {
                key: key(0)?,
                token: num(1)?,
            }
        }
        b"SYNCED" => {
            want(0)?;
            PeerMsg::Synced
        }
        b"HANDOFF" => {
            want(1)?;
            PeerMsg::Handoff { highest: num(0)? }
        }
        _ => return Err(bad()),
    };
    Ok(msg)
}

/// Appends `msg` as a line.
pub fn encode(out: &mut Vec<u8>, msg: &PeerMsg<'_>) {
    match *msg {
        PeerMsg::Hello {
            from,
            addr,
            incarnation,
        } => {
            out.extend_from_slice(b"P HELLO ");
            write_u64(out, VERSION);
            out.push(b' ');
            write_u64(out, from as u64);
            out.push(b' ');
            out.extend_from_slice(addr);
            out.push(b' ');
            write_u64(out, incarnation);
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
        } => {
            encode_grant(out, key, token, remaining_ms);
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
    }
    out.push(b'\n');
}

/// Appends `P G <key> <token> <remaining_ms>\n`.
pub fn encode_grant(out: &mut Vec<u8>, key: &[u8], token: u64, remaining_ms: u64) {
    out.extend_from_slice(b"P G ");
    out.extend_from_slice(key);
    out.push(b' ');
    write_u64(out, token);
    out.push(b' ');
    write_u64(out, remaining_ms);
    out.push(b'\n');
}

/// Appends `P X <key> <token>\n`.
pub fn encode_release(out: &mut Vec<u8>, key: &[u8], token: u64) {
    out.extend_from_slice(b"P X ");
    out.extend_from_slice(key);
    out.push(b' ');
    write_u64(out, token);
    out.push(b'\n');
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_message_round_trips() {
        let msgs = [
            PeerMsg::Hello {
                from: 2,
                addr: b"127.0.0.1:7173",
                incarnation: 99,
            },
            PeerMsg::Heartbeat {
                active: true,
                following: None,
                highest: u64::MAX,
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
                remaining_ms: 1500,
            },
            PeerMsg::Release {
                key: b"k",
                token: 3,
            },
            PeerMsg::Synced,
            PeerMsg::Handoff { highest: 11 },
        ];
        for msg in msgs {
            let mut out = Vec::new();
            encode(&mut out, &msg);
            assert_eq!(out.last(), Some(&b'\n'));
            let line = &out[..out.len() - 1];
            assert!(is_peer_line(line));
            assert_eq!(parse(line), Ok(msg));
        }
    }

    #[test]
    fn malformed_peer_lines_are_errors() {
        for line in [
            &b"P"[..],
            b"P HB A - 1",
            b"P HB Q - 1 0",
            b"P HELLO 2 0 a 1",
            b"P G k 1",
            b"P G bad\x01key 1 1",
            b"P NOPE",
            b"A k 1 0",
        ] {
            assert!(parse(line).is_err(), "{}", String::from_utf8_lossy(line));
        }
    }
}

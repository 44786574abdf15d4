//! Answers: encoded by the server, parsed by clients.

use std::fmt;

use super::{is_valid_key, is_valid_owner, parse_u64, write_u64};

/// A node's role as `S` reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    Active,
    Standby,
}

impl Role {
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Active => "active",
            Role::Standby => "standby",
        }
    }
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The kind of an acquire that is not `A`'s: its answers carry its op.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Kind {
    /// `G`: a shared acquire.
    Shared,
    /// `C`: a semaphore acquire.
    Permit,
}

impl Kind {
    /// The op of the request, and of its answers.
    pub fn op(self) -> u8 {
        match self {
            Kind::Shared => b'G',
            Kind::Permit => b'C',
        }
    }
}

/// How a key is held, as a `V` answer lists it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Held {
    /// `-`: nobody holds it (a lock only kept for a held-back `T`).
    Free,
    /// `exclusive`: one holder, acquired with `A`.
    Exclusive,
    /// `shared`: one or more shared holders, acquired with `G`.
    Shared,
    /// `semaphore`: one or more permits of a semaphore, acquired with `C`.
    Semaphore,
}

impl Held {
    /// The word `V` answers carry.
    pub fn as_str(self) -> &'static str {
        match self {
            Held::Free => "-",
            Held::Exclusive => "exclusive",
            Held::Shared => "shared",
            Held::Semaphore => "semaphore",
        }
    }

    fn parse(word: &[u8]) -> Option<Held> {
        Some(match word {
            b"-" => Held::Free,
            b"exclusive" => Held::Exclusive,
            b"shared" => Held::Shared,
            b"semaphore" => Held::Semaphore,
            _ => return None,
        })
    }
}

impl fmt::Display for Held {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Who holds a grant, or waits: the address of the connection that asked,
/// as the server saw it, and that connection's owner label (`O`). Each is
/// `-` on the wire when unknown (`None`). With client certificates the
/// holder also has an identity (from its certificate), which the client
/// protocol never shows: only the peer protocol carries it, so that a
/// standby knows who may release and renew the grant.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Holder<'a> {
    pub addr: Option<&'a [u8]>,
    pub owner: Option<&'a [u8]>,
    pub identity: Option<&'a [u8]>,
}

/// One answer line. `addr` is `None` for `-` (no known active node).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Answer<'a> {
    /// `A <key> <token>`: granted.
    Granted { key: &'a [u8], token: u64 },
    /// `T <key>`: the wait ran out, nothing granted.
    TimedOut { key: &'a [u8] },
    /// `M <key> <addr>`: this node does not serve; `addr` is the active one.
    Moved {
        key: &'a [u8],
        addr: Option<&'a [u8]>,
    },
    /// `R <key> 1|0`
    Released { key: &'a [u8], ok: bool },
    /// `N <key> 1|0`
    Renewed { key: &'a [u8], ok: bool },
    /// `S <role> <addr> <token>`
    Status {
        role: Role,
        addr: Option<&'a [u8]>,
        token: u64,
    },
    /// `E <reason...>`: the connection broke the protocol and is closed.
    Error { reason: &'a [u8] },
    /// `H ok`, or `H <problem...>`: what this node knows to be wrong in its
    /// cluster (`None`: nothing).
    Health { problem: Option<&'a [u8]> },
    /// `K <key> <token> <lease_ms> <waiters>`: one lock of an `L` answer:
    /// its holder's token (0: none), the holder's lease left in ms, and
    /// the acquires waiting for it.
    Lock {
        key: &'a [u8],
        token: u64,
        lease_ms: u64,
        waiters: u64,
    },
    /// `L <cursor>`: the end of an `L` answer; ask again from `cursor` for
    /// the next page (0: there is none).
    ListEnd { cursor: u64 },
    /// `O <owner>`: the connection's owner label is set.
    Owner { owner: &'a [u8] },
    /// `K <key> <token> <lease_ms> <waiters> <held_ms> <addr> <owner>`: one
    /// lock of a `W` or `Q` answer: [`Answer::Lock`]'s fields, then how long
    /// the holder has held it and who it is (all `0` / `-` without one).
    LockWho {
        key: &'a [u8],
        token: u64,
        lease_ms: u64,
        waiters: u64,
        held_ms: u64,
        holder: Holder<'a>,
    },
    /// `W <cursor>`: the end of a `W` answer, as [`Answer::ListEnd`].
    WhoEnd { cursor: u64 },
    /// `K <key> <token> <lease_ms> <waiters> <held_ms> <addr> <owner>
    /// <held> <limit> <holders>`: one lock of a `V` answer:
    /// [`Answer::LockWho`]'s fields, then how the key is held, a
    /// semaphore's limit (0 for any other key) and how many hold it.
    LockKinds {
        key: &'a [u8],
        token: u64,
        lease_ms: u64,
        waiters: u64,
        held_ms: u64,
        holder: Holder<'a>,
        held: Held,
        limit: u32,
        holders: u64,
    },
    /// `V <cursor>`: the end of a `V` answer, as [`Answer::ListEnd`].
    KindsEnd { cursor: u64 },
    /// `J <waited_ms> <addr> <owner>`: one waiting acquire of a `Q` answer,
    /// oldest first.
    Waiter { waited_ms: u64, holder: Holder<'a> },
    /// `Q <key> <waiters>`: the end of a `Q` answer; `waiters` counts every
    /// queued acquire of `key` (up to 65536), listed or not.
    QueueEnd { key: &'a [u8], waiters: u64 },
    /// `G <key> <token>` or `C <key> <token>`: granted; `token` 0 (`G <key>
    /// 0`): the wait ran out, nothing is held.
    KindGranted {
        kind: Kind,
        key: &'a [u8],
        token: u64,
    },
    /// `G|C <key> semaphore <limit>` (`limit` > 0): the key is a semaphore
    /// of `limit` permits; `C <key> lock` (`limit` 0): the key is a lock.
    /// Refused, nothing changed.
    KindRefused {
        kind: Kind,
        key: &'a [u8],
        limit: u32,
    },
}

impl Answer<'_> {
    /// Appends this answer, with its `\n`, to `out`.
    #[inline]
    pub fn encode(&self, out: &mut Vec<u8>) {
        match *self {
            Answer::Granted { key, token } => {
                line_start(out, b'A', key);
                out.push(b' ');
                write_u64(out, token);
            }
            Answer::TimedOut { key } => line_start(out, b'T', key),
            Answer::Moved { key, addr } => {
                line_start(out, b'M', key);
                out.push(b' ');
                out.extend_from_slice(addr.unwrap_or(b"-"));
            }
            Answer::Released { key, ok } => {
                line_start(out, b'R', key);
                out.extend_from_slice(if ok { b" 1" } else { b" 0" });
            }
            Answer::Renewed { key, ok } => {
                line_start(out, b'N', key);
                out.extend_from_slice(if ok { b" 1" } else { b" 0" });
            }
            Answer::Status { role, addr, token } => {
                line_start(out, b'S', role.as_str().as_bytes());
                out.push(b' ');
                out.extend_from_slice(addr.unwrap_or(b"-"));
                out.push(b' ');
                write_u64(out, token);
            }
            Answer::Error { reason } => line_start(out, b'E', reason),
            Answer::Health { problem } => line_start(out, b'H', problem.unwrap_or(b"ok")),
            Answer::Lock {
                key,
                token,
                lease_ms,
                waiters,
            } => {
                line_start(out, b'K', key);
                for n in [token, lease_ms, waiters] {
                    out.push(b' ');
                    write_u64(out, n);
                }
            }
            Answer::ListEnd { cursor } => {
                out.extend_from_slice(b"L ");
                write_u64(out, cursor);
            }
            Answer::Owner { owner } => line_start(out, b'O', owner),
            Answer::LockWho {
                key,
                token,
                lease_ms,
                waiters,
                held_ms,
                holder,
            } => {
                line_start(out, b'K', key);
                for n in [token, lease_ms, waiters, held_ms] {
                    out.push(b' ');
                    write_u64(out, n);
                }
                holder.encode(out);
            }
            Answer::WhoEnd { cursor } => {
                out.extend_from_slice(b"W ");
                write_u64(out, cursor);
            }
            Answer::Waiter { waited_ms, holder } => {
                out.extend_from_slice(b"J ");
                write_u64(out, waited_ms);
                holder.encode(out);
            }
            Answer::QueueEnd { key, waiters } => {
                line_start(out, b'Q', key);
                out.push(b' ');
                write_u64(out, waiters);
            }
            Answer::KindGranted { .. } | Answer::KindRefused { .. } => self.encode_kind(out),
            Answer::LockKinds { .. } | Answer::KindsEnd { .. } => self.encode_kinds(out),
        }
        out.push(b'\n');
    }
}

impl Answer<'_> {
    /// The `G` and `C` answers, without the `\n`.
    #[cold]
    #[inline(never)]
    fn encode_kind(&self, out: &mut Vec<u8>) {
        match *self {
            Answer::KindGranted { kind, key, token } => {
                line_start(out, kind.op(), key);
                out.push(b' ');
                write_u64(out, token);
            }
            Answer::KindRefused { kind, key, limit } => {
                line_start(out, kind.op(), key);
                if limit == 0 {
                    out.extend_from_slice(b" lock");
                } else {
                    out.extend_from_slice(b" semaphore ");
                    write_u64(out, u64::from(limit));
                }
            }
            _ => unreachable!("not a G or C answer"),
        }
    }
}

impl Answer<'_> {
    /// The lines of a `V` answer, without the `\n`.
    #[cold]
    #[inline(never)]
    fn encode_kinds(&self, out: &mut Vec<u8>) {
        match *self {
            Answer::LockKinds {
                key,
                token,
                lease_ms,
                waiters,
                held_ms,
                holder,
                held,
                limit,
                holders,
            } => {
                line_start(out, b'K', key);
                for n in [token, lease_ms, waiters, held_ms] {
                    out.push(b' ');
                    write_u64(out, n);
                }
                holder.encode(out);
                out.push(b' ');
                out.extend_from_slice(held.as_str().as_bytes());
                out.push(b' ');
                write_u64(out, u64::from(limit));
                out.push(b' ');
                write_u64(out, holders);
            }
            Answer::KindsEnd { cursor } => {
                out.extend_from_slice(b"V ");
                write_u64(out, cursor);
            }
            _ => unreachable!("not a V answer"),
        }
    }
}

impl Holder<'_> {
    /// Appends ` <addr> <owner>`.
    fn encode(&self, out: &mut Vec<u8>) {
        out.push(b' ');
        out.extend_from_slice(self.addr.unwrap_or(b"-"));
        out.push(b' ');
        out.extend_from_slice(self.owner.unwrap_or(b"-"));
    }
}

/// `<addr> <owner>` fields of an answer: an address is 1 to
/// [`super::MAX_HOLDER_ADDR`] bytes of a key's, an owner label as `O`
/// takes it; `-` for none.
fn holder<'a>(addr: &'a [u8], owner: &'a [u8]) -> Option<Holder<'a>> {
    let addr = match addr {
        b"-" => None,
        a if a.len() <= super::MAX_HOLDER_ADDR && is_valid_key(a) => Some(a),
        _ => return None,
    };
    let owner = match owner {
        b"-" => None,
        o if is_valid_owner(o) => Some(o),
        _ => return None,
    };
    Some(Holder {
        addr,
        owner,
        identity: None,
    })
}

#[inline]
fn line_start(out: &mut Vec<u8>, op: u8, first: &[u8]) {
    out.push(op);
    out.push(b' ');
    out.extend_from_slice(first);
}

/// An answer line that does not follow the protocol (a client's view: the
/// server, or something posing as it, is broken).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AnswerError(pub String);

impl fmt::Display for AnswerError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "malformed answer: {}", self.0)
    }
}

impl std::error::Error for AnswerError {}

fn addr(field: &[u8]) -> Option<&[u8]> {
    if field == b"-" { None } else { Some(field) }
}

/// Parses one answer line, without its `\n` (a trailing `\r` is tolerated).
pub fn parse_answer(line: &[u8]) -> Result<Answer<'_>, AnswerError> {
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    let bad = || AnswerError(String::from_utf8_lossy(line).into_owned());
    if let Some(reason) = line.strip_prefix(b"E ") {
        return Ok(Answer::Error { reason });
    }
    if let Some(text) = line.strip_prefix(b"H ") {
        let problem = (text != b"ok").then_some(text);
        return Ok(Answer::Health { problem });
    }
    if let Some(rest) = line.strip_prefix(b"K ") {
        return parse_lock(rest).ok_or_else(bad);
    }
    if let Some(rest) = line.strip_prefix(b"J ") {
        return parse_waiter(rest).ok_or_else(bad);
    }
    let mut fields = line.split(|&b| b == b' ');
    let op = fields.next().ok_or_else(bad)?;
    let first = fields.next().ok_or_else(bad)?;
    let second = fields.next();
    let third = fields.next();
    if fields.next().is_some() {
        return Err(bad());
    }
    let key = || Some(first).filter(|k| is_valid_key(k));
    let flag = |f: Option<&[u8]>| match f {
        Some(b"1") => Some(true),
        Some(b"0") => Some(false),
        _ => None,
    };
    let answer = match (op, second, third) {
        (b"A", Some(token), None) => Answer::Granted {
            key: key().ok_or_else(bad)?,
            token: parse_u64(token).filter(|&t| t > 0).ok_or_else(bad)?,
        },
        (b"L" | b"W" | b"V", None, None) => list_end(op, first).ok_or_else(bad)?,
        (b"O", None, None) if is_valid_owner(first) => Answer::Owner { owner: first },
        (b"Q", Some(waiters), None) => Answer::QueueEnd {
            key: key().ok_or_else(bad)?,
            waiters: parse_u64(waiters).ok_or_else(bad)?,
        },
        (b"G" | b"C", Some(word), limit) => {
            let kind = if op == b"G" {
                Kind::Shared
            } else {
                Kind::Permit
            };
            parse_kind(kind, key().ok_or_else(bad)?, word, limit).ok_or_else(bad)?
        }
        (b"T", None, None) => Answer::TimedOut {
            key: key().ok_or_else(bad)?,
        },
        (b"M", Some(a), None) if !a.is_empty() => Answer::Moved {
            key: key().ok_or_else(bad)?,
            addr: addr(a),
        },
        (b"R", Some(_), None) => Answer::Released {
            key: key().ok_or_else(bad)?,
            ok: flag(second).ok_or_else(bad)?,
        },
        (b"N", Some(_), None) => Answer::Renewed {
            key: key().ok_or_else(bad)?,
            ok: flag(second).ok_or_else(bad)?,
        },
        (b"S", Some(a), Some(token)) if !a.is_empty() => Answer::Status {
            role: match first {
                b"active" => Role::Active,
                b"standby" => Role::Standby,
                _ => return Err(bad()),
            },
            addr: addr(a),
            token: parse_u64(token).ok_or_else(bad)?,
        },
        _ => return Err(bad()),
    };
    Ok(answer)
}

/// The end line of an `L`, `W` or `V` answer: `op` and its cursor.
fn list_end<'a>(op: &[u8], cursor: &[u8]) -> Option<Answer<'a>> {
    let cursor = parse_u64(cursor)?;
    Some(match op {
        b"L" => Answer::ListEnd { cursor },
        b"W" => Answer::WhoEnd { cursor },
        _ => Answer::KindsEnd { cursor },
    })
}

/// A `G` or `C` answer's fields after the key: a token (0: the wait ran
/// out), `lock` (`C` only) or `semaphore <limit>`.
fn parse_kind<'a>(
    kind: Kind,
    key: &'a [u8],
    word: &[u8],
    limit: Option<&[u8]>,
) -> Option<Answer<'a>> {
    Some(match (word, limit) {
        (b"lock", None) if kind == Kind::Permit => Answer::KindRefused {
            kind,
            key,
            limit: 0,
        },
        (b"semaphore", Some(n)) => Answer::KindRefused {
            kind,
            key,
            limit: parse_u64(n).filter(|&n| (1..=u64::from(crate::MAX_PERMITS)).contains(&n))?
                as u32,
        },
        (token, None) => Answer::KindGranted {
            kind,
            key,
            token: parse_u64(token)?,
        },
        _ => return None,
    })
}

/// A `J` line's fields after `J `: `<waited_ms> <addr> <owner>`.
fn parse_waiter(rest: &[u8]) -> Option<Answer<'_>> {
    let mut f = rest.split(|&b| b == b' ');
    let (Some(waited), Some(addr), Some(owner), None) = (f.next(), f.next(), f.next(), f.next())
    else {
        return None;
    };
    Some(Answer::Waiter {
        waited_ms: parse_u64(waited)?,
        holder: holder(addr, owner)?,
    })
}

/// A `K` line's fields after `K `: four (an `L` answer's), seven (a `W`
/// or `Q` answer's, with the holder) or ten (a `V` answer's, with the
/// kind).
fn parse_lock(rest: &[u8]) -> Option<Answer<'_>> {
    let mut f: [&[u8]; 10] = [b""; 10];
    let mut count = 0;
    for field in rest.split(|&b| b == b' ') {
        *f.get_mut(count)? = field;
        count += 1;
    }
    let key = Some(f[0]).filter(|k| is_valid_key(k))?;
    let (token, lease_ms, waiters) = (parse_u64(f[1])?, parse_u64(f[2])?, parse_u64(f[3])?);
    match count {
        4 => Some(Answer::Lock {
            key,
            token,
            lease_ms,
            waiters,
        }),
        7 => Some(Answer::LockWho {
            key,
            token,
            lease_ms,
            waiters,
            held_ms: parse_u64(f[4])?,
            holder: holder(f[5], f[6])?,
        }),
        10 => {
            let held = Held::parse(f[7])?;
            // A semaphore has a limit of 1 to MAX_PERMITS, any other key 0.
            let limit = parse_u64(f[8])
                .filter(|&n| n <= u64::from(crate::MAX_PERMITS))
                .filter(|&n| (n > 0) == (held == Held::Semaphore))?;
            Some(Answer::LockKinds {
                key,
                token,
                lease_ms,
                waiters,
                held_ms: parse_u64(f[4])?,
                holder: holder(f[5], f[6])?,
                held,
                limit: limit as u32,
                holders: parse_u64(f[9])?,
            })
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_answer_round_trips() {
        let answers = [
            Answer::Granted {
                key: b"k",
                token: u64::MAX,
            },
            Answer::TimedOut { key: b"k\x80" },
            Answer::Lock {
                key: b"k",
                token: 7,
                lease_ms: 0,
                waiters: 4096,
            },
            Answer::ListEnd { cursor: 0 },
            Answer::ListEnd { cursor: u64::MAX },
            Answer::Moved {
                key: b"k",
                addr: Some(b"10.0.0.1:7171"),
            },
            Answer::Moved {
                key: b"k",
                addr: None,
            },
            Answer::Released {
                key: b"k",
                ok: true,
            },
            Answer::Renewed {
                key: b"k",
                ok: false,
            },
            Answer::Status {
                role: Role::Standby,
                addr: None,
                token: 0,
            },
            Answer::Error {
                reason: b"bad lease \"x\" in line 3",
            },
            Answer::Health { problem: None },
            Answer::Health {
                problem: Some(b"127.0.0.1:7172 has another --peers list"),
            },
            Answer::KindGranted {
                kind: Kind::Shared,
                key: b"k",
                token: 7,
            },
            Answer::KindGranted {
                kind: Kind::Permit,
                key: b"k",
                token: 0,
            },
            Answer::KindRefused {
                kind: Kind::Permit,
                key: b"k",
                limit: 0,
            },
            Answer::KindRefused {
                kind: Kind::Shared,
                key: b"k",
                limit: 65_536,
            },
        ];
        for answer in answers {
            let mut out = Vec::new();
            answer.encode(&mut out);
            assert_eq!(out.last(), Some(&b'\n'));
            assert_eq!(parse_answer(&out[..out.len() - 1]), Ok(answer));
        }
    }

    /// The longest `J`, `Q`, `O`, `W` lines are what docs/protocol.md
    /// ("Length of answer lines") says: 217, 259, 131, 23 bytes.
    #[test]
    fn holder_answer_lines_stay_within_their_documented_lengths() {
        let key = [b'k'; crate::MAX_KEY];
        let addr = [b'a'; crate::MAX_HOLDER_ADDR];
        let owner = [b'o'; crate::MAX_OWNER];
        let holder = Holder {
            addr: Some(&addr),
            owner: Some(&owner),
            identity: None,
        };
        for (answer, most) in [
            (
                Answer::Waiter {
                    waited_ms: u64::MAX,
                    holder,
                },
                217,
            ),
            (
                Answer::QueueEnd {
                    key: &key,
                    waiters: 65_536,
                },
                259,
            ),
            (Answer::Owner { owner: &owner }, 131),
            (Answer::WhoEnd { cursor: u64::MAX }, 23),
            (Answer::ListEnd { cursor: u64::MAX }, 23),
        ] {
            let mut out = Vec::new();
            answer.encode(&mut out);
            assert_eq!(out.len(), most, "{answer:?}");
        }
    }

    #[test]
    fn holder_answers_round_trip() {
        let answers = [
            Answer::Owner {
                owner: b"host-a/job-42",
            },
            Answer::LockWho {
                key: b"k",
                token: 7,
                lease_ms: 100,
                waiters: 2,
                held_ms: 5,
                holder: Holder {
                    addr: Some(b"[::1]:50000"),
                    owner: Some(b"host-a/1234"),
                    identity: None,
                },
            },
            Answer::LockWho {
                key: b"k",
                token: 0,
                lease_ms: 0,
                waiters: 0,
                held_ms: 0,
                holder: Holder::default(),
            },
            Answer::WhoEnd { cursor: 17 },
            Answer::Waiter {
                waited_ms: 1500,
                holder: Holder {
                    addr: Some(b"127.0.0.1:1"),
                    owner: None,
                    identity: None,
                },
            },
            Answer::QueueEnd {
                key: b"k",
                waiters: 65536,
            },
        ];
        for answer in answers {
            let mut out = Vec::new();
            answer.encode(&mut out);
            assert_eq!(parse_answer(&out[..out.len() - 1]), Ok(answer));
        }
    }

    #[test]
    fn kinds_answers_round_trip() {
        let holder = Holder {
            addr: Some(b"127.0.0.1:5"),
            owner: Some(b"o"),
            identity: None,
        };
        let lock = |held, limit, holders| Answer::LockKinds {
            key: b"k",
            token: 9,
            lease_ms: 100,
            waiters: 1,
            held_ms: 3,
            holder,
            held,
            limit,
            holders,
        };
        for (answer, line) in [
            (
                lock(Held::Exclusive, 0, 1),
                &b"K k 9 100 1 3 127.0.0.1:5 o exclusive 0 1"[..],
            ),
            (
                lock(Held::Shared, 0, 3),
                b"K k 9 100 1 3 127.0.0.1:5 o shared 0 3",
            ),
            (
                lock(Held::Semaphore, 4, 2),
                b"K k 9 100 1 3 127.0.0.1:5 o semaphore 4 2",
            ),
            (
                Answer::LockKinds {
                    key: b"k",
                    token: 0,
                    lease_ms: 0,
                    waiters: 0,
                    held_ms: 0,
                    holder: Holder::default(),
                    held: Held::Free,
                    limit: 0,
                    holders: 0,
                },
                b"K k 0 0 0 0 - - - 0 0",
            ),
            (Answer::KindsEnd { cursor: 17 }, b"V 17"),
        ] {
            let mut out = Vec::new();
            answer.encode(&mut out);
            assert_eq!(out.pop(), Some(b'\n'));
            assert_eq!(out, line, "{answer:?}");
            assert_eq!(parse_answer(&out), Ok(answer));
        }
    }

    /// A `V` lock line is at most 27 bytes longer than a `W` one with the
    /// same fields (docs/protocol.md, "Length of answer lines").
    #[test]
    fn kinds_lock_lines_are_bounded() {
        let key = [b'k'; crate::MAX_KEY];
        let addr = [b'a'; crate::MAX_HOLDER_ADDR];
        let owner = [b'o'; crate::MAX_OWNER];
        let holder = Holder {
            addr: Some(&addr),
            owner: Some(&owner),
            identity: None,
        };
        let (token, lease_ms, waiters, held_ms) = (i64::MAX as u64, 86_400_001, 65_536, u64::MAX);
        let (mut who, mut kinds) = (Vec::new(), Vec::new());
        Answer::LockWho {
            key: &key,
            token,
            lease_ms,
            waiters,
            held_ms,
            holder,
        }
        .encode(&mut who);
        Answer::LockKinds {
            key: &key,
            token,
            lease_ms,
            waiters,
            held_ms,
            holder,
            held: Held::Semaphore,
            limit: crate::MAX_PERMITS,
            holders: u64::from(u32::MAX),
        }
        .encode(&mut kinds);
        assert_eq!(kinds.len(), who.len() + 27);
        let mut end = Vec::new();
        Answer::KindsEnd { cursor: u64::MAX }.encode(&mut end);
        assert_eq!(end.len(), 23);
    }

    #[test]
    fn malformed_answers_are_errors() {
        for line in [
            &b""[..],
            b"A k",
            b"A k 0",
            b"A k x",
            b"R k 2",
            b"T k extra",
            b"S leader - 0",
            b"Q k",
            b"Q k x",
            b"O -",
            b"O a b",
            b"K k 1 2 3 4",
            b"K k 1 2 3 4 - ",
            b"K k 1 2 3 4 - - x",
            b"K k 1 2 3 4 a\x01 -",
            b"J 1 - ",
            b"J x - -",
            b"W x",
            b"G k lock",
            b"G k semaphore 0",
            b"C k semaphore 65537",
            b"C k semaphore",
            b"C k lock 2",
            b"C k x",
            b"G k 1 2",
            b"K k 1 2 3 4 - - exclusive 0",
            b"K k 1 2 3 4 - - exclusive 1 1",
            b"K k 1 2 3 4 - - semaphore 0 1",
            b"K k 1 2 3 4 - - semaphore 65537 1",
            b"K k 1 2 3 4 - - lock 0 1",
            b"K k 1 2 3 4 - - shared 0 x",
            b"K k 1 2 3 4 - - shared 0 1 1",
            b"V x",
            b"V 1 2",
        ] {
            assert!(parse_answer(line).is_err(), "{:?}", line);
        }
    }
}

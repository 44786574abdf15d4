//! Request parsing: one line, borrowed from the receive buffer.

use std::fmt;

use super::{
    MAX_DURATION_MS, MAX_KEY, MAX_LINE, MAX_LIST, MAX_PERMITS, is_key_byte, is_valid_owner,
    parse_seconds, parse_u64, write_seconds, write_u64,
};

/// One request, borrowing its key from the buffer it was parsed from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Request<'a> {
    /// `A <key> <lease> <wait>`; `wait_ms == 0` means no limit.
    Acquire {
        key: &'a [u8],
        lease_ms: u64,
        wait_ms: u64,
    },
    /// `R <key> <token>`
    Release { key: &'a [u8], token: u64 },
    /// `N <key> <token> <lease>`
    Renew {
        key: &'a [u8],
        token: u64,
        lease_ms: u64,
    },
    /// `S`
    Status,
    /// `H`: does this node know of a problem in its cluster?
    Health,
    /// `L <cursor> <limit> [<prefix>]`: a page of the lock table (an
    /// operator's inspection; docs/protocol.md). `prefix` is empty for
    /// every key.
    List {
        cursor: u64,
        limit: u32,
        prefix: &'a [u8],
    },
    /// `O <owner>`: the owner label of this connection's grants from now
    /// on (docs/protocol.md, "`O`, the owner request").
    Owner { owner: &'a [u8] },
    /// `W <cursor> <limit> [<prefix>]`: `L` with each lock's holder.
    Who {
        cursor: u64,
        limit: u32,
        prefix: &'a [u8],
    },
    /// `Q <key>`: one key's holder and the acquires waiting for it.
    Queue { key: &'a [u8] },
    /// `V <cursor> <limit> [<prefix>]`: `W` with each lock's kind, limit
    /// and number of holders (docs/protocol.md, "`V`, the list request
    /// with kinds").
    Kinds {
        cursor: u64,
        limit: u32,
        prefix: &'a [u8],
    },
    /// `G <key> <lease> <wait>`: a shared acquire (docs/protocol.md, "`G`
    /// and `C`, shared locks and semaphores"); `wait_ms == 0`: no limit.
    Shared {
        key: &'a [u8],
        lease_ms: u64,
        wait_ms: u64,
    },
    /// `C <key> <limit> <lease> <wait>`: a semaphore acquire of one of at
    /// most `limit` (1 to [`MAX_PERMITS`]) permits.
    Permit {
        key: &'a [u8],
        limit: u32,
        lease_ms: u64,
        wait_ms: u64,
    },
}

impl<'a> Request<'a> {
    /// Appends the request's canonical line, `\n` included: numbers without
    /// leading zeros, durations in their shortest exact seconds. What the
    /// official client sends, and what parses back to this same request.
    pub fn encode(&self, out: &mut Vec<u8>) {
        match *self {
            Request::Acquire {
                key,
                lease_ms,
                wait_ms,
            } => {
                out.extend_from_slice(b"A ");
                out.extend_from_slice(key);
                out.push(b' ');
                write_seconds(out, lease_ms);
                out.push(b' ');
                write_seconds(out, wait_ms);
            }
            Request::Release { key, token } => {
                out.extend_from_slice(b"R ");
                out.extend_from_slice(key);
                out.push(b' ');
                write_u64(out, token);
            }
            Request::Renew {
                key,
                token,
                lease_ms,
            } => {
                out.extend_from_slice(b"N ");
                out.extend_from_slice(key);
                out.push(b' ');
                write_u64(out, token);
                out.push(b' ');
                write_seconds(out, lease_ms);
            }
            Request::Status => out.push(b'S'),
            Request::Health => out.push(b'H'),
            Request::List {
                cursor,
                limit,
                prefix,
            }
            | Request::Who {
                cursor,
                limit,
                prefix,
            }
            | Request::Kinds {
                cursor,
                limit,
                prefix,
            } => {
                out.extend_from_slice(match self {
                    Request::List { .. } => b"L ",
                    Request::Who { .. } => b"W ",
                    _ => b"V ",
                });
                write_u64(out, cursor);
                out.push(b' ');
                write_u64(out, u64::from(limit));
                if !prefix.is_empty() {
                    out.push(b' ');
                    out.extend_from_slice(prefix);
                }
            }
            Request::Owner { owner } => {
                out.extend_from_slice(b"O ");
                out.extend_from_slice(owner);
            }
            Request::Queue { key } => {
                out.extend_from_slice(b"Q ");
                out.extend_from_slice(key);
            }
            Request::Shared { .. } | Request::Permit { .. } => self.encode_kind(out),
        }
        out.push(b'\n');
    }

    /// `G` and `C`, without the `\n`.
    fn encode_kind(&self, out: &mut Vec<u8>) {
        let (op, key, limit, lease_ms, wait_ms) = match *self {
            Request::Shared {
                key,
                lease_ms,
                wait_ms,
            } => (b'G', key, None, lease_ms, wait_ms),
            Request::Permit {
                key,
                limit,
                lease_ms,
                wait_ms,
            } => (b'C', key, Some(limit), lease_ms, wait_ms),
            _ => unreachable!("not a G or C request"),
        };
        out.push(op);
        out.push(b' ');
        out.extend_from_slice(key);
        if let Some(limit) = limit {
            out.push(b' ');
            write_u64(out, u64::from(limit));
        }
        out.push(b' ');
        write_seconds(out, lease_ms);
        out.push(b' ');
        write_seconds(out, wait_ms);
    }

    /// The request's key, if it has one.
    pub fn key(&self) -> Option<&'a [u8]> {
        match *self {
            Request::Acquire { key, .. }
            | Request::Release { key, .. }
            | Request::Renew { key, .. }
            | Request::Shared { key, .. }
            | Request::Permit { key, .. } => Some(key),
            // `Q` is an operator's question, answered by every node (a
            // standby too): it has a key, but no `M` answers it.
            Request::Status
            | Request::Health
            | Request::List { .. }
            | Request::Owner { .. }
            | Request::Who { .. }
            | Request::Kinds { .. }
            | Request::Queue { .. } => None,
        }
    }
}

/// Why a line breaks the protocol. Borrows the offending field so that the
/// reason can quote it; [`fmt::Display`] gives the human readable reason sent
/// after `E `.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ParseError<'a> {
    /// [`MAX_LINE`] bytes arrived without a `\n`.
    LineTooLong,
    /// The line is empty, or two spaces (or a leading or trailing one) make
    /// an empty field.
    EmptyField,
    UnknownOp(&'a [u8]),
    FieldCount {
        op: u8,
        got: usize,
        want: usize,
    },
    KeyTooLong(usize),
    KeyByte(u8),
    Lease(&'a [u8]),
    Wait(&'a [u8]),
    Token(&'a [u8]),
    Cursor(&'a [u8]),
    Limit(&'a [u8]),
    Owner(&'a [u8]),
    /// A `C` request's limit: not 1 to [`MAX_PERMITS`].
    Permits(&'a [u8]),
}

impl fmt::Display for ParseError<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            ParseError::LineTooLong => write!(f, "line longer than {MAX_LINE} bytes"),
            ParseError::EmptyField => write!(f, "empty field"),
            ParseError::UnknownOp(op) => write!(f, "unknown op \"{}\"", Quoted(op)),
            ParseError::FieldCount { op, got, want } => write!(
                f,
                "wrong number of fields for {}: {got}, expected {want}",
                op as char
            ),
            ParseError::KeyTooLong(len) => {
                write!(f, "key too long ({len} bytes, at most {MAX_KEY})")
            }
            ParseError::KeyByte(b) => write!(f, "forbidden byte 0x{b:02x} in key"),
            ParseError::Lease(v) => write!(f, "bad lease \"{}\"", Quoted(v)),
            ParseError::Wait(v) => write!(f, "bad wait \"{}\"", Quoted(v)),
            ParseError::Token(v) => write!(f, "bad token \"{}\"", Quoted(v)),
            ParseError::Cursor(v) => write!(f, "bad cursor \"{}\"", Quoted(v)),
            ParseError::Limit(v) => write!(f, "bad limit \"{}\" (1 to {MAX_LIST})", Quoted(v)),
            ParseError::Owner(v) => write!(f, "bad owner \"{}\"", Quoted(v)),
            ParseError::Permits(v) => {
                write!(f, "bad limit \"{}\" (1 to {MAX_PERMITS})", Quoted(v))
            }
        }
    }
}

/// Shows a field in an error line: printable ASCII as is, anything else as
/// `\xNN`, cut after 40 bytes so that the `E` line stays short.
pub struct Quoted<'a>(pub &'a [u8]);

impl fmt::Display for Quoted<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write_quoted(f, self.0, 40)
    }
}

/// `bytes` as one line of printable ASCII (anything else, `"` and `\` as
/// `\xNN`), cut after `limit` bytes with `...`.
pub fn quoted(bytes: &[u8], limit: usize) -> String {
    struct Up<'a>(&'a [u8], usize);
    impl fmt::Display for Up<'_> {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            write_quoted(f, self.0, self.1)
        }
    }
    Up(bytes, limit).to_string()
}

fn write_quoted(f: &mut fmt::Formatter<'_>, bytes: &[u8], limit: usize) -> fmt::Result {
    for &b in bytes.iter().take(limit) {
        if (0x20..=0x7e).contains(&b) && b != b'"' && b != b'\\' {
            write!(f, "{}", b as char)?;
        } else {
            write!(f, "\\x{b:02x}")?;
        }
    }
    if bytes.len() > limit {
        write!(f, "...")?;
    }
    Ok(())
}

/// Parses the first line of `buf`.
///
/// Returns `Ok(Some((request, consumed)))` where `consumed` counts the line's
/// bytes including its `\n`; `Ok(None)` when `buf` holds no whole line yet
/// (and fewer than [`MAX_LINE`] bytes); `Err` when the line breaks the
/// protocol.
#[inline]
pub fn parse_request(buf: &[u8]) -> Result<Option<(Request<'_>, usize)>, ParseError<'_>> {
    let window = &buf[..buf.len().min(MAX_LINE)];
    let Some(nl) = memchr::memchr(b'\n', window) else {
        return if buf.len() >= MAX_LINE {
            Err(ParseError::LineTooLong)
        } else {
            Ok(None)
        };
    };
    let mut line = &buf[..nl];
    if let [rest @ .., b'\r'] = line {
        line = rest;
    }
    parse_line(line).map(|req| Some((req, nl + 1)))
}

/// Parses one line without its `\n` (and `\r`).
fn parse_line(line: &[u8]) -> Result<Request<'_>, ParseError<'_>> {
    // At most five fields are kept: one more than any request has, so that
    // "too many" is still seen. Every field is looked at: an empty one
    // anywhere breaks the line.
    let mut fields: [&[u8]; 5] = [&[]; 5];
    let mut count = 0;
    let mut rest = line;
    loop {
        let end = find_space(rest);
        if end == 0 {
            return Err(ParseError::EmptyField);
        }
        if count < fields.len() {
            fields[count] = &rest[..end];
        }
        count += 1;
        if end == rest.len() {
            break;
        }
        rest = &rest[end + 1..];
    }
    let (op, want) = match fields[0] {
        b"A" => (b'A', 4),
        b"R" => (b'R', 3),
        b"N" => (b'N', 4),
        b"S" => (b'S', 1),
        b"H" => (b'H', 1),
        // Operators' requests and unknown ops, out of the requests' way.
        _ => return parse_rare(&fields, count),
    };
    if count != want {
        return Err(ParseError::FieldCount {
            op,
            got: count,
            want,
        });
    }
    let request = match op {
        b'A' => Request::Acquire {
            key: key(fields[1])?,
            lease_ms: lease(fields[2])?,
            wait_ms: parse_seconds(fields[3])
                .filter(|&ms| ms <= MAX_DURATION_MS)
                .ok_or(ParseError::Wait(fields[3]))?,
        },
        b'R' => Request::Release {
            key: key(fields[1])?,
            token: token(fields[2])?,
        },
        b'N' => Request::Renew {
            key: key(fields[1])?,
            token: token(fields[2])?,
            lease_ms: lease(fields[3])?,
        },
        b'S' => Request::Status,
        _ => Request::Health,
    };
    Ok(request)
}

/// The requests that are not `A`, `R`, `N`, `S` or `H` (`count` fields,
/// the first five in `fields`): `L`, `W`, `V`, `O`, `Q`, `G`, `C`, or an
/// unknown op.
#[cold]
#[inline(never)]
fn parse_rare<'a>(fields: &[&'a [u8]; 5], count: usize) -> Result<Request<'a>, ParseError<'a>> {
    let op = match fields[0] {
        b"L" => b'L',
        b"W" => b'W',
        b"V" => b'V',
        b"O" => b'O',
        b"Q" => b'Q',
        b"G" => b'G',
        b"C" => b'C',
        other => return Err(ParseError::UnknownOp(other)),
    };
    // `L` and `W`: `<cursor> <limit>`, and a prefix or not.
    let want = match op {
        b'L' | b'W' | b'V' => count.clamp(3, 4),
        b'G' => 4,
        b'C' => 5,
        _ => 2,
    };
    if count != want {
        return Err(ParseError::FieldCount {
            op,
            got: count,
            want,
        });
    }
    match op {
        b'O' => {
            let owner = fields[1];
            if is_valid_owner(owner) {
                Ok(Request::Owner { owner })
            } else {
                Err(ParseError::Owner(owner))
            }
        }
        b'Q' => Ok(Request::Queue {
            key: key(fields[1])?,
        }),
        b'G' => Ok(Request::Shared {
            key: key(fields[1])?,
            lease_ms: lease(fields[2])?,
            wait_ms: wait(fields[3])?,
        }),
        b'C' => Ok(Request::Permit {
            key: key(fields[1])?,
            limit: parse_u64(fields[2])
                .filter(|&n| (1..=u64::from(MAX_PERMITS)).contains(&n))
                .ok_or(ParseError::Permits(fields[2]))? as u32,
            lease_ms: lease(fields[3])?,
            wait_ms: wait(fields[4])?,
        }),
        _ => {
            let cursor = parse_u64(fields[1]).ok_or(ParseError::Cursor(fields[1]))?;
            let limit = parse_u64(fields[2])
                .filter(|&n| (1..=u64::from(MAX_LIST)).contains(&n))
                .ok_or(ParseError::Limit(fields[2]))? as u32;
            let prefix = if count == 4 { key(fields[3])? } else { b"" };
            Ok(match op {
                b'L' => Request::List {
                    cursor,
                    limit,
                    prefix,
                },
                b'W' => Request::Who {
                    cursor,
                    limit,
                    prefix,
                },
                _ => Request::Kinds {
                    cursor,
                    limit,
                    prefix,
                },
            })
        }
    }
}

/// Eight bytes at once, little-endian, for the word-at-a-time scans below.
#[inline(always)]
fn word(bytes: &[u8]) -> u64 {
    u64::from_le_bytes(bytes[..8].try_into().expect("eight bytes"))
}

const ONES: u64 = 0x0101_0101_0101_0101;
const HIGHS: u64 = 0x8080_8080_8080_8080;

/// The high bit of each byte of `w` that is below `n` (`n` <= 128). Exact
/// for the lowest such byte; bytes above it may be flagged falsely (a
/// borrow), so only "any" and "the first" may be asked of the result.
#[inline(always)]
fn bytes_below(w: u64, n: u8) -> u64 {
    w.wrapping_sub(ONES * u64::from(n)) & !w & HIGHS
}

/// Index of the first `' '` in `s`, or `s.len()`. A request's fields are a
/// few to a few dozen bytes: eight at a time, no call, no vector set-up.
#[inline]
fn find_space(s: &[u8]) -> usize {
    let mut i = 0;
    while i + 8 <= s.len() {
        let hits = bytes_below(word(&s[i..]) ^ (ONES * u64::from(b' ')), 1);
        if hits != 0 {
            return i + (hits.trailing_zeros() / 8) as usize;
        }
        i += 8;
    }
    while i < s.len() && s[i] != b' ' {
        i += 1;
    }
    i
}

/// The fields of `line` between single spaces, as `line.split(|&b| b ==
/// b' ')` gives them (two spaces make an empty field), found eight bytes at a
/// time: for the peer protocol's lines, whose parser checks the fields
/// itself.
pub fn split_spaces(line: &[u8]) -> SplitSpaces<'_> {
    SplitSpaces { rest: Some(line) }
}

/// The iterator of [`split_spaces`].
#[derive(Debug, Clone)]
pub struct SplitSpaces<'a> {
    rest: Option<&'a [u8]>,
}

impl<'a> Iterator for SplitSpaces<'a> {
    type Item = &'a [u8];

    #[inline]
    fn next(&mut self) -> Option<&'a [u8]> {
        let rest = self.rest?;
        let end = find_space(rest);
        if end == rest.len() {
            self.rest = None;
            Some(rest)
        } else {
            self.rest = Some(&rest[end + 1..]);
            Some(&rest[..end])
        }
    }
}

fn key(field: &[u8]) -> Result<&[u8], ParseError<'_>> {
    if field.len() > MAX_KEY {
        return Err(ParseError::KeyTooLong(field.len()));
    }
    if !has_non_key_byte(field) {
        return Ok(field);
    }
    match field.iter().find(|&&b| !is_key_byte(b)) {
        Some(&b) => Err(ParseError::KeyByte(b)),
        None => Ok(field),
    }
}

/// True if `field` holds a byte no key may: 0x00..=0x20 or 0x7F. Eight
/// bytes at a time; which byte it is, is looked up only when there is one.
#[inline]
pub(crate) fn has_non_key_byte(field: &[u8]) -> bool {
    let mut chunks = field.chunks_exact(8);
    let mut bad = false;
    for chunk in &mut chunks {
        let w = word(chunk);
        bad |= (bytes_below(w, 0x21) | bytes_below(w ^ (ONES * 0x7f), 1)) != 0;
    }
    bad | chunks.remainder().iter().any(|&b| !is_key_byte(b))
}

fn lease(field: &[u8]) -> Result<u64, ParseError<'_>> {
    parse_seconds(field)
        .filter(|&ms| ms > 0 && ms <= MAX_DURATION_MS)
        .ok_or(ParseError::Lease(field))
}

fn wait(field: &[u8]) -> Result<u64, ParseError<'_>> {
    parse_seconds(field)
        .filter(|&ms| ms <= MAX_DURATION_MS)
        .ok_or(ParseError::Wait(field))
}

fn token(field: &[u8]) -> Result<u64, ParseError<'_>> {
    parse_u64(field)
        .filter(|&t| t > 0)
        .ok_or(ParseError::Token(field))
}

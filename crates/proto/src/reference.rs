//! The first, plain version of the request parser and number codecs, kept
//! as the model the optimised ones are tested against (`parser_tests.rs`):
//! same results, same errors, on every generated input. Test builds only.

use super::{
    MAX_DURATION_MS, MAX_KEY, MAX_LINE, MAX_LIST, MAX_OWNER, MAX_PERMITS, ParseError, Request,
    is_key_byte,
};

pub(crate) fn parse_request(buf: &[u8]) -> Result<Option<(Request<'_>, usize)>, ParseError<'_>> {
    let window = &buf[..buf.len().min(MAX_LINE)];
    let Some(nl) = window.iter().position(|&b| b == b'\n') else {
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

fn parse_line(line: &[u8]) -> Result<Request<'_>, ParseError<'_>> {
    let mut fields: [&[u8]; 5] = [&[]; 5];
    let mut count = 0;
    for field in line.split(|&b| b == b' ') {
        if field.is_empty() {
            return Err(ParseError::EmptyField);
        }
        if count < fields.len() {
            fields[count] = field;
        }
        count += 1;
    }
    let (op, want) = match fields[0] {
        b"A" => (b'A', 4),
        b"R" => (b'R', 3),
        b"N" => (b'N', 4),
        b"S" => (b'S', 1),
        b"H" => (b'H', 1),
        // `L <cursor> <limit>` or `L <cursor> <limit> <prefix>`.
        b"L" => (b'L', count.clamp(3, 4)),
        // `W` and `V` as `L`; `O <owner>`, `Q <key>`.
        b"W" => (b'W', count.clamp(3, 4)),
        b"V" => (b'V', count.clamp(3, 4)),
        b"O" => (b'O', 2),
        b"Q" => (b'Q', 2),
        // `G <key> <lease> <wait>`, `C <key> <limit> <lease> <wait>`.
        b"G" => (b'G', 4),
        b"C" => (b'C', 5),
        other => return Err(ParseError::UnknownOp(other)),
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
        b'L' | b'W' | b'V' => list(op, &fields, count)?,
        b'O' => {
            let owner = fields[1];
            let printable = owner.iter().all(|&b| b > b' ' && b < 0x7f);
            if owner.len() > MAX_OWNER || owner == b"-" || !printable {
                return Err(ParseError::Owner(owner));
            }
            Request::Owner { owner }
        }
        b'Q' => Request::Queue {
            key: key(fields[1])?,
        },
        b'G' | b'C' => parse_kind(op, &fields)?,
        _ => Request::Health,
    };
    Ok(request)
}

/// `L`, `W` or `V` (`op`): `<cursor> <limit>`, and a prefix if `count`
/// is 4.
fn list<'a>(op: u8, fields: &[&'a [u8]; 5], count: usize) -> Result<Request<'a>, ParseError<'a>> {
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

fn parse_kind<'a>(op: u8, fields: &[&'a [u8]; 5]) -> Result<Request<'a>, ParseError<'a>> {
    let wait = |field: &'a [u8]| {
        parse_seconds(field)
            .filter(|&ms| ms <= MAX_DURATION_MS)
            .ok_or(ParseError::Wait(field))
    };
    Ok(if op == b'G' {
        Request::Shared {
            key: key(fields[1])?,
            lease_ms: lease(fields[2])?,
            wait_ms: wait(fields[3])?,
        }
    } else {
        Request::Permit {
            key: key(fields[1])?,
            limit: parse_u64(fields[2])
                .filter(|&n| (1..=u64::from(MAX_PERMITS)).contains(&n))
                .ok_or(ParseError::Permits(fields[2]))? as u32,
            lease_ms: lease(fields[3])?,
            wait_ms: wait(fields[4])?,
        }
    })
}

fn key(field: &[u8]) -> Result<&[u8], ParseError<'_>> {
    if field.len() > MAX_KEY {
        return Err(ParseError::KeyTooLong(field.len()));
    }
    match field.iter().find(|&&b| !is_key_byte(b)) {
        Some(&b) => Err(ParseError::KeyByte(b)),
        None => Ok(field),
    }
}

fn lease(field: &[u8]) -> Result<u64, ParseError<'_>> {
    parse_seconds(field)
        .filter(|&ms| ms > 0 && ms <= MAX_DURATION_MS)
        .ok_or(ParseError::Lease(field))
}

fn token(field: &[u8]) -> Result<u64, ParseError<'_>> {
    parse_u64(field)
        .filter(|&t| t > 0)
        .ok_or(ParseError::Token(field))
}

pub(crate) fn parse_seconds(field: &[u8]) -> Option<u64> {
    let (int, frac) = match field.iter().position(|&b| b == b'.') {
        Some(dot) => (&field[..dot], Some(&field[dot + 1..])),
        None => (field, None),
    };
    let mut ms = parse_digits(int)?.saturating_mul(1000);
    if let Some(frac) = frac {
        if frac.is_empty() || frac.len() > 3 {
            return None;
        }
        let mut scale = 100;
        for &b in frac {
            if !b.is_ascii_digit() {
                return None;
            }
            ms = ms.saturating_add(u64::from(b - b'0') * scale);
            scale /= 10;
        }
    }
    Some(ms)
}

fn parse_digits(field: &[u8]) -> Option<u64> {
    if field.is_empty() {
        return None;
    }
    let mut n: u64 = 0;
    for &b in field {
        if !b.is_ascii_digit() {
            return None;
        }
        n = n.saturating_mul(10).saturating_add(u64::from(b - b'0'));
    }
    Some(n)
}

pub(crate) fn parse_u64(field: &[u8]) -> Option<u64> {
    if field.is_empty() {
        return None;
    }
    let mut n: u64 = 0;
    for &b in field {
        if !b.is_ascii_digit() {
            return None;
        }
        n = n.checked_mul(10)?.checked_add(u64::from(b - b'0'))?;
    }
    Some(n)
}

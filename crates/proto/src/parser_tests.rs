//! Request parser tests, written against docs/protocol.md ("3. Values",
//! "4. Requests", "8. Errors", "2. Transport and framing") rather than against the code.

use super::*;

type Parsed<'a> = Result<Option<(Request<'a>, usize)>, ParseError<'a>>;

/// Parses `line` (which must hold exactly one line) and checks that the whole
/// line was consumed.
fn one(line: &[u8]) -> Result<Request<'_>, ParseError<'_>> {
    match parse_request(line) {
        Ok(Some((req, used))) => {
            assert_eq!(used, line.len(), "consumed of {:?}", esc(line));
            Ok(req)
        }
        Ok(None) => panic!("need-more for a whole line {:?}", esc(line)),
        Err(e) => Err(e),
    }
}

fn esc(b: &[u8]) -> String {
    b.escape_ascii().to_string()
}

fn acquire(key: &[u8], lease_ms: u64, wait_ms: u64) -> Request<'_> {
    Request::Acquire {
        key,
        lease_ms,
        wait_ms,
    }
}

/// The reason text goes out as `E <reason> in line N`: one line, printable
/// ASCII only, short.
fn assert_reason_ok(err: &ParseError<'_>) {
    let reason = err.to_string();
    assert!(!reason.is_empty());
    assert!(
        reason.bytes().all(|b| (0x20..=0x7e).contains(&b)),
        "reason not printable ASCII: {reason:?}"
    );
    assert!(reason.len() <= 200, "reason too long: {reason:?}");
}

// ---------------------------------------------------------------- valid forms

#[test]
#[expect(clippy::too_many_lines)]
fn every_valid_request_form() {
    let cases: &[(&[u8], Request<'_>)] = &[
        (b"A k 30 0\n", acquire(b"k", 30_000, 0)),
        (b"A k 30 10\n", acquire(b"k", 30_000, 10_000)),
        (b"A k 1.5 2.25\n", acquire(b"k", 1_500, 2_250)),
        (b"A k 0.001 0.001\n", acquire(b"k", 1, 1)),
        (b"A k 0.1 0.01\n", acquire(b"k", 100, 10)),
        (b"A k 86400 86400\n", acquire(b"k", 86_400_000, 86_400_000)),
        (
            b"A k 86400.000 86400.0\n",
            acquire(b"k", 86_400_000, 86_400_000),
        ),
        (b"A k 86399.999 0.000\n", acquire(b"k", 86_399_999, 0)),
        (b"A k 030 007.5\n", acquire(b"k", 30_000, 7_500)),
        (
            b"A k 0000000000000000000000001 00\n",
            acquire(b"k", 1_000, 0),
        ),
        (b"A k 1.500 2.050\n", acquire(b"k", 1_500, 2_050)),
        (
            b"R k 1\n",
            Request::Release {
                key: b"k",
                token: 1,
            },
        ),
        (
            b"R k 18446744073709551615\n",
            Request::Release {
                key: b"k",
                token: u64::MAX,
            },
        ),
        (
            b"R k 0000000000000000000000000042\n",
            Request::Release {
                key: b"k",
                token: 42,
            },
        ),
        (
            b"N k 7 0.5\n",
            Request::Renew {
                key: b"k",
                token: 7,
                lease_ms: 500,
            },
        ),
        (
            b"N k 18446744073709551615 86400\n",
            Request::Renew {
                key: b"k",
                token: u64::MAX,
                lease_ms: 86_400_000,
            },
        ),
        (
            b"N k 01 001.001\n",
            Request::Renew {
                key: b"k",
                token: 1,
                lease_ms: 1_001,
            },
        ),
        (b"S\n", Request::Status),
        (b"S\r\n", Request::Status),
        (b"H\n", Request::Health),
        (b"H\r\n", Request::Health),
        (
            b"L 0 100\n",
            Request::List {
                cursor: 0,
                limit: 100,
                prefix: b"",
            },
        ),
        (
            b"L 18446744073709551615 1000 jobs/\n",
            Request::List {
                cursor: u64::MAX,
                limit: 1000,
                prefix: b"jobs/",
            },
        ),
        (
            b"W 7 10\n",
            Request::Who {
                cursor: 7,
                limit: 10,
                prefix: b"",
            },
        ),
        (
            b"W 0 1000 jobs/\n",
            Request::Who {
                cursor: 0,
                limit: 1000,
                prefix: b"jobs/",
            },
        ),
        (
            b"V 7 10\n",
            Request::Kinds {
                cursor: 7,
                limit: 10,
                prefix: b"",
            },
        ),
        (
            b"V 0 1000 jobs/\r\n",
            Request::Kinds {
                cursor: 0,
                limit: 1000,
                prefix: b"jobs/",
            },
        ),
        (
            b"O host-a/job-42\n",
            Request::Owner {
                owner: b"host-a/job-42",
            },
        ),
        (b"O --\r\n", Request::Owner { owner: b"--" }),
        (b"Q k\n", Request::Queue { key: b"k" }),
        (b"Q \xff\n", Request::Queue { key: b"\xff" }),
        (
            b"G k 30 0.5\r\n",
            Request::Shared {
                key: b"k",
                lease_ms: 30_000,
                wait_ms: 500,
            },
        ),
        (
            b"C k 65536 0.001 86400\n",
            Request::Permit {
                key: b"k",
                limit: 65_536,
                lease_ms: 1,
                wait_ms: 86_400_000,
            },
        ),
        (
            b"C k 02 1 0\n",
            Request::Permit {
                key: b"k",
                limit: 2,
                lease_ms: 1_000,
                wait_ms: 0,
            },
        ),
        (b"A k 30 0\r\n", acquire(b"k", 30_000, 0)),
        (
            b"R k 5\r\n",
            Request::Release {
                key: b"k",
                token: 5,
            },
        ),
        (
            b"N k 5 1\r\n",
            Request::Renew {
                key: b"k",
                token: 5,
                lease_ms: 1_000,
            },
        ),
    ];
    for (line, want) in cases {
        assert_eq!(one(line), Ok(*want), "{}", esc(line));
        // The canonical form parses to the same request.
        let mut enc = Vec::new();
        want.encode(&mut enc);
        assert_eq!(one(&enc), Ok(*want), "{}", esc(&enc));
    }
}

#[test]
fn key_method() {
    assert_eq!(one(b"A ab 1 0\n").unwrap().key(), Some(&b"ab"[..]));
    assert_eq!(one(b"R ab 1\n").unwrap().key(), Some(&b"ab"[..]));
    assert_eq!(one(b"N ab 1 1\n").unwrap().key(), Some(&b"ab"[..]));
    assert_eq!(one(b"S\n").unwrap().key(), None);
}

#[test]
fn every_allowed_key_byte() {
    // 0x21..=0x7e and 0x80..=0xff, one at a time and all in one key, for
    // every op with a key.
    let allowed: Vec<u8> = (0x21..=0x7eu8).chain(0x80..=0xff).collect();
    for &b in &allowed {
        let line = [b'R', b' ', b'x', b, b'x', b' ', b'1', b'\n'];
        assert_eq!(
            one(&line),
            Ok(Request::Release {
                key: &[b'x', b, b'x'],
                token: 1
            }),
            "byte 0x{b:02x}"
        );
        let line = [b'A', b' ', b, b' ', b'1', b' ', b'0', b'\n'];
        assert_eq!(one(&line), Ok(acquire(&[b], 1_000, 0)), "byte 0x{b:02x}");
    }
    for chunk in allowed.chunks(MAX_KEY) {
        let mut line = b"N ".to_vec();
        line.extend_from_slice(chunk);
        line.extend_from_slice(b" 9 1\n");
        assert_eq!(
            one(&line),
            Ok(Request::Renew {
                key: chunk,
                token: 9,
                lease_ms: 1_000
            })
        );
    }
    // Keys are bytes, not UTF-8: invalid UTF-8 is fine.
    assert_eq!(
        one(b"A \x80\xff\xc3 1 0\n"),
        Ok(acquire(b"\x80\xff\xc3", 1_000, 0))
    );
}

#[test]
fn key_length_limit() {
    for (op, tail) in [
        (&b"A "[..], &b" 1 0\n"[..]),
        (b"R ", b" 1\n"),
        (b"N ", b" 1 1\n"),
    ] {
        for len in [1, 2, 249, 250] {
            let mut line = op.to_vec();
            line.extend(std::iter::repeat_n(b'k', len));
            line.extend_from_slice(tail);
            let req = one(&line).unwrap_or_else(|e| panic!("len {len}: {e}"));
            assert_eq!(req.key().map(<[u8]>::len), Some(len));
        }
        for len in [251, 252, 400] {
            let mut line = op.to_vec();
            line.extend(std::iter::repeat_n(b'k', len));
            line.extend_from_slice(tail);
            assert_eq!(one(&line), Err(ParseError::KeyTooLong(len)));
        }
    }
    // Multi-byte keys count bytes, not characters: 125 two-byte chars are
    // 250 bytes (ok), 126 are 252 (too long).
    let mut line = b"R ".to_vec();
    line.extend("é".repeat(125).as_bytes());
    line.extend_from_slice(b" 1\n");
    assert!(one(&line).is_ok());
    let mut line = b"R ".to_vec();
    line.extend("é".repeat(126).as_bytes());
    line.extend_from_slice(b" 1\n");
    assert_eq!(one(&line), Err(ParseError::KeyTooLong(252)));
}

// -------------------------------------------------------------- broken forms

#[test]
fn unknown_ops() {
    for line in [
        &b"X\n"[..],
        b"a k 1 0\n",
        b"r k 1\n",
        b"n k 1 1\n",
        b"s\n",
        b"AA k 1 0\n",
        b"SS\n",
        b"ACQUIRE k 1 0\n",
        b"E oops\n",
        b"T k\n",
        b"M k -\n",
        b"0\n",
        b"\x00\n",
        b"\x80\n",
        b"\xffA k 1 0\n",
        b"S\x00\n",
        b"\tS\n",
        b"S\t\n",
        b"\rS\n",
        b"S\r\r\n",
        b"A\r k 1 0\n",
        b"o x\n",
        b"q k\n",
        b"w 0 1\n",
        b"OO x\n",
        b"g k 1 0\n",
        b"c k 1 1 0\n",
        b"GG k 1 0\n",
    ] {
        let end = memchr::memchr(b' ', line).unwrap_or_else(|| {
            let body = &line[..line.len() - 1];
            body.strip_suffix(b"\r").unwrap_or(body).len()
        });
        let want = &line[..end];
        let got = one(line);
        assert_eq!(got, Err(ParseError::UnknownOp(want)), "{}", esc(line));
        assert_reason_ok(&got.unwrap_err());
    }
}

#[test]
fn wrong_number_of_fields_for_each_op() {
    let cases: &[(&[u8], u8, usize, usize)] = &[
        (b"A\n", b'A', 1, 4),
        (b"A k\n", b'A', 2, 4),
        (b"A k 1\n", b'A', 3, 4),
        (b"A k 1 0 0\n", b'A', 5, 4),
        (b"A k 1 0 0 0 0 0\n", b'A', 8, 4),
        (b"R\n", b'R', 1, 3),
        (b"R k\n", b'R', 2, 3),
        (b"R k 1 1\n", b'R', 4, 3),
        (b"N\n", b'N', 1, 4),
        (b"N k\n", b'N', 2, 4),
        (b"N k 1\n", b'N', 3, 4),
        (b"N k 1 1 1\n", b'N', 5, 4),
        (b"S x\n", b'S', 2, 1),
        (b"S x y z w v\n", b'S', 6, 1),
        (b"H ok\n", b'H', 2, 1),
        (b"O\n", b'O', 1, 2),
        (b"O a b\n", b'O', 3, 2),
        (b"Q\n", b'Q', 1, 2),
        (b"Q k 1\n", b'Q', 3, 2),
        (b"W 0\n", b'W', 2, 3),
        (b"W 0 1 p q\n", b'W', 5, 4),
        (b"V 0\n", b'V', 2, 3),
        (b"V 0 1 p q\n", b'V', 5, 4),
        (b"G k 1\n", b'G', 3, 4),
        (b"G k 1 0 0\n", b'G', 5, 4),
        (b"C k 1 1\n", b'C', 4, 5),
        (b"C k 1 1 0 0\n", b'C', 6, 5),
        (b"C k 1 1 0 0 0 0\n", b'C', 8, 5),
        // A space inside a key is impossible: it splits the key.
        (b"A my key 1 0\n", b'A', 5, 4),
        (b"R my key 1\n", b'R', 4, 3),
        // So is a `\n`: it ends the line.
        (b"A k\nx 1 0\n", b'A', 2, 4),
        (b"A k 1 0\r\n", b'A', 4, 4), // control: fine
    ];
    for &(line, op, got, want) in cases {
        let parsed = parse_request(line);
        if got == want {
            assert!(matches!(parsed, Ok(Some(_))), "{}", esc(line));
            continue;
        }
        assert_eq!(
            parsed,
            Err(ParseError::FieldCount { op, got, want }),
            "{}",
            esc(line)
        );
        assert_reason_ok(&parsed.unwrap_err());
    }
}

#[test]
fn empty_fields() {
    for line in [
        &b"\n"[..],
        b"\r\n",
        b" \n",
        b"  \n",
        b" S\n",
        b"S \n",
        b"S \r\n",
        b"S  \n",
        b" A k 1 0\n",
        b"A k 1 0 \n",
        b"A k 1 0 \r\n",
        b"A  k 1 0\n",
        b"A k  1 0\n",
        b"A k 1  0\n",
        b"R k  1\n",
        b"R  k 1\n",
        b"R k 1 \n",
        b"N k 1  1\n",
        b"N k 1 1 \n",
        b"X  y\n",
        // an empty field wins over a wrong field count
        b"A k \n",
        b"R k \n",
    ] {
        let got = one(line);
        assert_eq!(got, Err(ParseError::EmptyField), "{}", esc(line));
        assert_reason_ok(&got.unwrap_err());
    }
}

#[test]
fn forbidden_key_bytes() {
    // 0x00..=0x1f (0x0a ends the line, tested apart) and 0x7f, at the start,
    // middle and end of the key, for each op with a key.
    let forbidden = (0x00..=0x1fu8).filter(|&b| b != b'\n').chain([0x7f]);
    for b in forbidden {
        for key in [vec![b], vec![b, b'k'], vec![b'k', b, b'k'], vec![b'k', b]] {
            for (op, tail) in [
                (&b"A "[..], &b" 1 0\n"[..]),
                (b"R ", b" 1\n"),
                (b"N ", b" 1 1\n"),
            ] {
                let mut line = op.to_vec();
                line.extend_from_slice(&key);
                line.extend_from_slice(tail);
                let got = one(&line);
                assert_eq!(got, Err(ParseError::KeyByte(b)), "{}", esc(&line));
                assert_reason_ok(&got.unwrap_err());
            }
        }
    }
    // A `\n` inside a key ends the line: the first part is short of fields,
    // and the rest is another (broken) line.
    let buf = b"R k\nk 1\n";
    assert_eq!(
        parse_request(buf),
        Err(ParseError::FieldCount {
            op: b'R',
            got: 2,
            want: 3
        })
    );
    assert_eq!(parse_request(&buf[4..]), Err(ParseError::UnknownOp(b"k")));
}

#[test]
fn numbers_out_of_range() {
    // lease: > 0 and <= 86400
    for lease in [
        &b"0"[..],
        b"00",
        b"0.0",
        b"0.00",
        b"0.000",
        b"000.000",
        b"86400.001",
        b"86401",
        b"86400.01",
        b"86400.1",
        b"100000",
        b"18446744073709551615",
        b"18446744073709551616",
        b"99999999999999999999999999",
        b"18446744073709551.615",
    ] {
        let mut line = b"A k ".to_vec();
        line.extend_from_slice(lease);
        line.extend_from_slice(b" 0\n");
        assert_eq!(one(&line), Err(ParseError::Lease(lease)), "{}", esc(&line));
        let mut line = b"N k 1 ".to_vec();
        line.extend_from_slice(lease);
        line.push(b'\n');
        assert_eq!(one(&line), Err(ParseError::Lease(lease)), "{}", esc(&line));
    }
    // wait: 0..=86400
    for wait in [
        &b"86400.001"[..],
        b"86401",
        b"86400.01",
        b"86400.1",
        b"18446744073709551616",
        b"99999999999999999999999999",
    ] {
        let mut line = b"A k 1 ".to_vec();
        line.extend_from_slice(wait);
        line.push(b'\n');
        assert_eq!(one(&line), Err(ParseError::Wait(wait)), "{}", esc(&line));
    }
    // token: 1..=2^64-1
    for token in [
        &b"0"[..],
        b"00",
        b"0000000000000000000000000",
        b"18446744073709551616",
        b"18446744073709551620",
        b"28446744073709551615",
        b"99999999999999999999",
        b"184467440737095516150",
    ] {
        let mut line = b"R k ".to_vec();
        line.extend_from_slice(token);
        line.push(b'\n');
        assert_eq!(one(&line), Err(ParseError::Token(token)), "{}", esc(&line));
        let mut line = b"N k ".to_vec();
        line.extend_from_slice(token);
        line.extend_from_slice(b" 1\n");
        assert_eq!(one(&line), Err(ParseError::Token(token)), "{}", esc(&line));
    }
}

#[test]
fn numbers_of_wrong_form() {
    let durations = [
        &b"1.0000"[..],
        b"1.0001",
        b"0.0001",
        b"1.",
        b".5",
        b".",
        b"+1",
        b"-1",
        b"-0",
        b"+0",
        b"1e3",
        b"1E3",
        b"0x10",
        b"1,5",
        b"1..5",
        b"1.5.",
        b"1.5.0",
        b"inf",
        b"NaN",
        b"abc",
        b"\xef\xbc\x91", // fullwidth digit one
        b"1\x00",
        b"1\r",
        b"1\x7f",
        b"1_000",
    ];
    for field in durations {
        let mut line = b"A k ".to_vec();
        line.extend_from_slice(field);
        line.extend_from_slice(b" 0\n");
        assert_eq!(one(&line), Err(ParseError::Lease(field)), "{}", esc(&line));
        if field.ends_with(b"\r") {
            // last on the line, the `\r` would be the accepted one
            continue;
        }
        let mut line = b"A k 1 ".to_vec();
        line.extend_from_slice(field);
        line.push(b'\n');
        assert_eq!(one(&line), Err(ParseError::Wait(field)), "{}", esc(&line));
        let mut line = b"N k 1 ".to_vec();
        line.extend_from_slice(field);
        line.push(b'\n');
        assert_eq!(one(&line), Err(ParseError::Lease(field)), "{}", esc(&line));
    }
    for field in [
        &b"1.0"[..],
        b"1.",
        b".5",
        b"+1",
        b"-1",
        b"1e3",
        b"0x10",
        b"abc",
        b"1\x00",
        b"1\r",
        b"\xef\xbc\x91",
    ] {
        let mut line = b"N k ".to_vec();
        line.extend_from_slice(field);
        line.extend_from_slice(b" 1\n");
        assert_eq!(one(&line), Err(ParseError::Token(field)), "{}", esc(&line));
        if field.ends_with(b"\r") {
            continue;
        }
        let mut line = b"R k ".to_vec();
        line.extend_from_slice(field);
        line.push(b'\n');
        assert_eq!(one(&line), Err(ParseError::Token(field)), "{}", esc(&line));
    }
}

#[test]
fn first_broken_field_is_reported() {
    // key before lease before wait; key before token before lease.
    assert_eq!(one(b"A \x01 x y\n"), Err(ParseError::KeyByte(1)));
    assert_eq!(one(b"A k x y\n"), Err(ParseError::Lease(b"x")));
    assert_eq!(one(b"A k 1 y\n"), Err(ParseError::Wait(b"y")));
    assert_eq!(one(b"N \x01 x y\n"), Err(ParseError::KeyByte(1)));
    assert_eq!(one(b"N k x y\n"), Err(ParseError::Token(b"x")));
    assert_eq!(one(b"N k 1 y\n"), Err(ParseError::Lease(b"y")));
}

// --------------------------------------------------------- framing, lengths

/// `A k <lease padded with leading zeros> 0` + `ending`, `total` bytes long.
fn padded_line(total: usize, ending: &[u8]) -> Vec<u8> {
    let fixed = b"A k ".len() + b" 0".len() + ending.len() + 2; // "30"
    let mut line = b"A k ".to_vec();
    line.extend(std::iter::repeat_n(b'0', total - fixed));
    line.extend_from_slice(b"30 0");
    line.extend_from_slice(ending);
    assert_eq!(line.len(), total);
    line
}

#[test]
fn line_of_512_bytes_parses_513_breaks() {
    for ending in [&b"\n"[..], b"\r\n"] {
        let line = padded_line(MAX_LINE, ending);
        assert_eq!(
            parse_request(&line),
            Ok(Some((acquire(b"k", 30_000, 0), MAX_LINE)))
        );
        // with more data behind it
        let mut buf = line.clone();
        buf.extend_from_slice(b"S\n");
        assert_eq!(
            parse_request(&buf),
            Ok(Some((acquire(b"k", 30_000, 0), MAX_LINE)))
        );
        assert_eq!(
            parse_request(&buf[MAX_LINE..]),
            Ok(Some((Request::Status, 2)))
        );

        let line = padded_line(MAX_LINE + 1, ending);
        assert_eq!(parse_request(&line), Err(ParseError::LineTooLong));
        // ... also when only its first 512 bytes have arrived
        assert_eq!(
            parse_request(&line[..MAX_LINE]),
            Err(ParseError::LineTooLong)
        );
        // ... and 511 of them is still need-more
        assert_eq!(parse_request(&line[..MAX_LINE - 1]), Ok(None));
    }
    // A 512-byte line that is broken is reported as its own error, not as
    // too long.
    let mut line = vec![b'x'; MAX_LINE - 1];
    line.push(b'\n');
    assert_eq!(
        parse_request(&line),
        Err(ParseError::UnknownOp(&line[..511]))
    );
    // A 512-byte valid release: max key, token padded with zeros.
    let mut line = b"R ".to_vec();
    line.extend(std::iter::repeat_n(b'k', MAX_KEY));
    line.push(b' ');
    line.extend(std::iter::repeat_n(b'0', MAX_LINE - line.len() - 3));
    line.extend_from_slice(b"1\r\n");
    assert_eq!(line.len(), MAX_LINE);
    assert_eq!(
        parse_request(&line),
        Ok(Some((
            Request::Release {
                key: &line[2..2 + MAX_KEY],
                token: 1
            },
            MAX_LINE
        )))
    );
}

#[test]
fn no_newline_in_512_bytes_breaks_even_with_more_data() {
    for filler in [b'x', b' ', b'\r', 0x00, 0x80] {
        let mut buf = vec![filler; MAX_LINE];
        assert_eq!(parse_request(&buf), Err(ParseError::LineTooLong));
        buf.extend_from_slice(b"\nS\n");
        assert_eq!(parse_request(&buf), Err(ParseError::LineTooLong));
        buf.extend(std::iter::repeat_n(b'y', 10_000));
        assert_eq!(parse_request(&buf), Err(ParseError::LineTooLong));
    }
    let mut buf = padded_line(1000, b"\n");
    assert_eq!(parse_request(&buf), Err(ParseError::LineTooLong));
    buf.truncate(MAX_LINE);
    assert_eq!(parse_request(&buf), Err(ParseError::LineTooLong));
    assert_reason_ok(&ParseError::LineTooLong);
    assert_eq!(
        ParseError::LineTooLong.to_string(),
        "line longer than 512 bytes"
    );
}

#[test]
fn need_more_below_512_bytes() {
    assert_eq!(parse_request(b""), Ok(None));
    for len in [1, 2, 100, MAX_LINE - 2, MAX_LINE - 1] {
        // whatever the bytes, no `\n` and fewer than 512: need more
        for filler in [b'x', b' ', b'\r', 0x00, 0xff] {
            let buf = vec![filler; len];
            assert_eq!(parse_request(&buf), Ok(None), "len {len} 0x{filler:02x}");
        }
    }
    let line = padded_line(MAX_LINE, b"\r\n");
    for cut in 0..MAX_LINE {
        assert_eq!(parse_request(&line[..cut]), Ok(None), "cut {cut}");
    }
    // A broken line is not reported before its `\n` arrives.
    assert_eq!(parse_request(b"X y z"), Ok(None));
    assert_eq!(parse_request(b"A k 1 0\r"), Ok(None));
}

#[test]
fn carriage_return_only_before_newline() {
    assert_eq!(parse_request(b"S\r\n"), Ok(Some((Request::Status, 3))));
    assert_eq!(
        parse_request(b"A k 30 0\r\nS\n"),
        Ok(Some((acquire(b"k", 30_000, 0), 10)))
    );
    let cases: &[(&[u8], ParseError<'_>)] = &[
        (b"S\r\r\n", ParseError::UnknownOp(b"S\r")),
        (b"\rS\n", ParseError::UnknownOp(b"\rS")),
        (b"S\rS\n", ParseError::UnknownOp(b"S\rS")),
        (b"A k\r 30 0\n", ParseError::KeyByte(b'\r')),
        (b"A \rk 30 0\n", ParseError::KeyByte(b'\r')),
        (b"A k 30\r 0\n", ParseError::Lease(b"30\r")),
        (b"A k 30 0\r\r\n", ParseError::Wait(b"0\r")),
        (b"A k 30 \r0\r\n", ParseError::Wait(b"\r0")),
        (b"R k 1\r\r\n", ParseError::Token(b"1\r")),
        (b"N k 1\r 1\n", ParseError::Token(b"1\r")),
        (b"N k 1 1\r\r\n", ParseError::Lease(b"1\r")),
        (b"S \r\n", ParseError::EmptyField),
        (b"\r\r\n", ParseError::UnknownOp(b"\r")),
    ];
    for (line, want) in cases {
        assert_eq!(one(line), Err(*want), "{}", esc(line));
    }
    // A `\r` after the `\n` belongs to the next line.
    assert_eq!(parse_request(b"S\n\rS\n"), Ok(Some((Request::Status, 2))));
    assert_eq!(parse_request(b"\rS\n"), Err(ParseError::UnknownOp(b"\rS")));
    // `\r` right before `\n` counts toward the 512 bytes (tested above too).
    assert_eq!(
        parse_request(&padded_line(MAX_LINE + 1, b"\r\n")),
        Err(ParseError::LineTooLong)
    );
}

// ---------------------------------------------------------------- pipelining

const PIPELINE: &[u8] =
    b"S\nA k 1 0\r\nR k 5\nN k 5 1\nA \x80key\xff 0.5 86400\nS\r\nR k 0018446744073709551615\n";

fn pipeline_requests() -> Vec<Request<'static>> {
    vec![
        Request::Status,
        acquire(b"k", 1_000, 0),
        Request::Release {
            key: b"k",
            token: 5,
        },
        Request::Renew {
            key: b"k",
            token: 5,
            lease_ms: 1_000,
        },
        acquire(b"\x80key\xff", 500, 86_400_000),
        Request::Status,
        Request::Release {
            key: b"k",
            token: u64::MAX,
        },
    ]
}

#[test]
fn pipelined_lines_parse_one_by_one() {
    let want_used = [2, 9, 6, 8, 18, 3, 27];
    let mut rest = PIPELINE;
    let mut got = Vec::new();
    let mut used_all = Vec::new();
    while let Some((req, used)) = parse_request(rest).unwrap() {
        got.push(req);
        used_all.push(used);
        rest = &rest[used..];
    }
    assert!(rest.is_empty());
    assert_eq!(got, pipeline_requests());
    assert_eq!(used_all, want_used);
    assert_eq!(used_all.iter().sum::<usize>(), PIPELINE.len());

    // A broken line in the middle: the lines before it parse, then the error.
    let buf = b"S\nR k 1\nR k 0\nS\n";
    let (_, a) = parse_request(buf).unwrap().unwrap();
    let (_, b) = parse_request(&buf[a..]).unwrap().unwrap();
    assert_eq!(parse_request(&buf[a + b..]), Err(ParseError::Token(b"0")));
}

/// Drives the parser the way a connection does: bytes arrive in two reads,
/// split at `split`; after each read every whole line is parsed.
fn parse_in_two_reads<'a>(all: &'a [u8], split: usize, out: &mut Vec<Request<'a>>) {
    let mut start = 0;
    for end in [split, all.len()] {
        loop {
            match parse_request(&all[start..end]) {
                Ok(Some((req, used))) => {
                    assert!(used > 0 && start + used <= end);
                    assert_eq!(all[start + used - 1], b'\n');
                    out.push(req);
                    start += used;
                }
                Ok(None) => {
                    // Only an incomplete line is left.
                    assert!(!all[start..end].contains(&b'\n'), "split {split}");
                    break;
                }
                Err(e) => panic!("split {split}: {e}"),
            }
        }
    }
    assert_eq!(start, all.len(), "split {split}");
}

#[test]
fn partial_lines_split_at_every_byte() {
    let mut long = padded_line(MAX_LINE, b"\r\n");
    long.extend_from_slice(PIPELINE);
    long.extend_from_slice(&padded_line(MAX_LINE, b"\n"));
    let mut want_long = vec![acquire(b"k", 30_000, 0)];
    want_long.extend(pipeline_requests());
    want_long.push(acquire(b"k", 30_000, 0));

    for (buf, want) in [(PIPELINE, pipeline_requests()), (&long[..], want_long)] {
        for split in 0..=buf.len() {
            // The prefix alone: exactly the whole lines in it come out.
            let prefix = &buf[..split];
            let whole = prefix.iter().filter(|&&b| b == b'\n').count();
            let mut got = Vec::new();
            let mut rest = prefix;
            loop {
                match parse_request(rest) {
                    Ok(Some((req, used))) => {
                        got.push(req);
                        rest = &rest[used..];
                    }
                    Ok(None) => break,
                    Err(e) => panic!("split {split}: {e}"),
                }
            }
            assert_eq!(got.len(), whole, "split {split}");
            assert_eq!(got[..], want[..whole], "split {split}");

            // Then the whole buffer, continuing where the prefix stopped.
            let mut got = Vec::new();
            parse_in_two_reads(buf, split, &mut got);
            assert_eq!(got, want, "split {split}");
        }
    }
}

// ------------------------------------------------------------ error reasons

#[test]
fn reasons_are_one_printable_line() {
    let long_op = vec![0xffu8; 300];
    let errors = [
        ParseError::LineTooLong,
        ParseError::EmptyField,
        ParseError::UnknownOp(b"\x00\x01\r\n\t\x7f\x80\xff\"\\ok"),
        ParseError::UnknownOp(&long_op),
        ParseError::FieldCount {
            op: b'A',
            got: 5,
            want: 4,
        },
        ParseError::KeyTooLong(251),
        ParseError::KeyByte(0x00),
        ParseError::KeyByte(b'\n'),
        ParseError::KeyByte(0x7f),
        ParseError::Lease(b"\r\n\x00"),
        ParseError::Wait(b"\xff\xfe"),
        ParseError::Token(b"\"quoted\""),
    ];
    for e in &errors {
        assert_reason_ok(e);
    }
    assert_eq!(ParseError::Lease(b"abc").to_string(), "bad lease \"abc\"");
    assert_eq!(
        ParseError::Wait(b"1.0001").to_string(),
        "bad wait \"1.0001\""
    );
    assert_eq!(ParseError::Token(b"0").to_string(), "bad token \"0\"");
    assert_eq!(
        ParseError::UnknownOp(b"\x00\r\xff\"\\").to_string(),
        "unknown op \"\\x00\\x0d\\xff\\x22\\x5c\""
    );
    assert_eq!(
        ParseError::KeyByte(0x7f).to_string(),
        "forbidden byte 0x7f in key"
    );
    assert_eq!(
        ParseError::KeyTooLong(251).to_string(),
        "key too long (251 bytes, at most 250)"
    );
    assert_eq!(
        ParseError::FieldCount {
            op: b'R',
            got: 2,
            want: 3
        }
        .to_string(),
        "wrong number of fields for R: 2, expected 3"
    );
    assert_eq!(ParseError::EmptyField.to_string(), "empty field");
    // Long fields are cut.
    let shown = ParseError::UnknownOp(&long_op).to_string();
    assert!(shown.ends_with("...\""), "{shown}");
    // The `E` line built from it is a valid answer line.
    let reason = format!("{} in line 3", ParseError::Lease(b"\r\n"));
    let mut out = Vec::new();
    Answer::Error {
        reason: reason.as_bytes(),
    }
    .encode(&mut out);
    assert_eq!(out.iter().filter(|&&b| b == b'\n').count(), 1);
    assert_eq!(
        parse_answer(&out[..out.len() - 1]),
        Ok(Answer::Error {
            reason: reason.as_bytes()
        })
    );
}

// ------------------------------------------------- generated-input invariants

/// The fuzz target's invariants (fuzz/fuzz_targets/parse_request.rs), for a
/// deterministic run in `cargo test` on stable.
fn check_invariants(data: &[u8], enc: &mut Vec<u8>) {
    let mut rest = data;
    loop {
        let parsed: Parsed<'_> = parse_request(rest);
        // The optimised parser agrees with the plain model in everything:
        // request, bytes used, and which error.
        assert_eq!(
            parsed,
            super::reference::parse_request(rest),
            "on {:?}",
            esc(&rest[..rest.len().min(80)])
        );
        let window = &rest[..rest.len().min(MAX_LINE)];
        match parsed {
            Ok(Some((req, used))) => {
                assert!(used > 0 && used <= MAX_LINE && used <= rest.len());
                assert_eq!(rest[used - 1], b'\n');
                assert!(!rest[..used - 1].contains(&b'\n'));
                if let Some(key) = req.key() {
                    assert!(is_valid_key(key));
                }
                enc.clear();
                req.encode(enc);
                assert!(enc.len() <= MAX_LINE);
                assert_eq!(parse_request(enc), Ok(Some((req, enc.len()))));
                rest = &rest[used..];
            }
            Ok(None) => {
                assert!(rest.len() < MAX_LINE);
                assert!(!rest.contains(&b'\n'));
                break;
            }
            Err(ParseError::LineTooLong) => {
                assert!(rest.len() >= MAX_LINE);
                assert!(!window.contains(&b'\n'));
                break;
            }
            Err(e) => {
                assert_reason_ok(&e);
                // The line was whole: skip it and go on, for coverage.
                let nl = memchr::memchr(b'\n', window).expect("error without a whole line");
                rest = &rest[nl + 1..];
            }
        }
    }
    let first = data.split(|&b| b == b'\n').next().unwrap_or(data);
    if let Ok(answer) = parse_answer(first) {
        enc.clear();
        answer.encode(enc);
    }
}

struct XorShift(u64);

impl XorShift {
    fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        x
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
    fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len())]
    }
}

fn gen_number(rng: &mut XorShift, out: &mut Vec<u8>, decimals: bool) {
    for _ in 0..[0, 0, 0, 1, 3, 30][rng.below(6)] {
        out.push(b'0');
    }
    let n = match rng.below(4) {
        0 => rng.next() % 10,
        1 => rng.next() % 100_000,
        2 => rng.next(),
        _ => *rng.pick(&[0, 1, 86_400, 86_401, u64::MAX]),
    };
    write_u64(out, n);
    if decimals && rng.below(2) == 0 {
        out.push(b'.');
        for _ in 0..rng.below(5) {
            out.push(b'0' + rng.below(10) as u8);
        }
    }
}

fn gen_line(rng: &mut XorShift, out: &mut Vec<u8>) {
    let op = *rng.pick(b"ARNSARNSxOQGC");
    out.push(op);
    if op == b'S' {
        if rng.below(4) == 0 {
            out.push(b'\r');
        }
        out.push(b'\n');
        return;
    }
    out.push(b' ');
    let key_len = match rng.below(10) {
        0 => 240 + rng.below(15),
        _ => 1 + rng.below(20),
    };
    for _ in 0..key_len {
        let b = match rng.below(20) {
            0 => rng.next() as u8,
            1 => 0x80 + rng.below(128) as u8,
            _ => b'a' + rng.below(26) as u8,
        };
        out.push(b);
    }
    let fields: &[bool] = match op {
        b'A' | b'G' => &[true, true],
        b'C' => &[false, true, true],
        b'O' | b'Q' => &[],
        b'R' => &[false],
        _ => &[false, true],
    };
    for &decimals in fields {
        out.push(b' ');
        gen_number(rng, out, decimals);
    }
    if rng.below(4) == 0 {
        out.push(b'\r');
    }
    out.push(b'\n');
}

/// One input: one to three lines from `corpus`, then up to three mutations.
fn gen_input(rng: &mut XorShift, corpus: &[Vec<u8>], out: &mut Vec<u8>) {
    out.clear();
    for _ in 0..1 + rng.below(3) {
        let line = rng.pick(corpus);
        out.extend_from_slice(line);
    }
    for _ in 0..rng.below(4) {
        match rng.below(10) {
            // byte flip
            0..=2 if !out.is_empty() => {
                let i = rng.below(out.len());
                out[i] = rng.next() as u8;
            }
            // truncation
            3 | 4 if !out.is_empty() => {
                let len = rng.below(out.len());
                out.truncate(len);
            }
            // long run, to cross 512
            5 => {
                let i = rng.below(out.len() + 1);
                let b = *rng.pick(b"0k \r");
                let n = rng.below(600);
                out.splice(i..i, std::iter::repeat_n(b, n));
            }
            // insertion of a framing-relevant byte
            _ => {
                let i = rng.below(out.len() + 1);
                out.insert(i, *rng.pick(b" \r\n\x00\x80\xff.0"));
            }
        }
    }
}

#[test]
fn generated_inputs_keep_invariants() {
    let mut rng = XorShift(0x9e37_79b9_7f4a_7c15);
    // Lines are made once (making them is slow in a debug build), then
    // combined and mutated afresh for each input.
    let corpus: Vec<Vec<u8>> = (0..4096)
        .map(|_| {
            let mut line = Vec::new();
            gen_line(&mut rng, &mut line);
            line
        })
        .collect();
    let mut buf = Vec::with_capacity(4096);
    let mut enc = Vec::with_capacity(MAX_LINE);
    let mut parsed = [0usize; 3];
    for _ in 0..200_000 {
        gen_input(&mut rng, &corpus, &mut buf);
        check_invariants(&buf, &mut enc);
        parsed[match parse_request(&buf) {
            Ok(Some(_)) => 0,
            Ok(None) => 1,
            Err(_) => 2,
        }] += 1;
    }
    // The generator must reach all three outcomes in fair numbers.
    assert!(parsed.iter().all(|&n| n > 10_000), "{parsed:?}");
}

// ------------------------------------------------------- number codecs

/// Digit strings around every boundary: lengths 0 to 22, leading zeros,
/// `u64::MAX` and one more, dots in every place, bytes just outside '0'..='9'.
fn number_fields() -> Vec<Vec<u8>> {
    let mut fields: Vec<Vec<u8>> = vec![
        b"".to_vec(),
        b".".to_vec(),
        b"0".to_vec(),
        b"18446744073709551615".to_vec(),
        b"18446744073709551616".to_vec(),
        b"99999999999999999999".to_vec(),
        b"000000000000000000000000001".to_vec(),
    ];
    let mut rng = XorShift(0x2545_f491_4f6c_dd1d);
    let alphabet = b"0123456789./: ";
    for len in 0..=22 {
        for _ in 0..400 {
            let field: Vec<u8> = (0..len)
                .map(|_| {
                    if rng.below(10) < 8 {
                        b'0' + rng.below(10) as u8
                    } else {
                        *rng.pick(alphabet)
                    }
                })
                .collect();
            fields.push(field);
        }
    }
    fields
}

#[test]
fn number_parsers_agree_with_the_model() {
    for field in number_fields() {
        assert_eq!(
            parse_u64(&field),
            super::reference::parse_u64(&field),
            "parse_u64 {:?}",
            esc(&field)
        );
        assert_eq!(
            parse_seconds(&field),
            super::reference::parse_seconds(&field),
            "parse_seconds {:?}",
            esc(&field)
        );
    }
}

#[test]
fn write_u64_is_the_decimal_form() {
    let mut rng = XorShift(0x853c_49e6_748f_ea9b);
    let mut values = vec![0, u64::MAX, u64::MAX - 1];
    let mut p = 1u64;
    for _ in 0..20 {
        values.extend([p - 1, p, p + 1]);
        p = p.saturating_mul(10);
    }
    for _ in 0..100_000 {
        // Every magnitude, not only the huge values a uniform u64 gives.
        values.push(rng.next() >> rng.below(64));
    }
    let mut out = Vec::new();
    for n in values {
        out.clear();
        out.extend_from_slice(b"x");
        write_u64(&mut out, n);
        assert_eq!(out, format!("x{n}").into_bytes());
    }
}

#[test]
fn list_requests_are_bounded() {
    for (line, want) in [
        (&b"L 0 0\n"[..], "bad limit \"0\" (1 to 1000)"),
        (b"L 0 1001\n", "bad limit \"1001\" (1 to 1000)"),
        (b"L -1 10\n", "bad cursor \"-1\""),
        (
            b"L 18446744073709551616 10\n",
            "bad cursor \"18446744073709551616\"",
        ),
        (b"L 0\n", "wrong number of fields for L: 2, expected 3"),
        (
            b"L 0 1 p q\n",
            "wrong number of fields for L: 5, expected 4",
        ),
        (b"L 0 1 \x7f\n", "forbidden byte 0x7f in key"),
        (b"V 0 1001\n", "bad limit \"1001\" (1 to 1000)"),
        (b"V x 10\n", "bad cursor \"x\""),
        (b"V 0 1 \x7f\n", "forbidden byte 0x7f in key"),
    ] {
        let err = one(line).unwrap_err();
        assert_eq!(err.to_string(), want, "{}", esc(line));
        assert_eq!(
            crate::reference::parse_request(line).map(|r| r.map(|(q, _)| q)),
            Err(err)
        );
    }
}

#[test]
fn semaphore_limits_are_bounded() {
    for (line, ok) in [
        (&b"C k 1 1 0\n"[..], true),
        (b"C k 65536 1 0\n", true),
        (b"C k 0 1 0\n", false),
        (b"C k 65537 1 0\n", false),
        (b"C k 1.5 1 0\n", false),
        (b"C k 99999999999999999999 1 0\n", false),
    ] {
        let got = one(line);
        assert_eq!(got.is_ok(), ok, "{}", esc(line));
        if !ok {
            let field = &line[4..line.len() - 5];
            assert_eq!(got, Err(ParseError::Permits(field)), "{}", esc(line));
            assert_eq!(
                got.unwrap_err().to_string(),
                format!("bad limit \"{}\" (1 to 65536)", esc(field))
            );
        }
        assert_eq!(
            got,
            crate::reference::parse_request(line).map(|r| r.expect("a whole line").0)
        );
    }
    // The lease and wait of `G` and `C` are checked as `A`'s are.
    assert_eq!(one(b"G k 0 0\n"), Err(ParseError::Lease(b"0")));
    assert_eq!(one(b"C k 2 1 86401\n"), Err(ParseError::Wait(b"86401")));
}

#[test]
fn owner_labels_are_bounded() {
    let longest = vec![b'o'; MAX_OWNER];
    let mut line = b"O ".to_vec();
    line.extend_from_slice(&longest);
    line.push(b'\n');
    assert_eq!(one(&line), Ok(Request::Owner { owner: &longest }));
    let mut too_long = b"O ".to_vec();
    too_long.extend(std::iter::repeat_n(b'o', MAX_OWNER + 1));
    too_long.push(b'\n');
    for line in [
        &too_long[..],
        b"O -\n",
        b"O caf\xc3\xa9\n",
        b"O a\x7fb\n",
        b"O tab\there\n",
    ] {
        let err = one(line).unwrap_err();
        assert!(
            matches!(err, ParseError::Owner(_)),
            "{}: {err:?}",
            esc(line)
        );
        assert!(err.to_string().starts_with("bad owner \""), "{err}");
        assert_reason_ok(&err);
        assert_eq!(
            crate::reference::parse_request(line).map(|r| r.map(|(q, _)| q)),
            Err(err)
        );
    }
}

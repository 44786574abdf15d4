//! The hex numbers of version 6's `P g` and `P x` lines: lowercase, 1 to
//! 16 digits, no leading zero (but `0` itself). Writing one divides
//! nothing, unlike a decimal number (a token has 19 decimal digits).

/// Appends `n` in lowercase hex, without leading zeros.
#[inline(always)]
pub(crate) fn write_hex(out: &mut Vec<u8>, n: u64) {
    // 1 to 16 digits: `n | 1` has at most 63 leading zero bits.
    let digits = (67 - (n | 1).leading_zeros()) / 4;
    debug_assert!((1..=16).contains(&digits));
    let start = out.len();
    if digits <= 8 {
        // A remaining lease (under 2^27): one half only.
        let top = n << (4 * (8 - digits));
        out.extend_from_slice(&spread(top).to_be_bytes());
    } else {
        // The first digit at the top, then each nibble spread to a byte.
        let top = n << (4 * (16 - digits));
        let both = (u128::from(spread(top >> 32)) << 64) | u128::from(spread(top & 0xffff_ffff));
        out.extend_from_slice(&both.to_be_bytes());
    }
    out.truncate(start + digits as usize);
}

/// The eight nibbles of `x` (< 2^32) as the ASCII hex digits of eight
/// bytes, the most significant nibble in the most significant byte.
#[inline(always)]
fn spread(x: u64) -> u64 {
    debug_assert!(x <= u64::from(u32::MAX));
    let x = (x | (x << 16)) & 0x0000_ffff_0000_ffff;
    let x = (x | (x << 8)) & 0x00ff_00ff_00ff_00ff;
    let x = (x | (x << 4)) & 0x0f0f_0f0f_0f0f_0f0f;
    // 1 in each byte whose nibble is 10 or more: it becomes a letter.
    let letters = ((x + 0x0606_0606_0606_0606) >> 4) & 0x0101_0101_0101_0101;
    x + 0x3030_3030_3030_3030 + letters * u64::from(b'a' - b'0' - 10)
}

/// The number a field of [`write_hex`]'s form says, or `None` for anything
/// else: empty, over 16 digits, a byte not in `0-9a-f`, a leading zero.
/// Sixteen digits fit a `u64`: nothing overflows. The last eight digits at
/// once (a token has 16), the first eight at once too or one at a time.
#[inline(always)]
pub(crate) fn parse_hex(field: &[u8]) -> Option<u64> {
    let len = field.len();
    if len == 0 || len > 16 || (len > 1 && field.first() == Some(&b'0')) {
        return None;
    }
    if len < 8 {
        return few_digits(field);
    }
    let (head, tail) = field.split_at(len - 8);
    let low = u64::from(eight_digits(tail)?);
    let high = if head.len() == 8 {
        u64::from(eight_digits(head)?)
    } else {
        few_digits(head)?
    };
    Some((high << 32) | low)
}

/// [`parse_hex`] of `text[start..end]`: the same number, or `None` for
/// the same fields. A field of fewer than eight digits with eight bytes of
/// `text` ending where it does is read at once: those eight bytes, the
/// ones before the field replaced by `0` digits.
#[inline(always)]
pub(crate) fn parse_hex_in(text: &[u8], start: usize, end: usize) -> Option<u64> {
    let field = text.get(start..end)?;
    let len = field.len();
    if len >= 8 {
        return parse_hex(field);
    }
    let Some(window) = end.checked_sub(8).and_then(|from| text.get(from..end)) else {
        return parse_hex(field);
    };
    if len == 0 || (len > 1 && field.first() == Some(&b'0')) {
        return None;
    }
    let word = u64::from_be_bytes(window.try_into().ok()?);
    // The field's `len` (1 to 7) bytes are the low ones.
    let field_bytes = u64::MAX >> (8 * (8 - len));
    let padded = (word & field_bytes) | (0x3030_3030_3030_3030 & !field_bytes);
    eight_digits_of(padded).map(u64::from)
}

/// Fewer than eight hex digits (none: 0), one at a time.
#[inline(always)]
fn few_digits(field: &[u8]) -> Option<u64> {
    debug_assert!(field.len() < 8);
    let mut n: u64 = 0;
    for &b in field {
        let digit = match b {
            b'0'..=b'9' => b - b'0',
            b'a'..=b'f' => b - b'a' + 10,
            _ => return None,
        };
        n = (n << 4) | u64::from(digit);
    }
    Some(n)
}

/// Eight lowercase hex digits as a number, or `None` if any byte is not one.
#[inline(always)]
fn eight_digits(chunk: &[u8]) -> Option<u32> {
    eight_digits_of(u64::from_be_bytes(chunk.try_into().ok()?))
}

/// The eight hex digits of `v` (the first in its most significant byte)
/// as a number, or `None` if any byte is not one.
#[inline(always)]
fn eight_digits_of(v: u64) -> Option<u32> {
    const ONES: u64 = 0x0101_0101_0101_0101;
    const HIGH: u64 = 0x8080_8080_8080_8080;
    if v & HIGH != 0 {
        return None;
    }
    // Bytes below 0x80: adding 0x80 - m sets a byte's high bit iff the
    // byte is at least m, and carries into no other byte.
    let at_least = |m: u64| v.wrapping_add((0x80 - m) * ONES) & HIGH;
    let digit = at_least(0x30) & !at_least(0x3a);
    let letter = at_least(0x61) & !at_least(0x67);
    if digit | letter != HIGH {
        return None;
    }
    // `0`-`9` are 0x30-0x39, `a`-`f` 0x61-0x66 (bit 6 set: add 9).
    let x = (v & 0x0f0f_0f0f_0f0f_0f0f) + ((v >> 6) & ONES) * 9;
    // Pack the nibbles, the first digit the most significant.
    let x = (x | (x >> 4)) & 0x00ff_00ff_00ff_00ff;
    let x = (x | (x >> 8)) & 0x0000_ffff_0000_ffff;
    let x = (x | (x >> 16)) & 0xffff_ffff;
    u32::try_from(x).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hex_is_the_lowercase_form_and_parses_back() {
        let mut values = vec![0, 1, 9, 10, 15, 16, u64::MAX, u64::MAX - 1, 1 << 63];
        let mut x: u64 = 0x853c_49e6_748f_ea9b;
        for shift in 0..64 {
            values.extend([(1u64 << shift) - 1, 1 << shift, (1u64 << shift) + 1]);
        }
        for i in 0..100_000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            values.push(x >> (i % 64));
        }
        let mut out = Vec::new();
        for n in values {
            out.clear();
            out.push(b'x');
            write_hex(&mut out, n);
            assert_eq!(out, format!("x{n:x}").into_bytes());
            assert_eq!(parse_hex(&out[1..]), Some(n), "{n:x}");
        }
    }

    #[test]
    fn hex_fields_out_of_form_are_refused() {
        for field in [
            &b""[..],
            b"00",
            b"01",
            b"0f",
            b"A",
            b"ff_f",
            b"g",
            b"-1",
            b"+1",
            b" 1",
            b"1 ",
            b"0x1",
            b"10000000000000000",
            b"ffffffffffffffff0",
            b"\xff",
        ] {
            assert_eq!(parse_hex(field), None, "{}", crate::proto::Quoted(field));
        }
        // Each byte of a full-width field, replaced by every other byte.
        for b in 0..=255u8 {
            let ok = b.is_ascii_digit() || (b'a'..=b'f').contains(&b);
            for at in 0..16 {
                let mut field = *b"123456789abcdef1";
                field[at] = b;
                let lead_zero = at == 0 && b == b'0';
                assert_eq!(parse_hex(&field).is_some(), ok && !lead_zero, "{b} at {at}");
            }
        }
        assert_eq!(parse_hex(b"0"), Some(0));
        assert_eq!(parse_hex(b"ffffffffffffffff"), Some(u64::MAX));
    }

    #[test]
    fn a_field_read_with_the_bytes_before_it_says_what_it_says_alone() {
        // Every field of up to 17 bytes from a set of bytes that matter
        // (digits, letters, the space, `0` first), after every prefix.
        let bytes = [
            b'0', b'1', b'9', b'a', b'f', b'g', b'A', b' ', b'-', 0, 0xff,
        ];
        let mut x: u64 = 0x2545_f491_4f6c_dd1d;
        for _ in 0..200_000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let before = (x % 12) as usize;
            let len = ((x >> 8) % 18) as usize;
            let mut text: Vec<u8> = (0..before + len)
                .map(|i| bytes[((x >> (16 + i % 40)) as usize + i * 7) % bytes.len()])
                .collect();
            if x >> 60 < 8 {
                // Mostly digits, so that many fields parse.
                for (i, b) in text[before..].iter_mut().enumerate() {
                    *b = b"0123456789abcdef"[((x >> (i % 48)) & 15) as usize];
                }
            }
            let end = before + len;
            assert_eq!(
                parse_hex_in(&text, before, end),
                parse_hex(&text[before..end]),
                "{}",
                crate::proto::Quoted(&text)
            );
        }
        for (text, start, end) in [
            (&b"12345678 7530"[..], 9, 13),
            (b"x 0", 2, 3),
            (b"0000000a", 7, 8),
        ] {
            assert_eq!(parse_hex_in(text, start, end), parse_hex(&text[start..end]));
        }
        assert_eq!(parse_hex_in(b"ffffffff 7530", 9, 13), Some(0x7530));
        assert_eq!(parse_hex_in(b"ffffffff 07530", 9, 14), None);
        assert_eq!(parse_hex_in(b"ffffffff 0", 9, 10), Some(0));
        assert_eq!(parse_hex_in(b"k", 2, 1), None);
    }
}
